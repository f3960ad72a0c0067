//! Every control variant through encode and decode, and trailing bytes
//! refused: the wire format pinned.

use super::*;

#[test]
fn roundtrip_every_variant() {
    let msgs = vec![
        Control::Hello {
            user: "alice".into(),
            noise: vec![1; 48],
        },
        Control::Challenge { noise: vec![2; 80] },
        Control::Auth { proof: [4; 32] },
        Control::AuthOk { session: 77 },
        Control::Open(Open {
            server_role: Role::Sink,
            paths: vec![b"dst".to_vec()],
            recursive: true,
            streams: 4,
            block_size: 1 << 20,
            checksum: true,
        }),
        Control::Join {
            session: 77,
            stream: 3,
            nonce: [5; 32],
            mac: [6; 32],
        },
        Control::JoinOk,
        Control::Propose(Propose {
            roots: 1,
            streams: 4,
            block_size: 1 << 22,
            capacity_mbps: 0,
            checksum: true,
            cipher: 0,
        }),
        Control::Confirm(Confirm {
            streams: 4,
            block_size: 1 << 22,
            credits_per_stream: 8,
            capacity_mbps: 10_000,
            checksum: true,
            cipher: 0,
        }),
        Control::Entries(vec![Entry {
            id: 9,
            path: "a/ü b".as_bytes().to_vec(),
            kind: EntryKind::Symlink {
                target: b"../x".to_vec(),
            },
            mode: 0o755,
            mtime_s: -5,
            mtime_ns: 999,
        }]),
        Control::MetaEnd {
            entries: 1,
            files: 2,
            bytes: 3,
        },
        Control::SyncDone { failures: vec![] },
        Control::FilesDone(vec![(1, 2), (3, 4)]),
        Control::FileFailed {
            id: 1,
            reason: "EIO".into(),
        },
        Control::EndOfData { files: 1, bytes: 2 },
        Control::Complete(Complete {
            files: 1,
            bytes: 2,
            failures: vec![Failure {
                path: b"x".to_vec(),
                reason: "disk full".into(),
            }],
            cpu_s: 0.5,
        }),
        Control::Abort {
            reason: "disk full".into(),
        },
        Control::Error {
            code: 2,
            message: "no".into(),
        },
        Control::StatusQuery,
        Control::StatusReport {
            json: "{\"version\":1}".into(),
        },
        Control::SyncMode { flags: 5 },
        Control::Have(vec![
            Have {
                id: 3,
                state: HaveState::Unchanged,
            },
            Have {
                id: 4,
                state: HaveState::Digest(7),
            },
            Have {
                id: 5,
                state: HaveState::Blocks {
                    block_size: 1 << 18,
                    size: 9,
                    sums: vec![1, 0],
                },
            },
        ]),
        Control::Reuse(vec![
            Reuse {
                id: 4,
                what: ReuseKind::Keep,
            },
            Reuse {
                id: 5,
                what: ReuseKind::Base { bytes: 1 },
            },
        ]),
        Control::Deleted(vec![b"a/b".to_vec()]),
        Control::Resend(vec![(3, 1 << 20, 4096), (4, 0, 1 << 31 | 512)]),
        Control::Settled,
        Control::TokenRequest { ttl_s: 60 },
        Control::Token {
            user: "otp-00ff".into(),
            key: [7; 32],
            expires_s: 60,
        },
        Control::SealControl { cipher: 2 },
        Control::Rejoin {
            session: 9,
            stream: 3,
            epoch: 2,
            nonce: [1; 32],
            mac: [2; 32],
        },
        Control::Lost {
            stream: 3,
            epoch: 1,
            received: 77,
        },
        Control::LinkDown {
            stream: 3,
            epoch: 1,
        },
        Control::SelectOpen {
            open: Open {
                server_role: Role::Source,
                paths: vec![b"data".to_vec()],
                recursive: true,
                streams: 4,
                block_size: 1 << 22,
                checksum: true,
            },
            flags: 1,
            select: Selection {
                rules: vec![b"+ *.c".to_vec(), b"- /build/".to_vec()],
                min_size: 1,
                max_size: 1 << 30,
                files: vec![b"a/b".to_vec()].into(),
                files_recursive: true,
            },
        },
        Control::SiteHello {
            user: "site".into(),
            addr: "127.0.0.1:4000".into(),
            noise: vec![4; 48],
        },
        Control::Entries(vec![Entry {
            id: 3,
            path: b"p".to_vec(),
            kind: EntryKind::Special {
                kind: crate::attrs::special::CHAR,
                rdev: 0x0103,
            },
            mode: 0o666,
            mtime_s: 1,
            mtime_ns: 2,
        }]),
        Control::ArchiveOpen {
            open: Open {
                server_role: Role::Source,
                paths: vec![b"data".to_vec()],
                recursive: true,
                streams: 4,
                block_size: 1 << 22,
                checksum: true,
            },
            flags: 0,
            select: Selection::default(),
            preserve: crate::attrs::preserve::ALL,
        },
        Control::Preserve { flags: 3 },
        Control::Attrs(vec![crate::attrs::Attrs {
            id: 4,
            owner: Some(crate::attrs::Principal {
                id: 65534,
                name: b"nobody".to_vec(),
            }),
            group: None,
            xattrs: vec![(b"user.k".to_vec(), vec![0, 1, 2])],
            acl: vec![crate::attrs::AclEntry {
                tag: crate::attrs::acl_tag::USER,
                perm: 6,
                who: crate::attrs::Principal {
                    id: 1000,
                    name: b"alice".to_vec(),
                },
            }],
            default_acl: vec![],
            atime: Some((5, 6)),
        }]),
        Control::BwLimit {
            bytes_per_s: 20 << 20,
        },
        Control::Redirect {
            addr: "10.0.0.2:7070".into(),
            reason: "4 sessions running (max_sessions = 4)".into(),
            mac: [6; 32],
        },
        Control::Redirected {
            from: "10.0.0.1:7070".into(),
        },
        Control::RawQuery,
        Control::RawOffer {
            ifaces: vec![RawIface {
                name: "eth2".into(),
                ifindex: 4,
                mac: [2, 0, 0, 0, 0, 9],
                mtu: 9000,
                node: Some(1),
                addrs: vec!["10.1.0.2".into()],
            }],
        },
        Control::AddStream { stream: 5 },
        Control::StreamAdded {
            stream: 5,
            credits: 6,
        },
        Control::RelayOpen(Relay {
            sink: "10.0.0.2:7070".into(),
            paths: vec![b"run7/".to_vec()],
            dest: b"archive".to_vec(),
            recursive: true,
            streams: 0,
            block_size: 4 << 20,
            checksum: true,
            flags: sync::SYNC | sync::RESUME,
            select: Selection {
                rules: vec![b"- *.tmp".to_vec()],
                ..Default::default()
            },
            preserve: 3,
            bwlimit: 25_000_000,
            cipher: 1,
            share: Some(Share {
                index: 1,
                weights: vec![1000, 500, 1000],
                pieces: 4 << 20,
            }),
        }),
        Control::OnBehalf {
            user: "alice".into(),
        },
        Control::RelayProgress {
            files: 3,
            bytes: 9 << 20,
            total_files: 10,
            total_bytes: 30 << 20,
        },
        Control::RelayDone(RelayReport {
            files: 10,
            bytes: 30 << 20,
            unchanged: 2,
            streams: 4,
            block_size: 4 << 20,
            failures: vec![Failure {
                path: b"run7/x".to_vec(),
                reason: "Permission denied".into(),
            }],
            sink_cpu_s: 0.25,
            share_files: 10,
            share_bytes: 30 << 20,
            listing: 0xfeed,
            error: String::new(),
        }),
        Control::GrowStreams,
        Control::Grown {
            stages: vec![GrowStage {
                at_ms: 2500,
                streams: 4,
                kb_s: 120_000,
                link_kb_s: vec![20_000, 30_000, 40_000],
                then: "add 2".into(),
            }],
            stopped: "stop: at the limit (32)".into(),
        },
        Control::RetiredChallengeTcp,
        Control::GrownLinks {
            stages: vec![GrowStage {
                at_ms: 2500,
                streams: 4,
                kb_s: 120_000,
                link_kb_s: vec![],
                then: "add 2".into(),
            }],
            links: vec![StageLinks {
                busy_pm: Some(950),
                rtt_x100: None,
            }],
            stopped: String::new(),
        },
        Control::ScanFailed {
            failures: vec![Failure {
                path: b"sub/dir".to_vec(),
                reason: "cannot read directory: Permission denied".into(),
            }],
            io_error: true,
        },
        Control::WatchOpen {
            version: WATCH_VERSION,
            dest: b"mirror".to_vec(),
        },
        Control::WatchReady { version: 1 },
        Control::WatchOps {
            seq: 7,
            ops: vec![
                WatchOp::Rename {
                    from: b"a".to_vec(),
                    to: b"b/c".to_vec(),
                    dir: true,
                },
                WatchOp::Delete {
                    path: b"x".to_vec(),
                    dir: false,
                },
                WatchOp::DirAttrs {
                    path: vec![],
                    mode: 0o755,
                    mtime_s: -1,
                    mtime_ns: 5,
                },
            ],
        },
        Control::WatchDone {
            seq: 7,
            results: vec![
                WatchResult::Done,
                WatchResult::Missing,
                WatchResult::Failed("no".into()),
            ],
        },
        Control::SelectFiles {
            files: vec![b"a/b".to_vec(), b"c".to_vec()],
        },
        Control::WatchBatch { batch: u64::MAX },
        Control::Ready { through: 1 << 40 },
        Control::SettledThrough { through: 7 },
        Control::Window {
            files: 1 << 20,
            bytes: u64::MAX,
        },
        Control::Placed {
            files: vec![b"big".to_vec(), b"d/huge".to_vec()],
        },
        Control::RelayPlaced(RelayPlaced {
            cut: vec![b"src/big".to_vec(), b"src/huge".to_vec()],
            placed: Some(vec![b"src/huge".to_vec()]),
        }),
        Control::RelayPlaced(RelayPlaced {
            cut: vec![b"src/big".to_vec()],
            placed: None,
        }),
        Control::DirsDone {
            ids: vec![0, 7, u64::MAX],
        },
        Control::Entries(vec![Entry {
            id: 3,
            path: b"d/l".to_vec(),
            kind: EntryKind::LinkTo {
                target_id: 2,
                target: b"d/f".to_vec(),
            },
            mode: 0o644,
            mtime_s: 1,
            mtime_ns: 2,
        }]),
    ];
    for m in msgs {
        let b = m.encode().unwrap();
        assert_eq!(Control::decode(&b).unwrap(), m);
    }
}

