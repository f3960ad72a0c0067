//! One replication job's loop (module docs in replicate/mod.rs).

use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use ramsys_engine::daemon::jobs::JobStats;
use ramsys_engine::request::filter::Filter;
use ramsys_engine::request::walk::Top;
use ramsys_engine::roles::client::push;
use ramsys_engine::roles::watchops::WatchChannel;
use ramsys_engine::storage::fsops::Confinement;
use ramsys_engine::{EngineError, EngineResources, Stats, TransferOptions};
use ramsys_proto::control::{WatchOp, WatchResult};
use ramsys_watch::change::join;
use ramsys_watch::pending::{Batch, Kind, Op, PendingConfig};
use ramsys_watch::{Backend, Backlog, Change, Detector, Journal, Pending};

use super::Target;

/// Everything that defines a job.
pub struct JobSpec {
    pub name: String,
    /// The source directory, absolute.
    pub source: PathBuf,
    /// How the source is sent: its path below "/" and its wire name ("":
    /// its contents go into DST, rsync's `SRC/`).
    pub top: Top,
    /// The job's sync: flags (DELETE included), selection, archive bits.
    pub opts: TransferOptions,
    pub pending: PendingConfig,
    pub backend: Backend,
    pub batch_window: Duration,
    /// A full scan this often (None: at start and after overflows only).
    pub rescan: Option<Duration>,
    pub journal: PathBuf,
    /// Where batches are reported.
    pub output: Output,
    /// Most files in one batch.
    pub max_files: usize,
}

/// How a job reports its batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// One JSON line per batch on stdout (the agent's --json).
    Json,
    /// A line per full sync and per failure on stderr (the agent).
    Human,
    /// The log only (a daemon's job: its status shows the rest).
    Log,
}

struct State {
    pending: Pending,
    journal: Journal,
}

type Shared = Arc<(Mutex<State>, Condvar)>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, State> {
    s.0.lock().unwrap_or_else(|p| p.into_inner())
}

/// Persist what the pending set changed (a failure is logged: the start
/// scan still covers it).
fn save(st: &mut State) {
    let log = st.pending.drain_log();
    if let Err(e) = st.journal.apply(&log) {
        tracing::warn!("{e}");
    }
}

/// Run `spec` into `target` until `stop`; `res` is the source engine,
/// kept for the job (threads and buffers stay up between batches).
pub fn run(
    spec: JobSpec,
    target: Target,
    res: EngineResources,
    stats: Arc<JobStats>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let filter = Filter::new(&spec.opts.select).map_err(|e| anyhow::anyhow!(e))?;
    let det = Detector::open(&spec.source, spec.backend)
        .with_context(|| format!("watching {}", spec.source.display()))?;
    JobStats::set(&stats.backend, det.note.clone());
    let (src, note) = (spec.source.display(), &det.note);
    match spec.output {
        Output::Human => eprintln!("ramsys: watching {src} with {note}"),
        _ => tracing::info!("{}: watching {src} with {note}", spec.name),
    }
    let job = format!("{} -> {}", spec.source.display(), target.shown);
    let journal = Journal::open(&spec.journal, &job)?;
    let mut pending = Pending::new(spec.pending.clone());
    let (paths, ops, full) = journal.load()?;
    pending.restore(paths, ops, full);
    pending.request_full(Instant::now());
    let shared: Shared = Arc::new((Mutex::new(State { pending, journal }), Condvar::new()));
    let backlog = det.backlog()?;
    let watcher = {
        let (shared, stats, stop) = (shared.clone(), stats.clone(), stop.clone());
        let ctx = Watcher {
            source: spec.source.clone(),
            top: spec.top.name.clone(),
            filter,
        };
        std::thread::Builder::new()
            .name("watch".into())
            .spawn(move || ctx.run(det, &shared, &stats, &stop))?
    };
    let mut runner = Runner {
        spec,
        target,
        res,
        stats,
        shared,
        chan: None,
        channels: 0,
        root: crate::agent::open_root(std::path::Path::new("/"), Confinement::None)?,
        busy_until: None,
        backlog,
        pause: std::env::var_os("RAMSYS_WATCH_PAUSE_FILE").map(PathBuf::from),
    };
    let r = runner.run(&stop);
    stop.store(true, Relaxed);
    let _ = watcher.join();
    JobStats::set(&runner.stats.state, "stopped");
    r
}

