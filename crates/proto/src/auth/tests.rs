use super::*;

const TCP: TcpBuffers = TcpBuffers {
    wmem_max: 4 << 20,
    rmem_max: 6 << 20,
};

/// One recorded handshake: what crossed the wire and what each end got.
struct Run {
    hello: Control,
    challenge: Control,
    auth: Control,
    client: (u64, Bytes32),
    server: (String, Bytes32),
}

fn run_with(key: &[u8], user: &str, ephs: Option<(&[u8; 32], &[u8; 32])>) -> Run {
    let mut c = ClientHandshake::build(key, user, None, ephs.map(|e| &e.0[..]));
    let hello = c.hello().unwrap();
    let mut s = ServerHandshake::accept_with(key, &hello, ephs.map(|e| &e.1[..])).unwrap();
    let accept = Accept {
        session: 7,
        tcp: Some(TCP),
    };
    let challenge = s.challenge(accept).unwrap();
    let auth = c.on_challenge(&challenge).unwrap();
    assert_eq!(c.accepted(), Some(accept));
    let server = s.on_auth(&auth).unwrap();
    let client = c.on_auth_ok(&Control::AuthOk { session: 7 }).unwrap();
    Run {
        hello,
        challenge,
        auth,
        client,
        server,
    }
}

fn noise_of(m: &Control) -> &[u8] {
    match m {
        Control::Hello { noise, .. }
        | Control::SiteHello { noise, .. }
        | Control::Challenge { noise } => noise,
        other => panic!("no Noise message in {other:?}"),
    }
}

#[test]
fn same_key_agrees_on_session_key_and_limits() {
    let r = run_with(b"k1", "u", None);
    assert_eq!(r.client, (7, r.server.1));
    assert_eq!(r.server.0, "u");
    assert_eq!(noise_of(&r.hello).len(), 48);
    let m = join_mac(&r.client.1, 7, 2, &[3; 32]);
    assert!(verify_join(&r.server.1, 7, 2, &[3; 32], &m));
}

#[test]
fn wrong_key_and_unknown_user_fail_at_the_hello() {
    let mut c = ClientHandshake::new(b"client's key", "u");
    let hello = c.hello().unwrap();
    // The daemon's key for this name (or its decoy for an unknown one)
    // differs: the Hello's tag does not verify, nothing is answered but
    // the refusal.
    assert_eq!(
        ServerHandshake::accept(b"daemon's key", &hello).err(),
        Some(ProtoError::AuthFailed)
    );
    assert!(ServerHandshake::accept(b"client's key", &hello).is_ok());
}

#[test]
fn a_forged_or_foreign_challenge_fails_at_the_client() {
    // A server without the key cannot produce a Challenge: try one made
    // for another client's Hello with the same key, and garbage.
    let mut other = ClientHandshake::new(b"k", "u");
    let mut s = ServerHandshake::accept(b"k", &other.hello().unwrap()).unwrap();
    let foreign = s
        .challenge(Accept {
            session: 1,
            tcp: None,
        })
        .unwrap();
    let mut c = ClientHandshake::new(b"k", "u");
    c.hello().unwrap();
    assert_eq!(c.on_challenge(&foreign), Err(ProtoError::AuthFailed));
    let mut c = ClientHandshake::new(b"k", "u");
    c.hello().unwrap();
    let junk = Control::Challenge { noise: vec![9; 80] };
    assert_eq!(c.on_challenge(&junk), Err(ProtoError::AuthFailed));
    assert!(c.session().is_none());
}

