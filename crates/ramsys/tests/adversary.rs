//! A daemon and a site that hold against their own users (issue 34): a
//! user with a valid key tries what docs/SECURITY.md's threat model says it
//! cannot do, and each test checks the daemon did not do it.
//!
//! - Set-ID files: no user lands a set-user-ID or set-group-ID file owned
//!   by anyone but its own identity (users table as root, a single-key
//!   daemon as a service user); root to root keeps rsync's behaviour.
//!
//! - Watch channels (issue 38): operations naming `..`, absolute paths,
//!   another user's root or a reserved name are refused one by one.
//!
//! Needs root for the owner cases (CI runs as root); those skip with the
//! reason printed otherwise.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;

fn is_root() -> bool {
    // SAFETY: no failure mode.
    unsafe { libc::geteuid() == 0 }
}

fn write_key(p: &Path, text: &str) -> PathBuf {
    std::fs::write(p, format!("{text}\n")).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p.to_path_buf()
}

/// `ramsys ARGS` as `user` with `key`.
fn as_user(user: &str, key: &Path, args: &[&str]) -> Output {
    let mut c = Command::new(bin());
    c.args(args)
        .env("RAMSYS_KEY_FILE", key)
        .env("RAMSYS_USER", user);
    run_with_timeout(c, Duration::from_secs(120))
}

/// A source tree of set-ID files: `u` 4755 and `g` 2755 (owned by root),
/// `n` 6755 owned by nobody:nogroup (as root), and `plain` 0755.
fn setid_tree(src: &Path) {
    std::fs::create_dir_all(src).unwrap();
    for (name, mode) in [("u", 0o4755), ("g", 0o2755), ("plain", 0o755)] {
        std::fs::write(src.join(name), b"#!/bin/sh\nid\n").unwrap();
        std::fs::set_permissions(src.join(name), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    if is_root() {
        std::fs::write(src.join("n"), b"#!/bin/sh\nid\n").unwrap();
        std::os::unix::fs::chown(src.join("n"), Some(65534), Some(65534)).unwrap();
        std::fs::set_permissions(src.join("n"), std::fs::Permissions::from_mode(0o6755)).unwrap();
    }
}

/// (mode & 0o7777, uid) of every file under `dir`, by name.
fn modes(dir: &Path) -> Vec<(String, u32, u32)> {
    let mut v: Vec<(String, u32, u32)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let md = e.metadata().unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                md.mode() & 0o7777,
                md.uid(),
            )
        })
        .collect();
    v.sort();
    v
}

/// No file under `dir` carries a set-ID bit while owned by someone other
/// than `owner_ok(uid)`.
fn assert_no_foreign_setid(dir: &Path, owner_ok: impl Fn(u32) -> bool, what: &str) {
    for (name, mode, uid) in modes(dir) {
        assert!(
            mode & 0o6000 == 0 || owner_ok(uid),
            "{what}: {name} is {mode:o} owned by uid {uid}"
        );
    }
}

#[test]
fn plain_copies_drop_set_id_bits_everywhere() {
    // cp and rsync without -p drop them (checked against both below).
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    setid_tree(&src);
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = TestDaemon::start(&root, &key);
    let s = format!("{}/", src.display());
    assert_ok(&ramsys(&key, &["cp", "-r", &s, &d.url("push")]));
    let local = t.path().join("local");
    assert_ok(&ramsys(&key, &["cp", "-r", &s, local.to_str().unwrap()]));
    let pulled = t.path().join("pulled");
    assert_ok(&ramsys(
        &key,
        &["cp", "-r", &d.url("push/"), pulled.to_str().unwrap()],
    ));
    for dir in [root.join("push"), local, pulled] {
        for (name, mode, _) in modes(&dir) {
            assert_eq!(mode & 0o6000, 0, "{}: {name} {mode:o}", dir.display());
        }
    }
    let rs = t.path().join("rsync");
    // The oracle agrees (where rsync is installed: scripts/install-deps.sh).
    let o = Command::new("rsync").args(["-r", &s]).arg(&rs).output();
    if o.is_ok_and(|o| o.status.success()) {
        assert!(modes(&rs).iter().all(|m| m.1 & 0o6000 == 0), "rsync -r");
    }
}

