#!/usr/bin/env python3
"""ramsys benchmark suite (issue 3): ramsys against rsync, scp, GridFTP and XRootD.

Reproduces on one machine the comparison of seed 000 sec. 6.3: the same kinds of
workloads (bulk, a kernel-like tree as in Table 6.3, the log-normal mixed set of
Fig. 6-11), every installable peer, the machine's own limits (cp -a, iperf3, fio),
long RTTs through bench/wanem, and an ablation table in the style of Table 6.6.
Writes docs/BENCHMARKS.md plus PNG charts under docs/bench/.

See bench/README.md for setup, flags and the meaning of every column.
"""

import argparse
import atexit
import datetime
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
GIB = 1 << 30
MIB = 1 << 20
KIB = 1 << 10

# Workload shapes (seed 000 sec. 6.3.1). Kernel: one 3.18.21 tree, Table 6.3.
KERNEL_FILES, KERNEL_DIRS, KERNEL_MEAN = 47984, 3078, 13.5 * 1000
# Mixed: 4,000 files, log-normal, median 512 KiB (Fig. 6-11; 512 KB is also the
# "sweet spot" block size the text ties to the bulk of that distribution).
MIXED_FILES, MIXED_MEDIAN, MIXED_SIGMA = 4000, 512 * KIB, 1.0
BULK_FILES, BULK_SIZE = 4, GIB

# Each ramsys optimization turned off in turn (seed 000 Table 6.6). Add rows
# here; flags the binary does not know yet are skipped and reported.
ABLATIONS = [
    ("--no-checksum", "end-to-end checksum off"),
    ("--no-direct", "direct I/O off"),
    ("--io-engine sync", "asynchronous I/O off (sync engine)"),
    ("--numa off", "NUMA-awareness off"),
    ("--no-sort", "file sorting off"),
    ("--streams 1", "single stream"),
]

WAN = {"ns_a": "rsb-a", "ns_b": "rsb-b", "addr_a": "10.201.0.1", "addr_b": "10.201.0.2"}
LO_NS = "rsb-lo"  # loopback-only namespace for servers that cannot bind to 127.0.0.1


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------
# Process and namespace bookkeeping: everything we start is stopped by PID.
# --------------------------------------------------------------------------
_PROCS = []  # Popen objects of long-running servers
_NAMESPACES = set()


def stop_proc(p, grace=3.0):
    if p.poll() is not None:
        return
    try:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        p.kill()
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    except ProcessLookupError:
        pass


def cleanup_all():
    for p in reversed(_PROCS):
        stop_proc(p)
    _PROCS.clear()
    for ns in sorted(_NAMESPACES):
        del_ns(ns)


atexit.register(cleanup_all)
# SIGTERM/SIGHUP -> normal exit so atexit and finally blocks run.
for _sig in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(_sig, lambda s, f: sys.exit(128 + s))


def spawn(cmd, log_path, **kw):
    """Start a long-running server; it is registered for stop-by-PID."""
    with open(log_path, "ab") as lf:
        p = subprocess.Popen(cmd, stdout=kw.pop("stdout", lf), stderr=lf,
                             stdin=subprocess.DEVNULL, **kw)
    _PROCS.append(p)
    return p


def ns_prefix(ns):
    return ["ip", "netns", "exec", ns] if ns else []


_ETC_NETNS = set()  # /etc/netns/NAME dirs we created (removed at cleanup)


def make_ns(name):
    subprocess.run(["ip", "netns", "del", name], stderr=subprocess.DEVNULL)
    subprocess.run(["ip", "netns", "add", name], check=True)
    _NAMESPACES.add(name)
    # `ip netns exec` bind-mounts /etc/netns/NAME/hosts over /etc/hosts. The
    # namespaces have no DNS, and GridFTP insists on resolving its own address.
    etc = Path("/etc/netns") / name
    if not etc.exists():
        etc.mkdir(parents=True)
        _ETC_NETNS.add(etc)
        # Keep the host's own entries: xrootd must resolve the host name.
        base = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else "127.0.0.1 localhost\n"
        (etc / "hosts").write_text(base.rstrip("\n") + f"\n{WAN['addr_a']} rsb-a\n{WAN['addr_b']} rsb-b\n")
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
    # Room for a 100 ms bandwidth-delay product (these sysctls are per netns).
    subprocess.run(ns_prefix(name) + [
        "sysctl", "-qw",
        "net.ipv4.tcp_rmem=4096 131072 67108864",
        "net.ipv4.tcp_wmem=4096 65536 67108864"],
        stderr=subprocess.DEVNULL)


def del_ns(name):
    subprocess.run(["ip", "netns", "del", name], stderr=subprocess.DEVNULL)
    _NAMESPACES.discard(name)
    etc = Path("/etc/netns") / name
    if etc in _ETC_NETNS:
        shutil.rmtree(etc, ignore_errors=True)
        _ETC_NETNS.discard(etc)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(ns, addr, port, timeout=10.0):
    """Wait until something listens on addr:port inside ns."""
    deadline = time.time() + timeout
    needle = f"{addr}:{port}"
    while time.time() < deadline:
        out = subprocess.run(ns_prefix(ns) + ["ss", "-ltnH"], capture_output=True, text=True).stdout
        if any(needle in line or f"*:{port} " in line or f"0.0.0.0:{port} " in line
               or f"[::]:{port} " in line for line in out.splitlines()):
            return True
        time.sleep(0.1)
    return False


# --------------------------------------------------------------------------
# /proc accounting
# --------------------------------------------------------------------------
def _stat(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    rest = s[s.rindex(")") + 2:].split()
    # fields after comm: state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17)
    return {"ppid": int(rest[1]), "ticks": sum(int(x) for x in rest[11:15])}


def subtree(roots):
    children = {}
    stats = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _stat(int(d))
            if st:
                stats[int(d)] = st
                children.setdefault(st["ppid"], []).append(int(d))
    seen, stack = set(), [r for r in roots if r in stats]
    while stack:
        p = stack.pop()
        if p not in seen:
            seen.add(p)
            stack.extend(children.get(p, []))
    return seen, stats


def cpu_seconds(roots):
    """utime+stime of every live process under roots, plus what they already
    reaped (cutime+cstime): a child's time moves to its parent's c-fields when
    it is reaped, so the sum is consistent across before/after snapshots."""
    pids, stats = subtree(roots)
    return sum(stats[p]["ticks"] for p in pids) / CLK_TCK, pids


def vm_hwm_kib(pids):
    best = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        best = max(best, int(line.split()[1]))
        except OSError:
            pass
    return best


def reset_hwm(pids):
    for p in pids:
        try:
            with open(f"/proc/{p}/clear_refs", "w") as f:
                f.write("5")  # 5 = reset the peak RSS (VmHWM) to the current RSS
        except OSError:
            pass


def run_client(cmd, timeout, out_path, env=None):
    """Run one client to completion. Returns (rc, wall_s, rusage); rusage from
    wait4 covers the client and every descendant it reaped (ssh under rsync)."""
    with open(out_path, "wb") as fo:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=fo, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=env, start_new_session=True)
    timed_out = []

    def kill():
        timed_out.append(True)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout, kill)
    timer.start()
    try:
        _, status, ru = os.wait4(p.pid, 0)
    finally:
        timer.cancel()
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    rc = "timeout" if timed_out else p.returncode
    return rc, wall, ru


def drop_caches():
    subprocess.run(["sync"], check=False)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def warm(src):
    for root, _, files in os.walk(src):
        for fn in files:
            with open(os.path.join(root, fn), "rb") as f:
                while f.read(4 * MIB):
                    pass


# --------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------
def _write_random(path, size, rng):
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 4 * MIB)
            f.write(rng.randbytes(n))
            left -= n


def _lognormal_sizes(rng, n, mu, sigma, lo, hi):
    return [int(min(hi, max(lo, rng.lognormvariate(mu, sigma)))) for _ in range(n)]


