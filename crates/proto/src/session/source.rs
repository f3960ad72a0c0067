//! The source end's machine: which messages it may send and receive in
//! which phase.

use super::{Marks, Phase, Windows};
use crate::control::{Control, Entry, EntryKind};
use crate::frame::{ANY_WINDOWS, PLACED_FLAG, WINDOWS_FLAG};
use crate::ProtoError;

/// The source end of a session. The source may stream its metadata right
/// after Propose, before Confirm arrives: nothing in the records depends on
/// the answer, and pipelining them saves a round trip on long paths.
#[derive(Debug)]
pub struct SourceMachine {
    phase: Phase,
    proposed: bool,
    confirmed: bool,
    /// SyncMode sent (docs/SYNC.md): Have, Reuse and Deleted allowed (in a
    /// windowed session, Have for the window being readied and Reuse for
    /// ids readied).
    sync: bool,
    sent_entries: bool,
    /// Preserve sent (crate::attrs): Attrs allowed.
    preserve: bool,
    /// Grown sent: once per session.
    grown: bool,
    /// Windowed metadata (issue 36): negotiated, and the marks so far.
    marks: Marks,
    /// Records sent (the next id).
    announced: u64,
    /// A Placed asked for (frame::PLACED_FLAG on Propose), and received.
    placed: (bool, bool),
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
            marks: Marks::default(),
            announced: 0,
            placed: (false, false),
        }
    }

    /// Windowed metadata: proposed, taken by the sink, or neither.
    pub fn windows(&self) -> Windows {
        self.marks.windows
    }

    /// The sink takes DirsDone (frame::DIRS_DONE_FLAG on its Confirm).
    pub fn dirs_done(&self) -> bool {
        self.marks.dirs.on
    }

    /// The sink's last Ready and SettledThrough marks.
    pub fn marks(&self) -> (u64, u64) {
        (self.marks.ready, self.marks.settled)
    }

    /// Records about to go out: ids in order from 0, and in a session that
    /// may be windowed no piece; once windows are on, a second name is a
    /// LinkTo (the sink may have dropped the target's slot), before that a
    /// HardLink (the sink cannot, yet: a file settles only after its
    /// digest, which follows every record sent before Confirm was read).
    fn count(&mut self, es: &[Entry]) -> Result<(), ProtoError> {
        let mut next = self.announced;
        for e in es {
            if e.id != next {
                return Err(ProtoError::malformed(
                    "entry",
                    format!("id {} out of order (expected {})", e.id, next),
                ));
            }
            let bad = match e.kind {
                EntryKind::Piece { .. } => self.marks.windows != Windows::Off,
                EntryKind::HardLink { .. } => self.marks.on(),
                EntryKind::LinkTo { .. } => !self.marks.on(),
                _ => false,
            };
            if bad {
                return Err(ProtoError::malformed(
                    "entry",
                    "a piece, or a link of the other kind, for these windows",
                ));
            }
            next += 1;
        }
        // Within the window in force (frame::WINDOW_LIMIT_FLAG); nothing
        // counted of a batch refused.
        self.marks.limit_entries(es)?;
        self.announced = next;
        Ok(())
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Validate a message this end is about to send.
    pub fn on_send(&mut self, m: &Control) -> Result<(), ProtoError> {
        self.on_send_flags(m, 0)
    }

    /// [`Self::on_send`] of a message whose CONTROL frame carries `flags`
    /// (frame::WINDOWS_FLAG or WIDE_WINDOWS_FLAG on Propose: windows
    /// proposed).
    pub fn on_send_flags(&mut self, m: &Control, flags: u8) -> Result<(), ProtoError> {
        use Phase::*;
        let plain = self.marks.windows == Windows::Off;
        let (on, open) = (self.marks.on(), !self.marks.meta_end);
        self.phase = match (self.phase, m) {
            (_, Control::Abort { .. }) => Aborted,
            (Negotiate, Control::Propose(_)) if !self.proposed => {
                if flags & ANY_WINDOWS != 0 {
                    self.marks.windows = Windows::Proposed;
                }
                self.marks.propose_limit(flags)?;
                self.placed.0 = flags & PLACED_FLAG != 0;
                self.proposed = true;
                Negotiate
            }
            // A windowed session: a copy's journal, or a sync answered
            // per window (sync::WINDOWED; no dry run, resume or device).
            (Negotiate, Control::SyncMode { flags })
                if self.proposed
                    && !self.sync
                    && !self.sent_entries
                    && (plain || flags & !crate::control::sync::WINDOWED == 0) =>
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
            (Negotiate | Metadata, Control::Entries(es)) if self.proposed => {
                self.count(es)?;
                self.marks.entries(es);
                self.sent_entries = true;
                Metadata
            }
            // Windows: the metadata runs on into the payload.
            (Payload, Control::Entries(es)) if on && open => {
                self.count(es)?;
                self.marks.entries(es);
                Payload
            }
            (Metadata, Control::Attrs(v)) if self.preserve => {
                if !plain {
                    self.marks.attrs(v, self.announced)?;
                }
                Metadata
            }
            // Windows: a batch's Attrs right behind its records.
            (Payload, Control::Attrs(v)) if on && open && self.preserve => {
                self.marks.attrs(v, self.announced)?;
                Payload
            }
            // Directories whose every entry went (DIRS_DONE_FLAG).
            (Payload, Control::DirsDone { ids }) if on && open => {
                self.marks.dirs_done(ids)?;
                Payload
            }
            (Negotiate | Metadata, Control::ScanFailed { .. }) if self.proposed => self.phase,
            (Payload, Control::ScanFailed { .. }) if on && open => Payload,
            (Negotiate | Metadata, Control::MetaEnd { .. }) if self.proposed => {
                self.sent_entries = true;
                self.marks.meta_end = true;
                Syncing
            }
            (Payload, Control::MetaEnd { .. }) if on && open => {
                self.marks.meta_end = true;
                Payload
            }
            (Payload, Control::Reuse(v)) if self.sync => {
                if on {
                    self.marks.reuse(v)?;
                }
                Payload
            }
            (Payload, Control::FilesDone(_) | Control::FileFailed { .. }) => Payload,
            (Payload, Control::LinkDown { .. }) => Payload,
            (Payload, Control::AddStream { .. }) => Payload,
            // Right before EndOfData, once (a pull's growth, issue 21).
            (Payload, Control::Grown { .. } | Control::GrownLinks { .. }) if !self.grown => {
                self.grown = true;
                Payload
            }
            // Windows: not before the last record.
            (Payload, Control::EndOfData { .. }) if !open || !on => Completing,
            _ => return Err(self.phase.unexpected(m)),
        };
        Ok(())
    }

    /// Validate a message received from the sink.
    pub fn on_recv(&mut self, m: &Control) -> Result<(), ProtoError> {
        self.on_recv_flags(m, 0)
    }

    /// [`Self::on_recv`] of a message whose CONTROL frame carried `flags`
    /// (frame::WINDOWS_FLAG on Confirm: the sink takes windows, which only
    /// a Propose of ours carrying it may ask for).
    pub fn on_recv_flags(&mut self, m: &Control, flags: u8) -> Result<(), ProtoError> {
        use Phase::*;
        self.marks.not_window(m)?;
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
                let windows = match (self.marks.windows, flags & WINDOWS_FLAG != 0) {
                    (Windows::Proposed, true) => Windows::On,
                    (_, true) => return Err(Marks::unasked("confirm")),
                    (_, false) => Windows::Off,
                };
                self.marks.confirm_limit(flags, windows == Windows::On)?;
                self.marks.windows = windows;
                self.confirmed = true;
                self.phase
            }
            // Right behind a Confirm that announced it (WINDOW_LIMIT_FLAG).
            (Negotiate | Metadata | Syncing, Control::Window { files, bytes }) => {
                self.marks.window(*files, *bytes)?;
                self.phase
            }
            (Syncing, Control::Have(_)) if self.confirmed && self.sync => Syncing,
            // Windows: each window's answer right before its Ready.
            (Payload, Control::Have(v)) if self.sync && self.marks.on() => {
                self.marks.have(v, self.announced)?;
                Payload
            }
            (Syncing, Control::SyncDone { .. }) if self.confirmed => Payload,
            // Windows: the sink answers at once, the metadata runs on.
            (Negotiate | Metadata, Control::SyncDone { .. })
                if self.confirmed && self.marks.on() =>
            {
                Payload
            }
            (Payload, Control::Ready { through }) => {
                self.marks.ready(*through, self.announced)?;
                Payload
            }
            (Payload | Completing, Control::SettledThrough { through }) => {
                self.marks.settled(*through)?;
                self.phase
            }
            (Payload, Control::Resend(_) | Control::Settled) => Payload,
            // A link may break at any time; a Lost sent before the sink
            // saw EndOfData can arrive after we sent it.
            (Payload, Control::Lost { .. }) => Payload,
            (Completing, Control::Lost { .. }) => Completing,
            // The answer to an AddStream sent just before EndOfData.
            (Payload, Control::StreamAdded { .. }) => Payload,
            (Completing, Control::StreamAdded { .. }) => Completing,
            (Completing, Control::Deleted(_)) if self.sync => Completing,
            // Once, only when asked, right before Complete (issue 36).
            (Completing, Control::Placed { files }) if self.placed == (true, false) => {
                super::check_placed(files)?;
                self.placed.1 = true;
                Completing
            }
            (Completing, Control::Complete(_)) => Done,
            _ => return Err(self.phase.unexpected(m)),
        };
        Ok(())
    }
}
