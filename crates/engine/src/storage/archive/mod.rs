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
    /// When a file keeps its set-user-ID and set-group-ID bits.
    pub setid: SetId,
}

/// Set-user-ID and set-group-ID bits of regular and special files (issue
/// 34): a sink keeps them only where the file ends up owned by the
/// sender's own identity, so no user can land a set-ID file that runs as
/// somebody else (the daemon's user, root). Directories keep theirs (a
/// set-group-ID directory grants nothing). Without an archive copy the
/// bits always go, as `cp` and `rsync` without `-p` drop them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetId {
    /// The sink process is the sender's own user (a local copy, a pull
    /// into the agent, an ssh-serve sink): files are theirs, keep.
    Process,
    /// A daemon trusted with one shared key: keep set-user-ID only where
    /// the file was given the owner the source named (and set-group-ID
    /// only with the group it named): `rsync -a` as root, root to root.
    Owner,
    /// A multi-user daemon: files stay the daemon's user's, never keep.
    Never,
}

impl SetId {
    /// The mode a file may end with, `owner`/`group`: whether the file
    /// carries the owner / group the source named (a SetId::Owner sink
    /// knows only after its chown).
    pub fn allow(self, mode: u32, owner: bool, group: bool) -> u32 {
        let (u, g) = match self {
            SetId::Process => (true, true),
            SetId::Owner => (owner, group),
            SetId::Never => (false, false),
        };
        mode & !(if u { 0 } else { SUID }) & !(if g { 0 } else { SGID })
    }
}

/// The set-user-ID and set-group-ID bits of a mode.
pub const SUID: u32 = 0o4000;
pub const SGID: u32 = 0o2000;

impl Default for Policy {
    /// The sink is the user's own process, or a daemon trusted with one
    /// shared key: everything its privileges allow.
    fn default() -> Policy {
        Policy {
            owners: true,
            devices: true,
            user_xattrs_only: false,
            setid: SetId::Process,
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
            setid: SetId::Never,
        }
    }

    /// A daemon trusted with one shared key (`ramsys serve` without a
    /// users table): everything its privileges allow, but set-ID bits only
    /// on files given the source's owner (SetId::Owner).
    pub fn daemon() -> Policy {
        Policy {
            setid: SetId::Owner,
            ..Policy::default()
        }
    }

    /// The mode a file should end with, as far as known before its chown:
    /// without an archive copy no set-ID bit; with one, what
    /// [`SetId::allow`] lets through if the owner and group follow.
    pub fn wanted_mode(self, mode: u32, archive_flags: Option<u32>) -> u32 {
        match archive_flags {
            None => mode & !(SUID | SGID),
            Some(f) => self
                .setid
                .allow(mode, f & preserve::OWNER != 0, f & preserve::GROUP != 0),
        }
    }

    /// The mode a file is created with, before any chown: set-ID bits only
    /// where nothing later decides about them (this process is the
    /// sender's own user and no owner follows); otherwise without them, put
    /// back by the archive pass if the owner allows (ArchiveSink::apply).
    pub fn placed_mode(self, mode: u32, archive_flags: Option<u32>) -> u32 {
        let owners = preserve::OWNER | preserve::GROUP;
        match archive_flags {
            Some(f) if self.setid == SetId::Process && f & owners == 0 => {
                self.wanted_mode(mode, archive_flags)
            }
            _ => mode & !(SUID | SGID),
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

    #[test]
    fn set_id_bits_follow_the_owner() {
        let m = 0o6755;
        assert_eq!(SetId::Process.allow(m, false, false), 0o6755);
        assert_eq!(SetId::Owner.allow(m, true, true), 0o6755);
        assert_eq!(SetId::Owner.allow(m, true, false), 0o4755);
        assert_eq!(SetId::Owner.allow(m, false, true), 0o2755);
        assert_eq!(SetId::Owner.allow(m, false, false), 0o0755);
        assert_eq!(SetId::Never.allow(m, true, true), 0o0755);
        // Plain copies drop the bits everywhere (cp and rsync without -p).
        for p in [Policy::default(), Policy::daemon(), Policy::confined()] {
            assert_eq!(p.placed_mode(0o4755, None), 0o755);
            assert_eq!(p.placed_mode(0o1777, None), 0o1777, "sticky stays");
        }
        // An archive copy by the user's own process with no owner to set
        // places them at once; every other case waits for the chown.
        assert_eq!(Policy::default().placed_mode(0o4755, Some(0)), 0o4755);
        let owners = preserve::OWNER;
        assert_eq!(Policy::default().placed_mode(0o4755, Some(owners)), 0o755);
        assert_eq!(Policy::daemon().placed_mode(0o4755, Some(0)), 0o755);
        assert_eq!(Policy::confined().placed_mode(0o4755, Some(0)), 0o755);
        let all = preserve::OWNER | preserve::GROUP;
        assert_eq!(Policy::daemon().wanted_mode(0o6755, Some(all)), 0o6755);
        assert_eq!(Policy::daemon().wanted_mode(0o6755, Some(0)), 0o755);
        assert_eq!(Policy::confined().wanted_mode(0o6755, Some(all)), 0o755);
        assert_eq!(Policy::default().wanted_mode(0o6755, None), 0o755);
    }
}
