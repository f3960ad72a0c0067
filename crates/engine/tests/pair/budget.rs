//! A memory budget per session (issue 36, docs/SCALE.md "Bounds and
//! reports"): in a windowed session the window fits the budget of the end
//! that has one (a daemon's `--session-memory`), so a small budget slows
//! the session down (more, smaller windows) instead of ending it; a
//! whole-tree session cannot shed what it holds and still ends in one line.

use std::sync::atomic::Ordering;

use ramsys_engine::request::sync::flags;
use ramsys_engine::roles::sink::files::SLOT_BYTES;
use ramsys_engine::session::options::budget_window;
use ramsys_proto::Control;

use crate::common::pair::{Outcome, Pair, SINK, SOURCE};
use crate::common::tree::{same_tree, small_files, tmp};

/// 128 KiB: about 130 slots and 16 KiB of paths a window at the sink,
/// where the 3,000-file tree takes ~450 KB whole.
const BUDGET: u64 = 128 << 10;

/// Ready messages from the sink, and the most records an Entries message
/// from the source held (the machines check the window itself; the
/// transcript interleaves the two directions only roughly).
fn windows(o: &Outcome) -> (usize, usize) {
    let (mut readies, mut batch) = (0, 0);
    for r in o.transcript.iter().filter(|r| r.link == "ctl") {
        match (&r.control, r.from.as_str()) {
            (Some(Control::Ready { .. }), SINK) => readies += 1,
            (Some(Control::Entries(es)), SOURCE) => batch = batch.max(es.len()),
            _ => {}
        }
    }
    (readies, batch)
}

/// A push to a daemon with a small budget (the common case): the sink
/// announces the window its budget holds right behind its Confirm, the
/// source keeps to it (after the first window), the copy completes in
/// many more windows than without a budget, and the sink's file list
/// stayed within the budget.
#[test]
fn a_small_sink_budget_slows_a_windowed_copy_instead_of_ending_it() {
    let t = tmp();
    let src = t.path().join("src");
    small_files(&src, 3000, 36);
    let run = |budget: u64, into: &str| {
        let dst = t.path().join(into);
        std::fs::create_dir(&dst).unwrap();
        let mut p = Pair::new(&src, &dst);
        p.sink.opts.meta_budget = budget;
        let o = p.run();
        let (_, k) = o.reports();
        assert_eq!(k.files, 3000);
        same_tree(&src, &dst.join("src"));
        (o, p.sink.stats.meta_bytes.load(Ordering::Relaxed))
    };
    let (free, _) = run(0, "free");
    let (o, held) = run(BUDGET, "budget");
    let sink = o.control(SINK);
    let at = sink.iter().position(|r| r.name() == "Confirm").unwrap();
    let Some(Control::Window { files, bytes }) = sink[at + 1].control else {
        panic!("{} right behind Confirm", sink[at + 1].name());
    };
    assert_eq!(Some((files, bytes)), budget_window(BUDGET, SLOT_BYTES));
    assert!(files < 200, "a window of {files} ids");
    let ((readies, _), (free_readies, _)) = (windows(&o), windows(&free));
    assert!(
        readies >= 3000 / files as usize && readies > 2 * free_readies,
        "{readies} windows with the budget, {free_readies} without"
    );
    assert!(held <= BUDGET, "the sink held {held} bytes");
    assert!(free.control(SINK).iter().all(|r| r.name() != "Window"));
}

/// Long paths fill the sink's window by bytes before ids: 2,000 files
/// under a 200-byte directory path (about 230 bytes a record) against a
/// budget of 512 KiB, whose Window allows 64 KiB of records (some 280 a
/// window) where its ids allow 528. (The first window, 128 KiB of such
/// records and their slots, is more than a 128 KiB budget holds.)
#[test]
fn long_paths_fill_the_sinks_window_by_bytes() {
    let t = tmp();
    let src = t.path().join("src");
    let deep = src.join(["d".repeat(99), "e".repeat(99)].join("/"));
    std::fs::create_dir_all(&deep).unwrap();
    for i in 0..2000 {
        std::fs::write(deep.join(format!("file-{i:04}")), i.to_string()).unwrap();
    }
    let dst = t.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let mut p = Pair::new(&src, &dst);
    p.sink.opts.meta_budget = ARCHIVE_BUDGET;
    let o = p.run();
    let (_, k) = o.reports();
    assert_eq!(k.files, 2000);
    same_tree(&src, &dst.join("src"));
    let (files, bytes) = budget_window(ARCHIVE_BUDGET, SLOT_BYTES).unwrap();
    let (readies, _) = windows(&o);
    assert!(readies >= 2000 / 300, "{readies} windows");
    // Past the first window (sent before the Window was read), no
    // Entries message holds more records than the Window's bytes allow,
    // fewer than its ids would.
    let first = ramsys_proto::session::FIRST_WINDOW.0;
    let most = (o.control(SOURCE).iter())
        .filter_map(|r| match &r.control {
            Some(Control::Entries(es)) if es.first().is_some_and(|e| e.id >= first) => {
                Some(es.len() as u64)
            }
            _ => None,
        })
        .max()
        .unwrap();
    // A record: "src/", the two 99-byte names, "file-NNNN", 16 more.
    let record = (4 + 100 + 100 + 9 + 16) as u64;
    assert!(
        most <= bytes / record + 1 && most < files,
        "{most} records in a message"
    );
    let held = p.sink.stats.meta_bytes.load(Ordering::Relaxed);
    assert!(held <= ARCHIVE_BUDGET, "the sink held {held} bytes");
}

