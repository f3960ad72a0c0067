//! Third-party transfers between the daemons of a site (issue 19,
//! docs/SITE.md "Between two sites"): `ramsys cp -r ramsys://A/SRC
//! ramsys://B/DST` has A push to B; with `--stripe` over lists of equal
//! length each pair (Ai, Bi) moves its share of one shared tree. Byte for
//! byte, a second sync moves nothing, a pair lost mid-way fails its share
//! only and `--resume` finishes, and what B refuses a user directly it
//! refuses through A.
//!
//! (Over 800 lines: every file under tests/ is a test binary of its own
//! that links the whole engine, so one feature's tests stay in one file;
//! shared helpers live in tests/common.)

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::stripe::striped_in_netns;
use common::*;

/// A tree of awkward cases plus `big` files of `size` bytes.
fn tree(src: &Path, big: usize, size: usize) {
    make_varied_tree(src, 64 << 10);
    let mut r = Rng(11);
    for i in 0..big {
        std::fs::write(src.join(format!("big{i}")), r.bytes(size)).unwrap();
    }
}

/// Wait until `a`'s site view lists `b` as fresh (so A takes B as a peer).
fn wait_peer(key: &Path, env: &[(&str, &Path)], a: &str, b: &str) {
    let start = Instant::now();
    loop {
        let mut cmd = std::process::Command::new(bin());
        cmd.args(["status", "--site", "--json", a])
            .env("RAMSYS_KEY_FILE", key);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let o = run_with_timeout(cmd, Duration::from_secs(30));
        if o.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            let fresh = v["members"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| m["addr"] == b && m["age_ms"].as_u64().is_some_and(|a| a < 500));
            if fresh {
                return;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{a} never saw {b}: {}",
            stderr(&o)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Source daemon A serving `ra`, sink daemon B serving `rb`, B a peer of A.
fn pair(ra: &Path, rb: &Path, key: &Path, extra: &[&str]) -> (TestDaemon, TestDaemon) {
    let a = daemon(ra, key, extra, &[]);
    let b = sink_of(&a, rb, key, extra, &[]);
    (a, b)
}

/// A daemon serving `root` with `--site-interval 50`, `extra` and the
/// environment `env` (fault hooks).
fn daemon(root: &Path, key: &Path, extra: &[&str], env: Env) -> TestDaemon {
    let mut c = std::process::Command::new(bin());
    c.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--site-interval",
        "50",
        "--root",
    ])
    .arg(root)
    .arg("--key-file")
    .arg(key)
    .args(extra)
    .envs(env.iter().copied())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::inherit());
    TestDaemon::spawn(c, root)
}

/// A sink daemon serving `rb`, a peer of `a`.
fn sink_of(a: &TestDaemon, rb: &Path, key: &Path, extra: &[&str], env: Env) -> TestDaemon {
    let mut eb = vec!["--peer", &a.addr];
    eb.extend_from_slice(extra);
    daemon(rb, key, &eb, env)
}

#[test]
fn one_pair_third_party_copy_and_sync() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let (ra, rb) = (t.path().join("a"), t.path().join("b"));
    std::fs::create_dir_all(&rb).unwrap();
    let src = ra.join("src");
    tree(&src, 2, 3 << 20);
    let (a, b) = pair(&ra, &rb, &key, &[]);
    wait_peer(&key, &[], &a.addr, &b.addr);
    // DST does not exist: it becomes the copy.
    let o = ramsys(&key, &["cp", "-r", "--json", &a.url("src"), &b.url("dst")]);
    assert_ok(&o);
    assert_same_tree(&src, &rb.join("dst"));
    let j = summary(&o);
    assert_eq!(j["ok"], true, "{j}");
    assert!(j["bytes"].as_u64().unwrap() >= 6 << 20, "{j}");
    // DST exists: SRC lands inside it. The human summary, too.
    std::fs::create_dir(rb.join("into")).unwrap();
    let o = ramsys(&key, &["cp", "-r", &a.url("src"), &b.url("into")]);
    assert_ok(&o);
    assert!(String::from_utf8_lossy(&o.stdout).contains("copied"));
    assert_same_tree(&src, &rb.join("into/src"));
    // --encrypt: the agent's link to A and A's data links to B sealed.
    let o = ramsys(
        &key,
        &[
            "cp",
            "-r",
            "--encrypt",
            "--json",
            &a.url("src"),
            &b.url("sealed"),
        ],
    );
    assert_ok(&o);
    assert_same_tree(&src, &rb.join("sealed"));
    // A sync, run twice: the second moves nothing.
    let sync = |extra: &[&str]| {
        let mut args = vec!["sync", "-r", "--json"];
        args.extend_from_slice(extra);
        let (s, d) = (a.url("src/"), b.url("mirror"));
        args.extend([s.as_str(), d.as_str()]);
        let o = ramsys(&key, &args);
        assert_ok(&o);
        summary(&o)
    };
    let first = sync(&[]);
    assert_same_tree(&src, &rb.join("mirror"));
    assert!(first["bytes"].as_u64().unwrap() >= 6 << 20, "{first}");
    let second = sync(&[]);
    assert_eq!(second["bytes"], 0, "{second}");
    assert_eq!(second["files"], 0, "{second}");
    assert!(second["unchanged"].as_u64().unwrap() >= 2, "{second}");
    assert!(temp_files(&rb).is_empty());
    // A bad source path: one line, non-zero, nothing written.
    let o = ramsys(&key, &["cp", "-r", &a.url("nope"), &b.url("x")]);
    assert!(!o.status.success());
    assert_eq!(stderr(&o).trim().lines().count(), 1, "{}", stderr(&o));
    assert!(!rb.join("x").exists());
    // --delete is not carried between two daemons: refused in one line.
    let o = ramsys(
        &key,
        &["sync", "-r", "--delete", &a.url("src/"), &b.url("mirror")],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--delete"), "{}", stderr(&o));
}

