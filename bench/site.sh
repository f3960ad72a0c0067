#!/usr/bin/env bash
# Site substrate and monitoring (issue 19, docs/SITE.md "Numbers"):
# 1. DDSS get/put latency and one-requester throughput per coherence model
#    on loopback (crates/ddss/examples/latency.rs; ITERS operations each);
# 2. monitoring cost: CPU time of three daemons peered at the default 50 ms
#    and of one daemon outside a site, over SECS seconds (utime + stime
#    from /proc/PID/stat). Everything on 127.0.0.1; daemons stopped by PID.
# Usage: bench/site.sh [ITERS] [SECS]
set -euo pipefail
cd "$(dirname "$0")/.."
ITERS=${1:-2000}
SECS=${2:-20}
BIN=${RAMSYS_BIN:-target/release/ramsys}
[ -x "$BIN" ] || cargo build --release -p ramsys
echo "machine: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
cargo run -q --release -p ramsys-ddss --example latency "$ITERS"
SCRATCH=$(mktemp -d /tmp/ramsys-site-bench.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$SCRATCH"; }
trap cleanup EXIT
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$SCRATCH/key"; echo >> "$SCRATCH/key"
chmod 600 "$SCRATCH/key"
start() { # OUT ARGS...: start a daemon in the background (PIDS), wait for its address
    local out=$1; shift
    "$BIN" serve --listen 127.0.0.1:0 --root "$SCRATCH" --key-file "$SCRATCH/key" "$@" > "$out" 2>/dev/null &
    PIDS+=($!)
    for _ in $(seq 100); do grep -q listening "$out" 2>/dev/null && break; sleep 0.05; done
}
addr() { sed -n 's/^listening on //p' "$1"; }
start "$SCRATCH/a.out" --site-interval 50
A=$(addr "$SCRATCH/a.out")
start "$SCRATCH/b.out" --peer "$A"
start "$SCRATCH/c.out" --peer "$A" --peer "$(addr "$SCRATCH/b.out")"
start "$SCRATCH/l.out"
sleep 2
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
declare -A T0
for p in "${PIDS[@]}"; do T0[$p]=$(ticks "$p"); done
sleep "$SECS"
HZ=$(getconf CLK_TCK)
echo "monitoring cost over $SECS s (% of one core), load $(cut -d' ' -f1-3 /proc/loadavg):"
names=("site A" "site B" "site C" "no site")
i=0
for p in "${PIDS[@]}"; do
    d=$(( $(ticks "$p") - T0[$p] ))
    printf '  %-8s %5.2f %%\n' "${names[$i]}" "$(echo "$d * 100 / $HZ / $SECS" | bc -l)"
    i=$((i + 1))
done
