//! The ramsys wire protocol, without any I/O (in the style of quinn-proto).
//!
//! This crate is the *protocol and event processing* (PEP) layer of RAMSYS
//! (seed 000, sec. 6.1.4): it knows how every frame and message is encoded,
//! how a connection authenticates, and in which order the messages of a
//! session may appear. It never touches a socket; the engine feeds it bytes
//! and messages and acts on what it returns, so every rule here is tested
//! without a network.
//!
//! Layout:
//! - [`frame`]: the 8-byte frame header shared by every connection.
//! - [`control`]: control messages (handshake, negotiation, metadata,
//!   completion), encoded with postcard.
//! - [`attrs`]: archive attributes (owners, xattrs, ACLs, specials).
//! - [`data`]: payload blocks (segment table + checksum) and credits.
//! - [`auth`]: the Noise NNpsk0 handshake with a shared key, and the
//!   HKDF key schedule of everything the session key keys.
//! - [`path`]: validation of relative paths received from a peer.
//! - [`session`]: state machines for the source and sink ends of a session.
//! - [`relink`]: lost data links: what to send again, credits, back-off.
//! - [`text`]: names from a peer made safe to print (control characters).

pub mod attrs;
pub mod auth;
pub mod control;
pub mod data;
pub mod frame;
pub mod path;
pub mod relink;
pub mod session;
pub mod text;

pub use control::Control;
pub use frame::{FrameHeader, FrameKind};

/// Protocol version spoken by this build. Bumped on any incompatible change
/// (docs/PROTOCOL.md "Versions"): 2 = Selection rules are rsync filter
/// rules in its short text form, matched as rsync's wildmatch (issue 35);
/// 3 = the Noise handshake with forward secrecy (issue 34; until 2 the
/// PSK-only challenge/response).
pub const VERSION: u16 = 3;

/// Bytes every connection starts with, in both directions: magic + version.
pub const PREAMBLE_MAGIC: [u8; 6] = *b"RAMSYS";
/// Length of the preamble on the wire.
pub const PREAMBLE_LEN: usize = 8;

/// Encode the preamble for `version`.
pub fn preamble(version: u16) -> [u8; PREAMBLE_LEN] {
    let mut p = [0u8; PREAMBLE_LEN];
    p[..6].copy_from_slice(&PREAMBLE_MAGIC);
    p[6..].copy_from_slice(&version.to_le_bytes());
    p
}

/// Parse a peer's preamble; returns its version.
pub fn parse_preamble(p: &[u8; PREAMBLE_LEN]) -> Result<u16, ProtoError> {
    if p[..6] != PREAMBLE_MAGIC {
        return Err(ProtoError::BadMagic);
    }
    Ok(u16::from_le_bytes([p[6], p[7]]))
}

/// Everything that can be wrong with bytes or messages from a peer.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone)]
pub enum ProtoError {
    #[error("peer does not speak the ramsys protocol (bad magic)")]
    BadMagic,
    #[error("protocol version mismatch: we speak {ours}, peer speaks {theirs} (upgrade the older ramsys)")]
    VersionMismatch { ours: u16, theirs: u16 },
    #[error("unknown frame type {0}")]
    UnknownFrame(u8),
    #[error("frame of {len} bytes exceeds the limit of {limit}")]
    FrameTooLarge { len: u64, limit: u64 },
    #[error("malformed {what}: {detail}")]
    Malformed { what: &'static str, detail: String },
    #[error("unexpected message {got} in state {state}")]
    Unexpected {
        got: &'static str,
        state: &'static str,
    },
    #[error("bad path from peer: {0}")]
    BadPath(String),
    #[error("authentication failed")]
    AuthFailed,
    #[error("credit protocol violated: {0}")]
    Credit(String),
}

impl ProtoError {
    pub(crate) fn malformed(what: &'static str, detail: impl Into<String>) -> Self {
        ProtoError::Malformed {
            what,
            detail: detail.into(),
        }
    }
}
