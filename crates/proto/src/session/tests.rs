//! Both machines through whole sessions (copy, archive, sync, pieces,
//! lost links) and the orders and records they must refuse.

use super::*;
use crate::control::{Complete, Confirm, Propose};
use crate::control::{Control, Entry, EntryKind};

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

/// A kept session (issue 38, Control::WatchBatch): the next batch, or any
/// open, arriving before this session's Complete is a protocol error in
/// every phase of either machine, and so is a second Propose; a batch
/// starts only on the link's own loop, once the machine is done.
#[test]
fn a_next_batch_or_open_inside_a_session_is_refused() {
    use crate::control::{Open, Role};
    let open = Open {
        server_role: Role::Sink,
        paths: vec![b"m".to_vec()],
        recursive: true,
        streams: 1,
        block_size: 1 << 20,
        checksum: true,
    };
    let intruders = [
        Control::WatchBatch { batch: 2 },
        Control::Open(open.clone()),
        Control::SyncOpen {
            open: open.clone(),
            flags: 1,
        },
        Control::WatchOpen {
            version: 2,
            dest: vec![],
        },
    ];
    for phase in [
        Phase::Negotiate,
        Phase::Metadata,
        Phase::Syncing,
        Phase::Payload,
        Phase::Completing,
        Phase::Done,
    ] {
        for m in &intruders {
            let mut snk = SinkMachine::new();
            snk.phase = phase;
            assert!(snk.on_recv(m).is_err(), "{phase:?}: {}", m.name());
        }
    }
    let mut snk = SinkMachine::new();
    snk.on_recv(&propose()).unwrap();
    assert!(snk.on_recv(&propose()).is_err(), "a second Propose");
    let mut src = SourceMachine::new();
    for m in &intruders {
        assert!(src.on_recv(m).is_err() && src.on_send(m).is_err());
    }
}

/// Both machines through a windowed copy (issue 36): the flag on Propose
/// and Confirm, records before Confirm, SyncDone at once, records, Ready
/// and SettledThrough interleaved with the payload, MetaEnd inside it, a
/// second name as LinkTo once windows are on.
#[test]
fn windowed_session_both_ends() {
    use crate::frame::WINDOWS_FLAG;
    let mut src = SourceMachine::new();
    let mut snk = SinkMachine::new();
    let to_sink = |m: Control, src: &mut SourceMachine, snk: &mut SinkMachine| {
        src.on_send(&m).unwrap();
        snk.on_recv(&m).unwrap();
    };
    let to_source = |m: Control, src: &mut SourceMachine, snk: &mut SinkMachine| {
        snk.on_send(&m).unwrap();
        src.on_recv(&m).unwrap();
    };
    let p = propose();
    src.on_send_flags(&p, WINDOWS_FLAG).unwrap();
    snk.on_recv_flags(&p, WINDOWS_FLAG).unwrap();
    assert_eq!(src.windows(), Windows::Proposed);
    let c = confirm(2);
    snk.on_send_flags(&c, WINDOWS_FLAG).unwrap();
    // The first window travels before the source reads Confirm; a
    // HardLink is still right then.
    let first = vec![
        entry(0, "d", EntryKind::Dir),
        entry(1, "d/a", EntryKind::File { size: 5 }),
        entry(2, "d/h", EntryKind::HardLink { target_id: 1 }),
    ];
    to_sink(Control::Entries(first), &mut src, &mut snk);
    src.on_recv_flags(&c, WINDOWS_FLAG).unwrap();
    assert_eq!((src.windows(), snk.windows()), (Windows::On, Windows::On));
    to_source(Control::SyncDone { failures: vec![] }, &mut src, &mut snk);
    assert_eq!((src.phase(), snk.phase()), (Phase::Payload, Phase::Payload));
    to_source(Control::Ready { through: 3 }, &mut src, &mut snk);
    to_sink(Control::FilesDone(vec![(1, 9)]), &mut src, &mut snk);
    to_source(Control::SettledThrough { through: 3 }, &mut src, &mut snk);
    // The next window while the first one's data moved.
    let next = vec![
        entry(3, "d/b", EntryKind::File { size: 7 }),
        entry(
            4,
            "d/l",
            EntryKind::LinkTo {
                target_id: 1,
                target: b"d/a".to_vec(),
            },
        ),
    ];
    to_sink(Control::Entries(next), &mut src, &mut snk);
    let end = Control::MetaEnd {
        entries: 5,
        files: 2,
        bytes: 12,
    };
    to_sink(end, &mut src, &mut snk);
    assert!(snk.meta_ended());
    to_source(Control::Ready { through: 5 }, &mut src, &mut snk);
    to_sink(Control::FilesDone(vec![(3, 1)]), &mut src, &mut snk);
    to_source(Control::SettledThrough { through: 5 }, &mut src, &mut snk);
    to_source(Control::Settled, &mut src, &mut snk);
    to_sink(
        Control::EndOfData {
            files: 2,
            bytes: 12,
        },
        &mut src,
        &mut snk,
    );
    assert_eq!((src.marks(), snk.marks()), ((5, 5), (5, 5)));
    let done = Control::Complete(Complete {
        files: 2,
        bytes: 12,
        failures: vec![],
        cpu_s: 0.0,
    });
    to_source(done, &mut src, &mut snk);
    assert_eq!((src.phase(), snk.phase()), (Phase::Done, Phase::Done));
}

