#!/usr/bin/env bash
# One-command setup for the ramsys benchmark suite (issue 3).
# Installs the peer tools from Debian, then builds ramsys and wanem in release mode.
# Idempotent: packages already present are skipped; a package that cannot be
# installed is reported and the suite later marks that peer "unavailable".
# Usage: bench/setup.sh [--no-build]   (CARGO_TARGET_DIR is honoured)
set -u
cd "$(dirname "$0")/.."
BUILD=1
[ "${1:-}" = "--no-build" ] && BUILD=0
[ "$(id -u)" = 0 ] || { echo "setup: run as root (apt-get, and the suite needs root too)"; exit 1; }

PKGS=(rsync openssh-server openssh-client globus-gridftp-server-progs
      globus-gass-copy-progs xrootd-server xrootd-client iperf3 fio
      python3-matplotlib iputils-ping iproute2 procps
      python3-fusepy fuse3    # fusepy: bench/hddemu (rotational emulation)
      xfsprogs)               # bench/other_fs.sh

missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # Install all in one go; if that fails, fall back to one at a time so one
    # unavailable peer does not block the others.
    if ! apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
        for p in "${missing[@]}"; do
            apt-get install -y -qq --no-install-recommends "$p" || echo "setup: WARNING: $p not installable"
        done
    fi
else
    echo "setup: all packages already installed"
fi

# The suite runs its own sshd/rsyncd/gridftp/xrootd instances on loopback or in
# its own namespaces; it never uses or touches system services.
if [ $BUILD = 1 ]; then
    echo "setup: building ramsys and wanem (release)"
    cargo build --release -p ramsys -p wanem || { echo "setup: cargo build failed"; exit 1; }
fi
echo "setup: done"
