//! Time-bounded mutational fuzzing of every decoder of network input:
//! frame headers, frame streams, control messages (and the session
//! machines they drive), DATA segment tables, credits, the preamble and
//! sealed (encrypted) blocks and sealed control records. Seeds are valid encodings, mutated by bit
//! flips, byte overwrites, truncation, insertion and splicing; nothing may
//! panic, valid decodes must re-encode to the same message, and a mutated
//! sealed block must never authenticate.
//!
//! `RAMSYS_FUZZ_SECS` (default 3) bounds the run; docs/SECURITY.md
//! records a 10-minute run.

use std::time::{Duration, Instant};

use ramsys_engine::transport::crypto::{control_key, Cipher, RecordSeal, StreamSeal, TAG_LEN};
use ramsys_engine::transport::sealed::{open_records, End};
use ramsys_proto::control::{Complete, Confirm, Entry, EntryKind, Failure, Open, Propose, Role};
use ramsys_proto::data::{
    decode_credit, decode_table, encode_table, hash_block, table_len, Segment,
};
use ramsys_proto::frame::{FrameDecoder, FrameHeader, FrameKind, HEADER_LEN, PLACED_FLAG};
use ramsys_proto::session::{RelayMachine, SinkMachine, SourceMachine};
mod common;
use common::rng::Rng;
use ramsys_proto::{parse_preamble, preamble, Control, PREAMBLE_LEN};

fn seeds() -> Vec<Control> {
    vec![
        Control::Hello {
            user: "u".into(),
            noise: vec![1; 48],
        },
        Control::Challenge { noise: vec![2; 80] },
        Control::SiteHello {
            user: "site".into(),
            addr: "127.0.0.1:7070".into(),
            noise: vec![3; 48],
        },
        Control::Auth { proof: [4; 32] },
        Control::AuthOk { session: 9 },
        Control::Open(Open {
            server_role: Role::Sink,
            paths: vec![b"a/b".to_vec()],
            recursive: true,
            streams: 4,
            block_size: 1 << 20,
            checksum: true,
        }),
        Control::Join {
            session: 9,
            stream: 1,
            nonce: [5; 32],
            mac: [6; 32],
        },
        Control::Propose(Propose {
            roots: 1,
            streams: 4,
            block_size: 1 << 20,
            capacity_mbps: 0,
            checksum: true,
            cipher: 2,
        }),
        Control::Confirm(Confirm {
            streams: 4,
            block_size: 1 << 20,
            credits_per_stream: 8,
            capacity_mbps: 0,
            checksum: true,
            cipher: 2,
        }),
        Control::Entries(vec![
            Entry {
                id: 0,
                path: b"top".to_vec(),
                kind: EntryKind::Dir,
                mode: 0o755,
                mtime_s: 1,
                mtime_ns: 2,
            },
            Entry {
                id: 1,
                path: b"top/f".to_vec(),
                kind: EntryKind::File { size: 10 },
                mode: 0o644,
                mtime_s: 1,
                mtime_ns: 2,
            },
            // A striped big file's piece (issue 19): bytes 80..100.
            Entry {
                id: 2,
                path: b"top/big".to_vec(),
                kind: EntryKind::Piece {
                    size: 100,
                    piece: 40,
                    index: 2,
                },
                mode: 0o644,
                mtime_s: 1,
                mtime_ns: 2,
            },
        ]),
        Control::MetaEnd {
            entries: 3,
            files: 2,
            bytes: 30,
        },
        Control::SyncDone { failures: vec![] },
        // The sink's window for its memory budget (issue 36).
        Control::Window {
            files: 4096,
            bytes: 1 << 20,
        },
        Control::FilesDone(vec![(1, 77)]),
        Control::Resend(vec![(1, 0, 10)]),
        Control::Settled,
        Control::TokenRequest { ttl_s: 60 },
        Control::Token {
            user: "otp-0123456789abcdef0123456789abcdef".into(),
            key: [9; 32],
            expires_s: 60,
        },
        Control::SealControl { cipher: 1 },
        Control::EndOfData {
            files: 1,
            bytes: 10,
        },
        Control::Complete(Complete {
            files: 1,
            bytes: 10,
            failures: vec![Failure {
                path: b"x".to_vec(),
                reason: "r".into(),
            }],
            cpu_s: 0.1,
        }),
        Control::Abort { reason: "x".into() },
        // What a relay's sink placed (issue 36), to the agent's relay machine.
        Control::RelayPlaced(ramsys_proto::control::RelayPlaced {
            cut: vec![b"top/big".to_vec(), b"top/huge".to_vec()],
            placed: Some(vec![b"top/big".to_vec()]),
        }),
    ]
}