/// An archive copy's sink holds a file's record and Attrs too until it
/// settles (about twice a plain copy's per file): its first window of
/// 512 files takes more than 128 KiB.
const ARCHIVE_BUDGET: u64 = 512 << 10;

/// A budget over an archive `--delete` sync (the wide flag, Attrs behind
/// each batch the window splits): it completes in windows into a DST
/// holding an extra file, which it deletes, modes and mtimes kept.
#[test]
fn a_small_sink_budget_slows_an_archive_delete_sync_too() {
    use std::os::unix::fs::MetadataExt;
    let t = tmp();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    small_files(&src, 3000, 39);
    std::fs::create_dir_all(dst.join("src")).unwrap();
    std::fs::write(dst.join("src/extra"), b"x").unwrap();
    let mut p = Pair::new(&src, &dst);
    p.both(|o| {
        o.preserve = ramsys_proto::attrs::preserve::OWNER | ramsys_proto::attrs::preserve::GROUP;
        o.sync = flags::SYNC | flags::DELETE;
    });
    p.sink.opts.meta_budget = ARCHIVE_BUDGET;
    let o = p.run();
    let (_, k) = o.reports();
    assert_eq!(k.files, 3000);
    same_tree(&src, &dst.join("src"));
    assert!(!dst.join("src/extra").exists());
    let held = p.sink.stats.meta_bytes.load(Ordering::Relaxed);
    assert!(held <= ARCHIVE_BUDGET, "the sink held {held} bytes");
    let (a, b) = (src.join("d1/f700"), dst.join("src/d1/f700"));
    let (a, b) = (a.metadata().unwrap(), b.metadata().unwrap());
    assert_eq!((a.mode(), a.mtime()), (b.mode(), b.mtime()));
    let attrs = o
        .control(SOURCE)
        .iter()
        .filter(|r| r.name() == "Attrs")
        .count();
    let (readies, _) = windows(&o);
    assert!(
        attrs >= 3000 / 600 && readies >= 3000 / 600,
        "{attrs} Attrs, {readies} Ready"
    );
}

/// A pull from a daemon with a small budget: the source sizes its own
/// window by it (the sink, an agent, announces none), from the first
/// record on: batches of half of it, where its own window (65,536 ids)
/// would send batches of 1,024.
#[test]
fn a_small_source_budget_slows_a_windowed_copy_instead_of_ending_it() {
    let t = tmp();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    small_files(&src, 3000, 37);
    std::fs::create_dir(&dst).unwrap();
    let mut p = Pair::new(&src, &dst);
    p.dialer = crate::common::pair::Dialer::Sink;
    p.source.opts.meta_budget = BUDGET;
    let o = p.run();
    let (s, _) = o.reports();
    assert_eq!(s.files, 3000);
    same_tree(&src, &dst.join("src"));
    assert!(o.control(SINK).iter().all(|r| r.name() != "Window"));
    let (readies, batch) = windows(&o);
    assert!(batch < 256, "a batch of {batch} records");
    assert!(readies >= 3000 / 256, "{readies} windows");
    let held = p.source.stats.meta_bytes.load(Ordering::Relaxed);
    assert!(held <= BUDGET, "the source held {held} bytes");
}

/// A whole-tree session (a source that proposes no windows, as one of
/// before: the sink holds every file's slot until the end) past the same
/// budget still ends, with the one line.
#[test]
fn a_whole_tree_session_past_its_budget_still_ends() {
    let t = tmp();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    small_files(&src, 3000, 38);
    std::fs::create_dir(&dst).unwrap();
    let mut p = Pair::new(&src, &dst);
    p.both(|o| o.sync = flags::RESUME);
    p.source.opts.meta_window = (0, 0);
    p.sink.opts.meta_budget = BUDGET;
    let o = p.run();
    assert!(!o.stuck);
    let e = o.sink.as_ref().expect_err("the sink ended").to_string();
    assert!(e.contains("memory budget per session"), "{e}");
    assert!(o.control(SINK).iter().all(|r| r.name() != "Window"));
}
