//! The io_uring engine: batched asynchronous storage I/O driven by
//! Algorithm 2 (seed 000 sec. 6.2.2, after Fig. 6-8). io_uring is the
//! successor of the libaio the seed used.
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

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use crossbeam_channel::{Receiver, TryRecvError};
use io_uring::{opcode, types, IoUring};
use ramsys_proto::data::{hole_hash, segment_hash, Segment, MAX_HOLE, MAX_SEGMENTS};
use ramsys_resources::Buf;

use super::direct::{direct_prefix, is_aligned, pwrite_all_fd, round_up, ALIGN};
use super::sparse::Piece;
use super::{is_direct_refusal, IoEngine, IoOp};
use crate::data::reader::{ReaderCtx, SrcOpen};
use crate::data::sinkfiles::SinkFd;
use crate::data::writer::WriterIo;
use crate::fsops::pread_full;
use crate::request::tasks::ReadUnit;

/// Engine used when none is asked for (chosen by measurement, see
/// docs/STORAGE.md).
pub const DEFAULT_ENGINE: IoEngine = IoEngine::Uring;

/// Submission queue depth of each ring.
const RING_ENTRIES: u32 = 256;
/// Completion queue size; in-flight operations per ring stay below it, so
/// completions never overflow.
const CQ_ENTRIES: u32 = 16384;
/// Most operations one ring keeps in flight.
const MAX_INFLIGHT: usize = (CQ_ENTRIES / 2) as usize;

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
struct Ring {
    ring: IoUring,
    /// Registered region (start, len), if registration worked.
    fixed: Option<(usize, usize)>,
}

/// Register the pool as fixed buffers only for sessions at least this
/// large: registration pins (and so faults in) the whole region, which
/// costs ~0.5 ms per MiB up front and would dominate small transfers.
const FIXED_MIN_BYTES: u64 = 1 << 30;

impl Ring {
    fn new(sample: &Buf, register: bool) -> io::Result<Ring> {
        let ring = IoUring::builder()
            .setup_cqsize(CQ_ENTRIES)
            .build(RING_ENTRIES)?;
        let (ptr, len) = sample.region();
        let iov = libc::iovec {
            iov_base: ptr as *mut libc::c_void,
            iov_len: len,
        };
        // SAFETY: the region outlives the ring: every Buf (which keeps the
        // region alive) is back in its pool before the ring is dropped, and
        // the ring is dropped before the pool's memory.
        let fixed = if !register {
            None
        } else {
            match unsafe { ring.submitter().register_buffers(&[iov]) } {
                Ok(()) => Some((ptr as usize, len)),
                Err(_) => None,
            }
        };
        Ok(Ring { ring, fixed })
    }

    fn in_fixed(&self, p: usize, len: usize) -> bool {
        self.fixed.is_some_and(|(s, l)| p >= s && p + len <= s + l)
    }

