//! Raw-Ethernet channels (seed 002, Tyche; issue 18): data links carried
//! in frames of their own EtherType between hosts of one L2 segment.
//!
//! - [`frame`]: the wire format (encode, decode, check);
//! - [`endpoint`]: the per-channel reliability state machine, sans I/O;
//! - [`fault`]: the fault hook (loss, duplication, reordering, corruption).

pub mod endpoint;
pub mod fault;
pub mod frame;

pub use endpoint::{Config, Endpoint, Failure, ReadOutcome, Stats};
pub use fault::{FaultRates, Faults};
