#!/usr/bin/env python3
"""Small files (issue 17): the kernel-like tree (bench/run.py's `kernel`
workload, 47,984 files at scale 1) pushed by `ramsys cp -r --streams 4` to a
daemon on loopback, against `cp -a` and `rsync -aW` to `rsync --daemon` of
the same tree on the same disk, in settled, interleaved rounds.

    sudo python3 bench/small_files.py [--rounds 3] [VARIANT...]

A VARIANT is `LABEL=BINARY[,VAR=VALUE...][,serve:ARGS][,cp:ARGS]` (or just
BINARY): a ramsys binary whose daemon runs with those environment variables
(the client gets them too) and extra `serve` arguments, its client with
extra `cp` arguments (ARGS split at spaces); default `ramsys=target/release/ramsys`. `--local` adds a `ramsys cp -r`
local run per variant. Every run copies into a new directory; finished
copies are renamed into a trash directory, never deleted before the next
run: ext4 skips inodes freed in the last 60-360 s when it allocates
(ialloc.c recently_deleted()), which makes any tool run right after `rm -rf`
of a 48k-file copy 5-20x slower. Between rounds the trash is deleted, the
file system synced, the caches dropped, the source warmed again and the
script waits `--settle` seconds. The order of the tools rotates each round.

Per run: wall seconds, CPU seconds of the client (wait4) and of the daemon
(/proc/PID/stat delta), and with `--threads` the CPU of every thread of both
ends (sampled from /proc/PID/task every 50 ms; the last sample of each
thread). Prints per-tool medians and same-round ratios to the first variant.
"""
import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")


def log(*a):
    print(*a, flush=True)


def uptime():
    return open("/proc/loadavg").read().split()[0]


def proc_cpu(pid):
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])) / HZ
    except OSError:
        return 0.0


class ThreadSampler:
    """Last-seen CPU seconds of every thread of the given pids."""

    def __init__(self, pids):
        self.pids, self.seen, self.stop = pids, {}, threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)

    def sample(self):
        for who, pid in self.pids.items():
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    s = open(f"/proc/{pid}/task/{tid}/stat").read()
                except OSError:
                    continue
                comm = s[s.index("(") + 1:s.rindex(")")]
                f = s.rsplit(")", 1)[1].split()
                self.seen[(who, tid)] = (comm, (int(f[11]) + int(f[12])) / HZ)

    def run(self):
        while not self.stop.is_set():
            self.sample()
            time.sleep(0.05)

    def start(self, pids_more=None):
        if pids_more:
            self.pids.update(pids_more)
        self.t.start()

    def finish(self, base):
        self.stop.set()
        self.t.join()
        out = {}
        for (who, tid), (comm, cpu) in self.seen.items():
            cpu -= base.get((who, tid), (comm, 0.0))[1]
            if cpu > 0.005:
                k = f"{who}:{comm}"
                out[k] = out.get(k, 0.0) + cpu
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def run_client(cmd, env=None, sampler=None):
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    if sampler:
        sampler.start({"cli": p.pid})
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode(errors="replace")
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exit {p.returncode}: {err.strip()[-300:]}")
    return wall, ru.ru_utime + ru.ru_stime


