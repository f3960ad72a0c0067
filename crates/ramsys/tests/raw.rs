//! Raw-Ethernet data links end to end (issue 18, seed 002; docs/TYCHE.md):
//! two network namespaces joined by one or two veth pairs (MTU 9000 and
//! 1500), a daemon in one (`ip netns exec ... serve --raw-iface`) and the
//! agent in the other (`--transport raw`). Trees, a large file and a
//! loop-device volume replicate byte for byte, with 1 % and 5 % injected
//! loss, duplication, reordering and corruption in both processes
//! (RAMSYS_RAW_FAULTS), nothing half-written; a daemon or agent killed
//! mid-transfer and `--resume` completes; the one-line refusals.
//!
//! Needs root (namespaces, CAP_NET_RAW): skipped with the reason printed
//! otherwise. Namespaces, processes and loop devices are removed on drop,
//! so on every exit path.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::loopdev::Loop;
use common::*;
use ramsys_rawnet::netns::{self, Netns};

/// Namespace A (agent) and B (daemon) joined by `pairs` veth pairs:
/// pair i is `aI` (10.N.I.1/24) in A and `bI` (10.N.I.2/24) in B.
struct Net {
    a: Netns,
    b: Netns,
    pairs: usize,
    net: u8,
}

impl Net {
    fn new(tag: &str, net: u8, pairs: usize, mtu: usize) -> Option<Net> {
        if let Some(why) = netns::unavailable() {
            eprintln!("skipped: {why}");
            return None;
        }
        let pid = std::process::id();
        let a = Netns::create(&format!("rw{tag}a-{pid}")).unwrap();
        let b = Netns::create(&format!("rw{tag}b-{pid}")).unwrap();
        for i in 0..pairs {
            let (an, bn) = (format!("a{i}"), format!("b{i}"));
            netns::veth(&a, &an, &b, &bn, mtu).unwrap();
            a.ip(&["addr", "add", &format!("10.{net}.{i}.1/24"), "dev", &an])
                .unwrap();
            b.ip(&["addr", "add", &format!("10.{net}.{i}.2/24"), "dev", &bn])
                .unwrap();
        }
        Some(Net { a, b, pairs, net })
    }

    fn daemon_ip(&self) -> String {
        format!("10.{}.0.2", self.net)
    }

    /// `ramsys serve` in B offering raw channels on every bI.
    fn daemon(&self, root: &Path, key: &Path, env: &[(&str, &str)]) -> NsDaemon {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.b.name, bin(), "serve", "--listen"])
            .arg(format!("{}:0", self.daemon_ip()))
            .arg("--root")
            .arg(root)
            .arg("--key-file")
            .arg(key);
        for i in 0..self.pairs {
            c.args(["--raw-iface", &format!("b{i}")]);
        }
        NsDaemon::start(c, env)
    }

    /// `ramsys ARGS` in A (key from `key`), with a time limit.
    fn agent(&self, key: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
        run_with_timeout(self.agent_cmd(key, env, args), Duration::from_secs(240))
    }

    fn agent_cmd(&self, key: &Path, env: &[(&str, &str)], args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.a.name, bin()])
            .args(args)
            .arg("--explain")
            .env("RAMSYS_KEY_FILE", key)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied());
        c
    }
}

/// A daemon inside a namespace (`ip netns exec` execs it: the child is
/// the daemon), killed on drop.
struct NsDaemon {
    child: Child,
    addr: String,
}

impl NsDaemon {
    fn start(mut c: Command, env: &[(&str, &str)]) -> NsDaemon {
        let mut child = c
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start daemon");
        let addr = listening_addr(&mut child);
        NsDaemon { child, addr }
    }
    fn url(&self, p: &str) -> String {
        format!("ramsys://{}/{p}", self.addr)
    }
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NsDaemon {
    fn drop(&mut self) {
        self.kill();
    }
}

fn big_file(p: &Path, size: usize, seed: u64) {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(p).unwrap());
    let mut r = Rng(seed);
    let mut left = size;
    while left > 0 {
        let n = left.min(4 << 20);
        f.write_all(&r.bytes(n)).unwrap();
        left -= n;
    }
    f.flush().unwrap();
}

fn same_file(a: &Path, b: &Path) {
    let (ma, mb) = (std::fs::metadata(a).unwrap(), std::fs::metadata(b).unwrap());
    assert_eq!(ma.len(), mb.len(), "{} vs {}", a.display(), b.display());
    let o = Command::new("cmp").arg(a).arg(b).output().unwrap();
    assert!(
        o.status.success(),
        "{} differs from {}",
        a.display(),
        b.display()
    );
}

