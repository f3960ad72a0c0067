//! Storage access (seed 000 sec. 6.2.2, "I/O optimizations"): how readers
//! and writers touch the disk.
//!
//! - [`direct`]: kernel-bypass I/O (O_DIRECT) with aligned buffers and a
//!   logged-once fallback to buffered I/O where the file system refuses it.
//! - [`uring`]: the asynchronous engine (io_uring, successor of the libaio
//!   the seed used), driven by Algorithm 2.
//! - [`device`]: device type (rotational, SSD, NVMe, memory), which sets
//!   threads per device and striping vs pipelining (Fig. 6-7).
//! - [`extents`]: physical location of a file's first extent (FIEMAP) to
//!   sort device queues (sec. 6.2.2, "file sorting").
//! - [`sparse`]: data/hole maps (SEEK_DATA/SEEK_HOLE), so holes are sent as
//!   hole segments and stay holes on the sink.
//! - [`null`]: null source and sink engines, to measure the network alone
//!   (seed 004 Fig. 4, /dev/zero to /dev/null).

pub mod cache;
pub mod device;
pub mod direct;
pub mod extents;
pub mod null;
pub mod sparse;
pub mod uring;

use std::fmt;
use std::io;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub use device::DeviceKind;

/// Storage I/O engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoEngine {
    /// One blocking pread/pwrite per segment.
    Sync,
    /// Batched asynchronous I/O through io_uring (Algorithm 2).
    Uring,
}

impl FromStr for IoEngine {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sync" => Ok(IoEngine::Sync),
            "uring" | "io_uring" | "io-uring" => Ok(IoEngine::Uring),
            _ => Err(format!("unknown I/O engine {s:?} (sync or uring)")),
        }
    }
}

/// Where data comes from or goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataEngine {
    /// Real files.
    File,
    /// No storage: the source produces blocks without reading, the sink
    /// verifies and discards them (seed 004 Fig. 4).
    Null,
}

impl FromStr for DataEngine {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "file" => Ok(DataEngine::File),
            "null" => Ok(DataEngine::Null),
            _ => Err(format!("unknown data engine {s:?} (file or null)")),
        }
    }
}

/// Storage threads per device, by device type (seed 000 sec. 6.2.2: one
/// thread keeps a disk head sequential; flash and memory want several).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceThreads {
    pub rotational: usize,
    pub ssd: usize,
    pub nvme: usize,
    pub memory: usize,
}

impl Default for DeviceThreads {
    fn default() -> Self {
        DeviceThreads {
            rotational: 1,
            ssd: 4,
            nvme: 8,
            memory: 4,
        }
    }
}

impl DeviceThreads {
    pub fn for_kind(&self, k: DeviceKind) -> usize {
        match k {
            DeviceKind::Rotational => self.rotational,
            DeviceKind::Ssd => self.ssd,
            DeviceKind::Nvme => self.nvme,
            DeviceKind::Memory => self.memory,
        }
        .max(1)
    }
}

impl FromStr for DeviceThreads {
    type Err = String;
    /// `N` (every type) or `hdd=1,ssd=4,nvme=8,mem=4` (any subset).
    fn from_str(s: &str) -> Result<Self, String> {
        let num = |v: &str| -> Result<usize, String> {
            match v.trim().parse::<usize>() {
                Ok(n) if n >= 1 => Ok(n),
                _ => Err(format!("bad thread count {v:?}")),
            }
        };
        if !s.contains('=') {
            let n = num(s)?;
            return Ok(DeviceThreads {
                rotational: n,
                ssd: n,
                nvme: n,
                memory: n,
            });
        }
        let mut t = DeviceThreads::default();
        for part in s.split(',') {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("expected TYPE=N, got {part:?}"))?;
            let n = num(v)?;
            match k.trim() {
                "hdd" | "rotational" => t.rotational = n,
                "ssd" => t.ssd = n,
                "nvme" => t.nvme = n,
                "mem" | "memory" => t.memory = n,
                o => return Err(format!("unknown device type {o:?} (hdd, ssd, nvme, mem)")),
            }
        }
        Ok(t)
    }
}

/// An I/O operation a hook may fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    /// Opening a file with O_DIRECT.
    OpenDirect,
    Read,
    Write,
}

/// Fault injection: consulted before every storage operation of both
/// engines, so tests can inject EIO, ENOSPC or an O_DIRECT refusal on a
/// chosen file and offset. `path` is relative to the side's root.
pub trait IoHook: Send + Sync {
    fn check(&self, op: IoOp, path: &[u8], offset: u64, len: usize) -> io::Result<()>;
}