class Ramsys:
    def __init__(self, label, binary, envs, work, streams, local, sargs=(), cargs=()):
        self.label, self.bin, self.local = label, binary, local
        self.sargs, self.cargs = list(sargs), list(cargs)
        self.env = dict(os.environ, **envs)
        self.root = work / f"d-{label}"
        self.work, self.streams = work, streams
        self.daemon = None

    def start(self):
        if self.local:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        key = self.work / f"key-{self.label}"
        out = open(self.work / f"daemon-{self.label}.out", "w")
        self.daemon = subprocess.Popen(
            [self.bin, "serve", "--listen", "127.0.0.1:0", "--root", str(self.root), "--key-file", str(key)] + self.sargs,
            stdout=out, stderr=open(self.work / f"daemon-{self.label}.err", "w"), env=self.env)
        for _ in range(200):
            txt = (self.work / f"daemon-{self.label}.out").read_text()
            if "listening on" in txt and key.exists():
                self.port = int(txt.split("listening on", 1)[1].split()[0].rsplit(":", 1)[1].rstrip(","))
                self.key = key
                return
            time.sleep(0.05)
        raise RuntimeError(f"daemon {self.label} did not start")

    def stop(self):
        if self.daemon:
            self.daemon.send_signal(2)
            try:
                self.daemon.wait(10)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait()

    def run(self, src, name, sampler):
        if self.local:
            dst = self.work / f"l-{self.label}" / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            cmd = [self.bin, "cp", "-r", "--streams", str(self.streams)] + self.cargs + [str(src), str(dst)]
            wall, cpu = run_client(cmd, self.env, sampler)
            return wall, cpu, 0.0, dst
        cmd = [self.bin, "cp", "-r", "--streams", str(self.streams), "--key-file", str(self.key)] + \
            self.cargs + [str(src), f"ramsys://127.0.0.1:{self.port}/{name}"]
        if sampler:
            sampler.pids["srv"] = self.daemon.pid
        d0 = proc_cpu(self.daemon.pid)
        wall, cpu = run_client(cmd, self.env, sampler)
        time.sleep(0.05)
        return wall, cpu, proc_cpu(self.daemon.pid) - d0, self.root / name


class Rsyncd:
    label = "rsyncd"

    def __init__(self, work):
        self.work, self.root = work, work / "d-rsyncd"

    def start(self):
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        conf = self.work / "rsyncd.conf"
        conf.write_text("use chroot = false\nuid = root\ngid = root\n"
                        f"pid file = {self.work}/rsyncd.pid\nlog file = {self.work}/rsyncd.log\n"
                        f"[bench]\npath = {self.root}\nread only = false\n")
        self.daemon = subprocess.Popen(["rsync", "--daemon", "--no-detach", f"--config={conf}",
                                        "--address=127.0.0.1", f"--port={self.port}"])
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("rsync daemon did not start")

    def stop(self):
        self.daemon.terminate()
        self.daemon.wait()

    def run(self, src, name, sampler):
        d0 = proc_cpu(self.daemon.pid)
        if sampler:
            sampler.pids["srv"] = self.daemon.pid
        wall, cpu = run_client(["rsync", "-aW", f"{src}/", f"rsync://127.0.0.1:{self.port}/bench/{name}/"],
                               None, sampler)
        time.sleep(0.05)
        return wall, cpu, proc_cpu(self.daemon.pid) - d0, self.root / name


class Cp:
    label = "cp-a"

    def __init__(self, work):
        self.root = work / "d-cp"

    def start(self):
        self.root.mkdir(parents=True, exist_ok=True)

    def stop(self):
        pass

    def run(self, src, name, sampler):
        wall, cpu = run_client(["cp", "-a", str(src), str(self.root / name)], None, sampler)
        return wall, cpu, 0.0, self.root / name


def warm(src):
    subprocess.run(f"find {src} -type f -print0 | xargs -0 cat > /dev/null", shell=True, check=True)


