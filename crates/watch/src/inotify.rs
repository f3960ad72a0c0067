//! inotify, where fanotify is not allowed (issue 38): one watch per
//! directory (the `inotify` crate), added as the tree is walked at start
//! and as directories appear. Watches are a per-user kernel resource
//! (`fs.inotify.max_user_watches`); when they run out the detector says so
//! in one line and the rest of the tree is left to the job's periodic full
//! scan. A rename is a MOVED_FROM/MOVED_TO pair with one cookie; a
//! MOVED_FROM without its pair moved out of the tree (a delete), a
//! MOVED_TO without one moved in (a tree to scan).
//!
//! Memory: one path per watched directory, nothing per file.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use inotify::{EventMask, Inotify as Ino, WatchDescriptor, WatchMask};

use crate::change::{join, moved, under, Change};

pub struct Inotify {
    ino: Ino,
    root: PathBuf,
    wds: HashMap<WatchDescriptor, Vec<u8>>,
    /// A MOVED_FROM waiting for its MOVED_TO: (cookie, path, dir).
    from: Option<(u32, Vec<u8>, bool)>,
    buf: Vec<u8>,
    /// The watch limit was hit (reported once).
    limited: bool,
}

/// A raw event copied out of the read buffer.
struct Raw {
    wd: WatchDescriptor,
    mask: EventMask,
    cookie: u32,
    name: Option<Vec<u8>>,
}

fn mask() -> WatchMask {
    WatchMask::CLOSE_WRITE
        | WatchMask::MODIFY
        | WatchMask::ATTRIB
        | WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::DONT_FOLLOW
        | WatchMask::EXCL_UNLINK
        | WatchMask::ONLYDIR
}

/// `fs.inotify.max_user_watches`.
pub fn max_user_watches() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/fs/inotify/max_user_watches")
        .ok()?
        .trim()
        .parse()
        .ok()
}

impl Inotify {
    /// Watch every directory below `root`.
    pub fn open(root: &Path) -> io::Result<Inotify> {
        let mut me = Inotify {
            ino: Ino::init()?,
            root: root.canonicalize()?,
            wds: HashMap::new(),
            from: None,
            buf: vec![0; 256 << 10],
            limited: false,
        };
        me.add_tree(b"")?;
        tracing::info!(
            "inotify: watching {} directories (fs.inotify.max_user_watches = {})",
            me.wds.len(),
            max_user_watches().map_or("?".into(), |n| n.to_string())
        );
        Ok(me)
    }

    pub fn watched(&self) -> usize {
        self.wds.len()
    }

    fn abs(&self, rel: &[u8]) -> PathBuf {
        if rel.is_empty() {
            self.root.clone()
        } else {
            self.root.join(OsStr::from_bytes(rel))
        }
    }

