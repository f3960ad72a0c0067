//! Hardware-aware placement for one engine: which device a transfer
//! touches, which NUMA node its threads and buffers go to, and the
//! scheduler's plan. Glue between the hardware model (`ramsys-topo`), the
//! I/O model (`ramsys-iomodel`), the MSMRAP scheduler (`ramsys-sched`) and
//! the resource pools.
//!
//! Default placement follows seed 000 sec. 6.1.5: storage threads on the
//! storage device's node, network threads and buffers on the NIC's node.

use std::net::{IpAddr, ToSocketAddrs};
use std::path::Path;

use ramsys_sched::{
    Device as SDevice, DeviceKind as SKind, Host, Instance, IoModel, Node, Path as SPath, Request,
};
use ramsys_topo::{BlockDevice, DeviceKind, Nic, NumaMode, Role, Topology, TransferPlan};

use crate::data::resources::ResourceConfig;

/// "NAME (KIND, node N)" of a storage device, "unknown" without one: how
/// placements are logged and explained.
pub fn describe_storage(d: Option<&BlockDevice>) -> String {
    d.map(|d| {
        format!(
            "{} ({}, node {})",
            d.name,
            d.kind.as_str(),
            d.numa_node.map_or("unknown".into(), |x| x.to_string())
        )
    })
    .unwrap_or_else(|| "unknown".into())
}

/// "NAME (node N)" of a NIC, "unknown" without one.
pub fn describe_nic(n: Option<&Nic>) -> String {
    n.map(|n| {
        format!(
            "{} (node {})",
            n.name,
            n.numa_node.map_or("unknown".into(), |x| x.to_string())
        )
    })
    .unwrap_or_else(|| "unknown".into())
}

/// The block device holding a local path (live system: resolves mounts of
/// the real file system; a fixture tree: lexical match).
pub fn storage_for_path<'a>(
    topo: &'a Topology,
    path: &Path,
    live: bool,
) -> Option<&'a BlockDevice> {
    if live {
        topo.device_for_local_path(path)
    } else {
        topo.device_for_path(path)
    }
}

/// The NIC a connection to `addr` (HOST:PORT) leaves through: the NIC owning
/// a loopback or local address, else the one whose subnet holds the peer.
pub fn nic_for_addr<'a>(topo: &'a Topology, addr: &str) -> Option<&'a Nic> {
    let ip: IpAddr = addr.to_socket_addrs().ok()?.next()?.ip();
    if ip.is_loopback() {
        return topo.nic("lo").or_else(|| topo.nic_for_addr(ip));
    }
    topo.nic_for_addr(ip).or_else(|| topo.nic_for_peer(ip))
}

/// Nominal capacity of a device class, Gbit/s, when nothing better is known.
fn storage_gbps(kind: DeviceKind) -> f64 {
    match kind {
        DeviceKind::Hdd => 1.2,
        DeviceKind::Ssd => 4.0,
        DeviceKind::Nvme => 20.0,
        DeviceKind::Memory => 50.0,
        DeviceKind::Virtual => 8.0,
    }
}

/// Convert the measured I/O model into the scheduler's per-path table:
/// sched `read[i][k]` (device on node k, memory/CPU node i) takes the
/// model's device-read matrix `[k][i]`; single-thread bandwidth is the
/// aggregate divided by the threads that produced it.
pub fn sched_model(topo: &Topology, m: &ramsys_iomodel::Model) -> IoModel {
    let n = topo.nodes.len();
    let dist: Vec<Vec<u32>> = topo.nodes.iter().map(|x| x.distances.clone()).collect();
    let mut base = IoModel::from_distances(n, Some(&dist));
    let threads_of = |k: usize| topo.nodes.get(k).map(|x| x.cpus.len().max(1)).unwrap_or(1) as f64;
    for (table, matrix) in [
        (&mut base.read, &m.read_matrix_gbps),
        (&mut base.write, &m.write_matrix_gbps),
    ] {
        for (k, row) in matrix.iter().enumerate().take(n) {
            for (i, v) in row.iter().enumerate().take(n) {
                if let Some(g) = v {
                    table[i][k] = SPath {
                        single_gbps: g / threads_of(k),
                        max_gbps: *g,
                    };
                }
            }
        }
    }
    base
}

