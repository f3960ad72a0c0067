//! Regression for issue 36 (commit "A no-change sync of 1 M files no
//! longer deadlocks"): a sink streams its Have records before it takes
//! its data links, so a source that waited for the links before reading
//! them left the answer unread, and past the buffers both ends waited for
//! each other. Buffers of 4 KiB make a few thousand files enough.

use ramsys_engine::request::sync::flags;
use ramsys_proto::frame::FrameKind;

use crate::common::pair::{Pair, SINK, SOURCE};
use crate::common::tree::{mirror, same_tree, small_files, tmp};

const FILES: usize = 3000;
const BUFFER: usize = 4 << 10;

#[test]
fn a_no_change_sync_of_thousands_of_files_over_4_kib_buffers_completes() {
    let t = tmp();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    small_files(&src, FILES, 9);
    std::fs::create_dir(&dst).unwrap();
    // What an earlier sync left: the same files, the same mtimes.
    mirror(&src, &dst.join("src"));
    let mut p = Pair::new(&src, &dst);
    p.both(|o| o.sync = flags::SYNC);
    p.net.set_buffer(BUFFER);
    // Stuck ends fail in seconds, not at the idle timeout.
    p.watchdog = std::time::Duration::from_secs(8);
    let o = p.run();
    assert!(
        !o.stuck,
        "deadlocked: {:?} / {:?}",
        o.source.as_ref().err(),
        o.sink.as_ref().err()
    );
    let (_, k) = o.reports();
    assert_eq!((k.files, k.unchanged), (0, FILES as u64));
    let have: usize = o
        .control(SINK)
        .iter()
        .filter(|r| r.name() == "Have")
        .map(|r| r.header.unwrap().len as usize)
        .sum();
    assert!(
        have > 2 * BUFFER,
        "{have} bytes of Have: no deadlock to fear"
    );
    assert!(o.frames("data", SOURCE, FrameKind::Data).is_empty());
    same_tree(&src, &dst.join("src"));
}
