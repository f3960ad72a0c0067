//! A daemon serving several users (issue 9): each user's key selects its
//! export root; unknown names fail exactly like wrong keys; one-time
//! credentials are single-use, expire, and inherit the minter's root; the
//! daemon address file appears while `serve --addr-file` runs.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::*;
use ramsys_engine::session::Connect;
use ramsys_engine::transport::tcp::Tcp;
use ramsys_engine::transport::wire::{recv_control, send_control};
use ramsys_proto::auth::ClientHandshake;
use ramsys_proto::Control;

fn write_key(p: &Path, text: &str) -> PathBuf {
    std::fs::write(p, format!("{text}\n")).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p.to_path_buf()
}

struct Site {
    t: tempfile::TempDir,
    d: TestDaemon,
    /// Export roots of alice, bob and carol (read-only).
    a: PathBuf,
    b: PathBuf,
    ka: PathBuf,
    kb: PathBuf,
    kc: PathBuf,
}

const KEY_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const KEY_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

fn site() -> Site {
    let t = tempfile::tempdir().unwrap();
    let p = t.path();
    for d in ["a", "b", "shared", "keys"] {
        std::fs::create_dir(p.join(d)).unwrap();
    }
    let ka = write_key(&p.join("keys/alice"), KEY_A);
    let kb = write_key(&p.join("keys/bob"), KEY_B);
    let kc = write_key(&p.join("keys/carol"), "cccccccccccccccccccccccccccccccc");
    std::fs::write(
        p.join("users.toml"),
        "[[user]]\nname = \"alice\"\nkey_file = \"keys/alice\"\nroot = \"a\"\n\n\
         [[user]]\nname = \"bob\"\nkey_file = \"keys/bob\"\nroot = \"b\"\n\n\
         [[user]]\nname = \"carol\"\nkey_file = \"keys/carol\"\nroot = \"a\"\nread_only = true\n",
    )
    .unwrap();
    // The shared key exists but must not be accepted in users mode.
    let shared = key_file(p);
    let users = p.join("users.toml");
    let d = TestDaemon::start_with(
        &p.join("shared"),
        &shared,
        &["--users", users.to_str().unwrap()],
    );
    Site {
        a: p.join("a"),
        b: p.join("b"),
        ka,
        kb,
        kc,
        d,
        t,
    }
}

/// `ramsys ARGS` as `user` with `key`.
fn as_user(user: &str, key: &Path, args: &[&str]) -> Output {
    let mut c = Command::new(bin());
    c.args(args)
        .env("RAMSYS_KEY_FILE", key)
        .env("RAMSYS_USER", user);
    run_with_timeout(c, Duration::from_secs(120))
}

fn file(p: &Path, text: &str) -> String {
    std::fs::write(p, text).unwrap();
    p.to_str().unwrap().to_string()
}

#[test]
fn each_user_lands_in_its_own_root_and_cannot_leave_it() {
    let s = site();
    let fa = file(&s.t.path().join("fa"), "alice's data");
    let fb = file(&s.t.path().join("fb"), "bob's data");
    assert_ok(&as_user("alice", &s.ka, &["cp", &fa, &s.d.url("x")]));
    assert_ok(&as_user("bob", &s.kb, &["cp", &fb, &s.d.url("x")]));
    assert_eq!(std::fs::read(s.a.join("x")).unwrap(), b"alice's data");
    assert_eq!(std::fs::read(s.b.join("x")).unwrap(), b"bob's data");
    assert!(!s.t.path().join("shared/x").exists());

    // Bob pulls "x": his own file, not alice's.
    let back = s.t.path().join("back");
    assert_ok(&as_user(
        "bob",
        &s.kb,
        &["cp", &s.d.url("x"), back.to_str().unwrap()],
    ));
    assert_eq!(std::fs::read(&back).unwrap(), b"bob's data");

    // Paths cannot climb out of bob's root: ".." is refused...
    let o = as_user(
        "bob",
        &s.kb,
        &[
            "cp",
            &s.d.url("../a/x"),
            s.t.path().join("stolen").to_str().unwrap(),
        ],
    );
    assert!(!o.status.success());
    assert!(!s.t.path().join("stolen").exists());
    // ...and so are symlinks out of it, read or written through.
    std::os::unix::fs::symlink(&s.a, s.b.join("to_a")).unwrap();
    let o = as_user(
        "bob",
        &s.kb,
        &[
            "cp",
            &s.d.url("to_a/x"),
            s.t.path().join("stolen").to_str().unwrap(),
        ],
    );
    assert!(!o.status.success(), "read through a link out of the root");
    assert!(
        stderr(&o).contains("outside the daemon root"),
        "{}",
        stderr(&o)
    );
    assert!(!s.t.path().join("stolen").exists());
    let o = as_user("bob", &s.kb, &["cp", &fb, &s.d.url("to_a/y")]);
    assert!(!o.status.success(), "write through a link out of the root");
    assert!(!s.a.join("y").exists());
    assert_eq!(std::fs::read(s.a.join("x")).unwrap(), b"alice's data");

    // Carol shares alice's root read-only: she may read, not write.
    let cback = s.t.path().join("cback");
    assert_ok(&as_user(
        "carol",
        &s.kc,
        &["cp", &s.d.url("x"), cback.to_str().unwrap()],
    ));
    assert_eq!(std::fs::read(&cback).unwrap(), b"alice's data");
    let o = as_user("carol", &s.kc, &["cp", &fb, &s.d.url("z")]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("may only read"), "{}", stderr(&o));
    assert!(!s.a.join("z").exists());
}

