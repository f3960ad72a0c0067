//! Sessions, per-device task queues and task controllers (seed 000
//! sec. 6.1.3, 6.2.1, Fig. 6-3, Fig. 6-6).
//!
//! A request (one session) becomes a task on the waiting queue of the
//! storage device it reads or writes. One task poller thread serves every
//! queue: it activates the head of a queue when no other task of that
//! queue is between activation and transfer, so each queue is FIFO and a
//! suspended task keeps its turn (no starvation). The session's thread is
//! the task's controller (Fig. 6-5b): once active it reserves threads and
//! buffers; if the pools cannot give the minimum it suspends, and every
//! release wakes it to query again. States: waiting -> active ->
//! (suspended -> active)* -> transferring -> exit.
//!
//! Reservation rules (docs/DAEMON.md):
//! - All-or-nothing: a task checks every pool it needs (network threads,
//!   storage threads, and on a sink buffers) under the admission lock and
//!   takes its minimum from all of them or nothing, so no task ever holds
//!   part of its minimum while waiting for the rest: no deadlock inside a
//!   daemon. Across daemons only sinks wait, and a sink holds nothing while
//!   it waits; holders of sink resources are transferring and finish.
//! - Fair shares: a task gets at most `free / contenders` of a pool, where
//!   contenders are the tasks of its direction not yet transferring
//!   (itself included); at least one thread.
//! - Device budgets and work stealing (seed 000 sec. 7.2.3): each device
//!   queue owns ceil(pool / devices) storage threads; a queue may use the
//!   unused budget of queues that are starving (no task pending), which is
//!   counted as a steal. Stolen threads come back when the task exits (no
//!   preemption).
//!
//! (Over 800 lines: the task state machine, its poller and its queues are
//! one lock's worth of state; split, each part would reach into the
//! others' fields. Tests in tests.rs.)

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ramsys_resources::{BufferPool, Reservation, ThreadPool};
use serde::{Deserialize, Serialize};

use super::{Admission, SinkGrant};
use crate::daemon::site::member::SiteMember;
use crate::daemon::site::share::{self, DeviceShare, StorageUse, ThreadGate};
use crate::daemon::site::storage::StorageId;
use crate::data::resources::EngineResources;
use crate::types::error::EngineError;
use crate::types::stats::Stats;

/// Life cycle of a task (seed 000 Fig. 6-6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    /// On its device's waiting queue.
    Waiting,
    /// Taken by the poller; its controller reserves resources.
    Active,
    /// The pools could not give its minimum; waits for a release.
    Suspended,
    /// Holds its threads; data moving.
    Transferring,
    /// Done (threads returned).
    Exit,
}

impl TaskState {
    pub const ALL: [TaskState; 5] = [
        TaskState::Waiting,
        TaskState::Active,
        TaskState::Suspended,
        TaskState::Transferring,
        TaskState::Exit,
    ];
    pub fn name(self) -> &'static str {
        match self {
            TaskState::Waiting => "waiting",
            TaskState::Active => "active",
            TaskState::Suspended => "suspended",
            TaskState::Transferring => "transferring",
            TaskState::Exit => "exit",
        }
    }
    fn pending(self) -> bool {
        matches!(
            self,
            TaskState::Waiting | TaskState::Active | TaskState::Suspended
        )
    }
}

/// Data direction of a task, seen from the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Dir {
    /// Daemon is the sink: receivers, writers, buffers; bytes come in.
    In = 0,
    /// Daemon is the source: readers, senders; bytes go out.
    Out = 1,
}

impl Dir {
    pub fn name(self) -> &'static str {
        match self {
            Dir::In => "in",
            Dir::Out => "out",
        }
    }
    pub fn role(self) -> &'static str {
        match self {
            Dir::In => "sink",
            Dir::Out => "source",
        }
    }
}

/// What does not change over a task's life.
pub struct TaskInfo {
    pub id: u64,
    pub session: u64,
    pub dir: Dir,
    /// Device queue key ("major:minor").
    pub device: String,
    pub nic: String,
    pub stats: Arc<Stats>,
}

