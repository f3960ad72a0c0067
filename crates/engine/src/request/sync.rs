//! Incremental replication (`ramsys sync`, `cp --resume`; docs/SYNC.md).
//!
//! The sink answers the streamed metadata, in the same round trip as
//! SyncDone, with what it already holds (Have): unchanged files (size and
//! mtime), content digests (`--checksum`), or per-block hashes of an older
//! version or of an interrupted temp file. The source compares in parallel
//! and reads only what differs; the sink builds changed files from its old
//! copy plus the differing blocks. Deletions run after everything new is
//! in place.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};

use ramsys_proto::data::segment_hash;

pub use ramsys_proto::control::sync as flags;

/// The default journal (flags::JOURNAL without RESUME) keeps interrupted
/// files of at least this size: re-sending less is not worth a journal
/// row (issue 15; cost measured in docs/SYNC.md).
pub const JOURNAL_MIN: u64 = 64 << 20;

/// [`JOURNAL_MIN`], or `RAMSYS_JOURNAL_MIN` (bytes, or with a K/M/G
/// suffix) where set: the tests' files are smaller than the default.
pub fn journal_min() -> u64 {
    static MIN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        let v = std::env::var("RAMSYS_JOURNAL_MIN").unwrap_or_default();
        let v = v.trim();
        let (num, shift) = match v.chars().last() {
            Some('K' | 'k') => (&v[..v.len() - 1], 10),
            Some('M' | 'm') => (&v[..v.len() - 1], 20),
            Some('G' | 'g') => (&v[..v.len() - 1], 30),
            _ => (v, 0),
        };
        num.parse::<u64>()
            .map(|n| n << shift)
            .unwrap_or(JOURNAL_MIN)
    })
}

/// Flags that make a session compare with what the sink holds (all but
/// the default journal, which only keeps what an interruption leaves, and
/// the two that only say how to read DST).
pub const COMPARE: u32 = flags::ALL & !(flags::JOURNAL | flags::WRITE_DEVICES | flags::DEST_DIR);

/// Files below this size that changed in size are sent whole: their old
/// version is not worth reading and hashing.
pub const DELTA_MIN: u64 = 1 << 20;

/// Fixed delta block for a file of `size` bytes: 256 KiB, doubled until the
/// file has at most 16,384 blocks (so one file's hashes stay ≤ 160 KB on
/// the control link).
pub fn delta_block(size: u64) -> u32 {
    let mut b: u64 = 256 << 10;
    while size.div_ceil(b) > 16_384 && b < (64 << 20) {
        b *= 2;
    }
    b as u32
}

/// Hash of one block: the DATA segment hash keyed by file id and offset
/// (docs/PROTOCOL.md), never 0 (0 means "missing" in Have::Blocks).
pub fn block_hash(id: u64, off: u64, data: &[u8]) -> u64 {
    segment_hash(id, off, data).max(1)
}

/// Files from this size on are hashed by several threads, each over a
/// contiguous share of the blocks (a volume or a large image is one file:
/// one thread per side made its hashing the whole cost of a small delta).
pub const PAR_HASH_MIN: u64 = 1 << 30;

/// Hashes of the blocks of `f` (its first `size` bytes), block `i` hashed
/// only where `want(i)`; 0 elsewhere.
pub fn block_sums(
    f: &File,
    id: u64,
    size: u64,
    bs: u32,
    want: &(dyn Fn(usize) -> bool + Sync),
) -> std::io::Result<Vec<u64>> {
    let n = size.div_ceil(bs as u64) as usize;
    let mut out = vec![0u64; n];
    let threads = if size >= PAR_HASH_MIN {
        hash_threads()
    } else {
        1
    };
    if threads <= 1 {
        sums_into(f, id, size, bs, want, 0, &mut out)?;
        return Ok(out);
    }
    let per = n.div_ceil(threads);
    std::thread::scope(|s| {
        let jobs: Vec<_> = out
            .chunks_mut(per)
            .enumerate()
            .map(|(k, chunk)| s.spawn(move || sums_into(f, id, size, bs, want, k * per, chunk)))
            .collect();
        jobs.into_iter().try_for_each(|j| {
            j.join()
                .unwrap_or_else(|_| Err(std::io::Error::other("hash thread panicked")))
        })
    })?;
    Ok(out)
}

/// [`block_sums`] of blocks `first..first + out.len()`.
fn sums_into(
    f: &File,
    id: u64,
    size: u64,
    bs: u32,
    want: &(dyn Fn(usize) -> bool + Sync),
    first: usize,
    out: &mut [u64],
) -> std::io::Result<()> {
    // Sized to the file: small files are the common case, and zeroing a
    // full block per file would cost more than hashing it.
    let mut buf = vec![0u8; (bs as u64).min(size) as usize];
    for (j, slot) in out.iter_mut().enumerate() {
        let i = first + j;
        if !want(i) {
            continue;
        }
        let off = i as u64 * bs as u64;
        let len = (size - off).min(bs as u64) as usize;
        f.read_exact_at(&mut buf[..len], off)?;
        *slot = block_hash(id, off, &buf[..len]);
    }
    Ok(())
}

