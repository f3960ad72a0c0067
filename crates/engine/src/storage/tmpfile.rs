//! Anonymous temp files for the sink's small files (issue 17; seed 000
//! sec. 6.1.4, many small files): a file is created nameless with
//! O_TMPFILE in its destination directory, written, given its mtime (and
//! mode, only where creation could not set it) through its descriptor, and
//! linked under its final name with linkat(2) once its data and digest are
//! complete. Against a named temp file this saves the fchmodat, the
//! rename and the name lookups, and an interrupted transfer leaves nothing
//! behind: a nameless inode is freed with its last descriptor. The promise
//! is unchanged: nothing appears under its final name before it is whole.
//!
//! Where the file system refuses O_TMPFILE ([`is_unsupported`]), the caller
//! falls back to a named temp file and renames it.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use rustix::fs::{AtFlags, Mode, OFlags, Timespec, Timestamps, CWD, UTIME_OMIT};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// Whether the sink may use nameless temp files: on by default (6
/// interleaved rounds of the 48k-file tree: 3.36 s vs 4.34 s median with
/// named temp files, 15-25 % less sink CPU; docs/STORAGE.md "Default");
/// `RAMSYS_TMPFILE=0` turns them off (named temp file + rename).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("RAMSYS_TMPFILE").map_or(true, |v| v != "0"))
}

/// Create a nameless regular file in `dir`, open for writing, with `mode`
/// (less the umask or the directory's default ACL; see [`chmod_needed`]).
pub fn create(dir: BorrowedFd<'_>, mode: u32) -> io::Result<File> {
    let fd = rustix::fs::openat(
        dir,
        c".",
        OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC,
        Mode::from_bits_retain(mode & 0o777),
    )?;
    Ok(File::from(fd))
}

/// Is this the file system (or kernel) not supporting O_TMPFILE? Kernels
/// before 3.11 read the flag as O_DIRECTORY (EISDIR); file systems without
/// a tmpfile operation answer EOPNOTSUPP.
pub fn is_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::EISDIR) | Some(libc::EINVAL) | Some(libc::ENOSYS)
    )
}

/// How linkat can name a descriptor here, learnt on first use: through the
/// descriptor itself (AT_EMPTY_PATH, needs CAP_DAC_READ_SEARCH) or through
/// its /proc/self/fd link (anyone, where /proc is mounted).
static LINK_BY: AtomicU8 = AtomicU8::new(0);
const BY_EMPTY_PATH: u8 = 1;
const BY_PROC: u8 = 2;

/// Give the nameless `file` the name `name` in `dir`. Fails with EEXIST
/// when the name is taken (linkat never replaces): the caller then links
/// to a temp name and renames it over.
pub fn link(file: &File, dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    let n = crate::storage::fsops::cpath(name)?;
    if LINK_BY.load(Ordering::Relaxed) != BY_PROC {
        match link_empty_path(file, dir, n) {
            Ok(()) => {
                LINK_BY.store(BY_EMPTY_PATH, Ordering::Relaxed);
                return Ok(());
            }
            // Without CAP_DAC_READ_SEARCH the kernel answers ENOENT.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::EPERM)) => {}
            Err(e) => return Err(e),
        }
    }
    link_proc(file, dir, n)?;
    LINK_BY.store(BY_PROC, Ordering::Relaxed);
    Ok(())
}

fn link_empty_path(file: &File, dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    Ok(rustix::fs::linkat(
        file,
        c"",
        dir,
        name,
        AtFlags::EMPTY_PATH,
    )?)
}

fn link_proc(file: &File, dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    Ok(rustix::fs::linkat(
        CWD,
        proc_path(file),
        dir,
        name,
        AtFlags::SYMLINK_FOLLOW,
    )?)
}

/// A second descriptor of the nameless `file`, for O_DIRECT writes (the
/// sink's direct lane), through its /proc/self/fd link: a nameless inode
/// has no other name to open it by.
pub fn reopen_direct(file: &File) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(proc_path(file))
}

/// The /proc/self/fd link that names `file`.
fn proc_path(file: &File) -> String {
    format!("/proc/self/fd/{}", file.as_raw_fd())
}

