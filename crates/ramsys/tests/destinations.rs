//! Destinations that mean the same thing on every run (issue 15): `sync`
//! follows rsync's trailing-slash rule and converges when run again, for
//! local, daemon-push and daemon-pull endpoints (ssh: tests/ssh.rs);
//! `cp --resume` into a destination that did not exist continues the
//! interrupted copy in place; a missing destination directory is one line
//! before any data moves.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Local,
    Push,
    Pull,
}

fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// rsync's own verdict, where rsync is installed: nothing to itemize.
fn rsync_agrees(src: &Path, copy: &Path) {
    let Ok(o) = Command::new("rsync")
        .args(["-rlptn", "--checksum", "--delete", "--itemize-changes"])
        .arg(format!("{}/", src.display()))
        .arg(format!("{}/", copy.display()))
        .output()
    else {
        eprintln!("rsync not installed: comparison by tree snapshot only");
        return;
    };
    assert!(o.status.success(), "rsync: {o:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.trim().is_empty(), "rsync would change: {out}");
}

/// `sync` three times into a destination that does not exist, one file
/// changed between runs 2 and 3: one copy, identical, and run 2 moves no
/// file data.
fn sync_three_times(kind: Kind, slash: bool) {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = TestDaemon::start(&root, &key);
    let out = t.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let (src, from, to, dst): (PathBuf, String, String, PathBuf) = match kind {
        Kind::Local => {
            let src = t.path().join("src");
            let dst = out.join("x");
            (
                src.clone(),
                src.display().to_string(),
                dst.display().to_string(),
                dst,
            )
        }
        Kind::Push => {
            let src = t.path().join("src");
            (
                src.clone(),
                src.display().to_string(),
                d.url("x"),
                root.join("x"),
            )
        }
        Kind::Pull => {
            let src = root.join("src");
            let dst = out.join("x");
            (src, d.url("src"), dst.display().to_string(), dst)
        }
    };
    make_varied_tree(&src, 4096);
    let from = if slash { format!("{from}/") } else { from };
    let copy = if slash { dst.clone() } else { dst.join("src") };
    let what = format!("{kind:?}, slash {slash}");
    let run = || {
        let o = ramsys(&key, &["sync", "-r", "--json", &from, &to]);
        assert_ok(&o);
        summary(&o)
    };
    run();
    let second = run();
    assert_eq!(second["bytes"], 0, "{what}: run 2 moved data: {second}");
    assert_eq!(second["files"], 0, "{what}: run 2 moved files: {second}");
    if !slash {
        assert_eq!(names(&dst), BTreeSet::from(["src".into()]), "{what}");
    }
    assert_same_tree(&src, &copy);
    // One file changes between runs 2 and 3.
    let f = src.join("changed");
    std::fs::write(&f, b"version 3").unwrap();
    set_mtime(&f, 1_700_000_000, 7);
    let third = run();
    assert_eq!(third["files"], 1, "{what}: {third}");
    assert_same_tree(&src, &copy);
    rsync_agrees(&src, &copy);
    if !slash {
        assert_eq!(names(&dst), BTreeSet::from(["src".into()]), "{what}");
    }
    assert!(temp_files(&root).is_empty() && temp_files(&out).is_empty());
}

#[test]
fn sync_converges_locally() {
    sync_three_times(Kind::Local, false);
    sync_three_times(Kind::Local, true);
}

#[test]
fn sync_converges_pushing_to_a_daemon() {
    sync_three_times(Kind::Push, false);
    sync_three_times(Kind::Push, true);
}

#[test]
fn sync_converges_pulling_from_a_daemon() {
    sync_three_times(Kind::Pull, false);
    sync_three_times(Kind::Pull, true);
}

#[test]
fn sync_of_several_sources_and_of_a_daemon_root() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir_all(root.join("a")).unwrap();
    std::fs::write(root.join("a/f"), b"f").unwrap();
    std::fs::write(root.join("g"), b"g").unwrap();
    let d = TestDaemon::start(&root, &key);
    let out = t.path().join("out");
    std::fs::create_dir(&out).unwrap();
    // Two local sources, DST missing: created, each source inside it.
    let x = out.join("x");
    for _ in 0..2 {
        let a = root.join("a");
        let g = root.join("g");
        let o = ramsys(
            &key,
            &[
                "sync",
                "-r",
                a.to_str().unwrap(),
                g.to_str().unwrap(),
                x.to_str().unwrap(),
            ],
        );
        assert_ok(&o);
        assert_eq!(names(&x), BTreeSet::from(["a".into(), "g".into()]));
    }
    // The daemon's root with a slash: its contents, not its name.
    let y = out.join("y");
    for _ in 0..2 {
        let o = ramsys(&key, &["sync", "-r", &d.url(""), y.to_str().unwrap()]);
        assert_ok(&o);
        assert_eq!(names(&y), BTreeSet::from(["a".into(), "g".into()]));
    }
    // One file onto a missing DST becomes DST, as with rsync; again: same.
    let z = out.join("z");
    for _ in 0..2 {
        let g = root.join("g");
        assert_ok(&ramsys(
            &key,
            &["sync", g.to_str().unwrap(), z.to_str().unwrap()],
        ));
        assert_eq!(std::fs::read(&z).unwrap(), b"g");
    }
}