/// Optional hook (None in production: one branch per operation).
#[derive(Clone, Default)]
pub struct Hook(pub Option<Arc<dyn IoHook>>);

impl fmt::Debug for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Hook(set)"
        } else {
            "Hook(none)"
        })
    }
}

impl Hook {
    #[inline]
    pub fn check(&self, op: IoOp, path: &[u8], offset: u64, len: usize) -> io::Result<()> {
        match &self.0 {
            None => Ok(()),
            Some(h) => h.check(op, path, offset, len),
        }
    }
}

/// Files at least this large are read and written with O_DIRECT. Smaller
/// files are packed several to a block (seed 000 sec. 6.1.4), so their
/// segments sit at unaligned buffer offsets; they stay buffered, where the
/// page cache costs little next to the per-file open/close anyway.
pub const DIRECT_MIN: u64 = 1 << 20;

/// Devices that refused O_DIRECT (so each is tried once per session).
#[derive(Debug, Default)]
pub struct DirectRefusals(Mutex<Vec<u64>>);

impl DirectRefusals {
    pub fn refused(&self, dev: u64) -> bool {
        self.0.lock().unwrap().contains(&dev)
    }
    pub fn refuse(&self, dev: u64, what: &str, e: &io::Error) {
        let mut g = self.0.lock().unwrap();
        if !g.contains(&dev) {
            g.push(dev);
        }
        drop(g);
        log_direct_fallback(what, e);
    }
}

static DIRECT_FALLBACK_LOGGED: AtomicBool = AtomicBool::new(false);

/// The file system refused O_DIRECT: say so once per process.
pub fn log_direct_fallback(what: &str, e: &io::Error) {
    if !DIRECT_FALLBACK_LOGGED.swap(true, Ordering::AcqRel) {
        tracing::warn!("{what}: O_DIRECT refused ({e}); using buffered I/O there");
    }
}

/// Is this error the file system refusing O_DIRECT?
pub fn is_direct_refusal(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL) | Some(libc::EOPNOTSUPP)
    )
}

/// Storage settings of one side of a session, derived from the options.
#[derive(Debug)]
pub struct StorageCfg {
    /// O_DIRECT for large files (turned off when the block size is not a
    /// multiple of the alignment: reads must stay aligned).
    pub direct: bool,
    /// When a large file is read with O_DIRECT (cache::read_direct).
    pub direct_mode: cache::DirectMode,
    pub engine: IoEngine,
    pub null: bool,
    pub hook: Hook,
    pub refusals: DirectRefusals,
}

impl StorageCfg {
    /// Source side.
    pub fn source(opts: &crate::TransferOptions, block_size: usize) -> StorageCfg {
        Self::new(opts, block_size, opts.source_engine)
    }
    /// Sink side.
    pub fn sink(opts: &crate::TransferOptions) -> StorageCfg {
        Self::new(opts, direct::ALIGN, opts.sink_engine)
    }
    fn new(opts: &crate::TransferOptions, block_size: usize, data: DataEngine) -> StorageCfg {
        StorageCfg {
            direct: opts.direct && block_size.is_multiple_of(direct::ALIGN),
            direct_mode: opts.direct_mode,
            engine: uring::effective(opts.io_engine),
            null: data == DataEngine::Null,
            hook: opts.io_hook.clone(),
            refusals: DirectRefusals::default(),
        }
    }
    /// Plain settings (tests, tools).
    pub fn plain(direct: bool, engine: IoEngine) -> StorageCfg {
        StorageCfg {
            direct,
            direct_mode: cache::DirectMode::Auto,
            engine: uring::effective(engine),
            null: false,
            hook: Hook::default(),
            refusals: DirectRefusals::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_flags() {
        assert_eq!("sync".parse::<IoEngine>().unwrap(), IoEngine::Sync);
        assert_eq!("uring".parse::<IoEngine>().unwrap(), IoEngine::Uring);
        assert!("aio".parse::<IoEngine>().is_err());
        assert_eq!("null".parse::<DataEngine>().unwrap(), DataEngine::Null);
        let t: DeviceThreads = "3".parse().unwrap();
        assert_eq!((t.rotational, t.ssd, t.nvme, t.memory), (3, 3, 3, 3));
        let t: DeviceThreads = "hdd=2,nvme=16".parse().unwrap();
        assert_eq!((t.rotational, t.ssd, t.nvme, t.memory), (2, 4, 16, 4));
        assert!("hdd=0".parse::<DeviceThreads>().is_err());
        assert!("tape=1".parse::<DeviceThreads>().is_err());
        assert_eq!(DeviceThreads::default().for_kind(DeviceKind::Rotational), 1);
    }
}