/// The agent said which interface pairs its raw channels use, and every
/// data link (`--explain`'s stream lines) was a raw channel, on each of
/// `pairs`' local interfaces.
fn used_raw(o: &Output, pairs: &[&str]) {
    let e = stderr(o);
    let line = e
        .lines()
        .find(|l| l.contains("raw channels: "))
        .unwrap_or_else(|| panic!("data links did not go raw: {e}"));
    for p in pairs {
        assert!(line.contains(p), "{p} not in {line}");
    }
    let streams: Vec<&str> = e
        .lines()
        .filter(|l| l.starts_with("explain: stream ") && l.contains(" -> "))
        .collect();
    assert!(!streams.is_empty(), "no stream lines (--explain): {e}");
    for s in &streams {
        assert!(s.contains(": raw:"), "not a raw link: {s}");
    }
    for p in pairs {
        let local = p.split(' ').next().unwrap();
        let at = format!("@{local} ->");
        assert!(
            streams.iter().any(|s| s.contains(&at)),
            "no data link on {local}: {streams:?}"
        );
    }
}

fn src_of(d: &Dirs) -> &str {
    d.src.to_str().unwrap()
}

struct Dirs {
    t: tempfile::TempDir,
    key: PathBuf,
    src: PathBuf,
    root: PathBuf,
}

fn dirs() -> Dirs {
    let t = tempfile::tempdir_in("/var/tmp").unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    make_varied_tree(&src, 64 << 10);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    Dirs { t, key, src, root }
}

/// One veth pair at MTU 9000: a tree and a 256 MiB file pushed, the tree
/// pulled back sealed (--encrypt), all over raw channels, with the copy
/// offload on in the daemon (env) and in the agent (flag) for the pull.
#[test]
fn tree_and_large_file_over_one_pair_mtu_9000() {
    let Some(net) = Net::new("j", 81, 1, 9000) else {
        return;
    };
    let d = dirs();
    big_file(&d.src.join("large.bin"), 256 << 20, 7);
    // The daemon's large slot copies go through the copy thread (seed 003
    // MCNI, rawnet offload.rs), by env; the pull below turns it on in the
    // agent by flag: both directions through it, byte for byte.
    let daemon = net.daemon(&d.root, &d.key, &[("RAMSYS_COPY_OFFLOAD", "on")]);
    // `ramsys status` lists the interface (no --explain there).
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &net.a.name, bin(), "status", "--json"])
        .arg(format!("ramsys://{}", daemon.addr))
        .env("RAMSYS_KEY_FILE", &d.key);
    let o = run_with_timeout(c, Duration::from_secs(30));
    assert_ok(&o);
    let st: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let raw = st["raw"][0].as_str().unwrap_or_default().to_string();
    assert!(raw.starts_with("b0 ") && raw.contains("mtu 9000"), "{st}");
    let src = d.src.to_str().unwrap();
    let o = net.agent(
        &d.key,
        &[],
        &[
            "cp",
            "-r",
            "--transport",
            "raw",
            "--block-size",
            "1M",
            src,
            &daemon.url(""),
        ],
    );
    assert_ok(&o);
    used_raw(&o, &["a0 -> b0 (MTU 9000)"]);
    assert_same_tree(&d.src, &d.root.join("src"));
    assert!(temp_files(&d.root).is_empty());

    std::fs::remove_file(d.root.join("src/large.bin")).unwrap();
    let back = d.t.path().join("back");
    std::fs::create_dir(&back).unwrap();
    let o = net.agent(
        &d.key,
        &[],
        &[
            "cp",
            "-r",
            "--transport",
            "raw",
            "--encrypt",
            "--copy-offload",
            "on",
            &daemon.url("src"),
            back.to_str().unwrap(),
        ],
    );
    assert_ok(&o);
    used_raw(&o, &["a0 -> b0"]);
    assert_same_tree(&d.root.join("src"), &back.join("src"));
}

/// Two veth pairs at MTU 1500, data links spread over both, with 1 % and
/// then 5 % injected faults in the daemon and in the agent: identical,
/// nothing half-written.
#[test]
fn two_pairs_mtu_1500_with_faults() {
    let Some(net) = Net::new("f", 82, 2, 1500) else {
        return;
    };
    let d = dirs();
    big_file(&d.src.join("large.bin"), 24 << 20, 9);
    for (rate, dest) in [("0.01", "one"), ("0.05", "five")] {
        let env = [("RAMSYS_RAW_FAULTS", rate)];
        let daemon = net.daemon(&d.root, &d.key, &env);
        std::fs::create_dir(d.root.join(dest)).unwrap();
        let o = net.agent(
            &d.key,
            &env,
            &[
                "cp",
                "-r",
                "--transport",
                "raw",
                "--raw-iface",
                "a0",
                "--raw-iface",
                "a1",
                "--channels",
                "round-robin",
                "--streams",
                "4",
                "--block-size",
                "256K",
                d.src.to_str().unwrap(),
                &daemon.url(dest),
            ],
        );
        assert_ok(&o);
        used_raw(&o, &["a0 -> b0 (MTU 1500)", "a1 -> b1 (MTU 1500)"]);
        assert_same_tree(&d.src, &d.root.join(dest).join("src"));
        assert!(temp_files(&d.root).is_empty(), "{:?}", temp_files(&d.root));
    }
}

