#!/usr/bin/env python3
"""Streams through the WAN emulator (issue 21): `ramsys cp` with no flags vs
hand-picked `--streams N`, GridFTP `-p 4 -cc 16` and `iperf3 -P N`, pushed to
a daemon through bench/wanem at several RTTs, tools interleaved in each round.

    python3 bench/streams_wan.py --src DIR --rtts 0,20,50,100 --rounds 3 \
        [--tools auto,s4,s8,s16,s32,gridftp,iperfauto,pauto,p16] [--out results.json]

DIR (its top directory) is pushed from where it is to a daemon whose root is
a tmpfs under --scratch; the pull tools (pauto: no flags, pN: --streams N)
fetch a copy of it from under the daemon's root into that tmpfs. The
namespaces pth-a (client) and pth-b (server, daemon) are joined by wanem
with one-way delay RTT/2 and deleted on exit. Prints one JSON line per run
and a markdown table (medians, and each tool's median ratio to the no-flag
run of the same round) at the end, then one of the CPU each part used (wanem,
server, client: cores and CPU seconds per GB; the machine's busy share).
`--rate-mbit R` caps the emulated path at R Mbit/s per direction.
"""
import argparse
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

NS_A, NS_B, ADDR_A, ADDR_B = "pth-a", "pth-b", "10.213.0.1", "10.213.0.2"
ROOT = Path(__file__).resolve().parent.parent


def ns(name):
    return ["ip", "netns", "exec", name]


def make_ns(name):
    subprocess.run(["ip", "netns", "del", name], stderr=subprocess.DEVNULL)
    subprocess.run(["ip", "netns", "add", name], check=True)
    etc = Path("/etc/netns") / name
    etc.mkdir(parents=True, exist_ok=True)
    base = Path("/etc/hosts").read_text()
    (etc / "hosts").write_text(base.rstrip("\n") + f"\n{ADDR_A} pth-a\n{ADDR_B} pth-b\n")
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
    # Room for a 100 ms bandwidth-delay product (per-netns sysctls).
    subprocess.run(ns(name) + ["sysctl", "-qw", "net.ipv4.tcp_rmem=4096 131072 67108864",
                               "net.ipv4.tcp_wmem=4096 65536 67108864"], stderr=subprocess.DEVNULL)


def del_ns(name):
    subprocess.run(["ip", "netns", "del", name], stderr=subprocess.DEVNULL)
    shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)


PROCS = []


def spawn(cmd, log, **kw):
    p = subprocess.Popen(cmd, stdout=kw.pop("stdout", open(log, "ab")), stderr=subprocess.STDOUT,
                         start_new_session=True, **kw)
    PROCS.append(p)
    return p


def stop(p):
    if p and p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def cleanup():
    for p in PROCS:
        stop(p)
    del_ns(NS_A)
    del_ns(NS_B)


class Wan:
    def __init__(self, a, rtt):
        self.a, self.rtt = a, rtt

    def __enter__(self):
        make_ns(NS_A)
        make_ns(NS_B)
        log = self.a.work / f"wanem-{self.rtt}.log"
        log.unlink(missing_ok=True)
        self.p = spawn([self.a.wanem, "--ns-a", NS_A, "--ns-b", NS_B, "--addr-a", ADDR_A,
                        "--addr-b", ADDR_B, "--delay-ms", str(self.rtt / 2), "--rate-mbit",
                        str(self.a.rate_mbit), "--queue-pkts", "1000"], log)
        for _ in range(100):
            if "ready" in log.read_text():
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("wanem did not start: " + log.read_text()[-400:])
        out = subprocess.run(ns(NS_A) + ["ping", "-q", "-c", "5", "-i", "0.2", ADDR_B],
                             capture_output=True, text=True).stdout
        m = re.search(r"= [\d.]+/([\d.]+)/", out)
        self.ping = float(m.group(1)) if m else None
        return self

    def __exit__(self, *e):
        stop(self.p)
        del_ns(NS_A)
        del_ns(NS_B)


def cpu_s(pid):
    """CPU seconds (user + system) of process `pid` and its reaped children."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return sum(int(x) for x in f[11:15]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def busy_s():
    """CPU seconds the machine spent not idle so far (all CPUs)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(f) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")


