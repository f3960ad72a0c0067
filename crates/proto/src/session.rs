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

use crate::control::{Control, Entry, EntryKind};
use crate::path::{validate_link_target, validate_relative};
use crate::ProtoError;

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
    fn name(self) -> &'static str {
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
}

/// Checks of metadata records received by a sink.
#[derive(Debug, Default)]
struct EntryChecker {
    next_id: u64,
    files: u64,
    bytes: u64,
    seen_nondir: bool,
    /// Ids of File entries, for hard-link targets: one bit per id (ids
    /// arrive in order from 0), bounded by the entries actually received
    /// (each costs a record on the wire). A HashSet cost a SipHash insert
    /// and ~20 bytes per file (issue 36).
    file_ids: IdBits,
}

/// A set of entry ids, one bit each.
#[derive(Debug, Default)]
struct IdBits(Vec<u64>);

impl IdBits {
    fn insert(&mut self, id: u64) {
        let w = (id / 64) as usize;
        if w >= self.0.len() {
            self.0.resize(w + 1, 0);
        }
        self.0[w] |= 1 << (id % 64);
    }

    fn contains(&self, id: u64) -> bool {
        usize::try_from(id / 64)
            .ok()
            .and_then(|w| self.0.get(w))
            .is_some_and(|b| b & (1 << (id % 64)) != 0)
    }
}

impl EntryChecker {
    fn check(&mut self, e: &Entry) -> Result<(), ProtoError> {
        if e.id != self.next_id {
            return Err(ProtoError::malformed(
                "entry",
                format!("id {} out of order (expected {})", e.id, self.next_id),
            ));
        }
        self.next_id += 1;
        // An empty path is the destination itself: the directory record
        // of a `SRC/` source, whose contents land in DST (rsync's rule).
        if !(e.path.is_empty() && e.kind == EntryKind::Dir) {
            validate_relative(&e.path)?;
        }
        if e.mode & !0o7777 != 0 {
            return Err(ProtoError::malformed(
                "entry",
                "mode has non-permission bits",
            ));
        }
        if e.mtime_ns >= 1_000_000_000 {
            return Err(ProtoError::malformed("entry", "mtime_ns out of range"));
        }
        match &e.kind {
            EntryKind::Dir => {
                // Directories come first so the tree exists before any file.
                if self.seen_nondir {
                    return Err(ProtoError::malformed(
                        "entry",
                        "directory record after file records",
                    ));
                }
            }
            EntryKind::File { size } => {
                self.seen_nondir = true;
                self.files += 1;
                self.bytes = self.bytes.saturating_add(*size);
                self.file_ids.insert(e.id);
            }
            // Counted like a file of its length; never a hard-link target
            // (the file is complete only when every piece is).
            EntryKind::Piece { .. } => {
                self.seen_nondir = true;
                let Some((_, len)) = e.kind.piece_range() else {
                    return Err(ProtoError::malformed(
                        "entry",
                        "piece outside its file, of length 0, or one of too many",
                    ));
                };
                self.files += 1;
                self.bytes = self.bytes.saturating_add(len);
            }
            EntryKind::Symlink { target } => {
                self.seen_nondir = true;
                validate_link_target(target)?;
            }
            EntryKind::HardLink { target_id } => {
                self.seen_nondir = true;
                if !self.file_ids.contains(*target_id) {
                    return Err(ProtoError::malformed(
                        "entry",
                        "hard link to an id that is not an earlier file",
                    ));
                }
            }
            EntryKind::Special { kind, rdev } => {
                self.seen_nondir = true;
                use crate::attrs::special::*;
                let ok = match *kind {
                    CHAR | BLOCK => true,
                    FIFO | SOCKET => *rdev == 0,
                    _ => false,
                };
                if !ok {
                    return Err(ProtoError::malformed("entry", "unknown special file kind"));
                }
            }
        }
        Ok(())
    }
}