#[test]
fn refusals_non_peer_and_unreachable_sink() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let (ra, rb) = (t.path().join("a"), t.path().join("b"));
    std::fs::create_dir_all(&rb).unwrap();
    let src = ra.join("src");
    tree(&src, 1, 1 << 20);
    let (a, b) = pair(&ra, &rb, &key, &[]);
    let lone = TestDaemon::start(&rb, &key);
    wait_peer(&key, &[], &a.addr, &b.addr);
    let one_line = |o: &std::process::Output, what: &str| {
        assert!(!o.status.success(), "{what}: succeeded");
        let e = stderr(o);
        assert_eq!(e.trim().lines().count(), 1, "{what}: {e}");
        e
    };
    // A sink outside A's site is refused.
    let o = ramsys(&key, &["cp", "-r", &a.url("src"), &lone.url("x")]);
    let e = one_line(&o, "non-peer sink");
    assert!(e.contains("is not a peer"), "{e}");
    // A source daemon outside any site cannot relay.
    let o = ramsys(&key, &["cp", "-r", &lone.url("x"), &b.url("y")]);
    let e = one_line(&o, "source not in a site");
    assert!(e.contains("not part of a site"), "{e}");
    // A peer that died: A cannot reach it; one line naming it.
    let rd = t.path().join("d");
    std::fs::create_dir_all(&rd).unwrap();
    let mut d = TestDaemon::start_with(&rd, &key, &["--peer", &a.addr]);
    wait_peer(&key, &[], &a.addr, &d.addr);
    let dead = d.addr.clone();
    d.kill();
    let o = ramsys(
        &key,
        &["cp", "-r", &a.url("src"), &format!("ramsys://{dead}/x")],
    );
    let e = one_line(&o, "unreachable sink");
    assert!(e.contains(&dead), "{e}");
    assert!(
        walk_paths(&rd).is_empty(),
        "nothing written at the dead sink"
    );
    assert!(!rb.join("x").exists());
    // Unequal lists with --stripe: one line.
    let o = ramsys(
        &key,
        &[
            "cp",
            "-r",
            "--stripe",
            &format!("ramsys://{},{}/src", a.addr, a.addr),
            &b.url("x"),
        ],
    );
    let e = one_line(&o, "unequal lists");
    assert!(e.contains("2 source daemons, 1 sink daemons"), "{e}");
}

