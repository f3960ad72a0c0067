//! A big file's pieces at the sink (issue 19, docs/SITE.md "A big file's
//! blocks"): a striped push cuts a large file into pieces
//! (request::shares) and each daemon of the stripe receives some of them
//! (EntryKind::Piece) in a session of its own. All write into one temp
//! file in the destination directory, named from the path, size, mtime and
//! piece length (`.NAME.ramsys-H.big`), so every sink of the stripe, and a
//! later `--resume`, finds the same one; it is opened without truncation
//! and sized (ftruncate, idempotent) by whoever opens it first.
//!
//! Completion is counted in the file system the sinks share, which a
//! striped push needs anyway: a piece whose bytes all arrived and whose
//! digest matched leaves a marker `.NAME.ramsys-H.INDEX.done`, then checks
//! whether every piece's marker exists; the sink that finds them all
//! gives the temp file its mode and mtime and renames it into place. The
//! last marker created is always followed by a check that sees them all,
//! so someone finishes; if two finish at once, one rename wins and the
//! other finds the file in place (ENOENT on its temp name). No lock, no
//! coordinator, no message between the sinks (so it works between plain
//! daemons, not only a site), and nothing appears under the final name
//! before every piece verified. A stripe lost mid-way leaves the temp file
//! and the markers of the pieces it did finish: `--resume` skips those
//! (the sink answers Have Unchanged) and sends the rest.
//!
//! A marker names the temp file it vouches for: it is a hard link to it
//! (linkat of the descriptor the piece was written through), and counts
//! only while it is the same inode as the temp file now under the temp
//! name. Markers left by a temp file that was removed vouch for that
//! inode, which they keep alive, so its number cannot come back as a
//! fresh temp file's (an empty marker could not tell them apart, and one
//! holding an inode number alone could be fooled by reuse). Nothing is
//! ever cleared before use: clearing raced with the sinks marking the
//! fresh temp file, lost their markers, and no sink placed the file (the
//! striped push exited 0 without it; issue 36). A stale marker is
//! replaced when its piece is marked again and removed when the file is
//! placed (or, left linked to the placed file by a sink stopped between
//! its rename and their removal, when a later run finds it in place). A
//! link appears whole or not at all, so no reader sees half a marker.
//! Markers need hard links in the destination directory (every POSIX file
//! system a stripe shares: NFS, Lustre, CephFS, BeeGFS within one
//! directory); where linkat fails, the piece fails with its error.
//!
//! Each session names the big files of its pieces it saw in place (it
//! placed one, another sink had, or it was kept) in a Placed before its
//! Complete (files::FileTable::big_files_placed), so the agent fails a
//! push whose pieces all verified but whose file no sink placed, instead
//! of exiting 0 without it (ramsys::stripe).

use std::fs::File;
use std::io;
use std::os::fd::BorrowedFd;

use crate::storage::fsops::{lstat_at, unlink_in, Stat};

/// The names of one big file's temp file and markers.
#[derive(Debug, Clone)]
pub struct Names {
    /// `.NAME.ramsys-H`
    stem: Vec<u8>,
    /// `STEM.big`
    pub tmp: Vec<u8>,
}

impl Names {
    /// For the file at `rel` (the sink's destination path) of this size,
    /// mtime and piece length: another version of the file, or other
    /// pieces, never share a temp file or a marker.
    pub fn new(rel: &[u8], size: u64, mtime: (i64, u32), piece: u64) -> Names {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&(rel.len() as u64).to_le_bytes());
        h.update(rel);
        for x in [size, mtime.0 as u64, u64::from(mtime.1), piece] {
            h.update(&x.to_le_bytes());
        }
        let (_, name) = crate::storage::fsops::split_parent(rel);
        // Within NAME_MAX with the longest marker suffix
        // (".ramsys-" + 16 + "." + 4 digits + ".done").
        let keep = name.len().min(255 - 1 - 34);
        let mut stem = Vec::with_capacity(keep + 25);
        stem.push(b'.');
        stem.extend_from_slice(&name[..keep]);
        stem.extend_from_slice(format!(".ramsys-{:016x}", h.digest()).as_bytes());
        let tmp = [&stem[..], b".big"].concat();
        Names { stem, tmp }
    }

    fn marker(&self, index: u32) -> Vec<u8> {
        [&self.stem[..], format!(".{index}.done").as_bytes()].concat()
    }
}

