#!/bin/bash
# Bulk (issue 17): what still waits for the disk on a 4 x 1 GiB push to a
# daemon on loopback, per --direct policy: wall seconds, whole-machine
# iowait seconds (/proc/stat), the daemon's and client's CPU seconds, and
# the daemon's /proc/PID/io (bytes it made the disk read and write itself,
# and cancelled writes). Warm source, `sync` + 1 s before each run.
#
#   bench/bulk_wait.sh [BINARY]   (env: SRC, WORK, ROUNDS, POLICIES)
set -euo pipefail
BIN=${1:-target/release/ramsys}
SRC=${SRC:-/var/tmp/ramsys-bench/src/bulk}
WORK=${WORK:-/var/tmp/large/bulk}
ROUNDS=${ROUNDS:-1}
POLICIES=${POLICIES:-"auto never"}
mkdir -p "$WORK"
cat "$SRC"/* > /dev/null
iowait() { awk '/^cpu /{print $6 / 100}' /proc/stat; }
cpu_of() { awk '{print ($14 + $15) / 100}' /proc/$1/stat; }
uptime
for r in $(seq "$ROUNDS"); do
for pol in $POLICIES; do
    rm -rf "$WORK/dst"; mkdir -p "$WORK/dst"
    "$BIN" serve --listen 127.0.0.1:0 --root "$WORK/dst" --key-file "$WORK/key" --direct "$pol" \
        > "$WORK/d.out" 2> "$WORK/d.err" &
    D=$!
    for _ in $(seq 100); do grep -q listening "$WORK/d.out" 2>/dev/null && [ -e "$WORK/key" ] && break; sleep 0.1; done
    P=$(sed -n 's/.*:\([0-9]*\)$/\1/p' "$WORK/d.out")
    sync; sleep 1
    w0=$(iowait); t0=$(date +%s.%N)
    /usr/bin/time -f "%U %S" -o "$WORK/client.time" "$BIN" cp -r --direct "$pol" --key-file "$WORK/key" \
        "$SRC" "ramsys://127.0.0.1:$P/" > /dev/null
    t1=$(date +%s.%N); w1=$(iowait)
    dcpu=$(cpu_of $D)
    io=$(awk '/^(read_bytes|write_bytes|cancelled_write_bytes)/{printf "%s=%.0fMB ", $1, $2/1e6}' /proc/$D/io)
    kill -INT $D; wait $D || true
    ccpu=$(awk '{print $1 + $2}' "$WORK/client.time")
    printf "round %d --direct %-6s wall %5.2f s  iowait %5.2f s  cpu daemon %.2f client %.2f s  daemon io: %s\n" \
        "$r" "$pol" "$(echo "$t1 - $t0" | bc)" "$(echo "$w1 - $w0" | bc)" "$dcpu" "$ccpu" "$io"
done
done
rm -rf "$WORK/dst"
uptime