/// With a users table (the same on both daemons), A acts for the agent's
/// user at B: alice writes, read-only bob is refused as he would be
/// directly, and a user cannot claim to act for another.
#[test]
fn a_relay_carries_the_users_permissions() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path();
    let wk = |name: &str, k: &str| {
        let f = p.join("keys").join(name);
        std::fs::write(&f, format!("{k}\n")).unwrap();
        std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        f
    };
    std::fs::create_dir_all(p.join("keys")).unwrap();
    let alice = wk("alice", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    let bob = wk("bob", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb");
    wk("site", "ssssssssssssssssssssssssssssssss");
    let users = |dir: &str| {
        let d = p.join(dir);
        std::fs::create_dir_all(d.join("alice")).unwrap();
        std::fs::create_dir_all(d.join("bob")).unwrap();
        std::fs::create_dir_all(d.join("site")).unwrap();
        let f = d.join("users.toml");
        std::fs::write(
            &f,
            "[[user]]\nname = \"alice\"\nkey_file = \"../keys/alice\"\nroot = \"alice\"\n\n\
             [[user]]\nname = \"bob\"\nkey_file = \"../keys/bob\"\nroot = \"bob\"\nread_only = true\n\n\
             [[user]]\nname = \"site\"\nkey_file = \"../keys/site\"\nroot = \"site\"\n",
        )
        .unwrap();
        f
    };
    let (ua, ub) = (users("a"), users("b"));
    tree(&p.join("a/alice/src"), 0, 0);
    tree(&p.join("a/bob/src"), 0, 0);
    let shared = key_file(p);
    let a = TestDaemon::start_with(
        &p.join("a"),
        &shared,
        &["--users", ua.to_str().unwrap(), "--site-interval", "50"],
    );
    let b = TestDaemon::start_with(
        &p.join("b"),
        &shared,
        &["--users", ub.to_str().unwrap(), "--peer", &a.addr],
    );
    let as_user = |user: &str, key: &Path, args: &[&str]| {
        let mut cmd = std::process::Command::new(bin());
        cmd.args(args)
            .env("RAMSYS_KEY_FILE", key)
            .env("RAMSYS_USER", user);
        run_with_timeout(cmd, Duration::from_secs(60))
    };
    wait_peer(
        &alice,
        &[("RAMSYS_USER", Path::new("alice"))],
        &a.addr,
        &b.addr,
    );
    // Alice's tree lands in her root at B, not the site user's.
    let o = as_user("alice", &alice, &["cp", "-r", &a.url("src"), &b.url("dst")]);
    assert_ok(&o);
    assert_same_tree(&p.join("a/alice/src"), &p.join("b/alice/dst"));
    assert!(walk_paths(&p.join("b/site")).is_empty());
    // Bob may only read at B: refused through A as directly.
    let direct = as_user(
        "bob",
        &bob,
        &[
            "cp",
            "-r",
            p.join("a/bob/src").to_str().unwrap(),
            &b.url("dst"),
        ],
    );
    assert!(!direct.status.success());
    let o = as_user("bob", &bob, &["cp", "-r", &a.url("src"), &b.url("dst")]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(e.contains("may only read"), "{e}");
    assert!(walk_paths(&p.join("b/bob")).is_empty());
    // A client cannot claim to act for another user: alice's own session
    // naming bob (OnBehalf) is refused by B.
    let res =
        ramsys_engine::EngineResources::new(&ramsys_engine::data::resources::ResourceConfig {
            memory: 16 << 20,
            buffer_size: 1 << 20,
            ..Default::default()
        })
        .unwrap();
    let opts = ramsys_engine::TransferOptions {
        recursive: true,
        on_behalf: Some("bob".into()),
        ..Default::default()
    };
    let remote = ramsys_engine::roles::client::Remote {
        transport: std::sync::Arc::new(ramsys_engine::transport::tcp::Tcp {
            socket_buffer: None,
        }),
        addr: b.addr.clone(),
        key: ramsys_resources::keys::load_existing(&alice).unwrap(),
        connect_timeout: Duration::from_secs(10),
        user: Some("alice".into()),
    };
    let src = p.join("a/alice/src");
    let root = std::sync::Arc::new(
        ramsys_engine::storage::fsops::Root::open(
            &src,
            ramsys_engine::storage::fsops::Confinement::None,
        )
        .unwrap(),
    );
    let tops = vec![ramsys_engine::request::walk::Top {
        rel: Vec::new(),
        name: b"forged".to_vec(),
    }];
    let r = ramsys_engine::roles::client::push(
        &remote,
        root,
        tops,
        Vec::new(),
        &opts,
        &res,
        Default::default(),
    );
    let e = r.expect_err("alice cannot act for bob");
    assert!(
        e.to_string().contains("may not act for another user"),
        "{e}"
    );
    assert!(!p.join("b/bob/forged").exists() && !p.join("b/alice/forged").exists());
}

/// Three source daemons sharing one root, three sink daemons sharing
/// another, each Ai a peer of Bi: the pairs.
struct Pairs {
    t: tempfile::TempDir,
    key: std::path::PathBuf,
    src: std::path::PathBuf,
    rb: std::path::PathBuf,
    a: Vec<TestDaemon>,
    b: Vec<TestDaemon>,
}

fn three_pairs(big: usize, size: usize) -> Pairs {
    three_pairs_env(big, size, (&[], &[]))
}

/// A daemon's environment: (variable, value), fault hooks.
type Env<'a> = &'a [(&'a str, &'a str)];

/// [`three_pairs`] with the source and sink daemons' environments.
fn three_pairs_env(big: usize, size: usize, (env_a, env_b): (Env, Env)) -> Pairs {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let (ra, rb) = (t.path().join("a"), t.path().join("b"));
    std::fs::create_dir_all(&rb).unwrap();
    let src = ra.join("src");
    tree(&src, big, size);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let x = daemon(&ra, &key, &[], env_a);
        b.push(sink_of(&x, &rb, &key, &[], env_b));
        a.push(x);
    }
    for (x, y) in a.iter().zip(&b) {
        wait_peer(&key, &[], &x.addr, &y.addr);
    }
    Pairs {
        t,
        key,
        src,
        rb,
        a,
        b,
    }
}

fn list(ds: &[TestDaemon]) -> String {
    ds.iter()
        .map(|d| d.addr.clone())
        .collect::<Vec<_>>()
        .join(",")
}

#[test]
fn striped_over_three_pairs() {
    let p = three_pairs(6, 1 << 20);
    let (s, d) = (
        format!("ramsys://{}/src", list(&p.a)),
        format!("ramsys://{}/dst", list(&p.b)),
    );
    let o = ramsys(&p.key, &["cp", "-r", "--stripe", "--json", &s, &d]);
    assert_ok(&o);
    let j = summary(&o);
    assert_eq!(j["ok"], true, "{j}");
    // A missing DST receives SRC (rsync's rule, the same for every pair
    // whichever reaches DST first).
    assert_same_tree(&p.src, &p.rb.join("dst/src"));
    assert!(temp_files(&p.rb).is_empty());
    let stripes = j["stripes"].as_array().unwrap();
    assert_eq!(stripes.len(), 3, "{j}");
    for (i, st) in stripes.iter().enumerate() {
        assert_eq!(st["daemon"], p.a[i].addr.as_str(), "{j}");
        assert_eq!(st["sink"], p.b[i].addr.as_str(), "{j}");
        // Every pair moved a share (at least one of the 1 MiB files),
        // exactly its planned bytes (a hard link's second name is not
        // counted as a file moved).
        assert!(st["bytes"].as_u64().unwrap() >= 1 << 20, "{j}");
        assert_eq!(st["bytes"], st["share_bytes"], "{j}");
        assert!(st["files"].as_u64() <= st["share_files"].as_u64(), "{j}");
    }
    let sum = |k: &str| stripes.iter().map(|s| s[k].as_u64().unwrap()).sum::<u64>();
    assert_eq!(sum("bytes"), j["bytes"].as_u64().unwrap());
    assert_eq!(sum("files"), j["files"].as_u64().unwrap());
    // Again with --resume: everything is there, nothing moves.
    let o = ramsys(
        &p.key,
        &["cp", "-r", "--stripe", "--resume", "--json", &s, &d],
    );
    assert_ok(&o);
    assert_eq!(summary(&o)["bytes"], 0);
    // Split per daemon: each Ai sends what it holds (here all three hold
    // the same tree, so each sends all of it; sync keeps it whole).
    let o = ramsys(
        &p.key,
        &[
            "sync",
            "-r",
            "--stripe",
            "--split-sources",
            "--json",
            &format!("ramsys://{}/src/", list(&p.a[..1])),
            &format!("ramsys://{}/split", list(&p.b[..1])),
        ],
    );
    assert_ok(&o);
    assert_same_tree(&p.src, &p.rb.join("split"));
    drop(p.t);
}

/// One big file over three pairs (issue 19, docs/SITE.md "A big file's
/// blocks"): every pair moves a part of it into the sinks' shared
/// temp file, one sink places it, byte for byte; a second run moves
/// nothing.
#[test]
fn a_big_files_pieces_striped_over_three_pairs() {
    let p = three_pairs(0, 0);
    let size = (64 << 20) + 4321;
    std::fs::write(p.src.join("huge"), Rng(5).bytes(size)).unwrap();
    let (s, d) = (
        format!("ramsys://{}/src", list(&p.a)),
        format!("ramsys://{}/dst", list(&p.b)),
    );
    let o = ramsys(&p.key, &["cp", "-r", "--stripe", "--json", &s, &d]);
    assert_ok(&o);
    let j = summary(&o);
    assert_same_tree(&p.src, &p.rb.join("dst/src"));
    assert!(temp_files(&p.rb).is_empty(), "{:?}", temp_files(&p.rb));
    let stripes = j["stripes"].as_array().unwrap();
    assert_eq!(stripes.len(), 3, "{j}");
    // Each pair moved pieces of it (shares follow each pair's load in
    // the site view, so not exactly a third on a busy host).
    for st in stripes {
        assert!(st["bytes"].as_u64().unwrap() >= 4 << 20, "{j}");
        assert_eq!(st["bytes"], st["share_bytes"], "{j}");
    }
    let sum = |k: &str| stripes.iter().map(|s| s[k].as_u64().unwrap()).sum::<u64>();
    assert!(sum("bytes") >= size as u64, "{j}");
    assert_eq!(sum("bytes"), j["bytes"].as_u64().unwrap());
    assert_eq!(sum("files"), j["files"].as_u64().unwrap());
    let o = ramsys(&p.key, &["cp", "-r", "--stripe", "--json", &s, &d]);
    assert_ok(&o);
    assert_eq!(summary(&o)["bytes"], 0);
    drop(p.t);
}

/// Issue 36 between two sites: sinks whose fault hook skips every rename
/// of a big file (as the lost-marker race did) leave its pieces verified
/// but the file not placed; each pair's source daemon says so in its
/// RelayPlaced, and the push fails in one line naming the file with a
/// non-zero exit (it exited 0 without it). A daemon asked nothing sends
/// no RelayPlaced (an agent of before reads its relay as before).
/// `--resume` over sound sinks places the file from the kept pieces,
/// moving nothing, and a run again finds it in place.
#[test]
fn a_big_file_no_pairs_sink_placed_fails_the_push_in_one_line() {
    let skip = [("RAMSYS_FAULT_SKIP_PLACE", "1")];
    let mut p = three_pairs_env(0, 0, (&[], &skip));
    std::fs::write(p.src.join("huge"), Rng(6).bytes(24 << 20)).unwrap();
    let (s, d) = (
        format!("ramsys://{}/src", list(&p.a)),
        format!("ramsys://{}/dst", list(&p.b)),
    );
    let o = ramsys(&p.key, &["cp", "-r", "--stripe", &s, &d]);
    assert!(!o.status.success(), "exit 0 without the file");
    let err = stderr(&o);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("no sink placed"))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("src/huge") && lines[0].contains("--resume"),
        "{err}"
    );
    assert!(!p.rb.join("dst/src/huge").exists());
    assert!(p.rb.join("dst/src").is_dir(), "the rest was placed: {err}");
    // What a pair's source daemon says, asked and not: one share of all.
    let relay = |ask: bool, dest: &str| {
        let remote = ramsys_engine::roles::client::Remote {
            transport: std::sync::Arc::new(ramsys_engine::transport::tcp::Tcp {
                socket_buffer: None,
            }),
            addr: p.a[0].addr.clone(),
            key: ramsys_resources::keys::load_existing(&p.key).unwrap(),
            connect_timeout: Duration::from_secs(10),
            user: None,
        };
        let req = ramsys_proto::control::Relay {
            sink: p.b[0].addr.clone(),
            paths: vec![b"src".to_vec()],
            dest: dest.as_bytes().to_vec(),
            recursive: true,
            streams: 0,
            block_size: 1 << 20,
            checksum: false,
            flags: ramsys_engine::request::sync::flags::SYNC,
            select: Default::default(),
            preserve: 0,
            bwlimit: 0,
            cipher: 0,
            share: Some(ramsys_proto::control::Share {
                index: 0,
                weights: vec![1000],
                pieces: ramsys_engine::request::shares::PIECE_ALIGN as u32,
            }),
        };
        let stats = ramsys_engine::Stats::default();
        ramsys_engine::roles::client::relay(&remote, req, &stats, Duration::from_secs(30), ask)
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let (done, placed) = relay(true, "probe");
    assert!(done.error.is_empty(), "{done:?}");
    let placed = placed.expect("asked: a RelayPlaced");
    assert_eq!(placed.cut, vec![b"src/huge".to_vec()]);
    assert_eq!(placed.placed, Some(vec![]), "the sink placed nothing");
    let (done, placed) = relay(false, "probe");
    assert!(
        done.error.is_empty() && placed.is_none(),
        "{done:?} {placed:?}"
    );
    std::fs::remove_dir_all(p.rb.join("probe")).unwrap();
    // Sound sinks: --resume places it from the kept pieces.
    p.b.clear();
    for x in &p.a {
        p.b.push(sink_of(x, &p.rb, &p.key, &[], &[]));
    }
    for (x, y) in p.a.iter().zip(&p.b) {
        wait_peer(&p.key, &[], &x.addr, &y.addr);
    }
    let d = format!("ramsys://{}/dst", list(&p.b));
    let o = ramsys(
        &p.key,
        &["cp", "-r", "--stripe", "--resume", "--json", &s, &d],
    );
    assert_ok(&o);
    assert_eq!(
        summary(&o)["bytes"],
        0,
        "every piece was kept: {}",
        stderr(&o)
    );
    assert_same_tree(&p.src, &p.rb.join("dst/src"));
    assert!(temp_files(&p.rb).is_empty(), "{:?}", temp_files(&p.rb));
    let o = ramsys(
        &p.key,
        &["cp", "-r", "--stripe", "--resume", "--json", &s, &d],
    );
    assert_ok(&o);
    assert_eq!(summary(&o)["ok"], true);
    drop(p.t);
}

