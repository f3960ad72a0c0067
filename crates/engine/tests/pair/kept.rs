//! A watch channel's kept sessions (issue 38, docs/PROTOCOL.md "Kept
//! sessions") against a daemon in memory: many batches over one
//! authenticated control connection (one Hello in the whole transcript),
//! operations between them, sealed under --encrypt; and the misuse the
//! daemon refuses: a batch out of order, a Join of an ended batch or made
//! with another batch's key, an open of another role, for a path outside
//! the user's root, or on behalf of someone else.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ramsys_engine::data::resources::ResourceConfig;
use ramsys_engine::request::walk::Top;
use ramsys_engine::roles::client::{push_kept, Remote};
use ramsys_engine::roles::server::Daemon;
use ramsys_engine::roles::watchops::WatchChannel;
use ramsys_engine::session::{ClientSession, Connect};
use ramsys_engine::storage::fsops::{Confinement, Root};
use ramsys_engine::transport::crypto::Cipher;
use ramsys_engine::transport::mem::Net;
use ramsys_engine::transport::wire::{exchange_preamble, recv_control, send_control};
use ramsys_engine::{EngineResources, Stats, TransferOptions};
use ramsys_proto::auth::{batch_key, batch_session, join_mac};
use ramsys_proto::control::{Open, Role, WatchOp, WatchResult, WATCH_VERSION};
use ramsys_proto::Control;

use crate::common::tree::{files, same_tree, tmp};

const KEY: [u8; 32] = [9; 32];

fn opts() -> TransferOptions {
    TransferOptions {
        streams: 2,
        block_size: 16 << 10,
        recursive: true,
        direct: false,
        ..Default::default()
    }
}

fn res() -> EngineResources {
    EngineResources::new(&ResourceConfig {
        memory: 4 << 20,
        buffer_size: 64 << 10,
        readers: 2,
        writers: 2,
        max_streams: 4,
        ..Default::default()
    })
    .unwrap()
}

fn daemon(net: &Net, root: &Path) -> Remote {
    let d = Daemon::bind("127.0.0.1:0", root, KEY.to_vec(), opts(), res()).unwrap();
    d.serve_links(net.listen("daemon", "daemon"));
    Remote {
        transport: net.host("agent"),
        addr: "daemon".into(),
        key: KEY.to_vec(),
        connect_timeout: Duration::from_secs(5),
        user: None,
    }
}

fn src_top() -> Vec<Top> {
    vec![Top {
        rel: b"src".to_vec(),
        name: b"src".to_vec(),
    }]
}

/// An authenticated connection with a watch channel open on `dest`.
fn channel(remote: &Remote, dest: &[u8]) -> ClientSession {
    let mut s = Connect::new(&remote.addr, &remote.key, remote.connect_timeout)
        .open(&*remote.transport)
        .unwrap();
    let open = Control::WatchOpen {
        version: WATCH_VERSION,
        dest: dest.to_vec(),
    };
    send_control(&mut *s.ctl, &open).unwrap();
    match recv_control(&mut *s.ctl).unwrap() {
        Control::WatchReady { version } => assert_eq!(version, WATCH_VERSION),
        m => panic!("expected WatchReady, got {}", m.name()),
    }
    s
}

fn hellos(net: &Net) -> usize {
    let t = net.transcript();
    t.iter().filter(|r| r.name() == "Hello").count()
}

