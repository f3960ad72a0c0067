//! The source's half of an archive copy: what its scan reads of each
//! entry beyond mode and mtime (request::walk calls in here once per
//! entry, only when the client asked for it).

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use ramsys_proto::attrs::{preserve, special, Attrs};
use ramsys_proto::control::EntryKind;

use super::acl;
use super::ids::Names;

/// The fields of a stat an Attrs record needs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Owners {
    pub uid: u32,
    pub gid: u32,
    pub atime: (i64, u32),
}

/// Reads attributes for one scan.
pub struct Collector {
    flags: u32,
    names: Names,
    /// Without root only `user.*` xattrs can be read (rsync's rule).
    user_only: bool,
}

impl Collector {
    pub fn new(flags: u32) -> Collector {
        Collector {
            flags,
            names: Names::default(),
            user_only: !super::is_root(),
        }
    }

    /// Whether every entry gets an Attrs record.
    pub fn wanted(&self) -> bool {
        self.flags & preserve::ATTRS != 0
    }

    /// The record of a FIFO, socket or device of type `fmt` (S_IFMT bits),
    /// or None when the user did not ask for that kind.
    pub fn special(&self, fmt: u32, rdev: u64) -> Option<EntryKind> {
        let (kind, flag) = match fmt {
            libc::S_IFIFO => (special::FIFO, preserve::SPECIALS),
            libc::S_IFSOCK => (special::SOCKET, preserve::SPECIALS),
            libc::S_IFCHR => (special::CHAR, preserve::DEVICES),
            libc::S_IFBLK => (special::BLOCK, preserve::DEVICES),
            _ => return None,
        };
        if self.flags & flag == 0 {
            return None;
        }
        let rdev = if flag == preserve::DEVICES { rdev } else { 0 };
        Some(EntryKind::Special { kind, rdev })
    }

    /// The Attrs record of entry `id` at `path` (never followed if a
    /// symlink). An attribute that cannot be read is left out: the entry
    /// itself still copies.
    pub fn attrs(&mut self, id: u64, path: &Path, o: &Owners, symlink: bool, dir: bool) -> Attrs {
        let f = self.flags;
        let numeric = f & preserve::NUMERIC_IDS != 0;
        let mut a = Attrs {
            id,
            ..Default::default()
        };
        if f & preserve::OWNER != 0 {
            a.owner = Some(self.names.user(o.uid, numeric));
        }
        if f & preserve::GROUP != 0 {
            a.group = Some(self.names.group(o.gid, numeric));
        }
        if f & preserve::ATIMES != 0 && !dir {
            a.atime = Some(o.atime);
        }
        // Linux allows user.* xattrs and ACLs on neither symlinks nor
        // (through the path) special files' contents: links are skipped.
        if symlink {
            return a;
        }
        if f & preserve::XATTRS != 0 {
            if let Ok(list) = xattr::list(path) {
                let mut names: Vec<_> = list
                    .filter(|n| super::xattr_wanted(n.as_bytes(), self.user_only))
                    .collect();
                names.sort();
                for n in names {
                    if let Ok(Some(v)) = xattr::get(path, &n) {
                        a.xattrs.push((n.as_bytes().to_vec(), v));
                    }
                }
            }
        }
        if f & preserve::ACLS != 0 {
            let mut read = |name: &str| {
                xattr::get(path, name)
                    .ok()
                    .flatten()
                    .and_then(|v| acl::parse(&v, &mut self.names, numeric))
                    .unwrap_or_default()
            };
            a.acl = read(acl::ACCESS);
            if dir {
                a.default_acl = read(acl::DEFAULT);
            }
        }
        a
    }
}

/// Attrs records as Control::Attrs messages, as many per CONTROL frame
/// as fit in half of one (like the Entries they follow).
pub fn send_attrs<E>(
    attrs: &[Attrs],
    send: &mut dyn FnMut(ramsys_proto::Control) -> Result<(), E>,
) -> Result<(), E> {
    let limit = ramsys_proto::frame::MAX_CONTROL_BODY as usize / 2;
    let mut batch = Vec::new();
    let mut bytes = 0usize;
    for a in attrs {
        let sz = ramsys_proto::attrs::attrs_wire_size(a);
        if bytes + sz > limit && !batch.is_empty() {
            send(ramsys_proto::Control::Attrs(std::mem::take(&mut batch)))?;
            bytes = 0;
        }
        bytes += sz;
        batch.push(a.clone());
    }
    if !batch.is_empty() {
        send(ramsys_proto::Control::Attrs(batch))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specials_only_when_asked() {
        let c = Collector::new(preserve::SPECIALS);
        assert_eq!(
            c.special(libc::S_IFIFO, 5),
            Some(EntryKind::Special {
                kind: special::FIFO,
                rdev: 0
            })
        );
        assert_eq!(c.special(libc::S_IFCHR, 5), None);
        let d = Collector::new(preserve::DEVICES);
        assert_eq!(
            d.special(libc::S_IFBLK, 0x0801),
            Some(EntryKind::Special {
                kind: special::BLOCK,
                rdev: 0x0801
            })
        );
        assert_eq!(d.special(libc::S_IFSOCK, 0), None);
        assert!(!Collector::new(preserve::SPECIALS).wanted());
        assert!(Collector::new(preserve::GROUP).wanted());
    }

    #[test]
    fn reads_user_xattrs_and_owner() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"x").unwrap();
        let has_xattrs = xattr::set(&p, "user.ramsys", b"v1").is_ok();
        let mut c = Collector::new(preserve::OWNER | preserve::XATTRS | preserve::NUMERIC_IDS);
        let o = Owners {
            uid: 4242,
            gid: 7,
            atime: (1, 2),
        };
        let a = c.attrs(3, &p, &o, false, false);
        assert_eq!(a.id, 3);
        assert_eq!(a.owner.as_ref().unwrap().id, 4242);
        assert!(a.owner.unwrap().name.is_empty());
        assert!(a.group.is_none() && a.atime.is_none());
        if has_xattrs {
            assert_eq!(a.xattrs, vec![(b"user.ramsys".to_vec(), b"v1".to_vec())]);
        } else {
            eprintln!("skipped the xattr check: the temp file system has no user xattrs");
        }
    }
}
