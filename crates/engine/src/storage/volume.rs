//! Volumes (issue 18, seed 002's block-device replication): a block device
//! named as SRC or DST of `cp`/`sync` is a file of the device's size.
//!
//! - Reading: the size comes from BLKGETSIZE64 (st_size of a device node is
//!   0); a device has no SEEK_DATA map, so the reader finds zero runs in what
//!   it read ([`zero_runs`], [`ZERO_GRAIN`] granules) and sends them as hole
//!   segments: an empty or thin-provisioned volume crosses the wire as
//!   holes, as a sparse image file does.
//! - Writing: only with `--write-devices` (sync flag WRITE_DEVICES), into a
//!   device at least as large as the source, in place (a device node cannot
//!   be replaced by a renamed temp file), never truncated; a hole segment
//!   zeroes its range (the device holds old data there, unlike a fresh
//!   temp file); after the last write the sink re-reads every range it
//!   wrote and compares the segment hashes with the source's digest
//!   ([`VolumeLog`]).
//! - A regular file built from a base (sync, resume) gets hole segments
//!   punched out for the same reason ([`zero_range`]).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::sync::Mutex;

use ramsys_proto::data::{marker_hash, segment_hash, Segment};

/// BLKGETSIZE64 = _IOR(0x12, 114, size_t).
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
/// BLKZEROOUT = _IO(0x12, 127): arg is {start, len}, 512-byte aligned.
const BLKZEROOUT: libc::c_ulong = 0x127f;

/// Granule of zero detection in what the reader read from a device: 64 KiB
/// (a run of zeros shorter than this travels as data; smaller granules
/// cost more segments per block than the few bytes they save).
pub const ZERO_GRAIN: usize = 64 << 10;

/// Whether `md` (an lstat or stat) is a block device.
pub fn is_block(md: &std::fs::Metadata) -> bool {
    md.file_type().is_block_device()
}

/// Whether a raw stat is a block device.
pub fn is_block_stat(st: &crate::storage::fsops::Stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFBLK
}

/// Size in bytes of an open block device.
pub fn device_size(f: &File) -> io::Result<u64> {
    let mut n: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 to the pointer.
    if unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64 as _, &mut n as *mut u64) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n)
}

/// Size of the block device at `path` (opened read-only to ask).
pub fn device_size_at(path: &Path) -> io::Result<u64> {
    device_size(&File::open(path)?)
}

/// Whether every byte of `b` is zero (word at a time: this runs over every
/// byte read from a device, at memory speed).
pub fn is_zero(b: &[u8]) -> bool {
    // SAFETY: every bit pattern is a valid u128.
    let (pre, mid, post) = unsafe { b.align_to::<u128>() };
    pre.iter().all(|&x| x == 0) && mid.iter().all(|&x| x == 0) && post.iter().all(|&x| x == 0)
}

/// Split `data` (read at file offset `off`) into alternating runs of data
/// and zeros at [`ZERO_GRAIN`] granules aligned to file offsets; calls
/// `run(rel_start, len, zero)` per maximal run, in order.
pub fn zero_runs(data: &[u8], off: u64, mut run: impl FnMut(usize, usize, bool)) {
    let n = data.len();
    let mut p = 0;
    let mut cur: Option<(usize, bool)> = None;
    while p < n {
        // Granules end at multiples of ZERO_GRAIN in the file.
        let into = ((off + p as u64) % ZERO_GRAIN as u64) as usize;
        let g = (ZERO_GRAIN - into).min(n - p);
        let z = is_zero(&data[p..p + g]);
        match cur {
            Some((s, cz)) if cz != z => {
                run(s, p - s, cz);
                cur = Some((p, z));
            }
            None => cur = Some((p, z)),
            _ => {}
        }
        p += g;
    }
    if let Some((s, z)) = cur {
        run(s, n - s, z);
    }
}

/// Most segments [`zero_runs`] can make of `len` bytes at `off`.
pub fn max_runs(off: u64, len: usize) -> usize {
    let into = (off % ZERO_GRAIN as u64) as usize;
    (into + len).div_ceil(ZERO_GRAIN)
}

/// Make `[off, off+len)` of `f` read as zeros: a device gets the range
/// zeroed by the kernel (fallocate ZERO_RANGE, else BLKZEROOUT, which thin
/// and loop devices turn into discards), a regular file a punched hole;
/// where neither is supported, zeros are written.
pub fn zero_range(f: &File, off: u64, len: u64) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let fd = f.as_raw_fd();
    let block = f.metadata()?.file_type().is_block_device();
    let mode = if block {
        libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE
    } else {
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
    };
    // SAFETY: fallocate on an open descriptor.
    if unsafe { libc::fallocate(fd, mode, off as libc::off_t, len as libc::off_t) } == 0 {
        return Ok(());
    }
    if block && off.is_multiple_of(512) && len.is_multiple_of(512) {
        let range = [off, len];
        // SAFETY: BLKZEROOUT reads two u64.
        if unsafe { libc::ioctl(fd, BLKZEROOUT as _, range.as_ptr()) } == 0 {
            return Ok(());
        }
    }
    let zeros = vec![0u8; len.min(1 << 20) as usize];
    let mut o = off;
    while o < off + len {
        let n = (off + len - o).min(zeros.len() as u64) as usize;
        crate::storage::fsops::pwrite_all(f, &zeros[..n], o)?;
        o += n as u64;
    }
    Ok(())
}