#[test]
fn a_replayed_hello_and_auth_never_authenticate() {
    let r = run_with(b"k", "u", None);
    // The recorded Hello verifies again (it only shows the PSK) ...
    let mut s = ServerHandshake::accept(b"k", &r.hello).unwrap();
    s.challenge(Accept {
        session: 8,
        tcp: None,
    })
    .unwrap();
    // ... but the recorded Auth was for another server ephemeral.
    assert_eq!(s.on_auth(&r.auth), Err(ProtoError::AuthFailed));
    // An Auth before any Challenge is out of place.
    let mut s = ServerHandshake::accept(b"k", &r.hello).unwrap();
    assert!(matches!(
        s.on_auth(&r.auth),
        Err(ProtoError::Unexpected { .. })
    ));
    // The server's own Challenge reflected as an Auth proves nothing.
    let ch = s
        .challenge(Accept {
            session: 9,
            tcp: None,
        })
        .unwrap();
    let proof: Bytes32 = noise_of(&ch)[..32].try_into().unwrap();
    assert_eq!(
        s.on_auth(&Control::Auth { proof }),
        Err(ProtoError::AuthFailed)
    );
}

#[test]
fn the_prologue_binds_the_name_and_the_site_address() {
    let mut c = ClientHandshake::new(b"k", "alice");
    let Control::Hello { noise, .. } = c.hello().unwrap() else {
        panic!()
    };
    // The same Noise message under another name (both names with the
    // same key): refused.
    let renamed = Control::Hello {
        user: "bob".into(),
        noise: noise.clone(),
    };
    assert_eq!(
        ServerHandshake::accept(b"k", &renamed).err(),
        Some(ProtoError::AuthFailed)
    );
    // A session Hello is no SiteHello, and an announced address cannot
    // be changed on the way.
    let as_site = Control::SiteHello {
        user: "alice".into(),
        addr: String::new(),
        noise,
    };
    assert!(ServerHandshake::accept(b"k", &as_site).is_err());
    let mut c = ClientHandshake::site(b"k", "site", "10.0.0.1:7070");
    let Control::SiteHello { user, noise, .. } = c.hello().unwrap() else {
        panic!()
    };
    let moved = Control::SiteHello {
        user: user.clone(),
        addr: "10.6.6.6:7070".into(),
        noise: noise.clone(),
    };
    assert!(ServerHandshake::accept(b"k", &moved).is_err());
    let honest = Control::SiteHello {
        user,
        addr: "10.0.0.1:7070".into(),
        noise,
    };
    assert!(ServerHandshake::accept(b"k", &honest).is_ok());
}

#[test]
fn oversized_fields_are_refused_before_any_crypto() {
    let long = Control::Hello {
        user: "u".repeat(MAX_USER + 1),
        noise: vec![0; 48],
    };
    assert!(matches!(
        ServerHandshake::accept(b"k", &long),
        Err(ProtoError::Malformed { .. })
    ));
    let big = Control::Hello {
        user: "u".into(),
        noise: vec![0; MAX_NOISE + 1],
    };
    assert_eq!(
        ServerHandshake::accept(b"k", &big).err(),
        Some(ProtoError::AuthFailed)
    );
}

// ---- The key schedule: forward secrecy (issue 34) ----------------------

type HmacSha256 = Hmac<Sha256>;

/// Noise's HKDF (spec sec. 4.3) with 2 or 3 outputs: RFC 5869 with the
/// chaining key as salt and an empty info.
fn noise_hkdf(ck: &[u8; 32], ikm: &[u8]) -> [[u8; 32]; 3] {
    let mut out = [0u8; 96];
    Hkdf::<Sha256>::new(Some(ck), ikm)
        .expand(&[], &mut out)
        .unwrap();
    std::array::from_fn(|i| out[i * 32..(i + 1) * 32].try_into().unwrap())
}

fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    use sha2::Digest;
    let mut d = Sha256::new();
    for p in parts {
        d.update(p);
    }
    d.finalize().into()
}

/// Noise's SymmetricState for NNpsk0, written out from the spec (sec. 5.2,
/// 9.2) as someone holding the long-term key and a recording would run it:
/// every step needs only public bytes and the PSK, except `ee`.
struct Eavesdropper {
    ck: [u8; 32],
    h: [u8; 32],
}

