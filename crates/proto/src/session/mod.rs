//! Session state machines for the two ends of a transfer, independent of
//! which end is the daemon.
//!
//! The source always proposes and the sink always confirms (seed 000
//! Fig. 6-4a); the source then streams all metadata without waiting and
//! the sink answers one SyncDone (Fig. 6-4b: one round trip for the whole
//! tree); payload flows on the data links; one EndOfData/Complete exchange
//! ends the session. Each machine checks the order of the messages its end
//! sends and receives and the consistency of metadata records, so a
//! confused or hostile peer is caught here and not deep in the engine.
//!
//! One file per job (issue 37): `mod.rs` the phases and the re-exports;
//! `source.rs` and `sink.rs` the two machines; `relay.rs` the agent's end
//! of a third-party transfer; `checks.rs` the sink's
//! checks of metadata records and attributes from a peer; `tests.rs`
//! whole sessions and hostile orders through both machines.

mod checks;
mod relay;
mod sink;
mod source;

pub use relay::RelayMachine;
pub use sink::{SinkMachine, MAX_GROW_STAGES, MAX_WINDOW_IDS};
pub use source::SourceMachine;

use std::collections::VecDeque;

use crate::control::Entry;
use crate::frame::{ANY_WINDOWS, DIRS_DONE_FLAG, WINDOW_LIMIT_FLAG};
use crate::ProtoError;

/// The window (ids, record bytes) a source that proposed with
/// frame::WINDOW_LIMIT_FLAG keeps to until it has read the sink's answer
/// (issue 36, docs/PROTOCOL.md "Windows"): a tree this small still
/// travels whole in Propose's flight, and a sink with a small memory
/// budget is not sent more before it can say so (about 190 KB of slots
/// and names at the sink).
pub const FIRST_WINDOW: (u64, u64) = (512, 128 << 10);
/// The least window a sink may announce (Control::Window): a window of
/// no id would never move, and 16 KiB holds a record of the longest path
/// (path::MAX_PATH) three times.
pub const MIN_WINDOW: (u64, u64) = (64, 16 << 10);
/// The most record bytes a sink may announce.
pub const MAX_WINDOW_BYTES: u64 = 1 << 32;

/// What a record weighs in a window's bytes (Control::Window, and the
/// source's own window): its path and 16 for the rest of it.
pub fn record_bytes(e: &Entry) -> u64 {
    e.path.len() as u64 + 16
}

/// A Placed (issue 36): at most [`crate::control::MAX_PLACED`] paths,
/// each a valid relative path (a record's).
fn check_placed(files: &[Vec<u8>]) -> Result<(), ProtoError> {
    if files.len() > crate::control::MAX_PLACED {
        return Err(ProtoError::malformed("placed", "too many paths"));
    }
    for f in files {
        crate::path::validate_relative(f)?;
    }
    Ok(())
}

/// A window the records keep to (docs/PROTOCOL.md "Windows"): ids below
/// the settled mark plus `files`, and at most `bytes` of the records not
/// yet settled. Both machines keep it: the sink refuses records beyond
/// it, the source refuses to send them.
#[derive(Debug)]
pub(super) struct Limit {
    files: u64,
    bytes: u64,
    /// (one past the last id, record bytes) of each Entries batch not
    /// yet settled.
    batches: VecDeque<(u64, u64)>,
    held: u64,
}

impl Limit {
    fn first() -> Limit {
        Limit {
            files: FIRST_WINDOW.0,
            bytes: FIRST_WINDOW.1,
            batches: VecDeque::new(),
            held: 0,
        }
    }

    /// A batch of records going out or coming in, with `settled` the
    /// settled mark this end knows. A record of an empty window is taken
    /// whatever its size, so no window stands still (the sink refuses a
    /// path that long on its own: path::MAX_PATH).
    fn entries(&mut self, es: &[Entry], settled: u64) -> Result<(), ProtoError> {
        let Some(last) = es.last() else {
            return Ok(());
        };
        let mut held = self.held;
        for e in es {
            let b = record_bytes(e);
            if e.id >= settled.saturating_add(self.files) || (held > 0 && held + b > self.bytes) {
                return Err(ProtoError::malformed(
                    "entry",
                    format!(
                        "id {} beyond the window of {} ids and {} bytes",
                        e.id, self.files, self.bytes
                    ),
                ));
            }
            held += b;
        }
        self.batches.push_back((last.id + 1, held - self.held));
        self.held = held;
        Ok(())
    }

