#!/bin/bash
# The kernel-like tree on other file systems (issue 17): the headline's
# disk is ext4 without a journal, where ext4's recently-freed-inode window
# moves the tree's margin against cp -a by round. This pushes the same tree
# to a daemon rooted on a journalled ext4 and on XFS, each a 12 GiB file
# system on a loop device over a file of the benchmark disk (direct I/O on
# the backing file, so only the upper file system caches), against cp -a
# onto the same file system, tools interleaved, warm source, fresh file
# system trimmed before each run. Needs root, losetup, mkfs.xfs (xfsprogs).
#
#   bench/other_fs.sh [BINARY]   (env: ROUNDS, SRC, WORK, FS)
set -euo pipefail
BIN=$(realpath "${1:-target/release/ramsys}")
ROUNDS=${ROUNDS:-3}
SRC=${SRC:-/var/tmp/ramsys-bench/src/kernel}
WORK=${WORK:-/var/tmp/other-fs}
FS=${FS:-"ext4 xfs"}
[ -d "$SRC" ] || { echo "no tree at $SRC (bench/setup.sh makes it)" >&2; exit 2; }
mkdir -p "$WORK"
declare -A LOOP
cleanup() {
    for fs in $FS; do
        umount "$WORK/mnt-$fs" 2>/dev/null || true
        [ -n "${LOOP[$fs]:-}" ] && losetup -d "${LOOP[$fs]}" 2>/dev/null || true
        rm -f "$WORK/$fs.img"
    done
    [ -n "${D:-}" ] && kill "$D" 2>/dev/null || true
}
trap cleanup EXIT
for fs in $FS; do
    truncate -s 12G "$WORK/$fs.img"
    LOOP[$fs]=$(losetup -f --show --direct-io=on --sector-size 4096 "$WORK/$fs.img")
    "mkfs.$fs" -q "${LOOP[$fs]}"
    mkdir -p "$WORK/mnt-$fs"
    mount -o discard "${LOOP[$fs]}" "$WORK/mnt-$fs"
done
key="$WORK/key"
busy() { awk '/^cpu /{print ($2+$3+$4+$7+$8+$9)/100}' /proc/stat; }
# cat, not tar: GNU tar writing to /dev/null reads no file data.
warm() { find "$SRC" -type f -print0 | xargs -0 cat > /dev/null; }
uptime
for r in $(seq "$ROUNDS"); do
    for fs in $FS; do
        for tool in ramsys cp; do
            W="$WORK/mnt-$fs/w"
            rm -rf "$W"; mkdir -p "$W"; fstrim "$WORK/mnt-$fs"
            sync; echo 3 > /proc/sys/vm/drop_caches; warm
            if [ $tool = ramsys ]; then
                "$BIN" serve --listen 127.0.0.1:0 --root "$W" --key-file "$key" > "$WORK/d.log" 2>&1 &
                D=$!
                for _ in $(seq 50); do grep -q listening "$WORK/d.log" && break; sleep 0.1; done
                addr=$(sed -n 's/^listening on //p' "$WORK/d.log")
            fi
            sleep 2
            m0=$(busy); t0=$(date +%s.%N)
            if [ $tool = ramsys ]; then
                "$BIN" cp -r --key-file "$key" --streams 4 "$SRC" "ramsys://$addr/b" > /dev/null
            else
                cp -a "$SRC" "$W/b"
            fi
            t1=$(date +%s.%N); m1=$(busy)
            if [ $tool = ramsys ]; then kill -INT "$D"; wait "$D" || true; D=; fi
            n=$(find "$W/b" | wc -l)
            printf "round %d %-5s %-6s wall %5.2f s  machine cpu %5.2f s  entries %d\n" \
                "$r" "$fs" "$tool" "$(echo "$t1 - $t0" | bc)" "$(echo "$m1 - $m0" | bc)" "$n"
        done
    done
done
uptime