impl Eavesdropper {
    fn new(key: &[u8], user: &str, hello: &[u8], challenge: &[u8]) -> Self {
        let name = NOISE_PARAMS.as_bytes();
        assert!(name.len() > 32);
        let h = sha256(&[name]);
        let mut s = Eavesdropper { ck: h, h };
        s.mix_hash(&prologue(user, None));
        // Hello: psk, e, then the (empty) payload's tag.
        let [ck, temp_h, _k] = noise_hkdf(&s.ck, &psk(key));
        s.ck = ck;
        s.mix_hash(&temp_h);
        s.mix_hash(&hello[..32]);
        s.ck = noise_hkdf(&s.ck, &hello[..32])[0];
        s.mix_hash(&hello[32..]);
        // Challenge: e (mixed into the key in PSK mode) ...
        s.mix_hash(&challenge[..32]);
        s.ck = noise_hkdf(&s.ck, &challenge[..32])[0];
        s
    }

    fn mix_hash(&mut self, data: &[u8]) {
        self.h = sha256(&[&self.h, data]);
    }

    /// ... then ee: MixKey(DH(e_c, e_s)), the encrypted Accept is hashed,
    /// Split(), and ramsys's schedule. `dh` is what the eavesdropper would
    /// need and does not have.
    fn session_key(&self, dh: &[u8; 32], challenge: &[u8]) -> (Bytes32, [u8; 32]) {
        let ck = noise_hkdf(&self.ck, dh)[0];
        let h = sha256(&[&self.h, &challenge[32..]]);
        let [k1, k2, _] = noise_hkdf(&ck, &[]);
        (schedule_from(&k1, &k2, &h).session_key, h)
    }
}

fn x25519(private: &[u8; 32], public: &[u8]) -> [u8; 32] {
    let p = curve25519_dalek::montgomery::MontgomeryPoint(public.try_into().unwrap());
    p.mul_clamped(*private).to_bytes()
}

#[test]
fn a_recorded_session_key_cannot_be_recomputed_from_key_and_transcript() {
    let key = b"0123456789abcdef0123456789abcdef";
    let (ec, es) = ([0x11u8; 32], [0x22u8; 32]);
    let r = run_with(key, "alice", Some((&ec, &es)));
    let sk = r.client.1;
    let (hello, challenge) = (noise_of(&r.hello), noise_of(&r.challenge));

    // The eavesdropper's model of the schedule is exact: given the one
    // secret it lacks, the ephemeral DH, it lands on the session key and
    // on the handshake hash the Auth proof covers.
    let eve = Eavesdropper::new(key, "alice", hello, challenge);
    let dh = x25519(&ec, &challenge[..32]);
    assert_eq!(dh, x25519(&es, &hello[..32]));
    let (with_dh, h) = eve.session_key(&dh, challenge);
    assert_eq!(with_dh, sk);
    let mut m = <HmacSha256 as Mac>::new_from_slice(&{
        let mut ikm = [0u8; 64];
        let ck = noise_hkdf(&eve.ck, &dh)[0];
        let [k1, k2, _] = noise_hkdf(&ck, &[]);
        ikm[..32].copy_from_slice(&k1);
        ikm[32..].copy_from_slice(&k2);
        let mut f = [0u8; 32];
        Hkdf::<Sha256>::new(Some(&h), &ikm)
            .expand(b"ramsys v3 client finished", &mut f)
            .unwrap();
        f
    })
    .unwrap();
    m.update(&h);
    let proof: Bytes32 = m.finalize().into_bytes().into();
    assert_eq!(r.auth, Control::Auth { proof });

    // Without it, everything it can compute from the key and the
    // recording is something else: the chaining key before ee split
    // directly, the handshake hash, a DH guessed with a public key or its
    // own ephemeral, and the old derivation over both public values.
    let public_e: [u8; 32] = hello[..32].try_into().unwrap();
    let mut guesses = vec![
        eve.session_key(&[0; 32], challenge).0,
        eve.session_key(&public_e, challenge).0,
        eve.session_key(&x25519(&[0x33; 32], &challenge[..32]), challenge)
            .0,
        h,
        {
            let [k1, k2, _] = noise_hkdf(&eve.ck, &[]);
            schedule_from(&k1, &k2, &h).session_key
        },
        eve.ck,
    ];
    let mut v1 = <HmacSha256 as Mac>::new_from_slice(key).unwrap();
    for p in [&b"ramsys-v1 session"[..], hello, challenge] {
        v1.update(&(p.len() as u64).to_le_bytes());
        v1.update(p);
    }
    guesses.push(v1.finalize().into_bytes().into());
    for g in &guesses {
        assert_ne!(*g, sk);
    }
    // Replaying the recorded Hello to a daemon gets a fresh session whose
    // key is unrelated to the recorded one.
    let mut s = ServerHandshake::accept(key, &r.hello).unwrap();
    s.challenge(Accept {
        session: 7,
        tcp: Some(TCP),
    })
    .unwrap();
    assert_ne!(s.keys.as_ref().unwrap().session_key, sk);
}

