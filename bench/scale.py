#!/usr/bin/env python3
"""Cost per file as trees grow (issue 36): ramsys next to rsync (and cp -a).

Trees of N small files (0-2 KiB, 1,000 per directory; generated once under
--work and kept), for each N in --sizes:

  copy        a fresh copy (local; push to a daemon on loopback; pull)
  resync      a no-change sync right after (the daily case)
  changed     a sync after 1 % of the files were rewritten (new mtime)
  delete      a sync --delete after 1 % of the files were removed

ramsys: `ramsys cp/sync -r` local (its in-process daemon), push and pull
through `ramsys serve` on 127.0.0.1; rsync: `rsync -a` local and to an rsync
daemon on 127.0.0.1 (push and pull); cp: `cp -a` (copy only). Every run:
wall time, files/s and peak RSS of each process (agent max RSS from
wait4(); daemon VmHWM, reset with clear_refs before the run). Tools are
interleaved inside each round; medians of --runs. Between rounds the
destination is removed, the file system synced, caches dropped (root) and
the source re-read (warm: the sources' metadata is cached for every tool).

    sudo python3 bench/scale.py --bin target/release/ramsys --sizes 100000,1000000 --runs 3

Writes a JSON report (--out) and prints a Markdown table.
"""
import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time


def gen(root, n, seed=1):
    """N files of 0-2 KiB, 1,000 per directory; a marker file says done."""
    done = os.path.join(root, ".complete")
    if os.path.exists(done):
        return
    shutil.rmtree(root, ignore_errors=True)
    rng = random.Random(seed)
    blob = rng.randbytes(4096)
    for i in range(n):
        d = os.path.join(root, f"d{i // 1000:05d}")
        if i % 1000 == 0:
            os.makedirs(d)
        with open(os.path.join(d, f"f{i % 1000:04d}"), "wb") as f:
            f.write(blob[: rng.randint(0, 2048)])
    open(done, "w").close()


def files_of(root):
    out = []
    for dp, _, fs in os.walk(root):
        out += [os.path.join(dp, f) for f in fs if f != ".complete"]
    out.sort()
    return out


def settle(*paths):
    for p in paths:
        shutil.rmtree(p, ignore_errors=True)
    subprocess.run(["sync"])
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
    except OSError:
        pass


def reread(root):
    """Warm the source's metadata (every tool then starts equal)."""
    subprocess.run(["find", root, "-type", "f", "-size", "-1"], stdout=subprocess.DEVNULL)


