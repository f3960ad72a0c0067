//! What a sink checks of the records a peer sends: ids in order, paths
//! and link targets safe, counts that add up (EntryChecker), and Attrs
//! naming only entries already received (check_attrs).

use crate::control::{Entry, EntryKind};
use crate::path::{validate_link_target, validate_relative};
use crate::ProtoError;

/// Checks of metadata records received by a sink.
#[derive(Debug, Default)]
pub(super) struct EntryChecker {
    pub(super) next_id: u64,
    pub(super) files: u64,
    pub(super) bytes: u64,
    seen_nondir: bool,
    /// Which ids are File entries, for hard-link targets: a bit per id
    /// (ids arrive in order, from 0), bounded by the entries actually
    /// received (each costs a record on the wire). A hash set cost 4 % of
    /// a daemon's no-change re-sync of 1 M files and 32 MB; this is 125 KB.
    file_ids: Vec<u64>,
}

impl EntryChecker {
    pub(super) fn check(&mut self, e: &Entry) -> Result<(), ProtoError> {
        if e.id != self.next_id {
            return Err(ProtoError::malformed(
                "entry",
                format!("id {} out of order (expected {})", e.id, self.next_id),
            ));
        }
        self.next_id += 1;
        // An empty path is the destination itself: the directory record
        // of a `SRC/` source, whose contents land in DST (rsync's rule).
        if !(e.path.is_empty() && e.kind == EntryKind::Dir) {
            validate_relative(&e.path)?;
        }
        if e.mode & !0o7777 != 0 {
            return Err(ProtoError::malformed(
                "entry",
                "mode has non-permission bits",
            ));
        }
        if e.mtime_ns >= 1_000_000_000 {
            return Err(ProtoError::malformed("entry", "mtime_ns out of range"));
        }
        match &e.kind {
            EntryKind::Dir => {
                // Directories come first so the tree exists before any file.
                if self.seen_nondir {
                    return Err(ProtoError::malformed(
                        "entry",
                        "directory record after file records",
                    ));
                }
            }
            EntryKind::File { size } => {
                self.seen_nondir = true;
                self.files += 1;
                self.bytes = self.bytes.saturating_add(*size);
                let (word, bit) = ((e.id / 64) as usize, e.id % 64);
                if self.file_ids.len() <= word {
                    self.file_ids.resize(word + 1, 0);
                }
                self.file_ids[word] |= 1 << bit;
            }
            // Counted like a file of its length; never a hard-link target
            // (the file is complete only when every piece is).
            EntryKind::Piece { .. } => {
                self.seen_nondir = true;
                let Some((_, len)) = e.kind.piece_range() else {
                    return Err(ProtoError::malformed(
                        "entry",
                        "piece outside its file, of length 0, or one of too many",
                    ));
                };
                self.files += 1;
                self.bytes = self.bytes.saturating_add(len);
            }
            EntryKind::Symlink { target } => {
                self.seen_nondir = true;
                validate_link_target(target)?;
            }
            EntryKind::HardLink { target_id } => {
                self.seen_nondir = true;
                self.earlier_file(*target_id)?;
            }
            // The target's path is checked as a record's own (issue 36).
            EntryKind::LinkTo { target_id, target } => {
                self.seen_nondir = true;
                self.earlier_file(*target_id)?;
                validate_relative(target)?;
            }
            EntryKind::Special { kind, rdev } => {
                self.seen_nondir = true;
                use crate::attrs::special::*;
                let ok = match *kind {
                    CHAR | BLOCK => true,
                    FIFO | SOCKET => *rdev == 0,
                    _ => false,
                };
                if !ok {
                    return Err(ProtoError::malformed("entry", "unknown special file kind"));
                }
            }
        }
        Ok(())
    }
}

impl EntryChecker {
    /// A hard link's target: an earlier File record.
    fn earlier_file(&self, id: u64) -> Result<(), ProtoError> {
        let word = self.file_ids.get((id / 64) as usize);
        if word.is_none_or(|w| w & (1 << (id % 64)) == 0) {
            return Err(ProtoError::malformed(
                "entry",
                "hard link to an id that is not an earlier file",
            ));
        }
        Ok(())
    }
}

/// Attrs name only entries already received, and every ACL entry has a
/// known tag and rwx bits only.
pub(super) fn check_attrs(v: &[crate::attrs::Attrs], next_id: u64) -> Result<(), ProtoError> {
    use crate::attrs::acl_tag::*;
    for a in v {
        if a.id >= next_id {
            return Err(ProtoError::malformed("attrs", "unknown entry id"));
        }
        if a.atime.is_some_and(|(_, ns)| ns >= 1_000_000_000) {
            return Err(ProtoError::malformed("attrs", "atime_ns out of range"));
        }
        for e in a.acl.iter().chain(&a.default_acl) {
            let known = matches!(e.tag, USER_OBJ | USER | GROUP_OBJ | GROUP | MASK | OTHER);
            if !known || e.perm & !7 != 0 {
                return Err(ProtoError::malformed("attrs", "bad ACL entry"));
            }
        }
        if a.xattrs.iter().any(|(n, _)| n.is_empty() || n.contains(&0)) {
            return Err(ProtoError::malformed(
                "attrs",
                "bad extended attribute name",
            ));
        }
    }
    Ok(())
}
