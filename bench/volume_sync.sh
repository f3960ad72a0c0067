#!/usr/bin/env bash
# Volume sync (issue 18): a 4 GiB loop device whose replica is one day old
# (1 % of its 256 KiB blocks changed since), brought up to date three ways
# over ssh to 127.0.0.1 (an sshd of our own, like crates/ramsys/tests/ssh.rs),
# in the same run:
#   ramsys sync --write-devices DEV 127.0.0.1:REPLICA_DEV  (fixed-block delta)
#   dd if=DEV | ssh 127.0.0.1 dd of=REPLICA_DEV             (full copy, the
#                                                            blocksync/dd|ssh way)
#   rsync --inplace --no-whole-file IMG 127.0.0.1:REPLICA_IMG (on the image file)
# Prints wall time, bytes moved and the machine's load (uptime) per round.
# Usage: bench/volume_sync.sh [ROUNDS]   (results: docs/BENCHMARKS.md "Volumes")
# Needs root (losetup, sshd), rsync, ~12 GiB in $SCRATCH.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-2}
SIZE_MB=${SIZE_MB:-4096}
BIN=$(realpath "${RAMSYS_BIN:-target/release/ramsys}")
[ -x "$BIN" ] || cargo build --release -p ramsys
SCRATCH=${SCRATCH:-/var/tmp/ramsys-volume-sync}
rm -rf "$SCRATCH"; mkdir -p "$SCRATCH"
LA=""; LB=""; SPID=""
cleanup() {
    [ -n "$SPID" ] && kill "$SPID" 2>/dev/null || true
    [ -n "$LA" ] && losetup -d "$LA" 2>/dev/null || true
    [ -n "$LB" ] && losetup -d "$LB" 2>/dev/null || true
    rm -rf "$SCRATCH"
}
trap cleanup EXIT

# An sshd of our own on a free port.
ssh-keygen -q -t ed25519 -N "" -f "$SCRATCH/host_key"
ssh-keygen -q -t ed25519 -N "" -f "$SCRATCH/user_key"
cp "$SCRATCH/user_key.pub" "$SCRATCH/authorized_keys"
mkdir -p /run/sshd
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$SCRATCH/sshd_config" <<EOF
Port $PORT
ListenAddress 127.0.0.1
HostKey $SCRATCH/host_key
AuthorizedKeysFile $SCRATCH/authorized_keys
StrictModes no
UsePAM no
PermitRootLogin yes
PasswordAuthentication no
PidFile none
EOF
/usr/sbin/sshd -D -e -f "$SCRATCH/sshd_config" 2>"$SCRATCH/sshd.log" &
SPID=$!
for _ in $(seq 100); do grep -q "Server listening" "$SCRATCH/sshd.log" && break; sleep 0.1; done
SSHO=(-p "$PORT" -i "$SCRATCH/user_key" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR)
RSSH=(--ssh-port "$PORT" -i "$SCRATCH/user_key" --ssh-opt StrictHostKeyChecking=no
      --ssh-opt UserKnownHostsFile=/dev/null --ssh-opt BatchMode=yes --remote-ramsys "$BIN")

echo "generating a ${SIZE_MB} MiB volume (random data)"
head -c "${SIZE_MB}M" /dev/urandom > "$SCRATCH/a.img"
LA=$(losetup -f --show "$SCRATCH/a.img")
truncate -s "${SIZE_MB}M" "$SCRATCH/b.img"
LB=$(losetup -f --show "$SCRATCH/b.img")

change_one_percent() {
    python3 - "$LA" "$1" <<'PY'
import os, random, sys
dev, seed = sys.argv[1], int(sys.argv[2])
bs = 256 << 10
with open(dev, "r+b", buffering=0) as f:
    n = os.lseek(f.fileno(), 0, os.SEEK_END) // bs
    rnd = random.Random(seed)
    for b in rnd.sample(range(n), max(1, n // 100)):
        os.pwrite(f.fileno(), os.urandom(4096), b * bs + rnd.randrange(0, bs - 4096, 512))
    os.fsync(f.fileno())
PY
}

now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.2f}')"; }

printf "%-6s %-34s %9s %14s  %s\n" round method wall_s bytes_moved load
for r in $(seq "$ROUNDS"); do
    # The replicas start equal to the volume (yesterday's state)...
    dd if="$LA" of="$LB" bs=4M oflag=direct status=none
    cp --sparse=always "$SCRATCH/a.img" "$SCRATCH/c.img"
    sync
    # ...then 1 % of the volume's blocks change.
    change_one_percent "$r"

    t0=$(now)
    out=$("$BIN" sync --write-devices --json "${RSSH[@]}" "$LA" "127.0.0.1:$LB" | tail -1)
    t1=$(now)
    bytes=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["bytes"])')
    cmp "$LA" "$LB" || { echo "ramsys: replica differs"; exit 1; }
    printf "%-6s %-34s %9s %14s  %s\n" "$r" "ramsys sync (delta, verified)" "$(secs "$t0" "$t1")" "$bytes" "$(uptime | sed 's/.*load average: //')"

    t0=$(now)
    dd if="$LA" bs=4M iflag=direct status=none | ssh "${SSHO[@]}" 127.0.0.1 "dd of=$LB bs=4M oflag=direct status=none"
    t1=$(now)
    printf "%-6s %-34s %9s %14s  %s\n" "$r" "dd | ssh dd (full copy)" "$(secs "$t0" "$t1")" "$((SIZE_MB << 20))" "$(uptime | sed 's/.*load average: //')"

    t0=$(now)
    stats=$(rsync --inplace --no-whole-file --stats -e "ssh ${SSHO[*]}" "$SCRATCH/a.img" "127.0.0.1:$SCRATCH/c.img")
    t1=$(now)
    sent=$(echo "$stats" | sed -n 's/^Total bytes sent: //p' | tr -d ',')
    cmp "$SCRATCH/a.img" "$SCRATCH/c.img" || { echo "rsync: replica differs"; exit 1; }
    printf "%-6s %-34s %9s %14s  %s\n" "$r" "rsync --inplace --no-whole-file" "$(secs "$t0" "$t1")" "$sent" "$(uptime | sed 's/.*load average: //')"
done
nproc | sed 's/^/cpus: /'
