//! Why a session failed, and how path bytes are shown in messages: every
//! layer returns these, so they sit at the bottom (issue 37; they were in
//! lib.rs, which re-exports them for the binary).

use ramsys_proto::ProtoError;

/// Why a session failed as a whole (per-file failures are in the report).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("protocol error: {0}")]
    Proto(#[from] ProtoError),
    #[error("peer closed the connection")]
    PeerClosed,
    #[error("peer aborted: {0}")]
    PeerAborted(String),
    #[error("refused by peer: {0}")]
    Refused(String),
    #[error("{0}")]
    Local(String),
    /// The peer's connection went away mid-session: an interruption, not a
    /// failure of this end, so the default journal keeps the large temp
    /// files for `--resume` (roles::sink::pipeline teardown).
    #[error("{0}")]
    Lost(String),
    /// The daemon is at its admission limit and sent the session to a peer
    /// of its site (Control::Redirect, docs/SITE.md): the agent opens it
    /// there instead, once. `mac` is checked where the session key is
    /// known (client::redirect_checked) before anyone follows it.
    #[error("redirected to {to}: {reason}")]
    Redirected {
        to: String,
        reason: String,
        mac: ramsys_proto::control::Bytes32,
    },
}

impl EngineError {
    pub fn local(s: impl Into<String>) -> Self {
        EngineError::Local(s.into())
    }
}

/// Lossy display of wire path bytes.
pub fn show(p: &[u8]) -> String {
    String::from_utf8_lossy(p).into_owned()
}
