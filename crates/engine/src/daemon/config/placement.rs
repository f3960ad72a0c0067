//! The serving daemon's placement (seed 000 sec. 6.1.2): from its config
//! ([`DaemonConfig`]) and the host topology, which device and NIC it
//! serves, how big its buffer pools are and on which NUMA node they live,
//! and how many threads each task gets. Split from the config file's
//! parser (issue 37).

use std::net::{IpAddr, ToSocketAddrs};
use std::path::Path;

use ramsys_topo::{BlockDevice, Nic, NumaMode, Role, Topology, TransferPlan};

use super::{DaemonConfig, Purpose};
use std::collections::BTreeMap;

use crate::daemon::placement::{
    apply, plan_end, sched_instance_with, storage_for_path, Capacities,
};
use crate::data::resources::ResourceConfig;

/// What the command line says, before the config file and the hardware
/// are consulted. `None` = not given (so the config or the plan decides).
#[derive(Clone, Debug, Default)]
pub struct ServeInputs {
    pub numa: Option<NumaMode>,
    pub memory: Option<u64>,
    pub max_streams: Option<usize>,
    pub readers: Option<usize>,
    pub writers: Option<usize>,
    pub buffer_size: usize,
}

/// The daemon's hardware view and the placement it chose at start; kept
/// for per-task plans (issue 7).
#[derive(Clone, Debug)]
pub struct DaemonPlacement {
    pub topo: Topology,
    pub live: bool,
    pub mode: NumaMode,
    pub model: Option<ramsys_iomodel::Model>,
    pub capacities: Capacities,
    /// Storage threads configured per device (`[devices.X] threads`).
    pub device_threads: BTreeMap<String, usize>,
    /// The export root's block device and the listen NIC.
    pub storage: Option<String>,
    pub nic: Option<String>,
    /// The start-time placement (mode off: None).
    pub plan: Option<TransferPlan>,
    /// The resulting pool configuration.
    pub resources: ResourceConfig,
    /// One line per decision, for the log and `ramsys status`.
    pub lines: Vec<String>,
}

fn listen_ip(listen: &str) -> Option<IpAddr> {
    listen.to_socket_addrs().ok()?.next().map(|a| a.ip())
}

/// Decide the daemon's placement: the root's storage device, the NIC it
/// listens on (a wildcard address: the first physical, up NIC of purpose
/// data), pools pinned by [`plan_end`] (storage threads on the storage
/// node, network threads and buffers on the NIC's node, seed 000 6.1.5)
/// and sized by, in order: the command line, the config (per device, then
/// global), the device type (seed 000 6.1.2) and the scheduler's plan.
pub fn daemon_placement(
    topo: Topology,
    live: bool,
    cfg: &DaemonConfig,
    cli: &ServeInputs,
    root: &Path,
    listen: &str,
) -> anyhow::Result<DaemonPlacement> {
    let mode = cli.numa.or(cfg.numa).unwrap_or(NumaMode::Auto);
    let model = match &cfg.model {
        Some(p) => Some(ramsys_iomodel::load_model(p)?),
        None => None,
    };
    let capacities = cfg.capacities();
    let mut lines = Vec::new();
    let storage = storage_for_path(&topo, root, live).cloned();
    let nic = listening_nic(&topo, cfg, listen);
    if let Some(n) = &nic {
        if cfg.purpose(&n.name) == Purpose::Storage {
            lines.push(format!(
                "warning: listening on {} whose configured purpose is storage",
                n.name
            ));
        }
    }
    lines.push(describe_ends(
        storage.as_ref(),
        nic.as_ref(),
        mode,
        model.is_some(),
    ));

    // The scheduler's view of the root device <-> NIC path.
    let block = cli.buffer_size as u64;
    let sched = match (&storage, &nic) {
        (Some(s), Some(n)) => Some(ramsys_sched::plan(&sched_instance_with(
            &topo,
            model.as_ref(),
            &capacities,
            &s.name,
            &n.name,
            block,
        ))),
        _ => None,
    };
    let base = pool_sizes(
        cfg,
        cli,
        &capacities,
        storage.as_ref(),
        nic.as_ref(),
        sched.as_ref(),
    );
    let plan = if mode == NumaMode::Off {
        None
    } else {
        Some(plan_end(
            &topo,
            Role::Source,
            storage.as_ref(),
            nic.as_ref(),
            mode,
        )?)
    };
    let resources = match &plan {
        Some(p) => apply(p, base),
        None => base,
    };
    lines.extend(describe_pools(&resources, plan.as_ref(), sched.as_ref()));
    Ok(DaemonPlacement {
        device_threads: cfg
            .devices
            .iter()
            .filter_map(|(n, d)| d.threads.map(|t| (n.clone(), t)))
            .collect(),
        topo,
        live,
        mode,
        model,
        capacities,
        storage: storage.map(|d| d.name),
        nic: nic.map(|n| n.name),
        plan,
        resources,
        lines,
    })
}

