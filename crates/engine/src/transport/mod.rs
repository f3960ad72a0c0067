//! The transport interface. Sessions see only [`Link`]s, so TCP can later
//! be joined by raw-Ethernet channels (seed 002) or RDMA (seed 004) without
//! touching the data path.

pub mod channels;
pub mod path;
pub mod raw;
pub mod rawlink;
pub mod sealed;
pub mod tcp;

use std::io::{self, Read, Write};
use std::time::Duration;

/// One bidirectional, reliable, ordered byte stream.
pub trait Link: Read + Write + Send {
    /// A second handle to the same stream (one thread reads while another
    /// writes, e.g. a receiver and the writer returning credits).
    fn try_clone_link(&self) -> io::Result<Box<dyn Link>>;
    /// Unblock and fail every pending and future read and write (abort).
    fn shutdown_both(&self);
    /// Half-close: the peer reads everything sent so far, then end of
    /// stream (so a final Error message is not lost to a reset).
    fn shutdown_write(&self) {}
    /// Peer description for logs and --explain.
    fn peer(&self) -> String;
    /// Local address description (which NIC the stream uses).
    fn local(&self) -> String;
    /// Idle timeout for reads (None = block forever).
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()>;
    /// Whether the peer has closed or reset the stream, checked without
    /// consuming or waiting for input (false when unknown).
    fn peer_gone(&self) -> bool {
        false
    }
    /// The transport's current round-trip estimate (TCP: the kernel's
    /// smoothed RTT), None when it has none. Choices that depend on the
    /// path's length (the send path, crate::config::SendPath) read it.
    fn rtt(&self) -> Option<Duration> {
        None
    }
}

/// Something that can open links to an address.
pub trait Transport: Send + Sync {
    fn connect(&self, addr: &str, timeout: Duration) -> io::Result<Box<dyn Link>>;
    fn name(&self) -> &'static str;
    /// A different transport for the session's data links (raw channels
    /// while the control link stays TCP, rawlink::Split); None: this one.
    fn data_links(&self) -> Option<std::sync::Arc<dyn Transport>> {
        None
    }
}
