//! The sink's half of an archive copy: special files are made, and owners,
//! extended attributes, ACLs and atimes applied, once every file is in
//! place (sink::tree's deferred pass, before directories get their mode and
//! mtime, so nothing made here changes a directory's mtime afterwards).
//! A windowed session (issue 36) applies a regular file's as soon as the
//! file has settled and its Attrs came, so nothing of it outlives its
//! window; directories, symlinks and special files still wait for the end.
//!
//! Every call is relative to a directory opened through the sink's
//! confined [`Root`] and never follows the entry itself (fchownat and
//! utimensat with AT_SYMLINK_NOFOLLOW, mknodat, l*xattr through
//! /proc/self/fd/DIR/NAME), so a symlink swapped in cannot redirect them.
//! What is already as asked is left alone (a second sync changes nothing).
//! What the process or the [`Policy`] does not allow is counted and noted
//! in ONE line at the end, not per file; other errors are failures.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use ramsys_proto::attrs::{preserve, special, Attrs};
use ramsys_proto::control::{Entry, EntryKind, Failure};

use super::ids::Names;
use super::{acl, Policy};
use crate::storage::fsops::{lstat_at, split_parent, Root};
use rustix::fs::{AtFlags, FileType, Gid, Mode, Timespec, Timestamps, Uid, UTIME_OMIT};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
    Symlink,
    Special,
}

/// One entry the pass visits.
struct Rec {
    path: Vec<u8>,
    kind: Kind,
    mode: u32,
    mtime: (i64, u32),
    attrs: Option<Box<Attrs>>,
}

/// A FIFO, socket or device node to make.
struct Special {
    path: Vec<u8>,
    kind: u8,
    rdev: u64,
    mode: u32,
    mtime: (i64, u32),
}

/// Counts of what could not be kept (the one-line note).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NotKept {
    pub owners: u64,
    pub groups: u64,
    pub devices: u64,
    pub xattrs: u64,
    pub acls: u64,
}

impl NotKept {
    /// The note, or None when everything was kept.
    pub fn line(&self, why: &str) -> Option<String> {
        let mut parts = Vec::new();
        for (n, what) in [
            (self.owners, "owner"),
            (self.groups, "group"),
            (self.devices, "device node"),
            (self.xattrs, "extended attributes"),
            (self.acls, "ACL"),
        ] {
            if n > 0 {
                parts.push(format!("{what} of {n} entries"));
            }
        }
        if parts.is_empty() {
            return None;
        }
        Some(format!("not kept ({why}): {}", parts.join(", ")))
    }
}

/// The sink's archive state for one session.
pub struct ArchiveSink {
    flags: u32,
    policy: Policy,
    root_user: bool,
    names: Names,
    recs: Vec<Rec>,
    by_id: HashMap<u64, usize>,
    specials: Vec<Special>,
    pub not_kept: NotKept,
    /// A windowed session (issue 36): regular files are held apart.
    windowed: bool,
    /// Its regular files, by id: held from their record until both their
    /// Attrs came and they settled.
    files: BTreeMap<u64, Rec>,
    /// Every file of an id below it has settled (the sink's released
    /// slots).
    settled: u64,
    /// What failed of the attributes applied during the payload.
    failures: Vec<Failure>,
    /// Bytes `files` holds (records, paths, Attrs), for the session's
    /// file-list accounting.
    held: u64,
}

/// What a held record costs: the record, its path and its Attrs (their
/// wire size, near what they hold).
fn cost(r: &Rec) -> u64 {
    let attrs = r.attrs.as_deref().map_or(0, |a| {
        std::mem::size_of::<Attrs>() + ramsys_proto::attrs::attrs_wire_size(a)
    });
    (std::mem::size_of::<Rec>() + r.path.len() + attrs) as u64
}

fn cstr(b: &[u8]) -> io::Result<&[u8]> {
    crate::storage::fsops::cpath(b)
}

/// What [`ArchiveSink::owners`] did.
struct Owned {
    chowned: bool,
    /// The file has the owner the source named.
    owner: bool,
    /// The file has the group the source named.
    group: bool,
}

fn denied(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EPERM) | Some(libc::EACCES) | Some(libc::ENOTSUP)
    )
}

