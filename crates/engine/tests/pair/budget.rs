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

/// A whole-tree session (`--resume`: the sink holds every file's slot
/// until the end) past the same budget still ends, with the one line.
#[test]
fn a_whole_tree_session_past_its_budget_still_ends() {
    let t = tmp();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    small_files(&src, 3000, 38);
    std::fs::create_dir(&dst).unwrap();
    let mut p = Pair::new(&src, &dst);
    p.both(|o| o.sync = flags::RESUME);
    p.sink.opts.meta_budget = BUDGET;
    let o = p.run();
    assert!(!o.stuck);
    let e = o.sink.as_ref().expect_err("the sink ended").to_string();
    assert!(e.contains("memory budget per session"), "{e}");
    assert!(o.control(SINK).iter().all(|r| r.name() != "Window"));
}