/// The one-line refusal for a device DST, or None when it may be written:
/// `--write-devices` given and the device at least `need` bytes.
pub fn refusal(dest: &str, allowed: bool, dev_size: u64, need: u64) -> Option<String> {
    if !allowed {
        return Some(format!(
            "destination {dest} is a block device: writing into it needs --write-devices \
             (nothing was written)"
        ));
    }
    if dev_size < need {
        return Some(format!(
            "destination device {dest} holds {dev_size} bytes, the source {need}: too small \
             (nothing was written)"
        ));
    }
    None
}

/// `rel` under `root` as the user named it (the device's path).
pub fn shown(root: &crate::storage::fsops::Root, rel: &[u8]) -> String {
    use std::os::unix::ffi::OsStrExt;
    root.path()
        .join(std::ffi::OsStr::from_bytes(rel))
        .display()
        .to_string()
}

/// The sink's check of a device DST for a source of `size` bytes, before
/// anything is written (`--write-devices` was checked when DST was read).
pub fn accept_target(
    root: &crate::storage::fsops::Root,
    rel: &[u8],
    size: u64,
) -> Result<(), String> {
    let name = shown(root, rel);
    let dev = root
        .open_read(rel, false)
        .and_then(|f| device_size(&f))
        .map_err(|e| format!("destination device {name}: {e}"))?;
    match refusal(&name, true, dev, size) {
        Some(m) => Err(m),
        None => Ok(()),
    }
}

/// Fault injection for the verification test: `RAMSYS_FAULT_VOLUME_CORRUPT=OFF`
/// makes the sink flip the byte at OFF of a device it wrote, behind its own
/// back, just before reading it back (a device that lost a write).
pub fn corrupt_fault(root: &crate::storage::fsops::Root, rel: &[u8]) {
    static OFF: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    let off = *OFF.get_or_init(|| {
        std::env::var("RAMSYS_FAULT_VOLUME_CORRUPT")
            .ok()
            .and_then(|v| v.parse().ok())
    });
    let Some(off) = off else { return };
    if let Ok(fd) = root.openat(rel, libc::O_RDWR | libc::O_NOFOLLOW, 0) {
        let f = File::from(fd);
        let mut b = [0u8];
        if crate::storage::fsops::pread_full(&f, &mut b, off).is_ok() {
            let _ = crate::storage::fsops::pwrite_all(&f, &[!b[0]], off);
            let _ = f.sync_all();
        }
    }
}

/// What the sink wrote into a device in this session, to verify it by
/// reading it back: the segments (data, hole or local copy), in arrival
/// order.
/// Only device destinations keep one (one per session in practice), so the
/// mutex is per volume, not per block of a tree.
#[derive(Debug, Default)]
pub struct VolumeLog {
    segs: Mutex<Vec<Segment>>,
}

impl VolumeLog {
    pub fn note(&self, seg: &Segment) {
        self.segs.lock().unwrap().push(*seg);
    }

