//! Which kernel interface watches the tree (issue 38): fanotify where the
//! kernel and privileges allow, inotify otherwise; the choice and why is
//! one line for the user.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use crate::change::Change;
use crate::fanotify::Fanotify;
use crate::inotify::Inotify;

/// `--watch-backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// fanotify, else inotify.
    #[default]
    Auto,
    Fanotify,
    Inotify,
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Backend::Auto),
            "fanotify" => Ok(Backend::Fanotify),
            "inotify" => Ok(Backend::Inotify),
            _ => Err(format!("expected auto, fanotify or inotify, got {s:?}")),
        }
    }
}

enum Inner {
    Fan(Box<Fanotify>),
    Ino(Box<Inotify>),
}

/// The change source of one tree.
pub struct Detector {
    inner: Inner,
    /// What was chosen and why, one line.
    pub note: String,
    /// Set once the queue is seen readable, before it is read; cleared by
    /// [`Detector::applied`] (read by [`Backlog::empty`]).
    held: Arc<AtomicBool>,
    /// Test hook `$RAMSYS_WATCH_STALL_FILE` ([`Detector::read`]), read once.
    stall: Option<PathBuf>,
}

/// Whether every event the kernel has queued for a [`Detector`] has been
/// applied by its reader: the queue is empty and the reader holds nothing it
/// read. Once so after a batch ended, no rename from before the batch's
/// reads can still come (docs/WATCH.md "Renames behind a batch"), and the
/// pending set forgets what the batch read ([`crate::Pending::caught_up`]).
#[derive(Clone)]
pub struct Backlog {
    /// A duplicate of the detector's descriptor: the same queue.
    fd: Arc<OwnedFd>,
    held: Arc<AtomicBool>,
}

impl Backlog {
    /// Ask under the lock the reader applies its changes under (so what it
    /// read is either applied or still `held`).
    pub fn empty(&self) -> bool {
        // The queue before `held`: the reader sets `held` before it reads,
        // so a queue it emptied in between shows as held.
        let queued = crate::poll::poll_in(self.fd.as_raw_fd(), Duration::ZERO).unwrap_or(true);
        !queued && !self.held.load(SeqCst)
    }
}

impl Detector {
    /// Start watching `root` (before the job's first scan, so nothing
    /// done during the scan is missed).
    pub fn open(root: &Path, want: Backend) -> io::Result<Detector> {
        let fan = match want {
            Backend::Inotify => None,
            _ => Some(Fanotify::open(root)),
        };
        match fan {
            Some(Ok(f)) => Ok(Detector {
                inner: Inner::Fan(Box::new(f)),
                note: "fanotify (one mark for the file system, directory-entry events)".into(),
                held: Arc::default(),
                stall: stall_file(),
            }),
            Some(Err(e)) if want == Backend::Fanotify => Err(io::Error::new(
                e.kind(),
                format!("fanotify: {e} (needs root and Linux 5.17 or later)"),
            )),
            other => {
                let why = match other {
                    Some(Err(e)) => format!("fanotify unavailable ({e}); "),
                    _ => String::new(),
                };
                let i = Inotify::open(root)?;
                let limit =
                    crate::inotify::max_user_watches().map_or("?".into(), |n| n.to_string());
                Ok(Detector {
                    note: format!(
                        "{why}inotify ({} directories watched, max_user_watches {limit})",
                        i.watched()
                    ),
                    inner: Inner::Ino(Box::new(i)),
                    held: Arc::default(),
                    stall: stall_file(),
                })
            }
        }
    }

    pub fn name(&self) -> &'static str {
        match self.inner {
            Inner::Fan(_) => "fanotify",
            Inner::Ino(_) => "inotify",
        }
    }

    fn fd(&self) -> BorrowedFd<'_> {
        match &self.inner {
            Inner::Fan(f) => f.fd(),
            Inner::Ino(i) => i.fd(),
        }
    }

    /// Asks whether this detector's reader is behind the kernel (from
    /// another thread too).
    pub fn backlog(&self) -> io::Result<Backlog> {
        Ok(Backlog {
            fd: Arc::new(self.fd().try_clone_to_owned()?),
            held: self.held.clone(),
        })
    }

    /// Wait up to `timeout` for changes; append them to `out`. Call
    /// [`Detector::applied`] once they are applied. True when the queue was
    /// found empty before returning: every event queued before this call
    /// is in `out` (or was in an earlier call's).
    ///
    /// Test hook: while the file `$RAMSYS_WATCH_STALL_FILE` exists, nothing
    /// is read (the kernel queue fills up and overflows, as under a reader
    /// that cannot keep up). Looked at again once the queue is readable, so
    /// no event queued after the file appeared is read until it goes.
    pub fn read(&mut self, out: &mut Vec<Change>, timeout: Duration) -> io::Result<bool> {
        let stalled = |d: &Detector| d.stall.as_deref().is_some_and(Path::exists);
        if stalled(self) {
            std::thread::sleep(timeout.max(Duration::from_millis(10)));
            return Ok(false);
        }
        if !crate::poll::poll_in(self.fd().as_raw_fd(), timeout)? {
            return Ok(true);
        }
        if stalled(self) {
            return Ok(false);
        }
        self.held.store(true, SeqCst);
        match &mut self.inner {
            Inner::Fan(f) => f.read(out, Duration::ZERO),
            Inner::Ino(i) => i.read(out, Duration::ZERO),
        }
    }

    /// What [`Detector::read`] returned is in the pending set (call under
    /// the lock [`Backlog::empty`] is asked under).
    pub fn applied(&self) {
        self.held.store(false, SeqCst);
    }
}

fn stall_file() -> Option<PathBuf> {
    std::env::var_os("RAMSYS_WATCH_STALL_FILE").map(PathBuf::from)
}

#[cfg(test)]
mod tests;
