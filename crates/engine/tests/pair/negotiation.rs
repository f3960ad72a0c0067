//! Capacity negotiation (seed 000 Fig. 6-4a): what the source proposes,
//! what the sink confirms, and that both ends then run with the latter.

use ramsys_engine::transport::crypto::Cipher;
use ramsys_proto::control::Confirm;
use ramsys_proto::frame::FrameKind;
use ramsys_proto::Control;

use crate::common::pair::{Dialer, Outcome, Pair, SINK, SOURCE};
use crate::common::tree::{files, same_tree, tmp};

fn confirm(o: &Outcome) -> Confirm {
    match &o.first("Confirm").control {
        Some(Control::Confirm(c)) => c.clone(),
        _ => unreachable!(),
    }
}

/// The source proposes 4 streams of 16 KiB blocks; the sink serves 2
/// streams, 8 KiB buffers and a window of 3: both ends run with that, and
/// the two links dialled beyond it carry nothing.
#[test]
fn the_sink_confirms_fewer_streams_a_smaller_block_and_its_window() {
    let t = tmp();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    files(&src, 60, 16 << 10, 1);
    std::fs::create_dir(&dst).unwrap();
    let mut p = Pair::new(&src, &dst);
    p.source.opts.streams = 4;
    p.sink.res.max_streams = 2;
    p.sink.res.buffer_size = 8 << 10;
    p.sink.opts.window = 3;
    let o = p.run();
    let (s, k) = o.reports();
    match &o.first("Propose").control {
        Some(Control::Propose(p)) => assert_eq!((p.streams, p.block_size), (4, 16 << 10)),
        _ => unreachable!(),
    }
    let c = confirm(&o);
    assert_eq!(
        (c.streams, c.block_size, c.credits_per_stream),
        (2, 8 << 10, 3)
    );
    assert_eq!((s.streams, s.block_size as usize), (2, 8 << 10));
    assert_eq!((k.streams, k.block_size), (2, 8 << 10));
    let data = o.frames("data", SOURCE, FrameKind::Data);
    assert!(data
        .iter()
        .all(|r| r.link == "data0.0" || r.link == "data1.0"));
    assert!(data
        .iter()
        .all(|r| r.header.unwrap().len as usize <= (8 << 10) + 4096));
    same_tree(&src, &dst.join("src"));
}

/// A pull (the sink dials): a sink that can serve one stream only gets
/// one; and it may add encryption the source did not ask for, so every
/// block and credit is sealed.
#[test]
fn a_pulling_sink_serves_one_stream_and_adds_encryption() {
    let t = tmp();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    files(&src, 30, 16 << 10, 2);
    std::fs::create_dir(&dst).unwrap();
    let mut p = Pair::new(&src, &dst);
    p.dialer = Dialer::Sink;
    p.sink.res.max_streams = 1;
    p.sink.opts.encrypt = Cipher::ChaCha20Poly1305;
    let o = p.run();
    let (s, _) = o.reports();
    let c = confirm(&o);
    assert_eq!((c.streams, c.cipher), (1, Cipher::ChaCha20Poly1305.id()));
    assert_eq!(s.streams, 1);
    let data = o.frames("data", SOURCE, FrameKind::Data);
    assert!(!data.is_empty());
    assert!(data.iter().all(|r| r.link == "data0.0"));
    assert!(
        data.iter().all(|r| r.header.unwrap().flags & 1 == 1),
        "a clear block"
    );
    let credits = o.frames("data", SINK, FrameKind::Credit);
    assert!(
        credits.iter().all(|r| r.header.unwrap().flags & 1 == 1),
        "a clear credit"
    );
    same_tree(&src, &dst.join("src"));
}
