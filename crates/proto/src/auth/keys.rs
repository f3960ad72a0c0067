//! Everything keyed by a session key, derived with HKDF (RFC 5869;
//! issue 34): the handshake's key schedule ([`super`]) yields a 256-bit
//! session key, which is a uniformly random pseudorandom key, so each use
//! below is HKDF-Expand(session key, info) with `info` = a label of its own
//! followed by its context, every part length-prefixed (u64 LE) so parts
//! cannot be shifted between fields. No two uses share a label, so no
//! value derived for one purpose is ever valid for another (a Join tag is
//! no Rejoin tag, a data key no control key). HKDF-Expand is HMAC-SHA256
//! under the session key, a PRF: the MACs below are its output over their
//! fields, checked in constant time.

use hkdf::Hkdf;
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::control::Bytes32;

/// Labels of the session key's uses; each appears here once.
pub mod label {
    pub const JOIN: &[u8] = b"ramsys v3 join";
    pub const REJOIN: &[u8] = b"ramsys v3 rejoin";
    pub const TOKEN: &[u8] = b"ramsys v3 token";
    pub const REDIRECT: &[u8] = b"ramsys v3 redirect";
    /// DATA and CREDIT keys (engine crypto::data_key).
    pub const DATA_KEY: &[u8] = b"ramsys v3 data key";
    /// Sealed control link keys (engine crypto::control_key).
    pub const CONTROL_KEY: &[u8] = b"ramsys v3 control key";
    /// A kept session's batch key (issue 38, [`super::batch_key`]).
    pub const BATCH: &[u8] = b"ramsys v3 batch";
    /// The id its data links join (issue 38, [`super::batch_session`]).
    pub const BATCH_ID: &[u8] = b"ramsys v3 batch id";
}

/// HKDF-Expand(`session_key`, `label` ‖ `context`), 32 bytes.
pub fn derive(session_key: &Bytes32, label: &[u8], context: &[&[u8]]) -> Bytes32 {
    let hk = Hkdf::<Sha256>::from_prk(session_key).expect("a 32-byte PRK is long enough");
    let mut info = Vec::with_capacity(64);
    for p in std::iter::once(label).chain(context.iter().copied()) {
        info.extend_from_slice(&(p.len() as u64).to_le_bytes());
        info.extend_from_slice(p);
    }
    let mut out = [0u8; 32];
    hk.expand(&info, &mut out)
        .expect("32 bytes is within HKDF-SHA256's output limit");
    out
}

fn same(a: &Bytes32, b: &Bytes32) -> bool {
    a.ct_eq(b).into()
}

/// The key of batch `batch` (1, 2, ...) of a watch channel's kept sessions
/// (issue 38, Control::WatchBatch): it stands in for the session key in
/// everything that batch's session keys (Join and Rejoin MACs, DATA and
/// CREDIT keys, a Redirect's MAC), so no AEAD nonce of one batch's links
/// is ever used again under the same key by another, and a Join or Rejoin
/// made for one batch fails in every other. The sealed control link keeps
/// the session key and its record counters for the connection's life.
pub fn batch_key(session_key: &Bytes32, batch: u64) -> Bytes32 {
    derive(session_key, label::BATCH, &[&batch.to_le_bytes()])
}

/// The session id batch `batch`'s data links name in Join and Rejoin
/// (issue 38): the daemon registers each batch under an id of its own, so
/// a link of an ended batch finds no session at all. The top bit is set:
/// a connection's own ids stay below 2^48 (server.rs), so the two never
/// meet.
pub fn batch_session(session_key: &Bytes32, batch: u64) -> u64 {
    let d = derive(session_key, label::BATCH_ID, &[&batch.to_le_bytes()]);
    u64::from_le_bytes(d[..8].try_into().expect("8 bytes")) | 1 << 63
}

/// MAC a data link presents to join a session as `stream`.
pub fn join_mac(session_key: &Bytes32, session: u64, stream: u16, nonce: &Bytes32) -> Bytes32 {
    derive(
        session_key,
        label::JOIN,
        &[&session.to_le_bytes(), &stream.to_le_bytes(), nonce],
    )
}

/// Check a data link's join MAC in constant time.
pub fn verify_join(
    session_key: &Bytes32,
    session: u64,
    stream: u16,
    nonce: &Bytes32,
    tag: &Bytes32,
) -> bool {
    same(&join_mac(session_key, session, stream, nonce), tag)
}

/// MAC a replacement data link presents (Control::Rejoin): as
/// [`join_mac`], under its own label and over the epoch too.
pub fn rejoin_mac(
    session_key: &Bytes32,
    session: u64,
    stream: u16,
    epoch: u16,
    nonce: &Bytes32,
) -> Bytes32 {
    derive(
        session_key,
        label::REJOIN,
        &[
            &session.to_le_bytes(),
            &stream.to_le_bytes(),
            &epoch.to_le_bytes(),
            nonce,
        ],
    )
}

