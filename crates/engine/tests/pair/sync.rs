//! Sync (docs/SYNC.md): the sink answers the metadata with what it holds
//! (Have), in the same round trip as SyncDone, and only what changed
//! moves.

use ramsys_engine::request::sync::flags;
use ramsys_proto::frame::FrameKind;

use crate::common::pair::{Pair, SINK, SOURCE};
use crate::common::tree::{file, files, same_tree, tmp};

#[test]
fn a_sync_answers_with_have_records_and_moves_only_what_changed() {
    let t = tmp();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    files(&src, 40, 16 << 10, 8);
    std::fs::create_dir(&dst).unwrap();
    let sync = |p: &mut Pair| p.both(|o| o.sync = flags::SYNC);
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
    let (_, k) = o.reports();
    assert_eq!(k.files, 3, "files moved");
    assert_eq!(k.unchanged, 38);
    let haves: Vec<_> = o
        .control(SINK)
        .into_iter()
        .filter(|r| r.name() == "Have")
        .collect();
    assert!(!haves.is_empty(), "no Have records");
    assert!(
        haves.iter().all(|r| r.depth == 2),
        "Have not in the metadata's round trip"
    );
    let moved: u64 = o
        .frames("data", SOURCE, FrameKind::Data)
        .iter()
        .map(|r| r.header.unwrap().len as u64)
        .sum();
    assert!(moved < 50_000, "{moved} bytes of blocks for 42 KB changed");
    same_tree(&src, &dst.join("src"));
}