/// Batch after batch on one connection, with operations between them:
/// each batch's tree arrives whole, and the whole job shows one Hello.
#[test]
fn many_batches_share_one_authenticated_connection() {
    let t = tmp();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    std::fs::create_dir_all(dst.join("m")).unwrap();
    let net = Net::default();
    let remote = daemon(&net, &dst);
    let root = Arc::new(Root::open(t.path(), Confinement::None).unwrap());
    let mut s = channel(&remote, b"m");
    for n in 1..=5u64 {
        files(&src.join(format!("b{n}")), 12, 16 << 10, n);
        let stats = Arc::new(Stats::default());
        let r = push_kept(
            &mut s,
            n,
            &remote,
            root.clone(),
            src_top(),
            b"m".to_vec(),
            &opts(),
            &res(),
            stats,
        );
        let r = r.unwrap_or_else(|e| panic!("batch {n}: {e}"));
        assert!(r.files > 0, "batch {n} moved nothing");
        same_tree(&src, &dst.join("m/src"));
        // The channel's operations between two sessions: a rename at
        // both ends.
        std::fs::rename(src.join(format!("b{n}")), src.join(format!("c{n}"))).unwrap();
        let ops = Control::WatchOps {
            seq: n,
            ops: vec![WatchOp::Rename {
                from: format!("src/b{n}").into_bytes(),
                to: format!("src/c{n}").into_bytes(),
                dir: true,
            }],
        };
        send_control(&mut *s.ctl, &ops).unwrap();
        match recv_control(&mut *s.ctl).unwrap() {
            Control::WatchDone { seq, results } => {
                assert_eq!((seq, results), (n, vec![WatchResult::Done]))
            }
            m => panic!("expected WatchDone, got {}", m.name()),
        }
        same_tree(&src, &dst.join("m/src"));
    }
    assert_eq!(hellos(&net), 1, "a batch opened a connection of its own");
    let batches = net.transcript();
    let batches = batches.iter().filter(|r| r.name() == "WatchBatch").count();
    assert_eq!(batches, 5);
}

/// The same sealed (`--encrypt`): the control link stays sealed across
/// batches and each batch's data is sealed under its own key.
#[test]
fn kept_sessions_under_encrypt() {
    let t = tmp();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    std::fs::create_dir_all(dst.join("m")).unwrap();
    let net = Net::default();
    let remote = daemon(&net, &dst);
    let root = Arc::new(Root::open(t.path(), Confinement::None).unwrap());
    let cipher = Cipher::ChaCha20Poly1305;
    let mut c = WatchChannel::open(&remote, b"m", cipher).unwrap();
    assert!(c.keeps_sessions());
    let o = TransferOptions {
        encrypt: cipher,
        ..opts()
    };
    for n in 1..=3u64 {
        files(&src.join(format!("b{n}")), 10, 16 << 10, 100 + n);
        let stats = Arc::new(Stats::default());
        let tops = src_top();
        let r = c.push(
            &remote,
            root.clone(),
            tops,
            b"m".to_vec(),
            &o,
            &res(),
            stats,
        );
        r.unwrap_or_else(|e| panic!("batch {n}: {e}"));
        same_tree(&src, &dst.join("m/src"));
        let del = WatchOp::Delete {
            path: b"nothing-here".to_vec(),
            dir: false,
        };
        assert_eq!(c.apply(&[del]).unwrap(), vec![WatchResult::Missing]);
    }
    // A batch as a mirror's (--delete) lists its files, and a list this
    // long goes ahead of the open in SelectFiles chunks, all in the
    // batch's one write on the sealed link.
    files(&src.join("b4"), 10, 16 << 10, 104);
    let mut listed: Vec<Vec<u8>> = (0..10)
        .map(|i| format!("src/b4/d{}/f{i}", i % 7).into_bytes())
        .collect();
    listed.extend((0..30_000).map(|i| format!("src/gone/never-there-{i:08}").into_bytes()));
    let mut o = o.clone();
    o.sync = ramsys_proto::control::sync::SYNC | ramsys_proto::control::sync::DELETE;
    o.select.files = listed.into();
    o.select.files_recursive = true;
    let stats = Arc::new(Stats::default());
    let r = c.push(&remote, root, src_top(), b"m".to_vec(), &o, &res(), stats);
    r.unwrap_or_else(|e| panic!("a long list: {e}"));
    same_tree(&src.join("b4"), &dst.join("m/src/b4"));
    assert_eq!(hellos(&net), 1);
}

