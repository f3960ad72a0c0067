#!/usr/bin/env python3
"""Memory and files/s of a copy as the tree grows to 10 M files (issue 36).

The root file system here cannot hold two trees of 10 M small files (each
non-empty file takes a 4 KiB block: ~40 GB a tree), so every file is empty
and each tree lives on an ext4 image of its own (sparse files under
--work, loop-mounted, inodes reserved for the tree: `mkfs.ext4 -N`). The
per-file costs this measures (scan, records, slots, creates, renames,
memory) are those of a small file; the data path is not exercised.

For each N in --sizes: a source tree of N empty files, 1,000 per
directory (made once, kept on its image), then --runs copies by `ramsys cp
-r SRC/ DST` locally and pushed to `ramsys serve` on 127.0.0.1, in
alternating order. The destination is a fresh file system each time
(mkfs, not rm -rf: removing 10 M files takes longer than copying them and
leaves ext4 slow to create). Caches dropped, the source's metadata re-read
before each run. Wall time, files/s, the agent's max RSS (wait4) and the
daemon's VmHWM. --resync ARGS also times a no-change `sync ARGS` (e.g.
`-a --delete`) onto each fresh copy (its row's files/s: files compared).

    sudo python3 bench/huge_tree.py --bin target/release/ramsys --sizes 100000,1000000,10000000
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scale  # noqa: E402  (run, reread)


def sh(*cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def fresh_fs(image, mnt, inodes):
    """A new ext4 on `image` (sparse), mounted at `mnt`."""
    if os.path.ismount(mnt):
        sh("umount", mnt)
    size_gb = max(4, inodes * 400 // (1 << 30) + 2)
    with open(image, "wb") as f:
        f.truncate(size_gb << 30)
    # Inode tables and journal zeroed now, not by ext4lazyinit in the
    # background of the timed run (2.5 GB of zeros at 10 M inodes, against
    # 25 MB at 100 k: a cost that grows with the image, not the copy).
    sh("mkfs.ext4", "-q", "-F", "-N", str(inodes), "-I", "256",
       "-E", "lazy_itable_init=0,lazy_journal_init=0", image)
    os.makedirs(mnt, exist_ok=True)
    sh("mount", "-o", "loop,noatime", image, mnt)


def gen(root, n):
    """N empty files, 1,000 per directory; a marker says done."""
    done = os.path.join(root, ".complete")
    if os.path.exists(done):
        return
    for i in range(n):
        if i % 1000 == 0:
            d = os.path.join(root, "t", f"d{i // 1000:05d}")
            os.makedirs(d)
        os.close(os.open(os.path.join(d, f"f{i % 1000:04d}"), os.O_CREAT | os.O_WRONLY, 0o644))
    open(done, "w").close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="target/release/ramsys")
    ap.add_argument("--sizes", default="100000,1000000,10000000")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--modes", default="local,push")
    ap.add_argument("--work", default="/var/tmp/ramsys-huge")
    ap.add_argument("--resync", metavar="ARGS",
                    help="after each copy, time `ramsys sync ARGS SRC/ DST` onto it "
                         "(a no-change re-sync, e.g. '-a --delete'; same mode, warm)")
    a = ap.parse_args()
    binary = os.path.abspath(a.bin)
    os.makedirs(a.work, exist_ok=True)
    rows = []
    for n in [int(x) for x in a.sizes.split(",")]:
        inodes = n + n // 1000 + 1000
        src = os.path.join(a.work, f"src-{n}")
        img = os.path.join(a.work, f"src-{n}.img")
        if not os.path.ismount(src):
            if os.path.exists(img):
                os.makedirs(src, exist_ok=True)
                sh("mount", "-o", "loop,noatime", img, src)
            else:
                fresh_fs(img, src, inodes)
        t0 = time.monotonic()
        gen(src, n)
        print(f"{n} files ready ({time.monotonic() - t0:.0f} s)", file=sys.stderr)
        dst, dimg = os.path.join(a.work, "dst"), os.path.join(a.work, "dst.img")
        res = {}
        for r in range(a.runs):
            modes = a.modes.split(",")
            for mode in modes if r % 2 == 0 else modes[::-1]:
                fresh_fs(dimg, dst, inodes)
                scale.reread(src)
                subprocess.run(["sync"])
                with open("/proc/sys/vm/drop_caches", "w") as f:
                    f.write("3")
                scale.reread(src)
                d = None
                env = dict(os.environ, RAMSYS_KEY_FILE=os.path.join(a.work, "key"))
                if mode == "push":
                    d = subprocess.Popen(
                        [binary, "serve", "--listen", "127.0.0.1:0", "--root", dst,
                         "--key-file", env["RAMSYS_KEY_FILE"]],
                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
                    addr = d.stdout.readline().decode().split()[-1]
                    to = f"ramsys://{addr}/t"
                else:
                    to = os.path.join(dst, "t")
                cmd = [binary, "cp", "-r", os.path.join(src, "t") + "/", to]
                wall, rss, hwm, rc, err = scale.run(cmd, env=env,
                                                    daemon_pid=d.pid if d else None)
                if a.resync:
                    again = [binary, "sync", "-r", *a.resync.split(),
                             os.path.join(src, "t") + "/", to]
                    w2, r2, h2, rc2, err2 = scale.run(again, env=env,
                                                      daemon_pid=d.pid if d else None)
                    print(f"{n} {mode} re-sync {a.resync}: {w2:.1f} s, agent {r2:.0f} MiB, "
                          f"daemon {h2 or 0:.0f} MiB, rc {rc2} {err2}", file=sys.stderr)
                    res.setdefault(mode + " re-sync", []).append(
                        (w2, r2, h2 or 0, rc2 == 0))
                if d:
                    d.terminate()
                    d.wait()
                got = sum(len(fs) for _, _, fs in os.walk(os.path.join(dst, "t")))
                print(f"{n} {mode} run {r + 1}: {wall:.1f} s, agent {rss:.0f} MiB, daemon "
                      f"{hwm or 0:.0f} MiB, {got} files at DST, rc {rc} {err}", file=sys.stderr)
                res.setdefault(mode, []).append((wall, rss, hwm or 0, got == n and rc == 0))
        for mode, v in res.items():
            wall = statistics.median(x[0] for x in v)
            rows.append((n, mode, wall, n / wall, statistics.median(x[1] for x in v),
                         statistics.median(x[2] for x in v), all(x[3] for x in v)))
        sh("umount", dst)
    print("| files | mode | wall s | files/s | agent RSS MiB | daemon peak MiB | DST complete |")
    print("|---:|---|---:|---:|---:|---:|---|")
    for n, mode, wall, fps, rss, hwm, ok in rows:
        print(f"| {n:,} | {mode} | {wall:.1f} | {fps:,.0f} | {rss:.0f} | "
              f"{hwm:.0f} | {'yes' if ok else 'NO'} |")


if __name__ == "__main__":
    main()
