//! Daemon resource management and observability (issue 8; seed 000
//! sec. 6.1.3, 6.2.1, Fig. 6-6): concurrent sessions through one pair of
//! daemons, suspension and wake-up of a task, `ramsys status` and
//! `/metrics` during a transfer, and clean-up after a client vanishes.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use ramsys_engine::daemon::status::Status;
use ramsys_engine::daemon::TaskState;

/// A daemon with a metrics endpoint; killed on drop.
struct Mgd {
    child: Child,
    addr: String,
    metrics: String,
}

impl Mgd {
    fn start(root: &Path, key: &Path, extra: &[&str]) -> Mgd {
        let mut child = Command::new(bin())
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--metrics",
                "127.0.0.1:0",
                "--root",
            ])
            .arg(root)
            .arg("--key-file")
            .arg(key)
            .args(["--memory", "32M", "--max-block-size", "1M"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start daemon");
        let mut r = BufReader::new(child.stdout.take().unwrap());
        let mut line = |p: &str| {
            let mut l = String::new();
            r.read_line(&mut l).unwrap();
            l.trim()
                .strip_prefix(p)
                .unwrap_or_else(|| panic!("unexpected line {l:?}"))
                .to_string()
        };
        let addr = line("listening on ");
        let metrics = line("metrics on ");
        Mgd {
            child,
            addr,
            metrics,
        }
    }
    fn url(&self, p: &str) -> String {
        format!("ramsys://{}/{}", self.addr, p)
    }
    fn status(&self, key: &Path) -> Status {
        let o = ramsys(
            key,
            &["status", "--json", &format!("ramsys://{}", self.addr)],
        );
        assert_ok(&o);
        serde_json::from_slice(&o.stdout).expect("status --json parses")
    }
    fn metrics(&self) -> String {
        let mut c = TcpStream::connect(&self.metrics).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        let mut s = String::new();
        c.read_to_string(&mut s).unwrap();
        assert!(s.starts_with("HTTP/1.1 200 OK"), "{s}");
        s.split_once("\r\n\r\n").unwrap().1.to_string()
    }
    /// Poll status until `f` holds.
    fn wait_status(&self, key: &Path, what: &str, f: impl Fn(&Status) -> bool) -> Status {
        let t0 = Instant::now();
        loop {
            let s = self.status(key);
            if f(&s) {
                return s;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "timed out waiting for {what}: {s:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Mgd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Value of one sample line `name{labels} v` in a metrics text.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no series {series} in\n{text}"))
        .parse()
        .unwrap()
}

fn cp(key: &Path, args: &[&str]) -> Child {
    Command::new(bin())
        .arg("cp")
        .args(["--memory", "16M"])
        .args(args)
        .env("RAMSYS_KEY_FILE", key)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cp")
}

fn finish(c: Child) {
    let o = c.wait_with_output().unwrap();
    assert_ok(&o);
}

/// A file of `len` bytes (a multiple of 1 MiB) of non-zero data, so no
/// hole or zero-block shortcut makes its transfer instant.
fn big_file(p: &Path, len: u64) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(p).unwrap());
    let mut chunk = Rng(7).bytes(1 << 20);
    for i in 0..len >> 20 {
        chunk[..8].copy_from_slice(&i.to_le_bytes());
        f.write_all(&chunk).unwrap();
    }
}

/// Byte-compare two files in chunks (they may be large).
fn assert_same_file(a: &Path, b: &Path) {
    let (mut fa, mut fb) = (
        std::fs::File::open(a).unwrap(),
        std::fs::File::open(b).unwrap(),
    );
    assert_eq!(fa.metadata().unwrap().len(), fb.metadata().unwrap().len());
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = fa.read(&mut ba).unwrap();
        fb.read_exact(&mut bb[..n]).unwrap();
        assert!(
            ba[..n] == bb[..n],
            "{} and {} differ",
            a.display(),
            b.display()
        );
        if n == 0 {
            return;
        }
    }
}

