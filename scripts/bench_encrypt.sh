#!/usr/bin/env bash
# MB/s and CPU s/GB of a 1 GiB local copy (loopback daemon inside the
# agent), with and without --encrypt; median of 3 runs each.
# Usage: scripts/bench_encrypt.sh [ramsys binary] [workdir]
set -euo pipefail
BIN=${1:-target/release/ramsys}
W=${2:-/tmp/ramsys-bench-encrypt}
mkdir -p "$W"
[ -f "$W/src.bin" ] || head -c $((1 << 30)) /dev/urandom > "$W/src.bin"
cat "$W/src.bin" > /dev/null   # page cache: measure the pipeline, not the disk
run() { # label, sink engine, extra flags...
  local label=$1 sink=$2; shift 2
  local rows=()
  for _ in 1 2 3; do
    rm -rf "$W/out"; mkdir "$W/out"
    local t
    t=$( { /usr/bin/time -f "%e %U %S" "$BIN" cp --sink-engine "$sink" "$@" "$W/src.bin" "$W/out/" >/dev/null; } 2>&1 | tail -1)
    rows+=("$t")
  done
  printf '%s\n' "${rows[@]}" | sort -n | sed -n 2p | awk -v l="$label" '{
    gb = 1.073741824; printf "%-40s %8.0f MB/s  %6.2f CPU s/GB  (wall %.2f s, user %.2f, sys %.2f)\n", l, 1073.741824/$1, ($2+$3)/gb, $1, $2, $3 }'
}
run "plain, null sink" null
run "--encrypt=aes-256-gcm, null sink" null --encrypt=aes-256-gcm
run "--encrypt=chacha20-poly1305, null sink" null --encrypt=chacha20-poly1305
run "plain, file sink" file
run "--encrypt=aes-256-gcm, file sink" file --encrypt=aes-256-gcm
rm -rf "$W/out"
