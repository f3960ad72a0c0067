//! Readers: fill buffers from files (the "load" stage).
//!
//! A reader takes read units from its device's queue (request::tasks),
//! maps each unit into data and holes (storage::sparse), and packs the
//! pieces into blocks: small files share a block, a large file spans many
//! (seed 000 sec. 6.1.4). Files of at least storage::DIRECT_MIN bytes are
//! read with O_DIRECT into page-aligned buffer offsets (a large file's
//! first read starts a fresh block if the current one holds packed small
//! files at an unaligned length). Two engines share this file's helpers:
//! the synchronous loop below and the io_uring loop (storage::uring).

// The io_uring loop (Algorithm 2): a private part of the reader.
mod uring;

use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_channel::Sender;
use ramsys_proto::data::{marker_hash, segment_hash, Segment, MAX_HOLE, MAX_SEGMENTS};
use ramsys_resources::{Buf, BufferPool, FileRange, MAX_FILE_RANGES};

use crate::data::queue::{DeviceQueue, ReadUnit};
use crate::storage::cache::{read_direct, resident_fraction, DirectMode};
use crate::storage::direct::{is_aligned, pread_direct, round_down, round_up, ALIGN};
use crate::storage::dirs::ReadDirs;
use crate::storage::fsops::{pread_full, Root};
use crate::storage::local::{joins_copy_block, LOCAL_COPY_MIN};
use crate::storage::sparse::{map_range, Piece};
use crate::storage::volume::{max_runs, zero_runs, ZERO_GRAIN};
use crate::storage::zerocopy::{populate_works, FileMap, ZEROCOPY_MIN};
use crate::storage::{is_direct_refusal, policy_min, IoEngine, IoOp, StorageCfg, DIRECT_MIN};
use crate::types::file::SourceFile;
use crate::types::stats::Stats;

/// Progress of one source file across readers: 16 bytes a file (issue 36).
#[derive(Debug)]
pub struct SrcFileState {
    /// Bytes still to read; the reader that takes it to zero reports it.
    pub remaining: AtomicU64,
    /// Sum of segment hashes read so far.
    pub digest: AtomicU64,
}

/// Every file's [`SrcFileState`], and which files failed as a bitset (a
/// bool beside the two counters padded each state to 24 bytes).
#[derive(Debug)]
pub struct FileStates {
    each: Vec<SrcFileState>,
    failed: Vec<AtomicU64>,
}

impl FileStates {
    pub fn new(each: Vec<SrcFileState>) -> FileStates {
        let failed = (0..each.len().div_ceil(64))
            .map(|_| AtomicU64::new(0))
            .collect();
        FileStates { each, failed }
    }

    /// Mark file `i` failed; true the first time only.
    pub fn set_failed(&self, i: usize) -> bool {
        let bit = 1u64 << (i % 64);
        self.failed[i / 64].fetch_or(bit, Ordering::AcqRel) & bit == 0
    }

    pub fn is_failed(&self, i: usize) -> bool {
        self.failed[i / 64].load(Ordering::Acquire) & (1u64 << (i % 64)) != 0
    }
}

impl std::ops::Index<usize> for FileStates {
    type Output = SrcFileState;
    fn index(&self, i: usize) -> &SrcFileState {
        &self.each[i]
    }
}

/// What readers tell the source controller.
#[derive(Debug)]
pub enum ReaderEvent {
    FileDone {
        id: u64,
        digest: u64,
    },
    FileFailed {
        id: u64,
        path: String,
        reason: String,
    },
}

/// Everything a reader needs, shared by all readers of a session.
pub struct ReaderCtx {
    pub root: Arc<Root>,
    pub files: Arc<Vec<SourceFile>>,
    pub state: Arc<FileStates>,
    pub queues: Arc<Vec<DeviceQueue>>,
    pub pool: Arc<BufferPool>,
    pub filled: Sender<Buf>,
    /// Inline send path (crate::data::inline): readers send blocks
    /// themselves and `filled` stays unused.
    pub inline: Option<Arc<crate::data::inline::InlineLinks>>,
    pub events: Sender<ReaderEvent>,
    pub checksum: bool,
    pub abort: Arc<AtomicBool>,
    pub stats: Arc<Stats>,
    /// Payload bytes per block (≤ buffer capacity).
    pub block_size: usize,
    /// Direct I/O, engine, null source, fault hook.
    pub storage: Arc<StorageCfg>,
    /// Home queue of each reader, by reader index (tasks::assign_homes);
    /// empty = reader i serves queue i % queues.
    pub homes: Vec<Option<usize>>,
    /// Blocks of large files read buffered go zero-copy: hashed through
    /// a mapping, sent from the page cache (storage::zerocopy). Decided
    /// once per session from its links and options.
    pub zerocopy: bool,
    /// Each file's directory, opened once (storage::dirs::ReadDirs).
    pub dirs: Arc<ReadDirs>,
}

