//! The sink end of a session: confirm capacity, rebuild the tree from the
//! metadata stream, answer one SyncDone, then run receivers and writers,
//! finalize files as they complete, and report (seed 000 Fig. 6-4).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, select, unbounded};
use ramsys_proto::control::{Complete, Confirm, Failure};
use ramsys_proto::session::SinkMachine;
use ramsys_proto::Control;
use ramsys_resources::Buf;

use crate::data::receiver::{run_receiver, ReceiverEvent};
use crate::data::sinkfiles::FileTable;
use crate::data::writer::{run_writer, CreditReturn, WriterEvent};
use crate::fsops::Root;
use crate::relink::{LinkEvent, Streams};
use crate::resources::EngineResources;
use crate::session::LinkProvider;
use crate::stats::{process_cpu_seconds, FailedPath, Report, Stats};
use crate::sync::dest::DestMap;
use crate::transport::Link;
use crate::wire::{recv_control, send_control};
use crate::{show, EngineError, TransferOptions};

// The payload phase's event handlers and settle decision.
mod payload;
// The metadata phase's tree and the epilogue that places links.
mod tree;
use tree::Tree;

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

struct Ctl {
    link: Box<dyn Link>,
    machine: SinkMachine,
}

impl Ctl {
    fn send(&mut self, m: &Control) -> Result<(), EngineError> {
        self.machine.on_send(m)?;
        // A failed write here means the control link is gone: say so.
        send_control(&mut *self.link, m).map_err(|e| match e {
            EngineError::Io(e) => EngineError::local(format!("connection to the source lost: {e}")),
            e => e,
        })
    }
    fn recv(&mut self) -> Result<Control, EngineError> {
        let m = recv_control(&mut *self.link)?;
        if let Control::Abort { reason } = &m {
            return Err(EngineError::PeerAborted(reason.clone()));
        }
        // A daemon source refusing the request (path outside its root,
        // not found) answers Error instead of Propose.
        if let Control::Error { message, .. } = &m {
            return Err(EngineError::Refused(message.clone()));
        }
        self.machine.on_recv(&m)?;
        Ok(m)
    }
}

/// Run the sink end on an authenticated control link.
pub fn run_sink(
    ctl_link: Box<dyn Link>,
    links: &mut dyn LinkProvider,
    spec: SinkSpec,
    opts: &TransferOptions,
    res: &EngineResources,
    stats: Arc<Stats>,
) -> Result<Report, EngineError> {
    run_sink_with(
        ctl_link,
        links,
        spec,
        opts,
        res,
        stats,
        &crate::daemon::Unmanaged,
    )
}

