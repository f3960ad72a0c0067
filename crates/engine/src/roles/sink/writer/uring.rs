//! The io_uring writer loop (seed 000 sec. 6.2.2; the ring itself and the
//! engine choice: crate::storage::uring).

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam_channel::{Receiver, TryRecvError};
use ramsys_proto::data::Segment;
use ramsys_resources::Buf;

use super::WriterIo;
use crate::roles::sink::files::{FileRef, SinkFd};
use crate::storage::cache::{pwrite_cached, DiskReads, LANE_CONTENDED};
use crate::storage::direct::direct_prefix;
use crate::storage::uring::{Ring, Slab, FIXED_MIN_BYTES, MAX_INFLIGHT, RING_ENTRIES};
use crate::storage::{is_direct_refusal, IoOp};

/// Most write SQEs block `b` can need: a direct prefix and a buffered tail
/// per segment, plus the pieces its buffered bytes are cut into.
fn block_ops(b: &Buf) -> usize {
    2 * b.segs.len() + b.data().len() / crate::storage::cache::write_piece() + 1
}

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

/// The writer's in-flight state.
struct Queues {
    slots: Slab<WSlot>,
    segs: Slab<SegWrite>,
    ops: Slab<WriteOp>,
    /// O_DIRECT bytes in flight: the direct lane's fill
    /// (WriterIo::lane).
    lane: usize,
    /// Reads on the destination's disk: while it serves them the lane
    /// narrows to cache::LANE_CONTENDED.
    disk: Option<DiskReads>,
}

impl Queues {
    /// The lane's width for the next block.
    fn lane_width(&mut self, lane: usize) -> usize {
        let now = std::time::Instant::now();
        let busy = lane > LANE_CONTENDED && self.disk.as_mut().is_some_and(|d| d.busy(now));
        if busy {
            LANE_CONTENDED
        } else {
            lane
        }
    }
}

/// Writer body for the io_uring engine; false if no ring could be made.
pub(super) fn run_writer_uring(w: &WriterIo<'_>, rx: &Receiver<Buf>) -> bool {
    // Make the ring (and register the session's buffers) before data
    // flows, so its set-up cost is not paid on the first block.
    let mut bytes = 0u64;
    w.table.for_each_file(|f| bytes += f.size);
    let big = bytes >= FIXED_MIN_BYTES;
    let mut ring = match Ring::new(w.pool.span(), big) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("io_uring ring: {e}; writer uses the sync engine");
            return false;
        }
    };
    let mut q = Queues {
        slots: Slab::new(),
        segs: Slab::new(),
        ops: Slab::new(),
        lane: 0,
        disk: DiskReads::for_dir(std::path::Path::new("/sys"), w.table.root.path()),
    };
    let mut cqes = Vec::with_capacity(RING_ENTRIES as usize);
    let mut closed = false;
    // A block taken from the channel that did not fit yet.
    let mut held: Option<Buf> = None;
    loop {
        // Take every block that is ready; block on the channel only when
        // no write is in flight (the receivers are the bottleneck).
        loop {
            let buf = match held.take() {
                Some(b) => b,
                None if closed => break,
                None => {
                    let got = if q.ops.live == 0 {
                        w.next(rx).map_err(|_| TryRecvError::Disconnected)
                    } else if !w.admitted() {
                        // Over the site share: finish what is in flight, then park.
                        break;
                    } else {
                        rx.try_recv()
                    };
                    match got {
                        Ok(b) => b,
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => {
                            closed = true;
                            break;
                        }
                    }
                }
            };
            // Room for this block's own writes in the completion queue. The
            // worst case of any block exceeds the bound by itself, so
            // checking that let one block be in flight at a time and O_DIRECT
            // writes ran one deep, at the disk's latency (docs/STORAGE.md
            // "Direct lane").
            if q.ops.live > 0 && q.ops.live + block_ops(&buf) > MAX_INFLIGHT {
                held = Some(buf);
                break;
            }
            let s = q.slots.insert(WSlot { buf, pending: 0 });
            queue_block(w, &mut ring, &mut q, s);
        }
        if closed && held.is_none() && q.ops.live == 0 && q.slots.live == 0 {
            break;
        }
        let block = q.ops.live > 0 && (closed || held.is_some() || rx.is_empty());
        if let Err(e) = ring.submit(block as usize) {
            tracing::warn!("io_uring submit: {e}");
            w.check(Err(crate::roles::sink::files::WriteError::Fatal(format!(
                "io_uring: {e}"
            ))));
            while q.ops.live > 0 && ring.submit(1).is_ok() {
                cqes.clear();
                ring.reap(&mut cqes);
                for &(ud, res) in &cqes {
                    write_done(w, &mut q, ud as usize, res);
                }
            }
            break;
        }
        cqes.clear();
        ring.reap(&mut cqes);
        for &(ud, res) in &cqes {
            write_done(w, &mut q, ud as usize, res);
        }
    }
    // Drain (after an error): free what is left.
    if let Some(b) = held {
        w.release(b);
    }
    for i in 0..q.slots.items.len() {
        if q.slots.items[i].is_some() {
            let s = q.slots.remove(i);
            w.release(s.buf);
        }
    }
    while let Ok(b) = rx.recv() {
        w.release(b);
    }
    true
}

