//! Sync (docs/SYNC.md): the sink answers the metadata with what it holds
//! (Have), in the same round trip as SyncDone, and only what changed
//! moves; between two ends that take windows (issue 36, docs/PROTOCOL.md
//! "Windows") the answer comes per window, right before each Ready.

use ramsys_engine::request::sync::flags;
use ramsys_proto::frame::FrameKind;
use ramsys_proto::Control;

use crate::common::pair::{Outcome, Pair, SINK, SOURCE};
use crate::common::tree::{file, files, mirror, same_tree, small_files, tmp};

/// The same answer whole-tree and windowed: a tree smaller than the window
/// travels in Propose's flight, and its Have records come in the metadata's
/// round trip either way.
fn have_records_and_only_what_changed(windows: bool) {
    let t = tmp();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    files(&src, 40, 16 << 10, 8);
    std::fs::create_dir(&dst).unwrap();
    let sync = |p: &mut Pair| {
        p.both(|o| o.sync = flags::SYNC);
        if !windows {
            p.both(|o| o.meta_window = (0, 0));
        }
    };
    let mut first = Pair::new(&src, &dst);
    sync(&mut first);
    first.run().reports();
    // Two files change (and grow), one is new.
    file(&src.join("d1/f1"), 20_000, 80);
    file(&src.join("d2/f2"), 17_000, 81);
    file(&src.join("d3/new"), 5_000, 82);
    let mut p = Pair::new(&src, &dst);
    sync(&mut p);
    let o = p.run();
    let (s, k) = o.reports();
    assert_eq!(k.files, 3, "files moved");
    assert_eq!((s.unchanged, k.unchanged), (38, 38));
    let sink = o.control(SINK);
    let haves: Vec<_> = sink.iter().filter(|r| r.name() == "Have").collect();
    assert!(!haves.is_empty(), "no Have records");
    assert!(
        haves.iter().all(|r| r.depth == 2),
        "Have not in the metadata's round trip"
    );
    assert_eq!(sink.iter().any(|r| r.name() == "Ready"), windows);
    let moved: u64 = o
        .frames("data", SOURCE, FrameKind::Data)
        .iter()
        .map(|r| r.header.unwrap().len as u64)
        .sum();
    assert!(moved < 50_000, "{moved} bytes of blocks for 42 KB changed");
    same_tree(&src, &dst.join("src"));
}

#[test]
fn a_sync_answers_with_have_records_and_moves_only_what_changed() {
    have_records_and_only_what_changed(false);
}

#[test]
fn a_windowed_sync_answers_in_the_same_round_trip() {
    have_records_and_only_what_changed(true);
}

/// Windows of 100 ids (the first window only before Confirm) over
/// 3,000 files: dozens of windows.
const WINDOW: (u64, u64) = (100, 64 << 20);

fn windowed_sync(src: &std::path::Path, dst: &std::path::Path, sync: u32) -> Outcome {
    let mut p = Pair::new(src, dst);
    p.both(|o| {
        o.sync = sync;
        o.meta_window = WINDOW;
    });
    p.run()
}

/// The sink's answers, window by window: every Have names ids between the
/// Ready before it and the Ready after it (the window being readied), and
/// none comes after the last Ready. Returns (Have ids, Ready, SettledThrough).
fn answers_per_window(o: &Outcome) -> (usize, usize, usize) {
    let (mut ready, mut have, mut readies, mut settled) = (0, Vec::new(), 0, 0);
    let mut answered = 0;
    for r in o.control(SINK) {
        match &r.control {
            Some(Control::Have(v)) => have.extend(v.iter().map(|h| h.id)),
            Some(Control::Ready { through }) => {
                let out = have.iter().find(|&&id| id < ready || id >= *through);
                assert!(out.is_none(), "Have {out:?} outside {ready}..{through}");
                answered += have.len();
                have.clear();
                (ready, readies) = (*through, readies + 1);
            }
            Some(Control::SettledThrough { .. }) => settled += 1,
            _ => {}
        }
    }
    assert!(have.is_empty(), "Have {have:?} after the last Ready");
    (answered, readies, settled)
}

