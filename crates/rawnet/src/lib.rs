//! Raw-Ethernet channels (seed 002, Tyche; issue 18): data links carried
//! in frames of their own EtherType between hosts of one L2 segment.
//!
//! - [`frame`]: the wire format (encode, decode, check);
//! - [`endpoint`]: the per-channel reliability state machine, sans I/O;
//! - [`fault`]: the fault hook (loss, duplication, reordering, corruption);
//! - [`filter`]: classic BPF filters (a channel's frames, a listener's OPENs);
//! - [`socket`]: AF_PACKET sockets (recvmmsg/sendmmsg batches);
//! - [`channel`]: a channel as a blocking byte stream with its I/O thread;
//! - [`open`]: channel setup (OPEN / OPEN-OK) between two MACs;
//! - [`offload`]: the copy thread for large slot copies (seed 003's MCNI);
//! - [`netns`]: network namespaces and veth pairs for tests and benches.

pub mod channel;
pub mod endpoint;
pub mod fault;
pub mod filter;
pub mod frame;
pub mod netns;
pub mod offload;
pub mod open;
pub mod socket;

pub use channel::Channel;
pub use endpoint::{Config, Endpoint, Failure, ReadOutcome, Stats};
pub use fault::{FaultRates, Faults};
pub use socket::PacketSocket;
