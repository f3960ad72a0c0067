#!/usr/bin/env python3
"""No-change re-sync, old binary against new, next to rsync (issue 36).

One tree of N files (bench/scale.py's trees: 0-2 KiB, 1,000 per directory)
is copied once locally and once into an export served by three daemons on
127.0.0.1: `ramsys serve` of OLD, `ramsys serve` of NEW and an rsync
daemon. Then, each round, every tool re-syncs it with nothing changed, in
a shuffled order: `sync -r SRC/ DST` of OLD and NEW (local and push) and
`rsync -a SRC/ DST` (local and push), all on the same destinations (a
no-change sync changes nothing, so every tool finds the same warm tree).
Wall time, the agent's max RSS and the daemon's VmHWM (reset before each
run); medians of --runs. rsync must find nothing to do: checked first
(`rsync -ai -n`, no itemized line).

    sudo python3 bench/resync_ab.py --old /tmp/old/ramsys --new target/release/ramsys \\
        --files 1000000 --runs 3

--delete syncs every tool with --delete (the daily mirror; nothing to
delete); --dry-run runs every tool with -n; --archive runs ramsys with -a too (rsync always has -a); --old-env KEY=VALUE runs OLD's agent and daemon with that
variable (RAMSYS_WINDOW_FILES=0: NEW's binary without windows as OLD).
"""
import argparse
import os
import random
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scale  # noqa: E402  (gen, run, free_port, reread)


def serve(binary, root, key, env):
    p = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0", "--root", root,
                          "--key-file", key], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, env=env)
    return p, p.stdout.readline().decode().split()[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--files", type=int, default=100000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work", default="/var/tmp/ramsys-scale")
    ap.add_argument("--delete", action="store_true",
                    help="every tool syncs with --delete (nothing to delete: the daily mirror)")
    ap.add_argument("--archive", action="store_true",
                    help="ramsys syncs with -a as well (rsync always runs -a)")
    ap.add_argument("--dry-run", action="store_true",
                    help="every tool runs -n (the preview of the daily mirror)")
    ap.add_argument("--old-env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment of OLD's agent and daemon only, e.g. "
                         "RAMSYS_WINDOW_FILES=0 (NEW's binary without windows as OLD)")
    a = ap.parse_args()
    old, new = os.path.abspath(a.old), os.path.abspath(a.new)
    n = a.files
    src = os.path.join(a.work, f"src-{n}")
    scale.gen(src, n)
    w = os.path.join(a.work, f"resync-{n}")
    export = os.path.join(w, "export")
    local = os.path.join(w, "local")
    os.makedirs(export, exist_ok=True)
    key = os.path.join(w, "key")
    env = dict(os.environ, RAMSYS_KEY_FILE=key)
    # The push copy through a daemon of its own: the measured daemons
    # start with nothing resident from it.
    if not os.path.exists(os.path.join(export, "push.complete")):
        dcp, acp = serve(new, export, key, env)
        print(f"copying {src} -> {export}/push", file=sys.stderr)
        subprocess.run([new, "cp", "-r", src + "/", f"ramsys://{acp}/push"], check=True,
                       env=env, stdout=subprocess.DEVNULL)
        open(os.path.join(export, "push.complete"), "w").close()
        dcp.terminate()
        dcp.wait()
    env_old = dict(env, **dict(kv.split("=", 1) for kv in a.old_env))
    dold, aold = serve(old, export, key, env_old)
    dnew, anew = serve(new, export, key, env)
    rport = scale.free_port()
    conf = os.path.join(w, "rsyncd.conf")
    with open(conf, "w") as f:
        f.write(f"pid file = {w}/rsyncd.pid\nuse chroot = no\nuid = root\ngid = root\n"
                f"[x]\npath = {export}\nread only = no\n")
    rd = subprocess.Popen(["rsync", "--daemon", "--no-detach", f"--config={conf}",
                           f"--port={rport}", "--address=127.0.0.1"])
    time.sleep(0.5)
    try:
        # The local copy, once (kept between invocations, as the push's).
        if not os.path.exists(local + ".complete"):
            print(f"copying {src} -> {local}", file=sys.stderr)
            subprocess.run([new, "cp", "-r", src + "/", local], check=True, env=env,
                           stdout=subprocess.DEVNULL)
            open(local + ".complete", "w").close()
        rs = f"rsync://127.0.0.1:{rport}/x/push/"
        for dst in (local + "/", rs):
            out = subprocess.run(["rsync", "-ai", "-n", src + "/", dst],
                                 capture_output=True, text=True).stdout.split("\n")
            changed = [x for x in out if x.strip()]
            print(f"rsync -ai -n to {dst}: {len(changed)} itemized", file=sys.stderr)
        dl = (["--delete"] if a.delete else []) + (["-n"] if a.dry_run else [])
        d = (["-a"] if a.archive else []) + dl
        tools = {
            "ramsys old local": ([old, "sync", "-r", *d, src + "/", local], None),
            "ramsys new local": ([new, "sync", "-r", *d, src + "/", local], None),
            "rsync local": (["rsync", "-a", *dl, src + "/", local], None),
            "ramsys old push": ([old, "sync", "-r", *d, src + "/", f"ramsys://{aold}/push"],
                                dold),
            "ramsys new push": ([new, "sync", "-r", *d, src + "/", f"ramsys://{anew}/push"],
                                dnew),
            "rsync push": (["rsync", "-a", *dl, src + "/", rs], None),
        }
        rng = random.Random(36)
        res = {t: [] for t in tools}
        for r in range(a.runs):
            scale.reread(src)
            order = list(tools)
            rng.shuffle(order)
            for t in order:
                cmd, dm = tools[t]
                wall, rss, hwm, rc, err = scale.run(cmd, env=env_old if " old " in t else env,
                                                    daemon_pid=dm.pid if dm else None)
                if rc:
                    print(f"{t}: failed {err}", file=sys.stderr)
                res[t].append((wall, rss, hwm))
                print(f"round {r + 1} {t}: {wall:.2f} s", file=sys.stderr)
    finally:
        for p in (dold, dnew, rd):
            p.terminate()
            p.wait()
    print(f"| files | tool | wall s (median of {a.runs}) | runs | agent RSS MiB | "
          "daemon peak MiB |")
    print("|---:|---|---:|---|---:|---:|")
    for t, v in res.items():
        walls = [x[0] for x in v]
        hw = [x[2] for x in v if x[2]]
        print(f"| {n:,} | {t} | {statistics.median(walls):.2f} | "
              f"{', '.join(f'{x:.2f}' for x in walls)} | "
              f"{statistics.median(x[1] for x in v):.0f} | "
              f"{statistics.median(hw):.0f} |" if hw else
              f"| {n:,} | {t} | {statistics.median(walls):.2f} | "
              f"{', '.join(f'{x:.2f}' for x in walls)} | "
              f"{statistics.median(x[1] for x in v):.0f} | - |")


if __name__ == "__main__":
    main()