/// A loop-device volume in A pushed into a loop device exported by the
/// daemon in B, over raw channels with 1 % faults: byte for byte; then 1 %
/// of its blocks changed and `sync` moves about 1 %.
#[test]
fn loop_device_volume_over_raw() {
    let Some(net) = Net::new("v", 83, 1, 9000) else {
        return;
    };
    let d = dirs();
    let size = 48usize << 20;
    let aimg = d.t.path().join("a.img");
    big_file(&aimg, size, 21);
    let bimg = d.t.path().join("b.img");
    std::fs::write(&bimg, vec![0x5au8; size]).unwrap();
    let (Some(a), Some(b)) = (Loop::attach(&aimg), Loop::attach(&bimg)) else {
        return;
    };
    b.node_in(&d.root, "vol");
    let env = [("RAMSYS_RAW_FAULTS", "0.01")];
    let daemon = net.daemon(&d.root, &d.key, &env);
    let o = net.agent(
        &d.key,
        &env,
        &[
            "cp",
            "--transport",
            "raw",
            "--write-devices",
            "--block-size",
            "1M",
            a.path(),
            &daemon.url("vol"),
        ],
    );
    assert_ok(&o);
    used_raw(&o, &["a0 -> b0"]);
    assert!(b.read() == a.read(), "device differs after a raw push");

    // Change 1 % of the source's 256 KiB blocks; `sync` over raw moves
    // about that much (the fixed-block delta: Have/Reuse on the TCP
    // control link, the changed blocks on raw channels).
    let blocks = size / (256 << 10);
    let changed = blocks.div_ceil(100);
    {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(a.path())
            .unwrap();
        let mut r = Rng(5);
        for k in 0..changed {
            let off = (k * blocks / changed + 1) * (256 << 10) + 1000;
            std::os::unix::fs::FileExt::write_all_at(&f, &r.bytes(4096), off as u64).unwrap();
        }
        f.sync_all().unwrap();
    }
    let o = net.agent(
        &d.key,
        &env,
        &[
            "sync",
            "--transport",
            "raw",
            "--write-devices",
            "--json",
            a.path(),
            &daemon.url("vol"),
        ],
    );
    assert_ok(&o);
    used_raw(&o, &["a0 -> b0"]);
    let sent = summary(&o)["bytes"].as_u64().unwrap();
    assert!(
        sent >= changed as u64 * 4096 && sent <= 2 * size as u64 / 100,
        "sync moved {sent} of {size} for {changed} changed blocks"
    );
    assert!(b.read() == a.read(), "device differs after a raw sync");
}

/// Wait until the sink journalled progress (docs/SYNC.md), then a
/// little more: the transfer is under way and resumable.
fn wait_journal(root: &Path) {
    let journal = root.join(".ramsys-journal.sqlite");
    let t0 = Instant::now();
    while !journal.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "transfer never got going"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(700));
}

