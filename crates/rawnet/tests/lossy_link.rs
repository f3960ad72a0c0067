//! Two endpoints joined by an in-memory link with a fault hook (loss,
//! duplication, reordering, corruption at 1 % and 5 %) and a virtual
//! clock: the byte streams arrive identical in both directions, end of
//! stream included; forged frames are dropped and counted; no sockets.

mod common;

use std::collections::VecDeque;

use common::stream;

use ramsys_rawnet::frame::{self, Header, Kind};
use ramsys_rawnet::{Config, Endpoint, FaultRates, Faults, ReadOutcome};

const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
const B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];
const LATENCY: u64 = 30;

struct Wire {
    q: VecDeque<(u64, Vec<u8>)>,
    faults: Faults,
}

impl Wire {
    fn new(rates: FaultRates, seed: u64) -> Wire {
        Wire {
            q: VecDeque::new(),
            faults: Faults::new(rates, seed, 9014),
        }
    }
    fn send(&mut self, now: u64, f: &mut [u8]) {
        let q = &mut self.q;
        self.faults
            .apply(f, |g| q.push_back((now + LATENCY, g.to_vec())));
    }
}

struct Side {
    ep: Endpoint,
    out: Vec<u8>,
    sent: usize,
    got: Vec<u8>,
    eof: bool,
}

/// Runs both directions to completion; returns the endpoints.
fn run(
    mtu: usize,
    rates: FaultRates,
    seed: u64,
    a_len: usize,
    b_len: usize,
) -> (Endpoint, Endpoint) {
    let mk = |local, peer| {
        let mut c = Config::new(0x5e55, 0x7070_7070, 1, local, peer);
        c.mtu = mtu;
        // Near the wrap, so sequence arithmetic is exercised.
        c.initial_seq = u32::MAX - 1000;
        c
    };
    let mut sides = [
        Side {
            ep: Endpoint::new(mk(A, B), 0),
            out: stream(a_len, seed),
            sent: 0,
            got: vec![],
            eof: false,
        },
        Side {
            ep: Endpoint::new(mk(B, A), 0),
            out: stream(b_len, seed + 1),
            sent: 0,
            got: vec![],
            eof: false,
        },
    ];
    let mut wires = [Wire::new(rates, seed), Wire::new(rates, seed ^ 0xff)];
    let mut buf = vec![0u8; 9014];
    let mut rbuf = vec![0u8; 20_000];
    let mut now = 0u64;
    for _round in 0..5_000_000 {
        for (k, s) in sides.iter_mut().enumerate() {
            if s.sent < s.out.len() {
                // Uneven write sizes, as the engine's messages are.
                let end = (s.sent + 3000 + (now as usize % 50_000)).min(s.out.len());
                s.sent += s.ep.write(&s.out[s.sent..end]);
                if s.sent == s.out.len() {
                    s.ep.close_write();
                }
            }
            loop {
                match s.ep.read(&mut rbuf) {
                    ReadOutcome::Data(n) => s.got.extend_from_slice(&rbuf[..n]),
                    ReadOutcome::Eof => {
                        s.eof = true;
                        break;
                    }
                    ReadOutcome::WouldBlock => break,
                    ReadOutcome::Failed(f) => panic!("side {k} failed: {f}"),
                }
            }
            while let Some(n) = s.ep.poll_transmit(now, &mut buf) {
                wires[k].send(now, &mut buf[..n]);
            }
        }
        if sides.iter().all(|s| s.eof && s.ep.all_acked()) {
            break;
        }
        // Deliver what is due, then jump to the next event.
        let mut next = u64::MAX;
        for (k, w) in wires.iter_mut().enumerate() {
            if w.q.is_empty() {
                let q = &mut w.q;
                w.faults.flush(|g| q.push_back((now + LATENCY, g.to_vec())));
            }
            while let Some((t, _)) = w.q.front() {
                if *t > now {
                    next = next.min(*t);
                    break;
                }
                let (_, f) = w.q.pop_front().unwrap();
                sides[1 - k].ep.handle_frame(&f, now);
            }
        }
        for s in &sides {
            if s.ep.transmit_due(now) || (s.sent < s.out.len() && s.ep.writable()) {
                next = now;
            }
            if let Some(d) = s.ep.next_deadline() {
                next = next.min(d.max(now));
            }
        }
        now = if next == now {
            now + 1
        } else {
            next.min(now + 1_000_000)
        };
    }
    eprintln!(
        "virtual time {:.3} s, rto {} us srtt {:?}",
        now as f64 / 1e6,
        sides[0].ep.rto_us(),
        sides[0].ep.srtt_us()
    );
    let [a, b] = sides;
    assert!(a.eof && b.eof, "streams did not finish");
    assert!(a.ep.peer_finished() && b.ep.peer_finished());
    assert!(a.got == stream(b_len, seed + 1), "B->A stream differs");
    assert!(b.got == stream(a_len, seed), "A->B stream differs");
    (a.ep, b.ep)
}