#[test]
fn cp_keeps_cp_semantics() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("a"), b"a").unwrap();
    let x = t.path().join("x");
    let (s, d) = (src.to_str().unwrap(), x.to_str().unwrap());
    assert_ok(&ramsys(&key, &["cp", "-r", s, d]));
    assert_eq!(names(&x), BTreeSet::from(["a".into()]));
    // cp -r SRC DST with DST a directory now: inside it, as cp does.
    assert_ok(&ramsys(&key, &["cp", "-r", s, d]));
    assert_eq!(names(&x), BTreeSet::from(["a".into(), "src".into()]));
    // A trailing slash changes nothing for cp.
    let y = t.path().join("y");
    let s2 = format!("{s}/");
    assert_ok(&ramsys(&key, &["cp", "-r", &s2, y.to_str().unwrap()]));
    assert_eq!(names(&y), BTreeSet::from(["a".into()]));
}

#[test]
fn a_missing_destination_directory_is_one_line_before_any_data() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for i in 0..200 {
        std::fs::write(src.join(format!("f{i}")), b"x").unwrap();
    }
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = TestDaemon::start(&root, &key);
    let local = t.path().join("nope/x");
    for cmd in ["cp", "sync"] {
        for dst in [d.url("etc/x"), local.display().to_string()] {
            let o = ramsys(&key, &[cmd, "-r", src.to_str().unwrap(), &dst]);
            assert!(!o.status.success(), "{cmd} {dst}");
            let e = stderr(&o);
            let lines: Vec<&str> = e.lines().filter(|l| !l.trim().is_empty()).collect();
            assert_eq!(lines.len(), 1, "{cmd} {dst}: {e}");
            assert!(lines[0].contains("does not exist"), "{cmd} {dst}: {e}");
            assert!(lines[0].contains("etc") || lines[0].contains("nope"), "{e}");
        }
    }
    assert!(names(&root).is_empty());
}

/// Interrupted copies here must land mid-transfer: the sink writes slowly.
const SLOW: (&str, &str) = ("RAMSYS_FAULT_SLOW_WRITE_US", "15000");
const TOTAL: u64 = 16 * (1 << 20) + 8 * (1 << 20);

fn make_src(src: &Path) {
    std::fs::create_dir_all(src.join("d")).unwrap();
    let mut rng = Rng(5);
    for i in 0..16 {
        std::fs::write(src.join(format!("d/f{i:02}")), rng.bytes(1 << 20)).unwrap();
    }
    std::fs::write(src.join("big"), rng.bytes(8 << 20)).unwrap();
}

