//! The sink end of a session (seed 000 Fig. 6-4): a [`SinkSession`] runs
//! one method per protocol phase (negotiate, confirm, metadata, sync
//! answer and open links), hands over to the data pipeline (pipeline.rs:
//! receivers and writers, finalizing files as they complete), and ends
//! with its verdict (Complete).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ramsys_proto::control::{Bytes32, Complete, Confirm, Failure, Propose};
use ramsys_proto::session::SinkMachine;
use ramsys_proto::Control;
use ramsys_resources::Reservation;

use crate::daemon::Admission;
use crate::data::resources::{EngineResources, ShareGuard};
use crate::roles::sink::dest::DestMap;
use crate::roles::sink::files::FileTable;
use crate::roles::sink::sync_delta::SinkSync;
use crate::roles::SessionEnd;
use crate::session::control::{unexpected, ControlLink};
use crate::session::options::TransferOptions;
use crate::session::relink::Relinks;
use crate::session::report::Report;
use crate::session::LinkProvider;
use crate::storage::fsops::Root;
use crate::transport::crypto::Cipher;
use crate::transport::wire::send_control;
use crate::transport::Link;
use crate::types::error::show;
use crate::types::error::EngineError;
use crate::types::stats::{process_cpu_seconds, FailedPath, Stats};

pub mod bigfile;
pub mod delete;
pub mod dest;
pub mod files;
pub mod journal;
pub mod sync_delta;
pub mod writer;

// The payload phase's event handlers and settle decision.
mod payload;
// The data pipeline: receivers and writers, its event loop and teardown.
mod pipeline;
// The metadata phase's tree and the epilogue that places links.
mod tree;
use tree::{Deferred, Tree};

/// The sink's control link: every message passes its SinkMachine.
type Ctl = ControlLink<SinkMachine>;

/// Where to write.
pub struct SinkSpec {
    /// Confined root (Strict: no symlinks, nothing outside).
    pub root: Arc<Root>,
    /// Destination relative to the root ("" = the root itself).
    pub dest: Vec<u8>,
    /// Session id (names temp files).
    pub session: u64,
    /// (daemon address): AuthOk still to be read (pipelined connect).
    pub pending_auth: Option<String>,
}

/// Run the sink end on an authenticated control link.
pub fn run_sink(
    ctl_link: Box<dyn Link>,
    spec: SinkSpec,
    end: SessionEnd,
) -> Result<Report, EngineError> {
    sink_session(ctl_link, spec, end, false).map(|(r, _)| r)
}

/// [`run_sink`] on a control link kept for more sessions (a watch
/// channel's batch, issue 38): the source's EndOfData is its last message
/// of the session, so the control reader stops there, Complete is not
/// followed by a wait for the source's close, and the link is handed back
/// open. On an error it is gone with the session.
pub fn run_sink_kept(
    ctl_link: Box<dyn Link>,
    spec: SinkSpec,
    end: SessionEnd,
) -> Result<(Report, Box<dyn Link>), EngineError> {
    sink_session(ctl_link, spec, end, true)
}

