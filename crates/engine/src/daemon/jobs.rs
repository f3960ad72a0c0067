//! Continuous replication jobs' counters (issue 38): what `ramsys status
//! --jobs` and `/metrics` show of each job a daemon runs (`[[replicate]]`
//! in its config) or an agent runs (`sync --watch`). The job's runner
//! (crates/ramsys `replicate`) updates them; a snapshot reads them.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// One job's live counters.
#[derive(Debug, Default)]
pub struct JobStats {
    pub name: String,
    pub source: String,
    pub dest: String,
    /// Change detection in use (fanotify, inotify) and why, one line.
    pub backend: Mutex<String>,
    /// "scanning", "watching", "sending", "retrying", "stopped".
    pub state: Mutex<String>,
    pub last_error: Mutex<String>,
    /// Changes reported by the kernel (after the job's filters).
    pub changes: AtomicU64,
    /// Files whose data was sent, and their bytes.
    pub files: AtomicU64,
    pub bytes: AtomicU64,
    /// Renames, deletes and directory attributes applied at DST.
    pub ops: AtomicU64,
    pub batches: AtomicU64,
    pub failed_batches: AtomicU64,
    pub full_scans: AtomicU64,
    pub overflows: AtomicU64,
    /// Paths and operations waiting, and a batch in flight's.
    pub queue_depth: AtomicU64,
    /// Age of the oldest change not yet at DST, ms (0: in sync).
    pub lag_ms: AtomicU64,
    /// Bytes known to be waiting or in flight.
    pub bytes_behind: AtomicU64,
    /// Rates over the last seconds, f64 bits.
    pub changes_per_s: AtomicU64,
    pub files_per_s: AtomicU64,
}

impl JobStats {
    pub fn new(name: &str, source: &str, dest: &str) -> JobStats {
        JobStats {
            name: name.into(),
            source: source.into(),
            dest: dest.into(),
            ..Default::default()
        }
    }

    pub fn set(m: &Mutex<String>, v: impl Into<String>) {
        *m.lock().unwrap() = v.into();
    }

    pub fn set_rate(a: &AtomicU64, v: f64) {
        a.store(v.to_bits(), Relaxed);
    }

    pub fn status(&self) -> JobStatus {
        let f = |a: &AtomicU64| f64::from_bits(a.load(Relaxed));
        JobStatus {
            name: self.name.clone(),
            source: self.source.clone(),
            dest: self.dest.clone(),
            backend: self.backend.lock().unwrap().clone(),
            state: self.state.lock().unwrap().clone(),
            last_error: self.last_error.lock().unwrap().clone(),
            lag_s: self.lag_ms.load(Relaxed) as f64 / 1000.0,
            bytes_behind: self.bytes_behind.load(Relaxed),
            events_per_s: f(&self.changes_per_s),
            files_per_s: f(&self.files_per_s),
            queue_depth: self.queue_depth.load(Relaxed),
            changes: self.changes.load(Relaxed),
            files: self.files.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            ops: self.ops.load(Relaxed),
            batches: self.batches.load(Relaxed),
            failed_batches: self.failed_batches.load(Relaxed),
            full_scans: self.full_scans.load(Relaxed),
            overflows: self.overflows.load(Relaxed),
        }
    }
}

/// A job as `ramsys status --json` lists it (docs/DAEMON.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JobStatus {
    pub name: String,
    pub source: String,
    pub dest: String,
    pub backend: String,
    pub state: String,
    pub last_error: String,
    /// Seconds since the oldest change not yet at DST (0: in sync).
    pub lag_s: f64,
    pub bytes_behind: u64,
    pub events_per_s: f64,
    pub files_per_s: f64,
    pub queue_depth: u64,
    pub changes: u64,
    pub files: u64,
    pub bytes: u64,
    pub ops: u64,
    pub batches: u64,
    pub failed_batches: u64,
    pub full_scans: u64,
    pub overflows: u64,
}

/// The jobs of one daemon.
#[derive(Debug, Default)]
pub struct JobBoard {
    jobs: Mutex<Vec<Arc<JobStats>>>,
}

impl JobBoard {
    pub fn add(&self, j: Arc<JobStats>) {
        self.jobs.lock().unwrap().push(j);
    }

    pub fn snapshot(&self) -> Vec<JobStatus> {
        self.jobs
            .lock()
            .unwrap()
            .iter()
            .map(|j| j.status())
            .collect()
    }
}