class Cpu:
    """CPU over one run, in cores (CPU seconds / wall seconds): the emulator,
    the server process, the client (this script's waited-for children) and
    the whole machine's share busy (1.0 = every CPU)."""

    def __init__(self, wan, server=None):
        self.pids = {"wanem": wan.p.pid, "server": server.pid if server else None}
        self.t0 = {k: cpu_s(p) for k, p in self.pids.items() if p}
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.c0, self.m0, self.w0 = ru.ru_utime + ru.ru_stime, busy_s(), time.time()

    def done(self, r):
        wall = time.time() - self.w0
        for k, p in self.pids.items():
            if p:
                r[f"cpu_{k}"] = round((cpu_s(p) - self.t0[k]) / wall, 2)
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        r["cpu_client"] = round((ru.ru_utime + ru.ru_stime - self.c0) / wall, 2)
        r["cpu_machine"] = round((busy_s() - self.m0) / wall / os.cpu_count(), 2)
        return r


def start_daemon(a, dst, binary=None):
    log = a.work / "serve.log"
    p = spawn(ns(NS_B) + [binary or a.ramsys, "serve", "--listen", f"{ADDR_B}:0", "--root", str(dst),
                          "--key-file", str(a.work / "key")], log, stdout=subprocess.PIPE)
    box = []
    t = threading.Thread(target=lambda: box.append(p.stdout.readline()), daemon=True)
    t.start()
    t.join(15)
    m = re.search(rb"listening on \S*:(\d+)", box[0] if box else b"")
    if not m:
        raise RuntimeError("daemon did not start: " + log.read_text()[-400:])

    def drain():
        with open(log, "ab") as o:
            for c in iter(lambda: p.stdout.read1(65536), b""):
                o.write(c)
    threading.Thread(target=drain, daemon=True).start()
    for _ in range(50):
        if (a.work / "key").exists():
            break
        time.sleep(0.1)
    return p, int(m.group(1))


def run_ramsys(a, port, src, dst, streams, binary=None):
    flags = [] if streams is None else ["--streams", str(streams)]
    cmd = ns(NS_A) + [binary or a.ramsys, "cp", "-r", "--json", "--key-file", str(a.work / "key")] + flags + \
        [str(src), f"ramsys://{ADDR_B}:{port}/{a.tag}"]
    t = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    wall = time.time() - t
    summ = next((json.loads(l) for l in reversed(r.stdout.splitlines()) if '"summary"' in l), None)
    if r.returncode != 0 or not summ:
        return {"ok": False, "err": (r.stderr or r.stdout)[-300:]}
    c = summ.get("stream_choice") or {}
    g = c.get("growth") or {}
    return {"ok": True, "wall_s": wall, "mb_s": summ["bytes"] / 1e6 / wall,
            "streams": summ["streams"], "chosen": c.get("streams"),
            "stages": [(s["streams"], round(s["mb_s"]), s.get("busy_pct"), s.get("rtt_x"))
                       for s in g.get("stages", [])],
            "stopped": g.get("stopped")}


def run_pull(a, port, dst, streams):
    """Pull the copy under the daemon's root (dst/pull-TAG) into scratch/pulled/TAG."""
    out = Path(a.scratch) / "pulled"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    flags = [] if streams is None else ["--streams", str(streams)]
    cmd = ns(NS_A) + [a.ramsys, "cp", "-r", "--json", "--key-file", str(a.work / "key")] + flags + \
        [f"ramsys://{ADDR_B}:{port}/pull-{a.tag}", str(out / a.tag)]
    t = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    wall = time.time() - t
    shutil.rmtree(out, ignore_errors=True)
    summ = next((json.loads(l) for l in reversed(r.stdout.splitlines()) if '"summary"' in l), None)
    if r.returncode != 0 or not summ:
        return {"ok": False, "err": (r.stderr or r.stdout)[-300:]}
    c = summ.get("stream_choice") or {}
    g = c.get("growth") or {}
    return {"ok": True, "wall_s": wall, "mb_s": summ["bytes"] / 1e6 / wall,
            "streams": summ["streams"], "chosen": c.get("streams"),
            "stages": [(s["streams"], round(s["mb_s"]), s.get("busy_pct"), s.get("rtt_x"))
                       for s in g.get("stages", [])],
            "stopped": g.get("stopped")}


