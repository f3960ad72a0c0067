//! Every failure a user can cause ends with a clear one-line message, a
//! non-zero exit, and nothing lost: the source untouched and no file under
//! its final name half-written.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

#[test]
fn missing_source_is_reported_and_the_rest_copied() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let ok = t.path().join("ok");
    std::fs::write(&ok, b"fine").unwrap();
    let into = t.path().join("into");
    std::fs::create_dir(&into).unwrap();
    let missing = t.path().join("missing");
    let o = ramsys(
        &key,
        &[
            "cp",
            missing.to_str().unwrap(),
            ok.to_str().unwrap(),
            into.to_str().unwrap(),
        ],
    );
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("missing") && e.contains("No such file"), "{e}");
    assert_eq!(std::fs::read(into.join("ok")).unwrap(), b"fine");
}

#[test]
fn unreadable_file_is_reported_and_the_rest_copied() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("good"), b"good").unwrap();
    let bad = src.join("bad");
    std::fs::write(&bad, b"secret").unwrap();
    std::fs::set_permissions(&bad, std::fs::Permissions::from_mode(0o000)).unwrap();
    // root reads anything; make the failure real by opening a directory
    // where a file is expected is not possible, so only check when not root.
    let is_root = unsafe { libc::geteuid() } == 0;
    let dst = t.path().join("dst");
    let o = ramsys(
        &key,
        &["cp", "-r", src.to_str().unwrap(), dst.to_str().unwrap()],
    );
    if is_root {
        assert!(o.status.success(), "{}", stderr(&o));
    } else {
        assert!(!o.status.success());
        assert!(stderr(&o).contains("bad"), "{}", stderr(&o));
        assert!(!dst.join("bad").exists());
    }
    assert_eq!(std::fs::read(dst.join("good")).unwrap(), b"good");
}

#[test]
fn directory_without_r_is_refused_cleanly() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("dir");
    std::fs::create_dir(&src).unwrap();
    let o = ramsys(
        &key,
        &[
            "cp",
            src.to_str().unwrap(),
            t.path().join("d2").to_str().unwrap(),
        ],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("use -r"), "{}", stderr(&o));
}

#[test]
fn wrong_key_fails_with_message_and_writes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let other = t.path().join("other-key");
    std::fs::write(&other, "ffffffffffffffffffffffffffffffff\n").unwrap();
    std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o600)).unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = TestDaemon::start(&root, &key);
    let f = t.path().join("f");
    std::fs::write(&f, b"x").unwrap();
    let o = ramsys(&other, &["cp", f.to_str().unwrap(), &d.url("f")]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("authentication failed"), "{e}");
    assert_eq!(e.trim().lines().count(), 1, "one line: {e}");
    assert!(std::fs::read_dir(&root).unwrap().next().is_none());
}

#[test]
fn unreachable_daemon_fails_fast() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    // A port nobody listens on: bind, note it, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let f = t.path().join("f");
    std::fs::write(&f, b"x").unwrap();
    let start = Instant::now();
    let o = ramsys(
        &key,
        &[
            "cp",
            f.to_str().unwrap(),
            &format!("ramsys://127.0.0.1:{port}/f"),
        ],
    );
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(!o.status.success());
    assert!(stderr(&o).contains("cannot connect"), "{}", stderr(&o));
}

