//! The pieces of big files a striped share holds (issue 19, docs/SITE.md
//! "A big file's blocks"): plain types, so the walk's filter can carry
//! them without depending on the deal ([`super::shares`]), which lists
//! with the walk.

use std::collections::HashMap;

/// The pieces of one file a share holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PieceSet {
    /// The file's size and mtime when listed.
    pub size: u64,
    pub mtime: (i64, u32),
    /// Piece length (the last piece may be shorter).
    pub piece: u64,
    pub indices: Vec<u32>,
}

/// A share's pieces by the file's wire path (the walk sends a Piece record
/// for each instead of the File record).
pub type Pieces = HashMap<Vec<u8>, PieceSet>;