/// A windowed pair up to the payload: a Propose with `flag`, `modes`
/// (SyncMode, Preserve) right behind it, a Confirm with WINDOWS_FLAG,
/// SyncDone, then `n` file records announced, none ready yet.
fn windowed_with(flag: u8, modes: &[Control], n: u64) -> (SourceMachine, SinkMachine) {
    use crate::frame::WINDOWS_FLAG;
    let (mut src, mut snk) = (SourceMachine::new(), SinkMachine::new());
    let p = propose();
    src.on_send_flags(&p, flag).unwrap();
    snk.on_recv_flags(&p, flag).unwrap();
    for m in modes {
        src.on_send(m).unwrap();
        snk.on_recv(m).unwrap();
    }
    let c = confirm(1);
    snk.on_send_flags(&c, WINDOWS_FLAG).unwrap();
    src.on_recv_flags(&c, WINDOWS_FLAG).unwrap();
    let sd = Control::SyncDone { failures: vec![] };
    snk.on_send(&sd).unwrap();
    src.on_recv(&sd).unwrap();
    let es: Vec<_> = (0..n)
        .map(|i| entry(i, &format!("f{i}"), EntryKind::File { size: 1 }))
        .collect();
    let es = Control::Entries(es);
    src.on_send(&es).unwrap();
    snk.on_recv(&es).unwrap();
    (src, snk)
}

/// `n` ids ready: the sink's Ready through `n`, at both ends.
fn ready(n: u64, src: &mut SourceMachine, snk: &mut SinkMachine) {
    let r = Control::Ready { through: n };
    snk.on_send(&r).unwrap();
    src.on_recv(&r).unwrap();
}

/// A windowed pair up to the payload, `n` records announced and ready.
fn windowed(n: u64) -> (SourceMachine, SinkMachine) {
    let (mut src, mut snk) = windowed_with(crate::frame::WINDOWS_FLAG, &[], n);
    if n > 0 {
        ready(n, &mut src, &mut snk);
    }
    (src, snk)
}

/// What each machine refuses of windows: the flag on a Confirm nobody
/// proposed, window messages in a session without them, marks beyond what
/// was announced or ready or not increasing, ids out of order, records and
/// data outside the window, and the end before the last record.
#[test]
fn window_messages_refused_out_of_place() {
    use crate::frame::WINDOWS_FLAG;
    // Confirm with the flag, Propose without: both ends refuse it.
    let (mut src, mut snk) = (SourceMachine::new(), SinkMachine::new());
    src.on_send(&propose()).unwrap();
    snk.on_recv(&propose()).unwrap();
    assert!(snk.on_send_flags(&confirm(1), WINDOWS_FLAG).is_err());
    assert!(src.on_recv_flags(&confirm(1), WINDOWS_FLAG).is_err());
    // An old sink's Confirm (no flag): today's phases, no window message.
    let (mut src, mut snk) = (SourceMachine::new(), SinkMachine::new());
    src.on_send_flags(&propose(), WINDOWS_FLAG).unwrap();
    snk.on_recv(&propose()).unwrap();
    snk.on_send(&confirm(1)).unwrap();
    src.on_recv(&confirm(1)).unwrap();
    assert_eq!(src.windows(), Windows::Off);
    let es = Control::Entries(vec![entry(0, "f", EntryKind::File { size: 1 })]);
    src.on_send(&es).unwrap();
    snk.on_recv(&es).unwrap();
    // No SyncDone before MetaEnd without windows, and no Ready at all.
    assert!(snk
        .on_send(&Control::SyncDone { failures: vec![] })
        .is_err());
    let end = Control::MetaEnd {
        entries: 1,
        files: 1,
        bytes: 1,
    };
    src.on_send(&end).unwrap();
    snk.on_recv(&end).unwrap();
    let sd = Control::SyncDone { failures: vec![] };
    snk.on_send(&sd).unwrap();
    src.on_recv(&sd).unwrap();
    assert!(snk.on_send(&Control::Ready { through: 1 }).is_err());
    assert!(src.on_recv(&Control::Ready { through: 1 }).is_err());
    assert!(src
        .on_recv(&Control::SettledThrough { through: 1 })
        .is_err());
    assert!(snk.on_recv(&es).is_err(), "records after MetaEnd");
    // Ready beyond the records, SettledThrough beyond Ready, either not
    // increasing.
    let (mut src, mut snk) = windowed(3);
    assert!(snk.on_send(&Control::Ready { through: 4 }).is_err());
    assert!(src.on_recv(&Control::Ready { through: 4 }).is_err());
    assert!(src.on_recv(&Control::Ready { through: 3 }).is_err());
    assert!(snk
        .on_send(&Control::SettledThrough { through: 4 })
        .is_err());
    assert!(src
        .on_recv(&Control::SettledThrough { through: 4 })
        .is_err());
    src.on_recv(&Control::SettledThrough { through: 2 })
        .unwrap();
    assert!(src
        .on_recv(&Control::SettledThrough { through: 2 })
        .is_err());
    // Ids out of order in the payload, at both ends.
    let (mut src, mut snk) = windowed(2);
    let gap = Control::Entries(vec![entry(3, "g", EntryKind::File { size: 1 })]);
    assert!(src.on_send(&gap).is_err());
    assert!(snk.on_recv(&gap).is_err());
    // Data for an id announced but not ready.
    let (_, mut snk) = windowed(2);
    let more = Control::Entries(vec![entry(2, "m", EntryKind::File { size: 1 })]);
    snk.on_recv(&more).unwrap();
    assert!(snk.on_recv(&Control::FilesDone(vec![(2, 0)])).is_err());
    assert!(snk
        .on_recv(&Control::FileFailed {
            id: 2,
            reason: "x".into()
        })
        .is_err());
    // A HardLink to a settled slot, a piece, a LinkTo without windows.
    let (_, mut snk) = windowed(2);
    snk.on_send(&Control::SettledThrough { through: 2 })
        .unwrap();
    let late = Control::Entries(vec![entry(2, "h", EntryKind::HardLink { target_id: 0 })]);
    assert!(snk.on_recv(&late).is_err());
    let (mut src, mut snk) = windowed(1);
    let p = Control::Entries(vec![entry(1, "p", piece(10, 5, 0))]);
    assert!(src.on_send(&p).is_err());
    assert!(snk.on_recv(&p).is_err());
    let hl = Control::Entries(vec![entry(1, "h", EntryKind::HardLink { target_id: 0 })]);
    assert!(src.on_send(&hl).is_err(), "a HardLink once windows are on");
    let mut plain = SinkMachine::new();
    plain.on_recv(&propose()).unwrap();
    plain.on_send(&confirm(1)).unwrap();
    let to = Control::Entries(vec![
        entry(0, "a", EntryKind::File { size: 1 }),
        entry(
            1,
            "b",
            EntryKind::LinkTo {
                target_id: 0,
                target: b"a".to_vec(),
            },
        ),
    ]);
    assert!(plain.on_recv(&to).is_err());
    // A LinkTo's target path is checked as a record's own.
    let (_, mut snk) = windowed(1);
    let bad = Control::Entries(vec![entry(
        1,
        "l",
        EntryKind::LinkTo {
            target_id: 0,
            target: b"../etc/passwd".to_vec(),
        },
    )]);
    assert!(snk.on_recv(&bad).is_err());
    // A record as far as MAX_WINDOW_IDS past the settled mark.
    let (_, mut far) = windowed(0);
    far.entries.next_id = MAX_WINDOW_IDS;
    let beyond = Control::Entries(vec![entry(MAX_WINDOW_IDS, "x", EntryKind::Dir)]);
    assert!(far.on_recv(&beyond).is_err());
    // A SyncMode that needs the whole tree (a device) in a session that
    // proposed windows; a Preserve is taken (an archive copy runs
    // windowed too).
    let (mut src, mut snk) = (SourceMachine::new(), SinkMachine::new());
    src.on_send_flags(&propose(), WINDOWS_FLAG).unwrap();
    snk.on_recv_flags(&propose(), WINDOWS_FLAG).unwrap();
    use crate::control::sync::{DELETE, JOURNAL, SYNC, WRITE_DEVICES};
    let mode = Control::SyncMode {
        flags: SYNC | WRITE_DEVICES,
    };
    assert!(src.on_send(&mode).is_err());
    assert!(snk.on_recv(&mode).is_err());
    snk.on_recv(&Control::Preserve { flags: 1 }).unwrap();
    // ...but a copy's default journal or a sync (with --delete too), and
    // then only once.
    let journal = Control::SyncMode {
        flags: SYNC | DELETE | JOURNAL,
    };
    src.on_send(&journal).unwrap();
    snk.on_recv(&journal).unwrap();
    assert!(snk.on_recv(&journal).is_err());
    // Neither Settled nor EndOfData before MetaEnd.
    let (mut src, mut snk) = windowed(1);
    assert!(snk.on_send(&Control::Settled).is_err());
    let eod = Control::EndOfData { files: 1, bytes: 1 };
    assert!(src.on_send(&eod).is_err());
    assert!(snk.on_recv(&eod).is_err());
}

