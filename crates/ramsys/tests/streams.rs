//! Streams sized from the path (issue 21; engine transport/path.rs): with
//! no --streams the agent reads the control link's handshake RTT before it
//! dials the data links and reports the choice; on loopback that is the
//! LAN count (RTT 0 does not change), an explicit --streams is never
//! overridden, and a local copy (its path is memory) is not sized at all.
//! On a long path (bench/wanem between two namespaces) a transfer adds
//! streams while the rate grows: a push's source (the agent) dials them, a
//! pull's source (the daemon) asks and the agent dials (GrowStreams,
//! AddStream, StreamAdded, Rejoin, Grown); sealed links (--encrypt) too.
//! The long-path numbers are in docs/BENCHMARKS.md.

mod common;

use common::*;

#[test]
fn loopback_keeps_the_lan_count_and_says_why() {
    let t = tree_and_daemon(65536);
    let (key, src) = (&t.key, t.src.display().to_string());
    for (i, pull) in [false, true].into_iter().enumerate() {
        let out = t.t.path().join(format!("out{i}"));
        let (from, to) = if pull {
            std::fs::rename(&t.src, t.root.join("src")).unwrap();
            (t.d.url("src"), out.display().to_string())
        } else {
            (src.clone(), t.d.url(&format!("in{i}")))
        };
        let o = ramsys(key, &["cp", "-r", "--json", &from, &to]);
        assert_ok(&o);
        let v = summary(&o);
        let c = &v["stream_choice"];
        assert_eq!(c["streams"], 4, "pull {pull}: {v}");
        assert_eq!(v["streams"], 4, "pull {pull}: {v}");
        let rtt = c["rtt_us"].as_u64().expect("an RTT sample on loopback");
        assert!(rtt < 20_000, "loopback RTT {rtt} us");
        assert!(c["why"].as_str().unwrap().contains("ms x"), "{c}");
        // A LAN gets no streams added, push or pull. A source that sends
        // inline on a LAN (readers == streams: a cached tree gets 4 readers
        // on 4 streams, either end) has a fixed link set and reports no
        // growth at all; a queued source says why it kept the count.
        let g = &c["growth"];
        assert!(g["stages"].as_array().is_none_or(|s| s.is_empty()), "{c}");
        if g.is_null() {
            assert!(pull || v["send_path"] == "inline", "pull {pull}: {v}");
        } else {
            let why = g["stopped"].as_str().unwrap_or_default();
            assert!(why.contains("LAN"), "pull {pull}: {c}");
        }
    }
}

/// `proc/sys/net/ipv4/tcp_{w,r}mem` under `root` with these maxima.
fn tcp_fixture(root: &std::path::Path, wmem: u64, rmem: u64) {
    let p = root.join("proc/sys/net/ipv4");
    std::fs::create_dir_all(&p).unwrap();
    std::fs::write(p.join("tcp_wmem"), format!("4096\t16384\t{wmem}\n")).unwrap();
    std::fs::write(p.join("tcp_rmem"), format!("4096\t131072\t{rmem}\n")).unwrap();
}

/// This host's `tcp_{w,r}mem` maximum (Linux's default where unreadable).
fn tcp_here(name: &str, default: u64) -> u64 {
    std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}"))
        .ok()
        .and_then(|s| s.split_whitespace().nth(2)?.parse().ok())
        .unwrap_or(default)
}

/// The window transport::path derives from a sender's wmem and a
/// receiver's rmem.
fn window(wmem: u64, rmem: u64) -> u64 {
    (wmem * 2 / 3).min(rmem / 2).clamp(64 << 10, 2_700_000)
}

