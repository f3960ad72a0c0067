//! A big file's blocks striped across daemons (issue 19, docs/SITE.md "A
//! big file's blocks"): `cp -r --stripe` cuts a large file into pieces
//! dealt like files; the daemons, sharing one root, write their pieces
//! into one temp file and the one that verifies the last renames it into
//! place. One huge file stripes; a run again moves nothing; a daemon
//! killed mid-file leaves no final name and `--resume` over the daemons
//! left sends only the missing pieces.

mod common;

use common::stripe::{push_losing_the_last_daemon, site, striped, stripes};
use common::*;

fn write_big(p: &std::path::Path, size: usize, seed: u64) {
    std::fs::write(p, Rng(seed).bytes(size)).unwrap();
    set_mtime(p, 1_600_000_000, 123_456_789);
}

#[test]
fn one_huge_file_stripes_over_three_daemons_and_a_second_run_moves_nothing() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let (_ds, url) = site(t.path(), &key);
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    // 256 MiB and a bit: the last piece is short.
    let size = (256 << 20) + 12_345;
    write_big(&src.join("huge"), size, 11);
    let j = striped(&key, &["cp", "-r"], &src, &url);
    let root = t.path().join("shared");
    assert_same_tree(&src, &root.join("src"));
    assert!(temp_files(&root).is_empty(), "{:?}", temp_files(&root));
    assert_eq!(j["ok"], true, "{j}");
    // Every daemon moved a part of the one file; the parts add up to it,
    // and the file counts once.
    let s = stripes(&j);
    assert_eq!(s.len(), 3, "{j}");
    assert!(s.iter().all(|(_, b)| *b >= 64 << 20), "{j}");
    assert_eq!(s.iter().map(|x| x.1).sum::<u64>(), size as u64, "{j}");
    assert_eq!(j["bytes"].as_u64().unwrap(), size as u64, "{j}");
    assert_eq!(j["files"].as_u64().unwrap(), 1, "{j}");
    // The same command again converges: nothing moves.
    let j = striped(&key, &["cp", "-r"], &src, &url);
    assert_eq!(j["bytes"].as_u64().unwrap(), 0, "{j}");
    assert!(stripes(&j).iter().all(|(_, b)| *b == 0), "{j}");
    // By content (`sync --checksum`): every piece is compared with the
    // file in place (hashed once per side), nothing moves either.
    let j = striped(&key, &["sync", "-r", "--checksum"], &src, &url);
    assert_eq!(j["bytes"].as_u64().unwrap(), 0, "{j}");
    assert_same_tree(&src, &root.join("src"));
    assert!(temp_files(&root).is_empty());
}