/// A source file opened for reading.
pub struct SrcOpen {
    pub idx: u32,
    /// Buffered descriptor (unaligned pieces, metadata, holes); shared
    /// with the zero-copy blocks that send from it.
    pub file: Arc<File>,
    /// O_DIRECT descriptor for large files where the file system takes it.
    pub direct: Option<File>,
    /// Fewer blocks than bytes: map holes before reading.
    pub sparse: bool,
    /// A large file read buffered on a zero-copy session: its mapping,
    /// through which blocks are hashed without a copy.
    pub map: Option<FileMap>,
}

impl ReaderCtx {
    /// Next unit: from the home queue, else stolen from a flash or memory
    /// queue (never from a rotational one).
    pub fn next_unit(&self, home: usize) -> Option<ReadUnit> {
        let n = self.queues.len();
        if n == 0 {
            return None;
        }
        if let Some(u) = self.queues[home % n].pop() {
            return Some(u);
        }
        (1..n)
            .map(|k| &self.queues[(home + k) % n])
            .filter(|q| q.stealable())
            .find_map(|q| q.pop())
    }

    /// Home queue of reader `i`, None if it has no device to serve.
    pub fn home_of(&self, i: usize) -> Option<usize> {
        if self.homes.is_empty() {
            return Some(i % self.queues.len().max(1));
        }
        self.homes.get(i).copied().flatten()
    }

    pub fn fail(&self, idx: usize, reason: String) {
        if self.state.set_failed(idx) {
            let f = &self.files[idx];
            let _ = self.events.send(ReaderEvent::FileFailed {
                id: f.id,
                path: crate::types::error::show(&f.rel),
                reason,
            });
        }
    }

    pub fn is_failed(&self, idx: usize) -> bool {
        self.state.is_failed(idx)
    }

    /// Does a data piece of file `idx` at `off` go (its whole pages) to
    /// an aligned block? Files the sink may write with O_DIRECT
    /// (storage::policy_min and up), read from a page boundary, at least
    /// one page long. Both engines keep such pages page-aligned in their
    /// blocks; packed behind another file's tail they could only go
    /// through the sink's page cache.
    pub fn aligns(&self, idx: usize, off: u64, len: u64) -> bool {
        let f = &self.files[idx];
        f.size >= policy_min() && !f.volume && is_aligned(off) && len >= ALIGN as u64
    }

    /// Open file `idx` for reading (never through a final symlink),
    /// relative to its directory; a volume by its path.
    fn open_file(&self, idx: u32, direct: bool) -> std::io::Result<File> {
        let f = &self.files[idx as usize];
        if f.volume {
            return self.root.open_read(&f.rel, direct);
        }
        let fl = crate::storage::fsops::read_flags(direct);
        Ok(File::from(self.dirs.open(
            &self.root,
            idx as usize,
            &f.rel,
            fl,
        )?))
    }

