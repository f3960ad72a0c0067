//! Volumes (issue 18; docs/STORAGE.md "Volumes"): block devices as SRC and
//! DST of `cp` and `sync`, on loop devices. Image -> device -> image
//! locally, device -> device through a daemon (push and pull), a sync after
//! changing 1 % of the blocks moves about 1 % of the bytes, a device DST is
//! refused without --write-devices or when too small (and left untouched),
//! and a transfer into a device killed midway completes with --resume.
//!
//! Needs root and loop devices: skipped with a printed reason where
//! /dev/loop-control is absent or losetup fails.

mod common;

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::loopdev::Loop;
use common::*;

/// An image of `size` bytes: random data in every third MiB, the rest holes.
fn sparse_image(p: &Path, size: u64, seed: u64) -> Vec<u8> {
    let f = std::fs::File::create(p).unwrap();
    f.set_len(size).unwrap();
    let mut rng = Rng(seed);
    let mut all = vec![0u8; size as usize];
    let mut off = 0;
    while off < size {
        let d = rng.bytes(200_000);
        std::os::unix::fs::FileExt::write_all_at(&f, &d, off).unwrap();
        all[off as usize..off as usize + d.len()].copy_from_slice(&d);
        off += 3 << 20;
    }
    all
}

fn dense_image(p: &Path, size: usize, seed: u64) -> Vec<u8> {
    let d = Rng(seed).bytes(size);
    std::fs::write(p, &d).unwrap();
    d
}

fn blank_image(p: &Path, size: u64, fill: u8) {
    std::fs::write(p, vec![fill; size as usize]).unwrap();
}

/// Image -> device -> image, locally: byte for byte; the device read back
/// keeps its zero runs as holes in the new image.
#[test]
fn image_to_device_and_device_to_image() {
    let t = tempfile::tempdir_in("/var/tmp").unwrap();
    let key = key_file(t.path());
    let size = 24u64 << 20;
    let src = t.path().join("src.img");
    let want = sparse_image(&src, size, 3);
    let dimg = t.path().join("dev.img");
    blank_image(&dimg, size + (1 << 20), 0xEE);
    let Some(dev) = Loop::attach(&dimg) else {
        return;
    };
    let o = ramsys(
        &key,
        &[
            "cp",
            "--write-devices",
            "--json",
            src.to_str().unwrap(),
            dev.path(),
        ],
    );
    assert_ok(&o);
    let got = dev.read();
    assert_eq!(got.len() as u64, size + (1 << 20), "never truncated");
    assert!(got[..size as usize] == want[..], "device holds the image");
    assert!(
        got[size as usize..].iter().all(|&b| b == 0xEE),
        "bytes past the source are untouched"
    );
    assert!(
        std::fs::metadata(dev.path())
            .unwrap()
            .file_type()
            .is_block_device(),
        "the device node is still a device"
    );

    let back = t.path().join("back.img");
    let o = ramsys(&key, &["cp", "--json", dev.path(), back.to_str().unwrap()]);
    assert_ok(&o);
    let b = std::fs::read(&back).unwrap();
    assert_eq!(b.len() as u64, size + (1 << 20), "the device's size");
    assert!(b[..size as usize] == want[..]);
    let md = std::fs::metadata(&back).unwrap();
    assert!(
        md.blocks() * 512 < size / 2,
        "zero runs travel as holes: {} bytes allocated of {}",
        md.blocks() * 512,
        md.len()
    );
}

