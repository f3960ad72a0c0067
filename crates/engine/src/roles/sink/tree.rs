//! The sink's metadata phase and its epilogue (seed 000 Fig. 6-4: one
//! round trip of metadata before the payload): rebuild the tree as the
//! source's records arrive (directories made at once, files registered in
//! the [`FileTable`], links and directory attributes deferred), and, once
//! the files are in place, create the links, run sync's deletions and set
//! the directories' attributes (last: a deletion changes its directory's
//! mtime).

use std::sync::Arc;

use ramsys_proto::control::{EntryKind, Failure};
use ramsys_proto::Control;

use super::Ctl;
use crate::request::sync::flags as sync_flags;
use crate::roles::sink::dest::DestMap;
use crate::roles::sink::files::FileTable;
use crate::roles::sink::sync_delta::SinkSync;
use crate::storage::archive::apply::ArchiveSink;
use crate::storage::fsops::Root;
use crate::types::error::EngineError;

// Source failures a sink keeps to report (Control::ScanFailed); past it
// only a count.
pub use ramsys_proto::control::SCAN_FAILURES_KEPT as MAX_SCAN_FAILURES;

/// (path, link target, mtime)
type SymlinkRec = (Vec<u8>, Vec<u8>, (i64, u32));

/// What is placed only after every file is in place: hard links need
/// their target final, and a directory's mtime changes with every entry
/// created in it.
#[derive(Default)]
pub(super) struct Deferred {
    /// (path, mode, mtime)
    dirs: Vec<(Vec<u8>, u32, (i64, u32))>,
    symlinks: Vec<SymlinkRec>,
    /// (path, entry id of the file it links to, that file's path where a
    /// windowed sink may drop its slot before the links are made)
    hardlinks: Vec<(Vec<u8>, u64, Option<Vec<u8>>)>,
    /// An archive copy's special files and attributes (crate::storage::archive).
    archive: Option<ArchiveSink>,
}

/// The tree as the metadata phase builds it.
pub(super) struct Tree {
    /// Shared with the writers from the start in a windowed session.
    pub table: Arc<FileTable>,
    /// Windowed metadata (issue 36): the records run on into the payload,
    /// and a hard link names its target by path.
    pub windowed: bool,
    pub deferred: Deferred,
    /// Directories that could not be made (reported, not fatal).
    pub prep_failures: Vec<Failure>,
    /// What the source could not read (Control::ScanFailed), and how many
    /// more it named past MAX_SCAN_FAILURES.
    pub scan_failures: Vec<Failure>,
    pub scan_failures_dropped: u64,
    /// One of them was more than a vanished path: --delete deletes nothing.
    pub scan_io_error: bool,
    pub total_bytes: u64,
    /// Sync (docs/SYNC.md): set by a SyncMode right behind Propose.
    pub sync: Option<SinkSync>,
    /// How DST is read (roles::sink::dest), settled by the first record.
    pub dest: DestMap,
    dest_open: bool,
    /// What this sink may apply of an archive copy (crate::storage::archive).
    pub archive_policy: crate::storage::archive::Policy,
    /// The user's selection, handed to sync: `--delete` leaves what it
    /// excludes.
    pub protect: Option<crate::request::filter::Filter>,
    /// Files whose set-ID bits a plain (not archive) copy drops.
    pub setid_dropped: u64,
    /// Bytes of per-file state this session may hold (0: no bound;
    /// `serve --session-memory`, issue 36).
    pub meta_budget: u64,
    /// A dry run without windows: each file's path by id, for the
    /// HardLink records that name it by id only (SinkSync::on_dry_entry;
    /// a windowed session sends LinkTo, which names it).
    dry_paths: std::collections::HashMap<u64, Vec<u8>>,
    /// The transfer root's directory record sets DST's mode and mtime
    /// (not under a `--files-from` list that does not name `.`).
    pub root_attrs: bool,
}

impl Tree {
    pub fn new(table: FileTable, dest: DestMap) -> Tree {
        Tree {
            table: Arc::new(table),
            windowed: false,
            deferred: Deferred::default(),
            prep_failures: Vec::new(),
            scan_failures: Vec::new(),
            scan_failures_dropped: 0,
            scan_io_error: false,
            total_bytes: 0,
            sync: None,
            dest,
            dest_open: true,
            archive_policy: Default::default(),
            protect: None,
            setid_dropped: 0,
            meta_budget: 0,
            dry_paths: Default::default(),
            root_attrs: true,
        }
    }

