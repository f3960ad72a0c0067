//! `ramsys serve --config FILE`: what hardware detection cannot know (seed
//! 000 sec. 6.1.2, the user-assisted abstraction): the purpose of each
//! device, a capacity that beats the guess from its type, thread counts
//! per device, the I/O model file (`ramsys iomodel -o`), and the daemon's
//! NUMA mode, memory and stream limits. And the daemon's placement: which
//! device and NIC it serves, how big its pools are and where they live.
//!
//! ```toml
//! numa = "auto"              # off | auto | NODE
//! memory = "512M"            # buffer memory (bytes, or 512K/64M/2G)
//! max_streams = 32          # default DEFAULT_MAX_STREAMS (resources.rs)
//! readers = 4                # storage threads when no device entry says
//! writers = 4
//! model = "model.json"       # relative to this file's directory
//! send_path = "auto"         # inline | queued | auto (seed 002 sec. 7)
//! direct = "auto"            # O_DIRECT for large files: auto | always | never
//! max_rate = "200M"          # what the daemon sends, all sessions together
//!                            # (bytes/s or rsync units; data::rate; 0 = none)
//! max_connections = 1024     # connections held at once (server::limits)
//! max_connections_per_addr = 256   # ... from one source address
//! handshake_timeout = 10     # seconds to a connection's first message
//!
//! [devices.sda]
//! capacity_gbps = 4.0        # what the device really sustains
//! threads = 2                # reader and writer threads for it
//!
//! [devices.eth1]
//! purpose = "storage"        # data (default) | storage | ignore
//!
//! [users.alice]              # per-user key and export root (daemon::users)
//! key_file = "keys/alice"
//! root = "/srv/export/alice"
//! ```

use std::collections::BTreeMap;
use std::net::{IpAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

use ramsys_topo::{BlockDevice, Nic, NumaMode, Role, Topology, TransferPlan};

use crate::daemon::placement::{
    apply, plan_end, sched_instance_with, storage_for_path, Capacities,
};
use crate::data::resources::ResourceConfig;

pub use crate::daemon::toml::parse_size;
use crate::daemon::toml::{positive, string, toml_error};
use crate::types::sendpath::SendPath;

/// What a device is for. Detection sees a NIC but not whether it carries
/// replication traffic or the storage traffic of a SAN/NFS mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Purpose {
    /// Carries transfers (the default).
    Data,
    /// A NIC used for storage traffic: never a data channel.
    Storage,
    /// Not used by ramsys at all.
    Ignore,
}

/// One `[devices.NAME]` table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceConfig {
    pub purpose: Option<Purpose>,
    pub capacity_gbps: Option<f64>,
    pub threads: Option<usize>,
}

impl std::str::FromStr for SendPath {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "queued" => Ok(SendPath::Queued),
            "inline" => Ok(SendPath::Inline),
            "auto" => Ok(SendPath::Auto),
            _ => Err(format!("expected inline, queued or auto, got {s:?}")),
        }
    }
}

/// The parsed config file. Every field is optional: absent means "use the
/// command line or the detected default".
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DaemonConfig {
    pub numa: Option<NumaMode>,
    pub memory: Option<u64>,
    pub max_streams: Option<usize>,
    pub readers: Option<usize>,
    pub writers: Option<usize>,
    pub model: Option<PathBuf>,
    pub send_path: Option<SendPath>,
    /// `direct`: the O_DIRECT policy (storage::cache), under `--direct`.
    pub direct: Option<crate::storage::cache::DirectMode>,
    /// `max_rate`: bytes per second the daemon sends in all sessions
    /// together (data::rate); reloaded on SIGHUP.
    pub max_rate: Option<u64>,
    /// `max_connections`, `max_connections_per_addr`, `handshake_timeout`
    /// (seconds): the connection limits (server::limits, issue 34).
    pub max_connections: Option<usize>,
    pub max_connections_per_addr: Option<usize>,
    pub handshake_timeout: Option<u64>,
    pub devices: BTreeMap<String, DeviceConfig>,
    /// `[users.NAME]` tables (crate::daemon::users): per-user keys and
    /// export roots.
    pub users: Vec<crate::daemon::users::UserSpec>,
    /// `[site]` (crate::daemon::site, docs/SITE.md): `peers = ["ADDR", ...]`,
    /// `interval_ms` (1-1024), `user` (the name this daemon
    /// authenticates as at its peers).
    pub site_peers: Vec<String>,
    pub site_interval_ms: Option<u64>,
    pub site_user: Option<String>,
    /// `[site] max_sessions`, `max_load` (percent): the admission limit
    /// above which new sessions are redirected to a peer (site::redirect).
    pub site_limits: crate::daemon::site::redirect::Limits,
    /// `[site] share_storage` (default true): share the storage-thread
    /// budget of devices other members use too (site::share).
    pub site_share_storage: Option<bool>,
    /// `[site] max_members`: members that joined by dialling in, at most
    /// (site::membership; configured peers aside).
    pub site_max_members: Option<usize>,
    /// `[raw] ifaces = ["IFACE", ...]`: interfaces offering raw-Ethernet
    /// channels (transport::rawlink, docs/TYCHE.md), as `--raw-iface`.
    pub raw_ifaces: Vec<String>,
}