/// Until a file is being written, then a little longer. One part, not
/// two: in windows of one record (RAMSYS_WINDOW_FILES=1, issue 36) the
/// files go one at a time.
fn wait_for_parts(dir: &Path) {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(30) {
        if temp_files(dir)
            .iter()
            .any(|p| p.to_string_lossy().ends_with(".part"))
        {
            std::thread::sleep(Duration::from_millis(600));
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("transfer never started");
}

/// `cp -r [--resume] SRC DST`, DST missing, killed mid-transfer, then the
/// same command with `--resume`: one copy at DST, less than all re-sent,
/// nothing left behind. `first_resume`: whether the interrupted run had
/// `--resume` (without it, the default journal must still allow it; the
/// test lowers its size threshold to the test's file sizes).
fn resume_into_new_destination(pull: bool, first_resume: bool) {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let out = t.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let src = if pull {
        root.join("src")
    } else {
        t.path().join("src")
    };
    make_src(&src);
    let sink_env: Vec<(&str, &str)> = vec![SLOW, ("RAMSYS_JOURNAL_MIN", "1M")];
    let mut d = {
        let mut c = Command::new(bin());
        c.args(["serve", "--listen", "127.0.0.1:0", "--root"])
            .arg(&root)
            .arg("--key-file")
            .arg(&key)
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if !pull {
            c.envs(sink_env.iter().copied());
        }
        TestDaemon::spawn(c, &root)
    };
    let (from, to, dst, watch) = if pull {
        let dst = out.join("x");
        (d.url("src"), dst.display().to_string(), dst, out.clone())
    } else {
        (
            src.display().to_string(),
            d.url("x"),
            root.join("x"),
            root.clone(),
        )
    };
    let mut args = vec![
        "cp",
        "-r",
        "--json",
        "--block-size",
        "64K",
        "--streams",
        "2",
    ];
    if first_resume {
        args.push("--resume");
    }
    let mut c = Command::new(bin());
    c.args(&args)
        .args([&from, &to])
        .env("RAMSYS_KEY_FILE", &key)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if pull {
        c.envs(sink_env.iter().copied());
    }
    let mut agent = c.spawn().unwrap();
    wait_for_parts(&watch);
    if pull {
        agent.kill().unwrap();
        agent.wait().unwrap();
    } else {
        d.kill();
        let _ = agent.wait();
        d = TestDaemon::start(&root, &key);
    }
    assert!(
        !temp_files(&watch).is_empty(),
        "interrupted temp files kept"
    );
    let to = if pull { to } else { d.url("x") };
    let mut again: Vec<&str> = vec!["cp", "-r", "--json", "--block-size", "64K", "--resume"];
    again.extend([from.as_str(), to.as_str()]);
    let o = ramsys(&key, &again);
    assert_ok(&o);
    let sent = summary(&o)["bytes"].as_u64().unwrap();
    assert!(sent < TOTAL, "retry sent {sent} of {TOTAL}");
    // One copy, where an uninterrupted run puts it: DST is the copy.
    assert_same_tree(&src, &dst);
    assert!(temp_files(&watch).is_empty(), "{:?}", temp_files(&watch));
    // Once more: nothing moves, nothing nests.
    let o = ramsys(&key, &again);
    assert_ok(&o);
    assert_eq!(summary(&o)["bytes"], 0);
    assert_same_tree(&src, &dst);
    assert!(temp_files(&watch).is_empty(), "{:?}", temp_files(&watch));
}

#[test]
fn cp_resume_continues_a_push_to_a_new_destination() {
    resume_into_new_destination(false, true);
}

#[test]
fn cp_resume_continues_a_pull_to_a_new_destination() {
    resume_into_new_destination(true, true);
}

#[test]
fn cp_resume_continues_a_copy_that_ran_without_it() {
    resume_into_new_destination(false, false);
}

#[test]
fn a_directory_onto_a_file_is_one_line_and_the_file_stays() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("a"), b"a").unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("f"), b"keep").unwrap();
    let d = TestDaemon::start(&root, &key);
    let local = root.join("f");
    for cmd in ["cp", "sync"] {
        for dst in [d.url("f"), local.display().to_string()] {
            let o = ramsys(&key, &[cmd, "-r", src.to_str().unwrap(), &dst]);
            assert!(!o.status.success(), "{cmd} {dst}");
            let e = stderr(&o);
            let lines: Vec<&str> = e.lines().filter(|l| !l.trim().is_empty()).collect();
            assert_eq!(lines.len(), 1, "{cmd} {dst}: {e}");
            assert!(lines[0].contains("exists and is not a directory"), "{e}");
            assert_eq!(std::fs::read(&local).unwrap(), b"keep");
        }
    }
}
