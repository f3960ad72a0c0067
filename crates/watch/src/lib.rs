//! Change detection for continuous replication (issue 38; seed 000 ch. 6:
//! RAMSYS is an *asynchronous replication* system, and this is what keeps
//! its second site following the first without a rescan per minute).
//!
//! - [`detect`]: a [`Detector`] reads the kernel's events for one source
//!   tree, fanotify with directory-entry events (`FAN_REPORT_DFID_NAME`, one
//!   mark for the whole file system, [`fanotify`]) where the kernel and
//!   privileges allow, inotify (one watch per directory, [`inotify`])
//!   otherwise, and turns them into [`Change`]s with paths relative to the
//!   tree. Nothing is kept per file: fanotify keeps a bounded cache of
//!   directory handles, inotify one path per watched directory.
//! - [`pending`]: coalesces changes into [`Batch`]es: renames and deletes
//!   as ordered operations, files once closed after writing (or quiet for
//!   a while), directories that appeared as subtrees to scan; a queue
//!   overflow or a pending set above its cap asks for a full scan.
//! - [`journal`]: the pending set in SQLite, so a crash of the job loses
//!   no operation it had accepted (docs/WATCH.md).
//!
//! The crate knows nothing of sessions or protocols: the agent and the
//! daemon (crates/ramsys `replicate`) drive it.

pub mod change;
pub mod detect;
pub mod fanotify;
mod handle;
pub mod inotify;
pub mod journal;
pub mod pending;
mod poll;

pub use change::Change;
pub use detect::{Backend, Backlog, Detector};
pub use journal::Journal;

pub use pending::{Batch, Op, Pending, PendingConfig};