impl DaemonConfig {
    /// Parse config text. Relative paths (the model file) resolve against
    /// `base` (the config file's directory). Errors are one line naming
    /// the offending key.
    pub fn parse(text: &str, base: &Path) -> Result<DaemonConfig, String> {
        let table: ::toml::Table = text
            .parse()
            .map_err(|e: ::toml::de::Error| toml_error(text, &e))?;
        let mut c = DaemonConfig::default();
        for (k, v) in &table {
            match k.as_str() {
                "numa" => {
                    let s = match v {
                        ::toml::Value::Integer(n) => n.to_string(),
                        _ => string(k, v)?.to_string(),
                    };
                    c.numa = Some(s.parse().map_err(|e| format!("key `numa`: {e}"))?);
                }
                "memory" => {
                    c.memory = Some(match v {
                        ::toml::Value::Integer(n) if *n > 0 => *n as u64,
                        ::toml::Value::String(s) => {
                            parse_size(s).map_err(|e| format!("key `memory`: {e}"))?
                        }
                        _ => return Err(format!("key `memory`: expected a size, got {v}")),
                    })
                }
                "max_streams" => c.max_streams = Some(positive(k, v)?),
                "max_connections" => c.max_connections = Some(positive(k, v)?),
                "max_connections_per_addr" => c.max_connections_per_addr = Some(positive(k, v)?),
                "handshake_timeout" => c.handshake_timeout = Some(positive(k, v)? as u64),
                "readers" => c.readers = Some(positive(k, v)?),
                "writers" => c.writers = Some(positive(k, v)?),
                "model" => c.model = Some(base.join(string(k, v)?)),
                "send_path" => {
                    c.send_path = Some(
                        string(k, v)?
                            .parse()
                            .map_err(|e| format!("key `send_path`: {e}"))?,
                    )
                }
                "direct" => {
                    c.direct = Some(
                        string(k, v)?
                            .parse()
                            .map_err(|e| format!("key `direct`: {e}"))?,
                    )
                }
                "devices" => {
                    let t = v
                        .as_table()
                        .ok_or_else(|| format!("key `devices`: expected a table, got {v}"))?;
                    for (name, dv) in t {
                        c.devices
                            .insert(name.clone(), parse_device(&format!("devices.{name}"), dv)?);
                    }
                }
                "users" => c.users = crate::daemon::users::parse_users_section(v, base)?,
                "site" => parse_site(&mut c, v)?,
                "raw" => parse_raw(&mut c, v)?,
                "max_rate" => {
                    c.max_rate = Some(crate::daemon::users::parse_rate_value("key `max_rate`", v)?)
                }
                _ => {
                    return Err(format!(
                        "unknown key `{k}` (expected numa, memory, max_streams, readers, \
                         writers, model, send_path, direct, max_rate, max_connections, \
                         max_connections_per_addr, handshake_timeout, [devices.NAME], \
                         [users.NAME], [site] or [raw])"
                    ))
                }
            }
        }
        Ok(c)
    }

    /// Read and parse a config file; errors name the file and the key.
    pub fn load(path: &Path) -> anyhow::Result<DaemonConfig> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("config {}: {e}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        DaemonConfig::parse(&text, base)
            .map_err(|e| anyhow::anyhow!("config {}: {e}", path.display()))
    }

