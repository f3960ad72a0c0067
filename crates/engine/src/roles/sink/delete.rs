//! `--delete`: remove sink entries the source no longer has. Only the
//! directories the source sent are scanned (so nothing outside the
//! destination is looked at), every directory is opened through the root
//! (openat2, no symlinks followed), entries are removed with unlinkat on
//! that descriptor, and a symlink is removed, never followed. The sink runs
//! this after every new file, link and directory attribute is in place.

use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStrExt;

use crate::storage::fsops::{self, Root};

/// Our own working files, never deleted: temp files and links of running
/// or interrupted sessions, big files' pieces, and the resume journal
/// (crate::request::reserved).
pub fn is_ours(name: &[u8]) -> bool {
    crate::request::reserved::is_reserved(name)
}

fn join(a: &[u8], b: &[u8]) -> Vec<u8> {
    if a.is_empty() {
        return b.to_vec();
    }
    let mut v = a.to_vec();
    v.push(b'/');
    v.extend_from_slice(b);
    v
}

/// The destination paths the source sent, as keyed 64-bit hashes: 8
/// bytes a path and half a byte of index, where a set of the paths took
/// ~100 (a million-file `--delete` held 100 MB for it, issue 36) and a
/// hash table of them 9-18 (its buckets double: 150 MB at 10 M paths, the
/// most a windowed 10 M-file `-a --delete` held). A collision can only
/// keep an entry that should go (never delete one the source sent), with
/// odds of about n / 2^64 per entry looked up; the key is random per
/// session, so no name can be made to collide on purpose.
///
/// Every lookup comes after the last path (`--delete` and the orphan
/// clean-up run at the session's end), so the hashes are appended to one
/// vector while paths arrive and sorted in place once, at the first
/// lookup; the top bits of a hash index its run. (A large vector grows by
/// `mremap`, and its capacity not yet written is not resident: RSS is 8
/// bytes a path, with no copy while it grows.)
#[derive(Default)]
pub struct KeepSet {
    key: std::collections::hash_map::RandomState,
    /// Hashes not sorted yet.
    unsorted: std::cell::RefCell<Vec<u64>>,
    sorted: std::cell::OnceCell<Sorted>,
}

/// The hashes sorted, and where each run of equal top `bits` starts.
struct Sorted {
    hashes: Vec<u64>,
    /// `index[b]`: the first hash whose top `bits` bits are `b` or more;
    /// 2^bits + 1 entries (about one per 4-8 hashes).
    index: Vec<u32>,
    bits: u32,
}

impl Sorted {
    fn top(&self, h: u64) -> usize {
        match self.bits {
            0 => 0,
            b => (h >> (64 - b)) as usize,
        }
    }

    fn new(mut hashes: Vec<u64>) -> Sorted {
        hashes.sort_unstable();
        let n = hashes.len();
        // About 4-8 hashes a run: one or two cache lines a lookup.
        let bits = (n / 8).max(1).ilog2();
        let mut s = Sorted {
            hashes,
            index: Vec::with_capacity((1 << bits) + 1),
            bits,
        };
        let mut at = 0;
        for b in 0..1usize << bits {
            while at < n && s.top(s.hashes[at]) < b {
                at += 1;
            }
            s.index.push(at as u32);
        }
        s.index.push(n as u32);
        s
    }

    fn contains(&self, h: u64) -> bool {
        let b = self.top(h);
        let run = &self.hashes[self.index[b] as usize..self.index[b + 1] as usize];
        run.binary_search(&h).is_ok()
    }
}

impl KeepSet {
    fn hash(&self, path: &[u8]) -> u64 {
        std::hash::BuildHasher::hash_one(&self.key, path)
    }

    pub fn insert(&mut self, path: &[u8]) {
        let h = self.hash(path);
        // A path after a lookup (never in a session): sorted again later.
        if let Some(s) = self.sorted.take() {
            *self.unsorted.get_mut() = s.hashes;
        }
        self.unsorted.get_mut().push(h);
    }

    pub fn contains(&self, path: &[u8]) -> bool {
        let h = self.hash(path);
        let sorted = self
            .sorted
            .get_or_init(|| Sorted::new(std::mem::take(&mut *self.unsorted.borrow_mut())));
        sorted.contains(h)
    }

