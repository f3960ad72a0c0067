//! The source end of a session (seed 000 Fig. 6-4): a [`SourceSession`]
//! runs one method per protocol phase (negotiate, stream metadata,
//! confirm and open links, sync answer), then hands over to the data
//! pipeline (payload.rs), whose verdict and teardown end the session.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ramsys_proto::control::{entry_wire_size, Bytes32, Entry, Failure, Propose};
use ramsys_proto::session::{Phase, SourceMachine, Windows};
use ramsys_proto::Control;
use ramsys_resources::Reservation;

use crate::daemon::Admission;
use crate::data::resources::EngineResources;
use crate::request::walk::{walk_archive, Top, Walk};
use crate::roles::source::sync_plan::SyncPlan;
use crate::roles::SessionEnd;
use crate::session::control::{unexpected, ControlLink};
use crate::session::options::TransferOptions;
use crate::session::relink::Relinks;
use crate::session::report::Report;
use crate::session::LinkProvider;
use crate::storage::fsops::Root;
use crate::transport::crypto::Cipher;
use crate::transport::wire::{recv_control, send_control};
use crate::transport::Link;
use crate::types::error::show;
use crate::types::error::EngineError;
use crate::types::stats::{FailedPath, Stats};

pub mod sync_plan;

// Windowed metadata (issue 36): the scan's thread and the window's marks.
mod window;

// The data pipeline: readers and senders, its event loop and teardown.
mod payload;
// Decisions of the payload phase and the Resend handler.
mod pipeline;

/// The source's control link: every message passes its SourceMachine.
type Ctl = ControlLink<SourceMachine>;

/// What to send.
pub struct SourceSpec {
    pub root: Arc<Root>,
    pub tops: Vec<Top>,
    /// (daemon address, session): AuthOk still to be read (pipelined
    /// connect, session::Connect::pipelined).
    pub pending_auth: Option<(String, u64)>,
}

/// Run the source end on an authenticated control link.
pub fn run_source(
    ctl_link: Box<dyn Link>,
    spec: SourceSpec,
    end: SessionEnd,
) -> Result<Report, EngineError> {
    source_session(ctl_link, spec, end, false).map(|(r, _)| r)
}

/// [`run_source`] on a control link kept for more sessions (a watch
/// channel's batch, issue 38): the sink's Complete is the session's last
/// message, so the control reader stops there and the link is handed back
/// open, not shut. On an error it is gone with the session.
pub fn run_source_kept(
    ctl_link: Box<dyn Link>,
    spec: SourceSpec,
    end: SessionEnd,
) -> Result<(Report, Box<dyn Link>), EngineError> {
    source_session(ctl_link, spec, end, true)
}

fn source_session(
    ctl_link: Box<dyn Link>,
    spec: SourceSpec,
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
    let mut s = SourceSession {
        ctl: Ctl::new(ctl_link, SourceMachine::new(), "sink"),
        spec,
        opts,
        res,
        stats,
        adm,
        keep,
    };
    let mut threads = s.negotiate()?;
    crate::types::phase::mark("propose_sent");
    if s.ctl.machine.windows() == Windows::Proposed {
        // (Never on a kept link: windows are not offered there.)
        let r = run_windowed(&mut s, threads, links);
        return r.map(|r| (r, s.ctl.link));
    }
    let (walk, kept) = s.stream_metadata()?;
    crate::types::phase::mark("metadata_sent");
    let mut failures = walk.failures.clone();
    incomplete(&s.stats, &failures);
    let confirmed = s.confirm(&mut threads.senders)?;
    crate::types::phase::mark("confirm");
    // The sink's answer before its data links: a sink streams its Have
    // records before it takes the links, so a source that waited for the
    // links first would leave the answer unread, and past the socket
    // buffers both ends would wait for each other (a no-change sync of
    // 1 M files, issue 36).
    let plan = s.sync_answer(&walk, confirmed.block_size, &mut failures)?;
    crate::types::phase::mark("sync_done");
    let opened = s.open_links(links, &confirmed)?;
    crate::types::phase::mark("links_open");
    let mut data = payload::Payload::start(&mut s, threads, (walk, kept), plan, confirmed, opened)?;
    crate::types::phase::mark("payload_started");
    let verdict = data.run();
    crate::types::phase::mark("complete");
    let r = data.finish(verdict, failures);
    crate::types::phase::mark("torn_down");
    r.map(|r| (r, s.ctl.link))
}

