//! `[USER@]HOST:PATH` endpoints over the system ssh (issue 9), against an
//! sshd of our own on loopback (generated host and user keys, a config in
//! a temp dir): push, pull, rename, third-party, sync, the one-line
//! errors, the remote end's lifetime, and the one-time credential (never
//! in argv or environments, never usable twice). The `ssh-serve` tests at
//! the end run the remote end directly, without ssh.
//!
//! (Over 800 lines: every file under tests/ is a test binary of its own
//! that links the whole engine, so one feature's tests stay in one file;
//! shared helpers live in tests/common.)

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::sshd::*;
use common::*;

fn run(sshd: &Sshd, pre: &[&str], opts: &[String], paths: &[&str]) -> Output {
    let mut c = Command::new(bin());
    c.args(pre).args(opts).args(paths);
    // The agent's own key file is not used by ssh transfers; keep it in
    // the test's directory anyway so nothing lands in $HOME.
    c.env("RAMSYS_KEY_FILE", sshd.dir.path().join("ramsys-key"));
    let o = run_with_timeout(c, Duration::from_secs(120));
    if !o.status.success() {
        eprintln!("sshd log: {:?}", sshd.log.lock().unwrap());
    }
    o
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

fn remote(p: &Path) -> String {
    format!("127.0.0.1:{}", p.display())
}

/// The one error line of a failed run.
fn one_error_line(o: &Output) -> String {
    assert!(!o.status.success(), "expected failure: {o:?}");
    let e = stderr(o);
    let lines: Vec<&str> = e.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line, got {e:?}");
    assert!(lines[0].starts_with("ramsys: error: "), "{e:?}");
    lines[0].to_string()
}

#[test]
fn push_pull_and_rename_over_ssh() {
    let Some(sshd) = Sshd::start() else { return };
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make_varied_tree(&src, 65536);
    let opts = sshd.opts();

    // Push a tree into an existing remote directory.
    let dst = t.path().join("pushed");
    std::fs::create_dir(&dst).unwrap();
    let o = run(
        &sshd,
        &["cp", "-r", "--block-size", "64K"],
        &opts,
        &[&s(&src), &format!("{}/", remote(&dst))],
    );
    assert_ok(&o);
    assert_same_tree(&src, &dst.join("src"));
    assert!(temp_files(&dst).is_empty());

    // Pull it back.
    let back = t.path().join("pulled");
    std::fs::create_dir(&back).unwrap();
    let o = run(
        &sshd,
        &["cp", "-r", "--block-size", "64K"],
        &opts,
        &[&remote(&src), &s(&back)],
    );
    assert_ok(&o);
    assert_same_tree(&src, &back.join("src"));

    // One file to a new name on the remote.
    let f = src.join("sub/size_4_196625");
    let o = run(
        &sshd,
        &["cp"],
        &opts,
        &[&s(&f), &remote(&t.path().join("pushed/newname"))],
    );
    assert_ok(&o);
    assert_eq!(
        std::fs::read(t.path().join("pushed/newname")).unwrap(),
        std::fs::read(&f).unwrap()
    );

    // IPv6 in brackets, with a user: ssh-serve listens on ::1, where the
    // ssh connection arrived.
    if ipv6() {
        let o = run(
            &sshd,
            &["cp", "--explain"],
            &opts,
            &[&s(&f), &format!("root@[::1]:{}/v6name", dst.display())],
        );
        assert_ok(&o);
        assert!(stderr(&o).contains("-> [::1]:"), "{}", stderr(&o));
        assert_eq!(
            std::fs::read(dst.join("v6name")).unwrap(),
            std::fs::read(&f).unwrap()
        );
    } else {
        eprintln!("no IPv6 loopback: IPv6 endpoint not tested");
    }
}

/// `--remote-ramsys auto` (issue 20): with no ramsys of ours on the remote
/// PATH, the agent copies its own binary into the remote user's cache
/// (`$XDG_CACHE_HOME/ramsys/bin/`, set per test through ssh's SetEnv),
/// runs it from there, and finds it there the next time.
#[test]
fn remote_ramsys_auto_copies_this_binary_into_the_users_cache() {
    let Some(sshd) = Sshd::start() else { return };
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make_varied_tree(&src, 65536);
    let cache = t.path().join("cache");
    let mut opts = sshd.opts_with(&sshd.key(), "auto");
    opts.extend([
        "--ssh-opt".into(),
        format!("SetEnv=XDG_CACHE_HOME={}", cache.display()),
    ]);
    let version = format!("ramsys {}", env!("CARGO_PKG_VERSION"));
    // sshd's PATH for root (Debian): a ramsys of our version there is used
    // as it is, and nothing is copied.
    let on_path = Command::new("sh")
        .arg("-c")
        .arg("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin ramsys --version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == version)
        .unwrap_or(false);
    let cached = cache.join("ramsys/bin").join(format!(
        "ramsys-{}-{}",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH
    ));
    for (round, dst) in ["first", "second"].iter().enumerate() {
        let dst = t.path().join(dst);
        let o = run(&sshd, &["cp", "-r"], &opts, &[&s(&src), &remote(&dst)]);
        assert_ok(&o);
        assert_same_tree(&src, &dst);
        let copied = stderr(&o).contains("copying this one to");
        if on_path {
            eprintln!("a ramsys {version} is on the remote PATH: nothing to copy");
            assert!(!copied && !cached.exists());
            continue;
        }
        // Copied the first time only; the same bytes, private to the user.
        assert_eq!(copied, round == 0, "{}", stderr(&o));
        assert_eq!(
            std::fs::read(&cached).unwrap(),
            std::fs::read(bin()).unwrap()
        );
        let mode = std::fs::metadata(&cached).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert_eq!(
            std::fs::read_dir(cached.parent().unwrap()).unwrap().count(),
            1
        );
    }
}

#[test]
fn third_party_copy_between_two_remote_dirs() {
    let Some(sshd) = Sshd::start() else { return };
    let t = tempfile::tempdir().unwrap();
    let a = t.path().join("a");
    make_varied_tree(&a, 65536);
    let b = t.path().join("b");
    std::fs::create_dir(&b).unwrap();
    let o = run(
        &sshd,
        &["cp", "-r", "--json", "--block-size", "64K"],
        &sshd.opts(),
        &[&remote(&a), &remote(&b)],
    );
    assert_ok(&o);
    assert_same_tree(&a, &b.join("a"));
    let v = summary(&o);
    assert_eq!(v["ok"], true, "{v}");
    assert!(v["files"].as_u64().unwrap() > 10, "{v}");

    // To a new name; the human form ends in cp's summary line.
    let plain = t.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    for i in 0..5 {
        std::fs::write(
            plain.join(format!("f{i}")),
            Rng(i + 1).bytes(70_000 * i as usize),
        )
        .unwrap();
    }
    let c = t.path().join("c");
    std::fs::create_dir(&c).unwrap();
    let o = run(
        &sshd,
        &["cp", "-r"],
        &sshd.opts(),
        &[&remote(&plain), &remote(&c.join("renamed"))],
    );
    assert_ok(&o);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("copied"),
        "{o:?}"
    );
    assert_same_tree(&plain, &c.join("renamed"));

    // A missing source on HOST1 fails, nonzero, and says which.
    let o = run(
        &sshd,
        &["cp", "-r"],
        &sshd.opts(),
        &[&remote(&t.path().join("nope")), &remote(&c)],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("nope"), "{o:?}");
}

#[test]
fn sync_over_ssh_sends_only_changes() {
    let Some(sshd) = Sshd::start() else { return };
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make_varied_tree(&src, 65536);
    let dst = t.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let sync = |extra: &[&str]| {
        let mut pre = vec!["sync", "-r", "--json", "--block-size", "64K"];
        pre.extend_from_slice(extra);
        let o = run(&sshd, &pre, &sshd.opts(), &[&s(&src), &remote(&dst)]);
        assert_ok(&o);
        summary(&o)
    };
    sync(&[]);
    assert_same_tree(&src, &dst.join("src"));
    let again = sync(&[]);
    assert_eq!(again["bytes"], 0, "{again}");
    assert!(again["unchanged"].as_u64().unwrap() > 10, "{again}");

    std::fs::write(src.join("sub/size_0_1"), b"Z").unwrap();
    std::fs::remove_file(src.join("m600")).unwrap();
    let v = sync(&["--delete"]);
    assert_eq!(v["files"], 1, "{v}");
    assert_eq!(v["deleted"], 1, "{v}");
    assert_same_tree(&src, &dst.join("src"));

    // Third-party sync: the same flags reach HOST1's ramsys.
    let other = t.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let tp = |pre: &[&str]| {
        let o = run(&sshd, pre, &sshd.opts(), &[&remote(&src), &remote(&other)]);
        assert_ok(&o);
        summary(&o)
    };
    tp(&["sync", "-r", "--json"]);
    assert_same_tree(&src, &other.join("src"));
    let v = tp(&["sync", "-r", "--json"]);
    assert_eq!(v["bytes"], 0, "{v}");
}

/// Relative paths of the regular files under `d`.
fn files_under(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = snapshot(d)
        .into_keys()
        .filter(|p| d.join(p).symlink_metadata().unwrap().is_file())
        .collect();
    v.sort();
    v
}

#[test]
fn selection_rules_apply_over_ssh_push_pull_and_third_party() {
    // Issue 20: the rules travel to whichever end scans (the remote
    // source's ssh-serve, or HOST1's ramsys in a third-party copy), and a
    // remote sink keeps excluded files from --delete.
    let Some(sshd) = Sshd::start() else { return };
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make_varied_tree(&src, 4096);
    std::fs::write(src.join("skip.o"), b"o").unwrap();
    std::fs::write(src.join("sub/keep.c"), b"c").unwrap();
    let rules = ["--include", "*/", "--include", "*.c", "--exclude", "*"];
    let want = vec!["sub/keep.c".to_string()];
    let from = format!("{}/", s(&src));
    let rfrom = format!("{}/", remote(&src));
    let (push, pull, third) = (t.path().join("p"), t.path().join("l"), t.path().join("3"));
    for (a, b, dst) in [
        (from.clone(), remote(&push), &push),
        (rfrom.clone(), s(&pull), &pull),
        (rfrom.clone(), remote(&third), &third),
    ] {
        let mut pre = vec!["sync", "-r", "--json"];
        pre.extend_from_slice(&rules);
        for _ in 0..2 {
            let o = run(&sshd, &pre, &sshd.opts(), &[&a, &b]);
            assert_ok(&o);
        }
        assert_eq!(files_under(dst), want, "{a} -> {b}");
    }
    // --delete through a remote sink leaves what the rules exclude.
    std::fs::write(push.join("mine.o"), b"keep").unwrap();
    std::fs::write(push.join("sub/stale.c"), b"go").unwrap();
    let mut pre = vec!["sync", "-r", "--json", "--delete"];
    pre.extend_from_slice(&rules);
    let o = run(&sshd, &pre, &sshd.opts(), &[&from, &remote(&push)]);
    assert_ok(&o);
    assert_eq!(summary(&o)["deleted"], 1);
    assert!(push.join("mine.o").exists() && !push.join("sub/stale.c").exists());
    // Issue 35: rsync's wildmatch and rule forms give rsync's tree over
    // ssh too, in each direction and third-party (the rules travel as
    // --filter rules to HOST1).
    std::fs::write(src.join("-x-"), b"dash").unwrap();
    let rules = [
        "--exclude",
        "-x-",
        "-f",
        "- deep/**/d1[0-5]/***",
        "--filter",
        "exclude,! */",
        "--include",
        "this never matters",
        "--exclude",
        "/empty dir/",
    ];
    let reference = t.path().join("ref");
    let o = std::process::Command::new("rsync")
        .arg("-r")
        .args(rules)
        .arg(&from)
        .arg(&reference)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let want = snapshot(&reference).into_keys().collect::<Vec<_>>();
    assert!(want.iter().any(|p| p.ends_with("d9")) && !want.iter().any(|p| p.ends_with("d10")));
    assert!(!want.iter().any(|p| p.starts_with("empty dir")), "{want:?}");
    for (i, (a, b)) in [
        (from.clone(), "p35"),
        (rfrom.clone(), "l35"),
        (rfrom.clone(), "t35"),
    ]
    .into_iter()
    .enumerate()
    {
        let dst = t.path().join(b);
        let b = if i == 1 { s(&dst) } else { remote(&dst) };
        let mut pre = vec!["sync", "-r", "--json"];
        pre.extend_from_slice(&rules);
        assert_ok(&run(&sshd, &pre, &sshd.opts(), &[&a, &b]));
        let got = snapshot(&dst).into_keys().collect::<Vec<_>>();
        assert_eq!(got, want, "{a} -> {b}");
    }
}

#[test]
fn data_goes_through_ssh_when_asked_or_when_the_port_is_unreachable() {
    // Issue 20: hosts that accept only ssh. --ssh-tunnel carries every
    // link over the ssh connection; without it, an offered port that
    // cannot be reached (here ssh-serve advertises 127.0.0.1:1, where
    // nothing listens, as a firewall would make it) falls back to that
    // with one line, and the copy is the same.
    let Some(sshd) = Sshd::start() else { return };
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make_varied_tree(&src, 65536);
    let wrapper = t.path().join("ramsys-firewalled");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\ncmd=$1; shift\nexec {} \"$cmd\" --advertise 127.0.0.1:1 \"$@\"\n",
            bin()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let firewalled = sshd.opts_with(&sshd.key(), wrapper.to_str().unwrap());
    let cases: [(&str, &[&str], &[String], bool); 3] = [
        ("push, --ssh-tunnel", &["--ssh-tunnel"], &sshd.opts(), false),
        ("push, firewalled", &[], &firewalled, true),
        ("pull, firewalled", &[], &firewalled, true),
    ];
    for (i, (what, extra, opts, says)) in cases.into_iter().enumerate() {
        let dst = t.path().join(format!("d{i}"));
        let (from, to) = if what.starts_with("pull") {
            (remote(&src), s(&dst))
        } else {
            (s(&src), remote(&dst))
        };
        for run_no in 0..2 {
            let mut pre = vec!["sync", "-r", "--json", "--connect-timeout", "3"];
            pre.extend_from_slice(extra);
            let o = run(&sshd, &pre, opts, &[&from, &to]);
            assert_ok(&o);
            let err = stderr(&o);
            let said = err.contains("carrying the data through ssh");
            assert_eq!(said, says, "{what}, run {run_no}: {err}");
            assert_eq!(err.lines().count(), usize::from(says), "{what}: {err}");
        }
        assert_same_tree(&src, &dst.join("src"));
    }
}

#[test]
fn remote_failures_are_one_line_and_nonzero() {
    let Some(sshd) = Sshd::start() else { return };
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("f");
    std::fs::write(&f, b"data").unwrap();

    // A destination whose directory does not exist.
    let o = run(
        &sshd,
        &["cp"],
        &sshd.opts(),
        &[&s(&f), "127.0.0.1:/nonexistent/dir/x"],
    );
    let l = one_error_line(&o);
    assert!(l.contains("127.0.0.1:/nonexistent/dir/x"), "{l}");
    assert!(l.contains("does not exist"), "{l}");

    // A source that does not exist: a failure of that path (the other
    // sources would still be copied), named as typed, as for a local one.
    let o = run(
        &sshd,
        &["cp"],
        &sshd.opts(),
        &["127.0.0.1:/nonexistent/y", &s(t.path())],
    );
    assert!(!o.status.success(), "{o:?}");
    assert_eq!(
        stderr(&o).trim(),
        "ramsys: failed: /nonexistent/y: No such file or directory (os error 2)"
    );

    // ramsys missing on the remote.
    let o = run(
        &sshd,
        &["cp"],
        &sshd.opts_with(&sshd.key(), "/nonexistent/bin/ramsys"),
        &[&s(&f), &remote(&t.path().join("g"))],
    );
    let l = one_error_line(&o);
    assert!(l.contains("ramsys not found"), "{l}");
    assert!(l.contains("/nonexistent/bin/ramsys"), "{l}");

    // A key sshd does not accept: ssh's own message, shown.
    let o = run(
        &sshd,
        &["cp"],
        &sshd.opts_with(&sshd.dir.path().join("other_key"), bin()),
        &[&s(&f), &remote(&t.path().join("g"))],
    );
    let l = one_error_line(&o);
    assert!(l.contains("ssh failed"), "{l}");
    assert!(l.contains("Permission denied"), "{l}");
    assert!(!t.path().join("g").exists());
}

/// Command lines and environments of all processes, by pid.
fn processes() -> Vec<(u32, String, Vec<u8>)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        v.push((pid, cmd, env));
    }
    v
}

