//! The io_uring engine: batched asynchronous storage I/O driven by
//! Algorithm 2 (seed 000 sec. 6.2.2, after Fig. 6-8). io_uring is the
//! successor of the libaio the seed used.
//!
//! The reader and writer loops that drive these rings live beside the
//! other readers and writers: data/uring_reader.rs, data/uring_writer.rs.
//!
//! Reader (one ring per reader thread), following Algorithm 2:
//! - take several empty buffers per pool operation (`get_many`, lines
//!   4-8); block on the pool only when nothing is in flight, i.e. when the
//!   next stage (senders) holds every buffer and is the bottleneck;
//! - pack units into buffers as the sync engine does, one read SQE per
//!   segment, and submit the whole batch with one system call (lines
//!   9-13);
//! - reap every completion available (lines 14-19); block for completions
//!   only when this stage is the bottleneck (all our buffers are in flight,
//!   or there is nothing left to plan), poll otherwise. A buffer goes to
//!   the senders once all its reads completed and were hashed.
//!
//! Writer (one ring per writer thread): take every received block ready
//! (block on the channel only when no write is in flight), submit one
//! write per segment (two when the aligned prefix goes O_DIRECT and the
//! tail buffered), reap in batches, and free a buffer (and its credit)
//! once all its writes completed.
//!
//! The pool's memory is registered once per ring as a fixed buffer
//! (READ_FIXED/WRITE_FIXED: no page pinning per I/O) when the kernel
//! allows; files are not registered, since most are opened for a single
//! read and the per-file registration would cost what it saves.

use std::io;
use std::sync::OnceLock;

use io_uring::{opcode, types, IoUring};

use super::IoEngine;

/// Engine used when none is asked for (chosen by measurement, see
/// docs/STORAGE.md).
pub const DEFAULT_ENGINE: IoEngine = IoEngine::Uring;

/// Submission queue depth of each ring.
pub(crate) const RING_ENTRIES: u32 = 256;
/// Completion queue size; in-flight operations per ring stay below it, so
/// completions never overflow.
pub(crate) const CQ_ENTRIES: u32 = 16384;
/// Most operations one ring keeps in flight.
pub(crate) const MAX_INFLIGHT: usize = (CQ_ENTRIES / 2) as usize;

/// Whether this kernel lets us create a ring (probed once per process).
pub fn available() -> bool {
    static AVAIL: OnceLock<bool> = OnceLock::new();
    *AVAIL.get_or_init(|| match IoUring::new(4) {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!("io_uring unavailable ({e}); using the sync I/O engine");
            false
        }
    })
}

/// The engine actually used for a request.
pub fn effective(e: IoEngine) -> IoEngine {
    match e {
        IoEngine::Uring if !available() => IoEngine::Sync,
        e => e,
    }
}

/// A ring with the buffer region registered when possible.
pub(crate) struct Ring {
    pub(crate) ring: IoUring,
    /// Registered region (start, len), if registration worked.
    pub(crate) fixed: Option<(usize, usize)>,
}

/// Register the pool as fixed buffers only for sessions at least this
/// large: registration pins (and so faults in) the whole region, which
/// costs ~0.5 ms per MiB up front and would dominate small transfers.
pub(crate) const FIXED_MIN_BYTES: u64 = 1 << 30;

impl Ring {
    /// `region` is the session's buffers (`BufferPool::span`): registered
    /// as one fixed buffer when `register`; buffers outside it (none
    /// expected) are read and written unregistered.
    pub(crate) fn new(region: (*mut u8, usize), register: bool) -> io::Result<Ring> {
        let ring = IoUring::builder()
            .setup_cqsize(CQ_ENTRIES)
            .build(RING_ENTRIES)?;
        let (ptr, len) = region;
        let iov = libc::iovec {
            iov_base: ptr as *mut libc::c_void,
            iov_len: len,
        };
        // SAFETY: the region outlives the ring: every Buf (which keeps the
        // region alive) is back in its pool before the ring is dropped, and
        // the ring is dropped before the pool's memory.
        let fixed = if !register || len == 0 {
            None
        } else {
            match unsafe { ring.submitter().register_buffers(&[iov]) } {
                Ok(()) => Some((ptr as usize, len)),
                Err(_) => None,
            }
        };
        Ok(Ring { ring, fixed })
    }

    pub(crate) fn in_fixed(&self, p: usize, len: usize) -> bool {
        self.fixed.is_some_and(|(s, l)| p >= s && p + len <= s + l)
    }

    /// Queue a read of `len` bytes at `off` into `p`. The fixed buffer
    /// serves `direct` (O_DIRECT) reads only: see [`Ring::write`].
    pub(crate) fn read(
        &mut self,
        fd: i32,
        io: (*mut u8, usize),
        off: u64,
        direct: bool,
        ud: u64,
    ) -> bool {
        let (p, len) = io;
        let e = if direct && self.in_fixed(p as usize, len) {
            opcode::ReadFixed::new(types::Fd(fd), p, len as u32, 0)
                .offset(off)
                .build()
        } else {
            opcode::Read::new(types::Fd(fd), p, len as u32)
                .offset(off)
                .build()
        };
        self.push(e.user_data(ud))
    }