    /// Capacity overrides for the scheduler.
    pub fn capacities(&self) -> Capacities {
        self.devices
            .iter()
            .filter_map(|(n, d)| d.capacity_gbps.map(|c| (n.clone(), c)))
            .collect()
    }

    fn purpose(&self, name: &str) -> Purpose {
        self.devices
            .get(name)
            .and_then(|d| d.purpose)
            .unwrap_or(Purpose::Data)
    }

    fn threads(&self, name: &str) -> Option<usize> {
        self.devices.get(name).and_then(|d| d.threads)
    }
}

fn parse_device(key: &str, v: &::toml::Value) -> Result<DeviceConfig, String> {
    let t = v
        .as_table()
        .ok_or_else(|| format!("key `{key}`: expected a table, got {v}"))?;
    let mut d = DeviceConfig::default();
    for (k, v) in t {
        let full = format!("{key}.{k}");
        match k.as_str() {
            "purpose" => {
                d.purpose = Some(match string(&full, v)? {
                    "data" => Purpose::Data,
                    "storage" => Purpose::Storage,
                    "ignore" => Purpose::Ignore,
                    s => {
                        return Err(format!(
                            "key `{full}`: expected data, storage or ignore, got {s:?}"
                        ))
                    }
                })
            }
            "capacity_gbps" => {
                let g = v.as_float().or_else(|| v.as_integer().map(|i| i as f64));
                match g {
                    Some(g) if g > 0.0 && g.is_finite() => d.capacity_gbps = Some(g),
                    _ => {
                        return Err(format!(
                            "key `{full}`: expected a positive number of Gbit/s, got {v}"
                        ))
                    }
                }
            }
            "threads" => d.threads = Some(positive(&full, v)?),
            _ => {
                return Err(format!(
                    "unknown key `{full}` (expected purpose, capacity_gbps or threads)"
                ))
            }
        }
    }
    Ok(d)
}

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
         buffers {} MiB on {}",
        resources.readers,
        resources.writers,
        cpus_or_os(&resources.storage_cpus),
        resources.max_streams,
        cpus_or_os(&resources.net_cpus),
        resources.memory >> 20,
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

#[cfg(test)]
mod send_path_tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn auto_sends_inline_only_with_a_link_per_reader_on_a_short_path() {
        let us = |n| Some(Duration::from_micros(n));
        let a = SendPath::Auto;
        assert_eq!(a.resolve(4, 4, us(80)), SendPath::Inline);
        assert_eq!(a.resolve(4, 4, us(1_000)), SendPath::Inline);
        // A long path (the 100 ms measurement), an unknown one, or
        // unmatched counts: queued.
        assert_eq!(a.resolve(4, 4, us(1_001)), SendPath::Queued);
        assert_eq!(a.resolve(4, 4, us(100_000)), SendPath::Queued);
        assert_eq!(a.resolve(4, 4, None), SendPath::Queued);
        assert_eq!(a.resolve(4, 2, us(80)), SendPath::Queued);
        assert_eq!(a.resolve(1, 4, us(80)), SendPath::Queued);
        // An explicit choice is kept whatever the path.
        assert_eq!(SendPath::Inline.resolve(4, 2, None), SendPath::Inline);
        assert_eq!(SendPath::Queued.resolve(4, 4, us(80)), SendPath::Queued);
    }
}

/// The `[raw]` table: `ifaces`, a list of interface names.
fn parse_raw(c: &mut DaemonConfig, v: &::toml::Value) -> Result<(), String> {
    let t = v
        .as_table()
        .ok_or_else(|| format!("key `raw`: expected a table, got {v}"))?;
    for (k, v) in t {
        match k.as_str() {
            "ifaces" => {
                let a = v.as_array().ok_or_else(|| {
                    format!("key `raw.ifaces`: expected a list of interface names, got {v}")
                })?;
                for p in a {
                    c.raw_ifaces.push(string("raw.ifaces", p)?.to_string());
                }
            }
            _ => return Err(format!("unknown key `raw.{k}` (expected ifaces)")),
        }
    }
    Ok(())
}

