"""`sync_bench.py --wan`: repeat-run cost of `ramsys sync` next to rsync on
the 47,984-file kernel tree, locally and through wanem (docs/SYNC.md,
docs/BENCHMARKS.md). Reuses bench/run.py's namespaces, servers, wanem and
/proc accounting; its namespaces and addresses are renamed so that a
concurrent bench/run.py is not disturbed."""
import json
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as R  # noqa: E402

R.WAN.update(ns_a="rsbs-a", ns_b="rsbs-b", addr_a="10.202.0.1", addr_b="10.202.0.2")
R.LO_NS = "rsbs-lo"
TREE = "tree48k"


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def wire_bytes(ns):
    """rx+tx bytes of every non-loopback interface of `ns` (the TUN device
    wanem created there: only this benchmark's traffic crosses it)."""
    if not ns:
        return None
    out = subprocess.run(R.ns_prefix(ns) + ["cat", "/proc/net/dev"], capture_output=True,
                         text=True).stdout
    tot = 0
    for line in out.splitlines()[2:]:
        name, rest = line.split(":", 1)
        if name.strip() == "lo":
            continue
        f = rest.split()
        tot += int(f[0]) + int(f[8])
    return tot


def files_of(root):
    out = []
    for dp, _, fs in os.walk(root):
        out += [os.path.join(dp, f) for f in fs]
    out.sort()
    return out


