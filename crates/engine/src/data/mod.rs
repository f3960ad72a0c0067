//! Data access and transmission (DAT) layer (seed 000, sec. 6.1.5; RFTP's
//! load/transmit/offload pipeline, seed 004 sec. 3.2).
//!
//! ```text
//! source:  readers --filled (bounded)--> senders --link-->   (queued)
//! source:  readers --(free link from inline::InlineLinks)--> (inline)
//! sink:    --link--> receivers --received (bounded)--> writers
//!                       ^                                 |
//!                       +------ credits per stream -------+
//! ```
//! Buffers move by value between stages and return to their pool after
//! the last stage; the sink returns a credit only after the buffer is
//! free again, so the source can never have more in flight than the sink
//! can hold, however slow the sink's disk. The two source variants are
//! the send paths of seed 002 sec. 7 (`--send-path`); both send through
//! sender::StreamOut.

pub mod inline;
pub mod queue;
pub mod rate;
pub mod reader;
pub mod receiver;
pub mod reread;
pub mod resources;
pub mod sender;
