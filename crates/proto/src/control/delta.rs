//! A sync's comparison round trip: what the sink holds of each announced file
//! (Have) and the source's verdict on it (Reuse).

use serde::{Deserialize, Serialize};

/// What the sink holds of one announced file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Have {
    pub id: u64,
    pub state: HaveState,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HaveState {
    /// Same size and mtime (or resumed and verified): nothing to send; the
    /// sink applies the mode itself.
    Unchanged,
    /// `--checksum`: the sink's file has the announced size and this
    /// content digest (xxh3-64 of the whole file).
    Digest(u64),
    /// The sink has an older version (or an interrupted temp file) of
    /// `size` bytes: one hash per `block_size` block (segment hash keyed by
    /// the file id and offset; 0 = block missing, always sent).
    Blocks {
        block_size: u32,
        size: u64,
        sums: Vec<u64>,
    },
}

/// The source's verdict on a file the sink offered a Digest or Blocks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reuse {
    pub id: u64,
    pub what: ReuseKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReuseKind {
    /// Content identical: keep the sink's file, apply mode and mtime.
    Keep,
    /// Build the file from the sink's base: `bytes` of it are reused (the
    /// blocks that matched), the rest arrives as data.
    Base { bytes: u64 },
}