/// An archive copy or a `--delete` sync proposes windows with the wide
/// flag (a sink of before ignores it and keeps the whole-tree phases):
/// both ends take it as a windowed Propose, its Preserve and SyncMode
/// included, and the Confirm answers with the plain flag.
#[test]
fn the_wide_flag_proposes_windows_for_archive_and_delete_syncs() {
    use crate::control::sync::{DELETE, SYNC};
    let modes = [
        Control::SyncMode {
            flags: SYNC | DELETE,
        },
        Control::Preserve { flags: 1 },
    ];
    // Windowed: the record goes during the payload, and a Ready for it.
    let (mut src, mut snk) = windowed_with(crate::frame::WIDE_WINDOWS_FLAG, &modes, 1);
    ready(1, &mut src, &mut snk);
}

/// A dry run, and a resume, propose windows with a flag of their own (a
/// sink of before refused their SyncMode in windows, and ignores the
/// flag): both ends take
/// it as a windowed Propose, its DRY_RUN SyncMode included; the Confirm
/// answers with the plain flag, and the answer and Ready run per window.
#[test]
fn the_dry_and_resume_flags_propose_windows() {
    use crate::control::sync::{DELETE, DRY_RUN, SYNC};
    let modes = [Control::SyncMode {
        flags: SYNC | DELETE | DRY_RUN,
    }];
    let (mut src, mut snk) = windowed_with(crate::frame::DRY_WINDOWS_FLAG, &modes, 2);
    snk.on_send(&haves(&[1])).unwrap();
    src.on_recv(&haves(&[1])).unwrap();
    ready(2, &mut src, &mut snk);
    // A resume likewise, with a flag of its own.
    let resume = [Control::SyncMode {
        flags: crate::control::sync::RESUME | crate::control::sync::JOURNAL,
    }];
    let (mut src, mut snk) = windowed_with(crate::frame::RESUME_WINDOWS_FLAG, &resume, 2);
    ready(2, &mut src, &mut snk);
    // DIRS_DONE_FLAG alone proposes nothing: refused at both ends.
    let (mut src, mut snk) = (SourceMachine::new(), SinkMachine::new());
    let flag = crate::frame::DIRS_DONE_FLAG;
    assert!(src.on_send_flags(&propose(), flag).is_err());
    assert!(snk.on_recv_flags(&propose(), flag).is_err());
}