    /// Watch `rel` and every directory below it (depth first, one
    /// directory's names at a time).
    fn add_tree(&mut self, rel: &[u8]) -> io::Result<()> {
        let mut stack = vec![rel.to_vec()];
        while let Some(d) = stack.pop() {
            if !self.add(&d)? {
                return Ok(());
            }
            let Ok(rd) = std::fs::read_dir(self.abs(&d)) else {
                continue;
            };
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(join(&d, e.file_name().as_bytes()));
                }
            }
        }
        Ok(())
    }

    /// One watch; false once the limit is reached.
    fn add(&mut self, rel: &[u8]) -> io::Result<bool> {
        if self.limited {
            return Ok(false);
        }
        match self.ino.watches().add(self.abs(rel), mask()) {
            Ok(wd) => {
                self.wds.insert(wd, rel.to_vec());
                Ok(true)
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                self.limited = true;
                eprintln!(
                    "ramsys: inotify: watch limit reached at {} directories \
                     (fs.inotify.max_user_watches = {}): changes in the others are \
                     found by the periodic full scan; raise the limit, or run as root \
                     for fanotify",
                    self.wds.len(),
                    max_user_watches().map_or("?".into(), |n| n.to_string())
                );
                Ok(false)
            }
            // Gone or replaced by a non-directory since it was listed.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ELOOP)
                ) =>
            {
                Ok(true)
            }
            Err(e) => Err(e),
        }
    }

    /// Forget the watches at and below `rel` (moved out of the tree).
    fn drop_tree(&mut self, rel: &[u8]) {
        let gone: Vec<WatchDescriptor> = self
            .wds
            .iter()
            .filter(|(_, p)| under(p, rel))
            .map(|(w, _)| w.clone())
            .collect();
        for w in gone {
            self.wds.remove(&w);
            let _ = self.ino.watches().remove(w);
        }
    }

    pub(crate) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.ino.as_fd()
    }

    /// Wait up to `timeout` for events and append them to `out`; true when
    /// the queue was found empty (detect::Detector::read).
    pub fn read(&mut self, out: &mut Vec<Change>, timeout: Duration) -> io::Result<bool> {
        if !crate::poll::poll_in(self.ino.as_raw_fd(), timeout)? {
            self.flush_from(out);
            return Ok(true);
        }
        let mut drained = false;
        for _ in 0..64 {
            let raws = match self.ino.read_events(&mut self.buf) {
                Ok(evs) => evs
                    .map(|e| Raw {
                        wd: e.wd,
                        mask: e.mask,
                        cookie: e.cookie,
                        name: e.name.map(|n| n.as_bytes().to_vec()),
                    })
                    .collect::<Vec<_>>(),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    drained = true;
                    break;
                }
                Err(e) => return Err(e),
            };
            if raws.is_empty() {
                drained = true;
                break;
            }
            for r in raws {
                self.event(r, out)?;
            }
        }
        // A MOVED_FROM with no MOVED_TO right behind it: give the pair a
        // moment, else it left the tree.
        if self.from.is_some()
            && crate::poll::poll_in(self.ino.as_raw_fd(), Duration::from_millis(2))?
        {
            return self.read(out, Duration::ZERO);
        }
        self.flush_from(out);
        Ok(drained)
    }

    fn flush_from(&mut self, out: &mut Vec<Change>) {
        if let Some((_, path, dir)) = self.from.take() {
            if dir {
                self.drop_tree(&path);
            }
            out.push(Change::Deleted { path, dir });
        }
    }

    fn event(&mut self, r: Raw, out: &mut Vec<Change>) -> io::Result<()> {
        if r.mask.contains(EventMask::Q_OVERFLOW) {
            self.flush_from(out);
            out.push(Change::Overflow);
            return Ok(());
        }
        if r.mask.contains(EventMask::IGNORED) {
            self.wds.remove(&r.wd);
            return Ok(());
        }
        let Some(dirp) = self.wds.get(&r.wd).cloned() else {
            return Ok(());
        };
        let path = match &r.name {
            Some(n) => join(&dirp, n),
            None => dirp,
        };
        let dir = r.mask.contains(EventMask::ISDIR);
        if r.mask.contains(EventMask::MOVED_TO) {
            match self.from.take() {
                Some((c, from, d)) if c == r.cookie => {
                    for p in self.wds.values_mut() {
                        if under(p, &from) {
                            *p = moved(p, &from, &path);
                        }
                    }
                    out.push(Change::Renamed {
                        from,
                        to: path,
                        dir: d,
                    });
                    return Ok(());
                }
                other => {
                    self.from = other;
                    self.flush_from(out);
                }
            }
            if dir {
                self.add_tree(&path)?;
            }
            out.push(Change::Created {
                path,
                dir,
                settled: true,
            });
            return Ok(());
        }
        self.flush_from(out);
        if r.mask.contains(EventMask::MOVED_FROM) {
            self.from = Some((r.cookie, path, dir));
        } else if r.mask.contains(EventMask::CREATE) {
            if dir {
                self.add_tree(&path)?;
            }
            let settled = dir
                || !std::fs::symlink_metadata(self.abs(&path))
                    .is_ok_and(|m| m.file_type().is_file());
            out.push(Change::Created { path, dir, settled });
        } else if r.mask.contains(EventMask::MODIFY) {
            out.push(Change::Modified(path));
        } else if r.mask.contains(EventMask::CLOSE_WRITE) {
            out.push(Change::Closed(path));
        } else if r.mask.contains(EventMask::ATTRIB) {
            out.push(Change::Attrib { path, dir });
        } else if r.mask.contains(EventMask::DELETE) {
            out.push(Change::Deleted { path, dir });
        }
        Ok(())
    }
}