fn sink_session(
    ctl_link: Box<dyn Link>,
    spec: SinkSpec,
    end: SessionEnd,
    keep: bool,
) -> Result<(Report, Box<dyn Link>), EngineError> {
    let SessionEnd {
        links,
        opts,
        res,
        stats,
        adm,
    } = end;
    let mut s = SinkSession {
        cpu0: process_cpu_seconds(),
        started: SystemTime::now(),
        ctl: Ctl::new(ctl_link, SinkMachine::new(), "source"),
        spec,
        opts,
        stats,
        adm,
        keep,
    };
    let (prop, dest, flags) = s.negotiate()?;
    crate::types::phase::mark("sink_propose");
    let (windowed, limit) = s.windows(flags);
    // Directories done (DIRS_DONE_FLAG): taken with windows.
    let dirs_done = windowed && flags & ramsys_proto::frame::DIRS_DONE_FLAG != 0;
    let grant = s.confirm(&prop, res, (windowed, dirs_done), limit)?;
    crate::types::phase::mark("sink_confirm_sent");
    let (mut tree, opened, control) = if windowed {
        s.start_windowed(&prop, dest, links, (grant.streams, dirs_done))?
    } else {
        let mut tree = s.receive_metadata(&prop, dest)?;
        crate::types::phase::mark("sink_metadata_in");
        let t = &mut tree;
        let opened = s.sync_answer(
            &t.table,
            &mut t.sync,
            &t.prep_failures,
            links,
            grant.streams,
        )?;
        (tree, opened, None)
    };
    crate::types::phase::mark("sink_links_open");
    let (table, sync) = (tree.table.clone(), tree.sync.take());
    let tree_in = windowed.then_some(&mut tree);
    let mut data =
        pipeline::SinkPipeline::start(&mut s, grant, table, sync, opened, control, tree_in)?;
    crate::types::phase::mark("sink_payload_started");
    let result = data.run();
    crate::types::phase::mark("sink_payload_done");
    let done = data.teardown(result)?;
    crate::types::phase::mark("sink_torn_down");
    let (deferred, prep_failures, scan, dest, scan_io_error) = for_verdict(tree);
    let report = s.verdict(done, deferred, (prep_failures, scan_io_error), scan, dest)?;
    Ok((report, s.ctl.link))
}

/// What the verdict takes of the tree: the links and directories left to
/// finish, the failures before the payload, the source's own failures,
/// and DST. The source's own failures count in this end's verdict: the
/// report names them; an I/O error among them (not just a vanished path)
/// makes sync's --delete delete nothing, as rsync's IOERR_GENERAL does
/// (the last: whether there was one).
fn for_verdict(tree: Tree) -> (Deferred, Vec<Failure>, Vec<Failure>, DestMap, bool) {
    let Tree {
        deferred,
        mut prep_failures,
        scan_failures,
        scan_failures_dropped,
        scan_io_error,
        dest,
        ..
    } = tree;
    let mut scan = scan_failures;
    if scan_failures_dropped > 0 {
        scan.push(Failure::more_scan_failures(scan_failures_dropped));
    }
    if scan_io_error {
        prep_failures.append(&mut scan);
    }
    (deferred, prep_failures, scan, dest, scan_io_error)
}

/// A windowed session's control reader, started before the data links
/// open, and its flag of records due (its timeouts count until MetaEnd).
type RecordsReader = (
    crossbeam_channel::Receiver<crate::session::control::ControlEvent>,
    Arc<std::sync::atomic::AtomicBool>,
);

/// The sink end of one session, between its phases.
struct SinkSession<'a> {
    ctl: Ctl,
    spec: SinkSpec,
    opts: &'a TransferOptions,
    stats: Arc<Stats>,
    adm: &'a dyn Admission,
    /// For the CPU time Complete reports and sync's deletion cut-off.
    cpu0: f64,
    started: SystemTime,
    /// The control link outlives the session (run_sink_kept).
    keep: bool,
}

/// What the sink granted in its Confirm.
struct Grant<'r> {
    receivers: Reservation,
    writers: Reservation,
    /// Returned to the engine on every exit (ShareGuard's Drop).
    share: ShareGuard<'r>,
    streams: u16,
    block_size: u32,
    credits_per_stream: u32,
    checksum: bool,
    cipher: Cipher,
    /// How many writers run at once (a site share; site::share).
    gate: Option<Arc<crate::daemon::site::share::ThreadGate>>,
}

/// The data links as first opened.
struct Opened {
    links: Vec<Box<dyn Link>>,
    key: Option<Bytes32>,
    relinks: Relinks,
    /// The data links (local, peer, kind), for the report.
    desc: Vec<crate::types::stats::LinkDesc>,
}

/// What the data pipeline leaves for the verdict.
struct Drained {
    table: Arc<FileTable>,
    sync: Option<SinkSync>,
    file_failures: Vec<(Vec<u8>, String)>,
    streams: u16,
    block_size: u32,
    links: Vec<crate::types::stats::LinkDesc>,
    /// A daemon-side source's stream adaptation (Control::Grown).
    growth: Option<crate::transport::grow::Growth>,
    /// The control reader's events: the source's close is awaited there.
    control: crossbeam_channel::Receiver<crate::session::control::ControlEvent>,
}