    /// Bytes held (the session's accounting): what is written, 8 bytes a
    /// path and the index.
    pub fn bytes(&self) -> usize {
        let sorted = self
            .sorted
            .get()
            .map_or(0, |s| s.hashes.len() * 8 + s.index.len() * 4);
        self.unsorted.borrow().len() * 8 + sorted
    }
}

/// The names a windowed `--delete` sync was sent, per sent directory,
/// as [`KeepSet`]'s keyed hashes of their paths (issue 36, step 6:
/// docs/PROTOCOL.md "Directories done"): when the source names a
/// directory done, its set is taken, the directory's extras deleted, and
/// the set dropped; what is held follows the directories in flight, not
/// the tree. A name whose parent is not a sent directory is never looked
/// up (only sent directories are listed), so it is not kept.
#[derive(Default)]
pub struct DirKeeps {
    key: std::collections::hash_map::RandomState,
    /// Sent directory (its path under the root) -> hashes of its entries'
    /// paths, in arrival order until taken.
    sets: std::collections::HashMap<Vec<u8>, Vec<u64>>,
    /// What the sets hold (the session's accounting), kept as they grow.
    bytes: usize,
}

/// What a directory set costs beyond its hashes: its path's copy, the
/// map's slot and the vector's header.
const DIR_SET_BYTES: usize = 64;

/// One directory's set, sorted: is an entry's path among its names?
pub struct KeptDir<'a> {
    key: &'a std::collections::hash_map::RandomState,
    hashes: &'a [u64],
}

impl KeptDir<'_> {
    pub fn contains(&self, path: &[u8]) -> bool {
        let h = std::hash::BuildHasher::hash_one(self.key, path);
        self.hashes.binary_search(&h).is_ok()
    }
}

impl DirKeeps {
    /// A directory the source sent: its entries' names are kept from now.
    pub fn open(&mut self, dir: &[u8]) {
        if !self.sets.contains_key(dir) {
            self.bytes += DIR_SET_BYTES + dir.len();
            self.sets.insert(dir.to_vec(), Vec::new());
        }
    }

    /// An entry the source sent (its path under the root).
    pub fn insert(&mut self, path: &[u8]) {
        let (parent, _) = fsops::split_parent(path);
        if let Some(v) = self.sets.get_mut(parent) {
            v.push(std::hash::BuildHasher::hash_one(&self.key, path));
            self.bytes += 8;
        }
    }

    /// Directory `dir`'s set, taken out (the caller drops it when done).
    pub fn take(&mut self, dir: &[u8]) -> Option<Vec<u64>> {
        let mut v = self.sets.remove(dir)?;
        self.bytes -= DIR_SET_BYTES + dir.len() + v.len() * 8;
        v.sort_unstable();
        Some(v)
    }

    /// A set taken (or sorted in place by [`Self::sorted`]) to look up.
    pub fn view<'a>(&'a self, hashes: &'a [u64]) -> KeptDir<'a> {
        KeptDir {
            key: &self.key,
            hashes,
        }
    }

    /// Directory `dir`'s set, sorted in place, left held (the session's
    /// end, and a resume's stale temp files before it).
    pub fn sorted(&mut self, dir: &[u8]) -> Option<KeptDir<'_>> {
        let v = self.sets.get_mut(dir)?;
        v.sort_unstable();
        Some(KeptDir {
            key: &self.key,
            hashes: v,
        })
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// `protected(i, name, is_dir)`: entry `name` of `dirs[i]` is excluded
/// by the user's selection, so `--delete` leaves it (rsync's rule).
pub type Protected<'a> = &'a dyn Fn(usize, &[u8], bool) -> bool;

/// [`Protected`] within one directory: `protected(name, is_dir)`.
pub type ProtectedIn<'a> = &'a dyn Fn(&[u8], bool) -> bool;

/// Entries of the sink directories `dirs` whose paths are not in `keep`
/// and that `protected` does not cover.
pub fn extraneous(
    root: &Root,
    dirs: &[Vec<u8>],
    keep: &KeepSet,
    protected: Option<Protected>,
) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        let prot = protected.map(|p| move |n: &[u8], is_dir: bool| p(i, n, is_dir));
        let prot = prot.as_ref().map(|p| p as ProtectedIn);
        extraneous_in(root, d, &|p| keep.contains(p), prot, &mut out);
    }
    out
}

