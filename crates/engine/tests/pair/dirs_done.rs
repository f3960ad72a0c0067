//! `--delete` per directory (issue 36, docs/PROTOCOL.md "Directories
//! done"): a windowed `--delete` source names each directory whose every
//! entry it has sent (DirsDone), and the sink deletes that directory's
//! extras then and forgets its names; what is deleted is what the
//! whole-tree phases delete at the end, never a name the source has.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use ramsys_engine::request::sync::flags;
use ramsys_engine::request::walk::Top;
use ramsys_proto::Control;

use crate::common::pair::{Outcome, Pair, SOURCE};
use crate::common::tree::{mirror, same_tree, small_files, tmp};

/// `tops` (each `(rel, wire name)` under `base`) synced into `dst` with
/// `sync`, windowed (windows of 100 ids) or whole-tree.
fn run(base: &Path, tops: &[(&str, &str)], dst: &Path, sync: u32, windows: bool) -> Outcome {
    let mut p = Pair::new(&base.join(tops[0].0), dst);
    p.tops = tops
        .iter()
        .map(|(rel, name)| Top {
            rel: rel.as_bytes().to_vec(),
            name: name.as_bytes().to_vec(),
        })
        .collect();
    p.both(|o| {
        o.sync = sync;
        o.meta_window = (if windows { 100 } else { 0 }, 64 << 20);
    });
    p.run()
}

/// The ids the source named done, in order, and how many of its control
/// messages went before the first DirsDone and before MetaEnd.
fn dirs_done(o: &Outcome) -> (Vec<u64>, usize, usize) {
    let ctl = o.control(SOURCE);
    let mut ids = Vec::new();
    let mut first = None;
    let mut end = 0;
    for (i, r) in ctl.iter().enumerate() {
        match &r.control {
            Some(Control::DirsDone { ids: v }) => {
                first.get_or_insert(i);
                ids.extend(v);
            }
            Some(Control::MetaEnd { .. }) => end = i,
            _ => {}
        }
    }
    (ids, first.unwrap_or(usize::MAX), end)
}

/// `src` mirrored to `dst/src`, then DST's own extras put in.
fn dst_with_extras(src: &Path, dst: &Path, extras: &[&str]) {
    mirror(src, &dst.join("src"));
    for x in extras {
        let p = dst.join(x);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"extra").unwrap();
    }
}

/// A windowed `--delete` sync names every directory done once, the
/// first long before MetaEnd, and deletes exactly what the whole-tree
/// phases delete, in the same order; its dry run lists the same names
/// and removes nothing.
#[test]
fn a_windowed_delete_sync_deletes_each_directory_once_it_is_done() {
    let t = tmp();
    let src = t.path().join("src");
    small_files(&src, 1500, 21);
    let extras = [
        "src/d0/extra0",
        "src/d1/gone/deeper/f",
        "src/d2/extra2",
        "src/extra_top",
    ];
    let (win, whole) = (t.path().join("win"), t.path().join("whole"));
    for d in [&win, &whole] {
        dst_with_extras(&src, d, &extras);
    }
    let want = [
        "src/extra_top",
        "src/d0/extra0",
        "src/d1/gone",
        "src/d2/extra2",
    ];
    for dry in [true, false] {
        let sync = flags::SYNC | flags::DELETE | if dry { flags::DRY_RUN } else { 0 };
        let o = run(t.path(), &[("src", "src")], &win, sync, true);
        let w = run(t.path(), &[("src", "src")], &whole, sync, false);
        let (k, kw) = (o.reports().1, w.reports().1);
        assert_eq!(k.deleted, kw.deleted, "dry {dry}");
        let mut got = k.deleted.clone();
        got.sort();
        let mut sorted = want.to_vec();
        sorted.sort();
        assert_eq!(got, sorted, "dry {dry}");
        let (ids, first, end) = dirs_done(&o);
        let mut each = ids.clone();
        each.sort();
        assert_eq!(each, [0, 1, 2, 3], "dry {dry}: every directory once");
        assert!(first < end, "dry {dry}: DirsDone before MetaEnd");
        // The whole-tree phases name none.
        assert_eq!(dirs_done(&w).0, Vec::<u64>::new());
        assert_eq!(win.join("src/d0/extra0").exists(), dry);
    }
    same_tree(&src, &win.join("src"));
    same_tree(&win, &whole);
    // The first directory done (d0, all its 500 files out) went while
    // records were still coming.
    let o = run(
        t.path(),
        &[("src", "src")],
        &win,
        flags::SYNC | flags::DELETE,
        true,
    );
    let ctl = o.control(SOURCE);
    let last_entries = ctl.iter().rposition(|r| r.name() == "Entries").unwrap();
    let first_done = ctl.iter().position(|r| r.name() == "DirsDone").unwrap();
    assert!(first_done < last_entries, "{first_done} {last_entries}");
}

