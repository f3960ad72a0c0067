//! The sink's file table: where each file id goes, how much of it has
//! arrived, and its verification state.
//!
//! A file is written under a temporary name in its destination directory
//! and renamed into place only when (a) every byte has been written and
//! (b) the source's whole-file digest has arrived and matches what was
//! written. Either event may come first (data and control travel on
//! different links); whichever completes the pair finalizes the file, so
//! files appear under their final names while the transfer is still
//! running, and never half-written.
//!
//! Storage (storage module): each temp file is created at its final size
//! (ftruncate), so holes the source sends as hole segments stay holes and
//! a file ending in a hole has the right length. Files of at least
//! storage::DIRECT_MIN bytes also get an O_DIRECT descriptor: the aligned
//! prefix of each segment is written through it, the unaligned tail
//! through the buffered one (storage::direct). A null sink verifies
//! digests but creates nothing.
//!
//! Small files (issue 17): a file below storage::DIRECT_MIN that no
//! journal names is created nameless (O_TMPFILE, storage::tmpfile) and
//! linked under its final name when complete, its descriptor kept open
//! until then; it is not sized up front (its data fills it; a hole at its
//! end sets the size). Where O_TMPFILE is refused, it gets a named temp
//! file like the rest. Every directory is opened once per session
//! (storage::dirs).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ramsys_proto::data::Segment;

use crate::roles::sink::bigfile;
use crate::storage::direct::{direct_prefix, pwrite_all_fd};
use crate::storage::dirs::{DirRef, SinkDirs};
use crate::storage::fsops::{split_parent, Root};
use crate::storage::volume::VolumeLog;
use crate::storage::{is_direct_refusal, tmpfile, IoOp, StorageCfg, DIRECT_MIN};
use crate::types::stats::Stats;

const DATA_DONE: u8 = 1;
const DIGEST_KNOWN: u8 = 2;
const FAILED: u8 = 4;
const FINAL: u8 = 8;
const TEMP: u8 = 16;
/// Sync: the sink's existing file is kept (unchanged, or identical
/// content); FINAL is set too, but nothing was written.
const KEPT: u8 = 32;
/// Resume: written blocks changed since the journal last saw them.
const DIRTY: u8 = 64;
/// The temp file is nameless (O_TMPFILE): linked into place, never renamed
/// nor unlinked.
const ANON: u8 = 128;

/// Most descriptors of nameless temp files a session keeps open (a lane
/// file has two): half the open-file limit (raised to its hard maximum at
/// start), at least 1,024. Each file stays open from its first byte until
/// its digest has arrived too; past the cap, files get named temp files
/// (closed when their data is written, renamed when the digest comes).
/// The cap is not the in-flight bound: the io_uring writers keep up to
/// 4,096 segments each in flight, every one with its file open, so on the
/// 48k-file tree 10,041 nameless files were open at the peak, and a fixed
/// cap of 1,024 sent 85 % of the files down the named path (40,897
/// renames, fchmodat, ~0.4 CPU-s of 3.8 per push; issue 17).
pub fn anon_cap() -> usize {
    static CAP: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| {
        // SAFETY: plain struct out.
        let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
        let cur = match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } {
            0 => rl.rlim_cur,
            _ => 0,
        };
        (cur / 2).clamp(1024, 1 << 20) as usize
    })
}

/// What a changed file is built from (sync, resume; docs/SYNC.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base {
    /// The sink's current file under the final name: copied (reflinked
    /// where the file system can) into the temp file, then overwritten
    /// where blocks differ.
    Old,
    /// An interrupted temp file of an earlier session (name in the same
    /// directory): renamed to this session's temp name and completed.
    Part(Vec<u8>),
}

/// One regular file being received. A slot per announced file, so kept
/// small (issue 36, docs/SCALE.md): what few files need lives in [`Rare`]
/// behind one lock and is allocated only for them.
pub struct SinkFile {
    pub id: u64,
    /// Final path relative to the sink root.
    pub rel: Box<[u8]>,
    pub size: u64,
    pub mode: u32,
    pub mtime: (i64, u32),
    /// Its directory in the table's SinkDirs.
    dir: u32,
    written: AtomicU64,
    digest: AtomicU64,
    expected: AtomicU64,
    flags: AtomicU8,
    fd: Mutex<Option<Arc<SinkFd>>>,
    rare: Mutex<Option<Box<Rare>>>,
    /// Bytes taken from the base instead of the wire.
    reused: AtomicU64,
    /// A block device written in place (storage::volume): what this
    /// session wrote, re-read to verify it before the file counts as done.
    volume: std::sync::OnceLock<Box<VolumeLog>>,
    /// One piece of a big file striped across daemons (issue 19,
    /// roles::sink::bigfile): `size` is the whole file's, this entry writes its
    /// range into the shared temp file.
    piece: Option<Box<PieceAt>>,
}

/// Where a piece goes in its file.
struct PieceAt {
    offset: u64,
    len: u64,
    index: u32,
    /// Pieces of the file.
    count: u32,
    names: bigfile::Names,
    /// This session's sink renamed the file into place.
    finished: AtomicBool,
}

/// The state of a file that only failed, synced or resumed files have.
#[derive(Default)]
struct Rare {
    /// Why it failed (the first reason wins).
    reason: Option<String>,
    /// What it is built from (sync, resume).
    base: Option<Base>,
    /// Resume: bytes written per journal block (sync::delta_block).
    jblocks: Vec<u32>,
}

impl SinkFile {
    /// Its rare state, allocated at the first use.
    fn rare<R>(&self, f: impl FnOnce(&mut Rare) -> R) -> R {
        f(self.rare.lock().unwrap().get_or_insert_with(Box::default))
    }

    /// What it is built from, if anything (sync, resume).
    fn base(&self) -> Option<Base> {
        self.rare.lock().unwrap().as_ref()?.base.clone()
    }

    fn has_base(&self) -> bool {
        self.rare
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|r| r.base.is_some())
    }

    /// Why it failed ("" if it did not).
    fn reason(&self) -> String {
        let g = self.rare.lock().unwrap();
        g.as_ref()
            .and_then(|r| r.reason.clone())
            .unwrap_or_default()
    }

    /// Written in place into a block device (storage::volume).
    pub fn is_device(&self) -> bool {
        self.volume.get().is_some()
    }

    /// Bytes this entry receives (a piece's length, else the size).
    fn want(&self) -> u64 {
        self.piece.as_ref().map_or(self.size, |p| p.len)
    }
}

/// A regular file announced in the metadata: (path, size, mode, mtime).
pub type NewFile = (Vec<u8>, u64, u32, (i64, u32));

/// Where a segment goes: its file and descriptors (None for a null sink),
/// or None when there is nothing to write.
pub type Prepared<'a> = Option<(&'a SinkFile, Option<Arc<SinkFd>>)>;

/// Open descriptors of a temp file. Writers hold a clone while a write is
/// in flight, so a concurrent failure (which drops the table's reference)
/// can never close the descriptor under a write, nor let its number be
/// reused by another file.
pub struct SinkFd {
    pub buffered: File,
    pub direct: Option<File>,
    /// `direct` is the writer's direct lane, not the file's rule: a block
    /// goes to it only while the lane has room, else through the page cache
    /// (StorageCfg::lane_bytes). Counted per write, not at open.
    pub lane: bool,
    /// Local copies: the source file, opened at the first local-copy
    /// segment (storage::local).
    pub source: std::sync::OnceLock<File>,
    /// A large file written through the page cache: start writeback behind
    /// each write (storage::cache::start_writeback).
    pub writeback: bool,
    /// Nameless (O_TMPFILE): kept open until it is linked into place.
    pub anon: bool,
    /// Created at its final size (ftruncate); otherwise a hole at its end
    /// sets the size (FileTable::write_hole).
    pub sized: bool,
}

impl SinkFd {
    /// Descriptors it holds open (counted against [`anon_cap`]).
    fn fds(&self) -> usize {
        1 + self.direct.is_some() as usize
    }

    /// `len` bytes at `off` were written through the buffered descriptor.
    pub fn written(&self, off: u64, len: usize) {
        if self.writeback && len > 0 {
            crate::storage::cache::start_writeback(self.buffered.as_raw_fd(), off, len);
        }
    }
}

