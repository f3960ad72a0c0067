//! Streams sized from the path (issue 21; engine transport/path.rs): with
//! no --streams the agent reads the control link's handshake RTT before it
//! dials the data links and reports the choice; on loopback that is the
//! LAN count (RTT 0 does not change), an explicit --streams is never
//! overridden, and a local copy (its path is memory) is not sized at all.
//! On a long path (bench/wanem between two namespaces) a push adds streams
//! while the rate grows. The long-path numbers are in docs/BENCHMARKS.md.

mod common;

use common::*;

fn summary(o: &std::process::Output) -> serde_json::Value {
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out
        .lines()
        .rev()
        .find(|l| l.contains("\"summary\""))
        .unwrap();
    serde_json::from_str(line).unwrap()
}

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
        // A LAN gets no streams added; a pull's source (the daemon) does
        // not adapt at all.
        if pull {
            assert!(c["growth"].is_null(), "{c}");
        } else {
            let why = c["growth"]["stopped"].as_str().unwrap_or_default();
            assert!(why.contains("LAN"), "{c}");
        }
    }
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
/// emulator; no netem here), removed on drop.
struct Wan {
    names: [String; 2],
    wanem: Option<std::process::Child>,
    daemon: Option<std::process::Child>,
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

const ADDR_A: &str = "10.214.0.1";
const ADDR_B: &str = "10.214.0.2";

fn sh(args: &[&str]) -> bool {
    std::process::Command::new(args[0])
        .args(&args[1..])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A 20 ms path (more under load: wanem runs in user space) on which each
/// stream is held to the server's 128 KiB receive buffer (a few MB/s a
/// stream), so the aggregate grows with every stream added; None (with the reason printed) without root,
/// `ip` or a built wanem.
fn long_path() -> Option<Wan> {
    let wanem = std::path::Path::new(bin()).with_file_name("wanem");
    if !wanem.exists() {
        eprintln!(
            "skipped: no {} (cargo build --release -p wanem)",
            wanem.display()
        );
        return None;
    }
    let id = std::process::id();
    let names = [format!("r21a-{id}"), format!("r21b-{id}")];
    let mut w = Wan {
        names: names.clone(),
        wanem: None,
        daemon: None,
    };
    for (n, rmem) in [(&names[0], "67108864"), (&names[1], "131072")] {
        if !sh(&["ip", "netns", "add", n]) {
            eprintln!("skipped: cannot create network namespaces (not root?)");
            return None;
        }
        assert!(sh(&["ip", "-n", n, "link", "set", "lo", "up"]));
        let r = format!("net.ipv4.tcp_rmem=4096 131072 {rmem}");
        let sysctl = ["sysctl", "-qw", &r, "net.ipv4.tcp_wmem=4096 65536 67108864"];
        assert!(sh(&[&["ip", "netns", "exec", n][..], &sysctl[..]].concat()));
    }
    let log = tempfile::NamedTempFile::new().unwrap();
    w.wanem = Some(
        std::process::Command::new(&wanem)
            .args(["--ns-a", &names[0], "--ns-b", &names[1]])
            .args(["--addr-a", ADDR_A, "--addr-b", ADDR_B, "--delay-ms", "10"])
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
    Some(w)
}

/// Issue 21: with no --streams a push on a long path adds streams while
/// the aggregate rate grows and reports each stage; an explicit count is
/// never exceeded.
#[test]
fn a_long_path_gets_more_streams_during_the_transfer_but_never_past_an_explicit_count() {
    let Some(mut wan) = long_path() else {
        return;
    };
    let shm = std::path::Path::new("/dev/shm");
    let t = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let (src, root) = (t.path().join("src"), t.path().join("root"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&root).unwrap();
    let mut rng = Rng(21);
    let mut f = std::fs::File::create(src.join("big")).unwrap();
    for _ in 0..300 {
        std::io::Write::write_all(&mut f, &rng.bytes(1 << 20)).unwrap();
    }
    drop(f);
    let key = key_file(t.path());
    let mut d = std::process::Command::new("ip")
        .args(["netns", "exec", &wan.names[1], bin(), "serve", "--listen"])
        .arg(format!("{ADDR_B}:0"))
        .arg("--root")
        .arg(&root)
        .arg("--key-file")
        .arg(&key)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(d.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_string();
    wan.daemon = Some(d);
    let push = |dst: &str, extra: &[&str]| {
        let mut c = std::process::Command::new("ip");
        c.args(["netns", "exec", &wan.names[0], bin(), "cp", "-r", "--json"])
            .args(extra)
            .arg(&src)
            .arg(format!("ramsys://{addr}/{dst}"))
            .env("RAMSYS_KEY_FILE", &key);
        let o = run_with_timeout(c, std::time::Duration::from_secs(120));
        assert_ok(&o);
        summary(&o)
    };
    let v = push("auto", &[]);
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
    assert_eq!(v["congestion"], "bbr", "{v}");
    assert_same_tree(&src, &root.join("auto"));
    // An explicit count is the count, start to end.
    std::fs::write(src.join("big"), rng.bytes(16 << 20)).unwrap();
    let v = push("fixed", &["--streams", "3"]);
    assert_eq!(v["streams"], 3, "{v}");
    assert!(v["stream_choice"].is_null(), "{v}");
    assert_same_tree(&src, &root.join("fixed"));
}
