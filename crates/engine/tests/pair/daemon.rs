//! The agent's side (client.rs: connect, authenticate, Open) against a
//! daemon (server.rs: the same dispatch as for TCP connections) in
//! memory: the handshake, the request and the metadata in one flight.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ramsys_engine::data::resources::ResourceConfig;
use ramsys_engine::request::walk::Top;
use ramsys_engine::roles::client::{pull, push, Remote};
use ramsys_engine::roles::server::Daemon;
use ramsys_engine::storage::fsops::{Confinement, Root};
use ramsys_engine::transport::mem::Net;
use ramsys_engine::{EngineResources, Stats, TransferOptions};

use crate::common::tree::{files, same_tree, tmp};

const KEY: [u8; 32] = [3; 32];

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

/// A daemon serving `root`, reached at "daemon" on `net` (its TCP
/// listener, on a loopback port, sees no traffic).
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

/// Hello, then the daemon's Challenge; then Auth, Open, Propose and every
/// record in one flight, answered by AuthOk and Confirm.
#[test]
fn a_push_sends_auth_request_and_metadata_in_one_flight() {
    let t = tmp();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    files(&src, 50, 16 << 10, 20);
    std::fs::create_dir(&dst).unwrap();
    let net = Net::default();
    let remote = daemon(&net, &dst);
    let root = Arc::new(Root::open(t.path(), Confinement::None).unwrap());
    let tops = vec![Top {
        rel: b"src".to_vec(),
        name: b"src".to_vec(),
    }];
    let stats = Arc::new(Stats::default());
    let r = push(&remote, root, tops, Vec::new(), &opts(), &res(), stats);
    r.unwrap_or_else(|e| panic!("{e}"));
    same_tree(&src, &dst.join("src"));
    let ctl: Vec<_> = net
        .transcript()
        .into_iter()
        .filter(|r| r.link == "ctl" && r.control.is_some())
        .collect();
    let depth = |name: &str| ctl.iter().find(|r| r.name() == name).unwrap().depth;
    assert_eq!(depth("Hello"), 1);
    assert_eq!(depth("Challenge"), 2);
    for name in ["Auth", "Open", "Propose", "Entries", "MetaEnd"] {
        assert_eq!(depth(name), 3, "{name} waited for more than the Challenge");
    }
    for name in ["AuthOk", "Confirm", "SyncDone"] {
        assert_eq!(depth(name), 4, "{name}");
    }
}

#[test]
fn a_pull_through_the_same_dispatch() {
    let t = tmp();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    files(&src, 50, 16 << 10, 21);
    std::fs::create_dir(&dst).unwrap();
    let net = Net::default();
    let remote = daemon(&net, t.path());
    let root = Arc::new(Root::open(&dst, Confinement::None).unwrap());
    let stats = Arc::new(Stats::default());
    let r = pull(
        &remote,
        vec![b"src".to_vec()],
        root,
        Vec::new(),
        &opts(),
        &res(),
        stats,
    );
    assert_eq!(r.unwrap_or_else(|e| panic!("{e}")).streams, 2);
    same_tree(&src, &dst.join("src"));
}
