#!/bin/bash
# Small files (issue 17): the sink's per-file syscalls and wall time of a push
# of the kernel-like tree (bench/run.py's "kernel" workload, 47,984 files)
# to a daemon on loopback, against `cp -a` of the same tree on the same disk.
#
#   bench/small_files.sh [BINARY...]   (env: SRC, WORK, ROUNDS, STRACE=0|1)
#
# STRACE=1: one run of each tool under `strace -f -c` (the daemon for ramsys,
# and the pushing client for the source side; cp -a whole), per-file counts
# printed. Otherwise ROUNDS interleaved timed rounds (sync + 1 s pause
# before each run), wall seconds and `uptime` printed.
set -euo pipefail
SRC=${SRC:-/var/tmp/ramsys-bench/src/kernel}
WORK=${WORK:-/var/tmp/large/small}
ROUNDS=${ROUNDS:-3}
BINS=("${@:-target/release/ramsys}")
mkdir -p "$WORK"
NFILES=$(find "$SRC" -type f | wc -l)
cat "$SRC"/../kernel.stamp.json >/dev/null 2>&1 || true
# Warm the source once.
find "$SRC" -type f -print0 | xargs -0 cat >/dev/null

start_daemon() { # BIN ROOT [strace-out]
    local bin=$1 root=$2 out=${3:-}
    rm -rf "$root"; mkdir -p "$root"
    local pre=()
    [ -n "$out" ] && pre=(strace -f -c -o "$out")
    "${pre[@]}" "$bin" serve --listen 127.0.0.1:0 --root "$root" --key-file "$WORK/key" \
        >"$WORK/daemon.out" 2>"$WORK/daemon.err" &
    DPID=$!
    for _ in $(seq 100); do
        PORT=$(sed -n 's/.*listening on [^ ]*:\([0-9]*\).*/\1/p' "$WORK/daemon.out" | head -1)
        [ -n "$PORT" ] && [ -e "$WORK/key" ] && return 0
        sleep 0.1
    done
    echo "daemon did not start" >&2; cat "$WORK/daemon.err" >&2; exit 1
}
stop_daemon() { # under strace, the daemon is strace's child
    local pids; pids=$(pgrep -P $DPID || true)
    kill -INT ${pids:-$DPID} 2>/dev/null || true; wait $DPID 2>/dev/null || true
}

# Total calls of a `strace -c` summary, and the lines with most calls.
calls() { awk '/^------/{n++; next} n==1 && NF>=5 {c+=$4} END{print c}' "$1"; }
top() { awk '/^------/{n++; next} n==1 && NF>=5 {print $4, $NF}' "$1" | sort -rn | head -12 |
        awk -v n="$NFILES" '{printf "    %-18s %8d  %.2f/file\n", $2, $1, $1/n}'; }

if [ "${STRACE:-0}" = 1 ]; then
    for bin in "${BINS[@]}"; do
        start_daemon "$bin" "$WORK/dst" "$WORK/strace.daemon"
        strace -f -c -o "$WORK/strace.client" "$bin" cp -r --key-file "$WORK/key" "$SRC" \
            "ramsys://127.0.0.1:$PORT/t" >/dev/null
        stop_daemon
        echo "$bin sink (daemon): $(calls "$WORK/strace.daemon") calls, $NFILES files"; top "$WORK/strace.daemon"
        echo "$bin source (client): $(calls "$WORK/strace.client") calls"; top "$WORK/strace.client"
    done
    rm -rf "$WORK/cp"
    strace -f -c -o "$WORK/strace.cp" cp -a "$SRC" "$WORK/cp"
    echo "cp -a: $(calls "$WORK/strace.cp") calls"; top "$WORK/strace.cp"
    exit 0
fi

uptime
for r in $(seq "$ROUNDS"); do
    for bin in "${BINS[@]}"; do
        start_daemon "$bin" "$WORK/dst"
        sync; sleep 1
        t0=$(date +%s.%N)
        "$bin" cp -r --key-file "$WORK/key" "$SRC" "ramsys://127.0.0.1:$PORT/t" >/dev/null
        t1=$(date +%s.%N)
        stop_daemon
        printf "round %d %-40s %6.2f s\n" "$r" "$bin" "$(echo "$t1 - $t0" | bc)"
    done
    rm -rf "$WORK/cp"; sync; sleep 1
    t0=$(date +%s.%N); cp -a "$SRC" "$WORK/cp"; t1=$(date +%s.%N)
    printf "round %d %-40s %6.2f s\n" "$r" "cp -a" "$(echo "$t1 - $t0" | bc)"
done
uptime
