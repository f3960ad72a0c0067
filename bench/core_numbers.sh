#!/usr/bin/env bash
# The two reference measurements of the core issue, medians of RUNS runs:
#  1. a 20,000-file tree of 16 KB files copied through a daemon on loopback,
#     next to `cp -a` of the same tree on the same disk;
#  2. a 4 GiB file read from the page cache (tmpfs) to tmpfs through a
#     daemon with N streams, next to `iperf3 -P N` on loopback.
# Usage: bench/core_numbers.sh [RUNS] [STREAMS]   (root not required)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
N=${2:-4}
BIN=${RAMSYS_BIN:-target/release/ramsys}
[ -x "$BIN" ] || cargo build --release -p ramsys
SCRATCH=${SCRATCH:-/var/tmp/ramsys-core}
SHM=/dev/shm/ramsys-core
rm -rf "$SCRATCH" "$SHM"; mkdir -p "$SCRATCH/root" "$SHM/root"
export RAMSYS_KEY_FILE="$SCRATCH/key"
cleanup() { kill "${DPIDS[@]}" 2>/dev/null || true; pkill -f "iperf3 -s -p 5299" 2>/dev/null || true; rm -rf "$SCRATCH" "$SHM"; }
DPIDS=()
trap cleanup EXIT

start_daemon() { # root -> sets ADDR (no subshell: the pid must be kept for cleanup)
    "$BIN" serve --listen 127.0.0.1:0 --root "$1" > "$1.out" 2>/dev/null &
    DPIDS+=($!)
    for _ in $(seq 100); do grep -q listening "$1.out" 2>/dev/null && break; sleep 0.05; done
    ADDR=$(sed -n 's/^listening on //p' "$1.out")
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2)? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
now() { date +%s.%N; }

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
start_daemon "$SCRATCH/root"
R=(); C=()
for i in $(seq "$RUNS"); do
    rm -rf "$SCRATCH/root/tree" "$SCRATCH/cpa"; sync
    t0=$(now); "$BIN" cp -r --streams "$N" "$SCRATCH/tree" "ramsys://$ADDR/" > /dev/null; t1=$(now)
    diff -rq "$SCRATCH/tree" "$SCRATCH/root/tree"
    R+=("$(echo "$t1 - $t0" | bc -l)")
    t0=$(now); cp -a "$SCRATCH/tree" "$SCRATCH/cpa"; t1=$(now)
    C+=("$(echo "$t1 - $t0" | bc -l)")
done
rt=$(printf '%s\n' "${R[@]}" | median); ct=$(printf '%s\n' "${C[@]}" | median)
echo "tree 20000 x 16 KB: ramsys via daemon median ${rt} s (runs: ${R[*]}); cp -a median ${ct} s (runs: ${C[*]}); ratio cp/ramsys $(echo "$ct / $rt" | bc -l | cut -c1-5)"

head -c 4G /dev/urandom > "$SHM/big4g"
start_daemon "$SHM/root"; ADDR2=$ADDR
M=()
for i in $(seq "$RUNS"); do
    rm -f "$SHM/root/big4g"
    out=$("$BIN" cp --json --streams "$N" "$SHM/big4g" "ramsys://$ADDR2/big4g" | tail -1)
    M+=("$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["mb_s"])')")
done
cmp "$SHM/big4g" "$SHM/root/big4g"
rm -f "$SHM/root/big4g"
mm=$(printf '%s\n' "${M[@]}" | median)
iperf3 -s -p 5299 -1 -D >/dev/null 2>&1 || true
sleep 0.5
I=()
for i in $(seq "$RUNS"); do
    iperf3 -s -p 5299 -1 -D >/dev/null 2>&1 || true; sleep 0.3
    I+=("$(iperf3 -c 127.0.0.1 -p 5299 -P "$N" -t 5 -J | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e6)')")
done
im=$(printf '%s\n' "${I[@]}" | median)
echo "4 GiB file, page cache (tmpfs) to tmpfs, $N streams: ramsys median ${mm} MB/s (runs: ${M[*]}); iperf3 -P $N median ${im} MB/s (runs: ${I[*]}); ratio $(echo "$mm / $im" | bc -l | cut -c1-5)"
