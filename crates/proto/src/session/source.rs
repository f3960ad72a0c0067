//! The source end's machine: which messages it may send and receive in
//! which phase.

use super::Phase;
use crate::control::Control;
use crate::ProtoError;

/// The source end of a session. The source may stream its metadata right
/// after Propose, before Confirm arrives: nothing in the records depends on
/// the answer, and pipelining them saves a round trip on long paths.
#[derive(Debug)]
pub struct SourceMachine {
    phase: Phase,
    proposed: bool,
    confirmed: bool,
    /// SyncMode sent (docs/SYNC.md): Have, Reuse and Deleted allowed.
    sync: bool,
    sent_entries: bool,
    /// Preserve sent (crate::attrs): Attrs allowed.
    preserve: bool,
    /// Grown sent: once per session.
    grown: bool,
}

impl Default for SourceMachine {
    fn default() -> Self {
        Self::new()
    }
}

impl SourceMachine {
    pub fn new() -> Self {
        SourceMachine {
            phase: Phase::Negotiate,
            proposed: false,
            confirmed: false,
            sync: false,
            sent_entries: false,
            preserve: false,
            grown: false,
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Validate a message this end is about to send.
    pub fn on_send(&mut self, m: &Control) -> Result<(), ProtoError> {
        use Phase::*;
        self.phase = match (self.phase, m) {
            (_, Control::Abort { .. }) => Aborted,
            (Negotiate, Control::Propose(_)) if !self.proposed => {
                self.proposed = true;
                Negotiate
            }
            (Negotiate, Control::SyncMode { flags })
                if self.proposed && !self.sync && !self.sent_entries =>
            {
                if flags & !crate::control::sync::ALL != 0 {
                    return Err(ProtoError::malformed("sync mode", "unknown flags"));
                }
                self.sync = true;
                Negotiate
            }
            (Negotiate, Control::Preserve { flags })
                if self.proposed && !self.preserve && !self.sent_entries =>
            {
                if flags & !crate::attrs::preserve::ALL != 0 {
                    return Err(ProtoError::malformed("preserve", "unknown flags"));
                }
                self.preserve = true;
                Negotiate
            }
            (Negotiate | Metadata, Control::Entries(_)) if self.proposed => {
                self.sent_entries = true;
                Metadata
            }
            (Metadata, Control::Attrs(_)) if self.preserve => Metadata,
            (Negotiate | Metadata, Control::ScanFailed { .. }) if self.proposed => self.phase,
            (Negotiate | Metadata, Control::MetaEnd { .. }) if self.proposed => {
                self.sent_entries = true;
                Syncing
            }
            (Payload, Control::Reuse(_)) if self.sync => Payload,
            (Payload, Control::FilesDone(_) | Control::FileFailed { .. }) => Payload,
            (Payload, Control::LinkDown { .. }) => Payload,
            (Payload, Control::AddStream { .. }) => Payload,
            // Right before EndOfData, once (a pull's growth, issue 21).
            (Payload, Control::Grown { .. } | Control::GrownLinks { .. }) if !self.grown => {
                self.grown = true;
                Payload
            }
            (Payload, Control::EndOfData { .. }) => Completing,
            _ => return Err(self.phase.unexpected(m)),
        };
        Ok(())
    }

    /// Validate a message received from the sink.
    pub fn on_recv(&mut self, m: &Control) -> Result<(), ProtoError> {
        use Phase::*;
        self.phase = match (self.phase, m) {
            (_, Control::Abort { .. } | Control::Error { .. }) => Aborted,
            (Negotiate | Metadata | Syncing, Control::Confirm(c))
                if self.proposed && !self.confirmed =>
            {
                if c.streams == 0 || c.block_size == 0 || c.credits_per_stream == 0 {
                    return Err(ProtoError::malformed(
                        "confirm",
                        "zero streams, block or credits",
                    ));
                }
                self.confirmed = true;
                self.phase
            }
            (Syncing, Control::Have(_)) if self.confirmed && self.sync => Syncing,
            (Syncing, Control::SyncDone { .. }) if self.confirmed => Payload,
            (Payload, Control::Resend(_) | Control::Settled) => Payload,
            // A link may break at any time; a Lost sent before the sink
            // saw EndOfData can arrive after we sent it.
            (Payload, Control::Lost { .. }) => Payload,
            (Completing, Control::Lost { .. }) => Completing,
            // The answer to an AddStream sent just before EndOfData.
            (Payload, Control::StreamAdded { .. }) => Payload,
            (Completing, Control::StreamAdded { .. }) => Completing,
            (Completing, Control::Deleted(_)) if self.sync => Completing,
            (Completing, Control::Complete(_)) => Done,
            _ => return Err(self.phase.unexpected(m)),
        };
        Ok(())
    }
}
