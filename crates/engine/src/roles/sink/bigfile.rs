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

use std::fs::File;
use std::io;
use std::os::fd::BorrowedFd;

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

fn exists(dir: BorrowedFd<'_>, name: &[u8]) -> bool {
    matches!(crate::storage::fsops::lstat_at(dir, name), Ok(Some(_)))
}

/// Open the shared temp file for writing, creating it if missing (its
/// creator then drops the markers another version may have left), and
/// give it its final size. Never truncates what another sink wrote.
pub fn open(dir: BorrowedFd<'_>, n: &Names, size: u64, count: u32) -> io::Result<File> {
    let f = match open_at(dir, &n.tmp, libc::O_WRONLY) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            // Markers without their temp file vouch for nothing: the one
            // sink whose exclusive create made it drops them, at once. A
            // sink that found no temp file but lost the create opens the
            // winner's and clears nothing: clearing before the create let
            // a sink racing here remove markers the creator had written
            // since, and no sink ever placed the file (a striped push of
            // a sparse file, whose hole-only pieces verify at once, exited
            // 0 without it).
            match open_at(dir, &n.tmp, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL) {
                Ok(f) => {
                    clear(dir, n, count);
                    f
                }
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    open_at(dir, &n.tmp, libc::O_WRONLY)?
                }
                Err(e) => return Err(e),
            }
        }
        r => r?,
    };
    if f.metadata()?.len() != size {
        f.set_len(size)?;
    }
    Ok(f)
}

/// Piece `index` is in the temp file, verified (its marker exists and the
/// temp file has its size).
pub fn piece_done(dir: BorrowedFd<'_>, n: &Names, size: u64, index: u32) -> bool {
    exists(dir, &n.marker(index))
        && matches!(crate::storage::fsops::lstat_at(dir, &n.tmp), Ok(Some(st))
            if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_size as u64 == size)
}

/// Piece `index` verified: leave its marker.
pub fn mark(dir: BorrowedFd<'_>, n: &Names, index: u32) -> io::Result<()> {
    open_at(dir, &n.marker(index), libc::O_WRONLY | libc::O_CREAT).map(drop)
}

/// Every piece's marker is there.
pub fn all_done(dir: BorrowedFd<'_>, n: &Names, count: u32) -> bool {
    (0..count).all(|i| exists(dir, &n.marker(i)))
}

fn clear(dir: BorrowedFd<'_>, n: &Names, count: u32) {
    for i in 0..count {
        let _ = crate::storage::fsops::unlink_in(dir, &n.marker(i));
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
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            match crate::storage::fsops::lstat_at(dir, name) {
                Ok(Some(st)) if st.st_size as u64 == size => Ok(false),
                _ => Err(e),
            }
        }
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
        let a = open(dir, &n, 10, 3).unwrap();
        let b = open(dir, &n, 10, 3).unwrap();
        a.write_all_at(b"0123", 0).unwrap();
        b.write_all_at(b"89", 8).unwrap();
        mark(dir, &n, 2).unwrap();
        assert!(!all_done(dir, &n, 3));
        // Opened again (a resume): nothing truncated.
        drop(open(dir, &n, 10, 3).unwrap());
        a.write_all_at(b"4567", 4).unwrap();
        mark(dir, &n, 0).unwrap();
        assert!(piece_done(dir, &n, 10, 0) && !piece_done(dir, &n, 10, 1));
        assert!(!all_done(dir, &n, 3));
        mark(dir, &n, 1).unwrap();
        assert!(all_done(dir, &n, 3));
        assert!(!exists(dir, b"big"));
        assert!(finish(dir, &n, b"big", 10, 0o640, (5, 6), 3).unwrap());
        assert!(!finish(dir, &n, b"big", 10, 0o640, (5, 6), 3).unwrap());
        assert_eq!(names_in(d.path()), ["big"]);
        assert_eq!(std::fs::read(d.path().join("big")).unwrap(), b"0123456789");
        let md = std::fs::metadata(d.path().join("big")).unwrap();
        assert_eq!(
            (md.mode() & 0o7777, md.mtime(), md.mtime_nsec()),
            (0o640, 5, 6)
        );
    }

    /// Markers without their temp file (it was removed) are dropped when a
    /// fresh temp file is made: they cannot complete a file of zeros. A
    /// sink that opens the temp file another made clears nothing: the
    /// markers written since stay.
    #[test]
    fn stale_markers_do_not_count_for_a_fresh_temp_file() {
        let d = tempfile::tempdir().unwrap();
        let dir = File::open(d.path()).unwrap();
        let dir = dir.as_fd();
        let n = Names::new(b"f", 8, (1, 0), 4);
        mark(dir, &n, 0).unwrap();
        mark(dir, &n, 1).unwrap();
        assert!(!piece_done(dir, &n, 8, 0), "no temp file");
        drop(open(dir, &n, 8, 2).unwrap());
        assert!(!all_done(dir, &n, 2));
        assert_eq!(
            std::fs::metadata(
                d.path()
                    .join(std::ffi::OsStr::new(std::str::from_utf8(&n.tmp).unwrap()))
            )
            .unwrap()
            .len(),
            8
        );
        // Another sink opening the same temp file keeps the markers.
        mark(dir, &n, 0).unwrap();
        drop(open(dir, &n, 8, 2).unwrap());
        assert!(piece_done(dir, &n, 8, 0));
        // A long name stays within NAME_MAX.
        let long = vec![b'x'; 255];
        let n = Names::new(&long, 8, (1, 0), 4);
        assert!(n.marker(4095).len() <= 255);
    }
}