/// Set mtime (and with `chmod`, the mode) through the descriptor.
pub fn set_attrs(file: &File, chmod: Option<u32>, mtime: (i64, u32)) -> io::Result<()> {
    if let Some(m) = chmod {
        rustix::fs::fchmod(file, Mode::from_bits_retain(m))?;
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
    rustix::fs::futimens(file, &times)?;
    Ok(())
}

/// The process's umask, read from /proc/self/status (umask(2) can only be
/// read by setting it, which would race with other threads creating
/// files). Unknown: every bit, so every mode is set explicitly.
pub fn umask() -> u32 {
    static U: OnceLock<u32> = OnceLock::new();
    *U.get_or_init(|| {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Umask:"))
                    .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
            })
            .unwrap_or(0o7777)
    })
}

/// Whether a file created with `mode` needs an fchmod to carry it: when the
/// umask takes bits of it away, when it has set-ID or sticky bits (creation
/// takes only the permission bits), or when the directory has a default
/// ACL (which replaces the umask at creation).
pub fn chmod_needed(mode: u32, umask: u32, default_acl: bool) -> bool {
    default_acl || mode & 0o7000 != 0 || mode & 0o777 & umask != 0
}

/// Whether directory `dir` has a default ACL.
pub fn has_default_acl(dir: BorrowedFd<'_>) -> bool {
    // A size-0 query reads nothing.
    rustix::fs::fgetxattr_query(dir, c"system.posix_acl_default").is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::fs::{FileExt, MetadataExt};

    fn dir(p: &std::path::Path) -> File {
        File::open(p).unwrap()
    }

    #[test]
    fn nameless_until_linked_then_whole() {
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        let dd = dir(d.path());
        let f = match create(dd.as_fd(), 0o640) {
            Ok(f) => f,
            Err(e) if is_unsupported(&e) => {
                eprintln!("skipping: O_TMPFILE unsupported here ({e})");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        f.write_all_at(b"hello", 0).unwrap();
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
        set_attrs(&f, Some(0o640), (1_000_000, 7)).unwrap();
        link(&f, dd.as_fd(), b"x").unwrap();
        let md = std::fs::metadata(d.path().join("x")).unwrap();
        assert_eq!(std::fs::read(d.path().join("x")).unwrap(), b"hello");
        assert_eq!(md.mode() & 0o7777, 0o640);
        assert_eq!((md.mtime(), md.mtime_nsec()), (1_000_000, 7));
        // linkat never replaces a name.
        let g = create(dd.as_fd(), 0o600).unwrap();
        let e = link(&g, dd.as_fd(), b"x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
        // Dropped unlinked: nothing left.
        drop(g);
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

    /// Both ways of naming a descriptor work (AT_EMPTY_PATH needs
    /// CAP_DAC_READ_SEARCH: skipped without it; the /proc path does not).
    #[test]
    fn both_link_methods() {
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        let dd = dir(d.path());
        let Ok(a) = create(dd.as_fd(), 0o600) else {
            return;
        };
        link_proc(&a, dd.as_fd(), b"by-proc").unwrap();
        let b = create(dd.as_fd(), 0o600).unwrap();
        match link_empty_path(&b, dd.as_fd(), b"by-fd") {
            Ok(()) => assert!(d.path().join("by-fd").exists()),
            Err(e) => eprintln!("AT_EMPTY_PATH not allowed here: {e}"),
        }
        assert!(d.path().join("by-proc").exists());
    }

    #[test]
    fn modes_the_umask_would_change_are_set_explicitly() {
        assert!(!chmod_needed(0o644, 0o022, false));
        assert!(!chmod_needed(0o755, 0o022, false));
        assert!(chmod_needed(0o666, 0o022, false));
        assert!(chmod_needed(0o4755, 0o022, false), "set-uid");
        assert!(chmod_needed(0o644, 0o022, true), "default ACL");
        assert!(chmod_needed(0o644, 0o7777, false), "umask unknown");
        assert!(umask() <= 0o7777);
    }
}