/// [`run_source`] of a session that proposed windows (issue 36): the
/// first window before Confirm; then, if the sink took them, the payload
/// with the records running on ahead of it, else today's phases.
fn run_windowed(
    s: &mut SourceSession<'_>,
    mut threads: Threads,
    links: &mut dyn LinkProvider,
) -> Result<Report, EngineError> {
    let scan = window::start_scan(s)?;
    // The first window, until the sink's answer says what it holds
    // (frame::WINDOW_LIMIT_FLAG): within ours and FIRST_WINDOW.
    let own = window::own_window(s.opts);
    let first = ramsys_proto::session::FIRST_WINDOW;
    let dry = s.opts.sync & crate::request::sync::flags::DRY_RUN != 0;
    let mut ahead = window::Ahead::new((own.0.min(first.0), own.1.min(first.1))).naming(dry);
    if let Err(e) = window::first_window(s, &scan, &mut ahead) {
        return Err(peer_reason(&mut s.ctl, s.spec.pending_auth.as_ref()).unwrap_or(e));
    }
    crate::types::phase::mark("metadata_sent");
    let confirmed = s.confirm(&mut threads.senders)?;
    crate::types::phase::mark("confirm");
    // Ours, within the window the sink announced for its memory budget
    // (Control::Window; docs/SCALE.md "Bounds and reports").
    ahead.set_limit(match confirmed.limit {
        Some(w) => (own.0.min(w.0), own.1.min(w.1)),
        None => own,
    });
    if s.ctl.machine.windows() != Windows::On {
        // A sink of before: every record now, then today's phases.
        let (walk, names) = match window::whole(s, scan, ahead) {
            Ok(w) => w,
            Err(e) => return Err(peer_reason(&mut s.ctl, None).unwrap_or(e)),
        };
        s.stats
            .total_bytes
            .store(walk.total_bytes, Ordering::Relaxed);
        (s.stats.total_files).store(walk.files.len() as u64, Ordering::Relaxed);
        let mut failures = walk.failures.clone();
        incomplete(&s.stats, &failures);
        let plan = s.sync_answer(&walk, confirmed.block_size, &mut failures)?;
        let opened = s.open_links(links, &confirmed)?;
        let plain = (walk, names);
        let mut data = payload::Payload::start(s, threads, plain, plan, confirmed, opened)?;
        let verdict = data.run();
        return data.finish(verdict, failures);
    }
    // The sink's SyncDone comes at once: the payload starts.
    s.sync_answer(&Walk::default(), confirmed.block_size, &mut Vec::new())?;
    crate::types::phase::mark("sync_done");
    // What the first window left carried, as far as the window now goes.
    window::flush(&mut s.ctl, &mut ahead)?;
    window::account(&s.stats, &ahead, s.opts.meta_budget)?;
    let opened = s.open_links(links, &confirmed)?;
    crate::types::phase::mark("links_open");
    let mut data = payload::Payload::start_windowed(s, threads, (scan, ahead), confirmed, opened)?;
    crate::types::phase::mark("payload_started");
    let verdict = data.run();
    crate::types::phase::mark("complete");
    data.finish(verdict, Vec::new())
}

/// The source end of one session, between its phases.
struct SourceSession<'a> {
    ctl: Ctl,
    spec: SourceSpec,
    opts: &'a TransferOptions,
    res: &'a EngineResources,
    stats: Arc<Stats>,
    adm: &'a dyn Admission,
    /// The control link outlives the session (run_source_kept).
    keep: bool,
}

/// Threads reserved before proposing (Fig. 6-4a).
struct Threads {
    senders: Reservation,
    readers: Reservation,
}

/// What the sink confirmed of our proposal.
struct Confirmed {
    streams: u16,
    block_size: usize,
    checksum: bool,
    cipher: Cipher,
    /// Credits per stream (the sending window).
    window: u32,
    /// The records' window the sink announced for its memory budget
    /// (Control::Window, right behind a Confirm with WINDOW_LIMIT_FLAG).
    limit: Option<(u64, u64)>,
}

/// The data links as first opened.
struct Opened {
    links: Vec<Box<dyn Link>>,
    key: Option<Bytes32>,
    relinks: Relinks,
    /// The data links (local, peer, kind), for the report.
    desc: Vec<crate::types::stats::LinkDesc>,
}

