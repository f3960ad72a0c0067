#!/usr/bin/env bash
# Site-shared writer budgets (issue 19, docs/SITE.md "Storage shares"):
# three daemons of a site on loopback serving one directory (the shared
# file system: here one local disk, which is what an export is to its
# server), each configured for WRITERS writers per task on that disk. The
# agent pushes the same tree striped over the three (--stripe; the
# daemons fsync each file before its rename, serve --fsync), with the site sharing the disk's writer budget (--site-share-storage on)
# and without (off), interleaved, RUNS rounds, fresh daemons every run.
# Printed per run: wall time, and the writer threads of the three daemons
# sampled every 20 ms from /proc (threads named writer-N): mean running
# (state R or D, i.e. on a CPU or in the disk) and the most at once.
# HDD=1 puts the shared directory on bench/hddemu (an emulated rotational
# disk where seeks cost time; root, python3-fusepy) and prints its seeks
# and modelled busy time per run, the disk's own account of the order the
# writers made it serve.
# Usage: [HDD=1] bench/site_share.sh [RUNS] [FILES] [SIZE] [WRITERS]
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
FILES=${2:-48}
SIZE=${3:-4M}
WRITERS=${4:-4}
BIN=${RAMSYS_BIN:-target/release/ramsys}
[ -x "$BIN" ] || cargo build --release -p ramsys
BIN=$(realpath "$BIN")
SCRATCH=${SCRATCH:-/var/tmp/ramsys-site-share}
PIDS=()
HDD=${HDD:-0}
EMUPID=""
LOOP=""
stop_daemons() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    PIDS=()
}
cleanup() {
    stop_daemons
    if [ "$HDD" = 1 ]; then
        umount "$SCRATCH/hdd" 2>/dev/null || true
        [ -n "$LOOP" ] && losetup -d "$LOOP" 2>/dev/null || true
        umount "$SCRATCH/emu" 2>/dev/null || true
        [ -n "$EMUPID" ] && kill "$EMUPID" 2>/dev/null || true
        rm -rf /dev/shm/ramsys-site-share-hdd
    fi
    rm -rf "$SCRATCH"
}
trap cleanup EXIT
rm -rf "$SCRATCH"; mkdir -p "$SCRATCH/shared" "$SCRATCH/src"
SHARED="$SCRATCH/shared"
if [ "$HDD" = 1 ]; then
    mkdir -p "$SCRATCH/emu" "$SCRATCH/hdd" /dev/shm/ramsys-site-share-hdd
    /usr/bin/python3 bench/hddemu/hddemu.py /dev/shm/ramsys-site-share-hdd/img "$SCRATCH/emu" \
        --size $((1 << 30)) >"$SCRATCH/hddemu.log" 2>&1 &
    EMUPID=$!
    for _ in $(seq 100); do [ -e "$SCRATCH/emu/disk.img" ] && break; sleep 0.1; done
    LOOP=$(losetup -f --show "$SCRATCH/emu/disk.img")
    echo 1 > "/sys/block/${LOOP#/dev/}/queue/rotational"
    echo mq-deadline > "/sys/block/${LOOP#/dev/}/queue/scheduler"
    mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$LOOP"
    mount -o noatime "$LOOP" "$SCRATCH/hdd"
    SHARED="$SCRATCH/hdd/shared"
    mkdir -p "$SHARED"
fi
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$SCRATCH/key"; echo >> "$SCRATCH/key"
chmod 600 "$SCRATCH/key"
export RAMSYS_KEY_FILE="$SCRATCH/key"
for i in $(seq "$FILES"); do head -c "$SIZE" /dev/urandom > "$SCRATCH/src/f$i"; done
# The disk under the shared directory, as the daemons' plan names it.
DEV=$(basename "$(findmnt -no SOURCE -T "$SHARED")")
PARENT=$(lsblk -no PKNAME "/dev/$DEV" 2>/dev/null | head -1 || true)
DEV=${PARENT:-$DEV}
printf 'writers = %s\n[devices.%s]\nthreads = %s\n' "$WRITERS" "$DEV" "$WRITERS" > "$SCRATCH/serve.toml"

start() { # start MODE: three peered daemons; sets ADDRS and PIDS
    ADDRS=()
    local peers=()
    for i in 1 2 3; do
        "$BIN" serve --listen 127.0.0.1:0 --root "$SHARED" \
            --key-file "$SCRATCH/key" --config "$SCRATCH/serve.toml" \
            --site-interval 50 --site-share-storage "$1" --fsync "${peers[@]}" >"$SCRATCH/d$i.log" 2>&1 &
        PIDS+=($!)
        for _ in $(seq 100); do grep -q "listening on" "$SCRATCH/d$i.log" && break; sleep 0.05; done
        local a
        a=$(sed -n 's/^listening on //p' "$SCRATCH/d$i.log" | head -1)
        ADDRS+=("$a")
        peers+=(--peer "$a")
    done
    # Let the site form (every member fresh in every view).
    for _ in $(seq 100); do
        n=$("$BIN" status --site --json "${ADDRS[0]}" 2>/dev/null | grep -o '"age_ms":[0-9]*' | wc -l || true)
        [ "$n" = 3 ] && break; sleep 0.05
    done
}

sample() { # sample OUT: writer threads R/D of the daemons, every 20 ms
    while :; do
        n=0
        for p in "${PIDS[@]}"; do
            for s in /proc/"$p"/task/*/stat; do
                { read -r line < "$s"; } 2>/dev/null || continue
                case "$line" in *"(writer-"*") R "*|*"(writer-"*") D "*) n=$((n + 1));; esac
            done
        done
        echo "$n" >> "$1"
        sleep 0.02
    done
}

echo "uptime: $(uptime)"
echo "$FILES x $SIZE, $WRITERS writers per task on $DEV, --stripe over 3 daemons (serve --fsync)"
printf '%-5s %-4s %8s %12s %10s %s\n' round mode wall_s writers_mean writers_max "$([ "$HDD" = 1 ] && echo disk || true)"
for r in $(seq "$RUNS"); do
    for mode in on off; do
        start "$mode"
        rm -rf "$SHARED/dst"; sync
        if [ "$HDD" = 1 ]; then echo reset > "$SCRATCH/emu/ctl"; echo on > "$SCRATCH/emu/ctl"; fi
        : > "$SCRATCH/samples"
        sample "$SCRATCH/samples" & SP=$!
        t0=$(date +%s.%N)
        "$BIN" cp -r --stripe "$SCRATCH/src" "ramsys://$(IFS=,; echo "${ADDRS[*]}")/dst" >/dev/null
        t1=$(date +%s.%N)
        kill "$SP"; wait "$SP" 2>/dev/null || true
        disk=""
        if [ "$HDD" = 1 ]; then
            echo off > "$SCRATCH/emu/ctl"
            disk=$(/usr/bin/python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print("seeks %d busy %.2fs seek %.2fs writes %d" % (s["seeks"], s["busy_s"], s["seek_s"], s["writes"]))' "$SCRATCH/emu/stats")
        fi
        diff -r "$SCRATCH/src" "$SHARED/dst/src" >/dev/null || { echo "tree differs"; exit 1; }
        mean=$(awk '{s+=$1; n++} END {printf "%.2f", n ? s/n : 0}' "$SCRATCH/samples")
        max=$(sort -n "$SCRATCH/samples" | tail -1)
        printf '%-5s %-4s %8.2f %12s %10s %s\n' "$r" "$mode" "$(echo "$t1 - $t0" | bc)" "$mean" "$max" "$disk"
        stop_daemons
    done
done
echo "uptime: $(uptime)"
