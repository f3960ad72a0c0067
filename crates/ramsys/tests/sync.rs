//! `ramsys sync` (issue 10) through real daemons on loopback: unchanged
//! trees, single changes among many files, block deltas, deletes, dry
//! runs, metadata-only changes, --checksum, and files changing while read.

mod common;

use std::path::Path;

use common::*;

fn sync(key: &Path, extra: &[&str], src: &str, dst: &str) -> serde_json::Value {
    let mut args = vec!["sync", "-r", "--json", "--block-size", "64K"];
    args.extend_from_slice(extra);
    args.push(src);
    args.push(dst);
    let o = ramsys(key, &args);
    assert_ok(&o);
    summary(&o)
}

fn n(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("{k} missing in {v}"))
}

/// Regular files in a tree (hard-linked names count once: one inode).
fn count_files(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fn walk(p: &Path, seen: &mut std::collections::HashSet<u64>) {
        for e in std::fs::read_dir(p).unwrap() {
            let e = e.unwrap();
            let md = std::fs::symlink_metadata(e.path()).unwrap();
            if md.is_dir() {
                walk(&e.path(), seen);
            } else if md.is_file() {
                seen.insert(md.ino());
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    walk(p, &mut seen);
    seen.len() as u64
}

#[test]
fn unchanged_tree_sends_nothing_push_and_pull() {
    let TreeAndDaemon {
        t,
        key,
        src,
        root,
        d,
    } = tree_and_daemon(65536);
    let files = count_files(&src);

    let first = sync(&key, &[], src.to_str().unwrap(), &d.url(""));
    assert_eq!(n(&first, "unchanged"), 0);
    assert_same_tree(&src, &root.join("src"));
    let again = sync(&key, &[], src.to_str().unwrap(), &d.url(""));
    assert_eq!(n(&again, "bytes"), 0, "{again}");
    assert_eq!(n(&again, "files"), 0);
    assert_eq!(n(&again, "unchanged"), files);

    // Pull: the agent is the sink and answers Have itself.
    let back = t.path().join("back");
    std::fs::create_dir(&back).unwrap();
    sync(&key, &[], &d.url("src"), back.to_str().unwrap());
    let again = sync(&key, &[], &d.url("src"), back.to_str().unwrap());
    assert_eq!(n(&again, "bytes"), 0);
    assert_eq!(n(&again, "unchanged"), files);
    assert_same_tree(&src, &back.join("src"));
    assert!(temp_files(&root).is_empty() && temp_files(&back).is_empty());
}

#[test]
fn one_changed_file_in_20000() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    for d in 0..100 {
        let dir = src.join(format!("d{d:03}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..200 {
            std::fs::write(dir.join(format!("f{f:03}")), format!("{d}/{f} ").repeat(8)).unwrap();
        }
    }
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = TestDaemon::start(&root, &key);
    sync(&key, &[], src.to_str().unwrap(), &d.url(""));
    let p = src.join("d042/f117");
    std::fs::write(&p, b"changed, and a different size").unwrap();
    set_mtime(&p, 1_700_000_000, 5);
    let r = sync(&key, &[], src.to_str().unwrap(), &d.url(""));
    assert_eq!(n(&r, "files"), 1, "{r}");
    assert_eq!(n(&r, "bytes"), 29);
    assert_eq!(n(&r, "unchanged"), 19_999);
    assert_same_tree(&src, &root.join("src"));
}

#[test]
fn appended_truncated_and_changed_blocks_move_only_deltas() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let mut rng = Rng(7);
    let big = src.join("big");
    std::fs::write(&big, rng.bytes(8 << 20)).unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = TestDaemon::start(&root, &key);
    for (pull, dst) in [(false, d.url("")), (true, String::new())] {
        let back = t.path().join("back");
        let run = |extra: &[&str]| {
            if pull {
                std::fs::create_dir_all(&back).unwrap();
                // Pull from the daemon's copy into `back`.
                sync(&key, extra, &d.url("src"), back.to_str().unwrap())
            } else {
                sync(&key, extra, src.to_str().unwrap(), &dst)
            }
        };
        let check = || {
            if pull {
                assert_same_tree(&root.join("src"), &back.join("src"));
            } else {
                assert_same_tree(&src, &root.join("src"));
            }
        };
        run(&[]);
        check();
        if pull {
            // Change the daemon's side (the source of a pull).
            let f = root.join("src/big");
            let mut v = std::fs::read(&f).unwrap();
            v[5 << 20] ^= 0xff;
            v.extend_from_slice(b"appended tail");
            std::fs::write(&f, &v).unwrap();
        } else {
            let mut v = std::fs::read(&big).unwrap();
            v[3 << 20] ^= 0xff;
            v.extend_from_slice(b"appended tail");
            std::fs::write(&big, &v).unwrap();
        }
        // One changed block (256 KiB) and the appended tail's block.
        let r = run(&[]);
        check();
        assert!(n(&r, "bytes") <= 2 * (256 << 10), "{r}");
        assert_eq!(n(&r, "files"), 1);
        // Truncated: only the new last partial block moves.
        let f = if pull {
            root.join("src/big")
        } else {
            big.clone()
        };
        let v = std::fs::read(&f).unwrap();
        std::fs::write(&f, &v[..(6 << 20) + 1000]).unwrap();
        let r = run(&[]);
        check();
        assert!(n(&r, "bytes") <= 256 << 10, "{r}");
    }
    assert!(temp_files(&root).is_empty());
}

#[test]
fn renamed_directory_and_deletes_with_and_without_delete() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    make_varied_tree(&src, 65536);
    std::fs::create_dir_all(src.join("olddir/sub")).unwrap();
    std::fs::write(src.join("olddir/sub/x"), b"x").unwrap();
    std::fs::write(src.join("gone"), b"gone").unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    // Outside the destination: must survive --delete.
    std::fs::write(root.join("outside"), b"keep").unwrap();
    let d = TestDaemon::start(&root, &key);
    sync(&key, &[], src.to_str().unwrap(), &d.url(""));
    std::fs::rename(src.join("olddir"), src.join("newdir")).unwrap();
    std::fs::remove_file(src.join("gone")).unwrap();

    let r = sync(&key, &[], src.to_str().unwrap(), &d.url(""));
    assert_eq!(n(&r, "deleted"), 0);
    assert!(root.join("src/olddir/sub/x").exists() && root.join("src/gone").exists());
    assert!(root.join("src/newdir/sub/x").exists());

    let r = sync(&key, &["--delete"], src.to_str().unwrap(), &d.url(""));
    assert_eq!(n(&r, "deleted"), 2, "{r}");
    assert_eq!(n(&r, "bytes"), 0);
    assert_same_tree(&src, &root.join("src"));
    assert!(root.join("outside").exists());
}

#[test]
fn dry_run_changes_nothing_and_lists_plan() {
    let TreeAndDaemon {
        t,
        key,
        src,
        root,
        d,
    } = tree_and_daemon(65536);
    sync(&key, &[], src.to_str().unwrap(), &d.url(""));
    std::fs::write(src.join("new-file"), b"new").unwrap();
    std::fs::write(root.join("src/extra"), b"extra").unwrap();
    let before = snapshot(&root);
    let r = sync(
        &key,
        &["--dry-run", "--delete"],
        src.to_str().unwrap(),
        &d.url(""),
    );
    assert_eq!(n(&r, "bytes"), 0);
    assert_eq!(r["would_send"], serde_json::json!(["src/new-file"]), "{r}");
    assert_eq!(r["would_delete"], serde_json::json!(["src/extra"]));
    assert_eq!(snapshot(&root), before, "dry run changed the destination");
    // A first sync as a dry run creates nothing at all.
    let fresh = t.path().join("fresh");
    std::fs::create_dir(&fresh).unwrap();
    let r = sync(
        &key,
        &["--dry-run"],
        src.to_str().unwrap(),
        fresh.to_str().unwrap(),
    );
    assert_eq!(n(&r, "unchanged"), 0);
    assert_eq!(std::fs::read_dir(&fresh).unwrap().count(), 0);
}

#[test]
fn metadata_only_changes_move_no_data() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("a"), b"aaaa").unwrap();
    std::fs::write(src.join("b"), vec![7u8; 300_000]).unwrap();
    std::os::unix::fs::symlink("a", src.join("l")).unwrap();
    let dst = t.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    // Local mode: the in-process daemon is the sink.
    sync(&key, &[], src.to_str().unwrap(), dst.to_str().unwrap());
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(src.join("a"), std::fs::Permissions::from_mode(0o600)).unwrap();
    set_mtime(&src.join("b"), 1_600_000_000, 0);
    std::fs::remove_file(src.join("l")).unwrap();
    std::os::unix::fs::symlink("b", src.join("l")).unwrap();
    let r = sync(&key, &[], src.to_str().unwrap(), dst.to_str().unwrap());
    assert_eq!(n(&r, "bytes"), 0, "{r}");
    assert_same_tree(&src, &dst.join("src"));
}

