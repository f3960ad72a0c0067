//! Reads the hardware model from sysfs and procfs (seed 000 sec. 6.1.2, the
//! INI layer's resource profiling). Every path is taken relative to a sysroot
//! so captured or hand-built trees stand in for a machine.

use crate::model::*;
use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

/// Discovers the machine under `sysroot` ("/" for this one): every read of
/// /sys/... and /proc/... goes to sysroot/sys/... and sysroot/proc/....
pub fn discover(sysroot: &Path) -> Result<Topology> {
    let fs = Root::new(sysroot);
    if !fs.p("sys").is_dir() {
        bail!("{} has no sys/ directory", sysroot.display());
    }
    let (nodes, numa_synthetic) = read_nodes(&fs)?;
    let mut nics = read_nics(&fs);
    attach_addresses(&fs, &mut nics);
    let mut block_devices = read_block_devices(&fs);
    let (mounts, pseudo_devices) = read_mounts(&fs, &mut block_devices);
    Ok(Topology {
        numa_synthetic,
        nodes,
        nics,
        block_devices,
        pseudo_devices,
        mounts,
    })
}

struct Root {
    root: PathBuf,
    live: bool,
}

impl Root {
    fn new(sysroot: &Path) -> Root {
        let live = fs::canonicalize(sysroot).is_ok_and(|p| p == Path::new("/"));
        Root {
            root: sysroot.to_path_buf(),
            live,
        }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.root.join(rel.trim_start_matches('/'))
    }
}

fn read_str(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

fn read_num<T: std::str::FromStr>(path: &Path) -> Option<T> {
    read_str(path)?.parse().ok()
}

/// A sysfs numa_node value: -1 (or anything negative) means unknown.
fn numa_value(path: &Path) -> Option<u32> {
    let v: i64 = read_num(path)?;
    u32::try_from(v).ok()
}

/// Names in a directory, sorted; empty when it does not exist.
fn dir_names(path: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(path)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Kernel cpulist format: "0-3,8-11", "0,4,8", "0-7:2", or empty.
pub fn parse_cpulist(s: &str) -> Result<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (range, stride) = match part.split_once(':') {
            Some((r, s)) => (r, s.parse::<usize>().context("cpulist stride")?),
            None => (part, 1),
        };
        let (a, b) = match range.split_once('-') {
            Some((a, b)) => (a.parse::<usize>()?, b.parse::<usize>()?),
            None => {
                let a = range.parse::<usize>()?;
                (a, a)
            }
        };
        if b < a || stride == 0 {
            bail!("bad cpulist range {part:?}");
        }
        out.extend((a..=b).step_by(stride));
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// "48K", "2048K", "20M" (sysfs cache sizes: the kernel's K is 1024, as
/// in ramsys_units' rule).
fn parse_size(s: &str) -> Option<u64> {
    ramsys_units::parse_size(s).ok()
}

/// The "MemTotal: N kB" line of a (per-node) meminfo file.
fn meminfo_total(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let idx = l.find("MemTotal:")?;
        let kb: u64 = l[idx + 9..].split_whitespace().next()?.parse().ok()?;
        Some(kb * 1024)
    })
}

fn cpu_package(fs: &Root, cpu: usize) -> Option<u32> {
    read_num(&fs.p(&format!(
        "sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id"
    )))
}

/// Largest data/unified cache level of `cpu`.
fn cpu_llc(fs: &Root, cpu: usize) -> Option<u64> {
    let base = fs.p(&format!("sys/devices/system/cpu/cpu{cpu}/cache"));
    dir_names(&base)
        .iter()
        .filter(|n| n.starts_with("index"))
        .filter_map(|n| {
            let d = base.join(n);
            if read_str(&d.join("type")).as_deref() == Some("Instruction") {
                return None;
            }
            let level: u32 = read_num(&d.join("level"))?;
            Some((level, parse_size(&read_str(&d.join("size"))?)?))
        })
        .max_by_key(|&(level, _)| level)
        .map(|(_, size)| size)
}

