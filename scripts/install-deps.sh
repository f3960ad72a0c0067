#!/usr/bin/env bash
# System packages the build, the tests and the demo need (Debian/Ubuntu;
# acl and attr: setfacl/setfattr for the archive tests, crates/ramsys/tests/archive.rs).
set -euo pipefail
need=()
for p in build-essential pkg-config rsync iproute2 python3 openssh-client openssh-server acl attr; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi
