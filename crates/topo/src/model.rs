//! The hardware model produced by discovery: the "abstraction and description
//! of major characteristics" of every I/O resource (seed 000 sec. 6.1.2).

use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::path::{Component, Path, PathBuf};

/// Everything ramsys knows about the host's CPUs, memory and I/O devices.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Topology {
    /// True when the kernel exposes no NUMA nodes and one node 0 holding all
    /// online CPUs was made up.
    pub numa_synthetic: bool,
    pub nodes: Vec<Node>,
    pub nics: Vec<Nic>,
    /// Real block devices (whole disks, with their partitions folded in).
    pub block_devices: Vec<BlockDevice>,
    /// File systems without a block device that hold data (tmpfs, overlay,
    /// NFS, ...): kind "memory" or "virtual", `numa_node` unknown.
    #[serde(default)]
    pub pseudo_devices: Vec<BlockDevice>,
    /// Every mount, in mount order (later entries shadow earlier ones).
    #[serde(default)]
    pub mounts: Vec<Mount>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Node {
    pub id: u32,
    pub cpus: Vec<usize>,
    pub memory_bytes: u64,
    /// SLIT distances, indexed like `Topology::nodes` (ascending node id),
    /// exactly as the kernel's `nodeN/distance` lists them.
    pub distances: Vec<u32>,
    /// CPU packages (sockets) the node's CPUs sit in; two nodes sharing a
    /// package are "neighbours" in seed 000 sec. 1 (Fig. 1-2).
    pub packages: Vec<u32>,
    /// Last-level cache size seen from the node's first CPU.
    pub llc_bytes: Option<u64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Nic {
    pub name: String,
    /// None when the kernel reports -1 or no device node at all.
    pub numa_node: Option<u32>,
    pub speed_mbps: Option<u64>,
    /// No backing device (lo, veth, bridges, tunnels).
    #[serde(rename = "virtual")]
    pub is_virtual: bool,
    pub addresses: Vec<NicAddr>,
    pub irqs: Vec<u32>,
    pub mac: Option<String>,
    pub mtu: Option<u32>,
    pub operstate: Option<String>,
    pub driver: Option<String>,
    pub pci_slot: Option<String>,
    /// ARPHRD link type from sysfs `type` (1 = Ethernet, 772 = loopback).
    #[serde(default)]
    pub link_type: Option<u32>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct NicAddr {
    pub addr: IpAddr,
    pub prefix_len: u8,
}

impl NicAddr {
    /// Whether `ip` lies in this address's subnet.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(a), IpAddr::V4(b)) => {
                let mask = prefix_mask(self.prefix_len.min(32) as u32, 32) as u32;
                u32::from(a) & mask == u32::from(b) & mask
            }
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                let mask = prefix_mask(self.prefix_len.min(128) as u32, 128);
                u128::from(a) & mask == u128::from(b) & mask
            }
            _ => false,
        }
    }
}

fn prefix_mask(prefix: u32, width: u32) -> u128 {
    // Top `prefix` bits of a `width`-bit address set.
    if prefix == 0 {
        0
    } else {
        (u128::MAX << (128 - prefix)) >> (128 - width)
    }
}

/// Storage classes of seed 000 sec. 6.1.2 (HDD, SSD, memory) plus NVMe and
/// stacked/virtual devices.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Hdd,
    Ssd,
    Nvme,
    Memory,
    Virtual,
}