#[test]
fn clean_link_jumbo_and_standard() {
    for mtu in [9000, 1500] {
        let (a, b) = run(mtu, FaultRates::default(), 1, 3 << 20, 100_000);
        assert_eq!(a.stats().retransmitted + b.stats().retransmitted, 0);
    }
}

#[test]
fn one_percent_faults_both_mtus() {
    for (mtu, seed) in [(9000, 11), (1500, 12)] {
        let (a, b) = run(mtu, FaultRates::all(0.01), seed, 4 << 20, 1 << 20);
        let s = a.stats();
        assert!(
            s.retransmitted > 0 && b.stats().corrupt > 0,
            "{s:?} {:?}",
            b.stats()
        );
    }
}

#[test]
fn five_percent_faults_both_mtus() {
    for (mtu, seed) in [(9000, 21), (1500, 22)] {
        let (a, b) = run(mtu, FaultRates::all(0.05), seed, 4 << 20, 512 << 10);
        let (sa, sb) = (a.stats(), b.stats());
        assert!(
            sa.retransmitted > 0 && sb.duplicates > 0 && sb.corrupt > 0 && sa.nacks_received > 0,
            "{sa:?} {sb:?}"
        );
    }
}

#[test]
fn heavy_loss_only() {
    let rates = FaultRates {
        loss: 0.2,
        ..Default::default()
    };
    run(1500, rates, 31, 1 << 20, 1 << 20);
}

fn forged(dst: [u8; 6], src: [u8; 6], session: u64, token: u64, channel: u16, seq: u32) -> Vec<u8> {
    let h = Header {
        dst,
        src,
        kind: Kind::Data,
        flags: 0,
        session,
        token,
        channel,
        slot: (seq % 64) as u16,
        seq,
        ack: 0,
        credits: 64,
        len: 4,
        sack: 0,
    };
    let mut f = vec![0u8; frame::OVERHEAD + 4];
    f[frame::OVERHEAD..].copy_from_slice(b"EVIL");
    frame::encode(&h, &mut f);
    f
}

#[test]
fn forged_frames_are_dropped_and_counted() {
    let cfg = Config::new(0x5e55, 0x7070, 1, B, A);
    let mut b = Endpoint::new(cfg, 0);
    let x = [2, 0, 0, 0, 0, 0xe];
    b.handle_frame(&forged(B, x, 0x5e55, 0x7070, 1, 0), 1); // third host's MAC
    b.handle_frame(&forged(B, A, 0x5e56, 0x7070, 1, 0), 1); // other session
    b.handle_frame(&forged(B, A, 0x5e55, 0x7071, 1, 0), 1); // guessed token
    b.handle_frame(&forged(B, A, 0x5e55, 0x7070, 2, 0), 1); // other channel
    b.handle_frame(&forged(x, A, 0x5e55, 0x7070, 1, 0), 1); // not for us
    let mut bad = forged(B, A, 0x5e55, 0x7070, 1, 0);
    bad[frame::OVERHEAD] ^= 1; // corrupted
    b.handle_frame(&bad, 1);
    let s = b.stats();
    assert_eq!(
        (
            s.forged_mac,
            s.forged_session,
            s.forged_token,
            s.misdirected,
            s.corrupt
        ),
        (1, 1, 2, 1, 1)
    );
    assert_eq!(s.forged(), 5);
    assert_eq!(s.accepted, 0);
    let mut buf = [0u8; 16];
    assert_eq!(b.read(&mut buf), ReadOutcome::WouldBlock);
    // The genuine frame is still accepted.
    b.handle_frame(&forged(B, A, 0x5e55, 0x7070, 1, 0), 2);
    assert_eq!(b.read(&mut buf), ReadOutcome::Data(4));
    // Its replay is a duplicate, and a frame far past the credits is refused.
    b.handle_frame(&forged(B, A, 0x5e55, 0x7070, 1, 0), 3);
    b.handle_frame(&forged(B, A, 0x5e55, 0x7070, 1, 1000), 3);
    let s = b.stats();
    assert_eq!((s.duplicates, s.no_credit), (1, 1));
}