    /// Open file `idx` (None for the null source, which reads nothing).
    pub fn open(&self, idx: u32) -> Result<Option<SrcOpen>, String> {
        if self.storage.null {
            return Ok(None);
        }
        let f = &self.files[idx as usize];
        let file = self
            .open_file(idx, false)
            .map_err(|e| format!("cannot open: {e}"))?;
        // Sparse or not comes from the scan's stat: no fstat per open
        // (unit_done still checks size and mtime once the file is read).
        let sparse = f.sparse;
        let mut direct = None;
        // Large files past the page cache, unless it holds most of them
        // (storage::cache: reading cached pages from the disk again is
        // what made warm bulk copies slow).
        // Local copies of large files are not read here at all.
        // A volume is read here: its zero runs become holes (a copy in the
        // kernel would write every byte).
        let copied = self.storage.local.is_some() && f.size >= LOCAL_COPY_MIN && !f.volume;
        let cached = (self.storage.direct
            && !copied
            && self.storage.direct_mode == DirectMode::Auto
            && f.size >= DIRECT_MIN)
            .then(|| resident_fraction(&file, f.size))
            .flatten();
        let mode = if self.storage.direct {
            self.storage.direct_mode
        } else {
            DirectMode::Never
        };
        if !copied
            && read_direct(mode, f.size, DIRECT_MIN, cached)
            && !self.storage.refusals.refused(f.dev)
        {
            let r = self
                .storage
                .hook
                .check(IoOp::OpenDirect, &f.rel, 0, 0)
                .and_then(|_| self.open_file(idx, true));
            match r {
                Ok(d) => direct = Some(d),
                Err(e) if is_direct_refusal(&e) => {
                    self.storage.refusals.refuse(f.dev, "source", &e)
                }
                Err(e) => return Err(format!("cannot open: {e}")),
            }
        }
        // Zero-copy where the pages come from the page cache anyway (not
        // O_DIRECT), for files large enough that a mapping costs less
        // than the copy it saves (a volume's zero runs and local copies
        // are made from the data).
        let map = (self.zerocopy
            && direct.is_none()
            && !copied
            && !f.volume
            && f.size >= ZEROCOPY_MIN
            && populate_works())
        .then(|| FileMap::new(&file, f.size).ok())
        .flatten();
        Ok(Some(SrcOpen {
            idx,
            file: Arc::new(file),
            direct,
            sparse,
            map,
        }))
    }

    /// Data and holes of unit `u` (one data piece unless the file is
    /// sparse).
    pub fn pieces(
        &self,
        open: Option<&SrcOpen>,
        u: &ReadUnit,
        out: &mut Vec<Piece>,
    ) -> Result<(), String> {
        out.clear();
        let size = self.files[u.file as usize].size;
        // A local copy: the sink copies large files' data itself.
        let copy = self.storage.local.is_some()
            && open.is_some()
            && size >= LOCAL_COPY_MIN
            && !self.files[u.file as usize].volume;
        if let Some(o) = open.filter(|_| !copy) {
            self.storage.count(size, u.len(), o.direct.is_some());
        }
        match open {
            Some(o) if o.sparse => map_range(&o.file, u.offset, u.offset + u.len(), out)
                .map_err(|e| format!("cannot map holes at offset {}: {e}", u.offset)),
            _ => {
                out.push(Piece::Data {
                    off: u.offset,
                    len: u.len(),
                });
                Ok(())
            }
        }?;
        if copy {
            for p in out.iter_mut() {
                if let Piece::Data { off, len } = *p {
                    *p = Piece::Copy { off, len };
                    self.storage.copied_bytes.fetch_add(len, Ordering::Relaxed);
                }
            }
        }
        Ok(())
    }

    /// Append `n` bytes of `o`'s file at `off` to `buf` (at payload
    /// offset `buf.len`, which has room for them) as a zero-copy piece:
    /// hashed through the mapping, sent from the file. False when the file
    /// has no mapping, the range is not mapped or the block holds its most
    /// pieces or segments (read it into the buffer instead).
    pub fn push_mapped(&self, buf: &mut Buf, o: &SrcOpen, off: u64, n: usize) -> bool {
        if buf.files.len() == MAX_FILE_RANGES || buf.segs.len() == MAX_SEGMENTS {
            return false;
        }
        let idx = o.idx as usize;
        let f = &self.files[idx];
        let Some(map) = o.map.as_ref() else {
            return false;
        };
        // Checksums are on (a zero-copy session needs them).
        let Some(h) = map.hash(off, n, |b| segment_hash(f.id, off, b)) else {
            return false;
        };
        self.add_hash(buf, idx, h);
        buf.segs.push(Segment {
            file_id: f.id,
            offset: off,
            len: n as u32,
        });
        let at = buf.len;
        buf.files.push(FileRange {
            file: o.file.clone(),
            off,
            at,
            len: n,
        });
        buf.len = at + n;
        self.stats.add_bytes(n as u64);
        true
    }

    /// Record one segment already in `buf` at payload offset `start`.
    pub fn push_data(&self, buf: &mut Buf, idx: usize, off: u64, start: usize, n: usize) {
        let f = &self.files[idx];
        if self.checksum {
            let h = segment_hash(f.id, off, &buf.space()[start..start + n]);
            self.add_hash(buf, idx, h);
        }
        buf.segs.push(Segment {
            file_id: f.id,
            offset: off,
            len: n as u32,
        });
        buf.len = buf.len.max(start + n);
        self.stats.add_bytes(n as u64);
    }

