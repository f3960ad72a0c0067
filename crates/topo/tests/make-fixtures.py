#!/usr/bin/env python3
"""Builds the hand-made sysfs/procfs fixture trees of the seed hosts.

Only the files ramsys-topo reads are written. What the seeds state is used as
given; what they leave open is chosen and marked ASSUMED below.

  seed004-frontend  seed 004 Table 1, front-end LAN host: 2 x Xeon E5-2660,
                    16 cores, 2 NUMA nodes, 128 GB, 40 Gbps RoCE.
  seed000-intel4s   seed 000 Table 4.1, Dell R820: 4 x Xeon E5-4620, 32 cores,
                    4 nodes in a ring, 768 GB, 16 MB LLC; two LSI Nytro
                    WarpDrive SSDs and the 40 Gbps RoCE NIC on node 1.
  seed001-amd8n     seed 001 Table II (= seed 000 Table 4.1 AMD column),
                    HP DL585 G7: 4 x Opteron 6136, 2 dies each = 8 nodes,
                    32 cores, 32 GB, 5 MB LLC; ConnectX-3 dual-port 40 GbE and
                    two LSI SSDs on node 7.
  no-numa           a small VM whose kernel exposes no NUMA nodes.

Run from the crate directory: python3 tests/make-fixtures.py
"""
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")


class Tree:
    def __init__(self, name):
        self.root = os.path.join(OUT, name)
        shutil.rmtree(self.root, ignore_errors=True)

    def w(self, rel, text=""):
        p = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text if text.endswith("\n") or text == "" else text + "\n")

    def cpulist(self, cpus):
        return ",".join(str(c) for c in cpus)

    def nodes(self, node_cpus, mem_kb, dist, pkg_of, llc):
        allc = sorted(c for cs in node_cpus for c in cs)
        self.w("sys/devices/system/cpu/online", f"{allc[0]}-{allc[-1]}")
        for n, cpus in enumerate(node_cpus):
            d = f"sys/devices/system/node/node{n}"
            self.w(f"{d}/cpulist", compact(cpus))
            self.w(f"{d}/distance", " ".join(str(x) for x in dist[n]))
            self.w(f"{d}/meminfo",
                   f"Node {n} MemTotal:       {mem_kb} kB\nNode {n} MemFree:        {mem_kb // 2} kB")
            first = cpus[0]
            c = f"sys/devices/system/cpu/cpu{first}/cache"
            for i, (lvl, typ, size) in enumerate(llc):
                self.w(f"{c}/index{i}/level", str(lvl))
                self.w(f"{c}/index{i}/type", typ)
                self.w(f"{c}/index{i}/size", size)
        for c in allc:
            self.w(f"sys/devices/system/cpu/cpu{c}/topology/physical_package_id", str(pkg_of(c)))

    def nic(self, name, numa=None, speed=None, mac="00:00:00:00:00:00", mtu=1500,
            driver=None, pci=None, virtual=False, oper="up"):
        d = f"sys/class/net/{name}"
        self.w(f"{d}/address", mac)
        self.w(f"{d}/mtu", str(mtu))
        self.w(f"{d}/operstate", oper)
        if speed is not None:
            self.w(f"{d}/speed", str(speed))
        if not virtual:
            ue = []
            if driver:
                ue.append(f"DRIVER={driver}")
            if pci:
                ue.append(f"PCI_SLOT_NAME={pci}")
            self.w(f"{d}/device/uevent", "\n".join(ue))
            if numa is not None:
                self.w(f"{d}/device/numa_node", str(numa))

    def disk(self, name, devno, sectors, rot, numa=None, driver=None, pci=None,
             parts=(), slaves=(), has_device=True):
        d = f"sys/block/{name}"
        self.w(f"{d}/dev", devno)
        self.w(f"{d}/size", str(sectors))
        self.w(f"{d}/queue/rotational", "1" if rot else "0")
        if has_device:
            ue = []
            if driver:
                ue.append(f"DRIVER={driver}")
            if pci:
                ue.append(f"PCI_SLOT_NAME={pci}")
            self.w(f"{d}/device/uevent", "\n".join(ue))
            if numa is not None:
                self.w(f"{d}/device/numa_node", str(numa))
        for pname, pdev, psec in parts:
            self.w(f"{d}/{pname}/partition", pname[-1])
            self.w(f"{d}/{pname}/dev", pdev)
            self.w(f"{d}/{pname}/size", str(psec))
        for s in slaves:
            self.w(f"{d}/slaves/{s}")

    def mountinfo(self, rows):
        """rows: (major:minor, mount point, fs type, source)."""
        lines = []
        for i, (dev, mp, fst, src) in enumerate(rows):
            lines.append(f"{20 + i} 1 {dev} / {mp} rw,relatime shared:{i} - {fst} {src} rw")
        self.w("proc/self/mountinfo", "\n".join(lines))

    def net(self, v4, v6=(), irqs=(), ncpu=2):
        """v4: (iface, ip, prefix); v6: (iface, ifindex, hex addr, prefix)."""
        trie = ["Local:", "  +-- 0.0.0.0/0 3 0 5"]
        for _, ip, _ in v4:
            trie += [f"     |-- {ip}", "        /32 host LOCAL"]
        self.w("proc/net/fib_trie", "\n".join(trie))
        route = ["Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"]
        for ifc, ip, pfx in v4:
            if ip.startswith("127."):
                continue
            mask = (0xFFFFFFFF << (32 - pfx)) & 0xFFFFFFFF
            a = [int(x) for x in ip.split(".")]
            net = ((a[0] << 24) | (a[1] << 16) | (a[2] << 8) | a[3]) & mask
            le = lambda v: "%08X" % int.from_bytes(v.to_bytes(4, "big"), "little")
            route.append(f"{ifc}\t{le(net)}\t00000000\t0001\t0\t0\t0\t{le(mask)}\t0\t0\t0")
        self.w("proc/net/route", "\n".join(route))
        self.w("proc/net/if_inet6",
               "\n".join(f"{a} {idx:02x} {p:02x} 20 80 {ifc:>8}" for ifc, idx, a, p in v6))
        hdr = "    " + "".join(f"       CPU{c}" for c in range(ncpu))
        lines = [hdr] + [f" {n}: " + " ".join("0" for _ in range(ncpu)) + f"  IR-PCI-MSI-edge  {name}"
                         for n, name in irqs]
        self.w("proc/interrupts", "\n".join(lines))


