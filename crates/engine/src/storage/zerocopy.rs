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

use std::cell::Cell;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Files at least this large are sent zero-copy, packed several to a
/// block below the block size (data::reader::ReaderCtx::push_mapped).
/// Below it a mapping (mmap, page-table fill, munmap: some 10 us) costs
/// about what copying the file into the block does; most files of a
/// source tree are smaller and stay copied.
pub const ZEROCOPY_MIN: u64 = 64 * 1024;

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
    /// A page of it was cut off (the file was truncated while hashed) and
    /// replaced by zeros: not used again.
    poisoned: AtomicBool,
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
            poisoned: AtomicBool::new(false),
        })
    }

    /// `hash` of the bytes `[off, off + n)`, read in place ([`populated`]
    /// first). None: read this block into a buffer instead (the range is
    /// not mapped, or the file was truncated under the hash: the SIGBUS
    /// that would kill the process is caught, see [`guard`]).
    ///
    /// [`populated`]: FileMap::populated
    pub fn hash(&self, off: u64, n: usize, hash: impl FnOnce(&[u8]) -> u64) -> Option<u64> {
        if self.poisoned.load(Ordering::Relaxed) || !guard() {
            return None;
        }
        let bytes = self.populated(off, n)?;
        let lo = bytes.as_ptr() as usize;
        READING.with(|r| r.set((lo, lo + n)));
        FAULTED.with(|f| f.set(false));
        let h = hash(bytes);
        READING.with(|r| r.set((0, 0)));
        if FAULTED.with(|f| f.get()) {
            self.poisoned.store(true, Ordering::Relaxed);
            return None;
        }
        Some(h)
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

thread_local! {
    /// The mapped bytes this thread is hashing (start, end): a SIGBUS in
    /// them is a truncation under the hash, which [`on_sigbus`] survives.
    static READING: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
    /// Such a SIGBUS happened since the hash started.
    static FAULTED: Cell<bool> = const { Cell::new(false) };
}

/// The SIGBUS disposition before ours (std's stack-overflow handler).
static PREV: OnceLock<libc::sigaction> = OnceLock::new();
static PAGE: AtomicUsize = AtomicUsize::new(4096);

/// Install the SIGBUS handler once per process; false if it could not be
/// (then no block is hashed through a mapping). A file truncated between
/// MADV_POPULATE_READ and the end of the hash unmaps pages under the
/// reader; the next touch raises SIGBUS, which would end the process (a
/// daemon, for one user's truncate). The handler maps a zero page over
/// the faulting one, so the hash finishes; the block is then read into a
/// buffer (which sees the short file) and the mapping is not used again.
fn guard() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        // SAFETY: sysconf has no preconditions; sigaction installs a
        // handler that only touches const-initialized thread-locals, an
        // atomic and async-signal-safe system calls.
        unsafe {
            let page = libc::sysconf(libc::_SC_PAGESIZE);
            if page > 0 {
                PAGE.store(page as usize, Ordering::Relaxed);
            }
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut sa.sa_mask);
            let mut prev: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, &sa, &mut prev) != 0 {
                return false;
            }
            PREV.set(prev).is_ok()
        }
    })
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    let (lo, hi) = READING.with(|r| r.get());
    if addr >= lo && addr < hi {
        let page = PAGE.load(Ordering::Relaxed);
        // SAFETY: replaces one page of the FileMap this thread is hashing
        // (inside [lo, hi)) with a private zero page; the FileMap is
        // poisoned after the hash and unmapped whole on drop.
        let p = unsafe {
            libc::mmap(
                (addr & !(page - 1)) as *mut libc::c_void,
                page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            FAULTED.with(|f| f.set(true));
            return;
        }
    }
    // Not ours: what would have happened without us.
    match PREV.get() {
        Some(prev)
            if prev.sa_flags & libc::SA_SIGINFO != 0
                && prev.sa_sigaction != libc::SIG_DFL
                && prev.sa_sigaction != libc::SIG_IGN =>
        {
            // SAFETY: the previous SA_SIGINFO handler, called as the
            // kernel would have.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(prev.sa_sigaction) };
            f(sig, info, ctx);
        }
        prev => {
            // SAFETY: restoring a disposition; returning re-runs the
            // faulting access, which then takes the default action.
            unsafe {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, prev.unwrap_or(&dfl), std::ptr::null_mut());
            }
        }
    }
}

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

    /// A truncation after the pages were populated, while the hash runs:
    /// the SIGBUS is caught, the hash reports None and the mapping is
    /// not used again; the process lives.
    #[test]
    fn a_truncation_under_the_hash_is_survived() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![9u8; 4 * 4096]).unwrap();
        let m = FileMap::new(&f, 4 * 4096).unwrap();
        let sum = |b: &[u8]| b.iter().map(|&x| x as u64).sum::<u64>();
        assert_eq!(m.hash(0, 4 * 4096, sum), Some(9 * 4 * 4096));
        let r = m.hash(0, 4 * 4096, |b| {
            f.set_len(4096).unwrap();
            sum(b)
        });
        assert_eq!(r, None);
        assert_eq!(m.hash(0, 4096, sum), None, "poisoned");
    }
}