/// [`extraneous`] of one directory `d`: its entries whose paths `keep`
/// does not hold and `protected(name, is_dir)` does not cover, sorted,
/// appended to `out`. A directory that cannot be opened or listed
/// (gone, or not one) has none.
pub fn extraneous_in(
    root: &Root,
    d: &[u8],
    keep: &dyn Fn(&[u8]) -> bool,
    protected: Option<ProtectedIn>,
    out: &mut Vec<Vec<u8>>,
) {
    let Ok(fd) = root.open_dir(d) else { return };
    // Listing through the descriptor keeps the walk on the directory
    // openat2 confined.
    let Ok(mut names) = fsops::list_dir(fd.as_fd()) else {
        return;
    };
    names.sort_unstable();
    let mut p = Vec::new();
    for n in names.iter().filter(|n| !is_ours(n)) {
        p.clear();
        if !d.is_empty() {
            p.extend_from_slice(d);
            p.push(b'/');
        }
        p.extend_from_slice(n);
        if keep(p.as_slice()) {
            continue;
        }
        if let Some(prot) = protected {
            // lstat only the few entries that would go: a dir-only
            // pattern needs to know.
            let is_dir = fsops::lstat_at(fd.as_fd(), n)
                .ok()
                .flatten()
                .is_some_and(|st| fsops::is_dir(&st));
            if prot(n, is_dir) {
                continue;
            }
        }
        out.push(p.clone());
    }
}

/// Remove `rel` (a whole tree if it is a directory).
pub fn remove(root: &Root, rel: &[u8]) -> std::io::Result<()> {
    let (parent, name) = fsops::split_parent(rel);
    let dir = root.open_dir(parent)?;
    let name = nul_free(name)?;
    let st = fsops::lstat_at(dir.as_fd(), name)?
        .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOENT))?;
    if fsops::is_dir(&st) {
        let sub = root.open_dir(rel)?;
        let rd = std::fs::read_dir(format!("/proc/self/fd/{}", sub.as_raw_fd()))?;
        for e in rd {
            remove(root, &join(rel, e?.file_name().as_bytes()))?;
        }
        fsops::rmdir_in(dir.as_fd(), name)
    } else {
        fsops::unlink_in(dir.as_fd(), name)
    }
}

/// A name for a syscall: a NUL byte in it is refused, as CString did.
fn nul_free(name: &[u8]) -> std::io::Result<&[u8]> {
    if name.contains(&0) {
        return Err(std::io::Error::other("NUL in path"));
    }
    Ok(name)
}

/// Remove `rel` (whose path from the transfer root is `wire`) as
/// [`remove`] does, but leave every entry inside it that `keep(wire,
/// is_dir)` protects, and the directories holding one (rsync deletes an
/// extraneous directory's contents through its filter rules, so what they
/// exclude stays; issue 35). Ok(false): something was kept.
pub fn remove_unprotected(
    root: &Root,
    rel: &[u8],
    wire: &[u8],
    keep: &dyn Fn(&[u8], bool) -> bool,
) -> std::io::Result<bool> {
    let (parent, name) = fsops::split_parent(rel);
    let dir = root.open_dir(parent)?;
    let is_dir = fsops::lstat_at(dir.as_fd(), name)?.is_some_and(|st| fsops::is_dir(&st));
    if !is_dir {
        remove(root, rel)?;
        return Ok(true);
    }
    let sub = root.open_dir(rel)?;
    let mut all = true;
    for n in fsops::list_dir(sub.as_fd())? {
        let st = fsops::lstat_at(sub.as_fd(), &n)?;
        let n_dir = st.is_some_and(|st| fsops::is_dir(&st));
        let w = join(wire, &n);
        if keep(&w, n_dir) {
            all = false;
            continue;
        }
        all &= remove_unprotected(root, &join(rel, &n), &w, keep)?;
    }
    if all {
        fsops::rmdir_in(dir.as_fd(), nul_free(name)?)?;
    }
    Ok(all)
}