def run_gridftp(a, port, src, dst):
    t = time.time()
    r = subprocess.run(ns(NS_A) + ["globus-url-copy", "-r", "-cd", "-fast", "-p", "4", "-cc", "16",
                                   "-pp", f"file://{src}/", f"ftp://{ADDR_B}:{port}{dst / a.tag}/"],
                       capture_output=True, text=True, timeout=a.timeout)
    wall = time.time() - t
    if r.returncode != 0:
        return {"ok": False, "err": (r.stderr or r.stdout)[-300:]}
    return {"ok": True, "wall_s": wall, "mb_s": a.bytes / 1e6 / wall}


def run_iperf(a, n, secs, wan):
    srv = spawn(ns(NS_B) + ["iperf3", "-s", "-B", ADDR_B, "-1", "-p", "5299"], a.work / "iperf.log")
    time.sleep(0.5)
    cpu = Cpu(wan, srv)
    r = subprocess.run(ns(NS_A) + ["iperf3", "-c", ADDR_B, "-p", "5299", "-t", str(secs), "-O", "2",
                                   "-P", str(n), "-J"], capture_output=True, text=True, timeout=60)
    out = cpu.done({})
    stop(srv)
    try:
        bps = json.loads(r.stdout)["end"]["sum_received"]["bits_per_second"]
    except Exception:
        return {"ok": False, "err": r.stdout[-300:]}
    return {"ok": True, "mb_s": bps / 8e6, **out}


def main():
    # A plain kill (a background job ignores SIGINT) still cleans up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True)
    ap.add_argument("--rtts", default="0,20,50,100")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tools", default="auto,s4,s8,s16,s32,gridftp,iperfauto")
    ap.add_argument("--ramsys", default=str(ROOT / "target/release/ramsys"))
    ap.add_argument("--ramsys-base", help="tool `base`: this binary at both ends, no flags")
    ap.add_argument("--wanem", default=str(ROOT / "target/release/wanem"))
    ap.add_argument("--scratch", default="/dev/shm/pth-bench")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--rate-mbit", type=float, default=0,
                    help="wanem's rate cap per direction (0: none; the emulator's CPU is then the cap)")
    ap.add_argument("--out")
    ap.add_argument("--ns", default="pth", help="namespace prefix (NS-a, NS-b): runs side by side")
    a = ap.parse_args()
    global NS_A, NS_B
    NS_A, NS_B = f"{a.ns}-a", f"{a.ns}-b"
    a.src = Path(a.src).resolve()
    a.work = Path(a.scratch) / "work"
    a.work.mkdir(parents=True, exist_ok=True)
    dst = Path(a.scratch) / "dst"
    a.tag = a.src.name
    a.bytes = sum(f.stat().st_size for f in a.src.rglob("*") if f.is_file())
    tools = a.tools.split(",")
    results = []
    try:
        for rtt in [float(x) for x in a.rtts.split(",")]:
            with Wan(a, rtt) as w:
                print(f"# rtt {rtt} ms: ping {w.ping} ms; {os.getloadavg()}", flush=True)
                dst.mkdir(parents=True, exist_ok=True)
                daemon, port = start_daemon(a, dst)
                bdaemon = None
                if "base" in tools:
                    bdaemon, bport = start_daemon(a, dst, a.ramsys_base)
                gsrv = None
                if "gridftp" in tools:
                    gport = 2811
                    gsrv = spawn(ns(NS_B) + ["globus-gridftp-server", "-aa", "-anonymous-user", "root",
                                             "-allow-root", "-s", "-p", str(gport), "-control-interface",
                                             ADDR_B, "-data-interface", ADDR_B, "-home-dir", "/",
                                             "-log-level", "error"], a.work / "gridftp.log")
                    time.sleep(1)
                if any(t.startswith("p") for t in tools):
                    # Pull tools (pauto, pN) fetch a copy under the daemon's root.
                    shutil.rmtree(dst / f"pull-{a.tag}", ignore_errors=True)
                    shutil.copytree(a.src, dst / f"pull-{a.tag}", symlinks=True)
                for rnd in range(a.rounds):
                    # Rotate the order each round so no tool always runs first.
                    order = tools[rnd % len(tools):] + tools[:rnd % len(tools)]
                    for t in order:
                        shutil.rmtree(dst / a.tag, ignore_errors=True)
                        load = os.getloadavg()[0]
                        srv = {"gridftp": gsrv, "base": bdaemon}.get(t, daemon)
                        cpu = None if t.startswith("iperf") else Cpu(w, srv)
                        if t == "auto":
                            r = run_ramsys(a, port, a.src, dst, None)
                        elif t == "base":
                            r = run_ramsys(a, bport, a.src, dst, None, a.ramsys_base)
                        elif t == "pauto":
                            r = run_pull(a, port, dst, None)
                        elif t.startswith("p"):
                            r = run_pull(a, port, dst, int(t[1:]))
                        elif t.startswith("s"):
                            r = run_ramsys(a, port, a.src, dst, int(t[1:]))
                        elif t == "gridftp":
                            r = run_gridftp(a, gport, a.src, dst)
                        elif t == "iperfauto":
                            # As many streams as ramsys ended with at this RTT.
                            n = next((x["streams"] for x in reversed(results) if x["rtt"] == rtt
                                      and x["tool"] == "auto" and x["ok"]), 16)
                            r = run_iperf(a, n, 8, w)
                            r["streams"] = n
                        elif t.startswith("iperf"):
                            r = run_iperf(a, int(t[5:]), 8, w)
                        if cpu:
                            cpu.done(r)
                        r.update(rtt=rtt, round=rnd, tool=t, load=load)
                        results.append(r)
                        print(json.dumps(r), flush=True)
                shutil.rmtree(dst / a.tag, ignore_errors=True)
                shutil.rmtree(dst / f"pull-{a.tag}", ignore_errors=True)
                stop(gsrv)
                stop(daemon)
                stop(bdaemon)
    finally:
        cleanup()
        if a.out:
            Path(a.out).write_text(json.dumps(results, indent=1))
    table(results, tools)