#[test]
fn checksum_mode_finds_content_changes_size_and_mtime_miss() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("a"), b"same size one").unwrap();
    std::fs::write(src.join("b"), b"untouched").unwrap();
    set_mtime(&src.join("a"), 1_500_000_000, 0);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = TestDaemon::start(&root, &key);
    sync(&key, &[], src.to_str().unwrap(), &d.url(""));
    std::fs::write(src.join("a"), b"same size two").unwrap();
    set_mtime(&src.join("a"), 1_500_000_000, 0);
    let r = sync(&key, &[], src.to_str().unwrap(), &d.url(""));
    assert_eq!(n(&r, "bytes"), 0, "size+mtime cannot see it");
    let r = sync(&key, &["--checksum"], src.to_str().unwrap(), &d.url(""));
    assert_eq!(n(&r, "files"), 1, "{r}");
    assert_eq!(n(&r, "unchanged"), 1);
    assert_same_tree(&src, &root.join("src"));
}

#[test]
fn file_changing_while_read_is_reported_not_corrupted() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let f = src.join("growing");
    std::fs::write(&f, vec![1u8; 64 << 20]).unwrap();
    let dst = t.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    let f2 = f.clone();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let mut h = std::fs::OpenOptions::new().append(true).open(&f2).unwrap();
        while !s2.load(std::sync::atomic::Ordering::Relaxed) {
            h.write_all(&[2u8; 4096]).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    });
    // The writer appends every millisecond, but a loaded machine can leave
    // its thread without a core for the whole read (seen once under CI):
    // a run that saw no change is not the case under test, so up to three.
    let mut o = None;
    for _ in 0..3 {
        let r = ramsys(
            &key,
            &[
                "sync",
                "-r",
                "--json",
                "--block-size",
                "64K",
                src.to_str().unwrap(),
                dst.to_str().unwrap(),
            ],
        );
        let seen = !r.status.success();
        o = Some(r);
        if seen {
            break;
        }
        std::fs::remove_dir_all(&dst).unwrap();
        std::fs::create_dir(&dst).unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    let o = o.unwrap();
    assert!(!o.status.success(), "a changing file must be reported");
    let s = summary(&o);
    let failed = s["failed"].to_string();
    assert!(
        failed.contains("growing") && failed.contains("changed"),
        "{s}"
    );
    // Never a half-read file under the final name.
    assert!(!dst.join("src/growing").exists());
    assert!(temp_files(&dst).is_empty());
}