impl SinkSession<'_> {
    /// Windows (issue 36): only where the source asked and this end runs
    /// a plain copy too; else today's whole-tree phases. And the window
    /// this end's memory budget holds, told to a source that takes one
    /// (docs/SCALE.md "Bounds and reports"): a windowed session then slows
    /// down instead of ending.
    fn windows(&self, flags: u8) -> (bool, Option<(u64, u64)>) {
        use ramsys_proto::frame::{ANY_WINDOWS, WINDOW_LIMIT_FLAG};
        let windowed = flags & ANY_WINDOWS != 0 && self.opts.windows_allowed();
        let limit = (windowed && flags & WINDOW_LIMIT_FLAG != 0)
            .then(|| {
                crate::session::options::budget_window(self.opts.meta_budget, files::SLOT_BYTES)
            })
            .flatten();
        (windowed, limit)
    }

    /// A windowed session's start (docs/PROTOCOL.md "Windows"): an empty
    /// tree, SyncDone at once, then the data links; the records arrive
    /// during the payload, read by the control reader even while the
    /// links are awaited, so the source never blocks on a full socket.
    fn start_windowed(
        &mut self,
        prop: &Propose,
        dest: DestMap,
        links: &mut dyn LinkProvider,
        (streams, dirs_done): (u16, bool),
    ) -> Result<(Tree, Opened, Option<RecordsReader>), EngineError> {
        let mut tree = self.new_tree(prop, dest);
        tree.windowed = true;
        // A copy's default journal or a sync (sync::flags::WINDOWED), from
        // this end's own options (the same flags the source's SyncMode
        // carries: SyncOpen or the agent's), set before the writers share
        // the table; a sync answers each window before its Ready.
        let mode = self.opts.sync & !crate::request::sync::flags::DEST_DIR;
        if mode != 0 {
            tree.sync_mode(mode, &self.spec.root.clone());
        }
        // A `--delete` or resume keeps names per directory, dropped as the
        // source names each done (docs/PROTOCOL.md "Directories done").
        if let (Some(s), true) = (&mut tree.sync, dirs_done) {
            s.by_directory();
        }
        self.ctl.send(&Control::SyncDone { failures: vec![] })?;
        // Until MetaEnd the source speaks at least every 2 s (a record,
        // a digest or a keepalive): a silence of the idle timeout is named.
        let idle = Arc::new(std::sync::atomic::AtomicBool::new(true));
        // (A windowed session is never a kept link's batch: windows are
        // not offered there. Its reader stops only when the link does.)
        let control = self
            .ctl
            .spawn_reader_idle("sink-ctl", None, Some(idle.clone()))?;
        let opened = self.open_links(links, streams)?;
        let t = self.opts.idle_timeout;
        self.ctl.link.set_read_timeout(Some(t))?;
        Ok((tree, opened, Some((control, idle))))
    }

    /// The source's Propose, and where its roots go (roles::sink::dest: cp's
    /// rule, rsync's for sync, and where an interrupted copy went for a
    /// resumed one); refused here, before any data moves, when the
    /// destination cannot be used.
    fn negotiate(&mut self) -> Result<(Propose, DestMap, u8), EngineError> {
        // A daemon source may hold the task suspended until threads free up
        // (docs/DAEMON.md): wait as long as for an idle peer.
        self.ctl
            .link
            .set_read_timeout(Some(self.opts.idle_timeout))?;
        if let Some(addr) = &self.spec.pending_auth {
            crate::session::finish_auth(&mut *self.ctl.link, addr, self.spec.session)?;
        }
        // The machine admits only Propose first.
        let (prop, flags) = match self.ctl.recv_flagged()? {
            (Control::Propose(p), flags) => (p, flags),
            (m, _) => return Err(unexpected(&m, self.ctl.phase())),
        };
        let spec = &self.spec;
        match DestMap::resolve(&spec.root, &spec.dest, prop.roots, self.opts.sync) {
            Ok(m) => Ok((prop, m, flags)),
            Err(msg) => {
                let refusal = Control::Error {
                    code: 2,
                    message: msg.clone(),
                };
                crate::transport::wire::send_final(&mut *self.ctl.link, &refusal);
                Err(EngineError::Refused(msg))
            }
        }
    }

    /// Capacity: what we can serve of what was proposed. Threads and
    /// buffers come from `adm` (a daemon task may be queued and suspended
    /// first; docs/DAEMON.md); refused with code 4 (busy).
    fn confirm<'r>(
        &mut self,
        prop: &Propose,
        res: &'r EngineResources,
        (windowed, dirs_done): (bool, bool),
        limit: Option<(u64, u64)>,
    ) -> Result<Grant<'r>, EngineError> {
        let opts = self.opts;
        let window = opts.window.max(2) as usize;
        let reserved = self
            .adm
            .reserve_sink(res, prop.streams as usize, opts.writers.max(1), window)
            .inspect_err(|e| {
                let _ = send_control(
                    &mut *self.ctl.link,
                    &Control::Error {
                        code: 4,
                        message: e.to_string(),
                    },
                );
            })?;
        let streams = reserved.receivers.len() as u16;
        let block_size = prop.block_size.min(res.buffers.buf_size() as u32);
        let credits_per_stream = (reserved.buffers.count() / streams as usize) as u32;
        let share = ShareGuard::new(res, reserved.buffers);
        // Encryption is on if either end asks for it; the source's choice wins.
        let cipher = match Cipher::from_id(prop.cipher)? {
            Cipher::None => opts.encrypt,
            c => c,
        };
        let confirm = Control::Confirm(Confirm {
            streams,
            block_size,
            credits_per_stream,
            capacity_mbps: 0,
            checksum: prop.checksum,
            cipher: cipher.id(),
        });
        use ramsys_proto::frame::{WINDOWS_FLAG, WINDOW_LIMIT_FLAG};
        let mut flags = match (windowed, limit) {
            (true, Some(_)) => WINDOWS_FLAG | WINDOW_LIMIT_FLAG,
            (true, None) => WINDOWS_FLAG,
            (false, _) => 0,
        };
        if dirs_done {
            flags |= ramsys_proto::frame::DIRS_DONE_FLAG;
        }
        self.ctl.send_flagged(&confirm, flags)?;
        if let (true, Some((files, bytes))) = (windowed, limit) {
            self.ctl.send(&Control::Window { files, bytes })?;
        }
        self.adm.transferring(streams);
        Ok(Grant {
            receivers: reserved.receivers,
            writers: reserved.writers,
            share,
            streams,
            block_size,
            credits_per_stream,
            checksum: prop.checksum,
            cipher,
            gate: self.adm.storage_gate(),
        })
    }

    /// The tree the records build (tree.rs), empty.
    fn new_tree(&self, prop: &Propose, dest: DestMap) -> Tree {
        let (spec, opts) = (&self.spec, self.opts);
        let table = FileTable::new(
            spec.root.clone(),
            spec.session,
            prop.checksum,
            opts.fsync,
            self.stats.clone(),
        )
        .with_storage(opts.sink_storage());
        let mut tree = Tree::new(table, dest);
        tree.archive_policy = opts.archive_policy;
        tree.meta_budget = opts.meta_budget;
        // Checked before the session started (server.rs, the agent).
        tree.protect = crate::request::filter::Filter::new(&opts.select).ok();
        tree.root_attrs = tree.protect.as_ref().is_none_or(|f| f.root_attrs());
        tree
    }

    /// Metadata: build the tree as records arrive (tree.rs).
    fn receive_metadata(&mut self, prop: &Propose, dest: DestMap) -> Result<Tree, EngineError> {
        let spec = &self.spec;
        let mut tree = self.new_tree(prop, dest);
        if let Err(e) = tree.receive(&mut self.ctl, &spec.root) {
            tracing::warn!("session {}: {e}", spec.session);
            let _ = send_control(
                &mut *self.ctl.link,
                &Control::Abort {
                    reason: e.to_string(),
                },
            );
            return Err(e);
        }
        let stats = &self.stats;
        stats.total_bytes.store(tree.total_bytes, Ordering::Relaxed);
        let files = tree.table.file_count();
        stats.total_files.store(files, Ordering::Relaxed);
        stats
            .setid_dropped
            .store(tree.setid_dropped, Ordering::Relaxed);
        Ok(tree)
    }

    /// Sync: what we already hold, in the same round trip as SyncDone.
    /// The whole tree is prepared before the data links are waited for:
    /// a client that dialled them early has them ready, and SyncDone
    /// leaves one round trip earlier.
    fn sync_answer(
        &mut self,
        table: &FileTable,
        sync: &mut Option<SinkSync>,
        prep_failures: &[Failure],
        links: &mut dyn LinkProvider,
        streams: u16,
    ) -> Result<Opened, EngineError> {
        let ctl = &mut self.ctl;
        let mut have_sent = Ok(());
        if let Some(s) = sync {
            have_sent = s.answer(table, true, &mut |batch| ctl.send(&Control::Have(batch)));
        }
        have_sent
            .and_then(|_| {
                ctl.send(&Control::SyncDone {
                    failures: prep_failures.to_vec(),
                })
            })
            .and_then(|_| self.open_links(links, streams))
    }

    /// The data links, once the source dials them.
    fn open_links(
        &mut self,
        links: &mut dyn LinkProvider,
        streams: u16,
    ) -> Result<Opened, EngineError> {
        let data_links = links.open(streams)?;
        let desc = data_links
            .iter()
            .map(|l| crate::transport::describe(&**l))
            .collect();
        for l in &data_links {
            l.set_read_timeout(Some(self.opts.idle_timeout))?;
        }
        self.ctl.link.set_read_timeout(None)?;
        let key = links.session_key();
        let relinks = links.relinks();
        Ok(Opened {
            links: data_links,
            key,
            relinks,
            desc,
        })
    }

    /// Links once the files are in place, sync's deletions, directory
    /// attributes, then Complete: the session's verdict.
    fn verdict(
        &mut self,
        d: Drained,
        mut deferred: Deferred,
        (prep_failures, scan_io_error): (Vec<Failure>, bool),
        vanished: Vec<Failure>,
        mut dest: DestMap,
    ) -> Result<Report, EngineError> {
        let Drained {
            table, mut sync, ..
        } = d;
        // The source's listing or a file's data was incomplete: --delete
        // deletes nothing (rsync's IOERR_GENERAL; this end's own errors
        // do not stop it, as rsync's receiver's do not).
        let incomplete = scan_io_error || table.source_failed();
        let mut failures = prep_failures;
        failures.extend(
            d.file_failures
                .into_iter()
                .map(|(p, r)| Failure { path: p, reason: r }),
        );
        let dry = sync.as_ref().is_some_and(|s| s.dry());
        let place = (&mut deferred, dest.dest());
        let outcome =
            self.place_and_delete(&table, sync.as_mut(), place, &mut failures, incomplete)?;
        let root = &self.spec.root;
        // Source paths that vanished: failures, but after --delete ran.
        // The wire said so (ScanFailed's io_error); this end's report
        // keeps it as the typed flag.
        let gone = failures.len()..failures.len() + vanished.len();
        failures.extend(vanished);
        // Last: --delete changed the mtimes of the directories it removed
        // from (issue 35).
        failures.extend(deferred.finish_dirs(root));
        if failures.is_empty() && !dry {
            dest.finished(root);
        }
        let (files, bytes) = self.moved(&table, sync.as_ref());
        log_storage_usage(&table);
        let report = Report {
            source_incomplete: incomplete,
            unchanged: outcome.unchanged,
            deleted: outcome.deleted.iter().map(|p| show(p)).collect(),
            planned: outcome.planned.iter().map(|p| show(p)).collect(),
            files,
            bytes,
            failed: failed_paths(&failures, gone),
            peer_cpu_s: None,
            streams: d.streams,
            block_size: d.block_size,
            links: d.links,
            storage: table.storage.usage(true),
            growth: d.growth,
            ..Default::default()
        };
        self.send_complete(&table, (files, bytes), failures, &d.control)?;
        Ok(report)
    }

    /// Further names linked once their files are in place, then a sync's
    /// deletions (tree::sync_epilogue), which run unless the source
    /// failed to read something (`incomplete`).
    fn place_and_delete(
        &mut self,
        table: &FileTable,
        sync: Option<&mut SinkSync>,
        (deferred, dest): (&mut Deferred, &[u8]),
        failures: &mut Vec<Failure>,
        incomplete: bool,
    ) -> Result<tree::SyncOutcome, EngineError> {
        let spec = &self.spec;
        let tmp = |i: usize| format!(".ramsys-{:016x}-{i}.lnk", spec.session).into_bytes();
        failures.extend(deferred.place(&spec.root, table, tmp));
        let outcome = tree::SyncOutcome {
            deleted: Vec::new(),
            planned: Vec::new(),
            unchanged: table.kept(),
        };
        let Some(s) = sync else {
            return Ok(outcome);
        };
        let (started, session) = (self.started, spec.session);
        let unchanged = outcome.unchanged;
        tree::sync_epilogue(
            s,
            &mut self.ctl,
            (failures, incomplete),
            dest,
            started,
            unchanged,
            session,
        )
    }

    /// Files and bytes moved: sync counts files whose data moved (a delta
    /// with no differing block moved none); a copy counts every file put
    /// in place.
    fn moved(&self, table: &FileTable, sync: Option<&SinkSync>) -> (u64, u64) {
        let compare = sync.is_some_and(|s| s.flags & crate::request::sync::COMPARE != 0);
        let files = if compare {
            table.files_moved()
        } else {
            self.stats.files.load(Ordering::Relaxed)
        };
        (files, table.bytes_moved())
    }

    /// Placed where the source asked for it, then Complete; then the
    /// source's close is awaited, so our Complete is read before teardown
    /// (a kept link is not closed: its reader has stopped).
    fn send_complete(
        &mut self,
        table: &FileTable,
        (files, bytes): (u64, u64),
        failures: Vec<Failure>,
        control: &crossbeam_channel::Receiver<crate::session::control::ControlEvent>,
    ) -> Result<(), EngineError> {
        if self.ctl.machine.placed_asked() {
            // The big files of this session's pieces in place (issue 36):
            // the agent fails a striped push whose file no sink placed. A
            // share never holds pieces of more (shares::piece_size).
            let mut files = table.big_files_placed();
            files.truncate(ramsys_proto::control::MAX_PLACED);
            self.ctl.send(&Control::Placed { files })?;
        }
        self.ctl.send(&Control::Complete(Complete {
            files,
            bytes,
            failures,
            cpu_s: process_cpu_seconds() - self.cpu0,
        }))?;
        if !self.keep {
            let _ = control.recv_timeout(Duration::from_secs(10));
        }
        Ok(())
    }
}

/// How much of the large files went direct and how much through the page
/// cache (storage::cache), in the log.
fn log_storage_usage(table: &FileTable) {
    if let Some(u) = table.storage.usage(true) {
        if u.direct_bytes + u.cached_bytes > 0 {
            tracing::info!(
                "sink: large files {} MiB direct, {} MiB through the page cache ({:?})",
                u.direct_bytes >> 20,
                u.cached_bytes >> 20,
                u.mode
            );
        }
    }
}

/// The report's failures; those at `gone` are source paths that vanished.
fn failed_paths(failures: &[Failure], gone: std::ops::Range<usize>) -> Vec<FailedPath> {
    failures
        .iter()
        .enumerate()
        .map(|(i, f)| FailedPath {
            vanished: gone.contains(&i),
            ..FailedPath::new(show(&f.path), f.reason.clone())
        })
        .collect()
}
