//! Counters shared by the data threads and whoever reports progress.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;

/// Live counters of one session end (relaxed atomics; read by a progress
/// thread, never locked).
#[derive(Debug, Default)]
pub struct Stats {
    pub bytes: AtomicU64,
    pub files: AtomicU64,
    pub blocks: AtomicU64,
    pub total_bytes: AtomicU64,
    pub total_files: AtomicU64,
    pub failed: AtomicU64,
    pub checksum_errors: AtomicU64,
    /// Encrypted blocks that failed authentication (crate::transport::crypto).
    pub auth_failures: AtomicU64,
    /// Segments of failed blocks sent again: requested (sink) or re-read
    /// and re-sent (source).
    pub resends: AtomicU64,
    /// The source could not list or read all it was asked for (an error
    /// but a vanished path): the sink's --delete deletes nothing
    /// (Report::source_incomplete).
    pub source_incomplete: std::sync::atomic::AtomicBool,
    /// Data links that broke mid-transfer (crate::session::relink).
    pub links_lost: AtomicU64,
    /// Broken data links replaced by a new one.
    pub links_replaced: AtomicU64,
    /// Failed attempts to dial a replacement link.
    pub link_retries: AtomicU64,
    /// Blocks handed from a reader to a sender thread through the filled
    /// queue (0 on the inline send path; crate::data::inline).
    pub handoffs: AtomicU64,
    /// Blocks sent zero-copy, from the page cache with sendfile
    /// (storage::zerocopy, issue 17).
    pub zerocopy_blocks: AtomicU64,
    /// Pieces of big files verified at a sink (roles::sink::bigfile; the file
    /// counts in `files` once, where it was placed).
    pub pieces: AtomicU64,
    /// Files sent without an archive copy whose set-user-ID or
    /// set-group-ID bits the sink drops (issue 34's rule; counted by this
    /// process's end, the source of a push or the sink of a pull, so the
    /// agent can say so: rsync -p would keep them, issue 35).
    pub setid_dropped: AtomicU64,
    /// Memory this end holds for the session's file list and per-file
    /// state, accounted (the sink's file table, the source's file list;
    /// docs/SCALE.md), at its peak: what `serve --session-memory` bounds
    /// (issue 36).
    pub meta_bytes: AtomicU64,
}

impl Stats {
    pub fn add_bytes(&self, n: u64) {
        self.bytes.fetch_add(n, Relaxed);
    }
    /// Record `used` bytes of per-file state; refused (one line) past
    /// `budget` (0: none).
    pub fn meta_used(&self, used: u64, files: u64, budget: u64) -> Result<(), String> {
        self.meta_bytes.fetch_max(used, Relaxed);
        if budget == 0 || used <= budget {
            return Ok(());
        }
        Err(format!(
            "the session's file list outgrew the daemon's memory budget per session \
             ({} at {files} files, serve --session-memory); split the transfer or raise it",
            mib(budget)
        ))
    }

    pub fn snapshot(&self) -> (u64, u64, u64, u64) {
        (
            self.bytes.load(Relaxed),
            self.files.load(Relaxed),
            self.total_bytes.load(Relaxed),
            self.total_files.load(Relaxed),
        )
    }
}

/// One data link (issue 35: the summary says what carried the data).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LinkDesc {
    /// Local end: an address, or "raw:MAC@IFACE" for a raw channel.
    pub local: String,
    pub peer: String,
    /// "tcp", "raw" (a raw-Ethernet channel) or "ssh" (tunnelled through
    /// the ssh connection); transport::Link::kind.
    pub kind: &'static str,
}

/// One failed path and why.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FailedPath {
    pub path: String,
    pub reason: String,
    /// The path was not there (ENOENT: a missing source, or one removed
    /// while the tree was read): rsync's IOERR_VANISHED, which does not
    /// stop --delete, unlike an unreadable directory (IOERR_GENERAL). Set
    /// by the end that saw the io::Error, from its kind; not in the JSON
    /// summary (its shape predates the flag; the reason says it).
    #[serde(skip)]
    pub vanished: bool,
}

impl FailedPath {
    /// A failure that is not a vanished path (a refusal, a sink's error,
    /// anything that stops --delete).
    pub fn new(path: impl Into<String>, reason: impl Into<String>) -> Self {
        FailedPath {
            path: path.into(),
            reason: reason.into(),
            vanished: false,
        }
    }

    /// A failure from an io::Error `e` (`reason` names it, with or without
    /// context): vanished when `e` says the path is not there.
    pub fn io(path: impl Into<String>, reason: impl Into<String>, e: &std::io::Error) -> Self {
        FailedPath {
            vanished: e.kind() == std::io::ErrorKind::NotFound,
            ..FailedPath::new(path, reason)
        }
    }
}

/// CPU seconds (user + system) of this process so far.
pub fn process_cpu_seconds() -> f64 {
    // SAFETY: getrusage fills a plain struct.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
        t(ru.ru_utime) + t(ru.ru_stime)
    }
}

/// Bytes for one-line messages: the workspace's one form (ramsys_units,
/// issue 37).
pub fn mib(b: u64) -> String {
    ramsys_units::format_size(b)
}

/// This process's resident memory now and at its peak (VmRSS, VmHWM),
/// bytes; zeros where /proc has none.
pub fn process_rss() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = |key: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    (kb("VmRSS:"), kb("VmHWM:"))
}

/// Give the heap a session freed back to the system (issue 36): glibc
/// keeps freed small allocations (a big tree's names, per-file boxes) in
/// its arenas, so a daemon would keep the peak of its biggest session.
/// Called when a daemon session ends, off the data path. (The daemon's
/// RSS also grows towards its buffer pool, `--memory`, as sessions touch
/// more of it: bounded, docs/SCALE.md.)
pub fn return_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free heap pages; no pointer is
    // handed over.
    unsafe {
        libc::malloc_trim(0);
    }
}