    /// Record `n` bytes of a volume read at payload offset `start`: zero
    /// runs become hole segments (a device has no hole map), data runs are
    /// moved down over them so the payload stays contiguous.
    pub fn push_volume_data(&self, buf: &mut Buf, idx: usize, off: u64, start: usize, n: usize) {
        let id = self.files[idx].id;
        let mut runs: [(usize, usize, bool); 64] = [(0, 0, false); 64];
        let mut k = 0;
        // At most max_runs(off, n) runs; a block larger than 64 granules
        // is recorded in several passes.
        let mut p = 0;
        while p < n {
            let chunk = (n - p).min(63 * ZERO_GRAIN);
            let base = off + p as u64;
            zero_runs(
                &buf.space()[start + p..start + p + chunk],
                base,
                |s, len, z| {
                    runs[k] = (p + s, len, z);
                    k += 1;
                },
            );
            p += chunk;
            let mut w = buf.len.max(start);
            for &(s, len, zero) in &runs[..k] {
                if zero {
                    let seg = Segment::hole(id, off + s as u64, len as u32);
                    if self.checksum {
                        self.add_hash(buf, idx, marker_hash(&seg));
                    }
                    buf.segs.push(seg);
                    self.stats.add_bytes(len as u64);
                } else {
                    if w != start + s {
                        buf.space().copy_within(start + s..start + s + len, w);
                    }
                    self.push_data(buf, idx, off + s as u64, w, len);
                    w += len;
                }
            }
            k = 0;
        }
    }

    fn add_hash(&self, buf: &mut Buf, idx: usize, h: u64) {
        buf.hashes.push(h);
        buf.checksum = buf.checksum.wrapping_add(h);
        self.state[idx].digest.fetch_add(h, Ordering::AcqRel);
    }

    /// Append hole (or, with `copy`, local-copy) segments for
    /// `[off, off+len)`; blocks that fill up are shipped. Returns false if
    /// the senders are gone.
    pub fn push_hole(
        &self,
        cur: &mut Option<Buf>,
        idx: usize,
        mut off: u64,
        len: u64,
        copy: bool,
    ) -> bool {
        let end = off + len;
        let id = self.files[idx].id;
        while off < end {
            let mut buf = cur.take().unwrap_or_else(|| self.pool.get());
            let full = buf.segs.len() == MAX_SEGMENTS;
            if full || (copy && !joins_copy_block(&buf.segs, id)) {
                if !self.ship(buf) {
                    return false;
                }
                continue;
            }
            let n = (end - off).min(MAX_HOLE as u64) as u32;
            let seg = if copy {
                Segment::copy(id, off, n)
            } else {
                Segment::hole(id, off, n)
            };
            if self.checksum {
                self.add_hash(&mut buf, idx, marker_hash(&seg));
            }
            buf.segs.push(seg);
            self.stats.add_bytes(n as u64);
            off += n as u64;
            *cur = Some(buf);
        }
        true
    }

    /// Hand a filled block to the senders, or send it from this thread
    /// on the inline path (false if the links are gone).
    pub fn ship(&self, buf: Buf) -> bool {
        if buf.segs.is_empty() {
            self.pool.put(buf);
            return true;
        }
        if let Some(links) = &self.inline {
            return links.send(buf);
        }
        self.stats.handoffs.fetch_add(1, Ordering::Relaxed);
        self.filled.send(buf).is_ok()
    }

