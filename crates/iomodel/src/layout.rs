//! Minimal host layout reader: NUMA nodes and their CPUs, packages, last-level
//! cache size, and which nodes have I/O devices attached.
//!
//! Deliberately small and independent of `ramsys-topo`: Algorithm 1 (seed 001
//! sec. V) only needs the cores of each node (thread count and pinning), the
//! package grouping (class 1 = local node + same-package nodes, seed 001
//! sec. II-A "neighbor"), the LLC size (buffers >= 4x LLC, seed 001 sec. III-B)
//! and the nodes attached to I/O hubs (the default targets, seed 000 sec. 4.3.2).

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

/// Fallback LLC size when sysfs does not describe caches.
pub const DEFAULT_LLC_BYTES: u64 = 32 << 20;

/// One NUMA node and the CPUs attached to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeLayout {
    pub id: u32,
    pub cpus: Vec<u32>,
}

/// What Algorithm 1 needs to know about the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostLayout {
    /// Nodes sorted by id.
    pub nodes: Vec<NodeLayout>,
    /// Node ids grouped by CPU package (socket), packages sorted by package id.
    pub packages: Vec<Vec<u32>>,
    /// Largest cache size seen (bytes).
    pub llc_bytes: u64,
    /// Nodes with a PCI device that carries a network interface or block device.
    pub io_nodes: Vec<u32>,
}

/// Parse a Linux cpulist/nodelist such as `0-3,8-11,16`.
pub fn parse_list(s: &str) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some((a, b)) = part.split_once('-') {
            let (a, b): (u32, u32) = (a.trim().parse()?, b.trim().parse()?);
            if b < a {
                bail!("bad range {part:?}");
            }
            out.extend(a..=b);
        } else {
            out.push(
                part.parse()
                    .with_context(|| format!("bad list item {part:?}"))?,
            );
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Parse sysfs cache sizes such as `107520K`, `2M`, `512` (the kernel's
/// K is 1024, as in ramsys_units' rule).
fn parse_size(s: &str) -> Option<u64> {
    ramsys_units::parse_size(s).ok()
}

fn read_trim(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

/// Numeric suffix of names like `node3` / `cpu12`.
fn suffix_id(name: &str, prefix: &str) -> Option<u32> {
    name.strip_prefix(prefix)?.parse().ok()
}

impl HostLayout {
    /// Read the layout below `sysroot` (use `/` for the running host). A tree
    /// without `sys/devices/system/node` is treated as a single node 0 owning
    /// every CPU.
    pub fn from_sysfs(sysroot: &Path) -> Result<Self> {
        let sys = sysroot.join("sys/devices/system");
        let mut nodes = Vec::new();
        if let Ok(rd) = fs::read_dir(sys.join("node")) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(id) = suffix_id(&name, "node") else {
                    continue;
                };
                let cpus = match read_trim(&e.path().join("cpulist")) {
                    Some(s) => parse_list(&s).with_context(|| format!("{name}/cpulist"))?,
                    None => Vec::new(),
                };
                nodes.push(NodeLayout { id, cpus });
            }
        }
        if nodes.is_empty() {
            nodes.push(NodeLayout {
                id: 0,
                cpus: all_cpus(&sys),
            });
        }
        nodes.sort_by_key(|n| n.id);

        // Package of a node = physical_package_id of its first CPU; a node
        // without that information (e.g. CPU-less) is a package of its own.
        let mut pkgs: BTreeMap<i64, Vec<u32>> = BTreeMap::new();
        for n in &nodes {
            let pkg = n
                .cpus
                .first()
                .and_then(|c| {
                    read_trim(&sys.join(format!("cpu/cpu{c}/topology/physical_package_id")))
                })
                .and_then(|s| s.parse::<i64>().ok());
            let key = pkg.unwrap_or(-(n.id as i64) - 1);
            pkgs.entry(key).or_default().push(n.id);
        }
        let mut packages: Vec<Vec<u32>> = pkgs.into_values().collect();
        packages.sort_by_key(|p| p[0]);

        let llc_bytes = llc_bytes(&sys, &nodes).unwrap_or(DEFAULT_LLC_BYTES);
        let single = nodes.len() == 1;
        let io_nodes = io_nodes(sysroot, single, nodes[0].id);
        Ok(HostLayout {
            nodes,
            packages,
            llc_bytes,
            io_nodes,
        })
    }

    /// A synthetic fixture layout: `n_nodes` nodes of `cores` CPUs each,
    /// `per_package` consecutive nodes per package.
    pub fn synthetic(
        n_nodes: u32,
        cores: u32,
        per_package: u32,
        llc_bytes: u64,
        io_nodes: Vec<u32>,
    ) -> Self {
        let nodes = (0..n_nodes)
            .map(|id| NodeLayout {
                id,
                cpus: (id * cores..(id + 1) * cores).collect(),
            })
            .collect();
        let per = per_package.max(1);
        let packages = (0..n_nodes.div_ceil(per))
            .map(|p| (p * per..((p + 1) * per).min(n_nodes)).collect())
            .collect();
        HostLayout {
            nodes,
            packages,
            llc_bytes,
            io_nodes,
        }
    }

    pub fn node(&self, id: u32) -> Option<&NodeLayout> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// Node owning `cpu`.
    pub fn node_of_cpu(&self, cpu: u32) -> Option<u32> {
        self.nodes
            .iter()
            .find(|n| n.cpus.contains(&cpu))
            .map(|n| n.id)
    }

    pub fn node_ids(&self) -> Vec<u32> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    /// Default characterization targets: every node with an I/O device and
    /// CPUs, else every node with CPUs (seed 000 sec. 4.3.2: "nodes that are
    /// directly attached to I/O hubs, or specified by users").
    pub fn default_targets(&self) -> Vec<u32> {
        let with_cpus = |id: &u32| self.node(*id).is_some_and(|n| !n.cpus.is_empty());
        let io: Vec<u32> = self.io_nodes.iter().copied().filter(with_cpus).collect();
        if !io.is_empty() {
            return io;
        }
        self.node_ids().into_iter().filter(with_cpus).collect()
    }
}

fn all_cpus(sys: &Path) -> Vec<u32> {
    if let Some(list) = read_trim(&sys.join("cpu/online")).and_then(|s| parse_list(&s).ok()) {
        if !list.is_empty() {
            return list;
        }
    }
    let mut v: Vec<u32> = fs::read_dir(sys.join("cpu"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| suffix_id(&e.file_name().to_string_lossy(), "cpu"))
                .collect()
        })
        .unwrap_or_default();
    if v.is_empty() {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        v = (0..n).collect();
    }
    v.sort_unstable();
    v
}

