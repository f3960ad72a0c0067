//! Per-device queues of read units (seed 000 Fig. 6-3 and Fig. 6-7).
//!
//! Files are grouped by the device that holds them, so each device is read
//! by its own readers, as many as its type wants (one for a rotational
//! disk, several for SSD, NVMe and memory; storage::DeviceThreads).
//! Per file, from its size and the device type (Fig. 6-7, Fig. 6-13):
//! - pipelining: a file is one unit and one reader reads it whole while
//!   other readers read other files (small files, and medium files on
//!   flash, which favours concurrent access);
//! - striping: a large file is cut into chunks several readers take at
//!   once. Chunks are longer on a rotational disk (64 MiB vs 16 MiB) so
//!   each stays a long sequential run.
//!
//! A rotational device's queue is sorted by the physical address of each
//! file's first extent (FIEMAP, sec. 6.2.2 "file sorting"), or by inode
//! number where the file system cannot say; other queues by inode number
//! (no seeks to save, no syscalls spent); `--no-sort` keeps scan order. Readers take
//! units through an atomic cursor (no lock) and steal from other flash or
//! memory queues when their own runs dry (seed 000 sec. 7.2.3); nobody
//! steals from a rotational queue, which would add a second head position.

use std::os::unix::ffi::OsStrExt;

use crate::data::queue::{DeviceQueue, ReadUnit};
use crate::storage::extents::ExtentSource;
use crate::storage::fsops::Root;
use crate::storage::{DeviceKind, DeviceThreads};
use crate::types::file::SourceFile;

/// Size of a striping chunk for a given block size (16 MiB on flash and
/// memory).
pub fn stripe_chunk(block_size: u64) -> u64 {
    chunk_for(DeviceKind::Ssd, block_size)
}

/// Striping chunk for a device type, a whole number of blocks.
pub fn chunk_for(kind: DeviceKind, block_size: u64) -> u64 {
    let base: u64 = if kind == DeviceKind::Rotational {
        64 << 20
    } else {
        16 << 20
    };
    base.max(block_size).div_ceil(block_size) * block_size
}

/// How queues are planned.
#[derive(Debug, Clone, Copy)]
pub struct PlanOptions {
    pub block_size: u64,
    /// Sort by physical location (else scan order).
    pub sort: bool,
    pub threads: DeviceThreads,
}

/// Build per-device queues in scan order, every device taken as flash
/// (no probing; kept for callers without a root).
pub fn plan_units(files: &[SourceFile], block_size: u64) -> Vec<DeviceQueue> {
    let po = PlanOptions {
        block_size,
        sort: false,
        threads: DeviceThreads::default(),
    };
    plan(files, &po, &|_| DeviceKind::Ssd, None)
}

/// Build per-device queues. `kind_of` names the device type of a file's
/// device (called once per device); `extents` (root and extent source)
/// gives physical addresses when sorting.
pub fn plan(
    files: &[SourceFile],
    po: &PlanOptions,
    kind_of: &dyn Fn(&SourceFile) -> DeviceKind,
    extents: Option<(&Root, &dyn ExtentSource)>,
) -> Vec<DeviceQueue> {
    plan_some(files, po, kind_of, extents, &|_| false)
}

/// [`plan`] leaving out the files `skip` names (by index): a sync reads
/// only changed files, and locating the others (FIEMAP: open, ioctl,
/// close per file) would cost more than the whole unchanged run.
pub fn plan_some(
    files: &[SourceFile],
    po: &PlanOptions,
    kind_of: &dyn Fn(&SourceFile) -> DeviceKind,
    extents: Option<(&Root, &dyn ExtentSource)>,
    skip: &dyn Fn(usize) -> bool,
) -> Vec<DeviceQueue> {
    plan_probed(files, po, kind_of, extents, skip, &|_| false)
}

