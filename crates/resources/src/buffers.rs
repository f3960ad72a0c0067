//! The buffer pool (seed 000 sec. 6.1.5: one bulk allocation split into
//! fixed buffers that are reused for the whole transfer).
//!
//! Buffers travel between stages by value through bounded channels; the
//! pool itself is a lock-free bounded queue of free buffers, so there is no
//! global lock per block. Every buffer is page aligned (O_DIRECT-ready) and
//! carries its own pre-allocated segment table and hash slots, so the data
//! path never allocates.

use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, Sender};
use ramsys_proto::data::{Segment, MAX_SEGMENTS};

/// Alignment of every buffer: a page, enough for O_DIRECT on any device.
pub const ALIGN: usize = 4096;

/// Backing memory for a pool. The default is the heap; the NUMA layer
/// supplies node-bound regions (mbind) through the same trait.
pub trait Memory: Send + Sync {
    fn ptr(&self) -> *mut u8;
    fn len(&self) -> usize;
    /// NUMA node the memory is bound to, if any (for --explain).
    fn node(&self) -> Option<u32> {
        None
    }
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Page-aligned anonymous memory from mmap. Pages are zero-filled by the
/// kernel on first touch, so a large pool costs nothing until used (an
/// over-aligned `alloc_zeroed` would memset the whole pool up front).
pub struct HeapMemory {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the region is plain memory owned by this value; access is
// partitioned into disjoint buffers by the pool.
unsafe impl Send for HeapMemory {}
unsafe impl Sync for HeapMemory {}

impl HeapMemory {
    pub fn new(bytes: usize) -> anyhow::Result<Self> {
        let len = bytes.max(ALIGN).div_ceil(ALIGN) * ALIGN;
        // SAFETY: anonymous private mapping; checked for MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            anyhow::bail!(
                "cannot allocate {bytes} bytes of buffer memory: {}",
                std::io::Error::last_os_error()
            );
        }
        advise_huge(p, len);
        Ok(HeapMemory {
            ptr: NonNull::new(p as *mut u8).expect("mmap returned null"),
            len,
        })
    }
}

/// Pools at least this large are backed by transparent huge pages.
pub const HUGE_MIN: usize = 2 << 20;

/// Whether pools ask for huge pages: on unless `RAMSYS_THP=0`.
pub fn huge_pages_wanted() -> bool {
    std::env::var_os("RAMSYS_THP").is_none_or(|v| v != "0")
}

/// Ask for transparent huge pages over a pool of at least [`HUGE_MIN`]
/// bytes (issue 17). A fresh process touches its buffers for the first time
/// during its first transfer: with 4 KiB pages that was one page fault per
/// page, 23k in the pushing agent and 38k in the daemon for the
/// 47,984-file tree; with 2 MiB pages it is one per 2 MiB. The pages are
/// still taken on first touch (madvise only marks the range), and the
/// advice is only a hint: a kernel with THP off or no huge page free
/// falls back to small pages.
fn advise_huge(p: *mut libc::c_void, len: usize) {
    if len < HUGE_MIN || !huge_pages_wanted() {
        return;
    }
    // SAFETY: [p, p+len) is the mapping just made; madvise does not touch
    // its contents. A failure (EINVAL without THP) leaves small pages.
    unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
}

impl Drop for HeapMemory {
    fn drop(&mut self) {
        // SAFETY: mapped in new() with this length.
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len) };
    }
}

