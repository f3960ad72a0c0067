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
- ramsys only: a renamed 1 GiB file and a renamed directory of 10,000
  files, bytes moved (its --json batch lines) and time to the new name.

Replicators: `ramsys sync -r --delete --watch SRC/ DST` (local DST: the
agent's in-process daemon on loopback), lsyncd (Debian's 2.2.3,
default.rsync, delay 1 s: its minimum useful batching; the default is 15 s),
and Syncthing (Debian's 1.19.2: two instances on loopback, SRC a send-only
folder, DST a receive-only one, file-system watcher on with its delay at
1 s (the default is 10 s), discovery, relays, NAT and reporting off; its
CPU is both instances').

Usage: bench/watch_bench.py [--seconds 60] [--only ramsys|lsyncd|syncthing] [--dir D]
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


ST_CONFIG = """<configuration version="36">
  <folder id="bench" label="bench" path="{path}" type="{kind}" rescanIntervalS="3600"
          fsWatcherEnabled="true" fsWatcherDelayS="1" ignorePerms="false" autoNormalize="true">
    <device id="{me}"></device>
    <device id="{peer}"></device>
    <minDiskFree unit="%">0</minDiskFree>
  </folder>
  <device id="{me}" name="me"><address>dynamic</address></device>
  <device id="{peer}" name="peer"><address>tcp://127.0.0.1:{peer_port}</address></device>
  <gui enabled="true" tls="false"><address>127.0.0.1:{gui_port}</address><apikey>bench</apikey></gui>
  <options>
    <listenAddress>tcp://127.0.0.1:{port}</listenAddress>
    <globalAnnounceEnabled>false</globalAnnounceEnabled>
    <localAnnounceEnabled>false</localAnnounceEnabled>
    <relaysEnabled>false</relaysEnabled>
    <natEnabled>false</natEnabled>
    <startBrowser>false</startBrowser>
    <urAccepted>-1</urAccepted>
    <autoUpgradeIntervalH>0</autoUpgradeIntervalH>
    <crashReportingEnabled>false</crashReportingEnabled>
    <setLowPriority>false</setLowPriority>
    <minHomeDiskFree unit="%">0</minHomeDiskFree>
  </options>
</configuration>
"""


def start_syncthing(src, dst, work):
    """Two Syncthing instances on loopback: SRC send-only, DST receive-only."""
    homes = [os.path.join(work, "st-src"), os.path.join(work, "st-dst")]
    ids = []
    for h in homes:
        subprocess.run(["syncthing", "generate", "--home=" + h, "--no-default-folder",
                        "--skip-port-probing"], check=True, capture_output=True)
        ids.append(subprocess.run(["syncthing", "--home=" + h, "--device-id"], check=True,
                                  capture_output=True, text=True).stdout.strip())
    ports = [22101, 22102]
    procs = []
    for i, (h, path, kind) in enumerate([(homes[0], src, "sendonly"),
                                          (homes[1], dst, "receiveonly")]):
        os.makedirs(os.path.join(path, ".stfolder"), exist_ok=True)
        with open(os.path.join(h, "config.xml"), "w") as f:
            f.write(ST_CONFIG.format(path=path, kind=kind, me=ids[i], peer=ids[1 - i],
                                     port=ports[i], peer_port=ports[1 - i],
                                     gui_port=28384 + i))
        env = dict(os.environ, STNOUPGRADE="1", STNORESTART="1")
        procs.append(subprocess.Popen(
            ["syncthing", "serve", "--home=" + h, "--no-browser", "--no-restart",
             "--no-upgrade", "--logfile=" + os.path.join(work, f"syncthing{i}.log")],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return procs


def start(name, src, dst, work):
    """The replicator's processes."""
    if name == "syncthing":
        return start_syncthing(src, dst, work)
    if name == "ramsys":
        cmd = [RAMSYS, "sync", "-r", "--delete", "--watch", "--json",
               "--watch-journal", os.path.join(work, "journal.sqlite"), src + "/", dst]
        return [subprocess.Popen(cmd, stdout=open(os.path.join(work, "ramsys.jsonl"), "w"),
                                 stderr=subprocess.DEVNULL)]
    cfg = os.path.join(work, "lsyncd.lua")
    with open(cfg, "w") as f:
        f.write('settings { nodaemon = true, insist = true, maxProcesses = 4,\n'
                f'  logfile = "{work}/lsyncd.log" }}\n'
                f'sync {{ default.rsync, source = "{src}/", target = "{dst}/", delay = 1,\n'
                '  rsync = { archive = true, whole_file = true } }\n')
    return [subprocess.Popen(["lsyncd", cfg], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)]


def wait_dirs(dst, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        if all(os.path.isdir(os.path.join(dst, f"d{i:02}")) for i in range(SUBDIRS)):
            return True
        time.sleep(0.1)
    return False


def same(src, dst):
    """Whether DST holds SRC's names and contents (and file attributes); a
    directory's mtime alone is counted apart (Syncthing does not keep it)."""
    o = subprocess.run(["rsync", "-anc", "--delete", "--itemize-changes", src + "/", dst + "/"],
                       capture_output=True, text=True)
    lines = o.stdout.splitlines()
    dir_times = [l for l in lines if l.startswith(".d..t...... ")]
    return len(lines) == len(dir_times), len(lines) - len(dir_times), len(dir_times)


def rename_big(src, dst, work):
    """ramsys: a 1 GiB file, then a directory of 10,000 files, each renamed
    once at DST; bytes its batches moved for each rename."""
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
    out = {"rename_1g_s": round(took, 3),
           "rename_1g_bytes": sum(l.get("bytes", 0) for l in lines)}
    # A directory of 10,000 files, once at DST, renamed.
    many = os.path.join(src, "many")
    os.makedirs(many)
    for i in range(10000):
        with open(os.path.join(many, f"f{i:05}"), "wb") as f:
            f.write(b"x" * 4096)
    last = os.path.join(dst, "many", "f09999")
    end = time.time() + 120
    while time.time() < end and not os.path.exists(last):
        time.sleep(0.1)
    time.sleep(1)
    before = sum(1 for _ in open(log))
    t = time.time()
    os.rename(many, os.path.join(src, "many-renamed"))
    while time.time() < t + 60 and not os.path.exists(os.path.join(dst, "many-renamed", "f09999")):
        time.sleep(0.01)
    took = time.time() - t
    time.sleep(1)
    lines = [json.loads(l) for l in list(open(log))[before:]]
    out.update({"rename_10k_dir_s": round(took, 3),
                "rename_10k_dir_bytes": sum(l.get("bytes", 0) for l in lines)})
    return out


def run(name, args):
    work = os.path.join(args.dir, name)
    shutil.rmtree(work, ignore_errors=True)
    src, dst = os.path.join(work, "src"), os.path.join(work, "dst")
    for i in range(SUBDIRS):
        os.makedirs(os.path.join(src, f"d{i:02}"))
    os.makedirs(dst)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    ps = start(name, src, dst, work)
    if not wait_dirs(dst):
        for p in ps:
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
    for p in ps:
        p.terminate()
    for p in ps:
        p.wait()
    w.stop = True
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    lag = {k: w.seen[k] - t for k, t in closes.items() if k in w.seen}
    eq, diffs, dir_times = same(src, dst)
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
        "dir_mtimes_differ": dir_times,
    }
    res.update(extra)
    print(json.dumps(res), flush=True)
    if not args.keep:
        subprocess.run(["rm", "-rf", work])
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply both writer rates")
    ap.add_argument("--settle", type=float, default=120)
    ap.add_argument("--only", choices=["ramsys", "lsyncd", "syncthing"])
    ap.add_argument("--dir", default="/var/tmp/ramsys-watch-bench")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    for name in ["ramsys", "lsyncd", "syncthing"]:
        if args.only and args.only != name:
            continue
        if name != "ramsys" and not shutil.which(name):
            print(json.dumps({"replicator": name,
                              "skipped": f"not installed (apt-get install {name})"}))
            continue
        run(name, args)


if __name__ == "__main__":
    main()