#[test]
fn wrong_key_and_unknown_user_fail_the_same_way() {
    let s = site();
    let f = file(&s.t.path().join("f"), "data");
    let shared = s.t.path().join("key");
    let runs = [
        ("alice", &s.kb),      // a known user with another user's key
        ("mallory", &s.ka),    // an unknown user with a valid key
        ("mallory", &shared),  // an unknown user with the shared key
        ("otp-0123", &shared), // a token name that was never minted
    ];
    let mut messages = Vec::new();
    for (user, key) in runs {
        let o = as_user(user, key, &["cp", &f, &s.d.url("f")]);
        assert!(!o.status.success(), "{user} got in");
        assert_eq!(o.status.code(), Some(1));
        messages.push(stderr(&o));
    }
    assert!(
        messages[0].contains("authentication failed"),
        "{messages:?}"
    );
    assert!(
        messages.iter().all(|m| *m == messages[0]),
        "messages differ: {messages:?}"
    );
    assert!(!s.a.join("f").exists() && !s.b.join("f").exists());

    // On the wire: a Hello under a guessed key gets the same Error, at the
    // same step (the Hello: no Challenge), for a known and an unknown name
    // (the unknown one runs against the daemon's decoy key).
    let mut replies = Vec::new();
    for user in ["alice", "nobody"] {
        let t = Tcp::default();
        let mut l =
            ramsys_engine::transport::Transport::connect(&t, &s.d.addr, Duration::from_secs(5))
                .unwrap();
        ramsys_engine::transport::wire::exchange_preamble(&mut *l).unwrap();
        let mut hs = ClientHandshake::new(b"guess-guess-guess", user);
        send_control(&mut *l, &hs.hello().unwrap()).unwrap();
        replies.push(recv_control(&mut *l).unwrap());
    }
    assert_eq!(replies[0], replies[1]);
    assert!(
        matches!(&replies[0], Control::Error { message, .. } if message == "authentication failed")
    );
}