    fn dry(&self) -> bool {
        self.sync.as_ref().is_some_and(|s| s.dry())
    }

    /// Read metadata records until MetaEnd; every file is then reachable.
    pub fn receive(&mut self, ctl: &mut Ctl, root: &Arc<Root>) -> Result<(), EngineError> {
        while !self.on_message(ctl.recv()?, root)? {}
        self.table.publish();
        Ok(())
    }

    /// One metadata message (admitted by the machine already); true at
    /// MetaEnd.
    pub fn on_message(&mut self, m: Control, root: &Arc<Root>) -> Result<bool, EngineError> {
        {
            match m {
                Control::SyncMode { flags } => self.sync_mode(flags, root),
                Control::Entries(es) => self.entries(es, root)?,
                // An archive copy (crate::storage::archive): what the records carry.
                Control::Preserve { flags } => {
                    let a = ArchiveSink::new(flags, self.archive_policy);
                    // Windowed: a file's attributes as it settles (issue 36).
                    let a = if self.windowed { a.windowed() } else { a };
                    self.deferred.archive = Some(a)
                }
                Control::Attrs(v) => {
                    let dry = self.dry();
                    if let (Some(a), false) = (&mut self.deferred.archive, dry) {
                        a.attrs(v, root);
                        self.account()?;
                    }
                }
                // The source's unreadable paths (crate::source): reported,
                // and --delete then deletes nothing. Kept up to a bound: a
                // hostile source must not grow this end without limit.
                Control::ScanFailed {
                    failures: f,
                    io_error,
                } => {
                    self.scan_io_error |= io_error;
                    let room = MAX_SCAN_FAILURES.saturating_sub(self.scan_failures.len());
                    self.scan_failures_dropped += f.len().saturating_sub(room) as u64;
                    self.scan_failures.extend(f.into_iter().take(room));
                }
                // Directories whose every entry came (windowed, issue 36):
                // their extras go now, unless the source failed to read
                // something so far (the rule of the session's end: only
                // the source's errors stop --delete, as only rsync's
                // sender's do; docs/SYNC.md).
                Control::DirsDone { ids } => {
                    let may = !self.scan_io_error && !self.table.source_failed();
                    if let Some(s) = &mut self.sync {
                        for id in ids {
                            s.dir_done(id, may);
                        }
                    }
                    self.account()?;
                }
                Control::MetaEnd { .. } => return Ok(true),
                // SinkMachine admits only these in this phase.
                m => {
                    return Err(EngineError::local(format!(
                        "protocol error: {} during metadata",
                        m.name()
                    )))
                }
            }
        }
        Ok(false)
    }

    /// A windowed session's files below `below` settled and their slots
    /// were dropped: an archive copy applies their attributes now.
    pub fn settled(&mut self, below: u64, root: &Root) {
        if let Some(a) = &mut self.deferred.archive {
            a.settled(below, root);
        }
    }

    pub fn sync_mode(&mut self, flags: u32, root: &Arc<Root>) {
        let journal = sync_flags::RESUME | sync_flags::JOURNAL;
        // Before any record (the machine's rule): nobody holds the table.
        if let Some(t) = Arc::get_mut(&mut self.table) {
            t.resume = flags & journal != 0 && flags & sync_flags::DRY_RUN == 0;
            t.journal_min = match flags & sync_flags::RESUME {
                0 => crate::request::sync::journal_min(),
                _ => 0,
            };
        }
        let mut s = SinkSync::new(flags, root.clone());
        s.own_temp_suffix(self.table.tmp_suffix());
        if let Some(f) = self.protect.take() {
            s.protect(f);
        }
        self.sync = Some(s);
    }