impl SourceSession<'_> {
    /// Capacity negotiation (seed 000 Fig. 6-4a): reserve threads first,
    /// propose what we hold; what the sink cannot match is released once
    /// it confirms.
    fn negotiate(&mut self) -> Result<Threads, EngineError> {
        let (opts, res) = (self.opts, self.res);
        let want = opts.streams.clamp(1, res.config.max_streams as u16);
        let (senders, readers) = self
            .adm
            .reserve_source(res, want as usize, opts.readers.max(1))
            .inspect_err(|e| {
                let _ = send_control(
                    &mut *self.ctl.link,
                    &Control::Abort {
                        reason: e.to_string(),
                    },
                );
            })?;
        let block_size = opts.block_size.min(res.buffers.buf_size() as u32).max(4096);
        let propose = Control::Propose(Propose {
            roots: self.spec.tops.len() as u32,
            streams: senders.len() as u16,
            block_size,
            capacity_mbps: 0,
            checksum: opts.checksum,
            cipher: opts.encrypt.id(),
        });
        // A copy or sync (archive ones too) offers windows (issue 36); an
        // old sink ignores it.
        // Not on a kept link (issue 38): its sessions end at Complete with
        // the control reader stopped, which the windowed phases do not do.
        // An archive copy or a `--delete` sync offers them with the wide
        // flag, which a sink of before (windows for plain copies and syncs
        // only) ignores instead of refusing the session's Preserve or
        // SyncMode.
        // A dry run and a resume offer them with a flag of their own, which
        // a sink of before (it refused DRY_RUN and RESUME in windows)
        // ignores likewise. Each
        // with WINDOW_LIMIT_FLAG: a sink with a memory budget may answer
        // with the window it holds (Control::Window); a sink of before
        // ignores it.
        use crate::request::sync::flags::{DELETE, DRY_RUN, RESUME};
        use ramsys_proto::frame::{DRY_WINDOWS_FLAG, RESUME_WINDOWS_FLAG};
        use ramsys_proto::frame::{WIDE_WINDOWS_FLAG, WINDOWS_FLAG};
        let wide = opts.preserve != 0 || opts.sync & DELETE != 0;
        let offer = match (opts.windows_allowed() && !self.keep, wide) {
            (false, _) => 0,
            (true, _) if opts.sync & DRY_RUN != 0 => DRY_WINDOWS_FLAG,
            (true, _) if opts.sync & RESUME != 0 => RESUME_WINDOWS_FLAG,
            (true, false) => WINDOWS_FLAG,
            (true, true) => WIDE_WINDOWS_FLAG,
        };
        let mut flags = match offer {
            0 => 0,
            f => f | ramsys_proto::frame::WINDOW_LIMIT_FLAG,
        };
        // A windowed `--delete` or resume names each directory done, so
        // the sink deletes there and forgets its names during the payload
        // (docs/PROTOCOL.md "Directories done"); a sink of before ignores
        // the flag and deletes at the end.
        if offer != 0 && opts.sync & (DELETE | RESUME) != 0 {
            flags |= ramsys_proto::frame::DIRS_DONE_FLAG;
        }
        // Pieces of big files (a striped push): the sink names those in
        // place before Complete, so the agent can tell a file no sink
        // placed (issue 36); a sink of before ignores the flag.
        if opts.pieces.is_some() {
            flags |= ramsys_proto::frame::PLACED_FLAG;
        }
        self.ctl.send_flagged(&propose, flags)?;
        // DEST_DIR is the sink's own (SyncOpen, or its agent's options).
        let mode = opts.sync & !crate::request::sync::flags::DEST_DIR;
        if mode != 0 {
            // Sync (docs/SYNC.md): the sink answers with what it holds.
            self.ctl.send(&Control::SyncMode { flags: mode })?;
        }
        if opts.preserve != 0 {
            // An archive copy (crate::storage::archive): Attrs follow the records.
            self.ctl.send(&Control::Preserve {
                flags: opts.preserve,
            })?;
        }
        Ok(Threads { senders, readers })
    }

    /// Metadata in one round trip (Fig. 6-4b): stream every record right
    /// behind Propose; Confirm and the single SyncDone are read after.
    /// The scan streams its records as it goes (walk_streamed), so the
    /// sink checks what it holds while the source still scans.
    fn stream_metadata(&mut self) -> Result<(Walk, Names), EngineError> {
        let (opts, spec, ctl) = (self.opts, &self.spec, &mut self.ctl);
        // Records are not kept once sent (issue 36), but for a dry run,
        // whose report names the files it would send.
        let keep = opts.sync & crate::request::sync::flags::DRY_RUN != 0;
        let mut kept = Names::new();
        let mut held = MetaHeld::default();
        let stats = &self.stats;
        let scanned =
            if opts.source_engine == crate::storage::DataEngine::Null && opts.null_size > 0 {
                let (w, es) = crate::request::null::synthetic_walk(&spec.tops, opts.null_size);
                if keep {
                    kept.extend(names_of(&es));
                }
                send_entries(ctl, &es).map(|_| w)
            } else {
                // What the user selected (request::filter); checked before the
                // session started, so an error here is the peer's malformed rule.
                let mut filter = crate::request::filter::Filter::new(&opts.select)
                    .map_err(|e| EngineError::local(format!("filter rules: {e}")))?;
                // A striped push's pieces of big files (request::shares).
                filter.pieces.clone_from(&opts.pieces);
                filter.listed_may_vanish = opts.listed_may_vanish;
                let (root, tops) = (spec.root.path(), &spec.tops);
                walk_archive(
                    root,
                    tops,
                    opts.recursive,
                    &filter,
                    opts.preserve,
                    &mut |es, attrs| {
                        if keep {
                            kept.extend(names_of(es));
                        }
                        held.add(es);
                        stats
                            .meta_used(held.bytes, held.files, opts.meta_budget)
                            .map_err(EngineError::Local)?;
                        send_entries(ctl, es)?;
                        crate::storage::archive::collect::send_attrs(attrs, &mut |m| ctl.send(&m))
                    },
                )
            };
        let sent = scanned.and_then(|w| send_meta_end(ctl, &w, &spec.root).map(|_| w));
        let w = match sent {
            Ok(w) => w,
            // The peer may have refused and closed while we were still
            // streaming: its reason is waiting on the link.
            Err(e) => return Err(peer_reason(ctl, spec.pending_auth.as_ref()).unwrap_or(e)),
        };
        self.stats
            .total_bytes
            .store(w.total_bytes, Ordering::Relaxed);
        self.stats
            .total_files
            .store(w.files.len() as u64, Ordering::Relaxed);
        Ok((w, kept))
    }

    /// The negotiation answer, read only now so the metadata travelled in
    /// the same flight as Propose (and Auth, on a pipelined connect).
    /// Senders the sink cannot match are released.
    fn confirm(&mut self, senders: &mut Reservation) -> Result<Confirmed, EngineError> {
        if let Some((addr, session)) = &self.spec.pending_auth {
            crate::session::finish_auth(&mut *self.ctl.link, addr, *session)?;
            crate::types::phase::mark("auth_ok");
        }
        // A daemon sink may hold the task suspended until threads free up
        // (docs/DAEMON.md): wait as long as for an idle peer.
        self.ctl
            .link
            .set_read_timeout(Some(self.opts.idle_timeout))?;
        // The machine admits only Confirm before SyncDone's Have records.
        let (confirm, flags) = match self.ctl.recv_flagged()? {
            (Control::Confirm(c), flags) => (c, flags),
            (m, _) => return Err(unexpected(&m, self.ctl.phase())),
        };
        // The sink's window, right behind (the machine admits nothing else).
        let limit = match flags & ramsys_proto::frame::WINDOW_LIMIT_FLAG {
            0 => None,
            _ => match self.ctl.recv()? {
                Control::Window { files, bytes } => Some((files, bytes)),
                m => return Err(unexpected(&m, self.ctl.phase())),
            },
        };
        senders.shrink_to(confirm.streams as usize);
        let streams = senders.len() as u16;
        if streams < confirm.streams {
            return Err(EngineError::local(
                "sender threads vanished during negotiation",
            ));
        }
        self.adm.transferring(streams);
        // The sink may add encryption, never drop or swap the one we asked for.
        let cipher = Cipher::from_id(confirm.cipher)?;
        let asked = self.opts.encrypt;
        if asked != Cipher::None && cipher != asked {
            return Err(EngineError::local(format!(
                "peer confirmed cipher {} instead of {}",
                cipher.name(),
                asked.name()
            )));
        }
        Ok(Confirmed {
            streams,
            block_size: confirm.block_size as usize,
            checksum: confirm.checksum,
            cipher,
            window: confirm.credits_per_stream,
            limit,
        })
    }

    /// Open the data links the sink confirmed.
    fn open_links(
        &mut self,
        links: &mut dyn LinkProvider,
        c: &Confirmed,
    ) -> Result<Opened, EngineError> {
        // A sink that refused the metadata (e.g. a directory onto a file)
        // has ended the session: its reason is on the control link.
        let data_links = match links.open(c.streams) {
            Ok(l) => l,
            Err(e) => return Err(peer_reason(&mut self.ctl, None).unwrap_or(e)),
        };
        let key = links.session_key();
        let relinks = links.relinks();
        if c.cipher != Cipher::None && key.is_none() {
            return Err(EngineError::local("encryption without a session key"));
        }
        let desc = data_links
            .iter()
            .map(|l| crate::transport::describe(&**l))
            .collect();
        for l in &data_links {
            l.set_read_timeout(Some(self.opts.idle_timeout))?;
        }
        Ok(Opened {
            links: data_links,
            key,
            relinks,
            desc,
        })
    }

    /// The sink's answer to the metadata: what it holds (Have, on a sync)
    /// and its SyncDone with the paths it could not prepare. Sync compares
    /// what it holds and tells it what it can reuse (docs/SYNC.md).
    fn sync_answer(
        &mut self,
        w: &Walk,
        block_size: usize,
        failures: &mut Vec<FailedPath>,
    ) -> Result<Option<SyncPlan>, EngineError> {
        self.ctl.link.set_read_timeout(None)?;
        let mut haves = crate::roles::source::sync_plan::Answer::default();
        // SyncDone moves the machine on to the payload phase (a windowed
        // sink sends it before the last record).
        while self.ctl.phase() != Phase::Payload {
            match self.ctl.recv()? {
                Control::Have(v) => haves.extend(v),
                // The sink's own: each stops its --delete, whatever its cause.
                Control::SyncDone { failures: f } => {
                    failures.extend(
                        f.into_iter()
                            .map(|f| FailedPath::new(show(&f.path), f.reason)),
                    );
                }
                m => return Err(unexpected(&m, self.ctl.phase())),
            }
        }
        let sync = self.opts.sync;
        let dry = sync & crate::request::sync::flags::DRY_RUN != 0;
        let plan = (sync & crate::request::sync::COMPARE != 0).then(|| {
            let max_run = crate::request::tasks::stripe_chunk(block_size as u64);
            crate::roles::source::sync_plan::plan(&self.spec.root, &w.files, haves, dry, max_run)
        });
        if let Some(p) = &plan {
            for chunk in p.reuse.chunks(16_384) {
                self.ctl.send(&Control::Reuse(chunk.to_vec()))?;
            }
        }
        Ok(plan)
    }
}

