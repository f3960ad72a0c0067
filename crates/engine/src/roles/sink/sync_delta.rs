//! The sink's part of a sync: decide per announced file what it already
//! holds, answer Have in the metadata round trip, apply the source's Reuse
//! verdicts, keep the resume journal, and delete what the source no longer
//! has once everything new is in place.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use ramsys_proto::control::{Have, HaveState, Reuse, ReuseKind};

use super::journal::{Journal, PartRec};
use crate::request::sync::flags::{
    CHECKSUM, DELETE, DRY_RUN, IGNORE_EXISTING, JOURNAL, RESUME, SYNC, UPDATE,
};
use crate::roles::sink::files::{Base, FileTable, WriteError};
use crate::storage::fsops::{split_parent, Root};

/// (path, reason) of entries that could not be removed.
pub type PathFailures = Vec<(Vec<u8>, String)>;

enum Check {
    Digest,
    /// Hash the base: the old file, or a journalled temp file.
    Blocks {
        base_size: u64,
        part: Option<PartRec>,
    },
}

pub struct SinkSync {
    pub flags: u32,
    root: Arc<Root>,
    journal: Option<Journal>,
    checks: Vec<(u64, Vec<u8>, u64, Check)>,
    /// Ids answered Unchanged, as runs (first id, count): records arrive
    /// in id order, so a no-change re-sync keeps about one run per
    /// directory instead of a 48-byte Have per file (issue 36); the Have
    /// messages are built batch by batch as they are sent.
    unchanged: Vec<(u64, u64)>,
    /// Every destination path the source sent (for --delete).
    keep: super::delete::KeepSet,
    /// Instead, per directory, once the source names directories done
    /// (DIRS_DONE_FLAG; issue 36, docs/PROTOCOL.md "Directories done").
    by_dir: Option<super::delete::DirKeeps>,
    /// Destination directories the source sent that exist here.
    dirs: Vec<Vec<u8>>,
    /// Their wire paths (same order), what `protect` matches.
    wires: Vec<Vec<u8>>,
    /// Their record ids (same order, ascending), and which were done (their
    /// extras deleted then; the end looks at the others only).
    dir_ids: Vec<u64>,
    dir_done: Vec<bool>,
    /// What was deleted (or would be) in directories done, by index in
    /// `dirs` (the report lists them in `dirs`' order, as before), and
    /// what could not be.
    early: Vec<(usize, Vec<u8>)>,
    early_failed: PathFailures,
    /// The user's selection: what it excludes is never deleted.
    protect: Option<crate::request::filter::Filter>,
    /// Dry run: files that would be sent, by id; a file found unchanged
    /// (here, or by the source's Reuse) leaves at once, so what stays is
    /// the report's list and the comparisons in flight, not the tree
    /// (issue 36: dry runs run in windows).
    dry_files: BTreeMap<u64, Vec<u8>>,
    /// Dry run: files found unchanged.
    dry_kept: u64,
    /// Dry run: symlinks, hard links and special files DST does not hold
    /// as sent, which the run would make (listed, as `rsync -n` lists
    /// them), and their ids not yet answered (a Have each: the source
    /// names them too).
    dry_made: Vec<Vec<u8>>,
    dry_made_ids: Vec<u64>,
    /// Dry run: further names DST already links to the file `id`'s name,
    /// by `id`: remade (and listed) only if that file would be sent.
    dry_links: BTreeMap<u64, Vec<Vec<u8>>>,
    /// Resume: temp files taken as bases (paths under the root).
    used_parts: HashSet<Vec<u8>>,
    /// Resume: the destinations the journal held rows for at the first
    /// record, if few (most trees have a handful: one SQLite query per
    /// file was most of a no-change resume of 1 M files); None inside:
    /// ask the journal for each file.
    held_rows: std::cell::OnceCell<Option<HashSet<Vec<u8>>>>,
    /// This session's own temp names end so (FileTable's suffix): never
    /// stale, though a windowed session writes them before its last
    /// records come.
    own_suffix: Vec<u8>,
    /// The directory of the last file looked up: records arrive in walk
    /// order, so one confined open per directory instead of per file
    /// (None: it does not exist here).
    dir: Option<(Vec<u8>, Option<std::os::fd::OwnedFd>)>,
    /// What the directories removed to make way for a non-directory held
    /// (issue 35; not the directories, which rsync does not count: issue
    /// 36), reported with the deletions.
    made_way: Vec<Vec<u8>>,
}

/// `.NAME.ramsys-SESSION.part`: the only names orphan cleaning removes.
fn is_temp_name(n: &[u8]) -> bool {
    n.starts_with(b".")
        && n.ends_with(b".part")
        && n.windows(8).any(|w| w == b".ramsys-")
        && !n.contains(&b'/')
}

fn is_reg(st: &crate::storage::fsops::Stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG
}