def table(results, tools):
    rtts = sorted({r["rtt"] for r in results})
    print("\n| RTT ms | " + " | ".join(tools) + " |")
    print("|---|" + "---|" * len(tools))
    for rtt in rtts:
        cells = []
        auto = {r["round"]: r["mb_s"] for r in results if r["rtt"] == rtt and r["tool"] == "auto" and r["ok"]}
        for t in tools:
            rs = [r for r in results if r["rtt"] == rtt and r["tool"] == t and r["ok"]]
            if not rs:
                cells.append("–")
                continue
            m = statistics.median(r["mb_s"] for r in rs)
            c = f"{m:,.0f}"
            if t == "iperfauto":
                c += " [" + "/".join(str(r["streams"]) for r in rs) + "]"
            if t != "auto":
                ratios = [auto[r["round"]] / r["mb_s"] for r in rs if r["round"] in auto]
                if ratios:
                    c += f" ({statistics.median(ratios):.2f})"
            else:
                c += " [" + "/".join(str(r["streams"]) for r in rs) + "]"
            cells.append(c)
        print(f"| {rtt:g} | " + " | ".join(cells) + " |")
    # Where the CPU went: per tool, medians over runs of the cores each part
    # used during the run and its CPU seconds per GB moved (wanem = the path).
    print("\n| RTT ms | tool | MB/s | wanem cores (s/GB) | server cores (s/GB) | client cores (s/GB) "
          "| machine busy | streams start→end |")
    print("|---|---|---|---|---|---|---|---|")
    for rtt in rtts:
        for t in tools:
            rs = [r for r in results if r["rtt"] == rtt and r["tool"] == t and r["ok"] and "cpu_wanem" in r]
            if not rs:
                continue
            med = lambda k: statistics.median(r.get(k, 0) for r in rs)
            gb = lambda k: statistics.median(r.get(k, 0) / (r["mb_s"] / 1e3) for r in rs)
            cells = [f"{med(k):.2f} ({gb(k):.2f})" for k in ("cpu_wanem", "cpu_server", "cpu_client")]
            ss = "/".join(f"{r.get('chosen') or r.get('streams', '')}→{r.get('streams', '')}" for r in rs)
            print(f"| {rtt:g} | {t} | {med('mb_s'):,.0f} | " + " | ".join(cells) +
                  f" | {med('cpu_machine'):.2f} | {ss} |")


if __name__ == "__main__":
    main()
