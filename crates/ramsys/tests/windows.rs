//! Windowed metadata (issue 36, docs/PROTOCOL.md "Windows"): with a window
//! of 100 records (RAMSYS_WINDOW_FILES at both ends), a tree of 3,000
//! files crosses dozens of windows. A local copy, a push and a pull give
//! the tree the whole-tree phases give, hard links whose target settled
//! many windows before included; each end's file list stays within the
//! window; a file that fails in an early window fails alone. Syncs
//! answer per window: a no-change re-sync moves nothing, a changed one
//! only what changed, and `--delete` removes what the source lost;
//! archive copies keep modes, mtimes and owners as `rsync -a` does.

mod common;
mod proxy;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use proxy::LinkProxy;

const WINDOW: &str = "100";

/// The varied tree's shapes, 3,000 files of 0-3,000 bytes in 30
/// directories (every 7th empty), one of 3 MB, and hard links in the last
/// directory to files of the first.
fn make_tree(src: &Path) {
    make_varied_tree(src, 4096);
    let mut r = Rng(0x36);
    for d in 0..30 {
        let dir = src.join(format!("d{d:03}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..100u64 {
            let n = if f % 7 == 0 { 0 } else { r.next() % 3000 };
            std::fs::write(dir.join(format!("f{f:04}")), r.bytes(n as usize)).unwrap();
        }
    }
    std::fs::write(src.join("d015/big"), r.bytes(3 << 20)).unwrap();
    for f in 1..6 {
        let to = src.join(format!("d029/link{f}"));
        std::fs::hard_link(src.join(format!("d000/f{f:04}")), to).unwrap();
    }
}

/// A daemon with the test's window.
fn daemon(root: &Path, key: &Path, window: &str) -> TestDaemon {
    daemon_with(root, key, window, &[])
}

/// [`daemon`] with more environment (a fault injection).
fn daemon_with(root: &Path, key: &Path, window: &str, env: &[(&str, &str)]) -> TestDaemon {
    let mut c = Command::new(bin());
    c.args(["serve", "--listen", "127.0.0.1:0", "--root"])
        .arg(root)
        .arg("--key-file")
        .arg(key)
        .env("RAMSYS_WINDOW_FILES", window)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    TestDaemon::spawn(c, root)
}

/// `ramsys cp -r --json ARGS` with the window `window` (0: none).
fn cp(key: &Path, window: &str, args: &[&str]) -> Output {
    let mut c = Command::new(bin());
    c.args(["cp", "-r", "--json"])
        .args(args)
        .env("RAMSYS_KEY_FILE", key)
        .env("RAMSYS_WINDOW_FILES", window);
    run_with_timeout(c, Duration::from_secs(120))
}

/// `ramsys sync -r --json ARGS` with the window `window`.
fn sync(key: &Path, window: &str, args: &[&str]) -> Output {
    let mut c = Command::new(bin());
    c.args(["sync", "-r", "--json"])
        .args(args)
        .env("RAMSYS_KEY_FILE", key)
        .env("RAMSYS_WINDOW_FILES", window);
    run_with_timeout(c, Duration::from_secs(120))
}

/// The agent's own file list at its peak (summary `meta_bytes`).
fn meta_bytes(o: &Output) -> u64 {
    summary(o)["meta_bytes"].as_u64().expect("meta_bytes")
}

#[test]
fn windowed_copies_give_the_whole_tree_and_hold_a_window() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    make_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = daemon(&root, &key, WINDOW);
    let s = src.to_str().unwrap();

    // Push: the agent is the windowed source.
    let o = cp(&key, WINDOW, &[s, &d.url("")]);
    assert_ok(&o);
    assert_same_tree(&src, &root.join("src"));
    let pushed = meta_bytes(&o);

    // Pull: the agent is the windowed sink.
    let back = t.path().join("back");
    let o = cp(&key, WINDOW, &[&d.url("src"), back.to_str().unwrap()]);
    assert_ok(&o);
    assert_same_tree(&src, &back);
    let pulled = meta_bytes(&o);

    // Local copy: both ends in the agent.
    let local = t.path().join("local");
    let o = cp(&key, WINDOW, &[s, local.to_str().unwrap()]);
    assert_ok(&o);
    assert_same_tree(&src, &local);
    assert!(temp_files(&root).is_empty() && temp_files(&back).is_empty());
    assert!(temp_files(&local).is_empty());

    // The same push without windows holds every file's state: the
    // windowed ends held a small part of it.
    let whole = t.path().join("whole");
    std::fs::create_dir(&whole).unwrap();
    let d0 = daemon(&whole, &key, "0");
    let o = cp(&key, "0", &[s, &d0.url("")]);
    assert_ok(&o);
    assert_same_tree(&src, &whole.join("src"));
    let all = meta_bytes(&o);
    assert!(pushed * 4 < all, "source held {pushed} of {all} bytes");
    assert!(pulled * 4 < all, "sink held {pulled} of {all} bytes");
}