/// Largest cache reported for the first CPU of any node.
fn llc_bytes(sys: &Path, nodes: &[NodeLayout]) -> Option<u64> {
    let mut best = None;
    for cpu in nodes.iter().filter_map(|n| n.cpus.first()) {
        let Ok(rd) = fs::read_dir(sys.join(format!("cpu/cpu{cpu}/cache"))) else {
            continue;
        };
        for e in rd.flatten() {
            if !e.file_name().to_string_lossy().starts_with("index") {
                continue;
            }
            if let Some(sz) = read_trim(&e.path().join("size")).and_then(|s| parse_size(&s)) {
                best = best.max(Some(sz));
            }
        }
    }
    best
}

/// Does a PCI device directory carry a NIC or block device (directly, as
/// `net/`/`block/`/`nvme/`, or one level down, e.g. `virtio1/block`)?
fn has_io_child(dev: &Path) -> bool {
    const KINDS: [&str; 3] = ["net", "block", "nvme"];
    if KINDS.iter().any(|k| dev.join(k).is_dir()) {
        return true;
    }
    fs::read_dir(dev)
        .map(|rd| {
            rd.flatten().any(|e| {
                let p = e.path();
                // Skip the `driver`/`subsystem`/`firmware_node` links back up the tree.
                let name = e.file_name().to_string_lossy().into_owned();
                !matches!(
                    name.as_str(),
                    "driver" | "subsystem" | "firmware_node" | "iommu_group"
                ) && p.is_dir()
                    && KINDS.iter().any(|k| p.join(k).is_dir())
            })
        })
        .unwrap_or(false)
}

