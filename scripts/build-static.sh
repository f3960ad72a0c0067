#!/usr/bin/env bash
# A static ramsys (musl libc; issue 20): one file that runs on any x86-64
# Linux whatever its glibc, e.g. to copy onto a host without a toolchain.
# Installs what it needs: Debian's musl-tools (musl-gcc for the bundled
# SQLite) and rustup's x86_64-unknown-linux-musl standard library.
#
#   scripts/build-static.sh         -> target/static/ramsys (stripped)
#
# About 11 minutes from scratch on 2 busy cores; not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null 2>&1 || export PATH="$HOME/.cargo/bin:$PATH"
triple="$(uname -m)-unknown-linux-musl"
if ! command -v musl-gcc >/dev/null; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq musl-tools >/dev/null
fi
if ! rustup target list --installed | grep -qx "$triple"; then
    rustup target add "$triple" || {
        echo "build-static: cannot install the $triple standard library (rustup target add failed)" >&2
        exit 1
    }
fi
target="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --release --locked -p ramsys --target "$triple"
mkdir -p "$target/static"
strip --strip-unneeded -o "$target/static/ramsys" "$target/$triple/release/ramsys"
# Static means no interpreter: ldd says so, and it must still run.
ldd "$target/static/ramsys" 2>&1 | grep -qE 'statically linked|not a dynamic' || { echo "build-static: not a static binary" >&2; exit 1; }
"$target/static/ramsys" --version >/dev/null
echo "$target/static/ramsys"