#[test]
fn bad_flags_and_paths_are_clear() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let o = ramsys(&key, &["cp", "--block-size", "12Q", "a", "b"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("invalid size"), "{}", stderr(&o));
    // MB is 10^6 (issue 37's one rule): a block size that is not whole
    // 4 KiB pages is refused in one line naming the flag and the fix.
    for args in [
        &["cp", "--block-size", "4MB", "a", "b"][..],
        &["serve", "--max-block-size", "4MB"][..],
    ] {
        let o = ramsys(&key, args);
        assert!(!o.status.success());
        let e = stderr(&o);
        let line = e
            .lines()
            .find(|l| l.contains("not a multiple"))
            .unwrap_or("");
        assert!(line.contains(args[1]) && line.ends_with("use 4MiB"), "{e}");
    }
    let o = ramsys(&key, &["cp", "a", "ramsys://host-without-port/x"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("missing port"), "{}", stderr(&o));
    let o = ramsys(
        &key,
        &["cp", "x", t.path().join("no/such/dir/y").to_str().unwrap()],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("does not exist"), "{}", stderr(&o));
}

#[test]
fn destination_not_writable_is_reported() {
    if unsafe { libc::geteuid() } == 0 {
        // root writes anywhere; the read-only mount case covers this.
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let ro = t.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    let f = t.path().join("f");
    std::fs::write(&f, b"x").unwrap();
    let o = ramsys(&key, &["cp", f.to_str().unwrap(), ro.to_str().unwrap()]);
    assert!(!o.status.success());
}

#[test]
fn disk_full_on_sink_fails_cleanly() {
    let Some(fs) = SmallFs::mount("4m", "") else {
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let mut r = Rng(7);
    std::fs::write(src.join("big"), r.bytes(12 << 20)).unwrap();
    std::fs::write(src.join("small"), b"small").unwrap();
    let d = TestDaemon::start(fs.dir.path(), &key);
    let o = ramsys(
        &key,
        &[
            "cp",
            "-r",
            "--block-size",
            "256K",
            src.to_str().unwrap(),
            &d.url(""),
        ],
    );
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("disk full"), "{e}");
    assert!(
        !fs.dir.path().join("src/big").exists(),
        "no half-written final file"
    );
    // The sink's Abort stops the agent first; the daemon removes its temp
    // files right after (its writers joined): wait for that, briefly.
    let t0 = Instant::now();
    while !temp_files(fs.dir.path()).is_empty() && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let temps = temp_files(fs.dir.path());
    assert!(temps.is_empty(), "temp files removed: {temps:?}");
    // The source is untouched.
    assert_eq!(std::fs::metadata(src.join("big")).unwrap().len(), 12 << 20);
}

#[test]
fn read_only_destination_fails_cleanly() {
    let Some(fs) = SmallFs::mount("4m", ",ro") else {
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let f = t.path().join("f");
    std::fs::write(&f, b"data").unwrap();
    let o = ramsys(
        &key,
        &["cp", f.to_str().unwrap(), fs.dir.path().to_str().unwrap()],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("read-only"), "{}", stderr(&o));
}

#[test]
fn killing_the_sink_daemon_mid_transfer() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("big");
    let mut r = Rng(9);
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&src).unwrap();
        for _ in 0..48 {
            f.write_all(&r.bytes(8 << 20)).unwrap();
        }
    }
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let mut d = TestDaemon::start(&root, &key);
    // Small window and blocks so the transfer takes a while.
    let child = Command::new(bin())
        .args(["cp", "--block-size", "64K", "--streams", "1"])
        .arg(&src)
        .arg(d.url("big"))
        .env("RAMSYS_KEY_FILE", &key)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until data is landing, then kill the daemon.
    let start = Instant::now();
    while temp_files(&root).is_empty() && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    d.kill();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        eprintln!("note: copy finished before the kill landed");
        // The copy finished before the kill landed: then it must be whole.
        assert_eq!(
            std::fs::read(root.join("big")).unwrap(),
            std::fs::read(&src).unwrap()
        );
        return;
    }
    let e = String::from_utf8_lossy(&out.stderr);
    eprintln!("agent said: {e}");
    assert!(e.contains("ramsys: error"), "{e}");
    assert_eq!(e.trim().lines().count(), 1, "one line: {e}");
    assert!(!root.join("big").exists(), "no final-named partial file");
    assert_eq!(std::fs::metadata(&src).unwrap().len(), 48 * (8 << 20));
}

