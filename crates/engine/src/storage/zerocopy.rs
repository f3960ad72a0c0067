//! Zero-copy sends of large files' blocks (issue 17).
//!
//! A block of a large file whose pages are in the page cache (read
//! buffered, not O_DIRECT: storage::cache) need not be copied into a pool
//! buffer and then into the socket: the reader hashes it through a
//! read-only mapping of the file ([`FileMap`]) and the sender hands the
//! pages to TCP with sendfile(2) (transport::Link::send_file). The frame
//! on the wire is unchanged. If the file changes between the hash and the
//! send, the sink's check fails the block and the Resend path re-reads it
//! into a buffer (data::reread), as after a corrupted frame.
//!
//! Decided once per session (data::reader::ReaderCtx::zerocopy): TCP data
//! links, no sealing (`--encrypt` seals the payload in memory), checksums
//! on (the sink's check is what catches a change after the reader's
//! final stat, since the bytes leave at send time, not read time), no
//! fault injection that flips payload bits. `RAMSYS_SENDFILE=0` turns it
//! off.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::OnceLock;

/// Files at least this large are sent zero-copy (smaller ones are packed
/// into shared blocks, which must be in memory).
pub const ZEROCOPY_MIN: u64 = super::DIRECT_MIN;

/// Whether the environment allows zero-copy sends (`RAMSYS_SENDFILE=0`
/// turns them off; read once).
pub fn allowed_by_env() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| parse_switch(std::env::var("RAMSYS_SENDFILE").ok().as_deref()))
}

/// `RAMSYS_SENDFILE`'s value: anything but 0/off/no/false leaves it on.
fn parse_switch(v: Option<&str>) -> bool {
    !matches!(
        v.map(|s| s.trim().to_ascii_lowercase()).as_deref(),
        Some("0" | "off" | "no" | "false")
    )
}

/// A read-only shared mapping of a whole file, made once per reader and
/// file (not per block: one mmap and munmap per file).
pub struct FileMap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is read-only and owned by this value; readers only
// take shared slices of it.
unsafe impl Send for FileMap {}
unsafe impl Sync for FileMap {}

impl FileMap {
    /// Map the first `len` bytes of `file` (len > 0).
    pub fn new(file: &File, len: u64) -> io::Result<FileMap> {
        let len = usize::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
        if len == 0 {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        // SAFETY: a fresh PROT_READ mapping of a descriptor we hold; the
        // kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // Read ahead of the hash, and let pages behind it go first.
        // SAFETY: advice on the mapping just made.
        unsafe { libc::madvise(p, len, libc::MADV_SEQUENTIAL) };
        Ok(FileMap {
            ptr: p as *mut u8,
            len,
        })
    }

    /// The bytes `[off, off + n)`, their page-table entries filled first
    /// with MADV_POPULATE_READ (Linux >= 5.14): one call instead of a
    /// fault per 64 KiB, and a range past the end of the file (truncated
    /// since the scan) comes back as an error instead of a SIGBUS on the
    /// first touch. None: read this block into a buffer instead.
    pub fn populated(&self, off: u64, n: usize) -> Option<&[u8]> {
        let off = usize::try_from(off).ok()?;
        if n == 0 || off.checked_add(n)? > self.len {
            return None;
        }
        if !populate_works() {
            return None;
        }
        let page = super::direct::ALIGN;
        let lo = off / page * page;
        // SAFETY: [lo, off + n) lies inside our mapping, page aligned at lo.
        let r = unsafe {
            libc::madvise(
                self.ptr.add(lo) as *mut libc::c_void,
                off + n - lo,
                libc::MADV_POPULATE_READ,
            )
        };
        if r != 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
                // A kernel before 5.14: no safe way to touch the mapping.
                POPULATE_MISSING.set(true).ok();
            }
            return None;
        }
        // SAFETY: inside the mapping (checked above), read-only, and the
        // pages are mapped; a truncation from now until the hash is done
        // could still unmap them (see docs/STORAGE.md).
        Some(unsafe { std::slice::from_raw_parts(self.ptr.add(off), n) })
    }
}

static POPULATE_MISSING: OnceLock<bool> = OnceLock::new();

/// False once MADV_POPULATE_READ was refused (old kernel): zero-copy
/// blocks stop being made.
pub fn populate_works() -> bool {
    POPULATE_MISSING.get().is_none()
}

impl Drop for FileMap {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what new() mapped; no slice of it
        // outlives &self.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn the_switch_is_on_unless_turned_off() {
        for v in [None, Some("1"), Some("auto"), Some("")] {
            assert!(parse_switch(v), "{v:?}");
        }
        for v in ["0", "off", "OFF", "no", "false"] {
            assert!(!parse_switch(Some(v)), "{v}");
        }
    }

    #[test]
    fn a_mapping_gives_the_file_bytes_and_refuses_past_its_end() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i * 7) as u8).collect();
        f.write_all(&data).unwrap();
        let m = FileMap::new(&f, data.len() as u64).unwrap();
        assert_eq!(m.populated(5000, 7000).unwrap(), &data[5000..12000]);
        assert_eq!(m.populated(0, data.len()).unwrap(), &data[..]);
        assert!(m.populated(1, data.len()).is_none());
        assert!(m.populated(0, 0).is_none());
        // Truncated under the mapping: an error, not a SIGBUS.
        f.set_len(4096).unwrap();
        assert!(m.populated(8192, 4096).is_none());
        assert_eq!(m.populated(0, 4096).unwrap(), &data[..4096]);
    }
}