/// The detector's thread: changes in, filtered, into the pending set.
struct Watcher {
    source: PathBuf,
    top: Vec<u8>,
    filter: Filter,
}

impl Watcher {
    fn run(self, mut det: Detector, shared: &Shared, stats: &JobStats, stop: &AtomicBool) {
        let mut buf = Vec::new();
        let mut tick = Instant::now();
        let (mut changes0, mut files0) = (0, 0);
        // Batches ended before this read began (Pending::ended).
        let mut ended = 0;
        while !stop.load(Relaxed) {
            let drained = det.read(&mut buf, Duration::from_millis(100));
            let drained = match drained {
                Ok(d) => d,
                Err(e) => {
                    JobStats::set(&stats.last_error, format!("change detection: {e}"));
                    eprintln!("ramsys: change detection failed: {e}; relying on full scans");
                    let mut st = lock(shared);
                    st.pending.request_full(Instant::now());
                    drop(st);
                    std::thread::sleep(Duration::from_secs(5));
                    continue;
                }
            };
            let now = Instant::now();
            let mut st = lock(shared);
            for c in buf.drain(..) {
                if let Some(c) = self.admit(c) {
                    let size = self.size_of(&c);
                    st.pending.apply(c, now, size);
                }
            }
            // docs/WATCH.md "Renames behind a batch": every event queued
            // before the batches that ended before this read is applied.
            det.applied();
            if drained {
                st.pending.caught_up(ended);
            }
            ended = st.pending.ended();
            save(&mut st);
            // At once, not on the 1 s tick: the full scan an overflow asks
            // for may be taken and reported before the tick.
            stats
                .overflows
                .store(st.pending.counters.overflows, Relaxed);
            if tick.elapsed() >= Duration::from_secs(1) {
                let dt = tick.elapsed().as_secs_f64();
                tick = now;
                let c = st.pending.counters;
                stats.changes.store(c.changes, Relaxed);
                JobStats::set_rate(&stats.changes_per_s, (c.changes - changes0) as f64 / dt);
                let files = stats.files.load(Relaxed);
                JobStats::set_rate(&stats.files_per_s, (files - files0) as f64 / dt);
                (changes0, files0) = (c.changes, files);
                stats.queue_depth.store(st.pending.depth() as u64, Relaxed);
                let lag = st
                    .pending
                    .oldest()
                    .map_or(0, |t| now.duration_since(t).as_millis());
                stats.lag_ms.store(lag as u64, Relaxed);
                stats.bytes_behind.store(st.pending.bytes(), Relaxed);
            }
            drop(st);
            shared.1.notify_all();
        }
    }

    /// Is a path (relative to the tree) left out by the job's filters? Its
    /// ancestors are directories the scan would not descend.
    fn excluded(&self, rel: &[u8], dir: bool) -> bool {
        let wire = join(&self.top, rel);
        let start = self.top.len() + usize::from(!self.top.is_empty());
        for (i, &b) in wire.iter().enumerate().skip(start) {
            if b == b'/' && self.filter.excluded(&wire[..i], true) {
                return true;
            }
        }
        !rel.is_empty() && self.filter.excluded(&wire, dir)
    }

    /// The change as the job sees it through its filters: a rename out of
    /// the selection is a delete, into it a creation; an excluded entry
    /// made or removed still moves its (included) directory's mtime.
    fn admit(&self, c: Change) -> Option<Change> {
        let parent_meta = |p: &[u8]| {
            let d = ramsys_watch::change::parent(p);
            (!self.excluded(d, true)).then(|| Change::Attrib {
                path: d.to_vec(),
                dir: true,
            })
        };
        match c {
            Change::Renamed { from, to, dir } => {
                match (self.excluded(&from, dir), self.excluded(&to, dir)) {
                    (true, true) => parent_meta(&to),
                    (true, false) => Some(Change::Created {
                        path: to,
                        dir,
                        settled: true,
                    }),
                    (false, true) => Some(Change::Deleted { path: from, dir }),
                    (false, false) => Some(Change::Renamed { from, to, dir }),
                }
            }
            Change::Overflow => Some(c),
            Change::Closed(ref p) | Change::Modified(ref p) | Change::Rescan(ref p) => {
                (!self.excluded(p, false)).then_some(c)
            }
            Change::Created { ref path, dir, .. } | Change::Deleted { ref path, dir } => {
                if self.excluded(path, dir) {
                    parent_meta(path)
                } else {
                    Some(c)
                }
            }
            Change::Attrib { ref path, dir } => (!self.excluded(path, dir)).then_some(c),
        }
    }

