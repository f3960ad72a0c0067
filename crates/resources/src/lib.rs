//! Initialization (INI) layer of RAMSYS (seed 000, sec. 6.1.2): everything
//! the data path needs is allocated once, before any transfer starts.
//!
//! - [`buffers`]: one bounded, pre-allocated pool of page-aligned buffers;
//!   sessions borrow a share and recycle it. Nothing is allocated per block.
//! - [`threads`]: pre-spawned, optionally pinned I/O thread pools (readers,
//!   writers, senders, receivers) that sessions reserve and return.
//! - [`keys`]: the shared key used to authenticate every connection.

pub mod buffers;
pub mod keys;
pub mod threads;

pub use buffers::{Buf, BufferPool, FileRange, Memory, MAX_FILE_RANGES};
pub use threads::{JobHandle, Reservation, ThreadPool};
