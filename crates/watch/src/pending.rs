//! The pending set of a replication job (issue 38): what changed in the
//! source tree and has not reached the destination yet, coalesced into
//! batches.
//!
//! - Renames and deletes are *operations*, kept in order and sent before
//!   the batch's data (a renamed 1 GiB file moves 0 bytes). Only in mirror
//!   mode (`--delete`): without it DST keeps what SRC removed, as `sync`
//!   does, so a rename sends the new name as data and a delete nothing.
//! - Files are *dirty paths*: sent once closed after writing
//!   ([`Change::Closed`]) or quiet for [`PendingConfig::quiet`] after their
//!   last write, never while a writer is still at it. A path's pending
//!   changes follow it through later renames, so what is sent is always
//!   named as the source names it now.
//! - A directory that appeared is a *tree* to scan (its entries may have
//!   been made before any event named them); a directory whose attributes
//!   changed (or whose entries were renamed or removed, which moves its
//!   mtime) is *dir meta*: its mode and mtime are sent again.
//! - A queue overflow, or a pending set above [`PendingConfig::cap`]
//!   entries (a destination away for long), asks for a *full* scan and
//!   forgets the single entries: memory stays bounded and nothing is lost.
//!
//! One batch is in flight at a time; changes that arrive meanwhile apply to
//! it too (a path it holds that is renamed is renamed in it), so a batch
//! that fails goes back into the set exactly as the tree is now. Every
//! mutation is logged ([`LogRec`]) for the journal (crate::journal).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use crate::change::{moved, parent, under, Change};

/// What a dirty path needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A directory's mode and mtime only.
    DirMeta = 0,
    /// A file (or symlink, or special file): its content and attributes.
    File = 1,
    /// A directory and everything below it.
    Tree = 2,
    /// A directory and everything below it, and (mirror mode) nothing
    /// else below it at DST: a renamed path a batch read, which may have
    /// reached DST holding what the source made at its old name after the
    /// rename (the batch reads the source when it sends): extra entries,
    /// or a directory where SRC has a file; or a file a batch with
    /// --delete held out, whatever DST has at its name.
    Mirror = 3,
}

impl Kind {
    pub fn from_u8(v: u8) -> Option<Kind> {
        match v {
            0 => Some(Kind::DirMeta),
            1 => Some(Kind::File),
            2 => Some(Kind::Tree),
            3 => Some(Kind::Mirror),
            _ => None,
        }
    }
}

/// An operation DST applies before the batch's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Rename {
        from: Vec<u8>,
        to: Vec<u8>,
        dir: bool,
    },
    Delete {
        path: Vec<u8>,
        dir: bool,
    },
}

#[derive(Debug, Clone)]
pub struct PendingConfig {
    /// A file written but not closed is sent once this long without writes.
    pub quiet: Duration,
    /// Most dirty paths and operations held; beyond, a full scan instead.
    pub cap: usize,
    /// `--delete`: renames travel as renames, deletes as deletes.
    pub mirror: bool,
}

impl Default for PendingConfig {
    fn default() -> Self {
        PendingConfig {
            quiet: Duration::from_secs(2),
            cap: 1 << 20,
            mirror: true,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Dirty {
    kind: Kind,
    ready_at: Instant,
    since: Instant,
    size: u64,
}

/// A mutation of the pending set, for the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogRec {
    Mark {
        path: Vec<u8>,
        kind: Kind,
    },
    /// Forget `path` (and, `tree`, everything below it).
    Unmark {
        path: Vec<u8>,
        tree: bool,
    },
    /// Everything at or below `from` is now at or below `to`.
    Move {
        from: Vec<u8>,
        to: Vec<u8>,
    },
    Op {
        seq: u64,
        op: Op,
    },
    /// Operations up to `seq` reached DST.
    OpsDone {
        upto: u64,
    },
    Full(bool),
    /// Forget every path and operation (a full scan replaces them).
    Reset,
}

/// What to send next.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    /// Scan and sync the whole tree (after the ops).
    pub full: bool,
    /// In order, with their sequence numbers.
    pub ops: Vec<(u64, Op)>,
    /// Files and trees to send, sorted by path.
    pub files: Vec<(Vec<u8>, Kind)>,
    /// Directories whose mode and mtime to send.
    pub dirs: Vec<Vec<u8>>,
    /// Files below a listed tree (or anywhere, for a full scan) still
    /// being written: the tree goes without them (they follow once closed
    /// or quiet), so DST never shows one half-written and none is sent
    /// twice. At most [`MAX_HOLD`]; beyond that the rest go as they are.
    pub hold: Vec<Vec<u8>>,
    /// Bytes of the files whose size is known.
    pub bytes: u64,
    /// When the oldest change in it happened.
    pub since: Option<Instant>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        !self.full && self.ops.is_empty() && self.files.is_empty() && self.dirs.is_empty()
    }
}