/// The parent directory of the last entry given its attributes, kept for
/// one pass (a window's files, or the end's records): entries come in
/// directory order, so one openat2 serves a directory's files where one per
/// file cost 2.5 s of a 6.2 s no-change `sync -a` of 1 M files here.
type DirCache = Option<(Vec<u8>, OwnedFd)>;

/// `parent` under `root`, from `cache` when it holds that directory.
fn parent_dir<'a>(root: &Root, cache: &'a mut DirCache, parent: &[u8]) -> io::Result<&'a OwnedFd> {
    if cache.as_ref().is_none_or(|(p, _)| p != parent) {
        *cache = None;
        *cache = Some((parent.to_vec(), root.open_dir(parent)?));
    }
    Ok(&cache.as_ref().expect("just filled").1)
}

/// `name` in the open directory `dir`, as a path the l*xattr calls take:
/// the directory through its descriptor, the last component not followed.
fn fd_path(dir: &OwnedFd, name: &[u8]) -> PathBuf {
    let mut p = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    p.push(OsStr::from_bytes(if name.is_empty() { b"." } else { name }));
    p
}

impl ArchiveSink {
    pub fn new(flags: u32, policy: Policy) -> ArchiveSink {
        ArchiveSink {
            flags,
            policy,
            root_user: super::is_root(),
            names: Names::default(),
            recs: Vec::new(),
            by_id: HashMap::new(),
            specials: Vec::new(),
            not_kept: NotKept::default(),
            windowed: false,
            files: BTreeMap::new(),
            settled: 0,
            failures: Vec::new(),
            held: 0,
        }
    }

    /// Bytes held for a windowed session's files not yet given their
    /// attributes (at most about a window's).
    pub fn held_bytes(&self) -> u64 {
        self.held
    }

    /// A held file's record, no longer held.
    fn take_file(&mut self, id: u64) -> Option<Rec> {
        let r = self.files.remove(&id)?;
        self.held -= cost(&r);
        Some(r)
    }

    /// A windowed session's (issue 36): regular files' attributes are
    /// applied as the files settle ([`ArchiveSink::settled`]).
    pub fn windowed(mut self) -> ArchiveSink {
        self.windowed = true;
        self
    }

    /// The mode a file is renamed into place with: without its
    /// set-user-ID and set-group-ID bits when owners follow, so the file
    /// never carries them under the sink user's ownership (rsync chowns
    /// its temp file before the rename; here the chown comes after it).
    /// [`ArchiveSink::apply`] puts back what the policy allows after it.
    pub fn flags(&self) -> u32 {
        self.flags
    }

    pub fn placed_mode(&self, mode: u32) -> u32 {
        self.policy.placed_mode(mode, Some(self.flags))
    }

    /// A record as it arrives, its path mapped to `target` under the
    /// sink's root. The root itself ("") keeps its attributes.
    pub fn entry(&mut self, e: &Entry, target: &[u8]) {
        let kind = match &e.kind {
            _ if target.is_empty() => return,
            EntryKind::Dir => Kind::Dir,
            EntryKind::File { .. } => Kind::File,
            EntryKind::Symlink { .. } => Kind::Symlink,
            // A striped piece carries no attributes (an archive copy does
            // not cut files: request::shares).
            EntryKind::HardLink { .. } | EntryKind::LinkTo { .. } | EntryKind::Piece { .. } => {
                return
            }
            EntryKind::Special { kind, rdev } => {
                self.specials.push(Special {
                    path: target.to_vec(),
                    kind: *kind,
                    rdev: *rdev,
                    mode: e.mode,
                    mtime: (e.mtime_s, e.mtime_ns),
                });
                Kind::Special
            }
        };
        let rec = Rec {
            path: target.to_vec(),
            kind,
            mode: e.mode,
            mtime: (e.mtime_s, e.mtime_ns),
            attrs: None,
        };
        if self.windowed && kind == Kind::File {
            // Only where Attrs will come (preserve::ATTRS): else a file
            // has nothing left to apply once it is in place.
            if self.flags & preserve::ATTRS != 0 {
                self.held += cost(&rec);
                if let Some(old) = self.files.insert(e.id, rec) {
                    self.held -= cost(&old);
                }
            }
            return;
        }
        self.by_id.insert(e.id, self.recs.len());
        self.recs.push(rec);
    }

