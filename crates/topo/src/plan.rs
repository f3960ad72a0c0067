//! Placement decisions: pure functions from a [`Topology`] and the devices of
//! a transfer to CPU sets and memory nodes.
//!
//! - Storage threads (readers at the source, writers at the sink) run on the
//!   storage device's node (seed 000 sec. 6.1.2: "all threads belonging to
//!   the same I/O device are ... bounded to ... the same NUMA node to which
//!   the I/O device is attached").
//! - Network threads (senders/receivers) and the task's buffers go to the
//!   NIC's node (seed 000 sec. 6.1.5: buffers "pinned on to the NUMA node
//!   that directly connects the targeted network interface because TCP/IP
//!   incurs a more intensive protocol processing load than storage I/O";
//!   seed 002 sec. 3: a channel's buffers and threads live with its NIC).
//! - A local copy (no NIC) keeps its buffers with the source device.
//! - An unknown node means all CPUs and no memory binding, and the decision
//!   says so rather than silently using node 0.

use crate::model::{BlockDevice, DeviceKind, Nic, Topology};
use crate::placement::{NodeRegion, Placer};
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io;
use std::str::FromStr;

/// `ramsys cp --numa off|auto|NODE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NumaMode {
    /// Leave everything to the OS (the comparison baseline).
    Off,
    /// Follow the devices.
    Auto,
    /// Everything on one node.
    Node(u32),
}

impl FromStr for NumaMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(NumaMode::Off),
            "auto" => Ok(NumaMode::Auto),
            n => n
                .parse()
                .map(NumaMode::Node)
                .map_err(|_| format!("expected off, auto or a node number, got {n:?}")),
        }
    }
}

impl fmt::Display for NumaMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NumaMode::Off => f.write_str("off"),
            NumaMode::Auto => f.write_str("auto"),
            NumaMode::Node(n) => write!(f, "{n}"),
        }
    }
}

/// Where one class of threads or one buffer pool goes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// None: not bound to a node.
    pub node: Option<u32>,
    /// CPUs to pin to (all CPUs when `node` is None).
    pub cpus: Vec<usize>,
    /// Why, in words, for `--explain`.
    pub reason: String,
}

impl Placement {
    fn on(topo: &Topology, node: u32, reason: String) -> Placement {
        let cpus = topo.node(node).map(|n| n.cpus.clone()).unwrap_or_default();
        if cpus.is_empty() {
            // A memory-only node: memory there, threads anywhere.
            return Placement {
                node: Some(node),
                cpus: topo.all_cpus(),
                reason: format!("{reason}; node {node} has no CPUs, threads unpinned"),
            };
        }
        Placement {
            node: Some(node),
            cpus,
            reason,
        }
    }

    fn anywhere(topo: &Topology, reason: String) -> Placement {
        Placement {
            node: None,
            cpus: topo.all_cpus(),
            reason,
        }
    }
}

/// Which end of the transfer this host is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// Readers + senders.
    Source,
    /// Receivers + writers.
    Sink,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferPlan {
    pub role: Role,
    pub mode: NumaMode,
    /// Readers (source) or writers (sink).
    pub storage_threads: Placement,
    /// Senders (source) or receivers (sink); None for a local copy.
    pub network_threads: Option<Placement>,
    pub buffers: Placement,
}

fn describe_dev(d: &BlockDevice) -> String {
    format!("{} ({})", d.name, d.kind.as_str())
}