/// A windowed agent and a daemon without windows (as a daemon of before,
/// which ignores the flag): today's phases, the same tree.
#[test]
fn a_peer_without_windows_keeps_the_whole_tree_phases() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    make_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = daemon(&root, &key, "0");
    let o = cp(&key, WINDOW, &[src.to_str().unwrap(), &d.url("")]);
    assert_ok(&o);
    assert_same_tree(&src, &root.join("src"));
    let back = t.path().join("back");
    let o = cp(&key, WINDOW, &[&d.url("src"), back.to_str().unwrap()]);
    assert_ok(&o);
    assert_same_tree(&src, &back);
}

/// A file of the first window that cannot be put in place (a directory
/// holds its name at the destination) fails alone: its window is settled
/// and dropped, the session goes on, every other file arrives, and the
/// failure is reported with its reason.
#[test]
fn a_failed_file_in_an_early_window_fails_alone() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    make_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir_all(root.join("src/d000/f0003/in the way")).unwrap();
    let d = daemon(&root, &key, WINDOW);
    let o = cp(&key, WINDOW, &[src.to_str().unwrap(), &d.url("")]);
    assert!(!o.status.success(), "the failed file fails the copy");
    // The JSON summary names it, with the reason.
    let err = String::from_utf8_lossy(&o.stdout).into_owned() + &stderr(&o);
    assert!(err.contains("d000/f0003"), "{err}");
    // Everything else is in place.
    for d in 0..30 {
        for f in 0..100 {
            let rel = format!("d{d:03}/f{f:04}");
            if rel == "d000/f0003" {
                continue;
            }
            let a = std::fs::read(src.join(&rel)).unwrap();
            let b = std::fs::read(root.join("src").join(&rel)).unwrap();
            assert!(a == b, "{rel} differs");
        }
    }
    // Hard links to files of that window: made, but for the one whose
    // target failed (settled and dropped windows before the link came).
    for f in 1..6 {
        let to = root.join(format!("src/d029/link{f}"));
        if f == 3 {
            assert!(!to.exists() && err.contains("d029/link3"), "{err}");
            continue;
        }
        let a = std::fs::read(src.join(format!("d029/link{f}"))).unwrap();
        assert!(a == std::fs::read(&to).unwrap(), "link{f} differs");
        let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
        assert_eq!(ino(&to), ino(&root.join(format!("src/d000/f{f:04}"))));
    }
    assert!(temp_files(&root).is_empty(), "{:?}", temp_files(&root));
}

/// A data link cut mid-transfer (after 1 MB, with windows still to come):
/// replaced, what it lost read again from the files the window holds, and
/// the tree complete.
#[test]
fn a_data_link_cut_mid_window_is_replaced() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    make_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = daemon(&root, &key, WINDOW);
    let p = LinkProxy::start(&d.addr);
    p.rules.cut_data_after.store(1 << 20, Ordering::Relaxed);
    p.rules.cut_data_max.store(1, Ordering::Relaxed);
    let to = format!("ramsys://{}/dst", p.addr);
    let args = ["--streams", "4", "--block-size", "65536"];
    let o = cp(
        &key,
        WINDOW,
        &[&args[..], &[src.to_str().unwrap(), &to]].concat(),
    );
    assert_ok(&o);
    assert_eq!(p.seen.data_cuts.load(Ordering::Relaxed), 1);
    assert_same_tree(&src, &root.join("dst"));
    assert_eq!(summary(&o)["links_replaced"], 1, "{}", summary(&o));
    assert!(temp_files(&root).is_empty());
}