def mutate(root, rng, frac=0.01):
    """Change 1 % of the files: half rewritten in place at the same size
    (one 4 KiB region, or all of a small file), a quarter appended to, a
    quarter truncated or rewritten at a new size; plus 0.1 % new files and
    0.1 % deleted ones. Every changed file gets a new mtime."""
    files = files_of(root)
    n = max(1, int(len(files) * frac))
    picked = rng.sample(files, n)
    for i, p in enumerate(picked):
        size = os.path.getsize(p)
        kind = i % 4
        if kind in (0, 1) and size > 0:
            with open(p, "r+b") as f:
                if size > 8192:
                    f.seek(rng.randrange(size - 4096))
                    f.write(rng.randbytes(4096))
                else:
                    f.write(rng.randbytes(size))
        elif kind == 2:
            with open(p, "ab") as f:
                f.write(rng.randbytes(rng.randint(100, 20000)))
        else:
            with open(p, "r+b") as f:
                f.truncate(size // 2)
                f.seek(0)
                f.write(rng.randbytes(min(size // 2, 4096)))
        t = time.time() + rng.randint(1, 10**6)
        os.utime(p, (t, t))
    rest = [f for f in files if f not in set(picked)]
    k = max(1, len(files) // 1000)
    for p in rng.sample(rest, k):
        os.unlink(p)
    dirs = sorted({os.path.dirname(f) for f in files})
    for j in range(k):
        d = rng.choice(dirs)
        with open(os.path.join(d, f"new-{rng.getrandbits(40):010x}"), "wb") as f:
            f.write(rng.randbytes(rng.randint(512, 40000)))
    return {"changed": n, "deleted": k, "new": k}


class Row:
    """One tool in one environment: how to sync, where the copy lands."""

    def __init__(self, name, label, tool, cmd, target, kind):
        self.name, self.label, self.tool, self.cmd, self.target, self.kind = \
            name, label, tool, cmd, target, kind


def rows_for(ctx, env, tools, src):
    out = []
    streams = str(ctx.args.streams)
    for t in tools:
        cns = t.cns
        if t.name == "ramsys":
            cmd = R.ns_prefix(cns) + [ctx.ramsys, "sync", "-r", "--delete", "--json", "--streams", streams,
                                      "--key-file", str(t.key), str(src),
                                      f"ramsys://{t.addr}:{t.port}/"]
        elif t.name == "rsyncd":
            cmd = R.ns_prefix(cns) + ["rsync", "-a", "--delete", str(src),
                                      f"rsync://{t.addr}:{t.port}/bench/"]
        elif t.name == "rsync-ssh":
            cmd = R.ns_prefix(cns) + ["rsync", "-a", "--delete", "-e", shlex.join(t.ssh), str(src),
                                      f"root@{t.addr}:{t.dst_parent()}/"]
        else:
            continue
        out.append(Row(t.name, t.label, t, cmd, t.dst_parent() / TREE, t.kind))
    return out


def local_rows(ctx, src):
    out = []
    for name, label, cmd in (
        ("ramsys-local", "ramsys sync (local)",
         [ctx.ramsys, "sync", "-r", "--delete", "--json", "--streams", str(ctx.args.streams)]),
        ("rsync-local", "rsync -a --delete (local)", ["rsync", "-a", "--delete"]),
    ):
        d = ctx.scratch / "dst" / name
        d.mkdir(parents=True, exist_ok=True)
        out.append(Row(name, label, None, cmd + [str(src), str(d) + "/"], d / TREE,
                       "ramsys" if name.startswith("ramsys") else "peer"))
    return out


def measure(ctx, row, env_name, case, run, src, ns, check):
    spids = row.tool.server_pids() if row.tool else []
    cpu0, before = R.cpu_seconds(spids)
    w0 = wire_bytes(ns)
    outp = ctx.work / f"client-{row.name}.out"
    rc, wall, ru = R.run_client(row.cmd, ctx.args.timeout, outp)
    deadline = time.time() + 5
    while time.time() < deadline and spids and R.subtree(spids)[0] - before:
        time.sleep(0.05)
    cpu1, _ = R.cpu_seconds(spids)
    w1 = wire_bytes(ns)
    r = {"env": env_name, "case": case, "run": run, "tool": row.name, "wall_s": wall,
         "cpu_client_s": ru.ru_utime + ru.ru_stime, "cpu_server_s": max(0.0, cpu1 - cpu0)}
    r["cpu_s"] = r["cpu_client_s"] + r["cpu_server_s"]
    r["wire_bytes"] = (w1 - w0) if w0 is not None and w1 is not None else None
    out = outp.read_text(errors="replace")
    if rc != 0:
        r["error"] = f"exit {rc}: {out.strip()[-300:]}"
    if row.kind == "ramsys":
        summ = [json.loads(x) for x in out.splitlines() if x.startswith("{") and '"summary"' in x]
        if summ:
            s = summ[-1]
            r.update(sent_bytes=s.get("bytes"), sent_files=s.get("files"), unchanged=s.get("unchanged"),
                     deleted=s.get("deleted"))
            if s.get("failed"):
                r["error"] = f"failed files: {s['failed'][:3]}"
            if case == "unchanged" and s.get("bytes"):
                r["error"] = f"unchanged tree but {s['bytes']} bytes sent"
    if check and "error" not in r:
        err = R.verify(src, row.target)
        if err:
            r["error"] = f"verification failed: {err}"
    r["ok"] = "error" not in r
    wb = r["wire_bytes"]
    log(f"  {env_name:8} {case:9} {row.name:13} {wall:7.2f}s cpu {r['cpu_s']:6.2f}s "
        f"wire {'-' if wb is None else f'{wb / 1e6:.2f} MB'} {'ok' if r['ok'] else r['error'][:200]}")
    return r


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, nd=2):
    return "–" if x is None else f"{x:.{nd}f}"


def table(results, env_order, runs):
    L = ["| env | case | tool | wall s, median (min–max) | CPU s both ends | wire MB | "
         "ramsys data sent | ratio peer/ramsys wall | ok |",
         "|---|---|---|---|---|---|---|---|---|"]
    for env in env_order:
        for case in ("first", "unchanged", "changed"):
            rs = [r for r in results if r["env"] == env and r["case"] == case]
            tools = list(dict.fromkeys(r["tool"] for r in rs))
            base = "ramsys" if "ramsys" in tools else "ramsys-local"
            for t in tools:
                x = [r for r in rs if r["tool"] == t]
                walls = [r["wall_s"] for r in x]
                ratio = "–"
                if t != base:
                    rr = []
                    for r in x:
                        b = [y for y in rs if y["tool"] == base and y["run"] == r["run"]]
                        if b and b[0]["wall_s"]:
                            rr.append(r["wall_s"] / b[0]["wall_s"])
                    if rr:
                        ratio = f"{med(rr):.2f} ({min(rr):.2f}–{max(rr):.2f})"
                wire = med([r["wire_bytes"] for r in x])
                sent = ""
                if x[0].get("sent_bytes") is not None:
                    sent = (f"{med([r['sent_bytes'] for r in x]) / 1e6:.2f} MB, "
                            f"{med([r['sent_files'] for r in x]):.0f} files, "
                            f"{med([r['unchanged'] for r in x]):.0f} unchanged")
                L.append(f"| {env} | {case} | {t} | {fmt(med(walls))} ({fmt(min(walls))}–{fmt(max(walls))}) | "
                         f"{fmt(med([r['cpu_s'] for r in x]))} | {'–' if wire is None else f'{wire / 1e6:.2f}'} | "
                         f"{sent} | {ratio} | {sum(r['ok'] for r in x)}/{len(x)} |")
    return "\n".join(L)


def main(a):
    if os.geteuid() != 0:
        sys.exit("sync_bench.py --wan must run as root (namespaces, private sshd)")
    ctx = R.Ctx()
    ctx.args = a
    a.streams, a.timeout, a.rate_mbit, a.queue_pkts = 4, 1800.0, 0, 1000
    ctx.scratch = Path(a.scratch).resolve()
    ctx.work = ctx.scratch / "work"
    ctx.work.mkdir(parents=True, exist_ok=True)
    ctx.ramsys = a.bin if os.path.isabs(a.bin) or os.path.exists(a.bin) else R.find_binary("ramsys", None)
    ctx.ramsys = str(Path(ctx.ramsys).resolve())
    ctx.ramsys_problem = R.ramsys_help(ctx.ramsys)[1]
    near = Path(ctx.ramsys).parent / "wanem"
    ctx.wanem = str(near) if near.exists() else R.find_binary("wanem", None)
    rng = random.Random(7)
    gen = R.gen_workload("kernel", ctx.scratch / "gen", a.scale, 0)
    src = ctx.scratch / TREE
    if not src.is_dir():
        log(f"copying the generated tree to {src}")
        tmp = ctx.scratch / (TREE + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["cp", "-a", str(gen), str(tmp)], check=True)
        tmp.rename(src)
    nfiles = len(files_of(src))
    log(f"tree {src}: {nfiles} files; ramsys {ctx.ramsys}")
    results, env_order, pings = [], [], {}
    envs = ([None] if a.local == "yes" else []) + [R.Env(f"rtt{r}", int(r)) for r in a.rtts.split(",") if r]
    try:
        for env in envs:
            if env is None:
                name, rows, ns = "local", local_rows(ctx, src), None
                live = []
            else:
                name = env.name
                env.up(ctx, False)
                pings[name] = env.measured_rtt
                live = []
                for cls in (R.RamsysDaemon, R.Rsyncd, R.RsyncSsh):
                    if cls.name in a.tools.split(","):
                        t = cls(ctx)
                        why = t.check()
                        if why:
                            log(f"{t.label}: unavailable: {why}")
                            continue
                        t.start(env)
                        live.append(t)
                rows, ns = rows_for(ctx, env, live, src), R.WAN["ns_a"]
            env_order.append(name)
            try:
                for row in rows:
                    # A first copy where the destination is new; else (a copy
                    # left by an earlier environment) just bring it up to date.
                    case = "prep" if row.target.exists() else "first"
                    results.append(measure(ctx, row, name, case, 0, src, ns, check=True))
                for run in range(a.runs):
                    for row in rows:
                        results.append(measure(ctx, row, name, "unchanged", run, src, ns, check=False))
                    log(f"  mutate: {mutate(src, rng)}")
                    for row in rows:
                        results.append(measure(ctx, row, name, "changed", run, src, ns, check=True))
            finally:
                for t in live:
                    t.stop()
                if env is not None:
                    env.down()
    finally:
        R.cleanup_all()
    t = table(results, env_order, a.runs)
    print(f"\nfiles: {nfiles}; ping RTT (ms): {pings}\n")
    print(t)
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"results": results, "pings": pings, "files": nfiles,
                                                "argv": sys.argv[1:]}, indent=1))
    return 0 if all(r["ok"] for r in results) else 1