    /// Queue a write of `len` bytes at `off` from `p`. The fixed buffer
    /// serves `direct` (O_DIRECT) writes only, where it saves pinning
    /// pages per I/O. A buffered write copies into the page cache; from a
    /// fixed buffer that copy is the kernel's memcpy (a bvec iterator),
    /// which without FSRM is memcpy_orig, a plain mov loop; from a user
    /// address it is copy_from_user, `rep movsb` on ERMS CPUs. On this VM
    /// (erms, no fsrm) the first was a third of all CPU samples of a
    /// 4 x 1 GiB push (4.2 CPU-s), the second 2.7 CPU-s for the same
    /// bytes (docs/STORAGE.md "Fixed buffers").
    pub(crate) fn write(
        &mut self,
        fd: i32,
        io: (*const u8, usize),
        off: u64,
        direct: bool,
        ud: u64,
    ) -> bool {
        let (p, len) = io;
        let e = if direct && self.in_fixed(p as usize, len) {
            opcode::WriteFixed::new(types::Fd(fd), p, len as u32, 0)
                .offset(off)
                .build()
        } else {
            opcode::Write::new(types::Fd(fd), p, len as u32)
                .offset(off)
                .build()
        };
        self.push(e.user_data(ud))
    }

    /// Queue one SQE, submitting first if the queue is full (the kernel
    /// consumes submitted entries at once, freeing their slots).
    pub(crate) fn push(&mut self, e: io_uring::squeue::Entry) -> bool {
        if self.ring.submission().is_full() && self.submit(0).is_err() {
            return false;
        }
        // SAFETY: the buffer and fd an entry names stay alive until its
        // completion is reaped (owned by the slot and op tables).
        unsafe { self.ring.submission().push(&e).is_ok() }
    }

    pub(crate) fn sq_room(&mut self) -> usize {
        let sq = self.ring.submission();
        sq.capacity() - sq.len()
    }

    /// Submit what is queued; wait for at least `wait` completions.
    pub(crate) fn submit(&mut self, wait: usize) -> io::Result<()> {
        loop {
            match self.ring.submit_and_wait(wait) {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && wait == 0 => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    pub(crate) fn reap(&mut self, out: &mut Vec<(u64, i32)>) {
        for c in self.ring.completion() {
            out.push((c.user_data(), c.result()));
        }
    }
}

/// Simple slab of in-flight records indexed by user_data.
pub(crate) struct Slab<T> {
    pub(crate) items: Vec<Option<T>>,
    free: Vec<usize>,
    pub(crate) live: usize,
}

impl<T> Slab<T> {
    pub(crate) fn new() -> Self {
        Slab {
            items: Vec::new(),
            free: Vec::new(),
            live: 0,
        }
    }
    pub(crate) fn insert(&mut self, t: T) -> usize {
        self.live += 1;
        match self.free.pop() {
            Some(i) => {
                self.items[i] = Some(t);
                i
            }
            None => {
                self.items.push(Some(t));
                self.items.len() - 1
            }
        }
    }
    pub(crate) fn get_mut(&mut self, i: usize) -> &mut T {
        self.items[i].as_mut().expect("live slab entry")
    }
    pub(crate) fn remove(&mut self, i: usize) -> T {
        self.live -= 1;
        self.free.push(i);
        self.items[i].take().expect("live slab entry")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// Both opcodes a registered ring can pick (fixed for direct I/O,
    /// plain for buffered) move the right bytes to the right offsets.
    #[test]
    fn registered_ring_writes_and_reads_both_ways() {
        if !available() {
            return;
        }
        let pool = ramsys_resources::BufferPool::allocate(2, 8192).unwrap();
        let (ptr, len) = pool.span();
        let Ok(mut ring) = Ring::new((ptr, len), true) else {
            return;
        };
        // SAFETY: the pool's memory, alive until the end of the test; the
        // kernel touches it only between a submit and its reap below.
        let region = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
        for (i, b) in region.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let d = tempfile::tempdir().unwrap();
        let f = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(d.path().join("f"))
            .unwrap();
        let fd = f.as_raw_fd();
        // Buffered (plain) write of the first 4 KiB, "direct" (fixed)
        // opcode for the next 4 KiB: the fd is buffered, the opcode is
        // what differs.
        assert!(ring.write(fd, (ptr as *const u8, 4096), 0, false, 1));
        // SAFETY: offsets inside the region (two 8 KiB buffers).
        let second = unsafe { ptr.add(4096) } as *const u8;
        assert!(ring.write(fd, (second, 4096), 4096, ring.fixed.is_some(), 2));
        ring.submit(2).unwrap();
        let mut done = Vec::new();
        ring.reap(&mut done);
        done.sort_unstable();
        assert_eq!(done, vec![(1, 4096), (2, 4096)]);
        assert_eq!(std::fs::read(d.path().join("f")).unwrap(), region[..8192]);
        // Read it back into the second buffer both ways.
        // SAFETY: as above.
        let back = unsafe { ptr.add(8192) };
        region[8192..].fill(0);
        assert!(ring.read(fd, (back, 4096), 0, false, 3));
        let back2 = unsafe { back.add(4096) };
        assert!(ring.read(fd, (back2, 4096), 4096, ring.fixed.is_some(), 4));
        ring.submit(2).unwrap();
        done.clear();
        ring.reap(&mut done);
        assert_eq!(done.len(), 2);
        assert_eq!(region[..8192], region[8192..16384]);
    }
}
