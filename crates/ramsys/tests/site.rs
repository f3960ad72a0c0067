//! A site of daemons (issue 19, docs/SITE.md): three daemons on loopback
//! peered together see each other's load within a few intervals, a load
//! injected through one daemon's /proc root shows at the others, a killed
//! daemon goes stale while the rest carry on, and a lock whose holder dies
//! frees itself when its lease runs out (its token is then fenced).
//!
//! (Over 800 lines: every file under tests/ is a test binary of its own
//! that links the whole engine, so one feature's tests stay in one file;
//! shared helpers live in tests/common.)

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use ramsys_ddss::msg::{Error, Op, Reply};
use ramsys_ddss::net::Requester;
use ramsys_ddss::Model;

fn site_json(key: &Path, addr: &str) -> serde_json::Value {
    let o = ramsys(key, &["status", "--site", "--json", addr]);
    assert_ok(&o);
    serde_json::from_slice(&o.stdout).expect("status --site --json is JSON")
}

/// Poll `addr`'s view of the site until `pred` holds; panics after `t`.
fn wait_for(
    key: &Path,
    addr: &str,
    t: Duration,
    what: &str,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        let v = site_json(key, addr);
        if pred(&v) {
            return start.elapsed();
        }
        assert!(start.elapsed() < t, "{what} not seen within {t:?}: {v:#}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn member<'a>(v: &'a serde_json::Value, addr: &str) -> Option<&'a serde_json::Value> {
    v["members"].as_array()?.iter().find(|m| m["addr"] == addr)
}

fn age(v: &serde_json::Value, addr: &str) -> u64 {
    member(v, addr)
        .and_then(|m| m["age_ms"].as_u64())
        .unwrap_or(u64::MAX)
}

#[test]
fn three_daemons_monitor_each_other() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let fake = t.path().join("fakeroot");
    fake_proc(&fake, 0, 0);
    let a = TestDaemon::start_with(&root, &key, &["--site-interval", "50"]);
    let mut b = TestDaemon::start_with(&root, &key, &["--peer", &a.addr]);
    let c = TestDaemon::start_with(
        &root,
        &key,
        &[
            "--peer",
            &a.addr,
            "--peer",
            &b.addr,
            "--site-sys-root",
            fake.to_str().unwrap(),
        ],
    );
    let all = [a.addr.clone(), b.addr.clone(), c.addr.clone()];
    // Every daemon sees all three, each view fresh (A and B learn C, and A
    // learns B, from their SiteHello).
    for d in &all {
        wait_for(
            &key,
            d,
            Duration::from_secs(10),
            "three fresh members",
            |v| {
                v["members"].as_array().map(|m| m.len()) == Some(3)
                    && all.iter().all(|x| age(v, x) < 500)
            },
        );
    }
    let v = site_json(&key, &a.addr);
    let m = member(&v, &c.addr).unwrap();
    let mut fields: Vec<&str> = m.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    fields.sort();
    assert_eq!(
        fields,
        [
            "active_tasks",
            "addr",
            "age_ms",
            "cpu_load",
            "free_buffer_bytes",
            "sessions"
        ]
    );
    assert!(m["free_buffer_bytes"].as_u64().unwrap() > 0);

    // A CPU burner on C, seen through its injected /proc: 90 % busy.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let started = Instant::now();
    let burner = {
        let (fake, stop) = (fake.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut busy, mut idle) = (0u64, 0u64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                busy += 90;
                idle += 10;
                fake_proc(&fake, busy, idle);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    // Polled in-process every 2 ms (no process start per poll), so the
    // time printed is the site's: C's next sample plus A's next pull.
    let k = key_bytes(&key);
    let seen = loop {
        if cpu_in_view(&k, &a.addr, &c.addr) >= 0.8 {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "C's load never reached A"
        );
        std::thread::sleep(Duration::from_millis(2));
    };
    eprintln!("C's injected load visible at A after {seen:?} (intervals 50 ms)");
    wait_for(
        &key,
        &b.addr,
        Duration::from_secs(5),
        "C's load at B",
        |v| {
            member(v, &c.addr)
                .and_then(|m| m["cpu_load"].as_f64())
                .unwrap_or(0.0)
                >= 0.8
        },
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    burner.join().unwrap();

    // B dies: A and C report it stale within 3 s and stay fresh themselves.
    b.kill();
    for d in [&a.addr, &c.addr] {
        wait_for(&key, d, Duration::from_secs(3), "B stale", |v| {
            age(v, &b.addr) > 1000 && age(v, &a.addr) < 500 && age(v, &c.addr) < 500
        });
    }
    let o = ramsys(&key, &["status", "--site", &a.addr]);
    assert_ok(&o);
    let human = String::from_utf8_lossy(&o.stdout);
    let line = human.lines().find(|l| l.starts_with(&b.addr)).unwrap();
    assert!(line.contains("gone") || line.contains("stale"), "{human}");

    // A daemon without peers is not a site: one clear line, non-zero exit.
    let lone = TestDaemon::start(&root, &key);
    let o = ramsys(&key, &["status", "--site", &lone.addr]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("not part of a site"), "{}", stderr(&o));
    // ... and refuses a SiteHello (after checking nothing: Error 3).
    let e = ramsys_engine::daemon::site::dial(&lone.addr, "x", "site", &key_bytes(&key))
        .err()
        .expect("a daemon outside a site refuses site links");
    assert!(e.to_string().contains("not part of a site"), "{e}");
}

/// `of`'s CPU load in `addr`'s site view, asked in-process.
fn cpu_in_view(key: &[u8], addr: &str, of: &str) -> f64 {
    use ramsys_proto::Control;
    let t = ramsys_engine::transport::tcp::Tcp {
        socket_buffer: None,
    };
    let mut s = ramsys_engine::session::Connect::new(addr, key, Duration::from_secs(5))
        .open(&t)
        .unwrap();
    ramsys_engine::transport::wire::send_control(&mut *s.ctl, &Control::StatusQuery).unwrap();
    let Control::StatusReport { json } =
        ramsys_engine::transport::wire::recv_control(&mut *s.ctl).unwrap()
    else {
        panic!("no status report")
    };
    let st: ramsys_engine::daemon::status::Status = serde_json::from_str(&json).unwrap();
    st.site
        .iter()
        .find(|m| m.addr == of)
        .map_or(0.0, |m| m.cpu_load)
}

fn key_bytes(key: &Path) -> Vec<u8> {
    // The key file holds the key as text (common::key_file).
    ramsys_resources::keys::load_existing(key).unwrap()
}

#[test]
fn lock_holder_death_lease_and_fencing() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let mut home = TestDaemon::start_with(&root, &key, &["--site-interval", "100"]);
    let k = key_bytes(&key);
    let link = |who: &str| {
        let l = ramsys_engine::daemon::site::dial(&home.addr, who, "site", &k).expect("site link");
        Requester::new(Box::new(l), &home.addr)
    };
    // Holder 1 allocates a job segment on the home and locks it (300 ms).
    let mut h1 = link("127.0.0.1:1");
    let cap = 64;
    let r = h1.call(
        1,
        Op::Allocate {
            name: "job".into(),
            capacity: cap,
            model: Model::Strict,
        },
    );
    assert!(
        matches!(r, Ok(Reply::Allocated { created: true, .. })),
        "{r:?}"
    );
    let Ok(Reply::Locked { token: t1, .. }) = h1.call(
        1,
        Op::Lock {
            name: "job".into(),
            lease_ms: 300,
        },
    ) else {
        panic!("lock")
    };
    h1.call(
        1,
        Op::Put {
            name: "job".into(),
            data: b"one".to_vec(),
            token: t1,
        },
    )
    .unwrap();
    // Holder 1 is killed (its link gone, nothing released).
    drop(h1);
    let mut h2 = link("127.0.0.1:2");
    let started = Instant::now();
    match h2.call(
        2,
        Op::Lock {
            name: "job".into(),
            lease_ms: 5000,
        },
    ) {
        Err(Error::Busy {
            holder: 1,
            remaining_ms,
        }) => assert!(remaining_ms <= 300),
        other => panic!("expected Busy, got {other:?}"),
    }
    // Strict: the dead holder's lock still excludes readers until expiry.
    assert!(matches!(
        h2.call(
            2,
            Op::Get {
                name: "job".into(),
                have: None,
                slack: 0
            }
        ),
        Err(Error::Busy { .. })
    ));
    let t2 = loop {
        match h2.call(
            2,
            Op::Lock {
                name: "job".into(),
                lease_ms: 5000,
            },
        ) {
            Ok(Reply::Locked { token, .. }) => break token,
            Err(Error::Busy { .. }) => std::thread::sleep(Duration::from_millis(20)),
            other => panic!("{other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "lease never expired"
        );
    };
    assert!(t2 > t1);
    // Holder 1 comes back with its old token: fenced, data untouched.
    let mut h1 = link("127.0.0.1:1");
    assert_eq!(
        h1.call(
            1,
            Op::Put {
                name: "job".into(),
                data: b"stale".to_vec(),
                token: t1
            }
        ),
        Err(Error::Fenced)
    );
    h2.call(
        2,
        Op::Put {
            name: "job".into(),
            data: b"two".to_vec(),
            token: t2,
        },
    )
    .unwrap();
    assert!(matches!(
        h2.call(2, Op::Get { name: "job".into(), have: None, slack: 0 }),
        Ok(Reply::Data { version: 2, ref data, .. }) if data == b"two"
    ));

    // A wrong key is refused at SiteHello like at Hello.
    assert!(ramsys_engine::daemon::site::dial(&home.addr, "x", "site", b"not the key").is_err());

    // The home dies: requests fail with one clear error (soft state).
    home.kill();
    let e = h2
        .call(
            2,
            Op::Get {
                name: "job".into(),
                have: None,
                slack: 0,
            },
        )
        .unwrap_err();
    assert!(matches!(e, Error::HomeUnreachable(_)), "{e:?}");
    assert!(e.to_string().starts_with("home unreachable"), "{e}");
}

#[test]
fn transfer_goes_to_the_least_loaded_daemon() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    make_varied_tree(&src, 64 << 10);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut ds = vec![];
    let mut burners = vec![];
    for (i, pct) in [90u64, 20, 60].into_iter().enumerate() {
        let root = t.path().join(format!("root{i}"));
        std::fs::create_dir(&root).unwrap();
        let fake = t.path().join(format!("proc{i}"));
        burners.push(burn(&fake, pct, stop.clone()));
        let mut args = vec![
            "--site-interval".to_string(),
            "20".into(),
            "--site-sys-root".into(),
        ];
        args.push(fake.to_str().unwrap().into());
        for d in &ds {
            let d: &TestDaemon = d;
            args.push("--peer".into());
            args.push(d.addr.clone());
        }
        let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        ds.push(TestDaemon::start_with(&root, &key, &a));
    }
    let addrs: Vec<String> = ds.iter().map(|d| d.addr.clone()).collect();
    // Wait until the first daemon sees every load.
    wait_for(&key, &addrs[0], Duration::from_secs(10), "all loads", |v| {
        loads_seen(v, addrs.iter().map(|a| a.as_str()), 0.1)
    });
    let list = addrs.join(",");
    let o = ramsys(
        &key,
        &[
            "cp",
            "-r",
            src.to_str().unwrap(),
            &format!("ramsys://{list}/"),
        ],
    );
    assert_ok(&o);
    // The 20 % daemon got it; the others did not.
    assert_same_tree(&src, &ds[1].root.join("src"));
    assert!(!ds[0].root.join("src").exists());
    assert!(!ds[2].root.join("src").exists());
    // A list whose daemons are all gone: one clear line, non-zero exit.
    let gone = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let o = ramsys(
        &key,
        &[
            "cp",
            "-r",
            src.to_str().unwrap(),
            &format!("ramsys://{gone},{gone}/x"),
        ],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("none of the daemons"), "{}", stderr(&o));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for b in burners {
        b.join().unwrap();
    }
}

/// With a users table the site links authenticate as `[site] user`
/// ("site" by default) with that user's key; a daemon whose table lacks
/// it cannot join, and says so in its view.
#[test]
fn site_links_use_the_users_table() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path();
    std::fs::create_dir_all(p.join("keys")).unwrap();
    std::fs::create_dir_all(p.join("root")).unwrap();
    let wk = |name: &str, k: &str| {
        let f = p.join("keys").join(name);
        std::fs::write(&f, format!("{k}\n")).unwrap();
        std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        f
    };
    let alice = wk("alice", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    wk("site", "ssssssssssssssssssssssssssssssss");
    let with_site = p.join("users.toml");
    std::fs::write(
        &with_site,
        "[[user]]\nname = \"alice\"\nkey_file = \"keys/alice\"\nroot = \"root\"\n\n\
         [[user]]\nname = \"site\"\nkey_file = \"keys/site\"\nroot = \"root\"\nread_only = true\n",
    )
    .unwrap();
    let without = p.join("alice-only.toml");
    std::fs::write(
        &without,
        "[[user]]\nname = \"alice\"\nkey_file = \"keys/alice\"\nroot = \"root\"\n",
    )
    .unwrap();
    let shared = key_file(p);
    let (ws, wo) = (with_site.to_str().unwrap(), without.to_str().unwrap());
    let root = p.join("root");
    let a = TestDaemon::start_with(&root, &shared, &["--users", ws, "--site-interval", "50"]);
    let b = TestDaemon::start_with(&root, &shared, &["--users", ws, "--peer", &a.addr]);
    let c = TestDaemon::start_with(&root, &shared, &["--users", wo, "--peer", &a.addr]);
    let as_alice = |addr: &str| {
        let mut cmd = std::process::Command::new(bin());
        cmd.args(["status", "--site", "--json", addr])
            .env("RAMSYS_KEY_FILE", &alice)
            .env("RAMSYS_USER", "alice");
        let o = run_with_timeout(cmd, Duration::from_secs(30));
        assert_ok(&o);
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let start = Instant::now();
    loop {
        let v = as_alice(&b.addr);
        if age(&v, &a.addr) < 500 && age(&v, &b.addr) < 500 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "B never saw A: {v:#}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // C's table has no "site" user: A refuses it, C's view of A stays stale.
    std::thread::sleep(Duration::from_millis(1500));
    let o = {
        let mut cmd = std::process::Command::new(bin());
        cmd.args(["status", "--site", &c.addr])
            .env("RAMSYS_KEY_FILE", &alice)
            .env("RAMSYS_USER", "alice");
        run_with_timeout(cmd, Duration::from_secs(30))
    };
    assert_ok(&o);
    let human = String::from_utf8_lossy(&o.stdout);
    let line = human.lines().find(|l| l.starts_with(&a.addr)).unwrap();
    assert!(line.contains("authentication failed"), "{human}");
}

/// `cp -r --json SRC URL`, which must succeed; its summary.
fn push_json(key: &Path, src: &Path, url: &str) -> serde_json::Value {
    let o = ramsys(key, &["cp", "-r", "--json", src.to_str().unwrap(), url]);
    assert_ok(&o);
    summary(&o)
}

/// Whether the site view `v` has a fresh (< 500 ms) load above `min` for
/// every one of `addrs`.
fn loads_seen<'a>(
    v: &serde_json::Value,
    mut addrs: impl Iterator<Item = &'a str>,
    min: f64,
) -> bool {
    addrs.all(|a| {
        member(v, a)
            .and_then(|m| m["cpu_load"].as_f64())
            .unwrap_or(0.0)
            > min
            && age(v, a) < 500
    })
}

/// A daemon at its admission limit (`--site-max-sessions 1`, one session
/// running) answers a new session with a redirect to the least-loaded
/// peer of its site; the agent follows it once and says so in its JSON
/// summary, for a push and for a pull. The daemons share one root (a
/// shared file system), so the data is where the user asked.
#[test]
fn busy_daemon_redirects_to_the_least_loaded_peer() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    // One slow file to keep a session running on A.
    std::fs::write(root.join("big"), vec![7u8; 2 << 20]).unwrap();
    let src = t.path().join("src");
    make_varied_tree(&src, 64 << 10);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut burners = vec![];
    let mut ds: Vec<TestDaemon> = vec![];
    // A 50 %, B 40 %, C 10 %: A redirects to C.
    for (i, pct) in [50u64, 40, 10].into_iter().enumerate() {
        let fake = t.path().join(format!("proc{i}"));
        burners.push(burn(&fake, pct, stop.clone()));
        let mut args: Vec<String> = ["--site-interval", "20", "--site-sys-root"]
            .map(String::from)
            .to_vec();
        args.push(fake.to_str().unwrap().into());
        if i == 0 {
            args.extend(["--site-max-sessions".into(), "1".into()]);
        }
        if i == 1 {
            args.extend(["--site-max-load".into(), "30".into()]);
        }
        for d in &ds {
            args.extend(["--peer".into(), d.addr.clone()]);
        }
        let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        ds.push(TestDaemon::start_with(&root, &key, &a));
    }
    let (a, c) = (ds[0].addr.clone(), ds[2].addr.clone());
    wait_for(&key, &a, Duration::from_secs(10), "all loads", |v| {
        loads_seen(v, ds.iter().map(|d| d.addr.as_str()), 0.05)
    });
    // B is over its --site-max-load (40 % >= 30 %): a push to B goes to C.
    let b = ds[1].addr.clone();
    wait_for(&key, &b, Duration::from_secs(10), "loads at B", |v| {
        loads_seen(v, ds.iter().map(|d| d.addr.as_str()), 0.05)
    });
    let j = push_json(&key, &src, &ds[1].url("viaB/"));
    assert_eq!(j["redirect"]["from"], b.as_str(), "{j}");
    assert_eq!(j["redirect"]["to"], c.as_str(), "{j}");
    assert_eq!(
        j["redirect"]["reason"], "CPU load 40 % (max_load = 30 %)",
        "{j}"
    );
    assert_same_tree(&src, &root.join("viaB"));
    // Under its limit A takes the session itself.
    let j = push_json(&key, &src, &ds[0].url("first/"));
    assert!(j["redirect"].is_null(), "{j}");
    // A slow pull keeps one session running on A.
    let out = t.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let mut slow = std::process::Command::new(bin())
        .args(["cp", "--bwlimit", "64K", &ds[0].url("big")])
        .arg(out.join("big"))
        .env("RAMSYS_KEY_FILE", &key)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&key, &a, Duration::from_secs(10), "A's session", |v| {
        member(v, &a).and_then(|m| m["sessions"].as_u64()) == Some(1)
    });
    // A push to A goes to C (once B's push has left C's load).
    wait_for(&key, &a, Duration::from_secs(5), "C idle", |v| {
        member(v, &c).is_some_and(|m| m["active_tasks"] == 0 && m["sessions"] == 0)
    });
    std::fs::create_dir(root.join("dst")).unwrap();
    let j = push_json(&key, &src, &ds[0].url("dst/"));
    assert_eq!(j["redirect"]["from"], a.as_str(), "{j}");
    assert_eq!(j["redirect"]["to"], c.as_str(), "{j}");
    let why = j["redirect"]["reason"].as_str().unwrap();
    assert!(why.contains("max_sessions = 1"), "{why}");
    assert_same_tree(&src, &root.join("dst/src"));
    // C's view at A lags by up to two intervals, and A counts the session
    // it sent to C as C's for two intervals + 100 ms (against herds): wait
    // until both have passed, or A may (rightly) prefer B.
    let c_idle = |v: &serde_json::Value| {
        member(v, &c).is_some_and(|m| m["active_tasks"] == 0 && m["sessions"] == 0)
    };
    let settle = || {
        wait_for(&key, &a, Duration::from_secs(5), "C idle", c_idle);
        std::thread::sleep(Duration::from_millis(300));
    };
    settle();
    // So does a pull, and without --json the agent says so in one line.
    let back = t.path().join("back");
    let o = ramsys(
        &key,
        &["cp", "-r", &ds[0].url("dst/src"), back.to_str().unwrap()],
    );
    assert_ok(&o);
    assert_same_tree(&src, &back);
    let e = stderr(&o);
    assert!(
        e.lines()
            .any(|l| l.contains(&format!("{a} is busy"))
                && l.ends_with(&format!("redirected to {c}"))),
        "{e} (C is {c}); A's view now: {:#}",
        site_json(&key, &a)
    );
    // A counted both (status totals, ramsys_redirects_total).
    let o = ramsys(&key, &["status", "--json", &a]);
    assert_ok(&o);
    let st: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(st["totals"]["redirects"], 2, "{}", st["totals"]);
    // Draining (SIGTERM, the slow session still running), A sends new
    // sessions to its least-loaded peer instead of refusing them.
    let pid = ds[0].child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    settle();
    let j = push_json(&key, &src, &ds[0].url("drained/"));
    assert_eq!(j["redirect"]["reason"], "shutting down", "{j}");
    assert_eq!(j["redirect"]["to"], c.as_str(), "{j}");
    assert_same_tree(&src, &root.join("drained"));
    let _ = slow.kill();
    let _ = slow.wait();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for b in burners {
        b.join().unwrap();
    }
}

/// `addr`'s `status --json`.
fn status_json(key: &Path, addr: &str) -> serde_json::Value {
    let o = ramsys(key, &["status", "--json", addr]);
    assert_ok(&o);
    serde_json::from_slice(&o.stdout).expect("status --json is JSON")
}

/// The site share of the queue whose live task is a sink, if any.
fn shared_queue(v: &serde_json::Value) -> Option<serde_json::Value> {
    v["queues"]
        .as_array()?
        .iter()
        .find(|q| !q["site"].is_null())
        .map(|q| q["site"].clone())
}

/// Three daemons of a site serving one directory (the shared file system
/// of the test) share its writer budget (docs/SITE.md, "Storage shares"):
/// with pushes running into two and then three of them, each daemon's
/// status shows the device shared by that many members and a writer limit
/// that is its share; the members' shares add up to the budget (or one
/// each); when the others finish, the last one runs its full count again.
/// Every tree lands byte for byte.
#[test]
fn site_members_on_one_shared_device_share_its_writers() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let mut r = Rng(0x9e3779b97f4a7c15);
    for i in 0..3 {
        std::fs::write(src.join(format!("f{i}")), r.bytes(3 << 20)).unwrap();
    }
    // Four writers per task whatever the plan says of this disk (a VM's
    // virtio disk claims to be rotational: one), through the config's
    // `[devices.NAME] threads`, as an operator of a shared export would.
    let cfg = t.path().join("serve.toml");
    let dev = ramsys_topo::discover(Path::new("/")).ok().and_then(|topo| {
        ramsys_engine::daemon::placement::storage_for_path(&topo, &root, true)
            .map(|d| d.name.clone())
    });
    let body = dev.map_or(String::new(), |d| format!("[devices.{d}]\nthreads = 4\n"));
    std::fs::write(&cfg, format!("writers = 4\n{body}")).unwrap();
    let cfg = cfg.to_str().unwrap();
    let base = ["--site-interval", "20", "--config", cfg];
    let a = TestDaemon::start_with(&root, &key, &base);
    let b = TestDaemon::start_with(&root, &key, &[&base[..], &["--peer", &a.addr]].concat());
    let c = TestDaemon::start_with(
        &root,
        &key,
        &[&base[..], &["--peer", &a.addr, "--peer", &b.addr]].concat(),
    );
    let all = [a.addr.clone(), b.addr.clone(), c.addr.clone()];
    for d in &all {
        wait_for(
            &key,
            d,
            Duration::from_secs(10),
            "three fresh members",
            |v| {
                v["members"].as_array().map(|m| m.len()) == Some(3)
                    && all.iter().all(|x| age(v, x) < 500)
            },
        );
    }
    // A paced push (9 MiB at 1.5 MB/s: about 6 s) into `d`'s DST.
    let push = |d: &TestDaemon, dst: &str, rate: &str| {
        let mut cmd = std::process::Command::new(bin());
        cmd.env("RAMSYS_KEY_FILE", &key)
            .args(["cp", "-r", "--bwlimit", rate])
            .arg(&src)
            .arg(d.url(dst))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        cmd.spawn().unwrap()
    };
    let pa = push(&a, "to_a", "1500K");
    let pb = push(&b, "to_b", "1500K");
    // Both sinks see the device shared by two members; each runs its share.
    let mut shares = vec![];
    for d in [&a.addr, &b.addr] {
        let t0 = Instant::now();
        let q = loop {
            let v = status_json(&key, d);
            if let Some(q) = shared_queue(&v).filter(|q| q["members"] == 2) {
                let lim = v["tasks"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find_map(|t| t["site_limit"].as_u64());
                break (q, lim);
            }
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "{d}: no share of two: {v:#}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        eprintln!("{d}: {} (task limit {:?})", q.0, q.1);
        assert_eq!(q.0["tasks"], 2);
        let (budget, share) = (
            q.0["budget"].as_u64().unwrap(),
            q.0["share"].as_u64().unwrap(),
        );
        assert!(share >= 1 && share < budget, "{q:?}");
        assert_eq!(q.1, Some(share), "the one task runs the whole share");
        shares.push((budget, share));
    }
    // Same budget everywhere: the two shares add up to it.
    assert_eq!(shares[0].0, shares[1].0);
    assert_eq!(shares[0].1 + shares[1].1, shares[0].0.max(2));
    // A third: three members; the human status says so too.
    // (Slower, so it is still running when the other two end.)
    let pc = push(&c, "to_c", "700K");
    let t0 = Instant::now();
    let mut total = 0;
    for d in &all {
        let q = loop {
            let v = status_json(&key, d);
            if let Some(q) = shared_queue(&v).filter(|q| q["members"] == 3) {
                break q;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(8),
                "{d}: no share of three: {v:#}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        eprintln!("{d}: {q}");
        total += q["share"].as_u64().unwrap();
    }
    assert!(
        total <= shares[0].0.max(3) + 1,
        "shares of three add up to {total}"
    );
    let o = ramsys(&key, &["status", &c.addr]);
    assert_ok(&o);
    let human = String::from_utf8_lossy(&o.stdout);
    assert!(human.contains("shared over the site"), "{human}");
    for p in [pa, pb] {
        assert_ok(&p.wait_with_output().unwrap());
    }
    // A and B done: C, still writing, is alone on the device again and
    // its task runs every writer it holds (the view re-read, not frozen).
    let t0 = Instant::now();
    loop {
        let v = status_json(&key, &c.addr);
        let live = v["tasks"].as_array().unwrap();
        assert!(!live.is_empty(), "C finished before A and B: {v:#}");
        if shared_queue(&v).is_none() && live.iter().all(|t| t["site_limit"].is_null()) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "C still limited: {v:#}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_ok(&pc.wait_with_output().unwrap());
    for dst in ["to_a", "to_b", "to_c"] {
        assert_same_tree(&src, &root.join(dst));
    }
    // Alone again: no share, no limit.
    let v = status_json(&key, &a.addr);
    assert!(shared_queue(&v).is_none(), "{v:#}");
    assert!(v["finished"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t["site_limit"].is_null()));
    // Each task's plan was made on the host's published load (where the
    // daemon has a topology to plan on).
    for t in v["finished"].as_array().unwrap() {
        if let Some(h) = t["plan"].get("host_load") {
            assert!(h["cpu_load"].is_number() && h["busy_cpus"].is_u64(), "{h}");
        }
    }
}
