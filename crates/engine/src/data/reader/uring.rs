//! The io_uring reader loop (Algorithm 2 of seed 000 sec. 6.2.2; the
//! ring itself and the engine choice: crate::storage::uring).

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use ramsys_proto::data::{marker_hash, segment_hash, Segment, MAX_HOLE, MAX_SEGMENTS};
use ramsys_resources::Buf;

use super::{ReaderCtx, SrcOpen};
use crate::data::queue::ReadUnit;
use crate::storage::direct::{round_down, round_up, ALIGN};
use crate::storage::fsops::pread_full;
use crate::storage::local::joins_copy_block;
use crate::storage::sparse::Piece;
use crate::storage::uring::{Ring, Slab, FIXED_MIN_BYTES, MAX_INFLIGHT, RING_ENTRIES};
use crate::storage::{is_direct_refusal, IoOp};

/// A buffer being filled or in flight.
struct Slot {
    buf: Buf,
    /// Reads not yet completed.
    pending: usize,
    /// No more segments will be added.
    sealed: bool,
}

/// Which block a piece fills. Large files' whole pages go to blocks of
/// their own, where every segment starts page-aligned in the payload, so
/// the sink can write them with O_DIRECT from its receive buffer (its
/// direct lane, docs/STORAGE.md); small files and the large files' last
/// partial pages are packed together (seed 000 sec. 6.1.4). Both are open
/// at once, so neither costs the other a half-empty block.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fill {
    Packed = 0,
    Aligned = 1,
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
    /// Slots being filled, by [`Fill`].
    cur: [Option<usize>; 2],
    /// fill() stopped for want of a buffer.
    starved: bool,
    /// The pool has at least two buffers per reader, so a reader may wait
    /// for one while it holds a partly filled block (with fewer, every
    /// reader could hold one and wait for the others).
    may_hold: bool,
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
pub(super) fn run_reader_uring(ctx: &ReaderCtx, home: usize) -> bool {
    if ctx.storage.null {
        return false; // nothing to read: the sync loop is already optimal
    }
    let first = ctx.pool.get();
    let big = ctx.stats.total_bytes.load(Ordering::Relaxed) >= FIXED_MIN_BYTES;
    let ring = match Ring::new(ctx.pool.span(), big) {
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
        cur: [None; 2],
        starved: false,
        may_hold: ctx.pool.count() >= 2 * readers,
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
        self.slots.live - self.cur.iter().flatten().count()
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
                && (self.starved || self.cur == [None; 2])
                && self.slots.live < self.total
            {
                let want = self.batch.min(self.total - self.slots.live);
                let wait = self.ops.live == 0 && (self.may_hold || self.cur == [None; 2]);
                self.ctx.pool.get_many(&mut self.active, want, wait);
                self.starved &= self.active.is_empty();
            }
            // A buffer wanted, none to be had and nothing of ours in flight
            // (all our buffers in our open blocks, or the pool too small for
            // every reader to hold one while it waits): ship the partly
            // filled block(s) rather than wait for ourselves.
            if self.starved
                && self.active.is_empty()
                && self.ops.live == 0
                && (self.slots.live >= self.total || !self.may_hold)
            {
                self.seal_all();
            }
            // Lines 9-13: plan and queue reads while buffers and SQ room last.
            self.fill();
            if !self.work_left() {
                self.seal_all();
            }
            if self.ops.live == 0 && !self.work_left() && self.slots.live == 0 {
                break;
            }
            // Lines 14-19: block for completions when this stage is the
            // bottleneck (every buffer posted, or nothing more to plan, or
            // the SQ is full); otherwise just poll.
            let stuck = self.active.is_empty() && (self.starved || self.ring.sq_room() == 0);
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

    /// The slot being filled for `fill`, taking a fresh buffer if needed.
    fn cur_slot(&mut self, fill: Fill) -> Option<usize> {
        let c = &mut self.cur[fill as usize];
        if c.is_none() {
            let Some(buf) = self.active.pop() else {
                self.starved = true;
                return None;
            };
            *c = Some(self.slots.insert(Slot {
                buf,
                pending: 0,
                sealed: false,
            }));
        }
        *c
    }

    /// Seal both slots being filled.
    fn seal_all(&mut self) {
        for c in self.cur.into_iter().flatten() {
            self.seal(c);
        }
    }

    fn seal(&mut self, s: usize) {
        for c in &mut self.cur {
            if *c == Some(s) {
                *c = None;
            }
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

    /// Queue reads until the ring or the in-flight bound is full; the
    /// per-block path of one reader thread, nothing allocated or looked up
    /// per block.
    fn fill(&mut self) {
        while !self.gone && self.ring.sq_room() > 0 && self.ops.live < MAX_INFLIGHT {
            let Some((u, piece)) = self.next_piece() else {
                return;
            };
            let idx = self.units.get_mut(u).unit.file as usize;
            // A large file's whole pages go to the aligned block, its
            // last partial page (queued right behind) to the packed one.
            let (piece, fill) = match piece {
                Piece::Data { off, len } if self.ctx.aligns(idx, off, len) => {
                    let body = round_down(len as usize) as u64;
                    if body < len {
                        self.push_front(Piece::Data {
                            off: off + body,
                            len: len - body,
                        });
                    }
                    (Piece::Data { off, len: body }, Fill::Aligned)
                }
                p => (p, Fill::Packed),
            };
            let Some(s) = self.cur_slot(fill) else {
                self.push_front(piece);
                return;
            };
            match piece {
                Piece::Hole { off, len } => self.queue_marker(s, idx, false, off, len),
                Piece::Copy { off, len } => self.queue_marker(s, idx, true, off, len),
                Piece::Data { off, len } => self.queue_read(u, s, fill, idx, off, len),
            }
        }
    }

    /// A hole (or, `copy`, a local-copy range) of file `idx` as a segment
    /// without payload in slot `s`, at most MAX_HOLE of it; the rest goes
    /// back to the front of the queue.
    fn queue_marker(&mut self, s: usize, idx: usize, copy: bool, off: u64, len: u64) {
        let piece = |off, len| {
            if copy {
                Piece::Copy { off, len }
            } else {
                Piece::Hole { off, len }
            }
        };
        let id = self.ctx.files[idx].id;
        let slot = self.slots.get_mut(s);
        let full = slot.buf.segs.len() == MAX_SEGMENTS;
        if full || (copy && !joins_copy_block(&slot.buf.segs, id)) {
            self.push_front(piece(off, len));
            self.seal(s);
            return;
        }
        let n = len.min(MAX_HOLE as u64);
        let seg = if copy {
            Segment::copy(id, off, n as u32)
        } else {
            Segment::hole(id, off, n as u32)
        };
        slot.buf.segs.push(seg);
        if self.ctx.checksum {
            let h = marker_hash(&seg);
            slot.buf.hashes.push(h);
            slot.buf.checksum = slot.buf.checksum.wrapping_add(h);
            self.ctx.state[idx].digest.fetch_add(h, Ordering::AcqRel);
        }
        self.ctx.stats.add_bytes(n);
        if n < len {
            self.push_front(piece(off + n, len - n));
        }
    }

    /// A read of file `idx` (unit `u`) at `off` into slot `s`: as much of
    /// `len` as the block has room for; the rest goes back to the front of
    /// the queue. A full slot, or one a direct read cannot start in, is
    /// sealed first.
    fn queue_read(&mut self, u: usize, s: usize, fill: Fill, idx: usize, off: u64, len: u64) {
        if self.ctx.is_failed(idx) {
            return; // drop the rest of a failed file
        }
        let bs = self.ctx.block_size;
        let open = self.units.get_mut(u).open.clone();
        let slot = self.slots.get_mut(s);
        let start = slot.buf.len;
        let room = bs - start;
        if room == 0 || slot.buf.segs.len() == MAX_SEGMENTS {
            self.push_front(Piece::Data { off, len });
            self.seal(s);
            return;
        }
        // Only whole pages are read with O_DIRECT: a direct read of a
        // partial page would fill the rest of its page and end the block.
        let direct = open.direct.is_some() && fill == Fill::Aligned;
        if direct && !start.is_multiple_of(ALIGN) {
            self.push_front(Piece::Data { off, len });
            self.seal(s);
            return;
        }
        let want = room.min(len as usize);
        let f = &self.ctx.files[idx];
        if let Err(e) = self.ctx.storage.hook.check(IoOp::Read, &f.rel, off, want) {
            self.ctx
                .fail(idx, format!("read error at offset {off}: {e}"));
            return;
        }
        // A mapped file: a zero-copy piece, no read.
        if !direct && self.ctx.push_mapped(&mut slot.buf, &open, off, want) {
            let full = slot.buf.len == bs || slot.buf.segs.len() == MAX_SEGMENTS;
            if (want as u64) < len {
                self.push_front(Piece::Data {
                    off: off + want as u64,
                    len: len - want as u64,
                });
            }
            if full {
                self.seal(s);
            }
            return;
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
        if !self.ring.read(fd, (p, io_len), off, direct, op as u64) {
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
            self.ctx.unit_done(&rec.unit, Some(&*rec.open.file));
        }
    }
}
