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
pub use types::error::{show, EngineError};
pub use types::stats::Stats;