    /// All of unit `u` was read: the reader that completes the file checks
    /// it did not change under us and reports its digest.
    pub fn unit_done(&self, u: &ReadUnit, file: Option<&File>) {
        let idx = u.file as usize;
        let f = &self.files[idx];
        let st = &self.state[idx];
        if st.remaining.fetch_sub(u.len(), Ordering::AcqRel) != u.len() {
            return;
        }
        if let (Some(fd), true) = (file, f.volume) {
            // A device's node keeps its mtime while its blocks change: only
            // its size can be checked (consistency is the snapshot's).
            match crate::storage::volume::device_size(fd) {
                Ok(n) if n == f.size => {}
                Ok(n) => {
                    self.fail(
                        idx,
                        format!("device size changed while being read ({n} bytes)"),
                    );
                    return;
                }
                Err(e) => {
                    self.fail(idx, format!("cannot read device size: {e}"));
                    return;
                }
            }
        } else if let Some(fd) = file {
            match fd.metadata() {
                Ok(md) => {
                    use std::os::unix::fs::MetadataExt;
                    if md.len() != f.size || (md.mtime(), md.mtime_nsec() as u32) != f.mtime {
                        self.fail(idx, "file changed while being read".into());
                        return;
                    }
                }
                Err(e) => {
                    self.fail(idx, format!("cannot stat: {e}"));
                    return;
                }
            }
        }
        if !self.state.is_failed(idx) {
            let _ = self.events.send(ReaderEvent::FileDone {
                id: f.id,
                digest: st.digest.load(Ordering::Acquire),
            });
        }
    }
}

/// Reader thread body; `i` is the reader's index (its home queue comes
/// from `ctx.homes`).
pub fn run_reader(ctx: &ReaderCtx, i: usize) {
    let Some(home) = ctx.home_of(i) else { return };
    // Volumes are read by the synchronous loop: it finds the zero runs
    // of each read before the block is packed (storage::volume).
    let volumes = ctx.files.iter().any(|f| f.volume);
    if ctx.storage.engine == IoEngine::Uring && !volumes && uring::run_reader_uring(ctx, home) {
        return;
    }
    run_reader_sync(ctx, home);
}

/// The synchronous engine: one blocking read per segment. Like the
/// io_uring reader it fills two blocks: large files' whole pages go to
/// `aligned` (page-aligned in the block, so the sink can write them with
/// O_DIRECT), everything else is packed into `packed`.
pub fn run_reader_sync(ctx: &ReaderCtx, home: usize) {
    let mut blocks = SyncBlocks::default();
    let mut live = read_units(ctx, home, &mut blocks);
    // What is left goes out; once the links are gone, back to the pool.
    for b in [blocks.aligned, blocks.packed].into_iter().flatten() {
        if live {
            live = ctx.ship(b);
        } else {
            ctx.pool.put(b);
        }
    }
}

/// The blocks a synchronous reader is filling.
#[derive(Default)]
struct SyncBlocks {
    aligned: Option<Buf>,
    packed: Option<Buf>,
}

/// Read units from queue `home` until none is left (true) or the senders
/// are gone (false).
fn read_units(ctx: &ReaderCtx, home: usize, blocks: &mut SyncBlocks) -> bool {
    let mut open: Option<SrcOpen> = None;
    let mut pieces = Vec::new();
    'units: while let Some(u) = ctx.next_unit(home) {
        if ctx.abort.load(Ordering::Relaxed) {
            break;
        }
        let idx = u.file as usize;
        if ctx.is_failed(idx) {
            continue;
        }
        if !ctx.storage.null && open.as_ref().map(|o| o.idx) != Some(u.file) {
            open = None;
            match ctx.open(u.file) {
                Ok(o) => open = o,
                Err(e) => {
                    ctx.fail(idx, e);
                    continue;
                }
            }
        }
        if let Err(e) = ctx.pieces(open.as_ref(), &u, &mut pieces) {
            ctx.fail(idx, e);
            continue;
        }
        for p in &pieces {
            match *p {
                Piece::Hole { off, len } | Piece::Copy { off, len } => {
                    let copy = matches!(p, Piece::Copy { .. });
                    if !ctx.push_hole(&mut blocks.packed, idx, off, len, copy) {
                        return false;
                    }
                }
                Piece::Data { off, len } => {
                    // A volume keeps its one block (its direct reads
                    // ship the packed block first).
                    let volume = ctx.files[idx].volume;
                    let body = if ctx.aligns(idx, off, len) {
                        round_down(len as usize) as u64
                    } else {
                        0
                    };
                    let parts = [
                        (&mut blocks.aligned, off, off + body, true),
                        (&mut blocks.packed, off + body, off + len, volume),
                    ];
                    for (buf, from, to, direct) in parts {
                        if from == to {
                            continue;
                        }
                        match read_data(ctx, buf, open.as_mut(), idx, (from, to), direct) {
                            Ok(true) => {}
                            Ok(false) => return false,
                            Err(e) => {
                                ctx.fail(idx, e);
                                continue 'units;
                            }
                        }
                    }
                }
            }
        }
        ctx.unit_done(&u, open.as_ref().map(|o| &*o.file));
    }
    true
}