    fn settled(&mut self, through: u64) {
        while let Some(&(end, b)) = self.batches.front() {
            if end > through {
                break;
            }
            self.batches.pop_front();
            self.held -= b;
        }
    }
}

/// Windowed metadata (issue 36, frame::WINDOWS_FLAG on Propose and
/// Confirm): the metadata runs ahead of the data by a window of ids
/// instead of ending before the payload starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Windows {
    /// Not proposed, or the sink did not take them: today's phases.
    #[default]
    Off,
    /// Propose carried the flag; Confirm has not answered yet.
    Proposed,
    /// Confirm carried it too: Entries, ScanFailed and MetaEnd continue
    /// into the payload, paced by Ready and SettledThrough.
    On,
}

/// What a windowed session has said of its ids so far (both machines).
#[derive(Debug, Default)]
pub(super) struct Marks {
    pub(super) windows: Windows,
    /// Every id below it has a slot at the sink (Ready).
    pub(super) ready: u64,
    /// Every id below it is settled (SettledThrough).
    pub(super) settled: u64,
    /// MetaEnd sent or received.
    pub(super) meta_end: bool,
    /// A windowed sync's Have records since the last Ready: at most one
    /// per id of the window being readied, so a sink cannot grow the
    /// source's answer past the window by repeating ids.
    pub(super) answered: u64,
    /// The first id of the Entries since the last Attrs (or 0), and
    /// whether an Attrs came since those Entries: in a session that
    /// proposed windows an Attrs names only records of the batch it
    /// follows, so nothing of an entry outlives its window.
    pub(super) attrs_from: u64,
    pub(super) after_attrs: bool,
    /// The window in force (frame::WINDOW_LIMIT_FLAG): the first window
    /// from the Propose on, the sink's once it sent Window; None: only
    /// [`MAX_WINDOW_IDS`].
    pub(super) limit: Option<Limit>,
    /// Confirm carried WINDOW_LIMIT_FLAG: the sink's next message is its
    /// Window.
    pub(super) window_due: bool,
    /// Directories done (frame::DIRS_DONE_FLAG): proposed, then taken.
    pub(super) dirs: DirMarks,
}

/// DirsDone (frame::DIRS_DONE_FLAG, docs/PROTOCOL.md "Directories done"):
/// negotiated, the Dir records sent (ids 0 .. `count`: directories come
/// first), and which of them were named done, a bit each, so none twice.
#[derive(Debug, Default)]
pub(super) struct DirMarks {
    proposed: bool,
    pub(super) on: bool,
    count: u64,
    done: Vec<u64>,
}

impl DirMarks {
    pub(super) fn proposed(&self) -> bool {
        self.proposed
    }

    /// Dir records among a batch (ids in order, checked elsewhere): the
    /// leading run of directories from id `count` on.
    fn records(&mut self, es: &[Entry]) {
        for e in es {
            if e.kind == crate::control::EntryKind::Dir && e.id == self.count {
                self.count += 1;
            }
        }
    }

    /// A DirsDone: each id a Dir record sent, not named before.
    fn done(&mut self, ids: &[u64]) -> Result<(), ProtoError> {
        for &id in ids {
            if id >= self.count {
                return Err(ProtoError::malformed(
                    "dirs done",
                    format!("id {id} is not a directory sent ({} so far)", self.count),
                ));
            }
            let (word, bit) = ((id / 64) as usize, id % 64);
            if self.done.len() <= word {
                self.done.resize(word + 1, 0);
            }
            if self.done[word] & (1 << bit) != 0 {
                return Err(ProtoError::malformed(
                    "dirs done",
                    format!("directory {id} named done twice"),
                ));
            }
            self.done[word] |= 1 << bit;
        }
        Ok(())
    }
}

impl Marks {
    pub(super) fn on(&self) -> bool {
        self.windows == Windows::On
    }

    /// A window flag where the other end's own flag did not come first.
    pub(super) fn unasked(what: &'static str) -> crate::ProtoError {
        crate::ProtoError::malformed(what, "windows confirmed but never proposed")
    }