/// A windowed `--delete` pair with DIRS_DONE_FLAG on Propose (and on the
/// Confirm if `taken`), up to the payload: `dirs` Dir records, then one
/// file record, none ready.
fn dirs_done_pair(dirs: u64, taken: bool) -> (SourceMachine, SinkMachine) {
    use crate::control::sync::{DELETE, SYNC};
    use crate::frame::{DIRS_DONE_FLAG, WIDE_WINDOWS_FLAG, WINDOWS_FLAG};
    let (mut src, mut snk) = (SourceMachine::new(), SinkMachine::new());
    let p = propose();
    let flag = WIDE_WINDOWS_FLAG | DIRS_DONE_FLAG;
    src.on_send_flags(&p, flag).unwrap();
    snk.on_recv_flags(&p, flag).unwrap();
    assert!(snk.dirs_done_proposed());
    let m = Control::SyncMode {
        flags: SYNC | DELETE,
    };
    src.on_send(&m).unwrap();
    snk.on_recv(&m).unwrap();
    let c = confirm(1);
    let cflags = WINDOWS_FLAG | if taken { DIRS_DONE_FLAG } else { 0 };
    snk.on_send_flags(&c, cflags).unwrap();
    src.on_recv_flags(&c, cflags).unwrap();
    assert_eq!(src.dirs_done(), taken);
    let sd = Control::SyncDone { failures: vec![] };
    snk.on_send(&sd).unwrap();
    src.on_recv(&sd).unwrap();
    let mut es: Vec<_> = (0..dirs)
        .map(|i| entry(i, &format!("d{i}"), EntryKind::Dir))
        .collect();
    es.push(entry(dirs, "d0/f", EntryKind::File { size: 1 }));
    let es = Control::Entries(es);
    src.on_send(&es).unwrap();
    snk.on_recv(&es).unwrap();
    (src, snk)
}

fn dirs_done(ids: &[u64]) -> Control {
    Control::DirsDone { ids: ids.to_vec() }
}

/// DirsDone (docs/PROTOCOL.md "Directories done"): each directory sent,
/// once, before MetaEnd, in any order and batch; both ends agree.
#[test]
fn dirs_done_names_each_directory_sent_once() {
    let (mut src, mut snk) = dirs_done_pair(3, true);
    for m in [dirs_done(&[2]), dirs_done(&[]), dirs_done(&[0, 1])] {
        src.on_send(&m).unwrap();
        snk.on_recv(&m).unwrap();
    }
    let end = Control::MetaEnd {
        entries: 4,
        files: 1,
        bytes: 1,
    };
    src.on_send(&end).unwrap();
    snk.on_recv(&end).unwrap();
}

/// What both machines refuse of DirsDone: an id that is not a directory
/// sent (a file's, one not announced yet), a directory named twice (in
/// one message or two), one after MetaEnd, one without the flag on the
/// Confirm (a sink of before), in a session without windows, in a sync
/// without `--delete` or resume; and the flag on a Confirm to a Propose
/// without it.
#[test]
fn dirs_done_refused_out_of_place() {
    use crate::frame::{DIRS_DONE_FLAG, WINDOWS_FLAG};
    let both = |src: &mut SourceMachine, snk: &mut SinkMachine, m: &Control| {
        (src.on_send(m).is_err(), snk.on_recv(m).is_err())
    };
    for bad in [&[1u64][..], &[2], &[5], &[0, 0], &[u64::MAX]] {
        let (mut src, mut snk) = dirs_done_pair(1, true);
        assert_eq!(
            both(&mut src, &mut snk, &dirs_done(bad)),
            (true, true),
            "{bad:?}"
        );
    }
    let (mut src, mut snk) = dirs_done_pair(2, true);
    src.on_send(&dirs_done(&[1])).unwrap();
    snk.on_recv(&dirs_done(&[1])).unwrap();
    assert_eq!(both(&mut src, &mut snk, &dirs_done(&[1])), (true, true));
    // After MetaEnd.
    let (mut src, mut snk) = dirs_done_pair(1, true);
    let end = Control::MetaEnd {
        entries: 2,
        files: 1,
        bytes: 1,
    };
    src.on_send(&end).unwrap();
    snk.on_recv(&end).unwrap();
    assert_eq!(both(&mut src, &mut snk, &dirs_done(&[0])), (true, true));
    // A sink of before: its Confirm carries no flag.
    let (mut src, mut snk) = dirs_done_pair(1, false);
    assert_eq!(both(&mut src, &mut snk, &dirs_done(&[0])), (true, true));
    // Without windows (an old sink's plain Confirm), and in the metadata
    // phase.
    let (mut src, mut snk) = (SourceMachine::new(), SinkMachine::new());
    let flag = WINDOWS_FLAG | DIRS_DONE_FLAG;
    src.on_send_flags(&propose(), flag).unwrap();
    snk.on_recv_flags(&propose(), flag).unwrap();
    snk.on_send(&confirm(1)).unwrap();
    src.on_recv(&confirm(1)).unwrap();
    let es = Control::Entries(vec![entry(0, "d", EntryKind::Dir)]);
    src.on_send(&es).unwrap();
    snk.on_recv(&es).unwrap();
    assert_eq!(both(&mut src, &mut snk, &dirs_done(&[0])), (true, true));
    // A windowed sync without --delete or resume: the sink refuses.
    let mode = [Control::SyncMode {
        flags: crate::control::sync::SYNC,
    }];
    let (_, mut snk) = windowed_with(flag, &mode, 0);
    assert!(snk.on_recv(&dirs_done(&[])).is_err());
    // The flag on a Confirm whose Propose had none, or without windows.
    let (mut src, mut snk) = (SourceMachine::new(), SinkMachine::new());
    src.on_send_flags(&propose(), WINDOWS_FLAG).unwrap();
    snk.on_recv_flags(&propose(), WINDOWS_FLAG).unwrap();
    let c = confirm(1);
    assert!(snk.on_send_flags(&c, flag).is_err());
    assert!(src.on_recv_flags(&c, flag).is_err());
    let (mut src, mut snk) = (SourceMachine::new(), SinkMachine::new());
    src.on_send_flags(&propose(), flag).unwrap();
    snk.on_recv_flags(&propose(), flag).unwrap();
    assert!(snk.on_send_flags(&c, DIRS_DONE_FLAG).is_err());
    assert!(src.on_recv_flags(&c, DIRS_DONE_FLAG).is_err());
}

/// A windowed pair of a sync (SyncMode SYNC) up to the payload, `n`
/// file records announced, none ready yet.
fn windowed_sync(n: u64) -> (SourceMachine, SinkMachine) {
    let mode = Control::SyncMode {
        flags: crate::control::sync::SYNC,
    };
    windowed_with(crate::frame::WINDOWS_FLAG, &[mode], n)
}

