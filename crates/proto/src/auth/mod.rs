//! Authentication and the session key (seed 000 sec. 6.2.1; issue 34).
//!
//! The handshake is the Noise Protocol Framework's `NNpsk0` pattern,
//! `Noise_NNpsk0_25519_ChaChaPoly_SHA256`, run by the `snow` crate, with
//! one message of ours after it:
//!
//! ```text
//! prologue   "ramsys handshake" ‖ VERSION ‖ "session"|"site" ‖ user ‖ site address
//! Hello      -> psk, e     client ephemeral; AEAD tag under a key from the PSK
//! Challenge  <- e, ee      server ephemeral, X25519; payload Accept{session, tcp}
//! Auth       -> proof      HMAC(finished key, handshake hash): the client's proof
//! AuthOk     <- session
//! ```
//!
//! - **Which key**: the pre-shared key (PSK) is HKDF of the long-term key
//!   ([`psk`]), selected by the user name the Hello carries in clear; the
//!   name (and a site link's announced address) is in the prologue, so a
//!   name changed on the way fails the handshake.
//! - **The server proves its key** with the Challenge: its AEAD tag is
//!   under a key derived from the PSK and the fresh DH, which only a holder
//!   of the PSK can compute. The client checks it before it sends Auth or
//!   opens a data link, where it checked the old handshake's proof.
//! - **The client proves its key and its ephemeral**: the Hello's tag shows
//!   the PSK but can be replayed; Auth is an HMAC under a key only the two
//!   ends of *this* handshake can derive (it needs an ephemeral private
//!   key), so a replayed Hello (+ Auth) never authenticates a session.
//! - **Forward secrecy**: the session key comes from Noise's final chaining
//!   key, which absorbed the ephemeral-ephemeral DH ([`schedule`]). The
//!   ephemeral private keys live only inside the handshake states, dropped
//!   when the key schedule has run; the long-term key and a recording of
//!   the connection then no longer give the session key
//!   (tests::a_recorded_session_key_cannot_be_recomputed_from_key_and_transcript).
//! - A wrong key and an unknown user name (the daemon's decoy key) both
//!   fail at the same step, reading the Hello ([`ServerHandshake::accept`]).
//!
//! Everything the session key then keys (data link MACs, data and control
//! keys, token sealing, redirects) is HKDF-Expand under its own label
//! ([`keys`]).

use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use snow::HandshakeState;
use subtle::ConstantTimeEq;

use crate::control::{Bytes32, Control, TcpBuffers};
use crate::ProtoError;

pub mod keys;
pub use keys::{
    batch_key, batch_session, derive, join_mac, redirect_mac, rejoin_mac, seal_token_key,
    verify_join, verify_redirect, verify_rejoin,
};

/// The Noise protocol the handshake runs.
pub const NOISE_PARAMS: &str = "Noise_NNpsk0_25519_ChaChaPoly_SHA256";

/// Longest Noise message either end accepts: the Challenge is 32 bytes of
/// ephemeral, an Accept (at most 31 bytes) and a 16-byte tag; the Hello 48.
pub const MAX_NOISE: usize = 128;

/// Longest user name a Hello may carry.
pub const MAX_USER: usize = 256;

/// What the server tells the client inside its Challenge, so covered by
/// the Challenge's authentication: the id the session will have once the
/// client's Auth checks out (data links may join with it at once), and,
/// when the Hello's frame carried [`crate::frame::HELLO_PATH_FLAG`], the
/// server host's TCP buffer limits (issue 21).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accept {
    pub session: u64,
    pub tcp: Option<TcpBuffers>,
}

impl Accept {
    fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("an Accept always encodes")
    }

    fn decode(b: &[u8]) -> Result<Accept, ProtoError> {
        match postcard::take_from_bytes::<Accept>(b) {
            Ok((a, [])) => Ok(a),
            Ok(_) => Err(ProtoError::malformed("challenge", "trailing bytes")),
            Err(e) => Err(ProtoError::malformed("challenge", e.to_string())),
        }
    }
}

