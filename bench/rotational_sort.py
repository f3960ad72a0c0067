#!/usr/bin/env python3
"""File sorting on an emulated rotational disk (issue 4; seed 000 sec. 6.2.2,
Fig. 6-12a).

Sets up bench/hddemu (a FUSE file whose every read waits for a modelled
seek + rotation + transfer), a loop device on it flagged rotational, ext4 on
that; writes a scrambled mixed tree (directory order != physical order,
some files fragmented); then, cold cache before every run, copies the tree
to tmpfs with ramsys (file sorting on, and --no-sort), cp -a and rsync -a,
interleaved within each run. Reports medians of wall time and of the
emulator's own counters (seeks, seek distance, modelled disk time), and
writes them as JSON. Everything it starts (emulator, loop device, mounts) is
stopped by PID / device name on exit.

Usage (root): bench/rotational_sort.py [--runs 3] [--files 3000] [--ramsys BIN]
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
EMU = HERE / "hddemu" / "hddemu.py"


def sh(*cmd, **kw):
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


class Rig:
    """Emulator process, loop device and mount, torn down in reverse."""

    def __init__(self, a):
        self.a = a
        self.scratch = Path(a.scratch)
        self.fusemnt = self.scratch / "fuse"
        self.mnt = self.scratch / "hdd"
        self.image = Path(a.image)
        self.proc = None
        self.loop = None
        self.mounted = False

    def ctl(self, cmd):
        (self.fusemnt / "ctl").write_text(cmd + "\n")

    def stats(self):
        return json.loads((self.fusemnt / "stats").read_text())

    def up(self):
        for d in (self.fusemnt, self.mnt):
            d.mkdir(parents=True, exist_ok=True)
        self.image.parent.mkdir(parents=True, exist_ok=True)
        if self.image.exists():
            self.image.unlink()
        py = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
        # Real-time priority: the emulator stands in for hardware, so other
        # tenants of this 2-vCPU VM must not delay its completions (its
        # lateness is then ~0.03 ms median; it sleeps almost all the time).
        rt = ["chrt", "-f", "50"] if shutil.which("chrt") else []
        self.proc = subprocess.Popen(
            rt + [py, str(EMU), str(self.image), str(self.fusemnt), "--size", str(self.a.image_size)],
            stdout=open(self.scratch / "hddemu.log", "w"), stderr=subprocess.STDOUT)
        for _ in range(100):
            if (self.fusemnt / "stats").exists():
                break
            if self.proc.poll() is not None:
                sys.exit(f"hddemu exited: see {self.scratch / 'hddemu.log'}")
            time.sleep(0.1)
        else:
            sys.exit("hddemu did not mount")
        out = sh("losetup", "-f", "--show", self.fusemnt / "disk.img", capture_output=True, text=True)
        self.loop = out.stdout.strip()
        q = Path("/sys/block") / Path(self.loop).name / "queue"
        # What a real disk would report; ramsys reads this flag (storage/device.rs).
        (q / "rotational").write_text("1\n")
        # The default scheduler for a disk; also lets queued requests be sorted and merged.
        (q / "scheduler").write_text(self.a.scheduler + "\n")
        sh("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", self.loop)
        sh("mount", "-o", "noatime", self.loop, self.mnt)
        self.mounted = True

    def down(self):
        if self.mounted:
            subprocess.run(["umount", str(self.mnt)])
            self.mounted = False
        if self.loop:
            subprocess.run(["losetup", "-d", self.loop])
            # Detaching is deferred until the last opener lets go; the FUSE
            # file cannot be unmounted before that.
            bf = Path("/sys/block") / Path(self.loop).name / "loop" / "backing_file"
            for _ in range(100):
                if not bf.exists():
                    break
                time.sleep(0.1)
            self.loop = None
        if self.proc and self.proc.poll() is None:
            subprocess.run(["umount", str(self.fusemnt)])
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None
        if self.image.exists():
            self.image.unlink()


def make_tree(root, n, seed):
    """n files in 30 directories, log-uniform 1 KiB-1 MiB, created in random
    order with syncs so allocation follows creation order, then a third
    deleted and rewritten (filling the holes elsewhere) and 5 % written in
    interleaved pieces (fragmented). Directory (hash) order, name order and
    physical order then disagree."""
    rng = random.Random(seed)
    dirs = [root / f"d{i:02}" / f"s{i % 3}" for i in range(30)]
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    files = [(dirs[rng.randrange(30)] / f"f{i:05}", int(1024 * 1024 ** rng.random())) for i in range(n)]
    blob = rng.randbytes(1 << 20)

    def write(p, size):
        with open(p, "wb") as f:
            f.write(blob[:size])

    order = files[:]
    rng.shuffle(order)
    for k, (p, s) in enumerate(order):
        write(p, s)
        if k % 100 == 99:
            os.sync()
    os.sync()
    victims = rng.sample(files, n // 3)
    for p, _ in victims:
        p.unlink()
    os.sync()
    rng.shuffle(victims)
    for k, (p, s) in enumerate(victims):
        write(p, s)
        if k % 50 == 49:
            os.sync()
    os.sync()
    frag = rng.sample(files, n // 20)
    handles = [(open(p, "wb"), s) for p, s in frag]
    off = 0
    while any(off < s for _, s in handles):
        for f, s in handles:
            if off < s:
                f.write(blob[off:min(s, off + 65536)])
                f.flush()
                os.fsync(f.fileno())
        off += 65536
    for f, _ in handles:
        f.close()
    os.sync()
    return sum(s for _, s in files)


def drop_caches():
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def tools(a, src, dst):
    env = dict(os.environ, RAMSYS_KEY_FILE=str(Path(a.scratch) / "ramsys.key"))
    r = [a.ramsys, "cp", "-r", "--json"]
    return {
        "ramsys (sort)": (r + [src, f"{dst}/"], env),
        "ramsys --no-sort": (r + ["--no-sort", src, f"{dst}/"], env),
        # The sync engine keeps one read in flight, so the elevator below has
        # nothing to reorder: the pure effect of the order ramsys asks in.
        "ramsys --io-engine sync": (r + ["--io-engine", "sync", src, f"{dst}/"], env),
        "ramsys --io-engine sync --no-sort": (r + ["--io-engine", "sync", "--no-sort", src, f"{dst}/"], env),
        "cp -a": (["cp", "-a", src, f"{dst}/"], None),
        "rsync -a": (["rsync", "-a", src, f"{dst}/"], None),
    }


def run_one(rig, cmd, env, dst, verify_src):
    shutil.rmtree(dst, ignore_errors=True)
    os.mkdir(dst)
    drop_caches()
    rig.ctl("reset")
    rig.ctl("on")
    t = time.monotonic()
    o = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - t
    rig.ctl("off")
    st = rig.stats()
    if o.returncode != 0:
        sys.exit(f"{cmd} failed ({o.returncode}): {o.stderr[-2000:]}")
    if verify_src:
        d = subprocess.run(["diff", "-rq", str(verify_src), f"{dst}/{Path(verify_src).name}"],
                           capture_output=True, text=True)
        if d.returncode != 0:
            sys.exit(f"{cmd}: copy differs: {d.stdout[:2000]}")
    shutil.rmtree(dst, ignore_errors=True)
    return dict(wall_s=wall, seeks=st["seeks"], seek_distance=st["seek_distance"],
                reads=st["reads"], bytes_read=st["bytes_read"], busy_s=st["busy_s"],
                seek_s=st["seek_s"], sequential=st["sequential"], short_skips=st["short_skips"])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--files", type=int, default=3000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--image", default="/dev/shm/ramsys-hddemu/disk.img",
                   help="backing image (tmpfs, so only the model costs time)")
    p.add_argument("--image-size", type=int, default=2 << 30)
    p.add_argument("--scratch", default="/var/tmp/ramsys-rotational")
    p.add_argument("--dst", default="/dev/shm/ramsys-rotational-dst", help="destination (tmpfs)")
    p.add_argument("--ramsys", default=None)
    p.add_argument("--out", default=None, help="JSON results file")
    p.add_argument("--scheduler", default="mq-deadline", help="I/O scheduler of the loop device (none: no elevator)")
    p.add_argument("--tools", default=None, help="comma-separated subset of the tool names (default: all)")
    a = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("rotational_sort: run as root (losetup, mount, drop_caches)")
    if os.environ.get("ROTATIONAL_SORT_NS") != "1" and shutil.which("unshare"):
        # Private mount namespace: the mounts exist only for this script and
        # its children, so a mount namespace that another program creates
        # meanwhile (sshd, ip netns exec) cannot copy them and keep the file
        # system, loop device and emulator busy after we exit.
        os.environ["ROTATIONAL_SORT_NS"] = "1"
        os.execvp("unshare", ["unshare", "-m", "--propagation", "private", sys.executable, *sys.argv])
    if a.ramsys is None:
        t = os.environ.get("CARGO_TARGET_DIR", str(HERE.parent / "target"))
        a.ramsys = str(Path(t) / "release" / "ramsys")
    if not Path(a.ramsys).exists():
        sys.exit(f"rotational_sort: no ramsys binary at {a.ramsys} (cargo build --release -p ramsys)")
    Path(a.scratch).mkdir(parents=True, exist_ok=True)
    rig = Rig(a)

    def on_signal(sig, _):
        rig.down()
        sys.exit(128 + sig)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        rig.up()
        src = rig.mnt / "tree"
        t = time.monotonic()
        total = make_tree(src, a.files, a.seed)
        print(f"tree: {a.files} files, {total / 1e6:.0f} MB, written in {time.monotonic() - t:.0f} s "
              f"on {rig.loop}", flush=True)
        # ramsys's own view of the device: one debug line per read queue.
        env = dict(os.environ, RAMSYS_KEY_FILE=str(Path(a.scratch) / "ramsys.key"),
                   RUST_LOG="ramsys_engine=debug")
        shutil.rmtree(a.dst, ignore_errors=True)
        os.mkdir(a.dst)
        o = subprocess.run([a.ramsys, "cp", "-r", "--json", str(src), a.dst + "/"], env=env,
                           capture_output=True, text=True)
        plan = [re.sub(r"\x1b\[[0-9;]*m", "", l) for l in (o.stdout + o.stderr).splitlines()
                if "read queue" in l]
        print("ramsys plan:", *plan, sep="\n  ", flush=True)
        shutil.rmtree(a.dst, ignore_errors=True)
        results = {}
        for run in range(a.runs):
            for name, (cmd, env) in tools(a, src, a.dst).items():
                if a.tools and name not in a.tools.split(","):
                    continue
                r = run_one(rig, cmd, env, a.dst, src if run == 0 else None)
                r["mb_s"] = total / 1e6 / r["wall_s"]
                results.setdefault(name, []).append(r)
                print(f"run {run + 1} {name:34} {r['wall_s']:6.1f} s {r['mb_s']:6.1f} MB/s "
                      f"seeks {r['seeks']:6} dist {r['seek_distance'] / 1e9:7.2f} GB "
                      f"disk {r['busy_s']:6.1f} s reads {r['reads']}", flush=True)
        med = {}
        for name, rs in results.items():
            med[name] = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        ref = med.get("ramsys (sort)") or next(iter(med.values()))
        print("\n| tool | wall s | MB/s | seeks | seek distance GB | mean seek MB | modelled disk s | reads | wall vs ramsys (sort) |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name, m in med.items():
            mean = m["seek_distance"] / m["seeks"] / 1e6 if m["seeks"] else 0
            print(f"| {name} | {m['wall_s']:.1f} | {m['mb_s']:.1f} | {m['seeks']:.0f} | "
                  f"{m['seek_distance'] / 1e9:.2f} | {mean:.1f} | {m['busy_s']:.1f} | {m['reads']:.0f} | "
                  f"{m['wall_s'] / ref['wall_s']:.2f} |")
        if a.out:
            Path(a.out).write_text(json.dumps(dict(files=a.files, bytes=total, runs=a.runs,
                                                   scheduler=a.scheduler, plan=plan, results=results,
                                                   medians=med), indent=1))
    finally:
        rig.down()
        shutil.rmtree(a.dst, ignore_errors=True)


if __name__ == "__main__":
    main()
