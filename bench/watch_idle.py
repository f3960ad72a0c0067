#!/usr/bin/env python3
"""Idle cost of a watched tree (issue 38, docs/BENCHMARKS.md).

`ramsys sync -r --delete --watch SRC/ DST` on a large tree that nobody
writes to: the first full sync (time, peak RSS), then --seconds of idle
(CPU seconds per second and RSS of the agent, sampled from /proc), once per
change-detection backend. The first backend's run copies SRC; the later
ones find DST equal. The file system itself may be busy (fanotify marks the
whole file system: other writers' events arrive and are dropped by path).

Usage: bench/watch_idle.py SRC [--dst D] [--seconds 60] [--backends fanotify,inotify] [--keep]
"""
import argparse
import json
import os
import subprocess
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RAMSYS = os.environ.get("RAMSYS", os.path.join(ROOT, "target/release/ramsys"))
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK


def status_kb(pid, key):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def run(src, dst, backend, seconds, work):
    cmd = [RAMSYS, "sync", "-r", "--delete", "--watch", "--json", "--watch-backend", backend,
           "--watch-journal", os.path.join(work, f"journal-{backend}.sqlite"), src + "/", dst]
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    note = []
    threading.Thread(target=lambda: note.extend(p.stderr), daemon=True).start()
    first = None
    for line in p.stdout:
        v = json.loads(line)
        if v.get("full") and v.get("ok"):
            first = v
            break
        if v.get("ok") is False:
            print(json.dumps({"backend": backend, "failed": v}), flush=True)
    full_s = time.time() - t0
    peak_full = status_kb(p.pid, "VmHWM")
    # Let the scan's buffers go back, then measure.
    time.sleep(5)
    c0, t1 = cpu_s(p.pid), time.time()
    rss = []
    while time.time() < t1 + seconds:
        time.sleep(1)
        rss.append(status_kb(p.pid, "VmRSS"))
    c1, t2 = cpu_s(p.pid), time.time()
    threads = len(os.listdir(f"/proc/{p.pid}/task"))
    p.terminate()
    p.wait()
    res = {
        "backend": backend,
        "watching": "".join(note).strip().splitlines()[:1],
        "first_full_sync_s": round(full_s, 1),
        "first_full_files": first and first.get("files"),
        "peak_rss_during_full_sync_mb": round(peak_full / 1024, 1),
        "idle_s": round(t2 - t1, 1),
        "idle_cpu_ms_per_s": round(1000 * (c1 - c0) / (t2 - t1), 2),
        "idle_rss_mb": round(max(rss) / 1024, 1),
        "threads": threads,
    }
    print(json.dumps(res), flush=True)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("--dst", default="/var/tmp/ramsys-watch-idle/dst")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--backends", default="fanotify,inotify")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    work = os.path.dirname(os.path.abspath(args.dst))
    os.makedirs(work, exist_ok=True)
    for b in args.backends.split(","):
        run(os.path.abspath(args.src), args.dst, b, args.seconds, work)
    if not args.keep:
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
