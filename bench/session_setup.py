#!/usr/bin/env python3
"""Session setup cost (issue 34): many tiny sessions, each `ramsys cp` of
one small file to a daemon on loopback, per ramsys binary, interleaved.

    python3 bench/session_setup.py [--sessions 1000] [--rounds 10] \
        old=/path/to/main/ramsys new=target/release/ramsys

Each variant runs its own daemon (`serve --listen 127.0.0.1:0`, root in
--work, default under /dev/shm so the disk stays out of it). A round runs
sessions/rounds copies per variant back to back, the variants' order
rotating each round; every copy is a new `ramsys cp FILE
ramsys://ADDR/NAME` process (4 streams, the default auto choice), so a
session costs process start, TCP connects, the handshake, one file and
the teardown. Prints per round the mean wall ms per session and the
daemon's CPU ms per session (/proc/PID/stat), then medians over rounds
and same-round ratios to the first variant.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / HZ


class Variant:
    def __init__(self, label, binary, work):
        self.label, self.bin = label, str(Path(binary).resolve())
        self.root = work / f"root-{label}"
        self.root.mkdir(parents=True)
        self.key = work / "key"
        out = work / f"daemon-{label}.out"
        self.daemon = subprocess.Popen(
            [self.bin, "serve", "--listen", "127.0.0.1:0", "--root", str(self.root),
             "--key-file", str(self.key)],
            stdout=open(out, "w"), stderr=open(work / f"daemon-{label}.err", "w"))
        for _ in range(200):
            txt = out.read_text()
            if "listening on" in txt:
                self.addr = txt.split("listening on", 1)[1].split()[0].rstrip(",")
                return
            time.sleep(0.05)
        raise RuntimeError(f"daemon {label} did not start")

    def stop(self):
        self.daemon.send_signal(2)
        try:
            self.daemon.wait(10)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            self.daemon.wait()

    def run(self, src, n, tag):
        d0 = proc_cpu(self.daemon.pid)
        t0 = time.monotonic()
        for i in range(n):
            cmd = [self.bin, "cp", "--key-file", str(self.key), str(src),
                   f"ramsys://{self.addr}/{tag}-{i}"]
            p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            if p.returncode != 0:
                raise RuntimeError(f"{self.label}: {p.stderr.decode(errors='replace').strip()}")
        wall = (time.monotonic() - t0) / n * 1e3
        time.sleep(0.05)
        return wall, (proc_cpu(self.daemon.pid) - d0) / n * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+", help="LABEL=BINARY")
    ap.add_argument("--sessions", type=int, default=1000, help="per variant, over all rounds")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--work", default="/dev/shm")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ramsys-setup-", dir=a.work))
    key = work / "key"
    key.write_text(os.urandom(32).hex() + "\n")
    key.chmod(0o600)
    src = work / "tiny"
    src.write_bytes(os.urandom(100))
    vs = []
    try:
        for v in a.variants:
            label, binary = v.split("=", 1)
            vs.append(Variant(label, binary, work))
        per = a.sessions // a.rounds
        rows = {v.label: [] for v in vs}
        print(f"{per} sessions per variant per round, {a.rounds} rounds; "
              f"load {open('/proc/loadavg').read().split()[0]}", flush=True)
        for r in range(a.rounds):
            order = vs[r % len(vs):] + vs[:r % len(vs)]
            for v in order:
                wall, cpu = v.run(src, per, f"r{r}")
                rows[v.label].append((wall, cpu))
                print(f"round {r + 1} {v.label:<8} {wall:7.2f} ms/session  daemon cpu "
                      f"{cpu:5.2f} ms/session  load {open('/proc/loadavg').read().split()[0]}",
                      flush=True)
        ref = vs[0].label
        print(f"\n{'variant':<8} {'median ms':>10} {'min-max':>15} {'daemon cpu ms':>14} "
              f"{'ratio to ' + ref:>14}")
        for v in vs:
            w = [x[0] for x in rows[v.label]]
            c = [x[1] for x in rows[v.label]]
            ratio = statistics.median(x[0] / y[0] for x, y in zip(rows[v.label], rows[ref]))
            print(f"{v.label:<8} {statistics.median(w):10.2f} {min(w):7.2f}-{max(w):7.2f} "
                  f"{statistics.median(c):14.2f} {ratio:14.3f}")
    finally:
        for v in vs:
            v.stop()
        subprocess.run(["rm", "-rf", str(work)])


if __name__ == "__main__":
    sys.exit(main())