/// Attrs name only entries already received, and every ACL entry has a
/// known tag and rwx bits only.
fn check_attrs(v: &[crate::attrs::Attrs], next_id: u64) -> Result<(), ProtoError> {
    use crate::attrs::acl_tag::*;
    for a in v {
        if a.id >= next_id {
            return Err(ProtoError::malformed("attrs", "unknown entry id"));
        }
        if a.atime.is_some_and(|(_, ns)| ns >= 1_000_000_000) {
            return Err(ProtoError::malformed("attrs", "atime_ns out of range"));
        }
        for e in a.acl.iter().chain(&a.default_acl) {
            let known = matches!(e.tag, USER_OBJ | USER | GROUP_OBJ | GROUP | MASK | OTHER);
            if !known || e.perm & !7 != 0 {
                return Err(ProtoError::malformed("attrs", "bad ACL entry"));
            }
        }
        if a.xattrs.iter().any(|(n, _)| n.is_empty() || n.contains(&0)) {
            return Err(ProtoError::malformed(
                "attrs",
                "bad extended attribute name",
            ));
        }
    }
    Ok(())
}

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

    fn unexpected(&self, m: &Control) -> ProtoError {
        ProtoError::Unexpected {
            got: m.name(),
            state: self.phase.name(),
        }
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
            _ => return Err(self.unexpected(m)),
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
            _ => return Err(self.unexpected(m)),
        };
        Ok(())
    }
}

/// The sink end of a session.
#[derive(Debug)]
pub struct SinkMachine {
    phase: Phase,
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

    fn unexpected(&self, m: &Control) -> ProtoError {
        ProtoError::Unexpected {
            got: m.name(),
            state: self.phase.name(),
        }
    }

