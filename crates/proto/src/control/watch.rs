//! A watch channel's operations (issue 38): what a replication job applies at
//! its destination before a batch's data, and what became of each.

use serde::{Deserialize, Serialize};

/// Version of the watch channel ([`Control::WatchOpen`](super::Control::WatchOpen)):
/// 1, the operations below; 2, also [`WATCH_SESSIONS`].
pub const WATCH_VERSION: u16 = 2;

/// The first version whose channel also carries the job's sessions, one per
/// batch (Control::WatchBatch, issue 38): a server answering a lower
/// version (an older daemon) gets a session per batch on connections of
/// their own, as before.
pub const WATCH_SESSIONS: u16 = 2;

/// An operation a replication job applies at its destination before a
/// batch's data (issue 38): paths relative to WatchOpen's `dest`, as the
/// job's sessions name them on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WatchOp {
    /// Rename `from` to `to` (replacing what is there), only if `from` is
    /// a directory when `dir`, a non-directory otherwise.
    Rename {
        from: Vec<u8>,
        to: Vec<u8>,
        dir: bool,
    },
    /// Remove `path` (with everything below it when `dir`), only if it is
    /// of that kind.
    Delete { path: Vec<u8>, dir: bool },
    /// Set a directory's mode (permission bits) and mtime.
    DirAttrs {
        path: Vec<u8>,
        mode: u32,
        mtime_s: i64,
        mtime_ns: u32,
    },
}

/// What became of one [`WatchOp`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WatchResult {
    Done,
    /// The entry to rename, delete or set was not there (or of the other
    /// kind): nothing done. For a rename the client sends `to` as data.
    Missing,
    /// It could not be done: the reason, one line.
    Failed(String),
}