def gen_workload(name, root, scale, seed):
    """Generate workload `name` under root/name from a fixed seed. --scale
    shrinks the bulk file size and the kernel/mixed file counts, so each keeps
    its character (few huge files; many ~13.5 KB files; ~512 KiB median)."""
    d = root / name
    stamp = root / f"{name}.stamp.json"
    want = {"name": name, "scale": scale, "seed": seed, "version": 1}
    if d.is_dir() and stamp.exists() and json.loads(stamp.read_text()) == want:
        return d
    if d.exists():
        shutil.rmtree(d)
    stamp.unlink(missing_ok=True)
    rng = random.Random(f"{seed}-{name}")
    d.mkdir(parents=True)
    t0 = time.time()
    if name == "bulk":
        size = max(MIB, int(BULK_SIZE * scale) // 4096 * 4096)
        for i in range(BULK_FILES):
            _write_random(d / f"bulk-{i}.dat", size, rng)
    elif name == "kernel":
        nfiles = max(8, round(KERNEL_FILES * scale))
        ndirs = max(2, round(KERNEL_DIRS * scale))
        # Random recursive tree: each new directory hangs under a random earlier
        # one (depth grows ~log n, like a source tree's fan-out).
        dirs = [d]
        for i in range(1, ndirs):
            parent = rng.choice(dirs)
            sub = parent / f"dir{i:04d}"
            sub.mkdir()
            dirs.append(sub)
        # Source files are heavy-tailed: sigma 1.4 puts the median near 5 KB at
        # a 13.5 KB mean; the cap keeps the rare outlier from dominating.
        sigma = 1.4
        mu = math.log(KERNEL_MEAN) - sigma * sigma / 2
        sizes = _lognormal_sizes(rng, nfiles, mu, sigma, 1, 1 * MIB)
        exts = [".c", ".h", ".S", "", ".txt", "Makefile"]
        for j, sz in enumerate(sizes):
            ext = rng.choice(exts)
            fn = f"file{j:05d}{ext}" if ext != "Makefile" else f"Makefile.{j:05d}"
            with open(rng.choice(dirs) / fn, "wb") as f:
                f.write(rng.randbytes(sz))
    elif name == "mixed":
        nfiles = max(4, round(MIXED_FILES * scale))
        sizes = _lognormal_sizes(rng, nfiles, math.log(MIXED_MEDIAN), MIXED_SIGMA, KIB, 64 * MIB)
        for j, sz in enumerate(sizes):
            _write_random(d / f"mixed-{j:04d}.dat", sz, rng)
    else:
        raise ValueError(name)
    stamp.write_text(json.dumps(want))
    log(f"generated workload {name} in {time.time() - t0:.1f}s")
    return d


def describe(src):
    sizes, ndirs = [], 0
    for _, dirs, files in os.walk(src):
        ndirs += len(dirs)
        for fn in files:
            sizes.append(os.path.getsize(os.path.join(_, fn)))
    return {"files": len(sizes), "dirs": ndirs, "bytes": sum(sizes),
            "mean": statistics.mean(sizes) if sizes else 0,
            "median": statistics.median(sizes) if sizes else 0}


# --------------------------------------------------------------------------
# Verification: every destination compared byte for byte with its source.
# --------------------------------------------------------------------------
def _same_file(a, b):
    if os.path.getsize(a) != os.path.getsize(b):
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(4 * MIB), fb.read(4 * MIB)
            if x != y:
                return False
            if not x:
                return True


def verify(src, dst):
    """Return None if dst is an exact copy of src (names, tree, contents), else
    the first difference. Accepts dst/<basename(src)> for tools that nest."""
    src, dst = Path(src), Path(dst)
    if not dst.is_dir():
        return f"destination {dst} missing"
    nested = dst / src.name
    if nested.is_dir() and not (src / src.name).exists():
        dst = nested
    for root, dirs, files in os.walk(src):
        rel = os.path.relpath(root, src)
        droot = dst / rel
        try:
            have = set(os.listdir(droot))
        except OSError as e:
            return f"{droot}: {e}"
        want = set(dirs) | set(files)
        if have != want:
            miss, extra = sorted(want - have), sorted(have - want)
            return f"{rel}: missing {miss[:3]} extra {extra[:3]}"
        for fn in files:
            if not _same_file(os.path.join(root, fn), droot / fn):
                return f"{os.path.join(rel, fn)}: content differs"
    return None


# --------------------------------------------------------------------------
# Network environments
# --------------------------------------------------------------------------
class Env:
    """Where the two ends run. loopback: root namespace, 127.0.0.1 (tools that
    cannot bind to one address run in LO_NS instead). rttN: servers in rsb-b,
    clients in rsb-a, joined through wanem with one-way delay N/2 ms."""

    def __init__(self, name, rtt_ms=None):
        self.name, self.rtt_ms = name, rtt_ms
        self.wanem = None

    @property
    def is_wan(self):
        return self.rtt_ms is not None

    def ends(self, isolate):
        """(server_ns, client_ns, server_addr) for a tool."""
        if self.is_wan:
            return WAN["ns_b"], WAN["ns_a"], WAN["addr_b"]
        if isolate:
            return LO_NS, LO_NS, "127.0.0.1"
        return None, None, "127.0.0.1"

    def up(self, ctx, need_lo_ns):
        if not self.is_wan:
            if need_lo_ns:
                make_ns(LO_NS)
            return
        make_ns(WAN["ns_a"])
        make_ns(WAN["ns_b"])
        cmd = [ctx.wanem, "--ns-a", WAN["ns_a"], "--ns-b", WAN["ns_b"],
               "--addr-a", WAN["addr_a"], "--addr-b", WAN["addr_b"],
               "--delay-ms", str(self.rtt_ms / 2), "--rate-mbit", str(ctx.args.rate_mbit),
               "--queue-pkts", str(ctx.args.queue_pkts)]
        logp = ctx.work / f"wanem-{self.name}.log"
        logp.unlink(missing_ok=True)
        self.wanem = spawn(cmd, logp)
        deadline = time.time() + 10
        while time.time() < deadline and "ready" not in logp.read_text():
            if self.wanem.poll() is not None:
                raise RuntimeError(f"wanem exited: {logp.read_text()[-500:]}")
            time.sleep(0.1)
        if "ready" not in logp.read_text():
            raise RuntimeError("wanem did not become ready")
        out = subprocess.run(ns_prefix(WAN["ns_a"]) + ["ping", "-q", "-c", "5", "-i", "0.2", WAN["addr_b"]],
                             capture_output=True, text=True).stdout
        m = re.search(r"= [\d.]+/([\d.]+)/", out)
        self.measured_rtt = float(m.group(1)) if m else None
        log(f"env {self.name}: wanem up, ping RTT {self.measured_rtt} ms")

    def down(self):
        if self.wanem:
            stop_proc(self.wanem)
            self.wanem = None
        # Only namespaces this run made: another run.py (e.g. a CI --smoke
        # next to a long-RTT run) must keep its rsb-a/rsb-b.
        for ns in (WAN["ns_a"], WAN["ns_b"], LO_NS):
            if ns in _NAMESPACES:
                del_ns(ns)


# --------------------------------------------------------------------------
# Tools
# --------------------------------------------------------------------------
SSH_OPTS = ["-F", "/dev/null", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "-o", "Compression=no",
            # AES-GCM is the cheapest OpenSSH cipher with AES-NI: ssh's best case.
            "-c", "aes128-gcm@openssh.com"]


class Tool:
    name = "?"
    label = "?"
    kind = "peer"  # ramsys | peer | ref
    needs = []  # executables that must exist
    isolate = False  # server cannot bind to one address: run in a private netns
    options = ""  # documented in the report

    def __init__(self, ctx):
        self.ctx = ctx
        self.server = None
        self.port = None

    def check(self):
        for exe in self.needs:
            if not (os.path.isabs(exe) and os.access(exe, os.X_OK)) and not shutil.which(exe):
                return f"{exe} not installed (bench/setup.sh)"
        return None

    def dst_parent(self):
        d = self.ctx.scratch / "dst" / self.name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def start(self, env):
        self.env = env
        self.sns, self.cns, self.addr = env.ends(self.isolate)

    def stop(self):
        if self.server:
            stop_proc(self.server)
            self.server = None

    def server_pids(self):
        return [self.server.pid] if self.server and self.server.poll() is None else []

    def client_cmd(self, src, workload, extra):
        raise NotImplementedError

    def client_env(self):
        return None

    def _wait_listen(self):
        if not wait_port(self.sns, self.addr, self.port):
            self.stop()
            raise RuntimeError(f"{self.name} server did not listen on {self.addr}:{self.port}; "
                               f"log: {self._log_tail()}")

    def _log_tail(self):
        p = self.ctx.work / f"{self.name}-server.log"
        return p.read_text(errors="replace")[-400:] if p.exists() else ""


class RamsysDaemon(Tool):
    name, label, kind = "ramsys", "ramsys (daemon)", "ramsys"
    options = "`ramsys serve` + `ramsys cp -r --streams N --json --key-file K`"

    def check(self):
        return self.ctx.ramsys_problem

    def start(self, env):
        super().start(env)
        self.key = self.ctx.work / "ramsys.key"
        logp = self.ctx.work / f"{self.name}-server.log"
        cmd = ns_prefix(self.sns) + [self.ctx.ramsys, "serve", "--listen", f"{self.addr}:0",
                                     "--root", str(self.dst_parent()), "--key-file", str(self.key)]
        self.server = spawn(cmd, logp, stdout=subprocess.PIPE)
        # First stdout line is "listening on ADDR:PORT"; read it with a deadline.
        box = []
        t = threading.Thread(target=lambda: box.append(self.server.stdout.readline()), daemon=True)
        t.start()
        t.join(15)
        line = box[0].decode(errors="replace") if box else ""
        m = re.search(r"listening on \S*:(\d+)", line)
        if not m:
            self.stop()
            raise RuntimeError(f"ramsys serve did not report its port ({line!r}): {self._log_tail()}")
        self.port = int(m.group(1))

        # Keep draining stdout so the daemon never blocks on a full pipe.
        def drain(f=self.server.stdout, out=logp):
            with open(out, "ab") as o:
                for chunk in iter(lambda: f.read1(65536), b""):
                    o.write(chunk)
        threading.Thread(target=drain, daemon=True).start()
        # The key file is created by the tool on first use; give the daemon a moment.
        for _ in range(50):
            if self.key.exists():
                break
            time.sleep(0.1)

    def client_cmd(self, src, workload, extra):
        cmd = [self.ctx.ramsys, "cp", "-r", "--streams", str(self.ctx.args.streams), "--json",
               "--key-file", str(self.key)] + extra + [str(src), f"ramsys://{self.addr}:{self.port}/{workload}"]
        return ns_prefix(self.cns) + cmd, self.dst_parent() / workload


class RamsysLocal(Tool):
    name, label, kind = "ramsys-local", "ramsys (local)", "ramsys"
    options = "`ramsys cp -r --streams N --json` (both ends in one process)"

    def check(self):
        return self.ctx.ramsys_problem

    def start(self, env):
        super().start(env)
        if env.is_wan:
            raise RuntimeError("local mode has no network path")

    def client_cmd(self, src, workload, extra):
        t = self.dst_parent() / workload
        return [self.ctx.ramsys, "cp", "-r", "--streams", str(self.ctx.args.streams), "--json"] + extra + [
            str(src), str(t)], t


class Rsyncd(Tool):
    name, label = "rsyncd", "rsync daemon"
    needs = ["rsync"]
    options = "`rsync -aW` (whole-file, no delta) to an `rsync --daemon` module"

    def start(self, env):
        super().start(env)
        self.port = free_port()
        conf = self.ctx.work / f"rsyncd-{env.name}.conf"
        conf.write_text(
            "use chroot = false\nuid = root\ngid = root\n"
            f"pid file = {self.ctx.work}/rsyncd-{env.name}.pid\n"
            f"log file = {self.ctx.work}/rsyncd.log\n"
            f"[bench]\npath = {self.dst_parent()}\nread only = false\n")
        cmd = ns_prefix(self.sns) + ["rsync", "--daemon", "--no-detach", f"--config={conf}",
                                     f"--address={self.addr}", f"--port={self.port}"]
        self.server = spawn(cmd, self.ctx.work / f"{self.name}-server.log")
        self._wait_listen()

    def client_cmd(self, src, workload, extra):
        return ns_prefix(self.cns) + ["rsync", "-aW", f"{src}/",
                                      f"rsync://{self.addr}:{self.port}/bench/{workload}/"], \
            self.dst_parent() / workload


class SshBase(Tool):
    needs = ["/usr/sbin/sshd", "ssh", "ssh-keygen"]

    def start(self, env):
        super().start(env)
        keys = self.ctx.work / "ssh"
        keys.mkdir(exist_ok=True)
        for k in ("host_ed25519", "user_ed25519"):
            if not (keys / k).exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / k)], check=True)
        shutil.copy(keys / "user_ed25519.pub", keys / "authorized_keys")
        os.chmod(keys / "authorized_keys", 0o600)
        Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation dir
        self.port = free_port()
        conf = keys / f"sshd-{self.name}-{env.name}.conf"
        conf.write_text(
            f"Port {self.port}\nListenAddress {self.addr}\nHostKey {keys}/host_ed25519\n"
            f"PidFile {keys}/sshd-{self.name}.pid\nAuthorizedKeysFile {keys}/authorized_keys\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "UsePAM no\nStrictModes no\nSubsystem sftp internal-sftp\nUseDNS no\n")
        cmd = ns_prefix(self.sns) + ["/usr/sbin/sshd", "-D", "-e", "-f", str(conf)]
        self.server = spawn(cmd, self.ctx.work / f"{self.name}-server.log")
        self._wait_listen()
        self.ssh = ["ssh", "-p", str(self.port), "-i", str(keys / "user_ed25519")] + SSH_OPTS


class RsyncSsh(SshBase):
    name, label = "rsync-ssh", "rsync over ssh"
    needs = SshBase.needs + ["rsync"]
    options = "`rsync -aW -e 'ssh -c aes128-gcm@openssh.com -o Compression=no'` to a private sshd"

    def client_cmd(self, src, workload, extra):
        t = self.dst_parent() / workload
        return ns_prefix(self.cns) + ["rsync", "-aW", "-e", shlex.join(self.ssh), f"{src}/",
                                      f"root@{self.addr}:{t}/"], t


class Scp(SshBase):
    name, label = "scp", "scp"
    needs = SshBase.needs + ["scp"]
    options = "`scp -r -c aes128-gcm@openssh.com` (OpenSSH 9 default SFTP protocol) to a private sshd"

    def client_cmd(self, src, workload, extra):
        t = self.dst_parent() / workload
        keys = self.ctx.work / "ssh"
        return ns_prefix(self.cns) + ["scp", "-r", "-q", "-P", str(self.port), "-i", str(keys / "user_ed25519")] + \
            SSH_OPTS + [str(src), f"root@{self.addr}:{t}"], t


class GridFtp(Tool):
    name, label = "gridftp", "GridFTP"
    needs = ["globus-gridftp-server", "globus-url-copy"]
    isolate = True

    @property
    def options(self):
        n = self.ctx.args.streams
        return (f"`globus-url-copy -r -cd -fast -p {n} -cc {n} -pp` (MODE E via -fast, {n} parallel "
                f"streams, {n} concurrent FTP sessions as in seed 000's 8-session runs, pipelining) "
                "against `globus-gridftp-server -aa` (anonymous, clear text: no GSI cost)")

    def start(self, env):
        super().start(env)
        self.port = free_port()
        cmd = ns_prefix(self.sns) + [
            "globus-gridftp-server", "-aa", "-anonymous-user", "root", "-allow-root", "-s",
            "-p", str(self.port), "-control-interface", self.addr, "-data-interface", self.addr,
            "-home-dir", "/", "-log-level", "error", "-l", str(self.ctx.work / "gridftp.log")]
        self.server = spawn(cmd, self.ctx.work / f"{self.name}-server.log")
        self._wait_listen()

    def client_cmd(self, src, workload, extra):
        n = str(self.ctx.args.streams)
        t = self.dst_parent() / workload
        return ns_prefix(self.cns) + ["globus-url-copy", "-r", "-cd", "-fast", "-p", n, "-cc", n, "-pp",
                                      f"file://{src}/", f"ftp://{self.addr}:{self.port}{t}/"], t


class Xrootd(Tool):
    name, label = "xrootd", "XRootD"
    needs = ["xrootd", "xrdcp", "setpriv"]
    isolate = True  # xrootd listens on all addresses: keep it in a private netns

    @property
    def options(self):
        n = self.ctx.args.streams
        return (f"`xrdcp -r -f --parallel {n} --streams {n}` against `xrootd` "
                "(run as nobody: it refuses root)")

    def dst_parent(self):
        d = super().dst_parent()
        shutil.chown(d, "nobody", "nogroup")
        return d

    def start(self, env):
        super().start(env)
        self.port = free_port()
        adm = self.ctx.work / "xrd"
        adm.mkdir(exist_ok=True)
        shutil.chown(adm, "nobody", "nogroup")
        conf = self.ctx.work / f"xrootd-{env.name}.cfg"
        conf.write_text(f"xrd.port {self.port}\nall.export {self.dst_parent()}\n"
                        f"all.adminpath {adm}\nall.pidpath {adm}\n")
        cmd = ns_prefix(self.sns) + ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                                     "xrootd", "-c", str(conf), "-l", str(adm / "xrootd.log"), "-n", "bench"]
        self.server = spawn(cmd, self.ctx.work / f"{self.name}-server.log")
        self._wait_listen()

    def _log_tail(self):
        p = self.ctx.work / "xrd" / "bench" / "xrootd.log"
        return p.read_text(errors="replace")[-400:] if p.exists() else super()._log_tail()

    def client_env(self):
        e = dict(os.environ)
        e.update(XRD_CONNECTIONRETRY="1", XRD_REQUESTTIMEOUT="600", XRD_STREAMTIMEOUT="600")
        return e

    def client_cmd(self, src, workload, extra):
        n = str(self.ctx.args.streams)
        # xrdcp -r copies SRC into the target directory as <target>/<basename>.
        return ns_prefix(self.cns) + ["xrdcp", "-r", "-f", "-s", "--parallel", n, "--streams", n, str(src),
                                      f"root://{self.addr}:{self.port}/{self.dst_parent()}/"], \
            self.dst_parent() / workload