/// The tree, a daemon with the test's window, and the three ways a sync
/// runs: (source, destination, where it lands) of a push, a pull of what
/// the push left (after it), and a local sync.
struct ThreeWays {
    t: tempfile::TempDir,
    key: std::path::PathBuf,
    src: std::path::PathBuf,
    /// `SRC/`: its contents.
    s: String,
    /// Serves the runs' push and pull while the fixture lives.
    daemon: TestDaemon,
    runs: [(String, String, std::path::PathBuf); 3],
}

impl ThreeWays {
    fn new() -> ThreeWays {
        let t = tempfile::tempdir().unwrap();
        let key = key_file(t.path());
        let src = t.path().join("src");
        make_tree(&src);
        let root = t.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let d = daemon(&root, &key, WINDOW);
        let s = format!("{}/", src.display());
        let (back, local) = (t.path().join("back"), t.path().join("local"));
        let path = |p: &Path| p.to_str().unwrap().to_string();
        let runs = [
            (s.clone(), d.url("push"), root.join("push")),
            (d.url("push/"), path(&back), back),
            (s.clone(), path(&local), local),
        ];
        ThreeWays {
            t,
            key,
            src,
            s,
            daemon: d,
            runs,
        }
    }

    /// No temp file left at any destination.
    fn no_temp_files(&self) {
        for (_, _, at) in &self.runs {
            assert!(temp_files(at).is_empty(), "{:?}", temp_files(at));
        }
    }
}

/// Syncs in windows of 100 (push, pull, local): the first one fills DST,
/// a no-change re-sync moves nothing and finds every file unchanged, a
/// re-sync after three changes moves those three; every time DST is SRC.
#[test]
fn windowed_syncs_move_only_what_changed() {
    let w = ThreeWays::new();
    let (key, src) = (&w.key, &w.src);
    let n = |o: &Output, k: &str| summary(o)[k].as_u64().unwrap_or_else(|| panic!("{k}"));
    let mut files = 0;
    for (from, to, at) in &w.runs {
        let o = sync(key, WINDOW, &[from, to]);
        assert_ok(&o);
        assert_same_tree(src, at);
        files = n(&o, "files");
    }
    assert!(files > 3000, "{files} files");
    for (from, to, at) in &w.runs {
        let o = sync(key, WINDOW, &[from, to]);
        assert_ok(&o);
        assert_eq!((n(&o, "files"), n(&o, "bytes")), (0, 0), "{from} -> {to}");
        assert_eq!(n(&o, "unchanged"), files, "{from} -> {to}");
        assert_same_tree(src, at);
    }
    let mut r = Rng(0x37);
    let same = std::fs::metadata(src.join("d005/f0010")).unwrap().len();
    std::fs::write(src.join("d005/f0010"), r.bytes(same as usize)).unwrap();
    let mut grown = std::fs::read(src.join("d010/f0020")).unwrap();
    grown.extend_from_slice(b"more");
    std::fs::write(src.join("d010/f0020"), grown).unwrap();
    std::fs::write(src.join("d020/new"), r.bytes(1000)).unwrap();
    for (from, to, at) in &w.runs {
        let o = sync(key, WINDOW, &[from, to]);
        assert_ok(&o);
        assert_eq!(n(&o, "files"), 3, "{from} -> {to}");
        assert_eq!(n(&o, "unchanged"), files - 2, "{from} -> {to}");
        assert_same_tree(src, at);
    }
    w.no_temp_files();
}

/// `rsync -a` as the oracle: what `rsync -n -a[X] --itemize-changes
/// --delete A/ B/` would change (empty: the same tree, modes, mtimes,
/// owners and, with `x`, xattrs included).
fn rsync_changes(a: &Path, b: &Path, x: bool) -> String {
    let a_flag = if x { "-aX" } else { "-a" };
    rsync_out(a, b, &["-n", a_flag, "--itemize-changes", "--delete"])
        .trim()
        .to_string()
}