/// A pair's source daemon of before (its fault hook ignores the ask, as
/// a daemon of before does) sends no RelayPlaced: which files its share
/// cut is unknown, so nothing is judged and a push whose sinks placed no
/// big file ends as before, exit 0 (as for a sink of before).
#[test]
fn a_relay_of_before_is_not_judged() {
    let old = [("RAMSYS_FAULT_RELAY_OF_BEFORE", "1")];
    let skip = [("RAMSYS_FAULT_SKIP_PLACE", "1")];
    let p = three_pairs_env(0, 0, (&old, &skip));
    std::fs::write(p.src.join("huge"), Rng(7).bytes(24 << 20)).unwrap();
    let (s, d) = (
        format!("ramsys://{}/src", list(&p.a)),
        format!("ramsys://{}/dst", list(&p.b)),
    );
    let o = ramsys(&p.key, &["cp", "-r", "--stripe", "--json", &s, &d]);
    assert_ok(&o);
    assert!(!stderr(&o).contains("no sink placed"), "{}", stderr(&o));
    assert!(!p.rb.join("dst/src/huge").exists(), "the hook placed it");
    drop(p.t);
}

#[test]
fn losing_a_pair_then_resume_finishes() {
    lose_a_pair(false);
}

/// The same with the pair's source daemon killed: the agent's link to it
/// breaks (and the sink's session from it).
#[test]
fn losing_a_source_daemon_then_resume_finishes() {
    lose_a_pair(true);
}