/// Alive and not a zombie.
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn wait_gone(pid: u32, what: &str) {
    let end = Instant::now() + Duration::from_secs(30);
    while running(pid) {
        assert!(Instant::now() < end, "{what} (pid {pid}) still running");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A long transfer: a 40 GB synthetic file into a null sink, so the
/// session is still running while the test looks at it.
fn long_push(sshd: &Sshd, opts: &[String], dst: &str) -> Child {
    Command::new(bin())
        .args([
            "cp",
            "--source-engine",
            "null",
            "--null-size",
            "40G",
            "--sink-engine",
            "null",
        ])
        .args(opts)
        .args(["/dev/null", dst])
        .env("RAMSYS_KEY_FILE", sshd.dir.path().join("ramsys-key"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A process whose command line starts with `prefix` and mentions
/// `marker` (a test's unique path).
fn find_process(marker: &str, prefix: &str) -> Option<u32> {
    processes()
        .into_iter()
        .find(|(_, c, _)| c.starts_with(prefix) && c.contains(marker))
        .map(|(p, _, _)| p)
}

fn wait_for_process(marker: &str, prefix: &str) -> u32 {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(p) = find_process(marker, prefix) {
            return p;
        }
        assert!(Instant::now() < end, "no {prefix} process for {marker}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn killed_agent_leaves_no_remote_process() {
    let Some(sshd) = Sshd::start() else { return };
    let t = tempfile::tempdir().unwrap();
    let dst = t.path().join("killed-agent-dst");
    std::fs::create_dir(&dst).unwrap();
    let marker = s(&dst);
    let mut agent = long_push(&sshd, &sshd.opts(), &format!("{}/", remote(&dst)));
    let serve = wait_for_process(&marker, &format!("{} ssh-serve", bin()));
    let ssh = wait_for_process(&marker, "ssh ");
    // Let the session start moving data, then kill the agent outright.
    std::thread::sleep(Duration::from_millis(500));
    assert!(running(serve), "the transfer ended before the kill");
    agent.kill().unwrap();
    agent.wait().unwrap();
    wait_gone(serve, "remote ssh-serve");
    wait_gone(ssh, "ssh client");
}

#[test]
fn credential_never_in_argv_or_environment() {
    let Some(sshd) = Sshd::start() else { return };
    let t = tempfile::tempdir().unwrap();
    // A --remote-ramsys wrapper that records the credential it is handed
    // on stdin (the test's only way to learn it) and passes it on.
    let cred_dir = t.path().join("creds");
    std::fs::create_dir(&cred_dir).unwrap();
    let wrapper = t.path().join("ramsys-wrapper");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nIFS= read -r cred\nprintf '%s\\n' \"$cred\" > {dir}/cred.$$\n\
             {{ printf '%s\\n' \"$cred\"; exec cat; }} | {bin} \"$@\"\n",
            dir = cred_dir.display(),
            bin = bin()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let opts = sshd.opts_with(&sshd.key(), &s(&wrapper));

    // Third party: one ssh-serve (HOST2) and one cp --key-stdin (HOST1).
    let a = t.path().join("cred-src");
    std::fs::create_dir(&a).unwrap();
    let b = t.path().join("cred-dst");
    std::fs::create_dir(&b).unwrap();
    let mut agent = Command::new(bin())
        .args([
            "cp",
            "--source-engine",
            "null",
            "--null-size",
            "40G",
            "--sink-engine",
            "null",
        ])
        .args(&opts)
        .args([remote(&a), remote(&b)])
        .env("RAMSYS_KEY_FILE", sshd.dir.path().join("ramsys-key"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let serve = wait_for_process(&s(&b), &format!("{} ssh-serve", bin()));
    let cp = wait_for_process(&s(&a), &format!("{} cp --key-stdin", bin()));
    // Both credentials recorded: the sink's, and the same one given to
    // HOST1's cp (it is the sink's one-time credential).
    let end = Instant::now() + Duration::from_secs(30);
    let creds: Vec<String> = loop {
        let v: Vec<String> = std::fs::read_dir(&cred_dir)
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .map(|c| c.trim().to_string())
            .filter(|c| !c.is_empty())
            .collect();
        if v.len() >= 2 || Instant::now() > end {
            break v;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(creds.len(), 2, "{creds:?}");
    assert_eq!(creds[0], creds[1]);
    let cred = &creds[0];
    assert_eq!(cred.len(), 64);
    assert!(cred.bytes().all(|b| b.is_ascii_hexdigit()));
    std::thread::sleep(Duration::from_millis(300));
    assert!(running(serve) && running(cp), "transfer over too early");

    let procs = processes();
    let mut seen = 0;
    for (pid, cmd, env) in &procs {
        assert!(
            !cmd.contains(cred.as_str()),
            "credential in argv of {pid}: {cmd}"
        );
        assert!(
            !env.windows(cred.len()).any(|w| w == cred.as_bytes()),
            "credential in environment of {pid} ({cmd})"
        );
        if cmd.contains("ssh-serve") || cmd.contains("--key-stdin") {
            seen += 1;
        }
    }
    assert!(seen >= 2, "did not see the remote processes");
    let ps = Command::new("ps").args(["-eo", "args"]).output();
    if let Ok(ps) = ps {
        assert!(!String::from_utf8_lossy(&ps.stdout).contains(cred.as_str()));
    }
    agent.kill().unwrap();
    agent.wait().unwrap();
    wait_gone(serve, "remote ssh-serve");
    // Nor in any file the transfer touched (the wrapper's record aside).
    for dir in [&a, &b] {
        for e in walk(dir) {
            let data = std::fs::read(&e).unwrap_or_default();
            assert!(!data.windows(64).any(|w| w == cred.as_bytes()), "{e:?}");
        }
    }
}

fn walk(p: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(p).unwrap().flatten() {
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

// ---- ssh-serve without ssh ----------------------------------------------

struct Serve {
    child: Child,
    addr: String,
    dest: String,
}

fn ssh_serve(cwd: &Path, cred: &str, args: &[&str]) -> Serve {
    let mut child = Command::new(bin())
        .args(["ssh-serve", "--role", "sink"])
        .args(args)
        .current_dir(cwd)
        .env_remove("SSH_CONNECTION")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.as_mut().unwrap(), "{cred}").unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&f[..3], ["ramsys-ssh", "v1", "listen"], "{line:?}");
    assert_eq!(f[4], "dest", "{line:?}");
    Serve {
        child,
        addr: f[3].to_string(),
        dest: f[5].to_string(),
    }
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn exit_within(c: &mut Child, t: Duration) -> std::process::ExitStatus {
    let end = Instant::now() + t;
    loop {
        if let Some(s) = c.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < end, "ssh-serve did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn child_stderr(c: &mut Child) -> String {
    let mut e = String::new();
    c.stderr.take().unwrap().read_to_string(&mut e).unwrap();
    e
}

/// `cp --key-stdin FILE ramsys://ADDR/DEST` with `key` on stdin.
fn cp_key_stdin(key: &str, file: &Path, url: &str) -> Output {
    let mut c = Command::new(bin())
        .args(["cp", "--key-stdin"])
        .arg(file)
        .arg(url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(c.stdin.take().unwrap(), "{key}").unwrap();
    c.wait_with_output().unwrap()
}

#[test]
fn serve_one_session_then_exit_credential_single_use() {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir(t.path().join("sub")).unwrap();
    let f = t.path().join("f");
    std::fs::write(&f, b"hello").unwrap();
    let cred = "5a".repeat(32);
    // Relative paths resolve against the working directory (under ssh:
    // the home directory).
    let mut sv = ssh_serve(t.path(), &cred, &["--", "sub/newname"]);
    assert_eq!(sv.dest, hex("newname"));
    assert!(sv.addr.starts_with("127.0.0.1:"), "{}", sv.addr);
    let url = format!("ramsys://{}/newname", sv.addr);

    // A wrong credential is refused and does not use the session up.
    let o = cp_key_stdin(&"00".repeat(32), &f, &url);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("authentication failed"), "{o:?}");

    let o = cp_key_stdin(&cred, &f, &url);
    assert_ok(&o);
    assert_eq!(
        std::fs::read(t.path().join("sub/newname")).unwrap(),
        b"hello"
    );
    assert!(exit_within(&mut sv.child, Duration::from_secs(30)).success());
    // The daemon is gone with its one session: the credential is worth
    // nothing now.
    let o = cp_key_stdin(&cred, &f, &url);
    assert!(!o.status.success());
}

#[test]
fn credential_refused_for_a_second_concurrent_session() {
    use ramsys_engine::session::{finish_auth, Connect};
    use ramsys_engine::transport::tcp::Tcp;
    let t = tempfile::tempdir().unwrap();
    let cred = "c3".repeat(32);
    let mut sv = ssh_serve(t.path(), &cred, &["--", "."]);
    // The sink's root is DST's parent; DST is named in it (issue 15).
    let name = t.path().file_name().unwrap().to_str().unwrap();
    assert_eq!(sv.dest, hex(name));
    let tcp = Tcp {
        socket_buffer: None,
    };
    let timeout = Duration::from_secs(10);
    let mut first = Connect::new(&sv.addr, cred.as_bytes(), timeout)
        .pipelined(&tcp)
        .unwrap();
    finish_auth(&mut *first.ctl, &sv.addr, first.session).unwrap();
    // Same credential, while the first session is open: refused.
    let second = Connect::new(&sv.addr, cred.as_bytes(), timeout)
        .pipelined(&tcp)
        .and_then(|mut s| finish_auth(&mut *s.ctl, &sv.addr, s.session));
    let e = second.expect_err("second session with a used credential");
    assert!(e.to_string().contains("already used"), "{e}");
    // The first session ends without a request: ssh-serve exits with it.
    drop(first);
    let st = exit_within(&mut sv.child, Duration::from_secs(30));
    assert!(!st.success());
    assert!(child_stderr(&mut sv.child).contains("ramsys: error: "));

    // A sink session cannot be used to read: Open of the other role is
    // refused.
    let mut sv = ssh_serve(t.path(), &cred, &["--", "."]);
    let mut s = Connect::new(&sv.addr, cred.as_bytes(), timeout)
        .pipelined(&tcp)
        .unwrap();
    finish_auth(&mut *s.ctl, &sv.addr, s.session).unwrap();
    let open = ramsys_proto::control::Open {
        server_role: ramsys_proto::control::Role::Source,
        paths: vec![b"etc/passwd".to_vec()],
        recursive: false,
        streams: 1,
        block_size: 65536,
        checksum: true,
    };
    ramsys_engine::transport::wire::send_control(&mut *s.ctl, &ramsys_proto::Control::Open(open))
        .unwrap();
    match ramsys_engine::transport::wire::recv_control(&mut *s.ctl) {
        Ok(ramsys_proto::Control::Error { message, .. }) => {
            assert!(message.contains("role"), "{message}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    drop(s);
    exit_within(&mut sv.child, Duration::from_secs(30));
}

#[test]
fn serve_exits_on_stdin_eof_and_on_accept_timeout() {
    let t = tempfile::tempdir().unwrap();
    let cred = "11".repeat(32);
    let mut sv = ssh_serve(t.path(), &cred, &["--", "."]);
    drop(sv.child.stdin.take());
    assert!(!exit_within(&mut sv.child, Duration::from_secs(30)).success());
    assert!(child_stderr(&mut sv.child).contains("agent went away"));

    let mut sv = ssh_serve(t.path(), &cred, &["--accept-timeout", "1", "--", "."]);
    assert!(!exit_within(&mut sv.child, Duration::from_secs(30)).success());
    assert!(child_stderr(&mut sv.child).contains("no agent connected"));

    // No credential, or a malformed one: one line, nonzero, nothing bound.
    let o = Command::new(bin())
        .args(["ssh-serve", "--role", "sink", "--", "."])
        .current_dir(t.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(o.stdout.is_empty());
    assert!(stderr(&o).contains("credential"), "{o:?}");
}

/// Issue 9: "uses the daemon there if one runs for that user". Needs the
/// users interface (`ramsys token`); skipped with a reason without it.
#[test]
fn ssh_serve_uses_a_running_daemon_for_the_user() {
    let has_token = Command::new(bin())
        .args(["token", "--help"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_token {
        eprintln!("skipping: this build has no `ramsys token` (one-time credentials)");
        return;
    }
    let TreeAndDaemon {
        t,
        key,
        src,
        root,
        d,
    } = tree_and_daemon(65536);
    std::fs::create_dir(root.join("in")).unwrap();
    let serve = |path: &Path| {
        let mut c = Command::new(bin())
            .args(["ssh-serve", "--role", "sink", "--"])
            .arg(path)
            .env("RAMSYS_KEY_FILE", &key)
            .env("RAMSYS_DAEMON", &d.addr)
            .env_remove("SSH_CONNECTION")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        writeln!(c.stdin.as_mut().unwrap(), "{}", "77".repeat(32)).unwrap();
        let mut line = String::new();
        BufReader::new(c.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        (c, line)
    };
    let (mut c, line) = serve(&root.join("in"));
    // The daemon's address and a credential it minted; ssh-serve then
    // only relays links through ssh (crate::tunnel) until the agent
    // closes its stdin.
    let f: Vec<&str> = line.split_whitespace().collect();
    let field = |k: &str| {
        f.iter()
            .position(|w| *w == k)
            .map(|i| f[i + 1].to_string())
            .unwrap_or_else(|| panic!("no {k} in {line:?}"))
    };
    assert_eq!(field("listen"), d.addr, "{line}");
    assert_eq!(field("dest"), hex("in"));
    let user = field("user");
    assert!(user.starts_with("otp-"), "{line}");
    let cred = String::from_utf8(
        (0..field("key").len() / 2)
            .map(|i| u8::from_str_radix(&field("key")[2 * i..2 * i + 2], 16).unwrap())
            .collect(),
    )
    .unwrap();
    drop(c.stdin.take());
    assert!(exit_within(&mut c, Duration::from_secs(30)).success());
    let mut cp = Command::new(bin())
        .args(["cp", "-r", "--key-stdin"])
        .arg(&src)
        .arg(format!("ramsys://{}/in", d.addr))
        .env("RAMSYS_USER", &user)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(cp.stdin.take().unwrap(), "{cred}").unwrap();
    let o = cp.wait_with_output().unwrap();
    assert_ok(&o);
    assert_same_tree(&src, &root.join("in/src"));

    // Outside that daemon's root: a daemon of its own, as without one.
    let (mut c, line) = serve(t.path());
    assert!(!line.contains(" user "), "{line}");
    assert!(!line.contains(&d.addr), "{line}");
    drop(c.stdin.take());
    let _ = exit_within(&mut c, Duration::from_secs(30));
}

/// Issue 15 over ssh: `sync` into a destination that does not exist, with
/// and without a trailing slash, pushed and pulled, three runs (one file
/// changed before the third): exactly one copy, run 2 moves nothing.
#[test]
fn sync_over_ssh_converges_with_rsyncs_trailing_slash_rule() {
    let Some(sshd) = Sshd::start() else { return };
    for (pull, slash) in [(false, false), (false, true), (true, false), (true, true)] {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        make_varied_tree(&src, 4096);
        let dst = t.path().join("x");
        let copy = if slash { dst.clone() } else { dst.join("src") };
        let slashed = |p: String| if slash { format!("{p}/") } else { p };
        let (from, to) = if pull {
            (slashed(remote(&src)), s(&dst))
        } else {
            (slashed(s(&src)), remote(&dst))
        };
        let what = format!("pull {pull}, slash {slash}");
        let sync = || {
            let o = run(
                &sshd,
                &["sync", "-r", "--json"],
                &sshd.opts(),
                &[&from, &to],
            );
            assert_ok(&o);
            summary(&o)
        };
        sync();
        let v = sync();
        assert_eq!(v["bytes"], 0, "{what}: {v}");
        assert_eq!(v["files"], 0, "{what}: {v}");
        std::fs::write(src.join("changed"), b"third run").unwrap();
        let v = sync();
        assert_eq!(v["files"], 1, "{what}: {v}");
        assert_same_tree(&src, &copy);
        if !slash {
            let names: Vec<_> = std::fs::read_dir(&dst).unwrap().collect();
            assert_eq!(names.len(), 1, "{what}: one copy only");
        }
    }
}

/// Issue 15 over ssh: `cp -r --resume` to a destination that did not
/// exist, the agent killed mid-transfer, then the same command: the copy
/// lands once at DST, less than all is re-sent, no temp file is left.
#[test]
fn cp_resume_over_ssh_continues_in_place() {
    let Some(sshd) = Sshd::start() else { return };
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let mut rng = Rng(3);
    for i in 0..12 {
        std::fs::write(src.join(format!("f{i}")), rng.bytes(1 << 20)).unwrap();
    }
    let total = 12u64 << 20;
    // The remote sink writes slowly so the kill lands mid-transfer.
    let wrapper = t.path().join("slow-ramsys");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nRAMSYS_FAULT_SLOW_WRITE_US=15000 exec {} \"$@\"\n",
            bin()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let dst = t.path().join("x");
    let mut args: Vec<String> = ["cp", "-r", "--json", "--resume", "--block-size", "64K"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(sshd.opts_with(&sshd.key(), &s(&wrapper)));
    args.extend([s(&src), remote(&dst)]);
    let mut agent = Command::new(bin())
        .args(&args)
        .env("RAMSYS_KEY_FILE", sshd.dir.path().join("ramsys-key"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while temp_files(t.path()).len() < 2 && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    agent.kill().unwrap();
    agent.wait().unwrap();
    // The remote end notices its agent is gone and ends the session.
    let t0 = Instant::now();
    while find_process(&s(&dst), bin()).is_some() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut c = Command::new(bin());
    c.args(&args)
        .env("RAMSYS_KEY_FILE", sshd.dir.path().join("ramsys-key"));
    let o = run_with_timeout(c, Duration::from_secs(120));
    assert_ok(&o);
    let sent = summary(&o)["bytes"].as_u64().unwrap();
    assert!(sent < total, "retry sent {sent} of {total}");
    assert_same_tree(&src, &dst);
    assert!(
        temp_files(t.path()).is_empty(),
        "{:?}",
        temp_files(t.path())
    );
}

/// Volumes over ssh (issue 18): an image into a remote block device (with
/// --write-devices; refused without), then a sync of a changed local device
/// into it moves only the changed blocks, and a pull reads the remote
/// device back.
#[test]
fn volumes_over_ssh() {
    use common::loopdev::Loop;
    let Some(sshd) = Sshd::start() else { return };
    let t = tempfile::tempdir_in("/var/tmp").unwrap();
    let size = 16usize << 20;
    let img = t.path().join("src.img");
    let mut want = Rng(21).bytes(size);
    std::fs::write(&img, &want).unwrap();
    let dimg = t.path().join("dst.img");
    std::fs::write(&dimg, vec![0u8; size]).unwrap();
    let (Some(dst), Some(src)) = (Loop::attach(&dimg), Loop::attach(&img)) else {
        return;
    };
    let rdev = format!("127.0.0.1:{}", dst.path());
    let o = run(&sshd, &["cp", "--json"], &sshd.opts(), &[&s(&img), &rdev]);
    assert!(one_error_line(&o).contains("--write-devices"));
    assert!(dst.read().iter().all(|&b| b == 0), "device untouched");
    let o = run(
        &sshd,
        &["cp", "--write-devices", "--json"],
        &sshd.opts(),
        &[&s(&img), &rdev],
    );
    assert_ok(&o);
    assert!(dst.read() == want);

    // Change two 256 KiB blocks of the local device, sync it over.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(src.path())
        .unwrap();
    for off in [1usize << 20, 9 << 20] {
        want[off..off + 512].fill(0xAB);
        std::os::unix::fs::FileExt::write_all_at(&f, &[0xAB; 512], off as u64).unwrap();
    }
    f.sync_all().unwrap();
    let o = run(
        &sshd,
        &["sync", "--write-devices", "--json"],
        &sshd.opts(),
        &[src.path(), &rdev],
    );
    assert_ok(&o);
    let v = summary(&o);
    assert_eq!(v["bytes"], 2 * (256 << 10), "{v}");
    assert!(dst.read() == want);

    // Pull the remote device into an image file.
    let back = t.path().join("back.img");
    let o = run(&sshd, &["cp", "--json"], &sshd.opts(), &[&rdev, &s(&back)]);
    assert_ok(&o);
    assert!(std::fs::read(&back).unwrap() == want);
}
