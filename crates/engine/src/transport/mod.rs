//! The transport interface. Sessions see only [`Link`]s, so TCP can later
//! be joined by raw-Ethernet channels (seed 002) or RDMA (seed 004) without
//! touching the data path.

pub mod channels;
pub mod clock;
pub mod crypto;
pub mod grow;
pub mod mem;
pub mod path;
pub mod raw;
pub mod rawlink;
pub mod sealed;
pub mod tcp;
pub mod wire;

use std::fs::File;
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
    /// What carries the stream, for the summary (issue 35): "tcp", "raw"
    /// (a raw-Ethernet channel), "ssh" (tunnelled through ssh), "mem" (an
    /// in-memory link of one process, transport::mem).
    fn kind(&self) -> &'static str {
        "tcp"
    }
    /// Idle timeout for reads (None = block forever).
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()>;
    /// The clock its read timeouts run on (a simulated one in tests,
    /// transport::mem); lost-link recovery measures its budget with it.
    fn clock(&self) -> clock::Clock {
        clock::Clock::default()
    }
    /// Whether the peer has closed or reset the stream, checked without
    /// consuming or waiting for input (false when unknown).
    fn peer_gone(&self) -> bool {
        false
    }
    /// The transport's current round-trip estimate (TCP: the kernel's
    /// smoothed RTT), None when it has none. Choices that depend on the
    /// path's length (the send path, crate::daemon::config::SendPath) read it.
    fn rtt(&self) -> Option<Duration> {
        None
    }
    /// The transport's recent delivery rate, bytes/s (TCP: TCP_INFO's
    /// delivery_rate, sender side), None when it has none. The stream
    /// count's adaptation reports it per link (transport::grow).
    fn delivery_rate(&self) -> Option<u64> {
        None
    }
    /// Bytes the peer has acknowledged on this link so far (TCP_INFO's
    /// bytes_acked), None when the transport does not say.
    fn bytes_acked(&self) -> Option<u64> {
        None
    }
    /// Time this link had data in flight so far, microseconds (TCP_INFO's
    /// busy_time: not counting the time the sender had nothing to send),
    /// None when the transport does not say. Busy links are limited by
    /// the path (or its windows), idle ones by the ends (transport::grow).
    fn busy_us(&self) -> Option<u64> {
        None
    }
    /// The transport's smoothed round trip now (TCP_INFO's rtt), None
    /// when it has none; above [`Link::rtt`] (the minimum) by the time
    /// its packets wait in queues on the path.
    fn srtt(&self) -> Option<Duration> {
        None
    }
    /// Whether [`Link::send_file`] works on this link (asked once per
    /// link, not per block). Only plain TCP: raw-Ethernet channels, ssh
    /// tunnels and sealed links need the payload in memory.
    fn can_send_file(&self) -> bool {
        false
    }
    /// Zero-copy send (storage::zerocopy, issue 17): write the `head`
    /// slices, then `len` bytes of `file` from offset `off` straight from
    /// the page cache (sendfile(2)), as one stream of bytes with no copy
    /// in user space. Returns the file bytes sent: fewer than `len` only
    /// if the file ended first (the caller completes the frame).
    fn send_file(
        &mut self,
        head: &[&[u8]],
        file: &File,
        off: u64,
        len: usize,
    ) -> io::Result<usize> {
        let _ = (head, file, off, len);
        Err(io::ErrorKind::Unsupported.into())
    }
}

/// Something that can open links to an address.
pub trait Transport: Send + Sync {
    fn connect(&self, addr: &str, timeout: Duration) -> io::Result<Box<dyn Link>>;
    fn name(&self) -> &'static str;
    /// The clock of its links (see [`Link::clock`]).
    fn clock(&self) -> clock::Clock {
        clock::Clock::default()
    }
    /// A different transport for the session's data links (raw channels
    /// while the control link stays TCP, rawlink::Split); None: this one.
    fn data_links(&self) -> Option<std::sync::Arc<dyn Transport>> {
        None
    }
}

/// Placeholder left behind when a link is handed elsewhere (server.rs),
/// or holding the place of one still to come (a stream added mid-transfer).
pub struct ClosedLink;

impl std::io::Read for ClosedLink {
    fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
        Ok(0)
    }
}
impl std::io::Write for ClosedLink {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::ErrorKind::NotConnected.into())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
/// A link as the report shows it.
pub fn describe(l: &dyn Link) -> crate::types::stats::LinkDesc {
    crate::types::stats::LinkDesc {
        local: l.local(),
        peer: l.peer(),
        kind: l.kind(),
    }
}

impl Link for ClosedLink {
    fn try_clone_link(&self) -> std::io::Result<Box<dyn Link>> {
        Ok(Box::new(ClosedLink))
    }
    fn shutdown_both(&self) {}
    fn peer(&self) -> String {
        "closed".into()
    }
    fn local(&self) -> String {
        "closed".into()
    }
    fn kind(&self) -> &'static str {
        "closed"
    }
    fn set_read_timeout(&self, _: Option<Duration>) -> std::io::Result<()> {
        Ok(())
    }
}
