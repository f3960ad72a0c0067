//! Archive copies in windows (issue 36, docs/PROTOCOL.md "Windows"): each
//! batch's Attrs travel right behind its records, a file gets its
//! owner, group and extended attributes as it settles, directories,
//! symlinks and special files theirs at the end; the tree at DST is the
//! tree at SRC, modes, mtimes, owners and xattrs included, whole-tree or
//! windowed, and a windowed re-sync that moves nothing still puts back
//! attributes changed at DST.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use ramsys_engine::request::sync::flags;
use ramsys_proto::attrs::preserve;
use ramsys_proto::Control;

use crate::common::pair::{Outcome, Pair, SINK, SOURCE};
use crate::common::tree::{small_files, tmp};

const FILES: usize = 700;

/// Whether this file system takes user xattrs (tmpfs before 6.6 does not).
fn xattrs_work(dir: &Path) -> bool {
    let p = dir.join(".probe");
    std::fs::write(&p, b"").unwrap();
    let ok = xattr::set(&p, "user.probe", b"1").is_ok();
    std::fs::remove_file(&p).unwrap();
    ok
}

fn root() -> bool {
    rustix::process::geteuid().is_root()
}

fn set_mtime(p: &Path, s: i64, ns: i64) {
    let t = libc::timespec {
        tv_sec: s,
        tv_nsec: ns,
    };
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid path and two timespecs.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), [t, t].as_ptr(), 0x100) };
    assert_eq!(r, 0, "utimensat {}", p.display());
}

/// Small files in two directories, each with its own mode and mtime,
/// every third with a user xattr, every fifth owned by nobody (as root);
/// a symlink, a hard link, a FIFO; the directories' modes and mtimes last.
fn make_tree(src: &Path, xattrs: bool) {
    small_files(src, FILES, 36);
    let modes = [0o600, 0o640, 0o644, 0o755];
    for i in 0..FILES {
        let p = src.join(format!("d{}/f{i}", i / 500));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(modes[i % 4])).unwrap();
        if xattrs && i % 3 == 0 {
            xattr::set(&p, "user.n", i.to_string().as_bytes()).unwrap();
        }
        if root() && i % 5 == 0 {
            std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
        }
        set_mtime(&p, 1_500_000_000 + i as i64, i as i64 * 1000);
    }
    std::os::unix::fs::symlink("f1", src.join("d0/link")).unwrap();
    std::fs::hard_link(src.join("d0/f2"), src.join("d1/hard")).unwrap();
    let fifo = std::ffi::CString::new(src.join("d1/fifo").as_os_str().as_encoded_bytes());
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(fifo.unwrap().as_ptr(), 0o640) }, 0);
    for (d, mode, t) in [("d0", 0o750, 1_400_000_000), ("d1", 0o700, 1_400_000_500)] {
        let p = src.join(d);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        set_mtime(&p, t, 7);
    }
}

