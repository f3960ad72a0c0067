#!/usr/bin/env python3
"""Per-batch cost of `sync --watch` into a daemon on loopback (issue 38,
docs/WATCH.md "Per-batch cost"): one 4 KiB file written every 150 ms, 40
times, each its own batch with data; the median of the job's batch
wall_s, and with --phases the median time of each step of the batch's
session (RAMSYS_PHASES=1, crates/engine/src/types/phase.rs): milliseconds since
the agent's push or the daemon's control connection started.

  python3 bench/watch_batch.py [--files 40] [--gap 0.15] [--phases]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RAMSYS = os.environ.get("RAMSYS", os.path.join(HERE, "..", "target", "release", "ramsys"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=40)
    ap.add_argument("--gap", type=float, default=0.15)
    ap.add_argument("--phases", action="store_true")
    ap.add_argument("--extra", default="", help="more sync options, space separated")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as t:
        key = os.path.join(t, "key")
        with open(key, "w") as f:
            f.write("0123456789abcdef0123456789abcdef\n")
        os.chmod(key, 0o600)
        src, export = os.path.join(t, "src"), os.path.join(t, "export")
        os.makedirs(src)
        os.makedirs(export)
        denv = dict(os.environ)
        if a.phases:
            denv.update(RAMSYS_PHASES="1", RUST_LOG="ramsys::phase=info,error")
        derr = open(os.path.join(t, "derr"), "w")
        d = subprocess.Popen([RAMSYS, "serve", "--listen", "127.0.0.1:0", "--root", export,
                              "--key-file", key], stdout=subprocess.PIPE,
                             stderr=derr, env=denv, text=True)
        addr = re.search(r"listening on (\S+)", d.stdout.readline()).group(1)
        env = dict(os.environ, RAMSYS_KEY_FILE=key)
        if a.phases:
            env.update(RAMSYS_PHASES="1", RUST_LOG="ramsys::phase=info,error")
        err = open(os.path.join(t, "err"), "w")
        w = subprocess.Popen([RAMSYS, "sync", "-r", "--watch", "--json",
                              "--watch-journal", os.path.join(t, "j.sqlite")]
                             + a.extra.split() + [src + "/", f"ramsys://{addr}/m"],
                             stdout=subprocess.PIPE, stderr=err, env=env, text=True)
        first = json.loads(w.stdout.readline())
        assert first.get("ok"), first
        for i in range(a.files):
            with open(os.path.join(src, f"f{i:03}"), "wb") as f:
                f.write(os.urandom(4096))
            time.sleep(a.gap)
        walls, seen = [], 0
        end = time.time() + 30
        while seen < a.files and time.time() < end:
            v = json.loads(w.stdout.readline())
            if v.get("ok") and not v.get("full") and v.get("files", 0) > 0:
                walls.append(v["wall_s"] * 1e3)
                seen += v["files"]
        w.terminate()
        w.wait()
        d.terminate()
        d.wait()
        err.close()
        derr.close()
        print(f"batches with data: {len(walls)}, wall_s median {statistics.median(walls):.2f} ms "
              f"(p10 {sorted(walls)[len(walls) // 10]:.2f}, p90 {sorted(walls)[len(walls) * 9 // 10]:.2f})")
        if a.phases:
            steps = {}
            lines = list(open(os.path.join(t, "err"))) + list(open(os.path.join(t, "derr")))
            for line in lines:
                m = re.search(r"phase (\w+) (\d+)", line)
                if m:
                    steps.setdefault(m.group(1), []).append(int(m.group(2)) / 1e3)
            # The first full sync is one more session: drop it.
            for k, v in steps.items():
                v = v[1:] if len(v) > len(walls) else v
                print(f"  {k:16} {statistics.median(v):7.2f} ms since its end started (n={len(v)})")


if __name__ == "__main__":
    main()