fn read_nodes(fs: &Root) -> Result<(Vec<Node>, bool)> {
    let base = fs.p("sys/devices/system/node");
    let mut ids: Vec<u32> = dir_names(&base)
        .iter()
        .filter_map(|n| n.strip_prefix("node")?.parse().ok())
        .collect();
    ids.sort_unstable();
    let mut nodes = Vec::new();
    for id in &ids {
        let d = base.join(format!("node{id}"));
        let cpus = parse_cpulist(&read_str(&d.join("cpulist")).unwrap_or_default())
            .with_context(|| format!("{}/cpulist", d.display()))?;
        let memory_bytes = fs::read_to_string(d.join("meminfo"))
            .ok()
            .and_then(|t| meminfo_total(&t))
            .unwrap_or(0);
        let distances = read_str(&d.join("distance"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        nodes.push(node_with_cpu_info(fs, *id, cpus, memory_bytes, distances));
    }
    if !nodes.is_empty() {
        return Ok((nodes, false));
    }
    // No NUMA in the kernel (or a container hiding it): one synthetic node.
    let online = read_str(&fs.p("sys/devices/system/cpu/online"))
        .context("no NUMA nodes and no sys/devices/system/cpu/online")?;
    let cpus = parse_cpulist(&online)?;
    let memory_bytes = fs::read_to_string(fs.p("proc/meminfo"))
        .ok()
        .and_then(|t| meminfo_total(&t))
        .unwrap_or(0);
    Ok((
        vec![node_with_cpu_info(fs, 0, cpus, memory_bytes, vec![10])],
        true,
    ))
}

fn node_with_cpu_info(
    fs: &Root,
    id: u32,
    cpus: Vec<usize>,
    memory_bytes: u64,
    distances: Vec<u32>,
) -> Node {
    let packages: BTreeSet<u32> = cpus.iter().filter_map(|&c| cpu_package(fs, c)).collect();
    let llc_bytes = cpus.first().and_then(|&c| cpu_llc(fs, c));
    Node {
        id,
        cpus,
        memory_bytes,
        distances,
        packages: packages.into_iter().collect(),
        llc_bytes,
    }
}

/// What the `device` link of a class device tells: NUMA node, driver, PCI
/// slot and MSI IRQs. Real sysfs puts numa_node on the PCI function, which
/// may sit above the `device` link (virtio: device -> virtioN, whose parent
/// is the PCI function), so walk up the resolved path until it appears.
/// Hand-built trees simply put the files into `device/` itself.
#[derive(Default)]
struct DevInfo {
    numa_node: Option<u32>,
    driver: Option<String>,
    pci_slot: Option<String>,
    msi_irqs: Vec<u32>,
}

fn uevent_field(dir: &Path, key: &str) -> Option<String> {
    let text = fs::read_to_string(dir.join("uevent")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('=').map(String::from))
}

fn device_info(fs: &Root, device_link: &Path) -> DevInfo {
    let mut info = DevInfo {
        driver: uevent_field(device_link, "DRIVER"),
        ..DevInfo::default()
    };
    let Ok(mut dir) = fs::canonicalize(device_link) else {
        return info;
    };
    let stop = fs::canonicalize(fs.p("sys")).unwrap_or_else(|_| fs.p("sys"));
    while dir.starts_with(&stop) && dir != stop {
        if dir.join("numa_node").exists() {
            info.numa_node = numa_value(&dir.join("numa_node"));
            info.pci_slot = uevent_field(&dir, "PCI_SLOT_NAME");
            if info.driver.is_none() {
                info.driver = uevent_field(&dir, "DRIVER");
            }
            info.msi_irqs = dir_names(&dir.join("msi_irqs"))
                .iter()
                .filter_map(|n| n.parse().ok())
                .collect();
            break;
        }
        if !dir.pop() {
            break;
        }
    }
    info
}

fn read_nics(fs: &Root) -> Vec<Nic> {
    let base = fs.p("sys/class/net");
    let interrupts = fs::read_to_string(fs.p("proc/interrupts")).unwrap_or_default();
    let mut nics = Vec::new();
    for name in dir_names(&base) {
        let d = base.join(&name);
        if !d.is_dir() {
            continue; // e.g. bonding_masters
        }
        let dev = d.join("device");
        let is_virtual = !dev.exists();
        let info = if is_virtual {
            DevInfo::default()
        } else {
            device_info(fs, &dev)
        };
        // speed is -1 or unreadable (EINVAL) when the link is down/unknown.
        let speed_mbps = read_num::<i64>(&d.join("speed")).and_then(|s| u64::try_from(s).ok());
        let mut irqs = info.msi_irqs.clone();
        irqs.extend(irqs_named(&interrupts, &name, info.pci_slot.as_deref()));
        irqs.sort_unstable();
        irqs.dedup();
        nics.push(Nic {
            name,
            numa_node: info.numa_node,
            speed_mbps,
            is_virtual,
            addresses: Vec::new(),
            irqs,
            mac: read_str(&d.join("address")),
            mtu: read_num(&d.join("mtu")),
            operstate: read_str(&d.join("operstate")),
            driver: info.driver,
            pci_slot: info.pci_slot,
            link_type: read_num(&d.join("type")),
        });
    }
    nics
}

/// IRQ numbers of /proc/interrupts lines naming the interface ("eth2-rx-0")
/// or its PCI function ("mlx4-comp-0@pci:0000:41:00.0", "PCI-MSIX-0000:...").
fn irqs_named(interrupts: &str, ifname: &str, pci: Option<&str>) -> Vec<u32> {
    interrupts
        .lines()
        .filter_map(|l| {
            let (num, rest) = l.trim_start().split_once(':')?;
            let irq: u32 = num.trim().parse().ok()?;
            let hit = rest.split_whitespace().any(|tok| {
                tok.strip_prefix(ifname).is_some_and(|r| {
                    r.is_empty() || r.starts_with('-') || r.starts_with('@') || r.starts_with('.')
                }) || pci.is_some_and(|p| tok.contains(p))
            });
            hit.then_some(irq)
        })
        .collect()
}

/// Interface addresses: IPv6 from /proc/net/if_inet6; IPv4 from
/// getifaddrs(3) on the live system, otherwise from /proc/net/fib_trie
/// (local addresses) matched to /proc/net/route (which interface's subnet
/// holds them), since sysfs has no IPv4 addresses.
fn attach_addresses(fs: &Root, nics: &mut [Nic]) {
    let mut by_if: BTreeMap<String, Vec<NicAddr>> = BTreeMap::new();
    if let Ok(text) = fs::read_to_string(fs.p("proc/net/if_inet6")) {
        for (name, a) in parse_if_inet6(&text) {
            by_if.entry(name).or_default().push(a);
        }
    }
    let live_v4 = if fs.live { live_ipv4() } else { None };
    match live_v4 {
        Some(v4) => {
            for (name, a) in v4 {
                by_if.entry(name).or_default().push(a);
            }
        }
        None => {
            let trie = fs::read_to_string(fs.p("proc/net/fib_trie")).unwrap_or_default();
            let routes = fs::read_to_string(fs.p("proc/net/route")).unwrap_or_default();
            let loopback = nics.iter().find(|n| n.name == "lo").map(|n| n.name.clone());
            for (name, a) in ipv4_from_proc(&trie, &routes, loopback.as_deref()) {
                by_if.entry(name).or_default().push(a);
            }
        }
    }
    for nic in nics {
        if let Some(mut v) = by_if.remove(&nic.name) {
            v.sort_by_key(|a| (a.addr.is_ipv6(), a.addr));
            v.dedup();
            nic.addresses = v;
        }
    }
}

fn parse_if_inet6(text: &str) -> Vec<(String, NicAddr)> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 6 || f[0].len() != 32 {
                return None;
            }
            let addr = Ipv6Addr::from(u128::from_str_radix(f[0], 16).ok()?);
            let prefix_len = u8::from_str_radix(f[2], 16).ok()?;
            Some((
                f[5].to_string(),
                NicAddr {
                    addr: IpAddr::V6(addr),
                    prefix_len,
                },
            ))
        })
        .collect()
}

