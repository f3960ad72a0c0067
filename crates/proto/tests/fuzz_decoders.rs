//! Property tests: every decoder of network input, fed arbitrary bytes,
//! returns an error or a value; it never panics and never allocates more
//! than the frame limits allow (postcard pre-allocates cautiously and the
//! body itself is bounded before decoding).

use proptest::prelude::*;
use ramsys_proto::control::GrowStage;
use ramsys_proto::data::{decode_credit, decode_table, table_len, Segment};
use ramsys_proto::frame::{FrameDecoder, FrameHeader, HEADER_LEN};
use ramsys_proto::session::SinkMachine;
use ramsys_proto::{parse_preamble, path, Control};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn control_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = Control::decode(&bytes);
    }

    /// RawOffer (the daemon's raw interfaces) behind its own variant
    /// index, so the fuzzer reaches its fields; and any offer round-trips.
    #[test]
    fn raw_offer_decode(
        tail in proptest::collection::vec(any::<u8>(), 0..512),
        name in ".{0,16}",
        ifindex in any::<u32>(),
        mac in any::<[u8; 6]>(),
        mtu in any::<u32>(),
        node in proptest::option::of(any::<u32>()),
        addrs in proptest::collection::vec(".{0,40}", 0..4),
    ) {
        let idx = Control::RawOffer { ifaces: vec![] }.encode().unwrap()[0];
        let mut b = vec![idx];
        b.extend(tail);
        let _ = Control::decode(&b);
        let m = Control::RawOffer {
            ifaces: vec![ramsys_proto::control::RawIface { name, ifindex, mac, mtu, node, addrs }],
        };
        prop_assert_eq!(Control::decode(&m.encode().unwrap()).unwrap(), m);
    }

    /// Placed (issue 36) behind its own variant index, so the fuzzer
    /// reaches its list; any decoded one passes the machines' check or is
    /// refused, never panics; a valid one round-trips.
    #[test]
    fn placed_decode(
        tail in proptest::collection::vec(any::<u8>(), 0..512),
        files in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..80),
    ) {
        let idx = Control::Placed { files: vec![] }.encode().unwrap()[0];
        let mut b = vec![idx];
        b.extend(tail);
        if let Ok(m) = Control::decode(&b) {
            let mut snk = SinkMachine::new();
            let _ = snk.on_send(&m);
        }
        let m = Control::Placed { files };
        prop_assert_eq!(Control::decode(&m.encode().unwrap()).unwrap(), m);
    }

    /// RelayPlaced (issue 36) with lists up to past their bound: what the
    /// agent's relay machine takes names at most MAX_PLACED valid paths in
    /// each list and places only cut files; any decoded one is taken or
    /// refused, never panics; any one round-trips.
    #[test]
    fn relay_placed_decode(
        tail in proptest::collection::vec(any::<u8>(), 0..512),
        cut in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..12), 0..80),
        placed in proptest::option::of(proptest::collection::vec(
            proptest::collection::vec(any::<u8>(), 0..12), 0..80)),
    ) {
        use ramsys_proto::control::{RelayPlaced, MAX_PLACED};
        use ramsys_proto::frame::PLACED_FLAG;
        use ramsys_proto::session::RelayMachine;
        let empty = RelayPlaced { cut: vec![], placed: None };
        let mut b = vec![Control::RelayPlaced(empty).encode().unwrap()[0]];
        b.extend(tail);
        if let Ok(m) = Control::decode(&b) {
            let _ = RelayMachine::new(PLACED_FLAG).on_recv(&m);
        }
        let rp = RelayPlaced { cut, placed };
        let m = Control::RelayPlaced(rp.clone());
        prop_assert_eq!(Control::decode(&m.encode().unwrap()).unwrap(), m.clone());
        if RelayMachine::new(PLACED_FLAG).on_recv(&m).is_ok() {
            let p = rp.placed.unwrap_or_default();
            prop_assert!(rp.cut.len() <= MAX_PLACED && p.len() <= MAX_PLACED);
            prop_assert!(p.iter().all(|f| rp.cut.contains(f)));
            for f in rp.cut.iter() {
                prop_assert!(path::validate_relative(f).is_ok());
            }
        }
        prop_assert!(RelayMachine::new(0).on_recv(&m).is_err());
    }

    /// DirsDone (issue 36) behind its own variant index, so the fuzzer
    /// reaches its ids; a decoded one, fed to a windowed `--delete` sink
    /// that took DIRS_DONE_FLAG after `dirs` Dir records, is taken exactly
    /// when every id is a directory sent and none repeats, never panics;
    /// any round-trips.
    #[test]
    fn dirs_done_decode(
        tail in proptest::collection::vec(any::<u8>(), 0..256),
        ids in proptest::collection::vec(0u64..40, 0..12),
        dirs in 0u64..24,
    ) {
        use ramsys_proto::control::{Confirm, Entry, EntryKind, Propose};
        use ramsys_proto::frame::{DIRS_DONE_FLAG, WIDE_WINDOWS_FLAG, WINDOWS_FLAG};
        let idx = Control::DirsDone { ids: vec![] }.encode().unwrap()[0];
        let mut b = vec![idx];
        b.extend(tail);
        let sink = || {
            let mut m = SinkMachine::new();
            let p = Control::Propose(Propose {
                roots: 1, streams: 1, block_size: 4096, capacity_mbps: 0, checksum: true, cipher: 0,
            });
            m.on_recv_flags(&p, WIDE_WINDOWS_FLAG | DIRS_DONE_FLAG).unwrap();
            let mode = ramsys_proto::control::sync::SYNC | ramsys_proto::control::sync::DELETE;
            m.on_recv(&Control::SyncMode { flags: mode }).unwrap();
            let c = Control::Confirm(Confirm {
                streams: 1, block_size: 4096, credits_per_stream: 2, capacity_mbps: 0, checksum: true, cipher: 0,
            });
            m.on_send_flags(&c, WINDOWS_FLAG | DIRS_DONE_FLAG).unwrap();
            m.on_send(&Control::SyncDone { failures: vec![] }).unwrap();
            let es = (0..dirs).map(|i| Entry {
                id: i, path: format!("d{i}").into_bytes(), kind: EntryKind::Dir,
                mode: 0o755, mtime_s: 0, mtime_ns: 0,
            }).collect();
            m.on_recv(&Control::Entries(es)).unwrap();
            m
        };
        if let Ok(m) = Control::decode(&b) {
            let _ = sink().on_recv(&m);
        }
        let mut seen = std::collections::HashSet::new();
        let valid = ids.iter().all(|&i| i < dirs && seen.insert(i));
        let m = Control::DirsDone { ids };
        prop_assert_eq!(Control::decode(&m.encode().unwrap()).unwrap(), m.clone());
        prop_assert_eq!(sink().on_recv(&m).is_ok(), valid);
    }

    #[test]
    fn header_decode_never_panics(b in any::<[u8; HEADER_LEN]>(), max in any::<u32>()) {
        if let Ok(h) = FrameHeader::decode(&b, max) {
            prop_assert!(h.len <= max.max(1 << 20));
        }
    }

    #[test]
    fn preamble_never_panics(b in any::<[u8; 8]>()) {
        let _ = parse_preamble(&b);
    }

    #[test]
    fn table_decode_never_panics(
        bytes in proptest::collection::vec(any::<u8>(), 0..512),
        nseg in 0usize..40,
        extra in 0usize..100000,
    ) {
        let mut segs: Vec<Segment> = Vec::with_capacity(64);
        let tl = table_len(nseg);
        if bytes.len() >= tl {
            let r = decode_table(&bytes[..tl], nseg, tl + extra, 1 << 16, &mut segs);
            if let Ok((_, payload)) = r {
                prop_assert_eq!(payload, extra);
                prop_assert!(payload <= 1 << 16);
            }
        }
    }

    #[test]
    fn credit_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..8)) {
        let _ = decode_credit(&bytes);
    }

    #[test]
    fn frame_stream_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let mut d = FrameDecoder::new(1 << 16);
        d.feed(&bytes);
        for _ in 0..64 {
            match d.next_frame() {
                Ok(Some((h, body))) => {
                    prop_assert_eq!(h.len as usize, body.len());
                    if h.kind == ramsys_proto::FrameKind::Control {
                        let _ = Control::decode(&body);
                    }
                }
                _ => break,
            }
        }
    }

    #[test]
    fn path_validation_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        if path::validate_relative(&bytes).is_ok() {
            prop_assert!(!bytes.contains(&0));
            prop_assert!(bytes[0] != b'/');
            prop_assert!(!bytes.split(|&b| b == b'/').any(|c| c == b".." || c.is_empty()));
        }
    }

    /// Arbitrary decoded control messages fed to a sink machine never panic.
    #[test]
    fn sink_machine_never_panics(msgs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..128), 0..16)) {
        let mut m = SinkMachine::new();
        for b in msgs {
            if let Ok(c) = Control::decode(&b) {
                let _ = m.on_recv(&c);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// The one-time credential messages (tags 27, 28) followed by arbitrary
    /// bytes decode or fail, never panic; valid ones round-trip.
    #[test]
    fn token_messages_decode_or_fail(
        tag in 27u8..=28,
        rest in proptest::collection::vec(any::<u8>(), 0..300),
        user in ".{0,80}",
        key in any::<[u8; 32]>(),
        ttl in any::<u32>(),
    ) {
        let mut b = vec![tag];
        b.extend_from_slice(&rest);
        if let Ok(m) = Control::decode(&b) {
            let ok = matches!(m, Control::Token { .. } | Control::TokenRequest { .. });
            prop_assert!(ok, "tag {} decoded as {}", tag, m.name());
            prop_assert_eq!(Control::decode(&m.encode().unwrap()).unwrap(), m);
        }
        for m in [
            Control::TokenRequest { ttl_s: ttl },
            Control::Token { user: user.clone(), key, expires_s: ttl },
        ] {
            prop_assert_eq!(Control::decode(&m.encode().unwrap()).unwrap(), m);
        }
    }

    /// The redirect messages (issue 19) behind their own tags (taken from
    /// an encoding, so a renumbering at merge does not break the test)
    /// followed by arbitrary bytes decode or fail, never panic; valid ones
    /// round-trip.
    #[test]
    fn redirect_messages_decode_or_fail(
        which in 0usize..2,
        rest in proptest::collection::vec(any::<u8>(), 0..300),
        addr in ".{0,80}",
        reason in ".{0,200}",
    ) {
        let msgs = [
            Control::Redirect { addr: addr.clone(), reason, mac: [9; 32] },
            Control::Redirected { from: addr },
        ];
        let tag = msgs[which].encode().unwrap()[0];
        let mut b = vec![tag];
        b.extend_from_slice(&rest);
        if let Ok(m) = Control::decode(&b) {
            prop_assert_eq!(m.name(), msgs[which].name());
            prop_assert_eq!(Control::decode(&m.encode().unwrap()).unwrap(), m);
        }
        for m in msgs {
            prop_assert_eq!(Control::decode(&m.encode().unwrap()).unwrap(), m);
        }
    }

    /// The third-party messages (issue 19: RelayOpen, OnBehalf,
    /// RelayProgress, RelayDone; RelayPlaced, issue 36) behind their own
    /// tags (taken from an encoding) followed by arbitrary bytes decode or
    /// fail, never panic, and the agent's relay machine takes or refuses
    /// any decoded one without panicking; any valid one round-trips.
    #[test]
    fn relay_messages_decode_or_fail(
        which in 0usize..5,
        rest in proptest::collection::vec(any::<u8>(), 0..400),
        sink in ".{0,40}",
        paths in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..4),
        nums in any::<(u64, u64, u32, u16)>(),
        share in proptest::option::of((any::<u16>(), proptest::collection::vec(any::<u32>(), 0..6))),
        reason in ".{0,60}",
    ) {
        use ramsys_proto::control::{Failure, Relay, RelayPlaced, RelayReport, Share};
        let (a, b, c, d) = nums;
        let msgs = [
            Control::RelayOpen(Relay {
                sink: sink.clone(),
                paths: paths.clone(),
                dest: paths.first().cloned().unwrap_or_default(),
                recursive: a & 1 == 1,
                streams: d,
                block_size: c,
                checksum: b & 1 == 1,
                flags: c,
                select: Default::default(),
                preserve: c,
                bwlimit: b,
                cipher: d as u8,
                share: share.map(|(index, weights)| Share { index, weights, pieces: c }),
            }),
            Control::OnBehalf { user: sink.clone() },
            Control::RelayProgress { files: a, bytes: b, total_files: a, total_bytes: b },
            Control::RelayDone(RelayReport {
                files: a,
                bytes: b,
                unchanged: a,
                streams: d,
                block_size: c,
                failures: paths.iter().map(|p| Failure { path: p.clone(), reason: reason.clone() }).collect(),
                sink_cpu_s: c as f64 / 8.0,
                share_files: a,
                share_bytes: b,
                listing: b,
                error: reason.clone(),
            }),
            Control::RelayPlaced(RelayPlaced {
                cut: paths.clone(),
                placed: (a & 1 == 1).then(|| paths.iter().skip(1).cloned().collect()),
            }),
        ];
        let tag = msgs[which].encode().unwrap()[0];
        let mut bytes = vec![tag];
        bytes.extend_from_slice(&rest);
        if let Ok(m) = Control::decode(&bytes) {
            prop_assert_eq!(m.name(), msgs[which].name());
            let flags = if a & 2 == 2 { ramsys_proto::frame::PLACED_FLAG } else { 0 };
            let _ = ramsys_proto::session::RelayMachine::new(flags).on_recv(&m);
            let again = Control::decode(&m.encode().unwrap()).unwrap();
            // f64 fields: compare encodings (a NaN is not equal to itself).
            prop_assert_eq!(again.encode().unwrap(), m.encode().unwrap());
        }
        for m in msgs {
            prop_assert_eq!(Control::decode(&m.encode().unwrap()).unwrap(), m);
        }
    }

    /// The stream-growth and path messages (issue 21) behind their own
    /// tags, followed by arbitrary bytes, decode or fail, never panic;
    /// valid ones round-trip.
    #[test]
    fn growth_messages_decode_or_fail(
        which in 0usize..6,
        rest in proptest::collection::vec(any::<u8>(), 0..300),
        stream in any::<u16>(),
        credits in any::<u32>(),
        stages in proptest::collection::vec(
            (any::<u32>(), any::<u16>(), any::<u64>(),
             proptest::collection::vec(any::<u64>(), 0..4), ".{0,40}"),
            0..8,
        ),
        stopped in ".{0,80}",
        links in proptest::collection::vec(
            (proptest::option::of(any::<u16>()), proptest::option::of(any::<u32>())),
            0..8,
        ),
    ) {
        use ramsys_proto::control::StageLinks;
        let links: Vec<StageLinks> = links
            .into_iter()
            .map(|(busy_pm, rtt_x100)| StageLinks { busy_pm, rtt_x100 })
            .collect();
        let stages: Vec<GrowStage> = stages
            .into_iter()
            .map(|(at_ms, streams, kb_s, link_kb_s, then)| GrowStage {
                at_ms,
                streams,
                kb_s,
                link_kb_s,
                then,
            })
            .collect();
        let msgs = [
            Control::AddStream { stream },
            Control::StreamAdded { stream, credits },
            Control::GrowStreams,
            Control::Grown { stages: stages.clone(), stopped: stopped.clone() },
            Control::RetiredChallengeTcp,
            Control::GrownLinks { stages, links, stopped },
        ];
        let tag = msgs[which].encode().unwrap()[0];
        let mut b = vec![tag];
        b.extend_from_slice(&rest);
        if let Ok(m) = Control::decode(&b) {
            prop_assert_eq!(m.name(), msgs[which].name());
            prop_assert_eq!(Control::decode(&m.encode().unwrap()).unwrap(), m);
        }
        for m in msgs {
            prop_assert_eq!(Control::decode(&m.encode().unwrap()).unwrap(), m);
        }
    }

    /// The handshake messages (issue 34) behind their own tags, followed
    /// by arbitrary bytes: decode or fail, never panic; valid ones
    /// round-trip.
    #[test]
    fn handshake_messages_decode_or_fail(
        which in 0usize..4,
        rest in proptest::collection::vec(any::<u8>(), 0..300),
        user in ".{0,40}",
        noise in proptest::collection::vec(any::<u8>(), 0..128),
        proof in any::<[u8; 32]>(),
    ) {
        let msgs = [
            Control::Hello { user: user.clone(), noise: noise.clone() },
            Control::Challenge { noise: noise.clone() },
            Control::Auth { proof },
            Control::SiteHello { user, addr: "127.0.0.1:1".into(), noise },
        ];
        let tag = msgs[which].encode().unwrap()[0];
        let mut b = vec![tag];
        b.extend_from_slice(&rest);
        if let Ok(m) = Control::decode(&b) {
            prop_assert_eq!(m.name(), msgs[which].name());
            prop_assert_eq!(Control::decode(&m.encode().unwrap()).unwrap(), m);
        }
        for m in msgs {
            prop_assert_eq!(Control::decode(&m.encode().unwrap()).unwrap(), m);
        }
    }

    /// Arbitrary Noise bytes in a Hello or a Challenge are refused as a
    /// failed authentication (or a malformed message), never accepted,
    /// never a panic; any Auth proof but the one is refused.
    #[test]
    fn arbitrary_handshake_bytes_never_authenticate(
        noise in proptest::collection::vec(any::<u8>(), 0..200),
        user in ".{0,300}",
        proof in any::<[u8; 32]>(),
    ) {
        use ramsys_proto::auth::{Accept, ClientHandshake, ServerHandshake};
        use ramsys_proto::ProtoError;
        let hello = Control::Hello { user: user.clone(), noise: noise.clone() };
        prop_assert!(ServerHandshake::accept(b"k", &hello).is_err());
        let mut c = ClientHandshake::new(b"k", "u");
        let honest = c.hello().unwrap();
        let r = c.on_challenge(&Control::Challenge { noise });
        prop_assert_eq!(r, Err(ProtoError::AuthFailed));
        prop_assert!(c.session().is_none());
        let mut s = ServerHandshake::accept(b"k", &honest).unwrap();
        s.challenge(Accept { session: 1, tcp: None }).unwrap();
        prop_assert_eq!(s.on_auth(&Control::Auth { proof }), Err(ProtoError::AuthFailed));
    }

    /// One changed bit anywhere in a valid Hello, Challenge or Auth fails
    /// the handshake.
    #[test]
    fn a_flipped_bit_fails_the_handshake(which in 0usize..3, at in any::<usize>(), bit in 0u8..8) {
        use ramsys_proto::auth::{Accept, ClientHandshake, ServerHandshake};
        let flip = |v: &mut [u8]| {
            let i = at % v.len();
            v[i] ^= 1 << bit;
        };
        let mut c = ClientHandshake::new(b"k", "u");
        let mut hello = c.hello().unwrap();
        if which == 0 {
            if let Control::Hello { noise, .. } = &mut hello {
                flip(noise);
            }
            prop_assert!(ServerHandshake::accept(b"k", &hello).is_err());
            return Ok(());
        }
        let mut s = ServerHandshake::accept(b"k", &hello).unwrap();
        let mut ch = s.challenge(Accept { session: 3, tcp: None }).unwrap();
        if which == 1 {
            if let Control::Challenge { noise } = &mut ch {
                flip(noise);
            }
            prop_assert!(c.on_challenge(&ch).is_err());
            return Ok(());
        }
        let mut auth = c.on_challenge(&ch).unwrap();
        if let Control::Auth { proof } = &mut auth {
            flip(proof);
        }
        prop_assert!(s.on_auth(&auth).is_err());
    }

    /// Sealing a credential key is its own inverse for any session key and
    /// name, and a different session key never unseals it.
    #[test]
    fn token_seal_inverts(sk in any::<[u8; 32]>(), other in any::<[u8; 32]>(), user in ".{0,64}", key in any::<[u8; 32]>()) {
        use ramsys_proto::auth::seal_token_key;
        let s = seal_token_key(&sk, &user, &key);
        prop_assert_eq!(seal_token_key(&sk, &user, &s), key);
        if other != sk {
            prop_assert_ne!(seal_token_key(&other, &user, &s), key);
        }
    }
}

fn principal() -> impl Strategy<Value = ramsys_proto::attrs::Principal> {
    (any::<u32>(), proptest::collection::vec(any::<u8>(), 0..12))
        .prop_map(|(id, name)| ramsys_proto::attrs::Principal { id, name })
}

fn acl() -> impl Strategy<Value = Vec<ramsys_proto::attrs::AclEntry>> {
    proptest::collection::vec(
        (any::<u16>(), any::<u16>(), principal())
            .prop_map(|(tag, perm, who)| ramsys_proto::attrs::AclEntry { tag, perm, who }),
        0..4,
    )
}

fn attrs() -> impl Strategy<Value = ramsys_proto::attrs::Attrs> {
    use ramsys_proto::attrs::Attrs;
    (
        any::<u64>(),
        proptest::option::of(principal()),
        proptest::option::of(principal()),
        proptest::collection::vec(
            (
                proptest::collection::vec(any::<u8>(), 0..10),
                proptest::collection::vec(any::<u8>(), 0..20),
            ),
            0..3,
        ),
        acl(),
        acl(),
        proptest::option::of((any::<i64>(), any::<u32>())),
    )
        .prop_map(
            |(id, owner, group, xattrs, acl, default_acl, atime)| Attrs {
                id,
                owner,
                group,
                xattrs,
                acl,
                default_acl,
                atime,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// The archive messages (tags 35..=37: ArchiveOpen, Preserve, Attrs)
    /// followed by arbitrary bytes decode or fail, never panic, and a
    /// decoded one re-encodes to itself.
    #[test]
    fn archive_messages_decode_or_fail(
        tag in 35u8..=37,
        rest in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        let mut b = vec![tag];
        b.extend_from_slice(&rest);
        if let Ok(m) = Control::decode(&b) {
            let ok = matches!(
                m,
                Control::ArchiveOpen { .. } | Control::Preserve { .. } | Control::Attrs(_)
            );
            prop_assert!(ok, "tag {} decoded as {}", tag, m.name());
            prop_assert_eq!(Control::decode(&m.encode().unwrap()).unwrap(), m);
        }
    }

    /// Arbitrary Attrs and Special records round-trip, and a sink machine
    /// that got Preserve takes or refuses them without panicking; what it
    /// takes names only announced ids and well-formed ACL entries.
    #[test]
    fn attrs_roundtrip_and_sink_checks(
        a in proptest::collection::vec(attrs(), 0..4),
        kind in any::<u8>(),
        rdev in any::<u64>(),
        flags in any::<u32>(),
    ) {
        use ramsys_proto::control::{Confirm, Entry, EntryKind, Propose};
        let m = Control::Attrs(a.clone());
        prop_assert_eq!(Control::decode(&m.encode().unwrap()).unwrap(), m.clone());
        let mut s = SinkMachine::new();
        s.on_recv(&Control::Propose(Propose {
            roots: 1, streams: 1, block_size: 4096, capacity_mbps: 0, checksum: true, cipher: 0,
        })).unwrap();
        let preserve_ok = s.on_recv(&Control::Preserve { flags }).is_ok();
        prop_assert_eq!(preserve_ok, flags & !ramsys_proto::attrs::preserve::ALL == 0);
        s.on_send(&Control::Confirm(Confirm {
            streams: 1, block_size: 4096, credits_per_stream: 2, capacity_mbps: 0, checksum: true, cipher: 0,
        })).unwrap();
        let es = Control::Entries(vec![Entry {
            id: 0,
            path: b"p".to_vec(),
            kind: EntryKind::Special { kind, rdev },
            mode: 0o644,
            mtime_s: 0,
            mtime_ns: 0,
        }]);
        prop_assert_eq!(Control::decode(&es.encode().unwrap()).unwrap(), es.clone());
        if s.on_recv(&es).is_ok() {
            prop_assert!(kind <= 3);
            if s.on_recv(&m).is_ok() {
                prop_assert!(preserve_ok);
                for x in &a {
                    prop_assert_eq!(x.id, 0);
                    prop_assert!(x.acl.iter().all(|e| e.perm <= 7));
                }
            }
        }
    }
}

proptest! {
    /// Arbitrary Piece records (issue 19) round-trip; a sink machine takes
    /// exactly the well-formed ones (inside the file, non-empty, at most
    /// MAX_PIECES) and counts each as a file of its length in MetaEnd.
    #[test]
    fn piece_records_roundtrip_and_sink_checks(
        size in prop_oneof![0u64..100, any::<u64>()],
        piece in prop_oneof![0u64..40, any::<u64>()],
        index in prop_oneof![0u32..8, any::<u32>()],
    ) {
        use ramsys_proto::control::{Confirm, Entry, EntryKind, Propose, MAX_PIECES};
        let kind = EntryKind::Piece { size, piece, index };
        let es = Control::Entries(vec![Entry {
            id: 0, path: b"p".to_vec(), kind: kind.clone(), mode: 0o644, mtime_s: 0, mtime_ns: 0,
        }]);
        prop_assert_eq!(Control::decode(&es.encode().unwrap()).unwrap(), es.clone());
        let mut s = SinkMachine::new();
        s.on_recv(&Control::Propose(Propose {
            roots: 1, streams: 1, block_size: 4096, capacity_mbps: 0, checksum: true, cipher: 0,
        })).unwrap();
        s.on_send(&Control::Confirm(Confirm {
            streams: 1, block_size: 4096, credits_per_stream: 2, capacity_mbps: 0, checksum: true, cipher: 0,
        })).unwrap();
        let ok = piece > 0
            && size.div_ceil(piece) <= MAX_PIECES
            && (index as u128) * (piece as u128) < size as u128;
        prop_assert_eq!(s.on_recv(&es).is_ok(), ok);
        if ok {
            let (off, len) = kind.piece_range().unwrap();
            prop_assert!(len > 0 && off + len <= size);
            let end = Control::MetaEnd { entries: 1, files: 1, bytes: len };
            prop_assert!(s.on_recv(&end).is_ok());
        }
    }
}

/// A length prefix claiming a huge collection must not allocate it.
#[test]
fn huge_length_prefix_is_rejected_cheaply() {
    // Variant 9 = Entries, then a varint length of ~2^62 entries.
    let mut b = vec![9u8];
    b.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f]);
    assert!(Control::decode(&b).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// The watch channel's messages (issue 38; WatchBatch, its kept
    /// sessions) behind their own variant indices, so the fuzzer reaches
    /// their fields; any of them round-trips.
    #[test]
    fn watch_messages_decode_or_fail(
        tail in proptest::collection::vec(any::<u8>(), 0..512),
        which in 0usize..5,
        a in proptest::collection::vec(any::<u8>(), 0..64),
        b in proptest::collection::vec(any::<u8>(), 0..64),
        dir in any::<bool>(),
        seq in any::<u64>(),
        mode in any::<u32>(),
        t in any::<i64>(),
        why in ".{0,40}",
    ) {
        use ramsys_proto::control::{WatchOp, WatchResult};
        let ms = [
            Control::WatchOpen { version: mode as u16, dest: a.clone() },
            Control::WatchReady { version: mode as u16 },
            Control::WatchOps {
                seq,
                ops: vec![
                    WatchOp::Rename { from: a.clone(), to: b.clone(), dir },
                    WatchOp::Delete { path: b.clone(), dir },
                    WatchOp::DirAttrs { path: a, mode, mtime_s: t, mtime_ns: mode },
                ],
            },
            Control::WatchDone {
                seq,
                results: vec![WatchResult::Done, WatchResult::Missing, WatchResult::Failed(why)],
            },
            Control::WatchBatch { batch: seq },
        ];
        let m = &ms[which];
        let idx = m.encode().unwrap()[0];
        let mut bytes = vec![idx];
        bytes.extend(tail);
        if let Ok(d) = Control::decode(&bytes) {
            prop_assert_eq!(&Control::decode(&d.encode().unwrap()).unwrap(), &d);
        }
        prop_assert_eq!(&Control::decode(&m.encode().unwrap()).unwrap(), m);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// The window messages (issue 36; Window, the sink's limit) and a LinkTo record behind their own
    /// variant indices, so the fuzzer reaches their fields; each
    /// round-trips, and arbitrary bytes after the tag decode or fail.
    #[test]
    fn window_messages_decode_or_fail(
        tail in proptest::collection::vec(any::<u8>(), 0..256),
        through in any::<u64>(),
        target in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        use ramsys_proto::control::{Entry, EntryKind};
        let link = Entry {
            id: through, path: b"l".to_vec(),
            kind: EntryKind::LinkTo { target_id: through / 2, target },
            mode: 0o644, mtime_s: 0, mtime_ns: 0,
        };
        let ms = [
            Control::Ready { through },
            Control::SettledThrough { through },
            Control::Entries(vec![link]),
            Control::Window { files: through, bytes: through.rotate_left(17) },
        ];
        for m in ms {
            let b = m.encode().unwrap();
            prop_assert_eq!(Control::decode(&b).unwrap(), m.clone());
            let mut t = b[..1].to_vec();
            t.extend_from_slice(&tail);
            let _ = Control::decode(&t);
        }
    }

    /// A sink machine that took windows, of a copy or of a sync, fed
    /// arbitrary decoded messages with arbitrary frame flags, never panics.
    #[test]
    fn windowed_sink_machine_never_panics(
        msgs in proptest::collection::vec((proptest::collection::vec(any::<u8>(), 0..128), any::<u8>()), 0..16),
        sync in any::<bool>(),
        archive in any::<bool>(),
        attrs_in in proptest::collection::vec(attrs(), 0..3),
        limit in any::<bool>(),
    ) {
        use ramsys_proto::control::{Confirm, Propose};
        use ramsys_proto::frame::{WINDOWS_FLAG, WINDOW_LIMIT_FLAG};
        let mut m = SinkMachine::new();
        let p = Control::Propose(Propose {
            roots: 1, streams: 1, block_size: 4096, capacity_mbps: 0, checksum: true, cipher: 0,
        });
        // With a window limit announced too (a small one: records past it
        // are refused, not held).
        let flags = WINDOWS_FLAG | if limit { WINDOW_LIMIT_FLAG } else { 0 };
        m.on_recv_flags(&p, flags).unwrap();
        if sync {
            let mode = Control::SyncMode { flags: ramsys_proto::control::sync::SYNC };
            m.on_recv(&mode).unwrap();
        }
        let c = Control::Confirm(Confirm {
            streams: 1, block_size: 4096, credits_per_stream: 2, capacity_mbps: 0, checksum: true, cipher: 0,
        });
        m.on_send_flags(&c, flags).unwrap();
        if limit {
            m.on_send(&Control::Window { files: 64, bytes: 16 << 10 }).unwrap();
        }
        m.on_send(&Control::SyncDone { failures: vec![] }).unwrap();
        // An archive copy (Preserve after SyncDone): arbitrary Attrs
        // between the arbitrary messages too.
        if archive {
            m.on_recv(&Control::Preserve { flags: ramsys_proto::attrs::preserve::ALL }).unwrap();
        }
        let mut attrs_in = attrs_in.into_iter();
        for (b, flags) in msgs {
            if let Ok(c) = Control::decode(&b) {
                let _ = m.on_recv_flags(&c, flags);
            }
            if let Some(a) = attrs_in.next() {
                let _ = m.on_recv(&Control::Attrs(vec![a]));
            }
        }
    }

    /// A windowed archive copy (issue 36): after a first batch of `n1`
    /// records with its Attrs and a second of `n2`, an Attrs is taken at
    /// both ends exactly when every id lies in the second batch; the
    /// first batch's Ready and SettledThrough change nothing of that.
    #[test]
    fn windowed_attrs_only_for_the_batch_they_follow(
        n1 in 1u64..32,
        n2 in 1u64..32,
        settle in any::<bool>(),
        ids in proptest::collection::vec(0u64..80, 0..8),
    ) {
        use ramsys_proto::attrs::Attrs;
        // Preserve reaches the sink after SyncDone, as a windowed sink may
        // read it.
        let pr = Control::Preserve { flags: ramsys_proto::attrs::preserve::OWNER };
        let (mut src, mut snk) = windowed_pair(&[], &[pr]);
        let attrs = |ids: &mut dyn Iterator<Item = u64>| {
            Control::Attrs(ids.map(|id| Attrs { id, ..Default::default() }).collect())
        };
        let (b1, a1) = (files(0, n1), attrs(&mut (0..n1)));
        for m in [&b1, &a1] {
            src.on_send(m).unwrap();
            snk.on_recv(m).unwrap();
        }
        let ready = Control::Ready { through: n1 };
        snk.on_send(&ready).unwrap();
        src.on_recv(&ready).unwrap();
        if settle {
            let st = Control::SettledThrough { through: n1 };
            snk.on_send(&st).unwrap();
            src.on_recv(&st).unwrap();
        }
        let b2 = files(n1, n1 + n2);
        src.on_send(&b2).unwrap();
        snk.on_recv(&b2).unwrap();
        let m = attrs(&mut ids.iter().copied());
        let inside = ids.iter().all(|&id| id >= n1 && id < n1 + n2);
        prop_assert_eq!(src.on_send(&m).is_ok(), inside);
        prop_assert_eq!(snk.on_recv(&m).is_ok(), inside);
    }

    /// A windowed sync (issue 36): after `n` file records and a Ready at
    /// `ready`, the sink may send and the source accepts a Have exactly
    /// when every id lies in the window being readied (`ready .. n`), and
    /// a Reuse exactly when every id lies below the Ready mark; the
    /// machines never panic on any of them.
    #[test]
    fn windowed_sync_answers_only_inside_the_window(
        n in 1u64..64,
        ready in 0u64..64,
        have in proptest::collection::vec(0u64..80, 0..8),
        reuse in proptest::collection::vec(0u64..80, 0..8),
    ) {
        use ramsys_proto::control::{Have, HaveState, Reuse, ReuseKind};
        let ready = ready.min(n);
        let mode = Control::SyncMode { flags: ramsys_proto::control::sync::SYNC };
        let (mut src, mut snk) = windowed_pair(&[mode], &[]);
        let es = files(0, n);
        src.on_send(&es).unwrap();
        snk.on_recv(&es).unwrap();
        if ready > 0 {
            let r = Control::Ready { through: ready };
            snk.on_send(&r).unwrap();
            src.on_recv(&r).unwrap();
        }
        let h = Control::Have(have.iter().map(|&id| Have { id, state: HaveState::Unchanged }).collect());
        let inside = have.iter().all(|&id| id >= ready && id < n)
            && have.len() as u64 <= n - ready;
        prop_assert_eq!(snk.on_send(&h).is_ok(), inside);
        prop_assert_eq!(src.on_recv(&h).is_ok(), inside);
        let r = Control::Reuse(reuse.iter().map(|&id| Reuse { id, what: ReuseKind::Keep }).collect());
        let readied = reuse.iter().all(|&id| id < ready);
        prop_assert_eq!(src.on_send(&r).is_ok(), readied);
        prop_assert_eq!(snk.on_recv(&r).is_ok(), readied);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// A sink's Window (issue 36) is taken at both ends exactly when it
    /// lies within MIN_WINDOW and (MAX_WINDOW_IDS, MAX_WINDOW_BYTES);
    /// then a batch of `n` records whose paths are `len` bytes is taken at
    /// both ends exactly when it fits the window in force (the larger of
    /// the sink's and the first window: the source may have sent that
    /// much before it read the Window), its first record whatever its size.
    #[test]
    fn the_sinks_window_holds_at_both_ends(
        files in prop_oneof![0u64..2048, any::<u64>()],
        bytes in prop_oneof![0u64..(1 << 19), any::<u64>()],
        n in 1u64..1200,
        len in 1usize..250,
    ) {
        use ramsys_proto::control::{Confirm, Entry, EntryKind, Propose};
        use ramsys_proto::frame::{WINDOWS_FLAG, WINDOW_LIMIT_FLAG};
        use ramsys_proto::session::{FIRST_WINDOW, MAX_WINDOW_BYTES, MAX_WINDOW_IDS, MIN_WINDOW};
        let flags = WINDOWS_FLAG | WINDOW_LIMIT_FLAG;
        let (mut src, mut snk) = (ramsys_proto::session::SourceMachine::new(), SinkMachine::new());
        let p = Control::Propose(Propose {
            roots: 1, streams: 1, block_size: 4096, capacity_mbps: 0, checksum: true, cipher: 0,
        });
        src.on_send_flags(&p, flags).unwrap();
        snk.on_recv_flags(&p, flags).unwrap();
        let c = Control::Confirm(Confirm {
            streams: 1, block_size: 4096, credits_per_stream: 2, capacity_mbps: 0, checksum: true, cipher: 0,
        });
        snk.on_send_flags(&c, flags).unwrap();
        src.on_recv_flags(&c, flags).unwrap();
        let w = Control::Window { files, bytes };
        let valid = (MIN_WINDOW.0..=MAX_WINDOW_IDS).contains(&files)
            && (MIN_WINDOW.1..=MAX_WINDOW_BYTES).contains(&bytes);
        prop_assert_eq!(snk.on_send(&w).is_ok(), valid);
        prop_assert_eq!(src.on_recv(&w).is_ok(), valid);
        if !valid {
            return Ok(());
        }
        let sd = Control::SyncDone { failures: vec![] };
        snk.on_send(&sd).unwrap();
        src.on_recv(&sd).unwrap();
        let es: Vec<_> = (0..n).map(|id| {
            let mut path = format!("f{id}").into_bytes();
            path.resize(len.max(path.len()), b'x');
            Entry { id, path, kind: EntryKind::File { size: 1 }, mode: 0o644, mtime_s: 0, mtime_ns: 0 }
        }).collect();
        let weight: u64 = es.iter().map(ramsys_proto::session::record_bytes).sum();
        let fits = n <= files.max(FIRST_WINDOW.0)
            && (n == 1 || weight <= bytes.max(FIRST_WINDOW.1));
        let m = Control::Entries(es);
        prop_assert_eq!(src.on_send(&m).is_ok(), fits);
        prop_assert_eq!(snk.on_recv(&m).is_ok(), fits);
    }
}

/// A source and a sink machine that took windows, up to the payload:
/// `before` (SyncMode, Preserve) sent right behind the Propose and read by
/// the sink there, `late` sent there too but read by the sink only after
/// SyncDone.
fn windowed_pair(
    before: &[Control],
    late: &[Control],
) -> (ramsys_proto::session::SourceMachine, SinkMachine) {
    use ramsys_proto::control::{Confirm, Propose};
    use ramsys_proto::frame::WINDOWS_FLAG;
    let (mut src, mut snk) = (
        ramsys_proto::session::SourceMachine::new(),
        SinkMachine::new(),
    );
    let p = Control::Propose(Propose {
        roots: 1,
        streams: 1,
        block_size: 4096,
        capacity_mbps: 0,
        checksum: true,
        cipher: 0,
    });
    src.on_send_flags(&p, WINDOWS_FLAG).unwrap();
    snk.on_recv_flags(&p, WINDOWS_FLAG).unwrap();
    for m in before {
        src.on_send(m).unwrap();
        snk.on_recv(m).unwrap();
    }
    for m in late {
        src.on_send(m).unwrap();
    }
    let c = Control::Confirm(Confirm {
        streams: 1,
        block_size: 4096,
        credits_per_stream: 2,
        capacity_mbps: 0,
        checksum: true,
        cipher: 0,
    });
    snk.on_send_flags(&c, WINDOWS_FLAG).unwrap();
    src.on_recv_flags(&c, WINDOWS_FLAG).unwrap();
    let sd = Control::SyncDone { failures: vec![] };
    snk.on_send(&sd).unwrap();
    src.on_recv(&sd).unwrap();
    for m in late {
        snk.on_recv(m).unwrap();
    }
    (src, snk)
}

/// Entries of one-byte files with ids `from..to`.
fn files(from: u64, to: u64) -> Control {
    use ramsys_proto::control::{Entry, EntryKind};
    let es = (from..to).map(|id| Entry {
        id,
        path: format!("f{id}").into_bytes(),
        kind: EntryKind::File { size: 1 },
        mode: 0o644,
        mtime_s: 0,
        mtime_ns: 0,
    });
    Control::Entries(es.collect())
}
