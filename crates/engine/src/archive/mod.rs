//! Archive copies (issue 20, "faithful copies"; `-a`, `-X`, `-A`,
//! `--specials`, `--devices`, `--numeric-ids`, `--atimes`): what a copy
//! keeps beyond contents, mode and mtime, on both ends.
//!
//! - [`collect`]: the source's scan reads owners (with their names),
//!   extended attributes and POSIX ACLs into [`Attrs`] records, and turns
//!   FIFOs, sockets and device nodes into Special records when asked.
//! - [`apply`]: the sink creates the special files and applies the
//!   records once every file is in place, as far as it may ([`Policy`]),
//!   and notes in one line what it could not keep.
//! - [`ids`]: cached name <-> id lookups (owners travel by name, rsync's
//!   rule, unless `--numeric-ids`).
//! - [`acl`]: Linux's `system.posix_acl_*` xattr values <-> ACL entries.
//!
//! The records travel in the one metadata round trip (proto::attrs,
//! docs/PROTOCOL.md); what `-a` implies is in docs/SYNC.md.

pub mod acl;
pub mod apply;
pub mod collect;
pub mod ids;

pub use ramsys_proto::attrs::{preserve, Attrs};

/// What a sink may apply of what the source sends, beyond what the
/// process itself may do (a non-root sink keeps no foreign owner anyway).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Owners and groups as sent (else the files stay the sink user's).
    pub owners: bool,
    /// Device nodes (creating one is as good as reading the disk).
    pub devices: bool,
    /// Only `user.*` extended attributes (never `security.*`, e.g. file
    /// capabilities, or `trusted.*`).
    pub user_xattrs_only: bool,
}

impl Default for Policy {
    /// The sink is the user's own process, or a daemon trusted with one
    /// shared key: everything its privileges allow.
    fn default() -> Policy {
        Policy {
            owners: true,
            devices: true,
            user_xattrs_only: false,
        }
    }
}

impl Policy {
    /// A multi-user daemon (daemon::users): one authenticated user must
    /// never create files owned by another, device nodes, or attributes
    /// that grant privileges (docs/SECURITY.md).
    pub fn confined() -> Policy {
        Policy {
            owners: false,
            devices: false,
            user_xattrs_only: true,
        }
    }
}

/// Running as root (effective uid 0): owners, devices and the trusted
/// and security xattr namespaces are possible.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no failure mode.
    unsafe { libc::geteuid() == 0 }
}

/// Extended attributes this end handles, by name: never `system.*`
/// (ACLs travel on their own, rsync's rule); only `user.*` without root
/// or under a confined policy.
pub fn xattr_wanted(name: &[u8], user_only: bool) -> bool {
    if user_only {
        name.starts_with(b"user.")
    } else {
        !name.starts_with(b"system.")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xattr_namespaces() {
        assert!(xattr_wanted(b"user.a", true));
        assert!(!xattr_wanted(b"trusted.a", true));
        assert!(xattr_wanted(b"trusted.a", false));
        assert!(xattr_wanted(b"security.capability", false));
        assert!(!xattr_wanted(b"system.posix_acl_access", false));
        assert!(!Policy::confined().owners);
        assert!(Policy::default().devices);
    }
}
