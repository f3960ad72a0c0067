//! Send paths (seed 002 sec. 7; crate::data::inline): every transfer shape
//! comes out identical whether readers hand blocks to sender threads
//! (queued) or send them themselves (inline), and inline really bypasses
//! the queue. Each transfer is a real push into an in-process daemon on
//! loopback.

use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ramsys_engine::data::resources::ResourceConfig;
use ramsys_engine::request::walk::Top;
use ramsys_engine::roles::client::{push, Remote};
use ramsys_engine::roles::server::Daemon;
use ramsys_engine::storage::fsops::{Confinement, Root};
use ramsys_engine::storage::{Hook, IoEngine, IoHook, IoOp, DIRECT_MIN};
use ramsys_engine::transport::crypto::Cipher;
use ramsys_engine::transport::tcp::Tcp;
use ramsys_engine::types::sendpath::SendPath;
mod common;
use common::files::{same_tree, tmp};
use common::rng::Rng;
use ramsys_engine::{EngineError, EngineResources, Report, Stats, TransferOptions};

const BS: usize = 256 << 10;
const PATHS: [SendPath; 2] = [SendPath::Queued, SendPath::Inline];

fn opts(path: SendPath, engine: IoEngine) -> TransferOptions {
    TransferOptions {
        block_size: BS as u32,
        recursive: true,
        streams: 4,
        readers: 4,
        io_engine: engine,
        send_path: path,
        ..Default::default()
    }
}

fn res(o: &TransferOptions) -> EngineResources {
    EngineResources::new(&ResourceConfig {
        memory: 32 * BS,
        buffer_size: BS,
        readers: o.readers,
        writers: o.writers,
        max_streams: 4,
        ..Default::default()
    })
    .unwrap()
}

/// Push `src` into directory `dst` through a daemon with `sink` options;
/// the source end's report and counters.
fn copy(
    src: &Path,
    dst: &Path,
    o: &TransferOptions,
    sink: &TransferOptions,
) -> (Result<Report, EngineError>, Arc<Stats>) {
    let key = vec![9u8; 32];
    let d = Daemon::bind("127.0.0.1:0", dst, key.clone(), sink.clone(), res(sink)).unwrap();
    let addr = d.local_addr().to_string();
    d.spawn();
    let remote = Remote {
        transport: Arc::new(Tcp {
            socket_buffer: None,
        }),
        addr,
        key,
        connect_timeout: Duration::from_secs(10),
        user: None,
    };
    let root = Arc::new(Root::open(src.parent().unwrap(), Confinement::None).unwrap());
    let name = src.file_name().unwrap().as_encoded_bytes().to_vec();
    let tops = vec![Top {
        rel: name.clone(),
        name,
    }];
    let stats = Arc::new(Stats::default());
    let res = res(o);
    let r = push(&remote, root, tops, Vec::new(), o, &res, stats.clone());
    // Whatever the outcome, the session gave its buffer share back.
    assert_eq!(res.buffers.free(), res.buffers.count(), "buffers leaked");
    (r, stats)
}

/// Every shape of the transfer tests in one tree: zero-length files,
/// sizes around the block and O_DIRECT boundaries, many small files packed
/// into shared blocks, a file striped over all streams, a sparse file and
/// an all-hole file.
fn shapes_tree(dir: &Path) -> u64 {
    let mut r = Rng::new(0xfeed);
    std::fs::create_dir_all(dir.join("small/deeper")).unwrap();
    let big = DIRECT_MIN as usize;
    let mut n = 0;
    for s in [0, 1, 4095, 4097, BS - 1, BS, BS + 1, big + 4097] {
        std::fs::write(dir.join(format!("f{s}")), r.bytes(s)).unwrap();
        n += 1;
    }
    for i in 0..200 {
        let d = if i % 2 == 0 { "small" } else { "small/deeper" };
        std::fs::write(dir.join(format!("{d}/s{i}")), r.bytes((i * 53) % 7000)).unwrap();
        n += 1;
    }
    // Striped: 48 blocks over 4 streams.
    std::fs::write(dir.join("striped"), r.bytes(12 << 20)).unwrap();
    let f = std::fs::File::create(dir.join("holes")).unwrap();
    f.set_len(24 << 20).unwrap();
    f.write_at(&r.bytes(5000), 0).unwrap();
    f.write_at(&r.bytes(BS + 3), 9 << 20).unwrap();
    drop(f);
    std::fs::File::create(dir.join("all-hole"))
        .unwrap()
        .set_len(5 << 20)
        .unwrap();
    n + 3
}

