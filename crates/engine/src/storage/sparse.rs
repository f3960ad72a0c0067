//! Data/hole maps of sparse files (SEEK_DATA/SEEK_HOLE, lseek(2)).
//!
//! The reader sends a hole as a hole segment (no payload bytes, see
//! ramsys_proto::data::HOLE_FLAG) instead of zeros; the sink creates every
//! file at its final size (ftruncate) and skips hole segments, so holes
//! stay holes and the size is right even when a file ends in a hole. A
//! hole's hash is bound to its offset and length, so the whole-file digest
//! still covers every byte range of the file.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// A run of a file: data to read, or a hole that reads as zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece {
    Data {
        off: u64,
        len: u64,
    },
    Hole {
        off: u64,
        len: u64,
    },
    /// Data the in-process sink copies itself (storage::local).
    Copy {
        off: u64,
        len: u64,
    },
}

/// Whether a file may have holes: fewer blocks allocated than its size
/// needs (cheap test from fstat, so dense files skip the lseek calls).
pub fn may_be_sparse(st_blocks: u64, size: u64) -> bool {
    st_blocks.saturating_mul(512) < size
}

fn seek(f: &File, off: u64, whence: i32) -> io::Result<Option<u64>> {
    // SAFETY: plain lseek on an open descriptor.
    let r = unsafe { libc::lseek(f.as_raw_fd(), off as libc::off_t, whence) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENXIO) {
            return Ok(None);
        }
        return Err(e);
    }
    Ok(Some(r as u64))
}

/// Split `[start, end)` of `f` into data and holes, appended to `out`.
/// File systems without SEEK_DATA get one data piece.
pub fn map_range(f: &File, start: u64, end: u64, out: &mut Vec<Piece>) -> io::Result<()> {
    let mut off = start;
    while off < end {
        let data = match seek(f, off, libc::SEEK_DATA) {
            Ok(Some(d)) => d.min(end),
            // Nothing but hole up to end of file.
            Ok(None) => end,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINVAL) | Some(libc::EOPNOTSUPP)
                ) =>
            {
                out.push(Piece::Data {
                    off,
                    len: end - off,
                });
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        if data > off {
            out.push(Piece::Hole {
                off,
                len: data - off,
            });
            off = data;
            if off >= end {
                break;
            }
        }
        let hole = match seek(f, off, libc::SEEK_HOLE)? {
            Some(h) => h.min(end),
            None => end,
        };
        // A hole offset at or before `off` would loop forever: the file
        // changed under us; read the rest as data (the final mtime check
        // reports the change).
        if hole <= off {
            out.push(Piece::Data {
                off,
                len: end - off,
            });
            return Ok(());
        }
        out.push(Piece::Data {
            off,
            len: hole - off,
        });
        off = hole;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileExt, MetadataExt};

    #[test]
    fn maps_holes_and_data() {
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        let p = d.path().join("s");
        let f = File::create(&p).unwrap();
        f.set_len(10 << 20).unwrap();
        f.write_at(&[1u8; 8192], 4 << 20).unwrap();
        f.sync_all().unwrap();
        let f = File::open(&p).unwrap();
        let md = f.metadata().unwrap();
        assert!(may_be_sparse(md.blocks(), md.len()));
        let mut v = Vec::new();
        map_range(&f, 0, 10 << 20, &mut v).unwrap();
        let total: u64 = v
            .iter()
            .map(|p| match p {
                Piece::Data { len, .. } | Piece::Hole { len, .. } | Piece::Copy { len, .. } => *len,
            })
            .sum();
        assert_eq!(total, 10 << 20);
        assert!(
            v.contains(&Piece::Hole {
                off: 0,
                len: 4 << 20
            }),
            "{v:?}"
        );
        assert!(
            v.iter()
                .any(|p| matches!(p, Piece::Data { off, .. } if *off == 4 << 20)),
            "{v:?}"
        );
        assert!(matches!(v.last(), Some(Piece::Hole { .. })), "{v:?}");
        // A sub-range inside the data.
        v.clear();
        map_range(&f, (4 << 20) + 100, (4 << 20) + 200, &mut v).unwrap();
        assert_eq!(
            v,
            vec![Piece::Data {
                off: (4 << 20) + 100,
                len: 100
            }]
        );
    }
}