fn mint(user: &str, key: &Path, addr: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["token", "--daemon", addr, "--json"];
    args.extend_from_slice(extra);
    let o = as_user(user, key, &args);
    assert_ok(&o);
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn one_time_credentials_work_once_in_the_minters_root() {
    let s = site();
    let tok = mint("alice", &s.ka, &s.d.addr, &[]);
    let name = tok["user"].as_str().unwrap().to_string();
    assert!(name.starts_with("otp-"), "{tok}");
    assert_eq!(tok["expires_s"], 60);
    assert_eq!(tok["daemon"], s.d.addr.as_str());
    let tkey = write_key(&s.t.path().join("token.key"), tok["key"].as_str().unwrap());
    let f = file(&s.t.path().join("f"), "via token");
    assert_ok(&as_user(&name, &tkey, &["cp", &f, &s.d.url("t1")]));
    // The token carries alice's root.
    assert_eq!(std::fs::read(s.a.join("t1")).unwrap(), b"via token");
    assert!(!s.b.join("t1").exists());
    // Replayed: refused, like any wrong credential.
    let o = as_user(&name, &tkey, &["cp", &f, &s.d.url("t2")]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("authentication failed"),
        "{}",
        stderr(&o)
    );
    assert!(!s.a.join("t2").exists());

    // Expired before use: refused.
    let tok = mint("bob", &s.kb, &s.d.addr, &["--ttl", "1"]);
    assert_eq!(tok["expires_s"], 1);
    let tkey = write_key(&s.t.path().join("token2.key"), tok["key"].as_str().unwrap());
    std::thread::sleep(Duration::from_millis(1500));
    let o = as_user(
        tok["user"].as_str().unwrap(),
        &tkey,
        &["cp", &f, &s.d.url("late")],
    );
    assert!(!o.status.success());
    assert!(!s.b.join("late").exists());

    // A token cannot mint another (and is spent by trying).
    let tok = mint("bob", &s.kb, &s.d.addr, &[]);
    let tkey = write_key(&s.t.path().join("token3.key"), tok["key"].as_str().unwrap());
    let o = as_user(
        tok["user"].as_str().unwrap(),
        &tkey,
        &["token", "--daemon", &s.d.addr],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("cannot mint"), "{}", stderr(&o));

    // Only the minter's own key mints: an unknown user gets nothing.
    let o = as_user("mallory", &s.ka, &["token", "--daemon", &s.d.addr]);
    assert!(!o.status.success());
    assert!(o.stdout.is_empty());
}

#[test]
fn token_in_process_with_an_explicit_user() {
    // The engine API the ssh helper uses: request_token, then a Remote
    // whose `user` is the credential's name.
    let s = site();
    let t = std::sync::Arc::new(Tcp::default());
    let remote = ramsys_engine::roles::client::Remote {
        transport: t.clone(),
        addr: s.d.addr.clone(),
        key: KEY_B.as_bytes().to_vec(),
        connect_timeout: Duration::from_secs(5),
        user: Some("bob".into()),
    };
    let c = ramsys_engine::roles::client::request_token(&remote, 30).unwrap();
    assert_eq!(c.expires_s, 30);
    assert_eq!(c.key.len(), 64);
    let st = Connect::new(&s.d.addr, c.key.as_bytes(), Duration::from_secs(5))
        .user(c.user.clone())
        .open(&*t);
    assert!(st.is_ok(), "{:?}", st.err());
    let again = Connect::new(&s.d.addr, c.key.as_bytes(), Duration::from_secs(5))
        .user(c.user.clone())
        .open(&*t);
    assert!(again.is_err());
}

#[test]
fn status_shows_a_user_only_its_own_root() {
    let s = site();
    let o = as_user("bob", &s.kb, &["status", "--json", &s.d.addr]);
    assert_ok(&o);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let users = v["users"].as_array().unwrap();
    assert_eq!(users.len(), 1, "{v}");
    assert_eq!(users[0]["name"], "bob");
    let b = s.b.canonicalize().unwrap();
    assert_eq!(users[0]["root"], b.to_str().unwrap());
    assert_eq!(v["root"], b.to_str().unwrap());
}

#[test]
fn addr_file_lets_token_find_the_daemon_and_goes_at_exit() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let af = t.path().join("run/daemon.addr");
    let mut d = TestDaemon::start_with(&root, &key, &["--addr-file", af.to_str().unwrap()]);
    let text = std::fs::read_to_string(&af).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(d.addr.as_str()));
    assert_eq!(lines.next(), Some(d.child.id().to_string().as_str()));
    assert_eq!(
        std::fs::metadata(&af).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // Shared-key daemon: the token user lands in the daemon's root.
    let o = ramsys(&key, &["token", "--addr-file", af.to_str().unwrap()]);
    assert_ok(&o);
    let out = String::from_utf8(o.stdout).unwrap();
    let field = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{k} ")))
            .unwrap_or_else(|| panic!("no {k} in {out}"))
            .to_string()
    };
    let tkey = write_key(&t.path().join("tk"), &field("key"));
    let f = file(&t.path().join("f"), "shared root");
    assert_ok(&as_user(&field("user"), &tkey, &["cp", &f, &d.url("f")]));
    assert_eq!(std::fs::read(root.join("f")).unwrap(), b"shared root");

    // SIGTERM: the daemon removes its address file on the way out.
    unsafe { libc::kill(d.child.id() as i32, libc::SIGTERM) };
    let st = d.child.wait().unwrap();
    assert!(!st.success());
    assert!(!af.exists(), "address file left behind");
    // And a token request now says where it looked.
    let o = ramsys(&key, &["token", "--addr-file", af.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no daemon address"), "{}", stderr(&o));
    d.kill();
}

#[test]
fn bad_users_file_is_one_clear_line() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let u = t.path().join("users.toml");
    std::fs::write(&u, "[[user]]\nname = \"alice\"\nroot = \"/tmp\"\n").unwrap();
    let o = ramsys(
        &key,
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--users",
            u.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.contains("users file") && e.contains("missing `key_file`"),
        "{e}"
    );
    assert_eq!(e.trim().lines().count(), 1, "{e}");
}