/// Check a Rejoin MAC in constant time.
pub fn verify_rejoin(
    session_key: &Bytes32,
    session: u64,
    stream: u16,
    epoch: u16,
    nonce: &Bytes32,
    tag: &Bytes32,
) -> bool {
    same(&rejoin_mac(session_key, session, stream, epoch, nonce), tag)
}

/// Seal (or unseal: the operation is its own inverse) a one-time
/// credential's key for the Token message: XOR with a pad derived from the
/// session key and the credential's user name. Each minted name is fresh,
/// so no pad is ever used twice, and only the two ends of the session
/// (which hold the session key) can read the key.
pub fn seal_token_key(session_key: &Bytes32, user: &str, key: &Bytes32) -> Bytes32 {
    let pad = derive(session_key, label::TOKEN, &[user.as_bytes()]);
    std::array::from_fn(|i| key[i] ^ pad[i])
}

/// MAC a server puts on its Redirect (issue 34): the client follows only
/// a redirect its own daemon sent, whatever the path did to the link.
pub fn redirect_mac(session_key: &Bytes32, addr: &str, reason: &str) -> Bytes32 {
    derive(
        session_key,
        label::REDIRECT,
        &[addr.as_bytes(), reason.as_bytes()],
    )
}

/// Check a Redirect's MAC in constant time.
pub fn verify_redirect(session_key: &Bytes32, addr: &str, reason: &str, tag: &Bytes32) -> bool {
    same(&redirect_mac(session_key, addr, reason), tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirect_mac_binds_address_reason_and_key() {
        let k = [7u8; 32];
        let m = redirect_mac(&k, "10.0.0.2:7070", "busy");
        assert!(verify_redirect(&k, "10.0.0.2:7070", "busy", &m));
        assert!(!verify_redirect(&k, "10.6.6.6:7070", "busy", &m));
        assert!(!verify_redirect(&k, "10.0.0.2:7070", "idle", &m));
        assert!(!verify_redirect(&[8u8; 32], "10.0.0.2:7070", "busy", &m));
        // Parts are length-prefixed: moving a byte between them fails.
        assert!(!verify_redirect(&k, "10.0.0.2:7070b", "usy", &m));
    }

    #[test]
    fn rejoin_mac_binds_stream_epoch_and_label() {
        let k = [7u8; 32];
        let n = [3u8; 32];
        let m = rejoin_mac(&k, 5, 2, 1, &n);
        assert!(verify_rejoin(&k, 5, 2, 1, &n, &m));
        assert!(!verify_rejoin(&k, 5, 2, 2, &n, &m));
        assert!(!verify_rejoin(&k, 5, 3, 1, &n, &m));
        assert!(!verify_rejoin(&[8u8; 32], 5, 2, 1, &n, &m));
        // A Join MAC is no Rejoin MAC (different label).
        assert!(!verify_rejoin(&k, 5, 2, 0, &n, &join_mac(&k, 5, 2, &n)));
    }

    #[test]
    fn join_mac_binds_session_stream_and_key() {
        let k = [1u8; 32];
        let m = join_mac(&k, 1, 2, &[3; 32]);
        assert!(verify_join(&k, 1, 2, &[3; 32], &m));
        assert!(!verify_join(&k, 1, 3, &[3; 32], &m));
        assert!(!verify_join(&k, 2, 2, &[3; 32], &m));
        assert!(!verify_join(&k, 1, 2, &[4; 32], &m));
        assert!(!verify_join(&[2; 32], 1, 2, &[3; 32], &m));
    }

    #[test]
    fn token_seal_round_trips_and_depends_on_session_and_name() {
        let k = [9u8; 32];
        let sealed = seal_token_key(&[1; 32], "otp-a", &k);
        assert_ne!(sealed, k);
        assert_eq!(seal_token_key(&[1; 32], "otp-a", &sealed), k);
        assert_ne!(seal_token_key(&[2; 32], "otp-a", &sealed), k);
        assert_ne!(seal_token_key(&[1; 32], "otp-b", &sealed), k);
    }

    #[test]
    fn every_label_gives_its_own_key() {
        let k = [5u8; 32];
        let all = [
            label::JOIN,
            label::REJOIN,
            label::TOKEN,
            label::REDIRECT,
            label::DATA_KEY,
            label::CONTROL_KEY,
        ];
        let keys: std::collections::HashSet<Bytes32> =
            all.iter().map(|l| derive(&k, l, &[])).collect();
        assert_eq!(keys.len(), all.len());
        // Context parts are length-prefixed: ("ab", "c") is not ("a", "bc").
        assert_ne!(
            derive(&k, label::JOIN, &[b"ab", b"c"]),
            derive(&k, label::JOIN, &[b"a", b"bc"])
        );
        // HKDF-Expand as RFC 5869 defines it: T(1) = HMAC(PRK, info ‖ 0x01).
        use hmac::{Hmac, Mac};
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&k).unwrap();
        m.update(&(label::TOKEN.len() as u64).to_le_bytes());
        m.update(label::TOKEN);
        m.update(&[1]);
        let t1: Bytes32 = m.finalize().into_bytes().into();
        assert_eq!(derive(&k, label::TOKEN, &[]), t1);
    }
}
