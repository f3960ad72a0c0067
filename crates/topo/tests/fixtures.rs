//! Discovery and placement decisions on the fixture hosts (built by
//! tests/make-fixtures.py from the seeds' tables; this-vm captured by
//! tests/capture-fixture.sh).

use ramsys_topo::placement::{FakePlacer, PlacerCall};
use ramsys_topo::plan::{alloc_buffers, pin_for, storage_pool_size};
use ramsys_topo::*;
use std::path::Path;

mod common;
use common::{cpus_of, dev, ip, load};

// ---- seed 004 Table 1: 2-socket front-end host ----

#[test]
fn seed004_model() {
    let t = load("seed004-frontend");
    assert!(!t.numa_synthetic);
    assert_eq!(t.nodes.len(), 2);
    assert_eq!(t.nodes[0].cpus, (0..8).collect::<Vec<_>>());
    assert_eq!(t.nodes[1].cpus, (8..16).collect::<Vec<_>>());
    assert_eq!(t.all_cpus().len(), 16);
    assert_eq!(
        t.nodes.iter().map(|n| n.memory_bytes).sum::<u64>(),
        128 << 30
    );
    assert_eq!(t.nodes[0].distances, vec![10, 21]);
    assert_eq!(t.distance(1, 0), Some(21));
    assert_eq!(t.nodes[1].packages, vec![1]);
    assert!(!t.same_package(0, 1));
    assert_eq!(t.nodes[0].llc_bytes, Some(20 << 20));
    assert_eq!(t.node_of_cpu(9), Some(1));
    assert_eq!(t.node_of_cpu(16), None);

    let eth2 = t.nic("eth2").unwrap();
    assert_eq!(eth2.numa_node, Some(1));
    assert_eq!(eth2.speed_mbps, Some(40_000));
    assert_eq!(eth2.mtu, Some(9000));
    assert_eq!(eth2.pci_slot.as_deref(), Some("0000:81:00.0"));
    assert_eq!(eth2.irqs, vec![90, 91, 92]);
    assert!(!eth2.is_virtual);
    let lo = t.nic("lo").unwrap();
    assert!(lo.is_virtual);
    assert_eq!(lo.numa_node, None);
    assert_eq!(t.nic("eth0").unwrap().irqs, vec![60]);

    assert_eq!(t.nic_for_addr(ip("192.168.40.10")).unwrap().name, "eth2");
    assert_eq!(t.nic_for_addr(ip("10.0.0.10")).unwrap().name, "eth0");
    assert_eq!(t.nic_for_addr(ip("127.0.0.1")).unwrap().name, "lo");
    assert_eq!(t.nic_for_addr(ip("::1")).unwrap().name, "lo");
    assert_eq!(
        t.nic_for_addr(ip("fe80::202:c9ff:fe00:12")).unwrap().name,
        "eth2"
    );
    assert!(t.nic_for_addr(ip("192.168.40.11")).is_none());
    assert_eq!(t.nic_for_peer(ip("192.168.40.99")).unwrap().name, "eth2");

    let sda = dev(&t, "sda");
    assert_eq!(
        (sda.kind, sda.rotational, sda.numa_node),
        (DeviceKind::Hdd, true, Some(0))
    );
    assert_eq!(sda.partitions, vec!["sda1", "sda2"]);
    assert_eq!(sda.size_bytes, 976773168 * 512);
    let fioa = dev(&t, "fioa");
    assert_eq!(
        (fioa.kind, fioa.rotational, fioa.numa_node),
        (DeviceKind::Ssd, false, Some(0))
    );
    assert_eq!(fioa.mounts[0].mount_point, Path::new("/ssd"));
    assert_eq!(fioa.mounts[0].fs_type, "xfs");

    assert_eq!(
        t.device_for_path(Path::new("/ssd/run1/f.dat"))
            .unwrap()
            .name,
        "fioa"
    );
    assert_eq!(
        t.device_for_path(Path::new("/home/u/x")).unwrap().name,
        "sda"
    );
    let boot = t.mount_for_path(Path::new("/boot/vmlinuz")).unwrap();
    assert_eq!(boot.partition.as_deref(), Some("sda1"));
    assert_eq!(
        t.device_for_path(Path::new("/boot/vmlinuz")).unwrap().name,
        "sda"
    );
    let ram = t.device_for_path(Path::new("/mnt/ramdisk/lun0")).unwrap();
    assert_eq!(ram.kind, DeviceKind::Memory);
    assert_eq!(ram.numa_node, None);
    assert!(t.device_for_path(Path::new("/proc/cpuinfo")).is_none());
}