/// Read `[off, end)` of file `idx` into blocks, through the O_DIRECT
/// descriptor where it has one and `direct` allows (only a block kept
/// page-aligned does). Ok(false): senders gone.
fn read_data(
    ctx: &ReaderCtx,
    cur: &mut Option<Buf>,
    mut open: Option<&mut SrcOpen>,
    idx: usize,
    (mut off, end): (u64, u64),
    direct: bool,
) -> Result<bool, String> {
    let f = &ctx.files[idx];
    while off < end {
        let mut buf = cur.take().unwrap_or_else(|| ctx.pool.get());
        let room = ctx.block_size - buf.len;
        let want = room.min((end - off) as usize);
        // A volume's read may become one segment per zero granule.
        let segs = if f.volume { max_runs(off, want) } else { 1 };
        if room == 0 || buf.segs.len() + segs > MAX_SEGMENTS {
            if !ctx.ship(buf) {
                return Ok(false);
            }
            continue;
        }
        let start = buf.len;
        let use_direct =
            direct && open.as_ref().is_some_and(|o| o.direct.is_some()) && is_aligned(off);
        if use_direct && !start.is_multiple_of(ALIGN) {
            // Keep the large read aligned: send the packed block first.
            if !ctx.ship(buf) {
                return Ok(false);
            }
            continue;
        }
        if let Err(e) = ctx.storage.hook.check(IoOp::Read, &f.rel, off, want) {
            *cur = Some(buf);
            return Err(format!("read error at offset {off}: {e}"));
        }
        // A mapped file: a zero-copy piece, packed like any other.
        if !use_direct {
            if let Some(o) = open.as_deref() {
                if ctx.push_mapped(&mut buf, o, off, want) {
                    off += want as u64;
                    if buf.len == ctx.block_size || buf.segs.len() == MAX_SEGMENTS {
                        if !ctx.ship(buf) {
                            return Ok(false);
                        }
                    } else {
                        *cur = Some(buf);
                    }
                    continue;
                }
            }
        }
        let got = match open.as_deref_mut() {
            None => Ok(want), // null source: the block's bytes are whatever it holds
            Some(o) if use_direct => {
                let io_len = round_up(want).min(buf.capacity() - start);
                let r = pread_direct(
                    o.direct.as_ref().unwrap(),
                    &mut buf.space()[start..start + io_len],
                    off,
                );
                match r {
                    Err(e) if is_direct_refusal(&e) => {
                        ctx.storage.refusals.refuse(f.dev, "source read", &e);
                        o.direct = None;
                        *cur = Some(buf);
                        continue;
                    }
                    r => r.map(|n| n.min(want)),
                }
            }
            Some(o) => pread_full(&o.file, &mut buf.space()[start..start + want], off),
        };
        let n = match got {
            Ok(n) => n,
            Err(e) => {
                *cur = Some(buf);
                return Err(format!("read error at offset {off}: {e}"));
            }
        };
        if n < want {
            *cur = Some(buf);
            return Err(format!(
                "file shrank while being read (expected {} bytes, ended at {})",
                f.size,
                off + n as u64
            ));
        }
        if f.volume && open.is_some() {
            ctx.push_volume_data(&mut buf, idx, off, start, n);
        } else {
            ctx.push_data(&mut buf, idx, off, start, n);
        }
        off += n as u64;
        if buf.len == ctx.block_size || buf.segs.len() == MAX_SEGMENTS {
            if !ctx.ship(buf) {
                return Ok(false);
            }
        } else {
            *cur = Some(buf);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_fails_once_and_its_neighbours_do_not() {
        let each = (0..130)
            .map(|_| SrcFileState {
                remaining: AtomicU64::new(1),
                digest: AtomicU64::new(0),
            })
            .collect();
        let st = FileStates::new(each);
        assert_eq!(std::mem::size_of::<SrcFileState>(), 16);
        for i in [0, 63, 64, 129] {
            assert!(!st.is_failed(i));
            assert!(st.set_failed(i), "first failure of {i} is reported");
            assert!(!st.set_failed(i), "a second one is not");
            assert!(st.is_failed(i));
        }
        let failed: Vec<usize> = (0..130).filter(|&i| st.is_failed(i)).collect();
        assert_eq!(failed, vec![0, 63, 64, 129]);
    }
}