/// Most files a batch holds back ([`Batch::hold`]): each is a filter rule
/// every sent path is matched against.
pub const MAX_HOLD: usize = 256;

struct InFlight {
    files: BTreeMap<Vec<u8>, Dirty>,
    ops: Vec<(u64, Op, Instant)>,
    full: bool,
    ops_done: bool,
}

/// What a batch that ended read, kept until the watcher has applied every
/// event queued before it ended (docs/WATCH.md "Renames behind a batch").
struct Recent {
    /// Its number in [`Pending::ended`].
    n: u64,
    files: BTreeMap<Vec<u8>, Dirty>,
    full: bool,
}

/// Counters for status and metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counters {
    pub changes: u64,
    pub overflows: u64,
    /// The pending set went above its cap and became a full scan.
    pub collapses: u64,
}

pub struct Pending {
    cfg: PendingConfig,
    ops: VecDeque<(u64, Op, Instant)>,
    next_seq: u64,
    dirty: BTreeMap<Vec<u8>, Dirty>,
    inflight: Option<InFlight>,
    /// Mirror mode: what the batches read that ended after the watcher
    /// last caught up ([`Pending::caught_up`]), oldest first. A rename
    /// whose event comes now may have happened before they read, and they
    /// may have put what the source made at its old name since at DST's
    /// old name, or found it gone (docs/WATCH.md "Vanished paths"): for
    /// renames they count as still in flight, and then converge as the
    /// batch in flight does. The kernel queues a rename's
    /// event inside the rename (the parents' locks held), before anything
    /// can be made at its old name, so once every event queued after a
    /// batch ended is applied no such rename can come for it (docs/WATCH.md
    /// "Renames behind a batch"). Not journaled; counted against the cap;
    /// dropped when a full scan is cut.
    recent: VecDeque<Recent>,
    /// Batches ended so far.
    ended: u64,
    full: Option<Instant>,
    log: Vec<LogRec>,
    pub counters: Counters,
}

/// Remove every key at or below `dir` from `m`; returns them.
fn take_under<V>(m: &mut BTreeMap<Vec<u8>, V>, dir: &[u8]) -> Vec<(Vec<u8>, V)> {
    let keys: Vec<Vec<u8>> = m
        .range(dir.to_vec()..)
        .take_while(|(k, _)| k.starts_with(dir))
        .filter(|(k, _)| under(k, dir))
        .map(|(k, _)| k.clone())
        .collect();
    keys.into_iter()
        .filter_map(|k| m.remove(&k).map(|v| (k, v)))
        .collect()
}

impl Pending {
    pub fn new(cfg: PendingConfig) -> Pending {
        Pending {
            cfg,
            ops: VecDeque::new(),
            next_seq: 1,
            dirty: BTreeMap::new(),
            inflight: None,
            recent: VecDeque::new(),
            ended: 0,
            full: None,
            log: Vec::new(),
            counters: Counters::default(),
        }
    }

    pub fn config(&self) -> &PendingConfig {
        &self.cfg
    }

    /// Mutations since the last call, for the journal.
    pub fn drain_log(&mut self) -> Vec<LogRec> {
        std::mem::take(&mut self.log)
    }

