//! fanotify with directory-entry events (issue 38): one mark for the
//! whole file system holding the watched tree (`FAN_MARK_FILESYSTEM`, so
//! no per-directory watch and no watch limit), events reported with the
//! parent directory's file handle and the entry's name
//! (`FAN_REPORT_DFID_NAME`, Linux 5.9), renames as one event with both
//! names (`FAN_RENAME`, 5.17). Needs CAP_SYS_ADMIN (the mark) and
//! CAP_DAC_READ_SEARCH (`open_by_handle_at`, to turn a handle into a path).
//!
//! A handle is resolved by opening it (`O_PATH`) and reading the path of
//! the descriptor; a bounded cache keeps the answers (inside the tree: the
//! path; outside: nothing), so a busy file system outside the tree costs a
//! hash lookup per event. The cache is cleared whenever a directory is
//! renamed or removed, since its paths may have changed. Events outside
//! the tree are dropped; nothing is kept per file.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::change::{join, Change};
use crate::handle::{self, name_to_handle};

/// Most cached directory handles; the cache is emptied when full.
const CACHE_MAX: usize = 65_536;

pub struct Fanotify {
    fd: OwnedFd,
    /// The tree's root: the mount descriptor for open_by_handle_at.
    mount: OwnedFd,
    root: PathBuf,
    cache: HashMap<Vec<u8>, Option<Vec<u8>>>,
    buf: Vec<u8>,
}

/// A directory handle and an entry name, as an info record carries them.
struct Fid<'a> {
    /// handle_type (LE) followed by the handle bytes: the cache key.
    key: Vec<u8>,
    name: &'a [u8],
}

impl Fanotify {
    pub const MASK: u64 = libc::FAN_CREATE
        | libc::FAN_DELETE
        | libc::FAN_RENAME
        | libc::FAN_CLOSE_WRITE
        | libc::FAN_MODIFY
        | libc::FAN_ATTRIB
        | libc::FAN_ONDIR;

    /// Mark the file system holding `root`. Errors (no privilege, an old
    /// kernel, a file system without handles) leave the caller to inotify.
    pub fn open(root: &Path) -> io::Result<Fanotify> {
        let root = root.canonicalize()?;
        let flags = libc::FAN_CLASS_NOTIF
            | libc::FAN_CLOEXEC
            | libc::FAN_NONBLOCK
            | libc::FAN_REPORT_DFID_NAME;
        let fd = handle::fanotify_init(flags)?;
        handle::fanotify_mark(
            fd.as_fd(),
            libc::FAN_MARK_ADD | libc::FAN_MARK_FILESYSTEM,
            Self::MASK,
            &root,
        )?;
        let mount: OwnedFd = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(&root)?
            .into();
        let mut f = Fanotify {
            fd,
            mount,
            root,
            cache: HashMap::new(),
            buf: vec![0; 256 << 10],
        };
        // open_by_handle_at needs CAP_DAC_READ_SEARCH: find out now, not
        // at the first event.
        f.probe()?;
        Ok(f)
    }

    /// Resolve the root's own handle once.
    fn probe(&mut self) -> io::Result<()> {
        let (key, _) = name_to_handle(&self.root)?;
        match self.resolve_key(&key)? {
            Some(p) if p.is_empty() => Ok(()),
            _ => Err(io::Error::other(
                "the root's handle does not resolve to the root",
            )),
        }
    }

