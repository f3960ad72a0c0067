//! The source end of a session: negotiate, scan and stream metadata,
//! then run readers and senders until every block is out, and collect
//! the sink's verdict (seed 000 Fig. 6-4).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, select, unbounded, Sender};
use ramsys_proto::control::{entry_wire_size, Propose};
use ramsys_proto::frame::MAX_CONTROL_BODY;
use ramsys_proto::session::SourceMachine;
use ramsys_proto::Control;
use ramsys_resources::Buf;

use crate::config::SendPath;
use crate::data::inline::InlineLinks;
use crate::data::reader::{run_reader, ReaderCtx, ReaderEvent, SrcFileState};
use crate::data::reread::Rereader;
use crate::data::sender::{run_sender, LinkDone, StreamOut};
use crate::fsops::Root;
use crate::relink::{Joined, LinkEvent, Requeue, Streams};
use crate::request::tasks::{assign_homes, plan_source};
use crate::request::walk::{walk_streamed, Top};
use crate::resources::EngineResources;
use crate::session::LinkProvider;
use crate::stats::{FailedPath, Report, Stats};
use crate::transport::Link;
use crate::wire::{recv_control, send_control};
use crate::{show, EngineError, TransferOptions};

// Decisions of the payload phase and the Resend handler.
mod pipeline;
use pipeline::{LostLinks, Pipeline};
use ramsys_proto::relink::SentLog;

/// What to send.
pub struct SourceSpec {
    pub root: Arc<Root>,
    pub tops: Vec<Top>,
    /// (daemon address, session): AuthOk still to be read (pipelined
    /// connect, session::client_connect_pipelined).
    pub pending_auth: Option<(String, u64)>,
}

struct Ctl {
    link: Box<dyn Link>,
    machine: SourceMachine,
}

impl Ctl {
    fn send(&mut self, m: &Control) -> Result<(), EngineError> {
        self.machine.on_send(m)?;
        // A failed write here means the control link is gone: say so.
        send_control(&mut *self.link, m).map_err(|e| match e {
            EngineError::Io(e) => EngineError::local(format!("connection to the sink lost: {e}")),
            e => e,
        })
    }
    fn recv(&mut self) -> Result<Control, EngineError> {
        let m = recv_control(&mut *self.link)?;
        check_abort(&m)?;
        self.machine.on_recv(&m)?;
        Ok(m)
    }
}

fn check_abort(m: &Control) -> Result<(), EngineError> {
    match m {
        Control::Abort { reason } => Err(EngineError::PeerAborted(reason.clone())),
        Control::Error { message, .. } => Err(EngineError::Refused(message.clone())),
        _ => Ok(()),
    }
}

/// Entries records, as many per CONTROL frame as fit in half of one.
fn send_entries(
    ctl: &mut Ctl,
    entries: &[ramsys_proto::control::Entry],
) -> Result<(), EngineError> {
    let mut batch = Vec::new();
    let mut batch_bytes = 0usize;
    let limit = MAX_CONTROL_BODY as usize / 2;
    for e in entries {
        let sz = entry_wire_size(e);
        if batch_bytes + sz > limit && !batch.is_empty() {
            ctl.send(&Control::Entries(std::mem::take(&mut batch)))?;
            batch_bytes = 0;
        }
        batch_bytes += sz;
        batch.push(e.clone());
    }
    if !batch.is_empty() {
        ctl.send(&Control::Entries(batch))?;
    }
    Ok(())
}

fn send_meta_end(ctl: &mut Ctl, w: &crate::request::walk::Walk) -> Result<(), EngineError> {
    ctl.send(&Control::MetaEnd {
        entries: w.entries.len() as u64,
        files: w.files.len() as u64,
        bytes: w.total_bytes,
    })
}