    /// Paths and operations waiting (not counting a batch in flight).
    pub fn depth(&self) -> usize {
        self.dirty.len() + self.ops.len()
    }

    /// Bytes of the waiting files whose size is known.
    pub fn bytes(&self) -> u64 {
        self.dirty.values().map(|d| d.size).sum()
    }

    /// When the oldest change not yet at DST happened (in flight included).
    pub fn oldest(&self) -> Option<Instant> {
        let f = self.inflight.as_ref();
        let times = self
            .dirty
            .values()
            .map(|d| d.since)
            .chain(self.ops.iter().map(|o| o.2))
            .chain(
                f.into_iter()
                    .flat_map(|f| f.files.values().map(|d| d.since)),
            )
            .chain(f.into_iter().flat_map(|f| f.ops.iter().map(|o| o.2)))
            .chain(self.full);
        times.min()
    }

    pub fn in_flight(&self) -> bool {
        self.inflight.is_some()
    }

    /// A full scan is due (start, overflow, the safety-net period).
    pub fn request_full(&mut self, now: Instant) {
        if self.full.is_none() {
            self.full = Some(now);
            self.log.push(LogRec::Full(true));
        }
    }

    pub fn full_requested(&self) -> bool {
        self.full.is_some()
    }

    /// Apply one change seen at `now`; `size` is the file's size where the
    /// caller knows it (0 otherwise).
    pub fn apply(&mut self, c: Change, now: Instant, size: u64) {
        self.counters.changes += 1;
        let quiet = now + self.cfg.quiet;
        match c {
            Change::Closed(p) => self.mark(p, Kind::File, now, now, size),
            Change::Modified(p) => self.mark(p, Kind::File, quiet, now, size),
            Change::Created {
                path,
                dir: true,
                settled: _,
            } => self.mark(path, Kind::Tree, now, now, 0),
            Change::Created { path, settled, .. } => {
                let at = if settled { now } else { quiet };
                self.mark(path, Kind::File, at, now, size)
            }
            Change::Attrib { path, dir } => {
                if !self.dirty.contains_key(&path) {
                    let k = if dir { Kind::DirMeta } else { Kind::File };
                    self.mark(path, k, now, now, size)
                }
            }
            Change::Deleted { path, dir } => self.delete(path, dir, now),
            Change::Renamed { from, to, dir } => self.rename(from, to, dir, now),
            Change::Rescan(p) => self.mark(p, Kind::Tree, now, now, 0),
            Change::Overflow => {
                self.counters.overflows += 1;
                self.request_full(now);
            }
        }
        self.bound(now);
    }

    /// How many batches have ended (the watcher notes it before it reads).
    pub fn ended(&self) -> u64 {
        self.ended
    }

    /// Every event queued before batch `upto` ([`Pending::ended`]) ended
    /// has been applied: no rename from before the reads of the batches up
    /// to it can still come, and what they read is forgotten (docs/WATCH.md
    /// "Renames behind a batch").
    pub fn caught_up(&mut self, upto: u64) {
        while self.recent.front().is_some_and(|r| r.n <= upto) {
            self.recent.pop_front();
        }
    }

    fn recent_len(&self) -> usize {
        self.recent.iter().map(|r| r.files.len()).sum()
    }

    /// Above the cap (waiting paths, operations, what recent batches
    /// read): a full scan instead.
    fn bound(&mut self, now: Instant) {
        if self.depth() + self.recent_len() > self.cfg.cap {
            self.collapse(now);
        }
    }

    fn mark(&mut self, path: Vec<u8>, kind: Kind, ready_at: Instant, now: Instant, size: u64) {
        match self.dirty.get_mut(&path) {
            Some(d) => {
                if kind > d.kind {
                    d.kind = kind;
                    self.log.push(LogRec::Mark { path, kind });
                }
                // The latest event decides: a close makes it ready now, a
                // write after it waits again.
                if kind != Kind::DirMeta {
                    d.ready_at = ready_at;
                }
                if size > 0 {
                    d.size = size;
                }
            }
            None => {
                self.log.push(LogRec::Mark {
                    path: path.clone(),
                    kind,
                });
                let d = Dirty {
                    kind,
                    ready_at,
                    since: now,
                    size,
                };
                self.dirty.insert(path, d);
            }
        }
    }

