//! Per-transfer options, set by the agent's flags.

use std::time::Duration;

use crate::storage::{cache, direct, uring, DataEngine, IoEngine, StorageCfg};

/// What the user asked for; both ends read the parts that concern them.
#[derive(Debug, Clone)]
pub struct TransferOptions {
    /// Data streams (parallel links); with `auto_streams`, the least.
    pub streams: u16,
    /// The agent sizes the stream count from the path's RTT when it
    /// connects (transport::path, issue 21): the user gave no --streams.
    pub auto_streams: bool,
    /// A server-side source reports its growth as GrownLinks, with the
    /// links' busy share and RTT (the client's Hello asked for them).
    pub grown_links: bool,
    /// Block size, bytes: the unit of disk access and network transfer.
    pub block_size: u32,
    /// Per-block checksums and whole-file digests.
    pub checksum: bool,
    /// Copy directories (cp -r).
    pub recursive: bool,
    /// Reader threads per storage device on the source.
    pub readers: usize,
    /// `readers` is the user's (--readers): the source does not add
    /// readers for a rotational device found cached (request::tasks).
    pub readers_fixed: bool,
    /// Writer threads per storage device on the sink.
    pub writers: usize,
    /// Where `writers` was raised to config::SINK_WRITERS_MIN: the count
    /// before, which a session with fewer than config::MANY_SMALL_FILES
    /// small files runs with.
    pub bulk_writers: Option<usize>,
    /// Credits (blocks in flight) per stream the sink grants at most.
    pub window: u32,
    /// Give up on a peer that sends nothing for this long.
    pub idle_timeout: Duration,
    /// Bytes of per-file state (file list, file table) one session may
    /// hold (0: no bound; a daemon's `--session-memory`, issue 36): a
    /// windowed session's window fits it ([`budget_window`]), past it any
    /// other session ends with one line.
    pub meta_budget: u64,
    /// Windowed metadata (issue 36, docs/SCALE.md "Windows"): how far the
    /// source announces records ahead of the sink's settled mark, in ids
    /// and in path bytes; 0 ids: whole-tree phases. From RAMSYS_WINDOW_FILES
    /// and RAMSYS_WINDOW_BYTES (tests cross many windows with small ones).
    pub meta_window: (u64, u64),
    /// fsync each file before it is renamed into place.
    pub fsync: bool,
    /// O_DIRECT reads and writes of large files where the file system
    /// allows it (seed 000 sec. 6.2.2; see storage::direct).
    pub direct: bool,
    /// With `direct`: O_DIRECT reads only for large files mostly not in
    /// the page cache (auto), or for all large files (always); issue 17.
    pub direct_mode: crate::storage::cache::DirectMode,
    /// Storage I/O engine (falls back to sync without io_uring).
    pub io_engine: crate::storage::IoEngine,
    /// Source data engine: real files, or null (blocks without reading).
    pub source_engine: crate::storage::DataEngine,
    /// Sink data engine: real files, or null (verify and discard).
    pub sink_engine: crate::storage::DataEngine,
    /// With a null source: one synthetic file of this many bytes instead
    /// of scanning the sources (0 = scan, but do not read).
    pub null_size: u64,
    /// Sort each device queue by physical location (FIEMAP).
    pub sort: bool,
    /// Storage threads per device, by device type.
    pub device_threads: crate::storage::DeviceThreads,
    /// Cipher for DATA blocks (`--encrypt`); either end may ask for one.
    pub encrypt: crate::transport::crypto::Cipher,
    /// Fault injection for tests (none in production).
    pub io_hook: crate::storage::Hook,
    /// Source and sink in this process (a local copy): large files are
    /// copied by the sink with copy_file_range (storage::local, issue 17).
    pub local_copy: Option<std::sync::Arc<crate::storage::local::LocalBridge>>,
    /// What the source sends of its tree (`--exclude`, `--include`,
    /// `--min-size`, `--max-size`; request::filter). A daemon source gets
    /// it in SelectOpen.
    pub select: ramsys_proto::control::Selection,
    /// Sync and resume bits (proto::control::sync; docs/SYNC.md), 0 = cp.
    pub sync: u32,
    /// Archive bits (proto::attrs::preserve: `-a`, `-X`, `-A`, ...) the
    /// source collects and sends; a daemon source gets them in ArchiveOpen.
    pub preserve: u32,
    /// What a sink may apply of them (crate::storage::archive::Policy).
    pub archive_policy: crate::storage::archive::Policy,
    /// Where this end is the source: readers send their own blocks
    /// (inline) or hand them to sender threads (queued); seed 002 sec. 7.
    pub send_path: crate::types::sendpath::SendPath,
    /// Where this end is the source: blocks of large cached files go
    /// zero-copy (sendfile from the page cache) where the links allow it
    /// (storage::zerocopy; `--send-zerocopy off`, RAMSYS_SENDFILE=0).
    pub send_zerocopy: bool,
    /// Where this end is the source: the rate limits its senders draw
    /// from (`--bwlimit`, a daemon's and a user's `max_rate`; data::rate).
    pub rate: crate::data::rate::Limits,
    /// A client's session that a busy daemon redirected (issue 19): the
    /// daemon that did, sent as Control::Redirected so the new daemon
    /// does not redirect it again.
    pub redirected_from: Option<String>,
    /// A relaying daemon's push (server::relay): the user it acts for,
    /// sent as Control::OnBehalf right after authentication ("" = the
    /// shared-key identity).
    pub on_behalf: Option<String>,
    /// A striped push's share of big files (issue 19, request::shares):
    /// the walk sends these pieces instead of the whole files. Local to
    /// the source: the records carry them (EntryKind::Piece).
    pub pieces: Option<std::sync::Arc<crate::request::pieces::Pieces>>,
    /// A `--files-from` path that is not there is skipped without a word
    /// (a replication batch lists paths that may be gone by the time it
    /// reads them: their deletes travel as operations). Otherwise it is a
    /// failure, as rsync's `link_stat ... failed` (exit 23). Local to the
    /// source.
    pub listed_may_vanish: bool,
}

