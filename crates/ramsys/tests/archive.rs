//! Faithful copies (issue 20): `-aHAX --numeric-ids` (and by name)
//! through the local, daemon (`ramsys://`) and ssh (`HOST:PATH`) paths,
//! each result compared with what `rsync -aHAX --numeric-ids` makes of the
//! same tree (`rsync -n --itemize-changes --delete` between the two
//! reports nothing); a second sync changes nothing; a multi-user daemon
//! keeps no foreign owner and makes no device; a non-root sink keeps what
//! it can and says so in one line.
//!
//! The tree: a file owned by nobody:nogroup, a set-user-ID file, a FIFO, a
//! socket, a device node (mknod, root), user.* xattrs, an access and a
//! default ACL (setfacl), hard links and symlinks. Needs root (CI runs as
//! root), rsync and setfacl (scripts/install-deps.sh); skips with the
//! reason printed otherwise.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::sshd::Sshd;
use common::*;

fn is_root() -> bool {
    // SAFETY: no failure mode.
    unsafe { libc::geteuid() == 0 }
}

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Why this machine cannot run the comparison, if it cannot.
fn missing() -> Option<String> {
    if !is_root() {
        return Some("not root (owners and device nodes need it; CI runs as root)".into());
    }
    for c in ["rsync", "setfacl", "mknod", "mkfifo"] {
        if !have(c) {
            return Some(format!("{c} not installed (scripts/install-deps.sh)"));
        }
    }
    None
}

