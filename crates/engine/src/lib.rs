//! The ramsys engine: the request-management (RM) and data-access (DAT)
//! layers of RAMSYS (seed 000, sec. 6.1.3 and 6.1.5), driven by the
//! protocol crate (PEP layer) and fed by the resources crate (INI layer).
//!
//! Read top to bottom:
//! - [`transport`]: links (TCP now; raw Ethernet and RDMA later).
//! - [`wire`]: frames on links.
//! - [`session`]: connection handshake, authentication, data-link joins.
//! - [`request`]: a request becomes a walk of the source tree and per-device
//!   queues of read units (tasks grouped by storage, Fig. 6-3).
//! - [`data`]: readers fill buffers, senders drain them; receivers fill,
//!   writers drain; bounded queues and credits between every pair.
//! - [`archive`]: owners, xattrs, ACLs and special files of `-a` copies.
//! - [`daemon`]: the daemon's session list, per-device task queues, task
//!   states, reservation rules, status and metrics.
//! - [`source`] and [`sink`]: one session end each, as a controller thread
//!   with an event loop over control messages and data-thread events.

pub mod daemon;
pub mod data;
pub mod request;
pub mod roles;
pub mod session;
pub mod storage;
pub mod transport;
pub mod types;

pub use data::resources::EngineResources;
pub use session::options::TransferOptions;
pub use session::report::Report;
pub use types::stats::Stats;

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
