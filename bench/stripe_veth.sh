#!/usr/bin/env bash
# Striped vs one-daemon push (issue 19, docs/SITE.md "Striping"): three
# daemons, each in its own network namespace behind a veth pair whose host
# end is capped by tbf at RATE, all serving one shared directory (the
# site's shared file system). The agent on the host pushes the same tree
# to one daemon, then striped over the three (--stripe), interleaved,
# RUNS rounds; medians. One pair alone cannot fill the three caps, so the
# striped push should approach 3x. The same again with a tree of one file
# of BIG bytes (BIG=0: skip), which stripes as pieces (docs/SITE.md "A
# big file's blocks"). Needs root (namespaces, tc); deletes its namespaces
# and files on exit.
# Usage: bench/stripe_veth.sh [RUNS] [RATE] [FILES] [SIZE] [BIG]
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
RATE=${2:-200mbit}
FILES=${3:-64}
SIZE=${4:-1M}
BIG=${5:-256M}
BIN=${RAMSYS_BIN:-target/release/ramsys}
[ -x "$BIN" ] || cargo build --release -p ramsys
BIN=$(realpath "$BIN")
SCRATCH=${SCRATCH:-/var/tmp/ramsys-stripe-veth}
NS=(rsite1 rsite2 rsite3)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for n in "${NS[@]}"; do ip netns del "$n" 2>/dev/null || true; done
    rm -rf "$SCRATCH"
}
trap cleanup EXIT
rm -rf "$SCRATCH"; mkdir -p "$SCRATCH/shared" "$SCRATCH/src" "$SCRATCH/big"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$SCRATCH/key"; echo >> "$SCRATCH/key"
chmod 600 "$SCRATCH/key"
export RAMSYS_KEY_FILE="$SCRATCH/key"
for i in $(seq "$FILES"); do head -c "$SIZE" /dev/urandom > "$SCRATCH/src/f$i"; done
WORK=(src)
if [ "$BIG" != 0 ]; then head -c "$BIG" /dev/urandom > "$SCRATCH/big/huge"; WORK+=(big); fi
ADDRS=()
for i in 1 2 3; do
    n=${NS[$((i - 1))]}
    ip netns add "$n"
    ip link add "vrs$i" type veth peer name eth0 netns "$n"
    ip addr add "10.77.$i.1/24" dev "vrs$i"
    ip link set "vrs$i" up
    ip -n "$n" addr add "10.77.$i.2/24" dev eth0
    ip -n "$n" link set eth0 up
    ip -n "$n" link set lo up
    # The cap, both ways: pushes fill host -> daemon.
    tc qdisc add dev "vrs$i" root tbf rate "$RATE" burst 64kb latency 50ms
    ip netns exec "$n" tc qdisc add dev eth0 root tbf rate "$RATE" burst 64kb latency 50ms
    ip netns exec "$n" "$BIN" serve --listen "10.77.$i.2:7070" --root "$SCRATCH/shared" \
        --key-file "$SCRATCH/key" > "$SCRATCH/d$i.out" 2>/dev/null &
    PIDS+=($!)
    ADDRS+=("10.77.$i.2:7070")
done
for i in 1 2 3; do
    for _ in $(seq 100); do grep -q listening "$SCRATCH/d$i.out" 2>/dev/null && break; sleep 0.05; done
done
LIST=$(IFS=,; echo "${ADDRS[*]}")
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2)? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
declare -A T
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$RUNS"); do
    for w in "${WORK[@]}"; do
        for mode in one striped; do
            rm -rf "$SCRATCH/shared/$w"; sync
            if [ "$mode" = one ]; then
                line=$("$BIN" cp -r --json "$SCRATCH/$w" "ramsys://${ADDRS[0]}/" | grep '"summary"')
            else
                line=$("$BIN" cp -r --json --stripe "$SCRATCH/$w" "ramsys://$LIST/" | grep '"summary"')
            fi
            # Wall, MB/s and each stripe's share of the bytes.
            s=$(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); assert j["ok"]; st=j.get("stripes") or []; print("%.2f %.1f %s" % (j["wall_s"], j["mb_s"], "/".join("%d" % (s["bytes"] >> 20) for s in st) or "-"))' "$line")
            diff -r "$SCRATCH/$w" "$SCRATCH/shared/$w" > /dev/null
            T[$w$mode]+="$(echo "$s" | cut -d' ' -f1) "
            T[$w${mode}mb]+="$(echo "$s" | cut -d' ' -f2) "
            T[$w${mode}st]="$(echo "$s" | cut -d' ' -f3)"
        done
    done
done
echo "machine: $(nproc) CPUs, load after $(cut -d' ' -f1-3 /proc/loadavg); tbf $RATE per veth pair"
for w in "${WORK[@]}"; do
    if [ "$w" = src ]; then echo "tree: $FILES x $SIZE"; else echo "one file of $BIG"; fi
    for mode in one striped; do
        printf '  %-8s wall median %6.2f s (%s) MB/s median %6.1f, MiB per stripe %s\n' "$mode" \
            "$(printf '%s\n' ${T[$w$mode]} | median)" "${T[$w$mode]}" \
            "$(printf '%s\n' ${T[$w${mode}mb]} | median)" "${T[$w${mode}st]}"
    done
done
