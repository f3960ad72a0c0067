//! Which kernel interface watches the tree (issue 38): fanotify where the
//! kernel and privileges allow, inotify otherwise; the choice and why is
//! one line for the user.

use std::io;
use std::path::Path;
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

    /// Wait up to `timeout` for changes; append them to `out`.
    ///
    /// Test hook: while the file `$RAMSYS_WATCH_STALL_FILE` exists, nothing
    /// is read (the kernel queue fills up and overflows, as under a reader
    /// that cannot keep up).
    pub fn read(&mut self, out: &mut Vec<Change>, timeout: Duration) -> io::Result<()> {
        if let Some(f) = std::env::var_os("RAMSYS_WATCH_STALL_FILE") {
            if Path::new(&f).exists() {
                std::thread::sleep(timeout.max(Duration::from_millis(10)));
                return Ok(());
            }
        }
        match &mut self.inner {
            Inner::Fan(f) => f.read(out, timeout),
            Inner::Ino(i) => i.read(out, timeout),
        }
    }
}

#[cfg(test)]
mod tests;
