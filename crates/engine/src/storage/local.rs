//! Local copies without the network (issue 17): when source and sink run
//! in one process (`ramsys cp SRC DST` with both local), large files do
//! not travel through buffers and loopback TCP. The source still plans,
//! packs and ships blocks, but for a large file each block carries only
//! *local-copy* segments (ramsys_proto::data::COPY_FLAG: position and
//! length, no bytes), and the sink's writer copies that range from the
//! source file itself with copy_file_range(2), which the kernel does
//! without a user-space copy (and as a reflink where the file system
//! shares extents, e.g. XFS or Btrfs). Walk, metadata round trip, temp
//! name + rename, resume journal, failure handling and reports are the
//! ones every transfer uses; only the bytes take the short way.
//!
//! The [`LocalBridge`] is how the sink finds the source file of an entry
//! id: the source publishes its file list once the scan is done (before
//! any block is sent). A sink without a bridge (every daemon that serves
//! the network) rejects local-copy segments.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use crate::storage::fsops::Root;
use crate::types::file::LiveFiles;

/// Files at least this large are copied in the kernel; smaller ones are
/// packed into blocks as usual (a block of many small files costs fewer
/// system calls than a copy_file_range per file).
pub const LOCAL_COPY_MIN: u64 = 1 << 20;

/// Whether a local-copy segment of file `id` may join a block whose
/// segments are `segs`: only the same file's copy ranges. Each large
/// file's copy then travels in a block of its own and goes to whichever
/// sink writer is free, so the writers copy different files at once. One
/// block of every file's ranges kept 4 x 1 GiB on one writer, one core;
/// 64 MiB blocks of one file on two writers doubled the CPU for the same
/// wall (the writers wait on the file's inode lock, spinning) (BENCHMARKS
/// "Local copies").
pub fn joins_copy_block(segs: &[ramsys_proto::data::Segment], id: u64) -> bool {
    segs.last().is_none_or(|l| l.is_copy() && l.file_id == id)
}

/// The source's files, by entry id, shared with the in-process sink.
/// Published again by every session: a continuous replication job (issue
/// 38) runs session after session, one at a time, through one bridge.
#[derive(Default)]
pub struct LocalBridge {
    files: Mutex<Option<Arc<Published>>>,
}

/// One session's source root and its files' paths by entry id.
type Published = (Arc<Root>, LiveFiles);

impl std::fmt::Debug for LocalBridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LocalBridge")
    }
}

impl LocalBridge {
    /// The source: its regular files under `root`, ids ascending (the
    /// walk's order; its own list, not a copy of every path: issue 36).
    /// Set by each session before it sends any block (replacing the
    /// previous session's).
    pub fn publish(&self, root: Arc<Root>, files: LiveFiles) {
        *self.files.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new((root, files)));
    }

    /// The sink: open entry `id`'s source file for reading.
    pub fn open(&self, id: u64) -> io::Result<File> {
        let files = self
            .files
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| io::Error::other("local copy before the source's file list"))?;
        let (root, files) = &*files;
        match files.find(id) {
            Some(f) => root.open_read(&f.rel, false),
            None => Err(io::Error::other(format!(
                "local copy of unknown entry {id}"
            ))),
        }
    }
}

/// Copy `len` bytes at `off` from `src` to the same offset of `dst`:
/// copy_file_range(2), or read and write through `scratch` where the
/// kernel cannot (another file system type, an old kernel).
pub fn copy_range(
    src: &File,
    dst: &File,
    off: u64,
    len: u64,
    scratch: &mut Vec<u8>,
) -> io::Result<()> {
    let (mut o_in, mut o_out) = (off as i64, off as i64);
    let end = off + len;
    while (o_out as u64) < end {
        let want = (end - o_out as u64).min(1 << 30) as usize;
        // SAFETY: two open descriptors and offsets owned by this frame.
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut o_in,
                dst.as_raw_fd(),
                &mut o_out,
                want,
                0,
            )
        };
        if n > 0 {
            continue;
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "source file shorter than announced",
            ));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EXDEV | libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => {
                return copy_by_hand(src, dst, o_out as u64, end, scratch)
            }
            _ => return Err(e),
        }
    }
    Ok(())
}

fn copy_by_hand(
    src: &File,
    dst: &File,
    mut off: u64,
    end: u64,
    scratch: &mut Vec<u8>,
) -> io::Result<()> {
    if scratch.is_empty() {
        // Once per writer thread, only where the kernel cannot copy.
        scratch.resize(1 << 20, 0);
    }
    while off < end {
        let n = (end - off).min(scratch.len() as u64) as usize;
        src.read_exact_at(&mut scratch[..n], off)?;
        dst.write_all_at(&scratch[..n], off)?;
        off += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::fsops::Confinement;

    #[test]
    fn copies_ranges_in_place_and_finds_files_by_entry_id() {
        let d = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(d.path().join("src"), &data).unwrap();
        let root = Arc::new(Root::open(d.path(), Confinement::Strict).unwrap());
        let bridge = LocalBridge::default();
        assert!(bridge.open(1).is_err(), "nothing published yet");
        let src = crate::types::file::SourceFile::plain(1, b"src", data.len() as u64);
        bridge.publish(root, LiveFiles::whole(Arc::new(vec![src])));
        assert!(bridge.open(0).is_err(), "entry 0 is not a file");
        assert!(bridge.open(9).is_err(), "no such entry");
        let src = bridge.open(1).unwrap();
        let dst = File::create(d.path().join("dst")).unwrap();
        dst.set_len(data.len() as u64).unwrap();
        let mut scratch = Vec::new();
        // Out of order, as blocks arrive on several streams.
        copy_range(&src, &dst, 2_000_000, 1_000_000, &mut scratch).unwrap();
        copy_range(&src, &dst, 0, 2_000_000, &mut scratch).unwrap();
        assert_eq!(std::fs::read(d.path().join("dst")).unwrap(), data);
        // The hand-made path gives the same bytes.
        let dst2 = File::create(d.path().join("dst2")).unwrap();
        copy_by_hand(&src, &dst2, 0, data.len() as u64, &mut scratch).unwrap();
        assert_eq!(std::fs::read(d.path().join("dst2")).unwrap(), data);
        // A source shorter than announced is an error, not a hang.
        let e = copy_range(&src, &dst, 2_999_000, 5_000, &mut scratch).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }
}
