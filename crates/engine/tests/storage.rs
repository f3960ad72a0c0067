//! Storage engine tests (issue 4): both I/O engines, direct and buffered,
//! across sizes and alignments; sparse files; O_DIRECT refusal; injected
//! EIO; ENOSPC on a small tmpfs; null engines. Every transfer runs the
//! real path: an in-process daemon on loopback as the sink.

use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use ramsys_engine::data::resources::ResourceConfig;
use ramsys_engine::request::walk::Top;
use ramsys_engine::roles::client::{push, Remote};
use ramsys_engine::roles::server::Daemon;
use ramsys_engine::storage::fsops::{Confinement, Root};
use ramsys_engine::storage::{DataEngine, Hook, IoEngine, IoHook, IoOp, DIRECT_MIN};
use ramsys_engine::transport::tcp::Tcp;
mod common;
use common::files::{same_tree, tmp};
use common::rng::Rng;
use ramsys_engine::{EngineError, EngineResources, Report, Stats, TransferOptions};

use ramsys_engine::storage::cache::DirectMode;

const BS: usize = 256 << 10;

fn opts(engine: IoEngine, direct: bool) -> TransferOptions {
    TransferOptions {
        block_size: BS as u32,
        recursive: true,
        streams: 2,
        io_engine: engine,
        direct,
        // Tests of the direct path take it for every large file, cached
        // or not (auto would read these just-written files buffered).
        direct_mode: DirectMode::Always,
        ..Default::default()
    }
}

fn res(o: &TransferOptions) -> EngineResources {
    EngineResources::new(&ResourceConfig {
        memory: 24 * BS,
        buffer_size: BS,
        readers: o.readers,
        writers: o.writers,
        max_streams: 4,
        ..Default::default()
    })
    .unwrap()
}

/// Copy `src` (a directory or file) into directory `dst` through a daemon
/// whose sink uses `sink_opts`.
fn copy(
    src: &Path,
    dst: &Path,
    o: &TransferOptions,
    sink_opts: &TransferOptions,
) -> Result<Report, EngineError> {
    let key = vec![7u8; 32];
    let d = Daemon::bind(
        "127.0.0.1:0",
        dst,
        key.clone(),
        sink_opts.clone(),
        res(sink_opts),
    )
    .unwrap();
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
    push(
        &remote,
        root,
        tops,
        Vec::new(),
        o,
        &res(o),
        Arc::new(Stats::default()),
    )
}

fn leftovers(dir: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                v.extend(leftovers(&p));
            } else if p.to_string_lossy().contains(".part") {
                v.push(p);
            }
        }
    }
    v
}

fn sizes_tree(dir: &Path) {
    let mut r = Rng::new(0x1234_5678);
    std::fs::create_dir_all(dir.join("small")).unwrap();
    let big = DIRECT_MIN as usize;
    for s in [
        0,
        1,
        4095,
        4096,
        4097,
        BS - 1,
        BS,
        BS + 1,
        3 * BS + 17,
        big - 1,
        big,
        big + 4097,
        2 * big + 5,
    ] {
        std::fs::write(dir.join(format!("f{s}")), r.bytes(s)).unwrap();
    }
    for i in 0..300 {
        std::fs::write(dir.join(format!("small/s{i}")), r.bytes((i * 37) % 9000)).unwrap();
    }
}

#[test]
fn both_engines_identical_across_sizes_direct_and_buffered() {
    let t = tmp();
    let src = t.path().join("src");
    sizes_tree(&src);
    for engine in [IoEngine::Sync, IoEngine::Uring] {
        for direct in [true, false] {
            let dst = t.path().join(format!("dst-{engine:?}-{direct}"));
            std::fs::create_dir(&dst).unwrap();
            let o = opts(engine, direct);
            let rep = copy(&src, &dst, &o, &o).unwrap();
            assert!(
                rep.failed.is_empty(),
                "{engine:?} direct={direct}: {:?}",
                rep.failed
            );
            assert_eq!(rep.files, 313);
            same_tree(&src, &dst.join("src"));
        }
    }
}

#[test]
fn mixed_engines_source_uring_sink_sync_and_back() {
    let t = tmp();
    let src = t.path().join("src");
    sizes_tree(&src);
    for (a, b) in [
        (IoEngine::Uring, IoEngine::Sync),
        (IoEngine::Sync, IoEngine::Uring),
    ] {
        let dst = t.path().join(format!("dst-{a:?}"));
        std::fs::create_dir(&dst).unwrap();
        let rep = copy(&src, &dst, &opts(a, true), &opts(b, true)).unwrap();
        assert!(rep.failed.is_empty(), "{:?}", rep.failed);
        same_tree(&src, &dst.join("src"));
    }
}