    /// Attrs records, for entries already announced. A windowed session's
    /// file that settled already (a sync's unchanged file settles with its
    /// Ready, before its Attrs arrive) gets them at once.
    pub fn attrs(&mut self, v: Vec<Attrs>, root: &Root) {
        let mut dir = None;
        for a in v {
            let id = a.id;
            if let Some(r) = self.files.get_mut(&id) {
                let before = cost(r);
                r.attrs = Some(Box::new(a));
                self.held = self.held - before + cost(r);
                if id < self.settled {
                    if let Some(r) = self.take_file(id) {
                        self.apply_now(root, r, &mut dir);
                    }
                }
            } else if let Some(&i) = self.by_id.get(&a.id) {
                self.recs[i].attrs = Some(Box::new(a));
            }
        }
    }

    /// A windowed session: every file below `below` settled (in place or
    /// failed); those whose Attrs came get them now and are dropped.
    pub fn settled(&mut self, below: u64, root: &Root) {
        self.settled = self.settled.max(below);
        let due: Vec<u64> = (self.files.range(..below))
            .filter(|(_, r)| r.attrs.is_some())
            .map(|(&id, _)| id)
            .collect();
        let mut dir = None;
        for id in due {
            if let Some(r) = self.take_file(id) {
                self.apply_now(root, r, &mut dir);
            }
        }
    }

    /// One windowed file's attributes; a failure is kept for the verdict.
    fn apply_now(&mut self, root: &Root, r: Rec, dir: &mut DirCache) {
        let Some(a) = &r.attrs else { return };
        if let Err(e) = self.apply(root, &r, a, dir) {
            self.failures.push(Failure {
                path: r.path.clone(),
                reason: format!("attributes: {e}"),
            });
        }
    }

    /// Make the special files (temp names from `tmp`, renamed into place)
    /// and apply every record's attributes; directories' atimes wait for
    /// [`ArchiveSink::dir_atimes`].
    pub fn place(
        &mut self,
        root: &Root,
        tmp: impl Fn(usize) -> Vec<u8>,
        failures: &mut Vec<Failure>,
    ) {
        let specials = std::mem::take(&mut self.specials);
        for (i, s) in specials.iter().enumerate() {
            if let Err(e) = self.make_special(root, s, &tmp(i)) {
                failures.push(Failure {
                    path: s.path.clone(),
                    reason: format!("special file: {e}"),
                });
            }
        }
        // A windowed session's files not settled by the last look (the
        // payload ended first): in place or failed by now.
        self.held = 0;
        let mut dir = None;
        for (_, r) in std::mem::take(&mut self.files) {
            self.apply_now(root, r, &mut dir);
        }
        failures.append(&mut self.failures);
        let recs = std::mem::take(&mut self.recs);
        let mut dir = None;
        for r in &recs {
            let Some(a) = &r.attrs else { continue };
            if let Err(e) = self.apply(root, r, a, &mut dir) {
                failures.push(Failure {
                    path: r.path.clone(),
                    reason: format!("attributes: {e}"),
                });
            }
        }
        self.recs = recs;
    }

    /// Directories' atimes, after their mtimes were set (sink::tree).
    pub fn dir_atimes(&self, root: &Root) {
        if self.flags & preserve::ATIMES == 0 {
            return;
        }
        for r in self.recs.iter().filter(|r| r.kind == Kind::Dir) {
            if let Some((at, _)) = r.attrs.as_ref().and_then(|a| a.atime.map(|t| (t, ()))) {
                let (parent, name) = split_parent(&r.path);
                if let Ok(dir) = root.open_dir(parent) {
                    let _ = set_times(&dir, name, Some(at), r.mtime);
                }
            }
        }
    }

    /// The one line on what could not be kept, printed where the sink
    /// runs (the user's terminal for a local or ssh sink, the daemon's
    /// log for a daemon) and returned.
    pub fn note(&self) -> Option<String> {
        let why = if !self.root_user {
            "not running as root"
        } else {
            "the daemon's user configuration does not allow it"
        };
        let line = self.not_kept.line(why)?;
        tracing::warn!("{line}");
        eprintln!("ramsys: note: {}", ramsys_proto::text::escape(&line));
        Some(line)
    }

