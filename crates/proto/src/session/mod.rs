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
//! `source.rs` and `sink.rs` the two machines; `checks.rs` the sink's
//! checks of metadata records and attributes from a peer; `tests.rs`
//! whole sessions and hostile orders through both machines.

mod checks;
mod sink;
mod source;

pub use sink::{SinkMachine, MAX_GROW_STAGES, MAX_WINDOW_IDS};
pub use source::SourceMachine;

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
}

impl Marks {
    pub(super) fn on(&self) -> bool {
        self.windows == Windows::On
    }

    /// A window flag where the other end's own flag did not come first.
    pub(super) fn unasked(what: &'static str) -> crate::ProtoError {
        crate::ProtoError::malformed(what, "windows confirmed but never proposed")
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

    /// An Entries batch whose first record is `first` (None: a keepalive):
    /// after an Attrs it starts the batch the next Attrs may name.
    pub(super) fn entries(&mut self, first: Option<u64>) {
        if let (Some(id), true) = (first, self.after_attrs) {
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
