//! What one session end reports when it is done (issue 37: split from the
//! live counters, types::stats, which the data threads below share; the
//! report names what every layer chose, so it sits above them).

use serde::Serialize;

use crate::storage::StorageUse;
use crate::transport::grow::Growth;
use crate::transport::path::StreamChoice;
use crate::types::sendpath::SendPath;
use crate::types::stats::{FailedPath, LinkDesc};

/// The outcome of a session end.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Files written and verified at the sink.
    pub files: u64,
    /// File bytes moved.
    pub bytes: u64,
    pub failed: Vec<FailedPath>,
    /// CPU seconds of the peer process during the session, if reported.
    pub peer_cpu_s: Option<f64>,
    /// Streams and block size agreed.
    pub streams: u16,
    pub block_size: u32,
    /// The data links (local, peer, kind), for the summary and --explain.
    pub links: Vec<LinkDesc>,
    /// Sync: files the sink already had (nothing sent).
    pub unchanged: u64,
    /// Sync: sink entries removed (--delete), or that would be.
    pub deleted: Vec<String>,
    /// Dry run: files that would be sent.
    pub planned: Vec<String>,
    /// The source could not list or read all it was asked for (an error
    /// but a vanished path): sync's --delete deleted nothing (rsync's
    /// IOERR_GENERAL). Set by the end that builds the report.
    pub source_incomplete: bool,
    /// Where this end was the source: the send path it took (seed 002
    /// sec. 7) and the blocks it passed through the filled queue.
    pub send_path: Option<SendPath>,
    pub handoffs: u64,
    /// Where this end was the source: blocks it sent zero-copy
    /// (storage::zerocopy).
    pub zerocopy_blocks: u64,
    /// This end's O_DIRECT policy at work (storage::cache, issue 17).
    pub storage: Option<StorageUse>,
    /// The agent sized the stream count from the path (issue 21).
    pub stream_choice: Option<StreamChoice>,
    /// Streams added during the transfer (transport::grow): the source's
    /// own, or on a pull's sink what the daemon's source reported.
    pub growth: Option<Growth>,
    /// A session of pieces of big files (a striped push, issue 36): the
    /// record paths of those the sink found in place at its end (its
    /// Placed); None where the sink sent none (a sink of before, or no
    /// piece asked for it).
    #[serde(skip)]
    pub placed: Option<Vec<Vec<u8>>>,
}
