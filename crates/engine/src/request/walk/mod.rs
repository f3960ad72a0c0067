//! Depth-first scan of the source (seed 000 Fig. 6-4b, step 1).
//!
//! Every entry gets a file id. Directory records are numbered and sent
//! first, then files, symlinks and hard links, so the sink can build the
//! whole tree before any payload arrives. Symlinks are never followed;
//! a second name of an inode already seen becomes a hard-link record.
//! A block device named as a top-level source is a volume (issue 18,
//! storage::volume): a file record of the device's size; met inside a
//! tree, a device node is a special file as before.
//!
//! (Over 800 lines: the two passes share the pending records and the
//! record rules, and an archive walk the same loop; tests in tests.rs.)

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use ramsys_proto::attrs::Attrs;
use ramsys_proto::control::{Entry, EntryKind};

use super::filter::Filter;
use crate::storage::archive::collect::{Collector, Owners};
use crate::types::file::{RelArena, SourceFile};
use crate::types::stats::FailedPath;

/// Result of the scan.
#[derive(Debug, Default)]
pub struct Walk {
    /// Records sent (ids 0..entries; directories first). The records
    /// themselves went to `emit` and are not kept (issue 36).
    pub entries: u64,
    /// Non-directory records with a set-user- or set-group-ID bit.
    pub setid: u64,
    /// Regular files, in id order.
    pub files: Vec<SourceFile>,
    pub failures: Vec<FailedPath>,
    pub total_bytes: u64,
}

/// A top-level source: path relative to the root, and the name its tree
/// gets on the wire.
#[derive(Debug, Clone)]
pub struct Top {
    pub rel: Vec<u8>,
    pub name: Vec<u8>,
}

struct Pending {
    wire: Vec<u8>,
    rel: Vec<u8>,
    kind: PendingKind,
    mode: u32,
    mtime: (i64, u32),
    owners: Owners,
}

enum PendingKind {
    Dir,
    File {
        size: u64,
        dev: u64,
        ino: u64,
        nlink: u64,
        volume: bool,
        sparse: bool,
    },
    Symlink(Vec<u8>),
    /// A FIFO, socket or device the user asked for (crate::storage::archive).
    Special(EntryKind),
}

fn join(a: &[u8], b: &[u8]) -> Vec<u8> {
    if a.is_empty() {
        return b.to_vec();
    }
    let mut v = Vec::with_capacity(a.len() + 1 + b.len());
    v.extend_from_slice(a);
    // A top named with its trailing '/' (`SRC/`) has one already.
    if !a.ends_with(b"/") {
        v.push(b'/');
    }
    v.extend_from_slice(b);
    v
}

/// Scan `tops` under `base` (the root directory on disk), keeping every
/// record (a whole listing: for small trees and tests).
pub fn walk(base: &Path, tops: &[Top], recursive: bool) -> (Walk, Vec<Entry>) {
    let mut all = Vec::new();
    let r: Result<Walk, std::convert::Infallible> =
        walk_streamed(base, tops, recursive, &Filter::all(), &mut |es| {
            all.extend_from_slice(es);
            Ok(())
        });
    match r {
        Ok(w) => (w, all),
        Err(e) => match e {},
    }
}

/// Records per [`walk_streamed`] emission: small enough that the sink
/// starts on the first batch while the scan goes on.
pub const STREAM_BATCH: usize = 1024;

/// A scan that has sent nothing for this long hands `emit` an empty batch
/// (the source sends it as an empty Entries message): the sink's idle
/// timeout waits for a word from the source, and a directory pass over
/// millions of cold entries must not outgrow it (issue 36).
pub const SCAN_KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(2);