/// The `[site]` table.
fn parse_site(c: &mut DaemonConfig, v: &::toml::Value) -> Result<(), String> {
    let t = v
        .as_table()
        .ok_or_else(|| format!("key `site`: expected a table, got {v}"))?;
    for (k, v) in t {
        match k.as_str() {
            "peers" => {
                let a = v.as_array().ok_or_else(|| {
                    format!("key `site.peers`: expected a list of addresses, got {v}")
                })?;
                for p in a {
                    c.site_peers.push(string("site.peers", p)?.to_string());
                }
            }
            "interval_ms" => {
                let n = positive("site.interval_ms", v)? as u64;
                c.site_interval_ms = Some(
                    crate::daemon::site::check_interval(n)
                        .map_err(|e| format!("key `site.interval_ms`: {e}"))?,
                );
            }
            "user" => c.site_user = Some(string("site.user", v)?.to_string()),
            "max_members" => c.site_max_members = Some(positive("site.max_members", v)?),
            "max_sessions" => {
                let n = positive("site.max_sessions", v)?;
                c.site_limits.max_sessions = Some(n.min(u32::MAX as usize) as u32);
            }
            "share_storage" => {
                c.site_share_storage = Some(v.as_bool().ok_or_else(|| {
                    format!("key `site.share_storage`: expected true or false, got {v}")
                })?)
            }
            "max_load" => {
                let n = positive("site.max_load", v)?;
                c.site_limits.max_load = Some(
                    crate::daemon::site::check_load_pct(n as u64)
                        .map_err(|e| format!("key `site.max_load`: {e}"))?,
                );
            }
            _ => {
                return Err(format!(
                    "unknown key `site.{k}` (expected peers, interval_ms, user, \
                     max_sessions, max_load, share_storage or max_members)"
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod site_tests {
    use super::*;

    #[test]
    fn site_table() {
        let c = DaemonConfig::parse(
            "[site]\npeers = [\"10.0.0.2:4000\", \"10.0.0.3:4000\"]\ninterval_ms = 20\nuser = \"siteuser\"\n",
            Path::new("."),
        )
        .unwrap();
        assert_eq!(c.site_peers.len(), 2);
        assert_eq!(c.site_interval_ms, Some(20));
        assert_eq!(c.site_user.as_deref(), Some("siteuser"));
        let e = DaemonConfig::parse("[site]\ninterval_ms = 2000\n", Path::new(".")).unwrap_err();
        assert!(e.contains("1-1024"), "{e}");
        assert!(DaemonConfig::parse("[site]\nbogus = 1\n", Path::new(".")).is_err());
        let c = DaemonConfig::parse("[site]\nmax_sessions = 4\nmax_load = 90\n", Path::new("."))
            .unwrap();
        assert_eq!(c.site_limits.max_sessions, Some(4));
        assert_eq!(c.site_limits.max_load, Some(0.9));
        let c = DaemonConfig::parse("[site]\nshare_storage = false\n", Path::new(".")).unwrap();
        assert_eq!(c.site_share_storage, Some(false));
        let e = DaemonConfig::parse("[site]\nshare_storage = 1\n", Path::new(".")).unwrap_err();
        assert!(e.contains("share_storage"), "{e}");
        let e = DaemonConfig::parse("[site]\nmax_load = 150\n", Path::new(".")).unwrap_err();
        assert!(e.contains("1-100"), "{e}");
    }
}

#[cfg(test)]
mod raw_tests {
    use super::*;

    #[test]
    fn raw_table() {
        let c =
            DaemonConfig::parse("[raw]\nifaces = [\"eth2\", \"eth3\"]\n", Path::new(".")).unwrap();
        assert_eq!(c.raw_ifaces, ["eth2", "eth3"]);
        let e = DaemonConfig::parse("[raw]\nifaces = \"eth2\"\n", Path::new(".")).unwrap_err();
        assert!(e.contains("raw.ifaces"), "{e}");
        assert!(DaemonConfig::parse("[raw]\nmtu = 9000\n", Path::new(".")).is_err());
    }
}

#[cfg(test)]
mod limit_tests {
    use super::*;

    #[test]
    fn connection_limits() {
        let c = DaemonConfig::parse(
            "max_connections = 300\nmax_connections_per_addr = 20\nhandshake_timeout = 3\n",
            Path::new("."),
        )
        .unwrap();
        assert_eq!(c.max_connections, Some(300));
        assert_eq!(c.max_connections_per_addr, Some(20));
        assert_eq!(c.handshake_timeout, Some(3));
        let e = DaemonConfig::parse("max_connections = 0\n", Path::new(".")).unwrap_err();
        assert!(e.contains("max_connections"), "{e}");
    }
}