/// `--ignore-existing` (`--no-clobber`) and `--update` (`-u`), rsync's and
/// cp's: what DST has stays byte for byte (and keeps its mtime); only what
/// is missing, or with `-u` older, moves. Push to a daemon, pull from it,
/// with `cp` and `sync`, each run twice (the second changes nothing).
#[test]
fn ignore_existing_and_update_leave_what_dst_has() {
    use std::os::unix::fs::MetadataExt;
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = TestDaemon::start(&root, &key);
    let read = |p: &Path| std::fs::read(p).unwrap();
    let make_src = |src: &Path| {
        std::fs::create_dir_all(src.join("d")).unwrap();
        for name in ["a", "b", "c", "d/e"] {
            std::fs::write(src.join(name), format!("source {name}").repeat(100)).unwrap();
            set_mtime(&src.join(name), 1_700_000_000, 0);
        }
    };
    // DST as the sink found it: `a` edited (older than the source), `b`
    // edited and newer, `c` and `d/e` missing.
    let prepare = |dst: &Path| {
        std::fs::create_dir_all(dst).unwrap();
        std::fs::write(dst.join("a"), b"edited at the sink, older").unwrap();
        set_mtime(&dst.join("a"), 1_600_000_000, 0);
        std::fs::write(dst.join("b"), b"edited at the sink, newer").unwrap();
        set_mtime(&dst.join("b"), 1_800_000_000, 0);
    };
    let cases = [
        ("ignore", "sync", "--ignore-existing"),
        ("noclobber", "cp", "--no-clobber"),
        ("update", "sync", "-u"),
        ("cpupdate", "cp", "--update"),
    ];
    for (name, cmd, flag) in cases {
        for pull in [false, true] {
            let tag = format!("{name}-{}", if pull { "pull" } else { "push" });
            // `SRC PARENT` lands in PARENT/src by cp's rule (PARENT
            // exists) and by rsync's alike.
            let (src_top, parent) = (root.join(&tag), t.path().join(&tag));
            let (src, dst) = if pull {
                (src_top.join("src"), parent.join("src"))
            } else {
                (parent.join("src"), src_top.join("src"))
            };
            make_src(&src);
            prepare(&dst);
            let (from, to) = if pull {
                (
                    d.url(&format!("{tag}/src")),
                    parent.to_str().unwrap().to_string(),
                )
            } else {
                (src.to_str().unwrap().to_string(), d.url(&tag))
            };
            let update = flag.contains('u') && !flag.contains("clobber");
            for round in 0..2 {
                let o = ramsys(&key, &[cmd, "-r", "--json", flag, &from, &to]);
                assert_ok(&o);
                let j = summary(&o);
                let moved = match (round, update) {
                    (0, true) => 3,
                    (0, false) => 2,
                    _ => 0,
                };
                assert_eq!(n(&j, "files"), moved, "{tag} round {round}: {j}");
                assert_eq!(read(&dst.join("c")), read(&src.join("c")), "{tag}");
                assert_eq!(read(&dst.join("d/e")), read(&src.join("d/e")), "{tag}");
                assert_eq!(read(&dst.join("b")), b"edited at the sink, newer", "{tag}");
                let b = std::fs::metadata(dst.join("b")).unwrap();
                assert_eq!(b.mtime(), 1_800_000_000, "{tag}: b's mtime changed");
                if update {
                    assert_eq!(read(&dst.join("a")), read(&src.join("a")), "{tag}");
                } else {
                    assert_eq!(read(&dst.join("a")), b"edited at the sink, older", "{tag}");
                }
            }
            assert!(temp_files(&dst).is_empty(), "{tag}");
        }
    }
}

