//! Credit flow (seed 004): with a window of W credits a stream never has
//! more than W blocks in flight. In the transcript, block k on a link
//! follows the credit the sink sent after it received block k - W: its
//! depth is at least two half-trips above that block's.

use ramsys_proto::control::Confirm;
use ramsys_proto::frame::FrameKind;
use ramsys_proto::Control;

use crate::common::pair::{Pair, SINK, SOURCE};
use crate::common::tree::{file, same_tree, tmp};

#[test]
fn a_window_of_two_paces_every_block() {
    let t = tmp();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    file(&src.join("one"), 40 * 4096, 4);
    std::fs::create_dir(&dst).unwrap();
    let mut p = Pair::new(&src, &dst);
    p.source.opts.streams = 1;
    p.source.opts.block_size = 4096;
    p.sink.opts.window = 2;
    let o = p.run();
    o.reports();
    match &o.first("Confirm").control {
        Some(Control::Confirm(Confirm {
            credits_per_stream, ..
        })) => assert_eq!(*credits_per_stream, 2),
        _ => unreachable!(),
    }
    let blocks = o.frames("data0.0", SOURCE, FrameKind::Data);
    assert_eq!(blocks.len(), 40);
    for k in 2..blocks.len() {
        let (now, then) = (blocks[k].depth, blocks[k - 2].depth);
        assert!(
            now >= then + 2,
            "block {k} (depth {now}) sent without a credit ({then})"
        );
    }
    let credits = o.frames("data0.0", SINK, FrameKind::Credit);
    assert!(credits.len() >= 19, "{} credit frames", credits.len());
    same_tree(&src, &dst.join("src"));
}