#[test]
fn silent_peer_times_out_and_reset_propagates() {
    let mut c = Config::new(1, 2, 0, A, B);
    c.give_up_us = 1_000_000;
    let mut a = Endpoint::new(c.clone(), 0);
    let mut buf = vec![0u8; 9014];
    assert_eq!(a.write(b"hello"), 5);
    let mut now = 0;
    while a.failure().is_none() {
        while a.poll_transmit(now, &mut buf).is_some() {}
        if a.failure().is_some() {
            break;
        }
        now = a
            .next_deadline()
            .expect("a deadline while data is unacked")
            .max(now + 1);
        assert!(now < 10_000_000, "never gave up");
    }
    assert_eq!(a.failure(), Some(ramsys_rawnet::Failure::TimedOut));
    assert!(a.stats().timeouts >= 3, "{:?}", a.stats());

    let mut x = Endpoint::new(c, 0);
    let mut y = Endpoint::new(Config::new(1, 2, 0, B, A), 0);
    x.abort();
    let n = x.poll_transmit(0, &mut buf).unwrap();
    y.handle_frame(&buf[..n], 0);
    assert_eq!(
        y.read(&mut [0u8; 4]),
        ReadOutcome::Failed(ramsys_rawnet::Failure::Reset)
    );
    assert_eq!(y.write(b"x"), 0);
}

/// A slow reader: the sender runs out of credits, gets NO_CREDIT NACKs for
/// its probes, and resumes once the reader frees slots.
#[test]
fn credits_stall_and_resume() {
    let mut a = Endpoint::new(Config::new(1, 2, 0, A, B), 0);
    let mut b = Endpoint::new(Config::new(1, 2, 0, B, A), 0);
    let data = stream(2 << 20, 5);
    let mut sent = 0;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 9014];
    let mut rbuf = vec![0u8; 4096];
    let mut now = 0u64;
    let mut stalled_rounds = 0;
    while got.len() < data.len() {
        sent += a.write(&data[sent..]);
        while let Some(n) = a.poll_transmit(now, &mut buf) {
            b.handle_frame(&buf[..n], now + 10);
        }
        // The reader only reads every 50 ms.
        if now % 50_000 < 1000 {
            while let ReadOutcome::Data(n) = b.read(&mut rbuf) {
                got.extend_from_slice(&rbuf[..n]);
            }
        } else {
            stalled_rounds += 1;
        }
        while let Some(n) = b.poll_transmit(now, &mut buf) {
            a.handle_frame(&buf[..n], now + 10);
        }
        now += 500;
        assert!(now < 100_000_000);
    }
    assert_eq!(got, data);
    assert!(stalled_rounds > 0);
    assert!(b.stats().no_credit > 0, "{:?}", b.stats());
    assert!(a.stats().nacks_received > 0);
}

/// One frame lost in the middle of a burst: the receiver's NACK comes
/// back before the RTT guard, the hole is remembered and resent at the
/// guard, long before the RTO; no timeout, one resend.
#[test]
fn early_nack_resends_at_the_guard_not_the_rto() {
    let mut a = Endpoint::new(Config::new(1, 2, 0, A, B), 0);
    let mut b = Endpoint::new(Config::new(1, 2, 0, B, A), 0);
    let data = stream(20 * 8952, 3);
    assert_eq!(a.write(&data), data.len());
    let mut buf = vec![0u8; 9014];
    let mut n = 0;
    while let Some(len) = a.poll_transmit(0, &mut buf) {
        if n != 5 {
            b.handle_frame(&buf[..len], LATENCY);
        }
        n += 1;
    }
    let mut now = LATENCY;
    let mut got = Vec::new();
    let mut rbuf = vec![0u8; 1 << 20];
    while got.len() < data.len() {
        while let Some(len) = b.poll_transmit(now, &mut buf) {
            a.handle_frame(&buf[..len], now + LATENCY);
        }
        now += LATENCY;
        while let Some(len) = a.poll_transmit(now, &mut buf) {
            b.handle_frame(&buf[..len], now + LATENCY);
        }
        if let ReadOutcome::Data(k) = b.read(&mut rbuf) {
            got.extend_from_slice(&rbuf[..k]);
        }
        now = a.next_deadline().unwrap_or(now + LATENCY).max(now + 1);
        assert!(now < 50_000, "not recovered before the RTO");
    }
    assert_eq!(got, data);
    let s = a.stats();
    assert_eq!((s.timeouts, s.retransmitted), (0, 1), "{s:?}");
    assert!(s.nacks_received >= 1);
}