def compact(cpus):
    cpus = sorted(cpus)
    out, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


GIB_KB = 1024 * 1024


def seed004_frontend():
    t = Tree("seed004-frontend")
    # E5-2660: 8 cores per socket, HT off as in seed 004's tests; 20 MB L3.
    t.nodes([list(range(0, 8)), list(range(8, 16))], 64 * GIB_KB,
            [[10, 21], [21, 10]], lambda c: c // 8,
            [(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "256K"),
             (3, "Unified", "20480K")])
    t.nic("lo", virtual=True, mtu=65536)
    # ASSUMED: a 1 GbE management port on node 0.
    t.nic("eth0", numa=0, speed=1000, mac="00:25:90:00:00:10", driver="igb", pci="0000:01:00.0")
    # The 40 Gbps RoCE QDR adapter (MTU 9000, Table 1) on node 1 (the
    # issue's example: SSD on node 0, NIC on node 1).
    t.nic("eth2", numa=1, speed=40000, mac="00:02:c9:00:00:12", mtu=9000, driver="mlx4_core",
          pci="0000:81:00.0")
    # ASSUMED: system disk; the Fusion-io PCIe SSD seed 004 tried first, on node 0.
    t.disk("sda", "8:0", 976773168, True, numa=0, driver="ahci", pci="0000:00:1f.2",
           parts=[("sda1", "8:1", 1048576), ("sda2", "8:2", 975722496)])
    t.disk("fioa", "252:0", 2344225968, False, numa=0, driver="iomemory-vsl", pci="0000:04:00.0")
    t.mountinfo([
        ("8:2", "/", "ext4", "/dev/sda2"),
        ("8:1", "/boot", "ext4", "/dev/sda1"),
        ("0:3", "/proc", "proc", "proc"),
        ("0:17", "/sys", "sysfs", "sysfs"),
        ("0:18", "/dev/shm", "tmpfs", "tmpfs"),
        ("252:0", "/ssd", "xfs", "/dev/fioa"),
        # Seed 004 sec. 4: the back-end data set lived in main memory.
        ("0:40", "/mnt/ramdisk", "tmpfs", "tmpfs"),
    ])
    t.net([("lo", "127.0.0.1", 8), ("eth0", "10.0.0.10", 24), ("eth2", "192.168.40.10", 24)],
          v6=[("lo", 1, "00000000000000000000000000000001", 128),
              ("eth2", 4, "fe800000000000000202c9fffe000012", 64)],
          irqs=[(90, "mlx4-async@pci:0000:81:00.0"), (91, "mlx4-comp-0@pci:0000:81:00.0"),
                (92, "mlx4-comp-1@pci:0000:81:00.0"), (60, "eth0-TxRx-0")],
          ncpu=16)


