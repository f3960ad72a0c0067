//! The roles: who drives a transfer. The agent-facing [`client`] and the
//! daemon-facing [`server`] open sessions; each session has a [`source`]
//! end and a [`sink`] end (seed 000, sec. 6.1.4: the data source and data
//! sink of the negotiation protocol).

pub mod client;
pub mod server;
pub mod sink;
pub mod source;
