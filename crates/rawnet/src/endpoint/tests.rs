//! Streams through two endpoints over a lossy, reordering virtual link,
//! with and without the copy thread, and aborts that must arrive.

use super::*;
use proptest::prelude::*;

const A: Mac = [2, 0, 0, 0, 0, 1];
const B: Mac = [2, 0, 0, 0, 0, 2];

/// A stream through two endpoints whose slot copies both go through
/// the copy thread (offload.rs) arrives intact; small reads and writes
/// (below offload::MIN_BYTES) stay inline in the same stream.
#[test]
fn stream_with_copy_offload_arrives_intact() {
    let off = crate::offload::Offload::spawn(None).unwrap();
    let mut a = Config::new(9, 8, 7, A, B);
    a.mtu = 9000;
    let mut b = Config::new(9, 8, 7, B, A);
    b.mtu = 9000;
    let (mut tx, mut rx) = (Endpoint::new(a, 0), Endpoint::new(b, 0));
    tx.set_copy_offload(off.client());
    rx.set_copy_offload(off.client());
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i ^ (i >> 11)) as u8).collect();
    let mut got = Vec::new();
    let (mut sent, mut out, mut rb) = (0, vec![0u8; 9014], vec![0u8; 200_000]);
    let mut now = 0u64;
    let mut step = 0usize;
    while got.len() < data.len() {
        now += 10;
        step += 1;
        // Alternate large and small calls on both sides.
        let w = if step.is_multiple_of(3) {
            1000
        } else {
            100_000
        };
        sent += tx.write(&data[sent..(sent + w).min(data.len())]);
        tx.flush();
        while let Some(n) = tx.poll_transmit(now, &mut out) {
            rx.handle_frame(&out[..n], now);
        }
        let r = if step.is_multiple_of(2) {
            777
        } else {
            rb.len()
        };
        if let ReadOutcome::Data(n) = rx.read(&mut rb[..r]) {
            got.extend_from_slice(&rb[..n]);
        }
        while let Some(n) = rx.poll_transmit(now, &mut out) {
            tx.handle_frame(&out[..n], now);
        }
        assert!(step < 100_000, "stalled at {} of {}", got.len(), data.len());
    }
    assert!(got == data, "stream corrupted through the copy offload");
    // Counted (process-wide, so other tests may add to them): large
    // calls on the copy thread, small ones as fallbacks.
    let c = crate::offload::counters();
    assert!(c.copies > 0 && c.bytes >= 2_000_000, "{c:?}");
    assert!(c.fallbacks > 0 && c.fallback_bytes > 0, "{c:?}");
}

/// An abort sends its reset RESET_COPIES times (one that arrives is
/// enough), and answers every later frame of the peer with another.
#[test]
fn abort_resets_survive_loss_and_are_repeated_on_demand() {
    let mut a = Endpoint::new(Config::new(9, 8, 7, A, B), 0);
    let mut b = Endpoint::new(Config::new(9, 8, 7, B, A), 0);
    let mut out = vec![0u8; 9100];
    a.abort();
    assert_eq!(a.next_deadline(), Some(0));
    let mut resets = Vec::new();
    while let Some(n) = a.poll_transmit(1, &mut out) {
        resets.push(out[..n].to_vec());
    }
    assert_eq!(resets.len(), RESET_COPIES as usize);
    assert_eq!(a.next_deadline(), None);
    // The first copies are lost; the last one arrives.
    b.handle_frame(resets.last().unwrap(), 2);
    let mut buf = [0u8; 8];
    assert!(matches!(
        b.read(&mut buf),
        ReadOutcome::Failed(Failure::Reset)
    ));

    // A peer that missed every copy and sends: answered by a reset.
    let mut c = Endpoint::new(Config::new(9, 8, 7, B, A), 0);
    c.write(b"late");
    let n = c.poll_transmit(3, &mut out).expect("data frame");
    a.handle_frame(&out[..n], 4);
    let n = a.poll_transmit(5, &mut out).expect("a reset answers it");
    c.handle_frame(&out[..n], 6);
    assert!(matches!(
        c.read(&mut buf),
        ReadOutcome::Failed(Failure::Reset)
    ));
    assert!(a.poll_transmit(7, &mut out).is_none());
}

proptest! {
    /// Sealed, correctly addressed frames with arbitrary protocol
    /// fields (what a buggy or hostile peer holding the token could
    /// send) never panic the state machine, interleaved with writes,
    /// reads and transmits.
    #[test]
    fn hostile_peer_never_panics(
        frames in proptest::collection::vec(
            (1u8..6, any::<u16>(), any::<u16>(), any::<u32>(), any::<u32>(),
             any::<u16>(), any::<u64>(), 0usize..200), 1..60),
        seq_base in any::<u32>())
    {
        let mut c = Config::new(9, 8, 7, B, A);
        c.mtu = 1500;
        c.initial_seq = seq_base;
        let mut e = Endpoint::new(c, 0);
        let mut out = vec![0u8; 1514];
        let mut rb = [0u8; 3000];
        for (t, (kind, flags, slot, seq, ack, credits, sack, len)) in frames.into_iter().enumerate() {
            let kind = match kind { 1 => Kind::Data, 2 => Kind::Ack, 3 => Kind::Nack, 4 => Kind::Reset, _ => Kind::Open };
            // Near the endpoint's own sequence numbers half the time.
            let (seq, ack) = if flags & 1 == 0 {
                (seq_base.wrapping_add(seq % 80), seq_base.wrapping_add(ack % 80))
            } else { (seq, ack) };
            let h = Header { dst: B, src: A, kind, flags, session: 9, token: 8, channel: 7,
                slot, seq, ack, credits, len: len as u16, sack };
            let mut f = vec![0u8; OVERHEAD + len];
            frame::encode(&h, &mut f);
            let now = t as u64 * 1000;
            e.handle_frame(&f, now);
            e.write(&rb[..(len * 7) % 3000]);
            let _ = e.read(&mut rb);
            while e.poll_transmit(now, &mut out).is_some() {}
            let _ = e.next_deadline();
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..1600)) {
        let mut e = Endpoint::new(Config::new(9, 8, 7, B, A), 0);
        e.handle_frame(&data, 1);
    }
}