fn haves(ids: &[u64]) -> Control {
    use crate::control::{Have, HaveState};
    let v = ids.iter().map(|&id| Have {
        id,
        state: HaveState::Unchanged,
    });
    Control::Have(v.collect())
}

fn reuses(ids: &[u64]) -> Control {
    use crate::control::{Reuse, ReuseKind};
    let v = ids.iter().map(|&id| Reuse {
        id,
        what: ReuseKind::Keep,
    });
    Control::Reuse(v.collect())
}

/// A windowed sync (issue 36): each window's Have records right before
/// its Ready, the source's Reuse for readied ids, the next window's
/// records and answer while the first one's data moves.
#[test]
fn windowed_sync_answers_per_window() {
    let (mut src, mut snk) = windowed_sync(3);
    let to_source = |m: Control, src: &mut SourceMachine, snk: &mut SinkMachine| {
        snk.on_send(&m).unwrap();
        src.on_recv(&m).unwrap();
    };
    let to_sink = |m: Control, src: &mut SourceMachine, snk: &mut SinkMachine| {
        src.on_send(&m).unwrap();
        snk.on_recv(&m).unwrap();
    };
    to_source(haves(&[0, 2]), &mut src, &mut snk);
    to_source(Control::Ready { through: 3 }, &mut src, &mut snk);
    to_sink(reuses(&[0, 2]), &mut src, &mut snk);
    to_sink(Control::FilesDone(vec![(1, 7)]), &mut src, &mut snk);
    let next = (3..5).map(|i| entry(i, &format!("g{i}"), EntryKind::File { size: 1 }));
    to_sink(Control::Entries(next.collect()), &mut src, &mut snk);
    to_source(Control::SettledThrough { through: 3 }, &mut src, &mut snk);
    to_source(haves(&[4, 3]), &mut src, &mut snk);
    let end = Control::MetaEnd {
        entries: 5,
        files: 5,
        bytes: 5,
    };
    to_sink(end, &mut src, &mut snk);
    to_source(Control::Ready { through: 5 }, &mut src, &mut snk);
    to_sink(reuses(&[3, 4]), &mut src, &mut snk);
    to_source(Control::SettledThrough { through: 5 }, &mut src, &mut snk);
    to_source(Control::Settled, &mut src, &mut snk);
    let eod = Control::EndOfData { files: 1, bytes: 1 };
    to_sink(eod, &mut src, &mut snk);
    assert_eq!(src.phase(), Phase::Completing);
}

/// What a windowed sync refuses: a Have for an id not yet announced or
/// already readied (its window's reads are planned), a Reuse for an id
/// not readied, at both ends; and Have in a windowed copy (no SyncMode).
#[test]
fn windowed_sync_refuses_answers_outside_the_window() {
    // An id beyond the records: the sink has no slot to answer for.
    let (mut src, mut snk) = windowed_sync(3);
    assert!(snk.on_send(&haves(&[1, 3])).is_err());
    assert!(src.on_recv(&haves(&[1, 3])).is_err());
    // An id of a window already readied: its plan is made.
    let (mut src, mut snk) = windowed_sync(3);
    let r = Control::Ready { through: 2 };
    snk.on_send(&r).unwrap();
    src.on_recv(&r).unwrap();
    assert!(snk.on_send(&haves(&[2, 1])).is_err());
    assert!(src.on_recv(&haves(&[2, 1])).is_err());
    snk.on_send(&haves(&[2])).unwrap();
    src.on_recv(&haves(&[2])).unwrap();
    // One record per id of the window at most: no repeats past it.
    assert!(snk.on_send(&haves(&[2])).is_err());
    assert!(src.on_recv(&haves(&[2])).is_err());
    // A Reuse for an id the sink has not readied.
    assert!(src.on_send(&reuses(&[1, 2])).is_err());
    assert!(snk.on_recv(&reuses(&[1, 2])).is_err());
    src.on_send(&reuses(&[1])).unwrap();
    snk.on_recv(&reuses(&[1])).unwrap();
    // A windowed copy has no answer to give.
    let (mut src, mut snk) = windowed(2);
    assert!(snk.on_send(&haves(&[])).is_err());
    assert!(src.on_recv(&haves(&[])).is_err());
    assert!(src.on_send(&reuses(&[0])).is_err());
    assert!(snk.on_recv(&reuses(&[0])).is_err());
}