#[test]
fn the_summary_names_the_transport_in_one_line() {
    // issue 35: with --transport auto the summary did not say that TCP
    // carried the data (raw channels need an Ethernet segment, not
    // loopback), and sync printed two lines ("copied 1 files").
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let (src, root) = (t.path().join("src"), t.path().join("root"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("one"), b"one file").unwrap();
    let d = TestDaemon::start(&root, &key);
    let src_s = format!("{}/", src.display());
    let r = sync(&key, &["--transport", "auto"], &src_s, &d.url("a"));
    assert_eq!(r["transport"], "tcp", "{r}");
    assert_eq!(r["transport_requested"], "auto", "{r}");
    let why = r["transport_fallback"].as_str().unwrap_or_default();
    assert!(why.contains("loopback"), "{r}");
    let links = r["links"].as_array().unwrap();
    assert_eq!(links.len() as u64, n(&r, "streams"), "{r}");
    assert!(links.iter().all(|l| l["kind"] == "tcp"), "{r}");
    let r = sync(&key, &[], &src_s, &d.url("a"));
    assert_eq!(
        (r["transport"].as_str(), r["transport_fallback"].is_null()),
        (Some("tcp"), true)
    );
    // Human: one line, in English, naming the transport; the fallback is
    // one line of its own on stderr.
    std::fs::write(src.join("two"), b"two").unwrap();
    let o = ramsys(
        &key,
        &[
            "sync",
            "-r",
            "--delete",
            "--transport",
            "auto",
            &src_s,
            &d.url("a"),
        ],
    );
    assert_ok(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "{out}");
    assert!(
        lines[0].starts_with("copied 1 file, ") && lines[0].contains(" over tcp ("),
        "{out}"
    );
    assert!(lines[0].ends_with("; 1 unchanged, 0 deleted"), "{out}");
    let err = stderr(&o);
    assert!(
        err.contains("--transport auto: raw channels not used") && err.contains("over TCP"),
        "{err}"
    );
    // A local copy says so.
    let o = ramsys(
        &key,
        &[
            "sync",
            "-r",
            &src_s,
            t.path().join("local").to_str().unwrap(),
        ],
    );
    assert_ok(&o);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(" locally, "),
        "{o:?}"
    );
}
