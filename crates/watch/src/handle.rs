//! The workspace's only raw `*at` system calls, and why they are raw
//! (issue 37): fanotify_init, fanotify_mark (a dirfd + path call),
//! name_to_handle_at and open_by_handle_at have no safe wrapper in rustix
//! (its `not_implemented` list) nor in std; every other `*at`/openat2 call
//! goes through rustix (engine::storage::fsops and its callers). Each
//! function here is one checked syscall returning an owned descriptor or
//! the errno.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::other("path holds a NUL byte"))
}

/// fanotify_init(2) with `flags` and read-only, large-file event fds.
pub(crate) fn fanotify_init(flags: u32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the result is checked.
    let fd = unsafe { libc::fanotify_init(flags, (libc::O_RDONLY | libc::O_LARGEFILE) as u32) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// fanotify_mark(2) of `path` (resolved from the working directory).
pub(crate) fn fanotify_mark(
    fd: BorrowedFd<'_>,
    flags: u32,
    mask: u64,
    path: &Path,
) -> io::Result<()> {
    let c = cstr(path)?;
    // SAFETY: valid descriptor and C string.
    let r = unsafe { libc::fanotify_mark(fd.as_raw_fd(), flags, mask, libc::AT_FDCWD, c.as_ptr()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// open_by_handle_at(2), O_PATH: `fh` is a `struct file_handle`
/// (handle_bytes, handle_type, bytes) as fanotify reports it.
pub(crate) fn open_by_handle(mount: BorrowedFd<'_>, fh: &mut [u8]) -> io::Result<OwnedFd> {
    let hb = u32::from_ne_bytes(fh[..4].try_into().unwrap()) as usize;
    assert!(
        fh.len() >= 8 + hb,
        "file_handle shorter than its handle_bytes"
    );
    // SAFETY: fh is a whole file_handle (checked above).
    let fd = unsafe {
        libc::open_by_handle_at(
            mount.as_raw_fd(),
            fh.as_mut_ptr().cast(),
            libc::O_PATH | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor, closed on drop.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// name_to_handle_at(2) of `p`: the cache key (type + bytes) and mount id.
pub(crate) fn name_to_handle(p: &Path) -> io::Result<(Vec<u8>, i32)> {
    let c = cstr(p)?;
    let mut fh = vec![0u8; 8 + 128];
    fh[..4].copy_from_slice(&128u32.to_ne_bytes());
    let mut mount_id = 0;
    // SAFETY: fh is a file_handle with room for 128 handle bytes.
    let r = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            c.as_ptr(),
            fh.as_mut_ptr().cast(),
            &mut mount_id,
            0,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let hb = u32::from_ne_bytes(fh[..4].try_into().unwrap()) as usize;
    Ok((fh[4..8 + hb].to_vec(), mount_id))
}