/// An unreadable source directory stops `--delete` (rsync: "IO error
/// encountered -- skipping file deletion"), locally, pushed and pulled:
/// ramsys deleted the directory's copy at DST, because the sink never
/// heard of the source's failure. The run fails, names the directory,
/// and DST keeps everything, extras included. Root cannot be refused a
/// read, so the reading end runs as nobody (setpriv).
#[test]
fn an_unreadable_source_directory_stops_delete() {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 || Command::new("setpriv").arg("--help").output().is_err() {
        eprintln!("skipping: needs root and setpriv");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let w = t.path();
    let open = |p: &std::path::Path, m| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
    };
    open(w, 0o755);
    let key = key_file(w);
    // The same key, private to nobody (a key others can read is refused).
    let ukey = w.join("nobody.key");
    std::fs::copy(&key, &ukey).unwrap();
    std::os::unix::fs::chown(&ukey, Some(65534), Some(65534)).unwrap();
    let exe = w.join("ramsys");
    std::fs::copy(bin(), &exe).unwrap();
    open(&exe, 0o755);
    let nobody = |args: &[&str]| {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&exe)
            .args(args)
            .env("RAMSYS_KEY_FILE", &ukey);
        c
    };
    let src = w.join("src");
    for (p, d) in [("a/f", "one\n"), ("b/g", "two\n")] {
        std::fs::create_dir_all(src.join(p).parent().unwrap()).unwrap();
        std::fs::write(src.join(p), d).unwrap();
    }
    let root = w.join("root");
    std::fs::create_dir(&root).unwrap();
    let dsts = [w.join("local"), root.join("pushed"), w.join("pulled")];
    for d in &dsts {
        assert_ok(&ramsys(
            &key,
            &[
                "sync",
                "-r",
                &format!("{}/", src.display()),
                d.to_str().unwrap(),
            ],
        ));
        std::fs::write(d.join("extra"), "only at DST\n").unwrap();
    }
    for p in [&src, &src.join("a"), &dsts[0]] {
        open(p, 0o777);
    }
    open(&src.join("a/f"), 0o644);
    open(&src.join("b"), 0o000);
    let daemon = TestDaemon::start(&root, &key);
    let puller = TestDaemon::spawn(
        {
            let mut c = nobody(&["serve", "--listen", "127.0.0.1:0", "--root"]);
            c.arg(&src).arg("--key-file").arg(&ukey);
            c.stdout(Stdio::piped()).stderr(Stdio::inherit());
            c
        },
        &src,
    );
    let s = format!("{}/", src.display());
    let runs = [
        run_with_timeout(
            nobody(&[
                "sync",
                "-r",
                "--delete",
                "--json",
                &s,
                dsts[0].to_str().unwrap(),
            ]),
            Duration::from_secs(60),
        ),
        run_with_timeout(
            nobody(&[
                "sync",
                "-r",
                "--delete",
                "--json",
                &s,
                &daemon.url("pushed"),
            ]),
            Duration::from_secs(60),
        ),
        ramsys(
            &key,
            &[
                "sync",
                "-r",
                "--delete",
                "--json",
                &puller.url(""),
                dsts[2].to_str().unwrap(),
            ],
        ),
    ];
    open(&src.join("b"), 0o755);
    for (o, d) in runs.iter().zip(&dsts) {
        let what = d.display();
        assert!(!o.status.success(), "{what}: must fail: {}", stderr(o));
        let s = summary(o);
        assert_eq!(s["deletions_skipped"], true, "{what}: {s}");
        assert_eq!(s["deleted"], 0, "{what}: {s}");
        assert!(
            s["failed"].to_string().contains("cannot read directory"),
            "{what}: {s}"
        );
        assert_eq!(std::fs::read(d.join("b/g")).unwrap(), b"two\n", "{what}");
        assert_eq!(
            std::fs::read(d.join("extra")).unwrap(),
            b"only at DST\n",
            "{what}"
        );
    }
}

/// No fixed timeout a big tree can outgrow (issue 36): a source whose
/// directory pass takes longer than the daemon's idle timeout (a cold or
/// remote file system, injected: 300 ms per directory, 24 directories,
/// against `--timeout 3`) says it is still scanning, and the push
/// succeeds; a source silent for longer than that timeout (one directory
/// that takes 6 s) is given up on with one line naming what the sink
/// waited for.
#[test]
fn a_slow_scan_outlives_the_idle_timeout_and_a_silent_one_is_named() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    for d in 0..24 {
        let dir = src.join(format!("d{d:02}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("f"), format!("file {d}")).unwrap();
    }
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = TestDaemon::start_with(&root, &key, &["--timeout", "3"]);
    let push = |slow_ms: &str, dst: &str| {
        let mut c = Command::new(bin());
        c.args(["cp", "-r", "--key-file"])
            .arg(&key)
            .arg(&src)
            .arg(d.url(dst))
            .env("RAMSYS_FAULT_SLOW_SCAN_MS", slow_ms)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        run_with_timeout(c, Duration::from_secs(60))
    };
    let t0 = Instant::now();
    let o = push("300", "slow");
    assert_ok(&o);
    assert!(t0.elapsed() > Duration::from_secs(5), "the scan was slow");
    assert_same_tree(&src, &root.join("slow"));

    // One directory of 6 s: nothing said for twice the timeout.
    let src1 = t.path().join("one");
    std::fs::create_dir_all(src1.join("d")).unwrap();
    std::fs::write(src1.join("d/f"), b"x").unwrap();
    let mut c = Command::new(bin());
    c.args(["cp", "-r", "--key-file"])
        .arg(&key)
        .arg(src1.join("d"))
        .arg(d.url("silent"))
        .env("RAMSYS_FAULT_SLOW_SCAN_MS", "6000")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let o = run_with_timeout(c, Duration::from_secs(60));
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("no word from the source") && e.contains("file list"),
        "{e}"
    );
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(!root.join("silent/f").exists());
}