    pub fn on_send(&mut self, m: &Control) -> Result<(), ProtoError> {
        use Phase::*;
        self.phase = match (self.phase, m) {
            (_, Control::Abort { .. }) => Aborted,
            (Negotiate, Control::Confirm(c)) => {
                let Some(p) = &self.proposed else {
                    return Err(self.unexpected(m));
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
            _ => return Err(self.unexpected(m)),
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
            _ => return Err(self.unexpected(m)),
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::{Complete, Confirm, Propose};

    fn propose() -> Control {
        Control::Propose(Propose {
            roots: 1,
            streams: 4,
            block_size: 1 << 20,
            capacity_mbps: 0,
            checksum: true,
            cipher: 0,
        })
    }
    fn confirm(streams: u16) -> Control {
        Control::Confirm(Confirm {
            streams,
            block_size: 1 << 20,
            credits_per_stream: 4,
            capacity_mbps: 0,
            checksum: true,
            cipher: 0,
        })
    }
    fn entry(id: u64, path: &str, kind: EntryKind) -> Entry {
        Entry {
            id,
            path: path.as_bytes().to_vec(),
            kind,
            mode: 0o644,
            mtime_s: 0,
            mtime_ns: 0,
        }
    }

    /// Drive both machines through a full session, as the engine does,
    /// delivering every message the one sends to the other.
    #[test]
    fn full_session_both_ends() {
        let mut src = SourceMachine::new();
        let mut snk = SinkMachine::new();
        let deliver_to_sink = |m: Control, src: &mut SourceMachine, snk: &mut SinkMachine| {
            src.on_send(&m).unwrap();
            snk.on_recv(&m).unwrap();
        };
        deliver_to_sink(propose(), &mut src, &mut snk);
        let c = confirm(2);
        snk.on_send(&c).unwrap();
        src.on_recv(&c).unwrap();
        let es = vec![
            entry(0, "d", EntryKind::Dir),
            entry(1, "d/f", EntryKind::File { size: 10 }),
            entry(2, "d/l", EntryKind::HardLink { target_id: 1 }),
            entry(
                3,
                "d/s",
                EntryKind::Symlink {
                    target: b"f".to_vec(),
                },
            ),
        ];
        deliver_to_sink(Control::Entries(es), &mut src, &mut snk);
        deliver_to_sink(
            Control::MetaEnd {
                entries: 4,
                files: 1,
                bytes: 10,
            },
            &mut src,
            &mut snk,
        );
        let sd = Control::SyncDone { failures: vec![] };
        snk.on_send(&sd).unwrap();
        src.on_recv(&sd).unwrap();
        deliver_to_sink(Control::FilesDone(vec![(1, 42)]), &mut src, &mut snk);
        // A broken link mid-payload: either end may notice first.
        deliver_to_sink(
            Control::LinkDown {
                stream: 1,
                epoch: 0,
            },
            &mut src,
            &mut snk,
        );
        let lost = Control::Lost {
            stream: 1,
            epoch: 0,
            received: 3,
        };
        snk.on_send(&lost).unwrap();
        src.on_recv(&lost).unwrap();
        // One more stream (issue 21), asked and answered in the payload.
        deliver_to_sink(Control::AddStream { stream: 4 }, &mut src, &mut snk);
        let added = Control::StreamAdded {
            stream: 4,
            credits: 3,
        };
        snk.on_send(&added).unwrap();
        // A sink bounds what it keeps of a report.
        let mut flood = SinkMachine::new();
        flood.phase = Phase::Payload;
        let stage = crate::control::GrowStage {
            at_ms: 1,
            streams: 4,
            kb_s: 1,
            link_kb_s: vec![],
            then: "add 2".into(),
        };
        let many = Control::Grown {
            stages: vec![stage.clone(); MAX_GROW_STAGES + 1],
            stopped: String::new(),
        };
        assert!(flood.on_recv(&many).is_err());
        // GrownLinks: one links record per stage, else refused.
        let links = crate::control::StageLinks {
            busy_pm: Some(900),
            rtt_x100: Some(120),
        };
        let uneven = Control::GrownLinks {
            stages: vec![stage.clone(); 2],
            links: vec![links],
            stopped: String::new(),
        };
        assert!(flood.on_recv(&uneven).is_err());
        let mut one = SinkMachine::new();
        one.phase = Phase::Payload;
        let even = Control::GrownLinks {
            stages: vec![stage.clone()],
            links: vec![links],
            stopped: String::new(),
        };
        one.on_recv(&even).unwrap();
        // Once: neither a second GrownLinks nor a Grown after it.
        assert!(one.on_recv(&even).is_err());
        // A server-side source reports its growth once, before EndOfData.
        let grown = Control::Grown {
            stages: vec![],
            stopped: "stop: at the limit (32)".into(),
        };
        deliver_to_sink(grown.clone(), &mut src, &mut snk);
        assert!(src.on_send(&grown).is_err());
        assert!(snk.on_recv(&grown).is_err());
        deliver_to_sink(
            Control::EndOfData {
                files: 1,
                bytes: 10,
            },
            &mut src,
            &mut snk,
        );
        // A Lost and an answer the sink sent before it read EndOfData.
        src.on_recv(&lost).unwrap();
        src.on_recv(&added).unwrap();
        // No growth reported outside the payload, no stream added after
        // EndOfData.
        assert!(SourceMachine::new().on_send(&grown).is_err());
        assert!(src.on_send(&Control::AddStream { stream: 5 }).is_err());
        assert!(snk.on_recv(&Control::AddStream { stream: 5 }).is_err());
        let done = Control::Complete(Complete {
            files: 1,
            bytes: 10,
            failures: vec![],
            cpu_s: 0.0,
        });
        snk.on_send(&done).unwrap();
        src.on_recv(&done).unwrap();
        assert_eq!(src.phase(), Phase::Done);
        assert_eq!(snk.phase(), Phase::Done);
    }

    /// Archive attributes: Preserve right behind Propose, Attrs only
    /// behind the records they name; neither in a plain copy.
    #[test]
    fn preserve_and_attrs_in_order_only() {
        use crate::attrs::{preserve, special, AclEntry, Attrs, Principal};
        let mut src = SourceMachine::new();
        let mut snk = SinkMachine::new();
        src.on_send(&propose()).unwrap();
        snk.on_recv(&propose()).unwrap();
        // Attrs without Preserve: refused at both ends.
        let a = |id| {
            Control::Attrs(vec![Attrs {
                id,
                ..Default::default()
            }])
        };
        let mut plain = SinkMachine::new();
        plain.on_recv(&propose()).unwrap();
        plain.on_send(&confirm(2)).unwrap();
        plain
            .on_recv(&Control::Entries(vec![entry(0, "d", EntryKind::Dir)]))
            .unwrap();
        assert!(plain.on_recv(&a(0)).is_err());
        assert!(src
            .on_send(&Control::Preserve {
                flags: preserve::ALL + 1
            })
            .is_err());
        let p = Control::Preserve {
            flags: preserve::OWNER | preserve::SPECIALS,
        };
        src.on_send(&p).unwrap();
        snk.on_recv(&p).unwrap();
        assert_eq!(snk.preserve_flags(), Some(3 - 2 + 32));
        snk.on_send(&confirm(2)).unwrap();
        let es = Control::Entries(vec![
            entry(0, "d", EntryKind::Dir),
            entry(
                1,
                "d/p",
                EntryKind::Special {
                    kind: special::FIFO,
                    rdev: 0,
                },
            ),
        ]);
        src.on_send(&es).unwrap();
        snk.on_recv(&es).unwrap();
        // A second Preserve, after records, is refused.
        assert!(snk.on_recv(&p).is_err());
        src.on_send(&a(1)).unwrap();
        snk.on_recv(&a(1)).unwrap();
        // An id not yet announced, a bad ACL tag, a bad special kind.
        assert!(snk.on_recv(&a(2)).is_err());
        let bad_acl = Control::Attrs(vec![Attrs {
            id: 0,
            acl: vec![AclEntry {
                tag: 3,
                perm: 7,
                who: Principal::default(),
            }],
            ..Default::default()
        }]);
        assert!(snk.on_recv(&bad_acl).is_err());
        let mut snk2 = SinkMachine::new();
        snk2.on_recv(&propose()).unwrap();
        snk2.on_send(&confirm(2)).unwrap();
        let bad = Control::Entries(vec![entry(0, "p", EntryKind::Special { kind: 9, rdev: 0 })]);
        assert!(snk2.on_recv(&bad).is_err());
    }

    /// A sync session: SyncMode behind Propose, Have before SyncDone,
    /// Reuse in the payload phase, Deleted before Complete; none of them
    /// is accepted in a plain copy.
    #[test]
    fn sync_session_messages_in_order_only() {
        use crate::control::{Have, HaveState, Reuse, ReuseKind};
        let mut src = SourceMachine::new();
        let mut snk = SinkMachine::new();
        let to_sink = |m: Control, src: &mut SourceMachine, snk: &mut SinkMachine| {
            src.on_send(&m).unwrap();
            snk.on_recv(&m).unwrap();
        };
        let to_src = |m: Control, src: &mut SourceMachine, snk: &mut SinkMachine| {
            snk.on_send(&m).unwrap();
            src.on_recv(&m).unwrap();
        };
        to_sink(propose(), &mut src, &mut snk);
        to_src(confirm(2), &mut src, &mut snk);
        assert!(src.on_send(&Control::SyncMode { flags: 1 << 20 }).is_err());
        to_sink(Control::SyncMode { flags: 5 }, &mut src, &mut snk);
        assert_eq!(snk.sync_flags(), Some(5));
        to_sink(
            Control::Entries(vec![entry(0, "f", EntryKind::File { size: 10 })]),
            &mut src,
            &mut snk,
        );
        // A second SyncMode, after records, is refused.
        assert!(snk.on_recv(&Control::SyncMode { flags: 1 }).is_err());
        let mut snk2 = SinkMachine::new();
        snk2.on_recv(&propose()).unwrap();
        snk2.on_send(&confirm(2)).unwrap();
        snk2.on_recv(&Control::SyncMode { flags: 1 }).unwrap();
        to_sink(
            Control::MetaEnd {
                entries: 1,
                files: 1,
                bytes: 10,
            },
            &mut src,
            &mut snk,
        );
        let have = Control::Have(vec![Have {
            id: 0,
            state: HaveState::Digest(1),
        }]);
        to_src(have, &mut src, &mut snk);
        to_src(Control::SyncDone { failures: vec![] }, &mut src, &mut snk);
        let bad = Control::Reuse(vec![Reuse {
            id: 9,
            what: ReuseKind::Keep,
        }]);
        src.on_send(&bad).unwrap();
        assert!(snk.on_recv(&bad).is_err());
        let mut snk = SinkMachine::new();
        snk.on_recv(&propose()).unwrap();
        snk.on_send(&confirm(2)).unwrap();
        snk.on_recv(&Control::SyncMode { flags: 1 }).unwrap();
        snk.on_recv(&Control::Entries(vec![entry(
            0,
            "f",
            EntryKind::File { size: 10 },
        )]))
        .unwrap();
        snk.on_recv(&Control::MetaEnd {
            entries: 1,
            files: 1,
            bytes: 10,
        })
        .unwrap();
        snk.on_send(&Control::SyncDone { failures: vec![] })
            .unwrap();
        let ok = Control::Reuse(vec![Reuse {
            id: 0,
            what: ReuseKind::Base { bytes: 4 },
        }]);
        snk.on_recv(&ok).unwrap();
        src.on_send(&ok).unwrap();
        to_sink(
            Control::EndOfData { files: 1, bytes: 6 },
            &mut src,
            &mut snk,
        );
        to_src(Control::Deleted(vec![b"old".to_vec()]), &mut src, &mut snk);
        let done = Control::Complete(Complete {
            files: 1,
            bytes: 6,
            failures: vec![],
            cpu_s: 0.0,
        });
        to_src(done, &mut src, &mut snk);
        assert_eq!(src.phase(), Phase::Done);
        // A plain copy refuses the sync messages.
        let mut plain = SourceMachine::new();
        plain.on_send(&propose()).unwrap();
        plain.on_recv(&confirm(2)).unwrap();
        plain
            .on_send(&Control::MetaEnd {
                entries: 0,
                files: 0,
                bytes: 0,
            })
            .unwrap();
        assert!(plain.on_recv(&Control::Have(vec![])).is_err());
    }

    #[test]
    fn sink_rejects_out_of_order_and_hostile_records() {
        let mut snk = SinkMachine::new();
        snk.on_recv(&propose()).unwrap();
        snk.on_send(&confirm(4)).unwrap();
        // A confirm that raises the proposal is refused.
        let mut s2 = SinkMachine::new();
        s2.on_recv(&propose()).unwrap();
        assert!(s2.on_send(&confirm(9)).is_err());

        let bad = [
            vec![entry(1, "a", EntryKind::Dir)],
            vec![entry(0, "../a", EntryKind::Dir)],
            vec![entry(0, "/abs", EntryKind::File { size: 1 })],
            vec![entry(0, "a", EntryKind::HardLink { target_id: 0 })],
            vec![
                entry(0, "f", EntryKind::File { size: 1 }),
                entry(1, "d", EntryKind::Dir),
            ],
            // Pieces: past the end, of length 0, too many; never a link target.
            vec![entry(0, "p", piece(10, 5, 2))],
            vec![entry(0, "p", piece(10, 0, 0))],
            vec![entry(0, "p", piece(1 << 40, 1 << 20, 0))],
            vec![
                entry(0, "p", piece(10, 5, 1)),
                entry(1, "l", EntryKind::HardLink { target_id: 0 }),
            ],
        ];
        for b in bad {
            let mut m = SinkMachine::new();
            m.on_recv(&propose()).unwrap();
            m.on_send(&confirm(4)).unwrap();
            assert!(m.on_recv(&Control::Entries(b.clone())).is_err(), "{b:?}");
        }
        // Payload messages before metadata are refused.
        assert!(snk
            .on_recv(&Control::EndOfData { files: 0, bytes: 0 })
            .is_err());
    }

    fn piece(size: u64, piece: u64, index: u32) -> EntryKind {
        EntryKind::Piece { size, piece, index }
    }

    #[test]
    fn pieces_count_as_files_of_their_length() {
        assert_eq!(piece(10, 4, 0).piece_range(), Some((0, 4)));
        assert_eq!(piece(10, 4, 2).piece_range(), Some((8, 2)));
        assert_eq!(piece(10, 4, 3).piece_range(), None);
        assert_eq!(piece(10, 4, u32::MAX).piece_range(), None);
        assert_eq!(EntryKind::File { size: 3 }.piece_range(), None);
        let mut m = SinkMachine::new();
        m.on_recv(&propose()).unwrap();
        m.on_send(&confirm(1)).unwrap();
        m.on_recv(&Control::Entries(vec![
            entry(0, "f", piece(10, 4, 0)),
            entry(1, "f", piece(10, 4, 2)),
        ]))
        .unwrap();
        m.on_recv(&Control::MetaEnd {
            entries: 2,
            files: 2,
            bytes: 6,
        })
        .unwrap();
    }

    #[test]
    fn meta_end_counts_must_match() {
        let mut m = SinkMachine::new();
        m.on_recv(&propose()).unwrap();
        m.on_send(&confirm(1)).unwrap();
        m.on_recv(&Control::Entries(vec![entry(
            0,
            "f",
            EntryKind::File { size: 5 },
        )]))
        .unwrap();
        assert!(m
            .on_recv(&Control::MetaEnd {
                entries: 1,
                files: 1,
                bytes: 6
            })
            .is_err());
    }

    #[test]
    fn source_may_pipeline_metadata_before_confirm() {
        let mut s = SourceMachine::new();
        s.on_send(&propose()).unwrap();
        s.on_send(&Control::Entries(vec![])).unwrap();
        s.on_send(&Control::MetaEnd {
            entries: 0,
            files: 0,
            bytes: 0,
        })
        .unwrap();
        // SyncDone before Confirm is still out of order.
        let mut early = SourceMachine::new();
        early.on_send(&propose()).unwrap();
        early
            .on_send(&Control::MetaEnd {
                entries: 0,
                files: 0,
                bytes: 0,
            })
            .unwrap();
        assert!(early
            .on_recv(&Control::SyncDone { failures: vec![] })
            .is_err());
        s.on_recv(&confirm(1)).unwrap();
        assert!(s.on_recv(&confirm(1)).is_err(), "one Confirm only");
        s.on_recv(&Control::SyncDone { failures: vec![] }).unwrap();
        assert_eq!(s.phase(), Phase::Payload);
    }

    #[test]
    fn link_messages_only_in_the_payload() {
        let lost = Control::Lost {
            stream: 0,
            epoch: 0,
            received: 0,
        };
        let down = Control::LinkDown {
            stream: 0,
            epoch: 0,
        };
        let mut src = SourceMachine::new();
        assert!(src.on_recv(&lost).is_err());
        let mut src = SourceMachine::new();
        assert!(src.on_send(&down).is_err());
        let mut snk = SinkMachine::new();
        assert!(snk.on_recv(&down).is_err());
        let mut snk = SinkMachine::new();
        assert!(snk.on_send(&lost).is_err());
        // Rejoin belongs on a data link, never on the control link.
        let rejoin = Control::Rejoin {
            session: 1,
            stream: 0,
            epoch: 1,
            nonce: [0; 32],
            mac: [0; 32],
        };
        let mut snk = SinkMachine::new();
        assert!(snk.on_recv(&rejoin).is_err());
    }

    #[test]
    fn source_rejects_premature_messages() {
        let mut s = SourceMachine::new();
        assert!(s.on_recv(&Control::SyncDone { failures: vec![] }).is_err());
        let mut s = SourceMachine::new();
        assert!(s.on_send(&Control::Entries(vec![])).is_err());
        let mut s = SourceMachine::new();
        s.on_recv(&Control::Abort { reason: "x".into() }).unwrap();
        assert_eq!(s.phase(), Phase::Aborted);
    }
}
