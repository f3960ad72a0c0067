//! `--send-path inline|queued|auto` and the daemon's `send_path` config
//! (seed 002 sec. 7; docs/NUMA.md): pushes, pulls, local copies and
//! in-flight corruption come out identical on either path, and the path
//! each source took is the one asked for.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// A daemon whose log (`-v`) goes to a file, to see which send path its
/// source sessions took.
fn logged_daemon(root: &Path, key: &Path, extra: &[&str]) -> (TestDaemon, PathBuf) {
    let log = root.with_extension("log");
    let mut c = Command::new(bin());
    c.args(["-v", "serve", "--listen", "127.0.0.1:0", "--root"])
        .arg(root)
        .arg("--key-file")
        .arg(key)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap());
    (TestDaemon::spawn(c, root), log)
}

fn summary(o: &std::process::Output) -> serde_json::Value {
    let out = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(out.lines().last().unwrap()).unwrap()
}

/// Push on each path (the agent is the source), pull back (the daemon is
/// the source: its config says inline; for queued its flag overrides the
/// config).
#[test]
fn push_and_pull_tree_on_each_send_path() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    make_varied_tree(&src, 65536);
    let cfg = t.path().join("ramsys.toml");
    std::fs::write(&cfg, "send_path = \"inline\"\n").unwrap();
    for path in ["inline", "queued"] {
        let root = t.path().join(format!("root-{path}"));
        std::fs::create_dir(&root).unwrap();
        let mut extra = vec!["--config", cfg.to_str().unwrap()];
        if path == "queued" {
            extra.extend(["--send-path", "queued"]);
        }
        let (d, log) = logged_daemon(&root, &key, &extra);
        let o = ramsys(
            &key,
            &[
                "cp",
                "-r",
                "--json",
                "--block-size",
                "64K",
                "--streams",
                "4",
                "--readers",
                "4",
                "--send-path",
                path,
                src.to_str().unwrap(),
                &d.url(""),
            ],
        );
        assert_ok(&o);
        assert_same_tree(&src, &root.join("src"));
        let s = summary(&o);
        assert_eq!(s["send_path"], path);
        let handoffs = s["handoffs"].as_u64().unwrap();
        assert_eq!(handoffs == 0, path == "inline", "{s}");

        let back = t.path().join(format!("back-{path}"));
        let o = ramsys(
            &key,
            &[
                "cp",
                "-r",
                "--block-size",
                "64K",
                &d.url("src"),
                back.to_str().unwrap(),
            ],
        );
        assert_ok(&o);
        assert_same_tree(&src, &back);
        assert!(temp_files(&root).is_empty() && temp_files(&back).is_empty());
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            text.contains(&format!("send path {path}")),
            "daemon log lacks its send path {path}: {text}"
        );
    }
}

/// Flip a bit in every 5th block in flight: the sink asks again and the
/// source re-sends from the controller on the inline path too (no queue
/// involved); the copy is whole, with and without encryption.
#[test]
fn corrupted_blocks_are_resent_inline() {
    let TreeAndDaemon {
        t: _t,
        key,
        src,
        root,
        d,
    } = tree_and_daemon(65536);
    for (i, enc) in ["--encrypt=none", "--encrypt=aes-256-gcm"]
        .iter()
        .enumerate()
    {
        let dest = format!("d{i}");
        let mut c = Command::new(bin());
        c.args([
            "cp",
            "-r",
            "--json",
            "--block-size",
            "64K",
            "--streams",
            "4",
            "--readers",
            "2",
            "--send-path",
            "inline",
            enc,
        ])
        .arg(&src)
        .arg(d.url(&dest))
        .env("RAMSYS_KEY_FILE", &key)
        .env("RAMSYS_FAULT_FLIP_EVERY", "5");
        let o = run_with_timeout(c, Duration::from_secs(120));
        assert_ok(&o);
        assert_same_tree(&src, &root.join(&dest));
        let s = summary(&o);
        assert!(
            s["resent"].as_u64().unwrap() > 0,
            "{enc}: nothing re-sent: {s}"
        );
        assert_eq!(
            (s["send_path"].as_str(), s["handoffs"].as_u64()),
            (Some("inline"), Some(0))
        );
        assert!(temp_files(&root).is_empty());
    }
}

/// Local copies (in-process daemon as the sink): a file striped over four
/// streams, a sparse file and zero-length files, on each path, and auto
/// picking inline when readers match streams, queued when not.
#[test]
fn local_copies_on_each_path_and_auto() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("striped"), Rng(9).bytes(9 << 20)).unwrap();
    let f = std::fs::File::create(src.join("sparse")).unwrap();
    f.set_len(12 << 20).unwrap();
    std::os::unix::fs::FileExt::write_at(&f, b"middle", 6 << 20).unwrap();
    for i in 0..20 {
        std::fs::write(src.join(format!("empty{i}")), b"").unwrap();
    }
    for (path, readers, want) in [
        ("inline", "4", "inline"),
        ("queued", "4", "queued"),
        ("auto", "4", "inline"),
        ("auto", "6", "queued"),
        ("auto", "2", "queued"),
    ] {
        let dst = t.path().join(format!("dst-{path}-{readers}"));
        let o = ramsys(
            &key,
            &[
                "cp",
                "-r",
                "--json",
                "--numa",
                "off",
                "--block-size",
                "1M",
                "--streams",
                "4",
                "--readers",
                readers,
                "--send-path",
                path,
                src.to_str().unwrap(),
                dst.to_str().unwrap(),
            ],
        );
        assert_ok(&o);
        assert_same_tree(&src, &dst);
        assert_eq!(
            summary(&o)["send_path"],
            want,
            "{path} with {readers} readers"
        );
    }
    let o = ramsys(&key, &["cp", "--send-path", "fast", "a", "b"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("inline, queued or auto"),
        "{}",
        stderr(&o)
    );
}