/// Pair 3 dies mid-transfer (its sink, or its source daemon): its share
/// fails alone, nothing is half-written, `--resume` finishes.
fn lose_a_pair(source: bool) {
    let mut p = three_pairs(6, 1 << 20);
    let (s, d) = (
        format!("ramsys://{}/src", list(&p.a)),
        format!("ramsys://{}/dst", list(&p.b)),
    );
    // Paced so that the transfer still runs when B3 dies.
    let mut cmd = std::process::Command::new(bin());
    cmd.args(["cp", "-r", "--stripe", "--json", "--bwlimit", "1M", &s, &d])
        .env("RAMSYS_KEY_FILE", &p.key);
    let child = std::thread::spawn(move || run_with_timeout(cmd, Duration::from_secs(120)));
    let start = Instant::now();
    while temp_files(&p.rb).is_empty() {
        assert!(start.elapsed() < Duration::from_secs(30), "no data arrived");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let victim = if source { &mut p.a[2] } else { &mut p.b[2] };
    let dead = victim.addr.clone();
    victim.kill();
    let o = child.join().unwrap();
    assert!(!o.status.success(), "the dead pair's share failed");
    let j = summary(&o);
    assert_eq!(j["ok"], false, "{j}");
    let failed = j["failed"].to_string();
    assert!(failed.contains(&dead) && failed.contains("--resume"), "{j}");
    let stripes = j["stripes"].as_array().unwrap();
    assert!(stripes[2]["error"].is_string(), "{j}");
    assert!(
        stripes[0]["error"].is_null() && stripes[1]["error"].is_null(),
        "{j}"
    );
    // Nothing under its final name is half-written.
    for i in 0..6 {
        let (x, y) = (
            p.src.join(format!("big{i}")),
            p.rb.join(format!("dst/src/big{i}")),
        );
        if y.exists() {
            assert!(
                std::fs::read(&x).unwrap() == std::fs::read(&y).unwrap(),
                "{y:?}"
            );
        }
    }
    // The same command with --resume: pair 3 does not answer, the other
    // two finish, moving only what is missing.
    let o = ramsys(
        &p.key,
        &["cp", "-r", "--stripe", "--resume", "--json", &s, &d],
    );
    assert_ok(&o);
    assert_same_tree(&p.src, &p.rb.join("dst/src"));
    let j = summary(&o);
    assert_eq!(j["stripes"].as_array().unwrap().len(), 2, "{j}");
    let total: u64 = (0..6).map(|_| 1u64 << 20).sum();
    assert!(
        j["bytes"].as_u64().unwrap() < total,
        "only what was missing moved: {j}"
    );
    assert!(temp_files(&p.rb.join("dst")).is_empty());
}

/// A sink over its `--site-max-load` redirects a session of its own to a
/// less loaded peer, here the source daemon A, which serves another root;
/// a relayed session is never redirected: the tree lands at B.
#[test]
fn a_busy_sink_keeps_a_relayed_session() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let (ra, rb) = (t.path().join("a"), t.path().join("b"));
    std::fs::create_dir_all(&rb).unwrap();
    let src = ra.join("src");
    tree(&src, 1, 1 << 20);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (pa, pb) = (t.path().join("proc-a"), t.path().join("proc-b"));
    let burners = [burn(&pa, 10, stop.clone()), burn(&pb, 40, stop.clone())];
    let a = TestDaemon::start_with(
        &ra,
        &key,
        &[
            "--site-interval",
            "20",
            "--site-sys-root",
            pa.to_str().unwrap(),
        ],
    );
    let b = TestDaemon::start_with(
        &rb,
        &key,
        &[
            "--site-interval",
            "20",
            "--site-sys-root",
            pb.to_str().unwrap(),
            "--site-max-load",
            "30",
            "--peer",
            &a.addr,
        ],
    );
    wait_peer(&key, &[], &a.addr, &b.addr);
    // B sees both loads (its own 40 %, A's 10 %).
    let start = Instant::now();
    loop {
        let o = ramsys(&key, &["status", "--site", "--json", &b.addr]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        let load = |addr: &str| {
            v["members"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|m| m["addr"] == addr)
                .and_then(|m| m["cpu_load"].as_f64())
                .unwrap_or(-1.0)
        };
        if (load(&b.addr) - 0.4).abs() < 0.05 && (load(&a.addr) - 0.1).abs() < 0.05 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "loads: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A push of the agent's own to B goes to A (B is busy, A less loaded).
    let o = ramsys(
        &key,
        &[
            "cp",
            "-r",
            "--json",
            src.to_str().unwrap(),
            &b.url("direct"),
        ],
    );
    assert_ok(&o);
    let j = summary(&o);
    assert_eq!(j["redirect"]["to"], a.addr.as_str(), "{j}");
    // The relay A -> B stays at B.
    let o = ramsys(
        &key,
        &["cp", "-r", "--json", &a.url("src"), &b.url("relayed")],
    );
    assert_ok(&o);
    assert_same_tree(&src, &rb.join("relayed"));
    assert!(!ra.join("relayed").exists());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in burners {
        h.join().unwrap();
    }
}

/// Start `ramsys serve` in namespace `ns` on `addr`; killed on drop.
fn serve_in(ns: &str, addr: &str, root: &Path, key: &Path, extra: &[&str]) -> KillOnDrop {
    let mut child = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            bin(),
            "serve",
            "--listen",
            addr,
            "--root",
        ])
        .arg(root)
        .arg("--key-file")
        .arg(key)
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let addr = listening_addr(&mut child);
    assert!(addr.starts_with("10.79."), "{addr}");
    KillOnDrop(child)
}