/// A users-table daemon running as root: alice's plain and archive pushes
/// of set-ID files (one owned by nobody) land none owned by root or
/// anyone but... nobody: files stay the daemon's, so no bit at all.
#[test]
fn users_daemon_lands_no_set_id_file() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path();
    for d in ["a", "shared", "keys"] {
        std::fs::create_dir(p.join(d)).unwrap();
    }
    let ka = write_key(&p.join("keys/alice"), "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
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
    let src = p.join("src");
    setid_tree(&src);
    let s = format!("{}/", src.display());
    for (flags, dest) in [("-r", "plain"), ("-a", "archive")] {
        for round in 0..2 {
            let o = as_user("alice", &ka, &["cp", flags, &s, &d.url(dest)]);
            assert_ok(&o);
            assert_no_foreign_setid(&p.join("a").join(dest), |_| false, dest);
            // The second run finds nothing to change (sync converges on
            // what may be kept).
            if round == 1 && flags == "-a" {
                let o = as_user("alice", &ka, &["sync", flags, "--json", &s, &d.url(dest)]);
                assert_ok(&o);
                let j = summary(&o);
                assert_eq!(j["files"].as_u64(), Some(0), "second sync moved files: {j}");
            }
        }
    }
}

/// A single-key daemon run as a service user (the package's `ramsys`
/// user; here nobody): an archive push cannot give files the source's
/// owner, so they stay the service user's, without set-ID bits.
#[test]
fn service_user_daemon_lands_no_foreign_set_id_file() {
    if !is_root() {
        eprintln!("skipped: needs root to start a daemon as another user");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let p = t.path();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    let root = p.join("root");
    std::fs::create_dir(&root).unwrap();
    std::os::unix::fs::chown(&root, Some(65534), Some(65534)).unwrap();
    let key = key_file(p);
    std::os::unix::fs::chown(&key, Some(65534), Some(65534)).unwrap();
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", bin()])
        .args(["serve", "--listen", "127.0.0.1:0", "--root"])
        .arg(&root)
        .arg("--key-file")
        .arg(&key)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let d = TestDaemon::spawn(c, &root);
    let src = p.join("src");
    setid_tree(&src);
    let s = format!("{}/", src.display());
    assert_ok(&ramsys(&key, &["cp", "-a", &s, &d.url("archive")]));
    // nobody is the service user here: a file the source named as owned
    // by nobody may keep its bits; nothing else may carry any.
    for (name, mode, uid) in modes(&root.join("archive")) {
        assert_eq!(uid, 65534, "{name}: the service user owns every file");
        if name != "n" {
            assert_eq!(mode & 0o6000, 0, "{name}: {mode:o}");
        }
    }
}

/// Root to root with `-a` keeps rsync's behaviour: the owner follows, so
/// do the bits (through a single-key daemon and locally).
#[test]
fn archive_root_to_root_keeps_set_id_bits_with_their_owner() {
    if !is_root() {
        eprintln!("skipped: needs root to keep owners");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    setid_tree(&src);
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = TestDaemon::start(&root, &key);
    let s = format!("{}/", src.display());
    assert_ok(&ramsys(&key, &["cp", "-a", &s, &d.url("push")]));
    let local = t.path().join("local");
    assert_ok(&ramsys(&key, &["cp", "-a", &s, local.to_str().unwrap()]));
    let want = modes(&src);
    assert_eq!(modes(&root.join("push")), want);
    assert_eq!(modes(&local), want);
}

// ---------------------------------------------------------------------
// The site: daemon identity, verified members, sealed links (issue 34).
// ---------------------------------------------------------------------

const KEY_ALICE: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const KEY_BOB: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const KEY_SITE: &str = "ssssssssssssssssssssssssssssssss";

/// A users table with alice, bob and the site identity, each its own key
/// and root; returns (dir, users.toml, shared key file).
fn users_site() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let p = t.path();
    for d in ["a", "b", "site", "shared", "keys"] {
        std::fs::create_dir(p.join(d)).unwrap();
    }
    write_key(&p.join("keys/alice"), KEY_ALICE);
    write_key(&p.join("keys/bob"), KEY_BOB);
    write_key(&p.join("keys/site"), KEY_SITE);
    let users = p.join("users.toml");
    std::fs::write(
        &users,
        "[[user]]\nname = \"alice\"\nkey_file = \"keys/alice\"\nroot = \"a\"\n\n\
         [[user]]\nname = \"bob\"\nkey_file = \"keys/bob\"\nroot = \"b\"\n\n\
         [[user]]\nname = \"site\"\nkey_file = \"keys/site\"\nroot = \"site\"\n",
    )
    .unwrap();
    let shared = key_file(p);
    (t, users, shared)
}

fn site_daemon(t: &Path, users: &Path, shared: &Path, extra: &[&str]) -> TestDaemon {
    let mut args = vec!["--users", users.to_str().unwrap(), "--site-interval", "50"];
    args.extend_from_slice(extra);
    TestDaemon::start_with(&t.join("shared"), shared, &args)
}

/// `addr`'s site view as alice sees it (`status --site --json`).
fn view_as(user: &str, key: &Path, addr: &str) -> serde_json::Value {
    let o = as_user(user, key, &["status", "--site", "--json", addr]);
    assert_ok(&o);
    serde_json::from_slice(&o.stdout).expect("status --site --json is JSON")
}

fn member_addrs(v: &serde_json::Value) -> Vec<String> {
    v["members"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|m| m["addr"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// A listener that accepts and holds connections without a word (a
/// tarpit, or a rogue address someone wants data sent to); counts them.
fn silent_listener() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let n2 = n.clone();
    std::thread::spawn(move || {
        let mut held = vec![];
        for c in l.incoming().flatten() {
            n2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            held.push(c);
        }
    });
    (addr, n)
}

/// alice, holding only her own key, cannot join the site (she once could,
/// and then had sessions redirected and relays sent to her address).
#[test]
fn a_user_key_cannot_join_the_site() {
    let (t, users, shared) = users_site();
    let d = site_daemon(t.path(), &users, &shared, &[]);
    let (rogue, _) = silent_listener();
    let e = ramsys_engine::daemon::site::dial(&d.addr, &rogue, "alice", KEY_ALICE.as_bytes())
        .err()
        .expect("alice's SiteHello is refused");
    assert!(
        e.to_string().contains("only the site identity may join"),
        "{e}"
    );
    std::thread::sleep(Duration::from_millis(500));
    let ka = t.path().join("keys/alice");
    let v = view_as("alice", &ka, &d.addr);
    assert!(!member_addrs(&v).contains(&rogue), "{v:#}");
}

/// The site credential joins, but the address it announces becomes a
/// member only if it answers the site handshake itself: a silent or
/// third-party address never does; a real daemon of the site does.
#[test]
fn an_announced_address_must_answer_the_site_handshake() {
    let (t, users, shared) = users_site();
    let a = site_daemon(t.path(), &users, &shared, &[]);
    let b = site_daemon(t.path(), &users, &shared, &[]);
    let (rogue, dialled) = silent_listener();
    let _l = ramsys_engine::daemon::site::dial(&a.addr, &rogue, "site", KEY_SITE.as_bytes())
        .expect("the site identity joins");
    let _l2 = ramsys_engine::daemon::site::dial(&a.addr, &b.addr, "site", KEY_SITE.as_bytes())
        .expect("the site identity joins");
    let ka = t.path().join("keys/alice");
    let start = std::time::Instant::now();
    loop {
        let v = view_as("alice", &ka, &a.addr);
        let m = member_addrs(&v);
        if m.contains(&b.addr) {
            assert!(!m.contains(&rogue), "{v:#}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "B never admitted: {v:#}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The check dialled the rogue address (and got no answer); it stays out.
    std::thread::sleep(Duration::from_secs(2));
    assert!(dialled.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    let v = view_as("alice", &ka, &a.addr);
    assert!(!member_addrs(&v).contains(&rogue), "{v:#}");
}

/// OnBehalf on a link that is not sealed is refused, even from the site
/// identity: unsealed, it could have been rewritten on the path (alice's
/// relay turned OnBehalf{alice} into OnBehalf{bob}). A user's own sealed
/// link cannot claim another user either.
#[test]
fn on_behalf_needs_a_sealed_link_and_the_site_identity() {
    use ramsys_proto::Control;
    let (t, users, shared) = users_site();
    let d = site_daemon(t.path(), &users, &shared, &[]);
    let tcp = ramsys_engine::transport::tcp::Tcp {
        socket_buffer: None,
    };
    let try_behalf = |user: &str, key: &str, seal: bool| -> String {
        let mut s =
            ramsys_engine::session::Connect::new(&d.addr, key.as_bytes(), Duration::from_secs(5))
                .user(user)
                .open(&tcp)
                .unwrap();
        if seal {
            let c = ramsys_engine::transport::crypto::Cipher::preferred();
            ramsys_engine::transport::wire::send_control(
                &mut *s.ctl,
                &Control::SealControl { cipher: c.id() },
            )
            .unwrap();
            let inner =
                std::mem::replace(&mut s.ctl, Box::new(ramsys_engine::transport::ClosedLink));
            s.ctl = Box::new(
                ramsys_engine::transport::sealed::SealedLink::new(
                    inner,
                    c,
                    &s.session_key,
                    ramsys_engine::transport::sealed::End::Client,
                    u32::from(s.auth_pending),
                )
                .unwrap(),
            );
        }
        ramsys_engine::transport::wire::send_control(
            &mut *s.ctl,
            &Control::OnBehalf { user: "bob".into() },
        )
        .unwrap();
        loop {
            match ramsys_engine::transport::wire::recv_control(&mut *s.ctl) {
                Ok(Control::Error { message, .. }) => return message,
                Ok(_) => continue,
                Err(e) => return e.to_string(),
            }
        }
    };
    let m = try_behalf("site", KEY_SITE, false);
    assert!(m.contains("sealed"), "{m}");
    let m = try_behalf("alice", KEY_ALICE, true);
    assert!(m.contains("may not act for another user"), "{m}");
    assert_eq!(std::fs::read_dir(t.path().join("b")).unwrap().count(), 0);
}

/// Ten configured members that accept and never answer (tarpits) cost
/// the real member nothing: its view stays fresh (under 1 s), and a
/// redirect never goes to a tarpit.
#[test]
fn tarpit_members_do_not_stall_the_site() {
    let (t, users, shared) = users_site();
    let b = site_daemon(t.path(), &users, &shared, &[]);
    let mut extra: Vec<String> = vec!["--peer".into(), b.addr.clone()];
    let mut tarpits = vec![];
    for _ in 0..10 {
        let (addr, _) = silent_listener();
        extra.extend(["--peer".into(), addr.clone()]);
        tarpits.push(addr);
    }
    let args: Vec<&str> = extra.iter().map(|s| s.as_str()).collect();
    let a = site_daemon(t.path(), &users, &shared, &args);
    let ka = t.path().join("keys/alice");
    std::thread::sleep(Duration::from_secs(3));
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        let v = view_as("alice", &ka, &a.addr);
        let age = |addr: &str| {
            v["members"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["addr"] == addr)
                .and_then(|m| m["age_ms"].as_u64())
                .unwrap_or(u64::MAX)
        };
        assert!(age(&a.addr) < 1000, "own view stale: {v:#}");
        assert!(age(&b.addr) < 1000, "B's view stale: {v:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A watch channel (issue 38) as alice of a users-table daemon: WatchOpen
/// on `dest`, then each op in a WatchOps of its own. The channel's refusal
/// (Error) or each op's result.
fn watch_as(
    addr: &str,
    user: &str,
    key: &str,
    dest: &[u8],
    ops: &[ramsys_proto::control::WatchOp],
) -> Result<Vec<ramsys_proto::control::WatchResult>, String> {
    use ramsys_engine::transport::wire::{recv_control, send_control};
    use ramsys_proto::control::WATCH_VERSION;
    use ramsys_proto::Control;
    let tcp = ramsys_engine::transport::tcp::Tcp {
        socket_buffer: None,
    };
    let mut s = ramsys_engine::session::Connect::new(addr, key.as_bytes(), Duration::from_secs(5))
        .user(user)
        .open(&tcp)
        .unwrap();
    let open = Control::WatchOpen {
        version: WATCH_VERSION,
        dest: dest.to_vec(),
    };
    send_control(&mut *s.ctl, &open).unwrap();
    match recv_control(&mut *s.ctl).unwrap() {
        Control::WatchReady { .. } => {}
        Control::Error { message, .. } => return Err(message),
        m => panic!("expected WatchReady, got {}", m.name()),
    }
    let mut out = Vec::new();
    for (seq, op) in ops.iter().enumerate() {
        let seq = seq as u64 + 1;
        let m = Control::WatchOps {
            seq,
            ops: vec![op.clone()],
        };
        send_control(&mut *s.ctl, &m).unwrap();
        match recv_control(&mut *s.ctl).unwrap() {
            Control::WatchDone { seq: got, results } if got == seq => out.extend(results),
            m => panic!("expected WatchDone {seq}, got {}", m.name()),
        }
    }
    Ok(out)
}

/// A watch channel is peer input (issue 38, docs/SECURITY.md): alice's
/// renames, deletes and directory attributes naming `..`, absolute paths,
/// bob's root (directly or through a symlink in her own), or a name
/// ramsys reserves are each refused in one line, and nothing outside her
/// destination, nor her journal, changes; a channel opened on such a
/// destination, or by a read-only user, is refused.
#[test]
fn hostile_watch_operations_are_refused() {
    use ramsys_proto::control::{WatchOp, WatchResult};
    let (t, users, shared) = users_site();
    let p = t.path();
    // carol: read-only, in alice's root.
    write_key(&p.join("keys/carol"), "cccccccccccccccccccccccccccccccc");
    let mut table = std::fs::read_to_string(&users).unwrap();
    table.push_str(
        "\n[[user]]\nname = \"carol\"\nkey_file = \"keys/carol\"\nroot = \"a\"\nread_only = true\n",
    );
    std::fs::write(&users, table).unwrap();
    let d = TestDaemon::start_with(
        &p.join("shared"),
        &shared,
        &["--users", users.to_str().unwrap()],
    );
    let (a, b) = (p.join("a"), p.join("b"));
    std::fs::create_dir_all(a.join("m/dir")).unwrap();
    std::fs::write(a.join("m/f"), b"alice").unwrap();
    std::fs::write(a.join("m/.ramsys-journal.sqlite"), b"journal").unwrap();
    std::fs::write(b.join("secret"), b"bob's").unwrap();
    std::os::unix::fs::symlink(&b, a.join("m/tobob")).unwrap();
    let s = |x: &str| x.as_bytes().to_vec();
    let ren = |from: &str, to: &str, dir: bool| WatchOp::Rename {
        from: s(from),
        to: s(to),
        dir,
    };
    let del = |path: &str, dir: bool| WatchOp::Delete { path: s(path), dir };
    let attrs = |path: &str| WatchOp::DirAttrs {
        path: s(path),
        mode: 0o777,
        mtime_s: 0,
        mtime_ns: 0,
    };
    let ops = [
        ren("f", "../../b/stolen", false),
        ren("f", "../f2", false),
        ren("f", "/tmp/stolen", false),
        ren("../../b/secret", "got", false),
        ren("f", "tobob/stolen", false),
        ren("tobob/secret", "got", false),
        ren("dir", "dir/inside/itself", true),
        ren("f", ".ramsys-journal.sqlite", false),
        ren(".ramsys-journal.sqlite", "j", false),
        ren("f", "dir/.f.ramsys-00000000000000ab.part", false),
        del("../../b/secret", false),
        del("/etc/hostname", false),
        del("tobob/secret", false),
        del("../../b", true),
        del(".ramsys-journal.sqlite", false),
        del("", true),
        del("../a\nforged line", false),
        attrs("../../b"),
        attrs("tobob/.."),
        attrs("/tmp"),
    ];
    let results = watch_as(&d.addr, "alice", KEY_ALICE, b"m", &ops).unwrap();
    assert_eq!(results.len(), ops.len());
    for (op, r) in ops.iter().zip(&results) {
        match r {
            WatchResult::Failed(m) => {
                assert!(!m.is_empty() && !m.contains('\n'), "{op:?}: {m:?}");
            }
            other => panic!("{op:?} was not refused: {other:?}"),
        }
    }
    assert_eq!(std::fs::read(b.join("secret")).unwrap(), b"bob's");
    assert_eq!(
        std::fs::read_dir(&b).unwrap().count(),
        1,
        "bob's root changed"
    );
    assert_eq!(std::fs::read(a.join("m/f")).unwrap(), b"alice");
    let journal = std::fs::read(a.join("m/.ramsys-journal.sqlite")).unwrap();
    assert_eq!(journal, b"journal");
    assert!(!a.join("f2").exists() && !a.join("m/got").exists());
    assert!(!std::path::Path::new("/tmp/stolen").exists());
    assert!(a.join("m/tobob").is_symlink() && a.join("m/dir").is_dir());
    // Her own renames still work on the same kind of channel.
    let ok = watch_as(&d.addr, "alice", KEY_ALICE, b"m", &[ren("f", "g", false)]);
    assert_eq!(ok, Ok(vec![WatchResult::Done]));
    // Channels refused at WatchOpen, each in one line.
    for (user, key, dest) in [
        ("alice", KEY_ALICE, &b"../b"[..]),
        ("alice", KEY_ALICE, b"/tmp"),
        ("alice", KEY_ALICE, b"m/tobob"),
        ("alice", KEY_ALICE, b"m/.ramsys-journal.sqlite"),
        ("carol", "cccccccccccccccccccccccccccccccc", b"m"),
    ] {
        let what = format!("{user} on {}", String::from_utf8_lossy(dest));
        match watch_as(&d.addr, user, key, dest, &[del("g", false)]) {
            Err(m) => assert!(!m.is_empty() && !m.contains('\n'), "{what}: {m:?}"),
            Ok(r) => panic!("{what}: channel opened: {r:?}"),
        }
    }
    assert!(a.join("m/g").exists(), "a refused channel deleted");
}
