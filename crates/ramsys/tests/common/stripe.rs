//! Striped pushes over daemons that share one root (tests/stripe.rs,
//! tests/stripe_blocks.rs): the site, the per-daemon shares of a summary,
//! and a push that loses a daemon mid-transfer.

use std::path::Path;
use std::time::{Duration, Instant};

use super::{assert_ok, bin, ramsys, run_with_timeout, summary, temp_files, TestDaemon};

/// Three daemons on loopback serving one shared root `dir/shared`; the
/// `--stripe` URL naming them all.
pub fn site(dir: &Path, key: &Path) -> (Vec<TestDaemon>, String) {
    let root = dir.join("shared");
    std::fs::create_dir(&root).unwrap();
    let ds: Vec<TestDaemon> = (0..3).map(|_| TestDaemon::start(&root, key)).collect();
    let list: Vec<String> = ds.iter().map(|d| d.addr.clone()).collect();
    let url = format!("ramsys://{}/", list.join(","));
    (ds, url)
}

/// `ramsys ARGS --stripe --json SRC URL` (ARGS: the command and its
/// options) succeeds; its summary.
pub fn striped(key: &Path, args: &[&str], src: &Path, url: &str) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend(["--stripe", "--json", src.to_str().unwrap(), url]);
    let o = ramsys(key, &all);
    assert_ok(&o);
    summary(&o)
}

/// `ramsys cp -r --stripe --json SRC DST` run in the network namespace
/// `ns` succeeds over three daemons that each moved a share; its summary.
pub fn striped_in_netns(ns: &str, key: &Path, src: &str, dst: &str) -> serde_json::Value {
    let mut cmd = std::process::Command::new("ip");
    cmd.args(["netns", "exec", ns, bin(), "cp", "-r", "--stripe", "--json"])
        .args([src, dst])
        .env("RAMSYS_KEY_FILE", key);
    let o = run_with_timeout(cmd, Duration::from_secs(120));
    assert_ok(&o);
    let j = summary(&o);
    let stripes = j["stripes"].as_array().unwrap();
    assert_eq!(stripes.len(), 3, "{j}");
    assert!(
        stripes.iter().all(|s| s["bytes"].as_u64().unwrap() > 0),
        "{j}"
    );
    j
}

/// What each daemon of a striped summary moved: (daemon, bytes).
pub fn stripes(j: &serde_json::Value) -> Vec<(String, u64)> {
    j["stripes"]
        .as_array()
        .unwrap_or_else(|| panic!("no stripes in {j}"))
        .iter()
        .map(|s| {
            (
                s["daemon"].as_str().unwrap().to_string(),
                s["bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// A striped push of `src` to `url`, paced at `bwlimit` so that it is still
/// running when the last daemon of `ds` is killed, once data arrives in
/// `root` (a temp name). The push fails naming the dead daemon and
/// `--resume`; returns its summary.
pub fn push_losing_the_last_daemon(
    key: &Path,
    src: &Path,
    url: &str,
    root: &Path,
    bwlimit: &str,
    ds: &mut [TestDaemon],
) -> serde_json::Value {
    let mut cmd = std::process::Command::new(bin());
    cmd.args(["cp", "-r", "--stripe", "--json", "--bwlimit", bwlimit])
        .arg(src)
        .arg(url)
        .env("RAMSYS_KEY_FILE", key);
    let child = std::thread::spawn(move || run_with_timeout(cmd, Duration::from_secs(120)));
    let start = Instant::now();
    while temp_files(root).is_empty() {
        assert!(start.elapsed() < Duration::from_secs(20), "no data arrived");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let dead = ds.last_mut().expect("a daemon to kill");
    dead.kill();
    let o = child.join().unwrap();
    assert!(!o.status.success(), "the share of the dead daemon failed");
    let j = summary(&o);
    assert_eq!(j["ok"], false, "{j}");
    let failed = j["failed"].to_string();
    assert!(
        failed.contains(&dead.addr) && failed.contains("--resume"),
        "{j}"
    );
    j
}