    /// Re-read every logged range of `dev` (a fresh descriptor after the
    /// writes were flushed) and return the sum of the segment hashes, as
    /// the source computed them for file `id`. The page cache is dropped
    /// first (BLKFLSBUF after fsync), so what is read is what the device
    /// holds. A local copy's range is compared with `source` (the file the
    /// kernel copied from; its hash is a marker, not of the bytes).
    pub fn reread_digest(&self, dev: &File, id: u64, source: Option<&File>) -> io::Result<u64> {
        dev.sync_all()?;
        const BLKFLSBUF: libc::c_ulong = 0x1261;
        // SAFETY: BLKFLSBUF takes no argument; failure (not a device,
        // no permission) only means the re-read may come from the cache.
        unsafe { libc::ioctl(dev.as_raw_fd(), BLKFLSBUF as _, 0) };
        let segs = self.segs.lock().unwrap();
        let (mut buf, mut theirs) = (Vec::new(), Vec::new());
        let mut sum = 0u64;
        let read = |f: &File, buf: &mut Vec<u8>, off: u64, len: usize| -> io::Result<()> {
            buf.resize(len, 0);
            let n = crate::storage::fsops::pread_full(f, buf, off)?;
            if n < len {
                return Err(io::Error::other(format!(
                    "ended at offset {}",
                    off + n as u64
                )));
            }
            Ok(())
        };
        for seg in segs.iter() {
            let (off, len) = (seg.offset, seg.span());
            // Segments are at most a block (≤ 64 MiB); copies and holes may
            // be longer and are compared a MiB at a time.
            let mut o = off;
            while o < off + len {
                let n = (off + len - o).min(if seg.is_hole() { 1 << 20 } else { len }) as usize;
                read(dev, &mut buf, o, n)?;
                if seg.is_copy() {
                    let src =
                        source.ok_or_else(|| io::Error::other("local copy without its source"))?;
                    read(src, &mut theirs, o, n)?;
                    if buf != theirs {
                        return Err(io::Error::other(format!(
                            "range at offset {o} differs from the source"
                        )));
                    }
                } else if seg.is_hole() && !is_zero(&buf) {
                    return Err(io::Error::other(format!(
                        "zeroed range at offset {o} does not read as zeros"
                    )));
                }
                o += n as u64;
            }
            let h = if seg.is_hole() {
                marker_hash(&Segment {
                    file_id: id,
                    ..*seg
                })
            } else {
                segment_hash(id, off, &buf)
            };
            sum = sum.wrapping_add(h);
        }
        Ok(sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_runs_alternate_at_grain_boundaries() {
        let g = ZERO_GRAIN;
        let mut d = vec![0u8; 5 * g];
        d[g + 7] = 1; // granule 1 is data
        d[3 * g] = 1; // granules 3 is data
        d[4 * g - 1] = 1;
        let mut v = Vec::new();
        zero_runs(&d, 0, |s, n, z| v.push((s, n, z)));
        assert_eq!(
            v,
            vec![
                (0, g, true),
                (g, g, false),
                (2 * g, g, true),
                (3 * g, g, false),
                (4 * g, g, true)
            ]
        );
        // Unaligned start: the first granule ends at the next boundary.
        let mut v = Vec::new();
        zero_runs(&d[100..], 100, |s, n, z| v.push((s, n, z)));
        assert_eq!(v[0], (0, g - 100, true));
        assert_eq!(v.iter().map(|r| r.1).sum::<usize>(), 5 * g - 100);
        assert!(v.len() <= max_runs(100, 5 * g - 100));
        // All data: one run.
        let mut v = Vec::new();
        zero_runs(&[1u8; 1000], 0, |s, n, z| v.push((s, n, z)));
        assert_eq!(v, vec![(0, 1000, false)]);
    }

    #[test]
    fn is_zero_checks_every_byte() {
        let mut b = vec![0u8; 4099];
        assert!(is_zero(&b));
        for i in [0, 1, 17, 4096, 4098] {
            b[i] = 1;
            assert!(!is_zero(&b), "{i}");
            assert!(!is_zero(&b[1..]) || i == 0);
            b[i] = 0;
        }
    }

    #[test]
    fn refusals_are_one_line() {
        assert!(refusal("/dev/x", false, 10, 1)
            .unwrap()
            .contains("--write-devices"));
        assert!(refusal("/dev/x", true, 10, 11)
            .unwrap()
            .contains("too small"));
        assert!(refusal("/dev/x", true, 10, 10).is_none());
    }

    #[test]
    fn punched_range_reads_as_zeros_and_log_verifies() {
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        let p = d.path().join("img");
        std::fs::write(&p, vec![7u8; 1 << 20]).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        zero_range(&f, 4096, 8192).unwrap();
        let b = std::fs::read(&p).unwrap();
        assert_eq!(b.len(), 1 << 20);
        assert!(is_zero(&b[4096..12288]));
        assert_eq!(b[4095], 7);
        assert_eq!(b[12288], 7);
        let log = VolumeLog::default();
        log.note(&Segment::hole(3, 4096, 8192));
        log.note(&Segment {
            file_id: 3,
            offset: 12288,
            len: 100,
        });
        let want = marker_hash(&Segment::hole(3, 4096, 8192)).wrapping_add(segment_hash(
            3,
            12288,
            &[7u8; 100],
        ));
        assert_eq!(log.reread_digest(&f, 3, None).unwrap(), want);
        // A byte changed behind the sink's back fails the comparison.
        crate::storage::fsops::pwrite_all(&f, &[9], 12300).unwrap();
        assert_ne!(log.reread_digest(&f, 3, None).unwrap(), want);
        // A local copy is compared with its source.
        let log = VolumeLog::default();
        log.note(&Segment::copy(3, 0, 4096));
        let same = File::open(&p).unwrap();
        assert!(log.reread_digest(&f, 3, Some(&same)).is_ok());
        let other = d.path().join("other");
        std::fs::write(&other, vec![1u8; 8192]).unwrap();
        let other = File::open(&other).unwrap();
        assert!(log.reread_digest(&f, 3, Some(&other)).is_err());
    }
}
