//! A snapshot of the daemon's state, as `ramsys status --json` prints it
//! and as the metrics endpoint renders it (docs/DAEMON.md lists fields).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::admit::{Counters, DaemonState, Dir, Inner, TaskRec, TaskState};
use crate::data::resources::EngineResources;

/// Version of the status document (bump on incompatible changes).
pub const STATUS_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    pub version: u32,
    pub listen: String,
    pub root: String,
    pub uptime_s: f64,
    pub sessions: Vec<SessionStatus>,
    /// Live tasks (not yet exited).
    pub tasks: Vec<TaskStatus>,
    /// Recently exited tasks, newest last.
    pub finished: Vec<TaskStatus>,
    /// One waiting queue per storage device.
    pub queues: Vec<QueueStatus>,
    pub pools: Vec<PoolStatus>,
    pub nics: Vec<NicStatus>,
    pub totals: Totals,
    /// The placement chosen at start (`serve --config`, issue 5): one line
    /// per decision.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placement: Vec<String>,
    /// With a users table (daemon::users): each user's export root and
    /// running sessions (a user asking sees only itself).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<UserStatus>,
    /// Rate limits in force (daemon::rates): the daemon's and users'
    /// `max_rate`, sessions' `--bwlimit`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rates: Vec<super::rates::RateStatus>,
    /// A drain is under way (SIGTERM): new sessions are refused.
    #[serde(default)]
    pub draining: bool,
    /// With `serve --peer` (issue 19, docs/SITE.md): every member of the
    /// site, this daemon first, as its monitoring last saw it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub site: Vec<SiteMember>,
    /// Interfaces offering raw-Ethernet channels (`serve --raw-iface`,
    /// issue 18): "IFACE MAC mtu N node N|-" each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub raw: Vec<String>,
    /// The raw channels' copy offload (seed 003 MCNI, rawnet::offload):
    /// whether new channels use it, and its counters since start.
    #[serde(default)]
    pub copy_offload: CopyOffload,
    /// Continuous replication jobs (`[[replicate]]`, issue 38).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<super::jobs::JobStatus>,
    /// The daemon's memory (issue 36).
    #[serde(default)]
    pub memory: MemoryStatus,
}

/// The daemon process's resident memory now and at its peak (VmRSS,
/// VmHWM), and what one session may hold for its file list
/// (`serve --session-memory`; 0: no bound). Each task's share is its
/// `meta_bytes`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemoryStatus {
    pub rss_bytes: u64,
    pub peak_rss_bytes: u64,
    pub session_budget_bytes: u64,
}

/// Copies on the copy thread and their bytes; fallbacks: copies of an
/// offloading channel done inline (below 16 KiB), and their bytes.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CopyOffload {
    pub enabled: bool,
    pub copies: u64,
    pub bytes: u64,
    pub fallbacks: u64,
    pub fallback_bytes: u64,
}