/// The example: SSD on node 0 to a NIC on node 1 puts readers on
/// node-0 CPUs, senders and buffers on node 1.
#[test]
fn seed004_ssd_node0_to_nic_node1() {
    let t = load("seed004-frontend");
    let ssd = t.device_for_path(Path::new("/ssd/data")).unwrap();
    let nic = t.nic_for_addr(ip("192.168.40.10")).unwrap();
    let p = plan_transfer(&t, Role::Source, Some(ssd), Some(nic), NumaMode::Auto).unwrap();
    assert_eq!(p.storage_threads.node, Some(0));
    assert_eq!(p.storage_threads.cpus, cpus_of(&t, 0));
    let net = p.network_threads.as_ref().unwrap();
    assert_eq!(net.node, Some(1));
    assert_eq!(net.cpus, cpus_of(&t, 1));
    assert_eq!(p.buffers.node, Some(1));
    assert!(p.buffers.reason.contains("eth2"), "{}", p.buffers.reason);

    // The same plan driven through the fake placer: the calls a reader
    // thread, a sender thread and the buffer pool make.
    let f = FakePlacer::default();
    pin_for(&f, &p.storage_threads).unwrap();
    pin_for(&f, net).unwrap();
    let buf = alloc_buffers(&f, &p, 8 << 20).unwrap();
    assert_eq!(buf.len(), 8 << 20);
    assert_eq!(
        f.calls(),
        vec![
            PlacerCall::Pin((0..8).collect()),
            PlacerCall::Pin((8..16).collect()),
            PlacerCall::Alloc {
                bytes: 8 << 20,
                node: Some(1)
            },
        ]
    );

    // Sink side of the same host: writers on the storage node, receivers
    // and buffers on the NIC node.
    let s = plan_transfer(&t, Role::Sink, Some(ssd), Some(nic), NumaMode::Auto).unwrap();
    assert_eq!(s.storage_threads.node, Some(0));
    assert_eq!(s.network_threads.unwrap().node, Some(1));
    assert!(s.storage_threads.reason.contains("writers"));

    // --numa off: everything unbound, all CPUs.
    let off = plan_transfer(&t, Role::Source, Some(ssd), Some(nic), NumaMode::Off).unwrap();
    assert_eq!(off.buffers.node, None);
    assert_eq!(off.storage_threads.cpus.len(), 16);
    // --numa 0 forces all onto node 0; a missing node is an error.
    let n0 = plan_transfer(&t, Role::Source, Some(ssd), Some(nic), NumaMode::Node(0)).unwrap();
    assert_eq!(n0.network_threads.unwrap().cpus, cpus_of(&t, 0));
    assert_eq!(n0.buffers.node, Some(0));
    assert!(plan_transfer(&t, Role::Source, Some(ssd), Some(nic), NumaMode::Node(2)).is_err());

    // Local copy from the SSD to the in-memory store: buffers stay with
    // the source device's node.
    let local = plan_transfer(&t, Role::Source, Some(ssd), None, NumaMode::Auto).unwrap();
    assert!(local.network_threads.is_none());
    assert_eq!(local.buffers.node, Some(0));
}

// ---- seed 000 Table 4.1: 4-socket Intel E5-4620, devices on node 1 ----