#[test]
fn trailing_bytes_rejected() {
    let mut b = Control::JoinOk.encode().unwrap();
    b.push(0);
    assert!(Control::decode(&b).is_err());
}

/// The one reading of a peer's failure text as a kind (a relay's client):
/// ENOENT as the OS and as io::Error's kind alone say it; not another
/// errno, nor a reason that merely mentions one.
#[test]
fn a_failure_reason_says_vanished_only_for_enoent() {
    let f = |reason: String| Failure {
        path: b"p".to_vec(),
        reason,
    };
    // Linux numbers: ENOENT 2, EACCES 13.
    let enoent = std::io::Error::from_raw_os_error(2);
    let eacces = std::io::Error::from_raw_os_error(13);
    let kind = std::io::Error::from(std::io::ErrorKind::NotFound);
    assert!(f(enoent.to_string()).reason_says_vanished());
    assert!(f(format!("cannot read directory: {enoent}")).reason_says_vanished());
    assert!(f(kind.to_string()).reason_says_vanished());
    assert!(!f(format!("cannot read directory: {eacces}")).reason_says_vanished());
    assert!(!f("(os error 2) was said once, then it failed".into()).reason_says_vanished());
}

#[test]
fn more_scan_failures_line_is_recognized_and_only_it() {
    let more = Failure::more_scan_failures(42);
    assert!(more.counts_more_scan_failures());
    let real = Failure {
        path: b"(more)".to_vec(),
        reason: "Permission denied (os error 13)".into(),
    };
    assert!(!real.counts_more_scan_failures());
    let other = Failure {
        path: b"x".to_vec(),
        reason: more.reason.clone(),
    };
    assert!(!other.counts_more_scan_failures());
    let bare = Failure {
        path: b"(more)".to_vec(),
        reason: " more source paths failed".into(),
    };
    assert!(!bare.counts_more_scan_failures());
}