def seed000_intel4s():
    t = Tree("seed000-intel4s")
    # Xeon E5-4600 boxes enumerate CPUs round-robin over sockets:
    # node k = k, k+4, ..., k+28 (8 cores each, HT off per seed 000 4.1.1).
    cpus = [[k + 4 * i for i in range(8)] for k in range(4)]
    # Ring of four nodes (seed 000 4.1.1): neighbours 21, opposite 31.
    dist = [[10 if i == j else (31 if (i - j) % 4 == 2 else 21) for j in range(4)]
            for i in range(4)]
    t.nodes(cpus, 192 * GIB_KB, dist, lambda c: c % 4,
            [(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "256K"),
             (3, "Unified", "16384K")])
    t.nic("lo", virtual=True, mtu=65536)
    # ASSUMED: on-board 1 GbE on node 0 (only nodes 0 and 1 have I/O hubs).
    t.nic("eth0", numa=0, speed=1000, mac="90:b1:1c:00:00:01", driver="tg3", pci="0000:01:00.0")
    t.nic("eth2", numa=1, speed=40000, mac="00:02:c9:00:01:02", mtu=9000, driver="mlx4_core",
          pci="0000:41:00.0")
    # ASSUMED: PERC system disk on node 0.
    t.disk("sda", "8:0", 585871964, True, numa=0, driver="megaraid_sas", pci="0000:03:00.0",
           parts=[("sda1", "8:1", 585869312)])
    # Two LSI Nytro WarpDrive WLP4-200 (mpt2sas, SCSI disks) on node 1.
    t.disk("sdb", "8:16", 390703446, False, numa=1, driver="mpt2sas", pci="0000:42:00.0")
    t.disk("sdc", "8:32", 390703446, False, numa=1, driver="mpt2sas", pci="0000:43:00.0")
    # ASSUMED: software RAID 0 over both SSDs, mounted as the data volume.
    t.disk("md0", "9:0", 781406208, False, has_device=False, slaves=["sdb", "sdc"])
    t.mountinfo([
        ("8:1", "/", "ext4", "/dev/sda1"),
        ("0:3", "/proc", "proc", "proc"),
        ("9:0", "/data", "xfs", "/dev/md0"),
        ("0:18", "/dev/shm", "tmpfs", "tmpfs"),
    ])
    t.net([("lo", "127.0.0.1", 8), ("eth0", "10.1.0.20", 24), ("eth2", "192.168.41.20", 24)],
          irqs=[(100, "mlx4-comp-0@pci:0000:41:00.0"), (101, "mlx4-comp-1@pci:0000:41:00.0")],
          ncpu=32)