/// Decides placement for one end of a transfer. `storage` is the device the
/// data is read from (source) or written to (sink), `nic` the interface the
/// stream uses (None for a local copy). Fails only for a `NumaMode::Node`
/// that does not exist.
pub fn plan_transfer(
    topo: &Topology,
    role: Role,
    storage: Option<&BlockDevice>,
    nic: Option<&Nic>,
    mode: NumaMode,
) -> Result<TransferPlan> {
    let (storage_word, net_word) = match role {
        Role::Source => ("readers", "senders"),
        Role::Sink => ("writers", "receivers"),
    };
    let plan = |storage_threads, network_threads, buffers| TransferPlan {
        role,
        mode,
        storage_threads,
        network_threads,
        buffers,
    };
    match mode {
        NumaMode::Off => {
            let off = || Placement::anywhere(topo, "--numa off: placement left to the OS".into());
            Ok(plan(off(), nic.map(|_| off()), off()))
        }
        NumaMode::Node(n) => {
            if topo.node(n).is_none() {
                let have: Vec<u32> = topo.nodes.iter().map(|n| n.id).collect();
                bail!("--numa {n}: no such node (nodes: {have:?})");
            }
            let on = |what: &str| Placement::on(topo, n, format!("--numa {n}: {what} forced"));
            Ok(plan(
                on(storage_word),
                nic.map(|_| on(net_word)),
                on("buffers"),
            ))
        }
        NumaMode::Auto => {
            let storage_threads = match storage {
                None => Placement::anywhere(topo, "no storage device known: unpinned".into()),
                Some(d) => match d.numa_node {
                    Some(n) => Placement::on(
                        topo,
                        n,
                        format!("{storage_word} on {}'s node {n}", describe_dev(d)),
                    ),
                    None => Placement::anywhere(
                        topo,
                        format!(
                            "{}: NUMA node unknown, {storage_word} unpinned",
                            describe_dev(d)
                        ),
                    ),
                },
            };
            let Some(nic) = nic else {
                // Local copy: buffers live with the storage threads that
                // fill and drain them.
                let buffers = Placement {
                    reason: match storage_threads.node {
                        Some(n) => {
                            format!("local copy: buffers with the storage threads on node {n}")
                        }
                        None => "local copy, storage node unknown: buffers not bound".into(),
                    },
                    ..storage_threads.clone()
                };
                return Ok(plan(storage_threads, None, buffers));
            };
            let (network_threads, buffers) = match nic.numa_node {
                Some(n) => (
                    Placement::on(
                        topo,
                        n,
                        format!("{net_word} on NIC {}'s node {n}", nic.name),
                    ),
                    Placement::on(
                        topo,
                        n,
                        format!(
                            "buffers on NIC {}'s node {n} (seed 000 sec. 6.1.5)",
                            nic.name
                        ),
                    ),
                ),
                None => {
                    let why = if nic.is_virtual {
                        format!("NIC {} is virtual (no device)", nic.name)
                    } else {
                        format!("NIC {}: NUMA node unknown", nic.name)
                    };
                    (
                        Placement::anywhere(topo, format!("{why}, {net_word} unpinned")),
                        Placement::anywhere(topo, format!("{why}, buffers not bound")),
                    )
                }
            };
            Ok(plan(storage_threads, Some(network_threads), buffers))
        }
    }
}

/// Threads of a device's reader/writer pool by device type (seed 000 sec.
/// 6.1.2: one thread for devices that prefer sequential access (HDD),
/// several for SSDs and memory). `capacity_mbps` scales the random-access
/// kinds: one more thread per 10 Gbit/s, capped at `max`.
pub fn storage_pool_size(kind: DeviceKind, capacity_mbps: Option<u64>, max: usize) -> usize {
    let max = max.max(1);
    let base = match kind {
        DeviceKind::Hdd => return 1,
        DeviceKind::Virtual => 2,
        DeviceKind::Ssd => 2,
        DeviceKind::Nvme | DeviceKind::Memory => 4,
    };
    let extra = capacity_mbps.map_or(0, |c| (c / 10_000) as usize);
    (base + extra).min(max)
}

/// Applies a placement for the calling thread: pins it to the placement's
/// CPUs (all CPUs when unbound, undoing any earlier pin).
pub fn pin_for(placer: &dyn Placer, p: &Placement) -> io::Result<()> {
    if p.cpus.is_empty() {
        return Ok(());
    }
    placer.pin(&p.cpus)
}

/// Allocates `bytes` of buffer memory as the plan says.
pub fn alloc_buffers(
    placer: &dyn Placer,
    plan: &TransferPlan,
    bytes: usize,
) -> io::Result<NodeRegion> {
    placer.alloc(bytes, plan.buffers.node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numa_mode_parses() {
        assert_eq!("off".parse::<NumaMode>().unwrap(), NumaMode::Off);
        assert_eq!("auto".parse::<NumaMode>().unwrap(), NumaMode::Auto);
        assert_eq!("7".parse::<NumaMode>().unwrap(), NumaMode::Node(7));
        assert!("-1".parse::<NumaMode>().is_err());
        assert!("seven".parse::<NumaMode>().is_err());
        assert_eq!(NumaMode::Node(3).to_string(), "3");
    }

    #[test]
    fn pool_sizes_follow_device_type() {
        assert_eq!(storage_pool_size(DeviceKind::Hdd, Some(100_000), 16), 1);
        assert_eq!(storage_pool_size(DeviceKind::Ssd, None, 16), 2);
        assert_eq!(storage_pool_size(DeviceKind::Ssd, Some(20_000), 16), 4);
        assert_eq!(storage_pool_size(DeviceKind::Memory, Some(400_000), 8), 8);
        assert_eq!(storage_pool_size(DeviceKind::Nvme, None, 0), 1);
    }
}
