//! Zero-copy sends (issue 17, storage::zerocopy): blocks of large files,
//! and packed blocks of files of 64 KiB and more mixed with copied ones:
//! the copy is identical on either send path, the count of blocks sent
//! from the page cache is in the stats, `--send-zerocopy off`,
//! RAMSYS_SENDFILE=0 and `--encrypt` keep every block in a buffer, and a
//! file overwritten in place during the push is never copied corrupt.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// A tree of small files plus large ones (>= 1 MiB: multi-block, and one
/// with a short last block).
fn tree(src: &Path) {
    make_varied_tree(src, 65536);
    std::fs::write(src.join("large"), Rng(3).bytes(9 << 20)).unwrap();
    std::fs::write(src.join("tail"), Rng(4).bytes((1 << 20) + 12345)).unwrap();
}

fn push(key: &Path, src: &Path, url: &str, extra: &[&str], env: Option<(&str, &str)>) -> u64 {
    let mut c = Command::new(bin());
    c.args(["cp", "-r", "--json", "--block-size", "1M", "--streams", "3"])
        .args(extra)
        .arg(src)
        .arg(url)
        .env("RAMSYS_KEY_FILE", key);
    if let Some((k, v)) = env {
        c.env(k, v);
    }
    let o = run_with_timeout(c, Duration::from_secs(120));
    assert_ok(&o);
    summary(&o)["zerocopy_blocks"].as_u64().unwrap()
}

/// Destination name, extra flags, environment, zero-copy expected.
type Case<'a> = (&'a str, &'a [&'a str], Option<(&'a str, &'a str)>, bool);

#[test]
fn large_files_go_zero_copy_unless_turned_off_or_sealed() {
    let TreeAndDaemon {
        t,
        key,
        src: _,
        root,
        d,
    } = tree_and_daemon(65536);
    let src = t.path().join("zsrc");
    tree(&src);
    let cases: [Case; 6] = [
        ("queued", &["--send-path", "queued"], None, true),
        (
            "inline",
            &["--send-path", "inline", "--readers", "3"],
            None,
            true,
        ),
        ("sync", &["--io-engine", "sync"], None, true),
        ("off", &["--send-zerocopy", "off"], None, false),
        ("env", &[], Some(("RAMSYS_SENDFILE", "0")), false),
        ("sealed", &["--encrypt=aes-256-gcm"], None, false),
    ];
    for (name, extra, env, want) in cases {
        let n = push(&key, &src, &d.url(name), extra, env);
        assert_same_tree(&src, &root.join(name));
        if want {
            // 9-10 blocks of `large` and 2-3 of `tail` (one more each
            // when it starts in a block of small files), and at most one
            // for each of the 4 small files of 64 KiB and more.
            assert!((11..=17).contains(&n), "{name}: {n} zero-copy blocks");
        } else {
            assert_eq!(n, 0, "{name}");
        }
    }
    assert!(temp_files(&root).is_empty());
}

/// Files of 64 KiB to 1 MiB interleaved with smaller ones: many share a
/// block, as zero-copy pieces between the copied bytes of the small files
/// (at most 16 pieces a block, the rest copied); the copy is identical on
/// both engines and both send paths, and with zero-copy off.
#[test]
fn packed_blocks_mix_zero_copy_pieces_with_copied_files() {
    let TreeAndDaemon {
        t,
        key,
        src: _,
        root,
        d,
    } = tree_and_daemon(65536);
    let src = t.path().join("psrc");
    std::fs::create_dir(&src).unwrap();
    let mut r = Rng(77);
    let mut mapped = 0;
    for i in 0..120u64 {
        // Every third file below 64 KiB (copied), the others 64 KiB to
        // 1 MiB (zero-copy pieces), in one queue.
        let n = if i % 3 == 0 {
            1 + (i * 997 % 60_000) as usize
        } else {
            mapped += 1;
            65536 + (i * 7919 % (960 << 10)) as usize
        };
        std::fs::write(src.join(format!("f{i:03}")), r.bytes(n)).unwrap();
    }
    let cases: [Case; 4] = [
        ("queued", &["--send-path", "queued"], None, true),
        (
            "inline",
            &["--send-path", "inline", "--readers", "3"],
            None,
            true,
        ),
        ("sync", &["--io-engine", "sync"], None, true),
        ("off", &["--send-zerocopy", "off"], None, false),
    ];
    for (name, extra, env, want) in cases {
        let n = push(&key, &src, &d.url(name), extra, env);
        assert_same_tree(&src, &root.join(name));
        if want {
            // 80 files of 64 KiB+ in 1 MiB blocks: several to a block
            // (at least 80 / 16 blocks), not one block each.
            assert!(
                n >= mapped / 16 && n < mapped,
                "{name}: {n} zero-copy blocks for {mapped} files"
            );
        } else {
            assert_eq!(n, 0, "{name}");
        }
    }
    assert!(temp_files(&root).is_empty());
}

/// The file is overwritten in place (same size, other bytes) at several
/// points of a paced push, including after its last block was hashed while
/// blocks still wait to be sent (the bytes leave from the page cache at
/// send time): the copy is one whole state of the file or the file is
/// reported failed, never a mix.
#[test]
fn a_file_overwritten_during_the_push_is_never_copied_corrupt() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = TestDaemon::start(&root, &key);
    let size = 24 << 20;
    let (a, b) = (Rng(11).bytes(size), Rng(12).bytes(size));
    let mut outcomes = Vec::new();
    for (i, delay_ms) in [300u64, 1200, 1700, 2000, 2200, 2400]
        .into_iter()
        .enumerate()
    {
        let src = t.path().join(format!("src{i}"));
        std::fs::create_dir(&src).unwrap();
        let p = src.join("big");
        std::fs::write(&p, &a).unwrap();
        let writer = {
            let (p, b) = (p.clone(), b.clone());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(delay_ms));
                let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
                f.write_all_at(&b, 0).unwrap();
            })
        };
        let mut c = Command::new(bin());
        c.args([
            "cp",
            "-r",
            "--json",
            "--block-size",
            "1M",
            "--streams",
            "2",
            "--bwlimit",
            "12M",
        ])
        .arg(&src)
        .arg(d.url(&format!("d{i}")))
        .env("RAMSYS_KEY_FILE", &key);
        let t0 = Instant::now();
        let o = run_with_timeout(c, Duration::from_secs(120));
        writer.join().unwrap();
        let s = summary(&o);
        let dst = root.join(format!("d{i}/big"));
        let got = std::fs::read(&dst).ok();
        let failed = !s["failed"].as_array().unwrap().is_empty();
        let whole = got.as_ref().is_some_and(|g| *g == a || *g == b);
        assert!(
            whole || (failed && got.is_none()),
            "delay {delay_ms} ms: the copy is neither state of the file and \
             the push reports {s}"
        );
        if failed {
            // Reported as what it is (the first read's stat, or the
            // re-read of a block whose bytes changed before they left).
            let why = s["failed"].to_string();
            assert!(why.contains("changed while being read"), "{why}");
        } else {
            assert!(o.status.success(), "{s}");
        }
        outcomes.push((
            delay_ms,
            s["failed"].clone(),
            s["resent"].clone(),
            t0.elapsed(),
        ));
    }
    eprintln!("outcomes (delay, failed, resent, took): {outcomes:?}");
    // A failed file leaves its resume journal, nothing else.
    let left: Vec<_> = temp_files(&root)
        .into_iter()
        .filter(|p| !p.to_string_lossy().contains("journal"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
