//! End-to-end transfers through real daemons on loopback: both directions,
//! local mode, and every awkward tree shape of the core issue.

mod common;

use std::path::Path;

use common::*;

#[test]
fn push_and_pull_varied_tree_through_daemon() {
    let TreeAndDaemon {
        t,
        key,
        src,
        root,
        d,
    } = tree_and_daemon(65536);

    // Push into an existing directory: the tree lands inside it.
    let o = ramsys(
        &key,
        &[
            "cp",
            "-r",
            "--block-size",
            "64K",
            "--streams",
            "3",
            src.to_str().unwrap(),
            &d.url(""),
        ],
    );
    assert_ok(&o);
    assert_same_tree(&src, &root.join("src"));

    // Pull back to a new name: the copy is the destination itself.
    let back = t.path().join("back");
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
}

#[test]
fn local_mode_copies_tree_and_single_files() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    make_varied_tree(&src, 4096);
    let dst = t.path().join("dst");
    let o = ramsys(
        &key,
        &[
            "cp",
            "-r",
            "--block-size",
            "4K",
            "--json",
            src.to_str().unwrap(),
            dst.to_str().unwrap(),
        ],
    );
    assert_ok(&o);
    assert_same_tree(&src, &dst);
    // The JSON summary is the last line and carries the required fields.
    let out = String::from_utf8(o.stdout).unwrap();
    let last: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(last["event"], "summary");
    for f in ["files", "bytes", "wall_s", "mb_s", "cpu_s", "failed"] {
        assert!(last.get(f).is_some(), "summary lacks {f}: {last}");
    }
    assert_eq!(last["failed"].as_array().unwrap().len(), 0);

    // Several single files into an existing directory.
    let into = t.path().join("into");
    std::fs::create_dir(&into).unwrap();
    let a = src.join("m600");
    let b = src.join("sub/size_5_40960");
    let o = ramsys(
        &key,
        &[
            "cp",
            a.to_str().unwrap(),
            b.to_str().unwrap(),
            into.to_str().unwrap(),
        ],
    );
    assert_ok(&o);
    assert_eq!(
        std::fs::read(into.join("m600")).unwrap(),
        std::fs::read(&a).unwrap()
    );
    assert_eq!(
        std::fs::read(into.join("size_5_40960")).unwrap(),
        std::fs::read(&b).unwrap()
    );
}

#[test]
fn tree_with_no_files_and_empty_files() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("a/b/c")).unwrap();
    std::fs::create_dir_all(src.join("x")).unwrap();
    let dst = t.path().join("dst");
    assert_ok(&ramsys(
        &key,
        &["cp", "-r", src.to_str().unwrap(), dst.to_str().unwrap()],
    ));
    assert_same_tree(&src, &dst);
    let src2 = t.path().join("src2");
    std::fs::create_dir(&src2).unwrap();
    for i in 0..50 {
        std::fs::write(src2.join(format!("e{i}")), b"").unwrap();
    }
    let dst2 = t.path().join("dst2");
    assert_ok(&ramsys(
        &key,
        &["cp", "-r", src2.to_str().unwrap(), dst2.to_str().unwrap()],
    ));
    assert_same_tree(&src2, &dst2);
}

#[test]
fn twenty_thousand_small_files_through_daemon() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("many");
    let mut r = Rng(42);
    for d in 0..40 {
        let dir = src.join(format!("d{d:02}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..500 {
            let n = (r.next() % 3000) as usize;
            std::fs::write(dir.join(format!("f{f:03}")), r.bytes(n)).unwrap();
        }
    }
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = TestDaemon::start(&root, &key);
    let o = ramsys(
        &key,
        &["cp", "-r", "--json", src.to_str().unwrap(), &d.url("")],
    );
    assert_ok(&o);
    let out = String::from_utf8(o.stdout).unwrap();
    let last: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(last["files"], 20_000);
    assert_same_tree(&src, &root.join("many"));
}

#[test]
fn no_checksum_mode_still_copies_correctly() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    make_varied_tree(&src, 8192);
    let dst = t.path().join("dst");
    assert_ok(&ramsys(
        &key,
        &[
            "cp",
            "-r",
            "--no-checksum",
            "--block-size",
            "8K",
            src.to_str().unwrap(),
            dst.to_str().unwrap(),
        ],
    ));
    assert_same_tree(&src, &dst);
}

#[test]
fn overwrites_existing_file_atomically() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("f");
    std::fs::write(&src, vec![7u8; 100_000]).unwrap();
    let dst = t.path().join("g");
    std::fs::write(&dst, b"old contents").unwrap();
    assert_ok(&ramsys(
        &key,
        &["cp", src.to_str().unwrap(), dst.to_str().unwrap()],
    ));
    assert_eq!(std::fs::read(&dst).unwrap(), vec![7u8; 100_000]);
    assert!(temp_files(t.path()).is_empty());
}

fn _unused(_: &Path) {}