    fn make_special(&mut self, root: &Root, s: &Special, tmp: &[u8]) -> io::Result<()> {
        let device = matches!(s.kind, special::CHAR | special::BLOCK);
        if device && !self.policy.devices {
            self.not_kept.devices += 1;
            return Ok(());
        }
        let (fmt, ftype) = match s.kind {
            special::FIFO => (libc::S_IFIFO, FileType::Fifo),
            special::SOCKET => (libc::S_IFSOCK, FileType::Socket),
            special::CHAR => (libc::S_IFCHR, FileType::CharacterDevice),
            _ => (libc::S_IFBLK, FileType::BlockDevice),
        };
        let (parent, name) = split_parent(&s.path);
        let dir = root.open_dir(parent)?;
        let n = cstr(name)?;
        let old = lstat_at(dir.as_fd(), name)?
            .filter(|st| st.st_mode & libc::S_IFMT == fmt && (!device || st.st_rdev == s.rdev));
        // The same node with the same mode and mtime: nothing to do.
        if let Some(st) = &old {
            let mtime = (st.st_mtime, st.st_mtime_nsec as u32);
            if st.st_mode & 0o7777 == s.mode && mtime == s.mtime {
                return Ok(());
            }
        }
        if old.is_none() {
            let t = cstr(tmp)?;
            let perm = Mode::from_bits_retain(s.mode & 0o777);
            match rustix::fs::mknodat(&dir, t, ftype, perm, s.rdev as _) {
                Ok(()) => {}
                Err(rustix::io::Errno::PERM) if device => {
                    self.not_kept.devices += 1;
                    return Ok(());
                }
                Err(e) => return Err(e.into()),
            }
            if let Err(e) = rustix::fs::renameat(&dir, t, &dir, n) {
                let _ = rustix::fs::unlinkat(&dir, t, AtFlags::empty());
                return Err(e.into());
            }
        }
        // The mode past the umask, then the mtime (our own fresh node, or
        // one of the same type: never a symlink).
        rustix::fs::chmodat(&dir, n, Mode::from_bits_retain(s.mode), AtFlags::empty())?;
        set_times(&dir, name, None, s.mtime)
    }

    fn apply(&mut self, root: &Root, r: &Rec, a: &Attrs, cache: &mut DirCache) -> io::Result<()> {
        let (parent, name) = split_parent(&r.path);
        let dir = parent_dir(root, cache, parent)?;
        // A file that failed (reported already) or a device not made.
        let Some(st) = lstat_at(dir.as_fd(), name)? else {
            return Ok(());
        };
        if r.kind == Kind::Special && st.st_mode & libc::S_IFMT == libc::S_IFREG {
            return Ok(());
        }
        let numeric = self.flags & preserve::NUMERIC_IDS != 0;
        let n = cstr(if name.is_empty() { b"." } else { name })?;
        let own = self.owners(dir, n, a, &st, numeric)?;
        // chown clears set-user-ID and set-group-ID bits of a file, and
        // files were placed without them (placed_mode): put back what the
        // policy allows now that the owner is known (issue 34: never a
        // set-ID file owned by someone other than the sender's identity).
        // Directories get their mode in the directory pass.
        let mode = self.policy.setid.allow(r.mode, own.owner, own.group);
        let setid = mode & (super::SUID | super::SGID) != 0;
        let file = matches!(r.kind, Kind::File | Kind::Special);
        if file && setid && (own.chowned || st.st_mode & 0o7777 != mode) {
            // The entry is not a symlink.
            rustix::fs::chmodat(dir, n, Mode::from_bits_retain(mode), AtFlags::empty())?;
        }
        if r.kind != Kind::Symlink {
            if self.flags & preserve::XATTRS != 0 {
                self.xattrs(dir, name, a)?;
            }
            if self.flags & preserve::ACLS != 0 {
                self.acls(dir, name, r, a, numeric)?;
            }
        }
        if let (Some(at), false) = (a.atime, r.kind == Kind::Dir) {
            set_times(dir, name, Some(at), r.mtime)?;
        }
        Ok(())
    }

