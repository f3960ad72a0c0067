#!/usr/bin/env bash
# Build the Debian package of ramsys from this repository (issue 20):
# the release binary, the systemd unit, /etc/ramsys/ramsys.toml and
# /etc/default/ramsys (conffiles), the docs, and, when the binary can
# generate them, shell completions and man pages. Plain dpkg-deb on a
# staged tree: nothing to install beyond Debian's dpkg and binutils.
#
#   scripts/build-deb.sh [--no-build] [--out DIR]    -> DIR/ramsys_VERSION_ARCH.deb (default target/debian)
#
# The path of the .deb is the last line printed.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null 2>&1 || export PATH="$HOME/.cargo/bin:$PATH"

build=1
out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) build=0 ;;
        --out) out="$2"; shift ;;
        *) echo "usage: $0 [--no-build] [--out DIR]" >&2; exit 2 ;;
    esac
    shift
done
target="${CARGO_TARGET_DIR:-$PWD/target}"
out="${out:-$target/debian}"
if [ "$build" = 1 ]; then
    cargo build --release --locked -p ramsys
fi
bin="$target/release/ramsys"
[ -x "$bin" ] || { echo "build-deb: no binary at $bin (build it or drop --no-build)" >&2; exit 1; }

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
arch=$(dpkg --print-architecture)
# The newest glibc symbol version the binary needs is its libc6 dependency.
glibc=$(objdump -T "$bin" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/ramsys_${version}_$arch"
install -d "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" \
    "$root/etc/ramsys" "$root/etc/default" "$root/usr/share/doc/ramsys" \
    "$root/usr/share/ramsys/grafana"
# Debug info stays in the build tree; the package gets a stripped binary.
strip --strip-unneeded -o "$root/usr/bin/ramsys" "$bin"
chmod 0755 "$root/usr/bin/ramsys"
install -m 0644 packaging/systemd/ramsys.service "$root/lib/systemd/system/ramsys.service"
install -m 0644 packaging/etc/ramsys.toml "$root/etc/ramsys/ramsys.toml"
install -m 0644 packaging/etc/default.ramsys "$root/etc/default/ramsys"
install -m 0644 packaging/grafana/ramsys.json "$root/usr/share/ramsys/grafana/ramsys.json"
install -m 0644 README.md docs/DAEMON.md docs/SECURITY.md "$root/usr/share/doc/ramsys/"

# Completions and man pages come from the clap definitions (`ramsys
# completions SHELL`, `ramsys man DIR`, issue 20). Shipped when this
# binary has those commands; otherwise the package goes without them.
extras=()
if "$bin" completions bash >/dev/null 2>&1; then
    install -d "$root/usr/share/bash-completion/completions" \
        "$root/usr/share/zsh/vendor-completions" "$root/usr/share/fish/vendor_completions.d"
    "$bin" completions bash >"$root/usr/share/bash-completion/completions/ramsys"
    "$bin" completions zsh >"$root/usr/share/zsh/vendor-completions/_ramsys"
    "$bin" completions fish >"$root/usr/share/fish/vendor_completions.d/ramsys.fish"
    extras+=(completions)
else
    echo "build-deb: this ramsys has no \`completions\` command; package without shell completions" >&2
fi
mkdir -p "$stage/man"
if "$bin" man "$stage/man" >/dev/null 2>&1 && ls "$stage/man"/*.1 >/dev/null 2>&1; then
    install -d "$root/usr/share/man/man1"
    for m in "$stage/man"/*.1; do
        gzip -9n <"$m" >"$root/usr/share/man/man1/$(basename "$m").gz"
    done
    extras+=(man)
else
    echo "build-deb: this ramsys has no \`man\` command; package without man pages" >&2
fi

install -m 0755 packaging/debian/postinst packaging/debian/prerm packaging/debian/postrm "$root/DEBIAN/"
printf '/etc/ramsys/ramsys.toml\n/etc/default/ramsys\n' >"$root/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<CTRL
Package: ramsys
Version: $version
Architecture: $arch
Maintainer: ramsys developers <ramsys@localhost>
Installed-Size: $size
Depends: libc6 (>= $glibc), libgcc-s1, passwd
Section: net
Priority: optional
Description: NUMA-aware, resource-aware data replication
 A daemon per host and an agent that move files, directory trees and
 volumes between hosts over parallel, credit-paced TCP streams, with one
 round trip of metadata for a whole tree (RAMSYS, with RFTP's pipelined
 data path). The package runs the daemon as the systemd service ramsys.
CTRL

mkdir -p "$out"
deb="$out/ramsys_${version}_$arch.deb"
# Files owned by root whatever user builds; xz like Debian's own archive.
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "build-deb: $(du -h "$deb" | cut -f1) with ${extras[*]:-no extras}"
echo "$deb"
