//! Third-party transfers: the request (Relay), a pair's share of a striped one
//! (Share) and its outcome (RelayReport).

use serde::{Deserialize, Serialize};

use super::{Failure, Selection};

/// A third-party transfer request (RelayOpen).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Relay {
    /// The sink daemon (`HOST:PORT`), a member of this daemon's site.
    pub sink: String,
    /// Source paths under the user's root here; a trailing '/' names a
    /// directory's contents (as in Open).
    pub paths: Vec<Vec<u8>>,
    /// The destination path under the user's root at the sink.
    pub dest: Vec<u8>,
    pub recursive: bool,
    /// Streams (0: the relaying daemon sizes them from the path to the
    /// sink), block size and checksums, as in Open.
    pub streams: u16,
    pub block_size: u32,
    pub checksum: bool,
    /// Sync and resume bits ([`sync`](super::sync)), 0 = copy.
    pub flags: u32,
    /// What the relaying daemon's scan sends (as in SelectOpen).
    pub select: Selection,
    /// Archive bits ([`crate::attrs::preserve`]), as in ArchiveOpen.
    pub preserve: u32,
    /// `--bwlimit`, bytes/s for the push to the sink (0: none).
    pub bwlimit: u64,
    /// DATA block cipher asked for on the link to the sink (ids as in
    /// Propose).
    pub cipher: u8,
    /// Striping (`--stripe`): send only this pair's share of the files.
    pub share: Option<Share>,
}

/// One pair's share of a striped third-party transfer: the relaying
/// daemon lists the sources and deals the files over `weights.len()`
/// pairs exactly as every other pair's daemon does (largest first, to
/// the share that would finish first, bytes / weight), and sends share
/// `index`. `weights` in thousandths (0 counts as 1). `pieces`: cut big
/// files into pieces that are multiples of this many bytes (the engine's
/// request::shares::piece_size; 0 = deal whole files), the same value for
/// every pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    pub index: u16,
    pub weights: Vec<u32>,
    pub pieces: u32,
}

/// A relay's outcome (RelayDone).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RelayReport {
    pub files: u64,
    pub bytes: u64,
    /// Sync: files the sink already had.
    pub unchanged: u64,
    pub streams: u16,
    pub block_size: u32,
    /// Paths that failed (the session went on without them).
    pub failures: Vec<Failure>,
    /// CPU seconds of the sink's process during the session (< 0: not
    /// reported).
    pub sink_cpu_s: f64,
    /// With a Share: the files and bytes of this pair's share, and a
    /// digest (xxh3-64) of the whole listing the share was dealt from, so
    /// the client can tell whether every pair saw the same tree.
    pub share_files: u64,
    pub share_bytes: u64,
    pub listing: u64,
    /// Empty: done (see `failures`); else why the relay failed, one line.
    pub error: String,
}