#[test]
fn a_tree_of_one_big_file_and_many_small_stripes_evenly() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let (_ds, url) = site(t.path(), &key);
    let src = t.path().join("src");
    make_varied_tree(&src, 64 << 10);
    write_big(&src.join("big"), 40 << 20, 12);
    // A sparse big file: its pieces' holes stay zeros in the shared temp.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(src.join("sparse")).unwrap();
        f.set_len(24 << 20).unwrap();
        f.write_all_at(&Rng(3).bytes(3 << 20), 9 << 20).unwrap();
        set_mtime(&src.join("sparse"), 1_600_000_000, 0);
    }
    let j = striped(&key, &["cp", "-r"], &src, &url);
    let root = t.path().join("shared");
    assert_same_tree(&src, &root.join("src"));
    assert!(temp_files(&root).is_empty(), "{:?}", temp_files(&root));
    // Whole files alone would give one daemon the 40 MiB: in pieces,
    // each moves about a third (holes count too).
    let s = stripes(&j);
    assert_eq!(s.len(), 3, "{j}");
    assert!(s.iter().all(|(_, b)| *b >= 10 << 20), "{j}");
    let sum = |k: &str| {
        j["stripes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s[k].as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!(sum("bytes"), j["bytes"].as_u64().unwrap());
    assert_eq!(sum("files"), j["files"].as_u64().unwrap());
}

#[test]
fn a_daemon_killed_mid_file_leaves_no_final_name_and_resume_sends_the_rest() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let (mut ds, url) = site(t.path(), &key);
    let dead = ds[2].addr.clone();
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let size = 48 << 20;
    write_big(&src.join("big"), size, 13);
    let root = t.path().join("shared");
    // Paced so that the file is still in flight when C dies.
    push_losing_the_last_daemon(&key, &src, &url, &root, "2M", &mut ds);
    // Nothing under the final name; the shared temp file stays, with the
    // markers of the pieces A and B verified.
    assert!(
        !root.join("src/big").exists(),
        "half-written under its final name"
    );
    let left: Vec<String> = temp_files(&root)
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(left.iter().any(|n| n.ends_with(".big")), "{left:?}");
    assert!(left.iter().any(|n| n.ends_with(".done")), "{left:?}");
    // The same command with --resume: C does not answer, A and B send
    // only the pieces that are missing, and one of them places the file.
    let j = striped(&key, &["cp", "-r", "--resume"], &src, &url);
    let s = stripes(&j);
    assert!(s.len() == 2 && s.iter().all(|(d, _)| *d != dead), "{j}");
    let moved = j["bytes"].as_u64().unwrap();
    assert!(moved > 0 && moved < size as u64, "moved {moved}: {j}");
    assert_eq!(j["files"].as_u64().unwrap(), 1, "{j}");
    assert_same_tree(&src, &root.join("src"));
    assert!(temp_files(&root).is_empty(), "{:?}", temp_files(&root));
}

/// Issue 36: pieces that all verified but a file no sink placed (the
/// sinks' fault hook skips every rename, as the lost-marker race did) fail
/// the push in one line naming the file, with a non-zero exit (it exited 0
/// before); `--resume` over sound daemons then places it from the pieces
/// kept, and a run again finds it in place without a false failure.
#[test]
fn a_big_file_no_sink_placed_fails_the_push_in_one_line() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("shared");
    std::fs::create_dir(&root).unwrap();
    let faulty: Vec<TestDaemon> = (0..3)
        .map(|_| {
            let mut c = std::process::Command::new(bin());
            c.args(["serve", "--listen", "127.0.0.1:0", "--root"])
                .arg(&root)
                .arg("--key-file")
                .arg(&key)
                .env("RAMSYS_FAULT_SKIP_PLACE", "1")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::inherit());
            TestDaemon::spawn(c, &root)
        })
        .collect();
    let list: Vec<&str> = faulty.iter().map(|d| d.addr.as_str()).collect();
    let url = format!("ramsys://{}/", list.join(","));
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    write_big(&src.join("big"), 24 << 20, 14);
    let o = ramsys(&key, &["cp", "-r", "--stripe", src.to_str().unwrap(), &url]);
    assert!(!o.status.success(), "exit 0 without the file");
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("no sink placed"))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("big") && lines[0].contains("--resume"),
        "{err}"
    );
    assert!(!root.join("src/big").exists());
    drop(faulty);
    let (_ds, url) = sound_daemons(&root, &key);
    let j = striped(&key, &["cp", "-r", "--resume"], &src, &url);
    assert_eq!(j["bytes"].as_u64().unwrap(), 0, "every piece was kept: {j}");
    assert_same_tree(&src, &root.join("src"));
    assert!(temp_files(&root).is_empty(), "{:?}", temp_files(&root));
    let j = striped(&key, &["cp", "-r", "--resume"], &src, &url);
    assert_eq!(j["ok"], true, "{j}");
}

/// Three daemons serving `root` (which exists), and their `--stripe` URL.
fn sound_daemons(root: &std::path::Path, key: &std::path::Path) -> (Vec<TestDaemon>, String) {
    let ds: Vec<TestDaemon> = (0..3).map(|_| TestDaemon::start(root, key)).collect();
    let list: Vec<&str> = ds.iter().map(|d| d.addr.as_str()).collect();
    let url = format!("ramsys://{}/", list.join(","));
    (ds, url)
}