#[test]
fn seed000_intel_model_and_plan() {
    let t = load("seed000-intel4s");
    assert_eq!(t.nodes.len(), 4);
    assert_eq!(t.all_cpus().len(), 32);
    assert_eq!(t.nodes[1].cpus, vec![1, 5, 9, 13, 17, 21, 25, 29]);
    assert_eq!(t.node_of_cpu(6), Some(2));
    assert_eq!(
        t.nodes.iter().map(|n| n.memory_bytes).sum::<u64>(),
        768 << 30
    );
    // Ring: 1's neighbours are 0 and 2, node 3 is opposite.
    assert_eq!(t.nodes[1].distances, vec![21, 10, 21, 31]);
    assert_eq!(t.distance(0, 2), Some(31));
    assert_eq!(t.nodes[3].packages, vec![3]);
    assert_eq!(t.nodes[0].llc_bytes, Some(16 << 20));

    let eth2 = t.nic("eth2").unwrap();
    assert_eq!((eth2.numa_node, eth2.speed_mbps), (Some(1), Some(40_000)));
    for s in ["sdb", "sdc"] {
        let d = dev(&t, s);
        assert_eq!(
            (d.kind, d.numa_node, d.driver.as_deref()),
            (DeviceKind::Ssd, Some(1), Some("mpt2sas"))
        );
    }
    // md0 is virtual but inherits node 1 from both of its SSDs.
    let md = dev(&t, "md0");
    assert_eq!(md.kind, DeviceKind::Virtual);
    assert_eq!(md.slaves, vec!["sdb", "sdc"]);
    assert_eq!(md.numa_node, Some(1));
    assert_eq!(dev(&t, "sda").kind, DeviceKind::Hdd);

    let data = t.device_for_path(Path::new("/data/set/a")).unwrap();
    assert_eq!(data.name, "md0");
    let p = plan_transfer(&t, Role::Source, Some(data), Some(eth2), NumaMode::Auto).unwrap();
    assert_eq!(p.storage_threads.cpus, vec![1, 5, 9, 13, 17, 21, 25, 29]);
    assert_eq!(p.network_threads.unwrap().node, Some(1));
    assert_eq!(p.buffers.node, Some(1));

    // From the system disk (node 0) out through eth2 (node 1).
    let root = t.device_for_path(Path::new("/etc/hosts")).unwrap();
    let p = plan_transfer(&t, Role::Source, Some(root), Some(eth2), NumaMode::Auto).unwrap();
    assert_eq!(p.storage_threads.node, Some(0));
    assert_eq!(p.buffers.node, Some(1));
    assert_eq!(storage_pool_size(root.kind, None, 8), 1);
    assert!(storage_pool_size(data.kind, None, 8) > 1);
}

// ---- seed 001 Table II: 8-node AMD host, NICs and SSDs on node 7 ----

