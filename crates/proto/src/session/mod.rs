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

pub use sink::{SinkMachine, MAX_GROW_STAGES};
pub use source::SourceMachine;

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