/// A data link presenting `join` to the daemon: its answer, None when it
/// closed the link without one (the daemon's refusal can race its close
/// on the in-memory link: either way no JoinOk).
fn join_as(remote: &Remote, join: &Control) -> Option<Control> {
    let mut l = remote
        .transport
        .connect(&remote.addr, Duration::from_secs(5))
        .unwrap();
    exchange_preamble(&mut *l).unwrap();
    send_control(&mut *l, join).unwrap();
    l.flush().unwrap();
    l.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    match recv_control(&mut *l) {
        Err(ramsys_engine::types::error::EngineError::PeerClosed) => None,
        r => Some(r.unwrap()),
    }
}

fn sink_open(path: &[u8]) -> Control {
    Control::Open(Open {
        server_role: Role::Sink,
        paths: vec![path.to_vec()],
        recursive: true,
        streams: 1,
        block_size: 16 << 10,
        checksum: true,
    })
}

/// After batch 1, a Join of batch 1 finds no session, and one for batch 2
/// made with batch 1's key fails; batches out of order, opens of the other
/// role, outside the root or on behalf of another user are refused, each
/// in one line.
#[test]
fn stale_joins_and_misused_batches_are_refused() {
    let t = tmp();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    std::fs::create_dir_all(dst.join("m")).unwrap();
    files(&src, 6, 16 << 10, 7);
    let net = Net::default();
    let remote = daemon(&net, &dst);
    let root = Arc::new(Root::open(t.path(), Confinement::None).unwrap());
    let mut s = channel(&remote, b"m");
    let stats = Arc::new(Stats::default());
    let dest = b"m".to_vec();
    push_kept(
        &mut s,
        1,
        &remote,
        root,
        src_top(),
        dest,
        &opts(),
        &res(),
        stats,
    )
    .unwrap();
    // Batch 2 opened (its sink waits for the Propose that never comes).
    send_control(&mut *s.ctl, &Control::WatchBatch { batch: 2 }).unwrap();
    send_control(&mut *s.ctl, &sink_open(b"m")).unwrap();
    let sk = s.session_key;
    let join = |batch: u64, key_of: u64| {
        let (session, nonce) = (batch_session(&sk, batch), [5u8; 32]);
        let mac = join_mac(&batch_key(&sk, key_of), session, 0, &nonce);
        Control::Join {
            session,
            stream: 0,
            nonce,
            mac,
        }
    };
    for (batch, key_of) in [(1, 1), (2, 1)] {
        match join_as(&remote, &join(batch, key_of)) {
            Some(Control::Error { code, message }) => {
                assert_eq!(code, 1, "{message}");
            }
            None => {}
            Some(m) => panic!(
                "a Join of batch {batch} with batch {key_of}'s key: {}",
                m.name()
            ),
        }
    }
    send_control(
        &mut *s.ctl,
        &Control::Abort {
            reason: "test".into(),
        },
    )
    .unwrap();
    // Misuse on fresh channels, each refused with a one-line Error.
    let on_behalf = Control::OnBehalf {
        user: "root".into(),
    };
    let mut source_open = sink_open(b"m");
    if let Control::Open(o) = &mut source_open {
        o.server_role = Role::Source;
    }
    let cases: [(&str, Vec<Control>); 5] = [
        ("out of order", vec![Control::WatchBatch { batch: 2 }]),
        (
            "twice",
            vec![
                Control::WatchBatch { batch: 1 },
                Control::WatchBatch { batch: 1 },
            ],
        ),
        (
            "outside the root",
            vec![Control::WatchBatch { batch: 1 }, sink_open(b"../elsewhere")],
        ),
        (
            "source role",
            vec![Control::WatchBatch { batch: 1 }, source_open],
        ),
        (
            "on behalf",
            vec![Control::WatchBatch { batch: 1 }, on_behalf, sink_open(b"m")],
        ),
    ];
    for (what, msgs) in cases {
        let mut c = channel(&remote, b"m");
        for m in &msgs {
            send_control(&mut *c.ctl, m).unwrap();
        }
        c.ctl
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        match recv_control(&mut *c.ctl) {
            Ok(Control::Error { message, .. }) => {
                assert!(!message.contains('\n'), "{what}: {message}")
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    assert!(!dst.join("elsewhere").exists());
}
