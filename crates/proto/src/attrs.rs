//! What an archive copy carries beyond mode and mtime (issue 20, "faithful
//! copies"; `cp -a`, `-X`, `-A`, `--specials`, `--devices`): owners and
//! groups by name and id, extended attributes, POSIX ACLs, atimes.
//!
//! They travel in the one metadata round trip: the source announces what it
//! carries with [`crate::Control::Preserve`] right behind Propose (and
//! SyncMode), then follows each Entries batch with a
//! [`crate::Control::Attrs`] batch for the same ids. A peer that does not
//! ask for any of it never sees these messages, so older encodings are
//! untouched (docs/PROTOCOL.md, "Archive attributes").

use serde::{Deserialize, Serialize};

/// Bits of Preserve `flags` (and of ArchiveOpen `preserve`).
pub mod preserve {
    /// Owner: Attrs carry `owner`; the sink chowns (root only).
    pub const OWNER: u32 = 1;
    /// Group: Attrs carry `group`.
    pub const GROUP: u32 = 2;
    /// Map owner and group by id only (`--numeric-ids`); names are not sent.
    pub const NUMERIC_IDS: u32 = 4;
    /// Extended attributes (`-X`).
    pub const XATTRS: u32 = 8;
    /// POSIX ACLs (`-A`).
    pub const ACLS: u32 = 16;
    /// FIFOs and sockets as Special records (`--specials`).
    pub const SPECIALS: u32 = 32;
    /// Character and block devices as Special records (`--devices`).
    pub const DEVICES: u32 = 64;
    /// Access times (`--atimes`).
    pub const ATIMES: u32 = 128;
    pub const ALL: u32 = 255;
    /// Bits that put an Attrs record behind every entry.
    pub const ATTRS: u32 = OWNER | GROUP | XATTRS | ACLS | ATIMES;
}

/// Kinds of a `EntryKind::Special` record (the S_IFMT of the source).
pub mod special {
    pub const FIFO: u8 = 0;
    pub const SOCKET: u8 = 1;
    pub const CHAR: u8 = 2;
    pub const BLOCK: u8 = 3;
}

/// A user or group: the source's numeric id and its name there (empty
/// when the source has no name for it, or under `--numeric-ids`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    pub id: u32,
    pub name: Vec<u8>,
}

/// One entry of a POSIX ACL (acl(5)). `tag` is Linux's on-disk tag
/// (USER_OBJ 1, USER 2, GROUP_OBJ 4, GROUP 8, MASK 0x10, OTHER 0x20),
/// `perm` rwx bits; `who` names the user or group of USER and GROUP
/// entries (mapped by name at the sink like owners), and is unused
/// (id 0, no name) for the others.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclEntry {
    pub tag: u16,
    pub perm: u16,
    pub who: Principal,
}

/// ACL tags (Linux `acl_ea.h` values).
pub mod acl_tag {
    pub const USER_OBJ: u16 = 0x01;
    pub const USER: u16 = 0x02;
    pub const GROUP_OBJ: u16 = 0x04;
    pub const GROUP: u16 = 0x08;
    pub const MASK: u16 = 0x10;
    pub const OTHER: u16 = 0x20;
}

/// What the source knows of one entry beyond its record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attrs {
    /// Id of the Entry it belongs to (already sent).
    pub id: u64,
    pub owner: Option<Principal>,
    pub group: Option<Principal>,
    /// (name, value), names with their namespace ("user.foo"); never the
    /// ACL names (those go in `acl`/`default_acl`).
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Access ACL beyond the mode bits (empty = none).
    pub acl: Vec<AclEntry>,
    /// Default ACL of a directory (empty = none).
    pub default_acl: Vec<AclEntry>,
    /// (seconds, nanoseconds) with ATIMES.
    pub atime: Option<(i64, u32)>,
}

/// Encoded size of one Attrs record, to split batches like Entries.
pub fn attrs_wire_size(a: &Attrs) -> usize {
    postcard::experimental::serialized_size(a).unwrap_or(usize::MAX)
}