/// Queue the writes of block `s`; holes and skipped segments are
/// accounted at once.
fn queue_block(w: &WriterIo<'_>, ring: &mut Ring, q: &mut Queues, s: usize) {
    let lane = q.lane_width(w.lane);
    let mut p = 0usize;
    let nseg = q.slots.get_mut(s).buf.segs.len();
    let aborted = w.abort.load(Ordering::Relaxed);
    // Guard counts (slot and segment) keep both alive while queueing, even
    // if a write completes (fails) synchronously below.
    q.slots.get_mut(s).pending += 1;
    for i in 0..nseg {
        if aborted {
            break;
        }
        let (seg, hash, base) = {
            let b = &q.slots.get_mut(s).buf;
            (
                b.segs[i],
                b.hashes.get(i).copied().unwrap_or(0),
                b.data().as_ptr() as usize,
            )
        };
        let start = p;
        p += seg.payload_len();
        let (f, fd) = match open_seg(w, &seg, hash) {
            SegOpen::Write(f, fd) => (f, fd),
            SegOpen::Done => continue,
            SegOpen::Stop => break,
        };
        let at = SegAt {
            slot: s,
            seg,
            hash,
            addr: base + start,
        };
        queue_seg(w, ring, q, at, (&f, &fd), lane);
    }
    slot_step(w, &mut q.slots, s);
}

/// What becomes of one segment before any write is queued.
enum SegOpen {
    /// Its bytes go to this file's descriptors, through the ring.
    Write(FileRef, Arc<SinkFd>),
    /// Nothing to queue: skipped, accounted, or failed its file only.
    Done,
    /// The writer stops (an error that ends the session).
    Stop,
}

/// Segment `seg`'s file made ready (files::open); a segment with nothing
/// to write, a local copy, a hole (both done synchronously) or a write
/// the fault hook refuses is accounted here.
#[inline]
fn open_seg(w: &WriterIo<'_>, seg: &Segment, hash: u64) -> SegOpen {
    let table = w.table;
    let go_on = |ok: bool| if ok { SegOpen::Done } else { SegOpen::Stop };
    let (f, fd) = match table.prepare(seg) {
        Ok(Some((f, Some(fd)))) => (f, fd),
        Ok(Some((f, None))) => return go_on(w.check(table.account(&f, seg, hash))),
        Ok(None) => return SegOpen::Done,
        Err(e) => {
            w.check(Err(e));
            return SegOpen::Stop;
        }
    };
    // A local copy (in the kernel) or a hole: done synchronously.
    if let Some(r) = table.write_marker(&f, &fd, seg, hash) {
        return go_on(w.check(r));
    }
    let len = seg.payload_len();
    if let Err(e) = table
        .storage
        .hook
        .check(IoOp::Write, table.rel(&f), seg.offset, len)
    {
        return go_on(w.check(table.write_failed(&f, e)));
    }
    SegOpen::Write(f, fd)
}

/// Where one segment's writes come from: its block's slot, the segment,
/// its digest, and the address of its payload in the block's buffer.
#[derive(Clone, Copy)]
struct SegAt {
    slot: usize,
    seg: Segment,
    hash: u64,
    addr: usize,
}