class CpA(Tool):
    name, label, kind = "cp", "cp -a (same disk)", "ref"
    needs = ["cp"]
    options = "`cp -a SRC DST` on the scratch disk"

    def start(self, env):
        super().start(env)
        if env.is_wan:
            raise RuntimeError("local reference only")

    def client_cmd(self, src, workload, extra):
        t = self.dst_parent() / workload
        return ["cp", "-a", str(src), str(t)], t


TOOLS = [RamsysDaemon, RamsysLocal, Rsyncd, RsyncSsh, Scp, GridFtp, Xrootd, CpA]


# --------------------------------------------------------------------------
# Context and measurement
# --------------------------------------------------------------------------
class Ctx:
    pass


# Finished destinations are not deleted right away: ext4 skips inodes freed
# recently (60 s, 360 s while their inode-table buffer is dirty, which it
# stays after `sync` until the journal checkpoints it) when it allocates new
# ones (ialloc.c recently_deleted(), a buffer lookup per skipped inode), so
# after a 48k-file tree is deleted every file the next tool creates scans
# past those inodes: `cp -a` of the kernel tree took 1.7 s, then 17 s and
# 33 s with `rm -rf` of the previous copy right before each run (all system
# time, perf: find_get_block_common and recently_deleted), and still 15-25 s
# after rm + sync + 61 s. Deleting the previous tool's copy just before the
# next tool runs would charge that tool for it. Copies are renamed into a
# trash dir instead; `settle()` empties it between rounds, syncs and drops
# the caches when many inodes were freed (recently_deleted() only looks at
# buffers still cached: 5 s instead of 17-38 s; sources are warmed again
# before every warm run), then waits `--settle` seconds (default 0).
def retire(ctx, target, files):
    trash = ctx.scratch / "trash"
    trash.mkdir(parents=True, exist_ok=True)
    ctx.trash_n = getattr(ctx, "trash_n", 0) + 1
    os.rename(target, trash / str(ctx.trash_n))
    ctx.trash_files = getattr(ctx, "trash_files", 0) + files


def settle(ctx, wait=True):
    trash = ctx.scratch / "trash"
    if not trash.exists():
        return
    shutil.rmtree(trash, ignore_errors=True)
    os.sync()
    if wait and getattr(ctx, "trash_files", 0) >= 1000:
        dropped = drop_caches()
        log(f"settle: {ctx.trash_files} files deleted; caches {'dropped' if dropped else 'NOT dropped (not root)'}"
            f", waiting {ctx.args.settle:.0f} s")
        time.sleep(max(0.0, ctx.args.settle))
    ctx.trash_files = 0


