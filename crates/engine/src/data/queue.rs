//! The read queues between request management and the readers (seed 000
//! Fig. 6-3: a request is regrouped into per-device task queues, each
//! drained by the I/O threads bound to that device). request::tasks fills
//! them; data::reader drains them through an atomic cursor.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::storage::DeviceKind;

/// A byte range of one file to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadUnit {
    /// Index into the walk's file list.
    pub file: u32,
    /// At most two read chunks (request::tasks::chunk_for): 16 bytes a
    /// unit, one per small file (issue 36).
    pub len: u32,
    pub offset: u64,
}

impl ReadUnit {
    pub fn new(file: u32, offset: u64, len: u64) -> ReadUnit {
        let len = u32::try_from(len).expect("a read unit is under 4 GiB");
        ReadUnit { file, len, offset }
    }

    pub fn len(&self) -> u64 {
        self.len as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The read queue of one storage device.
#[derive(Debug)]
pub struct DeviceQueue {
    pub dev: u64,
    pub kind: DeviceKind,
    /// Reader threads this device gets.
    pub threads: usize,
    pub units: Vec<ReadUnit>,
    pub bytes: u64,
    /// A rotational device whose files were found in the page cache
    /// (read as memory; see [`mostly_cached`]).
    pub cached: bool,
    next: AtomicUsize,
}

impl DeviceQueue {
    pub fn new(dev: u64, kind: DeviceKind, threads: usize) -> Self {
        DeviceQueue {
            dev,
            kind,
            threads,
            units: Vec::new(),
            bytes: 0,
            cached: false,
            next: AtomicUsize::new(0),
        }
    }

    /// Next unit, or None when the queue is drained.
    pub fn pop(&self) -> Option<ReadUnit> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.units.get(i).copied()
    }

    /// Whether other devices' readers may take units from this queue.
    pub fn stealable(&self) -> bool {
        self.kind != DeviceKind::Rotational
    }
}
