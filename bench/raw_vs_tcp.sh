#!/usr/bin/env bash
# Raw-Ethernet data links vs TCP, end to end through a daemon (issue 18,
# seed 002; docs/TYCHE.md "Bench"): two network namespaces joined by PAIRS
# veth pairs at MTU, the daemon in B (`serve --raw-iface bI`), the agent in A
# pushing (a) one SIZE file and (b) a set of 4-128 KiB files (FILESET bytes
# in total) with `--transport tcp` and `--transport raw`, inline and queued
# send paths, interleaved per round. Reported per case: MB/s (bytes / agent
# wall time) and CPU s/GB of both ends (agent user+sys from time(1) plus the
# daemon's session CPU, the summary's peer_cpu_s).
# Needs root. Usage: bench/raw_vs_tcp.sh [RUNS]
#   PAIRS=1|2 MTU=9000|1500 SIZE=1G FILESET=256M STREAMS=2 PATHS="inline queued"
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-1}
PAIRS=${PAIRS:-1}
MTU=${MTU:-9000}
SIZE=${SIZE:-1G}
FILESET=${FILESET:-256M}
STREAMS=${STREAMS:-2}
PATHS=${PATHS:-inline queued}
BIN=$(readlink -f "${RAMSYS_BIN:-${CARGO_TARGET_DIR:-target}/release/ramsys}")
[ -x "$BIN" ] || { echo "build first: cargo build --release -p ramsys" >&2; exit 1; }
SCRATCH=${SCRATCH:-/var/tmp/ramsys-raw-bench}
A=rawbench-a-$$ B=rawbench-b-$$
DPID=""
cleanup() {
    [ -n "$DPID" ] && kill "$DPID" 2>/dev/null || true
    ip netns del "$A" 2>/dev/null || true
    ip netns del "$B" 2>/dev/null || true
    rm -rf "$SCRATCH"
}
trap cleanup EXIT
rm -rf "$SCRATCH"; mkdir -p "$SCRATCH/root" "$SCRATCH/bulk" "$SCRATCH/set"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$SCRATCH/key"; chmod 600 "$SCRATCH/key"
export RAMSYS_KEY_FILE="$SCRATCH/key"

ip netns add "$A"; ip netns add "$B"
ip -n "$A" link set lo up; ip -n "$B" link set lo up
RAWF=()
for i in $(seq 0 $((PAIRS - 1))); do
    ip link add "a$i" netns "$A" type veth peer name "b$i" netns "$B"
    ip -n "$A" link set "a$i" mtu "$MTU" up; ip -n "$B" link set "b$i" mtu "$MTU" up
    ip -n "$A" addr add "10.99.$i.1/24" dev "a$i"; ip -n "$B" addr add "10.99.$i.2/24" dev "b$i"
    RAWF+=(--raw-iface "b$i")
done
sleep 1

head -c "$SIZE" /dev/urandom > "$SCRATCH/bulk/f"
python3 - "$SCRATCH/set" "$FILESET" <<'PY'
import os, random, sys
root, total = sys.argv[1], sys.argv[2]
units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
n = int(total[:-1]) * units[total[-1]] if total[-1] in units else int(total)
r, done, i = random.Random(18), 0, 0
while done < n:
    s = r.randint(4096, 131072)
    d = os.path.join(root, f"d{i // 500:03}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i:05}"), "wb") as f:
        f.write(os.urandom(s))
    done, i = done + s, i + 1
PY
sync

ip netns exec "$B" "$BIN" serve --listen 10.99.0.2:7447 --root "$SCRATCH/root" --key-file "$SCRATCH/key" \
    "${RAWF[@]}" > "$SCRATCH/d.out" 2> "$SCRATCH/d.err" &
DPID=$!
for _ in $(seq 200); do grep -q listening "$SCRATCH/d.out" 2>/dev/null && break; sleep 0.05; done
grep -q listening "$SCRATCH/d.out" || { cat "$SCRATCH/d.err"; exit 1; }
AGENT_RAW=()
for i in $(seq 0 $((PAIRS - 1))); do AGENT_RAW+=(--raw-iface "a$i"); done

declare -A MBS CPU
for r in $(seq "$RUNS"); do
    for w in bulk set; do
        for p in $PATHS; do
            for t in tcp raw; do
                rm -rf "$SCRATCH/root/$w"; sync
                extra=(); [ "$t" = raw ] && extra=("${AGENT_RAW[@]}" --channels round-robin)
                out=$(ip netns exec "$A" /usr/bin/time -f 'TIME %e %U %S' "$BIN" cp -r --json \
                    --no-resume --transport "$t" "${extra[@]}" --send-path "$p" --streams "$STREAMS" \
                    "$SCRATCH/$w" "ramsys://10.99.0.2:7447/" 2>&1)
                read -r _ e u s <<< "$(grep '^TIME' <<< "$out")"
                sum=$(grep '"summary"' <<< "$out")
                bytes=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["bytes"])' "$sum")
                peer=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["peer_cpu_s"])' "$sum")
                k="$w $p $t"
                MBS[$k]+="$(echo "$bytes / $e / 1000000" | bc -l | xargs printf '%.0f') "
                CPU[$k]+="$(echo "($u + $s + $peer) / ($bytes / 1000000000)" | bc -l | xargs printf '%.2f') "
            done
        done
    done
done
echo "raw vs tcp: $PAIRS veth pair(s), MTU $MTU, $STREAMS streams, file $SIZE, file set $FILESET (4-128 KiB)"
echo "machine: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg) (uptime: $(uptime | sed 's/.*load/load/'))"
printf '%-5s %-7s %-4s  %-18s %s\n' workload path link "MB/s (per run)" "CPU s/GB both ends (per run)"
for w in bulk set; do
    for p in $PATHS; do
        for t in tcp raw; do
            k="$w $p $t"
            printf '%-5s %-7s %-4s  %-18s %s\n' "$w" "$p" "$t" "${MBS[$k]}" "${CPU[$k]}"
        done
    done
done