    /// Forget the pending changes at (and, for a directory, below) `path`,
    /// in the set and in the batch in flight. True when a batch may have
    /// put at DST, at or below `path`, an entry SRC made there after the
    /// event that calls this (docs/WATCH.md "Deletes behind a batch"): the
    /// batch in flight or a recent one read a path there, or a mirror is
    /// marked there.
    fn forget(&mut self, path: &[u8], dir: bool) -> bool {
        let taken = if dir {
            take_under(&mut self.dirty, path)
        } else {
            self.dirty.remove_entry(path).into_iter().collect()
        };
        let mut journaled = !taken.is_empty();
        let mut read = taken.iter().any(|(_, d)| d.kind == Kind::Mirror);
        // The batch in flight's paths are in the journal too.
        if let Some(f) = &mut self.inflight {
            let had = if dir {
                !take_under(&mut f.files, path).is_empty()
            } else {
                f.files.remove(path).is_some()
            };
            journaled |= had;
            read |= had;
        }
        // The recent batches' are not (they count as in flight for
        // renames only).
        for r in &mut self.recent {
            read |= if dir {
                !take_under(&mut r.files, path).is_empty()
            } else {
                r.files.remove(path).is_some()
            };
        }
        if journaled {
            self.log.push(LogRec::Unmark {
                path: path.to_vec(),
                tree: dir,
            });
        }
        read
    }