/// Issue 21: the daemon tells the agent its TCP buffer limits with the
/// Challenge (HELLO_PATH_FLAG); the agent sizes one stream's window from the
/// sender's wmem and the receiver's rmem, the daemon's on its side of the
/// transfer, and reports both hosts' limits.
#[test]
fn the_daemons_tcp_limits_size_the_window_and_are_reported() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    make_varied_tree(&src, 65536);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let fixture = t.path().join("sys");
    tcp_fixture(&fixture, 2 << 20, 1 << 20);
    let fx = fixture.display().to_string();
    let d = TestDaemon::start_with(&root, &key, &["--tcp-sys-root", &fx]);
    let (w, r) = (tcp_here("tcp_wmem", 4 << 20), tcp_here("tcp_rmem", 6 << 20));
    for pull in [false, true] {
        let out = t.path().join(format!("out{}", pull as u8));
        let (from, to) = if pull {
            (d.url("in0"), out.display().to_string())
        } else {
            (src.display().to_string(), d.url("in0"))
        };
        let o = ramsys(&key, &["cp", "-r", "--json", &from, &to]);
        assert_ok(&o);
        let v = summary(&o);
        let c = &v["stream_choice"];
        assert_eq!(c["tcp_remote"]["wmem_max"], 2 << 20, "pull {pull}: {c}");
        assert_eq!(c["tcp_remote"]["rmem_max"], 1 << 20, "pull {pull}: {c}");
        assert_eq!(c["tcp_local"]["wmem_max"], w, "{c}");
        assert_eq!(c["tcp_local"]["rmem_max"], r, "{c}");
        // A push sends from here into the daemon's 1 MiB rmem; a pull
        // from the daemon's 2 MiB wmem into ours.
        let want = if pull {
            window(2 << 20, r)
        } else {
            window(w, 1 << 20)
        };
        assert_eq!(c["window"], want, "pull {pull}: {c}");
        // Loopback stays a LAN: the count does not change.
        assert_eq!(c["streams"], 4, "{c}");
        if pull {
            assert_same_tree(&root.join("in0"), &out);
        } else {
            assert_same_tree(&src, &root.join("in0"));
        }
    }
    // --explain names both hosts' limits.
    let o = ramsys(
        &key,
        &[
            "cp",
            "-r",
            "--explain",
            &src.display().to_string(),
            &d.url("e"),
        ],
    );
    assert_ok(&o);
    let explain = stderr(&o);
    assert!(
        explain.contains("the daemon tcp_wmem max 2.0 MiB, tcp_rmem max 1.0 MiB"),
        "{explain}"
    );
    assert!(
        explain.contains("half the daemon's tcp_rmem max 1.0 MiB") || w * 2 / 3 < 512 << 10,
        "{explain}"
    );
}

#[test]
fn an_explicit_count_or_a_local_copy_is_not_sized() {
    let t = tree_and_daemon(65536);
    let src = t.src.display().to_string();
    let o = ramsys(
        &t.key,
        &["cp", "-r", "--json", "--streams", "6", &src, &t.d.url("x")],
    );
    assert_ok(&o);
    let v = summary(&o);
    assert!(v["stream_choice"].is_null(), "{v}");
    assert_eq!(v["streams"], 6, "{v}");
    let local = t.t.path().join("local").display().to_string();
    let o = ramsys(&t.key, &["cp", "-r", "--json", &src, &local]);
    assert_ok(&o);
    assert!(summary(&o)["stream_choice"].is_null());
}

/// Two network namespaces joined by bench/wanem (the user-space WAN
/// emulator; no netem here) and a daemon in the second, removed on drop.
struct Wan {
    names: [String; 2],
    wanem: Option<std::process::Child>,
    daemon: Option<std::process::Child>,
    /// The daemon's listen address, key file, and a directory holding
    /// `src` (the agent's side) and `root` (the daemon's).
    addr: String,
    key: std::path::PathBuf,
    dir: tempfile::TempDir,
}

impl Drop for Wan {
    fn drop(&mut self) {
        for c in [self.daemon.as_mut(), self.wanem.as_mut()]
            .into_iter()
            .flatten()
        {
            let _ = c.kill();
            let _ = c.wait();
        }
        for n in &self.names {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", n])
                .status();
        }
    }
}