fn open_at(dir: BorrowedFd<'_>, name: &[u8], flags: i32) -> io::Result<File> {
    if name.contains(&0) {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // libc's O_* values, which rustix's OFlags share bit for bit on Linux.
    let fl = rustix::fs::OFlags::from_bits_retain((flags | libc::O_NOFOLLOW) as u32)
        | rustix::fs::OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, name, fl, rustix::fs::Mode::from_bits_retain(0o600))?;
    Ok(File::from(fd))
}

/// The inode a name is, if it is a regular file.
fn inode(st: &Stat) -> Option<(u64, u64)> {
    crate::storage::fsops::is_reg(st).then_some((st.st_dev, st.st_ino))
}

fn inode_at(dir: BorrowedFd<'_>, name: &[u8]) -> Option<(u64, u64)> {
    lstat_at(dir, name).ok().flatten().as_ref().and_then(inode)
}

/// The temp file now under its name, if it is a regular file of `size`.
fn current(dir: BorrowedFd<'_>, n: &Names, size: u64) -> Option<(u64, u64)> {
    match lstat_at(dir, &n.tmp) {
        Ok(Some(st)) if st.st_size as u64 == size => inode(&st),
        _ => None,
    }
}

/// Open the shared temp file for writing, creating it if missing, and
/// give it its final size. Never truncates what another sink wrote and
/// clears nothing: markers of another temp file do not count for it.
pub fn open(dir: BorrowedFd<'_>, n: &Names, size: u64) -> io::Result<File> {
    let f = open_at(dir, &n.tmp, libc::O_WRONLY | libc::O_CREAT)?;
    if f.metadata()?.len() != size {
        f.set_len(size)?;
    }
    Ok(f)
}

/// Piece `index` is in the temp file, verified: its marker is the temp
/// file of `size` now under the temp name.
pub fn piece_done(dir: BorrowedFd<'_>, n: &Names, size: u64, index: u32) -> bool {
    current(dir, n, size).is_some_and(|t| inode_at(dir, &n.marker(index)) == Some(t))
}

/// Piece `index`, written through `file` (the temp file, None: open it
/// by name), verified: leave its marker, a hard link to that file. A
/// marker of another temp file in the way is replaced. Fails when `file`
/// is no longer the temp file under its name (removed or replaced
/// meanwhile: what was written into it counts for nothing), so a stray
/// writer of an old temp file never replaces a marker of the current one.
pub fn mark(dir: BorrowedFd<'_>, n: &Names, index: u32, file: Option<&File>) -> io::Result<()> {
    let opened;
    let file = match file {
        Some(f) => f,
        None => {
            opened = open_at(dir, &n.tmp, libc::O_RDONLY)?;
            &opened
        }
    };
    let me = file.metadata()?;
    let me = {
        use std::os::unix::fs::MetadataExt;
        (me.dev(), me.ino())
    };
    let name = n.marker(index);
    // Another sink marking the same piece of the same temp file (a resume
    // run beside the stripe) may unlink and link between our steps: each
    // turn either links, or finds the marker ours, or removes one that is
    // not; a few turns settle it.
    for _ in 0..8 {
        if inode_at(dir, &n.tmp) != Some(me) {
            return Err(io::Error::other(
                "its temp file was removed or replaced meanwhile",
            ));
        }
        match crate::storage::tmpfile::link(file, dir, &name) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            r => return r,
        }
        match lstat_at(dir, &name)? {
            Some(st) if inode(&st) == Some(me) => return Ok(()),
            Some(_) => match unlink_in(dir, &name) {
                Err(e) if e.raw_os_error() != Some(libc::ENOENT) => return Err(e),
                _ => {}
            },
            None => {}
        }
    }
    Err(io::Error::other(
        "its marker kept changing (another sink marking the same piece)",
    ))
}