    fn read(&mut self, fd: i32, p: *mut u8, len: usize, off: u64, ud: u64) -> bool {
        let e = if self.in_fixed(p as usize, len) {
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

    fn write(&mut self, fd: i32, p: *const u8, len: usize, off: u64, ud: u64) -> bool {
        let e = if self.in_fixed(p as usize, len) {
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
    fn push(&mut self, e: io_uring::squeue::Entry) -> bool {
        if self.ring.submission().is_full() && self.submit(0).is_err() {
            return false;
        }
        // SAFETY: the buffer and fd an entry names stay alive until its
        // completion is reaped (owned by the slot and op tables).
        unsafe { self.ring.submission().push(&e).is_ok() }
    }

    fn sq_room(&mut self) -> usize {
        let sq = self.ring.submission();
        sq.capacity() - sq.len()
    }

    /// Submit what is queued; wait for at least `wait` completions.
    fn submit(&mut self, wait: usize) -> io::Result<()> {
        loop {
            match self.ring.submit_and_wait(wait) {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && wait == 0 => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    fn reap(&mut self, out: &mut Vec<(u64, i32)>) {
        for c in self.ring.completion() {
            out.push((c.user_data(), c.result()));
        }
    }
}

/// Simple slab of in-flight records indexed by user_data.
struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<usize>,
    live: usize,
}

impl<T> Slab<T> {
    fn new() -> Self {
        Slab {
            items: Vec::new(),
            free: Vec::new(),
            live: 0,
        }
    }
    fn insert(&mut self, t: T) -> usize {
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
    fn get_mut(&mut self, i: usize) -> &mut T {
        self.items[i].as_mut().expect("live slab entry")
    }
    fn remove(&mut self, i: usize) -> T {
        self.live -= 1;
        self.free.push(i);
        self.items[i].take().expect("live slab entry")
    }
}

// ---------------------------------------------------------------- reader

/// A buffer being filled or in flight.
struct Slot {
    buf: Buf,
    /// Reads not yet completed.
    pending: usize,
    /// No more segments will be added.
    sealed: bool,
}

/// A unit being read.
struct UnitRec {
    unit: ReadUnit,
    open: Rc<SrcOpen>,
    outstanding: usize,
    planned: bool,
}

/// One read SQE.
struct ReadOp {
    slot: usize,
    seg: usize,
    unit: usize,
    idx: usize,
    off: u64,
    start: usize,
    want: usize,
    direct: bool,
}

struct UringReader<'a> {
    ctx: &'a ReaderCtx,
    home: usize,
    ring: Ring,
    total: usize,
    batch: usize,
    active: Vec<Buf>,
    slots: Slab<Slot>,
    /// Slot being filled.
    cur: Option<usize>,
    units: Slab<UnitRec>,
    ops: Slab<ReadOp>,
    /// Unit being planned, its pieces left.
    plan: Option<(usize, VecDeque<Piece>)>,
    last_open: Option<Rc<SrcOpen>>,
    pieces: Vec<Piece>,
    no_more_units: bool,
    gone: bool,
}

/// Reader body for the io_uring engine; false if no ring could be made
/// (the caller runs the sync engine instead).
pub fn run_reader_uring(ctx: &ReaderCtx, home: usize) -> bool {
    if ctx.storage.null {
        return false; // nothing to read: the sync loop is already optimal
    }
    let first = ctx.pool.get();
    let big = ctx.stats.total_bytes.load(Ordering::Relaxed) >= FIXED_MIN_BYTES;
    let ring = match Ring::new(&first, big) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("io_uring ring: {e}; reader uses the sync engine");
            ctx.pool.put(first);
            return false;
        }
    };
    let readers = ctx.homes.iter().filter(|h| h.is_some()).count().max(1);
    let total = (ctx.pool.count() / readers).clamp(2, 64);
    let mut r = UringReader {
        ctx,
        home,
        ring,
        total,
        batch: (total / 2).max(1),
        active: vec![first],
        slots: Slab::new(),
        cur: None,
        units: Slab::new(),
        ops: Slab::new(),
        plan: None,
        last_open: None,
        pieces: Vec::new(),
        no_more_units: false,
        gone: false,
    };
    r.run();
    true
}

impl UringReader<'_> {
    fn posted(&self) -> usize {
        self.slots.live - self.cur.is_some() as usize
    }

    fn work_left(&self) -> bool {
        !self.no_more_units || self.plan.is_some()
    }

    fn run(&mut self) {
        let mut cqes = Vec::with_capacity(RING_ENTRIES as usize);
        loop {
            let aborted = self.ctx.abort.load(Ordering::Relaxed) || self.gone;
            if aborted {
                self.no_more_units = true;
                self.plan = None;
            }
            // Alg. 2 lines 4-8: get empty buffers in a batch; block only if
            // nothing of ours is in flight (the senders hold them all).
            if self.work_left()
                && self.active.is_empty()
                && self.cur.is_none()
                && self.slots.live < self.total
            {
                let want = self.batch.min(self.total - self.slots.live);
                self.ctx
                    .pool
                    .get_many(&mut self.active, want, self.ops.live == 0);
            }
            // Lines 9-13: plan and queue reads while buffers and SQ room last.
            self.fill();
            if !self.work_left() {
                if let Some(c) = self.cur.take() {
                    self.seal(c);
                }
            }
            if self.ops.live == 0 && !self.work_left() && self.slots.live == 0 {
                break;
            }
            // Lines 14-19: block for completions when this stage is the
            // bottleneck (every buffer posted, or nothing more to plan, or
            // the SQ is full); otherwise just poll.
            let stuck = self.active.is_empty() && (self.cur.is_none() || self.ring.sq_room() == 0);
            let block =
                self.ops.live > 0 && (stuck || !self.work_left() || self.posted() >= self.total);
            if let Err(e) = self.ring.submit(block as usize) {
                tracing::warn!("io_uring submit: {e}");
                self.ctx.abort.store(true, Ordering::Release);
                // Wait out what the kernel still owns before freeing.
                while self.ops.live > 0 && self.ring.submit(1).is_ok() {
                    cqes.clear();
                    self.ring.reap(&mut cqes);
                    for &(ud, res) in &cqes {
                        self.complete(ud as usize, res);
                    }
                }
                break;
            }
            cqes.clear();
            self.ring.reap(&mut cqes);
            for &(ud, res) in &cqes {
                self.complete(ud as usize, res);
            }
        }
        // Anything left (abort): give buffers back.
        for i in 0..self.slots.items.len() {
            if self.slots.items[i].is_some() {
                let s = self.slots.remove(i);
                self.ctx.pool.put(s.buf);
            }
        }
        self.ctx.pool.put_many(&mut self.active);
    }

    /// The slot being filled, taking a fresh buffer if needed.
    fn cur_slot(&mut self) -> Option<usize> {
        if self.cur.is_none() {
            let buf = self.active.pop()?;
            self.cur = Some(self.slots.insert(Slot {
                buf,
                pending: 0,
                sealed: false,
            }));
        }
        self.cur
    }

    fn seal(&mut self, s: usize) {
        if self.cur == Some(s) {
            self.cur = None;
        }
        let slot = self.slots.get_mut(s);
        slot.sealed = true;
        if slot.pending == 0 {
            let slot = self.slots.remove(s);
            if !self.ctx.ship(slot.buf) {
                self.gone = true;
            }
        }
    }

    /// Next piece to plan, opening the next unit when needed.
    fn next_piece(&mut self) -> Option<(usize, Piece)> {
        loop {
            if let Some((u, q)) = &mut self.plan {
                if let Some(p) = q.pop_front() {
                    return Some((*u, p));
                }
                let u = *u;
                self.plan = None;
                self.units.get_mut(u).planned = true;
                self.maybe_unit_done(u);
            }
            if self.no_more_units {
                return None;
            }
            let Some(unit) = self.ctx.next_unit(self.home) else {
                self.no_more_units = true;
                return None;
            };
            let idx = unit.file as usize;
            if self.ctx.is_failed(idx) {
                continue;
            }
            let open = match &self.last_open {
                Some(o) if o.idx == unit.file => o.clone(),
                _ => match self.ctx.open(unit.file) {
                    Ok(Some(o)) => {
                        let o = Rc::new(o);
                        self.last_open = Some(o.clone());
                        o
                    }
                    Ok(None) => unreachable!("null source never reaches the uring reader"),
                    Err(e) => {
                        self.ctx.fail(idx, e);
                        continue;
                    }
                },
            };
            if let Err(e) = self.ctx.pieces(Some(&open), &unit, &mut self.pieces) {
                self.ctx.fail(idx, e);
                continue;
            }
            let u = self.units.insert(UnitRec {
                unit,
                open,
                outstanding: 0,
                planned: false,
            });
            self.plan = Some((u, self.pieces.drain(..).collect()));
        }
    }

    fn push_front(&mut self, p: Piece) {
        if let Some((_, q)) = &mut self.plan {
            q.push_front(p);
        }
    }

    fn fill(&mut self) {
        while !self.gone && self.ring.sq_room() > 0 && self.ops.live < MAX_INFLIGHT {
            let Some((u, piece)) = self.next_piece() else {
                return;
            };
            let Some(s) = self.cur_slot() else {
                self.push_front(piece);
                return;
            };
            let idx = self.units.get_mut(u).unit.file as usize;
            match piece {
                Piece::Hole { off, len } => {
                    let slot = self.slots.get_mut(s);
                    if slot.buf.segs.len() == MAX_SEGMENTS {
                        self.push_front(piece);
                        self.seal(s);
                        continue;
                    }
                    let n = len.min(MAX_HOLE as u64);
                    let id = self.ctx.files[idx].id;
                    slot.buf.segs.push(Segment::hole(id, off, n as u32));
                    if self.ctx.checksum {
                        let h = hole_hash(id, off, n);
                        slot.buf.hashes.push(h);
                        slot.buf.checksum = slot.buf.checksum.wrapping_add(h);
                        self.ctx.state[idx].digest.fetch_add(h, Ordering::AcqRel);
                    }
                    self.ctx.stats.add_bytes(n);
                    if n < len {
                        self.push_front(Piece::Hole {
                            off: off + n,
                            len: len - n,
                        });
                    }
                }
                Piece::Data { off, len } => {
                    if self.ctx.is_failed(idx) {
                        continue; // drop the rest of a failed file
                    }
                    let bs = self.ctx.block_size;
                    let open = self.units.get_mut(u).open.clone();
                    let slot = self.slots.get_mut(s);
                    let start = slot.buf.len;
                    let room = bs - start;
                    if room == 0 || slot.buf.segs.len() == MAX_SEGMENTS {
                        self.push_front(piece);
                        self.seal(s);
                        continue;
                    }
                    let direct = open.direct.is_some() && is_aligned(off);
                    if direct && !start.is_multiple_of(ALIGN) {
                        self.push_front(piece);
                        self.seal(s);
                        continue;
                    }
                    let want = room.min(len as usize);
                    let f = &self.ctx.files[idx];
                    if let Err(e) = self.ctx.storage.hook.check(IoOp::Read, &f.rel, off, want) {
                        self.ctx
                            .fail(idx, format!("read error at offset {off}: {e}"));
                        continue;
                    }
                    let io_len = if direct {
                        round_up(want).min(slot.buf.capacity() - start)
                    } else {
                        want
                    };
                    let seg = slot.buf.segs.len();
                    slot.buf.segs.push(Segment {
                        file_id: f.id,
                        offset: off,
                        len: want as u32,
                    });
                    if self.ctx.checksum {
                        slot.buf.hashes.push(0);
                    }
                    slot.buf.len = start + want;
                    slot.pending += 1;
                    let p = slot.buf.space()[start..].as_mut_ptr();
                    let fd = if direct {
                        open.direct.as_ref().unwrap().as_raw_fd()
                    } else {
                        open.file.as_raw_fd()
                    };
                    self.units.get_mut(u).outstanding += 1;
                    let op = self.ops.insert(ReadOp {
                        slot: s,
                        seg,
                        unit: u,
                        idx,
                        off,
                        start,
                        want,
                        direct,
                    });
                    if !self.ring.read(fd, p, io_len, off, op as u64) {
                        // Cannot happen with SQ room checked; complete it as failed.
                        self.complete(op, -libc::EIO);
                    }
                    if (want as u64) < len {
                        self.push_front(Piece::Data {
                            off: off + want as u64,
                            len: len - want as u64,
                        });
                    }
                    // A direct read of a file's unaligned tail transfers whole
                    // blocks, past `want`: nothing may be packed after it
                    // while it is in flight, so the block ends here.
                    if self.slots.get_mut(s).buf.len == bs || io_len > want {
                        self.seal(s);
                    }
                }
            }
        }
    }

    /// A read completed with `res` (bytes or -errno).
    fn complete(&mut self, op: usize, res: i32) {
        let r = self.ops.remove(op);
        let open = self.units.get_mut(r.unit).open.clone();
        let ctx = self.ctx;
        let f = &ctx.files[r.idx];
        let slot = self.slots.get_mut(r.slot);
        let mut got: Result<usize, io::Error> = if res < 0 {
            Err(io::Error::from_raw_os_error(-res))
        } else {
            Ok((res as usize).min(r.want))
        };
        // Short read or refused O_DIRECT: finish synchronously on the
        // buffered descriptor (rare).
        match &got {
            Err(e) if r.direct && is_direct_refusal(e) => {
                ctx.storage.refusals.refuse(f.dev, "source read", e);
                got = pread_full(
                    &open.file,
                    &mut slot.buf.space()[r.start..r.start + r.want],
                    r.off,
                );
            }
            Ok(n) if *n < r.want => {
                let n = *n;
                got = pread_full(
                    &open.file,
                    &mut slot.buf.space()[r.start + n..r.start + r.want],
                    r.off + n as u64,
                )
                .map(|m| n + m);
            }
            _ => {}
        }
        match got {
            Ok(n) if n == r.want => {}
            Ok(n) => ctx.fail(
                r.idx,
                format!(
                    "file shrank while being read (expected {} bytes, ended at {})",
                    f.size,
                    r.off + n as u64
                ),
            ),
            Err(e) => ctx.fail(r.idx, format!("read error at offset {}: {e}", r.off)),
        }
        // Hash what the block carries (even after a failure, so the block
        // checksum stays consistent for the other files in it).
        if ctx.checksum {
            let h = segment_hash(f.id, r.off, &slot.buf.space()[r.start..r.start + r.want]);
            slot.buf.hashes[r.seg] = h;
            slot.buf.checksum = slot.buf.checksum.wrapping_add(h);
            ctx.state[r.idx].digest.fetch_add(h, Ordering::AcqRel);
        }
        ctx.stats.add_bytes(r.want as u64);
        slot.pending -= 1;
        if slot.sealed && slot.pending == 0 {
            let s = self.slots.remove(r.slot);
            if !ctx.ship(s.buf) {
                self.gone = true;
            }
        }
        self.units.get_mut(r.unit).outstanding -= 1;
        self.maybe_unit_done(r.unit);
    }

    fn maybe_unit_done(&mut self, u: usize) {
        let rec = self.units.get_mut(u);
        if rec.planned && rec.outstanding == 0 {
            let rec = self.units.remove(u);
            self.ctx.unit_done(&rec.unit, Some(&rec.open.file));
        }
    }
}

// ---------------------------------------------------------------- writer

/// A received buffer whose writes are in flight.
struct WSlot {
    buf: Buf,
    pending: usize,
}

/// One segment being written (one or two SQEs).
struct SegWrite {
    slot: usize,
    seg: Segment,
    hash: u64,
    fd: Arc<SinkFd>,
    pending: usize,
    error: Option<io::Error>,
}

/// One write SQE.
struct WriteOp {
    segw: usize,
    p: usize,
    len: usize,
    off: u64,
    direct: bool,
}

/// Writer body for the io_uring engine; false if no ring could be made.
pub fn run_writer_uring(w: &WriterIo<'_>, rx: &Receiver<Buf>) -> bool {
    // Make the ring (and register the buffer region) before data flows,
    // so its set-up cost is not paid on the first block. Any buffer of the
    // pool names the region: a free one goes straight back; if none is
    // free, the first received block serves (and is then written).
    let mut next = None;
    let big = w.table.files().iter().map(|f| f.size).sum::<u64>() >= FIXED_MIN_BYTES;
    let ring = match w.pool.try_get() {
        Some(free) => {
            let r = Ring::new(&free, big);
            w.pool.put(free);
            r
        }
        None => match rx.recv() {
            Ok(b) => {
                let r = Ring::new(&b, big);
                next = Some(b);
                r
            }
            Err(_) => return true, // no data at all
        },
    };
    let mut ring = match ring {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("io_uring ring: {e}; writer uses the sync engine");
            if let Some(b) = next {
                write_sync(w, b);
            }
            return false;
        }
    };
    let mut slots: Slab<WSlot> = Slab::new();
    let mut segs: Slab<SegWrite> = Slab::new();
    let mut ops: Slab<WriteOp> = Slab::new();
    let mut cqes = Vec::with_capacity(RING_ENTRIES as usize);
    let mut closed = false;
    loop {
        // Take every block that is ready; block on the channel only when
        // no write is in flight (the receivers are the bottleneck).
        while ops.live + 2 * MAX_SEGMENTS <= MAX_INFLIGHT {
            let buf = match next.take() {
                Some(b) => b,
                None if closed => break,
                None if ops.live == 0 => match rx.recv() {
                    Ok(b) => b,
                    Err(_) => {
                        closed = true;
                        break;
                    }
                },
                None => match rx.try_recv() {
                    Ok(b) => b,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        closed = true;
                        break;
                    }
                },
            };
            let s = slots.insert(WSlot { buf, pending: 0 });
            queue_block(w, &mut ring, &mut slots, &mut segs, &mut ops, s);
        }
        if closed && ops.live == 0 && slots.live == 0 {
            break;
        }
        let block =
            ops.live > 0 && (closed || rx.is_empty() || ops.live + 2 * MAX_SEGMENTS > MAX_INFLIGHT);
        if let Err(e) = ring.submit(block as usize) {
            tracing::warn!("io_uring submit: {e}");
            w.check(Err(crate::data::sinkfiles::WriteError::Fatal(format!(
                "io_uring: {e}"
            ))));
            while ops.live > 0 && ring.submit(1).is_ok() {
                cqes.clear();
                ring.reap(&mut cqes);
                for &(ud, res) in &cqes {
                    write_done(w, &mut slots, &mut segs, &mut ops, ud as usize, res);
                }
            }
            break;
        }
        cqes.clear();
        ring.reap(&mut cqes);
        for &(ud, res) in &cqes {
            write_done(w, &mut slots, &mut segs, &mut ops, ud as usize, res);
        }
    }
    // Drain (after an error): free what is left.
    for i in 0..slots.items.len() {
        if slots.items[i].is_some() {
            let s = slots.remove(i);
            w.release(s.buf);
        }
    }
    while let Ok(b) = rx.recv() {
        w.release(b);
    }
    true
}

/// Sync fallback for one block (ring creation failed after a recv).
fn write_sync(w: &WriterIo<'_>, buf: Buf) {
    let mut p = 0usize;
    for (i, s) in buf.segs.iter().enumerate() {
        let end = p + s.payload_len();
        let h = buf.hashes.get(i).copied().unwrap_or(0);
        if !w.check(w.table.write_segment(s, &buf.data()[p..end], h)) {
            break;
        }
        p = end;
    }
    w.release(buf);
}

/// Queue the writes of block `s`; holes and skipped segments are
/// accounted at once.
fn queue_block(
    w: &WriterIo<'_>,
    ring: &mut Ring,
    slots: &mut Slab<WSlot>,
    segs: &mut Slab<SegWrite>,
    ops: &mut Slab<WriteOp>,
    s: usize,
) {
    let table = w.table;
    let mut p = 0usize;
    let nseg = slots.get_mut(s).buf.segs.len();
    let aborted = w.abort.load(Ordering::Relaxed);
    // Guard counts (slot and segment) keep both alive while queueing, even
    // if a write completes (fails) synchronously below.
    slots.get_mut(s).pending += 1;
    for i in 0..nseg {
        if aborted {
            break;
        }
        let (seg, hash, base) = {
            let b = &slots.get_mut(s).buf;
            (
                b.segs[i],
                b.hashes.get(i).copied().unwrap_or(0),
                b.data().as_ptr() as usize,
            )
        };
        let start = p;
        p += seg.payload_len();
        let (f, fd) = match table.prepare(&seg) {
            Ok(Some((f, Some(fd)))) => (f, fd),
            Ok(Some((f, None))) => {
                if !w.check(table.account(f, &seg, hash)) {
                    break;
                }
                continue;
            }
            Ok(None) => continue,
            Err(e) => {
                w.check(Err(e));
                break;
            }
        };
        if seg.is_hole() {
            if !w.check(table.account(f, &seg, hash)) {
                break;
            }
            continue;
        }
        let len = seg.payload_len();
        if let Err(e) = table
            .storage
            .hook
            .check(IoOp::Write, &f.rel, seg.offset, len)
        {
            if !w.check(table.write_failed(f, e)) {
                break;
            }
            continue;
        }
        let addr = base + start;
        let pre = if fd.direct.is_some() {
            direct_prefix(addr, seg.offset, len)
        } else {
            0
        };
        let parts: [(usize, usize, bool); 2] = [(0, pre, true), (pre, len - pre, false)];
        let sw = segs.insert(SegWrite {
            slot: s,
            seg,
            hash,
            fd: fd.clone(),
            pending: 1,
            error: None,
        });
        slots.get_mut(s).pending += 1;
        for (o, l, direct) in parts {
            if l == 0 {
                continue;
            }
            let rawfd = if direct {
                fd.direct.as_ref().unwrap().as_raw_fd()
            } else {
                fd.buffered.as_raw_fd()
            };
            let op = ops.insert(WriteOp {
                segw: sw,
                p: addr + o,
                len: l,
                off: seg.offset + o as u64,
                direct,
            });
            segs.get_mut(sw).pending += 1;
            if !ring.write(
                rawfd,
                (addr + o) as *const u8,
                l,
                seg.offset + o as u64,
                op as u64,
            ) {
                write_done(w, slots, segs, ops, op, -libc::EIO);
            }
        }
        seg_step(w, slots, segs, sw);
    }
    slot_step(w, slots, s);
}

/// One of a segment's writes (or its queueing guard) is done.
fn seg_step(w: &WriterIo<'_>, slots: &mut Slab<WSlot>, segs: &mut Slab<SegWrite>, sw: usize) {
    let rec = segs.get_mut(sw);
    rec.pending -= 1;
    if rec.pending > 0 {
        return;
    }
    let rec = segs.remove(sw);
    if let Some(f) = w.table.get(rec.seg.file_id) {
        let r = match rec.error {
            Some(e) => w.table.write_failed(f, e),
            None => w.table.account(f, &rec.seg, rec.hash),
        };
        w.check(r);
    }
    drop(rec.fd);
    slot_step(w, slots, rec.slot);
}

/// One of a block's segments (or its queueing guard) is done.
fn slot_step(w: &WriterIo<'_>, slots: &mut Slab<WSlot>, s: usize) {
    let slot = slots.get_mut(s);
    slot.pending -= 1;
    if slot.pending == 0 {
        let sl = slots.remove(s);
        w.release(sl.buf);
    }
}

fn write_done(
    w: &WriterIo<'_>,
    slots: &mut Slab<WSlot>,
    segs: &mut Slab<SegWrite>,
    ops: &mut Slab<WriteOp>,
    op: usize,
    res: i32,
) {
    let o = ops.remove(op);
    let sw = segs.get_mut(o.segw);
    // Short writes and refused O_DIRECT finish synchronously (buffered).
    let r = if res < 0 {
        let e = io::Error::from_raw_os_error(-res);
        if o.direct && is_direct_refusal(&e) {
            super::log_direct_fallback("sink write", &e);
            // SAFETY: the block is alive until its slot is released below.
            let data = unsafe { std::slice::from_raw_parts(o.p as *const u8, o.len) };
            pwrite_all_fd(sw.fd.buffered.as_raw_fd(), data, o.off)
        } else {
            Err(e)
        }
    } else if (res as usize) < o.len {
        let n = res as usize;
        // SAFETY: as above.
        let data = unsafe { std::slice::from_raw_parts((o.p + n) as *const u8, o.len - n) };
        pwrite_all_fd(sw.fd.buffered.as_raw_fd(), data, o.off + n as u64)
    } else {
        Ok(())
    };
    if let Err(e) = r {
        sw.error.get_or_insert(e);
    }
    seg_step(w, slots, segs, o.segw);
}