/// The Noise PSK for a long-term key of any length (a key file's 64 hex
/// digits, a one-time credential's): HKDF-SHA256 with a salt of its own.
pub fn psk(key: &[u8]) -> Bytes32 {
    let mut out = [0u8; 32];
    Hkdf::<Sha256>::new(Some(b"ramsys v3 psk"), key)
        .expand(b"noise psk0", &mut out)
        .expect("32 bytes is within HKDF-SHA256's output limit");
    out
}

/// What the handshake binds besides the key: protocol version, whether it
/// opens a session or a site link, the user name, and the address a site
/// link announces (every part length-prefixed).
fn prologue(user: &str, site: Option<&str>) -> Vec<u8> {
    let mut p = b"ramsys handshake".to_vec();
    p.extend_from_slice(&crate::VERSION.to_le_bytes());
    let kind: &[u8] = if site.is_some() { b"site" } else { b"session" };
    for part in [kind, user.as_bytes(), site.unwrap_or("").as_bytes()] {
        p.extend_from_slice(&(part.len() as u64).to_le_bytes());
        p.extend_from_slice(part);
    }
    p
}

/// A Noise handshake state; `eph` fixes the ephemeral key (tests only).
fn noise(key: &[u8], prologue: &[u8], initiator: bool, eph: Option<&[u8]>) -> HandshakeState {
    let psk = psk(key);
    let params = NOISE_PARAMS.parse().expect("a valid Noise protocol name");
    let mut b = snow::Builder::new(params)
        .psk(0, &psk)
        .expect("one PSK, in slot 0")
        .prologue(prologue)
        .expect("one prologue");
    if let Some(e) = eph {
        b = b.fixed_ephemeral_key_for_testing_only(e);
    }
    let hs = if initiator {
        b.build_initiator()
    } else {
        b.build_responder()
    };
    hs.expect("snow's default resolver has 25519, ChaChaPoly and SHA256")
}

/// What a finished handshake yields, the same at both ends.
struct Keys {
    session_key: Bytes32,
    /// The Auth message's proof.
    client_proof: Bytes32,
}

/// The key schedule, once the handshake's last message is written or read.
///
/// Noise ends a handshake with Split(): two cipher keys, HKDF of the final
/// chaining key, which has absorbed the PSK and the ephemeral-ephemeral DH
/// (so they are forward-secret, gone with the ephemeral private keys).
/// snow hands that key material out only inside its TransportState ciphers
/// or, behind the `risky-raw-split` feature, as the raw Split() output. We
/// take the raw output and never build a TransportState: ramsys has record
/// layers of its own (sealed control link, DATA AEAD), keyed from the
/// session key, as WireGuard keys its own packets from Noise's Split().
/// Each of the two keys is therefore used once, as HKDF input keying
/// material here, and never as a cipher key, so no key serves two purposes
/// (the hazard the feature's name warns of). The handshake hash, which
/// covers the whole transcript and the prologue, is the HKDF salt, binding
/// the session key to what was said. It is no secret on its own: whoever
/// holds the PSK and a recording recomputes it (tests show it), which is
/// why it cannot stand in for the session key.
fn schedule(hs: &mut HandshakeState) -> Keys {
    let (k1, k2) = hs.dangerously_get_raw_split();
    schedule_from(&k1, &k2, hs.get_handshake_hash())
}

/// [`schedule`] from Split()'s keys and the handshake hash `h`: HKDF with
/// `h` as salt; the session key and the key of the client's proof under
/// labels of their own; the proof is an HMAC of `h` (TLS 1.3's Finished).
fn schedule_from(k1: &[u8; 32], k2: &[u8; 32], h: &[u8]) -> Keys {
    let mut ikm = [0u8; 64];
    ikm[..32].copy_from_slice(k1);
    ikm[32..].copy_from_slice(k2);
    let hk = Hkdf::<Sha256>::new(Some(h), &ikm);
    let expand = |label: &[u8]| {
        let mut out = [0u8; 32];
        hk.expand(label, &mut out)
            .expect("32 bytes is within HKDF-SHA256's output limit");
        out
    };
    let session_key = expand(b"ramsys v3 session key");
    let finished = expand(b"ramsys v3 client finished");
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&finished).expect("any key length");
    m.update(h);
    Keys {
        session_key,
        client_proof: m.finalize().into_bytes().into(),
    }
}