fn io_nodes(sysroot: &Path, single: bool, only: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir(sysroot.join("sys/bus/pci/devices")) else {
        return out;
    };
    for e in rd.flatten() {
        let dev = e.path();
        if !has_io_child(&dev) {
            continue;
        }
        let node = read_trim(&dev.join("numa_node")).and_then(|s| s.parse::<i64>().ok());
        match node {
            Some(n) if n >= 0 => out.push(n as u32),
            // -1 = firmware did not say; only meaningful on a one-node host.
            _ if single => out.push(only),
            _ => {}
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::PathBuf;

    fn put(root: &Path, rel: &str, content: &str) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, content).unwrap();
    }

    /// Writes a sysfs fixture: `nodes` nodes of `cores` CPUs, two nodes per
    /// package, NICs on `nic_nodes`, and one NIC with numa_node -1.
    pub(crate) fn fixture(root: &Path, nodes: u32, cores: u32, nic_nodes: &[u32]) -> PathBuf {
        for n in 0..nodes {
            let lo = n * cores;
            put(
                root,
                &format!("sys/devices/system/node/node{n}/cpulist"),
                &format!("{}-{}\n", lo, lo + cores - 1),
            );
            for c in lo..lo + cores {
                put(
                    root,
                    &format!("sys/devices/system/cpu/cpu{c}/topology/physical_package_id"),
                    &format!("{}\n", n / 2),
                );
                put(
                    root,
                    &format!("sys/devices/system/cpu/cpu{c}/cache/index3/size"),
                    "5120K\n",
                );
            }
        }
        for (i, n) in nic_nodes.iter().enumerate() {
            let d = format!("sys/bus/pci/devices/0000:0{i}:00.0");
            put(root, &format!("{d}/numa_node"), &format!("{n}\n"));
            fs::create_dir_all(root.join(format!("{d}/net/eth{i}"))).unwrap();
        }
        // A device with unknown locality and a non-I/O device: both ignored.
        put(root, "sys/bus/pci/devices/0000:10:00.0/numa_node", "-1\n");
        fs::create_dir_all(root.join("sys/bus/pci/devices/0000:10:00.0/virtio3/block/vdb"))
            .unwrap();
        put(root, "sys/bus/pci/devices/0000:11:00.0/numa_node", "2\n");
        root.to_path_buf()
    }

    #[test]
    fn parses_lists_and_sizes() {
        assert_eq!(
            parse_list("0-3,8,10-11\n").unwrap(),
            vec![0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(parse_list("").unwrap(), Vec::<u32>::new());
        assert!(parse_list("3-1").is_err());
        assert_eq!(parse_size("107520K"), Some(107520 << 10));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("512"), Some(512));
    }

    #[test]
    fn reads_eight_node_fixture() {
        let dir = tempfile::tempdir().unwrap();
        let root = fixture(dir.path(), 8, 4, &[7, 7]);
        let l = HostLayout::from_sysfs(&root).unwrap();
        assert_eq!(l.nodes.len(), 8);
        assert_eq!(l.node(7).unwrap().cpus, vec![28, 29, 30, 31]);
        assert_eq!(
            l.packages,
            vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]
        );
        assert_eq!(l.llc_bytes, 5 << 20);
        // -1 device is ignored on a multi-node host; node-2 device has no I/O child.
        assert_eq!(l.io_nodes, vec![7]);
        assert_eq!(l.default_targets(), vec![7]);
        assert_eq!(l.node_of_cpu(13), Some(3));
    }

    #[test]
    fn no_node_dir_means_one_node() {
        let dir = tempfile::tempdir().unwrap();
        put(dir.path(), "sys/devices/system/cpu/online", "0-3\n");
        put(
            dir.path(),
            "sys/bus/pci/devices/0000:00:02.0/numa_node",
            "-1\n",
        );
        fs::create_dir_all(
            dir.path()
                .join("sys/bus/pci/devices/0000:00:02.0/virtio1/block"),
        )
        .unwrap();
        let l = HostLayout::from_sysfs(dir.path()).unwrap();
        assert_eq!(
            l.nodes,
            vec![NodeLayout {
                id: 0,
                cpus: vec![0, 1, 2, 3]
            }]
        );
        assert_eq!(l.packages, vec![vec![0]]);
        assert_eq!(l.llc_bytes, DEFAULT_LLC_BYTES);
        assert_eq!(l.io_nodes, vec![0]);
    }

    #[test]
    fn default_targets_fall_back_to_all_nodes() {
        let l = HostLayout::synthetic(4, 2, 1, 1 << 20, vec![]);
        assert_eq!(l.default_targets(), vec![0, 1, 2, 3]);
        assert_eq!(l.packages, vec![vec![0], vec![1], vec![2], vec![3]]);
    }

    #[test]
    fn reads_this_host() {
        let l = HostLayout::from_sysfs(Path::new("/")).unwrap();
        assert!(!l.nodes.is_empty());
        assert!(l.nodes.iter().any(|n| !n.cpus.is_empty()));
        assert!(l.llc_bytes > 0);
        assert!(!l.default_targets().is_empty());
    }
}