/// A windowed archive copy (issue 36): Preserve after SyncDone at the
/// sink, each batch's Attrs right behind it, before or after its Ready;
/// Attrs of an earlier batch, of an id not yet announced, before
/// Preserve or after MetaEnd are refused at both ends, and so is a
/// Preserve after records.
#[test]
fn windowed_archive_attrs_follow_their_batch() {
    use crate::attrs::Attrs;
    use crate::frame::WINDOWS_FLAG;
    let a = |ids: &[u64]| {
        let v = ids.iter().map(|&id| Attrs {
            id,
            ..Default::default()
        });
        Control::Attrs(v.collect())
    };
    let files = |from: u64, to: u64| {
        let v = (from..to).map(|i| entry(i, &format!("f{i}"), EntryKind::File { size: 1 }));
        Control::Entries(v.collect())
    };
    let (mut src, mut snk) = (SourceMachine::new(), SinkMachine::new());
    let p = propose();
    src.on_send_flags(&p, WINDOWS_FLAG).unwrap();
    snk.on_recv_flags(&p, WINDOWS_FLAG).unwrap();
    let pr = Control::Preserve { flags: 3 };
    src.on_send(&pr).unwrap();
    let c = confirm(1);
    snk.on_send_flags(&c, WINDOWS_FLAG).unwrap();
    let sd = Control::SyncDone { failures: vec![] };
    snk.on_send(&sd).unwrap();
    // The sink took windows and answered before reading Preserve; no
    // Attrs before it.
    assert!(snk.on_recv(&a(&[])).is_err());
    snk.on_recv(&pr).unwrap();
    // The first window, before the source read Confirm: two Entries
    // messages, their Attrs in two messages.
    for m in [files(0, 2), files(2, 4), a(&[0, 1, 3]), a(&[2])] {
        src.on_send(&m).unwrap();
        snk.on_recv(&m).unwrap();
    }
    src.on_recv_flags(&c, WINDOWS_FLAG).unwrap();
    src.on_recv(&sd).unwrap();
    let r = Control::Ready { through: 4 };
    snk.on_send(&r).unwrap();
    src.on_recv(&r).unwrap();
    let st = Control::SettledThrough { through: 4 };
    snk.on_send(&st).unwrap();
    src.on_recv(&st).unwrap();
    for m in [files(4, 6), a(&[4])] {
        src.on_send(&m).unwrap();
        snk.on_recv(&m).unwrap();
    }
    // An id of the batch before, and one not yet announced.
    for bad in [a(&[3]), a(&[6]), a(&[5, 0])] {
        assert!(src.on_send(&bad).is_err());
        assert!(snk.on_recv(&bad).is_err());
    }
    // A later Attrs for the same batch is still its own (split messages).
    let more = a(&[5]);
    src.on_send(&more).unwrap();
    snk.on_recv(&more).unwrap();
    // No Preserve once records came.
    assert!(snk.on_recv(&pr).is_err());
    assert!(src.on_send(&pr).is_err());
    let end = Control::MetaEnd {
        entries: 6,
        files: 6,
        bytes: 6,
    };
    src.on_send(&end).unwrap();
    snk.on_recv(&end).unwrap();
    assert!(src.on_send(&a(&[5])).is_err(), "Attrs after MetaEnd");
    assert!(snk.on_recv(&a(&[5])).is_err(), "Attrs after MetaEnd");
}

/// Records `from..to`, files whose paths are `len` bytes long.
fn long_files(from: u64, to: u64, len: usize) -> Control {
    let es = (from..to).map(|id| {
        // Components of at most 200 bytes (path::MAX_NAME).
        let mut p = format!("f{id}").into_bytes();
        while p.len() < len {
            p.push(if p.len() % 200 == 0 { b'/' } else { b'x' });
        }
        let path = String::from_utf8(p).unwrap();
        entry(id, &path, EntryKind::File { size: 1 })
    });
    Control::Entries(es.collect())
}

/// A pair whose Propose and Confirm carried WINDOW_LIMIT_FLAG, up to
/// the payload: the sink's Window (`files`, `bytes`) at both ends.
fn limited(files: u64, bytes: u64) -> (SourceMachine, SinkMachine) {
    use crate::frame::{WINDOWS_FLAG, WINDOW_LIMIT_FLAG};
    let both = WINDOWS_FLAG | WINDOW_LIMIT_FLAG;
    let (mut src, mut snk) = (SourceMachine::new(), SinkMachine::new());
    src.on_send_flags(&propose(), both).unwrap();
    snk.on_recv_flags(&propose(), both).unwrap();
    snk.on_send_flags(&confirm(1), both).unwrap();
    src.on_recv_flags(&confirm(1), both).unwrap();
    let w = Control::Window { files, bytes };
    snk.on_send(&w).unwrap();
    src.on_recv(&w).unwrap();
    let sd = Control::SyncDone { failures: vec![] };
    snk.on_send(&sd).unwrap();
    src.on_recv(&sd).unwrap();
    (src, snk)
}

/// The window a sink announces for its memory budget (issue 36,
/// docs/PROTOCOL.md "Windows"): records past it, in ids or in bytes, are
/// refused at both ends until the sink's SettledThrough makes room; the
/// first window holds before the source read it.
#[test]
fn the_window_the_sink_announces_holds_at_both_ends() {
    let send = |m: &Control, src: &mut SourceMachine, snk: &mut SinkMachine| {
        src.on_send(m).unwrap();
        snk.on_recv(m).unwrap();
    };
    let (first, first_bytes) = FIRST_WINDOW;
    // Ids: a window of 1,000; one more only once 10 are settled.
    let (mut src, mut snk) = limited(1000, 1 << 20);
    send(&long_files(0, 1000, 8), &mut src, &mut snk);
    let over = long_files(1000, 1001, 8);
    assert!(src.on_send(&over).is_err() && snk.on_recv(&over).is_err());
    let (r, st) = (
        Control::Ready { through: 10 },
        Control::SettledThrough { through: 10 },
    );
    for m in [&r, &st] {
        snk.on_send(m).unwrap();
        src.on_recv(m).unwrap();
    }
    send(&long_files(1000, 1010, 8), &mut src, &mut snk);
    // Bytes: the first window's 128 KiB at least (the larger of the two
    // holds); records of 4,096 bytes each, 32 fit, not 33, in two batches.
    let (mut src, mut snk) = limited(MIN_WINDOW.0, MIN_WINDOW.1);
    let long = 4096 - 16;
    assert_eq!(first_bytes / 4096, 32);
    send(&long_files(0, 20, long), &mut src, &mut snk);
    send(&long_files(20, 32, long), &mut src, &mut snk);
    let over = long_files(32, 33, long);
    assert!(src.on_send(&over).is_err() && snk.on_recv(&over).is_err());
    // The first batch settled: its bytes are free again.
    for m in [
        Control::Ready { through: 20 },
        Control::SettledThrough { through: 20 },
    ] {
        snk.on_send(&m).unwrap();
        src.on_recv(&m).unwrap();
    }
    send(&long_files(32, 52, long), &mut src, &mut snk);
    // Before the Window (before Confirm, even): the first window.
    use crate::frame::{WINDOWS_FLAG, WINDOW_LIMIT_FLAG};
    let both = WINDOWS_FLAG | WINDOW_LIMIT_FLAG;
    let (mut src, mut snk) = (SourceMachine::new(), SinkMachine::new());
    src.on_send_flags(&propose(), both).unwrap();
    snk.on_recv_flags(&propose(), both).unwrap();
    snk.on_send_flags(&confirm(1), both).unwrap();
    send(&long_files(0, first, 8), &mut src, &mut snk);
    let over = long_files(first, first + 1, 8);
    assert!(src.on_send(&over).is_err() && snk.on_recv(&over).is_err());
    // A sink that announces none (no budget) leaves the source its own.
    let (mut src, mut snk) = (SourceMachine::new(), SinkMachine::new());
    src.on_send_flags(&propose(), both).unwrap();
    snk.on_recv_flags(&propose(), both).unwrap();
    snk.on_send_flags(&confirm(1), WINDOWS_FLAG).unwrap();
    src.on_recv_flags(&confirm(1), WINDOWS_FLAG).unwrap();
    send(&long_files(0, 4 * first, 8), &mut src, &mut snk);
}