    /// A Propose's flags: WINDOW_LIMIT_FLAG only with windows, and then
    /// the first window holds.
    pub(super) fn propose_limit(&mut self, flags: u8) -> Result<(), ProtoError> {
        if flags & WINDOW_LIMIT_FLAG != 0 {
            if flags & ANY_WINDOWS == 0 {
                return Err(ProtoError::malformed(
                    "propose",
                    "a window limit without windows",
                ));
            }
            self.limit = Some(Limit::first());
        }
        if flags & DIRS_DONE_FLAG != 0 {
            if flags & ANY_WINDOWS == 0 {
                return Err(ProtoError::malformed(
                    "propose",
                    "directories done without windows",
                ));
            }
            self.dirs.proposed = true;
        }
        Ok(())
    }

    /// A Confirm's flags (`on`: it takes windows): WINDOW_LIMIT_FLAG only
    /// on one that takes windows the Propose offered it for (a Window is
    /// then due); without it the source keeps its own window.
    pub(super) fn confirm_limit(&mut self, flags: u8, on: bool) -> Result<(), ProtoError> {
        if flags & DIRS_DONE_FLAG != 0 {
            if !(on && self.dirs.proposed) {
                return Err(ProtoError::malformed(
                    "confirm",
                    "directories done never proposed, or without windows",
                ));
            }
            self.dirs.on = true;
        }
        if flags & WINDOW_LIMIT_FLAG == 0 {
            self.limit = None;
        } else if on && self.limit.is_some() {
            self.window_due = true;
        } else {
            return Err(ProtoError::malformed(
                "confirm",
                "a window limit never proposed, or without windows",
            ));
        }
        Ok(())
    }

    /// The sink's Window, due right behind its Confirm. Records the source
    /// sent before it read it kept to the first window, so the sink's
    /// check allows the larger of the two; the source keeps to the Window.
    pub(super) fn window(&mut self, files: u64, bytes: u64) -> Result<(), ProtoError> {
        let (Some(l), true) = (&mut self.limit, self.window_due) else {
            return Err(ProtoError::malformed(
                "window",
                "not right behind a Confirm that announced it",
            ));
        };
        if !(MIN_WINDOW.0..=MAX_WINDOW_IDS).contains(&files)
            || !(MIN_WINDOW.1..=MAX_WINDOW_BYTES).contains(&bytes)
        {
            return Err(ProtoError::malformed(
                "window",
                format!("{files} ids and {bytes} bytes: out of bounds"),
            ));
        }
        (l.files, l.bytes) = (files.max(FIRST_WINDOW.0), bytes.max(FIRST_WINDOW.1));
        self.window_due = false;
        Ok(())
    }

    /// A message other than the Window while it is due.
    pub(super) fn not_window(&self, m: &crate::control::Control) -> Result<(), ProtoError> {
        use crate::control::Control;
        if self.window_due
            && !matches!(
                m,
                Control::Window { .. } | Control::Abort { .. } | Control::Error { .. }
            )
        {
            return Err(ProtoError::Unexpected {
                got: m.name(),
                state: "window due",
            });
        }
        Ok(())
    }

    /// Records within the window in force, if any.
    pub(super) fn limit_entries(&mut self, es: &[Entry]) -> Result<(), ProtoError> {
        match &mut self.limit {
            Some(l) => l.entries(es, self.settled),
            None => Ok(()),
        }
    }

    /// A Ready for `through`, with `announced` records sent so far.
    pub(super) fn ready(&mut self, through: u64, announced: u64) -> Result<(), crate::ProtoError> {
        if !self.on() {
            return Err(crate::ProtoError::malformed(
                "ready",
                "in a session without windows",
            ));
        }
        if through <= self.ready || through > announced {
            return Err(crate::ProtoError::malformed(
                "ready",
                format!(
                    "through {through}: not past {} or beyond the {announced} records announced",
                    self.ready
                ),
            ));
        }
        self.ready = through;
        self.answered = 0;
        Ok(())
    }

    /// A windowed sync's Have records (docs/PROTOCOL.md "Windows"): each
    /// names an id the sink has registered (below `announced`) and not yet
    /// readied (at or past the Ready mark): a window's answer comes before
    /// its Ready, so the source plans the window's reads once. No more
    /// records than the window has ids.
    pub(super) fn have(
        &mut self,
        v: &[crate::control::Have],
        announced: u64,
    ) -> Result<(), crate::ProtoError> {
        if let Some(h) = v.iter().find(|h| h.id < self.ready || h.id >= announced) {
            return Err(crate::ProtoError::malformed(
                "have",
                format!(
                    "id {} outside the window being readied ({} .. {announced})",
                    h.id, self.ready
                ),
            ));
        }
        let answered = self.answered + v.len() as u64;
        if answered > announced - self.ready {
            return Err(crate::ProtoError::malformed(
                "have",
                "more records than the window has ids",
            ));
        }
        self.answered = answered;
        Ok(())
    }

