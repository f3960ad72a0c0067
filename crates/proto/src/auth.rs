//! Challenge/response authentication with a pre-shared key.
//!
//! Both ends contribute a fresh 256-bit nonce; each proves knowledge of
//! the key with an HMAC-SHA256 over both nonces and the user name, under a
//! role-specific label so one side's proof can never be replayed as the
//! other's. The key itself never crosses the wire. Both ends derive a
//! session key from the same nonces; data links prove membership of the
//! session with it (see [`join_mac`]).

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::control::{Bytes32, Control};
use crate::ProtoError;

type HmacSha256 = Hmac<Sha256>;

fn mac(key: &[u8], parts: &[&[u8]]) -> Bytes32 {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC accepts any key length");
    for p in parts {
        // Length-prefix every part so concatenations cannot collide.
        m.update(&(p.len() as u64).to_le_bytes());
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

fn verify(key: &[u8], parts: &[&[u8]], tag: &Bytes32) -> bool {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC accepts any key length");
    for p in parts {
        m.update(&(p.len() as u64).to_le_bytes());
        m.update(p);
    }
    m.verify_slice(tag).is_ok()
}

fn server_proof(key: &[u8], cn: &Bytes32, sn: &Bytes32, user: &str) -> Bytes32 {
    mac(key, &[b"ramsys-v1 server", cn, sn, user.as_bytes()])
}

fn client_parts<'a>(cn: &'a Bytes32, sn: &'a Bytes32, user: &'a str) -> [&'a [u8]; 4] {
    [b"ramsys-v1 client", cn, sn, user.as_bytes()]
}

fn session_key(key: &[u8], cn: &Bytes32, sn: &Bytes32) -> Bytes32 {
    mac(key, &[b"ramsys-v1 session", cn, sn])
}

/// MAC a data link presents to join a session as `stream`.
pub fn join_mac(session_key: &Bytes32, session: u64, stream: u16, nonce: &Bytes32) -> Bytes32 {
    mac(
        session_key,
        &[
            b"ramsys-v1 join",
            &session.to_le_bytes(),
            &stream.to_le_bytes(),
            nonce,
        ],
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
    verify(
        session_key,
        &[
            b"ramsys-v1 join",
            &session.to_le_bytes(),
            &stream.to_le_bytes(),
            nonce,
        ],
        tag,
    )
}

/// Seal (or unseal: the operation is its own inverse) a one-time
/// credential's key for the Token message: XOR with a pad derived from the
/// session key and the credential's user name. Each minted name is fresh,
/// so no pad is ever used twice, and only the two ends of the session
/// (which hold the session key) can read the key.
pub fn seal_token_key(session_key: &Bytes32, user: &str, key: &Bytes32) -> Bytes32 {
    let pad = mac(session_key, &[b"ramsys-v1 token", user.as_bytes()]);
    std::array::from_fn(|i| key[i] ^ pad[i])
}

/// MAC a server puts on its Redirect (issue 34): the client follows only
/// a redirect its own daemon sent, whatever the path did to the link.
pub fn redirect_mac(session_key: &Bytes32, addr: &str, reason: &str) -> Bytes32 {
    mac(
        session_key,
        &[b"ramsys-v1 redirect", addr.as_bytes(), reason.as_bytes()],
    )
}

/// Check a Redirect's MAC in constant time.
pub fn verify_redirect(session_key: &Bytes32, addr: &str, reason: &str, tag: &Bytes32) -> bool {
    verify(
        session_key,
        &[b"ramsys-v1 redirect", addr.as_bytes(), reason.as_bytes()],
        tag,
    )
}

fn rejoin_parts<'a>(
    session: &'a [u8; 8],
    stream: &'a [u8; 2],
    epoch: &'a [u8; 2],
    nonce: &'a Bytes32,
) -> [&'a [u8]; 5] {
    [b"ramsys-v1 rejoin", session, stream, epoch, nonce]
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
    let (s, st, e) = (
        session.to_le_bytes(),
        stream.to_le_bytes(),
        epoch.to_le_bytes(),
    );
    mac(session_key, &rejoin_parts(&s, &st, &e, nonce))
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
    let (s, st, e) = (
        session.to_le_bytes(),
        stream.to_le_bytes(),
        epoch.to_le_bytes(),
    );
    verify(session_key, &rejoin_parts(&s, &st, &e, nonce), tag)
}

/// Client side of the handshake.
pub struct ClientHandshake {
    key: Vec<u8>,
    user: String,
    nonce: Bytes32,
    server_nonce: Option<Bytes32>,
    session: Option<u64>,
}

impl ClientHandshake {
    /// `nonce` must come from a CSPRNG.
    pub fn new(key: &[u8], user: &str, nonce: Bytes32) -> Self {
        ClientHandshake {
            key: key.to_vec(),
            user: user.to_string(),
            nonce,
            server_nonce: None,
            session: None,
        }
    }

    /// Session id and session key, known once the Challenge has been
    /// verified: data links may join before AuthOk arrives.
    pub fn session(&self) -> Option<(u64, Bytes32)> {
        Some((
            self.session?,
            session_key(&self.key, &self.nonce, self.server_nonce.as_ref()?),
        ))
    }

    pub fn hello(&self) -> Control {
        Control::Hello {
            nonce: self.nonce,
            user: self.user.clone(),
        }
    }

    /// Handle the server's Challenge (or ChallengeTcp, which adds the
    /// server's TCP limits): verify its proof, return our Auth.
    pub fn on_challenge(&mut self, msg: &Control) -> Result<Control, ProtoError> {
        match msg {
            Control::Challenge {
                nonce,
                proof,
                session,
            }
            | Control::ChallengeTcp {
                nonce,
                proof,
                session,
                ..
            } => {
                let expect = server_proof(&self.key, &self.nonce, nonce, &self.user);
                if !bool::from(subtle::ConstantTimeEq::ct_eq(&expect[..], &proof[..])) {
                    return Err(ProtoError::AuthFailed);
                }
                self.server_nonce = Some(*nonce);
                self.session = Some(*session);
                Ok(Control::Auth {
                    proof: mac(&self.key, &client_parts(&self.nonce, nonce, &self.user)),
                })
            }
            Control::Error { .. } => Err(ProtoError::AuthFailed),
            other => Err(ProtoError::Unexpected {
                got: other.name(),
                state: "awaiting Challenge",
            }),
        }
    }

    /// Handle AuthOk; returns (session id, session key).
    pub fn on_auth_ok(&self, msg: &Control) -> Result<(u64, Bytes32), ProtoError> {
        match (msg, &self.server_nonce) {
            (Control::AuthOk { session }, Some(sn)) if Some(*session) == self.session => {
                Ok((*session, session_key(&self.key, &self.nonce, sn)))
            }
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
    key: Vec<u8>,
    nonce: Bytes32,
    client: Option<(Bytes32, String)>,
}

impl ServerHandshake {
    pub fn new(key: &[u8], nonce: Bytes32) -> Self {
        ServerHandshake {
            key: key.to_vec(),
            nonce,
            client: None,
        }
    }

    /// Handle Hello; returns the Challenge to send, announcing `session`.
    pub fn on_hello(&mut self, msg: &Control, session: u64) -> Result<Control, ProtoError> {
        match msg {
            Control::Hello { nonce, user } => {
                if user.len() > 256 {
                    return Err(ProtoError::malformed("hello", "user name too long"));
                }
                let proof = server_proof(&self.key, nonce, &self.nonce, user);
                self.client = Some((*nonce, user.clone()));
                Ok(Control::Challenge {
                    nonce: self.nonce,
                    proof,
                    session,
                })
            }
            other => Err(ProtoError::Unexpected {
                got: other.name(),
                state: "awaiting Hello",
            }),
        }
    }

    /// [`Self::on_hello`] for a client that asked for the path figures
    /// (frame::HELLO_PATH_FLAG): the Challenge as ChallengeTcp with `tcp`.
    pub fn on_hello_tcp(
        &mut self,
        msg: &Control,
        session: u64,
        tcp: crate::control::TcpBuffers,
    ) -> Result<Control, ProtoError> {
        match self.on_hello(msg, session)? {
            Control::Challenge {
                nonce,
                proof,
                session,
            } => Ok(Control::ChallengeTcp {
                nonce,
                proof,
                session,
                tcp,
            }),
            other => Ok(other),
        }
    }

    /// Handle Auth; on success returns (user, session key).
    pub fn on_auth(&self, msg: &Control) -> Result<(String, Bytes32), ProtoError> {
        let Some((cn, user)) = &self.client else {
            return Err(ProtoError::Unexpected {
                got: msg.name(),
                state: "awaiting Hello",
            });
        };
        match msg {
            Control::Auth { proof } => {
                if verify(&self.key, &client_parts(cn, &self.nonce, user), proof) {
                    Ok((user.clone(), session_key(&self.key, cn, &self.nonce)))
                } else {
                    Err(ProtoError::AuthFailed)
                }
            }
            other => Err(ProtoError::Unexpected {
                got: other.name(),
                state: "awaiting Auth",
            }),
        }
    }
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

    fn run(ckey: &[u8], skey: &[u8]) -> Result<(Bytes32, Bytes32), ProtoError> {
        let mut c = ClientHandshake::new(ckey, "u", [1; 32]);
        let mut s = ServerHandshake::new(skey, [2; 32]);
        let ch = s.on_hello(&c.hello(), 1)?;
        let auth = c.on_challenge(&ch)?;
        let (_, sk_s) = s.on_auth(&auth)?;
        let (_, sk_c) = c.on_auth_ok(&Control::AuthOk { session: 1 })?;
        Ok((sk_c, sk_s))
    }

    #[test]
    fn a_challenge_with_the_servers_limits_authenticates_the_same() {
        let tcp = crate::control::TcpBuffers {
            wmem_max: 1,
            rmem_max: 2,
        };
        let mut c = ClientHandshake::new(b"k", "u", [1; 32]);
        let mut s = ServerHandshake::new(b"k", [2; 32]);
        let ch = s.on_hello_tcp(&c.hello(), 7, tcp).unwrap();
        assert!(matches!(ch, Control::ChallengeTcp { tcp: t, session: 7, .. } if t == tcp));
        let auth = c.on_challenge(&ch).unwrap();
        let (_, sk_s) = s.on_auth(&auth).unwrap();
        let (_, sk_c) = c.on_auth_ok(&Control::AuthOk { session: 7 }).unwrap();
        assert_eq!(sk_c, sk_s);
        // A wrong key fails as with Challenge.
        let mut c = ClientHandshake::new(b"other", "u", [1; 32]);
        assert_eq!(c.on_challenge(&ch), Err(ProtoError::AuthFailed));
    }

    #[test]
    fn same_key_agrees_on_session_key() {
        let (a, b) = run(b"k1", b"k1").unwrap();
        assert_eq!(a, b);
        let m = join_mac(&a, 1, 2, &[3; 32]);
        assert!(verify_join(&b, 1, 2, &[3; 32], &m));
        assert!(!verify_join(&b, 1, 3, &[3; 32], &m));
    }

    #[test]
    fn wrong_key_fails_both_ways() {
        // The client detects a server without the key before proving itself.
        assert_eq!(run(b"k1", b"k2"), Err(ProtoError::AuthFailed));
        // A client without the key is refused by the server.
        let mut s = ServerHandshake::new(b"right", [2; 32]);
        let _ = s.on_hello(
            &Control::Hello {
                nonce: [1; 32],
                user: "u".into(),
            },
            1,
        );
        assert_eq!(
            s.on_auth(&Control::Auth { proof: [0; 32] }),
            Err(ProtoError::AuthFailed)
        );
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
    fn server_proof_is_not_a_client_proof() {
        let mut s = ServerHandshake::new(b"k", [2; 32]);
        let ch = s
            .on_hello(
                &Control::Hello {
                    nonce: [1; 32],
                    user: "u".into(),
                },
                1,
            )
            .unwrap();
        let Control::Challenge { proof, .. } = ch else {
            panic!()
        };
        // Reflecting the server's own proof back must not authenticate.
        assert_eq!(
            s.on_auth(&Control::Auth { proof }),
            Err(ProtoError::AuthFailed)
        );
    }
}