    /// Owner and group as asked and allowed: whether a chown happened, and
    /// whether the file now has the owner / group the source named.
    fn owners(
        &mut self,
        dir: &OwnedFd,
        n: &[u8],
        a: &Attrs,
        st: &crate::storage::fsops::Stat,
        numeric: bool,
    ) -> io::Result<Owned> {
        let uid = a.owner.as_ref().map(|p| self.names.uid(p, numeric));
        let gid = a.group.as_ref().map(|p| self.names.gid(p, numeric));
        // Already as named (or nothing named: not "kept").
        let mut own = Owned {
            chowned: false,
            owner: uid == Some(st.st_uid),
            group: gid == Some(st.st_gid),
        };
        let mut uid = uid.filter(|&u| u != st.st_uid);
        let gid = gid.filter(|&g| g != st.st_gid);
        if uid.is_none() && gid.is_none() {
            return Ok(own);
        }
        if !self.policy.owners {
            self.not_kept.owners += uid.is_some() as u64;
            self.not_kept.groups += gid.is_some() as u64;
            return Ok(own);
        }
        if !self.root_user {
            // Another owner needs root; a group the user belongs to can
            // still be set (chgrp), so try that alone.
            if uid.take().is_some() {
                self.not_kept.owners += 1;
            }
            if gid.is_none() {
                return Ok(own);
            }
        }
        // None leaves that id as it is (-1 to fchownat).
        let (u, g) = (uid.map(Uid::from_raw), gid.map(Gid::from_raw));
        if let Err(e) = rustix::fs::chownat(dir, n, u, g, AtFlags::SYMLINK_NOFOLLOW) {
            let e = io::Error::from(e);
            if denied(&e) {
                self.not_kept.owners += uid.is_some() as u64;
                self.not_kept.groups += gid.is_some() as u64;
                return Ok(own);
            }
            return Err(e);
        }
        own.chowned = true;
        own.owner |= uid.is_some();
        own.group |= gid.is_some();
        Ok(own)
    }