def seed001_amd8n():
    t = Tree("seed001-amd8n")
    cpus = [list(range(4 * k, 4 * k + 4)) for k in range(8)]

    # Seed 000 Fig. 1-2(a) / seed 001 Fig. 1: node 7 is a neighbour of 6
    # (same package), one hop from {0,2,4}, two hops from {1,3,5}.
    # ASSUMED SLIT values: 16 for neighbour and one hop, 22 for two hops.
    def d(i, j):
        if i == j:
            return 10
        if i // 2 == j // 2 or (i % 2) != (j % 2):
            return 16
        return 22
    dist = [[d(i, j) for j in range(8)] for i in range(8)]
    t.nodes(cpus, 4 * GIB_KB, dist, lambda c: c // 8,
            [(1, "Data", "64K"), (1, "Instruction", "64K"), (2, "Unified", "512K"),
             (3, "Unified", "5120K")])
    t.nic("lo", virtual=True, mtu=65536)
    # On-board NIC whose device has no numa_node file (old kernel/BIOS):
    # must come out unknown, not node 0.
    t.nic("eth0", numa=None, speed=1000, mac="78:e7:d1:00:00:01", driver="bnx2")
    # ConnectX-3 EN dual port: both ports are one PCI function, on node 7.
    t.nic("eth2", numa=7, speed=40000, mac="00:02:c9:00:07:02", mtu=9000, driver="mlx4_core",
          pci="0000:41:00.0")
    t.nic("eth3", numa=7, speed=40000, mac="00:02:c9:00:07:03", mtu=9000, driver="mlx4_core",
          pci="0000:41:00.0")
    # A container's veth: virtual, no device.
    t.nic("veth0", virtual=True, speed=10000, mac="aa:bb:cc:00:00:01")
    # System disk with numa_node -1 (BIOS gave no proximity): unknown.
    t.disk("sda", "8:0", 292968750, True, numa=-1, driver="ahci", pci="0000:00:11.0",
           parts=[("sda1", "8:1", 1048576), ("sda2", "8:2", 291917824)])
    t.disk("sdb", "8:16", 390703446, False, numa=7, driver="mpt2sas", pci="0000:42:00.0",
           parts=[("sdb1", "8:17", 390700000)])
    t.disk("sdc", "8:32", 390703446, False, numa=7, driver="mpt2sas", pci="0000:43:00.0",
           parts=[("sdc1", "8:33", 390700000)])
    t.disk("loop0", "7:0", 0, False, has_device=False)
    t.disk("ram0", "1:0", 131072, False, has_device=False)
    t.mountinfo([
        ("8:2", "/", "ext4", "/dev/sda2"),
        ("8:1", "/boot", "ext4", "/dev/sda1"),
        ("0:3", "/proc", "proc", "proc"),
        ("8:17", "/ssd1", "xfs", "/dev/sdb1"),
        ("8:33", "/ssd2", "xfs", "/dev/sdc1"),
        ("0:18", "/dev/shm", "tmpfs", "tmpfs"),
    ])
    t.net([("lo", "127.0.0.1", 8), ("eth0", "10.2.0.30", 24), ("eth2", "192.168.70.30", 24),
           ("eth3", "192.168.71.30", 24)],
          irqs=[(120, "mlx4-comp-0@pci:0000:41:00.0"), (121, "mlx4-comp-1@pci:0000:41:00.0"),
                (70, "eth0-0")],
          ncpu=32)


def no_numa():
    t = Tree("no-numa")
    t.w("sys/devices/system/cpu/online", "0-3")
    for c in range(4):
        t.w(f"sys/devices/system/cpu/cpu{c}/topology/physical_package_id", "0")
    t.w("proc/meminfo", "MemTotal:        8388608 kB\nMemFree:         4194304 kB")
    t.nic("lo", virtual=True, mtu=65536)
    t.nic("eth0", numa=-1, speed=-1, driver="virtio_net")
    t.disk("vda", "254:0", 41943040, True, driver="virtio_blk")
    t.mountinfo([
        ("0:50", "/", "overlay", "overlay"),
        ("254:0", "/data", "ext4", "/dev/vda"),
        ("0:3", "/proc", "proc", "proc"),
        ("0:51", "/mnt/with space", "tmpfs", "tmpfs"),
    ])
    # \040 is how mountinfo escapes the space.
    p = os.path.join(t.root, "proc/self/mountinfo")
    with open(p) as f:
        s = f.read().replace("/mnt/with space", "/mnt/with\\040space")
    with open(p, "w") as f:
        f.write(s)
    t.net([("lo", "127.0.0.1", 8), ("eth0", "192.0.2.7", 24)],
          v6=[("eth0", 2, "fd000000000000000000000000000007", 64)])


if __name__ == "__main__":
    seed004_frontend()
    seed000_intel4s()
    seed001_amd8n()
    no_numa()