# On ext4 without a journal the window is longer than the 60 s above: it is
# 360 s for an inode whose inode-table block is dirty, and allocating new
# inodes next to the deleted ones dirties it. Measured 2026-11-27 (this VM's
# /dev/vda has no journal): a ramsys push of the tree 65 s after 290k inodes
# were deleted spent 1.8 of its 4.8 CPU-s in find_inode_bit() skipping them
# (recently_deleted, find_get_block_common, __brelse); 370 s after, none
# (2.9 CPU-s). How much a tool pays depends on where its directories land
# next to the deleted inodes, not on the tool: `cp -a` ran the tree in 1.6 s
# in one headline round and 2.9 s in the two others, ramsys 1.74-2.05 s vs
# 1.45-1.88 s rested. So the many-file rounds rest: the trash is emptied
# once before the first of them, then the run waits out the window, and the
# copies of later rounds are kept (renamed aside) until the workload is done.
RECENTLY_DELETED_S = 361


def recently_deleted_applies(path):
    """Does the file system holding `path` skip recently freed inodes
    (ext4 without a journal, ialloc.c recently_deleted())?"""
    try:
        dev = os.stat(path).st_dev
        want = f"{os.major(dev)}:{os.minor(dev)}"
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            f = line.split()
            if f[2] != want or " - " not in line:
                continue
            fstype, source = line.split(" - ", 1)[1].split()[:2]
            if fstype != "ext4":
                return False
            jt = Path("/sys/fs/ext4") / Path(source).name / "journal_task"
            return jt.read_text().strip() == "<none>"
    except (OSError, ValueError, IndexError):
        pass
    return False


def many_files(ctx, workload):
    return ctx.desc.get(workload, {}).get("files", 0) >= 10_000


def settle_round(ctx, workload, run):
    """Before a round: settle, except between rounds of a many-file workload
    on a file system that skips recently freed inodes (see above): there the
    first round empties the trash and waits the window out, later rounds keep
    the trash (if the disk has room for another round of copies)."""
    if not (many_files(ctx, workload) and recently_deleted_applies(ctx.scratch)):
        ctx.keep_trash = False
        settle(ctx)
        return
    room = shutil.disk_usage(ctx.scratch).free
    need = 2 * ctx.desc[workload].get("bytes", 0) * max(1, len(ctx.tools))
    if run > 0 and room > need:
        ctx.keep_trash = True
        return
    settle(ctx, wait=False)
    log(f"rest: ext4 without a journal at {ctx.scratch}; waiting {RECENTLY_DELETED_S} s for "
        f"recently freed inodes to age out before the {workload} rounds")
    time.sleep(RECENTLY_DELETED_S)
    drop_caches()
    ctx.keep_trash = True


def find_binary(name, explicit):
    if explicit:
        return explicit
    cands = [REPO / "target" / "release" / name]
    if os.environ.get("CARGO_TARGET_DIR"):
        cands.insert(0, Path(os.environ["CARGO_TARGET_DIR"]) / "release" / name)
    for c in cands:
        if c.exists():
            return str(c)
    return str(cands[-1])