fn sh(cmd: &mut Command) {
    let o = cmd.output().expect("run helper");
    assert!(o.status.success(), "{cmd:?}: {}", stderr(&o));
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

/// The tree every test copies; false (reason printed) where the temp file
/// system lacks user xattrs or ACLs.
fn make_tree(src: &Path) -> bool {
    std::fs::create_dir_all(src.join("d/sub")).unwrap();
    std::fs::create_dir_all(src.join("acl_dir")).unwrap();
    std::fs::write(src.join("d/owned"), b"nobody's").unwrap();
    std::os::unix::fs::chown(src.join("d/owned"), Some(65534), Some(65534)).unwrap();
    std::fs::write(src.join("d/suid"), b"#!/bin/sh\n").unwrap();
    // chown clears set-user-ID: the mode after it.
    std::os::unix::fs::chown(src.join("d/suid"), Some(65534), None).unwrap();
    std::fs::set_permissions(src.join("d/suid"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    std::fs::write(src.join("d/sub/data"), vec![7u8; 300_000]).unwrap();
    std::fs::hard_link(src.join("d/sub/data"), src.join("d/hard")).unwrap();
    std::os::unix::fs::symlink("sub/data", src.join("d/link")).unwrap();
    std::os::unix::fs::symlink("../nowhere", src.join("d/dangling")).unwrap();
    sh(Command::new("mkfifo").arg(src.join("d/fifo")));
    drop(std::os::unix::net::UnixListener::bind(src.join("d/sock")).unwrap());
    sh(Command::new("mknod")
        .arg(src.join("d/null"))
        .args(["c", "1", "3"]));
    std::fs::write(src.join("acl_dir/f"), b"acl").unwrap();
    let x = std::fs::write(src.join("d/x"), b"xattrs").is_ok()
        && xattr::set(src.join("d/x"), "user.ramsys.a", b"one").is_ok()
        && xattr::set(src.join("d/x"), "user.ramsys.b", &[0u8, 255, 1]).is_ok()
        && xattr::set(src.join("d/sub"), "user.dir", b"on a directory").is_ok();
    let acl = Command::new("setfacl")
        .args(["-m", "u:nobody:rw,g:nogroup:r"])
        .arg(src.join("acl_dir/f"))
        .status()
        .is_ok_and(|s| s.success())
        && Command::new("setfacl")
            .args(["-d", "-m", "u:nobody:rx"])
            .arg(src.join("acl_dir"))
            .status()
            .is_ok_and(|s| s.success());
    for p in [
        "d/owned",
        "d/suid",
        "d/sub/data",
        "acl_dir/f",
        "d/x",
        "d/fifo",
    ] {
        set_mtime(&src.join(p), 1_600_000_000, 123_456_789);
    }
    if !(x && acl) {
        eprintln!("skipping: the temp file system has no user xattrs or ACLs");
    }
    x && acl
}

/// What `rsync -n -aHAX --numeric-ids --itemize-changes --delete` would
/// change to make `b` like `a` (empty = the same).
fn rsync_diff(a: &Path, b: &Path) -> String {
    let o = Command::new("rsync")
        .args([
            "-n",
            "-aHAX",
            "--numeric-ids",
            "--itemize-changes",
            "--delete",
        ])
        .arg(format!("{}/", a.display()))
        .arg(format!("{}/", b.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "rsync: {}", stderr(&o));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// rsync's own copy of `src`, the reference.
fn reference(src: &Path, to: &Path) {
    sh(Command::new("rsync")
        .args(["-aHAX", "--numeric-ids"])
        .arg(format!("{}/", src.display()))
        .arg(to));
}

fn assert_like_rsync(reference: &Path, ours: &Path, how: &str) {
    let d = rsync_diff(reference, ours);
    assert!(d.is_empty(), "{how}: rsync would change:\n{d}");
    // By name as well as by id: this system's names are the same.
    let md = std::fs::metadata(ours.join("d/owned")).unwrap();
    assert_eq!((md.uid(), md.gid()), (65534, 65534), "{how}");
    assert_eq!(
        std::fs::metadata(ours.join("d/suid")).unwrap().mode() & 0o7777,
        0o4755,
        "{how}: chown must not cost the set-user-ID bit"
    );
}

/// (inode, ctime) of every entry that is not a directory or symlink: a
/// run that changes nothing leaves them all alone.
fn stamps(root: &Path) -> BTreeMap<String, (u64, i64, i64)> {
    let mut m = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let md = std::fs::symlink_metadata(&p).unwrap();
            if md.is_dir() {
                stack.push(p);
            } else if !md.file_type().is_symlink() {
                let k = p.strip_prefix(root).unwrap().display().to_string();
                m.insert(k, (md.ino(), md.ctime(), md.ctime_nsec()));
            }
        }
    }
    m
}

const FLAGS: [&str; 2] = ["-aHAX", "--numeric-ids"];

#[test]
fn local_copy_and_sync_like_rsync() {
    if let Some(why) = missing() {
        eprintln!("skipping: {why}");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    if !make_tree(&src) {
        return;
    }
    let key = key_file(t.path());
    let refd = t.path().join("ref");
    reference(&src, &refd);

    // cp: DST missing, so DST is the copy.
    let dst = t.path().join("cp");
    let o = ramsys(&key, &[&["cp"], &FLAGS[..], &[&s(&src), &s(&dst)]].concat());
    assert_ok(&o);
    assert_like_rsync(&refd, &dst, "local cp -aHAX --numeric-ids");
    assert!(!stderr(&o).contains("not kept"), "{}", stderr(&o));

    // By name (no --numeric-ids): the same on one system.
    let named = t.path().join("named");
    assert_ok(&ramsys(&key, &["cp", "-aHAX", &s(&src), &s(&named)]));
    assert_like_rsync(&refd, &named, "local cp -aHAX");

    // sync twice into a fresh destination: the second run moves no data
    // and touches no file, FIFO, socket or device.
    let mirror = t.path().join("mirror");
    let (srcs, ms) = (format!("{}/", src.display()), s(&mirror));
    let args = [&["sync"], &FLAGS[..], &["--json", &srcs, &ms]].concat();
    assert_ok(&ramsys(&key, &args));
    assert_like_rsync(&refd, &mirror, "local sync");
    let before = stamps(&mirror);
    std::thread::sleep(Duration::from_millis(20));
    let o = ramsys(&key, &args);
    assert_ok(&o);
    assert_like_rsync(&refd, &mirror, "second local sync");
    assert_eq!(stamps(&mirror), before, "the second sync changed something");
    let out = String::from_utf8_lossy(&o.stdout);
    let summary = out
        .lines()
        .rev()
        .find(|l| l.contains("\"summary\""))
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(summary).unwrap();
    assert_eq!(v["bytes"], 0, "{summary}");

    // A changed owner and a changed xattr on the source: the next sync
    // brings both, and removes an xattr the source dropped.
    std::os::unix::fs::chown(src.join("d/x"), Some(65534), None).unwrap();
    xattr::remove(src.join("d/x"), "user.ramsys.b").unwrap();
    xattr::set(src.join("d/x"), "user.ramsys.a", b"two").unwrap();
    let refd2 = t.path().join("ref2");
    reference(&src, &refd2);
    assert_ok(&ramsys(&key, &args));
    assert_like_rsync(&refd2, &mirror, "sync after attribute changes");

    // -U: access times too (one after the mtime and recent, so reading
    // the file under relatime leaves it alone).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let f = src.join("d/owned");
    use rustix::fs::{AtFlags, Timespec, Timestamps, CWD, UTIME_OMIT};
    let times = Timestamps {
        last_access: Timespec {
            tv_sec: now - 3600,
            tv_nsec: 5000,
        },
        last_modification: Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        },
    };
    rustix::fs::utimensat(CWD, &f, &times, AtFlags::empty()).unwrap();
    let at = t.path().join("atimes");
    assert_ok(&ramsys(&key, &["cp", "-aU", &s(&src), &s(&at)]));
    let md = std::fs::metadata(at.join("d/owned")).unwrap();
    assert_eq!((md.atime(), md.atime_nsec()), (now - 3600, 5000));

    // Without --specials the FIFO is a failure, as before, with a hint.
    let plain = t.path().join("plain");
    let o = ramsys(&key, &["cp", "-r", &s(&src), &s(&plain)]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("--specials"), "{}", stderr(&o));
}

#[test]
fn daemon_push_and_pull_like_rsync() {
    if let Some(why) = missing() {
        eprintln!("skipping: {why}");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let src = root.join("src");
    if !make_tree(&src) {
        return;
    }
    let key = key_file(t.path());
    let refd = t.path().join("ref");
    reference(&src, &refd);
    let d = TestDaemon::start(&root, &key);

    // Push into the daemon (its sink applies), then pull back (its scan
    // collects, through ArchiveOpen).
    let o = ramsys(
        &key,
        &[&["cp"], &FLAGS[..], &[&s(&src), &d.url("pushed")]].concat(),
    );
    assert_ok(&o);
    assert_like_rsync(&refd, &root.join("pushed"), "daemon push");
    let pulled = t.path().join("pulled");
    let o = ramsys(
        &key,
        &[&["cp"], &FLAGS[..], &[&d.url("src"), &s(&pulled)]].concat(),
    );
    assert_ok(&o);
    assert_like_rsync(&refd, &pulled, "daemon pull");

    // sync twice through the daemon: nothing changes the second time.
    let (srcs, url) = (format!("{}/", src.display()), d.url("mirror"));
    let args = [&["sync"], &FLAGS[..], &[&srcs, &url]].concat();
    assert_ok(&ramsys(&key, &args));
    let before = stamps(&root.join("mirror"));
    assert_ok(&ramsys(&key, &args));
    assert_like_rsync(&refd, &root.join("mirror"), "daemon sync");
    assert_eq!(stamps(&root.join("mirror")), before);
}

#[test]
fn multi_user_daemon_keeps_no_foreign_owner_or_device() {
    if let Some(why) = missing() {
        eprintln!("skipping: {why}");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let p = t.path();
    let src = p.join("src");
    if !make_tree(&src) {
        return;
    }
    std::fs::create_dir_all(p.join("a")).unwrap();
    std::fs::create_dir_all(p.join("keys")).unwrap();
    std::fs::create_dir_all(p.join("shared")).unwrap();
    let ka = p.join("keys/alice");
    std::fs::write(&ka, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n").unwrap();
    std::fs::set_permissions(&ka, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(
        p.join("users.toml"),
        "[[user]]\nname = \"alice\"\nkey_file = \"keys/alice\"\nroot = \"a\"\n",
    )
    .unwrap();
    let shared = key_file(p);
    let users = p.join("users.toml");
    let d = TestDaemon::start_with(
        &p.join("shared"),
        &shared,
        &["--users", users.to_str().unwrap()],
    );
    let mut c = Command::new(bin());
    c.args([&["cp"], &FLAGS[..], &[&s(&src), &d.url("in")]].concat())
        .env("RAMSYS_KEY_FILE", &ka)
        .env("RAMSYS_USER", "alice");
    let o = run_with_timeout(c, Duration::from_secs(120));
    assert_ok(&o);
    let got = p.join("a/in");
    // The daemon runs as root, yet alice's files are not nobody's.
    assert_ne!(std::fs::metadata(got.join("d/owned")).unwrap().uid(), 65534);
    assert!(!got.join("d/null").exists(), "a device node was made");
    // What is harmless still comes: contents, FIFOs, user.* xattrs.
    assert_eq!(std::fs::read(got.join("d/owned")).unwrap(), b"nobody's");
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(got.join("d/fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    assert_eq!(
        xattr::get(got.join("d/x"), "user.ramsys.a")
            .unwrap()
            .as_deref(),
        Some(&b"one"[..])
    );
}

#[test]
fn non_root_sink_keeps_what_it_can_and_says_so_once() {
    if let Some(why) = missing() {
        eprintln!("skipping: {why}");
        return;
    }
    if !have("setpriv") {
        eprintln!("skipping: setpriv not installed");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let src = t.path().join("src");
    if !make_tree(&src) {
        return;
    }
    // The binary must be reachable by nobody.
    let mut dir = Path::new(bin()).parent();
    while let Some(d) = dir {
        if std::fs::metadata(d).unwrap().mode() & 0o001 == 0 {
            eprintln!("skipping: {} is not searchable by nobody", d.display());
            return;
        }
        dir = d.parent();
    }
    let out = t.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::os::unix::fs::chown(&out, Some(65534), Some(65534)).unwrap();
    let key = out.join("key");
    std::fs::write(&key, "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&key, Some(65534), Some(65534)).unwrap();
    let dst = out.join("copy");
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        bin(),
        "cp",
    ])
    .args(FLAGS)
    .arg(&src)
    .arg(&dst)
    .env("RAMSYS_KEY_FILE", &key)
    .env("HOME", &out);
    let o = run_with_timeout(c, Duration::from_secs(120));
    let e = stderr(&o);
    // The FIFO, socket, xattrs and file data all come; the one device
    // and the owners that are not nobody's cannot: one line says so.
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::symlink_metadata(dst.join("d/fifo"))
            .unwrap()
            .file_type()
            .is_fifo(),
        "{e}"
    );
    assert_eq!(std::fs::read(dst.join("d/owned")).unwrap(), b"nobody's");
    assert!(!dst.join("d/null").exists());
    let notes: Vec<&str> = e.lines().filter(|l| l.contains("not kept")).collect();
    assert_eq!(notes.len(), 1, "{e}");
    assert!(notes[0].contains("not running as root"), "{e}");
    assert!(notes[0].contains("device node of 1 entries"), "{e}");
    assert!(notes[0].contains("owner of"), "{e}");
    assert!(o.status.success(), "{e}");
}

fn over_ssh(d: &Sshd, args: &[String]) -> Output {
    let mut c = Command::new(bin());
    c.args(args)
        .env("RAMSYS_KEY_FILE", d.dir.path().join("ramsys-key"));
    run_with_timeout(c, Duration::from_secs(120))
}

#[test]
fn ssh_push_pull_and_sync_like_rsync() {
    if let Some(why) = missing() {
        eprintln!("skipping: {why}");
        return;
    }
    let Some(d) = Sshd::start() else { return };
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    if !make_tree(&src) {
        return;
    }
    let refd = t.path().join("ref");
    reference(&src, &refd);
    let remote = |p: &Path| format!("127.0.0.1:{}", p.display());
    let with = |pre: &[&str], paths: [String; 2]| -> Vec<String> {
        let mut v: Vec<String> = pre.iter().map(|x| x.to_string()).collect();
        v.extend(FLAGS.iter().map(|x| x.to_string()));
        v.extend(d.opts());
        v.extend(paths);
        v
    };
    let pushed = t.path().join("pushed");
    assert_ok(&over_ssh(&d, &with(&["cp"], [s(&src), remote(&pushed)])));
    assert_like_rsync(&refd, &pushed, "ssh push");
    let pulled = t.path().join("pulled");
    assert_ok(&over_ssh(&d, &with(&["cp"], [remote(&src), s(&pulled)])));
    assert_like_rsync(&refd, &pulled, "ssh pull");
    // Third party (HOST1's ramsys gets the archive flags on its command
    // line): 127.0.0.1:src -> 127.0.0.1:third.
    let third = t.path().join("third");
    assert_ok(&over_ssh(
        &d,
        &with(&["cp"], [remote(&src), remote(&third)]),
    ));
    assert_like_rsync(&refd, &third, "ssh third party");
    let mirror = t.path().join("mirror");
    let args = with(&["sync"], [format!("{}/", src.display()), remote(&mirror)]);
    assert_ok(&over_ssh(&d, &args));
    let before = stamps(&mirror);
    assert_ok(&over_ssh(&d, &args));
    assert_like_rsync(&refd, &mirror, "ssh sync");
    assert_eq!(stamps(&mirror), before);
}
