#!/bin/bash
# Larger than memory (issue 17): does a transfer evict the host's working
# set? Daemon and client run inside a memory cgroup (default 6 GiB) to
# emulate a machine smaller than the data: a 1 GiB "hot" file is read
# inside the cgroup (cached, charged to it), then 2 x 5 GiB (cold: caches
# dropped first) are pushed, and fincore reports how much of the hot file is
# still resident. Same for an rsync daemon, GridFTP (globus-gridftp-server,
# globus-url-copy -fast -p 4 -cc 4, as bench/run.py runs it) and cp -a.
#
#   bench/memory_pressure.sh [BINARY]   (env: WORK, LIMIT, SIZE_GIB, TOOLS)
set -euo pipefail
BIN=${1:-target/release/ramsys}
WORK=${WORK:-/var/tmp/large/mem}
LIMIT=${LIMIT:-6G}
SIZE_GIB=${SIZE_GIB:-5}
TOOLS=${TOOLS:-"ramsys rsync gridftp cp"}
mkdir -p "$WORK/src"
# cgroup v2 (memory.max) or v1 (memory.limit_in_bytes).
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    CG=/sys/fs/cgroup/ramsys-mem-bench; mkdir -p $CG; echo "$LIMIT" > $CG/memory.max
else
    CG=/sys/fs/cgroup/memory/ramsys-mem-bench; mkdir -p $CG
    echo "$(numfmt --from=iec "$LIMIT")" > $CG/memory.limit_in_bytes
fi
in_cg() { sh -c "echo \$\$ > $CG/cgroup.procs; exec \"\$@\"" sh "$@"; }
# Background: exec so that $! is the server itself.
bg_cg() { exec sh -c "echo \$\$ > $CG/cgroup.procs; exec \"\$@\"" sh "$@"; }
[ -s "$WORK/hot" ] || head -c 1G /dev/urandom > "$WORK/hot"
for i in 0 1; do
    f="$WORK/src/big-$i"
    [ "$(stat -c %s "$f" 2>/dev/null || echo 0)" = $((SIZE_GIB << 30)) ] ||
        dd if=/dev/urandom of="$f" bs=16M count=$((SIZE_GIB * 64)) status=none
done
resident() { fincore -b -n -o RES,SIZE "$WORK/hot" | awk '{printf "%.1f", 100 * $1 / $2}'; }
uptime
for tool in $TOOLS; do
    rm -rf "$WORK/dst"; mkdir -p "$WORK/dst"
    sync; echo 3 > /proc/sys/vm/drop_caches
    in_cg cat "$WORK/hot" > /dev/null
    before=$(resident)
    t0=$(date +%s.%N)
    case $tool in
    ramsys)
        (bg_cg "$BIN" serve --listen 127.0.0.1:0 --root "$WORK/dst" --key-file "$WORK/key" \
            > "$WORK/d.out" 2> "$WORK/d.err") &
        D=$!
        for _ in $(seq 100); do grep -q listening "$WORK/d.out" 2>/dev/null && [ -e "$WORK/key" ] && break; sleep 0.1; done
        t0=$(date +%s.%N)
        P=$(sed -n 's/.*:\([0-9]*\)$/\1/p' "$WORK/d.out")
        in_cg "$BIN" cp -r --key-file "$WORK/key" "$WORK/src" "ramsys://127.0.0.1:$P/" > /dev/null
        t1=$(date +%s.%N); kill -INT $D; wait $D || true ;;
    rsync)
        printf "[m]\npath = %s\nread only = false\nuid = root\ngid = root\n" "$WORK/dst" > "$WORK/rsyncd.conf"
        (bg_cg rsync --daemon --no-detach --config="$WORK/rsyncd.conf" --address=127.0.0.1 --port=28873) &
        D=$!; sleep 1; t0=$(date +%s.%N)
        in_cg rsync -a "$WORK/src" rsync://127.0.0.1:28873/m/
        t1=$(date +%s.%N); kill $D; wait $D || true ;;
    gridftp)
        command -v globus-url-copy > /dev/null || { echo "gridftp: not installed (bench/setup.sh)"; continue; }
        (bg_cg globus-gridftp-server -aa -anonymous-user root -allow-root -s -p 28811 \
            -control-interface 127.0.0.1 -data-interface 127.0.0.1 -home-dir / -log-level error \
            -l "$WORK/gridftp.log") &
        D=$!; sleep 1; t0=$(date +%s.%N)
        in_cg globus-url-copy -r -cd -fast -p 4 -cc 4 -pp "file://$WORK/src/" "ftp://127.0.0.1:28811$WORK/dst/src/"
        t1=$(date +%s.%N); kill $D; wait $D || true ;;
    cp)
        in_cg cp -a "$WORK/src" "$WORK/dst/"; t1=$(date +%s.%N) ;;
    esac
    after=$(resident)
    printf "%-8s %6.1f s  hot file resident before %5s %%  after %5s %%\n" "$tool" \
        "$(echo "$t1 - $t0" | bc)" "$before" "$after"
done
rm -rf "$WORK/dst"
uptime
