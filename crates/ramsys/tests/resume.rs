//! `cp --resume` (issue 9): a transfer killed midway (the sink daemon, or
//! the agent) and run again with the same arguments completes with a
//! byte-identical destination and sends less than a full copy. The sink is
//! slowed with RAMSYS_FAULT_SLOW_WRITE_US so the kill lands mid-transfer.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const TOTAL: u64 = 24 * (1 << 20) + 8 * (1 << 20);

fn make_src(src: &Path) {
    std::fs::create_dir_all(src.join("d")).unwrap();
    let mut rng = Rng(11);
    for i in 0..24 {
        std::fs::write(src.join(format!("d/f{i:02}")), rng.bytes(1 << 20)).unwrap();
    }
    std::fs::write(src.join("big"), rng.bytes(8 << 20)).unwrap();
}

fn slow_daemon(root: &Path, key: &Path) -> (std::process::Child, String) {
    let mut child = Command::new(bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--root"])
        .arg(root)
        .arg("--key-file")
        .arg(key)
        .env("RAMSYS_FAULT_SLOW_WRITE_US", "15000")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = listening_addr(&mut child);
    (child, addr)
}

/// Wait until a temp file is being written under `dir`, then a little
/// more. One, not two: in windows of one record (RAMSYS_WINDOW_FILES=1,
/// issue 36) the files go one at a time.
fn wait_for_parts(dir: &Path) {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(30) {
        if temp_files(dir)
            .iter()
            .any(|p| p.to_string_lossy().ends_with(".part"))
        {
            std::thread::sleep(Duration::from_millis(700));
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("transfer never started");
}

fn bytes_of(o: &std::process::Output) -> u64 {
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out.lines().rev().find(|l| l.contains("summary")).unwrap();
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    v["bytes"].as_u64().unwrap()
}

#[test]
fn resume_after_killing_the_sink_daemon() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    make_src(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let (mut daemon, addr) = slow_daemon(&root, &key);
    let url = format!("ramsys://{addr}/");
    let args = [
        "cp",
        "-r",
        "--resume",
        "--json",
        "--block-size",
        "64K",
        "--streams",
        "2",
        src.to_str().unwrap(),
        url.as_str(),
    ];
    let agent = Command::new(bin())
        .args(args)
        .env("RAMSYS_KEY_FILE", &key)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_parts(&root);
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let _ = run_with_timeout_child(agent);
    assert!(!temp_files(&root).is_empty(), "interrupted temp files kept");
    assert!(root.join(".ramsys-journal.sqlite").exists());

    // Same arguments, a healthy daemon on a new port.
    let d = TestDaemon::start(&root, &key);
    let url = d.url("");
    let mut again = args;
    again[9] = url.as_str();
    let o = ramsys(&key, &again);
    assert_ok(&o);
    let sent = bytes_of(&o);
    assert!(sent < TOTAL, "resume sent {sent} of {TOTAL}");
    assert_same_tree(&src, &root.join("src"));
    assert!(temp_files(&root).is_empty());
    assert!(!root.join(".ramsys-journal.sqlite").exists());
}

fn run_with_timeout_child(mut c: std::process::Child) -> Option<std::process::ExitStatus> {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(60) {
        if let Ok(Some(s)) = c.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = c.kill();
    c.wait().ok()
}

#[test]
fn resume_after_killing_the_agent_pull() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("root");
    make_src(&root.join("src"));
    let d = TestDaemon::start(&root, &key);
    let dst = t.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let url = d.url("src");
    let args = [
        "cp",
        "-r",
        "--resume",
        "--json",
        "--block-size",
        "64K",
        "--streams",
        "2",
        url.as_str(),
        dst.to_str().unwrap(),
    ];
    // The agent is the sink here: slow it, then kill it outright.
    let mut agent = Command::new(bin())
        .args(args)
        .env("RAMSYS_KEY_FILE", &key)
        .env("RAMSYS_FAULT_SLOW_WRITE_US", "15000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_parts(&dst);
    agent.kill().unwrap();
    agent.wait().unwrap();
    assert!(!temp_files(&dst).is_empty());

    let o = ramsys(&key, &args);
    assert_ok(&o);
    let sent = bytes_of(&o);
    assert!(sent < TOTAL, "resume sent {sent} of {TOTAL}");
    assert_same_tree(&root.join("src"), &dst.join("src"));
    assert!(temp_files(&dst).is_empty());
    assert!(!dst.join(".ramsys-journal.sqlite").exists());
}