/// Fill a new temp file with the first `size` bytes of the old version:
/// a reflink where the file system shares extents (FICLONE), else
/// copy_file_range (in-kernel, no user-space copy).
pub fn copy_base(old: &File, new: &File, size: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    const FICLONE: libc::c_ulong = 0x4004_9409;
    // SAFETY: ioctl on two valid descriptors.
    if unsafe { libc::ioctl(new.as_raw_fd(), FICLONE as _, old.as_raw_fd()) } == 0 {
        return Ok(());
    }
    let len = old.metadata()?.len().min(size);
    let (mut off_in, mut off_out): (i64, i64) = (0, 0);
    while (off_in as u64) < len {
        let want = (len - off_in as u64).min(1 << 30) as usize;
        // SAFETY: valid descriptors and offset pointers.
        let n = unsafe {
            libc::copy_file_range(
                old.as_raw_fd(),
                &mut off_in,
                new.as_raw_fd(),
                &mut off_out,
                want,
                0,
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if n == 0 {
            break;
        }
    }
    Ok(())
}

/// Whole-file content digest (`--checksum`): xxh3-64 of the bytes, the
/// same on both sides whatever the file id.
pub fn content_digest(mut f: File) -> std::io::Result<u64> {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    // One read for a small file; at most 1 MiB at a time for a large one.
    let len = f.metadata()?.len();
    let mut buf = vec![0u8; len.clamp(1, 1 << 20) as usize];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(h.digest());
        }
        h.update(&buf[..n]);
    }
}

/// Map `f` over `items` on up to `threads` threads (comparisons read
/// files: in parallel, as the side holding each file does its own).
pub fn par_map<T: Sync, R: Send + Default + Clone>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let mut out = vec![R::default(); items.len()];
    if items.is_empty() {
        return out;
    }
    let next = AtomicUsize::new(0);
    let slots: Vec<std::sync::Mutex<&mut R>> = out.iter_mut().map(std::sync::Mutex::new).collect();
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, items.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= items.len() {
                    break;
                }
                let r = f(&items[i]);
                **slots[i].lock().unwrap() = r;
            });
        }
    });
    drop(slots);
    out
}

/// Threads for comparisons: the machine's CPUs, at most 8.
pub fn hash_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .min(8)
}

/// Byte ranges to send for a file of `size` bytes, given the sink's block
/// hashes of its base (`base_size` bytes) and ours: runs of differing
/// blocks merged, each at most `max_run` bytes. Returns (ranges, bytes
/// reused).
pub fn diff_ranges(
    ours: &[u64],
    theirs: &[u64],
    bs: u32,
    size: u64,
    base_size: u64,
    max_run: u64,
) -> (Vec<(u64, u64)>, u64) {
    let bs = bs as u64;
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    let mut reused = 0;
    for (i, h) in ours.iter().enumerate() {
        let off = i as u64 * bs;
        let len = (size - off).min(bs);
        // A block matches only if the sink's block covers the same bytes.
        let same = theirs.get(i).is_some_and(|t| *t != 0 && t == h) && off + len <= base_size;
        if same {
            reused += len;
            continue;
        }
        match ranges.last_mut() {
            Some((o, l)) if *o + *l == off && *l + len <= max_run => *l += len,
            _ => ranges.push((off, len)),
        }
    }
    (ranges, reused)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_size_bounds_hash_count() {
        assert_eq!(delta_block(0), 256 << 10);
        assert_eq!(delta_block(4 << 30), 256 << 10);
        assert!((100u64 << 30).div_ceil(delta_block(100 << 30) as u64) <= 16_384);
    }

    #[test]
    fn diff_merges_runs_and_counts_reuse() {
        let ours = [1, 2, 3, 4, 5];
        let theirs = [1, 9, 9, 4];
        // Block 4 (the tail) is new: the base is shorter.
        let (r, reused) = diff_ranges(&ours, &theirs, 10, 45, 40, 100);
        assert_eq!(r, vec![(10, 20), (40, 5)]);
        assert_eq!(reused, 20);
        // Missing (0) hashes are always sent; runs split at max_run.
        let (r, reused) = diff_ranges(&[7, 7, 7], &[0, 0, 0], 10, 30, 30, 20);
        assert_eq!(r, vec![(0, 20), (20, 10)]);
        assert_eq!(reused, 0);
    }

    #[test]
    fn parallel_block_sums_equal_serial() {
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        let p = d.path().join("f");
        let f = File::create(&p).unwrap();
        // Sparse: cheap to make at PAR_HASH_MIN, a few data blocks.
        f.set_len(PAR_HASH_MIN + 12345).unwrap();
        for off in [0u64, 7 << 20, PAR_HASH_MIN / 2 + 1, PAR_HASH_MIN + 12000] {
            f.write_all_at(&[off as u8 | 1; 300], off).unwrap();
        }
        let f = File::open(&p).unwrap();
        let size = f.metadata().unwrap().len();
        let bs = delta_block(size);
        let want = |i: usize| i % 3 != 1;
        let par = block_sums(&f, 5, size, bs, &want).unwrap();
        let mut ser = vec![0u64; par.len()];
        sums_into(&f, 5, size, bs, &want, 0, &mut ser).unwrap();
        assert_eq!(par, ser);
        assert_eq!(par[1], 0);
        assert_ne!(par[0], 0);
    }

    #[test]
    fn par_map_keeps_order() {
        let v: Vec<u64> = (0..1000).collect();
        let r = par_map(&v, 4, |x| x * 2);
        assert_eq!(r, v.iter().map(|x| x * 2).collect::<Vec<_>>());
    }
}