/// A device that does not read back what was written (a byte flipped
/// behind the sink's back, RAMSYS_FAULT_VOLUME_CORRUPT) fails the run: one
/// line naming the verification, non-zero exit.
#[test]
fn verification_after_writing_catches_a_lost_write() {
    let t = tempfile::tempdir_in("/var/tmp").unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src.img");
    dense_image(&src, 8 << 20, 17);
    let dimg = t.path().join("dev.img");
    blank_image(&dimg, 8 << 20, 0);
    let Some(dev) = Loop::attach(&dimg) else {
        return;
    };
    let mut c = Command::new(bin());
    c.args([
        "cp",
        "--write-devices",
        "--json",
        src.to_str().unwrap(),
        dev.path(),
    ])
    .env("RAMSYS_KEY_FILE", &key)
    .env("RAMSYS_FAULT_VOLUME_CORRUPT", "5000");
    let o = run_with_timeout(c, Duration::from_secs(120));
    assert!(!o.status.success(), "a lost write must fail the run");
    let s = summary(&o);
    assert_eq!(s["ok"], false, "{s}");
    assert!(
        s["failed"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("verification after writing"),
        "{s}"
    );

    // The same through a daemon (data segments, not local copies).
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    dev.node_in(&root, "vol");
    let (mut d, addr) = daemon_env(&root, &key, &[("RAMSYS_FAULT_VOLUME_CORRUPT", "5000")]);
    let url = format!("ramsys://{addr}/vol");
    let o = ramsys(
        &key,
        &[
            "cp",
            "--write-devices",
            "--json",
            src.to_str().unwrap(),
            &url,
        ],
    );
    let _ = d.kill();
    let _ = d.wait();
    assert!(!o.status.success(), "a lost write must fail the run");
    let s = summary(&o);
    assert!(
        s["failed"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("verification after writing failed"),
        "{s}"
    );
}

/// Without --write-devices, or into a smaller device: one line, non-zero
/// exit, the device untouched.
#[test]
fn device_destination_refused_without_flag_or_when_too_small() {
    let t = tempfile::tempdir_in("/var/tmp").unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src.img");
    dense_image(&src, 8 << 20, 5);
    let dimg = t.path().join("dev.img");
    blank_image(&dimg, 8 << 20, 0x5A);
    let small = t.path().join("small.img");
    blank_image(&small, 4 << 20, 0x5A);
    let Some(dev) = Loop::attach(&dimg) else {
        return;
    };
    let Some(sdev) = Loop::attach(&small) else {
        return;
    };
    for (args, why) in [
        (
            vec!["cp", src.to_str().unwrap(), dev.path()],
            "--write-devices",
        ),
        (
            vec!["sync", src.to_str().unwrap(), dev.path()],
            "--write-devices",
        ),
        (
            vec!["cp", "--write-devices", src.to_str().unwrap(), sdev.path()],
            "too small",
        ),
    ] {
        let o = ramsys(&key, &args);
        assert!(!o.status.success(), "{args:?} must fail");
        let e = stderr(&o);
        assert!(e.contains(why), "{args:?}: {e}");
        assert_eq!(e.trim().lines().count(), 1, "one line: {e}");
    }
    assert!(dev.read().iter().all(|&b| b == 0x5A), "device untouched");
    assert!(sdev.read().iter().all(|&b| b == 0x5A), "device untouched");
    // Nothing was created next to the devices either.
    assert!(std::fs::metadata(dev.path())
        .unwrap()
        .file_type()
        .is_block_device());
}

/// Device -> device through a daemon, push and pull; then a sync after
/// changing 1 % of the 256 KiB blocks moves about 1 % of the bytes.
#[test]
fn device_to_device_through_a_daemon_and_sync_moves_changed_blocks() {
    let t = tempfile::tempdir_in("/var/tmp").unwrap();
    let key = key_file(t.path());
    let size = 64usize << 20;
    let aimg = t.path().join("a.img");
    let mut want = dense_image(&aimg, size, 7);
    let bimg = t.path().join("b.img");
    blank_image(&bimg, size as u64, 0);
    let cimg = t.path().join("c.img");
    blank_image(&cimg, size as u64, 0);
    let (Some(a), Some(b), Some(c)) = (
        Loop::attach(&aimg),
        Loop::attach(&bimg),
        Loop::attach(&cimg),
    ) else {
        return;
    };
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    b.node_in(&root, "vol");
    let d = TestDaemon::start(&root, &key);
    let url = d.url("vol");

    // Push: a local device into the daemon's device.
    let o = ramsys(&key, &["cp", "--write-devices", "--json", a.path(), &url]);
    assert_ok(&o);
    assert!(b.read() == want, "pushed device identical");
    // Pull: the daemon's device into another local device.
    let o = ramsys(&key, &["cp", "--write-devices", "--json", &url, c.path()]);
    assert_ok(&o);
    assert!(c.read() == want, "pulled device identical");

    // Change 1 % of the blocks (3 of 256) of the source, then sync.
    let blocks = size / (256 << 10);
    let changed = blocks.div_ceil(100);
    let mut rng = Rng(99);
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(a.path())
            .unwrap();
        for k in 0..changed {
            let off = (k * blocks / changed + 1) * (256 << 10) + 1000;
            let d = rng.bytes(4096);
            want[off..off + d.len()].copy_from_slice(&d);
            std::os::unix::fs::FileExt::write_all_at(&f, &d, off as u64).unwrap();
        }
        f.flush().unwrap();
        f.sync_all().unwrap();
    }
    let o = ramsys(&key, &["sync", "--write-devices", "--json", a.path(), &url]);
    assert_ok(&o);
    let s = summary(&o);
    let sent = s["bytes"].as_u64().unwrap();
    let one_pct = size as u64 / 100;
    assert!(
        sent >= (changed as u64) * (256 << 10) && sent <= 2 * one_pct,
        "sync moved {sent} bytes of {size} for {changed} changed blocks"
    );
    assert!(b.read() == want, "synced device identical");
    // Nothing changed: nothing moves.
    let o = ramsys(&key, &["sync", "--write-devices", "--json", a.path(), &url]);
    assert_ok(&o);
    assert_eq!(summary(&o)["bytes"].as_u64(), Some(0));
}

fn slow_daemon(root: &Path, key: &Path) -> (std::process::Child, String) {
    daemon_env(
        root,
        key,
        &[
            ("RAMSYS_FAULT_SLOW_WRITE_US", "15000"),
            ("RAMSYS_JOURNAL_MIN", "1M"),
        ],
    )
}

/// A daemon with fault-injection variables set.
fn daemon_env(root: &Path, key: &Path, env: &[(&str, &str)]) -> (std::process::Child, String) {
    let mut child = Command::new(bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--root"])
        .arg(root)
        .arg("--key-file")
        .arg(key)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = listening_addr(&mut child);
    (child, addr)
}

/// A push into a daemon's device, the daemon killed mid-transfer: the same
/// command with --resume completes it (sending less than all of it), and
/// the device reads back identical.
#[test]
fn killed_device_write_resumes_and_verifies() {
    let t = tempfile::tempdir_in("/var/tmp").unwrap();
    let key = key_file(t.path());
    let size = 32usize << 20;
    let aimg = t.path().join("a.img");
    let want = dense_image(&aimg, size, 13);
    let bimg = t.path().join("b.img");
    blank_image(&bimg, size as u64, 0x11);
    let (Some(a), Some(b)) = (Loop::attach(&aimg), Loop::attach(&bimg)) else {
        return;
    };
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    b.node_in(&root, "vol");
    let (mut daemon, addr) = slow_daemon(&root, &key);
    let url = format!("ramsys://{addr}/vol");
    let args = |url: &str| -> Vec<String> {
        [
            "cp",
            "--write-devices",
            "--resume",
            "--json",
            "--block-size",
            "64K",
            "--streams",
            "2",
            a.path(),
            url,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let mut agent = Command::new(bin())
        .args(args(&url))
        .env("RAMSYS_KEY_FILE", &key)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The journal appears once written blocks were saved.
    let journal = root.join(".ramsys-journal.sqlite");
    let t0 = Instant::now();
    while !journal.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "transfer never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(700));
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let t1 = Instant::now();
    while agent.try_wait().unwrap().is_none() && t1.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = agent.kill();
    let _ = agent.wait();
    assert!(b.read() != want, "the kill landed mid-transfer");
    assert!(journal.exists(), "progress journalled");
    assert!(std::fs::metadata(root.join("vol"))
        .unwrap()
        .file_type()
        .is_block_device());

    let d = TestDaemon::start(&root, &key);
    let a2 = args(&d.url("vol"));
    let a2: Vec<&str> = a2.iter().map(|s| s.as_str()).collect();
    let o = ramsys(&key, &a2);
    assert_ok(&o);
    let sent = summary(&o)["bytes"].as_u64().unwrap();
    assert!(sent < size as u64, "resume sent {sent} of {size}");
    assert!(b.read() == want, "device identical after resume");
    assert!(!journal.exists(), "journal gone once complete");
}

/// Sync of an image file where a data block of the source became a hole
/// (discarded, punched): the replica, built from its old copy, must read
/// zeros there, not keep the old bytes (hole segments zero their range in
/// a file built from a base). No loop device needed.
#[test]
fn sync_of_an_image_whose_block_became_a_hole() {
    let t = tempfile::tempdir_in("/var/tmp").unwrap();
    let key = key_file(t.path());
    let size = 8usize << 20;
    let src = t.path().join("src.img");
    let mut want = dense_image(&src, size, 23);
    let dst = t.path().join("dst.img");
    let o = ramsys(
        &key,
        &[
            "sync",
            "--json",
            src.to_str().unwrap(),
            dst.to_str().unwrap(),
        ],
    );
    assert_ok(&o);
    assert!(std::fs::read(&dst).unwrap() == want);
    // Punch 1 MiB out of the source's middle.
    let f = std::fs::OpenOptions::new().write(true).open(&src).unwrap();
    let (off, len) = (3usize << 20, 1usize << 20);
    let out = Command::new("fallocate")
        .args(["-p", "-o", &off.to_string(), "-l", &len.to_string()])
        .arg(&src)
        .output()
        .unwrap();
    assert_ok(&out);
    drop(f);
    want[off..off + len].fill(0);
    assert!(std::fs::read(&src).unwrap() == want);
    let o = ramsys(
        &key,
        &[
            "sync",
            "--json",
            src.to_str().unwrap(),
            dst.to_str().unwrap(),
        ],
    );
    assert_ok(&o);
    let sent = summary(&o)["bytes"].as_u64().unwrap();
    assert!(sent <= 2 * len as u64, "delta only: {sent}");
    assert!(
        std::fs::read(&dst).unwrap() == want,
        "the punched range reads as zeros at the replica"
    );
}
