#!/usr/bin/env bash
# One-command setup for the ramsys benchmark suite (issue 3).
# Installs the peer tools from Debian, then builds ramsys and wanem in release mode.
# Idempotent: packages already present are skipped; a package that cannot be
# installed is reported and the suite later marks that peer "unavailable".
set -u
cd "$(dirname "$0")/.."

PKGS=(rsync openssh-server openssh-client globus-gridftp-server-progs
      globus-gass-copy-progs xrootd-server xrootd-client iperf3 fio
      python3-matplotlib iputils-ping iproute2 procps)

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

# The Debian sshd/xrootd packages may start system services on install; the
# suite runs its own instances on loopback, so stop the system ones if running.
for svc in ssh xrootd@clustered; do
    systemctl stop "$svc" 2>/dev/null || true
done

echo "setup: building ramsys and wanem (release)"
cargo build --release -p ramsys -p wanem
echo "setup: done"