/// What `rsync ARGS A/ B/` printed (it must succeed).
fn rsync_out(a: &Path, b: &Path, args: &[&str]) -> String {
    let o = Command::new("rsync")
        .args(args)
        .arg(format!("{}/", a.display()))
        .arg(format!("{}/", b.display()))
        .output()
        .expect("rsync");
    assert!(o.status.success(), "rsync: {}", stderr(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The windows tree with an archive's attributes: every file its own mode
/// and mtime, every 11th a user xattr (where the file system takes them),
/// every 13th owned by nobody (as root), the directories' modes and
/// mtimes set last. Whether xattrs are on.
fn make_archive_tree(src: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    make_tree(src);
    let x = xattr::set(src.join("d000/f0000"), "user.probe", b"1").is_ok();
    let root = rustix::process::geteuid().is_root();
    let modes = [0o600, 0o640, 0o644, 0o755, 0o700];
    let mut i = 0usize;
    for d in 0..30 {
        let dir = src.join(format!("d{d:03}"));
        for f in 0..100 {
            let p = dir.join(format!("f{f:04}"));
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(modes[i % 5])).unwrap();
            if x && i.is_multiple_of(11) {
                xattr::set(&p, "user.i", i.to_string().as_bytes()).unwrap();
            }
            if root && i.is_multiple_of(13) {
                std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
            }
            set_mtime(&p, 1_500_000_000 + i as i64, (i * 1000) as i64);
            i += 1;
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).unwrap();
        set_mtime(&dir, 1_400_000_000 + d, 0);
    }
    x
}

/// Archive copies (`-a`, `-aX`, issue 36) in windows of 100: a local copy, a
/// push and a pull give what `rsync -a` gives (rsync's dry run between them finds
/// nothing to change), the local one holding a fraction of the file list
/// the same copy holds without windows; a no-change `sync -a` re-run
/// moves nothing and changes nothing.
#[test]
fn windowed_archive_copies_keep_modes_mtimes_and_owners() {
    if Command::new("rsync").arg("--version").output().is_err() {
        eprintln!("skipping: rsync not installed (scripts/install-deps.sh)");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    let x = make_archive_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = daemon(&root, &key, WINDOW);
    let s = format!("{}/", src.display());
    let local = t.path().join("local");
    let whole = t.path().join("whole");
    let (local_s, whole_s) = (local.to_str().unwrap(), whole.to_str().unwrap());
    // `-a` as rsync's, with xattrs where the file system takes them.
    let a = if x { "-aX" } else { "-a" };

    let o = cp(&key, WINDOW, &[a, &s, local_s]);
    assert_ok(&o);
    assert_eq!(rsync_changes(&src, &local, x), "", "local cp -a");
    let windowed = meta_bytes(&o);
    let o = cp(&key, "0", &[a, &s, whole_s]);
    assert_ok(&o);
    assert_eq!(
        rsync_changes(&src, &whole, x),
        "",
        "local cp -a, no windows"
    );
    let all = meta_bytes(&o);
    assert!(windowed * 4 < all, "held {windowed} of {all} bytes");

    let push = d.url("push");
    let o = cp(&key, WINDOW, &[a, &s, &push]);
    assert_ok(&o);
    assert_eq!(rsync_changes(&src, &root.join("push"), x), "", "push cp -a");
    // Pull: the daemon is the windowed source of an archive copy.
    let back = t.path().join("back");
    let o = cp(&key, WINDOW, &[a, &d.url("push/"), back.to_str().unwrap()]);
    assert_ok(&o);
    assert_eq!(rsync_changes(&src, &back, x), "", "pull cp -a");
    let pulled = meta_bytes(&o);
    assert!(
        pulled * 4 < all,
        "the pulling sink held {pulled} of {all} bytes"
    );

    let n = |o: &Output, k: &str| summary(o)[k].as_u64().unwrap_or_else(|| panic!("{k}"));
    for (to, at) in [(local_s, local.clone()), (push.as_str(), root.join("push"))] {
        let o = sync(&key, WINDOW, &[a, &s, to]);
        assert_ok(&o);
        assert_eq!((n(&o, "files"), n(&o, "bytes")), (0, 0), "sync -a {to}");
        assert_eq!(rsync_changes(&src, &at, x), "", "sync -a {to}");
    }
    for dir in [&root, &local, &back] {
        assert!(temp_files(dir).is_empty(), "{:?}", temp_files(dir));
    }
}

/// `--delete` in windows: the sink keeps a keyed hash per path the source
/// sent (8.5 bytes) and deletes at the end, as in the whole-tree phases.
/// Push, pull and local remove what the source lost (a file, a whole
/// directory) and DST's own extra under `-a --delete`, leave what the
/// rules exclude (rsync's rule), give the source's tree, and a second run
/// changes nothing. The pushing agent's file list stays within its window.
#[test]
fn windowed_delete_syncs_remove_what_the_source_lost() {
    let w = ThreeWays::new();
    let (key, src) = (&w.key, &w.src);
    for (from, to, at) in &w.runs {
        assert_ok(&sync(key, WINDOW, &[from, to]));
        assert_same_tree(src, at);
    }
    std::fs::remove_file(src.join("d007/f0003")).unwrap();
    std::fs::remove_dir_all(src.join("d012")).unwrap();
    let n = |o: &Output, k: &str| summary(o)[k].as_u64().unwrap_or_else(|| panic!("{k}"));
    for (from, to, at) in &w.runs {
        std::fs::write(at.join("d020/extra"), b"x").unwrap();
        std::fs::write(at.join("d021/extra.tmp"), b"kept").unwrap();
        // As rsync users run it: -a --delete (Attrs per window too).
        let o = sync(
            key,
            WINDOW,
            &["-a", "--delete", "--exclude", "*.tmp", from, to],
        );
        assert_ok(&o);
        // d007/f0003, d012 (one entry, its files with it), d020/extra.
        assert_eq!(n(&o, "deleted"), 3, "{from} -> {to}");
        assert_eq!(n(&o, "files"), 0, "{from} -> {to}");
        assert_eq!(std::fs::read(at.join("d021/extra.tmp")).unwrap(), b"kept");
        let o = sync(
            key,
            WINDOW,
            &["-a", "--delete", "--exclude", "*.tmp", from, to],
        );
        assert_ok(&o);
        assert_eq!((n(&o, "deleted"), n(&o, "files")), (0, 0), "{from} -> {to}");
        // Without the protected file (and its directory's mtime set back
        // by one more run), the source's tree.
        std::fs::remove_file(at.join("d021/extra.tmp")).unwrap();
        assert_ok(&sync(key, WINDOW, &[from, to]));
        assert_same_tree(src, at);
    }
    // The push again, after one more loss: the agent held a window.
    std::fs::remove_file(src.join("d001/f0001")).unwrap();
    let o = sync(key, WINDOW, &["-a", "--delete", &w.s, &w.runs[0].1]);
    assert_ok(&o);
    assert_eq!(n(&o, "deleted"), 1);
    let windowed = meta_bytes(&o);
    std::fs::write(src.join("d001/f0001"), b"back").unwrap();
    let whole = w.t.path().join("whole");
    std::fs::create_dir(&whole).unwrap();
    let d0 = daemon(&whole, key, "0");
    let o = sync(key, "0", &["-a", "--delete", &w.s, &d0.url("push")]);
    assert_ok(&o);
    let all = meta_bytes(&o);
    assert!(windowed * 4 < all, "source held {windowed} of {all} bytes");
    w.no_temp_files();
}

/// Dry runs in windows of 100 (push, pull, local; the pulling agent is
/// the windowed sink): `sync -n --delete` names what `rsync -n --delete`
/// names, sends and deletes nothing, counts the rest unchanged, with
/// `--checksum` too (a same-size, same-mtime change found by content);
/// the pushing agent's file list stays within its window.
#[test]
fn windowed_dry_runs_list_what_rsync_would_change() {
    let w = ThreeWays::new();
    let (key, src) = (&w.key, &w.src);
    for (from, to, _) in &w.runs {
        assert_ok(&sync(key, WINDOW, &[from, to]));
    }
    let mut r = Rng(0x38);
    std::fs::write(src.join("d003/f0004"), r.bytes(1000)).unwrap();
    std::fs::write(src.join("d020/new"), r.bytes(10)).unwrap();
    std::fs::remove_file(src.join("d007/f0003")).unwrap();
    // Same size, same mtime, other bytes: only --checksum sees it.
    let hidden = src.join("d011/f0005");
    let len = std::fs::metadata(&hidden).unwrap().len() as usize;
    let mtime = std::fs::metadata(&hidden).unwrap().modified().unwrap();
    std::fs::write(&hidden, r.bytes(len)).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&hidden)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let names = |o: &Output, k: &str| -> Vec<String> {
        let mut v: Vec<String> = summary(o)[k]
            .as_array()
            .unwrap_or_else(|| panic!("{k}"))
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect();
        v.sort();
        v
    };
    let n = |o: &Output, k: &str| summary(o)[k].as_u64().unwrap_or_else(|| panic!("{k}"));
    // (Not the lists in full: a wrong one may name 3,000 files.)
    let few = |v: &[String]| format!("{} {:?}", v.len(), &v[..v.len().min(5)]);
    let pushed = &w.runs[0].2;
    for (i, (from, to, at)) in w.runs.iter().enumerate() {
        // The pull's source is the daemon's copy: brought up to SRC (the
        // hidden change too) after the push's dry runs.
        let from_dir = match i {
            1 => {
                let args = ["--delete", "--checksum", &w.s, &w.runs[0].1];
                assert_ok(&sync(key, WINDOW, &args));
                pushed.as_path()
            }
            _ => src.as_path(),
        };
        std::fs::write(at.join("d020/extra"), b"x").unwrap();
        let before = snapshot(at);
        for checksum in [false, true] {
            let mut args = vec!["-n", "--delete"];
            let mut oracle = vec!["-rn", "--delete", "--out-format=%n"];
            if checksum {
                args.push("--checksum");
                oracle.push("--checksum");
            }
            args.extend([from.as_str(), to.as_str()]);
            let o = sync(key, WINDOW, &args);
            assert_ok(&o);
            let (send, delete) = rsync_would(from_dir, at, &oracle);
            let run = format!("{from} -> {to}, checksum {checksum}");
            let (got_send, got_delete) = (names(&o, "would_send"), names(&o, "would_delete"));
            assert!(got_send == send, "{run}: {} for {send:?}", few(&got_send));
            assert!(
                got_delete == delete,
                "{run}: {} for {delete:?}",
                few(&got_delete)
            );
            assert_eq!(send.len(), 2 + usize::from(checksum), "{run}");
            assert!(n(&o, "unchanged") > 3000, "{run}");
            assert_eq!((n(&o, "files"), n(&o, "bytes")), (0, 0), "{run}");
            assert!(before == snapshot(at), "{run}: the dry run changed DST");
        }
        std::fs::remove_file(at.join("d020/extra")).unwrap();
    }
    // Into a DST that does not exist, twice: every file, DST not made
    // (rsync -n makes nothing either).
    let none = w.t.path().join("none");
    // Every name but directories, hard links and symlinks too (issue 36),
    // as `rsync -n --out-format=%n` names them.
    let mut files: Vec<String> = rsync_out(src, &none, &["-rlnH", "--out-format=%n"])
        .lines()
        .filter(|l| !l.ends_with('/'))
        .map(String::from)
        .collect();
    files.sort();
    for to in [none.to_str().unwrap().to_string(), w.daemon.url("none")] {
        for _ in 0..2 {
            let o = sync(key, WINDOW, &["-n", &w.s, &to]);
            assert_ok(&o);
            let got = names(&o, "would_send");
            assert!(got == files, "{to}: {} for {}", few(&got), few(&files));
        }
    }
    assert!(!none.exists() && !w.t.path().join("root/none").exists());
    // The pushing agent held a window of the tree, not the tree.
    let o = sync(key, WINDOW, &["-n", &w.s, &w.runs[0].1]);
    assert_ok(&o);
    let windowed = meta_bytes(&o);
    let o = sync(key, "0", &["-n", &w.s, &w.runs[0].1]);
    assert_ok(&o);
    let all = meta_bytes(&o);
    assert!(windowed * 4 < all, "source held {windowed} of {all} bytes");
    w.no_temp_files();
}

/// What `rsync ARGS A/ B/` names: the regular files it would send and
/// the entries it would delete, each sorted.
fn rsync_would(a: &Path, b: &Path, args: &[&str]) -> (Vec<String>, Vec<String>) {
    let (mut send, mut delete) = (Vec::new(), Vec::new());
    for l in rsync_out(a, b, args).lines() {
        match l.strip_prefix("deleting ") {
            Some(p) => delete.push(p.to_string()),
            None if a.join(l).is_file() => send.push(l.to_string()),
            None => {}
        }
    }
    send.sort();
    delete.sort();
    (send, delete)
}

/// `cp --resume` in windows of 100 (issue 36): a push killed midway (its
/// sink daemon slowed, then killed) and run again with the same arguments
/// completes the tree from what is there, in windows: it sends less than
/// the tree holds, leaves no temp file and no journal, and a third run
/// sends nothing.
#[test]
fn a_killed_push_resumes_in_windows() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    make_tree(&src);
    let total: u64 = walk_paths(&src)
        .iter()
        .filter(|p| p.is_file())
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let slow_writes = [("RAMSYS_FAULT_SLOW_WRITE_US", "3000")];
    let mut slow = daemon_with(&root, &key, WINDOW, &slow_writes);
    let s = format!("{}/", src.display());
    let args = |url: &str| -> Vec<String> {
        [
            "cp",
            "-r",
            "--resume",
            "--json",
            "--block-size",
            "64K",
            &s,
            url,
        ]
        .map(String::from)
        .to_vec()
    };
    let mut agent = Command::new(bin())
        .args(args(&slow.url("push")))
        .env("RAMSYS_KEY_FILE", &key)
        .env("RAMSYS_WINDOW_FILES", WINDOW)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Some files in place (past the first windows), some still in flight.
    let t0 = std::time::Instant::now();
    while walk_paths(&root).len() < 600 && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    slow.child.kill().unwrap();
    slow.child.wait().unwrap();
    let _ = agent.wait();
    let placed = walk_paths(&root.join("push")).len();
    assert!(placed > 300, "only {placed} entries before the kill");

    let d = daemon(&root, &key, WINDOW);
    let run = |url: &str, window: &str| {
        let mut c = Command::new(bin());
        c.args(args(url))
            .env("RAMSYS_KEY_FILE", &key)
            .env("RAMSYS_WINDOW_FILES", window);
        run_with_timeout(c, Duration::from_secs(120))
    };
    let o = run(&d.url("push"), WINDOW);
    assert_ok(&o);
    let sent = summary(&o)["bytes"].as_u64().unwrap();
    assert!(sent < total, "resume sent {sent} of {total}");
    assert_same_tree(&src, &root.join("push"));
    assert!(temp_files(&root).is_empty(), "{:?}", temp_files(&root));
    let o = run(&d.url("push"), WINDOW);
    assert_ok(&o);
    assert_eq!(summary(&o)["bytes"].as_u64(), Some(0));
    // In windows: the agent held a window of the tree, not the tree.
    let windowed = meta_bytes(&o);
    let o = run(&d.url("push"), "0");
    assert_ok(&o);
    let all = meta_bytes(&o);
    assert!(windowed * 4 < all, "source held {windowed} of {all} bytes");
}

/// Hard links inside the first window (the one sent before Confirm): a
/// no-change sync settles a group's first name as soon as it answers it,
/// and a second name sent as a HardLink by id came after its target's
/// slot was dropped: the sink aborted ('a link the window cannot
/// resolve'). In windows of three, local, pushed and pulled, twice.
#[test]
fn hard_links_in_the_first_window_of_a_no_change_sync() {
    const SMALL: &str = "3";
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    // The root and both names: ids 0-2, the whole first window.
    std::fs::write(src.join("f"), b"one file, two names\n").unwrap();
    std::fs::hard_link(src.join("f"), src.join("l")).unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = daemon(&root, &key, SMALL);
    let s = format!("{}/", src.display());
    let (back, local) = (t.path().join("back"), t.path().join("local"));
    let runs = [
        (s.clone(), d.url("push"), root.join("push")),
        (d.url("push/"), back.display().to_string(), back),
        (s, local.display().to_string(), local),
    ];
    for (from, to, at) in &runs {
        for _ in 0..2 {
            let o = sync(&key, SMALL, &[from, to]);
            assert_ok(&o);
            assert_same_tree(&src, at);
            let md = std::fs::metadata(at.join("l")).unwrap();
            assert_eq!(md.nlink(), 2, "{from} -> {to}");
        }
    }
}