    fn entries(
        &mut self,
        es: Vec<ramsys_proto::control::Entry>,
        root: &Arc<Root>,
    ) -> Result<(), EngineError> {
        if let (true, Some(e)) = (self.dest_open, es.first()) {
            self.dest_open = false;
            let first = crate::roles::sink::dest::First {
                path: &e.path,
                dir: matches!(e.kind, EntryKind::Dir),
                mode: e.mode,
                mtime: (e.mtime_s, e.mtime_ns),
            };
            self.dest.settle(root, &first).map_err(EngineError::local)?;
        }
        for e in es {
            let target = self.dest.map(&e.path);
            if let EntryKind::File { size } = e.kind {
                if self.dest.is_device(&target) {
                    crate::storage::volume::accept_target(root, &target, size)
                        .map_err(EngineError::Refused)?;
                    let id = e.id;
                    self.entry(e, target, root);
                    self.table.set_device(id);
                    continue;
                }
            }
            self.entry(e, target, root);
        }
        // Per batch: the budget bounds the table before it grows past it.
        self.account()
    }

    /// What the file list holds now (the table, sync's kept runs, an
    /// archive copy's held attributes), against the session's budget.
    fn account(&self) -> Result<(), EngineError> {
        let files = self.table.file_count();
        let keep = self.sync.as_ref().map_or(0, |s| s.keep_bytes());
        let attrs = self.deferred.archive.as_ref().map_or(0, |a| a.held_bytes());
        (self.table.stats())
            .meta_used(
                self.table.meta_bytes() + keep + attrs,
                files,
                self.meta_budget,
            )
            .map_err(EngineError::Local)
    }

    /// One record, its path mapped to `target` under the sink's root.
    fn entry(&mut self, mut e: ramsys_proto::control::Entry, target: Vec<u8>, root: &Arc<Root>) {
        if crate::request::reserved::names_reserved(&target) {
            return self.refuse_reserved(e, target);
        }
        let mtime = (e.mtime_s, e.mtime_ns);
        let dry = self.dry();
        // Set-ID bits only where the policy lets the file keep them (issue
        // 34, archive::SetId); sync compares against what may be kept, so a
        // stripped file is not "changed" on the next run.
        let archive = self.deferred.archive.as_ref().map(|a| a.flags());
        if !matches!(e.kind, EntryKind::Dir) {
            let mode = self.archive_policy.wanted_mode(e.mode, archive);
            if archive.is_none() && mode != e.mode {
                self.setid_dropped += 1;
            }
            e.mode = mode;
        }
        // An archive copy chowns after the rename: until then no set-ID
        // bit under the sink user's ownership.
        let placed = self.archive_policy.placed_mode(e.mode, archive);
        let file = match e.kind {
            EntryKind::File { size } if !dry => {
                self.total_bytes += size;
                Some((target.clone(), size, placed, mtime))
            }
            // A piece of a big file (issue 19, roles::sink::bigfile): registered
            // with the whole file's size, writing only its range.
            EntryKind::Piece { size, .. } if !dry => {
                self.total_bytes += e.kind.piece_range().map_or(0, |r| r.1);
                Some((target.clone(), size, placed, mtime))
            }
            _ => None,
        };
        self.table.push_entry(e.id, file);
        if let (EntryKind::Piece { piece, index, .. }, false) = (&e.kind, dry) {
            self.table.set_piece(e.id, &e.path, *piece, *index);
        }
        // A dry run lists a hard link by its first name's state at DST.
        let first = match &e.kind {
            EntryKind::File { .. } if dry && !self.windowed => {
                self.dry_paths.insert(e.id, target.clone());
                None
            }
            EntryKind::HardLink { target_id } if dry => self.dry_paths.get(target_id).cloned(),
            EntryKind::LinkTo { target: to, .. } if dry => Some(self.dest.map(to)),
            _ => None,
        };
        // Sync replaces what is in the way of another type (issue 35).
        let mut replace = false;
        if let Some(s) = &mut self.sync {
            replace = s.replaces();
            match e.kind {
                EntryKind::Dir => s.on_dir(e.id, &target, &e.path),
                EntryKind::File { size } => {
                    s.on_file(&self.table, e.id, &target, size, e.mode, mtime)
                }
                EntryKind::Piece { size, .. } => {
                    s.on_piece(&self.table, e.id, &target, size, e.mode, mtime)
                }
                _ => {
                    // A hard link's mtime: `-u` may keep DST's file.
                    let link = matches!(
                        e.kind,
                        EntryKind::HardLink { .. } | EntryKind::LinkTo { .. }
                    );
                    match s.on_other(&target, link.then_some(mtime)) {
                        Ok(true) if dry => s.on_dry_entry(&e, &target, first.as_deref()),
                        Ok(true) => {}
                        Ok(false) => return,
                        Err(reason) => {
                            self.prep_failures.push(Failure {
                                path: target,
                                reason,
                            });
                            return;
                        }
                    }
                }
            }
        }
        if dry {
            return;
        }
        let d = &mut self.deferred;
        if let Some(a) = &mut d.archive {
            a.entry(&e, &target);
        }
        match e.kind {
            // "" is the sink's root itself (`SRC/` into the root): it
            // exists and keeps its attributes.
            EntryKind::Dir if target.is_empty() => {}
            EntryKind::Dir => match mkdir(root, &target, e.mode, replace) {
                Ok(()) if e.path.is_empty() && !self.root_attrs => {}
                Ok(()) => d.dirs.push((target, e.mode, mtime)),
                Err(err) => self.prep_failures.push(Failure {
                    path: target,
                    reason: err.to_string(),
                }),
            },
            // Made by the archive pass (crate::storage::archive::apply).
            EntryKind::File { .. } | EntryKind::Special { .. } | EntryKind::Piece { .. } => {}
            EntryKind::Symlink { target: t } => d.symlinks.push((target, t, mtime)),
            // Windowed: by path, the target's slot may be dropped by then
            // (a HardLink comes only while it is held: SinkMachine).
            EntryKind::HardLink { target_id } if self.windowed => {
                let to = self.table.path_of(target_id);
                d.hardlinks.push((target, target_id, to))
            }
            EntryKind::HardLink { target_id } => d.hardlinks.push((target, target_id, None)),
            EntryKind::LinkTo {
                target_id,
                target: to,
            } => {
                let to = self.dest.map(&to);
                d.hardlinks.push((target, target_id, Some(to)))
            }
        }
    }
}