impl Memory for HeapMemory {
    fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// One buffer: `cap` bytes of the pool's memory plus the metadata of the
/// block it currently holds.
pub struct Buf {
    mem: Arc<dyn Memory>,
    ptr: NonNull<u8>,
    cap: usize,
    /// Valid payload bytes.
    pub len: usize,
    /// Where the payload belongs (one segment per file piece).
    pub segs: Vec<Segment>,
    /// Per-segment hashes (same indices as `segs`).
    pub hashes: Vec<u64>,
    /// Block checksum (sum of segment hashes) or 0 when checksums are off.
    pub checksum: u64,
    /// Data link the block arrived on (sink side, for credit return).
    pub stream: u16,
    /// Zero-copy pieces (source side, issue 17): payload ranges whose
    /// bytes are not in the buffer but in a file, sent from the page cache
    /// with sendfile(2); the bytes between them are the buffer's own. In
    /// payload order, at most [`MAX_FILE_RANGES`] (capacity reserved at
    /// pool creation: nothing allocated per block; each holds a descriptor
    /// open until the block is sent). The buffer still counts against the
    /// pool (credits and back-pressure are per buffer).
    pub files: Vec<FileRange>,
}

/// Most zero-copy pieces per block: bounds the descriptors that blocks in
/// flight keep open (a packed block of small files holds one per file).
pub const MAX_FILE_RANGES: usize = 16;

/// `len` payload bytes at payload offset `at` that are `file`'s bytes at
/// `off` (a zero-copy piece of a block).
pub struct FileRange {
    pub file: Arc<std::fs::File>,
    pub off: u64,
    pub at: usize,
    pub len: usize,
}

// SAFETY: a Buf is the only handle to its slice of the region.
unsafe impl Send for Buf {}

impl Buf {
    pub fn capacity(&self) -> usize {
        self.cap
    }
    /// The valid payload.
    pub fn data(&self) -> &[u8] {
        // SAFETY: ptr..ptr+cap is exclusively ours; len <= cap.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len.min(self.cap)) }
    }
    /// The whole buffer, for filling.
    pub fn space(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }
    /// Payload, segment table and hash slots at once (to hash a block in
    /// place without copying).
    pub fn parts_mut(&mut self) -> (&[u8], &mut Vec<Segment>, &mut Vec<u64>) {
        // SAFETY: the payload slice and the two Vecs are disjoint.
        let data = unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len.min(self.cap)) };
        (data, &mut self.segs, &mut self.hashes)
    }
    /// Forget the block this buffer held.
    pub fn reset(&mut self) {
        self.len = 0;
        self.segs.clear();
        self.hashes.clear();
        self.checksum = 0;
        self.stream = 0;
        self.files.clear();
    }
    /// NUMA node of the memory, if bound.
    pub fn node(&self) -> Option<u32> {
        self.mem.node()
    }
    /// The whole region this buffer was cut from (start, length), e.g. to
    /// register it once with io_uring as a fixed buffer.
    pub fn region(&self) -> (*mut u8, usize) {
        (self.mem.ptr(), self.mem.len())
    }
}

/// A bounded pool of free buffers.
pub struct BufferPool {
    tx: Sender<Buf>,
    rx: Receiver<Buf>,
    count: usize,
    buf_size: usize,
    node: Option<u32>,
    /// Address range covering every buffer of this pool (start, length).
    span: (usize, usize),
}

impl BufferPool {
    /// Allocate `count` buffers of `buf_size` bytes (rounded up to the
    /// page) from fresh heap memory.
    pub fn allocate(count: usize, buf_size: usize) -> anyhow::Result<Self> {
        let size = buf_size.div_ceil(ALIGN) * ALIGN;
        let mem = Arc::new(HeapMemory::new(size * count.max(1))?);
        Self::from_memory(mem, count, size)
    }

    /// Split `mem` into `count` buffers of `buf_size` bytes.
    pub fn from_memory(
        mem: Arc<dyn Memory>,
        count: usize,
        buf_size: usize,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(count > 0, "buffer pool needs at least one buffer");
        anyhow::ensure!(
            buf_size.is_multiple_of(ALIGN),
            "buffer size must be a multiple of {ALIGN}"
        );
        anyhow::ensure!(
            mem.len() >= count * buf_size,
            "buffer memory too small: {} < {}",
            mem.len(),
            count * buf_size
        );
        let node = mem.node();
        let (tx, rx) = bounded(count);
        for i in 0..count {
            // SAFETY: i * buf_size + buf_size <= mem.len().
            let p = unsafe { mem.ptr().add(i * buf_size) };
            let buf = Buf {
                mem: mem.clone(),
                ptr: NonNull::new(p).expect("non-null region"),
                cap: buf_size,
                len: 0,
                segs: Vec::with_capacity(MAX_SEGMENTS),
                hashes: Vec::with_capacity(MAX_SEGMENTS),
                files: Vec::with_capacity(MAX_FILE_RANGES),
                checksum: 0,
                stream: 0,
            };
            tx.send(buf).expect("channel has room for count buffers");
        }
        Ok(BufferPool {
            tx,
            rx,
            count,
            buf_size,
            node,
            span: (mem.ptr() as usize, count * buf_size),
        })
    }