/// After a failed send: the reason the peer gave, if it sent one.
fn peer_reason(ctl: &mut Ctl, pending: Option<&(String, u64)>) -> Option<EngineError> {
    let _ = ctl.link.set_read_timeout(Some(Duration::from_secs(2)));
    if let Some((addr, session)) = pending {
        if let Err(e) = crate::session::finish_auth(&mut *ctl.link, addr, *session) {
            return Some(e);
        }
    }
    match recv_control(&mut *ctl.link) {
        Ok(Control::Error { message, .. }) => Some(EngineError::Refused(message)),
        Ok(Control::Abort { reason }) => Some(EngineError::PeerAborted(reason)),
        _ => None,
    }
}

/// Run the source end on an authenticated control link.
pub fn run_source(
    ctl_link: Box<dyn Link>,
    links: &mut dyn LinkProvider,
    spec: SourceSpec,
    opts: &TransferOptions,
    res: &EngineResources,
    stats: Arc<Stats>,
) -> Result<Report, EngineError> {
    run_source_with(
        ctl_link,
        links,
        spec,
        opts,
        res,
        stats,
        &crate::daemon::Unmanaged,
    )
}

/// [`run_source`] with threads reserved through `adm` (the daemon's task
/// controller, crate::daemon).
pub fn run_source_with(
    ctl_link: Box<dyn Link>,
    links: &mut dyn LinkProvider,
    spec: SourceSpec,
    opts: &TransferOptions,
    res: &EngineResources,
    stats: Arc<Stats>,
    adm: &dyn crate::daemon::Admission,
) -> Result<Report, EngineError> {
    let mut ctl = Ctl {
        link: ctl_link,
        machine: SourceMachine::new(),
    };
    // Capacity negotiation (seed 000 Fig. 6-4a): reserve threads first,
    // propose what we hold, then release what the sink cannot match.
    let want = opts.streams.clamp(1, res.config.max_streams as u16);
    let (mut senders, mut readers) = adm
        .reserve_source(res, want as usize, opts.readers.max(1))
        .inspect_err(|e| {
            let _ = send_control(
                &mut *ctl.link,
                &Control::Abort {
                    reason: e.to_string(),
                },
            );
        })?;
    let block_size = opts.block_size.min(res.buffers.buf_size() as u32).max(4096);
    ctl.send(&Control::Propose(Propose {
        roots: spec.tops.len() as u32,
        streams: senders.len() as u16,
        block_size,
        capacity_mbps: 0,
        checksum: opts.checksum,
        cipher: opts.encrypt.id(),
    }))?;
    if opts.sync != 0 {
        // Sync (docs/SYNC.md): the sink answers with what it holds.
        ctl.send(&Control::SyncMode { flags: opts.sync })?;
    }
    // Metadata in one round trip (Fig. 6-4b): stream every record right
    // behind Propose, then wait for Confirm and the single SyncDone.
    // The scan streams its records as it goes (walk_streamed), so the
    // sink checks what it holds while the source still scans.
    let scanned = if opts.source_engine == crate::storage::DataEngine::Null && opts.null_size > 0 {
        let w = crate::storage::null::synthetic_walk(&spec.tops, opts.null_size);
        send_entries(&mut ctl, &w.entries).map(|_| w)
    } else {
        // What the user selected (request::filter); checked before the
        // session started, so an error here is the peer's malformed rule.
        let filter = crate::request::filter::Filter::new(&opts.select)
            .map_err(|e| EngineError::local(format!("--exclude/--include: {e}")))?;
        walk_streamed(
            spec.root.path(),
            &spec.tops,
            opts.recursive,
            &filter,
            &mut |es| send_entries(&mut ctl, es),
        )
    };
    let sent = scanned.and_then(|w| send_meta_end(&mut ctl, &w).map(|_| w));
    let w = match sent {
        Ok(w) => w,
        // The peer may have refused and closed while we were still
        // streaming: its reason is waiting on the link.
        Err(e) => return Err(peer_reason(&mut ctl, spec.pending_auth.as_ref()).unwrap_or(e)),
    };
    stats.total_bytes.store(w.total_bytes, Ordering::Relaxed);
    stats
        .total_files
        .store(w.files.len() as u64, Ordering::Relaxed);
    let mut failures: Vec<FailedPath> = w.failures.clone();
    // Negotiation answer: read only now, so the metadata above travelled
    // in the same flight as Propose (and Auth, on a pipelined connect).
    if let Some((addr, session)) = &spec.pending_auth {
        crate::session::finish_auth(&mut *ctl.link, addr, *session)?;
    }
    // A daemon sink may hold the task suspended until threads free up
    // (docs/DAEMON.md): wait as long as for an idle peer.
    ctl.link.set_read_timeout(Some(opts.idle_timeout))?;
    let confirm = match ctl.recv()? {
        Control::Confirm(c) => c,
        _ => unreachable!("machine admits only Confirm here"),
    };
    senders.shrink_to(confirm.streams as usize);
    let streams = senders.len() as u16;
    if streams < confirm.streams {
        return Err(EngineError::local(
            "sender threads vanished during negotiation",
        ));
    }
    adm.transferring(streams);
    let block_size = confirm.block_size as usize;
    let checksum = confirm.checksum;
    // The sink may add encryption, never drop or swap the one we asked for.
    let cipher = crate::crypto::Cipher::from_id(confirm.cipher)?;
    if opts.encrypt != crate::crypto::Cipher::None && cipher != opts.encrypt {
        return Err(EngineError::local(format!(
            "peer confirmed cipher {} instead of {}",
            cipher.name(),
            opts.encrypt.name()
        )));
    }
    // A sink that refused the metadata (e.g. a directory onto a file)
    // has ended the session: its reason is on the control link.
    let data_links = match links.open(confirm.streams) {
        Ok(l) => l,
        Err(e) => return Err(peer_reason(&mut ctl, None).unwrap_or(e)),
    };
    let session_key = links.session_key();
    let relinks = links.relinks();
    if cipher != crate::crypto::Cipher::None && session_key.is_none() {
        return Err(EngineError::local("encryption without a session key"));
    }
    let link_desc: Vec<(String, String)> =
        data_links.iter().map(|l| (l.local(), l.peer())).collect();
    for l in &data_links {
        l.set_read_timeout(Some(opts.idle_timeout))?;
    }

    ctl.link.set_read_timeout(None)?;
    let mut haves = Vec::new();
    loop {
        match ctl.recv()? {
            Control::Have(v) => haves.extend(v),
            Control::SyncDone { failures: f } => {
                failures.extend(f.into_iter().map(|f| FailedPath {
                    path: show(&f.path),
                    reason: f.reason,
                }));
                break;
            }
            _ => unreachable!("machine admits only Have and SyncDone here"),
        }
    }
    // Sync: compare what the sink holds, tell it what it can reuse.
    let dry = opts.sync & crate::sync::flags::DRY_RUN != 0;
    let plan = (opts.sync & crate::sync::COMPARE != 0).then(|| {
        let max_run = crate::request::tasks::stripe_chunk(block_size as u64);
        crate::sync::source::plan(&spec.root, &w.files, haves, dry, max_run)
    });
    if let Some(p) = &plan {
        for chunk in p.reuse.chunks(16_384) {
            ctl.send(&Control::Reuse(chunk.to_vec()))?;
        }
    }

    // Payload: readers -> filled -> senders.
    let nread = readers.len();
    let share = res
        .take_buffers(2, streams as usize * 2 + nread + 2, Duration::from_secs(30))
        .ok_or_else(|| EngineError::local("no buffers free"))?;
    let pool = Arc::new(share);
    if let Some(bridge) = &opts.local_copy {
        // A local copy: the in-process sink opens large files by entry id.
        let mut rels = vec![Vec::new(); w.entries.len()];
        for f in &w.files {
            if let Some(r) = rels.get_mut(f.id as usize) {
                r.clone_from(&f.rel);
            }
        }
        bridge.publish(spec.root.clone(), rels);
    }
    let files = Arc::new(w.files);
    let state: Arc<Vec<SrcFileState>> = Arc::new(
        files
            .iter()
            .enumerate()
            .map(|(i, f)| SrcFileState {
                remaining: AtomicU64::new(plan.as_ref().map_or(f.size, |p| p.bytes(i, f.size))),
                digest: AtomicU64::new(0),
                failed: AtomicBool::new(false),
            })
            .collect(),
    );
    let skip = |i: usize| plan.as_ref().is_some_and(|p| p.skipped(i));
    let mut queues = plan_source(&spec.root, &files, opts, block_size as u64, &skip);
    if let Some(p) = &plan {
        crate::sync::source::restrict(&mut queues, p);
    }
    let queues = Arc::new(queues);
    let (filled_tx, filled_rx) = bounded::<Buf>(pool.count());
    let (rev_tx, mut rev_rx) = unbounded::<ReaderEvent>();
    // Re-read lost blocks report unreadable files here too (crate::relink).
    let requeue_events = rev_tx.clone();
    let abort = Arc::new(AtomicBool::new(false));
    // Data links: shut down on error so no thread stays blocked on one.
    // Every sending end reports on `sdone` (data::sender::LinkDone).
    let (sdone_tx, mut sdone_rx) = unbounded::<LinkDone>();
    let mut shutdown_handles = Vec::new();
    for l in &data_links {
        shutdown_handles.push(l.try_clone_link()?);
    }
    let window = confirm.credits_per_stream;
    // The sending end of stream i on link incarnation `epoch` (0 = first;
    // replacements, crate::relink, take higher ones, which key the AEAD
    // nonces).
    let rate = opts.rate.clone();
    let out_of = move |i: usize, epoch: u16, l: Box<dyn Link>| {
        let seal =
            session_key.and_then(|k| crate::crypto::StreamSeal::new(cipher, &k, i as u16, epoch));
        let credits = session_key
            .and_then(|k| crate::crypto::StreamSeal::credits(cipher, &k, i as u16, epoch));
        StreamOut::new(i, epoch, l, window, seal)
            .with_credit_seal(credits)
            .with_rate(rate.clone())
    };
    // Inline send path (seed 002 sec. 7): readers own the links' sending
    // ends in turn and no sender thread runs (crate::data::inline).
    // The control link has seen several round trips by now, so the
    // kernel's RTT estimate is a fair measure of the path.
    let rtt = ctl.link.rtt();
    let path = opts.send_path.resolve(nread, streams as usize, rtt);
    tracing::info!(
        "source: send path {} ({nread} readers, {streams} streams, rtt {})",
        path.name(),
        rtt.map_or("unknown".to_string(), |r| format!(
            "{:.2} ms",
            r.as_secs_f64() * 1e3
        ))
    );
    let mut data_links = data_links;
    let inline = (path == SendPath::Inline).then(|| {
        let outs = data_links
            .drain(..)
            .enumerate()
            .map(|(i, l)| out_of(i, 0, l))
            .collect();
        Arc::new(InlineLinks::new(
            outs,
            sdone_tx.clone(),
            pool.clone(),
            abort.clone(),
            stats.clone(),
        ))
    });
    // Nothing to read: empty files, and delta files with no differing
    // block (their digest is the sum over no segment).
    let nothing = |i: usize, f: &crate::request::walk::SourceFile| match &plan {
        None => f.size == 0,
        Some(p) => !p.skipped(i) && p.bytes(i, f.size) == 0,
    };
    for (_, f) in files.iter().enumerate().filter(|(i, f)| nothing(*i, f)) {
        let _ = rev_tx.send(ReaderEvent::FileDone {
            id: f.id,
            digest: 0,
        });
    }
    let ctx = Arc::new(ReaderCtx {
        root: spec.root.clone(),
        files: files.clone(),
        state,
        queues: queues.clone(),
        pool: pool.clone(),
        filled: filled_tx.clone(),
        inline: inline.clone(),
        events: rev_tx,
        checksum,
        abort: abort.clone(),
        stats: stats.clone(),
        block_size,
        storage: Arc::new(crate::storage::StorageCfg::source(opts, block_size)),
        homes: assign_homes(&queues, nread),
    });
    let (rdone_tx, mut rdone_rx) = unbounded::<()>();
    let mut jobs = Vec::new();
    for i in 0..nread {
        let c = ctx.clone();
        let d = rdone_tx.clone();
        jobs.push(readers.spawn(move || {
            run_reader(&c, i);
            drop(c);
            let _ = d.send(());
        }));
    }
    drop(rdone_tx);
    let read_storage = ctx.storage.clone();
    drop(ctx);
    // Queued path: a sender thread per link. Dropping a link's closer
    // stops its sender even while the queue is idle (data::sender).
    let mut closers: std::collections::HashMap<(usize, u16), Sender<()>> = Default::default();
    let sender_job = {
        let (rx, p, a, s, d) = (
            filled_rx.clone(),
            pool.clone(),
            abort.clone(),
            stats.clone(),
            sdone_tx.clone(),
        );
        let inline = inline.clone();
        move |i: usize, epoch: u16, l: Box<dyn Link>| -> Option<(Sender<()>, SenderJob)> {
            let out = out_of(i, epoch, l);
            if let Some(links) = &inline {
                // Inline: a replacement joins the free set; no thread.
                links.add(out);
                return None;
            }
            let (rx, p, a, s, d) = (rx.clone(), p.clone(), a.clone(), s.clone(), d.clone());
            let (close_tx, close_rx) = bounded::<()>(0);
            let job: SenderJob = Box::new(move || {
                let _ = d.send(run_sender(out, rx, close_rx, p, a, s));
            });
            Some((close_tx, job))
        }
    };
    for (i, l) in data_links.into_iter().enumerate() {
        if let Some((c, job)) = sender_job(i, 0, l) {
            closers.insert((i, 0), c);
            jobs.push(senders.spawn(job));
        }
    }
    // Inline: re-sent blocks (Resend, and those lost links lost) still
    // come through `filled`; one thread sends them, and ends the links
    // once the queue closes, as the queued senders would.
    let mut extra_jobs: Vec<std::thread::JoinHandle<()>> = Vec::new();
    if let Some(links) = &inline {
        let (links, rx) = (links.clone(), filled_rx.clone());
        extra_jobs.push(
            std::thread::Builder::new()
                .name("src-resend".into())
                .spawn(move || {
                    for b in rx.iter() {
                        links.send(b);
                    }
                    links.end();
                })?,
        );
    }
    // Inline: links the sink saw break, until their reports arrive.
    let mut evicting: std::collections::HashSet<(usize, u16)> = Default::default();
    drop(sdone_tx);
    let mut streams_st = Streams::new(
        relinks,
        shutdown_handles
            .iter()
            .map(|h| h.try_clone_link())
            .collect::<Result<_, _>>()?,
        ctl.link.peer(),
        stats.clone(),
        abort.clone(),
    );
    let requeue = Arc::new(Requeue {
        root: spec.root.clone(),
        files: files.clone(),
        pool: pool.clone(),
        checksum,
        null: opts.source_engine == crate::storage::DataEngine::Null,
        abort: abort.clone(),
    });
    // Per lost link (stream, epoch): what its sender sent, and how many
    // blocks the sink says it accepted; both are needed to re-queue.
    let mut lost: LostLinks<SentLog> = LostLinks::new();
    let check_tick = crossbeam_channel::tick(Duration::from_millis(250));
    // Replacement links' senders run outside the pool but on its CPUs.
    let sender_pool = senders.pool().clone();
    senders.release_unused();
    readers.release_unused();

    // Control reader: sink messages become events.
    let (cev_tx, cev_rx) = unbounded();
    let mut ctl_reader = ctl.link.try_clone_link()?;
    std::thread::Builder::new()
        .name("src-ctl".into())
        .spawn(move || loop {
            let r = recv_control(&mut *ctl_reader);
            let stop = r.is_err();
            if cev_tx.send(r).is_err() || stop {
                break;
            }
        })?;

    let mut pl = Pipeline::new(nread, streams as usize);
    let mut kept_links = Vec::new();
    let mut local_failed: Vec<FailedPath> = Vec::new();
    let mut deleted: Vec<String> = Vec::new();
    // Re-sent blocks (Resend) go through the same queue; the senders end
    // only once the sink has Settled and this handle is dropped.
    let mut resend_tx = Some(filled_tx);
    let resender = Rereader::new(
        &spec.root,
        &files,
        checksum,
        opts.source_engine == crate::storage::DataEngine::Null,
    );
    let result: Result<Control, EngineError> = loop {
        if pl.resends_over(rev_rx.is_empty()) {
            resend_tx = None;
        }
        // Flush digests whenever the event queue runs dry or grows big.
        if pl.flush_due(rev_rx.is_empty()) {
            if let Err(e) = ctl.send(&Control::FilesDone(std::mem::take(&mut pl.done_batch))) {
                break Err(e);
            }
        }
        if pl.eod_due(rev_rx.is_empty()) {
            let (files, bytes) = (pl.files_done, stats.bytes.load(Ordering::Relaxed));
            if let Err(e) = ctl.send(&Control::EndOfData { files, bytes }) {
                break Err(e);
            }
        }
        // Re-queue what a lost link lost, once both halves are known.
        if let Some(tx) = &resend_tx {
            let r = requeue_ready(&mut lost, &requeue, tx, &requeue_events, &mut extra_jobs);
            if let Err(e) = r {
                break Err(e);
            }
        }
        if let Some(l) = &inline {
            // A link put back just after the last sweep is caught here.
            for &(i, epoch) in &evicting {
                l.evict(i, epoch);
            }
        }
        if resend_tx.is_none() {
            // Settled: lost links need no replacement any more.
            pl.senders_left -= streams_st.settle();
        }
        select! {
            recv(check_tick) -> _ => if let Err(e) = streams_st.check() { break Err(e) },
            recv(streams_st.events) -> ev => match ev {
                Ok(LinkEvent::Up(j)) => {
                    if let Some(j) = streams_st.arrived(j) {
                        if let Err(e) = start_replacement(&mut streams_st, &mut shutdown_handles, &mut closers, (&sender_pool, &mut extra_jobs), &sender_job, j, opts.idle_timeout) {
                            break Err(e);
                        }
                    }
                }
                Ok(LinkEvent::GaveUp { stream, attempts, reason }) => {
                    if streams_st.gave_up(stream, attempts, reason) {
                        pl.senders_left -= 1;
                    }
                    if let Err(e) = streams_st.check() { break Err(e) }
                }
                Err(_) => {}
            },
            recv(rev_rx) -> ev => match ev {
                Ok(ReaderEvent::FileDone { id, digest }) => pl.file_done(id, digest),
                Ok(ReaderEvent::FileFailed { id, path, reason }) => {
                    tracing::warn!("{path}: {reason}");
                    local_failed.push(FailedPath { path: spec.root.path().join(std::ffi::OsStr::new(&path)).display().to_string(), reason: reason.clone() });
                    if let Err(e) = ctl.send(&Control::FileFailed { id, reason }) {
                        break Err(e);
                    }
                }
                // All readers gone: a disconnected channel is always ready,
                // so stop selecting on it (else this loop spins).
                Err(_) => rev_rx = crossbeam_channel::never(),
            },
            recv(rdone_rx) -> r => match r {
                Ok(()) => pl.readers_left -= 1,
                Err(_) => rdone_rx = crossbeam_channel::never(),
            },
            recv(sdone_rx) -> r => match r {
                Ok((i, epoch, Ok(link), _)) => { evicting.remove(&(i, epoch)); pl.senders_left -= 1; kept_links.push(link); streams_st.ended(i); }
                Ok((i, epoch, Err((link, e)), log)) if streams_st.enabled() && crate::relink::is_link_loss(&e) && !abort.load(Ordering::Acquire) => {
                    evicting.remove(&(i, epoch));
                    closers.remove(&(i, epoch));
                    kept_links.push(link);
                    if resend_tx.is_none() {
                        // Settled: nothing left to send on any link.
                        pl.senders_left -= 1;
                        streams_st.ended(i);
                        continue;
                    }
                    // The session goes on without this link (crate::relink):
                    // ask the sink what arrived, replace the link.
                    let waiting = streams_st.lost(i, epoch, &e);
                    lost.log((i, epoch), log);
                    if let Err(e) = ctl.send(&Control::LinkDown { stream: i as u16, epoch }) {
                        break Err(e);
                    }
                    if let Some(j) = waiting {
                        if let Err(e) = start_replacement(&mut streams_st, &mut shutdown_handles, &mut closers, (&sender_pool, &mut extra_jobs), &sender_job, j, opts.idle_timeout) {
                            break Err(e);
                        }
                    }
                    if let Err(e) = streams_st.check() { break Err(e) }
                }
                Ok((i, _, Err((link, e)), _)) => {
                    kept_links.push(link);
                    // The sink usually says why it dropped the stream
                    // (disk full, protocol error): prefer its reason.
                    if let Ok(Ok(Control::Abort { reason })) = cev_rx.recv_timeout(Duration::from_secs(2)) {
                        break Err(EngineError::PeerAborted(reason));
                    }
                    break Err(EngineError::local(format!("data stream {i} failed: {e}")));
                }
                Err(_) => sdone_rx = crossbeam_channel::never(),
            },
            recv(cev_rx) -> m => match m {
                Ok(Ok(m)) => {
                    if let Err(e) = check_abort(&m) { break Err(e); }
                    if let Err(e) = ctl.machine.on_recv(&m) { break Err(e.into()); }
                    if let Control::Deleted(v) = &m { deleted.extend(v.iter().map(|p| show(p))); }
                    if matches!(m, Control::Settled) { pl.settled = true; }
                    if let Control::Lost { stream, epoch, received } = m {
                        // Our end may not have noticed yet: close it, so
                        // its sender ends and hands over its log.
                        streams_st.close(stream as usize, epoch);
                        closers.remove(&(stream as usize, epoch));
                        if let Some(l) = &inline {
                            evicting.insert((stream as usize, epoch));
                            l.evict(stream as usize, epoch);
                        }
                        lost.received((stream as usize, epoch), received);
                    }
                    if let (Control::Resend(v), Some(tx)) = (&m, &resend_tx) {
                        if let Err(e) = pipeline::on_resend(v, tx, &resender, &pool, &stats, &mut ctl) { break Err(e); }
                    }
                    if matches!(m, Control::Complete(_)) { break Ok(m); }
                }
                Ok(Err(EngineError::PeerClosed)) | Ok(Err(EngineError::Io(_))) => {
                    break Err(EngineError::local("connection to the sink lost mid-transfer"));
                }
                Ok(Err(e)) => break Err(e),
                Err(_) => break Err(EngineError::local("control reader stopped")),
            },
        }
    };

    // Senders must see their queue close, on success and on error alike.
    drop(resend_tx);
    let outcome = match result {
        Ok(Control::Complete(c)) => {
            let mut failed = failures;
            failed.extend(local_failed);
            // The sink reports files the source failed too; keep one line each.
            for f in c.failures {
                let p = show(&f.path);
                if !failed.iter().any(|x| x.path.ends_with(&p)) {
                    failed.push(FailedPath {
                        path: p,
                        reason: f.reason,
                    });
                }
            }
            Ok(Report {
                files: c.files,
                bytes: c.bytes,
                failed,
                peer_cpu_s: Some(c.cpu_s),
                streams,
                block_size: block_size as u32,
                links: link_desc,
                send_path: Some(path),
                handoffs: stats.handoffs.load(Ordering::Relaxed),
                storage: read_storage.usage(false),
                unchanged: plan.as_ref().map_or(0, |p| p.unchanged),
                deleted,
                planned: plan.as_ref().map_or(Vec::new(), |p| {
                    // Wire paths (entry ids index the entry list).
                    p.planned
                        .iter()
                        .map(|&i| show(&w.entries[files[i].id as usize].path))
                        .collect()
                }),
            })
        }
        Ok(_) => unreachable!(),
        Err(e) => {
            abort.store(true, Ordering::Release);
            let reason = e.to_string();
            let _ = ctl.send(&Control::Abort { reason });
            for h in &shutdown_handles {
                h.shutdown_both();
            }
            if let Some(l) = &inline {
                // Wake readers waiting for a link that will not come.
                l.close();
            }
            Err(e)
        }
    };
    // Drain so no reader stays blocked on a full queue, then join all.
    if outcome.is_err() {
        while pl.readers_left > 0 {
            while let Ok(b) = filled_rx.try_recv() {
                pool.put(b);
            }
            if rdone_rx.recv_timeout(Duration::from_millis(20)).is_ok() {
                pl.readers_left -= 1;
            }
        }
    }
    drop(sender_job);
    for j in jobs {
        let _ = j.join();
    }
    for j in extra_jobs {
        let _ = j.join();
    }
    // Blocks still queued when the senders stopped (a failed session) go
    // back to the pool, or returning the share waits for them in vain.
    while let Ok(b) = filled_rx.try_recv() {
        pool.put(b);
    }
    drop(filled_rx);
    drop(requeue);
    drop(streams_st);
    drop(closers);
    // The inline links hold a reference to the buffer share.
    drop(inline);
    ctl.link.shutdown_both();
    drop(kept_links);
    res.return_buffers(pool);
    outcome
}