#[test]
fn seed001_amd_model_and_plan() {
    let t = load("seed001-amd8n");
    assert_eq!(t.nodes.len(), 8);
    assert_eq!(t.nodes[7].cpus, vec![28, 29, 30, 31]);
    assert_eq!(t.nodes[7].memory_bytes, 4 << 30);
    assert_eq!(t.nodes[7].llc_bytes, Some(5 << 20));
    // Fig. 1-2(a): 6 is 7's neighbour (same package), {0,2,4} one hop,
    // {1,3,5} two hops.
    assert!(t.same_package(6, 7));
    assert!(!t.same_package(5, 7));
    assert_eq!(t.nodes[7].distances, vec![16, 22, 16, 22, 16, 22, 16, 10]);
    for a in 0..8 {
        for b in 0..8 {
            assert_eq!(t.distance(a, b), t.distance(b, a));
        }
    }

    for n in ["eth2", "eth3"] {
        let nic = t.nic(n).unwrap();
        assert_eq!((nic.numa_node, nic.speed_mbps), (Some(7), Some(40_000)));
        assert_eq!(nic.irqs, vec![120, 121]);
    }
    // No numa_node file: unknown, never node 0.
    assert_eq!(t.nic("eth0").unwrap().numa_node, None);
    assert!(!t.nic("eth0").unwrap().is_virtual);
    let veth = t.nic("veth0").unwrap();
    assert!(veth.is_virtual && veth.numa_node.is_none());

    // numa_node -1: unknown.
    let sda = dev(&t, "sda");
    assert_eq!((sda.kind, sda.numa_node), (DeviceKind::Hdd, None));
    assert_eq!(dev(&t, "sdb").numa_node, Some(7));
    assert_eq!(dev(&t, "loop0").kind, DeviceKind::Virtual);
    assert_eq!(dev(&t, "ram0").kind, DeviceKind::Memory);
    // Partition mounts fold into the parent disk.
    let sdc = dev(&t, "sdc");
    assert_eq!(sdc.mounts.len(), 1);
    assert_eq!(sdc.mounts[0].partition.as_deref(), Some("sdc1"));
    assert_eq!(t.device_for_path(Path::new("/ssd2/x")).unwrap().name, "sdc");

    // SSD (node 7) through eth3 (node 7): everything on node 7.
    let ssd = t.device_for_path(Path::new("/ssd1/big")).unwrap();
    let eth3 = t.nic_for_addr(ip("192.168.71.30")).unwrap();
    assert_eq!(eth3.name, "eth3");
    let p = plan_transfer(&t, Role::Source, Some(ssd), Some(eth3), NumaMode::Auto).unwrap();
    assert_eq!(p.storage_threads.cpus, vec![28, 29, 30, 31]);
    assert_eq!(
        p.network_threads.as_ref().unwrap().cpus,
        vec![28, 29, 30, 31]
    );
    assert_eq!(p.buffers.node, Some(7));

    // System disk with unknown node to the on-board NIC with unknown node:
    // all CPUs, no binding, and the decision says so.
    let root = t.device_for_path(Path::new("/var/x")).unwrap();
    let eth0 = t.nic("eth0").unwrap();
    let p = plan_transfer(&t, Role::Source, Some(root), Some(eth0), NumaMode::Auto).unwrap();
    assert_eq!(p.storage_threads.node, None);
    assert_eq!(p.storage_threads.cpus.len(), 32);
    assert!(
        p.storage_threads.reason.contains("unknown"),
        "{}",
        p.storage_threads.reason
    );
    assert_eq!(p.buffers.node, None);
    assert!(p.buffers.reason.contains("unknown"), "{}", p.buffers.reason);
    let p = plan_transfer(&t, Role::Sink, Some(ssd), Some(veth), NumaMode::Auto).unwrap();
    assert_eq!(p.storage_threads.node, Some(7));
    assert!(p.buffers.reason.contains("virtual"), "{}", p.buffers.reason);

    // Two NICs on node 7 and one unknown: the affinity-aware scheduler
    // keeps node-7 buffers on the node-7 ports, alternating by bytes.
    let mut s =
        ChannelScheduler::from_topology(&t, &["eth0", "eth2", "eth3"], 1, ChannelPolicy::default())
            .unwrap();
    let picks: Vec<String> = (0..4)
        .map(|_| {
            let i = s.pick(Some(7), 1 << 20);
            s.channels()[i].nic.clone()
        })
        .collect();
    assert_eq!(picks, vec!["eth2", "eth3", "eth2", "eth3"]);
    assert!(ChannelScheduler::from_topology(&t, &["eth9"], 1, ChannelPolicy::Dynamic).is_err());
}

// ---- a VM without NUMA ----

#[test]
fn no_numa_gets_one_synthetic_node() {
    let t = load("no-numa");
    assert!(t.numa_synthetic);
    assert_eq!(t.nodes.len(), 1);
    assert_eq!(t.nodes[0].id, 0);
    assert_eq!(t.nodes[0].cpus, vec![0, 1, 2, 3]);
    assert_eq!(t.nodes[0].memory_bytes, 8 << 30);
    assert_eq!(t.nodes[0].distances, vec![10]);
    let eth0 = t.nic("eth0").unwrap();
    assert_eq!((eth0.numa_node, eth0.speed_mbps), (None, None));
    assert_eq!(t.nic_for_addr(ip("192.0.2.7")).unwrap().name, "eth0");
    assert_eq!(t.nic_for_addr(ip("fd00::7")).unwrap().name, "eth0");
    let vda = dev(&t, "vda");
    assert_eq!((vda.kind, vda.numa_node), (DeviceKind::Hdd, None));
    let root = t.device_for_path(Path::new("/etc/x")).unwrap();
    assert_eq!(
        (root.name.as_str(), root.kind),
        ("overlay:/", DeviceKind::Virtual)
    );
    assert_eq!(t.device_for_path(Path::new("/data/x")).unwrap().name, "vda");
    let sp = t.device_for_path(Path::new("/mnt/with space/f")).unwrap();
    assert_eq!(sp.kind, DeviceKind::Memory);
}

// ---- this machine, captured ----