    pub(crate) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Wait up to `timeout` for events and append them to `out`; true when
    /// the queue was found empty (detect::Detector::read).
    pub fn read(&mut self, out: &mut Vec<Change>, timeout: Duration) -> io::Result<bool> {
        if !crate::poll::poll_in(self.fd.as_raw_fd(), timeout)? {
            return Ok(true);
        }
        // A bounded number of reads per call keeps batches flowing.
        for _ in 0..64 {
            // SAFETY: reading into our own buffer.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::WouldBlock {
                    return Ok(true);
                }
                return Err(e);
            }
            if n == 0 {
                return Ok(true);
            }
            let buf = std::mem::take(&mut self.buf);
            let r = self.parse(&buf[..n as usize], out);
            self.buf = buf;
            r?;
        }
        Ok(false)
    }

    fn parse(&mut self, mut b: &[u8], out: &mut Vec<Change>) -> io::Result<()> {
        const META: usize = std::mem::size_of::<libc::fanotify_event_metadata>();
        while b.len() >= META {
            // SAFETY: at least META bytes; read_unaligned copies them.
            let m: libc::fanotify_event_metadata =
                unsafe { std::ptr::read_unaligned(b.as_ptr().cast()) };
            let len = m.event_len as usize;
            if m.vers != libc::FANOTIFY_METADATA_VERSION || len < META || len > b.len() {
                return Err(io::Error::other("fanotify: malformed event"));
            }
            self.event(&m, &b[m.metadata_len as usize..len], out);
            b = &b[len..];
        }
        Ok(())
    }

    /// One event's info records: (DFID_NAME or OLD_DFID_NAME, NEW_DFID_NAME).
    fn infos(mut b: &[u8]) -> (Option<Fid<'_>>, Option<Fid<'_>>) {
        let (mut main, mut new) = (None, None);
        while b.len() >= 4 {
            let typ = b[0];
            let len = u16::from_ne_bytes([b[2], b[3]]) as usize;
            if len < 4 || len > b.len() {
                break;
            }
            let rec = &b[..len];
            b = &b[len..];
            // header (4), fsid (8), handle_bytes u32, handle_type i32, handle, name.
            if rec.len() < 20 {
                continue;
            }
            let hb = u32::from_ne_bytes(rec[12..16].try_into().unwrap()) as usize;
            if 20 + hb > rec.len() {
                continue;
            }
            let mut key = rec[16..20].to_vec();
            key.extend_from_slice(&rec[20..20 + hb]);
            let tail = &rec[20 + hb..];
            let name = &tail[..tail.iter().position(|&c| c == 0).unwrap_or(tail.len())];
            let fid = Fid { key, name };
            match typ {
                libc::FAN_EVENT_INFO_TYPE_NEW_DFID_NAME => new = Some(fid),
                libc::FAN_EVENT_INFO_TYPE_DFID_NAME
                | libc::FAN_EVENT_INFO_TYPE_OLD_DFID_NAME
                | libc::FAN_EVENT_INFO_TYPE_DFID => main = Some(fid),
                _ => {}
            }
        }
        (main, new)
    }

    fn event(&mut self, m: &libc::fanotify_event_metadata, info: &[u8], out: &mut Vec<Change>) {
        let mask = m.mask;
        if mask & libc::FAN_Q_OVERFLOW != 0 {
            out.push(Change::Overflow);
            return;
        }
        let dir = mask & libc::FAN_ONDIR != 0;
        let (main, new) = Self::infos(info);
        let Some(main) = main else { return };
        let at = self.path_of(&main);
        if mask & libc::FAN_RENAME != 0 {
            let to = new.and_then(|n| self.path_of(&n));
            match (at, to) {
                (Some(from), Some(to)) => out.push(Change::Renamed { from, to, dir }),
                (Some(path), None) => out.push(Change::Deleted { path, dir }),
                (None, Some(path)) => out.push(Change::Created {
                    path,
                    dir,
                    settled: true,
                }),
                (None, None) => {}
            }
            if dir {
                self.cache.clear();
            }
            return;
        }
        let Some(path) = at else { return };
        if mask & libc::FAN_CREATE != 0 {
            let settled = dir || !self.is_regular(&path);
            out.push(Change::Created {
                path: path.clone(),
                dir,
                settled,
            });
        }
        if mask & libc::FAN_MODIFY != 0 {
            out.push(Change::Modified(path.clone()));
        }
        if mask & libc::FAN_ATTRIB != 0 {
            out.push(Change::Attrib {
                path: path.clone(),
                dir,
            });
        }
        if mask & libc::FAN_CLOSE_WRITE != 0 {
            out.push(Change::Closed(path.clone()));
        }
        if mask & libc::FAN_DELETE != 0 {
            out.push(Change::Deleted { path, dir });
            if dir {
                self.cache.clear();
            }
        }
    }

    fn is_regular(&self, rel: &[u8]) -> bool {
        let p = self.root.join(std::ffi::OsStr::from_bytes(rel));
        std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_file())
    }

    /// The entry's path below the root, None outside it (or gone).
    fn path_of(&mut self, f: &Fid) -> Option<Vec<u8>> {
        let dir = self.resolve_key(&f.key).ok().flatten()?;
        Some(match f.name {
            b"" | b"." => dir,
            n => join(&dir, n),
        })
    }

    fn resolve_key(&mut self, key: &[u8]) -> io::Result<Option<Vec<u8>>> {
        if let Some(v) = self.cache.get(key) {
            return Ok(v.clone());
        }
        if key.len() < 4 {
            return Ok(None);
        }
        let mut fh = Vec::with_capacity(8 + key.len());
        fh.extend_from_slice(&((key.len() - 4) as u32).to_ne_bytes());
        fh.extend_from_slice(key);
        let fd = match handle::open_by_handle(self.mount.as_fd(), &mut fh) {
            Ok(fd) => fd,
            // A directory already gone (ESTALE): nothing to report.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ESTALE) | Some(libc::ENOENT)) => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        let p = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        let b = p.as_os_str().as_bytes();
        if b.ends_with(b" (deleted)") {
            return Ok(None);
        }
        let rel = p
            .strip_prefix(&self.root)
            .ok()
            .map(|r| r.as_os_str().as_bytes().to_vec());
        if self.cache.len() >= CACHE_MAX {
            self.cache.clear();
        }
        self.cache.insert(key.to_vec(), rel.clone());
        Ok(rel)
    }
}