/// Fault injection for the timeout tests: `RAMSYS_FAULT_SLOW_SCAN_MS=N`
/// sleeps N ms per directory of the directory pass (a cold or remote file
/// system's scan).
fn slow_scan_fault() {
    static MS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let ms = *MS.get_or_init(|| {
        std::env::var("RAMSYS_FAULT_SLOW_SCAN_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    });
    if ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// When the scan last said something; `due` once [`SCAN_KEEPALIVE`] passed.
struct Pace(std::time::Instant);

impl Pace {
    fn due(&self) -> bool {
        self.0.elapsed() >= SCAN_KEEPALIVE
    }
    fn said(&mut self) {
        self.0 = std::time::Instant::now();
    }
}

/// What the directory pass leaves to the second, in scan order.
enum Deferred {
    /// Already stat'ed: a top-level file, symlink or device.
    Ready(Box<Pending>),
    /// The non-directory names of `dirs[i]`: the second pass reads the
    /// directory again (issue 36: the first pass keeps nothing per file,
    /// so a scan's memory follows its directories, not its files; one
    /// more getdents per directory is the cost).
    Dir(u32),
    /// The listed non-directory names of `dirs[i]` (`--files-from`), a
    /// bit per name of the list's children of that directory: stat'ed
    /// again by the second pass (`listed_again`).
    Listed(u32, Box<[u64]>),
}

/// The directory pass's list for the second (docs/SCALE.md "Windows"
/// step 2): one slot per top-level non-directory and per directory that
/// holds something else than directories. (It was a packed name per file,
/// ~30 B a file at 1 M files.)
#[derive(Default)]
struct Later {
    items: Vec<Deferred>,
}

impl Later {
    fn ready(&mut self, p: Pending) {
        self.items.push(Deferred::Ready(Box::new(p)));
    }

    fn dir(&mut self, dir: usize) {
        self.items.push(Deferred::Dir(dir as u32));
    }

    fn listed(&mut self, dir: usize, take: Box<[u64]>) {
        self.items.push(Deferred::Listed(dir as u32, take));
    }
}

/// [`walk`], handing records to `emit` as they are ready (seed 000 Fig.
/// 6-4b: metadata streams while the scan runs): a first pass reads only
/// directories (getdents; the entry type comes with the name) and emits
/// every directory record, then a second pass stats the other entries,
/// one directory descriptor at a time, and emits them in batches of
/// [`STREAM_BATCH`]. Ids and order are those of a plain walk: directories
/// first, then everything else in scan order. An `emit` error stops the
/// scan and is returned. What `filter` leaves out is not sent (and an
/// excluded directory is not descended).
pub fn walk_streamed<E>(
    base: &Path,
    tops: &[Top],
    recursive: bool,
    filter: &Filter,
    emit: &mut dyn FnMut(&[Entry]) -> Result<(), E>,
) -> Result<Walk, E> {
    walk_archive(base, tops, recursive, filter, 0, &mut |es, _| emit(es))
}

/// Where [`walk_archive`] hands each batch of records and their Attrs.
pub type ArchiveEmit<'a, E> = dyn FnMut(&[Entry], &[Attrs]) -> Result<(), E> + 'a;

/// [`walk_streamed`] for an archive copy: `preserve` bits
/// (proto::attrs::preserve) say which special files become records and
/// what each entry's Attrs record holds; each batch of records is handed
/// to `emit` with the Attrs of its entries (crate::storage::archive::collect).
pub fn walk_archive<E>(
    base: &Path,
    tops: &[Top],
    recursive: bool,
    filter: &Filter,
    preserve: u32,
    emit: &mut ArchiveEmit<E>,
) -> Result<Walk, E> {
    let mut emit =
        |es: &[Entry], attrs: &[Attrs], _: &mut Vec<SourceFile>, _: &mut Vec<u64>| emit(es, attrs);
    let how = (preserve, false, STREAM_BATCH);
    walk_inner(base, tops, recursive, filter, how, &mut emit)
}

/// [`walk_streamed`] for a windowed session (issue 36): each batch of
/// records is handed over with the regular files it names (the scan keeps
/// none) and, for an archive copy (`preserve`, as [`walk_archive`]), the
/// Attrs of its entries; a second name of an inode is a LinkTo that
/// carries its target's path (kept only for inodes of several names). The
/// Walk it returns has no files. Batches of at most `batch` records (a
/// window holds several). Each batch also names the directories done
/// since the last one (ids of Dir records every entry of which is now
/// handed over, so a `--delete` sink may delete their extras: [`Done`]).
pub fn walk_handing<E>(
    base: &Path,
    tops: &[Top],
    (recursive, batch, preserve): (bool, usize, u32),
    filter: &Filter,
    emit: &mut HandEmit<E>,
) -> Result<Walk, E> {
    let mut emit =
        |es: &[Entry], attrs: &[Attrs], files: &mut Vec<SourceFile>, done: &mut Vec<u64>| {
            emit(es, attrs, std::mem::take(files), std::mem::take(done))
        };
    let how = (preserve, true, batch.clamp(1, STREAM_BATCH));
    walk_inner(base, tops, recursive, filter, how, &mut emit)
}

/// Where [`walk_handing`] hands each batch of records, their Attrs, their
/// files and the directories done.
pub type HandEmit<'a, E> =
    dyn FnMut(&[Entry], &[Attrs], Vec<SourceFile>, Vec<u64>) -> Result<(), E> + 'a;

/// Where [`walk_inner`] hands each batch: records, their Attrs, the file
/// list so far and the directories done (both taken by a handing walk).
type InnerEmit<'a, E> =
    dyn FnMut(&[Entry], &[Attrs], &mut Vec<SourceFile>, &mut Vec<u64>) -> Result<(), E> + 'a;

/// The scan behind [`walk_archive`] and [`walk_handing`] (`hand`).
fn walk_inner<E>(
    base: &Path,
    tops: &[Top],
    recursive: bool,
    filter: &Filter,
    (preserve, hand, batch_len): (u32, bool, usize),
    emit: &mut InnerEmit<E>,
) -> Result<Walk, E> {
    let mut col = Collector::new(preserve);
    let mut out = Outbox {
        entries: Vec::new(),
        attrs: Vec::new(),
        done: Vec::new(),
        pace: Pace(std::time::Instant::now()),
    };
    let first = (base, tops, recursive, filter);
    let (dirs, later, failures) = paced_first_pass(first, &col, &mut out.pace, emit)?;
    let mut w = Walk {
        failures,
        ..Default::default()
    };
    // Several tops may name one path (`a/ b/ DST`, or one source named
    // twice): the list keeps one entry per path, as rsync's does (its
    // flist_sort_and_clean): a directory over anything else, else the
    // first; a directory named again merges its contents and keeps the
    // first one's attributes (issue 35). All directories are known before
    // any other record goes out, so a later directory still wins.
    let mut dup = Dedup::new(tops.len() > 1);
    let ids = emit_dirs(base, &dirs, &mut dup, &mut col, &mut w, &mut out, emit)?;
    let mut done = Done::new(&dirs, ids, &later, w.failures.is_empty());
    done.start(&mut out.done);
    let mut second = SecondPass {
        base,
        filter,
        hand,
        batch_len,
        dup,
        inodes: Inodes {
            first: HashMap::new(),
            by_path: hand,
        },
        arena: RelArena::default(),
        out,
    };
    for d in later.items {
        let to = done.target(&d);
        match d {
            Deferred::Ready(p) => second.take(*p, &mut w, &mut col, emit)?,
            Deferred::Listed(i, take) => {
                let dir = &dirs[i as usize];
                let names = filter.listed_children(&dir.wire).unwrap_or_default();
                for (k, name) in names.iter().enumerate() {
                    let at = (k, name.as_slice());
                    let fc = (filter, &col);
                    if let Some(p) = listed_again(base, dir, at, &take, fc, &mut w.failures) {
                        second.take(p, &mut w, &mut col, emit)?;
                    }
                }
            }
            Deferred::Dir(i) => {
                let dir = &dirs[i as usize];
                let Some(mut names) = DirNames::open(base, dir, &mut w.failures) else {
                    continue;
                };
                while let Some(p) = names.next(base, dir, filter, &col, &mut w.failures) {
                    second.take(p, &mut w, &mut col, emit)?;
                }
            }
        }
        done.item(to, w.failures.is_empty(), &mut second.out.done);
    }
    second.finish(&mut w, emit)?;
    w.files.shrink_to_fit();
    Ok(w)
}

/// The batch being emitted, the only records held (issue 36: none kept
/// once sent), with their Attrs and the directories done once they are
/// out; and when the scan last said something.
struct Outbox {
    entries: Vec<Entry>,
    attrs: Vec<Attrs>,
    done: Vec<u64>,
    pace: Pace,
}

/// Which directories are done (docs/PROTOCOL.md "Directories done"): a
/// directory's entries are its subdirectories (sent first, with every
/// directory) and the non-directories of each second-pass item that
/// lands in it: its `Deferred::Dir` or `Deferred::Listed` (`--files-from`)
/// slot, that of a directory of another top merged with it (`a/ b/ DST`),
/// or a top-level file whose parent it is. Once the last such item is
/// handed over, it is done. After any scan failure no directory is (an
/// unread name must not be deleted at the sink: rsync's "IO error
/// encountered -- skipping file deletion"); the sink deletes in those at
/// the end, by today's rules. What it holds is a count per directory.
struct Done {
    /// Per directory (index of the first pass's list): its record's id.
    ids: Vec<u64>,
    /// Per record id of a directory: second-pass items still to come.
    left: Vec<u32>,
    /// Wire path -> id of a directory, only when a second-pass item of
    /// its own (a top-level file, a listed name) may land in one.
    by_wire: HashMap<Vec<u8>, u64>,
    /// No failure so far: directories may still be done.
    clean: bool,
}

impl Done {
    fn new(dirs: &[Pending], ids: Vec<u64>, later: &Later, clean: bool) -> Done {
        let mut d = Done {
            left: vec![0; ids.iter().map(|&i| i as usize + 1).max().unwrap_or(0)],
            ids,
            by_wire: HashMap::new(),
            clean,
        };
        if later.items.iter().any(|i| matches!(i, Deferred::Ready(_))) {
            for (p, &id) in dirs.iter().zip(&d.ids) {
                d.by_wire.insert(p.wire.clone(), id);
            }
        }
        for item in &later.items {
            if let Some(id) = d.target(item) {
                d.left[id as usize] += 1;
            }
        }
        d
    }

    /// The directory (record id) a second-pass item lands in, if sent.
    fn target(&self, item: &Deferred) -> Option<u64> {
        match item {
            Deferred::Dir(i) | Deferred::Listed(i, _) => Some(self.ids[*i as usize]),
            Deferred::Ready(p) => {
                let parent = match p.wire.iter().rposition(|&b| b == b'/') {
                    Some(i) => &p.wire[..i],
                    None => &[][..],
                };
                self.by_wire.get(parent).copied()
            }
        }
    }

    /// Directories with nothing for the second pass: done at once.
    fn start(&mut self, out: &mut Vec<u64>) {
        if self.clean {
            let mut seen = vec![false; self.left.len()];
            for &id in &self.ids {
                if self.left[id as usize] == 0 && !std::mem::replace(&mut seen[id as usize], true) {
                    out.push(id);
                }
            }
        }
    }

    /// A second-pass item handed over (`clean`: no failure so far).
    fn item(&mut self, to: Option<u64>, clean: bool, out: &mut Vec<u64>) {
        self.clean &= clean;
        let Some(id) = to else { return };
        let left = &mut self.left[id as usize];
        *left -= 1;
        if *left == 0 && self.clean {
            out.push(id);
        }
    }
}

/// [`first_pass`] (`first`: base, tops, recursive, filter), which emits
/// nothing until it ends: it says it is alive with an empty batch each
/// [`SCAN_KEEPALIVE`]; an `emit` error stops it and is returned.
fn paced_first_pass<E>(
    (base, tops, recursive, filter): (&Path, &[Top], bool, &Filter),
    col: &Collector,
    pace: &mut Pace,
    emit: &mut InnerEmit<E>,
) -> Result<(Vec<Pending>, Later, Vec<FailedPath>), E> {
    let mut stopped = None;
    let mut alive = || {
        if pace.due() {
            pace.said();
            if let Err(e) = emit(&[], &[], &mut Vec::new(), &mut Vec::new()) {
                stopped = Some(e);
            }
        }
        stopped.is_none()
    };
    let found = first_pass(base, tops, recursive, filter, col, &mut alive);
    match stopped {
        Some(e) => Err(e),
        None => Ok(found),
    }
}

/// The directory records, numbered first (ids from 0) and emitted in one
/// batch, so the sink builds the tree before any other record (seed 000
/// Fig. 6-4b).
fn emit_dirs<E>(
    base: &Path,
    dirs: &[Pending],
    dup: &mut Dedup,
    col: &mut Collector,
    w: &mut Walk,
    out: &mut Outbox,
    emit: &mut InnerEmit<E>,
) -> Result<Vec<u64>, E> {
    // Each directory's record id (one named again: the first one's).
    let mut ids = Vec::with_capacity(dirs.len());
    for d in dirs.iter() {
        let i = out.entries.len();
        if let Some(first) = dup.dir(&d.wire, i as u64) {
            ids.push(first);
            continue;
        }
        ids.push(i as u64);
        out.entries.push(Entry {
            id: i as u64,
            path: d.wire.clone(),
            kind: EntryKind::Dir,
            mode: d.mode,
            mtime_s: d.mtime.0,
            mtime_ns: d.mtime.1,
        });
        if col.wanted() {
            let a = col.attrs(i as u64, &abs(base, &d.rel), &d.owners, false, true);
            out.attrs.push(a);
        }
    }
    w.entries = out.entries.len() as u64;
    if !out.entries.is_empty() {
        emit(&out.entries, &out.attrs, &mut w.files, &mut Vec::new())?;
        out.pace.said();
    }
    out.entries.clear();
    out.attrs.clear();
    Ok(ids)
}

/// The second pass: every non-directory record, in scan order, batched.
struct SecondPass<'a> {
    base: &'a Path,
    filter: &'a Filter,
    /// A handing walk: the files leave with their batch.
    hand: bool,
    batch_len: usize,
    dup: Dedup,
    inodes: Inodes,
    arena: RelArena,
    out: Outbox,
}

impl SecondPass<'_> {
    /// One record: listed, and its batch handed over when full or when
    /// the peer has waited long enough.
    fn take<E>(
        &mut self,
        o: Pending,
        w: &mut Walk,
        col: &mut Collector,
        emit: &mut InnerEmit<E>,
    ) -> Result<(), E> {
        if !self.dup.other(&o.wire) {
            return Ok(());
        }
        let id = w.entries;
        let symlink = matches!(o.kind, PendingKind::Symlink(_));
        let attrs_of = col.wanted().then(|| (abs(self.base, &o.rel), o.owners));
        let links = (&mut self.inodes, &mut self.arena);
        if !record(w, &mut self.out.entries, o, id, self.filter, links) {
            return Ok(());
        }
        if let Some((path, owners)) = attrs_of {
            let a = col.attrs(id, &path, &owners, symlink, false);
            self.out.attrs.push(a);
        }
        // A slow file system's stats send what they have (or nothing, as
        // a keepalive) before the sink's idle timeout.
        let out = &mut self.out;
        if out.entries.len() >= self.batch_len || out.pace.due() {
            if self.hand {
                // The files leave with their batch: their paths first.
                self.arena.seal(&mut w.files);
            }
            emit(&out.entries, &out.attrs, &mut w.files, &mut out.done)?;
            out.entries.clear();
            out.attrs.clear();
            out.pace.said();
        }
        Ok(())
    }

    /// The last batch, and the paths of every file listed.
    fn finish<E>(mut self, w: &mut Walk, emit: &mut InnerEmit<E>) -> Result<(), E> {
        self.arena.seal(&mut w.files);
        let out = &mut self.out;
        if !out.entries.is_empty() || !out.done.is_empty() {
            emit(&out.entries, &out.attrs, &mut w.files, &mut out.done)?;
        }
        Ok(())
    }
}

/// The first name of each inode with several (its id, and its wire path
/// where second names carry it: a handing walk's LinkTo records).
struct Inodes {
    first: HashMap<(u64, u64), (u64, Vec<u8>)>,
    by_path: bool,
}

/// Which wire paths are listed already, when several tops could name the
/// same one (see [`walk_archive`]).
struct Dedup {
    on: bool,
    /// Wire path -> record id.
    dirs: HashMap<Vec<u8>, u64>,
    others: HashSet<Vec<u8>>,
}

impl Dedup {
    fn new(on: bool) -> Dedup {
        Dedup {
            on,
            dirs: HashMap::new(),
            others: HashSet::new(),
        }
    }

    /// Whether to list a directory at `wire` as record `id`: None, or
    /// Some(the id of the directory listed at that path already).
    fn dir(&mut self, wire: &[u8], id: u64) -> Option<u64> {
        if !self.on {
            return None;
        }
        match self.dirs.entry(wire.to_vec()) {
            std::collections::hash_map::Entry::Occupied(e) => Some(*e.get()),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(id);
                None
            }
        }
    }

    /// Whether to list a non-directory at `wire`: no directory and no
    /// earlier entry has that path.
    fn other(&mut self, wire: &[u8]) -> bool {
        !self.on || (!self.dirs.contains_key(wire) && self.others.insert(wire.to_vec()))
    }
}

/// First pass over the tops: directories (stat'ed and recursed into) and
/// the names of everything else, in scan order; a block device named as
/// a top is a volume (issue 18).
fn first_pass(
    base: &Path,
    tops: &[Top],
    recursive: bool,
    filter: &Filter,
    col: &Collector,
    alive: &mut dyn FnMut() -> bool,
) -> (Vec<Pending>, Later, Vec<FailedPath>) {
    let mut dirs: Vec<Pending> = Vec::new();
    let mut later = Later::default();
    let mut failures = Vec::new();
    for t in tops {
        let path = abs(base, &t.rel);
        // Our own working files are not read through a session (issue 34).
        let (_, last) = crate::storage::fsops::split_parent(&t.rel);
        if crate::request::reserved::is_reserved(last)
            || crate::request::reserved::is_reserved(&t.name)
        {
            failures.push(FailedPath::new(
                path.display().to_string(),
                crate::request::reserved::REFUSED,
            ));
            continue;
        }
        match fs::symlink_metadata(&path) {
            Ok(md) if filter.excluded(&t.name, md.is_dir()) => {}
            // A device named as a source means its contents (issue 18);
            // inside a tree, devices stay special files.
            Ok(md) if crate::storage::volume::is_block(&md) => {
                match volume_top(&path, &t.rel, &t.name, &md) {
                    Ok(p) => later.ready(p),
                    Err(e) => failures.push(FailedPath::io(
                        path.display().to_string(),
                        format!("cannot read block device size: {e}"),
                        &e,
                    )),
                }
            }
            Ok(md) => {
                if md.is_dir() && !recursive {
                    failures.push(FailedPath::new(
                        path.display().to_string(),
                        "is a directory (use -r to copy directories)",
                    ));
                    continue;
                }
                let mut to = Found {
                    dirs: &mut dirs,
                    later: &mut later,
                    failures: &mut failures,
                    col,
                    alive: &mut *alive,
                };
                scan(base, &t.rel, &t.name, md, filter, &mut to);
            }
            Err(e) => failures.push(FailedPath::io(
                path.display().to_string(),
                e.to_string(),
                &e,
            )),
        }
    }
    (dirs, later, failures)
}

/// Second pass over one directory: its entries read again through a
/// descriptor (opened once, never through a symlink put in its place
/// since the first pass), each non-directory lstat'ed relative to it. The
/// first pass's rules again: our reserved names skipped, the filter
/// applied. A name created since the first pass is listed, one removed
/// since is not (either is a change during the scan).
struct DirNames {
    fd: fs::File,
    entries: rustix::fs::Dir,
}

impl DirNames {
    fn open(base: &Path, dir: &Pending, failures: &mut Vec<FailedPath>) -> Option<DirNames> {
        let path = abs(base, &dir.rel);
        let opened = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(&path)
            .and_then(|fd| {
                // The Dir reads a dup of its own (same offset: at 0 here).
                let dup = rustix::io::fcntl_dupfd_cloexec(&fd, 0)?;
                Ok(DirNames {
                    entries: rustix::fs::Dir::new(dup)?,
                    fd,
                })
            });
        match opened {
            Ok(d) => Some(d),
            Err(e) => {
                let reason = format!("cannot read directory: {e}");
                failures.push(FailedPath::io(path.display().to_string(), reason, &e));
                None
            }
        }
    }

    /// The next non-directory's record (None at the end, or after a read
    /// error, which is a failure of the directory).
    fn next(
        &mut self,
        base: &Path,
        dir: &Pending,
        filter: &Filter,
        col: &Collector,
        failures: &mut Vec<FailedPath>,
    ) -> Option<Pending> {
        use rustix::fs::FileType;
        loop {
            let ent = match self.entries.next()? {
                Ok(ent) => ent,
                Err(e) => {
                    let e = std::io::Error::from(e);
                    let path = abs(base, &dir.rel).display().to_string();
                    let reason = format!("cannot read directory: {e}");
                    failures.push(FailedPath::io(path, reason, &e));
                    return None;
                }
            };
            let name = ent.file_name().to_bytes();
            let dirlike = ent.file_type() == FileType::Directory;
            if dirlike
                || name == b"."
                || name == b".."
                || crate::request::reserved::is_reserved(name)
            {
                continue;
            }
            let (rel, wire) = (join(&dir.rel, name), join(&dir.wire, name));
            // The type without a stat where the file system gives it; the
            // record needs the stat anyway.
            if ent.file_type() != FileType::Unknown && filter.excluded(&wire, false) {
                continue;
            }
            let fd = std::os::fd::AsFd::as_fd(&self.fd);
            let e = match crate::storage::fsops::lstat_at(fd, name) {
                Ok(Some(st)) if crate::storage::fsops::is_dir(&st) => continue,
                Ok(Some(_)) if filter.excluded(&wire, false) => continue,
                Ok(Some(st)) => match pending(base, rel, wire, &Meta::from(&st), col, failures) {
                    Some(p) => return Some(p),
                    None => continue,
                },
                // Removed since this read: not a failure (as if removed
                // before the scan).
                Ok(None) => continue,
                Err(e) => e,
            };
            let path = abs(base, &rel).display().to_string();
            failures.push(FailedPath::io(path, e.to_string(), &e));
        }
    }
}

/// Push the record of a non-directory (a regular file is also listed to
/// read). False when it needs no Attrs record: the size limits left it
/// out, or it is a further name of a file already listed (a HardLink
/// record).
fn record(
    w: &mut Walk,
    batch: &mut Vec<Entry>,
    o: Pending,
    id: u64,
    filter: &Filter,
    (inodes, arena): (&mut Inodes, &mut RelArena),
) -> bool {
    let kind = match o.kind {
        PendingKind::Dir => unreachable!("directories are numbered first"),
        PendingKind::File {
            size,
            dev,
            ino,
            nlink,
            volume,
            sparse,
        } => {
            if filter.size_excluded(size) {
                return false;
            }
            if let Some(ps) = filter.pieces.as_ref().and_then(|p| p.get(&o.wire)) {
                // A striped push's pieces of a big file (issue 19): a
                // Piece record each, all cut from the version the agent
                // dealt (another version's pieces would never add up).
                if (size, o.mtime) != (ps.size, ps.mtime) || nlink > 1 {
                    w.failures.push(FailedPath::new(
                        crate::types::error::show(&o.wire),
                        "changed since the stripes were dealt; run again with --resume",
                    ));
                    return false;
                }
                for &index in &ps.indices {
                    let kind = EntryKind::Piece {
                        size,
                        piece: ps.piece,
                        index,
                    };
                    let Some(range) = kind.piece_range() else {
                        continue;
                    };
                    let id = w.entries;
                    w.total_bytes += range.1;
                    let rel = arena.add(&mut w.files, &o.rel);
                    w.files.push(SourceFile {
                        id,
                        rel,
                        size,
                        dev,
                        ino,
                        mtime: o.mtime,
                        volume,
                        sparse,
                        range: Some(Box::new(range)),
                    });
                    push_entry(w, batch, id, o.wire.clone(), kind, o.mode, o.mtime);
                }
                // No Attrs: an archive copy does not cut files.
                return false;
            }
            if nlink > 1 {
                if let Some((first, path)) = inodes.first.get(&(dev, ino)) {
                    let link = match inodes.by_path {
                        true => EntryKind::LinkTo {
                            target_id: *first,
                            target: path.clone(),
                        },
                        false => EntryKind::HardLink { target_id: *first },
                    };
                    push_entry(w, batch, id, o.wire, link, o.mode, o.mtime);
                    return false;
                }
                let path = if inodes.by_path {
                    o.wire.clone()
                } else {
                    Vec::new()
                };
                inodes.first.insert((dev, ino), (id, path));
            }
            w.total_bytes += size;
            let rel = arena.add(&mut w.files, &o.rel);
            w.files.push(SourceFile {
                id,
                rel,
                size,
                dev,
                ino,
                mtime: o.mtime,
                volume,
                sparse,
                range: None,
            });
            EntryKind::File { size }
        }
        PendingKind::Symlink(t) => EntryKind::Symlink { target: t },
        PendingKind::Special(k) => k,
    };
    push_entry(w, batch, id, o.wire, kind, o.mode, o.mtime);
    true
}

fn push_entry(
    w: &mut Walk,
    batch: &mut Vec<Entry>,
    id: u64,
    path: Vec<u8>,
    kind: EntryKind,
    mode: u32,
    mtime: (i64, u32),
) {
    w.entries += 1;
    w.setid += (mode & 0o6000 != 0) as u64;
    batch.push(Entry {
        id,
        path,
        kind,
        mode,
        mtime_s: mtime.0,
        mtime_ns: mtime.1,
    });
}

/// The record of a block device named as a top-level source: a regular
/// file of the device's size (BLKGETSIZE64), on the device's own queue.
fn volume_top(path: &Path, rel: &[u8], wire: &[u8], md: &fs::Metadata) -> std::io::Result<Pending> {
    let size = crate::storage::volume::device_size_at(path)?;
    Ok(Pending {
        wire: wire.to_vec(),
        rel: rel.to_vec(),
        kind: PendingKind::File {
            size,
            dev: md.rdev(),
            ino: md.ino(),
            nlink: 1,
            volume: true,
            sparse: false,
        },
        mode: md.mode() & 0o7777,
        mtime: (md.mtime(), md.mtime_nsec() as u32),
        owners: owners_of(md),
    })
}

/// The fields of a stat the scan uses.
struct Meta {
    fmt: u32,
    mode: u32,
    mtime: (i64, u32),
    size: u64,
    dev: u64,
    ino: u64,
    nlink: u64,
    /// 512-byte blocks allocated.
    blocks: u64,
    owners: Owners,
    rdev: u64,
}

impl From<&crate::storage::fsops::Stat> for Meta {
    fn from(st: &crate::storage::fsops::Stat) -> Self {
        Meta {
            fmt: st.st_mode & libc::S_IFMT,
            mode: st.st_mode & 0o7777,
            mtime: (st.st_mtime, st.st_mtime_nsec as u32),
            size: st.st_size as u64,
            dev: st.st_dev,
            ino: st.st_ino,
            nlink: st.st_nlink,
            blocks: st.st_blocks as u64,
            owners: Owners {
                uid: st.st_uid,
                gid: st.st_gid,
                atime: (st.st_atime, st.st_atime_nsec as u32),
            },
            rdev: st.st_rdev,
        }
    }
}

impl From<&fs::Metadata> for Meta {
    fn from(md: &fs::Metadata) -> Self {
        Meta {
            fmt: md.mode() & libc::S_IFMT,
            mode: md.mode() & 0o7777,
            mtime: (md.mtime(), md.mtime_nsec() as u32),
            size: md.len(),
            dev: md.dev(),
            ino: md.ino(),
            nlink: md.nlink(),
            blocks: md.blocks(),
            owners: owners_of(md),
            rdev: md.rdev(),
        }
    }
}

fn owners_of(md: &fs::Metadata) -> Owners {
    Owners {
        uid: md.uid(),
        gid: md.gid(),
        atime: (md.atime(), md.atime_nsec() as u32),
    }
}

fn abs(base: &Path, rel: &[u8]) -> PathBuf {
    if rel.is_empty() {
        base.to_path_buf()
    } else {
        base.join(std::ffi::OsStr::from_bytes(rel))
    }
}

/// Where the first pass puts what it finds.
struct Found<'a> {
    dirs: &'a mut Vec<Pending>,
    later: &'a mut Later,
    failures: &'a mut Vec<FailedPath>,
    col: &'a Collector,
    /// Called per directory: false once the peer is gone (stop scanning).
    alive: &'a mut dyn FnMut() -> bool,
}