/// The NIC the daemon listens on: the interface of its address (`lo` for
/// loopback), or for a wildcard address the first physical, up NIC whose
/// configured purpose is data; never one configured `ignore`.
fn listening_nic(topo: &Topology, cfg: &DaemonConfig, listen: &str) -> Option<Nic> {
    match listen_ip(listen) {
        Some(ip) if !ip.is_unspecified() => {
            if ip.is_loopback() {
                topo.nic("lo").or_else(|| topo.nic_for_addr(ip))
            } else {
                topo.nic_for_addr(ip)
            }
        }
        _ => topo
            .nics
            .iter()
            .filter(|n| cfg.purpose(&n.name) == Purpose::Data)
            .find(|n| !n.is_virtual && n.operstate.as_deref() != Some("down")),
    }
    .filter(|n| cfg.purpose(&n.name) != Purpose::Ignore)
    .cloned()
}

/// The placement's lines after the first: the pools and where they run,
/// why (the NUMA plan), and what the scheduler predicts.
fn describe_pools(
    resources: &ResourceConfig,
    plan: Option<&TransferPlan>,
    sched: Option<&ramsys_sched::Plan>,
) -> Vec<String> {
    let mut lines = vec![format!(
        "pools: readers {} writers {} (storage threads, CPUs {}), senders/receivers {} (CPUs {}), \
         buffers {} on {}",
        resources.readers,
        resources.writers,
        cpus_or_os(&resources.storage_cpus),
        resources.max_streams,
        cpus_or_os(&resources.net_cpus),
        ramsys_units::format_size(resources.memory as u64),
        resources
            .buffer_node
            .map_or("the heap (OS placement)".into(), |n| format!("node {n}")),
    )];
    if let Some(p) = plan {
        lines.push(format!("storage threads: {}", p.storage_threads.reason));
        if let Some(n) = &p.network_threads {
            lines.push(format!("network threads: {}", n.reason));
        }
        lines.push(format!("buffers: {}", p.buffers.reason));
    }
    if let Some(s) = sched {
        lines.push(format!(
            "scheduler: {:.1} Gbps predicted, bottleneck {}",
            s.predicted.gbps, s.predicted.bottleneck
        ));
    }
    lines
}

/// The placement's first line: storage device, NIC, NUMA mode.
fn describe_ends(
    storage: Option<&BlockDevice>,
    nic: Option<&Nic>,
    mode: NumaMode,
    model_loaded: bool,
) -> String {
    format!(
        "storage {} ; NIC {} ; numa {mode}{}",
        crate::daemon::placement::describe_storage(storage),
        crate::daemon::placement::describe_nic(nic),
        if model_loaded {
            ", I/O model loaded"
        } else {
            ""
        }
    )
}

/// Pool sizes, each from the first that says: the command line, the
/// config (per device, then global), the device type (seed 000 6.1.2) and
/// the scheduler's plan, else 4 storage threads and 16 streams.
fn pool_sizes(
    cfg: &DaemonConfig,
    cli: &ServeInputs,
    capacities: &Capacities,
    storage: Option<&BlockDevice>,
    nic: Option<&Nic>,
    sched: Option<&ramsys_sched::Plan>,
) -> ResourceConfig {
    let by_type = storage.map(|d| {
        let cap = capacities.get(&d.name).map(|g| (g * 1000.0) as u64);
        ramsys_topo::plan::storage_pool_size(d.kind, cap, 16)
    });
    let planned = sched
        .zip(storage)
        .map(|(p, d)| p.count(ramsys_sched::Role::Reader, &d.name) as usize);
    let dev_threads = storage.and_then(|d| cfg.threads(&d.name));
    let auto_storage = by_type.max(planned).filter(|n| *n > 0);
    let readers = cli
        .readers
        .or(dev_threads)
        .or(cfg.readers)
        .or(auto_storage)
        .unwrap_or(4);
    let writers = cli
        .writers
        .or(dev_threads)
        .or(cfg.writers)
        .or(auto_storage.map(|n| n.max(SINK_WRITERS_MIN)))
        .unwrap_or(4);
    let max_streams = cli
        .max_streams
        .or(nic.and_then(|n| cfg.threads(&n.name)))
        .or(cfg.max_streams)
        .unwrap_or(crate::data::resources::DEFAULT_MAX_STREAMS);
    let memory = cli.memory.or(cfg.memory).unwrap_or(256 << 20);
    ResourceConfig {
        memory: memory as usize,
        buffer_size: cli.buffer_size,
        readers: readers.max(1),
        writers: writers.max(1),
        max_streams: max_streams.max(1),
        ..Default::default()
    }
}

