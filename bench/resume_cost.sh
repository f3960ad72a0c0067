#!/usr/bin/env bash
# What the resume journal costs when it is on for every transfer (issue 15):
# the same copy through a daemon on loopback with --no-resume, with the
# default journal (files >= 64 MiB kept and journalled), and with --resume
# (every file journalled, sink compares), interleaved in each round; medians
# of wall time and whole-process CPU. Two workloads: 4 x 1 GiB (the
# journal's case) and a 20,000-file tree of 16 KB files (which the journal
# must not slow down).
# Usage: bench/resume_cost.sh [RUNS]   (results: docs/SYNC.md "Resume by default")
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
BIN=${RAMSYS_BIN:-target/release/ramsys}
[ -x "$BIN" ] || cargo build --release -p ramsys
SCRATCH=${SCRATCH:-/var/tmp/ramsys-resume-cost}
rm -rf "$SCRATCH"; mkdir -p "$SCRATCH/root" "$SCRATCH/bulk"
export RAMSYS_KEY_FILE="$SCRATCH/key"
DPID=""
cleanup() { [ -n "$DPID" ] && kill "$DPID" 2>/dev/null; rm -rf "$SCRATCH"; }
trap cleanup EXIT

for i in 0 1 2 3; do head -c 1G /dev/urandom > "$SCRATCH/bulk/f$i"; done
python3 - "$SCRATCH/tree" <<'PY'
import os, sys
root = sys.argv[1]
for d in range(100):
    p = os.path.join(root, f"d{d:03}")
    os.makedirs(p)
    for f in range(200):
        with open(os.path.join(p, f"f{f:03}"), "wb") as fh:
            fh.write(os.urandom(16384))
PY
sync
"$BIN" serve --listen 127.0.0.1:0 --root "$SCRATCH/root" > "$SCRATCH/d.out" 2>/dev/null &
DPID=$!
for _ in $(seq 100); do grep -q listening "$SCRATCH/d.out" 2>/dev/null && break; sleep 0.05; done
ADDR=$(sed -n 's/^listening on //p' "$SCRATCH/d.out")
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2)? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

declare -A WALL CPU
for r in $(seq "$RUNS"); do
    for w in ${WORKLOADS:-bulk tree}; do
        for mode in ${MODES:---no-resume default --resume}; do
            rm -rf "$SCRATCH/root/$w"; sync
            flag=(); [ "$mode" != default ] && flag=("$mode")
            s=$(/usr/bin/time -f '%e %U %S' "$BIN" cp -r --json "${flag[@]}" "$SCRATCH/$w" "ramsys://$ADDR/$w" 2>&1 >/dev/null | tail -1)
            read -r e u sy <<< "$s"
            # The daemon's CPU is not in the agent's: read it from the summary's peer figure
            # would need --json parsing; the agent's own wall and CPU are what differs here.
            WALL[$w$mode]+="$e "
            CPU[$w$mode]+="$(echo "$u + $sy" | bc -l) "
        done
    done
done
echo "machine: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), disk of $SCRATCH: $(df --output=source "$SCRATCH" | tail -1)"
for w in ${WORKLOADS:-bulk tree}; do
    for mode in ${MODES:---no-resume default --resume}; do
        wm=$(printf '%s\n' ${WALL[$w$mode]} | median); cm=$(printf '%s\n' ${CPU[$w$mode]} | median)
        printf '%-5s %-12s wall median %6.2f s (%s)  agent cpu median %5.2f s\n' "$w" "$mode" "$wm" "${WALL[$w$mode]}" "$cm"
    done
done