/// A no-change re-sync in windows: each window's files answered Unchanged
/// right before its Ready and settled at once, so the windows move on with
/// no data at all; and the first sync into an empty DST, in windows too.
#[test]
fn a_windowed_no_change_sync_moves_nothing_window_by_window() {
    let t = tmp();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    small_files(&src, 3000, 11);
    std::fs::create_dir(&dst).unwrap();
    let o = windowed_sync(&src, &dst, flags::SYNC | flags::JOURNAL);
    let (s, k) = o.reports();
    assert_eq!((k.files, k.unchanged, s.unchanged), (3000, 0, 0));
    same_tree(&src, &dst.join("src"));
    let o = windowed_sync(&src, &dst, flags::SYNC | flags::JOURNAL);
    let (s, k) = o.reports();
    assert_eq!((k.files, k.bytes), (0, 0), "a no-change sync moved data");
    assert_eq!((s.unchanged, k.unchanged), (3000, 3000));
    assert!(o.frames("data", SOURCE, FrameKind::Data).is_empty());
    let (answered, readies, settled) = answers_per_window(&o);
    assert_eq!(answered, 3000, "every file answered once");
    assert!(readies >= 20, "{readies} windows readied");
    assert!(
        settled >= 20,
        "{settled} SettledThrough: the window stood still"
    );
    same_tree(&src, &dst.join("src"));
}

/// A re-sync after changes, in windows: files rewritten at the same size
/// (a block delta, or with `-c` a digest), grown ones (sent whole), a big
/// file with one block changed (only that block moves), new files in old
/// and new directories, and one file whose DST path is a non-empty
/// directory (a sync without --delete leaves it, and that file fails
/// alone); the rest is rsync's tree.
fn changed_in_windows(sync: u32) {
    let t = tmp();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    small_files(&src, 3000, 12);
    file(&src.join("d3/big"), 2 << 20, 13);
    // What an earlier sync left: the same files and mtimes.
    mirror(&src, &dst.join("src"));
    std::thread::sleep(std::time::Duration::from_millis(20));
    let mut rewritten = 0;
    for i in (7..3000).step_by(97) {
        let p = src.join(format!("d{}/f{i}", i / 500));
        let len = std::fs::metadata(&p).unwrap().len() as usize;
        if len > 0 {
            file(&p, len, 100 + i as u64);
            rewritten += 1;
        }
    }
    for i in (11..3000).step_by(301) {
        let p = src.join(format!("d{}/f{i}", i / 500));
        let mut v = std::fs::read(&p).unwrap();
        v.extend_from_slice(b"grown");
        std::fs::write(&p, v).unwrap();
    }
    let mut big = std::fs::read(src.join("d3/big")).unwrap();
    big[1 << 20..(1 << 20) + 100].fill(0x5a);
    std::fs::write(src.join("d3/big"), big).unwrap();
    for i in 0..15 {
        file(
            &src.join(format!("d{}/new{i}", i % 6)),
            50 + i,
            200 + i as u64,
        );
        file(&src.join(format!("fresh/n{i}")), 10 + i, 300 + i as u64);
    }
    let blocked = dst.join("src/d2/f1234");
    std::fs::remove_file(&blocked).unwrap();
    std::fs::create_dir(&blocked).unwrap();
    std::fs::write(blocked.join("inside"), b"keep me").unwrap();
    let o = windowed_sync(&src, &dst, sync);
    let (s, k) = o.reports();
    let grown = (11..3000).step_by(301).count();
    let moved = rewritten + grown + 1 + 30;
    let total = 3000 + 1 + 30;
    assert_eq!(k.files as usize, moved, "files whose data moved");
    assert_eq!(k.unchanged as usize, total - moved - 1);
    assert_eq!(s.unchanged, k.unchanged);
    if sync & flags::CHECKSUM == 0 {
        // The big file's one changed block, not its 2 MiB.
        assert!(k.bytes < 1 << 20, "{} bytes moved", k.bytes);
    }
    for r in [s, k] {
        assert_eq!(r.failed.len(), 1, "{:?}", r.failed);
        assert!(r.failed[0].path.ends_with("d2/f1234"), "{:?}", r.failed);
    }
    answers_per_window(&o);
    // The failed file left DST's directory as it was; the rest is SRC.
    assert_eq!(std::fs::read(blocked.join("inside")).unwrap(), b"keep me");
    std::fs::remove_dir_all(&blocked).unwrap();
    std::fs::remove_file(src.join("d2/f1234")).unwrap();
    same_tree(&src, &dst.join("src"));
}

#[test]
fn a_windowed_sync_moves_what_changed_and_fails_a_file_alone() {
    changed_in_windows(flags::SYNC | flags::JOURNAL);
}

