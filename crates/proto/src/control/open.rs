//! Opening and negotiating a session: the client's request (Open, and the
//! Selection a SelectOpen carries), the source's Propose and the sink's
//! Confirm.

use serde::{Deserialize, Serialize};

/// Which end of a session the *server* (daemon) plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    Source,
    Sink,
}

/// A client's request, sent once on the control link after authentication.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Open {
    /// Which end the server plays in this session.
    pub server_role: Role,
    /// Server is source: the paths to send (relative to its root).
    /// Server is sink: exactly one path, the destination.
    pub paths: Vec<Vec<u8>>,
    /// Copy directories recursively (cp -r).
    pub recursive: bool,
    /// What the client asks for; a server-side source proposes at most
    /// this (a server-side sink gets the source's own Propose).
    pub streams: u16,
    pub block_size: u32,
    pub checksum: bool,
}

/// Capacity proposal, source to sink (seed 000 Fig. 6-4a).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Propose {
    /// Number of top-level source entries (decides how DST is interpreted).
    pub roots: u32,
    /// Data streams the source has senders for.
    pub streams: u16,
    /// Proposed block size in bytes.
    pub block_size: u32,
    /// Task capacity the source can sustain, Mbit/s (0 = unknown).
    pub capacity_mbps: u64,
    /// Per-block checksums and whole-file digests on.
    pub checksum: bool,
    /// DATA block cipher the source asks for: 0 none, 1 ChaCha20-Poly1305,
    /// 2 AES-256-GCM (docs/SECURITY.md).
    pub cipher: u8,
}

/// Confirmation, sink to source: what the sink can serve. The source
/// releases whatever it reserved beyond this.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confirm {
    pub streams: u16,
    pub block_size: u32,
    /// Blocks the source may have in flight per stream (the credit window).
    pub credits_per_stream: u32,
    pub capacity_mbps: u64,
    pub checksum: bool,
    /// DATA block cipher in force: the source's, or the sink's own when the
    /// source asked for none (either end may require encryption).
    pub cipher: u8,
}

/// What a source sends of its tree (rsync's filter rules, engine
/// `request::filter`): `rules` in command-line order, first match wins,
/// each in rsync's short form (`-` or `+`, modifiers from `!sr`, one
/// space, the pattern's bytes; engine `request::rules`);
/// regular files outside [`min_size`, `max_size`] are skipped
/// (`max_size` 0 = no upper limit); with `files` (`--files-from`) only
/// those paths (relative to each source top) and the directories leading
/// to them are sent, and what lies below a listed directory only when
/// `files_recursive`. A sink given a Selection (sync `--delete`) never
/// deletes what the rules exclude, as rsync does.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Selection {
    /// `- PATTERN`, `+ PATTERN`, `-! PATTERN`, `-s PATTERN`, ...
    pub rules: Vec<Vec<u8>>,
    pub min_size: u64,
    pub max_size: u64,
    /// `--files-from`'s paths, packed and shared: a session's options are
    /// cloned for each end and each message that carries them, and a list
    /// of millions of lines must not be copied with them (issue 36).
    pub files: super::PathList,
    pub files_recursive: bool,
}

impl Selection {
    /// Selects everything.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.min_size == 0 && self.max_size == 0 && self.files.is_empty()
    }
}