fn mutate(rng: &mut Rng, v: &mut Vec<u8>, pool: &[Vec<u8>]) {
    for _ in 0..1 + rng.below(4) {
        match rng.below(6) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = [0, 0xff, 0x7f, 0x80, rng.next() as u8][rng.below(5)];
            }
            2 => v.truncate(rng.below(v.len() + 1)),
            3 => {
                let i = rng.below(v.len() + 1);
                for _ in 0..1 + rng.below(8) {
                    v.insert(i, rng.next() as u8);
                }
            }
            4 => {
                let o = &pool[rng.below(pool.len())];
                let i = rng.below(v.len() + 1);
                let j = rng.below(o.len() + 1);
                v.truncate(i);
                v.extend_from_slice(&o[j..]);
            }
            _ => {
                let i = rng.below(v.len() + 1);
                v.splice(i..i, (rng.next() as u32).to_le_bytes());
            }
        }
    }
}

fn framed(c: &Control) -> Vec<u8> {
    let body = c.encode().unwrap();
    let mut v = FrameHeader::new(FrameKind::Control, 0, body.len() as u32)
        .encode()
        .to_vec();
    v.extend_from_slice(&body);
    v
}

#[test]
fn network_decoders_survive_mutated_input() {
    let secs: u64 = std::env::var("RAMSYS_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let seed = std::env::var("RAMSYS_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("fuzz: seed {seed}, {secs} s (RAMSYS_FUZZ_SEED / RAMSYS_FUZZ_SECS)");
    let mut rng = Rng::new(seed);
    let msgs = seeds();
    let bodies: Vec<Vec<u8>> = msgs.iter().map(|m| m.encode().unwrap()).collect();
    // A valid DATA block (table + payload) and a sealed one.
    let segs = [
        Segment {
            file_id: 1,
            offset: 0,
            len: 6,
        },
        Segment::hole(1, 6, 4096),
    ];
    let payload = b"abcdef".to_vec();
    let mut hashes = [0u64; 2];
    let ck = hash_block(&segs, &payload, &mut hashes);
    let mut table = vec![0u8; table_len(2)];
    encode_table(ck, &segs, &mut table);
    let mut stream: Vec<u8> = bodies
        .iter()
        .zip(&msgs)
        .flat_map(|(_, m)| framed(m))
        .collect();
    let mut dh = FrameHeader::new(FrameKind::Data, 2, (table.len() + payload.len()) as u32)
        .encode()
        .to_vec();
    dh.extend_from_slice(&table);
    dh.extend_from_slice(&payload);
    stream.extend_from_slice(&dh);
    let mut pool = bodies.clone();
    pool.push(table.clone());
    pool.push(stream.clone());
    let key = [9u8; 32];
    let mut sealed = payload.clone();
    let tag = StreamSeal::new(Cipher::ChaCha20Poly1305, &key, 0, 0)
        .unwrap()
        .seal(&dh[..HEADER_LEN + table.len()], &mut sealed);
    let mut sealed_block = dh[..HEADER_LEN + table.len()].to_vec();
    sealed_block.extend_from_slice(&sealed);
    sealed_block.extend_from_slice(&tag);

    // A sealed control stream (client to server) of three records.
    let ctl_plain: Vec<u8> = msgs.iter().take(3).flat_map(framed).collect();
    let mut records = Vec::new();
    let mut tx = RecordSeal::new(
        Cipher::Aes256Gcm,
        &control_key(&key, Cipher::Aes256Gcm, true),
    )
    .unwrap();
    for m in msgs.iter().take(3) {
        let mut body = framed(m);
        let len = (body.len() as u32).to_le_bytes();
        let tag = tx.seal(&len, &mut body);
        records.extend_from_slice(&len);
        records.extend_from_slice(&body);
        records.extend_from_slice(&tag);
    }
    assert_eq!(
        open_records(Cipher::Aes256Gcm, &key, End::Server, &records).unwrap(),
        ctl_plain
    );

    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut n: u64 = 0;
    let mut segs_out: Vec<Segment> = Vec::with_capacity(64);
    while Instant::now() < deadline {
        for _ in 0..256 {
            n += 1;
            // Control bodies, and the machines they drive.
            let mut b = bodies[rng.below(bodies.len())].clone();
            mutate(&mut rng, &mut b, &pool);
            if let Ok(c) = Control::decode(&b) {
                // Compare encodings, not values: a decoded f64 may be NaN.
                let e = c.encode().unwrap();
                let again = Control::decode(&e).unwrap().encode().unwrap();
                assert_eq!(again, e, "re-encoding changed the message");
                let _ = SinkMachine::new().on_recv(&c);
                let _ = SourceMachine::new().on_recv(&c);
                let _ = RelayMachine::new(PLACED_FLAG).on_recv(&c);
            }
            // Frame streams.
            let mut s = stream.clone();
            mutate(&mut rng, &mut s, &pool);
            let mut d = FrameDecoder::new(1 << 16);
            d.feed(&s);
            while let Ok(Some((h, body))) = d.next_frame() {
                assert_eq!(h.len as usize, body.len());
                match h.kind {
                    FrameKind::Control => {
                        let _ = Control::decode(&body);
                    }
                    FrameKind::Data => {
                        let tl = table_len(h.aux as usize);
                        if body.len() >= tl {
                            let _ = decode_table(
                                &body[..tl],
                                h.aux as usize,
                                body.len(),
                                1 << 16,
                                &mut segs_out,
                            );
                        }
                    }
                    FrameKind::Credit => {
                        let _ = decode_credit(&body);
                    }
                    FrameKind::End => {}
                }
            }
            // Headers, tables, credits, preambles straight from the RNG.
            let mut h = [0u8; HEADER_LEN];
            h.copy_from_slice(&rng.next().to_le_bytes());
            if let Ok(fh) = FrameHeader::decode(&h, 1 << 20) {
                assert!(fh.len <= 1 << 20);
            }
            let mut t = table.clone();
            mutate(&mut rng, &mut t, &pool);
            let nseg = rng.below(5);
            let tl = table_len(nseg);
            if t.len() >= tl {
                if let Ok((_, p)) =
                    decode_table(&t[..tl], nseg, tl + rng.below(9000), 8192, &mut segs_out)
                {
                    assert!(p <= 8192);
                }
            }
            let _ = decode_credit(&rng.next().to_le_bytes()[..rng.below(9)]);
            let mut p = preamble(ramsys_proto::VERSION);
            p[rng.below(PREAMBLE_LEN)] ^= 1 << rng.below(8);
            let _ = parse_preamble(&p);
            // Sealed blocks: any change must fail authentication.
            let mut sb = sealed_block.clone();
            let i = rng.below(sb.len());
            sb[i] ^= 1 << rng.below(8);
            let aad_len = HEADER_LEN + table.len();
            let (aad, rest) = sb.split_at_mut(aad_len);
            let (body, tag) = rest.split_at_mut(rest.len() - TAG_LEN);
            let tag: [u8; TAG_LEN] = (&*tag).try_into().unwrap();
            let mut rx = StreamSeal::new(Cipher::ChaCha20Poly1305, &key, 0, 0).unwrap();
            assert!(
                rx.open(aad, body, &tag).is_err(),
                "a modified block authenticated"
            );
            // Sealed control records: a mutated stream yields an error or,
            // cut at a record boundary, a prefix of what was sent; never
            // anything else.
            let mut r = records.clone();
            mutate(&mut rng, &mut r, &pool);
            if let Ok(out) = open_records(Cipher::Aes256Gcm, &key, End::Server, &r) {
                assert!(
                    ctl_plain.starts_with(&out),
                    "a modified record authenticated"
                );
            }
        }
    }
    eprintln!("fuzz: {n} iterations, no failure");
}

/// An in-memory link: reads come from `input`, writes are dropped.
struct MemLink(std::io::Cursor<Vec<u8>>);
impl std::io::Read for MemLink {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(b)
    }
}
impl std::io::Write for MemLink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
impl ramsys_engine::transport::Link for MemLink {
    fn try_clone_link(&self) -> std::io::Result<Box<dyn ramsys_engine::transport::Link>> {
        Err(std::io::ErrorKind::Unsupported.into())
    }
    fn shutdown_both(&self) {}
    fn peer(&self) -> String {
        "mem".into()
    }
    fn local(&self) -> String {
        "mem".into()
    }
    fn set_read_timeout(&self, _: Option<Duration>) -> std::io::Result<()> {
        Ok(())
    }
}

