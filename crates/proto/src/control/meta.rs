//! Metadata records (Entry, EntryKind and its pieces) and the end of a session
//! (Failure, Complete): what a source announces and what the sink reports back.

use serde::{Deserialize, Serialize};

/// What a metadata record describes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    Dir,
    File {
        size: u64,
    },
    Symlink {
        target: Vec<u8>,
    },
    /// A further name for the file with id `target_id` (same inode).
    HardLink {
        target_id: u64,
    },
    /// A FIFO, socket or device node (`--specials`, `--devices`): `kind`
    /// from [`crate::attrs::special`], `rdev` the device number of a
    /// device (0 otherwise). Sent only when the client asked for it.
    Special {
        kind: u8,
        rdev: u64,
    },
    /// One piece of a large regular file striped across daemons (issue 19,
    /// docs/SITE.md "A big file's blocks"): bytes `index * piece ..
    /// min((index + 1) * piece, size)` of a file of `size` bytes, written
    /// into a temp file shared by every sink of the stripe and renamed
    /// into place by whichever sink completes the last piece.
    Piece {
        size: u64,
        piece: u64,
        index: u32,
    },
    /// A further name for the file with id `target_id`, whose own path is
    /// `target` (relative, as an Entry's path): sent instead of HardLink
    /// in a windowed session (issue 36), where the sink may have dropped
    /// the target's slot by the time the second name is found.
    LinkTo {
        target_id: u64,
        target: Vec<u8>,
    },
}

/// Most pieces one file may be cut into (each leaves a marker file at the
/// sink until the file is complete).
pub const MAX_PIECES: u64 = 4096;

impl EntryKind {
    /// A piece's byte range (offset, length), checked: `piece` > 0, the
    /// index within the file, at most [`MAX_PIECES`] pieces. None for any
    /// other kind or a malformed piece.
    pub fn piece_range(&self) -> Option<(u64, u64)> {
        let EntryKind::Piece { size, piece, index } = *self else {
            return None;
        };
        if piece == 0 || size.div_ceil(piece) > MAX_PIECES {
            return None;
        }
        let off = (index as u64).checked_mul(piece)?;
        (off < size).then(|| (off, piece.min(size - off)))
    }
}

/// One metadata record (seed 000 Fig. 6-4b). `path` is relative, '/'
/// separated, and its first component is the top-level source name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// File id: position in the source's depth-first walk.
    pub id: u64,
    pub path: Vec<u8>,
    pub kind: EntryKind,
    /// Permission bits (07777).
    pub mode: u32,
    pub mtime_s: i64,
    pub mtime_ns: u32,
}

/// A path that failed, with the reason, for the final report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub path: Vec<u8>,
    pub reason: String,
}

/// How many of the source's ScanFailed paths a sink keeps; past them one
/// [`Failure::more_scan_failures`] line counts the rest (issue 36: a
/// failing tree of millions of paths must not grow the sink).
pub const SCAN_FAILURES_KEPT: usize = 10_000;

impl Failure {
    /// The sink's one line for the scan failures it did not keep.
    pub fn more_scan_failures(n: u64) -> Failure {
        Failure {
            path: b"(more)".to_vec(),
            reason: format!("{n} more source paths failed"),
        }
    }

    /// Whether this is [`Failure::more_scan_failures`]'s line: the source,
    /// which keeps every one of its scan failures, leaves that echo out of
    /// its report. A failure of a real path named `(more)` has an OS
    /// error as its reason, never this one.
    pub fn counts_more_scan_failures(&self) -> bool {
        self.path == b"(more)"
            && self
                .reason
                .strip_suffix(" more source paths failed")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    }

    /// Whether a peer's failure, known only as text, is a vanished path
    /// (ENOENT: rsync's IOERR_VANISHED, which does not stop --delete).
    /// The one place a failure's reason is read back as a kind: an end
    /// that saw the io::Error keeps a typed flag instead (the engine's
    /// FailedPath::vanished), and ScanFailed carries io_error for the
    /// sink's --delete. A flag in Failure itself would change the
    /// encoding of every message that carries one (the codec has no
    /// optional fields: a protocol version), for the one reader that
    /// lacks it, a relay's client, which uses it only for its summary's
    /// "deletions skipped". Linux's ENOENT reads "... (os error 2)"; an
    /// io::Error made from the kind alone, "entity not found".
    pub fn reason_says_vanished(&self) -> bool {
        let gone = std::io::Error::from(std::io::ErrorKind::NotFound).to_string();
        self.reason.ends_with("(os error 2)") || self.reason.ends_with(&gone)
    }
}

/// Final report, sink to source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Complete {
    pub files: u64,
    pub bytes: u64,
    pub failures: Vec<Failure>,
    /// CPU seconds the sink's process spent during the session.
    pub cpu_s: f64,
}