def ramsys_help(ramsys):
    try:
        r = subprocess.run([ramsys, "cp", "--help"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"ramsys not runnable ({e}); build it: cargo build --release -p ramsys"
    if r.returncode != 0:
        return None, f"`ramsys cp --help` failed: {(r.stderr or r.stdout).strip()[:200]}"
    return r.stdout + r.stderr, None


def measure(ctx, tool, env, workload, src, cache, extra=(), label=None):
    """One timed transfer. Returns a result dict (never raises for tool errors)."""
    cmd, target = tool.client_cmd(src, workload, list(extra))
    if target.exists():
        retire(ctx, target, ctx.desc[workload]["files"])
    # Bound the trash's disk use (ablation, WAN loops), but never inside a
    # loopback round of the headline: six tools x 47,984 files is 288k, and
    # a settle before the last tool of a round (it used to be 200k) made
    # that tool pay for the others' deleted inodes (recently_deleted()).
    if getattr(ctx, "trash_files", 0) >= 400_000 and not getattr(ctx, "keep_trash", False):
        settle(ctx)
    res = {"tool": tool.name, "env": env.name, "workload": workload, "cache": cache,
           "extra": " ".join(extra), "cmd": shlex.join(cmd)}
    if cache == "cold":
        if not drop_caches():
            res["error"] = "cannot drop caches"
            return res
    else:
        # The previous tool's copy may still be dirty: without a sync the
        # tool that follows a fast writer pays for that writeback (local
        # bulk copies, 2026-11-26: 1.24-1.62 s with a sync before each run,
        # ramsys and cp -a alike, against 2.4-4.3 s in a headline without;
        # whoever ran second paid). Not timed.
        os.sync()
        warm(src)
    spids = tool.server_pids()
    reset_hwm(subtree(spids)[0])
    cpu0, before = cpu_seconds(spids)
    outp = ctx.work / f"client-{tool.name}.out"
    rc, wall, ru = run_client(cmd, ctx.args.timeout, outp, env=tool.client_env())
    # Let per-connection server children (sshd sessions, gridftp forks) finish
    # so their CPU is in the parent's reaped totals before the second snapshot.
    deadline = time.time() + 5
    while time.time() < deadline and spids and subtree(spids)[0] - before:
        time.sleep(0.05)
    cpu1, after = cpu_seconds(spids)
    res.update(wall_s=wall, cpu_client_s=ru.ru_utime + ru.ru_stime, cpu_server_s=max(0.0, cpu1 - cpu0),
               rss_client_kib=ru.ru_maxrss, rss_server_kib=vm_hwm_kib(after))
    res["cpu_s"] = res["cpu_client_s"] + res["cpu_server_s"]
    out = outp.read_text(errors="replace")
    if rc == "timeout":
        res["error"] = f"timeout after {ctx.args.timeout:.0f} s"
        res["timeout"] = True
    elif rc != 0:
        res["error"] = f"exit {rc}: {out.strip()[-300:]}"
    else:
        if tool.kind == "ramsys":
            summ = [json.loads(x) for x in out.splitlines() if x.startswith("{") and '"summary"' in x]
            if summ and summ[-1].get("failed"):
                res["error"] = f"ramsys reported failed files: {summ[-1]['failed'][:3]}"
        err = verify(src, target)
        if err:
            res["error"] = f"verification failed: {err}"
    res["verified"] = "error" not in res
    d = ctx.desc[workload]
    res.update(bytes=d["bytes"], files=d["files"])
    if res["verified"]:
        res["mb_s"] = d["bytes"] / 1e6 / wall
        res["files_s"] = d["files"] / wall
        res["cpu_s_per_gb"] = res["cpu_s"] / (d["bytes"] / 1e9)
    if target.exists() and not ctx.args.keep_dst:
        retire(ctx, target, d["files"])
    status = "ok" if res["verified"] else f"FAIL {res['error'][:200]}"
    log(f"  {env.name:9} {workload:6} {cache:4} {tool.name:12} {label or ' '.join(extra):18} "
        f"{wall:8.2f}s cpu {res['cpu_s']:7.2f}s {status}")
    return res


def iperf3(ctx, env, seconds):
    sns, cns, addr = env.ends(False)
    port = free_port()
    srv = spawn(ns_prefix(sns) + ["iperf3", "-s", "-B", addr, "-p", str(port)], ctx.work / "iperf3.log")
    try:
        if not wait_port(sns, addr, port):
            return {"error": "iperf3 server did not start"}
        r = subprocess.run(ns_prefix(cns) + ["iperf3", "-c", addr, "-p", str(port), "-P", str(ctx.args.streams),
                                             "-t", str(seconds), "-O", "1", "-J"],
                           capture_output=True, text=True, timeout=seconds + 30)
        j = json.loads(r.stdout)
        if "error" in j:
            return {"error": j["error"]}
        bps = j["end"]["sum_received"]["bits_per_second"]
        return {"mb_s": bps / 8 / 1e6, "gbit_s": bps / 1e9}
    except (ValueError, KeyError, subprocess.TimeoutExpired) as e:
        return {"error": str(e)}
    finally:
        stop_proc(srv)


def fio(ctx):
    size = max(64 * MIB, int(GIB * ctx.args.scale))
    f = ctx.scratch / "fio.dat"
    out = {}
    for rw in ("write", "read"):
        r = subprocess.run(["fio", "--name=seq" + rw, f"--filename={f}", f"--rw={rw}", "--bs=1M",
                            f"--size={size}", "--direct=1", "--ioengine=psync", "--output-format=json"],
                           capture_output=True, text=True)
        try:
            j = json.loads(r.stdout)
            job = j["jobs"][0][rw]
            out[rw] = job["bw_bytes"] / 1e6
        except (ValueError, KeyError, IndexError):
            out[rw] = None
            out["error"] = (r.stderr or r.stdout)[-200:]
    f.unlink(missing_ok=True)
    out["size"] = size
    return out


# --------------------------------------------------------------------------
# Statistics and report
# --------------------------------------------------------------------------
def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def spread(xs):
    xs = [x for x in xs if x is not None]
    return (min(xs), max(xs)) if xs else (None, None)


def fmt(x, nd=2):
    if x is None:
        return "–"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.{nd}f}"


def fmt_ms(xs, nd=2):
    m = med(xs)
    lo, hi = spread(xs)
    if m is None:
        return "–"
    if len([x for x in xs if x is not None]) < 2:
        return fmt(m, nd)
    return f"{fmt(m, nd)} ({fmt(lo, nd)}–{fmt(hi, nd)})"


def git_head():
    r = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return (r.stdout.strip() or "?") + (" (+ uncommitted changes)" if dirty else "")


def machine_info(scratch):
    info = {}
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info["nproc"] = os.cpu_count()
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                info["mem_gib"] = int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    info["kernel"] = os.uname().release
    df = subprocess.run(["df", "-hT", str(scratch)], capture_output=True, text=True).stdout.splitlines()
    info["scratch_fs"] = df[-1] if df else "?"
    numa = Path("/sys/devices/system/node")
    info["numa_nodes"] = len(list(numa.glob("node[0-9]*"))) if numa.exists() else 1
    return info


def tool_versions():
    cmds = {"rsync": ["rsync", "--version"], "ssh": ["ssh", "-V"], "globus-url-copy": ["globus-url-copy", "-version"],
            "xrdcp": ["xrdcp", "--version"], "iperf3": ["iperf3", "--version"], "fio": ["fio", "--version"]}
    out = {}
    for k, c in cmds.items():
        try:
            r = subprocess.run(c, capture_output=True, text=True, timeout=10)
            out[k] = ((r.stdout or "") + (r.stderr or "")).strip().splitlines()[0][:80]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            out[k] = "not installed"
    return out


def write_report(ctx, results, refs, ablation, unavailable, out_dir):
    out_dir.mkdir(parents=True, exist_ok=True)
    charts = out_dir / "bench"
    charts.mkdir(exist_ok=True)
    a = ctx.args
    mi = machine_info(ctx.scratch)
    L = []
    title = "Benchmarks (SMOKE run: tiny scale, not a measurement)" if a.smoke else "Benchmarks"
    L.append(f"# {title}\n")
    L.append(f"Generated by `python3 bench/run.py {' '.join(ctx.argv)}` on "
             f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}. "
             f"**Scale {a.scale}** (1.0 = the full seed 000 workloads), **{a.runs} run(s)** per configuration, "
             f"**{a.streams} streams** for every tool that has streams. Suite wall time "
             f"{ctx.suite_s / 60:.1f} min; ramsys `{ctx.ramsys}` from commit {ctx.git_head}. "
             "See bench/README.md for how to reproduce and what each column means.\n")
    if a.scale < 1:
        L.append(f"> This is a scaled run (scale {a.scale}): absolute numbers are dominated by per-run "
                 "start-up costs and are not comparable with seed 000 or with a full run.\n")
    L.append("## Machine\n")
    L.append(f"- CPU: {mi.get('cpu', '?')}, {mi['nproc']} online CPUs (`nproc`), {mi.get('numa_nodes')} NUMA node(s)")
    L.append(f"- Memory: {mi.get('mem_gib', 0):.1f} GiB; kernel {mi['kernel']}")
    L.append(f"- Scratch: `{ctx.scratch}` on `{mi['scratch_fs']}`")
    for k, v in tool_versions().items():
        L.append(f"- {k}: {v}")
    L.append("")

    L.append("## Workloads\n")
    L.append("| workload | files | dirs | total MB | mean KiB | median KiB | shape |")
    L.append("|---|---|---|---|---|---|---|")
    shapes = {"bulk": f"{BULK_FILES} incompressible files (1 GiB each at scale 1)",
              "kernel": "tree like Linux 3.18.21 (seed 000 Table 6.3: 47,984 files, 3,078 dirs, 13.5 KB mean)",
              "mixed": "4,000 files, log-normal sizes, median 512 KiB, sigma 1 (seed 000 Fig. 6-11)"}
    for w, d in ctx.desc.items():
        L.append(f"| {w} | {d['files']:,} | {d['dirs']:,} | {d['bytes'] / 1e6:,.1f} | {d['mean'] / KIB:.1f} | "
                 f"{d['median'] / KIB:.1f} | {shapes[w]} |")
    L.append("")

    L.append("## Machine limits (references)\n")
    if refs.get("fio"):
        f = refs["fio"]
        L.append(f"- fio sequential on the scratch disk (1 MiB blocks, O_DIRECT, {f['size'] // MIB} MiB): "
                 f"write {fmt(f.get('write'))} MB/s, read {fmt(f.get('read'))} MB/s")
    for env_name, r in refs.get("iperf3", {}).items():
        if "error" in r:
            L.append(f"- iperf3 {env_name}, {a.streams} streams: unavailable: {r['error']}")
        else:
            L.append(f"- iperf3 memory to memory, {env_name}, {a.streams} streams: {fmt(r['mb_s'])} MB/s "
                     f"({r['gbit_s']:.2f} Gbit/s)")
    for env_name, rtt in refs.get("ping", {}).items():
        L.append(f"- wanem {env_name}: measured ping RTT {fmt(rtt)} ms")
    L.append("- `cp -a` on the same disk: row `cp` in the loopback tables below")
    L.append("")

    if unavailable:
        L.append("## Unavailable\n")
        for k, v in unavailable.items():
            L.append(f"- {k}: unavailable: {v}")
        L.append("")

    L.append("## Tool options\n")
    for t in ctx.tools:
        L.append(f"- **{t.label}** (`{t.name}`): {t.options}")
    L.append("")

    # Group results: (env, workload, cache) -> tool -> list of results (by run index)
    groups = {}
    for r in results:
        if r.get("extra"):
            continue
        groups.setdefault((r["env"], r["workload"], r["cache"]), {}).setdefault(r["tool"], []).append(r)
    L.append("## Results\n")
    L.append("Cells are median (min–max) over runs. *ratio* = peer wall time / ramsys (daemon) wall time "
             "of the same run, i.e. ramsys's speed-up (> 1: ramsys faster), as in seed 000 Tables 6.4/6.5. "
             "CPU = user+system seconds of all processes at both ends. RSS = peak resident set "
             "(VmHWM) of the ramsys daemon / ramsys client (MiB). ok = runs verified byte for byte.\n")
    labels = {t.name: t.label for t in ctx.tools}
    order = ["warm", "cold"]
    for key in sorted(groups, key=lambda k: (ctx.env_order.index(k[0]), ctx.wl_order.index(k[1]),
                                             order.index(k[2]))):
        env_name, wl, cache = key
        g = groups[key]
        L.append(f"### {wl}, {env_name}, {cache} cache\n")
        L.append("| tool | wall s | MB/s | files/s | CPU s | CPU s/GB | RSS MiB srv/cli | ok | ratio |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        base = g.get("ramsys", [])
        for tname, rs in g.items():
            ok = [r for r in rs if r.get("verified")]
            walls = [r["wall_s"] for r in ok]
            rss = "–"
            if tname.startswith("ramsys") and ok:
                srv = med([r["rss_server_kib"] / KIB for r in ok])
                rss = f"{srv:.0f}" if srv else "–"  # local mode has no daemon
                rss += f"/{med([r['rss_client_kib'] / KIB for r in ok]):.0f}"
            ratios = []
            for r in ok:
                b = [x for x in base if x.get("run") == r.get("run") and x.get("verified")]
                if b and tname != "ramsys":
                    ratios.append(r["wall_s"] / b[0]["wall_s"])
            errs = [r["error"] for r in rs if not r.get("verified") and not r.get("timeout")]
            wall_cell = fmt_ms(walls)
            if not ok and any(r.get("timeout") for r in rs):
                wall_cell = f"> {ctx.args.timeout:.0f} (timeout)"
            L.append(f"| {labels.get(tname, tname)} | {wall_cell} | {fmt_ms([r['mb_s'] for r in ok], 1)} | "
                     f"{fmt_ms([r['files_s'] for r in ok], 0)} | {fmt_ms([r['cpu_s'] for r in ok])} | "
                     f"{fmt_ms([r['cpu_s_per_gb'] for r in ok], 1)} | {rss} | {len(ok)}/{len(rs)} | "
                     f"{fmt_ms(ratios) if ratios else '–'} |")
            for e in errs[:1]:
                L.append(f"| ↳ failure | {e[:150].replace('|', '/')} | | | | | | | |")
        L.append("")

    if ablation is not None:
        L.append("## Ablation (seed 000 Table 6.6 style)\n")
        L.append("ramsys daemon on loopback, warm cache; each optimization turned off in turn by its flag "
                 "(given to `ramsys cp`, which negotiates it with the daemon). Δ = change of median throughput "
                 "against the full configuration of the same runs.\n")
        wls = sorted({r["workload"] for r in ablation["results"]}, key=ctx.wl_order.index)
        L.append("| configuration | " + " | ".join(f"{w} MB/s | {w} Δ %" for w in wls) + " |")
        L.append("|---|" + "---|---|" * len(wls))
        rows = [("", "all optimizations on")] + [(f, d) for f, d in ablation["flags"]]
        for flag, desc in rows:
            cells = []
            for w in wls:
                rs = [r for r in ablation["results"] if r["workload"] == w and r["extra"] == flag and r.get("verified")]
                base = [r for r in ablation["results"] if r["workload"] == w and r["extra"] == "" and r.get("verified")]
                m, b = med([r["mb_s"] for r in rs]), med([r["mb_s"] for r in base])
                delta = "–" if (m is None or not b or not flag) else f"{(m / b - 1) * 100:+.1f}"
                cells.append(f"{fmt_ms([r['mb_s'] for r in rs], 1)} | {delta}")
            L.append(f"| {desc}{f' (`{flag}`)' if flag else ''} | " + " | ".join(cells) + " |")
        for flag, why in ablation["skipped"]:
            L.append(f"\nSkipped `{flag}`: {why}.")
        L.append("")

    L.append("## Goals (issue 3)\n")
    L.extend(goals(ctx, groups, refs))
    L.append("")

    pngs = make_charts(ctx, groups, charts)
    if pngs:
        L.append("## Charts\n")
        for p in pngs:
            L.append(f"![{p.stem}](bench/{p.name})\n")
    (out_dir / "BENCHMARKS.md").write_text("\n".join(L) + "\n")
    (charts / "results.json").write_text(json.dumps({"results": results, "refs": refs, "ablation": ablation,
                                                     "unavailable": unavailable, "machine": mi,
                                                     "desc": ctx.desc, "env_order": ctx.env_order,
                                                     "suite_s": ctx.suite_s, "argv": ctx.argv,
                                                     "git_head": ctx.git_head,
                                                     "args": vars(a)}, indent=1, default=str))
    log(f"report written to {out_dir / 'BENCHMARKS.md'}")


def goals(ctx, groups, refs):
    """Judge the issue's goals from the numbers; says 'not measured' when a
    comparison is missing rather than guessing."""
    L = []

    def wall(env, wl, tool, cache="warm"):
        rs = groups.get((env, wl, cache), {}).get(tool, [])
        m = med([r["wall_s"] for r in rs if r.get("verified")])
        if m is None and any(r.get("timeout") for r in rs):
            return ctx.args.timeout  # a lower bound: the peer did not finish
        return m

    def cpugb(env, wl, tool, cache="warm"):
        rs = groups.get((env, wl, cache), {}).get(tool, [])
        return med([r["cpu_s_per_gb"] for r in rs if r.get("verified")])

    fastest, cheapest = [], []
    for (env, wl, cache), g in sorted(groups.items()):
        peers = [t for t in g if t not in ("ramsys", "ramsys-local", "cp")]
        rw = wall(env, wl, "ramsys", cache)
        if rw is None or not peers:
            continue
        pw = {t: wall(env, wl, t, cache) for t in peers}
        pw = {t: v for t, v in pw.items() if v is not None}
        if pw:
            best = min(pw, key=pw.get)
            fastest.append((f"{wl}/{env}/{cache}", rw <= pw[best], best, pw[best] / rw))
        pc = {t: cpugb(env, wl, t, cache) for t in peers}
        pc = {t: v for t, v in pc.items() if v is not None}
        rc = cpugb(env, wl, "ramsys", cache)
        if pc and rc is not None:
            best = min(pc, key=pc.get)
            cheapest.append((f"{wl}/{env}/{cache}", rc <= pc[best], best, pc[best], rc))
    if fastest:
        miss = [f for f in fastest if not f[1]]
        L.append(f"- ramsys fastest on every workload/RTT: **{'MET' if not miss else 'NOT MET'}** "
                 f"({len(fastest) - len(miss)}/{len(fastest)} configurations)" +
                 ("; behind in: " + ", ".join(f"{c} ({b} is {1 / r:.2f}x faster)" for c, _, b, r in miss)
                  if miss else ""))
    else:
        L.append("- ramsys fastest on every workload/RTT: not measured")
    if cheapest:
        miss = [c for c in cheapest if not c[1]]
        L.append(f"- ramsys least CPU per GB: **{'MET' if not miss else 'NOT MET'}** "
                 f"({len(cheapest) - len(miss)}/{len(cheapest)})" +
                 ("; more CPU than: " + ", ".join(f"{c} ({b} {pb:.1f} vs {rc:.1f} s/GB)" for c, _, b, pb, rc in miss)
                  if miss else ""))
    ip = refs.get("iperf3", {}).get("loopback", {})
    rs = groups.get(("loopback", "bulk", "warm"), {}).get("ramsys", [])
    bulk = med([r["mb_s"] for r in rs if r.get("verified")])
    if bulk and ip.get("mb_s"):
        pct = bulk / ip["mb_s"] * 100
        L.append(f"- bulk >= 80 % of iperf3 loopback ({ctx.args.streams} streams): **{'MET' if pct >= 80 else 'NOT MET'}** "
                 f"({bulk:.0f} of {ip['mb_s']:.0f} MB/s = {pct:.0f} %; warm cache, so the disk is not the limit)")
    else:
        L.append("- bulk >= 80 % of iperf3 loopback: not measured")
    k0 = "rtt0" if ("rtt0", "kernel", "warm") in groups else "loopback"
    rk = wall(k0, "kernel", "ramsys")
    for peer, factor in (("rsyncd", 3), ("gridftp", 5)):
        pw = wall(k0, "kernel", peer)
        if rk and pw:
            L.append(f"- kernel >= {factor}x faster than {peer} at RTT 0 ({k0}): "
                     f"**{'MET' if pw / rk >= factor else 'NOT MET'}** ({pw / rk:.2f}x)")
        else:
            L.append(f"- kernel >= {factor}x faster than {peer} at RTT 0: not measured")
    r100 = wall("rtt100", "kernel", "ramsys")
    if r100 and rk:
        L.append(f"- kernel at 100 ms RTT < 2x its RTT-0 time: **{'MET' if r100 < 2 * rk else 'NOT MET'}** "
                 f"({r100:.2f} s vs {rk:.2f} s = {r100 / rk:.2f}x)")
    else:
        L.append("- kernel at 100 ms RTT < 2x its RTT-0 time: not measured")
    # Data-driven hints at *why*, so a shortfall is explained by numbers.
    ram = [r for g in groups.values() for r in g.get("ramsys", []) if r.get("verified") and r["env"] == "loopback"]
    if ram:
        floor = min(ram, key=lambda r: r["wall_s"])
        others = []
        for peer in ("rsyncd", "gridftp", "xrootd", "cp"):
            pr = [r for g in groups.values() for r in g.get(peer, []) if r.get("verified") and r["env"] == "loopback"]
            if pr:
                others.append(f"{peer} {min(r['wall_s'] for r in pr):.2f} s")
        L.append(f"\nWhy, from the numbers: the shortest ramsys transfer ({floor['workload']}, "
                 f"{floor['bytes'] / 1e6:.1f} MB) took {floor['wall_s']:.2f} s, an upper bound on its fixed cost "
                 "per invocation (process start, key exchange, session set-up, buffer allocation)"
                 + (f"; the same bound for the others: {', '.join(others)}." if others else "."))
    extra_rtt = []
    for env in ctx.env_order:
        if not env.startswith("rtt") or env == "rtt0":
            continue
        for wl in ctx.wl_order:
            w = wall(env, wl, "ramsys")
            w0 = wall("rtt0", wl, "ramsys")
            if w and w0 is not None:
                rtt = int(env[3:]) / 1000
                extra_rtt.append(f"- {wl} at {env}: ramsys spent {w - w0:.2f} s more than at RTT 0, "
                                 f"i.e. about {(w - w0) / rtt:.0f} round trips.")
    if extra_rtt:
        L.append("\nWhat a long RTT costs ramsys (one-RTT metadata exchange + pipelined payload is the "
                 "design, seed 000 Fig. 6-4b):\n")
        L.extend(extra_rtt)
    if ctx.args.scale < 1:
        L.append(f"\nAt scale {ctx.args.scale} fixed per-run costs (process start, connection and "
                 "key set-up, one RTT per handshake) weigh far more than in a full run; judge the goals "
                 "on a scale-1 run.")
    return L


def make_charts(ctx, groups, charts):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not available: no charts (apt-get install python3-matplotlib)")
        return []
    out = []
    labels = {t.name: t.label for t in ctx.tools}
    colors = {t.name: f"C{i}" for i, t in enumerate(ctx.tools)}  # one colour per tool in every chart
    for metric, ylabel, fname in (("mb_s", "throughput MB/s (median)", "throughput"),
                                  ("cpu_s_per_gb", "CPU seconds per GB, both ends (median)", "cpu")):
        for env_name in ctx.env_order:
            keys = [k for k in groups if k[0] == env_name and k[2] == "warm"]
            if not keys:
                continue
            wls = [w for w in ctx.wl_order if any(k[1] == w for k in keys)]
            tools = [t.name for t in ctx.tools if any(t.name in groups[k] for k in keys)]
            # One panel per workload: their scales differ by orders of magnitude.
            fig, axes = plt.subplots(1, len(wls), figsize=(3.2 * len(wls) + 1, 4), squeeze=False)
            for ax, w in zip(axes[0], wls):
                names, vals, cols = [], [], []
                for t in tools:
                    rs = groups.get((env_name, w, "warm"), {}).get(t, [])
                    v = med([r.get(metric) for r in rs if r.get("verified")])
                    if v is not None:
                        names.append(labels.get(t, t))
                        vals.append(v)
                        cols.append(colors[t])
                ax.bar(range(len(vals)), vals, color=cols)
                ax.set_xticks(range(len(vals)))
                ax.set_xticklabels(names, rotation=45, ha="right", fontsize=7)
                ax.set_title(w, fontsize=9)
            axes[0][0].set_ylabel(ylabel, fontsize=8)
            fig.suptitle(f"{fname}: {env_name}, warm cache, scale {ctx.args.scale}", fontsize=10)
            fig.tight_layout()
            p = charts / f"{fname}_{env_name}.png"
            fig.savefig(p, dpi=90)
            plt.close(fig)
            out.append(p)
    # Wall time against RTT, one line per tool, for the WAN workloads.
    wan_envs = [e for e in ctx.env_order if e.startswith("rtt")]
    if wan_envs:
        for w in ctx.wl_order:
            if not any((e, w, "warm") in groups for e in wan_envs):
                continue
            fig, ax = plt.subplots(figsize=(7, 4))
            for t in ctx.tools:
                xs, ys = [], []
                for e in wan_envs:
                    rs = groups.get((e, w, "warm"), {}).get(t.name, [])
                    v = med([r["wall_s"] for r in rs if r.get("verified")])
                    if v is not None:
                        xs.append(int(e[3:]))
                        ys.append(v)
                if xs:
                    ax.plot(xs, ys, marker="o", label=t.label, color=colors[t.name])
            ax.set_xlabel("RTT ms (wanem)")
            ax.set_ylabel("wall time s (median)")
            ax.set_yscale("log")
            ax.set_title(f"{w}: wall time against RTT, scale {ctx.args.scale}")
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
            fig.tight_layout()
            p = charts / f"rtt_{w}.png"
            fig.savefig(p, dpi=90)
            plt.close(fig)
            out.append(p)
    return out


HEADLINE_BEGIN = "<!-- headline:begin (bench/run.py --headline rewrites this block) -->"
HEADLINE_END = "<!-- headline:end -->"


def headline_lines(ctx, results, unavailable):
    """One table: rows = workload and cache, columns = tools; each cell the
    median wall time (min-max) and, for peers, the median of the same-round
    ratios peer / ramsys; then CPU s/GB of both ends. Issue 17's targets are
    judged below it from the same numbers."""
    groups = {}
    for r in results:
        if not r.get("extra"):
            groups.setdefault((r["workload"], r["cache"]), {}).setdefault(r["tool"], []).append(r)
    tools = [t for t in ctx.tools if any(t.name in g for g in groups.values())]
    order = {"bulk": 0, "mixed": 1, "kernel": 2}
    keys = sorted(groups, key=lambda k: (k[1] != "warm", order.get(k[0], 9)))
    names = {"bulk": "bulk 4 x 1 GiB", "mixed": "mixed 4,000 files", "kernel": "kernel-like 47,984 files"}

    def ratios(g, tool):
        base = {r["run"]: r["wall_s"] for r in g.get("ramsys", []) if r.get("verified")}
        return [r["wall_s"] / base[r["run"]] for r in g.get(tool, []) if r.get("verified") and r["run"] in base]

    L = [f"Full scale, {ctx.args.runs} rounds, tools interleaved in each round (order rotated by one each round), push to a "
         f"daemon on loopback for every networked tool, {ctx.args.streams} streams where a tool has them, "
         f"rounds settled (bench/README.md `--settle`; on ext4 without a journal the kernel-like rounds "
         f"rest {RECENTLY_DELETED_S} s first: bench/README.md \"Recently freed inodes\"). Generated "
         f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} UTC on commit {ctx.git_head} by "
         "`sudo python3 bench/run.py --headline`; load average "
         f"{ctx.load_before} before, {ctx.load_after} after; per-configuration tables in "
         "docs/bench/headline/BENCHMARKS.md. Cells: wall seconds, median (min-max); "
         "x = same-round ratio peer / ramsys, median (> 1: ramsys faster).\n",
         "| workload, cache | " + " | ".join(t.label for t in tools) + " |",
         "|---|" + "---|" * len(tools)]
    for k in keys:
        g, cells = groups[k], []
        for t in tools:
            ok = [r["wall_s"] for r in g.get(t.name, []) if r.get("verified")]
            if not ok:
                to = any(r.get("timeout") for r in g.get(t.name, []))
                cells.append(f"> {ctx.args.timeout:.0f} s" if to else ("not run" if t.name not in g else "failed"))
                continue
            c = fmt_ms(ok)
            rr = ratios(g, t.name)
            if t.name != "ramsys" and rr:
                c += f", **{med(rr):.2f}x**"
            cells.append(c)
        L.append(f"| {names.get(k[0], k[0])}, {k[1]} | " + " | ".join(cells) + " |")
    L.append("| CPU s/GB both ends (warm bulk / mixed / kernel) | " + " | ".join(
        " / ".join(fmt(med([r["cpu_s_per_gb"] for r in groups.get((w, "warm"), {}).get(t.name, [])
                            if r.get("verified")]), 1) for w in ("bulk", "mixed", "kernel"))
        for t in tools) + " |")
    L.append("")
    for k, v in unavailable.items():
        L.append(f"- {k}: unavailable: {v}")
    if unavailable:
        L.append("")

    def m(w, c, tool):
        return med(ratios(groups.get((w, c), {}), tool))

    def judge(label, val, want):
        if val is None:
            return f"- {label}: not measured"
        return f"- {label}: {val:.2f} (target {want}): **{'met' if val >= want else 'not met'}**"
    L.append("Issue 17's targets, from the medians of the same-round ratios above:")
    L.append(judge("bulk warm vs GridFTP", m("bulk", "warm", "gridftp"), 1.3))
    L.append(judge("bulk warm vs rsync daemon", m("bulk", "warm", "rsyncd"), 1.0))
    L.append(judge("bulk cold vs GridFTP", m("bulk", "cold", "gridftp"), 1.0))
    L.append(judge("mixed vs GridFTP", m("mixed", "warm", "gridftp"), 1.3))
    L.append(judge("mixed vs rsync daemon", m("mixed", "warm", "rsyncd"), 1.0))
    kr = ratios(groups.get(("kernel", "warm"), {}), "cp")
    if kr:
        L.append(f"- kernel-like tree vs cp -a in every round: worst round {min(kr):.2f} (target 1.0): "
                 f"**{'met' if min(kr) >= 1.0 else 'not met'}**")
    L.append(judge("kernel-like tree vs rsync daemon", m("kernel", "warm", "rsyncd"), 1.5))
    loc = groups.get(("bulk", "warm"), {})
    lr = [c / r for c, r in zip(
        [x["wall_s"] for x in sorted(loc.get("cp", []), key=lambda x: x["run"]) if x.get("verified")],
        [x["wall_s"] for x in sorted(loc.get("ramsys-local", []), key=lambda x: x["run"]) if x.get("verified")])]
    L.append(judge("local ramsys cp -r of bulk vs cp -a", med(lr), 0.9))
    return L