/// Sealed CREDIT frames (docs/PROTOCOL.md "CREDIT and END") go through the
/// source's real credit check (StreamOut::send_block on a sealed link):
/// mutated input either fails, or its first credit frame is byte for byte
/// the one that was sealed; a forged or altered credit never grants.
#[test]
fn mutated_sealed_credits_never_grant() {
    use ramsys_engine::data::sender::StreamOut;
    use ramsys_engine::transport::wire::send_credit_sealed;
    let secs: u64 = std::env::var("RAMSYS_FUZZ_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let key = [9u8; 32];
    let c = Cipher::ChaCha20Poly1305;
    let mut first = Vec::new();
    let mut seal = StreamSeal::credits(c, &key, 1, 2).unwrap();
    send_credit_sealed(&mut first, 3, Some(&mut seal)).unwrap();
    let mut second = first.clone();
    send_credit_sealed(&mut second, 5, Some(&mut seal)).unwrap();
    let frame_len = first.len();
    let pool_src = vec![first.clone(), second.clone()];
    let pool = ramsys_resources::BufferPool::allocate(1, 4096).unwrap();
    let stats = ramsys_engine::types::stats::Stats::default();
    let mut rng = Rng::new(0x5eed_c4ed17 ^ secs);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (mut n, mut accepted) = (0u64, 0u64);
    while Instant::now() < deadline {
        n += 1;
        let mut v = second.clone();
        mutate(&mut rng, &mut v, &pool_src);
        let link = Box::new(MemLink(std::io::Cursor::new(v.clone())));
        let mut out = StreamOut::new(1, 2, link, 8, StreamSeal::new(c, &key, 1, 2))
            .with_credit_seal(StreamSeal::credits(c, &key, 1, 2));
        let mut b = pool.get();
        b.reset();
        let r = out.send_block(&mut b, &stats);
        pool.put(b);
        if r.is_ok() {
            accepted += 1;
            assert!(
                v.len() >= frame_len && v[..frame_len] == first[..],
                "a mutated credit granted: {v:02x?}"
            );
        }
    }
    eprintln!("credit fuzz: {n} iterations, {accepted} accepted unchanged frames");
}

/// The handshake (proto::auth, issue 34) under mutation: a valid Hello,
/// Challenge or Auth with any change (bit flips, truncation, insertion,
/// splicing in another handshake's bytes) never authenticates: the Hello
/// through the daemon's own helper (session::serve_handshake), the
/// Challenge at the client that sent the Hello, the Auth at the server
/// that sent the Challenge (which accepts the unmutated one).
#[test]
fn mutated_handshakes_never_authenticate() {
    use ramsys_engine::session::serve_handshake;
    use ramsys_proto::auth::{Accept, ClientHandshake, ServerHandshake};
    let secs: u64 = std::env::var("RAMSYS_FUZZ_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let key = b"0123456789abcdef0123456789abcdef";
    let accept = Accept {
        session: 5,
        tcp: None,
    };
    let mut rng = Rng::new(0xa11ce ^ secs);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (mut n, mut decoded) = (0u64, 0u64);
    let mut pool: Vec<Vec<u8>> = Vec::new();
    while Instant::now() < deadline {
        n += 1;
        let mut c = ClientHandshake::new(key, "u");
        let hello = c.hello().unwrap();
        let mut s = ServerHandshake::accept(key, &hello).unwrap();
        let ch = s.challenge(accept).unwrap();
        // The client keeps its state for a mutated Challenge.
        let which = rng.below(3);
        let auth = match which {
            1 => Control::Auth { proof: [0; 32] },
            _ => c.on_challenge(&ch).unwrap(),
        };
        let honest = [hello, ch, auth];
        pool.extend(honest.iter().map(|m| m.encode().unwrap()));
        pool.drain(..pool.len().saturating_sub(30));
        let original = honest[which].encode().unwrap();
        let mut v = original.clone();
        mutate(&mut rng, &mut v, &pool);
        let Ok(m) = Control::decode(&v) else {
            continue;
        };
        if m.encode().unwrap() == original {
            continue; // the mutation undid itself
        }
        decoded += 1;
        let ok = match which {
            0 => {
                let input = framed(&honest[2]);
                let mut link = MemLink(std::io::Cursor::new(input));
                matches!(serve_handshake(&mut link, &m, key, accept), Ok(Some(_)))
            }
            1 => c.on_challenge(&m).is_ok(),
            _ => {
                assert!(s.on_auth(&honest[2]).is_ok());
                s.on_auth(&m).is_ok()
            }
        };
        assert!(!ok, "a mutated {} authenticated", honest[which].name());
    }
    eprintln!("handshake fuzz: {n} iterations, {decoded} decoded, none authenticated");
}
