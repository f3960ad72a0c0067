//! Reads the hardware model from sysfs and procfs (seed 000 sec. 6.1.2, the
//! INI layer's resource profiling). Every path is taken relative to a sysroot
//! so captured or hand-built trees stand in for a machine.
//!
//! One file per job (issue 37): `mod.rs` the entry point, sysroot reads,
//! NUMA nodes with their CPUs and memory, and what a class device's `device`
//! link tells; `nics.rs` network interfaces, their IRQs and addresses;
//! `storage.rs` block devices and mounts; `tests.rs` the parsers on captured
//! text.

use crate::model::*;
use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

mod nics;
mod storage;

use nics::{attach_addresses, read_nics};
use storage::{read_block_devices, read_mounts};

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

#[cfg(test)]
mod tests;