/// A daemon bounds the memory one session may hold for its file list
/// (issue 36, `serve --session-memory`; docs/SCALE.md "Bounds and
/// reports"), 3,000 files against a budget of 128 KiB (about 600 files'
/// slots and names): a windowed push slows down to windows the budget holds
/// (Control::Window) and completes; a whole-tree session (an agent that
/// proposes no windows, as one of before) ends
/// with one line naming the budget and nothing under a final name
/// half-written; a small tree passes, and its JSON summary and the daemon's
/// status report the memory (peak RSS, the accounted file list).
#[test]
fn a_session_past_its_memory_budget_ends_in_one_line() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let big = t.path().join("big");
    for i in 0..3000 {
        let d = big.join(format!("d{}", i / 500));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("f{i}")), format!("{i}")).unwrap();
    }
    let small = t.path().join("small");
    std::fs::create_dir_all(&small).unwrap();
    for i in 0..50 {
        std::fs::write(small.join(format!("f{i}")), format!("{i}")).unwrap();
    }
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = TestDaemon::start_with(&root, &key, &["--session-memory", "128K"]);
    let o = ramsys(
        &key,
        &["cp", "-r", big.to_str().unwrap(), &d.url("windowed")],
    );
    assert_ok(&o);
    assert_same_tree(&big, &root.join("windowed"));
    let mut whole = std::process::Command::new(bin());
    whole
        .args(["cp", "-r", big.to_str().unwrap(), &d.url("big")])
        .env("RAMSYS_KEY_FILE", &key)
        .env("RAMSYS_WINDOW_FILES", "0");
    let o = run_with_timeout(whole, std::time::Duration::from_secs(60));
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("memory budget per session"), "{e}");
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    // The journal may stay (it says how a retry reads DST: issue 35).
    let temps = temp_files(&root);
    assert!(
        temps.iter().all(|p| p.ends_with(".ramsys-journal.sqlite")),
        "{temps:?}"
    );
    for p in walk_paths(&root.join("big")) {
        if p.is_file() {
            let n: usize = p.file_name().unwrap().to_str().unwrap()[1..]
                .parse()
                .unwrap();
            assert_eq!(std::fs::read(&p).unwrap(), n.to_string().as_bytes());
        }
    }

    let o = ramsys(
        &key,
        &[
            "cp",
            "-r",
            "--json",
            small.to_str().unwrap(),
            &d.url("small"),
        ],
    );
    assert_ok(&o);
    let s = summary(&o);
    assert!(s["peak_rss_bytes"].as_u64().unwrap() > 1 << 20, "{s}");
    assert!(s["meta_bytes"].as_u64().unwrap() > 50 * 8, "{s}");
    assert!(s["rss_bytes_per_file"].as_u64().unwrap() > 0, "{s}");
    assert_same_tree(&small, &root.join("small"));
    let st = ramsys(&key, &["status", "--json", &format!("ramsys://{}", d.addr)]);
    assert_ok(&st);
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(v["memory"]["session_budget_bytes"], 128 << 10, "{v}");
    assert!(v["memory"]["peak_rss_bytes"].as_u64().unwrap() > 0, "{v}");
    let done = v["finished"].as_array().unwrap();
    assert!(
        done.iter()
            .any(|t| t["meta_bytes"].as_u64().unwrap_or(0) > 0),
        "{v}"
    );
}

/// A `--files-from` list sent ahead of a pull's request counts against the
/// daemon's memory budget per session (issue 36): a user cannot grow a
/// daemon with an endless list. 20,000 paths of 100 bytes (2 MB) against a
/// budget of 1 MiB: one line naming the budget, nothing copied.
#[test]
fn a_files_from_list_past_the_memory_budget_is_refused_in_one_line() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(root.join("src/f"), b"x").unwrap();
    let list = t.path().join("list");
    let line = format!("{}\n", "n".repeat(100));
    std::fs::write(&list, line.repeat(20_000)).unwrap();
    let d = TestDaemon::start_with(&root, &key, &["--session-memory", "1MiB"]);
    let dst = t.path().join("dst");
    let o = ramsys(
        &key,
        &[
            "cp",
            "--files-from",
            list.to_str().unwrap(),
            &format!("{}/", d.url("src")),
            dst.to_str().unwrap(),
        ],
    );
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("--files-from list") && e.contains("memory budget per session"),
        "{e}"
    );
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(!dst.join("f").exists());
}
