#!/usr/bin/env bash
# ramsys over ssh (HOST:PATH) against scp, on loopback through a private sshd
# (generated keys, random port), files in /dev/shm so disks do not matter.
# Usage: bench/ssh_vs_scp.sh [RUNS] [SIZE_MIB]   (run as root; builds nothing:
# uses target/release/ramsys or $RAMSYS). Prints each run and the medians.
set -euo pipefail
runs=${1:-5}
mib=${2:-1024}
cd "$(dirname "$0")/.."
B=${RAMSYS:-$PWD/target/release/ramsys}
[ -x "$B" ] || { echo "build first: cargo build --release -p ramsys" >&2; exit 1; }
w=$(mktemp -d /dev/shm/ramsys-sshbench.XXXXXX)
trap 'kill "$sshd_pid" 2>/dev/null || true; rm -rf "$w"' EXIT
ssh-keygen -q -t ed25519 -N '' -f "$w/host"
ssh-keygen -q -t ed25519 -N '' -f "$w/user"
cp "$w/user.pub" "$w/auth"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$w/cfg" <<EOF
Port $port
ListenAddress 127.0.0.1
HostKey $w/host
AuthorizedKeysFile $w/auth
StrictModes no
UsePAM no
PermitRootLogin yes
PasswordAuthentication no
PidFile none
EOF
mkdir -p /run/sshd
/usr/sbin/sshd -D -e -f "$w/cfg" 2>"$w/sshd.log" &
sshd_pid=$!
sleep 1
o=(-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=error -i "$w/user")
r=(--ssh-port "$port" -i "$w/user" --ssh-opt StrictHostKeyChecking=no
   --ssh-opt UserKnownHostsFile=/dev/null --ssh-opt LogLevel=error --ssh-opt BatchMode=yes
   --remote-ramsys "$B")
head -c $((mib << 20)) /dev/urandom >"$w/big"
echo x >"$w/small"
mkdir "$w/d"
t() { local s e; s=$(date +%s.%N); "$@" >/dev/null; e=$(date +%s.%N); echo "$e - $s" | bc; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
: >"$w/res"
for i in $(seq "$runs"); do
    rm -f "$w/d"/*
    a=$(t "$B" cp "${r[@]}" "$w/small" "127.0.0.1:$w/d/")
    b=$(t scp -O -q -P "$port" "${o[@]}" "$w/small" "127.0.0.1:$w/d/s2")
    c=$(t ssh -p "$port" "${o[@]}" 127.0.0.1 true)
    rm -f "$w/d"/*
    d=$(t "$B" cp --no-direct "${r[@]}" "$w/big" "127.0.0.1:$w/d/")
    cmp -s "$w/big" "$w/d/big" || { echo "ramsys copy differs" >&2; exit 1; }
    rm -f "$w/d"/*
    e=$(t "$B" cp --no-direct --encrypt "${r[@]}" "$w/big" "127.0.0.1:$w/d/")
    rm -f "$w/d"/*
    f=$(t scp -O -q -P "$port" "${o[@]}" "$w/big" "127.0.0.1:$w/d/big")
    echo "run $i: small: ramsys $a scp $b ssh-true $c | ${mib} MiB: ramsys $d ramsys--encrypt $e scp $f"
    echo "$a $b $c $d $e $f" >>"$w/res"
done
for k in 1 2 3 4 5 6; do
    m[$k]=$(cut -d' ' -f"$k" "$w/res" | median)
done
echo "medians (s): small file: ramsys ${m[1]}, scp ${m[2]}, ssh true ${m[3]}"
echo "medians (s): ${mib} MiB: ramsys ${m[4]}, ramsys --encrypt ${m[5]}, scp ${m[6]}"