pub use crate::daemon::site::member::SiteMember;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UserStatus {
    pub name: String,
    pub root: String,
    pub sessions: u32,
    pub read_only: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionStatus {
    /// Session id, hex.
    pub id: String,
    pub user: String,
    pub peer: String,
    /// Role the daemon plays: "source" or "sink".
    pub role: String,
    pub paths: Vec<String>,
    pub age_s: f64,
    pub tasks: Vec<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskStatus {
    pub id: u64,
    pub session: String,
    pub role: String,
    pub device: String,
    pub nic: String,
    pub state: TaskState,
    /// Seconds in the current state.
    pub state_s: f64,
    pub age_s: f64,
    /// Threads held: network (senders or receivers) and storage (readers
    /// or writers), and buffers (sink).
    /// The scheduler plan the task follows (threads, buffers, streams,
    /// prediction; docs/SCHEDULER.md), when the daemon has a topology.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<serde_json::Value>,
    pub streams: usize,
    pub threads: usize,
    pub buffers: usize,
    pub bytes: u64,
    pub total_bytes: u64,
    pub files: u64,
    pub total_files: u64,
    pub blocks: u64,
    /// Memory held for the file list and per-file state (issue 36).
    #[serde(default)]
    pub meta_bytes: u64,
    /// Recent throughput, bytes per second.
    pub rate_bps: f64,
    pub suspensions: u64,
    /// Took storage budget of a starving device queue.
    pub stolen: bool,
    pub error: Option<String>,
    /// Storage threads allowed to run at once: the task's share of a
    /// device other site members use too (site::share); absent: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site_limit: Option<usize>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueStatus {
    pub device: String,
    pub kind: String,
    /// Task ids waiting, head first.
    pub waiting: Vec<u64>,
    /// Storage-thread budget of this device per pool, and threads held.
    pub budget: usize,
    pub readers_held: usize,
    pub writers_held: usize,
    pub steals: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub rate_in_bps: f64,
    pub rate_out_bps: f64,
    /// The device as the site knows it (site::storage): its identity.
    #[serde(default)]
    pub storage: String,
    #[serde(default)]
    pub storage_id: String,
    /// Its share over the site while other members use it (site::share).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<QueueSite>,
}

/// A device's storage-thread budget shared over the site (site::share).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct QueueSite {
    /// Members using the device (this daemon included), their tasks on
    /// it and the storage threads those hold.
    pub members: u32,
    pub tasks: u32,
    pub threads: u32,
    /// The device's budget: threads one daemon alone runs on it.
    pub budget: u32,
    /// This daemon's share, split over its tasks (their `site_limit`).
    pub share: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolStatus {
    /// "readers", "writers", "senders", "receivers" or "buffers".
    pub pool: String,
    pub size: usize,
    pub busy: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NicStatus {
    pub nic: String,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub rate_in_bps: f64,
    pub rate_out_bps: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Totals {
    pub sessions: u64,
    pub tasks: u64,
    pub tasks_failed: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub files_in: u64,
    pub files_out: u64,
    pub blocks_in: u64,
    pub blocks_out: u64,
    pub checksum_errors: u64,
    pub failed_files: u64,
    /// Data links lost mid-transfer, and replaced (crate::session::relink).
    #[serde(default)]
    pub links_lost: u64,
    #[serde(default)]
    pub links_replaced: u64,
    pub retries: u64,
    pub suspensions: u64,
    pub steals: u64,
    /// Sessions sent to a less-loaded site peer (Control::Redirect).
    #[serde(default)]
    pub redirects: u64,
    /// Live tasks by state ("exit" counts the finished tasks kept).
    pub tasks_by_state: BTreeMap<String, u64>,
}

fn task_status(t: &TaskRec, now: Instant) -> TaskStatus {
    let s = &t.info.stats;
    TaskStatus {
        id: t.info.id,
        session: format!("{:x}", t.info.session),
        role: t.info.dir.role().into(),
        device: t.info.device.clone(),
        nic: t.info.nic.clone(),
        state: t.state,
        state_s: now.duration_since(t.since).as_secs_f64(),
        age_s: now.duration_since(t.started).as_secs_f64(),
        plan: t.plan.clone(),
        streams: t.streams,
        threads: t.storage,
        buffers: t.buffers,
        bytes: s.bytes.load(Relaxed),
        total_bytes: s.total_bytes.load(Relaxed),
        files: s.files.load(Relaxed),
        total_files: s.total_files.load(Relaxed),
        blocks: s.blocks.load(Relaxed),
        meta_bytes: s.meta_bytes.load(Relaxed),
        rate_bps: match t.state {
            TaskState::Exit => 0.0,
            // Not sampled yet: the average since it started moving.
            TaskState::Transferring if t.last_bytes == 0 => {
                s.bytes.load(Relaxed) as f64 / now.duration_since(t.since).as_secs_f64().max(1e-3)
            }
            _ => t.rate,
        },
        suspensions: t.suspensions,
        stolen: t.stolen,
        error: t.error.clone(),
        site_limit: t.gate.limit(),
    }
}

/// Take a consistent snapshot: every part is read under one lock.
pub fn snapshot(st: &DaemonState, res: &EngineResources, listen: &str, root: &str) -> Status {
    let now = Instant::now();
    let g = st.lock();
    let live = Live::of(&g);
    Status {
        placement: Vec::new(),
        users: Vec::new(),
        rates: Vec::new(),
        draining: false,
        site: Vec::new(),
        raw: Vec::new(),
        copy_offload: CopyOffload::default(),
        jobs: Vec::new(),
        memory: {
            let (rss_bytes, peak_rss_bytes) = crate::types::stats::process_rss();
            MemoryStatus {
                rss_bytes,
                peak_rss_bytes,
                session_budget_bytes: 0,
            }
        },
        version: STATUS_VERSION,
        listen: listen.into(),
        root: root.into(),
        uptime_s: now.duration_since(st.started).as_secs_f64(),
        sessions: sessions(&g, now),
        tasks: g.tasks.values().map(|t| task_status(t, now)).collect(),
        finished: g.finished.iter().map(|t| task_status(t, now)).collect(),
        queues: queues(&g, res, &live.devices),
        pools: pools(res),
        nics: nics(&g, &live.nics),
        totals: totals(&st.counters, &g),
    }
}

/// Per direction (in, out): bytes and rate.
type InOut = [(u64, f64); 2];

/// What the live tasks have moved so far and how fast, per device and per
/// NIC.
struct Live<'g> {
    devices: BTreeMap<&'g str, InOut>,
    nics: BTreeMap<&'g str, InOut>,
}

impl<'g> Live<'g> {
    fn of(g: &'g Inner) -> Live<'g> {
        let mut live = Live {
            devices: BTreeMap::new(),
            nics: BTreeMap::new(),
        };
        for t in g.tasks.values() {
            let (i, b) = (t.info.dir as usize, t.info.stats.bytes.load(Relaxed));
            for (map, key) in [
                (&mut live.devices, &t.info.device),
                (&mut live.nics, &t.info.nic),
            ] {
                let x = &mut map.entry(key.as_str()).or_default()[i];
                x.0 += b;
                x.1 += t.rate;
            }
        }
        live
    }
}

/// The counters since start: finished tasks' and live tasks' together.
fn totals(c: &Counters, g: &Inner) -> Totals {
    let mut totals = Totals {
        sessions: c.sessions.load(Relaxed),
        tasks: c.tasks.load(Relaxed),
        tasks_failed: c.tasks_failed.load(Relaxed),
        retries: c.retries.load(Relaxed),
        suspensions: c.suspensions.load(Relaxed),
        steals: c.steals.load(Relaxed),
        redirects: c.redirects.load(Relaxed),
        bytes_in: g.done.bytes[Dir::In as usize],
        bytes_out: g.done.bytes[Dir::Out as usize],
        files_in: g.done.files[Dir::In as usize],
        files_out: g.done.files[Dir::Out as usize],
        blocks_in: g.done.blocks[Dir::In as usize],
        blocks_out: g.done.blocks[Dir::Out as usize],
        checksum_errors: g.done.checksum_errors,
        failed_files: g.done.failed_files,
        links_lost: g.done.links_lost,
        links_replaced: g.done.links_replaced,
        tasks_by_state: TaskState::ALL
            .iter()
            .map(|s| (s.name().to_string(), 0))
            .collect(),
    };
    *totals.tasks_by_state.get_mut("exit").unwrap() = g.finished.len() as u64;
    for t in g.tasks.values() {
        let s = &t.info.stats;
        let b = s.bytes.load(Relaxed);
        match t.info.dir {
            Dir::In => {
                totals.bytes_in += b;
                totals.files_in += s.files.load(Relaxed);
                totals.blocks_in += s.blocks.load(Relaxed);
            }
            Dir::Out => {
                totals.bytes_out += b;
                totals.files_out += s.files.load(Relaxed);
                totals.blocks_out += s.blocks.load(Relaxed);
            }
        }
        totals.checksum_errors += s.checksum_errors.load(Relaxed);
        totals.links_lost += s.links_lost.load(Relaxed);
        totals.links_replaced += s.links_replaced.load(Relaxed);
        totals.failed_files += s.failed.load(Relaxed);
        *totals.tasks_by_state.get_mut(t.state.name()).unwrap() += 1;
    }
    totals
}

/// Each device queue: its waiting tasks, threads, budget and traffic.
fn queues(g: &Inner, res: &EngineResources, live: &BTreeMap<&str, InOut>) -> Vec<QueueStatus> {
    let budget_of = |size: usize| size.div_ceil(g.lanes.len().max(1));
    g.lanes
        .iter()
        .map(|(k, l)| {
            let live = live.get(k.as_str()).copied().unwrap_or_default();
            QueueStatus {
                device: k.clone(),
                kind: l.kind.into(),
                waiting: l.queue.iter().copied().collect(),
                budget: budget_of(res.readers.size().max(res.writers.size())),
                readers_held: l.held[Dir::Out as usize],
                writers_held: l.held[Dir::In as usize],
                steals: l.steals,
                bytes_in: l.done_bytes[0] + live[0].0,
                bytes_out: l.done_bytes[1] + live[1].0,
                rate_in_bps: live[0].1,
                rate_out_bps: live[1].1,
                storage: l.storage.name.clone(),
                storage_id: format!("{:016x}", l.storage.id),
                site: l.site.map(|s| QueueSite {
                    members: s.members,
                    tasks: s.tasks,
                    threads: s.threads,
                    budget: s.budget,
                    share: s.share,
                }),
            }
        })
        .collect()
}

/// Every NIC that moved data, finished tasks' and live ones', by name.
fn nics(g: &Inner, live: &BTreeMap<&str, InOut>) -> Vec<NicStatus> {
    let mut names: Vec<&str> = g.nic_done.keys().map(|s| s.as_str()).collect();
    names.extend(live.keys().copied());
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .map(|n| {
            let done = g.nic_done.get(n).copied().unwrap_or_default();
            let live = live.get(n).copied().unwrap_or_default();
            NicStatus {
                nic: n.into(),
                bytes_in: done[0] + live[0].0,
                bytes_out: done[1] + live[1].0,
                rate_in_bps: live[0].1,
                rate_out_bps: live[1].1,
            }
        })
        .collect()
}

/// The engine's pools: size and how much of it is held.
fn pools(res: &EngineResources) -> Vec<PoolStatus> {
    let pool = |name: &str, size: usize, idle: usize| PoolStatus {
        pool: name.into(),
        size,
        busy: size.saturating_sub(idle),
    };
    vec![
        pool("readers", res.readers.size(), res.readers.idle()),
        pool("writers", res.writers.size(), res.writers.idle()),
        pool("senders", res.senders.size(), res.senders.idle()),
        pool("receivers", res.receivers.size(), res.receivers.idle()),
        pool("buffers", res.buffers.count(), res.buffers.free()),
    ]
}

/// The session list.
fn sessions(g: &Inner, now: Instant) -> Vec<SessionStatus> {
    g.sessions
        .iter()
        .map(|(id, s)| SessionStatus {
            id: format!("{id:x}"),
            user: s.user.clone(),
            peer: s.peer.clone(),
            role: s.role.into(),
            paths: s.paths.clone(),
            age_s: now.duration_since(s.started).as_secs_f64(),
            tasks: s.tasks.clone(),
        })
        .collect()
}

impl Status {
    /// True when no task is live and every pool is fully idle.
    pub fn idle(&self) -> bool {
        self.tasks.is_empty() && self.pools.iter().all(|p| p.busy == 0)
    }
}