/// Per-device capacities (Gbit/s) the user states in `serve --config`,
/// overriding what discovery guesses (seed 000 sec. 6.1.2, user-assisted
/// abstraction).
pub type Capacities = std::collections::BTreeMap<String, f64>;

fn sched_host(topo: &Topology, caps: &Capacities) -> Host {
    let cap = |name: &str, guess: f64| caps.get(name).copied().unwrap_or(guess);
    let mut devices = Vec::new();
    for d in &topo.block_devices {
        devices.push(SDevice {
            name: d.name.clone(),
            kind: SKind::Storage,
            node: d.numa_node,
            capacity_gbps: cap(&d.name, storage_gbps(d.kind)),
        });
    }
    for p in &topo.pseudo_devices {
        devices.push(SDevice {
            name: p.name.clone(),
            kind: SKind::Storage,
            node: p.numa_node,
            capacity_gbps: cap(&p.name, storage_gbps(p.kind)),
        });
    }
    for nic in &topo.nics {
        let guess = nic
            .speed_mbps
            .map(|m| m as f64 / 1000.0)
            .unwrap_or(if nic.is_virtual { 40.0 } else { 10.0 });
        devices.push(SDevice {
            name: nic.name.clone(),
            kind: SKind::Nic,
            node: nic.numa_node,
            capacity_gbps: cap(&nic.name, guess),
        });
    }
    Host {
        nodes: topo
            .nodes
            .iter()
            .map(|n| Node {
                id: n.id,
                cpus: n.cpus.clone(),
                busy_cpus: Vec::new(),
            })
            .collect(),
        devices,
        distances: Some(topo.nodes.iter().map(|x| x.distances.clone()).collect()),
    }
}

/// The scheduler instance for one transfer from device `source` to `sink`
/// (storage or NIC names from the topology).
pub fn sched_instance(
    topo: &Topology,
    model: Option<&ramsys_iomodel::Model>,
    source: &str,
    sink: &str,
    block: u64,
) -> Instance {
    sched_instance_with(topo, model, &Capacities::new(), source, sink, block)
}

/// [`sched_instance`] with capacity overrides from the daemon's config.
pub fn sched_instance_with(
    topo: &Topology,
    model: Option<&ramsys_iomodel::Model>,
    caps: &Capacities,
    source: &str,
    sink: &str,
    block: u64,
) -> Instance {
    let params = ramsys_sched::Params {
        block_bytes: block,
        ..Default::default()
    };
    Instance {
        host: sched_host(topo, caps),
        model: model.map(|m| sched_model(topo, m)),
        requests: vec![Request {
            source: source.to_string(),
            sink: sink.to_string(),
            bytes: None,
        }],
        params,
    }
}

/// Pin pools and place buffers as `plan` says (mode off: leave both to
/// the OS).
pub fn apply(plan: &TransferPlan, mut cfg: ResourceConfig) -> ResourceConfig {
    if plan.mode == NumaMode::Off {
        return cfg;
    }
    if plan.storage_threads.node.is_some() {
        cfg.storage_cpus = plan.storage_threads.cpus.clone();
    }
    if let Some(net) = &plan.network_threads {
        if net.node.is_some() {
            cfg.net_cpus = net.cpus.clone();
        }
    }
    cfg.buffer_node = plan.buffers.node;
    cfg
}

/// Placement of one end of a transfer on this host.
pub fn plan_end(
    topo: &Topology,
    role: Role,
    storage: Option<&BlockDevice>,
    nic: Option<&Nic>,
    mode: NumaMode,
) -> anyhow::Result<TransferPlan> {
    ramsys_topo::plan_transfer(topo, role, storage, nic, mode)
}