/// Local IPv4 addresses are the "/32 host LOCAL" leaves of fib_trie; the
/// interface is the one whose directly connected route (no gateway) holds
/// the address, longest mask first. 127/8 goes to the loopback device.
fn ipv4_from_proc(trie: &str, routes: &str, loopback: Option<&str>) -> Vec<(String, NicAddr)> {
    let mut locals = BTreeSet::new();
    let mut last: Option<Ipv4Addr> = None;
    for l in trie.lines() {
        let t = l.trim_start_matches([' ', '|', '+', '-']).trim();
        if let Ok(ip) = t.parse::<Ipv4Addr>() {
            last = Some(ip);
        } else if t.starts_with("/32 host LOCAL") {
            if let Some(ip) = last {
                locals.insert(ip);
            }
        }
    }
    // (iface, dest, mask) of connected routes.
    let hex = |s: &str| {
        u32::from_str_radix(s, 16)
            .ok()
            .map(|v| Ipv4Addr::from(v.to_le_bytes()))
    };
    let connected: Vec<(String, u32, u32)> = routes
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 8 || hex(f[2])? != Ipv4Addr::UNSPECIFIED {
                return None;
            }
            Some((
                f[0].to_string(),
                u32::from(hex(f[1])?),
                u32::from(hex(f[7])?),
            ))
        })
        .collect();
    let mut out = Vec::new();
    for ip in locals {
        if ip.is_loopback() {
            if let Some(lo) = loopback {
                out.push((
                    lo.to_string(),
                    NicAddr {
                        addr: IpAddr::V4(ip),
                        prefix_len: 8,
                    },
                ));
            }
            continue;
        }
        let v = u32::from(ip);
        if let Some((name, _, mask)) = connected
            .iter()
            .filter(|(_, dest, mask)| *mask != 0 && v & mask == *dest)
            .max_by_key(|(_, _, mask)| mask.count_ones())
        {
            out.push((
                name.clone(),
                NicAddr {
                    addr: IpAddr::V4(ip),
                    prefix_len: mask.count_ones() as u8,
                },
            ));
        }
    }
    out
}