/// Start a sender on a replacement link (crate::relink). Replacements are
/// rare, so they run on a thread of their own rather than a pooled one
/// (the session's pooled senders may all be busy), pinned to the sender
/// pool's CPUs.
fn start_replacement<F>(
    st: &mut Streams,
    handles: &mut Vec<Box<dyn Link>>,
    closers: &mut std::collections::HashMap<(usize, u16), Sender<()>>,
    (pool, jobs): (
        &ramsys_resources::ThreadPool,
        &mut Vec<std::thread::JoinHandle<()>>,
    ),
    job: &F,
    j: Joined,
    idle: Duration,
) -> Result<(), EngineError>
where
    F: Fn(usize, u16, Box<dyn Link>) -> Option<(Sender<()>, SenderJob)>,
{
    j.link.set_read_timeout(Some(idle))?;
    handles.push(j.link.try_clone_link()?);
    st.started(j.stream as usize, j.epoch, j.link.try_clone_link()?);
    let (stream, epoch) = (j.stream as usize, j.epoch);
    // Inline: the link joined the free set and needs no thread.
    if let Some((close, f)) = job(stream, epoch, j.link) {
        closers.insert((stream, epoch), close);
        jobs.push(pool.spawn_extra(format!("sender-r{stream}"), f)?);
    }
    Ok(())
}

/// A queued sender's thread body.
type SenderJob = Box<dyn FnOnce() + Send + 'static>;

/// Re-queue the blocks each lost link sent that the sink did not accept,
/// for the links whose log and count are both known (crate::relink).
fn requeue_ready(
    lost: &mut LostLinks<SentLog>,
    requeue: &Arc<crate::relink::Requeue>,
    tx: &Sender<Buf>,
    events: &Sender<ReaderEvent>,
    jobs: &mut Vec<std::thread::JoinHandle<()>>,
) -> Result<(), EngineError> {
    for ((stream, _), log, n) in lost.ready() {
        let blocks = log.unreceived(n)?;
        tracing::info!(
            "stream {stream}: sending {} lost blocks again",
            blocks.len()
        );
        let blocks = blocks.into_iter().map(|b| b.to_vec()).collect();
        jobs.push(requeue.spawn(blocks, tx.clone(), events.clone())?);
    }
    Ok(())
}
