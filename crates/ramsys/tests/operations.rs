//! What an operator runs a daemon with (issue 20): `--bwlimit` holds its
//! rate through a real daemon (the one timing test: it checks a promised
//! rate), rate limits show in status and metrics, SIGHUP reloads the users
//! table under a running transfer (a broken file keeps the old one), and
//! SIGTERM drains: running sessions finish, new ones are refused, and a
//! session still running when the grace period ends is stopped so that
//! `--resume` continues it.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A daemon whose stderr goes to a file (to check its log lines) and
/// whose stdout lines after "listening on" are read (metrics address).
struct Serve {
    child: Child,
    addr: String,
    metrics: Option<String>,
    log: PathBuf,
}

impl Serve {
    fn start(dir: &Path, args: &[&str]) -> Serve {
        let log = dir.join(format!("serve-{}.log", rand_tag()));
        let mut child = Command::new(bin())
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start daemon");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        let mut metrics = None;
        if args.contains(&"--metrics") {
            line.clear();
            out.read_line(&mut line).unwrap();
            metrics = line.trim().strip_prefix("metrics on ").map(String::from);
        }
        Serve {
            child,
            addr,
            metrics,
            log,
        }
    }

    fn url(&self, p: &str) -> String {
        format!("ramsys://{}/{p}", self.addr)
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: a child we started and have not reaped.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn metrics(&self) -> String {
        let mut c = std::net::TcpStream::connect(self.metrics.as_ref().unwrap()).unwrap();
        c.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut s = String::new();
        c.read_to_string(&mut s).unwrap();
        s
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rand_tag() -> u64 {
    let mut b = [0u8; 8];
    getrandom::getrandom(&mut b).unwrap();
    u64::from_le_bytes(b)
}

/// A file of `mib` MiB of non-zero, non-repeating-per-block bytes (no
/// holes for the source to skip).
fn data_file(p: &Path, mib: usize) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(p).unwrap());
    let mut r = Rng(0x5eed ^ mib as u64);
    for _ in 0..mib {
        f.write_all(&r.bytes(1 << 20)).unwrap();
    }
    f.flush().unwrap();
}

fn write_key(p: &Path, text: &str) -> PathBuf {
    std::fs::write(p, format!("{text}\n")).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p.to_path_buf()
}

/// `ramsys ARGS` as `user` with `key`, started in the background.
fn spawn_as(user: &str, key: &Path, args: &[&str]) -> Child {
    Command::new(bin())
        .args(args)
        .env("RAMSYS_KEY_FILE", key)
        .env("RAMSYS_USER", user)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn as_user(user: &str, key: &Path, args: &[&str]) -> Output {
    let mut c = Command::new(bin());
    c.args(args)
        .env("RAMSYS_KEY_FILE", key)
        .env("RAMSYS_USER", user);
    run_with_timeout(c, Duration::from_secs(120))
}

fn wait_output(c: Child, limit: Duration) -> Output {
    let start = Instant::now();
    let mut c = c;
    while c.try_wait().unwrap().is_none() {
        assert!(
            start.elapsed() < limit,
            "transfer still running after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    c.wait_with_output().unwrap()
}

/// Wait until the daemon shows a session in `ramsys status`.
fn wait_for_session(d: &Serve, user: &str, key: &Path) {
    let start = Instant::now();
    loop {
        let o = as_user(user, key, &["status", "--json", &d.addr]);
        let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        if j["sessions"].as_array().is_some_and(|s| !s.is_empty()) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no session appeared"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The one timing test: a pull of 200 MiB from a daemon with
/// `--bwlimit 20M` (20 MiB/s, applied by the daemon's senders across all
/// streams) takes 10 s within 10 %; meanwhile the limit shows in
/// `/metrics` and `ramsys status`.
#[test]
fn bwlimit_holds_its_rate_through_a_daemon() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    data_file(&root.join("big"), 200);
    let d = Serve::start(
        t.path(),
        &[
            "--root",
            root.to_str().unwrap(),
            "--key-file",
            key.to_str().unwrap(),
            "--metrics",
            "127.0.0.1:0",
            "--max-rate",
            "1G",
        ],
    );
    let dst = t.path().join("copy");
    let start = Instant::now();
    let agent = spawn_as(
        "me",
        &key,
        &[
            "cp",
            "--bwlimit",
            "20M",
            "--streams",
            "4",
            &d.url("big"),
            dst.to_str().unwrap(),
        ],
    );
    wait_for_session(&d, "me", &key);
    std::thread::sleep(Duration::from_millis(500));
    let m = d.metrics();
    assert!(
        m.lines().any(
            |l| l.starts_with("ramsys_rate_limit_bytes_per_second{scope=\"session\"")
                && l.ends_with(" 20971520")
        ),
        "{m}"
    );
    assert!(
        m.contains("ramsys_rate_limit_bytes_per_second{scope=\"daemon\",name=\"\"} 1073741824"),
        "{m}"
    );
    let st = as_user("me", &key, &["status", &d.addr]);
    let st = String::from_utf8_lossy(&st.stdout).into_owned();
    assert!(
        st.contains("RATE LIMIT") && st.contains("20.0 MiB/s"),
        "{st}"
    );
    let o = wait_output(agent, Duration::from_secs(60));
    let secs = start.elapsed().as_secs_f64();
    assert_ok(&o);
    assert_eq!(std::fs::metadata(&dst).unwrap().len(), 200 << 20);
    assert!(
        std::fs::read(&dst).unwrap() == std::fs::read(root.join("big")).unwrap(),
        "copy differs"
    );
    let rate = 200.0 / secs;
    println!("200 MiB with --bwlimit 20M: {secs:.2} s = {rate:.2} MiB/s");
    assert!(
        (9.0..=11.0).contains(&secs),
        "{secs:.2} s for 10 s of data ({rate:.2} MiB/s)"
    );
}

/// Bad rates are one line before anything runs.
#[test]
fn a_bad_rate_is_refused_in_one_line() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let o = ramsys(&key, &["cp", "--bwlimit", "fast", "a", "b"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("invalid rate"), "{}", stderr(&o));
    let cfg = t.path().join("c.toml");
    std::fs::write(&cfg, "max_rate = \"20Q\"\n").unwrap();
    let o = ramsys(
        &key,
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--root",
            t.path().to_str().unwrap(),
            "--config",
            cfg.to_str().unwrap(),
        ],
    );
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("max_rate") && e.lines().count() == 1, "{e}");
}

struct Site {
    t: tempfile::TempDir,
    users: PathBuf,
    ka: PathBuf,
    kb: PathBuf,
    a: PathBuf,
    b: PathBuf,
}

const ALICE: &str = "[[user]]\nname = \"alice\"\nkey_file = \"keys/alice\"\nroot = \"a\"\n";
const BOB: &str = "[[user]]\nname = \"bob\"\nkey_file = \"keys/bob\"\nroot = \"b\"\n";

fn site() -> Site {
    let t = tempfile::tempdir().unwrap();
    let p = t.path();
    for d in ["a", "b", "keys"] {
        std::fs::create_dir(p.join(d)).unwrap();
    }
    let ka = write_key(&p.join("keys/alice"), "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    let kb = write_key(&p.join("keys/bob"), "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb");
    let users = p.join("users.toml");
    std::fs::write(&users, ALICE).unwrap();
    Site {
        a: p.join("a"),
        b: p.join("b"),
        users,
        ka,
        kb,
        t,
    }
}

/// SIGHUP while alice's transfer runs: bob is added, the transfer
/// finishes intact, bob can then connect; a broken file on the next
/// SIGHUP keeps the table (one log line) and both still work.
#[test]
fn sighup_reloads_users_under_a_running_transfer() {
    let s = site();
    let cfg = s.t.path().join("serve.toml");
    std::fs::write(&cfg, "max_rate = \"1G\"\n").unwrap();
    let d = Serve::start(
        s.t.path(),
        &[
            "--users",
            s.users.to_str().unwrap(),
            "--config",
            cfg.to_str().unwrap(),
        ],
    );
    let src = s.t.path().join("src");
    data_file(&src, 24);
    // 24 MiB at 8 MiB/s: about 3 s, long enough to reload under it.
    let agent = spawn_as(
        "alice",
        &s.ka,
        &[
            "cp",
            "--bwlimit",
            "8M",
            src.to_str().unwrap(),
            &d.url("big"),
        ],
    );
    wait_for_session(&d, "alice", &s.ka);
    // Bob is refused before the reload...
    let fb = s.t.path().join("fb");
    std::fs::write(&fb, "bob's").unwrap();
    let o = as_user("bob", &s.kb, &["cp", fb.to_str().unwrap(), &d.url("x")]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("authentication failed"),
        "{}",
        stderr(&o)
    );
    std::fs::write(&s.users, format!("{ALICE}\n{BOB}max_rate = \"3M\"\n")).unwrap();
    std::fs::write(&cfg, "max_rate = \"2G\"\n").unwrap();
    d.signal(libc::SIGHUP);
    // ...and accepted after it, while alice's transfer still runs.
    let start = Instant::now();
    loop {
        let o = as_user("bob", &s.kb, &["cp", fb.to_str().unwrap(), &d.url("x")]);
        if o.status.success() {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{}", stderr(&o));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(std::fs::read(s.b.join("x")).unwrap(), b"bob's");
    // The new limits show: the daemon's from the config, bob's own.
    let o = as_user("bob", &s.kb, &["status", "--json", &d.addr]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rates: Vec<(String, String, u64)> = j["rates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["scope"].as_str().unwrap().to_string(),
                r["name"].as_str().unwrap().to_string(),
                r["bytes_per_s"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rates,
        vec![
            ("daemon".into(), "".into(), 2 << 30),
            ("user".into(), "bob".into(), 3 << 20)
        ]
    );
    let o = wait_output(agent, Duration::from_secs(60));
    assert_ok(&o);
    assert!(std::fs::read(s.a.join("big")).unwrap() == std::fs::read(&src).unwrap());
    assert!(d.log().contains("reloaded: 2 users"), "{}", d.log());

    // A broken file: the old table stays, one line says why.
    std::fs::write(&s.users, "[[user]]\nname = \"carol\"\nroot = \"a\"\n").unwrap();
    d.signal(libc::SIGHUP);
    let start = Instant::now();
    while !d.log().contains("reload failed") {
        assert!(start.elapsed() < Duration::from_secs(10), "{}", d.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let line: Vec<_> = d
        .log()
        .lines()
        .filter(|l| l.contains("reload failed"))
        .map(String::from)
        .collect();
    assert_eq!(line.len(), 1, "{line:?}");
    assert!(line[0].contains("key_file"), "{}", line[0]);
    assert_ok(&as_user(
        "bob",
        &s.kb,
        &["cp", fb.to_str().unwrap(), &d.url("y")],
    ));
    assert_ok(&as_user(
        "alice",
        &s.ka,
        &["cp", fb.to_str().unwrap(), &d.url("y")],
    ));
}

/// SIGTERM during a transfer: it completes (within the grace period), a
/// new session is refused with a clear message, then the daemon exits.
#[test]
fn sigterm_drains_running_sessions_and_refuses_new_ones() {
    let s = site();
    let mut d = Serve::start(s.t.path(), &["--users", s.users.to_str().unwrap()]);
    let src = s.t.path().join("src");
    data_file(&src, 24);
    let agent = spawn_as(
        "alice",
        &s.ka,
        &[
            "cp",
            "--bwlimit",
            "8M",
            src.to_str().unwrap(),
            &d.url("big"),
        ],
    );
    wait_for_session(&d, "alice", &s.ka);
    d.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(300));
    let o = as_user(
        "alice",
        &s.ka,
        &["cp", src.to_str().unwrap(), &d.url("other")],
    );
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("shutting down") && e.lines().count() == 1, "{e}");
    // Status still answers, and says so.
    let o = as_user("alice", &s.ka, &["status", "--json", &d.addr]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["draining"], true, "{j}");
    let o = wait_output(agent, Duration::from_secs(60));
    assert_ok(&o);
    assert!(std::fs::read(s.a.join("big")).unwrap() == std::fs::read(&src).unwrap());
    assert!(!s.a.join("other").exists());
    let st = d.child.wait().unwrap();
    assert_eq!(st.code(), Some(128 + libc::SIGTERM), "{}", d.log());
}

/// A session still running when `--drain-timeout` ends is stopped
/// resumably: the daemon keeps the large file's temp and journal, and
/// `cp --resume` against a restarted daemon completes the copy.
#[test]
fn a_drain_past_its_grace_period_stops_resumably() {
    let s = site();
    let args = ["--users", s.users.to_str().unwrap(), "--drain-timeout", "1"];
    let mut d = Serve::start(s.t.path(), &args);
    let src = s.t.path().join("src");
    data_file(&src, 80);
    // 80 MiB at 8 MiB/s: 10 s, far past the 1 s grace.
    let agent = spawn_as(
        "alice",
        &s.ka,
        &[
            "cp",
            "--bwlimit",
            "8M",
            src.to_str().unwrap(),
            &d.url("big"),
        ],
    );
    wait_for_session(&d, "alice", &s.ka);
    std::thread::sleep(Duration::from_millis(1500));
    let t0 = Instant::now();
    d.signal(libc::SIGTERM);
    let st = d.child.wait().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(12), "{:?}", t0.elapsed());
    assert_eq!(st.code(), Some(128 + libc::SIGTERM));
    assert!(d.log().contains("kept for --resume"), "{}", d.log());
    let o = wait_output(agent, Duration::from_secs(30));
    assert!(
        !o.status.success(),
        "the stopped transfer cannot have succeeded"
    );
    assert!(
        !s.a.join("big").exists(),
        "no half-written file under its final name"
    );
    assert!(
        !temp_files(&s.a).is_empty(),
        "the temp file is kept for --resume: {:?} {:?}",
        walk_paths(&s.a),
        d.log()
    );
    let d2 = Serve::start(s.t.path(), &args);
    let o = as_user(
        "alice",
        &s.ka,
        &["cp", "--resume", src.to_str().unwrap(), &d2.url("big")],
    );
    assert_ok(&o);
    assert!(std::fs::read(s.a.join("big")).unwrap() == std::fs::read(&src).unwrap());
}