/// What each machine refuses of a window limit: the flag on a Propose
/// without windows, on a Confirm whose Propose did not carry it or that
/// takes no windows; a Window not due, out of bounds (no id, absurd
/// sizes), or anything else where it is due.
#[test]
fn window_limits_refused_out_of_place() {
    use crate::frame::{WINDOWS_FLAG, WINDOW_LIMIT_FLAG};
    let both = WINDOWS_FLAG | WINDOW_LIMIT_FLAG;
    let (mut src, mut snk) = (SourceMachine::new(), SinkMachine::new());
    assert!(src.on_send_flags(&propose(), WINDOW_LIMIT_FLAG).is_err());
    assert!(snk.on_recv_flags(&propose(), WINDOW_LIMIT_FLAG).is_err());
    // Windows proposed without the limit: a Confirm with it is refused,
    // and so is a Window.
    let (mut src, mut snk) = (SourceMachine::new(), SinkMachine::new());
    src.on_send_flags(&propose(), WINDOWS_FLAG).unwrap();
    snk.on_recv_flags(&propose(), WINDOWS_FLAG).unwrap();
    assert!(snk.on_send_flags(&confirm(1), both).is_err());
    assert!(src.on_recv_flags(&confirm(1), both).is_err());
    snk.on_send_flags(&confirm(1), WINDOWS_FLAG).unwrap();
    src.on_recv_flags(&confirm(1), WINDOWS_FLAG).unwrap();
    let w = Control::Window {
        files: 1000,
        bytes: 1 << 20,
    };
    assert!(snk.on_send(&w).is_err() && src.on_recv(&w).is_err());
    // The limit on a Confirm that takes no windows.
    let (mut src, mut snk) = (SourceMachine::new(), SinkMachine::new());
    src.on_send_flags(&propose(), both).unwrap();
    snk.on_recv_flags(&propose(), both).unwrap();
    assert!(snk.on_send_flags(&confirm(1), WINDOW_LIMIT_FLAG).is_err());
    assert!(src.on_recv_flags(&confirm(1), WINDOW_LIMIT_FLAG).is_err());
    // Due: nothing else first; out of bounds refused at both ends.
    let (mut src, mut snk) = (SourceMachine::new(), SinkMachine::new());
    src.on_send_flags(&propose(), both).unwrap();
    snk.on_recv_flags(&propose(), both).unwrap();
    snk.on_send_flags(&confirm(1), both).unwrap();
    src.on_recv_flags(&confirm(1), both).unwrap();
    let sd = Control::SyncDone { failures: vec![] };
    assert!(snk.on_send(&sd).is_err() && src.on_recv(&sd).is_err());
    for (files, bytes) in [
        (0, 1 << 20),
        (MIN_WINDOW.0 - 1, 1 << 20),
        (MAX_WINDOW_IDS + 1, 1 << 20),
        (u64::MAX, u64::MAX),
        (1000, 0),
        (1000, MIN_WINDOW.1 - 1),
        (1000, MAX_WINDOW_BYTES + 1),
    ] {
        let w = Control::Window { files, bytes };
        assert!(snk.on_send(&w).is_err(), "{files} {bytes}");
        assert!(src.on_recv(&w).is_err(), "{files} {bytes}");
    }
    let w = Control::Window {
        files: MAX_WINDOW_IDS,
        bytes: MAX_WINDOW_BYTES,
    };
    snk.on_send(&w).unwrap();
    src.on_recv(&w).unwrap();
    // Once only.
    assert!(snk.on_send(&w).is_err() && src.on_recv(&w).is_err());
    snk.on_send(&sd).unwrap();
    src.on_recv(&sd).unwrap();
}