    fn push_op(&mut self, op: Op, now: Instant) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.log.push(LogRec::Op {
            seq,
            op: op.clone(),
        });
        self.ops.push_back((seq, op, now));
    }

    fn dir_meta(&mut self, dir: &[u8], now: Instant) {
        self.mark(dir.to_vec(), Kind::DirMeta, now, now, 0);
    }

    fn delete(&mut self, path: Vec<u8>, dir: bool, now: Instant) {
        let read = self.forget(&path, dir);
        // The parent's mtime moved; sync sets it at DST in both modes.
        let p = parent(&path).to_vec();
        if self.cfg.mirror {
            if read {
                // A batch read `path` (or below it) before this event
                // came, perhaps after the delete: DST may hold there what
                // SRC made at the name since, of either kind, which a
                // later rename of a parent would carry away unmarked, or
                // which (another kind) the delete would leave. DST's entry
                // goes whatever its kind: what SRC has there now came
                // after this event, whose own events mark it again
                // (docs/WATCH.md "Deletes behind a batch").
                let other = Op::Delete {
                    path: path.clone(),
                    dir: !dir,
                };
                self.push_op(other, now);
            }
            self.push_op(Op::Delete { path, dir }, now);
        }
        self.dir_meta(&p, now);
    }

    fn rename(&mut self, from: Vec<u8>, to: Vec<u8>, dir: bool, now: Instant) {
        if from == to {
            return;
        }
        if !self.cfg.mirror {
            // sync without --delete keeps the old name at DST: the new one
            // is new data.
            self.forget(&from, dir);
            let kind = if dir { Kind::Tree } else { Kind::File };
            self.dir_meta(parent(&from), now);
            self.mark(to, kind, now, now, 0);
            return;
        }
        // What was at `to` is replaced by what comes from `from`, but its
        // pending paths stay, the batch in flight's too: fanotify names a
        // directory as it is when the event is read, so a change made in
        // `from` before the rename may already be here as one under `to`.
        // Sent after the rename op, one that was the old `to`'s costs a
        // quick check (or is found gone).
        // A mirror marked at `from`: DST may hold there an entry of the
        // other kind (docs/WATCH.md "Files held out of a mirror"), which
        // the rename (of the kind named only) would leave behind.
        let mirror = |d: &Dirty| d.kind == Kind::Mirror;
        let other = self.dirty.get(&from).is_some_and(mirror)
            || (self.inflight.as_ref()).is_some_and(|f| f.files.get(&from).is_some_and(mirror));
        // The batches that ended before this event came count as in flight
        // here (docs/WATCH.md "Renames behind a batch"): they may have read
        // after the rename, as the one in flight may.
        let mut read = self.take_read(&to);
        if let Some(f) = &mut self.inflight {
            read.extend(take_under(&mut f.files, &to));
        }
        for (p, d) in read {
            self.log.push(LogRec::Mark {
                path: p.clone(),
                kind: d.kind,
            });
            let e = self.dirty.entry(p).or_insert(Dirty { ready_at: now, ..d });
            e.kind = e.kind.max(d.kind);
        }
        let moving = take_under(&mut self.dirty, &from);
        for (p, d) in moving {
            let e = self.dirty.entry(moved(&p, &from, &to)).or_insert(d);
            e.kind = e.kind.max(d.kind);
        }
        self.log.push(LogRec::Move {
            from: from.clone(),
            to: to.clone(),
        });
        // The batch in flight (or a recent one) may have read these before
        // or after the rename: they are sent again under their new names
        // (a quick check at DST makes that free when the content got
        // there). What it reads after the rename is what the source made
        // at the old name since, which the rename op then carries to the
        // new one: a tree with extra entries, or a directory where it
        // listed a file (a listed path is sent with what is below it). The
        // new name is sent as a mirror: extra entries removed, a directory
        // in a file's way made way for.
        let mut read = self.take_read(&from);
        if let Some(f) = &mut self.inflight {
            read.extend(take_under(&mut f.files, &from));
        }
        for (p, mut d) in read {
            let q = moved(&p, &from, &to);
            if d.kind != Kind::DirMeta {
                d.kind = Kind::Mirror;
            }
            self.log.push(LogRec::Mark {
                path: q.clone(),
                kind: d.kind,
            });
            let e = self.dirty.entry(q).or_insert(Dirty { ready_at: now, ..d });
            e.kind = e.kind.max(d.kind);
        }
        let (pf, pt) = (parent(&from).to_vec(), parent(&to).to_vec());
        if other {
            let op = Op::Delete {
                path: from.clone(),
                dir: !dir,
            };
            self.push_op(op, now);
        }
        if self.unsure(&from) {
            // The batch in flight (or a recent one) reads a tree holding
            // `from` (or all of it, a full scan) when it sends, or did
            // before this event came: DST's `from` may then be what
            // SRC made there after the rename, and moving it would put the
            // wrong entry at `to`. Both names are made again instead: what
            // DST has at either goes, and `to` is sent whole.
            self.push_op(
                Op::Delete {
                    path: from.clone(),
                    dir,
                },
                now,
            );
            self.push_op(
                Op::Delete {
                    path: to.clone(),
                    dir,
                },
                now,
            );
            let kind = if dir { Kind::Mirror } else { Kind::File };
            self.mark(to, kind, now, now, 0);
        } else {
            self.push_op(Op::Rename { from, to, dir }, now);
        }
        self.dir_meta(&pf, now);
        self.dir_meta(&pt, now);
    }

    /// Does the batch in flight, or one that ended before the watcher
    /// caught up, read `from` as part of a larger tree (a tree listed
    /// above it, or a full scan)?
    /// One lookup per ancestor, not a pass over the batch: a burst of
    /// renames during a batch of 50,000 files stays cheap.
    fn unsure(&self, from: &[u8]) -> bool {
        let f = self.inflight.as_ref().map(|f| (&f.files, f.full));
        let recent = self.recent.iter().map(|r| (&r.files, r.full));
        f.into_iter().chain(recent).any(|(files, full)| {
            let mut p = from;
            while !full && !p.is_empty() {
                p = parent(p);
                if files.get(p).is_some_and(|d| d.kind >= Kind::Tree) {
                    return true;
                }
            }
            full
        })
    }

    /// Too much pending (DST away for long): a full scan instead of the
    /// single entries, so memory stays bounded.
    fn collapse(&mut self, now: Instant) {
        self.counters.collapses += 1;
        let oldest = self.oldest().unwrap_or(now);
        self.dirty.clear();
        self.ops.clear();
        // A rename applied from now on goes ahead of the full scan, which
        // then makes DST as SRC is.
        self.recent.clear();
        self.log.push(LogRec::Reset);
        self.full = None;
        self.request_full(oldest);
    }

    /// The next batch, if anything is ready and none is in flight; and
    /// when the earliest path not yet ready will be (for the caller's
    /// sleep).
    pub fn take(&mut self, now: Instant, max_files: usize) -> (Option<Batch>, Option<Instant>) {
        if self.inflight.is_some() {
            return (None, None);
        }
        let mut next: Option<Instant> = None;
        let mut ready = Vec::new();
        for (p, d) in &self.dirty {
            if d.ready_at <= now {
                if ready.len() < max_files.max(1) || self.full.is_some() {
                    ready.push(p.clone());
                }
            } else {
                next = Some(next.map_or(d.ready_at, |n: Instant| n.min(d.ready_at)));
            }
        }
        if ready.is_empty() && self.ops.is_empty() && self.full.is_none() {
            return (None, next);
        }
        let mut b = Batch {
            full: self.full.is_some(),
            since: self.full,
            ..Default::default()
        };
        let mut f = InFlight {
            files: BTreeMap::new(),
            ops: self.ops.drain(..).collect(),
            full: b.full,
            ops_done: false,
        };
        self.full = None;
        if f.full {
            // A rename that comes from now on finds this scan in flight or
            // recent (unsure), or came before it.
            self.recent.clear();
        }
        for (seq, op, at) in &f.ops {
            b.ops.push((*seq, op.clone()));
            b.since = Some(b.since.map_or(*at, |s| s.min(*at)));
        }
        for p in ready {
            let d = self.dirty.remove(&p).expect("listed above");
            b.since = Some(b.since.map_or(d.since, |s| s.min(d.since)));
            b.bytes += d.size;
            match d.kind {
                Kind::DirMeta => b.dirs.push(p.clone()),
                k => b.files.push((p.clone(), k)),
            }
            f.files.insert(p, d);
        }
        if f.ops.is_empty() {
            f.ops_done = true;
        }
        b.hold = self.held(&b, now);
        if self.cfg.mirror && (b.full || b.files.iter().any(|(_, k)| *k == Kind::Mirror)) {
            // The batch runs with --delete, which leaves what it holds
            // out: DST keeps whatever is at those names, perhaps a
            // directory a rename carried there. Sent as mirrors, the files
            // make way for it (docs/WATCH.md "Files held out of a mirror").
            for p in &b.hold {
                if let Some(d) = self.dirty.get_mut(p) {
                    d.kind = Kind::Mirror;
                    self.log.push(LogRec::Mark {
                        path: p.clone(),
                        kind: Kind::Mirror,
                    });
                }
            }
        }
        self.inflight = Some(f);
        (Some(b), next)
    }

    /// The files still being written that `b` would send inside a tree.
    fn held(&self, b: &Batch, now: Instant) -> Vec<Vec<u8>> {
        let trees: std::collections::HashSet<&[u8]> = b
            .files
            .iter()
            .filter(|(_, k)| *k >= Kind::Tree)
            .map(|(p, _)| p.as_slice())
            .collect();
        if trees.is_empty() && !b.full {
            return Vec::new();
        }
        let inside = |p: &[u8]| {
            let mut q = p;
            while !q.is_empty() {
                q = parent(q);
                if trees.contains(q) {
                    return true;
                }
            }
            false
        };
        self.dirty
            .iter()
            // A mirror not ready is such a file too (it was held before,
            // or a renamed file of a batch written again).
            .filter(|(p, d)| {
                matches!(d.kind, Kind::File | Kind::Mirror)
                    && d.ready_at > now
                    && (b.full || inside(p))
            })
            .map(|(p, _)| p.clone())
            .take(MAX_HOLD)
            .collect()
    }

    /// The batch's operations reached DST. `missing`: renames whose source
    /// DST did not have (it never got it, or lost it): their targets are
    /// sent as data instead.
    pub fn ops_applied(&mut self, missing: &[(Vec<u8>, bool)], now: Instant) {
        let Some(f) = &mut self.inflight else { return };
        f.ops_done = true;
        if let Some((seq, _, _)) = f.ops.last() {
            self.log.push(LogRec::OpsDone { upto: *seq });
        }
        for (to, dir) in missing {
            let kind = if *dir { Kind::Tree } else { Kind::File };
            self.mark(to.clone(), kind, now, now, 0);
        }
    }

    /// The batch in flight ended. `ok`: its data reached DST, except the
    /// `failed` paths (sent again once quiet). A path it found gone needs
    /// nothing: the delete or rename that took it comes as an event, and a
    /// rename finds it in `recent` (docs/WATCH.md "Vanished paths"). Not
    /// `ok`: all of it goes back (its operations too, unless
    /// [`Pending::ops_applied`] said they arrived).
    pub fn finish(&mut self, ok: bool, failed: &[Vec<u8>], now: Instant) {
        let Some(mut f) = self.inflight.take() else {
            return;
        };
        if ok {
            for p in f.files.keys() {
                if !self.dirty.contains_key(p) {
                    self.log.push(LogRec::Unmark {
                        path: p.clone(),
                        tree: false,
                    });
                }
            }
            if f.full {
                self.log.push(LogRec::Full(self.full.is_some()));
            }
            let quiet = now + self.cfg.quiet;
            for p in failed {
                self.mark(p.clone(), Kind::File, quiet, now, 0);
            }
            self.keep_read(f.files, f.full);
            self.bound(now);
            return;
        }
        if !f.ops_done {
            for o in f.ops.drain(..).rev() {
                self.ops.push_front(o);
            }
        }
        for (p, d) in &f.files {
            // A newer change of the same path keeps its own timing, and
            // the larger need of the two (a tree over its dir meta).
            let e = self.dirty.entry(p.clone()).or_insert(Dirty {
                ready_at: now,
                ..*d
            });
            e.kind = e.kind.max(d.kind);
        }
        if f.full {
            self.request_full(now);
        }
        // It may have put part of what it read at DST before it failed.
        self.keep_read(f.files, f.full);
        self.bound(now);
    }

    /// A batch ended; mirror mode keeps what it read in `recent`.
    fn keep_read(&mut self, files: BTreeMap<Vec<u8>, Dirty>, full: bool) {
        self.ended += 1;
        if self.cfg.mirror && (full || !files.is_empty()) {
            let n = self.ended;
            self.recent.push_back(Recent { n, files, full });
        }
    }

    /// The recent batches' paths at or below `dir`, taken out.
    fn take_read(&mut self, dir: &[u8]) -> Vec<(Vec<u8>, Dirty)> {
        let mut v = Vec::new();
        for r in &mut self.recent {
            v.extend(take_under(&mut r.files, dir));
        }
        v
    }

    /// Restore from the journal: paths (ready now), operations in order,
    /// and whether a full scan was due. Logs nothing (it is the journal).
    pub fn restore(&mut self, paths: Vec<(Vec<u8>, Kind)>, ops: Vec<(u64, Op)>, full: bool) {
        let now = Instant::now();
        for (p, kind) in paths {
            let d = Dirty {
                kind,
                ready_at: now,
                since: now,
                size: 0,
            };
            self.dirty.insert(p, d);
        }
        for (seq, op) in ops {
            self.next_seq = self.next_seq.max(seq + 1);
            self.ops.push_back((seq, op, now));
        }
        if full {
            self.full = Some(now);
        }
    }
}

#[cfg(test)]
mod tests;
