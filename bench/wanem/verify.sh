#!/usr/bin/env bash
# Verify wanem: set up rsb-a <-> rsb-b through it, check the ping RTT is within
# 5 % of 2 x --delay-ms, measure iperf3 throughput through it, tear down.
# Usage: bench/wanem/verify.sh [DELAY_MS] [RATE_MBIT] [QUEUE_PKTS]
#   WANEM=path/to/wanem overrides the binary (default: target/release/wanem).
set -u
DELAY_MS=${1:-10}
RATE_MBIT=${2:-1000}
QUEUE_PKTS=${3:-1000}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
WANEM=${WANEM:-${CARGO_TARGET_DIR:-$ROOT/target}/release/wanem}
NS_A=rsb-a NS_B=rsb-b ADDR_A=10.201.0.1 ADDR_B=10.201.0.2
[ -x "$WANEM" ] || { echo "verify: no wanem binary at $WANEM (cargo build --release -p wanem)"; exit 2; }

WANEM_PID="" IPERF_PID=""
cleanup() {
    [ -n "$IPERF_PID" ] && kill "$IPERF_PID" 2>/dev/null
    [ -n "$WANEM_PID" ] && kill "$WANEM_PID" 2>/dev/null && wait "$WANEM_PID" 2>/dev/null
    ip netns del $NS_A 2>/dev/null
    ip netns del $NS_B 2>/dev/null
}
trap cleanup EXIT

for ns in $NS_A $NS_B; do
    ip netns del $ns 2>/dev/null
    ip netns add $ns
    ip -n $ns link set lo up
    # Room for a large bandwidth-delay product (per-netns sysctls).
    ip netns exec $ns sysctl -qw net.ipv4.tcp_rmem="4096 131072 67108864" net.ipv4.tcp_wmem="4096 65536 67108864" 2>/dev/null
done

OUT=$(mktemp)
"$WANEM" --ns-a $NS_A --ns-b $NS_B --addr-a $ADDR_A --addr-b $ADDR_B \
    --delay-ms "$DELAY_MS" --rate-mbit "$RATE_MBIT" --queue-pkts "$QUEUE_PKTS" >"$OUT" 2>&1 &
WANEM_PID=$!
for _ in $(seq 50); do grep -q ready "$OUT" && break; sleep 0.1; done
grep -q ready "$OUT" || { cat "$OUT"; echo "verify: wanem did not start"; exit 1; }
cat "$OUT"

fail=0
want=$(awk -v d="$DELAY_MS" 'BEGIN{print 2*d}')
avg=$(ip netns exec $NS_A ping -q -c 20 -i 0.1 $ADDR_B | awk -F/ '/^rtt/{print $5}')
echo "ping: RTT avg ${avg:-none} ms, expected ${want} ms"
if [ -z "$avg" ]; then
    echo "verify: FAIL no ping reply"; fail=1
else
    awk -v a="$avg" -v w="$want" 'BEGIN{ d=a-w; if (d<0) d=-d;
        # A 0 ms setting cannot be met within 5 %: allow 0.5 ms absolute then.
        tol = (w > 0) ? 0.05*w : 0.5; exit !(d <= tol) }' \
        && echo "verify: RTT OK (within 5 %)" || { echo "verify: FAIL RTT off by more than 5 %"; fail=1; }
fi

ip netns exec $NS_B iperf3 -s -B $ADDR_B -1 >/dev/null 2>&1 &
IPERF_PID=$!
sleep 0.5
for streams in 1 4; do
    bps=$(ip netns exec $NS_A iperf3 -c $ADDR_B -t 5 -O 1 -P $streams -J 2>/dev/null \
        | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"])' 2>/dev/null)
    if [ -n "$bps" ]; then
        echo "iperf3: $streams stream(s) through wanem: $(awk -v b="$bps" 'BEGIN{printf "%.1f", b/1e6}') Mbit/s (cap ${RATE_MBIT} Mbit/s, RTT ${want} ms)"
    else
        echo "verify: FAIL iperf3 ($streams streams) produced no result"; fail=1
    fi
    wait "$IPERF_PID" 2>/dev/null
    ip netns exec $NS_B iperf3 -s -B $ADDR_B -1 >/dev/null 2>&1 &
    IPERF_PID=$!
    sleep 0.5
done
kill "$WANEM_PID"; wait "$WANEM_PID" 2>/dev/null; WANEM_PID=""
cat "$OUT" | grep -v ready; rm -f "$OUT"
[ $fail = 0 ] && echo "verify: PASS" || echo "verify: FAILED"
exit $fail