fn sh(args: &[&str]) -> bool {
    std::process::Command::new(args[0])
        .args(&args[1..])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Which end's TCP receive buffer is held to 128 KiB (a few MB/s a stream
/// at 20 ms), so the aggregate grows with every stream added: the
/// receiver's (the daemon for a push, the agent for a pull).
#[derive(Clone, Copy, PartialEq)]
enum Held {
    Daemon,
    Agent,
}

/// A 20 ms path (more under load: wanem runs in user space) between
/// namespaces `r21<tag>a` (the agent) and `r21<tag>b` (a daemon), the
/// `held` end's receive buffer capped; None (with the reason printed)
/// without root, `ip` or a built wanem.
fn long_path(tag: &str, subnet: u8, held: Held) -> Option<Wan> {
    let wanem = std::path::Path::new(bin()).with_file_name("wanem");
    if !wanem.exists() {
        eprintln!(
            "skipped: no {} (cargo build --release -p wanem)",
            wanem.display()
        );
        return None;
    }
    let id = std::process::id();
    let names = [format!("r21{tag}a-{id}"), format!("r21{tag}b-{id}")];
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let mut w = Wan {
        names: names.clone(),
        wanem: None,
        daemon: None,
        addr: String::new(),
        key: key_file(dir.path()),
        dir,
    };
    let caps = match held {
        Held::Daemon => ["67108864", "131072"],
        Held::Agent => ["131072", "67108864"],
    };
    for (n, rmem) in names.iter().zip(caps) {
        if !sh(&["ip", "netns", "add", n]) {
            eprintln!("skipped: cannot create network namespaces (not root?)");
            return None;
        }
        assert!(sh(&["ip", "-n", n, "link", "set", "lo", "up"]));
        let r = format!("net.ipv4.tcp_rmem=4096 131072 {rmem}");
        let sysctl = ["sysctl", "-qw", &r, "net.ipv4.tcp_wmem=4096 65536 67108864"];
        assert!(sh(&[&["ip", "netns", "exec", n][..], &sysctl[..]].concat()));
    }
    let (a, b) = (format!("10.214.{subnet}.1"), format!("10.214.{subnet}.2"));
    let log = tempfile::NamedTempFile::new().unwrap();
    w.wanem = Some(
        std::process::Command::new(&wanem)
            .args(["--ns-a", &names[0], "--ns-b", &names[1]])
            .args(["--addr-a", &a, "--addr-b", &b, "--delay-ms", "10"])
            .stdout(log.reopen().unwrap())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let t0 = std::time::Instant::now();
    while !std::fs::read_to_string(log.path())
        .unwrap()
        .contains("ready")
    {
        assert!(t0.elapsed().as_secs() < 10, "wanem did not start");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (src, root) = (w.src(), w.root());
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&root).unwrap();
    let mut d = std::process::Command::new("ip")
        .args(["netns", "exec", &names[1], bin(), "serve", "--listen"])
        .arg(format!("{b}:0"))
        .arg("--root")
        .arg(&root)
        .arg("--key-file")
        .arg(&w.key)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    w.addr = listening_addr(&mut d);
    w.daemon = Some(d);
    Some(w)
}

impl Wan {
    fn src(&self) -> std::path::PathBuf {
        self.dir.path().join("src")
    }

    fn root(&self) -> std::path::PathBuf {
        self.dir.path().join("root")
    }

    /// `ramsys cp -r --json EXTRA FROM TO` in the agent's namespace; the
    /// JSON summary.
    fn cp(&self, extra: &[&str], from: &str, to: &str) -> serde_json::Value {
        let mut c = std::process::Command::new("ip");
        c.args(["netns", "exec", &self.names[0], bin(), "cp", "-r", "--json"])
            .args(extra)
            .args([from, to])
            .env("RAMSYS_KEY_FILE", &self.key);
        let o = run_with_timeout(c, std::time::Duration::from_secs(120));
        assert_ok(&o);
        summary(&o)
    }

    fn push(&self, extra: &[&str], dst: &str) -> serde_json::Value {
        let src = self.src().display().to_string();
        self.cp(extra, &src, &format!("ramsys://{}/{dst}", self.addr))
    }

    /// Fetch the daemon's `name` into the agent's `to`.
    fn pull(&self, extra: &[&str], name: &str, to: &std::path::Path) -> serde_json::Value {
        let from = format!("ramsys://{}/{name}", self.addr);
        self.cp(extra, &from, &to.display().to_string())
    }
}

/// `mib` MiB of random bytes at `path`.
fn big_file(path: &std::path::Path, mib: usize, rng: &mut Rng) {
    let mut f = std::fs::File::create(path).unwrap();
    for _ in 0..mib {
        std::io::Write::write_all(&mut f, &rng.bytes(1 << 20)).unwrap();
    }
}

/// The summary of a transfer that adapted on the 20 ms path: streams were
/// added, each stage reported, within the limit.
fn assert_grew(v: &serde_json::Value) {
    let c = &v["stream_choice"];
    let chosen = c["streams"].as_u64().unwrap();
    let rtt = c["rtt_us"].as_u64().unwrap();
    assert!((19_000..200_000).contains(&rtt), "{c}");
    let stages = c["growth"]["stages"].as_array().expect("stages").clone();
    assert!(!stages.is_empty(), "{c}");
    // The first stage always asks for more (nothing to compare with yet).
    assert!(
        stages[0]["then"].as_str().unwrap().starts_with("add"),
        "{c}"
    );
    let end = v["streams"].as_u64().unwrap();
    assert!(end > chosen, "no stream added: {v}");
    assert!(end <= c["max"].as_u64().unwrap().max(32), "{v}");
    assert!(
        stages[0]["link_mb_s"]
            .as_array()
            .is_some_and(|l| l.len() == 3),
        "{c}"
    );
}

/// Issue 21: with no --streams a push on a long path adds streams while
/// the aggregate rate grows and reports each stage; an explicit count is
/// never exceeded.
#[test]
fn a_long_path_gets_more_streams_during_the_transfer_but_never_past_an_explicit_count() {
    let Some(wan) = long_path("p", 0, Held::Daemon) else {
        return;
    };
    let (src, root) = (wan.src(), wan.root());
    let mut rng = Rng(21);
    big_file(&src.join("big"), 300, &mut rng);
    let v = wan.push(&[], "auto");
    assert_grew(&v);
    // The daemon's 128 KiB tcp_rmem (its namespace's, sent with the
    // Challenge) sets the window, 64 KiB: the push starts with the most
    // streams a start takes (with this host's 64 MiB at both ends, as
    // before the daemon sent its limits, it started with 10).
    let c = &v["stream_choice"];
    assert_eq!(c["tcp_remote"]["rmem_max"], 131072, "{c}");
    assert_eq!(c["window"], 65536, "{c}");
    let start = c["max"].as_u64().unwrap().min(16);
    assert_eq!(c["streams"], start, "{c}");
    // The receiver's window held every link back: busy (not waiting for
    // the ends), which is why streams were added (TCP_INFO busy_time).
    let busy = v["stream_choice"]["growth"]["stages"][0]["busy_pct"].as_f64();
    assert!(busy.is_some_and(|b| b >= 50.0), "{v}");
    assert_eq!(v["congestion"], "bbr", "{v}");
    assert_same_tree(&src, &root.join("auto"));
    // An explicit count is the count, start to end.
    std::fs::write(src.join("big"), rng.bytes(16 << 20)).unwrap();
    let v = wan.push(&["--streams", "3"], "fixed");
    assert_eq!(v["streams"], 3, "{v}");
    assert!(v["stream_choice"].is_null(), "{v}");
    assert_same_tree(&src, &root.join("fixed"));
}

/// A pull adapts like a push: the daemon's source measures and asks
/// (AddStream), the agent grants and dials (StreamAdded, Rejoin), the
/// daemon reports the stages (Grown) for the agent's summary, sealed
/// links too; an explicit count stays the count.
#[test]
fn a_pull_on_a_long_path_gets_more_streams_but_never_past_an_explicit_count() {
    let Some(wan) = long_path("l", 1, Held::Agent) else {
        return;
    };
    let (root, out) = (wan.root(), wan.dir.path().join("out"));
    std::fs::create_dir_all(&out).unwrap();
    let mut rng = Rng(22);
    std::fs::create_dir_all(root.join("data")).unwrap();
    big_file(&root.join("data/big"), 300, &mut rng);
    let v = wan.pull(&[], "data", &out.join("auto"));
    assert_grew(&v);
    let why = v["stream_choice"]["growth"]["stopped"].as_str();
    assert!(why.is_some_and(|w| !w.is_empty()), "{v}");
    // The daemon's stages carry what its links said (GrownLinks).
    let s0 = &v["stream_choice"]["growth"]["stages"][0];
    assert!(s0["busy_pct"].as_f64().is_some_and(|b| b > 0.0), "{v}");
    assert!(s0["rtt_x"].as_f64().is_some_and(|q| q >= 0.5), "{v}");
    assert_same_tree(&root.join("data"), &out.join("auto"));
    // Sealed: the streams the agent dials for the daemon carry sealed
    // blocks and credits like the first ones.
    let v = wan.pull(&["--encrypt"], "data", &out.join("sealed"));
    assert_grew(&v);
    assert_same_tree(&root.join("data"), &out.join("sealed"));
    std::fs::write(root.join("data/big"), rng.bytes(16 << 20)).unwrap();
    let v = wan.pull(&["--streams", "3"], "data", &out.join("fixed"));
    assert_eq!(v["streams"], 3, "{v}");
    assert!(v["stream_choice"].is_null(), "{v}");
    assert_same_tree(&root.join("data"), &out.join("fixed"));
}

/// Added links are sealed like the first ones (their epoch, 1, keys the
/// AEAD nonces): an encrypted push grows and lands byte for byte.
#[test]
fn an_encrypted_push_grows_with_sealed_links() {
    let Some(wan) = long_path("e", 2, Held::Daemon) else {
        return;
    };
    let (src, root) = (wan.src(), wan.root());
    big_file(&src.join("big"), 300, &mut Rng(23));
    let v = wan.push(&["--encrypt"], "sealed");
    assert_grew(&v);
    assert_same_tree(&src, &root.join("sealed"));
}