    /// A closed file's size, for "bytes behind".
    fn size_of(&self, c: &Change) -> u64 {
        match c {
            Change::Closed(p) => {
                std::fs::symlink_metadata(self.source.join(std::ffi::OsStr::from_bytes(p)))
                    .map_or(0, |m| m.len())
            }
            _ => 0,
        }
    }
}

/// The job's side that sends.
struct Runner {
    spec: JobSpec,
    target: Target,
    res: EngineResources,
    stats: Arc<JobStats>,
    shared: Shared,
    chan: Option<WatchChannel>,
    /// Watch channels opened so far (the job's control connections, but
    /// for the first full sync's when DST was not there yet).
    channels: u64,
    root: Arc<ramsys_engine::storage::fsops::Root>,
    /// When the last batch ended, until the idle job gave its memory back
    /// (None: given back, or nothing sent since).
    busy_until: Option<Instant>,
    /// Whether the watcher has applied every event queued so far.
    backlog: Backlog,
    /// Test hook `$RAMSYS_WATCH_PAUSE_FILE` ([`Runner::pause`]), read once.
    pause: Option<PathBuf>,
}

/// Listed files a batch on the kept watch channel may carry.
const KEPT_FILES: usize = 4096;

/// Whether a batch runs on the kept watch channel: a few listed files.
/// A kept session holds its whole list at both ends (it does not run in
/// windows: docs/SCALE.md "Windows" step 7), so a full scan, a tree that
/// appeared (of unknown size) and a long list go on connections of their
/// own, in windows: a first full sync onto a 1 M-file DST took 320 MB on
/// the channel, 24 MB as a sync of its own. Their handshake (about 1 ms)
/// is nothing beside them.
fn fits_kept(b: &Batch) -> bool {
    !b.full && b.files.len() <= KEPT_FILES && b.files.iter().all(|(_, k)| *k <= Kind::File)
}

/// A job this long without a batch gives its buffer pools' pages and its
/// freed heap back to the system (a full sync of a big tree touches most of
/// the pool; docs/BENCHMARKS.md "idle cost").
const IDLE_RELEASE: Duration = Duration::from_secs(5);

/// What one batch did.
#[derive(Default)]
struct Done {
    ops: u64,
    files: u64,
    bytes: u64,
    failed: Vec<Vec<u8>>,
    /// The data went as a session on the job's kept watch channel.
    kept: bool,
}

impl Runner {
    fn run(&mut self, stop: &AtomicBool) -> anyhow::Result<()> {
        let mut backoff = Duration::ZERO;
        let mut last_full = Instant::now();
        while let Some(b) = self.next_batch(stop, &mut last_full) {
            self.pause(&b, stop);
            let t0 = Instant::now();
            let state = if b.full { "scanning" } else { "sending" };
            JobStats::set(&self.stats.state, state);
            let r = self.execute(&b);
            let now = Instant::now();
            self.busy_until = Some(now);
            let mut st = lock(&self.shared);
            match &r {
                Ok(d) => {
                    st.pending.finish(true, &d.failed, now);
                    backoff = Duration::ZERO;
                    if b.full {
                        last_full = now;
                        self.stats.full_scans.fetch_add(1, Relaxed);
                    }
                }
                Err(_) => {
                    st.pending.finish(false, &[], now);
                    self.chan = None;
                    self.stats.failed_batches.fetch_add(1, Relaxed);
                    backoff =
                        (backoff * 2).clamp(Duration::from_millis(500), Duration::from_secs(30));
                }
            }
            // Usually the watcher is waiting on an empty queue: the batch's
            // reads are forgotten at once, and a rename made from now on
            // travels as a rename (docs/WATCH.md "Renames behind a batch").
            if self.backlog.empty() {
                let n = st.pending.ended();
                st.pending.caught_up(n);
            }
            save(&mut st);
            let lag = b.since.map_or(0.0, |s| now.duration_since(s).as_secs_f64());
            drop(st);
            self.stats.batches.fetch_add(1, Relaxed);
            self.report(&b, &r, lag, t0.elapsed().as_secs_f64());
            JobStats::set(
                &self.stats.state,
                if r.is_ok() { "watching" } else { "retrying" },
            );
            sleep_unless(stop, backoff);
        }
        Ok(())
    }