def run(cmd, env=None, daemon_pid=None):
    """(wall s, agent max RSS MiB, daemon VmHWM MiB or None, rc, stderr)."""
    if daemon_pid:
        try:
            with open(f"/proc/{daemon_pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    rc = os.waitstatus_to_exitcode(status)
    hwm = None
    if daemon_pid:
        with open(f"/proc/{daemon_pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) / 1024
    return wall, ru.ru_maxrss / 1024, hwm, rc, err.strip().splitlines()[-1:] if rc else []


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Servers:
    """A ramsys daemon and an rsync daemon on loopback, one export each."""

    def __init__(self, bin_, work):
        self.work = work
        self.key = os.path.join(work, "key")
        self.export = os.path.join(work, "export")
        os.makedirs(self.export, exist_ok=True)
        self.env = dict(os.environ, RAMSYS_KEY_FILE=self.key)
        self.rport = free_port()
        self.d = subprocess.Popen(
            [bin_, "serve", "--listen", "127.0.0.1:0", "--root", self.export,
             "--key-file", self.key],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=self.env)
        self.addr = self.d.stdout.readline().decode().split()[-1]
        conf = os.path.join(work, "rsyncd.conf")
        with open(conf, "w") as f:
            f.write(f"pid file = {work}/rsyncd.pid\nuse chroot = no\nuid = root\ngid = root\n"
                    f"[x]\npath = {self.export}\nread only = no\n")
        self.r = subprocess.Popen(["rsync", "--daemon", "--no-detach", f"--config={conf}",
                                   f"--port={self.rport}", "--address=127.0.0.1"])
        time.sleep(0.5)

    def stop(self):
        for p in (self.d, self.r):
            p.terminate()
            p.wait()


def scenarios(bin_, s, src, dst, n):
    """tool -> (command, which daemon it talks to); and every destination.
    Each tool has destinations of its own (a later tool must not find
    another's copy)."""
    ex = lambda name: os.path.join(s.export, name)  # noqa: E731
    rs = f"rsync://127.0.0.1:{s.rport}/x"
    url = f"ramsys://{s.addr}"
    cmds = {
        "ramsys local": ([bin_, "{verb}", "-r", "{flags}", src + "/", dst + "-ramsys"], None),
        "ramsys push": ([bin_, "{verb}", "-r", "{flags}", src + "/", f"{url}/push"], "ramsys"),
        "ramsys pull": ([bin_, "{verb}", "-r", "{flags}", f"{url}/push/", dst + "-pull"],
                        "ramsys"),
        "rsync local": (["rsync", "-a", "{flags}", src + "/", dst + "-rsync"], None),
        "rsync push": (["rsync", "-a", "{flags}", src + "/", f"{rs}/rpush"], "rsync"),
        "rsync pull": (["rsync", "-a", "{flags}", f"{rs}/rpush/", dst + "-rpull"], "rsync"),
        "cp -a": (["cp", "-a", src + "/.", dst + "-cp"], None),
    }
    dests = [ex("push"), ex("rpush")] + [dst + x for x in
                                         ("-ramsys", "-pull", "-rsync", "-rpull", "-cp")]
    return cmds, dests


def one_round(bin_, s, src, dst, n, tools, rng):
    cmds, dests = scenarios(bin_, s, src, dst, n)
    settle(*dests)
    reread(src)
    res = {}

    def go(tool, phase, verb, flags):
        if tool not in tools:
            return
        cmd, daemon = cmds[tool]
        if tool == "cp -a" and phase != "copy":
            return
        if tool == "cp -a":
            os.makedirs(dst + "-cp", exist_ok=True)
        c = [a.replace("{verb}", verb) for a in cmd]
        c = [x for a in c for x in ([flags] if a == "{flags}" else [a]) if x]
        # The rsync daemon forks a process per connection: its peak is
        # not read (rsync's incremental recursion keeps it small).
        pid = s.d.pid if daemon == "ramsys" else None
        wall, rss, hwm, rc, err = run(c, env=s.env, daemon_pid=pid)
        res[(tool, phase)] = dict(wall=wall, files_s=n / wall if wall else 0, rss=rss,
                                  daemon_hwm=hwm, rc=rc, err=err)

    order = list(tools)
    rng.shuffle(order)
    # Pushes first: the pulls read what they left.
    order.sort(key=lambda t: "pull" in t)
    for t in order:
        go(t, "copy", "cp", "")
    for t in order:
        go(t, "resync", "sync", "")
    changed = rng.sample(files_of(src), max(1, n // 100))
    for p in changed:
        with open(p, "ab") as f:
            f.write(b"x")
    for t in order:
        go(t, "changed", "sync", "")
    removed = rng.sample(files_of(src), max(1, n // 100))
    gone = []
    for p in removed:
        tmp = p + ".away"
        os.rename(p, tmp)
        gone.append((tmp, p))
    for t in order:
        go(t, "delete", "sync", "--delete")
    for tmp, p in gone:
        os.rename(tmp, p)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="target/release/ramsys")
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work", default="/var/tmp/ramsys-scale")
    ap.add_argument("--tools", default="ramsys local,ramsys push,ramsys pull,rsync local,"
                                       "rsync push,rsync pull,cp -a")
    ap.add_argument("--out", default="scale-results.json")
    a = ap.parse_args()
    bin_ = os.path.abspath(a.bin)
    tools = [t.strip() for t in a.tools.split(",")]
    os.makedirs(a.work, exist_ok=True)
    report = {}
    rng = random.Random(7)
    for n in [int(x) for x in a.sizes.split(",")]:
        src = os.path.join(a.work, f"src-{n}")
        print(f"generating {n} files in {src}", file=sys.stderr)
        gen(src, n)
        s = Servers(bin_, os.path.join(a.work, f"srv-{n}"))
        try:
            rounds = [one_round(bin_, s, src, os.path.join(a.work, f"dst-{n}"), n, tools, rng)
                      for _ in range(a.runs)]
        finally:
            s.stop()
            settle(os.path.join(a.work, f"srv-{n}"))
        for key in rounds[0]:
            vals = [r[key] for r in rounds if key in r]
            med = lambda f: statistics.median(v[f] for v in vals)  # noqa: E731
            hw = [v["daemon_hwm"] for v in vals if v["daemon_hwm"]]
            report[f"{n}|{key[0]}|{key[1]}"] = dict(
                files=n, tool=key[0], phase=key[1], wall=med("wall"), files_s=med("files_s"),
                rss=med("rss"), daemon_hwm=statistics.median(hw) if hw else None,
                failed=[v["err"] for v in vals if v["rc"]])
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    print("| files | tool | phase | wall s | files/s | agent RSS MiB | daemon peak MiB | failed |")
    print("|---:|---|---|---:|---:|---:|---:|---|")
    for r in report.values():
        hwm = f"{r['daemon_hwm']:.0f}" if r["daemon_hwm"] else "-"
        print(f"| {r['files']:,} | {r['tool']} | {r['phase']} | {r['wall']:.2f} | "
              f"{r['files_s']:,.0f} | {r['rss']:.0f} | {hwm} | {len(r['failed']) or ''} |")


if __name__ == "__main__":
    main()
