#!/usr/bin/env python3
"""Per-end CPU table for long-RTT runs of bench/run.py.

run.py's report gives CPU of both ends summed; this prints, from one or more
of its results.json files, per workload and RTT: wall time, MB/s, CPU s per
GB of the client and of the server separately and summed, and the
peer/ramsys wall ratio of the same run (median (min-max) over runs).

    python3 bench/rtt_table.py [--envs rtt0,rtt100] RESULTS.json [...]
"""
import json
import statistics
import sys
from collections import defaultdict

LABELS = {"ramsys": "ramsys (daemon)", "ramsys-local": "ramsys (local)", "rsyncd": "rsync daemon",
          "rsync-ssh": "rsync over ssh", "scp": "scp", "gridftp": "GridFTP", "xrootd": "XRootD"}


def cell(xs, nd):
    if not xs:
        return "–"
    m = statistics.median(xs)
    f = f"{{:,.{nd}f}}"
    return f"{f.format(m)} ({f.format(min(xs))}–{f.format(max(xs))})" if len(xs) > 1 else f.format(m)


def table(data, only=None):
    res = [r for r in data["results"] if r.get("verified")]
    envs = [e for e in data["env_order"] if not only or e in only]
    by = defaultdict(list)
    for r in res:
        by[(r["workload"], r["env"], r["tool"])].append(r)
    out = []
    for wl in dict.fromkeys(r["workload"] for r in res):
        d = data["desc"][wl]
        for env in envs:
            tools = [t for t in LABELS if (wl, env, t) in by]
            if not tools:
                continue
            base = {r["run"]: r["wall_s"] for r in by.get((wl, env, "ramsys"), [])}
            out.append(f"\n#### {wl} ({d['files']:,} files, {d['bytes'] / 1e6:,.1f} MB), {env}\n")
            out.append("| tool | wall s | MB/s | CPU s/GB client | CPU s/GB server | CPU s/GB both | "
                       "CPU s both | ok | ratio |")
            out.append("|---|---|---|---|---|---|---|---|---|")
            for t in tools:
                rs = by[(wl, env, t)]
                gb = d["bytes"] / 1e9
                ratio = [r["wall_s"] / base[r["run"]] for r in rs if r["run"] in base] if t != "ramsys" else []
                n_all = sum(1 for r in data["results"] if (r["workload"], r["env"], r["tool"]) == (wl, env, t))
                out.append("| " + " | ".join([
                    LABELS[t], cell([r["wall_s"] for r in rs], 2), cell([r["mb_s"] for r in rs], 1),
                    cell([r["cpu_client_s"] / gb for r in rs], 2), cell([r["cpu_server_s"] / gb for r in rs], 2),
                    cell([r["cpu_s"] / gb for r in rs], 2), cell([r["cpu_s"] for r in rs], 2),
                    f"{len(rs)}/{n_all}", cell(ratio, 2) if ratio else "–"]) + " |")
    return "\n".join(out)


def main():
    args, only = sys.argv[1:], None
    if args[:1] == ["--envs"] and len(args) > 1:
        only, args = set(args[1].split(",")), args[2:]
    if not args:
        sys.exit(__doc__)
    for p in args:
        print(table(json.load(open(p)), only))


if __name__ == "__main__":
    main()