impl DeviceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Hdd => "hdd",
            DeviceKind::Ssd => "ssd",
            DeviceKind::Nvme => "nvme",
            DeviceKind::Memory => "memory",
            DeviceKind::Virtual => "virtual",
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct BlockDevice {
    pub name: String,
    pub kind: DeviceKind,
    pub rotational: bool,
    pub numa_node: Option<u32>,
    pub size_bytes: u64,
    pub mounts: Vec<DeviceMount>,
    pub partitions: Vec<String>,
    /// Devices this one is stacked on (dm, md); its node is theirs when
    /// they all agree.
    pub slaves: Vec<String>,
    pub driver: Option<String>,
    pub pci_slot: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct DeviceMount {
    pub mount_point: PathBuf,
    pub fs_type: String,
    /// The partition holding the file system, None for the whole device.
    pub partition: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Mount {
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub source: String,
    /// Name of the entry of `block_devices` or `pseudo_devices` holding the
    /// data; None for kernel file systems (proc, sysfs, cgroup, ...).
    pub device: Option<String>,
    pub partition: Option<String>,
}

impl Topology {
    pub fn node(&self, id: u32) -> Option<&Node> {
        self.nodes.iter().find(|n| n.id == id)
    }

    pub fn node_of_cpu(&self, cpu: usize) -> Option<u32> {
        self.nodes
            .iter()
            .find(|n| n.cpus.contains(&cpu))
            .map(|n| n.id)
    }

    /// All CPUs of all nodes, ascending.
    pub fn all_cpus(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.nodes.iter().flat_map(|n| n.cpus.clone()).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// SLIT distance from node `a` to node `b`.
    pub fn distance(&self, a: u32, b: u32) -> Option<u32> {
        let from = self.node(a)?;
        let idx = self.nodes.iter().position(|n| n.id == b)?;
        from.distances.get(idx).copied()
    }

    /// Whether two nodes share a CPU package (the "neighbour" relation of
    /// seed 000 sec. 1).
    pub fn same_package(&self, a: u32, b: u32) -> bool {
        match (self.node(a), self.node(b)) {
            (Some(x), Some(y)) => x.packages.iter().any(|p| y.packages.contains(p)),
            _ => false,
        }
    }

    pub fn nic(&self, name: &str) -> Option<&Nic> {
        self.nics.iter().find(|n| n.name == name)
    }

    /// Real or pseudo device by name.
    pub fn device(&self, name: &str) -> Option<&BlockDevice> {
        self.block_devices
            .iter()
            .chain(self.pseudo_devices.iter())
            .find(|d| d.name == name)
    }

    /// The NIC carrying local address `ip`.
    pub fn nic_for_addr(&self, ip: IpAddr) -> Option<&Nic> {
        self.nics
            .iter()
            .find(|n| n.addresses.iter().any(|a| a.addr == ip))
    }

    /// The NIC whose subnet holds the peer `ip` (longest prefix wins):
    /// the NIC a connection to that peer leaves through when no router is
    /// involved.
    pub fn nic_for_peer(&self, ip: IpAddr) -> Option<&Nic> {
        self.nics
            .iter()
            .flat_map(|n| n.addresses.iter().map(move |a| (n, a)))
            .filter(|(_, a)| a.contains(ip))
            .max_by_key(|(_, a)| a.prefix_len)
            .map(|(n, _)| n)
    }

    /// The mount holding absolute `path` (lexical: no symlink resolution, see
    /// [`Topology::device_for_local_path`]). The longest mount point that is a
    /// component-wise prefix wins; on ties the later (top) mount wins.
    pub fn mount_for_path(&self, path: &Path) -> Option<&Mount> {
        let path = normalize(path)?;
        let mut best: Option<&Mount> = None;
        for m in &self.mounts {
            if path.starts_with(&m.mount_point) {
                let longer = best.is_none_or(|b| {
                    m.mount_point.components().count() >= b.mount_point.components().count()
                });
                if longer {
                    best = Some(m);
                }
            }
        }
        best
    }

    /// The device holding absolute `path`; partitions map to their disk,
    /// tmpfs/overlay and the like to a pseudo device. None for kernel file
    /// systems and unknown paths. Pure: never touches the file system.
    pub fn device_for_path(&self, path: &Path) -> Option<&BlockDevice> {
        let m = self.mount_for_path(path)?;
        self.device(m.device.as_deref()?)
    }

    /// Like [`Topology::device_for_path`] but for a path on this machine:
    /// resolves symlinks in the longest existing ancestor first (so a file
    /// that does not exist yet, like a copy destination, still resolves).
    pub fn device_for_local_path(&self, path: &Path) -> Option<&BlockDevice> {
        let abs = if path.is_absolute() {
            path.to_path_buf()
        } else {
            std::env::current_dir().ok()?.join(path)
        };
        let mut existing = abs.clone();
        let mut rest = Vec::new();
        while std::fs::symlink_metadata(&existing).is_err() {
            rest.push(existing.file_name()?.to_os_string());
            if !existing.pop() {
                break;
            }
        }
        let mut resolved = std::fs::canonicalize(&existing).unwrap_or(existing);
        for part in rest.iter().rev() {
            resolved.push(part);
        }
        self.device_for_path(&resolved)
    }
}

/// Lexical normalisation of an absolute path ("." and ".." resolved).
fn normalize(path: &Path) -> Option<PathBuf> {
    if !path.is_absolute() {
        return None;
    }
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(mp: &str, dev: Option<&str>) -> Mount {
        Mount {
            mount_point: mp.into(),
            fs_type: "ext4".into(),
            source: String::new(),
            device: dev.map(String::from),
            partition: None,
        }
    }

    fn dev(name: &str, kind: DeviceKind) -> BlockDevice {
        BlockDevice {
            name: name.into(),
            kind,
            rotational: false,
            numa_node: None,
            size_bytes: 0,
            mounts: vec![],
            partitions: vec![],
            slaves: vec![],
            driver: None,
            pci_slot: None,
        }
    }

    fn topo() -> Topology {
        Topology {
            numa_synthetic: false,
            nodes: vec![],
            nics: vec![],
            block_devices: vec![dev("sda", DeviceKind::Hdd), dev("sdb", DeviceKind::Ssd)],
            pseudo_devices: vec![dev("tmpfs:/data/tmp", DeviceKind::Memory)],
            mounts: vec![
                mount("/", Some("sda")),
                mount("/data", Some("sdb")),
                mount("/data/tmp", Some("tmpfs:/data/tmp")),
                mount("/proc", None),
            ],
        }
    }

    #[test]
    fn longest_component_prefix_wins() {
        let t = topo();
        let name = |p: &str| t.device_for_path(Path::new(p)).map(|d| d.name.clone());
        assert_eq!(name("/data/x/y").as_deref(), Some("sdb"));
        assert_eq!(name("/data").as_deref(), Some("sdb"));
        // "/database" is not under "/data".
        assert_eq!(name("/database/f").as_deref(), Some("sda"));
        assert_eq!(name("/data/tmp/f").as_deref(), Some("tmpfs:/data/tmp"));
        assert_eq!(name("/data/tmp/../f").as_deref(), Some("sdb"));
        assert_eq!(name("/proc/self"), None);
        assert_eq!(name("relative/path"), None);
    }

    #[test]
    fn later_mount_on_same_point_shadows_earlier() {
        let mut t = topo();
        t.mounts.push(mount("/data", Some("sda")));
        assert_eq!(t.device_for_path(Path::new("/data/f")).unwrap().name, "sda");
    }

    #[test]
    fn subnet_matching() {
        let a = NicAddr {
            addr: "10.1.2.3".parse().unwrap(),
            prefix_len: 24,
        };
        assert!(a.contains("10.1.2.200".parse().unwrap()));
        assert!(!a.contains("10.1.3.1".parse().unwrap()));
        assert!(!a.contains("::1".parse().unwrap()));
        let b = NicAddr {
            addr: "fd00::2".parse().unwrap(),
            prefix_len: 64,
        };
        assert!(b.contains("fd00::99".parse().unwrap()));
        assert!(!b.contains("fd01::2".parse().unwrap()));
        let all = NicAddr {
            addr: "0.0.0.0".parse().unwrap(),
            prefix_len: 0,
        };
        assert!(all.contains("8.8.8.8".parse().unwrap()));
        let host = NicAddr {
            addr: "10.0.0.1".parse().unwrap(),
            prefix_len: 32,
        };
        assert!(host.contains("10.0.0.1".parse().unwrap()));
        assert!(!host.contains("10.0.0.2".parse().unwrap()));
    }
}
