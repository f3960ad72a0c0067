//! Striped transfers (issue 19, docs/SITE.md "Striping"): one push split
//! over three daemons that share their root (the shared file system of a
//! site), one summary, the tree byte for byte; a daemon killed mid-way
//! fails its share only, and the same command with --resume over the
//! daemons still up finishes the tree.

mod common;

use common::stripe::{push_losing_the_last_daemon, site, striped, striped_in_netns};
use common::*;

/// A tree of awkward cases plus `big` files of `size` bytes.
fn tree(src: &std::path::Path, big: usize, size: usize) {
    make_varied_tree(src, 64 << 10);
    let mut r = Rng(7);
    for i in 0..big {
        std::fs::write(src.join(format!("big{i}")), r.bytes(size)).unwrap();
    }
}

#[test]
fn striped_push_over_three_daemons() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let (ds, url) = site(t.path(), &key);
    let root = t.path().join("shared");
    let src = t.path().join("src");
    tree(&src, 6, 1 << 20);
    let list: Vec<String> = ds.iter().map(|d| d.addr.clone()).collect();
    let j = striped(&key, &["cp", "-r"], &src, &url);
    assert_same_tree(&src, &root.join("src"));
    assert!(temp_files(&root).is_empty());
    assert_eq!(j["ok"], true, "{j}");
    let stripes = j["stripes"].as_array().unwrap();
    assert_eq!(stripes.len(), 3, "{j}");
    // Every daemon moved a share, and the shares add up to the summary.
    let sum = |k: &str| stripes.iter().map(|s| s[k].as_u64().unwrap()).sum::<u64>();
    assert!(
        stripes
            .iter()
            .all(|s| s["bytes"].as_u64().unwrap() >= 1 << 20),
        "{j}"
    );
    assert_eq!(sum("bytes"), j["bytes"].as_u64().unwrap());
    assert_eq!(sum("files"), j["files"].as_u64().unwrap());
    let daemons: Vec<&str> = stripes
        .iter()
        .map(|s| s["daemon"].as_str().unwrap())
        .collect();
    for d in &list {
        assert!(daemons.contains(&d.as_str()), "{j}");
    }
    // A missing DST receives the tree (rsync's rule, the same in every
    // daemon's session whichever creates DST first).
    let url_new = format!("ramsys://{}/new", list.join(","));
    let o = ramsys(
        &key,
        &["cp", "-r", "--stripe", src.to_str().unwrap(), &url_new],
    );
    assert_ok(&o);
    assert_same_tree(&src, &root.join("new/src"));
    // --stripe wants a daemon destination and local sources: one line.
    let o = ramsys(
        &key,
        &[
            "cp",
            "-r",
            "--stripe",
            src.to_str().unwrap(),
            t.path().join("x").to_str().unwrap(),
        ],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--stripe: the destination must be"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn losing_a_daemon_then_resume_finishes() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let (mut ds, url) = site(t.path(), &key);
    let root = t.path().join("shared");
    let src = t.path().join("src");
    tree(&src, 6, 1 << 20);
    let dead = ds[2].addr.clone();
    // Paced so that the transfer is still running when C dies.
    push_losing_the_last_daemon(&key, &src, &url, &root, "1M", &mut ds);
    // Nothing under its final name is half-written.
    for i in 0..6 {
        let (a, b) = (
            src.join(format!("big{i}")),
            root.join(format!("src/big{i}")),
        );
        if b.exists() {
            assert!(
                std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
                "{b:?}"
            );
        }
    }
    // The same command with --resume: C does not answer, A and B finish.
    let o = ramsys(
        &key,
        &[
            "cp",
            "-r",
            "--stripe",
            "--resume",
            src.to_str().unwrap(),
            &url,
        ],
    );
    assert_ok(&o);
    assert!(
        stderr(&o).contains(&format!("{dead} does not answer")),
        "{}",
        stderr(&o)
    );
    assert_same_tree(&src, &root.join("src"));
}

/// The agent in one network namespace, each daemon in its own behind a
/// veth pair (10.78.N.1 agent side, 10.78.N.2 daemon side), the daemons
/// sharing one directory: the striped push crosses three real links.
/// Skips when namespaces cannot be made (not root, no `ip`).
#[test]
fn striped_push_across_network_namespaces() {
    let tag = std::process::id();
    let agent = format!("rsta{tag}");
    if !ip(&["netns", "add", &agent]) {
        eprintln!("skipped: cannot create network namespaces (needs root and ip)");
        return;
    }
    let mut ns = Netns(vec![agent.clone()]);
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("shared");
    std::fs::create_dir(&root).unwrap();
    let src = t.path().join("src");
    tree(&src, 6, 256 << 10);
    assert!(ip(&["-n", &agent, "link", "set", "lo", "up"]));
    let mut daemons = vec![];
    for i in 1..=3 {
        let d = format!("rstd{i}-{tag}");
        assert!(ip(&["netns", "add", &d]));
        ns.0.push(d.clone());
        let (a_if, d_if) = (format!("sa{i}"), format!("sd{i}"));
        for c in [
            vec![
                "link", "add", &a_if, "netns", &agent, "type", "veth", "peer", "name", &d_if,
                "netns", &d,
            ],
            vec![
                "-n",
                &agent,
                "addr",
                "add",
                &format!("10.78.{i}.1/24"),
                "dev",
                &a_if,
            ],
            vec![
                "-n",
                &d,
                "addr",
                "add",
                &format!("10.78.{i}.2/24"),
                "dev",
                &d_if,
            ],
            vec!["-n", &agent, "link", "set", &a_if, "up"],
            vec!["-n", &d, "link", "set", &d_if, "up"],
            vec!["-n", &d, "link", "set", "lo", "up"],
        ] {
            assert!(ip(&c), "ip {c:?}");
        }
        let mut child = std::process::Command::new("ip")
            .args(["netns", "exec", &d, bin(), "serve", "--listen"])
            .arg(format!("10.78.{i}.2:7070"))
            .arg("--root")
            .arg(&root)
            .arg("--key-file")
            .arg(&key)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let addr = listening_addr(&mut child);
        assert!(addr.starts_with("10.78."), "{addr}");
        daemons.push(KillOnDrop(child));
    }
    let url = "ramsys://10.78.1.2:7070,10.78.2.2:7070,10.78.3.2:7070/";
    striped_in_netns(&agent, &key, src.to_str().unwrap(), url);
    assert_same_tree(&src, &root.join("src"));
    drop(daemons);
}