/// [`plan_some`] asking `cached` (with a device's file indices) whether a
/// rotational device's files are in the page cache: such a queue is read
/// like memory (several readers, no FIEMAP, inode order), since reading
/// cached pages moves no head.
pub fn plan_probed(
    files: &[SourceFile],
    po: &PlanOptions,
    kind_of: &dyn Fn(&SourceFile) -> DeviceKind,
    extents: Option<(&Root, &dyn ExtentSource)>,
    skip: &dyn Fn(usize) -> bool,
    cached: &dyn Fn(&[u32]) -> bool,
) -> Vec<DeviceQueue> {
    let groups = by_device(files, skip);
    let mut queues = Vec::with_capacity(groups.len());
    for (dev, mut idx) in groups {
        let mut kind = kind_of(&files[idx[0] as usize]);
        let was_cached = kind == DeviceKind::Rotational && small_files(files, &idx) && cached(&idx);
        if was_cached {
            kind = DeviceKind::Memory;
        }
        let mut q = DeviceQueue::new(dev, kind, po.threads.for_kind(kind));
        q.cached = was_cached;
        // Sorting by first extent saves head seeks (seed 000 sec. 6.2.2);
        // flash and memory have none to save, and locating costs an open,
        // an ioctl and a close per file (a third of the source's syscalls
        // on a tree of small files): they sort by inode, which is free.
        if po.sort {
            let locate = extents.filter(|_| kind == DeviceKind::Rotational);
            sort_by_location(files, &mut idx, locate);
        }
        tracing::debug!(
            dev,
            kind = kind.name(),
            threads = q.threads,
            files = idx.len(),
            sorted = po.sort,
            cached = q.cached,
            "read queue"
        );
        let chunk = chunk_for(kind, po.block_size);
        q.units.reserve_exact(idx.len());
        for i in idx {
            let f = &files[i as usize];
            // A piece of a big file (issue 19) reads its range only.
            let (start, end) = f.span();
            q.bytes += end - start;
            if end - start >= 2 * chunk {
                let mut off = start;
                while off < end {
                    let len = chunk.min(end - off);
                    q.units.push(ReadUnit::new(i, off, len));
                    off += len;
                }
            } else {
                q.units.push(ReadUnit::new(i, start, end - start));
            }
        }
        queues.push(q);
    }
    queues
}

/// Order `idx` by first-extent address; files whose address is unknown
/// go after the located ones, by inode. Where no file of the device can
/// be located (no FIEMAP), this is plain inode order, which on most file
/// systems follows allocation order.
fn sort_by_location(
    files: &[SourceFile],
    idx: &mut [u32],
    extents: Option<(&Root, &dyn ExtentSource)>,
) {
    let mut keys: Vec<(u64, u64, u32)> = idx
        .iter()
        .map(|&i| {
            let f = &files[i as usize];
            let phys = extents.and_then(|(r, e)| e.first_physical(r, f));
            (phys.unwrap_or(u64::MAX), f.ino, i)
        })
        .collect();
    keys.sort_unstable();
    for (slot, k) in idx.iter_mut().zip(keys) {
        *slot = k.2;
    }
}

/// Queues for a source session: device types from sysfs/statfs, sorted
/// by FIEMAP when `po.sort`. A null source (`engine`) reads nothing: its
/// files are taken as memory and not located. Files `skip` names are left
/// out.
pub fn plan_source(
    root: &Root,
    files: &[SourceFile],
    po: &PlanOptions,
    engine: crate::storage::DataEngine,
    skip: &dyn Fn(usize) -> bool,
) -> Vec<DeviceQueue> {
    let po = *po;
    if engine == crate::storage::DataEngine::Null {
        return plan_some(files, &po, &|_| DeviceKind::Memory, None, skip);
    }
    let kind_of = |f: &SourceFile| {
        let p = root.path().join(std::ffi::OsStr::from_bytes(&f.rel));
        crate::storage::device::device_kind(f.dev, &p)
    };
    plan_probed(
        files,
        &po,
        &kind_of,
        Some((root, &crate::storage::extents::Fiemap)),
        skip,
        &|idx| mostly_cached(root, files, idx),
    )
}

/// The indices of `files` with data (and not `skip`ped), grouped by
/// device, each group in scan order.
fn by_device(files: &[SourceFile], skip: &dyn Fn(usize) -> bool) -> Vec<(u64, Vec<u32>)> {
    let mut groups: Vec<(u64, Vec<u32>)> = Vec::new();
    for (i, f) in files.iter().enumerate() {
        if f.is_empty() || skip(i) {
            continue;
        }
        match groups.iter_mut().find(|g| g.0 == f.dev) {
            Some(g) => g.1.push(i as u32),
            None => groups.push((f.dev, vec![i as u32])),
        }
    }
    groups
}