/// Outcome of writing one segment.
#[derive(Debug)]
pub enum WriteError {
    /// The peer broke the protocol (unknown id, data past end of file).
    Protocol(String),
    /// The destination cannot take more (disk full, quota, read-only):
    /// the whole session stops.
    Fatal(String),
}

/// All files of a session, indexed by entry id.
pub struct FileTable {
    pub root: Arc<Root>,
    files: Vec<SinkFile>,
    /// entry id -> index in `files` (u32::MAX: not a regular file).
    by_id: Vec<u32>,
    tmp_suffix: String,
    checksum: bool,
    fsync: bool,
    stats: Arc<Stats>,
    /// Direct I/O, engine, null sink, fault hook.
    pub storage: Arc<StorageCfg>,
    /// Resume: track written blocks for the journal (roles::sink::journal).
    pub resume: bool,
    /// Files smaller than this are not journalled nor kept when the
    /// session fails (0 = all; the default journal keeps large files only,
    /// sync::JOURNAL_MIN).
    pub journal_min: u64,
    /// Files whose written blocks changed since the last journal flush
    /// (indices into `files`; pushed once per flush when DIRTY is first
    /// set), so a flush costs the files in flight, not a walk of a table
    /// of millions (issue 36).
    dirty: std::sync::Mutex<Vec<u32>>,
    /// Bytes of the files' names (meta_bytes).
    name_bytes: u64,
    /// Files before this index are all settled (never unsettle again).
    settled_upto: std::sync::atomic::AtomicUsize,
    /// Destination directories, opened once.
    dirs: SinkDirs,
    /// O_TMPFILE works here (cleared at the first refusal).
    anon_ok: AtomicBool,
    /// Descriptors of nameless temp files open now (two for a lane file),
    /// and how many may be ([`anon_cap`]).
    anon_open: AtomicUsize,
    anon_cap: usize,
}

/// Fault injection for the resume tests: `RAMSYS_FAULT_SLOW_WRITE_US=N`
/// sleeps N µs per segment written, so a test can kill a transfer midway.
fn slow_write_fault() {
    static US: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let us = *US.get_or_init(|| {
        std::env::var("RAMSYS_FAULT_SLOW_WRITE_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    });
    if us > 0 {
        std::thread::sleep(std::time::Duration::from_micros(us));
    }
}

pub fn is_fatal(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EROFS)
    )
}

pub fn fatal_msg(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => "sink disk full (No space left on device)".into(),
        Some(libc::EDQUOT) => "sink disk quota exceeded".into(),
        Some(libc::EROFS) => "sink file system is read-only".into(),
        _ => e.to_string(),
    }
}

impl FileTable {
    pub fn new(
        root: Arc<Root>,
        session: u64,
        checksum: bool,
        fsync: bool,
        stats: Arc<Stats>,
    ) -> Self {
        FileTable {
            root,
            files: Vec::new(),
            by_id: Vec::new(),
            tmp_suffix: format!(".ramsys-{session:016x}.part"),
            checksum,
            fsync,
            stats,
            storage: Arc::new(StorageCfg::plain(false, crate::storage::IoEngine::Sync)),
            resume: false,
            journal_min: 0,
            dirty: std::sync::Mutex::new(Vec::new()),
            name_bytes: 0,
            settled_upto: std::sync::atomic::AtomicUsize::new(0),
            dirs: SinkDirs::default(),
            anon_ok: AtomicBool::new(tmpfile::enabled()),
            anon_open: AtomicUsize::new(0),
            anon_cap: anon_cap(),
        }
    }

    /// Use these storage settings (direct I/O, engine, null sink, hook).
    pub fn with_storage(mut self, cfg: StorageCfg) -> Self {
        self.storage = Arc::new(cfg);
        self
    }

    /// Register entry `id` (ids arrive in order; non-files get no slot).
    pub fn push_entry(&mut self, id: u64, file: Option<NewFile>) {
        debug_assert_eq!(id as usize, self.by_id.len());
        match file {
            Some((rel, size, mode, mtime)) => {
                self.name_bytes += rel.len() as u64;
                self.by_id.push(self.files.len() as u32);
                let dir = self.dirs.intern(split_parent(&rel).0);
                self.files.push(SinkFile {
                    id,
                    rel: rel.into_boxed_slice(),
                    size,
                    mode,
                    mtime,
                    dir,
                    written: AtomicU64::new(0),
                    digest: AtomicU64::new(0),
                    expected: AtomicU64::new(0),
                    flags: AtomicU8::new(0),
                    fd: Mutex::new(None),
                    rare: Mutex::new(None),
                    reused: AtomicU64::new(0),
                    volume: std::sync::OnceLock::new(),
                    piece: None,
                });
            }
            None => self.by_id.push(u32::MAX),
        }
    }

    /// Entry `id` (registered with the whole file's size) is piece `index`
    /// of pieces of `piece` bytes (EntryKind::Piece, checked by the
    /// protocol machine; a bad one is not made a piece and fails).
    pub fn set_piece(&mut self, id: u64, piece: u64, index: u32) {
        let Some(&i) = self.by_id.get(id as usize) else {
            return;
        };
        let Some(f) = self.files.get_mut(i as usize) else {
            return;
        };
        let kind = ramsys_proto::control::EntryKind::Piece {
            size: f.size,
            piece,
            index,
        };
        if let Some((offset, len)) = kind.piece_range() {
            f.piece = Some(Box::new(PieceAt {
                offset,
                len,
                index,
                count: f.size.div_ceil(piece) as u32,
                names: bigfile::Names::new(&f.rel, f.size, f.mtime, piece),
                finished: AtomicBool::new(false),
            }));
        }
    }

    /// Sync: piece `id` is already in the shared temp file, verified (an
    /// earlier run's marker): nothing to send.
    pub fn piece_done(&self, id: u64) -> bool {
        let Some(f) = self.get(id) else { return false };
        let Some(p) = &f.piece else { return false };
        self.dir_of(f)
            .is_ok_and(|d| bigfile::piece_done(d.fd(), &p.names, f.size, p.index))
    }

    /// Sync: piece `id` is done already: kept; finish the file if every
    /// other piece is too (an earlier run may have stopped just before).
    pub fn keep_piece(&self, id: u64) {
        let Some(f) = self.get(id) else { return };
        match self.try_finish(f) {
            Ok(()) => {
                f.flags.fetch_or(KEPT | FINAL, Ordering::AcqRel);
            }
            Err(e) => self.fail(f, format!("cannot rename into place: {e}")),
        }
    }

