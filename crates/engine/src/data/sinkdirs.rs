//! The sink's open destination directories (issue 17, small files): each
//! directory a file is written into is opened once per session and its
//! descriptor reused for every file in it (create, link or rename, unlink),
//! where a lookup per operation cost an openat2 and a close twice per file.
//!
//! Directories are interned while the metadata phase registers files
//! (single-threaded, `&mut`), so the writers find a file's directory by
//! index without a lock; each descriptor is opened on first use. At most
//! [`MAX_OPEN`] are kept per session (a tree with more directories opens
//! the rest per use, as before).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::OnceLock;

use crate::fsops::Root;

/// Most directory descriptors one session keeps open.
pub const MAX_OPEN: usize = 4096;

/// Index of a directory that is not kept open.
pub const UNCACHED: u32 = u32::MAX;

/// An open destination directory.
pub struct Dir {
    pub fd: OwnedFd,
    /// It has a default ACL (files created in it do not take the umask).
    pub default_acl: bool,
}

impl Dir {
    fn open(root: &Root, rel: &[u8]) -> io::Result<Dir> {
        let fd = root.open_dir(rel)?;
        let default_acl = crate::storage::tmpfile::has_default_acl(fd.as_fd());
        Ok(Dir { fd, default_acl })
    }
}

/// A directory, kept open by the table or opened for one use.
pub enum DirRef<'a> {
    Kept(&'a Dir),
    Once(Dir),
}

impl DirRef<'_> {
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.dir().fd.as_fd()
    }
    pub fn dir(&self) -> &Dir {
        match self {
            DirRef::Kept(d) => d,
            DirRef::Once(d) => d,
        }
    }
}

#[derive(Default)]
pub struct SinkDirs {
    index: HashMap<Vec<u8>, u32>,
    slots: Vec<OnceLock<Dir>>,
}

impl SinkDirs {
    /// The index of directory `rel` (relative to the sink root), or
    /// [`UNCACHED`] past [`MAX_OPEN`] directories.
    pub fn intern(&mut self, rel: &[u8]) -> u32 {
        if let Some(&i) = self.index.get(rel) {
            return i;
        }
        if self.slots.len() >= MAX_OPEN {
            return UNCACHED;
        }
        let i = self.slots.len() as u32;
        self.slots.push(OnceLock::new());
        self.index.insert(rel.to_vec(), i);
        i
    }

    /// Directory `rel` (interned as `i`), opened on first use. Two writers
    /// racing on the first use both open it; one descriptor is kept.
    pub fn get(&self, root: &Root, i: u32, rel: &[u8]) -> io::Result<DirRef<'_>> {
        let Some(slot) = self.slots.get(i as usize) else {
            return Ok(DirRef::Once(Dir::open(root, rel)?));
        };
        if let Some(d) = slot.get() {
            return Ok(DirRef::Kept(d));
        }
        let d = Dir::open(root, rel)?;
        let _ = slot.set(d);
        Ok(DirRef::Kept(slot.get().expect("set above")))
    }

    /// Directories interned.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsops::Confinement;

    #[test]
    fn one_descriptor_per_directory_and_uncached_past_the_cap() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("a")).unwrap();
        let root = Root::open(d.path(), Confinement::Strict).unwrap();
        let mut dirs = SinkDirs::default();
        let a = dirs.intern(b"a");
        assert_eq!(dirs.intern(b""), 1);
        assert_eq!(dirs.intern(b"a"), a);
        let x = dirs.get(&root, a, b"a").unwrap();
        let y = dirs.get(&root, a, b"a").unwrap();
        use std::os::fd::AsRawFd;
        assert_eq!(x.fd().as_raw_fd(), y.fd().as_raw_fd());
        assert!(matches!(x, DirRef::Kept(_)));
        assert!(matches!(
            dirs.get(&root, UNCACHED, b"a").unwrap(),
            DirRef::Once(_)
        ));
        assert!(dirs.get(&root, 1, b"").is_ok(), "slot 1 is the root");
        let m = dirs.intern(b"missing");
        assert!(dirs.get(&root, m, b"missing").is_err());
        for i in 0..MAX_OPEN {
            dirs.intern(format!("d{i}").as_bytes());
        }
        assert_eq!(dirs.intern(b"one-too-many"), UNCACHED);
        assert_eq!(dirs.len(), MAX_OPEN);
    }
}
