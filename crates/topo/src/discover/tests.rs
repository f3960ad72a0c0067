//! The sysfs and procfs parsers on captured text: cpulists, sizes, device
//! kinds, mount escapes, addresses, IRQ lines.

use super::nics::{ipv4_from_proc, irqs_named, parse_if_inet6};
use super::storage::{classify, unescape_mount};
use super::*;

#[test]
fn cpulists() {
    assert_eq!(parse_cpulist("0-3,8-9\n").unwrap(), vec![0, 1, 2, 3, 8, 9]);
    assert_eq!(parse_cpulist("0,4,8").unwrap(), vec![0, 4, 8]);
    assert_eq!(parse_cpulist("0-7:2").unwrap(), vec![0, 2, 4, 6]);
    assert_eq!(parse_cpulist("").unwrap(), Vec::<usize>::new());
    assert!(parse_cpulist("3-1").is_err());
    assert!(parse_cpulist("x").is_err());
}

#[test]
fn sizes_and_meminfo() {
    assert_eq!(parse_size("107520K"), Some(107520 * 1024));
    assert_eq!(parse_size("20M"), Some(20 << 20));
    assert_eq!(parse_size("512"), Some(512));
    assert_eq!(
        meminfo_total("Node 0 MemTotal:        4416068 kB\nNode 0 MemFree: 1 kB"),
        Some(4416068 * 1024)
    );
    assert_eq!(meminfo_total("MemTotal: 16 kB"), Some(16384));
}

#[test]
fn classification() {
    assert_eq!(classify("zram0", false, false), DeviceKind::Memory);
    assert_eq!(classify("ram0", false, false), DeviceKind::Memory);
    assert_eq!(classify("loop3", false, false), DeviceKind::Virtual);
    assert_eq!(classify("dm-0", false, false), DeviceKind::Virtual);
    assert_eq!(classify("md127", false, false), DeviceKind::Virtual);
    assert_eq!(classify("nvme0n1", true, false), DeviceKind::Nvme);
    assert_eq!(classify("sda", true, true), DeviceKind::Hdd);
    assert_eq!(classify("sdb", true, false), DeviceKind::Ssd);
    assert_eq!(classify("xyz", false, true), DeviceKind::Virtual);
}

#[test]
fn mountinfo_escapes() {
    assert_eq!(unescape_mount(r"/mnt/my\040disk"), "/mnt/my disk");
    assert_eq!(unescape_mount(r"/a\\b"), r"/a\\b");
    assert_eq!(unescape_mount(r"/end\04"), r"/end\04");
}

#[test]
fn if_inet6_lines() {
    let v = parse_if_inet6(
        "fd000000000000000000000000000002 04 40 00 82     eth0\n\
         00000000000000000000000000000001 01 80 10 80       lo\n",
    );
    assert_eq!(v.len(), 2);
    assert_eq!(v[0].0, "eth0");
    assert_eq!(v[0].1.addr, "fd00::2".parse::<IpAddr>().unwrap());
    assert_eq!(v[0].1.prefix_len, 64);
    assert_eq!(v[1].1.prefix_len, 128);
}

#[test]
fn ipv4_from_trie_and_routes() {
    let trie = "Local:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 10.0.0.5\n        /32 host LOCAL\n\
                |-- 10.0.0.255\n        /32 link BROADCAST\n     |-- 127.0.0.1\n        /32 host LOCAL\n\
                |-- 172.16.1.9\n        /32 host LOCAL\n";
    let routes =
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n\
                  eth0\t00000000\t0100000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                  eth0\t0000000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                  eth1\t000010AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n\
                  eth2\t000110AC\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
    let v = ipv4_from_proc(trie, routes, Some("lo"));
    let find = |ip: &str| {
        v.iter()
            .find(|(_, a)| a.addr == ip.parse::<IpAddr>().unwrap())
            .map(|(n, a)| (n.as_str(), a.prefix_len))
    };
    assert_eq!(find("10.0.0.5"), Some(("eth0", 24)));
    assert_eq!(find("127.0.0.1"), Some(("lo", 8)));
    // 172.16.1.9 is in both 172.16/16 (eth1) and 172.16.1/24 (eth2).
    assert_eq!(find("172.16.1.9"), Some(("eth2", 24)));
    assert_eq!(find("10.0.0.255"), None);
}

#[test]
fn irq_lines() {
    let text = "           CPU0       CPU1\n\
                38:  0  2402 PCI-MSIX-0000:00:03.0   1-edge      virtio2-input.0\n\
                90:  1  0 IR-PCI-MSI 1 mlx4-comp-0@pci:0000:41:00.0\n\
                91:  1  0 IR-PCI-MSI 2 eth10-rx-0\n\
                92:  1  0 IR-PCI-MSI 3 eth1-rx-0\n\
                NMI:  0 0 Non-maskable interrupts\n";
    assert_eq!(irqs_named(text, "eth1", None), vec![92]);
    assert_eq!(irqs_named(text, "eth0", Some("0000:00:03.0")), vec![38]);
    assert_eq!(irqs_named(text, "eth2", Some("0000:41:00.0")), vec![90]);
}
