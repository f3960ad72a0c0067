#!/usr/bin/env python3
"""Continuous replication benchmark (issue 38, docs/WATCH.md, docs/BENCHMARKS.md).

A writer creates 1 MiB files at 200/s and 4 KiB files at 5,000/s (two
processes, paced on a schedule) for --seconds into a watched tree; a
replicator keeps DST following SRC. Reported per replicator:

- lag from close() at the source to the rename into place at DST (p50,
  p99, max), timed by an inotify watch on DST's directories (IN_MOVED_TO:
  both ramsys and rsync write a temp name and rename it);
- files that never arrived within --settle seconds after the writer ended;
- CPU per file: the replicator's process tree (RUSAGE_CHILDREN after it is
  reaped: lsyncd's rsync children included);
- whether DST equals SRC at the end (`rsync -anc --delete`, content and
  names, prints nothing when equal);
- ramsys only: a renamed 1 GiB file, bytes moved (its --json batch lines).

Replicators: `ramsys sync -r --delete --watch SRC/ DST` (local DST: the
agent's in-process daemon on loopback), and lsyncd (Debian's 2.2.3,
default.rsync, delay 1 s: its minimum useful batching; the default is 15 s).

Usage: bench/watch_bench.py [--seconds 60] [--only ramsys|lsyncd] [--dir D]
"""
import argparse
import ctypes
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import threading
import time
from multiprocessing import Process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RAMSYS = os.environ.get("RAMSYS", os.path.join(ROOT, "target/release/ramsys"))
SUBDIRS = 16

libc = ctypes.CDLL("libc.so.6", use_errno=True)
IN_MOVED_TO = 0x80
IN_CREATE = 0x100


class DstWatch(threading.Thread):
    """Time every name that appears in DST's directories (inotify)."""

    def __init__(self, dirs):
        super().__init__(daemon=True)
        self.fd = libc.inotify_init1(0)
        self.wd = {}
        for d in dirs:
            w = libc.inotify_add_watch(self.fd, d.encode(), IN_MOVED_TO | IN_CREATE)
            self.wd[w] = os.path.basename(d)
        self.seen = {}
        self.stop = False

    def run(self):
        while not self.stop:
            buf = os.read(self.fd, 1 << 20)
            now = time.time()
            i = 0
            while i < len(buf):
                wd, mask, _cookie, ln = struct.unpack_from("iIII", buf, i)
                name = buf[i + 16:i + 16 + ln].rstrip(b"\0").decode()
                i += 16 + ln
                if not name.startswith("."):
                    self.seen.setdefault(self.wd.get(wd, "?") + "/" + name, now)


def writer(src, kind, size, rate, seconds, out):
    """Create files on a schedule; record each one's close() time."""
    data = os.urandom(size)
    t0 = time.time()
    n = int(rate * seconds)
    log = []
    for i in range(n):
        due = t0 + i / rate
        d = due - time.time()
        if d > 0:
            time.sleep(d)
        rel = f"d{i % SUBDIRS:02}/{kind}{i:07}"
        with open(os.path.join(src, rel), "wb") as f:
            f.write(data)
        log.append((rel, time.time()))
    with open(out, "w") as f:
        json.dump(log, f)


def pct(v, p):
    if not v:
        return float("nan")
    v = sorted(v)
    return v[min(len(v) - 1, int(p / 100 * len(v)))]


