#!/usr/bin/env python3
"""Test of the Grafana dashboard against a real Prometheus (issue 20).

packaging/grafana/ramsys.json queries the `ramsys_*` metrics a daemon
serves with `ramsys serve --metrics` (docs/DAEMON.md, "Metrics"). This
starts Debian's Prometheus (installed with apt-get when absent) scraping a
ramsys daemon on loopback every second, moves data through the daemon for
a few seconds as a user of its users table, then asks the Prometheus HTTP
API:

- every metric name the dashboard uses has series in the test's time range;
- every panel query (with Grafana's variables filled in) parses and returns
  data;
- the throughput series moved: the byte counter's rate and the per-device
  and per-NIC rate gauges were above zero during the transfer.

Opt-in (it needs apt and about 25 s): `python3 scripts/test-dashboard.py
[--bin PATH]`; the binary defaults to $CARGO_TARGET_DIR (or target)/release/ramsys.
Run as root when prometheus must be installed.
"""

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DASHBOARD = os.path.join(REPO, "packaging", "grafana", "ramsys.json")
SCRAPE_S = 1
TRANSFER_S = 6


def fail(msg):
    print(f"test-dashboard: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def say(msg):
    print(f"test-dashboard: {msg}", flush=True)


def ensure_prometheus():
    if shutil.which("prometheus"):
        return
    if os.geteuid() != 0:
        fail("prometheus is not installed and installing it needs root")
    say("installing prometheus (apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "prometheus"],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_line(path, prefix, proc, timeout=20):
    end = time.time() + timeout
    while time.time() < end:
        if os.path.exists(path):
            for line in open(path):
                if line.startswith(prefix):
                    return line[len(prefix) :].strip()
        if proc.poll() is not None:
            fail(f"the daemon exited: {open(path + '.err').read()}")
        time.sleep(0.1)
    fail(f"no '{prefix}' line from the daemon")


def api(base, path, **params):
    url = f"{base}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"
    with urllib.request.urlopen(url, timeout=10) as r:
        doc = json.load(r)
    if doc.get("status") != "success":
        fail(f"{path} {params}: {doc}")
    return doc["data"]


def dashboard_queries():
    """Every target expression of every panel, Grafana variables filled in."""
    d = json.load(open(DASHBOARD))
    exprs = []
    for p in d["panels"]:
        for t in p.get("targets", []):
            e = t["expr"]
            e = e.replace("$__rate_interval", f"{4 * SCRAPE_S}s")
            e = e.replace("$__range", "5m").replace("$instance", ".*")
            exprs.append((p["title"], e))
    return exprs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    ap.add_argument("--bin", default=os.path.join(target, "release", "ramsys"))
    args = ap.parse_args()
    if not os.access(args.bin, os.X_OK):
        fail(f"no ramsys binary at {args.bin} (cargo build --release -p ramsys)")
    t0 = time.time()
    ensure_prometheus()
    work = tempfile.mkdtemp(prefix="ramsys-dash.")
    procs = []
    try:
        run(args.bin, work, procs)
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)
    say(f"ok ({time.time() - t0:.0f} s)")


def run(binary, work, procs):
    # A daemon with a users table, so that the per-user series exist too.
    root = os.path.join(work, "export")
    os.makedirs(root)
    key = os.path.join(work, "alice.key")
    fd = os.open(key, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, os.urandom(32).hex().encode())
    os.close(fd)
    users = os.path.join(work, "users.toml")
    with open(users, "w") as f:
        f.write(f'[[user]]\nname = "alice"\nkey_file = "{key}"\nroot = "{root}"\n')
    # A replication job into a local directory, so that the ramsys_job_*
    # series exist (issue 38).
    src = os.path.join(work, "watched")
    os.makedirs(src)
    with open(os.path.join(src, "first"), "w") as f:
        f.write("replicated\n")
    cfg = os.path.join(work, "ramsys.toml")
    with open(cfg, "w") as f:
        f.write(f'[[replicate]]\nname = "mirror"\nsource = "{src}/"\n'
                f'dest = "{work}/mirror"\njournal = "{work}/mirror.sqlite"\n')
    out = os.path.join(work, "daemon.out")
    daemon = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--users", users, "--config", cfg,
         "--metrics", "127.0.0.1:0", "--memory", "64M"],
        stdout=open(out, "w"),
        stderr=open(out + ".err", "w"),
    )
    procs.append(daemon)
    addr = wait_line(out, "listening on ", daemon)
    metrics = wait_line(out, "metrics on ", daemon)

    port = free_port()
    conf = os.path.join(work, "prometheus.yml")
    with open(conf, "w") as f:
        f.write(
            f"global:\n  scrape_interval: {SCRAPE_S}s\n  evaluation_interval: {SCRAPE_S}s\n"
            f"scrape_configs:\n  - job_name: ramsys\n    static_configs:\n"
            f"      - targets: ['{metrics}']\n"
        )
    prom = subprocess.Popen(
        ["prometheus", f"--config.file={conf}", f"--storage.tsdb.path={work}/tsdb",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(work, "prometheus.err"), "w"),
    )
    procs.append(prom)
    base = f"http://127.0.0.1:{port}"
    end = time.time() + 30
    while True:
        try:
            if api(base, "query", query="ramsys_up")["result"]:
                break
        except (OSError, ValueError):
            pass
        if prom.poll() is not None or time.time() > end:
            fail("prometheus never scraped the daemon: "
                 + open(os.path.join(work, "prometheus.err")).read()[-2000:])
        time.sleep(0.5)
    say(f"prometheus on {base} scraping {metrics} every {SCRAPE_S}s")
    start = time.time()

    # Transfers for TRANSFER_S seconds, so that several scrapes see them.
    # Each is paced to about 2 s (--bwlimit): a task's rate gauges are
    # EWMAs of samples at least 0.5 s apart (daemon/admit/), so on an
    # idle machine an unpaced 64 MiB copy (0.2-0.3 s) ends unseen.
    src = os.path.join(work, "src")
    os.makedirs(src)
    for i in range(4):
        with open(os.path.join(src, f"f{i}"), "wb") as f:
            f.write(os.urandom(16 << 20))
    env = dict(os.environ, RAMSYS_USER="alice")
    n = 0
    while time.time() - start < TRANSFER_S or n < 2:
        r = subprocess.run(
            [binary, "cp", "-r", "--key-file", key, "--no-resume", "--bwlimit", "32M", src,
             f"ramsys://{addr}/copy{n}"],
            env=env, capture_output=True, text=True,
        )
        if r.returncode != 0:
            fail(f"transfer {n}: {r.stderr.strip()}")
        n += 1
    moved = n * 64 << 20
    time.sleep(3 * SCRAPE_S)  # the last scrapes after the transfer
    stop = time.time()
    say(f"{n} transfers of 64 MiB in {stop - start:.1f} s")

    # Every metric the dashboard queries exists.
    text = open(DASHBOARD).read()
    names = sorted(set(re.findall(r"\bramsys_[a-z_]+", text)))
    missing = [m for m in names if not api(base, "series", **{"match[]": m},
                                           start=start - 5, end=stop)]
    if missing:
        fail(f"no series for {', '.join(missing)}")
    say(f"{len(names)} metrics the dashboard uses all have series")

    # Every panel query parses and has data in the range.
    empty = []
    for title, e in dashboard_queries():
        data = api(base, "query_range", query=e, start=start - 2, end=stop, step=SCRAPE_S)
        if not data["result"]:
            empty.append(f"{title}: {e}")
    if empty:
        fail("panel queries without data:\n  " + "\n  ".join(empty))
    say(f"{len(dashboard_queries())} panel queries all return data")

    # The throughput series moved.
    def peak(q):
        data = api(base, "query", query=f"max(max_over_time(({q})[{int(stop - start) + 5}s:{SCRAPE_S}s]))",
                   time=stop)
        return float(data["result"][0]["value"][1]) if data["result"] else 0.0
    checks = {
        "bytes in (counter increase)": peak('ramsys_bytes_total{direction="in"}')
        - float(api(base, "query", query='ramsys_bytes_total{direction="in"}', time=start)
                ["result"][0]["value"][1]),
        "rate(ramsys_bytes_total)": peak(f'rate(ramsys_bytes_total{{direction="in"}}[{4 * SCRAPE_S}s])'),
        "device throughput gauge": peak('ramsys_device_throughput_bytes_per_second{direction="in"}'),
        "NIC throughput gauge": peak('ramsys_nic_throughput_bytes_per_second{direction="in"}'),
        "sessions gauge": peak("ramsys_sessions"),
        "alice's sessions": peak('ramsys_user_sessions{user="alice"}'),
    }
    for what, v in checks.items():
        say(f"  {what}: peak {v:.0f}")
        if v <= 0:
            fail(f"{what} did not move during the transfers")
    if checks["bytes in (counter increase)"] < moved:
        fail(f"bytes counter grew by {checks['bytes in (counter increase)']:.0f}, expected {moved}")


if __name__ == "__main__":
    main()
