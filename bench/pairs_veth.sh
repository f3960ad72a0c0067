#!/usr/bin/env bash
# Third-party striping over daemon pairs vs one pair (issue 19, docs/SITE.md
# "Between two sites"): six daemons, A1-A3 serving one shared source
# directory and B1-B3 another shared destination, each in its own network
# namespace, all joined by a bridge on the host (where the agent runs). The
# data of pair i leaves Ai through Ai's veth and enters Bi through Bi's,
# both capped by tbf at RATE (egress of Ai's namespace end and of the
# bridge port toward Bi), so every pair has its own capped path and one
# pair alone cannot fill three. The agent asks A1 to push the tree to B1,
# then the same striped over the three pairs (--stripe), interleaved, RUNS
# rounds, the tree checked with diff -r after each; medians. Needs root
# (namespaces, bridge, tc); deletes its namespaces, bridge and files on exit.
# Usage: bench/pairs_veth.sh [RUNS] [RATE] [FILES] [SIZE]
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
RATE=${2:-200mbit}
FILES=${3:-64}
SIZE=${4:-1M}
BIN=${RAMSYS_BIN:-target/release/ramsys}
[ -x "$BIN" ] || cargo build --release -p ramsys
BIN=$(realpath "$BIN")
SCRATCH=${SCRATCH:-/var/tmp/ramsys-pairs-veth}
BR=brpairs
NAMES=(a1 a2 a3 b1 b2 b3)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for n in "${NAMES[@]}"; do ip netns del "rp$n" 2>/dev/null || true; done
    ip link del "$BR" 2>/dev/null || true
    rm -rf "$SCRATCH"
}
trap cleanup EXIT
rm -rf "$SCRATCH"; mkdir -p "$SCRATCH/a/src" "$SCRATCH/b"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$SCRATCH/key"; echo >> "$SCRATCH/key"
chmod 600 "$SCRATCH/key"
export RAMSYS_KEY_FILE="$SCRATCH/key"
for i in $(seq "$FILES"); do head -c "$SIZE" /dev/urandom > "$SCRATCH/a/src/f$i"; done
ip link add "$BR" type bridge
ip addr add 10.78.0.1/24 dev "$BR"
ip link set "$BR" up
declare -A ADDR
k=10
for n in "${NAMES[@]}"; do
    k=$((k + 1))
    ns="rp$n"
    ip netns add "$ns"
    ip link add "vp$n" type veth peer name eth0 netns "$ns"
    ip link set "vp$n" master "$BR" up
    ip -n "$ns" addr add "10.78.0.$k/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    # The cap: what leaves this daemon's namespace, and what the bridge
    # sends into it.
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$RATE" burst 64kb latency 50ms
    tc qdisc add dev "vp$n" root tbf rate "$RATE" burst 64kb latency 50ms
    ADDR[$n]="10.78.0.$k:7070"
done
serve() { # NAME ROOT ARGS...
    local n=$1 root=$2; shift 2
    ip netns exec "rp$n" "$BIN" serve --listen "${ADDR[$n]}" --root "$root" \
        --key-file "$SCRATCH/key" --site-interval 50 "$@" > "$SCRATCH/$n.out" 2>/dev/null &
    PIDS+=($!)
    for _ in $(seq 100); do grep -q listening "$SCRATCH/$n.out" 2>/dev/null && break; sleep 0.05; done
}
serve a1 "$SCRATCH/a"
serve a2 "$SCRATCH/a" --peer "${ADDR[a1]}"
serve a3 "$SCRATCH/a" --peer "${ADDR[a1]}"
for i in 1 2 3; do serve "b$i" "$SCRATCH/b" --peer "${ADDR[a$i]}"; done
# Each Ai must see Bi in its site view before it relays to it.
for i in 1 2 3; do
    for _ in $(seq 200); do
        "$BIN" status --site --json "${ADDR[a$i]}" > "$SCRATCH/site.json" 2>/dev/null || true
        grep -q "\"${ADDR[b$i]}\"" "$SCRATCH/site.json" && break
        sleep 0.05
    done
done
SRC_LIST="${ADDR[a1]},${ADDR[a2]},${ADDR[a3]}"
SNK_LIST="${ADDR[b1]},${ADDR[b2]},${ADDR[b3]}"
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2)? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
declare -A T
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq "$RUNS"); do
    for mode in one pairs; do
        rm -rf "$SCRATCH/b/src"; sync
        if [ "$mode" = one ]; then
            line=$("$BIN" cp -r --json "ramsys://${ADDR[a1]}/src" "ramsys://${ADDR[b1]}/" | grep '"summary"')
        else
            line=$("$BIN" cp -r --json --stripe "ramsys://$SRC_LIST/src" "ramsys://$SNK_LIST/" | grep '"summary"')
        fi
        s=$(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); assert j["ok"], j; print("%.2f %.1f" % (j["wall_s"], j["mb_s"]))' "$line")
        diff -r "$SCRATCH/a/src" "$SCRATCH/b/src" > /dev/null
        T[$mode]+="$(echo "$s" | cut -d' ' -f1) "
        T[${mode}mb]+="$(echo "$s" | cut -d' ' -f2) "
    done
done
echo "machine: $(nproc) CPUs, load $LOAD0 before, $(cut -d' ' -f1-3 /proc/loadavg) after; $FILES x $SIZE, tbf $RATE per daemon veth (both ways)"
for mode in one pairs; do
    printf '%-6s wall median %6.2f s (%s) MB/s median %6.1f\n' "$mode" \
        "$(printf '%s\n' ${T[$mode]} | median)" "${T[$mode]}" "$(printf '%s\n' ${T[${mode}mb]} | median)"
done
