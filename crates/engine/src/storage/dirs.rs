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
//!
//! The source's readers use the same table ([`ReadDirs`]): a file opened
//! by its whole path from the source root walked every component of it
//! (openat2 on "var/tmp/.../dir0001/.../file44568": `link_path_walk` and
//! `__d_lookup_rcu` were 9 % of the pushing agent's CPU on the
//! 47,984-file tree); relative to its open directory the walk is one
//! component.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::OnceLock;

use crate::storage::fsops::Root;

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
    fn open(root: &Root, rel: &[u8], acl: bool) -> io::Result<Dir> {
        let fd = root.open_dir(rel)?;
        let default_acl = acl && crate::storage::tmpfile::has_default_acl(fd.as_fd());
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

pub struct SinkDirs {
    /// Interned through `&self` (a windowed sink adds files while its
    /// writers open directories; issue 36): the slots never move.
    index: std::sync::Mutex<HashMap<Vec<u8>, u32>>,
    slots: Box<[OnceLock<Dir>]>,
    /// Ask each directory for a default ACL (the sink's file creation
    /// needs it; readers do not).
    acl: bool,
}

impl Default for SinkDirs {
    fn default() -> Self {
        SinkDirs {
            index: Default::default(),
            slots: (0..MAX_OPEN).map(|_| OnceLock::new()).collect(),
            acl: true,
        }
    }
}

impl SinkDirs {
    /// A table for reading (no default-ACL probe per directory).
    pub fn reading() -> Self {
        SinkDirs {
            acl: false,
            ..SinkDirs::default()
        }
    }

    /// The index of directory `rel` (relative to the sink root), or
    /// [`UNCACHED`] past [`MAX_OPEN`] directories.
    pub fn intern(&self, rel: &[u8]) -> u32 {
        let mut index = self.index.lock().unwrap();
        if let Some(&i) = index.get(rel) {
            return i;
        }
        if index.len() >= MAX_OPEN {
            return UNCACHED;
        }
        let i = index.len() as u32;
        index.insert(rel.to_vec(), i);
        i
    }

    /// Directory `rel` (interned as `i`), opened on first use. Two writers
    /// racing on the first use both open it; one descriptor is kept.
    pub fn get(&self, root: &Root, i: u32, rel: &[u8]) -> io::Result<DirRef<'_>> {
        let Some(slot) = self.slots.get(i as usize) else {
            return Ok(DirRef::Once(Dir::open(root, rel, self.acl)?));
        };
        if let Some(d) = slot.get() {
            return Ok(DirRef::Kept(d));
        }
        let d = Dir::open(root, rel, self.acl)?;
        let _ = slot.set(d);
        Ok(DirRef::Kept(slot.get().expect("set above")))
    }

    /// Directories interned.
    pub fn len(&self) -> usize {
        self.index.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The directories of a source session's files, for the readers: each
/// file is opened relative to its directory's descriptor (opened on first
/// use, kept for the session) instead of by its whole path.
pub struct ReadDirs {
    dirs: SinkDirs,
    /// Directory index of each file (same order as the session's files).
    of_file: Vec<u32>,
}

impl ReadDirs {
    /// Intern the parent of every path in `rels` (in walk order, so a
    /// directory's files are adjacent: one hash lookup per directory).
    pub fn new<'a>(rels: impl Iterator<Item = &'a [u8]>) -> ReadDirs {
        let dirs = SinkDirs::reading();
        let mut of_file = Vec::new();
        let mut last: Option<(&[u8], u32)> = None;
        for rel in rels {
            let parent = crate::storage::fsops::split_parent(rel).0;
            let i = match last {
                Some((p, i)) if p == parent => i,
                _ => dirs.intern(parent),
            };
            last = Some((parent, i));
            of_file.push(i);
        }
        ReadDirs { dirs, of_file }
    }

    /// Open file `idx` (path `rel`) relative to its directory, with the
    /// root's resolution rules (the directory was opened under the root,
    /// so the open stays confined as a whole-path open was).
    pub fn open(&self, root: &Root, idx: usize, rel: &[u8], flags: i32) -> io::Result<OwnedFd> {
        let (parent, name) = crate::storage::fsops::split_parent(rel);
        let i = self.of_file.get(idx).copied().unwrap_or(UNCACHED);
        if name.is_empty() {
            return root.openat(rel, flags, 0);
        }
        let dir = self.dirs.get(root, i, parent)?;
        root.openat_in(dir.fd(), name, flags, 0)
    }

    /// Directories interned.
    pub fn len(&self) -> usize {
        self.dirs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.dirs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::fsops::Confinement;

    #[test]
    fn one_descriptor_per_directory_and_uncached_past_the_cap() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("a")).unwrap();
        let root = Root::open(d.path(), Confinement::Strict).unwrap();
        let dirs = SinkDirs::default();
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

    #[test]
    fn readers_open_files_through_their_directory() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        std::fs::write(d.path().join("top"), b"p").unwrap();
        std::fs::write(d.path().join("a/b/x"), b"x").unwrap();
        std::fs::write(d.path().join("a/b/y"), b"y").unwrap();
        std::fs::write(d.path().join("a/z"), b"z").unwrap();
        let root = Root::open(d.path(), Confinement::Strict).unwrap();
        let rels: [&[u8]; 4] = [b"top", b"a/b/x", b"a/b/y", b"a/z"];
        let dirs = ReadDirs::new(rels.iter().copied());
        assert_eq!(dirs.len(), 3, "\"\", a/b and a: one entry each");
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW;
        for (i, rel) in rels.iter().enumerate() {
            let fd = dirs.open(&root, i, rel, flags).unwrap();
            let mut s = String::new();
            use std::io::Read;
            std::fs::File::from(fd).read_to_string(&mut s).unwrap();
            assert_eq!(s.as_bytes(), &rel[rel.len() - 1..]);
        }
        // A missing file is an error as before; so is a symlink (O_NOFOLLOW).
        std::os::unix::fs::symlink("x", d.path().join("a/b/l")).unwrap();
        let more: [&[u8]; 2] = [b"a/b/gone", b"a/b/l"];
        let dirs = ReadDirs::new(more.iter().copied());
        assert!(dirs.open(&root, 0, more[0], flags).is_err());
        assert!(dirs.open(&root, 1, more[1], flags).is_err());
        // Confinement holds: a directory that became a symlink out of the
        // root is refused like a whole-path open.
        let out = tempfile::tempdir().unwrap();
        std::fs::write(out.path().join("secret"), b"s").unwrap();
        std::fs::rename(d.path().join("a"), d.path().join("a.old")).unwrap();
        std::os::unix::fs::symlink(out.path(), d.path().join("a")).unwrap();
        let esc: [&[u8]; 1] = [b"a/secret"];
        let dirs = ReadDirs::new(esc.iter().copied());
        assert!(dirs.open(&root, 0, esc[0], flags).is_err());
        assert!(root.openat(esc[0], flags, 0).is_err());
    }
}