    /// Test hook: while the file `$RAMSYS_WATCH_PAUSE_FILE` exists, a batch
    /// waits once taken, before its operations and before it reads the
    /// source, having written the paths it lists into the file (one a
    /// line), so a test can change the tree behind a batch in flight
    /// (docs/WATCH.md "Deletes behind a batch").
    fn pause(&self, b: &Batch, stop: &AtomicBool) {
        let Some(f) = self.pause.as_deref().filter(|f| f.exists()) else {
            return;
        };
        let listed: Vec<u8> = (b.files.iter())
            .flat_map(|(p, _)| p.iter().copied().chain([b'\n']))
            .collect();
        if std::fs::write(f, listed).is_err() {
            return;
        }
        while f.exists() && !stop.load(Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Wait for the next batch: ready paths or operations, then the
    /// batch window for more to gather. None: stopped.
    fn next_batch(&mut self, stop: &AtomicBool, last_full: &mut Instant) -> Option<Batch> {
        let shared = self.shared.clone();
        let mut st = lock(&shared);
        loop {
            if stop.load(Relaxed) {
                return None;
            }
            let now = Instant::now();
            if self
                .busy_until
                .is_some_and(|t| now.duration_since(t) >= IDLE_RELEASE)
            {
                self.busy_until = None;
                self.release_memory();
            }
            if self
                .spec
                .rescan
                .is_some_and(|p| now.duration_since(*last_full) >= p)
            {
                st.pending.request_full(now);
                *last_full = now;
            }
            let (b, next) = st.pending.take(now, self.spec.max_files);
            if b.is_some() {
                return b;
            }
            let wait = next.map_or(Duration::from_secs(1), |n| n.saturating_duration_since(now));
            let (g, to) = shared
                .1
                .wait_timeout(st, wait.min(Duration::from_secs(1)))
                .unwrap_or_else(|p| p.into_inner());
            st = g;
            if !to.timed_out() {
                // Something changed: let more gather before taking.
                drop(st);
                std::thread::sleep(self.spec.batch_window);
                st = lock(&shared);
            }
        }
    }

    /// Idle: the pages of every buffer pool in this process that the job
    /// uses (its source engine's, a local DST's daemon's) and the heap the
    /// last batches freed go back to the system. A pool with a buffer in
    /// use (a session still ending) keeps its pages.
    fn release_memory(&self) {
        let pools = std::iter::once(&self.res.buffers).chain(&self.target.pools);
        let bytes: usize = pools.map(|p| p.release_idle()).sum();
        ramsys_engine::types::stats::return_freed_memory();
        tracing::debug!(
            "{}: idle, {bytes} bytes of buffers released",
            self.spec.name
        );
    }

    fn wire(&self, rel: &[u8]) -> Vec<u8> {
        join(&self.spec.top.name, rel)
    }

    /// The batch's operations at DST, then its data.
    fn execute(&mut self, b: &Batch) -> Result<Done, EngineError> {
        let mut done = Done::default();
        if !b.ops.is_empty() || !b.dirs.is_empty() {
            done.ops = self.operations(b)?;
        }
        if b.full || !b.files.is_empty() {
            let (rep, kept) = self.data(b)?;
            done.kept = kept;
            done.files = rep.files;
            done.bytes = rep.bytes;
            let src = self.spec.source.as_os_str().as_bytes();
            for f in &rep.failed {
                // A vanished path is the tree moving under the batch (a
                // temporary file renamed into place), not a fault: the
                // event that took it follows (docs/WATCH.md "Vanished
                // paths").
                if f.vanished {
                    tracing::debug!("{}: {}", f.path, f.reason);
                    continue;
                }
                tracing::warn!("{}: {}", f.path, f.reason);
                // Source-side failures name the source path.
                if let Some(rel) = f.path.as_bytes().strip_prefix(src) {
                    let rel = rel.strip_prefix(b"/").unwrap_or(rel).to_vec();
                    done.failed.push(rel);
                }
            }
        }
        self.stats.ops.fetch_add(done.ops, Relaxed);
        self.stats.files.fetch_add(done.files, Relaxed);
        self.stats.bytes.fetch_add(done.bytes, Relaxed);
        Ok(done)
    }

    /// Renames, deletes, directory attributes on the watch channel; a
    /// rename DST could not do becomes its target's data.
    fn operations(&mut self, b: &Batch) -> Result<u64, EngineError> {
        let mut ops: Vec<WatchOp> = b
            .ops
            .iter()
            .map(|(_, op)| match op {
                Op::Rename { from, to, dir } => WatchOp::Rename {
                    from: self.wire(from),
                    to: self.wire(to),
                    dir: *dir,
                },
                Op::Delete { path, dir } => WatchOp::Delete {
                    path: self.wire(path),
                    dir: *dir,
                },
            })
            .collect();
        for d in &b.dirs {
            let p = self.spec.source.join(std::ffi::OsStr::from_bytes(d));
            if let Some(md) = std::fs::symlink_metadata(&p).ok().filter(|m| m.is_dir()) {
                use std::os::unix::fs::MetadataExt;
                ops.push(WatchOp::DirAttrs {
                    path: self.wire(d),
                    mode: md.mode() & 0o7777,
                    mtime_s: md.mtime(),
                    mtime_ns: md.mtime_nsec() as u32,
                });
            }
        }
        let results = match self.channel(b)? {
            Some(chan) => chan.apply(&ops)?,
            // DST does not exist yet: the full sync of this batch makes it
            // and sends everything.
            None => vec![WatchResult::Missing; ops.len()],
        };
        let mut missing = Vec::new();
        for ((_, op), r) in b.ops.iter().zip(&results) {
            if let (Op::Rename { to, dir, .. }, WatchResult::Missing) = (op, r) {
                missing.push((to.clone(), *dir));
            }
            if let WatchResult::Failed(why) = r {
                tracing::warn!("{op:?}: {why}");
            }
        }
        let mut st = lock(&self.shared);
        st.pending.ops_applied(&missing, Instant::now());
        save(&mut st);
        Ok(results.iter().filter(|r| **r == WatchResult::Done).count() as u64)
    }

    /// The job's watch channel, opened on first use and kept; None when DST
    /// is not there yet and this batch is a full sync that makes it.
    fn channel(&mut self, b: &Batch) -> Result<Option<&mut WatchChannel>, EngineError> {
        if self.chan.is_none() {
            let cipher = self.spec.opts.encrypt;
            match WatchChannel::open(&self.target.remote(), &self.target.dest, cipher) {
                Ok(c) => {
                    self.channels += 1;
                    self.chan = Some(c)
                }
                Err(EngineError::Refused(m)) if b.full && m.contains("not a directory") => {
                    return Ok(None)
                }
                Err(e) => return Err(e),
            }
        }
        Ok(self.chan.as_mut())
    }

    /// The batch's files, or (full) the whole tree, as a sync session: on
    /// the job's watch channel when its daemon keeps sessions there and
    /// the batch is small ([`fits_kept`]; no connect, no handshake: true),
    /// else on connections of its own.
    fn data(&mut self, b: &Batch) -> Result<(ramsys_engine::Report, bool), EngineError> {
        let mut opts = self.spec.opts.clone();
        opts.listed_may_vanish = true;
        if !b.full {
            // Only what the batch lists; deletes travelled as operations,
            // except below a mirror (a renamed tree that was in flight,
            // pending::Kind::Mirror): its extra entries go, and the
            // batch's other trees are exact too, as mirror mode wants.
            // Outside the listed trees --files-from protects everything.
            if !b.files.iter().any(|(_, k)| *k == Kind::Mirror) {
                opts.sync &= !ramsys_engine::request::sync::flags::DELETE;
            }
            opts.select.files = b
                .files
                .iter()
                .map(|(p, _)| self.wire(p))
                .collect::<Vec<_>>()
                .into();
            // A listed directory is a tree that appeared: all of it goes.
            opts.select.files_recursive = true;
            // A small batch needs few links: their setup is its cost.
            let want = 1 + b.bytes / (256 << 20);
            opts.streams = opts.streams.min(want.min(u16::MAX as u64) as u16).max(1);
            opts.auto_streams = false;
        }
        // Files still being written inside a listed tree stay out of it
        // (pending::Batch::hold), ahead of the user's rules: first match
        // wins.
        if !b.hold.is_empty() {
            let hold = b.hold.iter().map(|p| hold_rule(&self.wire(p)));
            opts.select.rules = hold.chain(opts.select.rules.drain(..)).collect();
        }
        let stats = Arc::new(Stats::default());
        // A daemon that refuses the channel (one older than it) still
        // takes the data on connections of its own.
        match self.channel(b) {
            Ok(_) | Err(EngineError::Refused(_)) => {}
            Err(e) => return Err(e),
        }
        let (remote, root, tops) = (
            self.target.remote(),
            self.root.clone(),
            vec![self.spec.top.clone()],
        );
        let dest = self.target.dest.clone();
        match (self.chan.as_mut()).filter(|c| c.keeps_sessions() && fits_kept(b)) {
            Some(c) => c
                .push(&remote, root, tops, dest, &opts, &self.res, stats)
                .map(|r| (r, true)),
            None => push(&remote, root, tops, dest, &opts, &self.res, stats).map(|r| (r, false)),
        }
    }

    fn report(&self, b: &Batch, r: &Result<Done, EngineError>, lag: f64, wall: f64) {
        if let Err(e) = r {
            JobStats::set(&self.stats.last_error, e.to_string());
        }
        if self.spec.output == Output::Log {
            match r {
                Err(e) => tracing::warn!("{}: batch failed ({e}); retrying", self.spec.name),
                Ok(d) => tracing::debug!(
                    "{}: batch: {} ops, {} files, {} bytes",
                    self.spec.name,
                    d.ops,
                    d.files,
                    d.bytes
                ),
            }
            return;
        }
        let json = self.spec.output == Output::Json;
        match r {
            Err(e) => {
                if json {
                    let l = serde_json::json!({"event": "batch", "ok": false, "error": e.to_string(),
                        "full": b.full, "wall_s": wall});
                    println!("{l}");
                } else {
                    eprintln!(
                        "ramsys: {}: batch failed ({e}); retrying",
                        self.target.shown
                    );
                }
            }
            Ok(d) if json => {
                let l = serde_json::json!({"event": "batch", "ok": true, "full": b.full,
                    "ops": d.ops, "files": d.files, "bytes": d.bytes, "listed": b.files.len(),
                    "failed": d.failed.len(), "lag_s": lag, "wall_s": wall,
                    "kept": d.kept, "channels": self.channels,
                    "overflows": self.stats.overflows.load(Relaxed)});
                println!("{l}");
            }
            Ok(d) if b.full => eprintln!(
                "ramsys: full sync of {}: {} files, {} bytes sent in {wall:.2} s",
                self.spec.source.display(),
                d.files,
                d.bytes
            ),
            Ok(_) => {}
        }
    }
}

/// An exclude rule (request::rules' short form) matching exactly the wire
/// path `p`: anchored at the transfer root, wildmatch's special bytes
/// escaped.
fn hold_rule(p: &[u8]) -> Vec<u8> {
    let mut r = b"- /".to_vec();
    for &c in p {
        if matches!(c, b'*' | b'?' | b'[' | b'\\') {
            r.push(b'\\');
        }
        r.push(c);
    }
    r
}

fn sleep_unless(stop: &AtomicBool, d: Duration) {
    let end = Instant::now() + d;
    while !stop.load(Relaxed) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50).min(end - Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ramsys_proto::control::Selection;

    #[test]
    fn a_hold_rule_excludes_exactly_its_path() {
        let odd: &[u8] = b"top/a*[b]/f?\\x y ";
        let sel = Selection {
            rules: vec![hold_rule(odd), b"- *.tmp".to_vec()],
            ..Default::default()
        };
        let f = Filter::new(&sel).unwrap();
        assert!(f.excluded(odd, false));
        for other in [
            &b"top/aX[b]/fz\\x y "[..],
            b"top/a*b/f?\\x y ",
            b"top/a*[b]/f?\\x y",
            b"other/top/a*[b]/f?\\x y ",
        ] {
            assert!(
                !f.excluded(other, false),
                "{}",
                String::from_utf8_lossy(other)
            );
        }
        assert!(f.excluded(b"top/x.tmp", false));
    }
}
