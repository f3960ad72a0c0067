#!/bin/bash
# The sink's direct lane with the two ends on different devices (issue 17):
# the daemon's root is ext4 on a loop device over a file in /dev/shm (direct
# I/O on the backing file: a second device far faster than the source's
# disk). Bulk (4 x 1 GiB) pushed warm, daemon --direct auto (the lane)
# against never (all through the page cache), interleaved. Needs root and
# 10 GiB free in /dev/shm.
#
#   bench/fast_sink.sh [BINARY]   (env: ROUNDS, SRC)
set -euo pipefail
BIN=$(realpath "${1:-target/release/ramsys}")
ROUNDS=${ROUNDS:-3}
SRC=${SRC:-/var/tmp/ramsys-bench/src/bulk}
[ -d "$SRC" ] || { echo "no data at $SRC (bench/setup.sh makes it)" >&2; exit 2; }
IMG=/dev/shm/ramsys-fast-sink.img; MNT=/var/tmp/ramsys-fast-sink; KEY=$MNT.key
busy() { awk '/^cpu /{print ($2+$3+$4+$7+$8+$9)/100}' /proc/stat; }
cleanup() {
    [ -n "${D:-}" ] && kill "$D" 2>/dev/null || true
    umount "$MNT" 2>/dev/null || true
    [ -n "${L:-}" ] && losetup -d "$L" 2>/dev/null || true
    rm -f "$IMG" "$KEY"
}
trap cleanup EXIT
truncate -s 10G "$IMG"
L=$(losetup -f --show --direct-io=on --sector-size 4096 "$IMG")
mkfs.ext4 -q "$L"; mkdir -p "$MNT"; mount "$L" "$MNT"
find "$SRC" -type f -print0 | xargs -0 cat > /dev/null
uptime
for r in $(seq "$ROUNDS"); do
    for mode in auto never; do
        W="$MNT/w"; rm -rf "$W"; mkdir -p "$W"; fstrim "$MNT"; sync
        "$BIN" serve --listen 127.0.0.1:0 --root "$W" --key-file "$KEY" --direct $mode -v \
            > "$MNT.log" 2>&1 &
        D=$!
        for _ in $(seq 50); do grep -q listening "$MNT.log" && break; sleep 0.1; done
        addr=$(sed -n 's/^listening on //p' "$MNT.log")
        sleep 2; m0=$(busy); t0=$(date +%s.%N)
        "$BIN" cp -r --key-file "$KEY" --streams 4 "$SRC" "ramsys://$addr/b" > /dev/null
        t1=$(date +%s.%N); m1=$(busy)
        kill -INT "$D"; wait "$D" || true; D=
        split=$(grep -o 'large files.*cache' "$MNT.log" | tail -1 || true)
        printf "round %d --direct %-6s wall %5.2f s  machine cpu %5.2f s  %s\n" \
            "$r" "$mode" "$(echo "$t1 - $t0" | bc)" "$(echo "$m1 - $m0" | bc)" "$split"
    done
done
rm -f "$MNT.log"