/// What the source's file list holds as the scan sends it (issue 36's
/// accounting): a `SourceFile` and its path per regular file, kept for
/// the payload; directories and other records are not kept.
#[derive(Default)]
struct MetaHeld {
    files: u64,
    bytes: u64,
}

impl MetaHeld {
    fn add(&mut self, es: &[Entry]) {
        use ramsys_proto::control::EntryKind;
        for e in es {
            if matches!(e.kind, EntryKind::File { .. } | EntryKind::Piece { .. }) {
                self.files += 1;
                self.bytes +=
                    (std::mem::size_of::<crate::types::file::SourceFile>() + e.path.len()) as u64;
            }
        }
    }
}

/// Entries records, as many per CONTROL frame as fit in half of one. An
/// empty slice is the scan's keepalive (request::walk::SCAN_KEEPALIVE):
/// an empty Entries message, which renews the sink's idle timeout.
fn send_entries(ctl: &mut Ctl, entries: &[Entry]) -> Result<(), EngineError> {
    if entries.is_empty() {
        return ctl.send(&Control::Entries(Vec::new()));
    }
    ctl.send_batched(entries.iter().cloned(), entry_wire_size, Control::Entries)
}

fn send_meta_end(ctl: &mut Ctl, w: &Walk, root: &Root) -> Result<(), EngineError> {
    send_scan_failures(ctl, &w.failures, &root.path().to_string_lossy())?;
    ctl.send(&Control::MetaEnd {
        entries: w.entries,
        files: w.files.len() as u64,
        bytes: w.total_bytes,
    })
}