/// Queue segment `at`'s writes on the ring: the direct prefix in one
/// write while the direct lane (`lane` wide) has room, the buffered rest
/// in pieces (cache::write_piece: smaller page-cache folios fill faster).
#[inline]
fn queue_seg(
    w: &WriterIo<'_>,
    ring: &mut Ring,
    q: &mut Queues,
    at: SegAt,
    (f, fd): (&FileRef, &Arc<SinkFd>),
    lane: usize,
) {
    let table = w.table;
    let SegAt {
        slot: s,
        seg,
        hash,
        addr,
    } = at;
    let len = seg.payload_len();
    // A lane file goes direct only while the lane has room.
    let pre = match &fd.direct {
        Some(_) if !fd.lane || q.lane < lane => direct_prefix(addr, seg.offset, len),
        _ => 0,
    };
    if fd.lane {
        table.storage.count(f.size, pre as u64, true);
        table.storage.count(f.size, (len - pre) as u64, false);
    }
    let piece = crate::storage::cache::write_piece();
    let direct_part = std::iter::once((0, pre, true));
    let cached_parts = (pre..len)
        .step_by(piece)
        .map(|o| (o, piece.min(len - o), false));
    let parts = direct_part.chain(cached_parts);
    let sw = q.segs.insert(SegWrite {
        slot: s,
        seg,
        hash,
        fd: fd.clone(),
        pending: 1,
        error: None,
    });
    q.slots.get_mut(s).pending += 1;
    for (o, l, direct) in parts {
        if l == 0 {
            continue;
        }
        let rawfd = if direct {
            fd.direct.as_ref().unwrap().as_raw_fd()
        } else {
            fd.buffered.as_raw_fd()
        };
        let op = q.ops.insert(WriteOp {
            segw: sw,
            p: addr + o,
            len: l,
            off: seg.offset + o as u64,
            direct,
        });
        q.segs.get_mut(sw).pending += 1;
        if direct {
            q.lane += l;
        }
        let io = ((addr + o) as *const u8, l);
        if !ring.write(rawfd, io, seg.offset + o as u64, direct, op as u64) {
            write_done(w, q, op, -libc::EIO);
        }
    }
    seg_step(w, &mut q.slots, &mut q.segs, sw);
}

/// One of a segment's writes (or its queueing guard) is done.
fn seg_step(w: &WriterIo<'_>, slots: &mut Slab<WSlot>, segs: &mut Slab<SegWrite>, sw: usize) {
    let rec = segs.get_mut(sw);
    rec.pending -= 1;
    if rec.pending > 0 {
        return;
    }
    let rec = segs.remove(sw);
    if let Some(f) = &w.table.get(rec.seg.file_id) {
        let r = match rec.error {
            Some(e) => w.table.write_failed(f, e),
            None => {
                rec.fd.written(rec.seg.offset, rec.seg.payload_len());
                w.table.account(f, &rec.seg, rec.hash)
            }
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

fn write_done(w: &WriterIo<'_>, q: &mut Queues, op: usize, res: i32) {
    let o = q.ops.remove(op);
    if o.direct {
        q.lane -= o.len;
    }
    let sw = q.segs.get_mut(o.segw);
    // Short writes and refused O_DIRECT finish synchronously (buffered).
    let r = if res < 0 {
        let e = io::Error::from_raw_os_error(-res);
        if o.direct && is_direct_refusal(&e) {
            crate::storage::log_direct_fallback("sink write", &e);
            // SAFETY: the block is alive until its slot is released below.
            let data = unsafe { std::slice::from_raw_parts(o.p as *const u8, o.len) };
            pwrite_cached(sw.fd.buffered.as_raw_fd(), data, o.off)
        } else {
            Err(e)
        }
    } else if (res as usize) < o.len {
        let n = res as usize;
        // SAFETY: as above.
        let data = unsafe { std::slice::from_raw_parts((o.p + n) as *const u8, o.len - n) };
        pwrite_cached(sw.fd.buffered.as_raw_fd(), data, o.off + n as u64)
    } else {
        Ok(())
    };
    if let Err(e) = r {
        sw.error.get_or_insert(e);
    }
    seg_step(w, &mut q.slots, &mut q.segs, o.segw);
}