/// `--timeout SECS` as a wait: 0 is "as long as the connection lives"
/// (a year: a read timeout of zero would mean none in std but an error in
/// setsockopt's eyes; TCP keepalive still notices a vanished host).
pub fn idle_timeout(secs: u64) -> Duration {
    match secs {
        0 => Duration::from_secs(365 * 86_400),
        s => Duration::from_secs(s),
    }
}

/// The default window of a windowed session: 65,536 ids (a window of
/// small files outlasts a 50 ms RTT) and 64 MiB of paths, or what
/// RAMSYS_WINDOW_FILES and RAMSYS_WINDOW_BYTES say (0 files: no windows).
fn meta_window() -> (u64, u64) {
    static W: std::sync::OnceLock<(u64, u64)> = std::sync::OnceLock::new();
    *W.get_or_init(|| {
        let var = |k: &str, d: u64| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(d)
        };
        let files = var("RAMSYS_WINDOW_FILES", 1 << 16);
        (
            files.min(ramsys_proto::session::MAX_WINDOW_IDS / 2),
            var("RAMSYS_WINDOW_BYTES", 64 << 20).max(1),
        )
    })
}

/// The window a memory budget per session holds (issue 36, docs/SCALE.md
/// "Bounds and reports"), for an end that keeps `per_id` bytes of state
/// an id: an eighth of the budget for that state, an eighth for the
/// records' paths. A quarter in all (half while the vectors of the batch
/// being registered grow by doubling), the rest left for what grows with
/// the tree and not with the window: the directories' and links' records,
/// `--delete`'s keyed hashes, an archive copy's held Attrs. Within what a
/// Control::Window may say; None without a budget.
pub fn budget_window(budget: u64, per_id: u64) -> Option<(u64, u64)> {
    use ramsys_proto::session::{MAX_WINDOW_BYTES, MAX_WINDOW_IDS, MIN_WINDOW};
    if budget == 0 {
        return None;
    }
    let eighth = budget / 8;
    Some((
        (eighth / per_id.max(1)).clamp(MIN_WINDOW.0, MAX_WINDOW_IDS),
        eighth.clamp(MIN_WINDOW.1, MAX_WINDOW_BYTES),
    ))
}