fn is_dir(st: &crate::storage::fsops::Stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

impl SinkSync {
    pub fn new(flags: u32, root: Arc<Root>) -> Self {
        SinkSync {
            flags,
            root,
            journal: None,
            checks: Vec::new(),
            unchanged: Vec::new(),
            keep: Default::default(),
            by_dir: None,
            dirs: Vec::new(),
            wires: Vec::new(),
            dir_ids: Vec::new(),
            dir_done: Vec::new(),
            early: Vec::new(),
            early_failed: Vec::new(),
            protect: None,
            dry_files: BTreeMap::new(),
            dry_kept: 0,
            dry_made: Vec::new(),
            dry_made_ids: Vec::new(),
            dry_links: BTreeMap::new(),
            used_parts: HashSet::new(),
            own_suffix: Vec::new(),
            held_rows: Default::default(),
            dir: None,
            made_way: Vec::new(),
        }
    }

    /// Record a path the source sent: needed only to find what it no
    /// longer has (--delete) and stale temp files (resume).
    fn remember(&mut self, target: &[u8]) {
        if self.flags & (DELETE | RESUME) != 0 {
            match &mut self.by_dir {
                Some(k) => k.insert(target),
                None => self.keep.insert(target),
            }
        }
    }

    /// The source names directories done (DIRS_DONE_FLAG): keep names per
    /// directory from the first record on.
    pub fn by_directory(&mut self) {
        if self.flags & (DELETE | RESUME) != 0 {
            self.by_dir = Some(Default::default());
        }
    }

    /// lstat of a destination path through the cached directory descriptor.
    fn lstat(&mut self, rel: &[u8]) -> Option<crate::storage::fsops::Stat> {
        let (parent, name) = split_parent(rel);
        if name.is_empty() {
            return self.root.lstat(rel).ok().flatten();
        }
        if self.dir.as_ref().is_none_or(|(p, _)| p != parent) {
            let fd = self.root.open_dir(parent).ok();
            self.dir = Some((parent.to_vec(), fd));
        }
        let fd = self.dir.as_ref()?.1.as_ref()?;
        crate::storage::fsops::lstat_at(std::os::fd::AsFd::as_fd(fd), name)
            .ok()
            .flatten()
    }

    /// Bytes its --delete set holds (the session's memory budget).
    pub fn keep_bytes(&self) -> u64 {
        (self.keep.bytes() + self.by_dir.as_ref().map_or(0, |k| k.bytes())) as u64
    }

    pub fn dry(&self) -> bool {
        self.flags & DRY_RUN != 0
    }

    pub fn resume(&self) -> bool {
        self.flags & RESUME != 0 && !self.dry()
    }

    /// The suffix of this session's own temp names (FileTable::tmp_suffix).
    pub fn own_temp_suffix(&mut self, suffix: &str) {
        self.own_suffix = suffix.as_bytes().to_vec();
    }

    /// `--delete` leaves what this selection excludes (rsync's rule).
    pub fn protect(&mut self, f: crate::request::filter::Filter) {
        self.protect = (!f.is_all()).then_some(f);
    }

    /// A directory record (created by the caller unless dry run); `wire`
    /// is its path as the source sent it.
    pub fn on_dir(&mut self, id: u64, target: &[u8], wire: &[u8]) {
        self.dir = None;
        self.remember(target);
        if let Some(k) = &mut self.by_dir {
            k.open(target);
        }
        self.dirs.push(target.to_vec());
        self.wires.push(wire.to_vec());
        self.dir_ids.push(id);
        self.dir_done.push(false);
    }

    /// The source sent every entry of directory record `id` (DirsDone):
    /// a resume drops the directory's stale temp files, `--delete` its
    /// extras (listed only, in a dry run) if `may_delete` (the source has
    /// failed to read nothing so far: the rule the session's end keeps,
    /// so nothing is deleted there after such a failure either), and its
    /// names are dropped. A
    /// directory not sent here (a reserved name refused) has nothing.
    pub fn dir_done(&mut self, id: u64, may_delete: bool) {
        let Ok(i) = self.dir_ids.binary_search(&id) else {
            return;
        };
        let Some(hashes) = self.by_dir.as_mut().and_then(|k| k.take(&self.dirs[i])) else {
            return;
        };
        self.dir_done[i] = true;
        let keeps = self.by_dir.as_ref().expect("by directory");
        let kept = keeps.view(&hashes);
        if self.resume() {
            self.drop_stale_in(&self.dirs[i], &|p| kept.contains(p));
        }
        if self.flags & DELETE == 0 || !may_delete {
            return;
        }
        let mut gone = Vec::new();
        self.extraneous_in(i, &|p| kept.contains(p), &mut gone);
        let (done, failed) = self.remove_all(i, gone);
        self.early.extend(done.into_iter().map(|p| (i, p)));
        self.early_failed.extend(failed);
    }

    /// A symlink, hard link or special file record (`link_mtime`: a hard
    /// link's, a regular file's mtime): Ok(true) to make it, Ok(false) to
    /// leave DST's entry as it is (`--ignore-existing`: rsync's
    /// recv_generator skips every existing non-directory, whatever its
    /// type; `-u`: a hard link is a regular file, and a newer one at DST
    /// stays; rsync's -u leaves symlinks and specials alone). Err: a
    /// directory is in its way and stays (the reason; the caller reports
    /// it and skips the record).
    pub fn on_other(
        &mut self,
        target: &[u8],
        link_mtime: Option<(i64, u32)>,
    ) -> Result<bool, String> {
        self.remember(target);
        if self.flags & IGNORE_EXISTING != 0 {
            return Ok(self.lstat(target).is_none());
        }
        if let (Some(m), true) = (link_mtime, self.flags & UPDATE != 0) {
            if self.lstat(target).is_some_and(|st| self.leaves(&st, m)) {
                return Ok(false);
            }
        }
        if !self.replaces() {
            return Ok(true);
        }
        match self.lstat(target) {
            Some(st) if is_dir(&st) => self.make_way(target).map(|()| true),
            _ => Ok(true),
        }
    }

    /// A sync (not a copy, not `--ignore-existing`) replaces what is in
    /// the way of a source entry of another type, as rsync does (issue 35).
    pub fn replaces(&self) -> bool {
        self.flags & SYNC != 0 && self.flags & IGNORE_EXISTING == 0
    }

    /// Remove the directory at `target` so a non-directory can take its
    /// place (sync::delete::make_way); nothing changes in a dry run.
    fn make_way(&mut self, target: &[u8]) -> Result<(), String> {
        self.dir = None;
        if self.dry() {
            return Ok(());
        }
        match super::delete::make_way(&self.root, target, self.flags & DELETE != 0) {
            Ok(gone) => {
                self.made_way.extend(gone);
                Ok(())
            }
            Err(e) => Err(format!("cannot replace the directory: {e}")),
        }
    }

    /// What every file and piece record does first: remember its name,
    /// list it for a dry run, and say whether to compare it at all (the
    /// default journal alone compares nothing: a plain copy).
    fn note_data(&mut self, id: u64, target: &[u8]) -> bool {
        self.remember(target);
        if self.dry() {
            self.dry_files.insert(id, target.to_vec());
        }
        self.flags & crate::request::sync::COMPARE != 0
    }

    /// `--ignore-existing` / `--update`: DST's entry `st` is to stay as it
    /// is: it exists, or (`-u`) it is a regular file newer than the source.
    fn leaves(&self, st: &crate::storage::fsops::Stat, mtime: (i64, u32)) -> bool {
        self.flags & IGNORE_EXISTING != 0
            || self.flags & UPDATE != 0
                && is_reg(st)
                && (st.st_mtime, st.st_mtime_nsec as u32) > mtime
    }

    /// File `id` needs no data: tell the source, keep DST's file (applying
    /// the mode and mtime if `attrs`).
    fn unchanged(&mut self, table: &FileTable, id: u64, attrs: bool) {
        self.push_unchanged(id);
        table.keep(id, attrs);
        self.kept(id);
    }

    fn push_unchanged(&mut self, id: u64) {
        match self.unchanged.last_mut() {
            Some((first, n)) if *first + *n == id => *n += 1,
            _ => self.unchanged.push((id, 1)),
        }
    }

    /// Dry run: count `id` among the unchanged (nothing to do otherwise).
    fn kept(&mut self, id: u64) {
        if self.dry() && self.dry_files.remove(&id).is_some() {
            self.dry_kept += 1;
            self.dry_links.remove(&id);
        }
    }

    /// Dry run: a symlink, hard link or special record `e` the run would
    /// place at `target` (`first`: a hard link's first name at DST). It is
    /// listed where DST does not hold it as sent, as `rsync -n` lists it
    /// (issue 36): a symlink with another target or none, a name not yet
    /// linked to the first (or linked to a first name that would be sent
    /// again), a special file of another type or device.
    pub fn on_dry_entry(
        &mut self,
        e: &ramsys_proto::control::Entry,
        target: &[u8],
        first: Option<&[u8]>,
    ) {
        use ramsys_proto::control::EntryKind;
        let st = self.lstat(target);
        let held = match (&e.kind, &st) {
            (_, None) => false,
            (EntryKind::Symlink { target: t }, Some(st)) => {
                crate::storage::fsops::is_symlink(st) && self.readlink(target).as_ref() == Some(t)
            }
            (EntryKind::HardLink { target_id } | EntryKind::LinkTo { target_id, .. }, Some(st)) => {
                let one = first
                    .and_then(|f| self.lstat(f))
                    .is_some_and(|f| (f.st_dev, f.st_ino) == (st.st_dev, st.st_ino));
                if one && self.dry_files.contains_key(target_id) {
                    let names = self.dry_links.entry(*target_id).or_default();
                    names.push(target.to_vec());
                }
                one
            }
            (EntryKind::Special { kind, rdev }, Some(st)) => {
                use ramsys_proto::attrs::special;
                let (want, dev) = match *kind {
                    special::FIFO => (libc::S_IFIFO, false),
                    special::SOCKET => (libc::S_IFSOCK, false),
                    special::CHAR => (libc::S_IFCHR, true),
                    _ => (libc::S_IFBLK, true),
                };
                st.st_mode & libc::S_IFMT == want && (!dev || st.st_rdev == *rdev)
            }
            _ => true,
        };
        if !held {
            self.dry_made.push(target.to_vec());
            self.dry_made_ids.push(e.id);
        }
    }

    /// The target of the symlink at `rel`, through the cached directory.
    fn readlink(&mut self, rel: &[u8]) -> Option<Vec<u8>> {
        let (_, name) = split_parent(rel);
        self.lstat(rel)?;
        let fd = self.dir.as_ref()?.1.as_ref()?;
        crate::storage::fsops::readlink_at(std::os::fd::AsFd::as_fd(fd), name).ok()
    }

    /// A file record, already in `table` (unless dry run): unchanged,
    /// to compare, or to send whole.
    pub fn on_file(
        &mut self,
        table: &FileTable,
        id: u64,
        target: &[u8],
        size: u64,
        mode: u32,
        mtime: (i64, u32),
    ) {
        if !self.note_data(id, target) {
            return;
        }
        // `--ignore-existing` / `-u` look at DST first (one lstat, reused).
        let early = (self.flags & (IGNORE_EXISTING | UPDATE) != 0).then(|| self.lstat(target));
        if let Some(Some(st)) = &early {
            if self.leaves(st, mtime) {
                return self.unchanged(table, id, false);
            }
        }
        if self.resume() {
            if self.journal.is_none() {
                match Journal::open(self.root.path()) {
                    Ok(j) => self.journal = Some(j),
                    Err(e) => tracing::warn!("{e}; resuming without it"),
                }
            }
            let journal = &self.journal;
            let held = self
                .held_rows
                .get_or_init(|| journal.as_ref().and_then(held_rows));
            let listed = held.as_ref().is_none_or(|h| h.contains(target));
            let rec = (self.journal.as_ref())
                .filter(|_| listed)
                .and_then(|j| j.lookup(target).ok().flatten());
            if let Some(r) = rec.filter(|r| r.size == size && r.mtime == mtime) {
                let (parent, _) = split_parent(target);
                let mut p = parent.to_vec();
                if !p.is_empty() {
                    p.push(b'/');
                }
                p.extend_from_slice(&r.part);
                // A device's row names the device itself (written in place).
                if matches!(self.root.lstat(&p), Ok(Some(st))
                    if is_reg(&st) || crate::storage::volume::is_block_stat(&st))
                {
                    self.used_parts.insert(p.clone());
                    let check = Check::Blocks {
                        base_size: size,
                        part: Some(r),
                    };
                    self.checks.push((id, p, size, check));
                    return;
                }
            }
        }
        let Some(st) = early.unwrap_or_else(|| self.lstat(target)) else {
            return;
        };
        if crate::storage::volume::is_block_stat(&st) {
            // A device DST (accepted: --write-devices, large enough): its
            // first `size` bytes are the base, block by block; its mtime
            // says nothing about its contents.
            if self.flags & SYNC != 0 && !self.dry() && size > 0 {
                let check = Check::Blocks {
                    base_size: size,
                    part: None,
                };
                self.checks.push((id, target.to_vec(), size, check));
            }
            return;
        }
        if is_dir(&st) && self.replaces() {
            if let Err(e) = self.make_way(target) {
                table.fail_id(id, e);
            }
            return;
        }
        if !is_reg(&st) {
            return;
        }
        let osize = st.st_size as u64;
        let omtime = (st.st_mtime, st.st_mtime_nsec as u32);
        let delta_ok = self.flags & SYNC != 0
            && !self.dry()
            && osize > 0
            && (osize == size || size >= crate::request::sync::DELTA_MIN);
        if self.flags & CHECKSUM != 0 && osize == size {
            self.checks.push((id, target.to_vec(), size, Check::Digest));
        } else if self.flags & CHECKSUM == 0 && osize == size && omtime == mtime {
            // A mode change alone is applied here: no data moves.
            self.unchanged(table, id, st.st_mode & 0o7777 != mode);
        } else if delta_ok {
            let check = Check::Blocks {
                base_size: osize,
                part: None,
            };
            self.checks.push((id, target.to_vec(), size, check));
        }
    }

    /// A piece of a big file (issue 19, roles::sink::bigfile), already in
    /// `table`: unchanged when the file is in place as a copy of this one
    /// (same size and mtime, or same content with `-c`), or when an earlier
    /// run left this piece verified in the shared temp file; otherwise sent
    /// whole (no delta: a piece is small and its base is the temp file).
    pub fn on_piece(
        &mut self,
        table: &FileTable,
        id: u64,
        target: &[u8],
        size: u64,
        mode: u32,
        mtime: (i64, u32),
    ) {
        if !self.note_data(id, target) {
            return;
        }
        let st = self.lstat(target);
        if st.as_ref().is_some_and(|st| self.leaves(st, mtime)) {
            return self.unchanged(table, id, false);
        }
        if st.as_ref().is_some_and(is_dir) && self.replaces() {
            // The first piece makes way for all of them.
            if let Err(e) = self.make_way(target) {
                table.fail_id(id, e);
            }
            return;
        }
        if let Some(st) = st.filter(is_reg) {
            let same_size = st.st_size as u64 == size;
            if self.flags & CHECKSUM != 0 && same_size {
                self.checks.push((id, target.to_vec(), size, Check::Digest));
                return;
            }
            let omtime = (st.st_mtime, st.st_mtime_nsec as u32);
            if self.flags & CHECKSUM == 0 && same_size && omtime == mtime {
                return self.unchanged(table, id, st.st_mode & 0o7777 != mode);
            }
        }
        if !self.dry() && table.piece_done(id) {
            self.push_unchanged(id);
            table.keep_piece(id);
            self.kept(id);
        }
    }

    /// Resume: temp files of this session's files that no journal row
    /// vouches for (written after its last save before a kill, or of
    /// another source version) are removed: their blocks are unverified.
    /// Directories done (DirsDone) had theirs removed then.
    fn drop_stale_parts(&mut self) {
        let mut by_dir = self.by_dir.take();
        for (i, d) in self.dirs.iter().enumerate() {
            if self.dir_done[i] {
                continue;
            }
            match &mut by_dir {
                Some(k) => {
                    if let Some(kept) = k.sorted(d) {
                        self.drop_stale_in(d, &|p| kept.contains(p));
                    }
                }
                None => self.drop_stale_in(d, &|p| self.keep.contains(p)),
            }
        }
        self.by_dir = by_dir;
    }

    /// [`Self::drop_stale_parts`] in directory `d`, whose sent paths
    /// `keep` holds: a temp file of a file sent, not taken as a base and
    /// not this session's own, goes.
    fn drop_stale_in(&self, d: &[u8], keep: &dyn Fn(&[u8]) -> bool) {
        let Ok(fd) = self.root.open_dir(d) else {
            return;
        };
        use std::os::fd::AsRawFd;
        use std::os::unix::ffi::OsStrExt;
        let Ok(rd) = std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd())) else {
            return;
        };
        for e in rd.filter_map(|e| e.ok()) {
            let name = e.file_name().as_bytes().to_vec();
            let s = String::from_utf8_lossy(&name).into_owned();
            let Some(i) = s.rfind(".ramsys-") else {
                continue;
            };
            if !s.starts_with('.') || !s.ends_with(".part") {
                continue;
            }
            if !self.own_suffix.is_empty() && name.ends_with(&self.own_suffix) {
                continue;
            }
            let mut dest = d.to_vec();
            let mut part = d.to_vec();
            if !d.is_empty() {
                dest.push(b'/');
                part.push(b'/');
            }
            dest.extend_from_slice(&name[1..i]);
            part.extend_from_slice(&name);
            if keep(&dest) && !self.used_parts.contains(&part) {
                let _ = self.root.unlink(d, &name);
            }
        }
    }

    /// After MetaEnd (a windowed session: after each batch of records):
    /// digests and block hashes of the files noted since the last call, in
    /// parallel; the Have answer handed to `send` in batches that fit a
    /// CONTROL frame (the Unchanged first, then the comparisons); the first
    /// error stops it. `all_in`: every record has come (MetaEnd), so a
    /// resume knows which temp files no record took: those go, once.
    pub fn answer<E>(
        &mut self,
        table: &FileTable,
        all_in: bool,
        send: &mut dyn FnMut(Vec<Have>) -> Result<(), E>,
    ) -> Result<(), E> {
        if self.resume() && all_in {
            self.drop_stale_parts();
        }
        let root = self.root.clone();
        // The pieces of one big file (issue 19) all ask for the digest of
        // the same final file (`-c`): hashed once.
        let mut first: std::collections::HashMap<&[u8], usize> = Default::default();
        let same: Vec<Option<usize>> = (self.checks.iter().enumerate())
            .map(|(i, (_, p, _, c))| match c {
                Check::Digest => match first.get(&p[..]) {
                    Some(&j) => Some(j),
                    None => {
                        first.insert(&p[..], i);
                        None
                    }
                },
                _ => None,
            })
            .collect();
        let idx: Vec<usize> = (0..self.checks.len()).collect();
        let checks = &self.checks;
        let mut res: Vec<Option<HaveState>> =
            crate::request::sync::par_map(&idx, crate::request::sync::hash_threads(), |&i| {
                let (id, path, size, c) = &checks[i];
                if same[i].is_some() {
                    return None;
                }
                let f = root.open_read(path, false).ok()?;
                match c {
                    Check::Digest => crate::request::sync::content_digest(f)
                        .ok()
                        .map(HaveState::Digest),
                    Check::Blocks { base_size, part } => {
                        let bs = crate::request::sync::delta_block(*size);
                        let want = |i: usize| part.as_ref().is_none_or(|p| p.has(i));
                        let sums = crate::request::sync::block_sums(&f, *id, *base_size, bs, &want)
                            .ok()?;
                        Some(HaveState::Blocks {
                            block_size: bs,
                            size: *base_size,
                            sums,
                        })
                    }
                }
            });
        for (i, j) in same.iter().enumerate() {
            if let Some(j) = *j {
                res[i] = res[j].clone();
            }
        }
        let mut compared = Vec::new();
        for ((id, _, _, c), r) in std::mem::take(&mut self.checks).into_iter().zip(res) {
            let Some(state) = r else { continue };
            match c {
                Check::Blocks { part: Some(p), .. } => table.set_base(id, Base::Part(p.part)),
                Check::Blocks { part: None, .. } => table.set_base(id, Base::Old),
                Check::Digest => {}
            }
            compared.push(Have { id, state });
        }
        let unchanged = std::mem::take(&mut self.unchanged)
            .into_iter()
            .flat_map(|(first, n)| first..first + n)
            .map(|id| Have {
                id,
                state: HaveState::Unchanged,
            });
        // A dry run's entries it would make (on_dry_entry): Blocks with
        // nothing in them, "DST holds none of it" (docs/PROTOCOL.md, Have).
        let made = std::mem::take(&mut self.dry_made_ids)
            .into_iter()
            .map(|id| Have {
                id,
                state: HaveState::Blocks {
                    block_size: 0,
                    size: 0,
                    sums: Vec::new(),
                },
            });
        let mut cur = Vec::new();
        let mut bytes = 0;
        for h in unchanged.chain(compared).chain(made) {
            let sz = 16
                + match &h.state {
                    HaveState::Blocks { sums, .. } => sums.len() * 10 + 16,
                    _ => 10,
                };
            if bytes + sz > (ramsys_proto::frame::MAX_CONTROL_BODY as usize) / 2 && !cur.is_empty()
            {
                send(std::mem::take(&mut cur))?;
                bytes = 0;
            }
            bytes += sz;
            cur.push(h);
        }
        if !cur.is_empty() {
            send(cur)?;
        }
        Ok(())
    }

    /// The source's verdicts. A windowed sink may have dropped the slot of
    /// a file that failed here meanwhile (its Reuse crossed the
    /// SettledThrough): nothing is left to reuse for it. A dry run has no
    /// slots (its files settle with their Ready): a Keep only strikes the
    /// file off the list it would send.
    pub fn on_reuse(&mut self, table: &FileTable, v: Vec<Reuse>) -> Result<(), WriteError> {
        for r in v {
            if self.dry() {
                if let ReuseKind::Keep = r.what {
                    self.kept(r.id);
                }
                continue;
            }
            if table.is_released(r.id) {
                continue;
            }
            match r.what {
                ReuseKind::Keep => {
                    self.kept(r.id);
                    table.keep(r.id, true);
                }
                ReuseKind::Base { bytes } => table.reuse(r.id, bytes)?,
            }
        }
        Ok(())
    }

    /// Resume: save the written blocks of temp files changed since last time.
    pub fn flush(&mut self, table: &FileTable, all: bool) {
        if self.flags & (RESUME | JOURNAL) == 0 || self.dry() {
            return;
        }
        // Nothing to save: no journal is created (the default journal
        // costs nothing until a large file is in flight).
        let rows = table.journal_rows(all);
        if rows.is_empty() {
            return;
        }
        if self.journal.is_none() {
            match Journal::open(self.root.path()) {
                Ok(j) => self.journal = Some(j),
                Err(e) => {
                    tracing::warn!("{e}");
                    return;
                }
            }
        }
        if let Some(j) = &mut self.journal {
            if let Err(e) = j.put(&rows) {
                tracing::warn!("{e}");
            }
        }
    }

    /// After the session's files are in place (or it failed): forget what
    /// completed, keep what did not.
    pub fn close_journal(&mut self, table: &FileTable) {
        self.flush(table, true);
        if let Some(mut j) = self.journal.take() {
            let removed = j.dests().and_then(|held| {
                let mut done = table.final_paths(&held);
                // A windowed session's table no longer holds the files of
                // its settled windows: a row whose temp file is gone (put
                // in place, or removed) has nothing left to resume.
                let listed: HashSet<Vec<u8>> = done.iter().cloned().collect();
                for d in held.iter().filter(|d| !listed.contains(*d)) {
                    let row = j.lookup(d).ok().flatten();
                    if row.is_some_and(|r| !self.part_exists(&r)) {
                        done.push(d.clone());
                    }
                }
                j.remove(&done.iter().map(|p| &p[..]).collect::<Vec<_>>())
            });
            if let Err(e) = removed {
                tracing::warn!("{e}");
            }
            j.close();
        }
    }

    /// Whether a journal row's temp file (or device) is still there.
    fn part_exists(&self, r: &PartRec) -> bool {
        let (parent, _) = split_parent(&r.dest);
        let p = match parent.is_empty() {
            true => r.part.clone(),
            false => [parent, b"/", &r.part].concat(),
        };
        matches!(self.root.lstat(&p), Ok(Some(_)))
    }

    /// Orphans (issue 15): once a transfer to `dest` has succeeded, journal
    /// rows under it that this session did not leave (an older interrupted
    /// run, files the source no longer has) go, with their temp files. Only
    /// temp names (`.NAME.ramsys-*.part`) are ever removed, never a final
    /// name, and only those untouched since this session started (another
    /// session may be writing into the same tree).
    pub fn clean_orphans(&mut self, dest: &[u8], since: std::time::SystemTime) {
        if self.journal.is_none()
            && !self
                .root
                .path()
                .join(crate::request::reserved::JOURNAL_NAME)
                .exists()
        {
            return;
        }
        let Ok(mut j) = Journal::open(self.root.path()) else {
            return;
        };
        let rows = j.rows_under(dest).unwrap_or_default();
        let mut gone: Vec<&[u8]> = Vec::new();
        for r in &rows {
            let (parent, _) = split_parent(&r.dest);
            if !is_temp_name(&r.part) {
                continue;
            }
            let p = if parent.is_empty() {
                r.part.clone()
            } else {
                [parent, b"/", &r.part].concat()
            };
            let fresh = match self.root.lstat(&p) {
                Ok(Some(st)) => {
                    let m = std::time::UNIX_EPOCH
                        + std::time::Duration::new(st.st_mtime as u64, st.st_mtime_nsec as u32);
                    m >= since
                }
                _ => false,
            };
            if fresh {
                continue;
            }
            let _ = self.root.unlink(parent, &r.part);
            gone.push(&r.dest);
        }
        if !gone.is_empty() {
            tracing::info!(
                "removed {} interrupted temp files left by earlier runs",
                gone.len()
            );
        }
        if let Err(e) = j.remove(&gone) {
            tracing::warn!("{e}");
        }
        self.journal = None;
        j.close();
    }

    /// `--delete`, last of all: entries of the sent directories the source
    /// does not have (removed unless dry run), with those deleted in
    /// directories done earlier (DirsDone), in the order of the directory
    /// records as before. Returns (removed, failures).
    pub fn delete(&mut self) -> (Vec<Vec<u8>>, PathFailures) {
        if self.flags & DELETE == 0 {
            return (self.made_way.clone(), Vec::new());
        }
        let mut gone: Vec<(usize, Vec<u8>)> = std::mem::take(&mut self.early);
        let mut failed = std::mem::take(&mut self.early_failed);
        let mut by_dir = self.by_dir.take();
        let mut out = Vec::new();
        for i in 0..self.dirs.len() {
            if self.dir_done[i] {
                continue;
            }
            match &mut by_dir {
                // Every sent directory has its set until it is done.
                Some(k) => match k.sorted(&self.dirs[i]) {
                    Some(kept) => self.extraneous_in(i, &|p| kept.contains(p), &mut out),
                    None => continue,
                },
                None => self.extraneous_in(i, &|p| self.keep.contains(p), &mut out),
            }
            let (done, f) = self.remove_all(i, std::mem::take(&mut out));
            gone.extend(done.into_iter().map(|p| (i, p)));
            failed.extend(f);
        }
        self.by_dir = by_dir;
        // Stable: each directory's names stay sorted.
        gone.sort_by_key(|(i, _)| *i);
        let mut done = match self.dry() {
            true => Vec::new(),
            false => self.made_way.clone(),
        };
        done.extend(gone.into_iter().map(|(_, p)| p));
        (done, failed)
    }

    /// Entries of `dirs[i]` whose paths `keep` does not hold and that the
    /// user's selection does not protect (delete::extraneous_in).
    fn extraneous_in(&self, i: usize, keep: &dyn Fn(&[u8]) -> bool, out: &mut Vec<Vec<u8>>) {
        let d = &self.dirs[i];
        let Some(f) = &self.protect else {
            return super::delete::extraneous_in(&self.root, d, keep, None, out);
        };
        let w = &self.wires[i];
        let protected = |name: &[u8], is_dir: bool| {
            let wire = if w.is_empty() {
                name.to_vec()
            } else {
                [w.as_slice(), b"/", name].concat()
            };
            f.protects(&wire, is_dir)
        };
        super::delete::extraneous_in(&self.root, d, keep, Some(&protected), out)
    }

    /// Remove `gone`, entries of `dirs[i]` (nothing in a dry run, which
    /// reports them as they are): (removed, failures). What the rules
    /// exclude inside a directory that goes stays, with the directory
    /// (rsync's rule).
    fn remove_all(&self, i: usize, gone: Vec<Vec<u8>>) -> (Vec<Vec<u8>>, PathFailures) {
        if self.dry() {
            return (gone, Vec::new());
        }
        let mut done = Vec::new();
        let mut failed = Vec::new();
        for p in gone {
            let r = match &self.protect {
                None => super::delete::remove(&self.root, &p).map(|()| true),
                Some(f) => {
                    let (_, name) = split_parent(&p);
                    let w = &self.wires[i];
                    let wire = match w.is_empty() {
                        true => name.to_vec(),
                        false => [&w[..], b"/", name].concat(),
                    };
                    super::delete::remove_unprotected(&self.root, &p, &wire, &|w, is_dir| {
                        f.protects(w, is_dir)
                    })
                }
            };
            match r {
                Ok(true) => done.push(p),
                Ok(false) => {}
                Err(e) => failed.push((p, format!("delete: {e}"))),
            }
        }
        (done, failed)
    }

    /// What directories removed to make way for a non-directory held
    /// (reported with the deletions, also where `--delete` did not run).
    pub fn made_way(&self) -> Vec<Vec<u8>> {
        self.made_way.clone()
    }

    /// Dry run: what would be sent or made (files, and the symlinks,
    /// hard links and special files DST does not hold as sent), and how
    /// many files were unchanged.
    pub fn planned(&self) -> (Vec<Vec<u8>>, u64) {
        let links = (self.dry_links.iter())
            .filter(|(id, _)| self.dry_files.contains_key(id))
            .flat_map(|(_, names)| names.iter());
        let all = (self.dry_files.values())
            .chain(&self.dry_made)
            .chain(links)
            .cloned();
        (all.collect(), self.dry_kept)
    }
}