def start(name, src, dst, work):
    if name == "ramsys":
        cmd = [RAMSYS, "sync", "-r", "--delete", "--watch", "--json",
               "--watch-journal", os.path.join(work, "journal.sqlite"), src + "/", dst]
        return subprocess.Popen(cmd, stdout=open(os.path.join(work, "ramsys.jsonl"), "w"),
                                stderr=subprocess.DEVNULL)
    cfg = os.path.join(work, "lsyncd.lua")
    with open(cfg, "w") as f:
        f.write('settings { nodaemon = true, insist = true, maxProcesses = 4,\n'
                f'  logfile = "{work}/lsyncd.log" }}\n'
                f'sync {{ default.rsync, source = "{src}/", target = "{dst}/", delay = 1,\n'
                '  rsync = { archive = true, whole_file = true } }\n')
    return subprocess.Popen(["lsyncd", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_dirs(dst, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        if all(os.path.isdir(os.path.join(dst, f"d{i:02}")) for i in range(SUBDIRS)):
            return True
        time.sleep(0.1)
    return False


def same(src, dst):
    o = subprocess.run(["rsync", "-anc", "--delete", "--itemize-changes", src + "/", dst + "/"],
                       capture_output=True, text=True)
    return o.stdout.strip() == "", len(o.stdout.splitlines())


def rename_big(src, dst, work):
    """ramsys: a 1 GiB file, then renamed; bytes its batches moved for the rename."""
    big = os.path.join(src, "big.bin")
    with open(big, "wb") as f:
        for _ in range(1024):
            f.write(os.urandom(1 << 20))
    end = time.time() + 120
    while time.time() < end and not (os.path.exists(os.path.join(dst, "big.bin"))
                                     and os.path.getsize(os.path.join(dst, "big.bin")) == 1 << 30):
        time.sleep(0.1)
    log = os.path.join(work, "ramsys.jsonl")
    before = sum(1 for _ in open(log))
    t = time.time()
    os.rename(big, os.path.join(src, "renamed.bin"))
    while time.time() < t + 60 and not os.path.exists(os.path.join(dst, "renamed.bin")):
        time.sleep(0.01)
    took = time.time() - t
    time.sleep(1)
    lines = [json.loads(l) for l in list(open(log))[before:]]
    return {"rename_1g_s": round(took, 3), "rename_1g_bytes": sum(l.get("bytes", 0) for l in lines)}


def run(name, args):
    work = os.path.join(args.dir, name)
    shutil.rmtree(work, ignore_errors=True)
    src, dst = os.path.join(work, "src"), os.path.join(work, "dst")
    for i in range(SUBDIRS):
        os.makedirs(os.path.join(src, f"d{i:02}"))
    os.makedirs(dst)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = start(name, src, dst, work)
    if not wait_dirs(dst):
        p.kill()
        sys.exit(f"{name}: DST directories never appeared")
    w = DstWatch([os.path.join(dst, f"d{i:02}") for i in range(SUBDIRS)])
    w.start()
    time.sleep(1)
    logs = [os.path.join(work, "big.json"), os.path.join(work, "small.json")]
    ws = [Process(target=writer, args=(src, "m", 1 << 20, 200 * args.scale, args.seconds, logs[0])),
          Process(target=writer, args=(src, "k", 4096, 5000 * args.scale, args.seconds, logs[1]))]
    t0 = time.time()
    for x in ws:
        x.start()
    for x in ws:
        x.join()
    wrote = time.time() - t0
    closes = dict(c for l in logs for c in json.load(open(l)))
    end = time.time() + args.settle
    while time.time() < end and len([k for k in closes if k in w.seen]) < len(closes):
        time.sleep(0.2)
    extra = rename_big(src, dst, work) if name == "ramsys" else {}
    time.sleep(2)
    p.terminate()
    p.wait()
    w.stop = True
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    lag = {k: w.seen[k] - t for k, t in closes.items() if k in w.seen}
    eq, diffs = same(src, dst)
    res = {
        "replicator": name,
        "files": len(closes),
        "writer_s": round(wrote, 1),
        "arrived": len(lag),
        "lag_1m_p50_s": round(pct([v for k, v in lag.items() if "/m" in k], 50), 3),
        "lag_1m_p99_s": round(pct([v for k, v in lag.items() if "/m" in k], 99), 3),
        "lag_4k_p50_s": round(pct([v for k, v in lag.items() if "/k" in k], 50), 3),
        "lag_4k_p99_s": round(pct([v for k, v in lag.items() if "/k" in k], 99), 3),
        "lag_max_s": round(max(lag.values(), default=float("nan")), 3),
        "cpu_s": round(cpu, 1),
        "cpu_ms_per_file": round(1000 * cpu / max(1, len(closes)), 3),
        "dst_equals_src": eq,
        "differences": diffs,
    }
    res.update(extra)
    print(json.dumps(res), flush=True)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply both writer rates")
    ap.add_argument("--settle", type=float, default=120)
    ap.add_argument("--only", choices=["ramsys", "lsyncd"])
    ap.add_argument("--dir", default="/var/tmp/ramsys-watch-bench")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    for name in ["ramsys", "lsyncd"]:
        if args.only and args.only != name:
            continue
        if name == "lsyncd" and not shutil.which("lsyncd"):
            print('{"replicator": "lsyncd", "skipped": "not installed (apt-get install lsyncd)"}')
            continue
        run(name, args)


if __name__ == "__main__":
    main()
