//! Third-party transfers: the request (Relay), a pair's share of a striped one
//! (Share), its outcome (RelayReport) and what its sink placed of the big
//! files in pieces (RelayPlaced).

use serde::{Deserialize, Serialize};

use super::{Failure, Selection, MAX_PLACED};
use crate::ProtoError;

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

/// What a relay's push said of the big files its share held pieces of
/// (RelayPlaced, issue 36; docs/PROTOCOL.md "Third-party transfers"):
/// sent right before RelayDone, only to an agent that asked (PLACED_FLAG
/// on its RelayOpen frame), so the agent can fail a striped transfer
/// between two sites whose file no sink placed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayPlaced {
    /// The record paths of the big files this pair's share held pieces
    /// of (the Piece records it sent).
    pub cut: Vec<Vec<u8>>,
    /// Of those, the ones the sink named in its Placed; None: the sink
    /// sent no Placed (a sink of before).
    pub placed: Option<Vec<Vec<u8>>>,
}

impl RelayPlaced {
    /// At most [`MAX_PLACED`] paths in each list (a share holds pieces of
    /// 16 files at most, as for Placed), each a valid relative path, and
    /// `placed` only names files of `cut`. Anything else: malformed.
    pub fn check(&self) -> Result<(), ProtoError> {
        let placed = self.placed.as_deref().unwrap_or_default();
        if self.cut.len() > MAX_PLACED || placed.len() > MAX_PLACED {
            return Err(ProtoError::malformed("relay placed", "too many paths"));
        }
        for p in self.cut.iter().chain(placed) {
            crate::path::validate_relative(p)?;
        }
        if placed.iter().any(|p| !self.cut.contains(p)) {
            return Err(ProtoError::malformed(
                "relay placed",
                "a placed file that was not cut into pieces",
            ));
        }
        Ok(())
    }
}