/// Every piece's marker is the temp file of `size` now under its name.
pub fn all_done(dir: BorrowedFd<'_>, n: &Names, size: u64, count: u32) -> bool {
    current(dir, n, size)
        .is_some_and(|t| (0..count).all(|i| inode_at(dir, &n.marker(i)) == Some(t)))
}

/// Remove the markers, but those of a temp file now under the temp name
/// (a later run's, made after the rename: they vouch for it).
fn clear(dir: BorrowedFd<'_>, n: &Names, count: u32) {
    let now = inode_at(dir, &n.tmp);
    for i in 0..count {
        let m = n.marker(i);
        if now.is_none() || inode_at(dir, &m) != now {
            let _ = unlink_in(dir, &m);
        }
    }
}

/// The file is in place under `name` (a run again, a resume): remove
/// markers still linked to it, left when a sink stopped between its
/// rename and [`clear`] (they would keep its data alive after the file
/// is removed, and make it a hard link). A fresh temp file's markers are
/// another inode: never touched.
pub fn forget(dir: BorrowedFd<'_>, n: &Names, name: &[u8], count: u32) {
    // Nothing to look for in a file of one link (the usual case).
    let Ok(Some(st)) = lstat_at(dir, name) else {
        return;
    };
    let Some(placed) = inode(&st).filter(|_| st.st_nlink > 1) else {
        return;
    };
    for i in 0..count {
        let m = n.marker(i);
        if inode_at(dir, &m) == Some(placed) {
            let _ = unlink_in(dir, &m);
        }
    }
}

