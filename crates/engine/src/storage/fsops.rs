//! File-system access confined to a root directory.
//!
//! Every path a peer names is resolved with `openat2(2)` and
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` (sink) or `RESOLVE_BENEATH`
//! (source): the kernel itself refuses `..` escapes, absolute paths and,
//! on the sink, any symlink on the way, atomically with the lookup, so a
//! symlink swapped in during a transfer cannot redirect a write (no
//! check-then-use race). Final renames, links and attribute changes are
//! made relative to a directory fd obtained the same way.

//!
//! Every system call here goes through rustix's safe wrappers (issue 37:
//! the confinement layer security rests on has no `unsafe` block): the
//! same calls with the same flags, errors carrying the same errno.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, Timespec, Timestamps, UTIME_OMIT};

/// What [`lstat_at`] returns: `struct stat` (st_mode, st_mtime, st_ino...).
pub type Stat = rustix::fs::Stat;

/// How strictly paths under a root are resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confinement {
    /// Beneath the root, no symlinks at all (sink side, peer-named paths).
    Strict,
    /// Beneath the root; symlinks allowed when they stay inside (daemon
    /// source: reading through a link inside the export is harmless).
    Beneath,
    /// The user's own local paths: ordinary resolution.
    None,
}

/// An open directory all paths are resolved against.
pub struct Root {
    fd: OwnedFd,
    path: PathBuf,
    confine: Confinement,
}

/// A path for a syscall: a NUL byte in it is InvalidInput, as before.
pub(crate) fn cpath(b: &[u8]) -> io::Result<&[u8]> {
    if b.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "NUL byte in path",
        ));
    }
    Ok(b)
}

/// Flags as the callers pass them (libc's O_* values, which rustix's
/// OFlags share bit for bit on Linux).
fn oflags(flags: i32) -> OFlags {
    OFlags::from_bits_retain(flags as u32)
}

/// The target of symlink `name` in `dir`.
pub fn readlink_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<Vec<u8>> {
    Ok(rustix::fs::readlinkat(dir, cpath(name)?, Vec::new())?.into_bytes())
}

/// openat2(2) relative to `dir`; the error is the raw errno.
fn openat2(
    dir: BorrowedFd<'_>,
    rel: &[u8],
    flags: i32,
    mode: u32,
    resolve: ResolveFlags,
) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat2(
        dir,
        cpath(rel)?,
        oflags(flags) | OFlags::CLOEXEC,
        Mode::from_bits_retain(mode),
        resolve,
    )?)
}

fn show_rel(rel: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(rel)
}

/// Split "a/b/c" into ("a/b", "c"); "c" into ("", "c").
pub fn split_parent(rel: &[u8]) -> (&[u8], &[u8]) {
    match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => (&b""[..], rel),
    }
}

/// lstat of `name` (one component; "" is the directory itself) in an open
/// directory `dir` (from [`Root::open_dir`], so already confined): callers
/// that stat many names of one directory open it once (sync's sink).
pub fn lstat_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<Option<Stat>> {
    let name = if name.is_empty() { &b"."[..] } else { name };
    match rustix::fs::statat(dir, cpath(name)?, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether a stat is of a directory / regular file / symlink / block device.
pub fn is_dir(st: &Stat) -> bool {
    rustix::fs::FileType::from_raw_mode(st.st_mode as _) == rustix::fs::FileType::Directory
}
pub fn is_reg(st: &Stat) -> bool {
    rustix::fs::FileType::from_raw_mode(st.st_mode as _) == rustix::fs::FileType::RegularFile
}
pub fn is_symlink(st: &Stat) -> bool {
    rustix::fs::FileType::from_raw_mode(st.st_mode as _) == rustix::fs::FileType::Symlink
}

/// Names in an open directory (without "." and ".."), read through the
/// descriptor itself: no path lookup (a /proc/self/fd path costs a magic
/// link walk per directory).
pub fn list_dir(dir: BorrowedFd<'_>) -> io::Result<Vec<Vec<u8>>> {
    // Dir owns a dup (no path lookup); a dup shares the file offset with
    // `dir`: rewind before reading.
    let mut d = rustix::fs::Dir::new(rustix::io::fcntl_dupfd_cloexec(dir, 0)?)?;
    d.rewind();
    let mut out = Vec::new();
    for ent in d {
        let ent = ent?;
        let name = ent.file_name().to_bytes();
        if name != b"." && name != b".." {
            out.push(name.to_vec());
        }
    }
    Ok(out)
}

impl Root {
    pub fn open(path: &Path, confine: Confinement) -> io::Result<Root> {
        let fd = rustix::fs::open(
            cpath(path.as_os_str().as_encoded_bytes())?,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            let e = io::Error::from(e);
            io::Error::new(e.kind(), format!("{}: {e}", path.display()))
        })?;
        Ok(Root {
            fd,
            path: path.to_path_buf(),
            confine,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn resolve_flags(&self) -> ResolveFlags {
        match self.confine {
            Confinement::Strict => {
                ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS
            }
            Confinement::Beneath => ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
            Confinement::None => ResolveFlags::empty(),
        }
    }

    /// openat2 relative to the root; "" is the root itself.
    pub fn openat(&self, rel: &[u8], flags: i32, mode: u32) -> io::Result<OwnedFd> {
        self.openat_in(self.fd.as_fd(), rel, flags, mode)
    }

    /// openat2 relative to `dir`, a directory already opened under this
    /// root (so confined), with this root's resolution rules.
    pub fn openat_in(
        &self,
        dir: BorrowedFd<'_>,
        rel: &[u8],
        flags: i32,
        mode: u32,
    ) -> io::Result<OwnedFd> {
        let rel = if rel.is_empty() { &b"."[..] } else { rel };
        let mode = if flags & libc::O_CREAT != 0 { mode } else { 0 };
        match openat2(dir, rel, flags, mode, self.resolve_flags()) {
            Ok(fd) => Ok(fd),
            Err(e) => {
                let shown = String::from_utf8_lossy(rel);
                Err(match e.raw_os_error() {
                    Some(libc::ELOOP) | Some(libc::EXDEV) if self.confine != Confinement::None => {
                        io::Error::new(
                            io::ErrorKind::PermissionDenied,
                            format!("refusing to follow a symlink or leave the root at {shown:?}"),
                        )
                    }
                    _ => io::Error::new(e.kind(), format!("{shown}: {e}")),
                })
            }
        }
    }

    /// Where `rel` leads, following symlinks that stay beneath the root
    /// (openat2 RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS for the whole
    /// walk, whatever this root's confinement), as a path relative to the
    /// root with no symlink left (a daemon source's top; issue 35). The
    /// error keeps its errno: EXDEV or ELOOP when the walk would leave the
    /// root (`..` above it, an absolute link, a magic link), ENOENT, ...
    pub fn resolve_beneath(&self, rel: &[u8]) -> io::Result<Vec<u8>> {
        let rel = if rel.is_empty() { &b"."[..] } else { rel };
        let fd = openat2(
            self.fd.as_fd(),
            rel,
            libc::O_PATH,
            0,
            ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
        )?;
        use std::os::fd::AsRawFd;
        let at = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        // The root's own path as the kernel names it (the daemon opened it
        // by its canonical path).
        let root = std::fs::read_link(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))?;
        let inside = at
            .strip_prefix(&root)
            .map_err(|_| io::Error::from_raw_os_error(libc::EXDEV))?;
        Ok(inside.as_os_str().as_encoded_bytes().to_vec())
    }

    /// Open a directory under the root.
    pub fn open_dir(&self, rel: &[u8]) -> io::Result<OwnedFd> {
        self.openat(rel, libc::O_RDONLY | libc::O_DIRECTORY, 0)
    }

    /// Open a regular file for reading (never through a final symlink).
    pub fn open_read(&self, rel: &[u8], direct: bool) -> io::Result<File> {
        Ok(File::from(self.openat(rel, read_flags(direct), 0)?))
    }

    /// lstat of `rel` (None if it does not exist).
    pub fn lstat(&self, rel: &[u8]) -> io::Result<Option<Stat>> {
        let (parent, name) = split_parent(rel);
        let dir = match self.open_dir(parent) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        lstat_at(dir.as_fd(), name)
    }

    /// Create directory `rel` (its parent must exist); an existing directory
    /// is fine, an existing non-directory is an error.
    pub fn mkdir(&self, rel: &[u8], mode: u32) -> io::Result<()> {
        let (parent, name) = split_parent(rel);
        let dir = self.open_dir(parent)?;
        let name = cpath(name)?;
        match rustix::fs::mkdirat(&dir, name, Mode::from_bits_retain(mode | 0o700)) {
            Ok(()) => Ok(()),
            Err(rustix::io::Errno::EXIST) => match lstat_at(dir.as_fd(), name) {
                Ok(Some(st)) if is_dir(&st) => Ok(()),
                _ => Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a directory", show_rel(rel)),
                )),
            },
            Err(e) => {
                let e = io::Error::from(e);
                Err(io::Error::new(
                    e.kind(),
                    format!("mkdir {}: {e}", show_rel(rel)),
                ))
            }
        }
    }

    /// [`Root::mkdir`], but a non-directory in the way (a symlink, a file,
    /// a special file) is removed first, never followed: rsync's receiver
    /// does the same, so a sync converges where a link sits in DST in
    /// place of a source directory (issue 35). True when something was
    /// removed.
    pub fn mkdir_over(&self, rel: &[u8], mode: u32) -> io::Result<bool> {
        match self.mkdir(rel, mode) {
            Ok(()) => return Ok(false),
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            Err(_) => {}
        }
        let (parent, name) = split_parent(rel);
        let dir = self.open_dir(parent)?;
        // No AT_REMOVEDIR: removes the entry itself (unlinkat never
        // follows a symlink).
        if let Err(e) = rustix::fs::unlinkat(&dir, cpath(name)?, AtFlags::empty()) {
            let e = io::Error::from(e);
            return Err(io::Error::new(
                e.kind(),
                format!("cannot replace {} by a directory: {e}", show_rel(rel)),
            ));
        }
        self.mkdir(rel, mode)?;
        Ok(true)
    }

    /// Create a new temporary file `tmp` in directory `parent`.
    pub fn create_temp(&self, parent: &[u8], tmp: &[u8]) -> io::Result<File> {
        create_temp_in(self.open_dir(parent)?.as_fd(), tmp)
    }

    /// Set mode and mtime of `name` in `dir` without following a symlink.
    fn set_attrs(
        dir: BorrowedFd<'_>,
        name: &[u8],
        mode: Option<u32>,
        mtime: (i64, u32),
    ) -> io::Result<()> {
        let name = cpath(name)?;
        if let Some(m) = mode {
            // fchmodat cannot refuse symlinks portably; name is our own
            // freshly created temp file or directory, never a link.
            rustix::fs::chmodat(dir, name, Mode::from_bits_retain(m), AtFlags::empty())?;
        }
        let times = Timestamps {
            last_access: Timespec {
                tv_sec: 0,
                tv_nsec: UTIME_OMIT,
            },
            last_modification: Timespec {
                tv_sec: mtime.0,
                tv_nsec: mtime.1 as _,
            },
        };
        rustix::fs::utimensat(dir, name, &times, AtFlags::SYMLINK_NOFOLLOW)?;
        Ok(())
    }

    /// Give the temp file its mode and mtime and rename it over `name`.
    pub fn finalize(
        &self,
        parent: &[u8],
        tmp: &[u8],
        name: &[u8],
        mode: u32,
        mtime: (i64, u32),
    ) -> io::Result<()> {
        finalize_in(self.open_dir(parent)?.as_fd(), tmp, name, mode, mtime)
    }

    /// Rename `from` to `to`, both in directory `parent` (a resumed temp
    /// file taking this session's temp name).
    pub fn rename_in(&self, parent: &[u8], from: &[u8], to: &[u8]) -> io::Result<()> {
        rename_in_dir(self.open_dir(parent)?.as_fd(), from, to)
    }

    /// Remove `name` from `parent` (a temp file we created).
    pub fn unlink(&self, parent: &[u8], name: &[u8]) -> io::Result<()> {
        unlink_in(self.open_dir(parent)?.as_fd(), name)
    }

    /// Apply mode and mtime to an existing directory.
    pub fn set_dir_attrs(&self, rel: &[u8], mode: u32, mtime: (i64, u32)) -> io::Result<()> {
        let (parent, name) = split_parent(rel);
        let dir = self.open_dir(parent)?;
        let n = if name.is_empty() { b"." } else { name };
        Self::set_attrs(dir.as_fd(), n, Some(mode), mtime)
    }

    /// [`Root::set_dir_attrs`], unless the directory has them already: a
    /// sync run again changes nothing, not even a ctime (issue 35).
    pub fn ensure_dir_attrs(&self, rel: &[u8], mode: u32, mtime: (i64, u32)) -> io::Result<()> {
        let (parent, name) = split_parent(rel);
        let dir = self.open_dir(parent)?;
        if let Some(st) = lstat_at(dir.as_fd(), name)? {
            if st.st_mode & 0o7777 == mode && (st.st_mtime, st.st_mtime_nsec as u32) == mtime {
                return Ok(());
            }
        }
        let n = if name.is_empty() { b"." } else { name };
        Self::set_attrs(dir.as_fd(), n, Some(mode), mtime)
    }

    /// Create (or replace) symlink `rel` pointing at `target`, atomically:
    /// a temp link is renamed over the final name. A link already there
    /// with that target is kept (its mtime set if it differs), as rsync
    /// keeps it: a second sync changes nothing (issue 35).
    pub fn symlink(
        &self,
        rel: &[u8],
        target: &[u8],
        tmp: &[u8],
        mtime: (i64, u32),
    ) -> io::Result<()> {
        let (parent, name) = split_parent(rel);
        let dir = self.open_dir(parent)?;
        let (t, tm, n) = (cpath(target)?, cpath(tmp)?, cpath(name)?);
        if let Some(st) = lstat_at(dir.as_fd(), name)? {
            if is_symlink(&st) && readlink_at(dir.as_fd(), n).is_ok_and(|old| old == target) {
                if (st.st_mtime, st.st_mtime_nsec as u32) != mtime {
                    Self::set_attrs(dir.as_fd(), n, None, mtime)?;
                }
                return Ok(());
            }
        }
        rustix::fs::symlinkat(t, &dir, tm)?;
        let _ = Self::set_attrs(dir.as_fd(), tm, None, mtime);
        if let Err(e) = rustix::fs::renameat(&dir, tm, &dir, n) {
            let _ = rustix::fs::unlinkat(&dir, tm, AtFlags::empty());
            return Err(e.into());
        }
        Ok(())
    }

    /// Make `link` another name of the existing file `target` (atomically
    /// replacing `link` through a temp name).
    pub fn hardlink(&self, target: &[u8], link: &[u8], tmp: &[u8]) -> io::Result<()> {
        let (tp, tn) = split_parent(target);
        let (lp, ln) = split_parent(link);
        let tdir = self.open_dir(tp)?;
        let ldir = self.open_dir(lp)?;
        // Already one inode (a sync over an existing link): linking again
        // would only touch its ctime.
        if let (Some(a), Some(b)) = (lstat_at(tdir.as_fd(), tn)?, lstat_at(ldir.as_fd(), ln)?) {
            if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) {
                return Ok(());
            }
        }
        let (tn, tm, ln) = (cpath(tn)?, cpath(tmp)?, cpath(ln)?);
        // No AT_SYMLINK_FOLLOW: a link to `tn` itself, never its target.
        rustix::fs::linkat(&tdir, tn, &ldir, tm, AtFlags::empty())?;
        if let Err(e) = rustix::fs::renameat(&ldir, tm, &ldir, ln) {
            let _ = rustix::fs::unlinkat(&ldir, tm, AtFlags::empty());
            return Err(e.into());
        }
        // rename(2) between two names of one inode does nothing and leaves
        // the temp name (a re-run or sync over an existing link): drop it;
        // ENOENT after a real rename is expected.
        let _ = rustix::fs::unlinkat(&ldir, tm, AtFlags::empty());
        Ok(())
    }
}

/// Create a new temporary file `tmp` (mode 0600) in the open directory
/// `dir`: the named temp file, written and then renamed into place.
pub fn create_temp_in(dir: BorrowedFd<'_>, tmp: &[u8]) -> io::Result<File> {
    let fd = rustix::fs::openat(
        dir,
        cpath(tmp)?,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_bits_retain(0o600),
    )?;
    Ok(File::from(fd))
}

/// Create `name` in `dir`, exclusively (following no link), with these
/// permission bits (masked by the umask or the directory's default ACL).
pub fn create_new_in(dir: BorrowedFd<'_>, name: &[u8], mode: u32) -> io::Result<File> {
    let fd = rustix::fs::openat(
        dir,
        cpath(name)?,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_bits_retain(mode & 0o777),
    )?;
    Ok(File::from(fd))
}

/// Give temp file `tmp` in `dir` its mode and mtime and rename it over
/// `name` (one directory, so the rename is atomic).
pub fn finalize_in(
    dir: BorrowedFd<'_>,
    tmp: &[u8],
    name: &[u8],
    mode: u32,
    mtime: (i64, u32),
) -> io::Result<()> {
    Root::set_attrs(dir, tmp, Some(mode), mtime)?;
    rename_in_dir(dir, tmp, name)
}

/// Rename `from` to `to`, both in the open directory `dir`.
pub fn rename_in_dir(dir: BorrowedFd<'_>, from: &[u8], to: &[u8]) -> io::Result<()> {
    Ok(rustix::fs::renameat(dir, cpath(from)?, dir, cpath(to)?)?)
}

/// Remove `name` from the open directory `dir`.
pub fn unlink_in(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    Ok(rustix::fs::unlinkat(dir, cpath(name)?, AtFlags::empty())?)
}

/// Remove the empty directory `name` from the open directory `dir`.
pub fn rmdir_in(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    Ok(rustix::fs::unlinkat(dir, cpath(name)?, AtFlags::REMOVEDIR)?)
}

/// Raise the open-file limit to its hard maximum (many files in flight).
pub fn raise_nofile_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut rl = getrlimit(Resource::Nofile);
    // None is RLIM_INFINITY.
    let n = |v: Option<u64>| v.unwrap_or(u64::MAX);
    if n(rl.current) < n(rl.maximum) {
        rl.current = rl.maximum;
        let _ = setrlimit(Resource::Nofile, rl);
    }
}

/// Positional write of the whole buffer.
pub fn pwrite_all(f: &File, mut buf: &[u8], mut off: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    while !buf.is_empty() {
        match f.write_at(buf, off) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "short write")),
            Ok(n) => {
                buf = &buf[n..];
                off += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Positional read filling as much of `buf` as the file has; returns bytes
/// read (short only at end of file).
pub fn pread_full(f: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], off + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Flags a source file is opened for reading with: never through a final
/// symlink, O_DIRECT when `direct`.
pub fn read_flags(direct: bool) -> i32 {
    let fl = libc::O_RDONLY | libc::O_NOFOLLOW;
    if direct {
        fl | libc::O_DIRECT
    } else {
        fl
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mkdir_over_removes_a_link_in_the_way_never_following_it() {
        // issue 35: a symlink (or a file) where the source has a directory
        // is replaced by the directory; its target is untouched.
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), b"keep").unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("link")).unwrap();
        std::fs::write(d.path().join("file"), b"f").unwrap();
        std::fs::create_dir(d.path().join("dir")).unwrap();
        let r = Root::open(d.path(), Confinement::Strict).unwrap();
        assert!(r.mkdir(b"link", 0o755).is_err());
        assert!(r.mkdir_over(b"link", 0o755).unwrap());
        assert!(r.mkdir_over(b"file", 0o755).unwrap());
        assert!(!r.mkdir_over(b"dir", 0o755).unwrap());
        assert!(!r.mkdir_over(b"new", 0o755).unwrap());
        for n in ["link", "file", "dir", "new"] {
            let md = std::fs::symlink_metadata(d.path().join(n)).unwrap();
            assert!(md.is_dir(), "{n}");
        }
        assert_eq!(std::fs::read(outside.path().join("keep")).unwrap(), b"keep");
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
        // Never through a link on the way.
        std::os::unix::fs::symlink(outside.path(), d.path().join("l2")).unwrap();
        assert!(r.mkdir_over(b"l2/x", 0o755).is_err());
        assert!(!outside.path().join("x").exists());
    }

    #[test]
    fn resolve_beneath_follows_links_inside_only() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("mod/inner/sub")).unwrap();
        let sym = |t: &Path, l: &str| std::os::unix::fs::symlink(t, d.path().join(l)).unwrap();
        sym(Path::new("inner"), "mod/in-link");
        sym(Path::new(".."), "mod/inner/up");
        sym(outside.path(), "mod/out-link");
        sym(Path::new("../../.."), "mod/up-link");
        sym(&d.path().join("mod/inner"), "mod/abs-link");
        let r = Root::open(&d.path().canonicalize().unwrap(), Confinement::Beneath).unwrap();
        assert_eq!(r.resolve_beneath(b"mod/in-link").unwrap(), b"mod/inner");
        assert_eq!(
            r.resolve_beneath(b"mod/in-link/up/in-link/sub").unwrap(),
            b"mod/inner/sub"
        );
        assert_eq!(r.resolve_beneath(b"").unwrap(), b"");
        for bad in ["mod/out-link", "mod/up-link", "mod/abs-link", "mod/../.."] {
            let e = r.resolve_beneath(bad.as_bytes()).unwrap_err();
            assert!(
                matches!(e.raw_os_error(), Some(libc::EXDEV | libc::ELOOP)),
                "{bad}: {e}"
            );
        }
        let e = r.resolve_beneath(b"mod/nope").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn strict_root_refuses_symlinks_and_escapes() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("link")).unwrap();
        let r = Root::open(d.path(), Confinement::Strict).unwrap();
        assert!(r.mkdir(b"sub/x", 0o755).is_ok());
        let e = r.mkdir(b"link/x", 0o755).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert!(r.open_dir(b"../").is_err());
        assert!(r.create_temp(b"link", b"t").is_err());
        assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
        let f = r.create_temp(b"sub", b".t").unwrap();
        pwrite_all(&f, b"hello", 0).unwrap();
        drop(f);
        r.finalize(b"sub", b".t", b"f", 0o640, (1_000_000, 5))
            .unwrap();
        let md = std::fs::metadata(d.path().join("sub/f")).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(md.mode() & 0o777, 0o640);
        assert_eq!((md.mtime(), md.mtime_nsec()), (1_000_000, 5));
        r.symlink(b"sub/s", b"../../etc", b".s", (5, 0)).unwrap();
        assert_eq!(
            std::fs::read_link(d.path().join("sub/s")).unwrap(),
            Path::new("../../etc")
        );
        r.hardlink(b"sub/f", b"sub/h", b".h").unwrap();
        assert_eq!(
            std::fs::metadata(d.path().join("sub/h")).unwrap().ino(),
            md.ino()
        );
        // Writing through the symlink we just created is refused.
        assert!(r.create_temp(b"sub/s", b"x").is_err());
    }
}