/// The journal's destinations, read once when it holds at most
/// `HELD_ROWS_MAX` rows (a set of that many paths is a few MB).
fn held_rows(j: &Journal) -> Option<HashSet<Vec<u8>>> {
    const HELD_ROWS_MAX: u64 = 1 << 16;
    let n = j.count().ok()?;
    (n <= HELD_ROWS_MAX).then(|| j.dests().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::fsops::Confinement;

    fn row(dest: &[u8], part: &[u8]) -> PartRec {
        PartRec {
            dest: dest.to_vec(),
            size: 10,
            mtime: (5, 6),
            part: part.to_vec(),
            block_size: 4,
            written: vec![1],
        }
    }

    fn put(root: &std::path::Path, files: &[&str]) {
        for f in files {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, b"x").unwrap();
        }
    }

    /// `--delete` per directory (DirsDone, docs/PROTOCOL.md "Directories
    /// done"): a directory done has its extras deleted then (never our
    /// temp files or what the rules protect) and its names dropped; after a
    /// failure nothing is deleted there; an id not sent does nothing; the
    /// end deletes in the others, and the report lists every deletion in
    /// the order of the directory records.
    #[test]
    fn a_directory_done_is_deleted_then_and_forgotten() {
        let d = tempfile::tempdir().unwrap();
        put(
            d.path(),
            &[
                "a/keep",
                "a/extra",
                "a/.keep.ramsys-1.part",
                "a/x.o",
                "b/keep",
                "b/extra",
            ],
        );
        put(d.path(), &["b/x.o", "c/extra", "top_extra"]);
        let root = Arc::new(Root::open(d.path(), Confinement::Strict).unwrap());
        let mut s = SinkSync::new(SYNC | DELETE, root);
        let sel = ramsys_proto::control::Selection {
            rules: vec![b"- *.o".to_vec()],
            ..Default::default()
        };
        s.protect(crate::request::filter::Filter::new(&sel).unwrap());
        s.by_directory();
        for (id, p) in [(0, ""), (1, "a"), (2, "b"), (3, "c")] {
            s.on_dir(id, p.as_bytes(), p.as_bytes());
        }
        s.remember(b"a/keep");
        s.remember(b"b/keep");
        let held = s.keep_bytes();
        s.dir_done(2, true);
        assert!(!d.path().join("b/extra").exists());
        assert!(d.path().join("b/keep").exists() && d.path().join("b/x.o").exists());
        assert!(s.keep_bytes() < held, "b's names dropped");
        // A failure so far: nothing deleted in c, not at the end either.
        s.dir_done(3, false);
        s.dir_done(7, true);
        assert!(d.path().join("c/extra").exists());
        let (deleted, failed) = s.delete();
        assert!(failed.is_empty(), "{failed:?}");
        assert_eq!(deleted, [&b"top_extra"[..], b"a/extra", b"b/extra"]);
        assert!(d.path().join("a/.keep.ramsys-1.part").exists());
        assert!(d.path().join("a/x.o").exists() && d.path().join("c/extra").exists());
    }

    /// A resume drops a directory's stale temp files when it is done: one
    /// of a file sent and not taken as a base goes; one of a file not sent,
    /// and this session's own, stay.
    #[test]
    fn a_resumed_directory_done_drops_its_stale_temp_files() {
        let d = tempfile::tempdir().unwrap();
        let temps = [".f.ramsys-1.part", ".g.ramsys-1.part", ".f.ramsys-9.part"];
        put(
            d.path(),
            &temps
                .map(|t| format!("a/{t}"))
                .each_ref()
                .map(|s| s.as_str()),
        );
        let root = Arc::new(Root::open(d.path(), Confinement::Strict).unwrap());
        let mut s = SinkSync::new(RESUME, root);
        s.own_temp_suffix(".ramsys-9.part");
        s.by_directory();
        s.on_dir(0, b"a", b"a");
        s.remember(b"a/f");
        s.dir_done(0, true);
        let left: Vec<bool> = temps
            .iter()
            .map(|t| d.path().join("a").join(t).exists())
            .collect();
        assert_eq!(left, [false, true, true]);
    }

    /// A windowed resume's table no longer holds the files of its settled
    /// windows: at the end, a journal row whose temp file is gone goes, one
    /// whose temp file is still there stays (issue 36), and an emptied
    /// journal is removed.
    #[test]
    fn closing_the_journal_drops_rows_whose_temp_file_is_gone() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("a")).unwrap();
        std::fs::write(d.path().join("a/.kept.ramsys-1.part"), b"x").unwrap();
        let root = Arc::new(Root::open(d.path(), Confinement::Strict).unwrap());
        let stats = Arc::new(crate::types::stats::Stats::default());
        let table = FileTable::new(root.clone(), 2, false, false, stats);
        let mut j = Journal::open(d.path()).unwrap();
        let rows = [
            row(b"a/kept", b".kept.ramsys-1.part"),
            row(b"a/placed", b".placed.ramsys-1.part"),
            row(b"top", b".top.ramsys-1.part"),
        ];
        j.put(&rows).unwrap();
        let mut s = SinkSync::new(RESUME, root.clone());
        s.journal = Some(j);
        s.close_journal(&table);
        let j = Journal::open(d.path()).unwrap();
        assert!(j.lookup(b"a/kept").unwrap().is_some());
        assert!(j.lookup(b"a/placed").unwrap().is_none());
        assert!(j.lookup(b"top").unwrap().is_none());
        j.close();
        std::fs::remove_file(d.path().join("a/.kept.ramsys-1.part")).unwrap();
        let mut s = SinkSync::new(RESUME, root);
        s.journal = Some(Journal::open(d.path()).unwrap());
        s.close_journal(&table);
        assert!(!d
            .path()
            .join(crate::request::reserved::JOURNAL_NAME)
            .exists());
    }
}