impl TransferOptions {
    /// A session that may run its metadata in windows (issue 36): a copy
    /// or a sync whose answer comes per window (flags::WINDOWED: dry runs
    /// and resumes included, no device DST), archive copies included
    /// (their Attrs travel per batch), without pieces or synthetic files.
    pub fn windows_allowed(&self) -> bool {
        use crate::request::sync::flags;
        let synthetic =
            self.source_engine == crate::storage::DataEngine::Null && self.null_size > 0;
        self.meta_window.0 > 0
            && self.sync & !flags::WINDOWED == 0
            && self.pieces.is_none()
            && !synthetic
    }
}

impl Default for TransferOptions {
    fn default() -> Self {
        TransferOptions {
            streams: 4,
            auto_streams: false,
            grown_links: false,
            block_size: 4 << 20,
            checksum: true,
            recursive: false,
            readers: 4,
            readers_fixed: false,
            writers: 4,
            bulk_writers: None,
            window: 8,
            idle_timeout: Duration::from_secs(60),
            meta_budget: 0,
            meta_window: meta_window(),
            fsync: false,
            direct: true,
            direct_mode: crate::storage::cache::DirectMode::Auto,
            io_engine: crate::storage::uring::DEFAULT_ENGINE,
            source_engine: crate::storage::DataEngine::File,
            sink_engine: crate::storage::DataEngine::File,
            null_size: 0,
            sort: true,
            device_threads: crate::storage::DeviceThreads::default(),
            encrypt: crate::transport::crypto::Cipher::None,
            io_hook: crate::storage::Hook::default(),
            local_copy: None,
            select: Default::default(),
            sync: 0,
            preserve: 0,
            archive_policy: crate::storage::archive::Policy::default(),
            send_path: crate::types::sendpath::SendPath::default(),
            send_zerocopy: true,
            rate: Default::default(),
            redirected_from: None,
            on_behalf: None,
            pieces: None,
            listed_may_vanish: false,
        }
    }
}

/// The storage settings of each end, derived from the options: here, above
/// the storage layer, so storage/ needs no session type (issue 37).
impl TransferOptions {
    /// Source side.
    pub fn source_storage(&self, block_size: usize) -> StorageCfg {
        self.storage(block_size, self.source_engine)
    }
    /// Sink side.
    pub fn sink_storage(&self) -> StorageCfg {
        let cfg = self.storage(direct::ALIGN, self.sink_engine);
        if cfg.direct && cfg.direct_mode == cache::DirectMode::Auto {
            cfg.buffered_left.store(
                cache::host_write_absorb(),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        cfg
    }
    fn storage(&self, block_size: usize, data: DataEngine) -> StorageCfg {
        let opts = self;
        StorageCfg {
            direct: opts.direct && block_size.is_multiple_of(direct::ALIGN),
            direct_mode: opts.direct_mode,
            engine: uring::effective(opts.io_engine),
            null: data == DataEngine::Null,
            hook: opts.io_hook.clone(),
            refusals: Default::default(),
            buffered_left: Default::default(),
            lane_bytes: if opts.direct_mode == cache::DirectMode::Auto
                && uring::effective(opts.io_engine) == IoEngine::Uring
            {
                cache::direct_lane()
            } else {
                0
            },
            writeback: std::env::var("RAMSYS_WRITEBACK").is_ok_and(|v| v == "1"),
            direct_bytes: Default::default(),
            cached_bytes: Default::default(),
            local: (data == DataEngine::File)
                .then(|| opts.local_copy.clone())
                .flatten(),
            copied_bytes: Default::default(),
        }
    }
}