    /// A pool made of buffers taken from another pool (a session's share).
    pub fn from_bufs(bufs: Vec<Buf>) -> anyhow::Result<Self> {
        anyhow::ensure!(!bufs.is_empty(), "empty buffer share");
        let buf_size = bufs[0].cap;
        let node = bufs[0].node();
        let count = bufs.len();
        let start = bufs.iter().map(|b| b.ptr.as_ptr() as usize).min();
        let end = bufs.iter().map(|b| b.ptr.as_ptr() as usize + b.cap).max();
        let span = match (start, end) {
            (Some(s), Some(e)) => (s, e - s),
            _ => (0, 0),
        };
        let (tx, rx) = bounded(count);
        for b in bufs {
            tx.send(b).expect("room for every buffer");
        }
        Ok(BufferPool {
            tx,
            rx,
            count,
            buf_size,
            node,
            span,
        })
    }

    /// The smallest address range holding every buffer of this pool
    /// (start, length): what a session registers with io_uring. A share
    /// of a fresh engine pool is its first buffers, so registering the
    /// span instead of the engine's whole region (`Buf::region`) pins and
    /// faults in only the memory the session uses: 44 MiB of a client's
    /// 192 MiB with 4 streams (0.12-0.22 s of page faults per run saved on
    /// the measurement VM, docs/BENCHMARKS.md "CPU per GB").
    pub fn span(&self) -> (*mut u8, usize) {
        (self.span.0 as *mut u8, self.span.1)
    }

    pub fn buf_size(&self) -> usize {
        self.buf_size
    }
    pub fn count(&self) -> usize {
        self.count
    }
    pub fn node(&self) -> Option<u32> {
        self.node
    }
    /// Buffers currently free.
    pub fn free(&self) -> usize {
        self.rx.len()
    }

    /// Take a free buffer, waiting for one.
    pub fn get(&self) -> Buf {
        let mut b = self.rx.recv().expect("pool holds its own sender");
        b.reset();
        b
    }

    /// Take a free buffer, waiting at most `t`.
    pub fn get_timeout(&self, t: Duration) -> Option<Buf> {
        self.rx.recv_timeout(t).ok().map(|mut b| {
            b.reset();
            b
        })
    }

    /// Take a free buffer if one is ready.
    pub fn try_get(&self) -> Option<Buf> {
        self.rx.try_recv().ok().map(|mut b| {
            b.reset();
            b
        })
    }

    /// Return a buffer.
    pub fn put(&self, mut b: Buf) {
        // A free buffer holds no file open (a zero-copy block's source).
        b.files.clear();
        // Cannot fail: the pool never holds more than `count` buffers.
        let _ = self.tx.try_send(b);
    }

    /// Batch get (seed 000 sec. 6.2.2, Fig. 6-8: take several buffers per
    /// pool operation): append up to `max` free buffers to `out`, waiting
    /// for the first one only if `block`. Returns how many were taken.
    pub fn get_many(&self, out: &mut Vec<Buf>, max: usize, block: bool) -> usize {
        let mut n = 0;
        if block && max > 0 {
            out.push(self.get());
            n = 1;
        }
        while n < max {
            match self.try_get() {
                Some(b) => {
                    out.push(b);
                    n += 1;
                }
                None => break,
            }
        }
        n
    }

    /// Batch put: return every buffer in `bufs` (drained).
    pub fn put_many(&self, bufs: &mut Vec<Buf>) {
        for b in bufs.drain(..) {
            self.put(b);
        }
    }

