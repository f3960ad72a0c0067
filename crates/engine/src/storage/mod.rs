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
//! - [`tmpfile`]: nameless temp files (O_TMPFILE) linked into place, for
//!   the sink's small files.
//! - [`volume`]: block devices as SRC and DST (size, zero runs as holes,
//!   in-place writes verified by reading back; issue 18).
//! - [`null`]: null source and sink engines, to measure the network alone
//!   (seed 004 Fig. 4, /dev/zero to /dev/null).

pub mod archive;
pub mod cache;
pub mod device;
pub mod direct;
pub mod dirs;
pub mod extents;
pub mod fsops;
pub mod local;
pub mod sparse;
pub mod tmpfile;
pub mod uring;
pub mod volume;
pub mod zerocopy;

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
    /// Creating a nameless temp file (O_TMPFILE); an error the file
    /// system would give for no support makes the sink name its temp files.
    TmpFile,
    /// Creating an empty file at its final name (nothing to half-write).
    CreateEmpty,
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

/// Files at least this large may also take the sink's direct lane (their
/// whole pages, read into page-aligned blocks: data::reader::uring), under
/// the forced rule's DIRECT_MIN: the page-cache copy of a file of 64 KiB to
/// 1 MiB costs the same per byte as of a larger one, and on the mixed set
/// those files hold 1.3 of 3.5 GB (issue 17: the io-wq workers' copies were
/// 40 % of a warm mixed push's CPU). `RAMSYS_LANE_MIN` (bytes, >= 4096)
/// overrides it, to repeat the measurement.
pub fn lane_min() -> u64 {
    static V: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("RAMSYS_LANE_MIN")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&v| v >= direct::ALIGN as u64)
            .unwrap_or(64 << 10)
    })
}

/// The smallest file the direct policy covers: the lane's start or the
/// forced rule's, whichever is lower. Such files' whole pages are read into
/// page-aligned blocks, and their bytes are counted in the direct/cached
/// split ([`StorageCfg::count`]).
pub fn policy_min() -> u64 {
    lane_min().min(DIRECT_MIN)
}

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

/// How one side moved its large files (issue 17), for `--explain` and the
/// JSON summary.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct StorageUse {
    /// "read" (source) or "write" (sink).
    pub side: &'static str,
    pub mode: cache::DirectMode,
    pub direct_bytes: u64,
    pub cached_bytes: u64,
    /// Local copies: bytes the kernel copied (copy_file_range).
    pub copied_bytes: u64,
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
    /// Sink, `--direct auto`: bytes of large files this session may still
    /// write through the page cache (cache::write_absorb); files that do
    /// not fit go O_DIRECT.
    pub buffered_left: std::sync::atomic::AtomicU64,
    /// Sink, `--direct auto`, io_uring writers: bytes of O_DIRECT writes
    /// each writer keeps in flight on large files the budget lets it
    /// write buffered (0: none). A block goes to the disk direct while
    /// that lane has room and through the page cache past it, so the disk
    /// takes what it can without a CPU copy and the CPU the rest
    /// (docs/STORAGE.md "Direct lane"; 16 MiB, `RAMSYS_DIRECT_LANE=MiB`:
    /// cache::direct_lane).
    pub lane_bytes: usize,
    /// Start writeback behind the write front of buffered large files
    /// (cache::start_writeback). Off: measured 1.5-2.5x slower on 4 x 1 GiB
    /// here (the writer threads then do the file system's block allocation
    /// and wait for the disk queue, work the kernel's flusher otherwise
    /// does behind the transfer; docs/STORAGE.md). `RAMSYS_WRITEBACK=1`
    /// turns it on to repeat that measurement.
    pub writeback: bool,
    /// Bytes of files the direct policy covers ([`policy_min`] and up)
    /// this side moved with O_DIRECT
    /// and through the page cache: what `--explain` and the JSON summary
    /// report of the policy.
    pub direct_bytes: std::sync::atomic::AtomicU64,
    pub cached_bytes: std::sync::atomic::AtomicU64,
    /// A local copy (local::LocalBridge): the source sends large files as
    /// local-copy segments, the sink copies them from the source file.
    pub local: Option<std::sync::Arc<local::LocalBridge>>,
    /// Bytes the sink copied in the kernel (local copies).
    pub copied_bytes: std::sync::atomic::AtomicU64,
}

impl StorageCfg {
    /// Count `len` bytes of a file of `size` bytes moved direct or not.
    pub fn count(&self, size: u64, len: u64, direct: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        if size >= policy_min() {
            let c = if direct {
                &self.direct_bytes
            } else {
                &self.cached_bytes
            };
            c.fetch_add(len, Relaxed);
        }
    }
    /// What this side did, for the report (None for a null engine).
    pub fn usage(&self, write: bool) -> Option<StorageUse> {
        use std::sync::atomic::Ordering::Relaxed;
        (!self.null).then(|| StorageUse {
            side: if write { "write" } else { "read" },
            mode: if self.direct {
                self.direct_mode
            } else {
                cache::DirectMode::Never
            },
            direct_bytes: self.direct_bytes.load(Relaxed),
            cached_bytes: self.cached_bytes.load(Relaxed),
            copied_bytes: self.copied_bytes.load(Relaxed),
        })
    }
    /// Sink: write a large file of `size` bytes with O_DIRECT? Under auto
    /// the file takes its size out of the buffered budget when it fits.
    pub fn write_direct(&self, size: u64) -> bool {
        use std::sync::atomic::Ordering;
        if !self.direct || size < DIRECT_MIN {
            return false;
        }
        match self.direct_mode {
            cache::DirectMode::Never => false,
            cache::DirectMode::Always => true,
            cache::DirectMode::Auto => self
                .buffered_left
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                    left.checked_sub(size)
                })
                .is_err(),
        }
    }
    /// Sink: a file of [`lane_min`] bytes or more that the budget lets
    /// through the page cache is still opened O_DIRECT, for the writers'
    /// direct lane (`lane_bytes`).
    pub fn lane(&self, size: u64) -> bool {
        self.direct && self.lane_bytes > 0 && size >= lane_min()
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
            buffered_left: Default::default(),
            lane_bytes: 0,
            writeback: false,
            direct_bytes: Default::default(),
            cached_bytes: Default::default(),
            local: None,
            copied_bytes: Default::default(),
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

    #[test]
    fn auto_writes_through_the_cache_until_the_budget_is_spent() {
        use std::sync::atomic::Ordering;
        let cfg = StorageCfg::plain(true, IoEngine::Sync);
        cfg.buffered_left.store(3 << 20, Ordering::Relaxed);
        assert!(!cfg.write_direct(1000), "small files are never direct");
        assert!(!cfg.write_direct(2 << 20), "fits: buffered");
        assert!(cfg.write_direct(2 << 20), "1 MiB left: direct");
        assert!(!cfg.write_direct(1 << 20), "the last MiB still fits");
        assert!(cfg.write_direct(1 << 20), "spent");
        let mut always = StorageCfg::plain(true, IoEngine::Sync);
        always.direct_mode = cache::DirectMode::Always;
        always.buffered_left.store(u64::MAX, Ordering::Relaxed);
        assert!(always.write_direct(2 << 20));
        let off = StorageCfg::plain(false, IoEngine::Sync);
        off.buffered_left.store(0, Ordering::Relaxed);
        assert!(!off.write_direct(2 << 20), "--direct never");
    }
}