/// The scan's failures, for the sink's report and its --delete rule
/// (Control::ScanFailed), named relative to the source root: a daemon's
/// paths mean nothing to its client. Batched as Entries are.
fn send_scan_failures(ctl: &mut Ctl, failed: &[FailedPath], root: &str) -> Result<(), EngineError> {
    let io_error = failed.iter().any(|f| !f.vanished);
    let named = failed.iter().map(|f| Failure {
        path: wire_path(root, &f.path).as_bytes().to_vec(),
        reason: f.reason.clone(),
    });
    ctl.send_batched(
        named,
        |f| f.path.len() + f.reason.len() + 16,
        |failures| Control::ScanFailed { failures, io_error },
    )
}

/// The scan's `failed` paths: any but a vanished one (rsync's
/// IOERR_GENERAL) stops the sink's --delete, as the report says.
pub(super) fn incomplete(stats: &Stats, failed: &[FailedPath]) {
    if failed.iter().any(|f| !f.vanished) {
        stats.source_incomplete.store(true, Ordering::Relaxed);
    }
}

/// A failed path as the sink names it: a daemon's root stripped; "/" (an
/// ssh source) keeps paths whole.
fn wire_path<'p>(root: &str, path: &'p str) -> &'p str {
    let root = root.trim_end_matches('/');
    match path.strip_prefix(root) {
        Some(r) if !root.is_empty() => r.trim_start_matches('/'),
        _ => path,
    }
}