/// A hard link and a symlink are made after every file, at the end: in a
/// directory done long before, their names are never deleted, whatever
/// DST has there (another file, a directory that makes way), while its
/// extras go.
#[test]
fn links_in_a_directory_done_early_are_never_deleted() {
    let t = tmp();
    let src = t.path().join("src");
    small_files(&src, 1000, 22);
    std::fs::hard_link(src.join("d0/f1"), src.join("d0/hard")).unwrap();
    std::os::unix::fs::symlink("f1", src.join("d0/sym")).unwrap();
    let (win, whole) = (t.path().join("win"), t.path().join("whole"));
    for d in [&win, &whole] {
        mirror(&src, &d.join("src"));
        for x in ["hard", "sym"] {
            std::fs::remove_file(d.join("src/d0").join(x)).unwrap();
        }
        std::fs::write(d.join("src/d0/hard"), b"another file").unwrap();
        std::fs::create_dir_all(d.join("src/d0/sym/in")).unwrap();
        std::fs::write(d.join("src/d0/extra"), b"x").unwrap();
    }
    let sync = flags::SYNC | flags::DELETE;
    let o = run(t.path(), &[("src", "src")], &win, sync, true);
    let w = run(t.path(), &[("src", "src")], &whole, sync, false);
    assert_eq!(o.reports().1.deleted, w.reports().1.deleted);
    // The directory in the symlink's way counts what it held, as rsync's
    // --stats does (docs/SYNC.md).
    assert_eq!(o.reports().1.deleted, ["src/d0/sym/in", "src/d0/extra"]);
    assert!(dirs_done(&o).0.len() == 3, "{:?}", dirs_done(&o));
    let d0 = win.join("src/d0");
    let (a, b) = (
        d0.join("f1").metadata().unwrap(),
        d0.join("hard").metadata().unwrap(),
    );
    assert_eq!(a.ino(), b.ino(), "a hard link again");
    assert_eq!(std::fs::read_link(d0.join("sym")).unwrap(), Path::new("f1"));
    assert!(!d0.join("extra").exists());
    same_tree(&src, &win.join("src"));
}

/// Two sources' contents into one DST directory (`sync -r a/ b/ DST`):
/// the shared directories are done only once both sources' entries in
/// them went, so nothing of either is deleted, while what neither has
/// goes.
#[test]
fn two_sources_merged_into_one_directory_lose_nothing() {
    let t = tmp();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    small_files(&a, 600, 23);
    small_files(&b.join("d0"), 300, 24);
    std::fs::write(b.join("b_top"), b"b").unwrap();
    let (win, whole) = (t.path().join("win"), t.path().join("whole"));
    for d in [&win, &whole] {
        mirror(&a, d);
        mirror(&b, d);
        std::fs::write(d.join("extra"), b"x").unwrap();
        std::fs::write(d.join("d0/extra"), b"x").unwrap();
    }
    let tops = [("a", ""), ("b", "")];
    let sync = flags::SYNC | flags::DELETE;
    let o = run(t.path(), &tops, &win, sync, true);
    let w = run(t.path(), &tops, &whole, sync, false);
    let (k, kw) = (o.reports().1, w.reports().1);
    assert_eq!(k.deleted, kw.deleted);
    let mut got = k.deleted.clone();
    got.sort();
    assert_eq!(got, ["d0/extra", "extra"]);
    assert!(!dirs_done(&o).0.is_empty());
    for from in [&a, &b] {
        all_in(from, &win);
    }
    same_tree(&win, &whole);
}

/// Every file under `a` is in `b` with the same bytes.
fn all_in(a: &Path, b: &Path) {
    for e in std::fs::read_dir(a).unwrap() {
        let e = e.unwrap();
        let (pa, pb) = (e.path(), b.join(e.file_name()));
        match pa.is_dir() {
            true => all_in(&pa, &pb),
            false => assert!(std::fs::read(&pa).unwrap() == std::fs::read(&pb).unwrap()),
        }
    }
}

/// A source that cannot read part of its tree names no directory done
/// (a failure of its directory pass: none at all), and the sink deletes
/// nothing (rsync: "IO error encountered -- skipping file deletion").
#[test]
fn a_source_read_error_deletes_nothing() {
    let t = tmp();
    let src = t.path().join("src");
    small_files(&src, 600, 25);
    std::fs::write(t.path().join("f"), b"not a directory").unwrap();
    let dst = t.path().join("dst");
    dst_with_extras(&src, &dst, &["src/d0/extra", "src/extra"]);
    let tops = [("src", "src"), ("f/under", "under")];
    let o = run(t.path(), &tops, &dst, flags::SYNC | flags::DELETE, true);
    let (s, k) = o.reports();
    assert_eq!(s.failed.len(), 1, "{:?}", s.failed);
    assert!(k.deleted.is_empty(), "{:?}", k.deleted);
    assert!(dirs_done(&o).0.is_empty());
    assert!(dst.join("src/d0/extra").exists() && dst.join("src/extra").exists());
}
