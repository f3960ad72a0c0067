//! Seed 002 channels end to end: two veth pairs between two network
//! namespaces (client side A, daemon side B, one /24 shared by all four
//! addresses). `cp --explain` must show the streams spread over both of the
//! client's NICs, each stream's local address being its NIC's. Skips when
//! namespaces cannot be created (not root, no `ip`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

struct Netns {
    names: [String; 2],
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

fn sh(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn setup() -> Option<Netns> {
    let tag = std::process::id();
    let (a, b) = (format!("rsA{tag}"), format!("rsB{tag}"));
    if !sh(&["ip", "netns", "add", &a]) {
        return None;
    }
    let ns = Netns {
        names: [a.clone(), b.clone()],
    };
    if !sh(&["ip", "netns", "add", &b]) {
        return None;
    }
    let cmds: Vec<Vec<String>> = vec![
        vec![
            "ip", "link", "add", "ca0", "netns", &a, "type", "veth", "peer", "name", "sb0",
            "netns", &b,
        ],
        vec![
            "ip", "link", "add", "ca1", "netns", &a, "type", "veth", "peer", "name", "sb1",
            "netns", &b,
        ],
        vec!["ip", "-n", &a, "addr", "add", "10.77.0.1/24", "dev", "ca0"],
        vec!["ip", "-n", &a, "addr", "add", "10.77.0.11/24", "dev", "ca1"],
        vec!["ip", "-n", &b, "addr", "add", "10.77.0.2/24", "dev", "sb0"],
        vec!["ip", "-n", &b, "addr", "add", "10.77.0.12/24", "dev", "sb1"],
        vec!["ip", "-n", &a, "link", "set", "lo", "up"],
        vec!["ip", "-n", &b, "link", "set", "lo", "up"],
        vec!["ip", "-n", &a, "link", "set", "ca0", "up"],
        vec!["ip", "-n", &a, "link", "set", "ca1", "up"],
        vec!["ip", "-n", &b, "link", "set", "sb0", "up"],
        vec!["ip", "-n", &b, "link", "set", "sb1", "up"],
    ]
    .into_iter()
    .map(|v| v.into_iter().map(String::from).collect())
    .collect();
    for c in cmds {
        let c: Vec<&str> = c.iter().map(String::as_str).collect();
        if !sh(&c) {
            return None;
        }
    }
    Some(ns)
}

#[test]
fn streams_spread_over_two_nics_with_bound_source_addresses() {
    let Some(ns) = setup() else {
        eprintln!("skipping: cannot create network namespaces");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    let mut perm = std::fs::metadata(&key).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o600);
    std::fs::set_permissions(&key, perm).unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let src = dir.path().join("f");
    std::fs::write(&src, vec![42u8; 8 << 20]).unwrap();

    let mut daemon = Command::new("ip")
        .args(["netns", "exec", &ns.names[1], common::bin(), "serve"])
        .args(["--listen", "10.77.0.2:7341", "--root"])
        .arg(&root)
        .arg("--key-file")
        .arg(&key)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait for the daemon's "listening on" line.
    {
        use std::io::BufRead;
        let mut line = String::new();
        let mut r = std::io::BufReader::new(daemon.stdout.take().unwrap());
        r.read_line(&mut line).unwrap();
        assert!(line.contains("listening on"), "{line}");
    }
    let run = |policy: &str| {
        let c = {
            let mut c = Command::new("ip");
            c.args([
                "netns",
                "exec",
                &ns.names[0],
                common::bin(),
                "cp",
                "--explain",
            ])
            .args(["--streams", "4", "--channels", policy, "--key-file"])
            .arg(&key)
            .arg(&src)
            .arg("ramsys://10.77.0.2:7341/f");
            c
        };
        common::run_with_timeout(c, Duration::from_secs(60))
    };
    let t0 = Instant::now();
    for policy in ["round-robin", "affinity-aware"] {
        let out = run(policy);
        let err = common::stderr(&out);
        assert!(out.status.success(), "{policy}: {err}");
        assert!(err.contains("channels:"), "{policy}: {err}");
        let streams: Vec<&str> = err.lines().filter(|l| l.contains(": stream ")).collect();
        assert_eq!(streams.len(), 4, "{err}");
        let via0 = streams
            .iter()
            .filter(|l| l.contains("10.77.0.1:") && l.contains("via ca0"))
            .count();
        let via1 = streams
            .iter()
            .filter(|l| l.contains("10.77.0.11:") && l.contains("via ca1"))
            .count();
        // The veths report no NUMA node, so affinity-aware has no local
        // preference and balances like round robin.
        assert_eq!(via0 + via1, 4, "{policy}: {streams:?}");
        assert!(via0 >= 1 && via1 >= 1, "{policy}: {streams:?}");
        assert_eq!(
            std::fs::read(root.join("f")).unwrap().len(),
            8 << 20,
            "{policy}"
        );
    }
    assert!(t0.elapsed() < Duration::from_secs(60));
    let _ = daemon.kill();
    let _ = daemon.wait();
    let _ = Path::new("");
}