    /// Take up to `max` buffers that are free right now (at least `min`,
    /// waiting up to `wait` for them); used to give a session its share.
    pub fn take(&self, min: usize, max: usize, wait: Duration) -> Option<Vec<Buf>> {
        let deadline = std::time::Instant::now() + wait;
        let mut out = Vec::with_capacity(max);
        while out.len() < max {
            match self.rx.try_recv() {
                Ok(b) => out.push(b),
                Err(_) if out.len() >= min => break,
                Err(_) => match self
                    .rx
                    .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
                {
                    Ok(b) => out.push(b),
                    Err(_) => {
                        for b in out {
                            self.put(b);
                        }
                        return None;
                    }
                },
            }
        }
        Some(out)
    }

    /// Give the pages of an idle pool back to the system (a watch job
    /// between batches, issue 38: a full sync touches most of the pool and
    /// its RSS would stay there for the job's life). Only when every buffer
    /// is free (no session holds one, so no I/O targets any and no io_uring
    /// ring has them registered: rings live per session): they are taken
    /// out meanwhile so none is handed out during the madvise. The next
    /// use faults zeroed pages in again (one fault per huge page). Returns
    /// the bytes released, 0 when a buffer is in use.
    pub fn release_idle(&self) -> usize {
        let mut held = Vec::with_capacity(self.count);
        while let Ok(b) = self.rx.try_recv() {
            held.push(b);
        }
        let mut released = 0;
        if held.len() == self.count && self.span.1 > 0 {
            // SAFETY: the span covers exactly this pool's buffers, all of
            // them held here; MADV_DONTNEED on private anonymous memory
            // only drops their contents (nobody reads a free buffer).
            let r = unsafe {
                libc::madvise(
                    self.span.0 as *mut libc::c_void,
                    self.span.1,
                    libc::MADV_DONTNEED,
                )
            };
            if r == 0 {
                released = self.span.1;
            }
        }
        for b in held {
            self.put(b);
        }
        released
    }