fn noise_failed(e: snow::Error) -> ProtoError {
    ProtoError::malformed("handshake", e.to_string())
}

/// Client side of the handshake.
pub struct ClientHandshake {
    /// Until the Challenge is read: holds our ephemeral private key.
    noise: Option<HandshakeState>,
    user: String,
    /// A site link's announced address (SiteHello).
    site: Option<String>,
    done: Option<(Accept, Keys)>,
}

impl ClientHandshake {
    /// A session's handshake as `user` with `key`.
    pub fn new(key: &[u8], user: &str) -> Self {
        Self::build(key, user, None, None)
    }

    /// A site link's handshake (SiteHello), announcing `addr`.
    pub fn site(key: &[u8], user: &str, addr: &str) -> Self {
        Self::build(key, user, Some(addr), None)
    }

    fn build(key: &[u8], user: &str, site: Option<&str>, eph: Option<&[u8]>) -> Self {
        ClientHandshake {
            noise: Some(noise(key, &prologue(user, site), true, eph)),
            user: user.to_string(),
            site: site.map(str::to_string),
            done: None,
        }
    }

    /// The first message, Hello (SiteHello for a site link); once.
    pub fn hello(&mut self) -> Result<Control, ProtoError> {
        let hs = self
            .noise
            .as_mut()
            .filter(|hs| hs.is_my_turn())
            .ok_or_else(|| ProtoError::malformed("handshake", "Hello already sent"))?;
        let mut buf = [0u8; MAX_NOISE];
        let n = hs.write_message(&[], &mut buf).map_err(noise_failed)?;
        let (user, noise) = (self.user.clone(), buf[..n].to_vec());
        Ok(match &self.site {
            None => Control::Hello { user, noise },
            Some(addr) => Control::SiteHello {
                user,
                addr: addr.clone(),
                noise,
            },
        })
    }

    /// Check the server's Challenge (its proof that it holds the key; any
    /// failure is AuthFailed) and return our Auth.
    pub fn on_challenge(&mut self, msg: &Control) -> Result<Control, ProtoError> {
        let noise = match msg {
            Control::Challenge { noise } => noise,
            Control::Error { .. } => return Err(ProtoError::AuthFailed),
            other => {
                return Err(ProtoError::Unexpected {
                    got: other.name(),
                    state: "awaiting Challenge",
                })
            }
        };
        let mut hs =
            self.noise
                .take()
                .filter(|hs| !hs.is_my_turn())
                .ok_or(ProtoError::Unexpected {
                    got: "Challenge",
                    state: "handshake not awaiting one",
                })?;
        if noise.len() > MAX_NOISE {
            return Err(ProtoError::AuthFailed);
        }
        let mut payload = [0u8; MAX_NOISE];
        let n = hs
            .read_message(noise, &mut payload)
            .map_err(|_| ProtoError::AuthFailed)?;
        if !hs.is_handshake_finished() {
            return Err(ProtoError::AuthFailed);
        }
        let accept = Accept::decode(&payload[..n])?;
        let keys = schedule(&mut hs);
        // `hs` (our ephemeral private key) ends here.
        let auth = Control::Auth {
            proof: keys.client_proof,
        };
        self.done = Some((accept, keys));
        Ok(auth)
    }

    /// What the verified Challenge said.
    pub fn accepted(&self) -> Option<Accept> {
        self.done.as_ref().map(|(a, _)| *a)
    }

    /// Session id and session key, known once the Challenge has been
    /// verified: data links may join before AuthOk arrives.
    pub fn session(&self) -> Option<(u64, Bytes32)> {
        let (a, k) = self.done.as_ref()?;
        Some((a.session, k.session_key))
    }

