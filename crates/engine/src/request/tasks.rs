//! Per-device queues of read units (seed 000 Fig. 6-3 and Fig. 6-7).
//!
//! Files are grouped by the device that holds them, so each device is read
//! by its own readers. A small file is one unit (pipelining mode: several
//! readers on several files); a large file is cut into chunks that several
//! readers take at once (striping mode). Readers take units through an
//! atomic cursor (no lock) and steal from other devices' queues when their
//! own runs dry (seed 000 sec. 7.2.3).

use std::sync::atomic::{AtomicUsize, Ordering};

use super::walk::SourceFile;

/// A byte range of one file to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadUnit {
    /// Index into the walk's file list.
    pub file: u32,
    pub offset: u64,
    pub len: u64,
}

/// The read queue of one storage device.
#[derive(Debug)]
pub struct DeviceQueue {
    pub dev: u64,
    pub units: Vec<ReadUnit>,
    pub bytes: u64,
    next: AtomicUsize,
}

impl DeviceQueue {
    /// Next unit, or None when the queue is drained.
    pub fn pop(&self) -> Option<ReadUnit> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.units.get(i).copied()
    }
}

/// Size of a striping chunk for a given block size.
pub fn stripe_chunk(block_size: u64) -> u64 {
    (16 << 20u64).max(block_size).div_ceil(block_size) * block_size
}

/// Build per-device queues. Files of at least two chunks are striped.
pub fn plan_units(files: &[SourceFile], block_size: u64) -> Vec<DeviceQueue> {
    let chunk = stripe_chunk(block_size);
    let mut queues: Vec<DeviceQueue> = Vec::new();
    for (i, f) in files.iter().enumerate() {
        if f.size == 0 {
            continue;
        }
        let q = match queues.iter_mut().position(|q| q.dev == f.dev) {
            Some(p) => &mut queues[p],
            None => {
                queues.push(DeviceQueue {
                    dev: f.dev,
                    units: Vec::new(),
                    bytes: 0,
                    next: AtomicUsize::new(0),
                });
                queues.last_mut().unwrap()
            }
        };
        q.bytes += f.size;
        if f.size >= 2 * chunk {
            let mut off = 0;
            while off < f.size {
                let len = chunk.min(f.size - off);
                q.units.push(ReadUnit {
                    file: i as u32,
                    offset: off,
                    len,
                });
                off += len;
            }
        } else {
            q.units.push(ReadUnit {
                file: i as u32,
                offset: 0,
                len: f.size,
            });
        }
    }
    queues
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(size: u64, dev: u64) -> SourceFile {
        SourceFile {
            id: 0,
            rel: vec![],
            size,
            dev,
            ino: 0,
            mtime: (0, 0),
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
        let covered: u64 = qs[0].units.iter().filter(|u| u.file == 2).map(|u| u.len).sum();
        assert_eq!(covered, 3 * chunk + 5);
        assert_eq!(qs[1].pop().unwrap().file, 3);
        assert!(qs[1].pop().is_none());
    }
}