/// [`run_sink`] with threads and buffers reserved through `adm` (the
/// daemon's task controller, crate::daemon).
pub fn run_sink_with(
    ctl_link: Box<dyn Link>,
    links: &mut dyn LinkProvider,
    spec: SinkSpec,
    opts: &TransferOptions,
    res: &EngineResources,
    stats: Arc<Stats>,
    adm: &dyn crate::daemon::Admission,
) -> Result<Report, EngineError> {
    let cpu0 = process_cpu_seconds();
    let started = std::time::SystemTime::now();
    let mut ctl = Ctl {
        link: ctl_link,
        machine: SinkMachine::new(),
    };
    // A daemon source may hold the task suspended until threads free up
    // (docs/DAEMON.md): wait as long as for an idle peer.
    ctl.link.set_read_timeout(Some(opts.idle_timeout))?;
    if let Some(addr) = &spec.pending_auth {
        crate::session::finish_auth(&mut *ctl.link, addr, spec.session)?;
    }
    let prop = match ctl.recv()? {
        Control::Propose(p) => p,
        _ => unreachable!("machine admits only Propose here"),
    };
    // How DST is read (sync::dest): cp's rule, rsync's for sync, and
    // where an interrupted copy went for a resumed one. Refused here,
    // before any data moves, when it cannot be used.
    let dmap = match DestMap::resolve(&spec.root, &spec.dest, prop.roots, opts.sync) {
        Ok(m) => m,
        Err(msg) => {
            crate::wire::send_final(
                &mut *ctl.link,
                &Control::Error {
                    code: 2,
                    message: msg.clone(),
                },
            );
            return Err(EngineError::Refused(msg));
        }
    };

    // Capacity: what we can serve of what was proposed.
    // Threads and buffers come from `adm` (a daemon task may be queued
    // and suspended first; docs/DAEMON.md). Refuse with code 4 (busy).
    let grant = adm
        .reserve_sink(
            res,
            prop.streams as usize,
            opts.writers.max(1),
            opts.window.max(2) as usize,
        )
        .inspect_err(|e| {
            let _ = send_control(
                &mut *ctl.link,
                &Control::Error {
                    code: 4,
                    message: e.to_string(),
                },
            );
        })?;
    let (mut receivers, mut writers, share) = (grant.receivers, grant.writers, grant.buffers);
    let streams = receivers.len() as u16;
    let block_size = prop.block_size.min(res.buffers.buf_size() as u32);
    let credits_per_stream = (share.count() / streams as usize) as u32;
    // Returned to the engine on every exit (ShareGuard's Drop).
    let share = crate::resources::ShareGuard::new(res, share);
    let pool = share.pool().clone();
    // Encryption is on if either end asks for it; the source's choice wins.
    let cipher = match crate::crypto::Cipher::from_id(prop.cipher) {
        Ok(crate::crypto::Cipher::None) => opts.encrypt,
        Ok(c) => c,
        Err(e) => {
            return Err(e.into());
        }
    };
    ctl.send(&Control::Confirm(Confirm {
        streams,
        block_size,
        credits_per_stream,
        capacity_mbps: 0,
        checksum: prop.checksum,
        cipher: cipher.id(),
    }))?;
    adm.transferring(streams);

    // Metadata: build the tree as records arrive (tree.rs).
    let table = FileTable::new(
        spec.root.clone(),
        spec.session,
        prop.checksum,
        opts.fsync,
        stats.clone(),
    )
    .with_storage(crate::storage::StorageCfg::sink(opts));
    let mut tree = Tree::new(table, dmap);
    // Checked before the session started (server.rs, the agent).
    tree.protect = crate::request::filter::Filter::new(&opts.select).ok();
    let meta_result = tree.receive(&mut ctl, &spec.root);
    if let Err(e) = meta_result {
        tracing::warn!("session {}: {e}", spec.session);
        let _ = send_control(
            &mut *ctl.link,
            &Control::Abort {
                reason: e.to_string(),
            },
        );
        return Err(e);
    }
    let Tree {
        table,
        deferred,
        prep_failures,
        total_bytes,
        mut sync,
        dest: mut dmap,
        ..
    } = tree;
    stats.total_bytes.store(total_bytes, Ordering::Relaxed);
    stats
        .total_files
        .store(table.files().len() as u64, Ordering::Relaxed);
    // Sync: what we already hold, in the same round trip as SyncDone.
    let mut have_sent = Ok(());
    if let Some(s) = &mut sync {
        for batch in s.answer(&table) {
            have_sent = have_sent.and_then(|_| ctl.send(&Control::Have(batch)));
        }
    }
    let table = Arc::new(table);
    // The whole tree is prepared before the data links are waited for: a
    // client that dialled them early has them ready, and SyncDone leaves
    // one round trip earlier.
    let opened = have_sent
        .and_then(|_| {
            ctl.send(&Control::SyncDone {
                failures: prep_failures.clone(),
            })
        })
        .and_then(|_| links.open(streams));
    let data_links = match opened {
        Ok(l) => l,
        Err(e) => {
            return Err(e);
        }
    };
    let link_desc: Vec<(String, String)> =
        data_links.iter().map(|l| (l.local(), l.peer())).collect();
    for l in &data_links {
        l.set_read_timeout(Some(opts.idle_timeout))?;
    }
    ctl.link.set_read_timeout(None)?;
    let session_key = links.session_key();
    let relinks = links.relinks();
    if cipher != crate::crypto::Cipher::None && session_key.is_none() {
        return Err(EngineError::local("encryption without a session key"));
    }

    // Payload: receivers -> received -> writers, credits back per stream.
    let abort = Arc::new(AtomicBool::new(false));
    let mut credit_returns = Vec::new();
    let mut shutdown_handles = Vec::new();
    // Credits on a sealed session carry a tag (keyed per stream and
    // epoch, crypto::StreamSeal::credits) so no one on the path can forge,
    // replay or alter them.
    let credit_seal = move |i: usize, epoch: u16| {
        session_key.and_then(|k| crate::crypto::StreamSeal::credits(cipher, &k, i as u16, epoch))
    };
    for (i, l) in data_links.iter().enumerate() {
        credit_returns.push(CreditReturn::new(
            l.try_clone_link()?,
            (credits_per_stream as u64 / 4).max(1),
            credit_seal(i, 0),
        ));
        shutdown_handles.push(l.try_clone_link()?);
    }
    let credits = Arc::new(credit_returns);
    let (recv_tx, recv_rx) = bounded::<Buf>(pool.count());
    let (wev_tx, mut wev_rx) = unbounded::<WriterEvent>();
    let (rev_tx, mut rev_rx) = unbounded::<ReceiverEvent>();
    let (rdone_tx, mut rdone_rx) = unbounded();
    let mut writer_jobs = Vec::new();
    for _ in 0..writers.len() {
        let t = table.clone();
        let rx = recv_rx.clone();
        let p = pool.clone();
        let c = credits.clone();
        let ev = wev_tx.clone();
        let a = abort.clone();
        writer_jobs.push(writers.spawn(move || run_writer(&t, rx, p, c, ev, a)));
    }
    drop(recv_rx);
    drop(wev_tx);
    let mut receiver_jobs = Vec::new();
    // A receiver job for stream i on link incarnation `epoch` (0 = first;
    // replacements, crate::relink, take higher ones, which key the AEAD
    // nonces). It reports how many blocks it accepted and how it ended.
    let receiver_job = {
        let (tx, p, ev, a, s, d) = (
            recv_tx.clone(),
            pool.clone(),
            rev_tx.clone(),
            abort.clone(),
            stats.clone(),
            rdone_tx.clone(),
        );
        let (bs, ck) = (block_size as usize, prop.checksum);
        move |i: usize, epoch: u16, l: Box<dyn Link>, g: Arc<AtomicU64>| {
            let (tx, p, ev, a, s, d) = (
                tx.clone(),
                p.clone(),
                ev.clone(),
                a.clone(),
                s.clone(),
                d.clone(),
            );
            let seal = session_key
                .and_then(|k| crate::crypto::StreamSeal::new(cipher, &k, i as u16, epoch));
            move || {
                let mut n = 0u64;
                let r = run_receiver(i as u16, l, bs, ck, p, tx, ev, g, a, s, seal, &mut n);
                let _ = d.send((i, epoch, n, r));
            }
        }
    };
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
    for (i, l) in data_links.into_iter().enumerate() {
        receiver_jobs.push(receivers.spawn(receiver_job(i, 0, l, credits[i].granted())));
    }
    // Blocks accepted per stream over all its links (credit rebase).
    let mut accepted = vec![0u64; streams as usize];
    let mut extra_jobs: Vec<std::thread::JoinHandle<()>> = Vec::new();
    let check_tick = crossbeam_channel::tick(Duration::from_millis(250));
    let window = credits_per_stream as u64;
    drop(recv_tx);
    drop(rev_tx);
    drop(rdone_tx);
    receivers.release_unused();
    writers.release_unused();
    for c in credits.iter() {
        c.grant(credits_per_stream as u64)?;
    }

    let (cev_tx, cev_rx) = unbounded();
    let mut ctl_reader = ctl.link.try_clone_link()?;
    std::thread::Builder::new()
        .name("sink-ctl".into())
        .spawn(move || loop {
            let r = recv_control(&mut *ctl_reader);
            let stop = r.is_err();
            if cev_tx.send(r).is_err() || stop {
                break;
            }
        })?;

    let mut receivers_left = streams as usize;
    let mut eod = false;
    // Resume: the journal follows the written blocks (sync::journal).
    let tick = if table.resume {
        crossbeam_channel::tick(Duration::from_millis(200))
    } else {
        crossbeam_channel::never()
    };
    // Settled (docs/PROTOCOL.md): once every file is in place or failed,
    // no Resend can follow and the source may end its links. Files finish
    // on writer threads, so look often, and scan only after progress.
    let settle_tick = crossbeam_channel::tick(Duration::from_millis(5));
    let mut settle = payload::SettleWatch::new();
    let result: Result<(), EngineError> = loop {
        if eod && receivers_left == 0 {
            break Ok(());
        }
        select! {
            recv(check_tick) -> _ => if !eod && !settle.settled {
                if let Err(e) = streams_st.check() { break Err(e) }
            },
            recv(streams_st.events) -> ev => match ev {
                Ok(LinkEvent::Up(j)) => {
                    if let Some(j) = streams_st.arrived(j) {
                        let i = j.stream as usize;
                        let r = (|| {
                            j.link.set_read_timeout(Some(opts.idle_timeout))?;
                            let g = credits[i].rebase(j.link.try_clone_link()?, credit_seal(i, j.epoch), window, accepted[i])?;
                            shutdown_handles.push(j.link.try_clone_link()?);
                            streams_st.started(i, j.epoch, j.link.try_clone_link()?);
                            let f = receiver_job(i, j.epoch, j.link, g);
                            // Outside the pool (its threads may all be busy), on its CPUs.
                            extra_jobs.push(receivers.pool().spawn_extra(format!("receiver-r{i}"), f)?);
                            Ok::<_, EngineError>(())
                        })();
                        if let Err(e) = r { break Err(e) }
                        receivers_left += 1;
                    }
                }
                Ok(LinkEvent::GaveUp { stream, attempts, reason }) => {
                    streams_st.gave_up(stream, attempts, reason);
                    if !eod && !settle.settled {
                        if let Err(e) = streams_st.check() { break Err(e) }
                    }
                }
                Err(_) => {}
            },
            // (After EndOfData it is too late: the source did not wait.)
            recv(settle_tick) -> _ => if !eod && settle.look(payload::progress(&stats), || table.all_settled()) {
                if let Err(e) = ctl.send(&Control::Settled) { break Err(e); }
            },
            recv(tick) -> _ => if let Some(s) = &mut sync { s.flush(&table, false) },
            recv(cev_rx) -> m => match m {
                Ok(Ok(m)) => if let Err(e) = payload::on_control(m, &mut ctl, &table, &mut sync, &mut streams_st, &mut eod) {
                    break Err(e);
                },
                Ok(Err(EngineError::PeerClosed)) | Ok(Err(EngineError::Io(_))) => {
                    break Err(EngineError::local("connection to the source lost mid-transfer"));
                }
                Ok(Err(e)) => break Err(e),
                Err(_) => break Err(EngineError::local("control reader stopped")),
            },
            recv(rdone_rx) -> r => match r {
                Ok((i, _, n, Ok(()))) => {
                    accepted[i] += n;
                    receivers_left -= 1;
                    streams_st.ended(i);
                }
                Ok((i, epoch, n, Err(e))) if streams_st.enabled() && crate::relink::is_link_loss(&e) && !abort.load(Ordering::Acquire) => {
                    accepted[i] += n;
                    receivers_left -= 1;
                    if eod || settle.settled {
                        // Nothing more is needed on any link.
                        streams_st.ended(i);
                        continue;
                    }
                    // The session goes on without this link (crate::relink):
                    // tell the source what arrived, replace the link.
                    let waiting = streams_st.lost(i, epoch, &e);
                    if let Err(e) = ctl.send(&Control::Lost { stream: i as u16, epoch, received: n }) {
                        break Err(e);
                    }
                    if let Some(j) = waiting {
                        if let Err(e) = streams_st.requeue_arrival(j) { break Err(e) }
                    }
                    if let Err(e) = streams_st.check() { break Err(e) }
                }
                Ok((i, _, n, Err(e))) => {
                    accepted[i] += n;
                    receivers_left -= 1;
                    if abort.load(Ordering::Acquire) {
                        // A writer stopped the session; its event says why.
                        continue;
                    }
                    break Err(EngineError::local(format!("data stream {i} failed: {e}")));
                }
                // Every receiver has ended: a disconnected channel is always
                // ready, so stop selecting on it (else this loop spins).
                Err(_) => rdone_rx = crossbeam_channel::never(),
            },
            recv(wev_rx) -> ev => match ev {
                Ok(WriterEvent::Fatal(m)) => break Err(EngineError::local(m)),
                Ok(WriterEvent::Protocol(m)) => break Err(EngineError::local(format!("protocol error: {m}"))),
                Err(_) => wev_rx = crossbeam_channel::never(),
            },
            recv(rev_rx) -> ev => if let Ok(ReceiverEvent::Corrupt { stream, segs }) = ev {
                if let Err(e) = payload::on_corrupt(stream, &segs, &mut ctl, &table, &stats) { break Err(e); }
            } else {
                rev_rx = crossbeam_channel::never();
            },
        }
    };

    if let Err(e) = &result {
        abort.store(true, Ordering::Release);
        tracing::warn!("session {}: {e}", spec.session);
        let _ = send_control(
            &mut *ctl.link,
            &Control::Abort {
                reason: e.to_string(),
            },
        );
        for h in &shutdown_handles {
            h.shutdown_both();
        }
    }
    for j in receiver_jobs {
        let _ = j.join();
    }
    for j in extra_jobs {
        let _ = j.join();
    }
    drop(receiver_job);
    drop(streams_st);
    for j in writer_jobs {
        let _ = j.join();
    }
    // A writer may have failed after the last block arrived (disk full on
    // the final write): that fails the session, with its reason.
    let mut result = result;
    if result.is_ok() {
        if let Ok(ev) = wev_rx.try_recv() {
            let e = match ev {
                WriterEvent::Fatal(m) => EngineError::local(m),
                WriterEvent::Protocol(m) => EngineError::local(format!("protocol error: {m}")),
            };
            tracing::warn!("session {}: {e}", spec.session);
            let _ = send_control(
                &mut *ctl.link,
                &Control::Abort {
                    reason: e.to_string(),
                },
            );
            result = Err(e);
        }
    }
    // Late corrupt-block reports.
    while let Ok(ReceiverEvent::Corrupt { stream, segs }) = rev_rx.try_recv() {
        for s in segs {
            table.fail_id(
                s.file_id,
                format!("block checksum mismatch on stream {stream}"),
            );
        }
    }
    // The default journal keeps what an interruption left (a lost peer),
    // not what a local failure left (a full disk gets its space back).
    let keep =
        table.resume && (table.journal_min == 0 || !matches!(result, Err(EngineError::Local(_))));
    let file_failures = table.finish_keeping(keep);
    if let Some(s) = &mut sync {
        s.close_journal(&table);
    }
    drop(credits);
    // Every thread holding a clone is joined: the share goes back now.
    drop(pool);
    drop(share);
    if let Err(e) = result {
        ctl.link.shutdown_both();
        return Err(e);
    }

    // Links and directory attributes once the files are in place.
    let mut failures = prep_failures;
    failures.extend(
        file_failures
            .into_iter()
            .map(|(p, r)| Failure { path: p, reason: r }),
    );
    let tmp = |i: usize| format!(".ramsys-{:016x}-{i}.lnk", spec.session).into_bytes();
    let dry = sync.as_ref().is_some_and(|s| s.dry());
    failures.extend(deferred.place(&spec.root, &table, tmp));
    let mut outcome = tree::SyncOutcome {
        deleted: Vec::new(),
        planned: Vec::new(),
        unchanged: table.kept(),
    };
    if let Some(s) = &mut sync {
        outcome = tree::sync_epilogue(
            s,
            &mut ctl,
            &mut failures,
            dmap.dest(),
            started,
            outcome.unchanged,
            spec.session,
        )?;
    }
    let tree::SyncOutcome {
        deleted,
        planned,
        unchanged,
    } = outcome;
    if failures.is_empty() && !dry {
        dmap.finished(&spec.root);
    }
    // Sync counts files whose data moved (a delta with no differing
    // block moved none); a copy counts every file put in place.
    let files = if sync
        .as_ref()
        .is_some_and(|s| s.flags & crate::sync::COMPARE != 0)
    {
        table.files_moved()
    } else {
        stats.files.load(Ordering::Relaxed)
    };
    let bytes: u64 = table.bytes_moved();
    let report = Report {
        unchanged,
        deleted: deleted.iter().map(|p| show(p)).collect(),
        planned: planned.iter().map(|p| show(p)).collect(),
        files,
        bytes,
        failed: failures
            .iter()
            .map(|f| FailedPath {
                path: show(&f.path),
                reason: f.reason.clone(),
            })
            .collect(),
        peer_cpu_s: None,
        streams,
        block_size,
        links: link_desc,
        storage: table.storage.usage(true),
        ..Default::default()
    };
    ctl.send(&Control::Complete(Complete {
        files,
        bytes,
        failures,
        cpu_s: process_cpu_seconds() - cpu0,
    }))?;
    // Wait for the source to close, so our Complete is read before teardown.
    let _ = cev_rx.recv_timeout(Duration::from_secs(10));
    Ok(report)
}