impl Tree {
    /// A record naming one of our own working files (issue 34,
    /// crate::request::reserved): nothing is made; a file's data, if sent anyway,
    /// is dropped; the path is reported failed.
    fn refuse_reserved(&mut self, e: ramsys_proto::control::Entry, target: Vec<u8>) {
        let reason = crate::request::reserved::REFUSED.to_string();
        let size = match e.kind {
            EntryKind::File { size } | EntryKind::Piece { size, .. } if !self.dry() => Some(size),
            _ => None,
        };
        match size {
            Some(size) => {
                let file = (target, size, 0o600, (e.mtime_s, e.mtime_ns));
                self.table.push_entry(e.id, Some(file));
                self.table.fail_id(e.id, reason);
            }
            None => {
                self.table.push_entry(e.id, None);
                self.prep_failures.push(Failure {
                    path: target,
                    reason,
                });
            }
        }
    }
}

/// Make a directory record's directory; a sync replaces a non-directory
/// in its way (a symlink is removed, never followed; fsops::Root::mkdir_over).
fn mkdir(root: &Root, target: &[u8], mode: u32, replace: bool) -> std::io::Result<()> {
    if replace {
        root.mkdir_over(target, mode).map(|_| ())
    } else {
        root.mkdir(target, mode)
    }
}

impl Deferred {
    /// Hard links, symlinks (through temp names `tmp(i)`), an archive
    /// copy's special files and attributes; what failed. Directory
    /// attributes wait for [`Deferred::finish_dirs`]: sync's deletions
    /// come in between (issue 35).
    pub fn place(
        &mut self,
        root: &Root,
        table: &FileTable,
        tmp: impl Fn(usize) -> Vec<u8>,
    ) -> Vec<Failure> {
        let mut failures = Vec::new();
        let mut fail = |path: &Vec<u8>, reason: String| {
            failures.push(Failure {
                path: path.clone(),
                reason,
            })
        };
        for (i, (target, id, to)) in self.hardlinks.iter().enumerate() {
            let from = match to {
                Some(to) if table.placed(*id) == Some(true) => Some(to.clone()),
                Some(_) => None,
                None => table
                    .get(*id)
                    .filter(|f| table.is_final(f))
                    .map(|f| f.rel().to_vec()),
            };
            match from {
                Some(from) => {
                    if let Err(e) = root.hardlink(&from, target, &tmp(i)) {
                        fail(target, format!("hard link: {e}"));
                    }
                }
                None => fail(target, "hard link target was not copied".into()),
            }
        }
        let n = self.hardlinks.len();
        for (i, (path, t, mtime)) in self.symlinks.iter().enumerate() {
            if let Err(e) = root.symlink(path, t, &tmp(n + i), *mtime) {
                fail(path, format!("symlink: {e}"));
            }
        }
        let m = self.symlinks.len();
        if let Some(a) = &mut self.archive {
            let mut fs = Vec::new();
            a.place(root, |i| tmp(n + m + i), &mut fs);
            for f in fs {
                fail(&f.path, f.reason);
            }
        }
        failures
    }