/// Six daemons, each in its own network namespace, joined by a bridge in
/// a hub namespace where the agent runs (10.79.0.1; A1-A3 .11-.13, B1-B3
/// .21-.23): the three pairs' data crosses real links, Ai -> bridge -> Bi,
/// and lands byte for byte. Skips when namespaces cannot be made.
#[test]
fn three_pairs_across_network_namespaces() {
    let tag = std::process::id();
    let hub = format!("rpph{tag}");
    if !ip(&["netns", "add", &hub]) {
        eprintln!("skipped: cannot create network namespaces (needs root and ip)");
        return;
    }
    let mut ns = Netns(vec![hub.clone()]);
    for c in [
        vec!["-n", &hub, "link", "set", "lo", "up"],
        vec!["-n", &hub, "link", "add", "br0", "type", "bridge"],
        vec!["-n", &hub, "addr", "add", "10.79.0.1/24", "dev", "br0"],
        vec!["-n", &hub, "link", "set", "br0", "up"],
    ] {
        if !ip(&c) {
            eprintln!("skipped: cannot make a bridge in a namespace (ip {c:?})");
            return;
        }
    }
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let (ra, rb) = (t.path().join("a"), t.path().join("b"));
    std::fs::create_dir_all(&rb).unwrap();
    let src = ra.join("src");
    tree(&src, 6, 256 << 10);
    let addr = |k: u32| format!("10.79.0.{k}:7070");
    for k in [11u32, 12, 13, 21, 22, 23] {
        let d = format!("rppd{k}-{tag}");
        assert!(ip(&["netns", "add", &d]));
        ns.0.push(d.clone());
        let h = format!("hp{k}");
        for c in [
            vec![
                "link", "add", &h, "netns", &hub, "type", "veth", "peer", "name", "eth0", "netns",
                &d,
            ],
            vec!["-n", &hub, "link", "set", &h, "master", "br0", "up"],
            vec![
                "-n",
                &d,
                "addr",
                "add",
                &format!("10.79.0.{k}/24"),
                "dev",
                "eth0",
            ],
            vec!["-n", &d, "link", "set", "eth0", "up"],
            vec!["-n", &d, "link", "set", "lo", "up"],
        ] {
            assert!(ip(&c), "ip {c:?}");
        }
    }
    let mut daemons = vec![];
    let site = ["--site-interval", "50"];
    for i in 1..=3u32 {
        let mut extra = site.to_vec();
        let first = addr(11);
        if i > 1 {
            extra.extend(["--peer", &first]);
        }
        daemons.push(serve_in(
            &format!("rppd{}-{tag}", 10 + i),
            &addr(10 + i),
            &ra,
            &key,
            &extra,
        ));
    }
    for i in 1..=3u32 {
        let mut extra = site.to_vec();
        let source = addr(10 + i);
        extra.extend(["--peer", &source]);
        daemons.push(serve_in(
            &format!("rppd{}-{tag}", 20 + i),
            &addr(20 + i),
            &rb,
            &key,
            &extra,
        ));
    }
    // Each Ai sees Bi (asked from the hub).
    for i in 1..=3u32 {
        let start = Instant::now();
        loop {
            let mut cmd = std::process::Command::new("ip");
            cmd.args(["netns", "exec", &hub, bin(), "status", "--site", "--json"])
                .arg(addr(10 + i))
                .env("RAMSYS_KEY_FILE", &key);
            let o = run_with_timeout(cmd, Duration::from_secs(30));
            if String::from_utf8_lossy(&o.stdout).contains(&format!("\"{}\"", addr(20 + i))) {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "A{i} never saw B{i}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let (s, d) = (
        format!("ramsys://{},{},{}/src", addr(11), addr(12), addr(13)),
        format!("ramsys://{},{},{}/", addr(21), addr(22), addr(23)),
    );
    striped_in_netns(&hub, &key, &s, &d);
    assert_same_tree(&src, &rb.join("src"));
    drop(daemons);
}

/// The agent killed mid-relay: A stops the push (its links to B shut), B
/// keeps its temp files for a resume, nothing under a final name is
/// half-written, and the same command with --resume finishes the tree.
#[test]
fn an_agent_that_goes_away_stops_the_relay() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let (ra, rb) = (t.path().join("a"), t.path().join("b"));
    std::fs::create_dir_all(&rb).unwrap();
    let src = ra.join("src");
    tree(&src, 4, 1 << 20);
    let (a, b) = pair(&ra, &rb, &key, &[]);
    wait_peer(&key, &[], &a.addr, &b.addr);
    let mut agent = std::process::Command::new(bin())
        .args([
            "cp",
            "-r",
            "--json",
            "--bwlimit",
            "512K",
            &a.url("src"),
            &b.url("dst"),
        ])
        .env("RAMSYS_KEY_FILE", &key)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while temp_files(&rb).is_empty() {
        assert!(start.elapsed() < Duration::from_secs(30), "no data arrived");
        std::thread::sleep(Duration::from_millis(20));
    }
    let sessions = |addr: &str| {
        let o = ramsys(&key, &["status", "--json", addr]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["sessions"].as_array().map_or(0, |s| s.len())
    };
    assert_eq!(sessions(&a.addr), 1, "the relay runs at A");
    agent.kill().unwrap();
    agent.wait().unwrap();
    // A's relay session ends within a few progress periods (at 512 KiB/s
    // the 4 MiB would take 8 s more).
    let start = Instant::now();
    while sessions(&a.addr) > 0 || sessions(&b.addr) > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the relay went on without its agent"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for i in 0..4 {
        let (x, y) = (src.join(format!("big{i}")), rb.join(format!("dst/big{i}")));
        if y.exists() {
            assert!(
                std::fs::read(&x).unwrap() == std::fs::read(&y).unwrap(),
                "{y:?}"
            );
        }
    }
    assert!(
        !(0..4).all(|i| rb.join(format!("dst/big{i}")).exists()),
        "the push was stopped before the end"
    );
    let o = ramsys(
        &key,
        &["cp", "-r", "--resume", &a.url("src"), &b.url("dst")],
    );
    assert_ok(&o);
    assert_same_tree(&src, &rb.join("dst"));
}