    /// Drain every buffer (waiting for all to come back) to hand them to
    /// their parent pool.
    pub fn into_bufs(self, wait: Duration) -> Vec<Buf> {
        let deadline = std::time::Instant::now() + wait;
        let mut out = Vec::with_capacity(self.count);
        while out.len() < self.count {
            match self
                .rx
                .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
            {
                Ok(b) => out.push(b),
                Err(_) => break,
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resident pages of [p, p+len) (mincore).
    fn resident(p: *mut u8, len: usize) -> usize {
        let mut v = vec![0u8; len.div_ceil(4096)];
        // SAFETY: p is page aligned and mapped for len bytes; v has a byte
        // per page.
        let r = unsafe { libc::mincore(p as *mut libc::c_void, len, v.as_mut_ptr()) };
        assert_eq!(r, 0);
        v.iter().filter(|b| **b & 1 == 1).count()
    }

    #[test]
    fn an_idle_pool_gives_its_pages_back_and_a_busy_one_keeps_them() {
        let pool = BufferPool::allocate(4, 64 << 10).unwrap();
        let mut bufs = Vec::new();
        pool.get_many(&mut bufs, 4, true);
        for b in &mut bufs {
            b.space().fill(7);
        }
        let (p, len) = pool.span();
        assert_eq!(resident(p, len), len / 4096);
        // One buffer still out: nothing released.
        let out = bufs.pop().unwrap();
        pool.put_many(&mut bufs);
        assert_eq!(pool.release_idle(), 0);
        assert_eq!(resident(p, len), len / 4096);
        pool.put(out);
        assert_eq!(pool.release_idle(), len);
        assert_eq!(resident(p, len), 0);
        assert_eq!(pool.free(), 4, "every buffer back in the pool");
        // Usable again, zeroed.
        let mut b = pool.get();
        assert!(b.space().iter().all(|x| *x == 0));
        b.space()[0] = 1;
        pool.put(b);
    }

    /// The `THPeligible` line of the smaps entry that holds `addr`.
    fn thp_eligible(addr: usize) -> Option<bool> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = first.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = (a..b).contains(&addr);
                    continue;
                }
            }
            if inside {
                if let Some(v) = line.strip_prefix("THPeligible:") {
                    return Some(v.trim() == "1");
                }
            }
        }
        None
    }

    #[test]
    fn large_pools_ask_for_huge_pages_small_ones_do_not() {
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if thp.is_empty() || thp.contains("[never]") || !huge_pages_wanted() {
            return; // no THP on this kernel: nothing to observe
        }
        let big = HeapMemory::new(8 << 20).unwrap();
        assert_eq!(thp_eligible(big.ptr() as usize), Some(true));
        // A pool below HUGE_MIN keeps small pages (with THP "always" the
        // kernel may still use huge pages on its own).
        if thp.contains("[madvise]") {
            let small = HeapMemory::new(64 << 10).unwrap();
            assert_eq!(thp_eligible(small.ptr() as usize), Some(false));
        }
        // The memory works as before: written and read back.
        let p = BufferPool::from_memory(Arc::new(big), 2, 4 << 20).unwrap();
        let mut b = p.get();
        b.space()[..4].copy_from_slice(b"abcd");
        b.len = 4;
        assert_eq!(b.data(), b"abcd");
        p.put(b);
    }

    #[test]
    fn buffers_are_aligned_disjoint_and_recycled() {
        let p = BufferPool::allocate(4, 10_000).unwrap();
        assert_eq!(p.buf_size(), 12_288);
        let mut bs: Vec<Buf> = (0..4).map(|_| p.get()).collect();
        assert!(p.try_get().is_none());
        for (i, b) in bs.iter_mut().enumerate() {
            assert_eq!(b.space().as_ptr() as usize % ALIGN, 0);
            b.space().fill(i as u8);
            b.len = 10;
        }
        for (i, b) in bs.iter().enumerate() {
            assert!(b.data().iter().all(|&x| x == i as u8));
        }
        for b in bs {
            p.put(b);
        }
        assert_eq!(p.free(), 4);
        let share = p.take(1, 3, Duration::from_millis(10)).unwrap();
        assert_eq!(share.len(), 3);
        let sub = BufferPool::from_bufs(share).unwrap();
        assert_eq!(sub.count(), 3);
        assert_eq!(p.free(), 1);
        assert!(p.take(2, 2, Duration::from_millis(10)).is_none());
        assert_eq!(p.free(), 1, "a failed take returns what it took");
        for b in sub.into_bufs(Duration::from_millis(10)) {
            p.put(b);
        }
        assert_eq!(p.free(), 4);
    }

    #[test]
    fn batch_get_and_put() {
        let p = BufferPool::allocate(3, 4096).unwrap();
        let mut v = Vec::new();
        assert_eq!(p.get_many(&mut v, 2, false), 2);
        assert_eq!(p.get_many(&mut v, 5, true), 1);
        assert_eq!(p.get_many(&mut v, 5, false), 0);
        let (start, len) = v[0].region();
        assert!(len >= 3 * 4096 && !start.is_null());
        p.put_many(&mut v);
        assert!(v.is_empty());
        assert_eq!(p.free(), 3);
    }

    #[test]
    fn a_share_spans_only_its_own_buffers() {
        let p = BufferPool::allocate(8, 4096).unwrap();
        let (region, region_len) = p.get().region();
        assert_eq!(p.span(), (region, 8 * 4096), "whole pool: its region");
        // A fresh pool hands out its first buffers: the share of 3 spans
        // 3 buffers, not the 8 of the region (what io_uring registers).
        let p = BufferPool::allocate(8, 4096).unwrap();
        let share =
            BufferPool::from_bufs(p.take(3, 3, Duration::from_millis(10)).unwrap()).unwrap();
        let (start, len) = share.span();
        assert_eq!(len, 3 * 4096);
        let bufs: Vec<Buf> = (0..3).map(|_| share.get()).collect();
        for b in &bufs {
            let a = b.data().as_ptr() as usize;
            assert!(a >= start as usize && a + b.capacity() <= start as usize + len);
        }
        assert!(region_len >= 8 * 4096);
    }
}