/// Every entry under `a` is at `b` with the same type, mode, mtime,
/// owner, user xattrs and contents (symlinks: target and mtime).
fn same_archive(a: &Path, b: &Path) {
    for e in std::fs::read_dir(a).unwrap() {
        let e = e.unwrap();
        let (pa, pb) = (e.path(), b.join(e.file_name()));
        let (x, y) = (
            std::fs::symlink_metadata(&pa).unwrap(),
            std::fs::symlink_metadata(&pb).unwrap_or_else(|e| panic!("{}: {e}", pb.display())),
        );
        let what = pb.display();
        assert_eq!(x.file_type(), y.file_type(), "{what}");
        assert_eq!(x.mode() & 0o7777, y.mode() & 0o7777, "{what} mode");
        assert_eq!((x.uid(), x.gid()), (y.uid(), y.gid()), "{what} owner");
        if x.is_dir() {
            same_archive(&pa, &pb);
        } else if x.file_type().is_symlink() {
            assert_eq!(
                std::fs::read_link(&pa).unwrap(),
                std::fs::read_link(&pb).unwrap()
            );
        } else {
            let list = |p: &Path| {
                let mut v: Vec<_> = xattr::list(p).unwrap().collect();
                v.sort();
                v.into_iter()
                    .map(|n| (n.clone(), xattr::get(p, &n).unwrap()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(list(&pa), list(&pb), "{what} xattrs");
            if x.is_file() {
                assert!(std::fs::read(&pa).unwrap() == std::fs::read(&pb).unwrap());
            }
        }
        // Directories after their contents: the recursion above did not
        // change theirs (the sink set them last).
        assert_eq!(
            (x.mtime(), x.mtime_nsec()),
            (y.mtime(), y.mtime_nsec()),
            "{what} mtime"
        );
    }
}

/// An archive pair with windows of `window` ids at the source and
/// `sink_window` at the sink (0: it does not take them, as a sink of
/// before).
fn archive_with(src: &Path, dst: &Path, (window, sink_window): (u64, u64), sync: u32) -> Outcome {
    let mut p = Pair::new(src, dst);
    p.both(|o| {
        o.preserve = preserve::OWNER | preserve::GROUP | preserve::XATTRS | preserve::SPECIALS;
        o.meta_window = (window, 64 << 20);
        o.sync = sync;
    });
    p.sink.opts.meta_window.0 = sink_window;
    p.run()
}

fn archive(src: &Path, dst: &Path, window: u64, sync: u32) -> Outcome {
    archive_with(src, dst, (window, window), sync)
}

/// Attrs messages from the source, and Ready messages from the sink.
fn counts(o: &Outcome) -> (usize, usize) {
    let n = |from, name| o.control(from).iter().filter(|r| r.name() == name).count();
    (n(SOURCE, "Attrs"), n(SINK, "Ready"))
}

/// Every Attrs the source sent names only ids of the Entries records
/// sent since the Attrs before it (the batch it follows).
fn attrs_follow_their_batch(o: &Outcome) {
    let (mut from, mut next, mut after_attrs) = (0, 0, false);
    for r in o.control(SOURCE) {
        match &r.control {
            Some(Control::Entries(es)) if !es.is_empty() => {
                if after_attrs {
                    (from, after_attrs) = (es[0].id, false);
                }
                next = es.last().unwrap().id + 1;
            }
            Some(Control::Attrs(v)) => {
                after_attrs = true;
                for a in v {
                    assert!(
                        (from..next).contains(&a.id),
                        "{} not in {from}..{next}",
                        a.id
                    );
                }
            }
            _ => {}
        }
    }
}

#[test]
fn a_windowed_archive_copy_keeps_every_attribute() {
    let t = tmp();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    std::fs::create_dir_all(&dst).unwrap();
    let x = xattrs_work(t.path());
    make_tree(&src, x);
    // Windows of 64 ids over 700 files: a dozen windows.
    let o = archive(&src, &dst, 64, 0);
    o.reports();
    let (attrs, readies) = counts(&o);
    assert!(readies >= 8, "{readies} Ready messages");
    assert!(attrs >= 8, "{attrs} Attrs messages");
    attrs_follow_their_batch(&o);
    same_archive(&src, &dst.join("src"));
    // Whole-tree phases (neither end takes windows): the same tree.
    let whole = t.path().join("whole");
    std::fs::create_dir_all(&whole).unwrap();
    let o = archive(&src, &whole, 0, 0);
    o.reports();
    assert_eq!(counts(&o).1, 0, "Ready without windows");
    same_archive(&src, &whole.join("src"));
    // A windowed source and a sink that does not take windows: its scan's
    // batches and their Attrs, in the whole-tree phases.
    let old = t.path().join("old");
    std::fs::create_dir_all(&old).unwrap();
    let o = archive_with(&src, &old, (64, 0), 0);
    o.reports();
    assert_eq!(counts(&o).1, 0, "Ready from a sink without windows");
    attrs_follow_their_batch(&o);
    same_archive(&src, &old.join("src"));
}

/// A windowed archive re-sync that moves no data: every file is unchanged
/// and settles with its Ready, before its Attrs arrive; they are applied
/// then (an xattr and an owner changed at DST come back).
#[test]
fn a_windowed_archive_resync_moves_nothing_and_restores_attributes() {
    let t = tmp();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    std::fs::create_dir_all(&dst).unwrap();
    let x = xattrs_work(t.path());
    make_tree(&src, x);
    let sync = flags::SYNC | flags::JOURNAL;
    archive(&src, &dst, 64, sync).reports();
    same_archive(&src, &dst.join("src"));
    let f = dst.join("src/d0/f3");
    if x {
        xattr::set(&f, "user.n", b"changed").unwrap();
    }
    if root() {
        std::os::unix::fs::chown(&f, Some(65534), None).unwrap();
    }
    let o = archive(&src, &dst, 64, sync);
    let (s, k) = o.reports();
    assert_eq!((k.files, k.bytes), (0, 0), "nothing moves");
    assert_eq!(s.unchanged, FILES as u64);
    assert!(counts(&o).1 >= 8, "ran windowed");
    same_archive(&src, &dst.join("src"));
}