/// What the path taken leaves in the counters: inline sends every block
/// from the reader that filled it (no queue hand-off at all), queued hands
/// every block through the queue.
fn check_path(path: SendPath, rep: &Report, stats: &Stats) {
    let blocks = stats.blocks.load(Ordering::Relaxed);
    let handoffs = stats.handoffs.load(Ordering::Relaxed);
    assert!(blocks > 0);
    assert_eq!(rep.send_path, Some(path));
    assert_eq!(rep.handoffs, handoffs);
    match path {
        SendPath::Inline => assert_eq!(handoffs, 0, "inline used the queue"),
        _ => assert_eq!(handoffs, blocks, "queued: every block through the queue"),
    }
}

#[test]
fn every_shape_identical_on_both_paths_and_engines() {
    let t = tmp();
    let src = t.path().join("src");
    let files = shapes_tree(&src);
    for path in PATHS {
        for engine in [IoEngine::Sync, IoEngine::Uring] {
            let dst = t.path().join(format!("dst-{path:?}-{engine:?}"));
            std::fs::create_dir(&dst).unwrap();
            let o = opts(path, engine);
            let (rep, stats) = copy(&src, &dst, &o, &o);
            let rep = rep.unwrap();
            assert!(rep.failed.is_empty(), "{path:?}: {:?}", rep.failed);
            assert_eq!(rep.files, files);
            assert_eq!(rep.streams, 4);
            same_tree(&src, &dst.join("src"));
            check_path(path, &rep, &stats);
            let md = std::fs::metadata(dst.join("src/holes")).unwrap();
            assert_eq!(md.len(), 24 << 20);
            assert!(md.blocks() * 512 < 2 << 20, "{path:?}: holes written");
            let md = std::fs::metadata(dst.join("src/all-hole")).unwrap();
            assert_eq!((md.len(), md.blocks()), (5 << 20, 0));
        }
    }
}

#[test]
fn encrypted_blocks_are_sealed_once_on_either_path() {
    let t = tmp();
    let src = t.path().join("src");
    let files = shapes_tree(&src);
    for path in PATHS {
        for cipher in [Cipher::ChaCha20Poly1305, Cipher::Aes256Gcm] {
            let dst = t.path().join(format!("dst-{path:?}-{}", cipher.name()));
            std::fs::create_dir(&dst).unwrap();
            let o = TransferOptions {
                encrypt: cipher,
                ..opts(path, IoEngine::Uring)
            };
            let (rep, stats) = copy(&src, &dst, &o, &o);
            let rep = rep.unwrap();
            assert!(rep.failed.is_empty(), "{:?}", rep.failed);
            assert_eq!(rep.files, files);
            same_tree(&src, &dst.join("src"));
            check_path(path, &rep, &stats);
            // The sink opened every block: none failed authentication.
            assert_eq!(stats.auth_failures.load(Ordering::Relaxed), 0);
        }
    }
}

