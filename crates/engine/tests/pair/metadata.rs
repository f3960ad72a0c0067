//! Metadata in one round trip (Fig. 6-4b): the source streams every
//! record right behind Propose without reading anything, and the sink's
//! answer (Confirm, SyncDone) comes after reading only that. Round trips
//! are counted by the transcript's depths (a Lamport clock per link end,
//! transport::mem::Record::depth): 1 for what an end writes before it has
//! read a frame, one more than the deepest frame read otherwise.

use ramsys_proto::Control;

use crate::common::pair::{Pair, SINK, SOURCE};
use crate::common::tree::{files, same_tree, tmp};

#[test]
fn the_whole_tree_travels_in_one_round_trip() {
    let t = tmp();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    // 400 records over 7 directories: several Entries messages.
    files(&src, 400, 1 << 10, 3);
    std::fs::create_dir(&dst).unwrap();
    let o = Pair::new(&src, &dst).run();
    o.reports();
    let src_msgs = o.control(SOURCE);
    let end = src_msgs.iter().position(|r| r.name() == "MetaEnd").unwrap();
    let entries = src_msgs[..end]
        .iter()
        .filter(|r| r.name() == "Entries")
        .count();
    assert!(entries >= 2, "{entries} Entries messages");
    for r in &src_msgs[..=end] {
        assert_eq!(r.depth, 1, "the source read before sending {}", r.name());
    }
    match &src_msgs[end].control {
        Some(Control::MetaEnd { files, .. }) => assert_eq!(*files, 400),
        _ => unreachable!(),
    }
    let sink_msgs = o.control(SINK);
    for name in ["Confirm", "SyncDone"] {
        let r = sink_msgs.iter().find(|r| r.name() == name).unwrap();
        assert_eq!(r.depth, 2, "{name} waited for more than the metadata");
    }
    // The payload phase starts with the source's third half-trip.
    assert_eq!(src_msgs[end + 1].depth, 3, "{}", src_msgs[end + 1].name());
    // A whole copy: metadata, Settled (all in place), the verdict.
    let deepest = o.control(SINK).iter().map(|r| r.depth).max().unwrap();
    let complete = o.first("Complete").depth;
    assert_eq!(complete, deepest);
    assert!(
        complete <= 6,
        "a copy took {complete} half-trips on the control link"
    );
    same_tree(&src, &dst.join("src"));
}