def same_tree(src, dst):
    r = subprocess.run(["diff", "-rq", str(src), str(dst)], capture_output=True, text=True)
    return r.returncode == 0, r.stdout[:300]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="*", default=["ramsys=target/release/ramsys"])
    ap.add_argument("--src", default="/var/tmp/ramsys-bench/src/kernel")
    ap.add_argument("--work", default="/var/tmp/ramsys-bench/small")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settle", type=float, default=10.0)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--tools", default="rsyncd,cp", help="peers besides the variants (rsyncd,cp or '')")
    ap.add_argument("--local", action="store_true", help="also `ramsys cp -r` locally per variant")
    ap.add_argument("--no-remote", action="store_true", help="only the local runs of the variants")
    ap.add_argument("--threads", action="store_true", help="per-thread CPU of both ends")
    ap.add_argument("--verify", action="store_true", help="diff -r every copy of round 1")
    ap.add_argument("--json", help="write all runs here")
    ap.add_argument("--delete", choices=["rounds", "never"], default="rounds",
                    help="rounds: empty the trash between rounds (then sync, drop caches, --settle); "
                         "never: keep every copy until you delete it (no recently freed inodes at all "
                         "during the runs; wait 6 minutes after deleting before the next measurement)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (drop_caches)")
    src, work = Path(a.src), Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    trash = work / "trash"
    nfiles = int(subprocess.run(f"find {src} -type f | wc -l", shell=True, capture_output=True,
                                text=True).stdout)
    tools = []
    for v in a.variants:
        label, rest = v.split("=", 1) if "=" in v.split(",")[0] else ("", v)
        parts = rest.split(",")
        label = label or Path(parts[0]).parent.parent.parent.name or "ramsys"
        envs = dict(p.split("=", 1) for p in parts[1:] if not p.startswith(("serve:", "cp:")))
        sargs = [x for p in parts[1:] if p.startswith("serve:") for x in p[6:].split()]
        cargs = [x for p in parts[1:] if p.startswith("cp:") for x in p[3:].split()]
        if not a.no_remote:
            tools.append(Ramsys(label, parts[0], envs, work, a.streams, False, sargs, cargs))
        if a.local or a.no_remote:
            tools.append(Ramsys(label + "-local", parts[0], envs, work, a.streams, True, sargs, cargs))
    for t in filter(None, a.tools.split(",")):
        tools.append({"rsyncd": Rsyncd, "cp": Cp}[t](work))
    for t in tools:
        t.start()
    runs = []
    n = 0
    try:
        log(f"{nfiles} files in {src}; load {uptime()}")
        for r in range(1, a.rounds + 1):
            if trash.exists() and a.delete == "rounds":
                shutil.rmtree(trash)
            os.sync()
            open("/proc/sys/vm/drop_caches", "w").write("3\n")
            time.sleep(a.settle)
            warm(src)
            order = tools[(r - 1) % len(tools):] + tools[:(r - 1) % len(tools)]
            for t in order:
                n += 1
                name = f"r{r}-{n}-{os.getpid()}"
                os.sync()
                time.sleep(1)
                load = uptime()
                sampler = ThreadSampler({}) if a.threads else None
                base = {}
                wall, ccpu, dcpu, dst = t.run(src, name, sampler)
                threads = sampler.finish(base) if sampler else None
                ok = ""
                if a.verify and r == 1:
                    good, diff = same_tree(src, dst / src.name if (dst / src.name).is_dir() else dst)
                    ok = " ok" if good else f" DIFFERS {diff}"
                trash.mkdir(exist_ok=True)
                os.rename(dst, trash / f"{t.label}-{name}")
                row = {"round": r, "tool": t.label, "wall": wall, "cpu_client": ccpu, "cpu_daemon": dcpu,
                       "load": float(load), "threads": threads}
                runs.append(row)
                log(f"round {r} {t.label:<16} {wall:6.2f} s  cpu cli {ccpu:5.2f} srv {dcpu:5.2f}  "
                    f"load {load}{ok}")
                if threads:
                    log("    " + "  ".join(f"{k} {v:.2f}" for k, v in list(threads.items())[:14]))
    finally:
        for t in tools:
            t.stop()
    log(f"load {uptime()}")
    labels = [t.label for t in tools]
    ref = labels[0]
    log(f"\n{'tool':<16} {'median s':>9} {'min-max':>13} {'cpu s':>6} {'ratio to ' + ref:>16}")
    for lab in labels:
        rs = [x for x in runs if x["tool"] == lab]
        walls = [x["wall"] for x in rs]
        cpus = [x["cpu_client"] + x["cpu_daemon"] for x in rs]
        ratios = []
        for x in rs:
            base = [y for y in runs if y["tool"] == ref and y["round"] == x["round"]]
            if base:
                ratios.append(x["wall"] / base[0]["wall"])
        log(f"{lab:<16} {statistics.median(walls):9.2f} {min(walls):6.2f}-{max(walls):<6.2f} "
            f"{statistics.median(cpus):6.2f} {statistics.median(ratios):7.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f})")
    if a.json:
        Path(a.json).write_text(json.dumps(runs, indent=1))
    if a.delete == "never":
        log(f"copies kept in {trash}")


if __name__ == "__main__":
    main()