/// Every piece verified: give the temp file its mode and mtime and rename
/// it to `name`, then drop the markers. Ok(true): this call placed it;
/// Ok(false): another sink did first (its rename won).
pub fn finish(
    dir: BorrowedFd<'_>,
    n: &Names,
    name: &[u8],
    size: u64,
    mode: u32,
    mtime: (i64, u32),
    count: u32,
) -> io::Result<bool> {
    match crate::storage::fsops::finalize_in(dir, &n.tmp, name, mode, mtime) {
        Ok(()) => {
            clear(dir, n, count);
            Ok(true)
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => match lstat_at(dir, name) {
            Ok(Some(st)) if st.st_size as u64 == size => Ok(false),
            _ => Err(e),
        },
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::fs::{FileExt, MetadataExt};

    fn names_in(d: &std::path::Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn exists(dir: BorrowedFd<'_>, name: &[u8]) -> bool {
        matches!(lstat_at(dir, name), Ok(Some(_)))
    }

    fn path(d: &std::path::Path, name: &[u8]) -> std::path::PathBuf {
        use std::os::unix::ffi::OsStrExt;
        d.join(std::ffi::OsStr::from_bytes(name))
    }

    /// Two sinks write their pieces into one temp file; only the one that
    /// completes the last piece finds them all and renames; the markers
    /// go with the rename; a second finisher finds the file in place.
    #[test]
    fn pieces_meet_in_one_temp_file_and_the_last_renames() {
        let d = tempfile::tempdir().unwrap();
        let dir = File::open(d.path()).unwrap();
        let dir = dir.as_fd();
        let n = Names::new(b"sub/big", 10, (5, 6), 4);
        assert!(n.tmp.starts_with(b".big.ramsys-") && n.tmp.ends_with(b".big"));
        assert_ne!(n.tmp, Names::new(b"sub/big", 10, (5, 7), 4).tmp);
        assert_ne!(n.tmp, Names::new(b"sub/big", 10, (5, 6), 2).tmp);
        let a = open(dir, &n, 10).unwrap();
        let b = open(dir, &n, 10).unwrap();
        a.write_all_at(b"0123", 0).unwrap();
        b.write_all_at(b"89", 8).unwrap();
        mark(dir, &n, 2, Some(&b)).unwrap();
        assert!(!all_done(dir, &n, 10, 3));
        // Opened again (a resume): nothing truncated.
        drop(open(dir, &n, 10).unwrap());
        a.write_all_at(b"4567", 4).unwrap();
        mark(dir, &n, 0, Some(&a)).unwrap();
        assert!(piece_done(dir, &n, 10, 0) && !piece_done(dir, &n, 10, 1));
        assert!(!piece_done(dir, &n, 9, 0), "another size");
        assert!(!all_done(dir, &n, 10, 3));
        // Marked twice (a resume's sink of the same piece): still one.
        mark(dir, &n, 1, None).unwrap();
        mark(dir, &n, 1, Some(&a)).unwrap();
        assert!(all_done(dir, &n, 10, 3));
        assert!(!path(d.path(), b"big").exists());
        assert!(finish(dir, &n, b"big", 10, 0o640, (5, 6), 3).unwrap());
        assert!(!finish(dir, &n, b"big", 10, 0o640, (5, 6), 3).unwrap());
        assert_eq!(names_in(d.path()), ["big"]);
        assert_eq!(std::fs::read(d.path().join("big")).unwrap(), b"0123456789");
        let md = std::fs::metadata(d.path().join("big")).unwrap();
        assert_eq!(
            (md.mode() & 0o7777, md.mtime(), md.mtime_nsec(), md.nlink()),
            (0o640, 5, 6, 1)
        );
    }

    /// Markers of a temp file that was removed (all of them, here) do not
    /// count for a fresh temp file, and opening the fresh one removes
    /// nothing; marking a piece again replaces its stale marker. The old
    /// inode lives on in its markers, so the fresh file cannot reuse its
    /// number.
    #[test]
    fn stale_markers_do_not_count_for_a_fresh_temp_file() {
        let d = tempfile::tempdir().unwrap();
        let dir = File::open(d.path()).unwrap();
        let dir = dir.as_fd();
        let n = Names::new(b"f", 8, (1, 0), 4);
        let old = open(dir, &n, 8).unwrap();
        old.write_all_at(b"old!old!", 0).unwrap();
        mark(dir, &n, 0, Some(&old)).unwrap();
        mark(dir, &n, 1, Some(&old)).unwrap();
        assert!(all_done(dir, &n, 8, 2));
        unlink_in(dir, &n.tmp).unwrap();
        assert!(!piece_done(dir, &n, 8, 0), "no temp file");
        assert!(!all_done(dir, &n, 8, 2));
        // A piece written into the removed file cannot be marked.
        assert!(mark(dir, &n, 1, Some(&old)).is_err());
        let fresh = open(dir, &n, 8).unwrap();
        assert_ne!(
            fresh.metadata().unwrap().ino(),
            old.metadata().unwrap().ino()
        );
        assert!(!piece_done(dir, &n, 8, 0) && !piece_done(dir, &n, 8, 1));
        assert!(!all_done(dir, &n, 8, 2), "stale markers count for nothing");
        assert_eq!(names_in(d.path()).len(), 3, "and nothing was cleared");
        assert_eq!(std::fs::metadata(path(d.path(), &n.tmp)).unwrap().len(), 8);
        fresh.write_all_at(b"new!", 0).unwrap();
        mark(dir, &n, 0, Some(&fresh)).unwrap();
        assert!(piece_done(dir, &n, 8, 0) && !all_done(dir, &n, 8, 2));
        // A stray writer of the old file cannot replace the fresh marker.
        assert!(mark(dir, &n, 0, Some(&old)).is_err());
        assert!(piece_done(dir, &n, 8, 0));
        fresh.write_all_at(b"new!", 4).unwrap();
        mark(dir, &n, 1, Some(&fresh)).unwrap();
        assert!(all_done(dir, &n, 8, 2));
        assert!(finish(dir, &n, b"f", 8, 0o600, (1, 0), 2).unwrap());
        assert_eq!(names_in(d.path()), ["f"]);
        assert_eq!(std::fs::read(d.path().join("f")).unwrap(), b"new!new!");
        // A long name stays within NAME_MAX.
        let long = vec![b'x'; 255];
        let n = Names::new(&long, 8, (1, 0), 4);
        assert!(n.marker(4095).len() <= 255);
    }

    /// The interleaving that lost a marker (issue 36): stale markers lie
    /// about; sink A finds no temp file and creates one; sink B opens A's,
    /// writes and marks its piece; only then does A get on (before, A's
    /// create-then-clear removed B's marker here and no sink ever placed
    /// the file). Then a stray sink opens the temp file again. B's marker
    /// stays, and A, marking the last piece, finds them all.
    #[test]
    fn a_sink_opening_the_temp_file_never_drops_markers() {
        let d = tempfile::tempdir().unwrap();
        let dir = File::open(d.path()).unwrap();
        let dir = dir.as_fd();
        let n = Names::new(b"g", 8, (2, 0), 4);
        // An earlier temp file's markers, its file gone.
        let gone = open(dir, &n, 8).unwrap();
        mark(dir, &n, 0, Some(&gone)).unwrap();
        mark(dir, &n, 1, Some(&gone)).unwrap();
        unlink_in(dir, &n.tmp).unwrap();
        let a = open(dir, &n, 8).unwrap();
        let b = open(dir, &n, 8).unwrap();
        b.write_all_at(b"BBBB", 4).unwrap();
        mark(dir, &n, 1, Some(&b)).unwrap();
        assert!(!all_done(dir, &n, 8, 2), "B sees A's piece not done");
        drop(open(dir, &n, 8).unwrap());
        assert!(piece_done(dir, &n, 8, 1), "B's marker survives A's open");
        a.write_all_at(b"AAAA", 0).unwrap();
        mark(dir, &n, 0, Some(&a)).unwrap();
        assert!(all_done(dir, &n, 8, 2), "A, last, finds every marker");
        assert!(finish(dir, &n, b"g", 8, 0o600, (2, 0), 2).unwrap());
        assert_eq!(std::fs::read(d.path().join("g")).unwrap(), b"AAAABBBB");
        assert_eq!(names_in(d.path()), ["g"]);
        drop(gone);
    }

    /// Placing the file removes its markers and stale ones, but not those
    /// of a temp file made after the rename (a later run's).
    #[test]
    fn finish_keeps_the_markers_of_a_later_temp_file() {
        let d = tempfile::tempdir().unwrap();
        let dir = File::open(d.path()).unwrap();
        let dir = dir.as_fd();
        let n = Names::new(b"h", 4, (3, 0), 4);
        let t = open(dir, &n, 4).unwrap();
        mark(dir, &n, 0, Some(&t)).unwrap();
        // Placed by hand, as a racing finisher would; then a later run's
        // sink makes a fresh temp file and marks its piece.
        crate::storage::fsops::rename_in_dir(dir, &n.tmp, b"h").unwrap();
        let later = open(dir, &n, 4).unwrap();
        mark(dir, &n, 1, Some(&later)).unwrap();
        clear(dir, &n, 2);
        assert!(piece_done(dir, &n, 4, 1) && !piece_done(dir, &n, 4, 0));
        assert_eq!(std::fs::metadata(d.path().join("h")).unwrap().nlink(), 1);
    }

    /// A sink that stopped between its rename and removing the markers
    /// left them linked to the placed file: a later run that finds the
    /// file in place removes those, and only those.
    #[test]
    fn markers_left_linked_to_the_placed_file_are_forgotten() {
        let d = tempfile::tempdir().unwrap();
        let dir = File::open(d.path()).unwrap();
        let dir = dir.as_fd();
        let n = Names::new(b"k", 4, (3, 0), 4);
        let t = open(dir, &n, 4).unwrap();
        mark(dir, &n, 0, Some(&t)).unwrap();
        mark(dir, &n, 1, Some(&t)).unwrap();
        crate::storage::fsops::rename_in_dir(dir, &n.tmp, b"k").unwrap();
        let fresh = open(dir, &n, 4).unwrap();
        mark(dir, &n, 1, Some(&fresh)).unwrap();
        assert_eq!(std::fs::metadata(d.path().join("k")).unwrap().nlink(), 2);
        forget(dir, &n, b"k", 2);
        assert_eq!(std::fs::metadata(d.path().join("k")).unwrap().nlink(), 1);
        assert!(!exists(dir, &n.marker(0)) && piece_done(dir, &n, 4, 1));
    }
}