/// The reader threads that `files`' cached queues would have (the sum of
/// [`DeviceQueue::threads`] over the queues [`plan_source`] marks
/// `cached`), found without planning: no FIEMAP, a sample of each
/// device's files. A windowed source (issue 36) sizes its readers from its
/// first window this way, before any window is planned: without it a warm
/// tree kept the one reader of a cold disk.
pub fn cached_threads(
    root: &Root,
    files: &[SourceFile],
    po: &PlanOptions,
    engine: crate::storage::DataEngine,
) -> usize {
    if engine == crate::storage::DataEngine::Null {
        return 0;
    }
    let groups = by_device(files, &|_| false);
    let kind_of = |f: &SourceFile| {
        let p = root.path().join(std::ffi::OsStr::from_bytes(&f.rel));
        crate::storage::device::device_kind(f.dev, &p)
    };
    groups
        .iter()
        .filter(|(_, idx)| {
            kind_of(&files[idx[0] as usize]) == DeviceKind::Rotational
                && small_files(files, idx)
                && mostly_cached(root, files, idx)
        })
        .map(|_| po.threads.for_kind(DeviceKind::Memory))
        .sum()
}

/// Mean file size under which a cached rotational queue is read like
/// memory. Small files are what one reader and a FIEMAP per file slow
/// down (the 48k-file tree); a queue of large files keeps the disk's
/// rules: on the quiet VM the 4 x 1 GiB bulk push went from about 2.5 s
/// and 4 CPU-s to 5-6 s and 9 CPU-s with 4 readers and the inline path.
const SMALL_MEAN: u64 = 256 << 10;

fn small_files(files: &[SourceFile], idx: &[u32]) -> bool {
    let total: u64 = idx.iter().map(|&i| files[i as usize].size).sum();
    !idx.is_empty() && total / (idx.len() as u64) < SMALL_MEAN
}

/// Files sampled per device by [`mostly_cached`].
const CACHE_SAMPLES: usize = 16;

/// Whether `idx`'s files are in the page cache, judged from up to
/// CACHE_SAMPLES files spread over the list (an open, a cachestat and a
/// close each): at least 90 % of the sampled bytes resident. A warm tree
/// on a disk that says it is rotational (or is: a virtio disk backed by
/// the host's cache and flash reports rotational=1) is then read by
/// several readers without FIEMAP: the 47,984-file tree pushed from this
/// VM's /dev/vda took 1.0 CPU-s at the source instead of 1.4 (docs/STORAGE.md).
pub fn mostly_cached(root: &Root, files: &[SourceFile], idx: &[u32]) -> bool {
    let step = idx.len().div_ceil(CACHE_SAMPLES).max(1);
    let (mut bytes, mut resident) = (0f64, 0f64);
    for &i in idx.iter().step_by(step) {
        let f = &files[i as usize];
        if f.volume {
            return false;
        }
        let Ok(file) = root.open_read(&f.rel, false) else {
            return false;
        };
        let Some(frac) = crate::storage::cache::resident_fraction(&file, f.size) else {
            return false;
        };
        bytes += f.size as f64;
        resident += frac * f.size as f64;
    }
    bytes > 0.0 && resident >= 0.9 * bytes
}