/// First pass: directories (stat'ed, recursed into) and the names of
/// everything else, in scan order.
fn scan(base: &Path, rel: &[u8], wire: &[u8], md: fs::Metadata, filter: &Filter, to: &mut Found) {
    if !md.is_dir() {
        if let Some(p) = pending(
            base,
            rel.to_vec(),
            wire.to_vec(),
            &Meta::from(&md),
            to.col,
            to.failures,
        ) {
            to.later.ready(p);
        }
        return;
    }
    slow_scan_fault();
    if !(to.alive)() {
        return;
    }
    let me = to.dirs.len();
    to.dirs.push(Pending {
        wire: wire.to_vec(),
        rel: rel.to_vec(),
        kind: PendingKind::Dir,
        mode: md.mode() & 0o7777,
        mtime: (md.mtime(), md.mtime_nsec() as u32),
        owners: owners_of(&md),
    });
    if let Some(names) = filter.listed_children(wire) {
        return scan_listed(base, (rel, wire, me), names, filter, to);
    }
    let path = abs(base, rel);
    let rd = match fs::read_dir(&path) {
        Ok(rd) => rd,
        Err(e) => {
            let reason = format!("cannot read directory: {e}");
            to.failures
                .push(FailedPath::io(path.display().to_string(), reason, &e));
            return;
        }
    };
    let mut others = false;
    for de in rd {
        let de = match de {
            Ok(d) => d,
            Err(e) => {
                let reason = format!("cannot read directory: {e}");
                to.failures
                    .push(FailedPath::io(path.display().to_string(), reason, &e));
                // Not read again: one failure for the directory.
                others = false;
                break;
            }
        };
        let name = de.file_name();
        let name = name.as_bytes();
        // Our own working files (crate::request::reserved): never part of a tree
        // sent, as `--delete` never removes them (issue 34).
        if crate::request::reserved::is_reserved(name) {
            continue;
        }
        // The type comes with the name (d_type); where the file system
        // gives none, std stats it here.
        let is_dir = match de.file_type() {
            Ok(ft) => ft.is_dir(),
            Err(e) => {
                let path = abs(base, &join(rel, name)).display().to_string();
                to.failures.push(FailedPath::io(path, e.to_string(), &e));
                continue;
            }
        };
        if filter.excluded(&join(wire, name), is_dir) {
            continue;
        }
        if !is_dir {
            // Read again, with the others, by the second pass.
            others = true;
            continue;
        }
        let crel = join(rel, name);
        match de.metadata() {
            Ok(cmd) => scan(base, &crel, &join(wire, name), cmd, filter, to),
            Err(e) => {
                let path = abs(base, &crel).display().to_string();
                to.failures.push(FailedPath::io(path, e.to_string(), &e))
            }
        }
    }
    if others {
        to.later.dir(me);
    }
}

