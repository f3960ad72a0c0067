//! Continuous replication (issue 38, docs/WATCH.md): `ramsys sync --watch
//! SRC DST` and the daemon's `[[replicate]]` jobs run the same loop.
//!
//! 1. The detector starts first (crates/watch: fanotify or inotify), so
//!    nothing done during the first scan is missed.
//! 2. A full sync (the job's own `sync`: filters, --delete, archive flags),
//!    then batches as changes come: the operations of the batch (renames,
//!    deletes, directory attributes) on the job's watch channel to the
//!    destination daemon (engine watchops: one connection for the job's
//!    life), then its files as a sync session that lists exactly them
//!    (`--files-from` semantics; the scan stats only the listed names), on
//!    the same connection when the daemon keeps sessions there.
//! 3. A batch that fails (DST slow, away, restarting) goes back into the
//!    pending set and is retried with back-off: the job falls behind and
//!    catches up, never losing a change. The pending set is journalled
//!    (crates/watch journal), so a crash loses nothing either; a full scan
//!    at start covers what changed while nothing watched.
//!
//! What a batch costs beyond its data is one watch-channel round trip (if
//! it has operations) and one session on the same channel (no connect, no
//! handshake: its data links, one metadata round trip, Complete);
//! docs/WATCH.md measures it and says what keeping the data links too
//! would save.

pub mod agent;
pub mod daemon;
mod job;
mod target;

use std::path::PathBuf;

pub use job::{run, JobSpec, Output};
pub use target::Target;

/// Where a job keeps its journal by default: a name derived from the job.
pub fn default_journal(job: &str) -> PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(|| PathBuf::from("/var/tmp"));
    let h = xxhash_rust::xxh3::xxh3_64(job.as_bytes());
    base.join("ramsys/watch").join(format!("{h:016x}.sqlite"))
}