    /// A verified piece: leave its marker, and place the file if every
    /// piece is now in (roles::sink::bigfile).
    fn place_piece(&self, f: &SinkFile, p: &PieceAt) {
        drop(self.take_fd(f));
        let marked = self
            .dir_of(f)
            .and_then(|d| bigfile::mark(d.fd(), &p.names, p.index));
        if let Err(e) = marked {
            self.fail(f, format!("cannot mark piece {} done: {e}", p.index));
            return;
        }
        match self.try_finish(f) {
            Ok(()) => {
                f.flags.fetch_or(FINAL, Ordering::AcqRel);
                self.stats.pieces.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => self.fail(f, format!("cannot rename into place: {e}")),
        }
    }

    /// Rename the big file piece `f` belongs to into place if every piece
    /// is verified (and nobody did yet).
    fn try_finish(&self, f: &SinkFile) -> std::io::Result<()> {
        let Some(p) = &f.piece else { return Ok(()) };
        let dir = self.dir_of(f)?;
        if !bigfile::all_done(dir.fd(), &p.names, p.count) {
            return Ok(());
        }
        let (_, name) = split_parent(&f.rel);
        let (size, mode, mtime) = (f.size, f.mode, f.mtime);
        if bigfile::finish(dir.fd(), &p.names, name, size, mode, mtime, p.count)? {
            p.finished.store(true, Ordering::Release);
            self.stats.files.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    pub fn get(&self, id: u64) -> Option<&SinkFile> {
        let i = *self.by_id.get(id as usize)?;
        self.files.get(i as usize)
    }

    pub fn files(&self) -> &[SinkFile] {
        &self.files
    }

    /// This session end's counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Bytes this table holds for its files: slots, the id map and the
    /// names (issue 36's accounting; the sink's dominant share,
    /// docs/SCALE.md).
    pub fn meta_bytes(&self) -> u64 {
        (self.files.capacity() * std::mem::size_of::<SinkFile>()
            + self.by_id.capacity() * std::mem::size_of::<u32>()) as u64
            + self.name_bytes
    }

    fn tmp_name(&self, f: &SinkFile) -> Vec<u8> {
        let (_, name) = split_parent(&f.rel);
        if f.is_device() {
            // Written in place: the journal names the device itself.
            return name.to_vec();
        }
        // Keep the temp name within NAME_MAX.
        let keep = name.len().min(255 - 1 - self.tmp_suffix.len());
        let mut t = Vec::with_capacity(keep + 1 + self.tmp_suffix.len());
        t.push(b'.');
        t.extend_from_slice(&name[..keep]);
        t.extend_from_slice(self.tmp_suffix.as_bytes());
        t
    }

    /// Mark a file failed (first reason wins) and close it.
    pub fn fail(&self, f: &SinkFile, reason: String) {
        let prev = f.flags.fetch_or(FAILED, Ordering::AcqRel);
        if prev & (FAILED | FINAL) == 0 {
            f.rare(|r| r.reason = Some(reason));
            self.stats.failed.fetch_add(1, Ordering::Relaxed);
        }
        // A nameless temp file goes with its last descriptor.
        self.take_fd(f);
    }

    /// Take the file's descriptors out of the table.
    fn take_fd(&self, f: &SinkFile) -> Option<Arc<SinkFd>> {
        let fd = f.fd.lock().unwrap().take();
        if let Some(d) = fd.as_ref().filter(|d| d.anon) {
            self.anon_open.fetch_sub(d.fds(), Ordering::AcqRel);
        }
        fd
    }

    /// The directory file `f` goes into.
    fn dir_of(&self, f: &SinkFile) -> std::io::Result<DirRef<'_>> {
        self.dirs.get(&self.root, f.dir, split_parent(&f.rel).0)
    }

    pub fn fail_id(&self, id: u64, reason: String) {
        if let Some(f) = self.get(id) {
            self.fail(f, reason);
        }
    }

    /// Write one received segment (synchronous engine).
    pub fn write_segment(&self, seg: &Segment, data: &[u8], hash: u64) -> Result<(), WriteError> {
        let Some((f, fd)) = self.prepare(seg)? else {
            return Ok(());
        };
        if let Some(fd) = fd {
            if let Some(r) = self.write_marker(f, &fd, seg, hash) {
                return r;
            }
            if let Err(e) = self.write_data(f, &fd, data, seg.offset) {
                return self.write_failed(f, e);
            }
        }
        self.account(f, seg, hash)
    }

    /// A segment without payload, written at once and accounted: a local
    /// copy's range (storage::local) or a hole. None: a data segment.
    pub fn write_marker(
        &self,
        f: &SinkFile,
        fd: &SinkFd,
        seg: &Segment,
        hash: u64,
    ) -> Option<Result<(), WriteError>> {
        let r = if seg.is_copy() {
            self.copy_local(f, fd, seg, &mut Vec::new())
        } else if seg.is_hole() {
            self.write_hole(f, fd, seg)
        } else {
            return None;
        };
        Some(match r {
            Ok(()) => self.account(f, seg, hash),
            Err(e) => self.write_failed(f, e),
        })
    }

    /// A local-copy segment: copy its range from the source file in the
    /// kernel (storage::local). Only a sink with a local bridge (the source
    /// runs in this process) takes one; from anyone else it is refused.
    pub fn copy_local(
        &self,
        f: &SinkFile,
        fd: &SinkFd,
        seg: &Segment,
        scratch: &mut Vec<u8>,
    ) -> std::io::Result<()> {
        let len = seg.span();
        self.storage
            .hook
            .check(IoOp::Write, &f.rel, seg.offset, len as usize)?;
        let Some(bridge) = &self.storage.local else {
            return Err(std::io::Error::other(
                "local-copy segment from a peer in another process",
            ));
        };
        let src = match fd.source.get() {
            Some(s) => s,
            None => {
                let s = bridge.open(seg.file_id)?;
                fd.source.get_or_init(|| s)
            }
        };
        crate::storage::local::copy_range(src, &fd.buffered, seg.offset, len, scratch)?;
        fd.written(seg.offset, len as usize);
        self.storage
            .copied_bytes
            .fetch_add(len, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// A hole segment: nothing to do in a fresh temp file (created at its
    /// size, all holes); a device, a file built from a base or a piece's
    /// shared temp file holds old bytes there, which must read as zeros
    /// (storage::volume).
    pub fn write_hole(&self, f: &SinkFile, fd: &SinkFd, seg: &Segment) -> std::io::Result<()> {
        if !fd.sized && seg.offset + seg.span() == f.size {
            // Not created at its size: a hole at the end sets it.
            fd.buffered.set_len(f.size)?;
        }
        // A piece's temp file may hold an interrupted earlier attempt's
        // bytes (roles::sink::bigfile): zeroed like a base.
        if !f.is_device() && !f.has_base() && f.piece.is_none() {
            return Ok(());
        }
        self.storage
            .hook
            .check(IoOp::Write, &f.rel, seg.offset, seg.span() as usize)?;
        crate::storage::volume::zero_range(&fd.buffered, seg.offset, seg.span())
    }

    /// Entry `id` goes into the block device at its path, in place
    /// (checked by the caller: `--write-devices`, large enough).
    pub fn set_device(&self, id: u64) {
        if let Some(f) = self.get(id) {
            let _ = f.volume.set(Box::default());
        }
    }

    /// Check a segment and find where it goes: None if there is nothing to
    /// do (file failed or already complete); otherwise the file and its
    /// descriptors (None for a null sink), created on first use.
    pub fn prepare(&self, seg: &Segment) -> Result<Prepared<'_>, WriteError> {
        let f = self.get(seg.file_id).ok_or_else(|| {
            WriteError::Protocol(format!("data for unknown file id {}", seg.file_id))
        })?;
        if seg.is_copy() && self.storage.local.is_none() {
            return Err(WriteError::Protocol(
                "local-copy segment from a peer in another process".into(),
            ));
        }
        let end = seg.offset + seg.span();
        if end > f.size {
            return Err(WriteError::Protocol(format!(
                "data past the end of {} ({end} > {})",
                crate::types::error::show(&f.rel),
                f.size
            )));
        }
        if let Some(p) = &f.piece {
            if seg.offset < p.offset || end > p.offset + p.len {
                return Err(WriteError::Protocol(format!(
                    "data outside piece {} of {}",
                    p.index,
                    crate::types::error::show(&f.rel)
                )));
            }
        }
        if f.flags.load(Ordering::Acquire) & (FAILED | FINAL) != 0 {
            return Ok(None);
        }
        if self.storage.null {
            return Ok(Some((f, None)));
        }
        let mut g = f.fd.lock().unwrap();
        if g.is_none() {
            if f.flags.load(Ordering::Acquire) & (TEMP | FAILED) != 0 {
                // Closed after completion or failure: nothing to write.
                return Ok(None);
            }
            match self.create(f) {
                Ok(fd) => {
                    let anon = if fd.anon { ANON } else { 0 };
                    f.flags.fetch_or(TEMP | anon, Ordering::AcqRel);
                    *g = Some(Arc::new(fd));
                }
                Err(e) if is_fatal(&e) => return Err(WriteError::Fatal(fatal_msg(&e))),
                Err(e) => {
                    drop(g);
                    self.fail(f, format!("cannot create: {e}"));
                    return Ok(None);
                }
            }
        }
        Ok(Some((f, g.clone())))
    }

    /// Create the temp file at its final size, with an O_DIRECT descriptor
    /// for large files where the file system takes one.
    fn create(&self, f: &SinkFile) -> std::io::Result<SinkFd> {
        if f.is_device() {
            return self.open_device(f);
        }
        let (parent, _) = split_parent(&f.rel);
        let dir = self.dir_of(f)?;
        let base = f.base();
        if base.is_none() && f.piece.is_none() {
            if let Some(fd) = self.create_anon(f, &dir)? {
                return Ok(fd);
            }
        }
        let tmp = match &f.piece {
            Some(p) => p.names.tmp.clone(),
            None => self.tmp_name(f),
        };
        let buffered = match &base {
            // A piece: the temp file shared by the stripe, sized by
            // whoever opens it first (roles::sink::bigfile).
            _ if f.piece.is_some() => {
                let p = f.piece.as_ref().expect("a piece");
                bigfile::open(dir.fd(), &p.names, f.size, p.count)?
            }
            Some(Base::Part(name)) => {
                self.root.rename_in(parent, name, &tmp)?;
                let mut rel = parent.to_vec();
                if !rel.is_empty() {
                    rel.push(b'/');
                }
                rel.extend_from_slice(&tmp);
                File::from(
                    self.root
                        .openat(&rel, libc::O_WRONLY | libc::O_NOFOLLOW, 0)?,
                )
            }
            _ => crate::storage::fsops::create_temp_in(dir.fd(), &tmp)?,
        };
        // A small fresh file is not sized up front: its data fills it and
        // a hole at its end sets the size. Large files are (the O_DIRECT
        // prefix and the buffered tail of a block write disjoint pages of
        // a file that already has its size), and so is one built on a base.
        let sized = base.is_some() || f.size >= DIRECT_MIN || f.piece.is_some();
        let made = (|| {
            if base == Some(Base::Old) {
                let old = self.root.open_read(&f.rel, false)?;
                crate::request::sync::copy_base(&old, &buffered, f.size)?;
            }
            if sized && f.piece.is_none() {
                buffered.set_len(f.size)?;
            }
            let mut direct = None;
            let forced = self.storage.write_direct(f.size);
            let lane = !forced && self.storage.lane(f.size);
            if forced || lane {
                let mut rel = parent.to_vec();
                if !rel.is_empty() {
                    rel.push(b'/');
                }
                rel.extend_from_slice(&tmp);
                direct = self.open_direct(f, &buffered, || {
                    let fl = libc::O_WRONLY | libc::O_DIRECT | libc::O_NOFOLLOW;
                    self.root.openat(&rel, fl, 0).map(File::from)
                })?;
            }
            Ok((direct, lane))
        })();
        match made {
            Ok((direct, lane)) => {
                let lane = lane && direct.is_some();
                if !lane {
                    self.storage.count(f.size, f.want(), direct.is_some());
                }
                Ok(SinkFd {
                    source: std::sync::OnceLock::new(),
                    writeback: direct.is_none() && self.storage.writeback && f.size >= DIRECT_MIN,
                    buffered,
                    direct,
                    lane,
                    anon: false,
                    sized,
                })
            }
            Err(e) => {
                // Another sink's pieces may be in a shared one.
                if f.piece.is_none() {
                    let _ = crate::storage::fsops::unlink_in(dir.fd(), &tmp);
                }
                Err(e)
            }
        }
    }

    /// A nameless temp file for a small fresh file no journal will name,
    /// while O_TMPFILE works here and fewer than `anon_cap` are open;
    /// None: use a named one.
    fn create_anon(&self, f: &SinkFile, dir: &DirRef) -> std::io::Result<Option<SinkFd>> {
        let journalled = self.resume && f.size >= self.journal_min;
        if f.size >= DIRECT_MIN
            || journalled
            || !self.anon_ok.load(Ordering::Relaxed)
            || self.anon_open.load(Ordering::Relaxed) >= self.anon_cap
        {
            return Ok(None);
        }
        let made = self
            .storage
            .hook
            .check(IoOp::TmpFile, &f.rel, 0, 0)
            .and_then(|_| tmpfile::create(dir.fd(), f.mode));
        match made {
            Ok(buffered) => {
                // Also a direct lane file: sized now (its O_DIRECT pages and
                // buffered tail then write disjoint pages of a file that
                // has its size, as a large file's), with a second,
                // O_DIRECT descriptor.
                let direct = match self.storage.lane(f.size) {
                    true => self.anon_direct(f, &buffered)?,
                    false => None,
                };
                let fd = SinkFd {
                    buffered,
                    sized: direct.is_some(),
                    lane: direct.is_some(),
                    direct,
                    source: std::sync::OnceLock::new(),
                    writeback: false,
                    anon: true,
                };
                self.anon_open.fetch_add(fd.fds(), Ordering::AcqRel);
                Ok(Some(fd))
            }
            Err(e) if tmpfile::is_unsupported(&e) => {
                if self.anon_ok.swap(false, Ordering::AcqRel) {
                    tracing::info!("O_TMPFILE refused ({e}): temp files are named and renamed");
                }
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The O_DIRECT descriptor of a nameless lane file, sized; None where
    /// the device refuses O_DIRECT (or /proc is not there to reopen it).
    fn anon_direct(&self, f: &SinkFile, buffered: &File) -> std::io::Result<Option<File>> {
        match self.open_direct(f, buffered, || tmpfile::reopen_direct(buffered)) {
            Ok(Some(d)) => {
                buffered.set_len(f.size)?;
                Ok(Some(d))
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            r => r,
        }
    }

    /// A second, O_DIRECT descriptor of the temp file `buffered`, made by
    /// `open`; None where its device refuses O_DIRECT (remembered per
    /// device, so each is tried once per session).
    fn open_direct(
        &self,
        f: &SinkFile,
        buffered: &File,
        open: impl FnOnce() -> std::io::Result<File>,
    ) -> std::io::Result<Option<File>> {
        let dev = buffered.metadata()?.dev();
        if self.storage.refusals.refused(dev) {
            return Ok(None);
        }
        let r = self
            .storage
            .hook
            .check(IoOp::OpenDirect, &f.rel, 0, 0)
            .and_then(|_| open());
        match r {
            Ok(d) => Ok(Some(d)),
            Err(e) if is_direct_refusal(&e) => {
                self.storage.refusals.refuse(dev, "sink", &e);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Give a nameless temp file its mtime (and mode where creation could
    /// not set it) and link it under its final name; where the name is
    /// taken (an overwrite), under the temp name, renamed over it.
    fn link_anon(
        &self,
        f: &SinkFile,
        fd: &SinkFd,
        dir: &DirRef,
        name: &[u8],
    ) -> std::io::Result<()> {
        let acl = dir.dir().default_acl;
        let chmod = tmpfile::chmod_needed(f.mode, tmpfile::umask(), acl).then_some(f.mode);
        tmpfile::set_attrs(&fd.buffered, chmod, f.mtime)?;
        match tmpfile::link(&fd.buffered, dir.fd(), name) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                let tmp = self.tmp_name(f);
                tmpfile::link(&fd.buffered, dir.fd(), &tmp)?;
                crate::storage::fsops::rename_in_dir(dir.fd(), &tmp, name).inspect_err(|_| {
                    let _ = crate::storage::fsops::unlink_in(dir.fd(), &tmp);
                })
            }
            r => r,
        }
    }

    /// A device destination: opened in place for writing (never created,
    /// never truncated), with an O_DIRECT descriptor for the aligned part.
    fn open_device(&self, f: &SinkFile) -> std::io::Result<SinkFd> {
        let fl = libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        let buffered = File::from(self.root.openat(&f.rel, fl, 0)?);
        let direct = if self.storage.write_direct(f.size) {
            self.root
                .openat(&f.rel, fl | libc::O_DIRECT, 0)
                .ok()
                .map(File::from)
        } else {
            None
        };
        self.storage.count(f.size, f.size, direct.is_some());
        Ok(SinkFd {
            source: std::sync::OnceLock::new(),
            writeback: false,
            buffered,
            direct,
            lane: false,
            anon: false,
            sized: true,
        })
    }

    /// Write a data segment: aligned prefix direct, tail buffered.
    pub fn write_data(
        &self,
        f: &SinkFile,
        fd: &SinkFd,
        data: &[u8],
        off: u64,
    ) -> std::io::Result<()> {
        self.storage
            .hook
            .check(IoOp::Write, &f.rel, off, data.len())?;
        let mut done = 0;
        if fd.lane {
            // No lane on this path (the sync engine waits for each write).
            self.storage.count(f.size, data.len() as u64, false);
        } else if let Some(d) = &fd.direct {
            let pre = direct_prefix(data.as_ptr() as usize, off, data.len());
            if pre > 0 {
                match pwrite_all_fd(d.as_raw_fd(), &data[..pre], off) {
                    Ok(()) => done = pre,
                    Err(e) if is_direct_refusal(&e) => {
                        let dev = fd.buffered.metadata().map(|m| m.dev()).unwrap_or(0);
                        self.storage.refusals.refuse(dev, "sink write", &e);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        crate::storage::cache::pwrite_cached(
            fd.buffered.as_raw_fd(),
            &data[done..],
            off + done as u64,
        )?;
        fd.written(off, data.len());
        Ok(())
    }

    /// A write failed: fatal errors stop the session, others fail the file.
    pub fn write_failed(&self, f: &SinkFile, e: std::io::Error) -> Result<(), WriteError> {
        if is_fatal(&e) {
            return Err(WriteError::Fatal(fatal_msg(&e)));
        }
        self.fail(f, format!("write error: {e}"));
        Ok(())
    }

    /// The segment is on disk (or is a hole, or was discarded): count it.
    pub fn account(&self, f: &SinkFile, seg: &Segment, hash: u64) -> Result<(), WriteError> {
        if self.checksum {
            f.digest.fetch_add(hash, Ordering::AcqRel);
        }
        let span = seg.span();
        if let Some(log) = f.volume.get() {
            log.note(seg);
        }
        slow_write_fault();
        // A piece's resume state is its marker (roles::sink::bigfile).
        if self.resume && !self.storage.null && f.size >= self.journal_min && f.piece.is_none() {
            self.note_blocks(f, seg.file_id, seg.offset, span);
        }
        let w = f.written.fetch_add(span, Ordering::AcqRel) + span;
        self.stats.add_bytes(span);
        if w > f.want() {
            self.fail(f, "received more bytes than the file holds".into());
        } else if w == f.want() {
            self.data_complete(f)?;
        }
        Ok(())
    }

    /// Resume: count written bytes per journal block.
    fn note_blocks(&self, f: &SinkFile, id: u64, off: u64, len: u64) {
        let bs = crate::request::sync::delta_block(f.size) as u64;
        f.rare(|r| {
            let g = &mut r.jblocks;
            if g.is_empty() {
                g.resize(f.size.div_ceil(bs) as usize, 0);
            }
            let (mut o, end) = (off, off + len);
            while o < end {
                let i = (o / bs) as usize;
                let n = ((i as u64 + 1) * bs).min(end) - o;
                if let Some(c) = g.get_mut(i) {
                    *c += n as u32;
                }
                o += n;
            }
        });
        if f.flags.fetch_or(DIRTY, Ordering::AcqRel) & DIRTY == 0 {
            if let Some(&i) = self.by_id.get(id as usize) {
                self.dirty.lock().unwrap().push(i);
            }
        }
    }

    /// Sync: build file `id` from `base` (set during metadata, before any
    /// data can arrive).
    pub fn set_base(&self, id: u64, base: Base) {
        if let Some(f) = self.get(id) {
            f.rare(|r| r.base = Some(base));
        }
    }

    /// Sync: the sink's file is kept as it is; give it the source's mode
    /// and mtime (a metadata-only change moves no data).
    pub fn keep(&self, id: u64, apply_attrs: bool) {
        let Some(f) = self.get(id) else { return };
        if apply_attrs && !self.storage.null {
            if let Err(e) = self.root.set_dir_attrs(&f.rel, f.mode, f.mtime) {
                self.fail(f, format!("attributes: {e}"));
                return;
            }
        }
        f.flags.fetch_or(KEPT | FINAL, Ordering::AcqRel);
    }

    /// Sync: the source reuses `bytes` of file `id`'s base; only the rest
    /// arrives as data. Creates the temp file from the base now, so a file
    /// with no differing block completes here.
    pub fn reuse(&self, id: u64, bytes: u64) -> Result<(), WriteError> {
        let Some(f) = self.get(id) else {
            return Err(WriteError::Protocol(format!(
                "reuse of unknown file id {id}"
            )));
        };
        if bytes > f.size || !f.has_base() {
            return Err(WriteError::Protocol(format!(
                "reuse of {} without a base the sink offered",
                crate::types::error::show(&f.rel)
            )));
        }
        if bytes == 0 {
            return Ok(());
        }
        let seg = Segment {
            file_id: id,
            offset: 0,
            len: 0,
        };
        if self.prepare(&seg)?.is_none() {
            return Ok(());
        }
        f.reused.fetch_add(bytes, Ordering::AcqRel);
        if self.resume && f.size >= self.journal_min {
            // Reused blocks count as written for the journal too.
            let bs = crate::request::sync::delta_block(f.size) as u64;
            f.rare(|r| r.jblocks.resize(f.size.div_ceil(bs) as usize, 0));
        }
        let w = f.written.fetch_add(bytes, Ordering::AcqRel) + bytes;
        if w > f.size {
            self.fail(f, "received more bytes than the file holds".into());
        } else if w == f.size {
            self.data_complete(f)?;
        }
        Ok(())
    }

    /// File bytes that crossed the wire for files now in place.
    pub fn bytes_moved(&self) -> u64 {
        self.files
            .iter()
            .filter(|f| f.flags.load(Ordering::Acquire) & (FINAL | KEPT) == FINAL)
            .map(|f| f.want() - f.reused.load(Ordering::Acquire).min(f.want()))
            .sum()
    }

    /// Files now in place whose data (some of it) crossed the wire.
    pub fn files_moved(&self) -> u64 {
        self.files
            .iter()
            .filter(|f| f.flags.load(Ordering::Acquire) & (FINAL | KEPT) == FINAL)
            .filter(|f| f.size == 0 || f.reused.load(Ordering::Acquire) < f.size)
            // A big file counts once, at the sink that placed it.
            .filter(|f| {
                f.piece
                    .as_ref()
                    .is_none_or(|p| p.finished.load(Ordering::Acquire))
            })
            .count() as u64
    }

    /// Files kept as they were at the sink.
    pub fn kept(&self) -> u64 {
        self.files
            .iter()
            .filter(|f| f.flags.load(Ordering::Acquire) & KEPT != 0)
            // A big file counts once: at the sink of its first piece.
            .filter(|f| f.piece.as_ref().is_none_or(|p| p.index == 0))
            .count() as u64
    }

    /// Resume: journal rows of temp files whose written blocks changed
    /// since the last call (`all`: every temp file not in place, once at
    /// the session's end). A tick takes the dirty list, not the table.
    pub fn journal_rows(&self, all: bool) -> Vec<crate::roles::sink::journal::PartRec> {
        let dirty = std::mem::take(&mut *self.dirty.lock().unwrap());
        let rows = |f: &SinkFile| self.journal_row(f, all);
        if all {
            self.files.iter().filter_map(rows).collect()
        } else {
            dirty
                .iter()
                .filter_map(|&i| self.files.get(i as usize))
                .filter_map(rows)
                .collect()
        }
    }

    /// The journal row of one file, if it has one to write now.
    fn journal_row(&self, f: &SinkFile, all: bool) -> Option<crate::roles::sink::journal::PartRec> {
        let fl = f.flags.load(Ordering::Acquire);
        if fl & TEMP == 0
            || fl & (FINAL | ANON) != 0
            || (!all && fl & DIRTY == 0)
            || f.size < self.journal_min
            || f.piece.is_some()
        {
            return None;
        }
        f.flags.fetch_and(!DIRTY, Ordering::AcqRel);
        let bs = crate::request::sync::delta_block(f.size);
        let written = f.rare(|r| {
            let mut written = vec![0u8; r.jblocks.len().div_ceil(8)];
            for (i, c) in r.jblocks.iter().enumerate() {
                let blen = (f.size - i as u64 * bs as u64).min(bs as u64);
                if *c as u64 >= blen {
                    written[i / 8] |= 1 << (i % 8);
                }
            }
            written
        });
        Some(crate::roles::sink::journal::PartRec {
            dest: f.rel.to_vec(),
            size: f.size,
            mtime: f.mtime,
            part: self.tmp_name(f),
            block_size: bs,
            written,
        })
    }

    /// Paths of files now in place that the journal holds a row for
    /// (`held`: its rows, few): their rows can go. One DELETE per row, not
    /// per file of the tree.
    pub fn final_paths<'t>(&'t self, held: &std::collections::HashSet<Vec<u8>>) -> Vec<&'t [u8]> {
        if held.is_empty() {
            return Vec::new();
        }
        self.files
            .iter()
            .filter(|f| f.flags.load(Ordering::Acquire) & FINAL != 0 && f.piece.is_none())
            .filter(|f| held.contains(&f.rel[..]))
            .map(|f| &f.rel[..])
            .collect()
    }

    fn data_complete(&self, f: &SinkFile) -> Result<(), WriteError> {
        // A nameless file stays open: it is linked through its descriptor.
        let file = {
            let mut g = f.fd.lock().unwrap();
            match &*g {
                Some(d) if d.anon => g.clone(),
                _ => g.take(),
            }
        };
        if let Some(file) = file {
            if self.fsync {
                if let Err(e) = file.buffered.sync_all() {
                    if is_fatal(&e) {
                        return Err(WriteError::Fatal(fatal_msg(&e)));
                    }
                    self.fail(f, format!("fsync: {e}"));
                    return Ok(());
                }
            }
        }
        let prev = f.flags.fetch_or(DATA_DONE, Ordering::AcqRel);
        if prev & DIGEST_KNOWN != 0 {
            self.finalize(f);
        }
        Ok(())
    }

    /// The source reported the file fully read with this digest.
    pub fn digest_known(&self, id: u64, digest: u64) -> Result<(), WriteError> {
        let f = self
            .get(id)
            .ok_or_else(|| WriteError::Protocol(format!("digest for unknown file id {id}")))?;
        f.expected.store(digest, Ordering::Release);
        if f.size == 0 && !self.storage.null && f.is_device() {
            f.flags.fetch_or(TEMP | DATA_DONE, Ordering::AcqRel);
        } else if f.size == 0 && !self.storage.null {
            // No payload will come: create the empty file now.
            let mut g = f.fd.lock().unwrap();
            match self.create(f) {
                Ok(fd) => {
                    let anon = if fd.anon { ANON } else { 0 };
                    f.flags.fetch_or(TEMP | DATA_DONE | anon, Ordering::AcqRel);
                    // Closed (a named file) or linked (nameless) by finalize.
                    *g = Some(Arc::new(fd));
                }
                Err(e) if is_fatal(&e) => return Err(WriteError::Fatal(fatal_msg(&e))),
                Err(e) => {
                    drop(g);
                    self.fail(f, format!("cannot create: {e}"));
                    return Ok(());
                }
            }
        }
        let prev = f.flags.fetch_or(DIGEST_KNOWN, Ordering::AcqRel);
        if prev & DATA_DONE != 0 || f.size == 0 {
            self.finalize(f);
        }
        Ok(())
    }

    fn finalize(&self, f: &SinkFile) {
        if f.flags.load(Ordering::Acquire) & FAILED != 0 {
            return;
        }
        if self.checksum && f.digest.load(Ordering::Acquire) != f.expected.load(Ordering::Acquire) {
            self.fail(f, "checksum mismatch: file corrupted in transit".into());
            return;
        }
        if self.storage.null {
            // Verified and discarded.
            f.flags.fetch_or(FINAL, Ordering::AcqRel);
            self.stats.files.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if let Some(p) = &f.piece {
            self.place_piece(f, p);
            return;
        }
        if let Some(log) = f.volume.get() {
            // In place: nothing to rename; read back what was written.
            match self.verify_device(f, log) {
                Ok(()) => {
                    f.flags.fetch_or(FINAL, Ordering::AcqRel);
                    self.stats.files.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => self.fail(f, e),
            }
            return;
        }
        let (_, name) = split_parent(&f.rel);
        let fd = self.take_fd(f);
        let placed = self.dir_of(f).and_then(|dir| match &fd {
            Some(fd) if fd.anon => self.link_anon(f, fd, &dir, name),
            _ if f.flags.load(Ordering::Acquire) & ANON != 0 => Err(std::io::Error::other(
                "temp file closed before it was linked",
            )),
            _ => crate::storage::fsops::finalize_in(
                dir.fd(),
                &self.tmp_name(f),
                name,
                f.mode,
                f.mtime,
            ),
        });
        drop(fd);
        match placed {
            Ok(()) => {
                f.flags.fetch_or(FINAL, Ordering::AcqRel);
                self.stats.files.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => self.fail(f, format!("cannot rename into place: {e}")),
        }
    }

    /// Re-read the ranges this session wrote into a device and compare
    /// their segment hashes with the source's digest (without checksums
    /// there is no digest to compare: fsync only).
    fn verify_device(&self, f: &SinkFile, log: &VolumeLog) -> Result<(), String> {
        crate::storage::volume::corrupt_fault(&self.root, &f.rel);
        let dev = self
            .root
            .open_read(&f.rel, false)
            .map_err(|e| format!("cannot reopen device to verify: {e}"))?;
        if !self.checksum {
            return dev.sync_all().map_err(|e| format!("fsync: {e}"));
        }
        // Local copies are compared with the file they were copied from.
        let source = self.storage.local.as_ref().and_then(|b| b.open(f.id).ok());
        let got = log
            .reread_digest(&dev, f.id, source.as_ref())
            .map_err(|e| format!("verification after writing: {e}"))?;
        if got != f.expected.load(Ordering::Acquire) {
            return Err(
                "verification after writing failed: the device does not read back \
                        what was written"
                    .into(),
            );
        }
        Ok(())
    }

    /// Files neither in place nor failed yet (the sink tells the source
    /// it may end the payload when none is left; docs/PROTOCOL.md).
    pub fn unsettled(&self) -> usize {
        self.files
            .iter()
            .filter(|f| f.flags.load(Ordering::Acquire) & (FINAL | FAILED) == 0)
            .count()
    }

    /// `unsettled() == 0`, amortized O(1): the sink asks every 5 ms during
    /// the payload, and a full scan of a 48,000-file table each time cost
    /// more than the rest of its control loop. Settled is final, so the
    /// scan resumes at the first file that was not settled last time.
    pub fn all_settled(&self) -> bool {
        let from = self.settled_upto.load(Ordering::Relaxed);
        let first = self.files[from.min(self.files.len())..]
            .iter()
            .position(|f| f.flags.load(Ordering::Acquire) & (FINAL | FAILED) == 0)
            .map_or(self.files.len(), |i| from + i);
        self.settled_upto.store(first, Ordering::Relaxed);
        first == self.files.len()
    }

    /// Whether file `id` is in place or failed (nothing more to ask for).
    pub fn is_settled(&self, id: u64) -> bool {
        self.get(id)
            .is_some_and(|f| f.flags.load(Ordering::Acquire) & (FINAL | FAILED) != 0)
    }

    /// Whether a file made it to its final name.
    pub fn is_final(&self, f: &SinkFile) -> bool {
        f.flags.load(Ordering::Acquire) & FINAL != 0 && f.piece.is_none()
    }

    /// After the transfer: fail what is incomplete, remove every temp file
    /// left, and list failures as (path, reason).
    pub fn finish(&self) -> Vec<(Vec<u8>, String)> {
        self.finish_keeping(false)
    }

    /// [`Self::finish`]; with `keep_parts` (resume), temp files that hold
    /// data stay for the next run (the journal names them).
    pub fn finish_keeping(&self, keep_parts: bool) -> Vec<(Vec<u8>, String)> {
        let mut out = Vec::new();
        for f in &self.files {
            let fl = f.flags.load(Ordering::Acquire);
            if fl & FINAL != 0 {
                continue;
            }
            // The default journal keeps what the interruption cut short,
            // not files that failed on their own (changed while read...).
            let failed_alone = fl & FAILED != 0 && self.journal_min > 0;
            if fl & FAILED == 0 {
                let w = f.written.load(Ordering::Acquire);
                let why = if w < f.want() {
                    format!("incomplete: received {w} of {} bytes", f.want())
                } else {
                    "source never confirmed the file".into()
                };
                self.fail(f, why);
            }
            self.take_fd(f);
            let keep = keep_parts
                && !failed_alone
                && f.written.load(Ordering::Acquire) > 0
                && f.size >= self.journal_min;
            let fl = f.flags.load(Ordering::Acquire);
            // A piece's temp file is shared with the other sinks of the
            // stripe and holds the verified pieces `--resume` reuses.
            if fl & TEMP != 0 && fl & ANON == 0 && !keep && !f.is_device() && f.piece.is_none() {
                if let Ok(dir) = self.dir_of(f) {
                    let _ = crate::storage::fsops::unlink_in(dir.fd(), &self.tmp_name(f));
                }
            }
            out.push((f.rel.to_vec(), f.reason()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::fsops::Confinement;

    /// A slot per announced file (issue 36): what only some files need
    /// stays out of it (it was ~260 bytes with five locks and a OnceLock).
    #[test]
    fn file_slot_stays_small() {
        let n = std::mem::size_of::<SinkFile>();
        eprintln!("SinkFile: {n} bytes");
        assert!(n <= 160, "SinkFile grew to {n} bytes");
    }

    #[test]
    fn all_settled_follows_files_settling_in_any_order() {
        let d = tempfile::tempdir().unwrap();
        let root = Arc::new(Root::open(d.path(), Confinement::Strict).unwrap());
        let mut t = FileTable::new(root, 1, false, false, Arc::new(Stats::default()));
        for id in 0..4u64 {
            t.push_entry(id, Some((format!("f{id}").into_bytes(), 1, 0o644, (0, 0))));
        }
        assert!(!t.all_settled());
        for id in [2, 0, 3] {
            t.keep(id, false);
            assert!(!t.all_settled());
        }
        t.keep(1, false);
        assert!(t.all_settled());
        assert_eq!(t.unsettled(), 0);
    }

    fn small_table(d: &std::path::Path, hook: crate::storage::Hook) -> FileTable {
        let root = Arc::new(Root::open(d, Confinement::Strict).unwrap());
        let mut cfg = StorageCfg::plain(false, crate::storage::IoEngine::Sync);
        cfg.hook = hook;
        let t = FileTable::new(root, 1, true, false, Arc::new(Stats::default())).with_storage(cfg);
        // Nameless temp files are off by default (tmpfile::enabled).
        t.anon_ok.store(true, Ordering::Relaxed);
        t
    }

    fn names(d: &std::path::Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// Write `data` as file `id` in one segment; its digest.
    fn send(t: &FileTable, id: u64, off: u64, data: &[u8]) -> u64 {
        let seg = Segment {
            file_id: id,
            offset: off,
            len: data.len() as u32,
        };
        let h = ramsys_proto::data::segment_hash(id, off, data);
        t.write_segment(&seg, data, h).unwrap();
        h
    }

    /// Small files are nameless until whole: written, nothing is visible in
    /// the directory; the digest links them under their final names with
    /// their mode and mtime. A trailing hole gives a file its size; an
    /// empty file and an existing final name (replaced) work too.
    #[test]
    fn small_files_appear_only_whole() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/old"), b"previous contents").unwrap();
        let mut t = small_table(d.path(), Default::default());
        t.push_entry(0, Some((b"sub/a".to_vec(), 5, 0o640, (1_000_000, 9))));
        t.push_entry(1, Some((b"sub/old".to_vec(), 3, 0o4755, (7, 0))));
        t.push_entry(2, Some((b"sub/holey".to_vec(), 10_000, 0o644, (8, 0))));
        t.push_entry(3, Some((b"sub/empty".to_vec(), 0, 0o600, (9, 0))));
        let ha = send(&t, 0, 0, b"hello");
        let ho = send(&t, 1, 0, b"new");
        let hh = send(&t, 2, 0, &[5u8; 4096]);
        let hole = Segment::hole(2, 4096, 10_000 - 4096);
        let hole_hash = ramsys_proto::data::marker_hash(&hole);
        t.write_segment(&hole, &[], hole_hash).unwrap();
        // All data is written; no digest yet: nothing new under any name
        // (where the file system has O_TMPFILE).
        if t.anon_ok.load(Ordering::Relaxed) {
            assert_eq!(names(&d.path().join("sub")), vec!["old"]);
            assert_eq!(t.anon_open.load(Ordering::Relaxed), 3);
        }
        t.digest_known(0, ha).unwrap();
        t.digest_known(1, ho).unwrap();
        t.digest_known(2, hh.wrapping_add(hole_hash)).unwrap();
        t.digest_known(3, 0).unwrap();
        assert!(t.finish().is_empty());
        assert_eq!(t.anon_open.load(Ordering::Relaxed), 0);
        let sub = d.path().join("sub");
        assert_eq!(names(&sub), vec!["a", "empty", "holey", "old"]);
        assert_eq!(std::fs::read(sub.join("a")).unwrap(), b"hello");
        assert_eq!(std::fs::read(sub.join("old")).unwrap(), b"new");
        let h = std::fs::read(sub.join("holey")).unwrap();
        assert_eq!(h.len(), 10_000);
        assert!(h[..4096].iter().all(|&b| b == 5) && h[4096..].iter().all(|&b| b == 0));
        let md = std::fs::metadata(sub.join("a")).unwrap();
        assert_eq!(md.mode() & 0o7777, 0o640);
        assert_eq!((md.mtime(), md.mtime_nsec()), (1_000_000, 9));
        let md = std::fs::metadata(sub.join("old")).unwrap();
        assert_eq!(md.mode() & 0o7777, 0o4755, "set-uid needs the fchmod");
        assert_eq!(std::fs::metadata(sub.join("empty")).unwrap().len(), 0);
    }

    /// A file that fails or never completes leaves nothing behind.
    #[test]
    fn incomplete_small_files_leave_nothing() {
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        let mut t = small_table(d.path(), Default::default());
        t.push_entry(0, Some((b"half".to_vec(), 10, 0o644, (0, 0))));
        t.push_entry(1, Some((b"bad".to_vec(), 4, 0o644, (0, 0))));
        send(&t, 0, 0, b"12345");
        let h = send(&t, 1, 0, b"abcd");
        t.digest_known(1, h ^ 1).unwrap();
        let f = t.finish();
        assert_eq!(f.len(), 2, "{f:?}");
        assert!(f.iter().any(|(_, r)| r.contains("checksum")));
        assert!(names(d.path()).is_empty(), "{:?}", names(d.path()));
    }

    /// Past the cap of open nameless files, a file gets a named temp
    /// file (visible only under its temp name until whole); both kinds
    /// land whole, and the cap follows the open-file limit.
    #[test]
    fn past_the_anon_cap_files_get_named_temp_files() {
        assert!(anon_cap() >= 1024);
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        let mut t = small_table(d.path(), Default::default());
        t.anon_cap = 2;
        for (id, n) in [(0, "a"), (1, "b"), (2, "c")] {
            t.push_entry(id, Some((n.as_bytes().to_vec(), 3, 0o644, (5, 0))));
        }
        let h: Vec<u64> = (0..3).map(|id| send(&t, id, 0, b"xyz")).collect();
        if !t.anon_ok.load(Ordering::Relaxed) {
            return; // no O_TMPFILE here: the fallback test covers named files
        }
        assert_eq!(t.anon_open.load(Ordering::Relaxed), 2);
        assert_eq!(names(d.path()), vec![".c.ramsys-0000000000000001.part"]);
        for (id, h) in h.into_iter().enumerate() {
            t.digest_known(id as u64, h).unwrap();
        }
        assert!(t.finish().is_empty());
        assert_eq!(t.anon_open.load(Ordering::Relaxed), 0);
        assert_eq!(names(d.path()), vec!["a", "b", "c"]);
        for n in ["a", "b", "c"] {
            assert_eq!(std::fs::read(d.path().join(n)).unwrap(), b"xyz");
        }
    }

    /// A nameless file of the lane's size gets a second, O_DIRECT
    /// descriptor (counted against the cap) and its size at creation; it
    /// lands whole, and both descriptors are given back.
    #[test]
    fn a_nameless_lane_file_has_two_descriptors() {
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        let root = Arc::new(Root::open(d.path(), Confinement::Strict).unwrap());
        let mut cfg = StorageCfg::plain(true, crate::storage::IoEngine::Sync);
        cfg.lane_bytes = 1 << 20;
        let mut t =
            FileTable::new(root, 1, true, false, Arc::new(Stats::default())).with_storage(cfg);
        t.anon_ok.store(true, Ordering::Relaxed);
        let size = crate::storage::lane_min() as usize + 5000;
        t.push_entry(0, Some((b"mid".to_vec(), size as u64, 0o644, (7, 0))));
        let data: Vec<u8> = (0..size).map(|i| (i * 31 + 7) as u8).collect();
        let h = send(&t, 0, 0, &data);
        if !t.anon_ok.load(Ordering::Relaxed) {
            return; // no O_TMPFILE here
        }
        let fd = t.get(0).unwrap().fd.lock().unwrap().clone().unwrap();
        if fd.direct.is_some() {
            assert!(fd.lane && fd.sized);
            assert_eq!(t.anon_open.load(Ordering::Relaxed), 2);
            assert_eq!(fd.buffered.metadata().unwrap().len(), size as u64);
        } else {
            assert_eq!(t.anon_open.load(Ordering::Relaxed), 1); // O_DIRECT refused here
        }
        drop(fd);
        t.digest_known(0, h).unwrap();
        assert!(t.finish().is_empty());
        assert_eq!(t.anon_open.load(Ordering::Relaxed), 0);
        assert_eq!(std::fs::read(d.path().join("mid")).unwrap(), data);
    }

    struct NoTmpFile;
    impl crate::storage::IoHook for NoTmpFile {
        fn check(&self, op: IoOp, _: &[u8], _: u64, _: usize) -> std::io::Result<()> {
            match op {
                IoOp::TmpFile => Err(std::io::Error::from_raw_os_error(libc::EOPNOTSUPP)),
                _ => Ok(()),
            }
        }
    }

    /// Where O_TMPFILE is refused (injected EOPNOTSUPP), files get named
    /// temp files, renamed into place: the temp name is what is visible
    /// until the file is whole, and nothing is left after.
    #[test]
    fn o_tmpfile_refused_falls_back_to_named_temp_files() {
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        let mut t = small_table(d.path(), crate::storage::Hook(Some(Arc::new(NoTmpFile))));
        t.push_entry(0, Some((b"a".to_vec(), 5, 0o640, (3, 0))));
        t.push_entry(1, Some((b"b".to_vec(), 3, 0o644, (3, 0))));
        t.push_entry(2, Some((b"e".to_vec(), 0, 0o644, (3, 0))));
        let ha = send(&t, 0, 0, b"hello");
        assert!(!t.anon_ok.load(Ordering::Relaxed));
        assert_eq!(names(d.path()), vec![".a.ramsys-0000000000000001.part"]);
        let hb = send(&t, 1, 0, b"xyz");
        t.digest_known(0, ha).unwrap();
        t.digest_known(1, hb).unwrap();
        t.digest_known(2, 0).unwrap();
        assert!(t.finish().is_empty());
        assert_eq!(names(d.path()), vec!["a", "b", "e"]);
        assert_eq!(std::fs::read(d.path().join("a")).unwrap(), b"hello");
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::metadata(d.path().join("a")).unwrap();
        assert_eq!((md.mode() & 0o777, md.mtime()), (0o640, 3));
    }

    /// Resume journals name their temp files: with a journal, small files
    /// are named too, and a short one is completed by its trailing hole.
    #[test]
    fn journalled_files_keep_named_temp_files() {
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        let mut t = small_table(d.path(), Default::default());
        t.resume = true;
        t.journal_min = 0;
        t.push_entry(0, Some((b"j".to_vec(), 8, 0o644, (0, 0))));
        send(&t, 0, 0, b"1234");
        assert_eq!(names(d.path()), vec![".j.ramsys-0000000000000001.part"]);
        assert_eq!(t.journal_rows(true).len(), 1);
    }

    /// A journal tick costs the files written since the last one, not a
    /// walk of the table (issue 36): of 1,000 journalled files, the one
    /// written is the one row, once; the session's end still saves every
    /// unfinished temp file.
    #[test]
    fn journal_ticks_take_only_dirty_files() {
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        let mut t = small_table(d.path(), Default::default());
        t.resume = true;
        t.journal_min = 0;
        for id in 0..1000u64 {
            t.push_entry(id, Some((format!("f{id}").into_bytes(), 8, 0o644, (0, 0))));
        }
        send(&t, 0, 0, b"12");
        send(&t, 1, 0, b"34");
        assert!(
            t.dirty.lock().unwrap().len() <= 2,
            "one entry per dirty file"
        );
        let rows: Vec<_> = t.journal_rows(false).into_iter().map(|r| r.dest).collect();
        assert_eq!(rows, vec![b"f0".to_vec(), b"f1".to_vec()]);
        assert!(t.journal_rows(false).is_empty(), "nothing written since");
        send(&t, 0, 2, b"56");
        assert_eq!(t.journal_rows(false).len(), 1);
        assert_eq!(t.journal_rows(true).len(), 2, "temp files not in place");
    }

    /// Two sessions (two daemons of a stripe) receive the pieces of one big
    /// file into one directory: data outside a piece is a protocol error;
    /// the file appears under its final name, with its mode and mtime, only
    /// when the last piece verified, placed by exactly one of them; a
    /// piece with a bad digest leaves no marker.
    #[test]
    fn pieces_of_one_file_from_two_sessions_meet_and_one_places_it() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let table = |session: u64, pieces: &[u32]| {
            let root = Arc::new(Root::open(d.path(), Confinement::Strict).unwrap());
            let mut t = FileTable::new(root, session, true, false, Arc::new(Stats::default()));
            for (id, &i) in pieces.iter().enumerate() {
                t.push_entry(id as u64, Some((b"big".to_vec(), 10, 0o640, (7, 8))));
                t.set_piece(id as u64, 4, i);
            }
            t
        };
        let data = b"0123456789";
        let piece = |t: &FileTable, id: u64, i: usize| {
            let (o, e) = (i * 4, (i * 4 + 4).min(10));
            send(t, id, o as u64, &data[o..e])
        };
        let a = table(1, &[0, 2]);
        let b = table(2, &[1]);
        let bad = Segment {
            file_id: 0,
            offset: 4,
            len: 1,
        };
        assert!(matches!(
            a.write_segment(&bad, b"x", 0),
            Err(WriteError::Protocol(_))
        ));
        let h0 = piece(&a, 0, 0);
        let h2 = piece(&a, 1, 2);
        a.digest_known(0, h0).unwrap();
        // A corrupt piece: failed, no marker, nothing placed.
        a.digest_known(1, h2 ^ 1).unwrap();
        let h1 = piece(&b, 0, 1);
        b.digest_known(0, h1).unwrap();
        assert!(!d.path().join("big").exists());
        assert_eq!(b.files_moved(), 0);
        // The piece again (a resume's session): the last one, it places it.
        let c = table(3, &[2]);
        let h2 = piece(&c, 0, 2);
        c.digest_known(0, h2).unwrap();
        assert!(a.finish().len() == 1 && b.finish().is_empty() && c.finish().is_empty());
        assert_eq!(std::fs::read(d.path().join("big")).unwrap(), data);
        let md = std::fs::metadata(d.path().join("big")).unwrap();
        assert_eq!(
            (md.mode() & 0o7777, md.mtime(), md.mtime_nsec()),
            (0o640, 7, 8)
        );
        assert_eq!(names(d.path()), vec!["big"]);
        // Counted once, where it was placed; bytes where they arrived.
        assert_eq!((b.files_moved(), c.files_moved()), (0, 1));
        assert_eq!((b.bytes_moved(), c.bytes_moved()), (4, 2));
    }

    /// Local-copy segments make the sink read a file of its own choosing:
    /// only a sink whose source runs in the same process takes them.
    #[test]
    fn local_copy_segments_only_from_an_in_process_source() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("s"), vec![9u8; 3 << 20]).unwrap();
        let root = Arc::new(Root::open(d.path(), Confinement::Strict).unwrap());
        let seg = Segment::copy(0, 0, 3 << 20);
        let hash = ramsys_proto::data::marker_hash(&seg);
        let table = |local| {
            let mut t = FileTable::new(root.clone(), 1, true, false, Arc::new(Stats::default()));
            let mut cfg = StorageCfg::plain(false, crate::storage::IoEngine::Sync);
            cfg.local = local;
            t = t.with_storage(cfg);
            t.push_entry(0, Some((b"d".to_vec(), 3 << 20, 0o644, (0, 0))));
            t
        };
        let network = table(None);
        assert!(matches!(
            network.write_segment(&seg, &[], hash),
            Err(WriteError::Protocol(_))
        ));
        let bridge = Arc::new(crate::storage::local::LocalBridge::default());
        let src = crate::types::file::SourceFile::plain(0, b"s", 3 << 20);
        bridge.publish(root.clone(), Arc::new(vec![src]));
        let local = table(Some(bridge));
        local.write_segment(&seg, &[], hash).unwrap();
        local.digest_known(0, hash).unwrap();
        assert_eq!(
            std::fs::read(d.path().join("d")).unwrap(),
            vec![9u8; 3 << 20]
        );
    }
}
