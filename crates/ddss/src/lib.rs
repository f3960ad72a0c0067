//! DDSS, the distributed data sharing substrate of seed 003 (Vaidyanathan,
//! ch. 2): soft shared state between the daemons of a site. Segments live
//! on a home node, carry a 64-bit version and a lock word, and are read
//! and written under one of the six coherence models plus version-based
//! (docs/SITE.md).
//!
//! Sans-I/O core in the manner of quinn-proto: [`store`] (the home's
//! side) and [`cache`] (the requester's) take messages and a clock and
//! return messages, and are tested without sockets. [`net`] runs them over
//! any authenticated byte stream and [`node`] routes the API to homes.

pub mod alloc;
pub mod cache;
pub mod lock;
pub mod model;
pub mod msg;
pub mod net;
pub mod node;
pub mod store;

pub use cache::Value;
pub use lock::Holder;
pub use model::Model;
pub use msg::Error;
pub use node::{Dialer, Key, Node, Placement};