/// A dry run's report names what it would send or make by wire paths:
/// (id, path, the file a further name links to) of each record but
/// directories, ascending ids.
pub(super) type Names = Vec<Named>;
pub(super) type Named = (u64, Vec<u8>, Option<u64>);

/// The records among `es` a dry run may name (all but directories).
pub(super) fn names_of(es: &[Entry]) -> impl Iterator<Item = Named> + '_ {
    use ramsys_proto::control::EntryKind;
    es.iter()
        .filter(|e| !matches!(e.kind, EntryKind::Dir))
        .map(|e| {
            let link = match e.kind {
                EntryKind::HardLink { target_id } | EntryKind::LinkTo { target_id, .. } => {
                    Some(target_id)
                }
                _ => None,
            };
            (e.id, e.path.clone(), link)
        })
}

/// What a dry run lists of `names`, in id order, as `rsync -n` lists it
/// (issue 36): the files it would send (`planned`, ids; kept in `sent`
/// for the further names of later windows), the records the sink would
/// make (`made`: its Have for a record that is not a file,
/// docs/PROTOCOL.md), and every further name of a file it would send.
pub(super) fn dry_list(
    names: &Names,
    planned: impl IntoIterator<Item = u64>,
    made: &[u64],
    sent: &mut std::collections::HashSet<u64>,
) -> Vec<String> {
    sent.extend(planned);
    let made: std::collections::HashSet<u64> = made.iter().copied().collect();
    names
        .iter()
        .filter(|(id, _, link)| {
            sent.contains(id) || made.contains(id) || link.is_some_and(|t| sent.contains(&t))
        })
        .map(|(_, p, _)| show(p))
        .collect()
}

/// After a failed send: the reason the peer gave, if it sent one.
fn peer_reason(ctl: &mut Ctl, pending: Option<&(String, u64)>) -> Option<EngineError> {
    let _ = ctl.link.set_read_timeout(Some(Duration::from_secs(2)));
    if let Some((addr, session)) = pending {
        if let Err(e) = crate::session::finish_auth(&mut *ctl.link, addr, *session) {
            return Some(e);
        }
    }
    // The reason may come behind the sink's ordinary answers (Confirm is
    // sent before the metadata it then refuses): skip those.
    for _ in 0..8 {
        match recv_control(&mut *ctl.link) {
            Ok(Control::Error { message, .. }) => return Some(EngineError::Refused(message)),
            Ok(Control::Abort { reason }) => return Some(EngineError::PeerAborted(reason)),
            Ok(m @ Control::Redirect { .. }) => {
                return crate::session::control::check_abort(&m).err()
            }
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
    None
}
