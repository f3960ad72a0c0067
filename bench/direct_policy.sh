#!/usr/bin/env bash
# The source's read policy (issue 17): 4 x 1 GiB pushed through a daemon on
# loopback with --direct always (every large file read with O_DIRECT, the
# old default), auto (O_DIRECT only for files mostly not in the page cache)
# and never, interleaved in each round; warm source (just written, resident)
# and cold (echo 3 > drop_caches before each run, needs root). Medians.
# Usage: bench/direct_policy.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
BIN=${RAMSYS_BIN:-target/release/ramsys}
[ -x "$BIN" ] || cargo build --release -p ramsys
SCRATCH=${SCRATCH:-/var/tmp/ramsys-direct-policy}
rm -rf "$SCRATCH"; mkdir -p "$SCRATCH/root" "$SCRATCH/bulk"
export RAMSYS_KEY_FILE="$SCRATCH/key"
DPID=""
cleanup() { [ -n "$DPID" ] && kill "$DPID" 2>/dev/null; rm -rf "$SCRATCH"; }
trap cleanup EXIT
for i in 0 1 2 3; do head -c 1G /dev/urandom > "$SCRATCH/bulk/f$i"; done
"$BIN" serve --listen 127.0.0.1:0 --root "$SCRATCH/root" > "$SCRATCH/d.out" 2>/dev/null &
DPID=$!
for _ in $(seq 100); do grep -q listening "$SCRATCH/d.out" 2>/dev/null && break; sleep 0.05; done
ADDR=$(sed -n 's/^listening on //p' "$SCRATCH/d.out")
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2)? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
declare -A T
for r in $(seq "$RUNS"); do
    for cache in warm ${COLD:-cold}; do
        for mode in always auto never; do
            rm -rf "$SCRATCH/root/bulk"; sync
            if [ "$cache" = cold ]; then echo 3 > /proc/sys/vm/drop_caches; else cat "$SCRATCH"/bulk/* > /dev/null; fi
            s=$(/usr/bin/time -f '%e' "$BIN" cp -r --direct "$mode" "$SCRATCH/bulk" "ramsys://$ADDR/" 2>&1 >/dev/null | tail -1)
            T[$cache$mode]+="$s "
        done
    done
done
echo "machine: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $(df --output=source "$SCRATCH" | tail -1); the daemon's writes use --direct auto in every run"
for cache in warm ${COLD:-cold}; do
    for mode in always auto never; do
        printf '%-5s --direct %-7s wall median %6.2f s (%s)\n' "$cache" "$mode" "$(printf '%s\n' ${T[$cache$mode]} | median)" "${T[$cache$mode]}"
    done
done
