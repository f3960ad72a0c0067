//! Kernel-bypass I/O (seed 000 sec. 6.2.2: direct I/O saves the copy
//! between page cache and user buffers; Table 6.6 credits it +98.85 % on
//! bulk data).
//!
//! O_DIRECT needs the file offset, the length and the memory address all
//! aligned to the device's logical block. Pool buffers are page aligned
//! (resources::buffers::ALIGN), so a read or write that starts at buffer
//! offset 0 (or any multiple of [`ALIGN`]) and at an aligned file offset
//! qualifies. Rules used here:
//! - Reads: the length is rounded up to [`ALIGN`]; at end of file the
//!   kernel returns the short tail, which is all we keep.
//! - Writes: the aligned prefix of a segment goes through the O_DIRECT
//!   descriptor, the unaligned tail (last bytes of a file) through a
//!   second, buffered descriptor of the same file. Both descriptors write
//!   disjoint pages, and the file already has its final size (ftruncate at
//!   creation), so neither write extends it.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Alignment of O_DIRECT offsets, lengths and addresses (a page: enough
/// for 512-byte and 4K-sector devices alike).
pub const ALIGN: usize = 4096;

#[inline]
pub fn is_aligned(x: u64) -> bool {
    x.is_multiple_of(ALIGN as u64)
}

#[inline]
pub fn round_up(x: usize) -> usize {
    x.div_ceil(ALIGN) * ALIGN
}

#[inline]
pub fn round_down(x: usize) -> usize {
    x / ALIGN * ALIGN
}

/// Read into `buf` (aligned address and length) at aligned `off` through
/// an O_DIRECT descriptor. Stops at the first short read (end of file):
/// another read at the unaligned offset after it would fail with EINVAL.
pub fn pread_direct(f: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut got = 0usize;
    while got < buf.len() {
        // SAFETY: buf[got..] is valid writable memory.
        let n = unsafe {
            libc::pread(
                f.as_raw_fd(),
                buf[got..].as_mut_ptr() as *mut libc::c_void,
                buf.len() - got,
                (off + got as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let n = n as usize;
        got += n;
        if n == 0 || !n.is_multiple_of(ALIGN) {
            break;
        }
    }
    Ok(got)
}

/// Positional write of the whole slice through a raw descriptor.
pub fn pwrite_all_fd(fd: i32, mut buf: &[u8], mut off: u64) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: fd is open for writing; buf is a valid slice.
        let n = unsafe {
            libc::pwrite(
                fd,
                buf.as_ptr() as *const libc::c_void,
                buf.len(),
                off as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "short write"));
        }
        buf = &buf[n as usize..];
        off += n as u64;
    }
    Ok(())
}

/// How a segment of `len` bytes at buffer address `addr` and file offset
/// `off` splits into an O_DIRECT part and a buffered tail: returns the
/// length of the direct prefix (0 if the start is not aligned).
#[inline]
pub fn direct_prefix(addr: usize, off: u64, len: usize) -> usize {
    if !addr.is_multiple_of(ALIGN) || !is_aligned(off) {
        return 0;
    }
    round_down(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_math() {
        assert_eq!(round_up(1), 4096);
        assert_eq!(round_up(4096), 4096);
        assert_eq!(round_up(4097), 8192);
        assert_eq!(round_down(4095), 0);
        assert_eq!(direct_prefix(8192, 4096, 10_000), 8192);
        assert_eq!(direct_prefix(8193, 4096, 10_000), 0);
        assert_eq!(direct_prefix(0, 100, 10_000), 0);
        assert_eq!(direct_prefix(0, 0, 4095), 0);
    }
}
