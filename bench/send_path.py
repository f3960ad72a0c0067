#!/usr/bin/env python3
"""Inline vs queued send paths (seed 002 sec. 7; docs/NUMA.md "Send paths").

Pushes a 1 GiB file and a 20,000-file tree of 16 KB files from tmpfs to
tmpfs through a daemon on loopback, once per send path per round, the
paths interleaved (A/B then B/A) so background load hits both alike.
Reports per workload and path the median wall time and the median CPU
seconds of the agent (the source) and of the daemon (the sink, as it
reports them in Complete), plus the inline/queued ratios.

Usage: bench/send_path.py [--runs N] [--streams N] [--readers N]
       [--workloads big,tree] [--json OUT]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("RAMSYS_BIN", os.path.join(HERE, "..", "target", "release", "ramsys"))
SHM = os.environ.get("SHM", "/dev/shm/ramsys-sendpath")


def gen(src_root):
    big = os.path.join(src_root, "big1g")
    with open(big, "wb") as f:
        for _ in range(1024):
            f.write(os.urandom(1 << 20))
    tree = os.path.join(src_root, "tree")
    for d in range(100):  # same shape as bench/core_numbers.sh
        p = os.path.join(tree, f"d{d:03}")
        os.makedirs(p)
        for i in range(200):
            with open(os.path.join(p, f"f{i:03}"), "wb") as fh:
                fh.write(os.urandom(16384))
    return {"big": (big, []), "tree": (tree, ["-r"])}


def start_daemon(root, key):
    out = open(root + ".out", "w")
    p = subprocess.Popen([BIN, "serve", "--listen", "127.0.0.1:0", "--root", root],
                         stdout=out, stderr=subprocess.DEVNULL,
                         env=dict(os.environ, RAMSYS_KEY_FILE=key))
    for _ in range(200):
        with open(root + ".out") as f:
            for line in f:
                if line.startswith("listening on "):
                    return p, line.split()[-1]
        time.sleep(0.05)
    p.kill()
    sys.exit("daemon did not start")


def one(addr, key, src, flags, path, streams, readers):
    dst = os.path.basename(src)
    cmd = [BIN, "cp", "--json", "--streams", str(streams), "--send-path", path, *flags]
    if readers:
        cmd += ["--readers", str(readers)]
    cmd += [src, f"ramsys://{addr}/{dst}"]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True,
                       env=dict(os.environ, RAMSYS_KEY_FILE=key))
    wall = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {r.stderr}")
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["send_path"] == path, s
    return {"wall_s": wall, "src_cpu_s": s["cpu_s"], "sink_cpu_s": s["peer_cpu_s"],
            "handoffs": s["handoffs"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--readers", type=int, default=0)
    ap.add_argument("--workloads", default="big,tree")
    ap.add_argument("--json")
    a = ap.parse_args()
    shutil.rmtree(SHM, ignore_errors=True)
    os.makedirs(os.path.join(SHM, "src"))
    os.makedirs(os.path.join(SHM, "root"))
    key = os.path.join(SHM, "key")
    with open(key, "w") as f:
        f.write(os.urandom(16).hex() + "\n")
    os.chmod(key, 0o600)
    daemon = None
    try:
        work = gen(os.path.join(SHM, "src"))
        daemon, addr = start_daemon(os.path.join(SHM, "root"), key)
        res = {}
        for w in a.workloads.split(","):
            src, flags = work[w]
            res[w] = {"queued": [], "inline": []}
            for i in range(a.runs):
                order = ["queued", "inline"] if i % 2 == 0 else ["inline", "queued"]
                for path in order:
                    shutil.rmtree(os.path.join(SHM, "root", os.path.basename(src)),
                                  ignore_errors=True)
                    m = one(addr, key, src, flags, path, a.streams, a.readers)
                    res[w][path].append(m)
                    print(f"{w} {path} run {i}: {m}", flush=True)
        lines = []
        for w, by in res.items():
            med = {p: {k: statistics.median(x[k] for x in v)
                       for k in ("wall_s", "src_cpu_s", "sink_cpu_s")}
                   for p, v in by.items()}
            q, n = med["queued"], med["inline"]
            lines.append(
                f"{w}: queued wall {q['wall_s']:.2f} s, cpu src {q['src_cpu_s']:.2f} + "
                f"sink {q['sink_cpu_s']:.2f} s | inline wall {n['wall_s']:.2f} s, cpu src "
                f"{n['src_cpu_s']:.2f} + sink {n['sink_cpu_s']:.2f} s | inline/queued wall "
                f"{n['wall_s'] / q['wall_s']:.3f}, src cpu {n['src_cpu_s'] / q['src_cpu_s']:.3f}")
            res[w]["median"] = med
        print("\n".join(lines))
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"streams": a.streams, "readers": a.readers, "runs": a.runs,
                           "results": res}, f, indent=1)
    finally:
        if daemon:
            daemon.kill()
            daemon.wait()
        shutil.rmtree(SHM, ignore_errors=True)


if __name__ == "__main__":
    main()
