//! The sink end's machine: the order of messages and, through
//! `checks.rs`, the consistency of every record a source sends.

use super::checks::{check_attrs, EntryChecker};
use super::{Marks, Phase, Windows};
use crate::control::{Control, EntryKind};
use crate::frame::{ANY_WINDOWS, PLACED_FLAG, WINDOWS_FLAG};
use crate::ProtoError;

/// The sink end of a session.
#[derive(Debug)]
pub struct SinkMachine {
    /// pub(super): tests.rs puts a machine straight into a phase.
    pub(super) phase: Phase,
    /// pub(super): tests.rs puts a machine far into a window.
    pub(super) entries: EntryChecker,
    proposed: Option<crate::control::Propose>,
    /// Flags of a SyncMode received (docs/SYNC.md), None for a plain copy.
    sync: Option<u32>,
    /// Flags of a Preserve received (crate::attrs), None without.
    preserve: Option<u32>,
    /// Grown received: once per session.
    grown: bool,
    /// Windowed metadata (issue 36): negotiated, and the marks so far.
    marks: Marks,
    /// The Propose asked for a Placed (frame::PLACED_FLAG), and it was
    /// sent.
    placed: (bool, bool),
}

/// Most ids a windowed source may announce past the sink's settled mark
/// (its own window is smaller, ~64 k): a source that runs further ahead
/// is refused, so it cannot grow the sink's table past the window.
pub const MAX_WINDOW_IDS: u64 = 1 << 20;

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
            marks: Marks::default(),
            placed: (false, false),
        }
    }

    /// The source asked for a Placed before Complete (frame::PLACED_FLAG).
    pub fn placed_asked(&self) -> bool {
        self.placed.0
    }

    /// Windowed metadata: proposed, taken, or neither.
    pub fn windows(&self) -> Windows {
        self.marks.windows
    }

    /// The source proposed DirsDone (frame::DIRS_DONE_FLAG on Propose):
    /// a sink that takes windows takes them too.
    pub fn dirs_done_proposed(&self) -> bool {
        self.marks.dirs.proposed()
    }

    /// A SyncMode of a `--delete` or resume sync came: DirsDone may.
    fn deletes(&self) -> bool {
        use crate::control::sync::{DELETE, RESUME};
        self.sync.is_some_and(|f| f & (DELETE | RESUME) != 0)
    }

    /// The Ready and SettledThrough marks sent so far.
    pub fn marks(&self) -> (u64, u64) {
        (self.marks.ready, self.marks.settled)
    }

    /// MetaEnd received.
    pub fn meta_ended(&self) -> bool {
        self.marks.meta_end
    }

    /// Records of a session that may be windowed: no piece; no id as far
    /// as [`MAX_WINDOW_IDS`] past the settled mark; a HardLink only to a
    /// slot not yet settled (before the source read Confirm: see
    /// SourceMachine::count), a LinkTo only once windows are on.
    fn check_window(&self, es: &[crate::control::Entry]) -> Result<(), ProtoError> {
        if self.marks.windows == Windows::Off {
            if es
                .iter()
                .any(|e| matches!(e.kind, EntryKind::LinkTo { .. }))
            {
                return Err(ProtoError::malformed("entry", "LinkTo without windows"));
            }
            return Ok(());
        }
        for e in es {
            let bad = match e.kind {
                EntryKind::Piece { .. } => true,
                EntryKind::HardLink { target_id } => target_id < self.marks.settled,
                EntryKind::LinkTo { .. } => !self.marks.on(),
                _ => false,
            };
            if bad {
                return Err(ProtoError::malformed(
                    "entry",
                    "a piece, or a link the window cannot resolve",
                ));
            }
            if e.id >= self.marks.settled.saturating_add(MAX_WINDOW_IDS) {
                return Err(ProtoError::malformed("entry", "id beyond the window"));
            }
        }
        Ok(())
    }

    /// A file id the source reports on: announced, and in a windowed
    /// session within the ready mark (no data before the slot exists).
    fn known(&self, id: u64) -> bool {
        id < self.entries.next_id && (!self.marks.on() || id < self.marks.ready)
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
        self.on_send_flags(m, 0)
    }

    /// [`Self::on_send`] of a message whose CONTROL frame carries `flags`
    /// (frame::WINDOWS_FLAG on Confirm: windows taken, only if proposed).
    pub fn on_send_flags(&mut self, m: &Control, flags: u8) -> Result<(), ProtoError> {
        use Phase::*;
        self.marks.not_window(m)?;
        let on = self.marks.on();
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
                let windows = match (self.marks.windows, flags & WINDOWS_FLAG != 0) {
                    (Windows::Proposed, true) => Windows::On,
                    (_, true) => return Err(Marks::unasked("confirm")),
                    (_, false) => Windows::Off,
                };
                self.marks.confirm_limit(flags, windows == Windows::On)?;
                self.marks.windows = windows;
                Metadata
            }
            // Right behind a Confirm that announced it (WINDOW_LIMIT_FLAG).
            (Metadata, Control::Window { files, bytes }) => {
                self.marks.window(*files, *bytes)?;
                Metadata
            }
            (Syncing, Control::Have(_)) if self.sync.is_some() => Syncing,
            // Windows: a window's answer, right before its Ready.
            (Payload, Control::Have(v)) if on && self.sync.is_some() => {
                self.marks.have(v, self.entries.next_id)?;
                Payload
            }
            (Syncing, Control::SyncDone { .. }) => Payload,
            // Windows: the payload starts at once, the metadata runs on.
            (Metadata, Control::SyncDone { .. }) if on => Payload,
            (Payload, Control::Ready { through }) => {
                self.marks.ready(*through, self.entries.next_id)?;
                Payload
            }
            (Payload, Control::SettledThrough { through }) => {
                self.marks.settled(*through)?;
                Payload
            }
            // Windows: settled means every record, so not before MetaEnd.
            (Payload, Control::Settled) if !on || self.marks.meta_end => Payload,
            (Payload, Control::Resend(_) | Control::Lost { .. }) => Payload,
            (Payload, Control::StreamAdded { .. }) => Payload,
            (Completing, Control::Deleted(_)) if self.sync.is_some() => Completing,
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

    pub fn on_recv(&mut self, m: &Control) -> Result<(), ProtoError> {
        self.on_recv_flags(m, 0)
    }

    /// [`Self::on_recv`] of a message whose CONTROL frame carried `flags`
    /// (frame::WINDOWS_FLAG or WIDE_WINDOWS_FLAG on Propose: the source can
    /// run windows).
    pub fn on_recv_flags(&mut self, m: &Control, flags: u8) -> Result<(), ProtoError> {
        use Phase::*;
        let (on, open) = (self.marks.on(), !self.marks.meta_end);
        // Windows: the metadata runs on in the payload until MetaEnd.
        let records = self.phase == Metadata || (self.phase == Payload && on && open);
        self.phase = match (self.phase, m) {
            (_, Control::Abort { .. } | Control::Error { .. }) => Aborted,
            (Negotiate, Control::Propose(p)) if self.proposed.is_none() => {
                self.recv_propose(p, flags)?;
                Negotiate
            }
            // Right behind Propose, so it may arrive after Confirm left
            // (windows: after SyncDone). A session that proposed windows is
            // a copy (its default journal) or a sync answered per window:
            // sync::WINDOWED at most (no dry run, resume or device).
            (Negotiate | Metadata | Payload, Control::SyncMode { flags })
                if self.sync.is_none()
                    && self.before_records()
                    && (self.marks.windows == Windows::Off
                        || flags & !crate::control::sync::WINDOWED == 0) =>
            {
                if flags & !crate::control::sync::ALL != 0 {
                    return Err(ProtoError::malformed("sync mode", "unknown flags"));
                }
                self.sync = Some(*flags);
                self.phase
            }
            // Likewise (windows: after SyncDone, before any record).
            (Negotiate | Metadata | Payload, Control::Preserve { flags })
                if self.preserve.is_none() && self.before_records() =>
            {
                if flags & !crate::attrs::preserve::ALL != 0 {
                    return Err(ProtoError::malformed("preserve", "unknown flags"));
                }
                self.preserve = Some(*flags);
                self.phase
            }
            (Metadata | Payload, Control::Entries(es)) if records => {
                self.recv_entries(es)?;
                self.phase
            }
            (Metadata | Payload, Control::ScanFailed { .. }) if records => self.phase,
            // Directories whose every entry came (DIRS_DONE_FLAG), only
            // of a `--delete` or resume sync.
            (Payload, Control::DirsDone { ids }) if records && self.deletes() => {
                self.marks.dirs_done(ids)?;
                Payload
            }
            // Windows: a batch's Attrs right behind its records.
            (Metadata | Payload, Control::Attrs(v)) if records && self.preserve.is_some() => {
                self.recv_attrs(v)?;
                self.phase
            }
            (
                Metadata | Payload,
                Control::MetaEnd {
                    entries,
                    files,
                    bytes,
                },
            ) if open && (self.phase == Metadata || on) => {
                self.recv_meta_end(*entries, *files, *bytes)?;
                // Windows: the payload is under way already.
                match self.phase {
                    Payload => Payload,
                    _ => Syncing,
                }
            }
            (Payload, Control::EndOfData { .. }) if !on || !open => Completing,
            (Payload, _) => {
                self.payload_report(m)?;
                Payload
            }
            _ => return Err(self.phase.unexpected(m)),
        };
        Ok(())
    }

    /// The first Propose: the session's shape, and whether the source can
    /// run windows (issue 36) and asks for a Placed.
    fn recv_propose(&mut self, p: &crate::control::Propose, flags: u8) -> Result<(), ProtoError> {
        if p.streams == 0 || p.block_size == 0 {
            return Err(ProtoError::malformed(
                "propose",
                "zero streams or block size",
            ));
        }
        if flags & ANY_WINDOWS != 0 {
            self.marks.windows = Windows::Proposed;
        }
        self.marks.propose_limit(flags)?;
        self.placed.0 = flags & PLACED_FLAG != 0;
        self.proposed = Some(p.clone());
        Ok(())
    }

    /// A SyncMode or Preserve may still come: after Propose, before the
    /// first record, and in the payload only of a windowed session.
    fn before_records(&self) -> bool {
        self.proposed.is_some()
            && self.entries.next_id == 0
            && (self.phase != Phase::Payload || self.marks.on())
    }

    /// A batch of records: within the window, each consistent with those
    /// before it.
    fn recv_entries(&mut self, es: &[crate::control::Entry]) -> Result<(), ProtoError> {
        self.check_window(es)?;
        self.marks.limit_entries(es)?;
        for e in es {
            self.entries.check(e)?;
        }
        self.marks.entries(es);
        Ok(())
    }

    /// Attributes of records received; windowed, they also count against
    /// the window.
    fn recv_attrs(&mut self, v: &[crate::attrs::Attrs]) -> Result<(), ProtoError> {
        check_attrs(v, self.entries.next_id)?;
        if self.marks.windows != Windows::Off {
            self.marks.attrs(v, self.entries.next_id)?;
        }
        Ok(())
    }

    /// MetaEnd's totals must be those of the records received.
    fn recv_meta_end(&mut self, entries: u64, files: u64, bytes: u64) -> Result<(), ProtoError> {
        if entries != self.entries.next_id
            || files != self.entries.files
            || bytes != self.entries.bytes
        {
            return Err(ProtoError::malformed(
                "meta end",
                "counts do not match the records received",
            ));
        }
        self.marks.meta_end = true;
        Ok(())
    }

    /// The reports a source sends while the payload runs, each checked
    /// against what the sink announced; any other message is unexpected.
    fn payload_report(&mut self, m: &Control) -> Result<(), ProtoError> {
        match m {
            Control::FilesDone(v) => {
                if v.iter().any(|(id, _)| !self.known(*id)) {
                    return Err(ProtoError::malformed("files done", "unknown file id"));
                }
            }
            Control::FileFailed { id, .. } => {
                if !self.known(*id) {
                    return Err(ProtoError::malformed("file failed", "unknown file id"));
                }
            }
            Control::Reuse(v) if self.sync.is_some() => {
                if v.iter().any(|r| r.id >= self.entries.next_id) {
                    return Err(ProtoError::malformed("reuse", "unknown file id"));
                }
                if self.marks.on() {
                    self.marks.reuse(v)?;
                }
            }
            Control::LinkDown { .. } | Control::AddStream { .. } => {}
            Control::Grown { stages, .. } if !self.grown => {
                if stages.len() > MAX_GROW_STAGES {
                    return Err(ProtoError::malformed("grown", "too many stages"));
                }
                self.grown = true;
            }
            Control::GrownLinks { stages, links, .. } if !self.grown => {
                if stages.len() > MAX_GROW_STAGES || links.len() != stages.len() {
                    return Err(ProtoError::malformed(
                        "grown",
                        "too many stages, or not one links record per stage",
                    ));
                }
                self.grown = true;
            }
            _ => return Err(Phase::Payload.unexpected(m)),
        }
        Ok(())
    }
}