    /// Directory attributes, deepest first, once nothing else will change
    /// a directory: after the entries are placed and after `--delete`
    /// (a removal sets its directory's mtime, which rsync restores too;
    /// issue 35). What failed.
    pub fn finish_dirs(self, root: &Root) -> Vec<Failure> {
        let mut failures = Vec::new();
        for (path, mode, mtime) in self.dirs.iter().rev() {
            if let Err(e) = root.ensure_dir_attrs(path, *mode, *mtime) {
                failures.push(Failure {
                    path: path.clone(),
                    reason: format!("directory attributes: {e}"),
                });
            }
        }
        if let Some(a) = self.archive {
            a.dir_atimes(root);
            a.note();
        }
        failures
    }
}

/// What sync's epilogue did: deleted paths, (dry run) planned paths, and
/// how many files were already in place.
pub(super) struct SyncOutcome {
    pub deleted: Vec<Vec<u8>>,
    pub planned: Vec<Vec<u8>>,
    pub unchanged: u64,
}

/// `p` (under the sink's root) named from DST: DST's own name where it
/// is DST itself (one file copied as DST).
fn from_dest(dest: &[u8], p: &[u8]) -> Vec<u8> {
    if dest.is_empty() {
        return p.to_vec();
    }
    match p.strip_prefix(dest) {
        Some(b"") => crate::storage::fsops::split_parent(dest).1.to_vec(),
        Some(rest) if rest.first() == Some(&b'/') => rest[1..].to_vec(),
        _ => p.to_vec(),
    }
}

/// Sync's epilogue: `--delete` unless the source's side was `incomplete`
/// (a directory it could not list, a file it could not read: rsync's
/// IOERR_GENERAL); this end's own failures (an entry it could not make
/// or write) do not stop it, as rsync's receiver's errors do not. Then
/// orphan cleanup (after a session without failures), the dry run's
/// plan; deletions reported to the source in batches that fit a control
/// frame.
pub(super) fn sync_epilogue(
    s: &mut SinkSync,
    ctl: &mut Ctl,
    (failures, incomplete): (&mut Vec<Failure>, bool),
    dest: &[u8],
    started: std::time::SystemTime,
    mut unchanged: u64,
    session: u64,
) -> Result<SyncOutcome, EngineError> {
    let deleted: Vec<Vec<u8>>;
    let mut planned = Vec::new();
    if !incomplete {
        let (d, f) = s.delete();
        deleted = d;
        failures.extend(f.into_iter().map(|(p, r)| Failure { path: p, reason: r }));
    } else {
        deleted = s.made_way();
        if s.flags & sync_flags::DELETE != 0 {
            tracing::warn!("session {session}: errors, deletions skipped");
        }
    }
    if failures.is_empty() && !s.dry() {
        s.clean_orphans(dest, started);
    }
    if s.dry() {
        let (p, u) = s.planned();
        planned = p;
        unchanged = u;
    }
    // Named from DST, as rsync names them and as a pushing source names
    // what it would send (issue 35); a daemon's root or a local sink's
    // parent directory mean nothing to the user.
    let deleted: Vec<Vec<u8>> = deleted.iter().map(|p| from_dest(dest, p)).collect();
    let planned = planned.iter().map(|p| from_dest(dest, p)).collect();
    ctl.send_batched(deleted.iter().cloned(), |p| p.len() + 4, Control::Deleted)?;
    Ok(SyncOutcome {
        deleted,
        planned,
        unchanged,
    })
}