    fn xattrs(&mut self, dir: &OwnedFd, name: &[u8], a: &Attrs) -> io::Result<()> {
        let user_only = self.policy.user_xattrs_only || !self.root_user;
        let p = fd_path(dir, name);
        let mut lost = false;
        let mut wanted: Vec<&(Vec<u8>, Vec<u8>)> = Vec::with_capacity(a.xattrs.len());
        for x in &a.xattrs {
            if super::xattr_wanted(&x.0, user_only) {
                wanted.push(x);
            } else {
                lost = true;
            }
        }
        // Those we manage that the source does not have go.
        let have = match xattr::list(&p) {
            Ok(l) => l.collect::<Vec<_>>(),
            Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => {
                self.not_kept.xattrs += !wanted.is_empty() as u64;
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        for h in &have {
            let hb = h.as_bytes();
            if super::xattr_wanted(hb, user_only) && !wanted.iter().any(|(n, _)| n == hb) {
                xattr::remove(&p, h)?;
            }
        }
        for (n, v) in wanted {
            let key = OsStr::from_bytes(n);
            let cur = if have.iter().any(|h| h.as_bytes() == &n[..]) {
                xattr::get(&p, key)?
            } else {
                None
            };
            if cur.as_deref() == Some(&v[..]) {
                continue;
            }
            match xattr::set(&p, key, v) {
                Ok(()) => {}
                Err(e) if denied(&e) => lost = true,
                Err(e) => return Err(e),
            }
        }
        self.not_kept.xattrs += lost as u64;
        Ok(())
    }

    fn acls(
        &mut self,
        dir: &OwnedFd,
        name: &[u8],
        r: &Rec,
        a: &Attrs,
        numeric: bool,
    ) -> io::Result<()> {
        let p = fd_path(dir, name);
        let mut lost = false;
        for (xname, entries, applies) in [
            (acl::ACCESS, &a.acl, true),
            (acl::DEFAULT, &a.default_acl, r.kind == Kind::Dir),
        ] {
            if !applies {
                continue;
            }
            let cur = match xattr::get(&p, xname) {
                Ok(v) => v,
                Err(e) if denied(&e) => {
                    lost |= !entries.is_empty();
                    continue;
                }
                Err(e) => return Err(e),
            };
            let r = if entries.is_empty() {
                match cur {
                    Some(_) => xattr::remove(&p, xname),
                    None => Ok(()),
                }
            } else {
                let v = acl::encode(entries, &mut self.names, numeric);
                if cur.as_deref() == Some(&v[..]) {
                    Ok(())
                } else {
                    xattr::set(&p, xname, &v)
                }
            };
            match r {
                Ok(()) => {}
                Err(e) if denied(&e) => lost = true,
                Err(e) => return Err(e),
            }
        }
        self.not_kept.acls += lost as u64;
        Ok(())
    }
}

/// utimensat without following `name`: `atime` or leave it, and `mtime`.
fn set_times(
    dir: &OwnedFd,
    name: &[u8],
    atime: Option<(i64, u32)>,
    mtime: (i64, u32),
) -> io::Result<()> {
    let n = cstr(if name.is_empty() { b"." } else { name })?;
    let ts = |t: (i64, u32)| Timespec {
        tv_sec: t.0,
        tv_nsec: t.1 as _,
    };
    let times = Timestamps {
        last_access: match atime {
            Some(t) => ts(t),
            None => Timespec {
                tv_sec: 0,
                tv_nsec: UTIME_OMIT,
            },
        },
        last_modification: ts(mtime),
    };
    rustix::fs::utimensat(dir, n, &times, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::fsops::Confinement;
    use ramsys_proto::attrs::Principal;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};

    fn entry(id: u64, kind: EntryKind, mode: u32) -> Entry {
        Entry {
            id,
            path: Vec::new(),
            kind,
            mode,
            mtime_s: 1_000_000,
            mtime_ns: 7,
        }
    }

    #[test]
    fn fifo_socket_xattrs_and_groups_applied_then_nothing_to_do() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), b"x").unwrap();
        let root = Root::open(d.path(), Confinement::Strict).unwrap();
        let flags = preserve::ALL & !preserve::DEVICES;
        let mut s = ArchiveSink::new(flags, Policy::default());
        let fifo = EntryKind::Special {
            kind: special::FIFO,
            rdev: 0,
        };
        let sock = EntryKind::Special {
            kind: special::SOCKET,
            rdev: 0,
        };
        s.entry(&entry(0, fifo, 0o640), b"p");
        s.entry(&entry(1, sock, 0o755), b"s");
        s.entry(&entry(2, EntryKind::File { size: 1 }, 0o644), b"f");
        // Our own gid: settable by anyone; a user.* xattr.
        let gid = rustix::process::getegid().as_raw();
        s.attrs(
            vec![Attrs {
                id: 2,
                group: Some(Principal {
                    id: gid,
                    name: vec![],
                }),
                xattrs: vec![(b"user.k".to_vec(), b"v".to_vec())],
                atime: Some((5, 6)),
                ..Default::default()
            }],
            &root,
        );
        let tmp = |i: usize| format!(".t{i}").into_bytes();
        let mut fails = Vec::new();
        s.place(&root, tmp, &mut fails);
        assert!(fails.is_empty(), "{fails:?}");
        let p = std::fs::symlink_metadata(d.path().join("p")).unwrap();
        assert!(p.file_type().is_fifo());
        assert_eq!(p.mode() & 0o7777, 0o640);
        assert_eq!((p.mtime(), p.mtime_nsec()), (1_000_000, 7));
        assert!(std::fs::symlink_metadata(d.path().join("s"))
            .unwrap()
            .file_type()
            .is_socket());
        let f = std::fs::metadata(d.path().join("f")).unwrap();
        assert_eq!(f.atime(), 5);
        let xattrs = xattr::get(d.path().join("f"), "user.k").ok().flatten();
        if xattr::SUPPORTED_PLATFORM && xattr::set(d.path().join("p2"), "user.x", b"").is_ok() {
            assert_eq!(xattrs.as_deref(), Some(&b"v"[..]));
        }
        assert_eq!(s.not_kept, NotKept::default());
        // A second pass over the same records: same nodes, no failures.
        let ino = p.ino();
        let mut s2 = ArchiveSink::new(flags, Policy::default());
        s2.entry(&entry(0, fifo_kind(), 0o640), b"p");
        s2.place(&root, tmp, &mut fails);
        assert!(fails.is_empty(), "{fails:?}");
        assert_eq!(
            std::fs::symlink_metadata(d.path().join("p")).unwrap().ino(),
            ino
        );
    }

    /// A windowed session (issue 36): a file's attributes are applied once
    /// it settled and its Attrs came, in either order, and nothing of it
    /// is held after; a file not settled by the last look gets them at the
    /// end; a directory's wait for the end.
    #[test]
    fn windowed_files_get_attributes_as_they_settle() {
        let d = tempfile::tempdir().unwrap();
        for f in ["a", "b", "c"] {
            std::fs::write(d.path().join(f), b"x").unwrap();
        }
        std::fs::create_dir(d.path().join("d")).unwrap();
        let root = Root::open(d.path(), Confinement::Strict).unwrap();
        let mut s = ArchiveSink::new(preserve::ATIMES, Policy::default()).windowed();
        let atime = |id: u64, t: i64| Attrs {
            id,
            atime: Some((t, 0)),
            ..Default::default()
        };
        let at = |f: &str| std::fs::metadata(d.path().join(f)).unwrap().atime();
        s.entry(&entry(0, EntryKind::Dir, 0o755), b"d");
        for (id, f) in [(1, "a"), (2, "b"), (3, "c")] {
            s.entry(&entry(id, EntryKind::File { size: 1 }, 0o644), f.as_bytes());
        }
        s.attrs(vec![atime(0, 50), atime(1, 11)], &root);
        assert_ne!(at("a"), 11, "not before it settled");
        s.settled(2, &root);
        assert_eq!(at("a"), 11);
        // Settled before its Attrs came (a sync's unchanged file).
        s.settled(3, &root);
        s.attrs(vec![atime(2, 22), atime(3, 33)], &root);
        assert_eq!(at("b"), 22);
        assert_ne!(at("c"), 33);
        assert_eq!(s.files.keys().copied().collect::<Vec<_>>(), vec![3]);
        assert_eq!(s.held_bytes(), cost(&s.files[&3]));
        let mut fails = Vec::new();
        s.place(&root, |i| format!(".t{i}").into_bytes(), &mut fails);
        assert!(fails.is_empty(), "{fails:?}");
        assert_eq!(at("c"), 33);
        assert!(s.files.is_empty() && s.held_bytes() == 0);
        s.dir_atimes(&root);
        assert_eq!(at("d"), 50);
    }

    fn fifo_kind() -> EntryKind {
        EntryKind::Special {
            kind: special::FIFO,
            rdev: 0,
        }
    }

    #[test]
    fn confined_policy_keeps_no_foreign_owner_or_device() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), b"x").unwrap();
        let root = Root::open(d.path(), Confinement::Strict).unwrap();
        let mut s = ArchiveSink::new(preserve::ALL, Policy::confined());
        // Files are placed without set-ID bits while owners are pending.
        assert_eq!(s.placed_mode(0o6755), 0o755);
        assert_eq!(
            ArchiveSink::new(preserve::XATTRS, Policy::default()).placed_mode(0o4755),
            0o4755
        );
        s.entry(
            &entry(
                0,
                EntryKind::Special {
                    kind: special::CHAR,
                    rdev: 0x0103,
                },
                0o666,
            ),
            b"null",
        );
        s.entry(&entry(1, EntryKind::File { size: 1 }, 0o644), b"f");
        s.attrs(
            vec![Attrs {
                id: 1,
                owner: Some(Principal {
                    id: 4242,
                    name: vec![],
                }),
                xattrs: vec![(b"trusted.k".to_vec(), b"v".to_vec())],
                ..Default::default()
            }],
            &root,
        );
        let mut fails = Vec::new();
        s.place(&root, |i| format!(".t{i}").into_bytes(), &mut fails);
        assert!(fails.is_empty(), "{fails:?}");
        assert!(!d.path().join("null").exists());
        assert_ne!(std::fs::metadata(d.path().join("f")).unwrap().uid(), 4242);
        assert_eq!(s.not_kept.devices, 1);
        assert_eq!(s.not_kept.owners, 1);
        assert_eq!(s.not_kept.xattrs, 1);
        let line = s.note().unwrap();
        assert!(line.contains("owner of 1 entries"), "{line}");
        assert!(line.contains("device node of 1 entries"), "{line}");
    }
}