#[test]
fn sparse_files_stay_sparse_with_the_right_size() {
    let t = tmp();
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let mut r = Rng::new(5);
    // Data, hole, data, trailing hole; and a file that is all hole.
    let f = std::fs::File::create(src.join("holes")).unwrap();
    f.set_len(40 << 20).unwrap();
    f.write_at(&r.bytes(5000), 0).unwrap();
    f.write_at(&r.bytes(BS + 3), 17 << 20).unwrap();
    drop(f);
    std::fs::File::create(src.join("empty-hole"))
        .unwrap()
        .set_len(9 << 20)
        .unwrap();
    for engine in [IoEngine::Sync, IoEngine::Uring] {
        let dst = t.path().join(format!("dst-{engine:?}"));
        std::fs::create_dir(&dst).unwrap();
        let o = opts(engine, true);
        let rep = copy(&src, &dst, &o, &o).unwrap();
        assert!(rep.failed.is_empty(), "{:?}", rep.failed);
        same_tree(&src, &dst.join("src"));
        let md = std::fs::metadata(dst.join("src/holes")).unwrap();
        assert_eq!(md.len(), 40 << 20);
        assert!(
            md.blocks() * 512 < 2 << 20,
            "holes were written: {} blocks",
            md.blocks()
        );
        let md = std::fs::metadata(dst.join("src/empty-hole")).unwrap();
        assert_eq!((md.len(), md.blocks()), (9 << 20, 0));
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

#[test]
fn refused_o_direct_falls_back_to_buffered() {
    let t = tmp();
    let src = t.path().join("src");
    sizes_tree(&src);
    for engine in [IoEngine::Sync, IoEngine::Uring] {
        let dst = t.path().join(format!("dst-{engine:?}"));
        std::fs::create_dir(&dst).unwrap();
        // EINVAL on every O_DIRECT open, both ends: what a file system
        // without direct I/O answers.
        let o = TransferOptions {
            io_hook: hook(IoOp::OpenDirect, "", libc::EINVAL),
            ..opts(engine, true)
        };
        let rep = copy(&src, &dst, &o, &o).unwrap();
        assert!(rep.failed.is_empty(), "{:?}", rep.failed);
        same_tree(&src, &dst.join("src"));
    }
}

/// A small tmpfs mounted for the test (root only; skipped otherwise).
struct SmallFs(tempfile::TempDir);
impl SmallFs {
    fn mount(size: &str) -> Option<SmallFs> {
        let dir = tempfile::tempdir().ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("skipping: cannot mount tmpfs (not root?)");
            return None;
        }
        Some(SmallFs(dir))
    }
}
impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

#[test]
fn tmpfs_source_and_sink_work_with_direct_on() {
    // Older kernels refuse O_DIRECT on tmpfs (EINVAL, the fallback path);
    // since Linux 6.6 tmpfs accepts it. Either way the copy must be exact.
    let Some(fs) = SmallFs::mount("64m") else {
        return;
    };
    let src = fs.0.path().join("src");
    sizes_tree(&src);
    let dst = fs.0.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    for engine in [IoEngine::Sync, IoEngine::Uring] {
        let d = dst.join(format!("{engine:?}"));
        std::fs::create_dir(&d).unwrap();
        let o = opts(engine, true);
        let rep = copy(&src, &d, &o, &o).unwrap();
        assert!(rep.failed.is_empty(), "{:?}", rep.failed);
        same_tree(&src, &d.join("src"));
    }
}

#[test]
fn injected_read_eio_fails_only_that_file() {
    let t = tmp();
    let src = t.path().join("src");
    sizes_tree(&src);
    let mut r = Rng::new(3);
    std::fs::write(src.join("bad-big"), r.bytes(3 * DIRECT_MIN as usize)).unwrap();
    std::fs::write(src.join("small/bad-small"), r.bytes(100)).unwrap();
    for engine in [IoEngine::Sync, IoEngine::Uring] {
        let dst = t.path().join(format!("dst-{engine:?}"));
        std::fs::create_dir(&dst).unwrap();
        let o = TransferOptions {
            io_hook: hook(IoOp::Read, "bad-", libc::EIO),
            ..opts(engine, true)
        };
        let rep = copy(&src, &dst, &o, &opts(engine, true)).unwrap();
        let mut failed: Vec<_> = rep.failed.iter().map(|f| f.path.clone()).collect();
        failed.sort();
        assert_eq!(failed.len(), 2, "{:?}", rep.failed);
        assert!(
            failed[0].ends_with("src/bad-big") && failed[1].ends_with("bad-small"),
            "{failed:?}"
        );
        assert!(
            rep.failed
                .iter()
                .all(|f| f.reason.contains("Input/output error")),
            "{:?}",
            rep.failed
        );
        assert_eq!(rep.files, 313);
        assert!(!dst.join("src/bad-big").exists() && !dst.join("src/small/bad-small").exists());
        assert!(dst.join("src/f1048576").exists());
        assert!(leftovers(&dst).is_empty(), "{:?}", leftovers(&dst));
    }
}

#[test]
fn injected_write_eio_fails_only_that_file() {
    let t = tmp();
    let src = t.path().join("src");
    sizes_tree(&src);
    for engine in [IoEngine::Sync, IoEngine::Uring] {
        let dst = t.path().join(format!("dst-{engine:?}"));
        std::fs::create_dir(&dst).unwrap();
        let sink = TransferOptions {
            io_hook: hook(IoOp::Write, "f1052673", libc::EIO),
            ..opts(engine, true)
        };
        let rep = copy(&src, &dst, &opts(engine, true), &sink).unwrap();
        assert_eq!(rep.failed.len(), 1, "{:?}", rep.failed);
        assert!(
            rep.failed[0].path.ends_with("f1052673")
                && rep.failed[0].reason.contains("write error")
        );
        assert_eq!(rep.files, 312);
        assert!(leftovers(&dst).is_empty());
    }
}

#[test]
fn enospc_on_small_tmpfs_stops_cleanly() {
    let Some(fs) = SmallFs::mount("2m") else {
        return;
    };
    let t = tmp();
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let mut r = Rng::new(11);
    std::fs::write(src.join("big"), r.bytes(6 << 20)).unwrap();
    for engine in [IoEngine::Sync, IoEngine::Uring] {
        let dst = fs.0.path().join(format!("{engine:?}"));
        std::fs::create_dir(&dst).unwrap();
        let o = opts(engine, true);
        let e = copy(&src, &dst, &o, &o).unwrap_err().to_string();
        // The sink stops with "sink disk full"; the source reports that,
        // or the broken data link if it notices that first (a race in the
        // source's error reporting, not in storage).
        assert!(
            e.contains("disk full") || e.contains("data stream"),
            "{engine:?}: {e}"
        );
        assert!(!dst.join("src/big").exists());
        // The sink removes its temp files as the session ends.
        let t0 = std::time::Instant::now();
        while !leftovers(&dst).is_empty() && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(leftovers(&dst).is_empty(), "{:?}", leftovers(&dst));
    }
}

#[test]
fn null_engines_move_bytes_without_storage() {
    let t = tmp();
    let dst = t.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    // Null source, synthetic 10 MB file, null sink: nothing read or written.
    let o = TransferOptions {
        source_engine: DataEngine::Null,
        sink_engine: DataEngine::Null,
        null_size: 10_000_000,
        ..opts(IoEngine::Sync, true)
    };
    let rep = copy(&t.path().join("nothing"), &dst, &o, &o).unwrap();
    assert!(rep.failed.is_empty(), "{:?}", rep.failed);
    assert_eq!((rep.files, rep.bytes), (1, 10_000_000));
    assert_eq!(std::fs::read_dir(&dst).unwrap().count(), 0);
    // Real source, null sink (checksums still verified): nothing created.
    let src = t.path().join("src");
    sizes_tree(&src);
    let sink = TransferOptions {
        sink_engine: DataEngine::Null,
        ..opts(IoEngine::Uring, true)
    };
    let rep = copy(&src, &dst, &opts(IoEngine::Uring, true), &sink).unwrap();
    assert!(rep.failed.is_empty(), "{:?}", rep.failed);
    assert_eq!(rep.files, 313);
    assert!(!dst.join("src/f1").exists());
}

/// Issue 17: under --direct auto the source reads a file the page cache
/// holds through the cache, and one it does not hold with O_DIRECT;
/// --direct always bypasses the cache either way. The report says which.
#[test]
fn auto_reads_cached_files_through_the_cache_and_cold_ones_direct() {
    use std::os::fd::AsRawFd;
    let t = tmp();
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let size = 8u64 << 20;
    let f = src.join("big");
    std::fs::write(&f, Rng::new(5).bytes(size as usize)).unwrap();
    let drop_cache = || {
        let h = std::fs::File::open(&f).unwrap();
        h.sync_all().unwrap();
        // SAFETY: valid descriptor.
        unsafe { libc::posix_fadvise(h.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    };
    let run = |name: &str, mode: DirectMode| {
        let dst = t.path().join(name);
        std::fs::create_dir(&dst).unwrap();
        let o = TransferOptions {
            direct_mode: mode,
            ..opts(IoEngine::Sync, true)
        };
        let rep = copy(&src, &dst, &o, &o).unwrap();
        assert!(rep.failed.is_empty(), "{:?}", rep.failed);
        same_tree(&src, &dst.join("src"));
        let u = rep.storage.expect("a file source reports its reads");
        assert_eq!(u.side, "read");
        (u.direct_bytes, u.cached_bytes)
    };
    // Just written: resident.
    assert_eq!(run("warm-auto", DirectMode::Auto), (0, size));
    assert_eq!(run("warm-always", DirectMode::Always), (size, 0));
    drop_cache();
    assert_eq!(run("cold-auto", DirectMode::Auto), (size, 0));
}

/// Local copies (storage::local, issue 17): the sink copies large files
/// from the source in the kernel; the same tree arrives, a write error
/// fails only its file, and a full disk stops the session with nothing
/// left under a final name, on both writer engines.
#[test]
fn local_copies_keep_every_promise_of_the_byte_path() {
    use ramsys_engine::storage::local::LocalBridge;
    let t = tmp();
    let src = t.path().join("src");
    sizes_tree(&src);
    let local = |o: TransferOptions| TransferOptions {
        local_copy: Some(Arc::new(LocalBridge::default())),
        ..o
    };
    for engine in [IoEngine::Sync, IoEngine::Uring] {
        // One bridge shared by both ends, as `ramsys cp` does.
        let o = local(opts(engine, true));
        let dst = t.path().join(format!("ok-{engine:?}"));
        std::fs::create_dir(&dst).unwrap();
        let rep = copy(&src, &dst, &o, &o).unwrap();
        assert!(rep.failed.is_empty(), "{:?}", rep.failed);
        assert_eq!(rep.files, 313);
        same_tree(&src, &dst.join("src"));
        let u = rep.storage.unwrap();
        assert!(u.copied_bytes >= 1 << 20, "{u:?}");

        let o = local(opts(engine, true));
        let sink = TransferOptions {
            io_hook: hook(IoOp::Write, "f1052673", libc::EIO),
            ..o.clone()
        };
        let dst = t.path().join(format!("eio-{engine:?}"));
        std::fs::create_dir(&dst).unwrap();
        let rep = copy(&src, &dst, &o, &sink).unwrap();
        assert_eq!(rep.failed.len(), 1, "{:?}", rep.failed);
        assert!(rep.failed[0].path.ends_with("f1052673"));
        assert_eq!(rep.files, 312);
        assert!(leftovers(&dst).is_empty());
    }
    let Some(fs) = SmallFs::mount("2m") else {
        return;
    };
    let big = t.path().join("big");
    std::fs::create_dir(&big).unwrap();
    std::fs::write(big.join("big"), Rng::new(12).bytes(6 << 20)).unwrap();
    for engine in [IoEngine::Sync, IoEngine::Uring] {
        let o = local(opts(engine, true));
        let dst = fs.0.path().join(format!("{engine:?}"));
        std::fs::create_dir(&dst).unwrap();
        let e = copy(&big, &dst, &o, &o).unwrap_err().to_string();
        assert!(
            e.contains("disk full") || e.contains("data stream"),
            "{engine:?}: {e}"
        );
        assert!(!dst.join("big/big").exists());
    }
}

/// Issue 17: the sink writes small files nameless (O_TMPFILE) and links
/// them into place; where the file system refuses O_TMPFILE (injected
/// EOPNOTSUPP on the sink) it names and renames temp files instead. Both
/// give the same tree and leave no temp file.
#[test]
fn small_files_with_and_without_o_tmpfile() {
    // Nameless temp files are the default (RAMSYS_TMPFILE=0 turns them
    // off, read once per process); the injected refusal below runs the
    // named fallback.
    let t = tmp();
    let src = t.path().join("src");
    sizes_tree(&src);
    for refuse in [false, true] {
        let dst = t.path().join(format!("dst-{refuse}"));
        std::fs::create_dir(&dst).unwrap();
        let o = opts(IoEngine::Uring, true);
        let sink = TransferOptions {
            io_hook: if refuse {
                hook(IoOp::TmpFile, "", libc::EOPNOTSUPP)
            } else {
                Hook::default()
            },
            ..o.clone()
        };
        let rep = copy(&src, &dst, &o, &sink).unwrap();
        assert!(rep.failed.is_empty(), "{:?}", rep.failed);
        same_tree(&src, &dst.join("src"));
        fn temps(d: &Path, out: &mut Vec<PathBuf>) {
            for e in std::fs::read_dir(d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    temps(&p, out);
                } else if p.to_string_lossy().contains(".ramsys-") {
                    out.push(p);
                }
            }
        }
        let mut left = Vec::new();
        temps(&dst, &mut left);
        assert!(left.is_empty(), "{left:?}");
    }
}