/// Killed mid-transfer, first the daemon, then the agent: the same
/// command with --resume completes, sending less than the whole file, and
/// nothing appears under the final name before it is whole.
#[test]
fn killed_either_end_resumes_over_raw() {
    let Some(net) = Net::new("k", 84, 1, 9000) else {
        return;
    };
    let d = dirs();
    let size = 64u64 << 20;
    let file = d.t.path().join("big.bin");
    big_file(&file, size as usize, 33);
    // Slow writes at the sink, so the kill lands mid-transfer; journal
    // from 1 MiB on (docs/SYNC.md).
    let slow = [
        ("RAMSYS_FAULT_SLOW_WRITE_US", "15000"),
        ("RAMSYS_JOURNAL_MIN", "1M"),
        ("RAMSYS_RAW_FAULTS", "0.01"),
    ];
    let target = d.root.join("big.bin");
    let args = |url: &str| -> Vec<String> {
        [
            "cp",
            "--resume",
            "--json",
            "--transport",
            "raw",
            "--block-size",
            "64K",
            "--streams",
            "2",
            file.to_str().unwrap(),
            url,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let run = |daemon: &NsDaemon, env: &[(&str, &str)]| -> Child {
        let a = args(&daemon.url("big.bin"));
        let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
        net.agent_cmd(&d.key, env, &a)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let finish = |mut agent: Child| {
        let t0 = Instant::now();
        while agent.try_wait().unwrap().is_none() && t0.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = agent.kill();
        let _ = agent.wait();
    };

    // 1. The daemon dies.
    let mut daemon = net.daemon(&d.root, &d.key, &slow);
    let agent = run(&daemon, &[("RAMSYS_RAW_FAULTS", "0.01")]);
    wait_journal(&d.root);
    daemon.kill();
    finish(agent);
    assert!(!target.exists(), "a killed transfer left the final name");

    // 2. The agent dies (daemon restarted, still slow).
    let daemon = net.daemon(&d.root, &d.key, &slow);
    let mut agent = run(&daemon, &[("RAMSYS_RAW_FAULTS", "0.01")]);
    std::thread::sleep(Duration::from_millis(1500));
    let _ = agent.kill();
    let _ = agent.wait();
    drop(daemon);
    assert!(!target.exists(), "a killed transfer left the final name");

    // 3. --resume completes.
    let daemon = net.daemon(&d.root, &d.key, &[("RAMSYS_RAW_FAULTS", "0.01")]);
    let a = args(&daemon.url("big.bin"));
    let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
    let o = net.agent(&d.key, &[("RAMSYS_RAW_FAULTS", "0.01")], &a);
    assert_ok(&o);
    used_raw(&o, &["a0 -> b0"]);
    let sent = summary(&o)["bytes"].as_u64().unwrap();
    assert!(sent < size, "resume sent {sent} of {size}");
    same_file(&file, &target);
    assert!(temp_files(&d.root).is_empty(), "{:?}", temp_files(&d.root));
}

/// The refusals: an unknown interface or a missing CAP_NET_RAW stops the
/// daemon with one line; `--transport raw` to a daemon offering no raw
/// channels is one line and non-zero, `auto` falls back to TCP.
#[test]
fn refusals_and_fallback() {
    let Some(net) = Net::new("e", 85, 1, 1500) else {
        return;
    };
    let d = dirs();
    let ip = net.daemon_ip();
    let one_line = |o: &Output, want: &str| {
        assert!(!o.status.success());
        let e = stderr(o);
        assert_eq!(e.trim().lines().count(), 1, "{e}");
        assert!(e.contains(want), "{e}");
    };
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &net.b.name, bin(), "serve", "--listen"])
        .arg(format!("{ip}:0"))
        .arg("--root")
        .arg(&d.root)
        .arg("--key-file")
        .arg(&d.key)
        .args(["--raw-iface", "nosuch0"]);
    one_line(
        &run_with_timeout(c, Duration::from_secs(30)),
        "--raw-iface nosuch0",
    );
    if Command::new("setpriv").arg("--version").output().is_ok() {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &net.b.name])
            .args([
                "setpriv",
                "--bounding-set=-net_raw",
                bin(),
                "serve",
                "--listen",
            ])
            .arg(format!("{ip}:0"))
            .arg("--root")
            .arg(&d.root)
            .arg("--key-file")
            .arg(&d.key)
            .args(["--raw-iface", "b0"]);
        one_line(
            &run_with_timeout(c, Duration::from_secs(30)),
            "CAP_NET_RAW is missing",
        );
    } else {
        eprintln!("setpriv absent: CAP_NET_RAW refusal not checked");
    }

    // A local copy has no link to carry raw.
    let local = d.t.path().join("local");
    let o = net.agent(
        &d.key,
        &[],
        &[
            "cp",
            "-r",
            "--transport",
            "raw",
            src_of(&d),
            local.to_str().unwrap(),
        ],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("error: --transport raw: a local copy"),
        "{}",
        stderr(&o)
    );
    assert!(!local.exists());

    // A daemon without raw channels.
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &net.b.name, bin(), "serve", "--listen"])
        .arg(format!("{ip}:0"))
        .arg("--root")
        .arg(&d.root)
        .arg("--key-file")
        .arg(&d.key);
    let daemon = NsDaemon::start(c, &[]);
    let src = d.src.to_str().unwrap();
    let o = net.agent(
        &d.key,
        &[],
        &["cp", "-r", "--transport", "raw", src, &daemon.url("")],
    );
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("offers no raw channels"), "{e}");
    assert!(!d.root.join("src").exists());
    let o = net.agent(
        &d.key,
        &[],
        &["cp", "-r", "--transport", "auto", src, &daemon.url("")],
    );
    assert_ok(&o);
    assert!(stderr(&o).contains("data links over TCP"), "{}", stderr(&o));
    assert_same_tree(&d.src, &d.root.join("src"));
}