pub(super) struct TaskRec {
    pub info: Arc<TaskInfo>,
    pub state: TaskState,
    pub since: Instant,
    pub started: Instant,
    /// Held now: network threads, storage threads, buffers.
    pub streams: usize,
    pub storage: usize,
    pub buffers: usize,
    pub suspensions: u64,
    pub stolen: bool,
    pub rate: f64,
    pub last_bytes: u64,
    pub error: Option<String>,
    /// The scheduler plan the task follows (issue 7), as JSON.
    pub plan: Option<serde_json::Value>,
    /// How many of its storage threads run at once: its share of a device
    /// shared over the site (site::share); open otherwise.
    pub gate: Arc<ThreadGate>,
    /// Storage threads it would hold alone (its grant before any site
    /// share): what it claims in the site's split.
    pub alone: usize,
}

pub(super) struct SessionRec {
    pub user: String,
    pub peer: String,
    pub role: &'static str,
    pub paths: Vec<String>,
    pub started: Instant,
    pub tasks: Vec<u64>,
}

/// The waiting queue of one storage device and its thread budget.
pub(super) struct Lane {
    pub kind: &'static str,
    pub queue: VecDeque<u64>,
    /// Storage threads held by this device's tasks, by [`Dir`].
    pub held: [usize; 2],
    pub steals: u64,
    /// Bytes moved by finished tasks, by [`Dir`].
    pub done_bytes: [u64; 2],
    /// The device as the site knows it (site::storage).
    pub storage: StorageId,
    /// Its share over the site, while other members use it too.
    pub site: Option<DeviceShare>,
}

/// Sums over finished tasks, by [`Dir`].
#[derive(Default, Clone, Copy)]
pub(super) struct Done {
    pub bytes: [u64; 2],
    pub files: [u64; 2],
    pub blocks: [u64; 2],
    pub checksum_errors: u64,
    pub failed_files: u64,
    /// Data links lost mid-transfer and replaced (crate::session::relink).
    pub links_lost: u64,
    pub links_replaced: u64,
}

pub(super) struct Inner {
    pub sessions: BTreeMap<u64, SessionRec>,
    pub tasks: BTreeMap<u64, TaskRec>,
    pub lanes: BTreeMap<String, Lane>,
    /// The last finished tasks, newest last.
    pub finished: VecDeque<TaskRec>,
    pub nic_done: BTreeMap<String, [u64; 2]>,
    pub done: Done,
    next_task: u64,
    last_sample: Instant,
    /// The last site view (our address, the members, self first), when
    /// the daemon shares its storage budgets over a site (site::share).
    site: Option<(String, Vec<SiteMember>)>,
}

/// Event counters (monotonic).
#[derive(Default)]
pub struct Counters {
    pub sessions: AtomicU64,
    pub tasks: AtomicU64,
    pub tasks_failed: AtomicU64,
    /// Reservation attempts repeated after a suspension.
    pub retries: AtomicU64,
    pub suspensions: AtomicU64,
    pub steals: AtomicU64,
    /// Sessions redirected to a site peer (site::redirect).
    pub redirects: AtomicU64,
}

/// Finished tasks kept for `status`.
const KEEP_FINISHED: usize = 32;
/// A suspended controller re-queries at least this often (releases by
/// holders outside the daemon's accounting wake nobody).
const REQUERY: Duration = Duration::from_millis(250);

/// The daemon's explicit, observable state.
pub struct DaemonState {
    pub(super) inner: Mutex<Inner>,
    /// Wakes controllers (activation, release).
    cv: Condvar,
    /// Wakes the poller (arrival, release).
    poll: Condvar,
    pub counters: Counters,
    pub started: Instant,
    /// Longest a task waits in a queue or suspended before it fails.
    pub max_wait: Duration,
}