#[test]
fn a_windowed_checksum_sync_moves_what_changed() {
    changed_in_windows(flags::SYNC | flags::CHECKSUM | flags::JOURNAL);
}

/// `--delete` in windows: the sink answers per window and keeps a keyed
/// hash per path it was sent, per directory until the source names it
/// done (dirs_done.rs); it deletes what the source does not have (a file,
/// a directory with its files), nothing it was sent.
#[test]
fn a_windowed_delete_sync_deletes_what_the_source_lost() {
    let t = tmp();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    small_files(&src, 300, 14);
    mirror(&src, &dst.join("src"));
    std::fs::write(dst.join("src/d0/extra"), b"x").unwrap();
    std::fs::create_dir_all(dst.join("src/d0/gone/deeper")).unwrap();
    std::fs::write(dst.join("src/d0/gone/deeper/f"), b"y").unwrap();
    let o = windowed_sync(&src, &dst, flags::SYNC | flags::DELETE);
    let (_, k) = o.reports();
    assert_eq!(k.unchanged, 300);
    let mut deleted = k.deleted.clone();
    deleted.sort();
    assert_eq!(deleted, ["src/d0/extra", "src/d0/gone"], "{deleted:?}");
    let readies = o
        .control(SINK)
        .iter()
        .filter(|r| r.name() == "Ready")
        .count();
    assert!(readies >= 3, "not windowed: {readies} Ready");
    same_tree(&src, &dst.join("src"));
}

/// A windowed sync adds no round trip where a windowed copy adds none
/// (metadata.rs `windows_add_no_round_trip_on_a_slow_link`: while a
/// window's batch of data outlasts two round trips): 4,000 files, nine in
/// ten rewritten at their size (a block delta each), in windows of 400 ids
/// over links that each take `D` each way; the answers travel with each
/// window's Ready, so the windowed sync stays within 6 round trips of the
/// whole-tree one, where waiting windows would add ~20. (With half the files changed a batch moves in ~1.3
/// round trips, and each window then waits for the sink's SettledThrough,
/// as a copy's would.) Best of three interleaved runs each, and a tenth of
/// slack: the answers' hashing at both ends adds CPU per window, which a
/// busy machine stretches.
#[test]
fn a_windowed_sync_adds_no_round_trip_on_a_slow_link() {
    use ramsys_engine::transport::mem::Fault;
    // 10 ms: what a window costs besides round trips (its answers'
    // hashing, a generation's planning and drain: 1-7 ms a window here)
    // stays well inside the bound, while a waiting window costs ~40 ms.
    const D: std::time::Duration = std::time::Duration::from_millis(10);
    let t = tmp();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    files(&src, 4000, 1 << 10, 5);
    let old = t.path().join("old");
    mirror(&src, &old);
    for i in (0..4000).filter(|i| i % 10 != 0) {
        let p = src.join(format!("d{}/f{i}", i % 7));
        let len = std::fs::metadata(&p).unwrap().len() as usize;
        file(&p, len.max(1), 1000 + i as u64);
    }
    let run = |windows: bool, into: &str| {
        let dst = dst.join(into);
        mirror(&old, &dst.join("src"));
        let mut p = Pair::new(&src, &dst);
        p.both(|o| {
            o.sync = flags::SYNC;
            o.meta_window = (if windows { 400 } else { 0 }, 64 << 20);
        });
        for link in ["ctl", "data0.0", "data1.0"] {
            for from in [SOURCE, SINK] {
                p.net.fault(link, from, Fault::Delay(D));
            }
        }
        let o = p.run();
        let (_, k) = o.reports();
        assert_eq!((k.files, k.unchanged), (3600, 400));
        let readies = o
            .control(SINK)
            .iter()
            .filter(|r| r.name() == "Ready")
            .count();
        assert_eq!(readies >= 10, windows, "{readies} Ready messages");
        same_tree(&src, &dst.join("src"));
        o.elapsed
    };
    let (mut whole, mut windowed) = (std::time::Duration::MAX, std::time::Duration::MAX);
    for round in 0..3 {
        whole = whole.min(run(false, &format!("w{round}")));
        windowed = windowed.min(run(true, &format!("n{round}")));
    }
    assert!(
        windowed <= whole + whole / 10 + 6 * 2 * D,
        "windowed {windowed:?}, whole tree {whole:?}"
    );
}