fn tree(p: &Path, seed: u64, files: usize) {
    std::fs::create_dir_all(p.join("d")).unwrap();
    let mut r = Rng(seed);
    for i in 0..files {
        let n = (r.next() % 300_000) as usize;
        std::fs::write(
            p.join(if i % 2 == 0 { "d" } else { "" })
                .join(format!("f{i}")),
            r.bytes(n),
        )
        .unwrap();
    }
}

#[test]
fn eight_concurrent_transfers_from_three_agents_through_two_daemons() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let (r1, r2) = (t.path().join("r1"), t.path().join("r2"));
    std::fs::create_dir_all(&r1).unwrap();
    std::fs::create_dir_all(&r2).unwrap();
    // Small pools so tasks queue and share: 4 streams, 2 storage threads.
    let small = ["--max-streams", "4", "--readers", "2", "--writers", "2"];
    let d1 = Mgd::start(&r1, &key, &small);
    let d2 = Mgd::start(&r2, &key, &small);
    // Three agents (own working directories); 8 transfers: pushes to d1
    // and pulls from d2, all at once.
    let mut jobs: Vec<(PathBuf, PathBuf, Child)> = Vec::new();
    for i in 0..8u64 {
        let agent = t.path().join(format!("agent{}", i % 3));
        let name = format!("t{i}");
        if i % 2 == 0 {
            let src = agent.join(&name);
            tree(&src, i + 1, 6);
            let c = cp(
                &key,
                &[
                    "-r",
                    "--streams",
                    "3",
                    "--block-size",
                    "64K",
                    src.to_str().unwrap(),
                    &d1.url(""),
                ],
            );
            jobs.push((src, r1.join(&name), c));
        } else {
            let src = r2.join(&name);
            tree(&src, i + 1, 6);
            std::fs::create_dir_all(&agent).unwrap();
            let dst = agent.join(format!("{name}.copy"));
            let c = cp(
                &key,
                &[
                    "-r",
                    "--streams",
                    "3",
                    "--block-size",
                    "64K",
                    &d2.url(&name),
                    dst.to_str().unwrap(),
                ],
            );
            jobs.push((src, dst, c));
        }
    }
    for (src, dst, c) in jobs {
        finish(c);
        assert_same_tree(&src, &dst);
    }
    for d in [&d1, &d2] {
        let s = d.wait_status(&key, "idle", |s| s.idle());
        assert_eq!(s.totals.sessions, 4);
        assert_eq!(s.totals.tasks_failed, 0, "{s:?}");
        assert!(s.sessions.is_empty());
        // Every task went through the queue to exit, none over-reserved.
        assert_eq!(s.finished.len(), 4);
        assert!(s
            .finished
            .iter()
            .all(|k| k.state == TaskState::Exit && k.error.is_none()));
    }
    let m = d1.metrics();
    assert!(metric(&m, "ramsys_bytes_total{direction=\"in\"}") > 0.0);
    assert_eq!(metric(&m, "ramsys_tasks{state=\"transferring\"}"), 0.0);
}