impl DaemonState {
    /// Create the state and start the task poller thread.
    pub fn start(max_wait: Duration) -> Arc<DaemonState> {
        let st = Arc::new(DaemonState {
            inner: Mutex::new(Inner {
                sessions: BTreeMap::new(),
                tasks: BTreeMap::new(),
                lanes: BTreeMap::new(),
                finished: VecDeque::new(),
                nic_done: BTreeMap::new(),
                done: Done::default(),
                next_task: 1,
                last_sample: Instant::now(),
                site: None,
            }),
            cv: Condvar::new(),
            poll: Condvar::new(),
            counters: Counters::default(),
            started: Instant::now(),
            max_wait,
        });
        let weak = Arc::downgrade(&st);
        std::thread::Builder::new()
            .name("task-poller".into())
            .spawn(move || poller(weak))
            .expect("spawn task poller");
        st
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Register a storage device queue (the daemon's "resource
    /// abstractions for all storage devices", sec. 6.2.1).
    pub fn add_device(&self, key: &str, kind: &'static str) {
        if self.lock().lanes.contains_key(key) {
            return;
        }
        // Once per device, outside the lock: reads mountinfo.
        let storage = crate::daemon::site::storage::identify_local(key);
        self.lock()
            .lanes
            .entry(key.to_string())
            .or_insert_with(|| Lane {
                kind,
                queue: VecDeque::new(),
                held: [0; 2],
                steals: 0,
                done_bytes: [0; 2],
                storage,
                site: None,
            });
    }

    /// Shared devices in use, for this daemon's monitoring record: per
    /// device, the tasks holding storage threads and how many they hold.
    pub fn storage_use(&self) -> Vec<StorageUse> {
        let g = self.lock();
        let mut v: Vec<StorageUse> = g
            .lanes
            .iter()
            .filter_map(|(k, l)| {
                let (n, t) = lane_tasks(&g, k)
                    .iter()
                    .fold((0usize, 0usize), |(n, t), x| (n + 1, t + x.1 as usize));
                (n > 0).then(|| StorageUse {
                    id: l.storage.id,
                    tasks: n.min(u16::MAX as usize) as u16,
                    threads: t.min(u16::MAX as usize) as u16,
                })
            })
            .collect();
        // Busiest first, if more than fit.
        v.sort_by_key(|u| std::cmp::Reverse(u.threads));
        v.truncate(share::MAX_PUBLISHED);
        v
    }

    /// Re-read the storage shares from a new site view (`me`: our
    /// address; `view`: every member, self first). The injection point
    /// of site::share: tests call it with a made-up view.
    pub fn apply_site(&self, me: &str, view: &[SiteMember]) {
        let mut g = self.lock();
        g.site = Some((me.to_string(), view.to_vec()));
        reshare(&mut g);
    }

    /// Add a user session to the session list.
    pub fn open_session(
        &self,
        id: u64,
        user: &str,
        peer: &str,
        role: &'static str,
        paths: Vec<String>,
    ) {
        self.counters.sessions.fetch_add(1, Relaxed);
        self.lock().sessions.insert(
            id,
            SessionRec {
                user: user.to_string(),
                peer: peer.to_string(),
                role,
                paths,
                started: Instant::now(),
                tasks: Vec::new(),
            },
        );
    }

    /// Remove a session (its tasks have exited).
    pub fn close_session(&self, id: u64) {
        self.lock().sessions.remove(&id);
    }

    /// Queue a task of `session` on `device`'s waiting queue.
    pub fn new_task(
        self: &Arc<Self>,
        session: u64,
        dir: Dir,
        device: &str,
        kind: &'static str,
        nic: &str,
        stats: Arc<Stats>,
    ) -> TaskGuard {
        self.add_device(device, kind);
        let mut g = self.lock();
        let id = g.next_task;
        g.next_task += 1;
        let now = Instant::now();
        g.tasks.insert(
            id,
            TaskRec {
                info: Arc::new(TaskInfo {
                    id,
                    session,
                    dir,
                    device: device.to_string(),
                    nic: nic.to_string(),
                    stats,
                }),
                state: TaskState::Waiting,
                since: now,
                started: now,
                streams: 0,
                storage: 0,
                buffers: 0,
                suspensions: 0,
                stolen: false,
                rate: 0.0,
                last_bytes: 0,
                error: None,
                plan: None,
                gate: Arc::new(ThreadGate::default()),
                alone: 0,
            },
        );
        g.lanes
            .get_mut(device)
            .expect("lane added")
            .queue
            .push_back(id);
        if let Some(s) = g.sessions.get_mut(&session) {
            s.tasks.push(id);
        }
        drop(g);
        self.counters.tasks.fetch_add(1, Relaxed);
        self.poll.notify_all();
        TaskGuard {
            state: self.clone(),
            id,
            outcome: Mutex::new(None),
        }
    }

    /// Count of live tasks in `s` (for tests and metrics).
    pub fn tasks_in(&self, s: TaskState) -> usize {
        self.lock().tasks.values().filter(|t| t.state == s).count()
    }

    fn set_state(g: &mut Inner, id: u64, s: TaskState) {
        if let Some(t) = g.tasks.get_mut(&id) {
            if t.state != s {
                t.state = s;
                t.since = Instant::now();
            }
        }
    }

    /// Activate queue heads (the task poller's step). A queue's head is
    /// taken when no other task of that queue is active or suspended.
    fn poll_once(&self, g: &mut Inner) -> bool {
        let mut woke = false;
        let keys: Vec<String> = g.lanes.keys().cloned().collect();
        for k in keys {
            let busy = g.tasks.values().any(|t| {
                t.info.device == k && matches!(t.state, TaskState::Active | TaskState::Suspended)
            });
            if busy {
                continue;
            }
            if let Some(id) = g.lanes.get_mut(&k).and_then(|l| l.queue.pop_front()) {
                Self::set_state(g, id, TaskState::Active);
                woke = true;
            }
        }
        woke
    }

    /// Update per-task rates (EWMA over one-second samples).
    fn sample(g: &mut Inner) {
        let now = Instant::now();
        let dt = now.duration_since(g.last_sample).as_secs_f64();
        if dt < 0.5 {
            return;
        }
        g.last_sample = now;
        for t in g.tasks.values_mut() {
            let b = t.info.stats.bytes.load(Relaxed);
            let inst = b.saturating_sub(t.last_bytes) as f64 / dt;
            t.rate = if t.last_bytes == 0 && t.rate == 0.0 {
                inst
            } else {
                0.5 * t.rate + 0.5 * inst
            };
            t.last_bytes = b;
        }
    }

    /// Storage threads `lane` may take from a pool of `size` threads for
    /// `dir`: (own unused budget, own + budget of starving lanes).
    fn lane_room(g: &Inner, lane: &str, dir: Dir, size: usize) -> (usize, usize) {
        let n = g.lanes.len().max(1);
        let budget = size.div_ceil(n);
        let i = dir as usize;
        let own = g
            .lanes
            .get(lane)
            .map_or(0, |l| budget.saturating_sub(l.held[i]));
        let spare: usize = g
            .lanes
            .iter()
            .filter(|(k, _)| k.as_str() != lane)
            .filter(|(k, _)| {
                !g.tasks
                    .values()
                    .any(|t| t.info.device == **k && t.info.dir == dir && t.state.pending())
            })
            .map(|(_, l)| budget.saturating_sub(l.held[i]))
            .sum();
        (own, own + spare)
    }

    /// One all-or-nothing attempt under the lock.
    fn try_grant(&self, g: &mut Inner, id: u64, res: &EngineResources, w: &Want) -> Option<Held> {
        let (dir, lane) = {
            let t = g.tasks.get(&id)?;
            (t.info.dir, t.info.device.clone())
        };
        let (net_pool, sto_pool): (&Arc<ThreadPool>, &Arc<ThreadPool>) = match dir {
            Dir::Out => (&res.senders, &res.readers),
            Dir::In => (&res.receivers, &res.writers),
        };
        let contenders = g
            .tasks
            .values()
            .filter(|t| t.info.dir == dir && t.state.pending())
            .count()
            .max(1);
        // Network threads: at least one, at most a fair share.
        let net_idle = net_pool.idle();
        let mut net = w.streams.min((net_idle / contenders).max(1)).max(1);
        if net_idle < 1 {
            return None;
        }
        // Storage threads from this device's budget (plus stolen budget).
        let (own, room) = Self::lane_room(g, &lane, dir, sto_pool.size());
        let room = room.min(sto_pool.idle());
        if room < 1 {
            return None;
        }
        let waiting_here = g.lanes.get(&lane).map_or(0, |l| l.queue.len()) + 1;
        let alone = w.storage.min((room / waiting_here).max(1)).max(1);
        // A source's readers are its site share of the device from the
        // start (a reader cannot be parked: its home queue may have no
        // other reader, request::tasks); a sink's writers are gated.
        let sto = match lane_split(g, &lane, Some((id, alone as u32))) {
            Some((mine, _, per)) if dir == Dir::Out => mine
                .iter()
                .zip(per)
                .find(|(t, _)| t.0 == id)
                .map_or(alone, |(_, n)| (n as usize).clamp(1, alone)),
            _ => alone,
        };
        // Buffers (sink): two per stream at least, `window` at most.
        let mut bufs = (0, 0);
        if dir == Dir::In {
            let free = res.buffers.free();
            if free < 2 {
                return None;
            }
            net = net.min(free / 2);
            let share = (free / contenders).max(net * 2);
            bufs = (net * 2, share.min(net * w.window.max(2)));
        }
        // Every minimum is available: take it all (idle counts only grow
        // outside this lock, so none of these can fail).
        let net_r = net_pool.reserve(net, net, Duration::ZERO)?;
        let sto_r = sto_pool.reserve(1, sto, Duration::ZERO)?;
        let buffers = if dir == Dir::In {
            Some(res.take_buffers(bufs.0, bufs.1, Duration::ZERO)?)
        } else {
            None
        };
        let stolen = sto_r.len() > own;
        if stolen {
            if let Some(l) = g.lanes.get_mut(&lane) {
                l.steals += 1;
            }
            self.counters.steals.fetch_add(1, Relaxed);
        }
        if let Some(l) = g.lanes.get_mut(&lane) {
            l.held[dir as usize] += sto_r.len();
        }
        if let Some(t) = g.tasks.get_mut(&id) {
            t.streams = net_r.len();
            t.storage = sto_r.len();
            t.buffers = buffers.as_ref().map_or(0, |b| b.count());
            t.stolen = stolen;
            t.alone = alone.max(t.storage);
        }
        // Start at its site share, not at the full grant until the next
        // view (the peers see this task within two intervals).
        reshare(g);
        Some(Held {
            net: net_r,
            storage: sto_r,
            buffers,
        })
    }
}

/// Live tasks of `lane` holding storage threads: (id, threads each
/// would hold alone).
fn lane_tasks(g: &Inner, lane: &str) -> Vec<(u64, u32)> {
    g.tasks
        .values()
        .filter(|t| t.info.device == lane && t.storage > 0 && t.state != TaskState::Exit)
        .map(|t| (t.info.id, t.alone.min(u32::MAX as usize) as u32))
        .collect()
}

/// Our tasks on a device (id, threads alone), its split, each's limit.
type LaneSplit = (Vec<(u64, u32)>, DeviceShare, Vec<u32>);

/// This daemon's tasks on `lane` with `extra` added, split by the site
/// view (site::share::device_shares); None outside a site, with sharing
/// off, or when no fresh peer uses the device.
fn lane_split(g: &Inner, lane: &str, extra: Option<(u64, u32)>) -> Option<LaneSplit> {
    let (me, view) = g.site.as_ref()?;
    let id = g.lanes.get(lane)?.storage.id;
    let mut mine = lane_tasks(g, lane);
    mine.extend(extra);
    let (d, per) = share::device_shares(me, id, &mine, view)?;
    Some((mine, d, per))
}

/// Set every task's gate from the last site view (site::share): per
/// device, this daemon's share of the device's budget given the fresh
/// members' tasks on it, split over our tasks there. Writers (a sink)
/// park past their gate; readers (a source) were capped when granted
/// (try_grant) and keep an open gate. A device no peer uses leaves its
/// tasks' gates open.
fn reshare(g: &mut Inner) {
    let lanes: Vec<String> = g.lanes.keys().cloned().collect();
    for k in lanes {
        let split = lane_split(g, &k, None);
        let limits: Vec<(u64, Option<u32>)> = match &split {
            Some((mine, _, per)) => mine.iter().zip(per).map(|(t, n)| (t.0, Some(*n))).collect(),
            None => lane_tasks(g, &k).into_iter().map(|t| (t.0, None)).collect(),
        };
        for (id, n) in limits {
            if let Some(t) = g.tasks.get(&id) {
                match n {
                    Some(n) if t.info.dir == Dir::In => t.gate.set(n as usize),
                    _ => t.gate.open(),
                }
            }
        }
        if let Some(l) = g.lanes.get_mut(&k) {
            l.site = split.map(|s| s.1);
        }
    }
}

/// What a controller asks for (maximums; the minimum is one thread each).
struct Want {
    streams: usize,
    storage: usize,
    window: usize,
}

struct Held {
    net: Reservation,
    storage: Reservation,
    buffers: Option<BufferPool>,
}

fn poller(weak: std::sync::Weak<DaemonState>) {
    loop {
        let Some(st) = weak.upgrade() else { return };
        let mut g = st.lock();
        if st.poll_once(&mut g) {
            st.cv.notify_all();
        }
        DaemonState::sample(&mut g);
        let (g, _) = st
            .poll
            .wait_timeout(g, Duration::from_millis(500))
            .unwrap_or_else(|e| e.into_inner());
        drop(g);
    }
}

/// The controller's handle on its task: reserves through the queues and
/// releases everything (and wakes suspended tasks) when dropped.
pub struct TaskGuard {
    state: Arc<DaemonState>,
    id: u64,
    outcome: Mutex<Option<Result<(), String>>>,
}

impl TaskGuard {
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Record how the task ended (default on drop: failed, "aborted").
    pub fn finish<T>(&self, r: &Result<T, EngineError>) {
        *self.outcome.lock().unwrap() = Some(match r {
            Ok(_) => Ok(()),
            Err(e) => Err(e.to_string()),
        });
    }

    /// Record the plan this task follows, for `ramsys status`.
    pub fn set_plan(&self, plan: serde_json::Value) {
        if let Some(t) = self.state.lock().tasks.get_mut(&self.id) {
            t.plan = Some(plan);
        }
    }

    pub fn state(&self) -> TaskState {
        self.state
            .lock()
            .tasks
            .get(&self.id)
            .map_or(TaskState::Exit, |t| t.state)
    }

    fn acquire(&self, res: &EngineResources, w: Want) -> Result<Held, EngineError> {
        let st = &self.state;
        let deadline = Instant::now() + st.max_wait;
        let mut g = st.lock();
        loop {
            let s = g.tasks.get(&self.id).map(|t| t.state);
            match s {
                Some(TaskState::Waiting) => {}
                Some(s @ (TaskState::Active | TaskState::Suspended)) => {
                    if s == TaskState::Suspended {
                        // Woken: back to active and query the pools again.
                        st.counters.retries.fetch_add(1, Relaxed);
                        DaemonState::set_state(&mut g, self.id, TaskState::Active);
                    }
                    if let Some(h) = st.try_grant(&mut g, self.id, res, &w) {
                        return Ok(h);
                    }
                    if s != TaskState::Suspended {
                        st.counters.suspensions.fetch_add(1, Relaxed);
                        if let Some(t) = g.tasks.get_mut(&self.id) {
                            t.suspensions += 1;
                        }
                    }
                    DaemonState::set_state(&mut g, self.id, TaskState::Suspended);
                }
                _ => return Err(EngineError::local("task is not pending")),
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(EngineError::local(format!(
                    "no threads free on the daemon after {} s",
                    st.max_wait.as_secs()
                )));
            }
            g = st
                .cv
                .wait_timeout(g, REQUERY.min(deadline - now))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Admission for TaskGuard {
    fn reserve_source(
        &self,
        res: &EngineResources,
        streams: usize,
        readers: usize,
    ) -> Result<(Reservation, Reservation), EngineError> {
        let h = self.acquire(
            res,
            Want {
                streams,
                storage: readers,
                window: 0,
            },
        )?;
        Ok((h.net, h.storage))
    }

    fn reserve_sink(
        &self,
        res: &EngineResources,
        streams: usize,
        writers: usize,
        window: usize,
    ) -> Result<SinkGrant, EngineError> {
        let h = self.acquire(
            res,
            Want {
                streams,
                storage: writers,
                window,
            },
        )?;
        Ok(SinkGrant {
            receivers: h.net,
            writers: h.storage,
            buffers: h.buffers.expect("sink grant has buffers"),
        })
    }

    fn transferring(&self, streams: u16) {
        let mut g = self.state.lock();
        if let Some(t) = g.tasks.get_mut(&self.id) {
            t.streams = streams as usize;
        }
        DaemonState::set_state(&mut g, self.id, TaskState::Transferring);
        drop(g);
        // The source may have relinquished senders (Fig. 6-4a).
        self.state.cv.notify_all();
        self.state.poll.notify_all();
    }

    fn storage_gate(&self) -> Option<Arc<ThreadGate>> {
        self.state
            .lock()
            .tasks
            .get(&self.id)
            .map(|t| t.gate.clone())
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        let outcome = self
            .outcome
            .lock()
            .unwrap()
            .take()
            .unwrap_or(Err("aborted".into()));
        let st = &self.state;
        let mut g = st.lock();
        if let Some(mut t) = g.tasks.remove(&self.id) {
            let i = t.info.dir as usize;
            let s = &t.info.stats;
            let bytes = s.bytes.load(Relaxed);
            g.done.bytes[i] += bytes;
            g.done.files[i] += s.files.load(Relaxed);
            g.done.blocks[i] += s.blocks.load(Relaxed);
            g.done.checksum_errors += s.checksum_errors.load(Relaxed);
            g.done.links_lost += s.links_lost.load(Relaxed);
            g.done.links_replaced += s.links_replaced.load(Relaxed);
            g.done.failed_files += s.failed.load(Relaxed);
            g.nic_done.entry(t.info.nic.clone()).or_default()[i] += bytes;
            if let Some(l) = g.lanes.get_mut(&t.info.device) {
                l.held[i] = l.held[i].saturating_sub(t.storage);
                l.queue.retain(|&q| q != self.id);
                l.done_bytes[i] += bytes;
            }
            if let Some(sess) = g.sessions.get_mut(&t.info.session) {
                sess.tasks.retain(|&q| q != self.id);
            }
            if let Err(e) = &outcome {
                st.counters.tasks_failed.fetch_add(1, Relaxed);
                t.error = Some(e.clone());
            }
            t.state = TaskState::Exit;
            t.since = Instant::now();
            t.streams = 0;
            t.storage = 0;
            t.buffers = 0;
            t.gate.open();
            g.finished.push_back(t);
            while g.finished.len() > KEEP_FINISHED {
                g.finished.pop_front();
            }
            // Our other tasks on the device may run more threads now.
            reshare(&mut g);
        }
        drop(g);
        // Wake suspended tasks and the poller (Fig. 6-6, exit).
        st.cv.notify_all();
        st.poll.notify_all();
    }
}

#[cfg(test)]
mod tests;
