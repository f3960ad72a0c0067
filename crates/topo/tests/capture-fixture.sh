#!/usr/bin/env bash
# Captures the subset of this machine's /sys and /proc that ramsys-topo reads
# into a fixture tree, so `discover(DIR)` sees what `discover("/")` sees.
#
#   tests/capture-fixture.sh tests/fixtures/this-vm
#
# Symlinks are not copied: where the kernel puts numa_node, PCI_SLOT_NAME and
# msi_irqs on a parent of the `device` link (virtio, nvme), the script walks
# up like the discovery code does and writes them into DIR/.../device/.
# EXCLUDE_MOUNTS (an ERE) drops matching mountinfo lines.
set -euo pipefail

out=${1:?usage: $0 OUTDIR}
rm -rf "$out"
mkdir -p "$out"

put() { # put REL [CONTENT-FROM-STDIN]
    mkdir -p "$(dirname "$out/$1")"
    cat >"$out/$1"
}
copy() { # copy REL: /REL -> OUT/REL when readable
    local v
    if v=$(cat "/$1" 2>/dev/null); then printf '%s\n' "$v" | put "$1"; fi
}

# Nodes and CPUs.
copy sys/devices/system/cpu/online
for n in /sys/devices/system/node/node[0-9]*; do
    [ -d "$n" ] || continue
    rel=${n#/}
    copy "$rel/cpulist"
    copy "$rel/distance"
    grep MemTotal "$n/meminfo" | put "$rel/meminfo"
done
grep MemTotal /proc/meminfo | put proc/meminfo
for c in /sys/devices/system/cpu/cpu[0-9]*; do
    rel=${c#/}
    copy "$rel/topology/physical_package_id"
    for i in "$c"/cache/index*; do
        [ -d "$i" ] || continue
        for f in level type size; do copy "${i#/}/$f"; done
    done
done

# The device behind a class device: DRIVER from device/uevent, the rest from
# the nearest ancestor holding numa_node.
device() { # device SYSDIR RELDIR
    local dev=$1/device rel=$2/device d
    [ -e "$dev" ] || return 0
    grep '^DRIVER=' "$dev/uevent" 2>/dev/null | put "$rel/uevent" || true
    touch "$out/$rel/uevent"
    d=$(readlink -f "$dev")
    while [ "$d" != /sys ] && [ "$d" != / ] && [ ! -e "$d/numa_node" ]; do d=$(dirname "$d"); done
    [ -e "$d/numa_node" ] || return 0
    cat "$d/numa_node" | put "$rel/numa_node"
    grep '^PCI_SLOT_NAME=' "$d/uevent" >>"$out/$rel/uevent" 2>/dev/null || true
    if [ -d "$d/msi_irqs" ]; then
        mkdir -p "$out/$rel/msi_irqs"
        for i in "$d"/msi_irqs/*; do touch "$out/$rel/msi_irqs/$(basename "$i")"; done
    fi
}

# NICs.
for n in /sys/class/net/*; do
    [ -d "$n" ] || continue
    rel=sys/class/net/$(basename "$n")
    mkdir -p "$out/$rel"
    for f in address mtu operstate speed; do copy "$rel/$f"; done
    device "$n" "$rel"
done

# Block devices and their partitions.
for b in /sys/block/*; do
    name=$(basename "$b")
    rel=sys/block/$name
    for f in dev size queue/rotational; do copy "$rel/$f"; done
    device "$b" "$rel"
    for p in "$b"/"$name"*; do
        [ -e "$p/partition" ] || continue
        for f in partition dev size; do copy "$rel/$(basename "$p")/$f"; done
    done
    if [ -n "$(ls "$b/slaves" 2>/dev/null)" ]; then
        mkdir -p "$out/$rel/slaves"
        for s in "$b"/slaves/*; do touch "$out/$rel/slaves/$(basename "$s")"; done
    fi
done

# procfs.
grep -v -E "${EXCLUDE_MOUNTS:-^$}" /proc/self/mountinfo | put proc/self/mountinfo
for f in net/route net/fib_trie net/if_inet6 interrupts; do copy "proc/$f"; done
echo "captured $(find "$out" -type f | wc -l) files into $out"