    /// Handle AuthOk; returns (session id, session key).
    pub fn on_auth_ok(&self, msg: &Control) -> Result<(u64, Bytes32), ProtoError> {
        match (msg, self.session()) {
            (Control::AuthOk { session }, Some((s, k))) if *session == s => Ok((s, k)),
            (Control::Error { .. }, _) => Err(ProtoError::AuthFailed),
            (other, _) => Err(ProtoError::Unexpected {
                got: other.name(),
                state: "awaiting AuthOk",
            }),
        }
    }
}

/// Server side of the handshake.
pub struct ServerHandshake {
    /// Between Hello and Challenge: holds our ephemeral private key.
    noise: Option<HandshakeState>,
    user: String,
    keys: Option<Keys>,
}

impl ServerHandshake {
    /// Read the client's Hello or SiteHello under `key`, the one its user
    /// name selects. AuthFailed when the client does not hold that key: a
    /// wrong key and an unknown name (whose decoy key nobody holds) fail
    /// alike, here. A valid Hello may be a replay: nothing is granted
    /// before [`Self::on_auth`].
    pub fn accept(key: &[u8], hello: &Control) -> Result<Self, ProtoError> {
        Self::accept_with(key, hello, None)
    }

    fn accept_with(key: &[u8], hello: &Control, eph: Option<&[u8]>) -> Result<Self, ProtoError> {
        let (user, site, msg) = match hello {
            Control::Hello { user, noise } => (user, None, noise),
            Control::SiteHello { user, addr, noise } => (user, Some(addr.as_str()), noise),
            other => {
                return Err(ProtoError::Unexpected {
                    got: other.name(),
                    state: "awaiting Hello",
                })
            }
        };
        if user.len() > MAX_USER || site.is_some_and(|a| a.len() > MAX_USER) {
            return Err(ProtoError::malformed(
                "hello",
                "user name or address too long",
            ));
        }
        if msg.len() > MAX_NOISE {
            return Err(ProtoError::AuthFailed);
        }
        let mut hs = noise(key, &prologue(user, site), false, eph);
        let mut payload = [0u8; MAX_NOISE];
        match hs.read_message(msg, &mut payload) {
            Ok(0) => {}
            // Authenticated, but v2 sends nothing here.
            Ok(_) => return Err(ProtoError::malformed("hello", "payload not empty")),
            Err(_) => return Err(ProtoError::AuthFailed),
        }
        Ok(ServerHandshake {
            noise: Some(hs),
            user: user.clone(),
            keys: None,
        })
    }

    /// The Challenge carrying `accept`; once.
    pub fn challenge(&mut self, accept: Accept) -> Result<Control, ProtoError> {
        let mut hs = self
            .noise
            .take()
            .ok_or_else(|| ProtoError::malformed("handshake", "Challenge already sent"))?;
        let mut buf = [0u8; MAX_NOISE];
        let n = hs
            .write_message(&accept.encode(), &mut buf)
            .map_err(noise_failed)?;
        self.keys = Some(schedule(&mut hs));
        Ok(Control::Challenge {
            noise: buf[..n].to_vec(),
        })
    }

    /// Handle Auth; on success returns (user, session key).
    pub fn on_auth(&self, msg: &Control) -> Result<(String, Bytes32), ProtoError> {
        let Some(keys) = &self.keys else {
            return Err(ProtoError::Unexpected {
                got: msg.name(),
                state: "awaiting Hello",
            });
        };
        match msg {
            Control::Auth { proof } if bool::from(proof.ct_eq(&keys.client_proof)) => {
                Ok((self.user.clone(), keys.session_key))
            }
            Control::Auth { .. } => Err(ProtoError::AuthFailed),
            other => Err(ProtoError::Unexpected {
                got: other.name(),
                state: "awaiting Auth",
            }),
        }
    }
}

#[cfg(test)]
mod tests;