#[test]
fn this_vm_capture_matches_live() {
    let t = load("this-vm");
    assert_eq!(t.nodes.len(), 1);
    assert!(!t.numa_synthetic);
    assert_eq!(t.nodes[0].distances, vec![10]);
    let vda = dev(&t, "vda");
    assert_eq!(vda.numa_node, None, "virtio PCI numa_node is -1 here");
    assert!(vda.mounts.iter().any(|m| m.mount_point == Path::new("/")));
    assert_eq!(dev(&t, "zram0").kind, DeviceKind::Memory);
    assert_eq!(dev(&t, "loop0").kind, DeviceKind::Virtual);
    let eth0 = t.nic("eth0").unwrap();
    assert_eq!(eth0.driver.as_deref(), Some("virtio_net"));
    assert!(!eth0.irqs.is_empty());
    assert_eq!(t.nic("lo").unwrap().numa_node, None);
    // Every captured IPv4 address maps back to its NIC.
    for nic in &t.nics {
        for a in &nic.addresses {
            assert_eq!(t.nic_for_addr(a.addr).unwrap().name, nic.name);
        }
    }
    assert!(!t.nic("eth0").unwrap().addresses.is_empty());
    assert_eq!(t.device_for_path(Path::new("/work/x")).unwrap().name, "vda");
    assert_eq!(
        t.device_for_path(Path::new("/dev/shm/x")).unwrap().kind,
        DeviceKind::Memory
    );
    // Placement with every node unknown falls back to all CPUs.
    let p = plan_transfer(&t, Role::Source, Some(vda), Some(eth0), NumaMode::Auto).unwrap();
    assert_eq!(p.storage_threads.cpus, t.all_cpus());
    assert_eq!(p.buffers.node, None);
}

#[test]
fn json_shape() {
    for name in [
        "seed004-frontend",
        "seed000-intel4s",
        "seed001-amd8n",
        "no-numa",
        "this-vm",
    ] {
        let t = load(name);
        let v: serde_json::Value = serde_json::to_value(&t).unwrap();
        for key in ["nodes", "nics", "block_devices"] {
            assert!(v[key].is_array(), "{name}: {key}");
        }
        let n0 = &v["nodes"][0];
        for key in ["id", "cpus", "memory_bytes", "distances"] {
            assert!(!n0[key].is_null(), "{name}: node {key}");
        }
        for nic in v["nics"].as_array().unwrap() {
            assert!(nic["name"].is_string());
            assert!(nic.get("numa_node").is_some() && nic.get("speed_mbps").is_some());
        }
        for d in v["block_devices"].as_array().unwrap() {
            let kind = d["kind"].as_str().unwrap();
            assert!(["hdd", "ssd", "nvme", "memory", "virtual"].contains(&kind));
            assert!(d["rotational"].is_boolean());
            assert!(d.get("numa_node").is_some());
        }
        // Round trip.
        let back: Topology = serde_json::from_value(v).unwrap();
        assert_eq!(back, t);
    }
    let t = load("seed001-amd8n");
    let v = serde_json::to_value(&t).unwrap();
    let sda = v["block_devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "sda")
        .unwrap();
    assert!(sda["numa_node"].is_null());
    assert_eq!(
        v["nics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == "eth2")
            .unwrap()["numa_node"],
        7
    );
}

#[test]
fn text_rendering_mentions_everything() {
    let t = load("seed001-amd8n");
    let s = render_text(&t);
    assert!(s.contains("NUMA nodes: 8"), "{s}");
    assert!(s.contains("node 7: cpus 28-31"), "{s}");
    assert!(s.contains("eth2: node 7  40000 Mb/s"), "{s}");
    // Raw channels (seed 002): eth2 is jumbo Ethernet with native XDP,
    // loopback is not Ethernet.
    assert!(
        s.contains("raw channels: yes  mac 00:02:c9:00:07:02  mtu 9000 (jumbo)  xdp native"),
        "{s}"
    );
    assert!(
        s.contains("raw channels: yes  mac 78:e7:d1:00:00:01  mtu 1500  xdp generic"),
        "{s}"
    );
    assert!(
        s.contains("raw channels: no (not Ethernet (link type 772))"),
        "{s}"
    );
    assert!(s.contains("sda: hdd (rotational)  node unknown"), "{s}");
    assert!(s.contains("sdb1 /ssd1 (xfs)"), "{s}");
    let s = render_text(&load("no-numa"));
    assert!(s.contains("synthetic"), "{s}");
}

#[test]
fn missing_sysroot_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    assert!(discover(dir.path()).is_err());
    assert!(discover(&dir.path().join("nope")).is_err());
}
