#!/usr/bin/env python3
"""Old binary against new, same rounds (issue 37: "performance unchanged").

The full-scale headline workloads of bench/run.py (bulk 4 x 1 GiB, the
48k-file kernel-like tree, 4,000 mixed files), each pushed to a daemon of
the same binary on 127.0.0.1 and copied locally, by OLD and NEW in turn
(the order alternates by round). Between runs the copy is removed, the
file system synced, caches dropped and the source re-read (warm source, as
the headline's warm rows). Wall time of the agent; medians and the
same-round ratio new / old (< 1: new faster).

    sudo python3 bench/ab.py --old /path/old/ramsys --new target/release/ramsys --runs 3

Prints a Markdown table; --out writes the raw runs as JSON.
"""
import argparse
import json
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as suite  # noqa: E402  (bench/run.py: workloads, caches)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def daemon(binary, root, key):
    port = free_port()
    p = subprocess.Popen(
        [binary, "serve", "--listen", f"127.0.0.1:{port}", "--root", root, "--key-file", key],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return p, port
        except OSError:
            time.sleep(0.05)
    p.kill()
    raise SystemExit(f"{binary}: daemon did not listen")


def settle(dst, src):
    shutil.rmtree(dst, ignore_errors=True)
    suite.drop_caches()
    suite.warm(src)


def one(binary, mode, src, scratch, key):
    dst = os.path.join(scratch, "dst")
    env = dict(os.environ, RAMSYS_KEY_FILE=key)
    p = None
    # The copy lands in dst/t: cp, like cp(1), wants its parent to exist.
    os.makedirs(dst, exist_ok=True)
    if mode == "push":
        p, port = daemon(binary, dst, key)
        cmd = [binary, "cp", "-r", str(src) + "/", f"ramsys://127.0.0.1:{port}/t"]
    else:
        cmd = [binary, "cp", "-r", str(src) + "/", os.path.join(dst, "t")]
    t0 = time.time()
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.time() - t0
    if p:
        p.terminate()
        p.wait()
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: {r.stderr.strip()}")
    n = sum(len(fs) for _, _, fs in os.walk(os.path.join(dst, "t")))
    settle(dst, src)
    return wall, n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workloads", default="bulk,mixed,kernel")
    ap.add_argument("--modes", default="push,local")
    ap.add_argument("--scratch", default="/var/tmp/ramsys-ab")
    ap.add_argument("--out")
    a = ap.parse_args()
    bins = {"old": os.path.abspath(a.old), "new": os.path.abspath(a.new)}
    root = pathlib.Path(a.scratch)
    root.mkdir(parents=True, exist_ok=True)
    key = os.path.join(a.scratch, "key")
    with open(key, "w") as f:
        f.write(os.urandom(16).hex() + "\n")
    os.chmod(key, 0o600)
    runs = []
    for w in a.workloads.split(","):
        src = suite.gen_workload(w, root, 1.0, 0)
        settle(os.path.join(a.scratch, "dst"), src)
        for mode in a.modes.split(","):
            for r in range(a.runs):
                order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
                rnd = {}
                for which in order:
                    wall, n = one(bins[which], mode, src, a.scratch, key)
                    rnd[which] = wall
                    print(f"{w} {mode} round {r + 1} {which}: {wall:.2f} s ({n} files)",
                          file=sys.stderr)
                runs.append({"workload": w, "mode": mode, "round": r + 1, **rnd})
    print("| workload | mode | old s (median) | new s (median) | new / old, same round (median; min-max) |")
    print("|---|---|---:|---:|---|")
    for w in a.workloads.split(","):
        for mode in a.modes.split(","):
            rs = [x for x in runs if x["workload"] == w and x["mode"] == mode]
            ratios = [x["new"] / x["old"] for x in rs]
            print(f"| {w} | {mode} | {statistics.median(x['old'] for x in rs):.2f} | "
                  f"{statistics.median(x['new'] for x in rs):.2f} | "
                  f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
