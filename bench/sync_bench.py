#!/usr/bin/env python3
"""Repeat-run cost of `ramsys sync` next to `rsync -a` (docs/SYNC.md).

A tree of N small files (0.5-16 KiB) plus 4 files of 16 MiB, local to local
(RTT 0: ramsys runs its in-process loopback daemon). Measured, medians of
--reps runs: a second run over the unchanged tree; a run after changing 1 %
of the files (rewritten, new mtime; the big files get one changed block
each time they are picked); the unchanged run with --checksum next to
`rsync -a --checksum`. Every run is followed by a tree comparison.

    bench/sync_bench.py --bin target/release/ramsys --files 20000 --reps 3

--wan (root; uses bench/run.py's namespaces, wanem, servers and accounting):
the 47,984-file "kernel" tree of run.py, (a) a run over the unchanged tree
and (b) a run after changing 1 % of its files (content rewritten in place,
appended or truncated, plus new and deleted files; --delete), for
`ramsys sync` (daemon), `rsync -a --delete` to an rsync daemon and over
ssh, through wanem at each --rtts, and locally (ramsys local, rsync local).
Medians of --runs, tools interleaved inside each run; wall time, CPU of
both ends, bytes on the wire (the TUN devices of the client namespace).

    sudo python3 bench/sync_bench.py --wan --rtts 0,100 --runs 3
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time


def gen(root, n, rng):
    os.makedirs(root)
    per_dir = 200
    for i in range(n):
        d = os.path.join(root, f"d{i // per_dir:04d}")
        if i % per_dir == 0:
            os.makedirs(d)
        with open(os.path.join(d, f"f{i:06d}"), "wb") as f:
            f.write(rng.randbytes(rng.randint(512, 16384)))
    for b in range(4):
        with open(os.path.join(root, f"big{b}"), "wb") as f:
            f.write(rng.randbytes(16 << 20))


def mutate(root, n, rng, frac=0.01):
    files = []
    for dp, _, fs in os.walk(root):
        files += [os.path.join(dp, f) for f in fs]
    files.sort()
    for p in rng.sample(files, int(len(files) * frac)):
        if os.path.basename(p).startswith("big"):
            with open(p, "r+b") as f:
                f.seek(rng.randrange(16 << 20))
                f.write(rng.randbytes(4096))
        else:
            with open(p, "wb") as f:
                f.write(rng.randbytes(rng.randint(512, 16384)))
        t = time.time() + rng.randint(1, 10**6)
        os.utime(p, (t, t))


def timed(cmd, env):
    t0 = time.monotonic()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    dt = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"{cmd} failed: {r.stderr}")
    summary = None
    for line in r.stdout.splitlines():
        if '"summary"' in line:
            summary = json.loads(line)
    return dt, summary


def same(a, b):
    r = subprocess.run(["diff", "-r", "--no-dereference", a, b], capture_output=True)
    if r.returncode != 0:
        raise SystemExit(f"trees differ: {r.stdout[:500]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/ramsys")
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--wan", action="store_true", help="remote runs through wanem (root)")
    ap.add_argument("--rtts", default="0,100")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--local", default="yes", help="also the local (no network) rows: yes/no")
    ap.add_argument("--scale", type=float, default=1.0, help="kernel tree size (1.0 = 47,984 files)")
    ap.add_argument("--tools", default="ramsys,rsyncd,rsync-ssh")
    ap.add_argument("--scratch", default="/var/tmp/ramsys-syncbench")
    ap.add_argument("--json-out", default=None, help="also write all results here")
    a = ap.parse_args()
    if a.wan:
        import sync_wan
        return sync_wan.main(a)
    rng = random.Random(42)
    base = tempfile.mkdtemp(prefix="syncbench-", dir=a.dir)
    env = dict(os.environ)
    key = os.path.join(base, "key")
    with open(key, "w") as f:
        f.write("0123456789abcdef0123456789abcdef\n")
    os.chmod(key, 0o600)
    env["RAMSYS_KEY_FILE"] = key
    src = os.path.join(base, "src")
    gen(src, a.files, rng)
    dr, ds = os.path.join(base, "dr"), os.path.join(base, "ds")
    os.makedirs(dr)
    os.makedirs(ds)
    ram = [a.bin, "sync", "-r", "--json", "--numa", "off", src, dr]
    rsy = ["rsync", "-a", src + "/", os.path.join(ds, "src") + "/"]
    res = {}
    res["first_ramsys"], _ = timed(ram, env)
    res["first_rsync"], _ = timed(rsy, env)
    rows = {k: [] for k in ["unchanged_ramsys", "unchanged_rsync", "changed_ramsys",
                            "changed_rsync", "checksum_ramsys", "checksum_rsync"]}
    sent = []
    for _ in range(a.reps):
        dt, s = timed(ram, env)
        assert s["bytes"] == 0, s
        rows["unchanged_ramsys"].append(dt)
        rows["unchanged_rsync"].append(timed(rsy, env)[0])
        mutate(src, a.files, rng)
        dt, s = timed(ram, env)
        rows["changed_ramsys"].append(dt)
        sent.append((s["files"], s["bytes"], s["unchanged"]))
        rows["changed_rsync"].append(timed(rsy, env)[0])
        same(src, os.path.join(dr, "src"))
        same(src, os.path.join(ds, "src"))
        rows["checksum_ramsys"].append(timed(ram[:2] + ["--checksum"] + ram[2:], env)[0])
        rows["checksum_rsync"].append(timed(rsy[:2] + ["--checksum"] + rsy[2:], env)[0])
    for k, v in rows.items():
        res[k] = statistics.median(v)
    res["changed_sent_files_bytes_unchanged"] = sent
    res["files"] = a.files + 4
    print(json.dumps(res, indent=1))
    shutil.rmtree(base)


if __name__ == "__main__":
    raise SystemExit(main())