/// A Placed (issue 36): only when the Propose asked for it
/// (frame::PLACED_FLAG), once, after EndOfData and before Complete, with
/// at most MAX_PLACED valid relative paths; refused by both machines
/// otherwise.
#[test]
fn placed_only_when_asked_once_before_complete() {
    use crate::frame::PLACED_FLAG;
    let session = |flags: u8| {
        let mut src = SourceMachine::new();
        let mut snk = SinkMachine::new();
        src.on_send_flags(&propose(), flags).unwrap();
        snk.on_recv_flags(&propose(), flags).unwrap();
        let c = confirm(2);
        snk.on_send(&c).unwrap();
        src.on_recv(&c).unwrap();
        let es = Control::Entries(vec![entry(
            0,
            "big",
            EntryKind::Piece {
                size: 8,
                piece: 4,
                index: 1,
            },
        )]);
        let end = Control::MetaEnd {
            entries: 1,
            files: 1,
            bytes: 4,
        };
        for m in [es, end] {
            src.on_send(&m).unwrap();
            snk.on_recv(&m).unwrap();
        }
        let sd = Control::SyncDone { failures: vec![] };
        snk.on_send(&sd).unwrap();
        src.on_recv(&sd).unwrap();
        (src, snk)
    };
    let placed = |files: &[&str]| Control::Placed {
        files: files.iter().map(|f| f.as_bytes().to_vec()).collect(),
    };
    let eod = Control::EndOfData { files: 1, bytes: 4 };
    let done = Control::Complete(Complete {
        files: 1,
        bytes: 4,
        failures: vec![],
        cpu_s: 0.0,
    });
    let (mut src, mut snk) = session(PLACED_FLAG);
    assert!(snk.placed_asked());
    // Not during the payload.
    assert!(snk.on_send(&placed(&["big"])).is_err());
    let (mut src2, _) = session(PLACED_FLAG);
    assert!(src2.on_recv(&placed(&["big"])).is_err());
    src.on_send(&eod).unwrap();
    snk.on_recv(&eod).unwrap();
    // Hostile contents: too many, an absolute or empty path, a `..`.
    let many: Vec<String> = (0..=crate::control::MAX_PLACED)
        .map(|i| format!("f{i}"))
        .collect();
    let many: Vec<&str> = many.iter().map(|s| s.as_str()).collect();
    for bad in [
        placed(&many),
        placed(&["/etc"]),
        placed(&[""]),
        placed(&["a/../b"]),
    ] {
        let (mut s, mut k) = session(PLACED_FLAG);
        s.on_send(&eod).unwrap();
        k.on_recv(&eod).unwrap();
        assert!(s.on_recv(&bad).is_err(), "{bad:?}");
        assert!(k.on_send(&bad).is_err(), "{bad:?}");
    }
    let ok = placed(&["big"]);
    snk.on_send(&ok).unwrap();
    src.on_recv(&ok).unwrap();
    // Once.
    assert!(snk.on_send(&ok).is_err());
    assert!(src.on_recv(&ok).is_err());
    snk.on_send(&done).unwrap();
    src.on_recv(&done).unwrap();
    assert_eq!(src.phase(), Phase::Done);
    // Not asked: refused at both ends (a sink of before never sends it).
    let (mut src, mut snk) = session(0);
    assert!(!snk.placed_asked());
    src.on_send(&eod).unwrap();
    snk.on_recv(&eod).unwrap();
    assert!(snk.on_send(&ok).is_err());
    assert!(src.on_recv(&ok).is_err());
    snk.on_send(&done).unwrap();
    src.on_recv(&done).unwrap();
    assert_eq!(src.phase(), Phase::Done);
}

/// A RelayPlaced (issue 36) reaches the agent only when its RelayOpen
/// frame asked (frame::PLACED_FLAG), once, before RelayDone, with at most
/// MAX_PLACED valid paths in each list and only cut files placed; the
/// agent's machine refuses it otherwise, and a relay of before (none
/// sent) is a relay like any other.
#[test]
fn relay_placed_only_when_asked_once_before_done() {
    use crate::control::{RelayPlaced, RelayReport, MAX_PLACED};
    use crate::frame::PLACED_FLAG;
    let v = |l: &[&str]| l.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>();
    let rp = |cut: &[&str], placed: Option<&[&str]>| {
        Control::RelayPlaced(RelayPlaced {
            cut: v(cut),
            placed: placed.map(v),
        })
    };
    let progress = Control::RelayProgress {
        files: 1,
        bytes: 2,
        total_files: 3,
        total_bytes: 4,
    };
    let done = Control::RelayDone(RelayReport {
        files: 1,
        bytes: 2,
        unchanged: 0,
        streams: 1,
        block_size: 1 << 20,
        failures: vec![],
        sink_cpu_s: -1.0,
        share_files: 1,
        share_bytes: 2,
        listing: 7,
        error: String::new(),
    });
    let ok = rp(&["src/a", "src/b"], Some(&["src/b"]));
    // Asked: progress, one RelayPlaced, RelayDone.
    let mut m = RelayMachine::new(PLACED_FLAG);
    m.on_recv(&progress).unwrap();
    m.on_recv(&ok).unwrap();
    // Twice, or progress after it: refused.
    assert!(RelayMachine::new(PLACED_FLAG).on_recv(&ok).is_ok());
    let mut twice = RelayMachine::new(PLACED_FLAG);
    twice.on_recv(&ok).unwrap();
    assert!(twice.on_recv(&ok).is_err());
    let mut late = RelayMachine::new(PLACED_FLAG);
    late.on_recv(&ok).unwrap();
    assert!(late.on_recv(&progress).is_err());
    m.on_recv(&done).unwrap();
    // Nothing after RelayDone.
    assert!(m.on_recv(&ok).is_err() && m.on_recv(&done).is_err());
    // A sink of before: cut, no placed list.
    RelayMachine::new(PLACED_FLAG)
        .on_recv(&rp(&["big"], None))
        .unwrap();
    // Unasked (an agent of before never gets one): refused.
    let mut unasked = RelayMachine::new(0);
    assert!(unasked.on_recv(&ok).is_err());
    // Asked, but a daemon of before sends none: a relay as before.
    let mut old = RelayMachine::new(PLACED_FLAG);
    old.on_recv(&progress).unwrap();
    old.on_recv(&done).unwrap();
    // Hostile contents: too many, bad paths, a placed file not cut.
    let many: Vec<String> = (0..=MAX_PLACED).map(|i| format!("f{i}")).collect();
    let many: Vec<&str> = many.iter().map(|s| s.as_str()).collect();
    for bad in [
        rp(&many, Some(&[])),
        rp(&["a"], Some(&many)),
        rp(&["/etc/passwd"], Some(&[])),
        rp(&["a"], Some(&["../a"])),
        rp(&[""], None),
        rp(&["a/../b"], None),
        rp(&["src/a"], Some(&["src/elsewhere"])),
    ] {
        let mut m = RelayMachine::new(PLACED_FLAG);
        assert!(m.on_recv(&bad).is_err(), "{bad:?}");
    }
    // Anything else during a relay.
    assert!(RelayMachine::new(PLACED_FLAG)
        .on_recv(&Control::Settled)
        .is_err());
}