def splice_headline(ctx, results, unavailable, path):
    """Replace the block between the headline markers of BENCHMARKS.md (or
    put one after its first paragraph) with the new table."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = "\n".join([HEADLINE_BEGIN] + headline_lines(ctx, results, unavailable) + [HEADLINE_END])
    if HEADLINE_BEGIN in text and HEADLINE_END in text:
        head, rest = text.split(HEADLINE_BEGIN, 1)
        text = head + block + rest.split(HEADLINE_END, 1)[1]
    else:
        text = text.replace("\n\n", "\n\n" + block + "\n\n", 1)
    path.write_text(text)
    log(f"headline table written to {path}")


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------
def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true",
                    help="CI mode: tiny scale, loopback only, ramsys + rsync daemon + cp -a, 1 run, "
                         "report to a temp dir; exit 1 on any verification failure")
    ap.add_argument("--scale", type=float, default=1.0, help="shrink all workloads (default 1.0 = full)")
    ap.add_argument("--runs", type=int, default=3, help="runs per configuration (default 3)")
    ap.add_argument("--streams", type=int, default=4, help="streams for every tool that has them (default 4)")
    ap.add_argument("--seed", type=int, default=0, help="workload generator seed (default 0)")
    ap.add_argument("--scratch", default="/var/tmp/ramsys-bench", help="scratch dir outside the repo")
    ap.add_argument("--settle", type=float, default=0.0,
                    help="seconds to wait between rounds after deleting >= 1000 files and dropping caches "
                         "(ext4 skips recently freed inodes; default 0)")
    ap.add_argument("--out", default=str(REPO / "docs"), help="report dir (BENCHMARKS.md, bench/*.png)")
    ap.add_argument("--tools", default=",".join(t.name for t in TOOLS),
                    help="comma list of tools (default all): " + ",".join(t.name for t in TOOLS))
    ap.add_argument("--workloads", default="bulk,kernel,mixed")
    ap.add_argument("--caches", default="warm,cold", help="loopback cache states (default warm,cold)")
    ap.add_argument("--cold-workloads", default=None,
                    help="workloads that also run cold when --caches has cold (default: all)")
    ap.add_argument("--headline", action="store_true",
                    help="the table docs/BENCHMARKS.md leads with (issue 17): full scale, 3 rounds, bulk, "
                         "mixed and kernel warm plus bulk cold, ramsys, ramsys-local, rsyncd, gridftp, "
                         "xrootd and cp -a, settled rounds; rewrites the block between the headline "
                         "markers of docs/BENCHMARKS.md, the full report goes to docs/bench/headline/")
    ap.add_argument("--rtts", default="0,20,100", help="wanem RTTs in ms, '' for none (default 0,20,100)")
    ap.add_argument("--wan-workloads", default="kernel,mixed")
    ap.add_argument("--rate-mbit", type=float, default=0, help="wanem rate cap (default 0 = unlimited)")
    ap.add_argument("--queue-pkts", type=int, default=1000, help="wanem queue (default 1000)")
    ap.add_argument("--no-ablation", action="store_true")
    ap.add_argument("--ablation-workloads", default="bulk,mixed", help="as seed 000 Table 6.6")
    ap.add_argument("--no-fio", action="store_true")
    ap.add_argument("--iperf-seconds", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=1800,
                    help="per-transfer timeout in s; a tool that times out is not run again in that "
                         "configuration and is reported as '> timeout' (default 1800)")
    ap.add_argument("--ramsys", help="ramsys binary (default target/release/ramsys)")
    ap.add_argument("--wanem", help="wanem binary (default target/release/wanem)")
    ap.add_argument("--keep-dst", action="store_true", help="keep destination copies")
    ap.add_argument("--report-from", metavar="RESULTS_JSON",
                    help="only rewrite the report (to --out) from a previous run's docs/bench/results.json")
    a = ap.parse_args()
    if a.headline:
        a.scale, a.runs = 1.0, max(a.runs, 3)
        a.workloads, a.caches, a.cold_workloads = "bulk,mixed,kernel", "warm,cold", "bulk"
        a.tools = "ramsys,ramsys-local,rsyncd,gridftp,xrootd,cp"
        a.rtts, a.no_ablation, a.no_fio = "", True, True
        if a.out == str(REPO / "docs"):
            a.out = str(REPO / "docs" / "bench" / "headline")
    if a.smoke:
        a.scale = min(a.scale, 0.002)
        a.runs = 1
        a.tools = "ramsys,ramsys-local,rsyncd,cp"
        a.caches = "warm"
        a.rtts = ""
        a.no_ablation = True
        a.no_fio = True
        a.iperf_seconds = 1
        a.timeout = 60
        tmp = Path(tempfile.mkdtemp(prefix="ramsys-smoke-", dir="/var/tmp"))
        a.scratch = str(tmp / "scratch")
        a.out = str(tmp / "report")
        a._smoke_tmp = tmp
    return a


def report_only(a):
    """Re-render BENCHMARKS.md and the charts from a saved results.json."""
    j = json.loads(Path(a.report_from).read_text())
    old = argparse.Namespace(**j["args"])
    ctx = Ctx()
    ctx.args, ctx.scratch = old, Path(old.scratch)
    ctx.ramsys = old.ramsys or "target/release/ramsys"
    ctx.argv = j.get("argv") or ["(re-rendered)"]
    ctx.suite_s = j.get("suite_s") or 0
    ctx.git_head = j.get("git_head") or git_head()
    ctx.tools = [t(ctx) for t in TOOLS if t.name in old.tools.split(",")]
    ctx.wl_order = [w for w in old.workloads.split(",") if w]
    ctx.env_order = j.get("env_order") or sorted({r["env"] for r in j["results"]},
                                                 key=lambda e: -1 if e == "loopback" else int(e[3:]))
    if j.get("desc"):
        ctx.desc = j["desc"]
    else:
        ctx.desc = {w: describe(ctx.scratch / "src" / w) for w in ctx.wl_order}
    write_report(ctx, j["results"], j["refs"], j["ablation"], j["unavailable"], Path(a.out))
    return 0


def main():
    a = parse_args()
    if a.report_from:
        return report_only(a)
    if os.geteuid() != 0:
        sys.exit("bench/run.py must run as root (namespaces, drop_caches, private sshd)")
    ctx = Ctx()
    t_start = time.time()
    ctx.git_head = git_head()
    ctx.args = a
    ctx.argv = sys.argv[1:]
    ctx.load_before = "%.1f" % os.getloadavg()[0]
    ctx.scratch = Path(a.scratch).resolve()
    if REPO in ctx.scratch.parents or ctx.scratch == REPO:
        sys.exit("--scratch must be outside the repository")
    ctx.work = ctx.scratch / "work"
    ctx.work.mkdir(parents=True, exist_ok=True)
    ctx.ramsys = find_binary("ramsys", a.ramsys)
    ctx.wanem = find_binary("wanem", a.wanem)
    help_text, ctx.ramsys_problem = ramsys_help(ctx.ramsys)

    want_tools = [x for x in a.tools.split(",") if x]
    unknown = set(want_tools) - {t.name for t in TOOLS}
    if unknown:
        sys.exit(f"unknown tools: {sorted(unknown)}")
    ctx.tools = [t(ctx) for t in TOOLS if t.name in want_tools]
    unavailable = {}
    for t in list(ctx.tools):
        why = t.check()
        if why:
            unavailable[t.label] = why
    ctx.wl_order = [w for w in a.workloads.split(",") if w]
    rtts = [int(x) for x in a.rtts.split(",") if x.strip()]
    if rtts and not os.access(ctx.wanem, os.X_OK):
        unavailable["long-RTT runs"] = f"no wanem binary at {ctx.wanem} (cargo build --release -p wanem)"
        rtts = []
    envs = [Env("loopback")] + [Env(f"rtt{r}", r) for r in rtts]
    ctx.env_order = [e.name for e in envs]

    log(f"scale {a.scale}, runs {a.runs}, streams {a.streams}, scratch {ctx.scratch}, ramsys {ctx.ramsys}")
    for k, v in unavailable.items():
        log(f"{k}: unavailable: {v}")
    src_root = ctx.scratch / "src"
    ctx.desc = {}
    srcs = {}
    for w in ctx.wl_order:
        srcs[w] = gen_workload(w, src_root, a.scale, a.seed)
        ctx.desc[w] = describe(srcs[w])

    results, refs, ablation = [], {"iperf3": {}, "ping": {}}, None
    if not a.no_fio and shutil.which("fio"):
        refs["fio"] = fio(ctx)
        log(f"fio: {refs['fio']}")
    try:
        for env in envs:
            try:
                env.up(ctx, any(t.isolate and t.label not in unavailable for t in ctx.tools))
            except (RuntimeError, subprocess.CalledProcessError, OSError) as e:
                unavailable[f"environment {env.name}"] = str(e)[:300]
                env.down()
                continue
            if env.is_wan:
                refs["ping"][env.name] = env.measured_rtt
            if shutil.which("iperf3"):
                refs["iperf3"][env.name] = iperf3(ctx, env, a.iperf_seconds)
                log(f"iperf3 {env.name}: {refs['iperf3'][env.name]}")
            live, timed_out = [], set()
            for t in ctx.tools:
                if t.label in unavailable:
                    continue
                try:
                    t.start(env)
                    live.append(t)
                except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
                    if env.is_wan and t.name in ("ramsys-local", "cp"):
                        continue  # local-only tools have no WAN row
                    unavailable[f"{t.label} ({env.name})"] = str(e)[:300]
                    log(f"{t.label} ({env.name}): unavailable: {e}")
            try:
                wls = ctx.wl_order if not env.is_wan else [w for w in a.wan_workloads.split(",") if w in srcs]
                caches = [c for c in a.caches.split(",") if c] if not env.is_wan else ["warm"]
                cold_wls = [x for x in (a.cold_workloads or ",".join(wls)).split(",") if x]
                for w in wls:
                    for cache in [c for c in caches if c != "cold" or w in cold_wls]:
                        for run in range(a.runs):
                            settle_round(ctx, w, run)
                            # Rotate the order each round: the memory a tool's
                            # writes land in depends on who ran before it (on
                            # this VM free pages are handed back to the host
                            # by the balloon's free page reporting, and the
                            # first touch of such a page faults in the host:
                            # page-cache writes cost 0.2-0.8 s/GB depending
                            # on it), so no tool always takes one position.
                            k = run % len(live) if live else 0
                            for t in live[k:] + live[:k]:
                                # One timeout is enough: later runs would only time out again.
                                if (t.name, env.name, w, cache) in timed_out:
                                    continue
                                r = measure(ctx, t, env, w, srcs[w], cache)
                                if r.get("timeout"):
                                    timed_out.add((t.name, env.name, w, cache))
                                r["run"] = run
                                results.append(r)
                if not env.is_wan and not a.no_ablation:
                    ablation = run_ablation(ctx, env, live, help_text, srcs)
            finally:
                for t in live:
                    t.stop()
                env.down()
    finally:
        cleanup_all()
        settle(ctx, wait=False)

    ctx.suite_s = time.time() - t_start
    ctx.load_after = "%.1f" % os.getloadavg()[0]
    write_report(ctx, results, refs, ablation, unavailable, Path(a.out))
    if a.headline:
        splice_headline(ctx, results, unavailable, REPO / "docs" / "BENCHMARKS.md")
    failures = [r for r in results if not r.get("verified")]
    ramsys_fail = [r for r in failures if r["tool"].startswith("ramsys")]
    if a.smoke:
        ran = {r["tool"] for r in results}
        ok = not failures and "ramsys" in ran and len(ran - {"ramsys", "ramsys-local"}) >= 1
        log(f"smoke: {len(results) - len(failures)} passed, {len(failures)} failed"
            + ("" if ok else f"; report kept in {a.out}"))
        for r in failures:
            log(f"  FAILED {r['tool']} {r['workload']}: {r.get('error')}")
        if "ramsys" not in ran:
            log(f"  ramsys did not run: {ctx.ramsys_problem or unavailable}")
        # Plain closing line that CI log readers understand.
        nfail = len(failures) if failures else (0 if ok else 1)  # "ramsys did not run" counts as one
        print(f"smoke: {len(results) - len(failures)} passed, {nfail} failed", flush=True)
        # Keep the evidence only when something failed.
        shutil.rmtree(a._smoke_tmp if ok else a._smoke_tmp / "scratch", ignore_errors=True)
        return 0 if ok else 1
    if ramsys_fail:
        log(f"{len(ramsys_fail)} ramsys transfer(s) failed verification")
        return 1
    return 0


def run_ablation(ctx, env, live, help_text, srcs):
    tool = next((t for t in live if t.name == "ramsys"), None)
    flags, skipped = [], []
    for flag, desc in ABLATIONS:
        name = flag.split()[0]
        if tool is None:
            skipped.append((flag, "ramsys daemon not running"))
        elif help_text is None or not re.search(rf"(^|\s){re.escape(name)}([\s=,]|$)", help_text, re.M):
            skipped.append((flag, "the ramsys binary does not know this flag yet (`ramsys cp --help`)"))
        elif flag == f"--streams {ctx.args.streams}":
            skipped.append((flag, "same as the baseline stream count"))
        else:
            flags.append((flag, desc))
    res = []
    wls = [w for w in ctx.args.ablation_workloads.split(",") if w in srcs]
    if tool is not None:
        log(f"ablation: {[f for f, _ in flags]}; skipped {[f for f, _ in skipped]}")
        for w in wls:
            for run in range(ctx.args.runs):
                settle(ctx)
                for flag in [""] + [f for f, _ in flags]:
                    extra = flag.split() if flag else []
                    if "--streams" in extra:
                        # Override the baseline stream count rather than repeat the flag.
                        r = measure_override_streams(ctx, tool, env, w, srcs[w], extra)
                    else:
                        r = measure(ctx, tool, env, w, srcs[w], "warm", extra)
                    r["extra"], r["run"] = flag, run
                    res.append(r)
    return {"flags": flags, "skipped": skipped, "results": res}


def measure_override_streams(ctx, tool, env, w, src, extra):
    saved = ctx.args.streams
    ctx.args.streams = int(extra[1])
    try:
        return measure(ctx, tool, env, w, src, "warm", label=" ".join(extra))
    finally:
        ctx.args.streams = saved


if __name__ == "__main__":
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        # Debian's python3-matplotlib lives in the system interpreter; a pyenv
        # python3 first on PATH would not see it.
        if os.path.exists("/usr/bin/python3") and sys.executable != "/usr/bin/python3" \
                and not os.environ.get("RSB_REEXEC"):
            os.environ["RSB_REEXEC"] = "1"
            os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    sys.exit(main())