fn cpus_or_os(c: &[usize]) -> String {
    if c.is_empty() {
        "any (OS)".into()
    } else {
        ramsys_topo::fmt_cpus(c)
    }
}

/// Writers a sink runs at least, whatever the device type: a sink writes
/// through the page cache (small files always, large ones within the
/// buffered budget; storage::cache), so its writers spend their time on
/// file-system metadata (create, link, set the mtime) while the kernel
/// writes back in its own order; the one-thread rule of a rotational disk
/// (seed 000 sec. 6.1.2) is about the head position of reads. The
/// 47,984-file tree pushed to a daemon on /dev/vda (rotational=1): 1
/// writer 6.16 s median, 2 writers 4.53 s (3 interleaved rounds, load
/// 12-16; docs/STORAGE.md); 4 writers were no faster than 1 on 2 CPUs.
pub const SINK_WRITERS_MIN: usize = 2;

/// Files below DIRECT_MIN a sink session needs before it runs the writers
/// SINK_WRITERS_MIN added (TransferOptions::bulk_writers).
pub const MANY_SMALL_FILES: usize = 1024;

/// Thread counts a task follows, from its plan (issue 7).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskCounts {
    /// Storage threads (readers for a source, writers for a sink).
    pub storage: usize,
    /// Network threads = streams.
    pub network: usize,
}

impl DaemonPlacement {
    /// The MSMRAP plan for one task: data from the storage device under
    /// `path` to the NIC that owns `local` (the control link's local
    /// address), or the reverse for a sink. None when either device is
    /// unknown. `busy`: CPUs other work keeps busy (the host's published
    /// load less the daemon's own, ramsys_sched::busy_from_load), taken
    /// out of the plan's budget (seed 000 Eq. 5.4); the last value returned
    /// is how many were (one CPU always stays free).
    pub fn task_plan(
        &self,
        sink: bool,
        path: &Path,
        local: &str,
        block: u64,
        busy: usize,
    ) -> Option<(ramsys_sched::Plan, String, String, usize)> {
        let storage = storage_for_path(&self.topo, path, self.live)
            .map(|d| d.name.clone())
            .or_else(|| self.storage.clone())?;
        let nic = local
            .parse::<std::net::SocketAddr>()
            .ok()
            .and_then(|a| {
                if a.ip().is_loopback() {
                    self.topo.nic("lo")
                } else {
                    self.topo.nic_for_addr(a.ip())
                }
            })
            .map(|n| n.name.clone())
            .or_else(|| self.nic.clone())?;
        let (from, to) = if sink {
            (nic.as_str(), storage.as_str())
        } else {
            (storage.as_str(), nic.as_str())
        };
        let mut inst = sched_instance_with(
            &self.topo,
            self.model.as_ref(),
            &self.capacities,
            from,
            to,
            block,
        );
        let busy = inst.host.add_busy(busy);
        Some((ramsys_sched::plan(&inst), storage, nic, busy))
    }
}

/// The counts a task runs with: the plan's, raised to what the user
/// configured for the device (an explicit `threads` wins), and never
/// above the pools (admission grants within these). `floor` keeps at
/// least that many storage threads (see docs/SCHEDULER.md: a virtio disk
/// that claims to be rotational).
pub fn task_counts(
    plan: &ramsys_sched::Plan,
    sink: bool,
    storage: &str,
    nic: &str,
    configured: Option<usize>,
    pools: &ResourceConfig,
    floor: usize,
) -> TaskCounts {
    use ramsys_sched::Role as R;
    let (sr, nr, pool) = if sink {
        (R::Writer, R::Receiver, pools.writers)
    } else {
        (R::Reader, R::Sender, pools.readers)
    };
    let planned = plan.count(sr, storage) as usize;
    let storage_n = configured
        .unwrap_or(planned.max(floor))
        .clamp(1, pool.max(1));
    let network = (plan.count(nr, nic) as usize).clamp(1, pools.max_streams.max(1));
    TaskCounts {
        storage: storage_n,
        network,
    }
}