    /// A windowed sync's Reuse verdicts: only for ids the sink readied
    /// (the source plans a window once its Ready came).
    pub(super) fn reuse(&self, v: &[crate::control::Reuse]) -> Result<(), crate::ProtoError> {
        match v.iter().find(|r| r.id >= self.ready) {
            Some(r) => Err(crate::ProtoError::malformed(
                "reuse",
                format!("id {} not below the ready mark {}", r.id, self.ready),
            )),
            None => Ok(()),
        }
    }

    /// An Entries batch (empty: a keepalive): after an Attrs it starts
    /// the batch the next Attrs may name; its Dir records may be named
    /// done later.
    pub(super) fn entries(&mut self, es: &[Entry]) {
        self.dirs.records(es);
        if let (Some(id), true) = (es.first().map(|e| e.id), self.after_attrs) {
            self.attrs_from = id;
            self.after_attrs = false;
        }
    }

    /// An Attrs in a session that proposed windows (docs/PROTOCOL.md
    /// "Windows"): only ids of the Entries batch it follows, at or past
    /// `attrs_from` and below the `announced` records. A sink may have
    /// settled some already (a sync's unchanged files settle with their
    /// Ready): it applies those at once.
    pub(super) fn attrs(
        &mut self,
        v: &[crate::attrs::Attrs],
        announced: u64,
    ) -> Result<(), crate::ProtoError> {
        if let Some(a) = v
            .iter()
            .find(|a| a.id < self.attrs_from || a.id >= announced)
        {
            return Err(crate::ProtoError::malformed(
                "attrs",
                format!(
                    "id {} outside the batch it follows ({} .. {announced})",
                    a.id, self.attrs_from
                ),
            ));
        }
        self.after_attrs = true;
        Ok(())
    }

    /// A DirsDone: negotiated, windows on, before MetaEnd, and naming
    /// only directories sent, each once.
    pub(super) fn dirs_done(&mut self, ids: &[u64]) -> Result<(), ProtoError> {
        if !self.dirs.on || !self.on() || self.meta_end {
            return Err(ProtoError::malformed(
                "dirs done",
                "not negotiated, without windows, or after MetaEnd",
            ));
        }
        self.dirs.done(ids)
    }

    /// A SettledThrough for `through`.
    pub(super) fn settled(&mut self, through: u64) -> Result<(), crate::ProtoError> {
        if !self.on() {
            return Err(crate::ProtoError::malformed(
                "settled through",
                "in a session without windows",
            ));
        }
        if through <= self.settled || through > self.ready {
            return Err(crate::ProtoError::malformed(
                "settled through",
                format!(
                    "through {through}: not past {} or beyond the ready mark {}",
                    self.settled, self.ready
                ),
            ));
        }
        self.settled = through;
        if let Some(l) = &mut self.limit {
            l.settled(through);
        }
        Ok(())
    }
}

/// Phases common to both ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Before Propose/Confirm.
    Negotiate,
    /// Confirm sent/received; metadata flowing.
    Metadata,
    /// MetaEnd sent/received; waiting for SyncDone.
    Syncing,
    /// SyncDone exchanged: payload flowing.
    Payload,
    /// EndOfData exchanged; waiting for Complete.
    Completing,
    /// Complete exchanged.
    Done,
    /// Abort or Error seen.
    Aborted,
}

impl Phase {
    pub(super) fn name(self) -> &'static str {
        match self {
            Phase::Negotiate => "negotiate",
            Phase::Metadata => "metadata",
            Phase::Syncing => "syncing",
            Phase::Payload => "payload",
            Phase::Completing => "completing",
            Phase::Done => "done",
            Phase::Aborted => "aborted",
        }
    }

    /// `m` does not belong in this phase (either machine's refusal).
    pub(super) fn unexpected(self, m: &crate::control::Control) -> crate::ProtoError {
        crate::ProtoError::Unexpected {
            got: m.name(),
            state: self.name(),
        }
    }
}

#[cfg(test)]
mod tests;