/// IPv4 addresses of this machine via getifaddrs(3).
fn live_ipv4() -> Option<Vec<(String, NicAddr)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` walks the list returned by getifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and its family tells the real type.
        if unsafe { (*ifa.ifa_addr).sa_family } as i32 != libc::AF_INET {
            continue;
        }
        // SAFETY: AF_INET addresses are sockaddr_in; netmask likewise when set.
        let (addr, prefix_len) = unsafe {
            let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
            let addr = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            let prefix = if ifa.ifa_netmask.is_null() {
                32
            } else {
                let m = &*(ifa.ifa_netmask as *const libc::sockaddr_in);
                u32::from_be(m.sin_addr.s_addr).count_ones() as u8
            };
            (addr, prefix)
        };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        out.push((
            name,
            NicAddr {
                addr: IpAddr::V4(addr),
                prefix_len,
            },
        ));
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Some(out)
}

/// Memory-backed block devices (brd ramdisks, zram, pmem).
const MEMORY_PREFIXES: &[&str] = &["ram", "zram", "pmem"];
/// Devices stacked on or emulating others.
const VIRTUAL_PREFIXES: &[&str] = &["loop", "dm-", "md", "nbd", "rbd", "drbd", "bcache"];

fn classify(name: &str, has_device: bool, rotational: bool) -> DeviceKind {
    if MEMORY_PREFIXES.iter().any(|p| name.starts_with(p)) {
        DeviceKind::Memory
    } else if VIRTUAL_PREFIXES.iter().any(|p| name.starts_with(p)) || !has_device {
        DeviceKind::Virtual
    } else if name.starts_with("nvme") {
        DeviceKind::Nvme
    } else if rotational {
        DeviceKind::Hdd
    } else {
        DeviceKind::Ssd
    }
}

fn read_block_devices(fs: &Root) -> Vec<BlockDevice> {
    let base = fs.p("sys/block");
    let mut devs = Vec::new();
    for name in dir_names(&base) {
        let d = base.join(&name);
        let has_device = d.join("device").exists();
        let rotational = read_num::<u32>(&d.join("queue/rotational")) == Some(1);
        let info = if has_device {
            device_info(fs, &d.join("device"))
        } else {
            DevInfo::default()
        };
        let partitions = dir_names(&d)
            .into_iter()
            .filter(|p| d.join(p).join("partition").exists())
            .collect();
        devs.push(BlockDevice {
            kind: classify(&name, has_device, rotational),
            rotational,
            numa_node: info.numa_node,
            // `size` counts 512-byte sectors whatever the logical block size.
            size_bytes: read_num::<u64>(&d.join("size")).unwrap_or(0) * 512,
            mounts: Vec::new(),
            partitions,
            slaves: dir_names(&d.join("slaves")),
            driver: info.driver,
            pci_slot: info.pci_slot,
            name,
        });
    }
    // Stacked devices (md RAID over two SSDs, dm) live where all their
    // slaves live. Two rounds cover dm over md.
    for _ in 0..2 {
        let snapshot = devs.clone();
        let owner_node = |slave: &str| -> Option<Option<u32>> {
            snapshot
                .iter()
                .find(|d| d.name == slave || d.partitions.iter().any(|p| p == slave))
                .map(|d| d.numa_node)
        };
        for dev in devs.iter_mut().filter(|d| d.numa_node.is_none()) {
            let nodes: Option<BTreeSet<Option<u32>>> =
                dev.slaves.iter().map(|s| owner_node(s)).collect();
            if let Some(nodes) = nodes {
                if nodes.len() == 1 {
                    dev.numa_node = *nodes.iter().next().unwrap();
                }
            }
        }
    }
    devs
}

/// Kernel file systems that hold no user data: no device for them.
const KERNEL_FS: &[&str] = &[
    "proc",
    "sysfs",
    "devtmpfs",
    "devpts",
    "cgroup",
    "cgroup2",
    "securityfs",
    "debugfs",
    "tracefs",
    "pstore",
    "bpf",
    "mqueue",
    "configfs",
    "fusectl",
    "binfmt_misc",
    "autofs",
    "efivarfs",
    "rpc_pipefs",
    "nsfs",
    "selinuxfs",
];
const MEMORY_FS: &[&str] = &["tmpfs", "ramfs", "hugetlbfs"];

/// Decodes the octal escapes (\040 for space) of mountinfo fields.
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

struct RawMount {
    dev: Option<String>, // "major:minor"
    mount_point: String,
    fs_type: String,
    source: String,
}

/// /proc/self/mountinfo, or /proc/mounts (no device numbers) as a fallback.
fn read_raw_mounts(fs: &Root) -> Vec<RawMount> {
    if let Ok(text) = fs::read_to_string(fs.p("proc/self/mountinfo")) {
        return text
            .lines()
            .filter_map(|l| {
                let (pre, post) = l.split_once(" - ")?;
                let pre: Vec<&str> = pre.split_whitespace().collect();
                let mut post = post.split_whitespace();
                Some(RawMount {
                    dev: Some(pre.get(2)?.to_string()),
                    mount_point: unescape_mount(pre.get(4)?),
                    fs_type: post.next()?.to_string(),
                    source: unescape_mount(post.next().unwrap_or("")),
                })
            })
            .collect();
    }
    fs::read_to_string(fs.p("proc/mounts"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(RawMount {
                dev: None,
                source: unescape_mount(f.first()?),
                mount_point: unescape_mount(f.get(1)?),
                fs_type: f.get(2)?.to_string(),
            })
        })
        .collect()
}

fn read_mounts(fs: &Root, devs: &mut [BlockDevice]) -> (Vec<Mount>, Vec<BlockDevice>) {
    // major:minor and name of every disk and partition -> (disk, partition).
    let mut by_dev: HashMap<String, (String, Option<String>)> = HashMap::new();
    let mut by_name: HashMap<String, (String, Option<String>)> = HashMap::new();
    for d in devs.iter() {
        let dir = fs.p("sys/block").join(&d.name);
        if let Some(n) = read_str(&dir.join("dev")) {
            by_dev.insert(n, (d.name.clone(), None));
        }
        by_name.insert(d.name.clone(), (d.name.clone(), None));
        for p in &d.partitions {
            if let Some(n) = read_str(&dir.join(p).join("dev")) {
                by_dev.insert(n, (d.name.clone(), Some(p.clone())));
            }
            by_name.insert(p.clone(), (d.name.clone(), Some(p.clone())));
        }
    }
    let mut mounts = Vec::new();
    let mut pseudo: Vec<BlockDevice> = Vec::new();
    for r in read_raw_mounts(fs) {
        let hit = r
            .dev
            .as_ref()
            .and_then(|d| by_dev.get(d))
            .or_else(|| {
                let base = r.source.strip_prefix("/dev/")?;
                by_name.get(base.rsplit('/').next()?)
            })
            .cloned();
        let (device, partition) = match hit {
            Some((disk, part)) => {
                if let Some(d) = devs.iter_mut().find(|d| d.name == disk) {
                    d.mounts.push(DeviceMount {
                        mount_point: r.mount_point.clone().into(),
                        fs_type: r.fs_type.clone(),
                        partition: part.clone(),
                    });
                }
                (Some(disk), part)
            }
            None if KERNEL_FS.contains(&r.fs_type.as_str()) => (None, None),
            None => {
                let kind = if MEMORY_FS.contains(&r.fs_type.as_str()) {
                    DeviceKind::Memory
                } else {
                    DeviceKind::Virtual
                };
                let name = format!("{}:{}", r.fs_type, r.mount_point);
                pseudo.retain(|p| p.name != name);
                pseudo.push(BlockDevice {
                    name: name.clone(),
                    kind,
                    rotational: false,
                    numa_node: None,
                    size_bytes: 0,
                    mounts: vec![DeviceMount {
                        mount_point: r.mount_point.clone().into(),
                        fs_type: r.fs_type.clone(),
                        partition: None,
                    }],
                    partitions: vec![],
                    slaves: vec![],
                    driver: None,
                    pci_slot: None,
                });
                (Some(name), None)
            }
        };
        mounts.push(Mount {
            mount_point: r.mount_point.into(),
            fs_type: r.fs_type,
            source: r.source,
            device,
            partition,
        });
    }
    (mounts, pseudo)
}

#[cfg(test)]
mod tests {
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
}