/// A directory that only leads to `--files-from` paths: stat the listed
/// names in it instead of reading it whole (request::filter
/// `listed_children`); a listed name that is not there (removed since it
/// was listed, as in a replication batch, Filter::listed_may_vanish) is a
/// vanished path (rsync's IOERR_VANISHED: reported, --delete still runs):
/// a watch job learns so that the batch read a name a late rename event
/// took away (docs/WATCH.md "Vanished paths"). A name the user listed that
/// is not there is a failure (rsync's link_stat error, exit 23).
fn scan_listed(
    base: &Path,
    (rel, wire, me): (&[u8], &[u8], usize),
    names: Vec<Vec<u8>>,
    filter: &Filter,
    to: &mut Found,
) {
    // The non-directories are stat'ed again by the second pass, which
    // finds them by their index in this same list: a bit each here, where
    // a record each (~150 B a listed file, all held until the directory
    // pass ended) made a list of 1 M paths cost ~300 MB (issue 36).
    let mut take = vec![0u64; names.len().div_ceil(64)];
    for (k, name) in names.into_iter().enumerate() {
        let crel = join(rel, &name);
        let cwire = join(wire, &name);
        let md = match listed_stat(base, &crel, filter, to.failures) {
            Some(md) => md,
            None => continue,
        };
        if filter.excluded(&cwire, md.is_dir()) {
            continue;
        }
        if md.is_dir() {
            scan(base, &crel, &cwire, md, filter, to);
        } else {
            take[k / 64] |= 1 << (k % 64);
        }
    }
    if take.iter().any(|&b| b != 0) {
        to.later.listed(me, take.into_boxed_slice());
    }
}