#[test]
fn task_without_free_threads_is_suspended_then_completes() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    // One receiver thread: a second push finds the pool empty.
    let d = Mgd::start(&root, &key, &["--max-streams", "1", "--writers", "1"]);
    let big = t.path().join("big");
    big_file(&big, 600 << 20);
    let a = cp(
        &key,
        &[
            "--streams",
            "1",
            "--block-size",
            "64K",
            big.to_str().unwrap(),
            &d.url(""),
        ],
    );
    d.wait_status(&key, "first task transferring", |s| {
        s.tasks.iter().any(|k| k.state == TaskState::Transferring)
    });
    let small = t.path().join("small");
    tree(&small, 99, 4);
    // A connect timeout far below the time it stays suspended: its data
    // links wait for JoinOk as long as for Confirm (the idle timeout), not
    // the connect timeout (they used to fail with a bare EAGAIN).
    let b = cp(
        &key,
        &[
            "-r",
            "--connect-timeout",
            "1",
            "--streams",
            "2",
            "--block-size",
            "64K",
            small.to_str().unwrap(),
            &d.url(""),
        ],
    );
    let s = d.wait_status(&key, "second task suspended", |s| {
        s.tasks.iter().any(|k| k.state == TaskState::Suspended)
    });
    let m = d.metrics();
    assert_eq!(metric(&m, "ramsys_tasks{state=\"suspended\"}"), 1.0);
    assert!(s
        .tasks
        .iter()
        .any(|k| k.state == TaskState::Transferring && k.streams == 1));
    // The first task's exit wakes it; it gets the thread and finishes.
    finish(a);
    finish(b);
    assert_same_file(&big, &root.join("big"));
    assert_same_tree(&small, &root.join("small"));
    let s = d.wait_status(&key, "idle", |s| s.idle());
    assert!(
        s.totals.suspensions >= 1 && s.totals.retries >= 1,
        "{:?}",
        s.totals
    );
    assert_eq!(s.totals.tasks_failed, 0);
}

#[test]
fn status_and_metrics_during_transfer_and_cleanup_after_disconnect() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let d = Mgd::start(&root, &key, &[]);
    let big = t.path().join("big");
    big_file(&big, 1 << 30);
    let mut a = cp(
        &key,
        &[
            "--streams",
            "2",
            "--block-size",
            "64K",
            big.to_str().unwrap(),
            &d.url(""),
        ],
    );
    let s = d.wait_status(&key, "bytes moving", |s| {
        s.tasks
            .iter()
            .any(|k| k.state == TaskState::Transferring && k.bytes > 0)
    });
    let k = &s.tasks[0];
    assert_eq!((k.role.as_str(), k.streams, k.total_files), ("sink", 2, 1));
    assert_eq!(s.sessions.len(), 1);
    assert_eq!(s.sessions[0].tasks, vec![k.id]);
    assert!(s.pools.iter().any(|p| p.pool == "receivers" && p.busy == 2));
    assert_eq!(s.nics[0].nic, "lo");
    // The human form shows the same task.
    let o = ramsys(&key, &["status", &format!("ramsys://{}", d.addr)]);
    assert_ok(&o);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("transferring") && text.contains("receivers"),
        "{text}"
    );
    let m = d.metrics();
    assert_eq!(metric(&m, "ramsys_tasks{state=\"transferring\"}"), 1.0);
    assert_eq!(metric(&m, "ramsys_pool_busy{pool=\"receivers\"}"), 2.0);
    assert!(metric(&m, "ramsys_bytes_total{direction=\"in\"}") > 0.0);
    assert!(metric(&m, "ramsys_nic_bytes_total{nic=\"lo\",direction=\"in\"}") > 0.0);
    assert!(m.contains(&format!("ramsys_task_bytes{{task=\"{}\"", k.id)));

    // The client vanishes mid-task: everything it held comes back.
    a.kill().unwrap();
    a.wait().unwrap();
    let s = d.wait_status(&key, "idle after disconnect", |s| s.idle());
    assert!(s.sessions.is_empty());
    assert_eq!(s.totals.tasks_failed, 1);
    assert!(s.finished.last().unwrap().error.is_some());
    assert!(s.finished.last().unwrap().bytes < 1 << 30);
    let m = d.metrics();
    for p in ["readers", "writers", "senders", "receivers", "buffers"] {
        assert_eq!(
            metric(&m, &format!("ramsys_pool_busy{{pool=\"{p}\"}}")),
            0.0,
            "{p}"
        );
    }
    // What stays is what a later --resume continues from: the interrupted
    // large file's temp file and the journal (on by default, issue 15).
    for p in temp_files(&root) {
        let n = p.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            n.starts_with(".ramsys-journal.sqlite")
                || (n.starts_with(".big") && n.ends_with(".part")),
            "{n}"
        );
    }
}