/// More readers than links: inline readers take turns on the one link
/// (waiting while it is busy) and the copy is still whole; one reader
/// spreads its blocks over three links; auto picks inline only where
/// readers match streams.
#[test]
fn readers_share_links_inline_and_auto_follows_the_counts() {
    let t = tmp();
    let src = t.path().join("src");
    let files = shapes_tree(&src);
    for (path, readers, streams, want) in [
        (SendPath::Inline, 4, 1, SendPath::Inline),
        (SendPath::Auto, 4, 1, SendPath::Queued),
        (SendPath::Auto, 2, 3, SendPath::Queued),
        (SendPath::Inline, 1, 3, SendPath::Inline),
        (SendPath::Auto, 3, 3, SendPath::Inline),
    ] {
        let dst = t.path().join(format!("dst-{path:?}-{readers}-{streams}"));
        std::fs::create_dir(&dst).unwrap();
        let o = TransferOptions {
            readers,
            streams,
            ..opts(path, IoEngine::Uring)
        };
        let (rep, stats) = copy(&src, &dst, &o, &opts(SendPath::Queued, IoEngine::Uring));
        let rep = rep.unwrap();
        assert!(rep.failed.is_empty(), "{:?}", rep.failed);
        assert_eq!((rep.files, rep.streams), (files, streams));
        same_tree(&src, &dst.join("src"));
        check_path(want, &rep, &stats);
    }
}

/// Fails one kind of operation on paths containing `needle`.
struct FailOn {
    op: IoOp,
    needle: &'static str,
    errno: i32,
}

impl IoHook for FailOn {
    fn check(&self, op: IoOp, path: &[u8], _off: u64, _len: usize) -> io::Result<()> {
        if op == self.op && String::from_utf8_lossy(path).contains(self.needle) {
            return Err(io::Error::from_raw_os_error(self.errno));
        }
        Ok(())
    }
}

fn hook(op: IoOp, needle: &'static str, errno: i32) -> Hook {
    Hook(Some(Arc::new(FailOn { op, needle, errno })))
}

/// A read error fails its file alone on the inline path too: the reader
/// that hit it keeps sending the other files' blocks.
#[test]
fn inline_read_error_fails_only_that_file() {
    let t = tmp();
    let src = t.path().join("src");
    let files = shapes_tree(&src);
    std::fs::write(src.join("bad-big"), Rng::new(3).bytes(3 * BS + 5)).unwrap();
    std::fs::write(src.join("small/bad-small"), b"x").unwrap();
    for engine in [IoEngine::Sync, IoEngine::Uring] {
        let dst = t.path().join(format!("dst-{engine:?}"));
        std::fs::create_dir(&dst).unwrap();
        let o = TransferOptions {
            io_hook: hook(IoOp::Read, "bad-", libc::EIO),
            ..opts(SendPath::Inline, engine)
        };
        let (rep, stats) = copy(&src, &dst, &o, &opts(SendPath::Queued, engine));
        let rep = rep.unwrap();
        assert_eq!(rep.failed.len(), 2, "{:?}", rep.failed);
        assert_eq!(rep.files, files);
        assert!(!dst.join("src/bad-big").exists());
        assert_eq!(
            std::fs::read(dst.join("src/striped")).unwrap(),
            std::fs::read(src.join("striped")).unwrap()
        );
        check_path(SendPath::Inline, &rep, &stats);
    }
}

/// A fatal sink error mid-transfer (disk full) aborts the session: the
/// inline readers blocked on credits or links wake up, the push returns
/// one error, and nothing hangs.
#[test]
fn inline_session_aborts_cleanly_on_a_fatal_sink_error() {
    let t = tmp();
    let src = t.path().join("src");
    shapes_tree(&src);
    let dst = t.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let sink = TransferOptions {
        io_hook: hook(IoOp::Write, "striped", libc::ENOSPC),
        ..opts(SendPath::Queued, IoEngine::Sync)
    };
    let o = opts(SendPath::Inline, IoEngine::Sync);
    let (r, _) = copy(&src, &dst, &o, &sink);
    let e = r.unwrap_err().to_string();
    assert!(e.contains("disk full") || e.contains("data stream"), "{e}");
    assert!(!dst.join("src/striped").exists());
}