/// A listed name's lstat, or None with its failure recorded: a name gone
/// from a replication batch is a vanished path the job learns from
/// (docs/WATCH.md); a path the user listed that is not there is rsync's
/// `link_stat ... failed` (IOERR_GENERAL, exit 23: --delete deletes
/// nothing).
fn listed_stat(
    base: &Path,
    rel: &[u8],
    filter: &Filter,
    failures: &mut Vec<FailedPath>,
) -> Option<fs::Metadata> {
    match fs::symlink_metadata(abs(base, rel)) {
        Ok(md) => Some(md),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && filter.listed_may_vanish => {
            let path = abs(base, rel).display().to_string();
            failures.push(FailedPath::io(path, e.to_string(), &e));
            None
        }
        Err(e) => {
            let path = abs(base, rel).display().to_string();
            failures.push(FailedPath::new(path, format!("cannot stat: {e}")));
            None
        }
    }
}

/// Second pass over a directory that only leads to listed paths, one
/// name: the non-directories the first pass found (`take`: a bit per name
/// of `listed_children`, the same list again) are stat'ed again. One
/// turned into a directory since is left out, as the plain second pass
/// does; one gone since fails as it would have in the first pass.
fn listed_again(
    base: &Path,
    dir: &Pending,
    (k, name): (usize, &[u8]),
    take: &[u64],
    (filter, col): (&Filter, &Collector),
    failures: &mut Vec<FailedPath>,
) -> Option<Pending> {
    if take.get(k / 64).is_none_or(|b| b & (1 << (k % 64)) == 0) {
        return None;
    }
    let rel = join(&dir.rel, name);
    let md = listed_stat(base, &rel, filter, failures)?;
    if md.is_dir() {
        return None;
    }
    let wire = join(&dir.wire, name);
    pending(base, rel, wire, &Meta::from(&md), col, failures)
}