#[test]
fn the_session_key_depends_on_both_ephemerals() {
    let key = b"same long-term key";
    let (a, b, c) = ([0x11u8; 32], [0x22u8; 32], [0x44u8; 32]);
    // Same key, name, session id and limits; only the ephemerals differ.
    let base = run_with(key, "u", Some((&a, &b))).client.1;
    assert_eq!(run_with(key, "u", Some((&a, &b))).client.1, base);
    assert_ne!(run_with(key, "u", Some((&c, &b))).client.1, base);
    assert_ne!(run_with(key, "u", Some((&a, &c))).client.1, base);
    // Fresh ephemerals every time without a fixed one.
    let (x, y) = (run_with(key, "u", None), run_with(key, "u", None));
    assert_ne!(x.client.1, y.client.1);
    assert_ne!(noise_of(&x.hello), noise_of(&y.hello));
    // And on the name (prologue) with everything else equal.
    assert_ne!(run_with(key, "v", Some((&a, &b))).client.1, base);
}

/// A kept session's batches (issue 38): each batch key differs from the
/// session key and from every other batch's, so a Join or Rejoin made for
/// one batch never verifies in another, and neither does one made with the
/// connection's own key; each batch's id is its own, and never a
/// connection's (top bit set).
#[test]
fn a_join_of_one_batch_fails_in_every_other() {
    use super::keys::{batch_key, batch_session, join_mac, rejoin_mac, verify_join, verify_rejoin};
    use proptest::prelude::*;
    proptest!(|(sk in any::<[u8; 32]>(), a in 1u64..1 << 40, d in 1u64..1000,
                stream in any::<u16>(), epoch in 1u16.., nonce in any::<[u8; 32]>())| {
        let b = a + d;
        let (ka, kb) = (batch_key(&sk, a), batch_key(&sk, b));
        prop_assert_ne!(ka, kb);
        prop_assert_ne!(ka, sk);
        prop_assert_eq!(batch_key(&sk, a), ka);
        let (ia, ib) = (batch_session(&sk, a), batch_session(&sk, b));
        prop_assert!(ia != ib && ia >> 63 == 1 && ib >> 63 == 1);
        let session = 0x1234;
        let mac = join_mac(&ka, session, stream, &nonce);
        prop_assert!(verify_join(&ka, session, stream, &nonce, &mac));
        prop_assert!(!verify_join(&kb, session, stream, &nonce, &mac));
        prop_assert!(!verify_join(&sk, session, stream, &nonce, &mac));
        let own = join_mac(&sk, session, stream, &nonce);
        prop_assert!(!verify_join(&ka, session, stream, &nonce, &own));
        let re = rejoin_mac(&ka, session, stream, epoch, &nonce);
        prop_assert!(!verify_rejoin(&kb, session, stream, epoch, &nonce, &re));
    });
}