/// Make way for a non-directory at `rel` where DST has a directory
/// (rsync's receiver does the same; issue 35): an empty directory is
/// removed; a non-empty one only with `tree` (`--delete`, which rsync's
/// `--force` implies), through [`remove`], never following a symlink.
/// What was deleted: the entries the directory held (each one entry, as
/// `--delete` counts a directory with its contents), not the directory,
/// which rsync's `--stats` does not count either (issue 36).
pub fn make_way(root: &Root, rel: &[u8], tree: bool) -> std::io::Result<Vec<Vec<u8>>> {
    let (parent, name) = fsops::split_parent(rel);
    let dir = root.open_dir(parent)?;
    let e = match fsops::rmdir_in(dir.as_fd(), nul_free(name)?) {
        Ok(()) => return Ok(Vec::new()),
        Err(e) => e,
    };
    match e.raw_os_error() {
        Some(libc::ENOTEMPTY | libc::EEXIST) if tree => {
            let held = fsops::list_dir(root.open_dir(rel)?.as_fd())?;
            remove(root, rel)?;
            Ok(held.iter().map(|n| join(rel, n)).collect())
        }
        Some(libc::ENOTEMPTY | libc::EEXIST) => Err(std::io::Error::new(
            std::io::ErrorKind::DirectoryNotEmpty,
            "a non-empty directory is in the way (--delete replaces it)",
        )),
        _ => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fsops::Confinement;

    /// Every path inserted is found, at every size the index takes (one
    /// run up to 2^17 runs); others are not; a path added after a lookup
    /// is found too.
    #[test]
    fn keep_set_finds_every_path_it_was_given_and_no_other() {
        for n in [0usize, 1, 7, 8, 9, 100, 8191, 8192, 1 << 20] {
            let mut k = KeepSet::default();
            for i in 0..n {
                k.insert(format!("d{}/f{i}", i % 97).as_bytes());
            }
            for i in 0..n {
                assert!(
                    k.contains(format!("d{}/f{i}", i % 97).as_bytes()),
                    "{n}: {i}"
                );
            }
            for i in n..n + 1000 {
                assert!(
                    !k.contains(format!("d{}/f{i}", i % 97).as_bytes()),
                    "{n}: {i}"
                );
            }
            assert!(
                k.bytes() >= n * 8 && k.bytes() <= n * 9 + 8,
                "{n}: {}",
                k.bytes()
            );
            k.insert(b"late");
            assert!(k.contains(b"late") && (n == 0 || k.contains(b"d0/f0")));
        }
    }

    /// The per-directory sets: an entry is found in its own directory's
    /// set only; names under no open directory are not kept; a set taken
    /// is gone (its bytes with it); the bytes follow what is held.
    #[test]
    fn dir_keeps_hold_each_directory_until_it_is_taken() {
        let mut k = DirKeeps::default();
        k.open(b"");
        k.insert(b"a");
        k.open(b"a");
        k.open(b"a/b");
        k.insert(b"a/b");
        for i in 0..100 {
            k.insert(format!("a/f{i}").as_bytes());
            k.insert(format!("a/b/g{i}").as_bytes());
        }
        // Its parent is no directory sent: not kept.
        k.insert(b"elsewhere/x");
        let held = k.bytes();
        assert_eq!(held, 3 * DIR_SET_BYTES + 1 + 3 + 8 * 202);
        let a = k.take(b"a").unwrap();
        let view = k.view(&a);
        assert!(view.contains(b"a/b") && view.contains(b"a/f99"));
        assert!(!view.contains(b"a/b/g1") && !view.contains(b"a/f100"));
        assert_eq!(k.bytes(), held - DIR_SET_BYTES - 1 - 8 * 101);
        assert!(k.take(b"a").is_none(), "taken once");
        let b = k.sorted(b"a/b").unwrap();
        assert!(b.contains(b"a/b/g0") && !b.contains(b"a/f0"));
        assert!(k.sorted(b"").unwrap().contains(b"a"));
        assert!(k.sorted(b"elsewhere").is_none());
        // A name that comes after its directory was taken is not kept.
        k.insert(b"a/late");
        assert_eq!(k.bytes(), 2 * DIR_SET_BYTES + 3 + 8 * 101);
    }

    #[test]
    fn finds_and_removes_only_extraneous_never_through_symlinks() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), b"x").unwrap();
        let t = d.path().join("t");
        std::fs::create_dir_all(t.join("old/deep")).unwrap();
        std::fs::write(t.join("old/deep/f"), b"x").unwrap();
        std::fs::write(t.join("a"), b"x").unwrap();
        std::fs::write(t.join("gone"), b"x").unwrap();
        std::fs::write(t.join(".a.ramsys-00000001.part"), b"x").unwrap();
        std::os::unix::fs::symlink(outside.path(), t.join("link")).unwrap();
        let root = Root::open(d.path(), Confinement::Strict).unwrap();
        let mut keep = KeepSet::default();
        keep.insert(b"t");
        keep.insert(b"t/a");
        // A protected entry (the user's --exclude) stays; dirs by is_dir.
        let prot =
            |i: usize, n: &[u8], is_dir: bool| i == 0 && (n == b"gone" || (n == b"old" && is_dir));
        let x = extraneous(&root, &[b"t".to_vec()], &keep, Some(&prot));
        assert_eq!(x, vec![b"t/link".to_vec()]);
        let x = extraneous(&root, &[b"t".to_vec()], &keep, None);
        assert_eq!(
            x,
            vec![b"t/gone".to_vec(), b"t/link".to_vec(), b"t/old".to_vec()]
        );
        for p in &x {
            remove(&root, p).unwrap();
        }
        assert!(t.join("a").exists() && t.join(".a.ramsys-00000001.part").exists());
        assert!(!t.join("old").exists() && !t.join("gone").exists());
        assert!(std::fs::symlink_metadata(t.join("link")).is_err());
        assert!(outside.path().join("keep").exists());
    }

    #[test]
    fn a_directory_holding_protected_entries_keeps_them_and_itself() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("t");
        std::fs::create_dir_all(t.join("old/deep")).unwrap();
        std::fs::create_dir_all(t.join("gone/sub")).unwrap();
        for f in [
            "old/keep.o",
            "old/x",
            "old/deep/y.o",
            "old/deep/z",
            "gone/sub/w",
        ] {
            std::fs::write(t.join(f), b"x").unwrap();
        }
        let root = Root::open(d.path(), Confinement::Strict).unwrap();
        // The wire path is the one from the transfer root ("src/...").
        let keep = |w: &[u8], _dir: bool| w.ends_with(b".o") && w.starts_with(b"src/");
        assert!(!remove_unprotected(&root, b"t/old", b"src/old", &keep).unwrap());
        assert!(t.join("old/keep.o").exists() && t.join("old/deep/y.o").exists());
        assert!(!t.join("old/x").exists() && !t.join("old/deep/z").exists());
        assert!(remove_unprotected(&root, b"t/gone", b"src/gone", &keep).unwrap());
        assert!(!t.join("gone").exists());
    }

    #[test]
    fn make_way_removes_an_empty_directory_and_a_full_one_only_with_delete() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), b"x").unwrap();
        std::fs::create_dir_all(d.path().join("empty")).unwrap();
        std::fs::create_dir_all(d.path().join("full/sub")).unwrap();
        std::fs::write(d.path().join("full/sub/f"), b"x").unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("full/link")).unwrap();
        let root = Root::open(d.path(), Confinement::Strict).unwrap();
        // Not a deletion (rsync's --stats counts none); a full one's
        // entries are.
        assert!(make_way(&root, b"empty", false).unwrap().is_empty());
        assert!(!d.path().join("empty").exists());
        let e = make_way(&root, b"full", false).unwrap_err();
        assert!(e.to_string().contains("--delete"), "{e}");
        assert!(d.path().join("full/sub/f").exists());
        let mut gone = make_way(&root, b"full", true).unwrap();
        gone.sort();
        assert_eq!(gone, [b"full/link".to_vec(), b"full/sub".to_vec()]);
        assert!(!d.path().join("full").exists());
        assert!(outside.path().join("keep").exists());
    }
}
