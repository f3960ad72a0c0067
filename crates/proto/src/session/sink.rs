//! The sink end's machine: the order of messages and, through
//! `checks.rs`, the consistency of every record a source sends.

use super::checks::{check_attrs, EntryChecker};
use super::Phase;
use crate::control::Control;
use crate::ProtoError;

/// The sink end of a session.
#[derive(Debug)]
pub struct SinkMachine {
    /// pub(super): tests.rs puts a machine straight into a phase.
    pub(super) phase: Phase,
    entries: EntryChecker,
    proposed: Option<crate::control::Propose>,
    /// Flags of a SyncMode received (docs/SYNC.md), None for a plain copy.
    sync: Option<u32>,
    /// Flags of a Preserve received (crate::attrs), None without.
    preserve: Option<u32>,
    /// Grown received: once per session.
    grown: bool,
}

/// Most stages a Grown may report: each stage at least adds one stream,
/// and no session has more than u16::MAX of them; a source reports far
/// fewer (a stage adds half the count again).
pub const MAX_GROW_STAGES: usize = 64;

impl Default for SinkMachine {
    fn default() -> Self {
        Self::new()
    }
}

impl SinkMachine {
    pub fn new() -> Self {
        SinkMachine {
            phase: Phase::Negotiate,
            entries: EntryChecker::default(),
            proposed: None,
            sync: None,
            preserve: None,
            grown: false,
        }
    }

    /// Flags of the Preserve received, if any.
    pub fn preserve_flags(&self) -> Option<u32> {
        self.preserve
    }

    /// Flags of the SyncMode received, if any.
    pub fn sync_flags(&self) -> Option<u32> {
        self.sync
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Number of entries accepted so far (= next expected id).
    pub fn entries_seen(&self) -> u64 {
        self.entries.next_id
    }

    pub fn on_send(&mut self, m: &Control) -> Result<(), ProtoError> {
        use Phase::*;
        self.phase = match (self.phase, m) {
            (_, Control::Abort { .. }) => Aborted,
            (Negotiate, Control::Confirm(c)) => {
                let Some(p) = &self.proposed else {
                    return Err(self.phase.unexpected(m));
                };
                // The sink may lower what was proposed, never raise it.
                if c.streams > p.streams || c.block_size > p.block_size || c.streams == 0 {
                    return Err(ProtoError::malformed("confirm", "exceeds proposal"));
                }
                Metadata
            }
            (Syncing, Control::Have(_)) if self.sync.is_some() => Syncing,
            (Syncing, Control::SyncDone { .. }) => Payload,
            (Payload, Control::Resend(_) | Control::Settled | Control::Lost { .. }) => Payload,
            (Payload, Control::StreamAdded { .. }) => Payload,
            (Completing, Control::Deleted(_)) if self.sync.is_some() => Completing,
            (Completing, Control::Complete(_)) => Done,
            _ => return Err(self.phase.unexpected(m)),
        };
        Ok(())
    }

    pub fn on_recv(&mut self, m: &Control) -> Result<(), ProtoError> {
        use Phase::*;
        self.phase = match (self.phase, m) {
            (_, Control::Abort { .. } | Control::Error { .. }) => Aborted,
            (Negotiate, Control::Propose(p)) if self.proposed.is_none() => {
                if p.streams == 0 || p.block_size == 0 {
                    return Err(ProtoError::malformed(
                        "propose",
                        "zero streams or block size",
                    ));
                }
                self.proposed = Some(p.clone());
                Negotiate
            }
            // Right behind Propose, so it may arrive after Confirm left.
            (Negotiate | Metadata, Control::SyncMode { flags })
                if self.proposed.is_some() && self.sync.is_none() && self.entries.next_id == 0 =>
            {
                if flags & !crate::control::sync::ALL != 0 {
                    return Err(ProtoError::malformed("sync mode", "unknown flags"));
                }
                self.sync = Some(*flags);
                self.phase
            }
            (Negotiate | Metadata, Control::Preserve { flags })
                if self.proposed.is_some()
                    && self.preserve.is_none()
                    && self.entries.next_id == 0 =>
            {
                if flags & !crate::attrs::preserve::ALL != 0 {
                    return Err(ProtoError::malformed("preserve", "unknown flags"));
                }
                self.preserve = Some(*flags);
                self.phase
            }
            (Metadata, Control::Entries(es)) => {
                for e in es {
                    self.entries.check(e)?;
                }
                Metadata
            }
            (Metadata, Control::ScanFailed { .. }) => Metadata,
            (Metadata, Control::Attrs(v)) if self.preserve.is_some() => {
                check_attrs(v, self.entries.next_id)?;
                Metadata
            }
            (
                Metadata,
                Control::MetaEnd {
                    entries,
                    files,
                    bytes,
                },
            ) => {
                if *entries != self.entries.next_id
                    || *files != self.entries.files
                    || *bytes != self.entries.bytes
                {
                    return Err(ProtoError::malformed(
                        "meta end",
                        "counts do not match the records received",
                    ));
                }
                Syncing
            }
            (Payload, Control::FilesDone(v)) => {
                if v.iter().any(|(id, _)| *id >= self.entries.next_id) {
                    return Err(ProtoError::malformed("files done", "unknown file id"));
                }
                Payload
            }
            (Payload, Control::FileFailed { id, .. }) => {
                if *id >= self.entries.next_id {
                    return Err(ProtoError::malformed("file failed", "unknown file id"));
                }
                Payload
            }
            (Payload, Control::Reuse(v)) if self.sync.is_some() => {
                if v.iter().any(|r| r.id >= self.entries.next_id) {
                    return Err(ProtoError::malformed("reuse", "unknown file id"));
                }
                Payload
            }
            (Payload, Control::LinkDown { .. }) => Payload,
            (Payload, Control::AddStream { .. }) => Payload,
            (Payload, Control::Grown { stages, .. }) if !self.grown => {
                if stages.len() > MAX_GROW_STAGES {
                    return Err(ProtoError::malformed("grown", "too many stages"));
                }
                self.grown = true;
                Payload
            }
            (Payload, Control::GrownLinks { stages, links, .. }) if !self.grown => {
                if stages.len() > MAX_GROW_STAGES || links.len() != stages.len() {
                    return Err(ProtoError::malformed(
                        "grown",
                        "too many stages, or not one links record per stage",
                    ));
                }
                self.grown = true;
                Payload
            }
            (Payload, Control::EndOfData { .. }) => Completing,
            _ => return Err(self.phase.unexpected(m)),
        };
        Ok(())
    }
}