/// Second pass: the record of a non-directory.
fn pending(
    base: &Path,
    rel: Vec<u8>,
    wire: Vec<u8>,
    md: &Meta,
    col: &Collector,
    failures: &mut Vec<FailedPath>,
) -> Option<Pending> {
    let (mode, mtime, owners) = (md.mode, md.mtime, md.owners);
    match md.fmt {
        libc::S_IFREG => Some(Pending {
            wire,
            rel,
            kind: PendingKind::File {
                size: md.size,
                dev: md.dev,
                ino: md.ino,
                nlink: md.nlink,
                volume: false,
                sparse: crate::storage::sparse::may_be_sparse(md.blocks, md.size),
            },
            mode,
            mtime,
            owners,
        }),
        libc::S_IFLNK => match fs::read_link(abs(base, &rel)) {
            Ok(t) => Some(Pending {
                wire,
                rel,
                kind: PendingKind::Symlink(t.as_os_str().as_bytes().to_vec()),
                mode: 0o777,
                mtime,
                owners,
            }),
            Err(e) => {
                let path = abs(base, &rel).display().to_string();
                failures.push(FailedPath::io(
                    path,
                    format!("cannot read symlink: {e}"),
                    &e,
                ));
                None
            }
        },
        // A directory that appeared since its parent was read: skipped
        // like any entry created during the scan.
        libc::S_IFDIR => None,
        fmt => match col.special(fmt, md.rdev) {
            Some(k) => Some(Pending {
                wire,
                rel,
                kind: PendingKind::Special(k),
                mode,
                mtime,
                owners,
            }),
            None => {
                let what = match fmt {
                    libc::S_IFIFO | libc::S_IFSOCK => "fifo or socket (use --specials or -a)",
                    _ => "device (use --devices or -a)",
                };
                failures.push(FailedPath::new(
                    abs(base, &rel).display().to_string(),
                    format!("special file skipped: {what}"),
                ));
                None
            }
        },
    }
}

#[cfg(test)]
mod tests;
