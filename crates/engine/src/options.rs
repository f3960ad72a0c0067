//! Per-transfer options, set by the agent's flags.

use std::time::Duration;

/// What the user asked for; both ends read the parts that concern them.
#[derive(Debug, Clone)]
pub struct TransferOptions {
    /// Data streams (parallel links).
    pub streams: u16,
    /// Block size, bytes: the unit of disk access and network transfer.
    pub block_size: u32,
    /// Per-block checksums and whole-file digests.
    pub checksum: bool,
    /// Copy directories (cp -r).
    pub recursive: bool,
    /// Reader threads per storage device on the source.
    pub readers: usize,
    /// Writer threads per storage device on the sink.
    pub writers: usize,
    /// Credits (blocks in flight) per stream the sink grants at most.
    pub window: u32,
    /// Give up on a peer that sends nothing for this long.
    pub idle_timeout: Duration,
    /// fsync each file before it is renamed into place.
    pub fsync: bool,
}

impl Default for TransferOptions {
    fn default() -> Self {
        TransferOptions {
            streams: 4,
            block_size: 4 << 20,
            checksum: true,
            recursive: false,
            readers: 4,
            writers: 4,
            window: 8,
            idle_timeout: Duration::from_secs(60),
            fsync: false,
        }
    }
}