/// Home queue of each of `readers` reader threads: queues get readers in
/// turn up to their device's thread count; readers left over get None
/// (every device already has the threads its type wants).
pub fn assign_homes(queues: &[DeviceQueue], readers: usize) -> Vec<Option<usize>> {
    let mut homes = Vec::with_capacity(readers);
    let mut given = vec![0usize; queues.len()];
    while homes.len() < readers {
        let before = homes.len();
        for (q, g) in given.iter_mut().enumerate() {
            if homes.len() < readers && *g < queues[q].threads {
                *g += 1;
                homes.push(Some(q));
            }
        }
        if homes.len() == before {
            break;
        }
    }
    homes.resize(readers, None);
    homes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::extents::FixtureExtents;

    fn f(size: u64, dev: u64) -> SourceFile {
        SourceFile {
            id: 0,
            rel: crate::types::file::Rel::new(b""),
            size,
            dev,
            ino: 0,
            mtime: (0, 0),
            volume: false,
            sparse: false,
            range: None,
        }
    }

    #[test]
    fn stripes_large_pipelines_small_groups_by_device() {
        let bs = 1 << 20;
        let chunk = stripe_chunk(bs);
        let files = vec![f(10, 1), f(0, 1), f(3 * chunk + 5, 1), f(7, 2)];
        let qs = plan_units(&files, bs);
        assert_eq!(qs.len(), 2);
        assert_eq!(qs[0].units.len(), 1 + 4);
        assert_eq!(qs[0].bytes, 10 + 3 * chunk + 5);
        let covered: u64 = qs[0]
            .units
            .iter()
            .filter(|u| u.file == 2)
            .map(|u| u.len())
            .sum();
        assert_eq!(covered, 3 * chunk + 5);
        assert_eq!(qs[1].pop().unwrap().file, 3);
        assert!(qs[1].pop().is_none());
    }

    #[test]
    fn device_type_sets_threads_and_chunks() {
        let bs = 4 << 20;
        let files = vec![f(100 << 20, 1), f(100 << 20, 2)];
        let po = PlanOptions {
            block_size: bs,
            sort: false,
            threads: DeviceThreads::default(),
        };
        let kind = |s: &SourceFile| {
            if s.dev == 1 {
                DeviceKind::Rotational
            } else {
                DeviceKind::Nvme
            }
        };
        let qs = plan(&files, &po, &kind, None);
        assert_eq!((qs[0].kind, qs[0].threads), (DeviceKind::Rotational, 1));
        assert_eq!((qs[1].kind, qs[1].threads), (DeviceKind::Nvme, 8));
        // 100 MiB: under two 64 MiB chunks on the disk (one unit), seven
        // 16 MiB chunks on NVMe.
        assert_eq!(qs[0].units.len(), 1);
        assert_eq!(qs[1].units.len(), 7);
        assert!(!qs[0].stealable() && qs[1].stealable());
        let homes = assign_homes(&qs, 4);
        assert_eq!(homes, vec![Some(0), Some(1), Some(1), Some(1)]);
        let homes = assign_homes(&qs, 12);
        assert_eq!(homes.iter().filter(|h| **h == Some(0)).count(), 1);
        assert_eq!(homes.iter().filter(|h| **h == Some(1)).count(), 8);
        assert_eq!(homes.iter().filter(|h| h.is_none()).count(), 3);
    }

    #[test]
    fn sorted_by_fixture_extent_map_then_inode() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::open(d.path(), crate::storage::fsops::Confinement::None).unwrap();
        let mk = |name: &str, ino: u64| SourceFile {
            id: 0,
            rel: crate::types::file::Rel::new(name.as_bytes()),
            size: 100,
            dev: 1,
            ino,
            mtime: (0, 0),
            volume: false,
            sparse: false,
            range: None,
        };
        let files = vec![
            mk("a", 50),
            mk("b", 40),
            mk("c", 30),
            mk("d", 20),
            mk("e", 10),
        ];
        let mut map = FixtureExtents::default();
        map.0.insert(b"a".to_vec(), 9000);
        map.0.insert(b"b".to_vec(), 100);
        map.0.insert(b"c".to_vec(), 5000);
        // d and e unknown: after the located ones, by inode (e before d).
        let po = PlanOptions {
            block_size: 4096,
            sort: true,
            threads: DeviceThreads::default(),
        };
        let qs = plan(
            &files,
            &po,
            &|_| DeviceKind::Rotational,
            Some((&root, &map)),
        );
        let order: Vec<u32> = qs[0].units.iter().map(|u| u.file).collect();
        assert_eq!(order, vec![1, 2, 0, 4, 3]);
        // No extent source: inode order.
        let qs = plan(&files, &po, &|_| DeviceKind::Rotational, None);
        let order: Vec<u32> = qs[0].units.iter().map(|u| u.file).collect();
        assert_eq!(order, vec![4, 3, 2, 1, 0]);
        // Flash is not located (no seeks to save): inode order.
        let qs = plan(&files, &po, &|_| DeviceKind::Ssd, Some((&root, &map)));
        let order: Vec<u32> = qs[0].units.iter().map(|u| u.file).collect();
        assert_eq!(order, vec![4, 3, 2, 1, 0]);
        // --no-sort: scan order.
        let po = PlanOptions { sort: false, ..po };
        let qs = plan(&files, &po, &|_| DeviceKind::Ssd, Some((&root, &map)));
        let order: Vec<u32> = qs[0].units.iter().map(|u| u.file).collect();
        assert_eq!(order, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_cached_rotational_queue_is_read_like_memory_without_fiemap() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::open(d.path(), crate::storage::fsops::Confinement::None).unwrap();
        let mk = |name: &str, ino: u64| SourceFile {
            rel: crate::types::file::Rel::new(name.as_bytes()),
            ino,
            ..f(100, 1)
        };
        let files = vec![mk("a", 30), mk("b", 20), mk("c", 10)];
        let mut map = FixtureExtents::default();
        map.0.insert(b"a".to_vec(), 1);
        map.0.insert(b"b".to_vec(), 2);
        map.0.insert(b"c".to_vec(), 3);
        let po = PlanOptions {
            block_size: 4096,
            sort: true,
            threads: DeviceThreads::default(),
        };
        let hdd = |_: &SourceFile| DeviceKind::Rotational;
        let asked = std::cell::Cell::new(0);
        let cached = |idx: &[u32]| {
            asked.set(asked.get() + 1);
            assert_eq!(idx, &[0, 1, 2]);
            true
        };
        let qs = plan_probed(&files, &po, &hdd, Some((&root, &map)), &|_| false, &cached);
        assert_eq!(asked.get(), 1, "asked once per device");
        assert!(qs[0].cached);
        assert_eq!((qs[0].kind, qs[0].threads), (DeviceKind::Memory, 4));
        // Inode order: the extent map (disk order a, b, c) was not used.
        let order: Vec<u32> = qs[0].units.iter().map(|u| u.file).collect();
        assert_eq!(order, vec![2, 1, 0]);
        // Not cached: the disk's rules (one reader, located).
        let qs = plan_probed(&files, &po, &hdd, Some((&root, &map)), &|_| false, &|_| {
            false
        });
        assert!(!qs[0].cached);
        assert_eq!((qs[0].kind, qs[0].threads), (DeviceKind::Rotational, 1));
        let order: Vec<u32> = qs[0].units.iter().map(|u| u.file).collect();
        assert_eq!(order, vec![0, 1, 2]);
        // Large files are never probed: they keep the disk's rules.
        let big: Vec<SourceFile> = files
            .iter()
            .map(|x| SourceFile {
                size: 1 << 30,
                ..x.clone()
            })
            .collect();
        let qs = plan_probed(&big, &po, &hdd, Some((&root, &map)), &|_| false, &|_| {
            panic!("probed")
        });
        assert_eq!((qs[0].kind, qs[0].threads), (DeviceKind::Rotational, 1));
        // Flash is never probed.
        let ssd = |_: &SourceFile| DeviceKind::Ssd;
        let qs = plan_probed(&files, &po, &ssd, None, &|_| false, &|_| panic!("probed"));
        assert!(!qs[0].cached);
    }

    #[test]
    fn mostly_cached_sees_evicted_files() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let d = tempfile::tempdir().unwrap();
        let root = Root::open(d.path(), crate::storage::fsops::Confinement::None).unwrap();
        let mut files = Vec::new();
        for i in 0..40u32 {
            let name = format!("f{i}");
            let mut w = std::fs::File::create(d.path().join(&name)).unwrap();
            w.write_all(&vec![7u8; 64 << 10]).unwrap();
            files.push(SourceFile {
                rel: crate::types::file::Rel::new(name.as_bytes()),
                ..f(64 << 10, 1)
            });
        }
        let idx: Vec<u32> = (0..40).collect();
        // Just written: in the page cache.
        assert!(mostly_cached(&root, &files, &idx));
        // Written back and dropped from the cache (where the file system
        // lets fadvise drop them: not tmpfs).
        for sf in &files {
            let p = d.path().join(std::ffi::OsStr::from_bytes(&sf.rel));
            let fd = std::fs::File::open(p).unwrap();
            fd.sync_all().unwrap();
            // SAFETY: valid fd.
            unsafe { libc::posix_fadvise(fd.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
        let first = root.open_read(&files[0].rel, false).unwrap();
        let dropped = crate::storage::cache::resident_fraction(&first, 64 << 10) == Some(0.0);
        if dropped {
            assert!(!mostly_cached(&root, &files, &idx));
        }
        // A missing file: not judged cached.
        files[0].rel = crate::types::file::Rel::new(b"gone");
        assert!(!mostly_cached(&root, &files, &idx));
    }
}
