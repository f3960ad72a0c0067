#!/usr/bin/env python3
"""A fresh copy of a big tree, old binary against new (issue 36: windows).

bench/scale.py's tree of N files (0-2 KiB, 1,000 per directory), copied
by OLD and NEW in turn, locally (`cp -r SRC/ DST`) and pushed to a daemon
of the same binary on 127.0.0.1; the order of the binaries alternates by
round. Before every run the destinations are removed, the file system
synced, caches dropped and the source's metadata re-read (bench/scale.py's
settle and reread). Wall time, the agent's max RSS, the daemon's VmHWM;
medians of --runs and the same-round ratio new / old (< 1: new faster).

    sudo python3 bench/copy_ab.py --old /tmp/old/ramsys --new target/release/ramsys \\
        --files 1000000 --runs 3
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scale  # noqa: E402  (gen, run, settle, reread)


def serve(binary, work):
    key, export = os.path.join(work, "key"), os.path.join(work, "export")
    os.makedirs(export, exist_ok=True)
    env = dict(os.environ, RAMSYS_KEY_FILE=key)
    d = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0", "--root", export,
                          "--key-file", key],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    addr = d.stdout.readline().decode().split()[-1]
    return d, addr, env, export


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--files", type=int, default=1000000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--modes", default="local,push")
    ap.add_argument("--work", default="/var/tmp/ramsys-scale")
    a = ap.parse_args()
    src = os.path.join(a.work, f"src-{a.files}")
    scale.gen(src, a.files)
    bins = {"old": os.path.abspath(a.old), "new": os.path.abspath(a.new)}
    daemons = {k: serve(b, os.path.join(a.work, f"ab-{k}")) for k, b in bins.items()}
    dst = os.path.join(a.work, "ab-dst")
    res = {}
    try:
        for r in range(a.runs):
            order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
            for mode in a.modes.split(","):
                for k in order:
                    d, addr, env, export = daemons[k]
                    scale.settle(dst, os.path.join(export, "t"))
                    time.sleep(2)
                    scale.reread(src)
                    to = dst if mode == "local" else f"ramsys://{addr}/t"
                    pid = d.pid if mode == "push" else None
                    wall, rss, hwm, rc, err = scale.run([bins[k], "cp", "-r", src + "/", to],
                                                        env=env, daemon_pid=pid)
                    print(f"round {r} {mode} {k}: {wall:.1f} s, agent {rss:.0f} MiB, "
                          f"daemon {hwm or 0:.0f} MiB, rc {rc} {err}", file=sys.stderr)
                    res.setdefault((mode, k), []).append((wall, rss, hwm or 0))
    finally:
        for d, *_ in daemons.values():
            d.terminate()
            d.wait()
        scale.settle(dst, *[os.path.join(a.work, f"ab-{k}") for k in bins])
    print(f"| {a.files:,} files | binary | wall s (median) | new/old same round | "
          "agent RSS MiB | daemon peak MiB |")
    print("|---|---|---:|---:|---:|---:|")
    for mode in a.modes.split(","):
        for k in ("old", "new"):
            v = res[(mode, k)]
            ratios = [n[0] / o[0] for n, o in zip(res[(mode, "new")], res[(mode, "old")])]
            ratio = f"{statistics.median(ratios):.2f}" if k == "new" else "-"
            print(f"| {mode} | {k} | {statistics.median(x[0] for x in v):.1f} | {ratio} | "
                  f"{statistics.median(x[1] for x in v):.0f} | "
                  f"{statistics.median(x[2] for x in v):.0f} |")


if __name__ == "__main__":
    main()
