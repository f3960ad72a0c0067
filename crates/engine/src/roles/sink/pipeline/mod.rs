//! The sink's data pipeline (seed 000 Fig. 6-4c): a receiver per data
//! link verifies blocks and queues them to the writers, which write them
//! and return credits per stream; one event loop on the session's thread
//! answers the source's control messages, the receivers' ends and the
//! writers' failures, each with a handler of its own; one teardown joins
//! every thread and finalizes the files.
//!
//! (Over 800 lines: the loop's handlers are methods of one
//! `SinkPipeline` that share its state: the credits, the receivers and
//! the writers' wiring. The next step moves the wiring and the credits to
//! files of their own once the windowed sink (branch `window`, issue 36)
//! has landed, which reshapes the same handlers.)

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, never, select, unbounded, Receiver, RecvError, Sender};
use ramsys_proto::control::Bytes32;
use ramsys_proto::Control;
use ramsys_resources::{Buf, BufferPool, JobHandle};

use super::tree::Tree;
use super::{payload, Ctl, Drained, Grant, Opened, SinkSession};
use crate::data::receiver::{run_receiver, ReceiverEvent};
use crate::data::resources::ShareGuard;
use crate::roles::sink::files::FileTable;
use crate::roles::sink::sync_delta::SinkSync;
use crate::roles::sink::writer::settler::{SettlerWiring, Settlers, MAX_SETTLERS};
use crate::roles::sink::writer::{direct_lane, run_writer, CreditReturn, WriterEvent, WriterIo};
use crate::session::control::ControlEvent;
use crate::session::relink::{Joined, LinkEvent, Streams};
use crate::transport::crypto::{Cipher, StreamSeal};
use crate::transport::grow::{Growth, Stage};
use crate::transport::Link;
use crate::types::error::EngineError;
use crate::types::stats::Stats;

/// How a receiver thread ended: (stream, epoch, blocks accepted, result).
type ReceiverDone = (usize, u16, u64, Result<(), EngineError>);

/// A receiver thread's body for stream i on link incarnation `epoch`
/// (0 = first; replacements, crate::session::relink, take higher ones, which key
/// the AEAD nonces), given the credit count it may be granted.
type ReceiverFactory =
    Box<dyn Fn(usize, u16, Box<dyn Link>, Arc<AtomicU64>) -> Box<dyn FnOnce() + Send>>;

/// What one event did: go on, or an error that ends the session.
type Step = Result<(), EngineError>;

/// The data pipeline of one sink session, from its first block to its
/// teardown.
pub(super) struct SinkPipeline<'s> {
    ctl: &'s mut Ctl,
    table: Arc<FileTable>,
    sync: Option<SinkSync>,
    stats: Arc<Stats>,
    abort: Arc<AtomicBool>,
    /// Returned to the engine once every thread is joined (teardown).
    share: ShareGuard<'s>,
    pool: Arc<BufferPool>,
    events: Events,
    streams: Streams,
    receivers: ReceiverSet,
    credits: Credits,
    progress: Progress,
    writer_jobs: Vec<JobHandle>,
    /// FilesDone applied off this thread (writer::settler).
    settlers: Settlers,
    _writers: ramsys_resources::Reservation,
    session: u64,
    facts: (u16, u32, Vec<crate::types::stats::LinkDesc>),
    /// What a daemon-side source's stream adaptation did (Control::Grown).
    growth: Option<Growth>,
    /// A windowed session's metadata, still arriving (issue 36).
    window: Option<Window<'s>>,
}

/// A windowed session's records during the payload (issue 36,
/// docs/PROTOCOL.md "Windows"): each Entries batch is registered and made
/// reachable, then Ready; settled chunks are dropped and SettledThrough
/// says so; Settled only once MetaEnd came and everything settled.
struct Window<'s> {
    tree: &'s mut Tree,
    /// The Ready and SettledThrough marks sent.
    ready: u64,
    settled: u64,
    meta_end: bool,
    /// Progress (files settled, by the counters) and the Ready mark at
    /// the last release: a chunk settles with one of them (a chunk of
    /// directories only, with the Ready that covers it).
    last: (u64, u64),
    /// The control reader's timeouts count until MetaEnd.
    idle: Arc<AtomicBool>,
}

impl<'s> Window<'s> {
    /// No mark sent yet; `idle` counts the control reader's timeouts.
    fn new(tree: &'s mut Tree, idle: Arc<AtomicBool>) -> Self {
        Window {
            tree,
            ready: 0,
            settled: 0,
            meta_end: false,
            last: (u64::MAX, 0),
            idle,
        }
    }
}

/// What the loop waits on, besides the links' own events.
struct Events {
    check_tick: Receiver<Instant>,
    /// Settled (docs/PROTOCOL.md): files finish on writer threads, so
    /// look often, and scan only after progress (payload::SettleWatch).
    settle_tick: Receiver<Instant>,
    /// ...and at once when a writer saw the counters reach every file
    /// (FileTable::counted_all_first).
    settle_wake: Receiver<()>,
    /// Resume: the journal follows the written blocks (roles::sink::journal).
    journal_tick: Receiver<Instant>,
    control: Receiver<ControlEvent>,
    receivers_done: Receiver<ReceiverDone>,
    writers: Receiver<WriterEvent>,
    corrupt: Receiver<ReceiverEvent>,
}

impl Events {
    /// `settle`: the writers' wake-up and the journal's tick.
    fn new(
        (settle_wake, journal_tick): (Receiver<()>, Receiver<Instant>),
        control: Receiver<ControlEvent>,
        receivers_done: Receiver<ReceiverDone>,
        writers: Receiver<WriterEvent>,
        corrupt: Receiver<ReceiverEvent>,
    ) -> Events {
        Events {
            check_tick: crossbeam_channel::tick(Duration::from_millis(250)),
            settle_tick: crossbeam_channel::tick(Duration::from_millis(5)),
            settle_wake,
            journal_tick,
            control,
            receivers_done,
            writers,
            corrupt,
        }
    }
}

/// The data links' receiving ends.
struct ReceiverSet {
    make: ReceiverFactory,
    reservation: ramsys_resources::Reservation,
    jobs: Vec<JobHandle>,
    /// Replacement links' receivers, outside the pool on its CPUs.
    extra: Vec<std::thread::JoinHandle<()>>,
    /// Shut down on error so no thread stays blocked on a link.
    shutdown: Vec<Box<dyn Link>>,
    idle: Duration,
}

impl ReceiverSet {
    fn new(
        make: ReceiverFactory,
        reservation: ramsys_resources::Reservation,
        jobs: Vec<JobHandle>,
        shutdown: Vec<Box<dyn Link>>,
        idle: Duration,
    ) -> ReceiverSet {
        ReceiverSet {
            make,
            reservation,
            jobs,
            extra: Vec::new(),
            shutdown,
            idle,
        }
    }
}

/// Credits returned per stream, and what a replacement link rebases on.
/// Sized for the most streams the sink takes (its receiver pool), so
/// streams added mid-transfer (issue 21) need no reallocation under the
/// writers' feet.
struct Credits {
    returns: Arc<Vec<CreditReturn>>,
    keys: StreamKeys,
    /// Each stream's window, credits (AddStream shrinks the others').
    windows: Vec<u64>,
    /// The session's buffers: the windows never add up to more.
    buffers: u64,
    /// The window Confirm announced: no stream gets more.
    window: u64,
    /// Blocks accepted per stream over all its links (credit rebase).
    accepted: Vec<u64>,
}

impl Credits {
    /// The first `streams` streams hold a window of `window` credits each;
    /// the slots past them wait for streams the source may add.
    fn new(
        returns: Arc<Vec<CreditReturn>>,
        keys: StreamKeys,
        streams: u16,
        window: u64,
        buffers: u64,
    ) -> Credits {
        let windows = (0..returns.len())
            .map(|i| if i < streams as usize { window } else { 0 })
            .collect();
        Credits {
            keys,
            windows,
            buffers,
            window,
            accepted: vec![0u64; returns.len()],
            returns,
        }
    }

    /// Room for stream `stream` (the `n`-th): a window of up to
    /// `buffers / (n + 1)` credits, taken from the buffers no window holds
    /// and then from the widest windows, one credit at a time (their
    /// writers give that many fewer back); at least 2 credits each, so a
    /// stream keeps one block in flight while one is written. 0: no room.
    fn make_room(&mut self, stream: usize, n: usize) -> u64 {
        if stream != n || n >= self.returns.len() {
            return 0;
        }
        let want = (self.buffers / (n as u64 + 1)).min(self.window);
        let held: u64 = self.windows[..n].iter().sum();
        let mut got = self.buffers.saturating_sub(held).min(want);
        let mut debt = vec![0u64; n];
        while got < want {
            let (j, w) = (0..n)
                .map(|j| (j, self.windows[j]))
                .max_by_key(|&(_, w)| w)
                .expect("at least one stream");
            if w <= 2 {
                break;
            }
            self.windows[j] -= 1;
            debt[j] += 1;
            got += 1;
        }
        if got < 2 {
            // Give back what was taken: nothing changes.
            for (j, d) in debt.into_iter().enumerate() {
                self.windows[j] += d;
            }
            return 0;
        }
        for (j, d) in debt.into_iter().enumerate() {
            if d > 0 {
                self.returns[j].withhold(d);
            }
        }
        self.windows[stream] = got;
        got
    }
}

type Links = Vec<Box<dyn Link>>;

/// The credit returns of the first links (and second handles on those
/// links, to shut them down on error), plus slots for streams the source
/// may add (issue 21): as many as the receiver pool (`most`) has threads,
/// each linked once its link joins.
fn credit_returns(
    links: &[Box<dyn Link>],
    batch: u64,
    keys: StreamKeys,
    most: usize,
) -> Result<(Arc<Vec<CreditReturn>>, Links), EngineError> {
    let mut returns = Vec::new();
    let mut shutdown = Vec::new();
    for (i, l) in links.iter().enumerate() {
        let link = l.try_clone_link()?;
        returns.push(CreditReturn::new(link, batch, keys.credits(i, 0)));
        shutdown.push(l.try_clone_link()?);
    }
    while returns.len() < most {
        let placeholder = Box::new(crate::transport::ClosedLink);
        returns.push(CreditReturn::new(placeholder, batch, None));
    }
    Ok((Arc::new(returns), shutdown))
}

/// The source's last message of a session.
fn is_end_of_data(m: &Control) -> bool {
    matches!(m, Control::EndOfData { .. })
}

/// A receiver on each first link, from the receiver pool; each may be
/// granted its stream's credits.
fn spawn_receivers(
    receivers: &mut ramsys_resources::Reservation,
    make: &ReceiverFactory,
    links: Links,
    returns: &[CreditReturn],
) -> Vec<JobHandle> {
    let mut jobs = Vec::new();
    for (i, l) in links.into_iter().enumerate() {
        jobs.push(receivers.spawn(make(i, 0, l, returns[i].granted())));
    }
    jobs
}

/// Each first stream's window of credits, once every receiver runs. The
/// slots past `streams` wait for links the source may add (issue 21).
fn grant_first_credits(
    returns: &[CreditReturn],
    streams: u16,
    per_stream: u64,
) -> Result<(), EngineError> {
    for c in returns.iter().take(streams as usize) {
        c.grant(per_stream)?;
    }
    Ok(())
}

/// The control messages: from the reader a windowed session started
/// already (with its flag of records due), else from a reader started
/// here, which on a kept link stops at EndOfData (run_sink_kept).
fn control_reader(
    ctl: &mut Ctl,
    keep: bool,
    started: Option<(Receiver<ControlEvent>, Arc<AtomicBool>)>,
) -> Result<(Receiver<ControlEvent>, Option<Arc<AtomicBool>>), EngineError> {
    let last = keep.then_some(is_end_of_data as fn(&Control) -> bool);
    Ok(match started {
        Some((c, due)) => (c, Some(due)),
        None => (ctl.spawn_reader("sink-ctl", last)?, None),
    })
}

/// How many of the `reserved` writers run. SINK_WRITERS_MIN is for trees
/// of small files (metadata-bound); a session of large files keeps the
/// plan's count, `bulk` (4 x 1 GiB took ~10 % more sink CPU with the
/// floor's second writer). A local copy keeps them all: its writers do
/// the copying itself (copy_file_range, storage::local), and one writer
/// left 4 x 1 GiB on one core.
fn writer_count(bulk: Option<usize>, table: &FileTable, reserved: usize) -> usize {
    if table.storage.local.is_some() {
        return reserved;
    }
    let mut small = 0;
    table.for_each_file(|f| small += (f.size < crate::storage::DIRECT_MIN) as usize);
    match bulk {
        Some(b) if small < crate::daemon::config::placement::MANY_SMALL_FILES => {
            b.clamp(1, reserved)
        }
        _ => reserved,
    }
}

/// Resume: the journal follows the written blocks (roles::sink::journal) on a
/// tick; without resume, never.
fn journal_tick(resume: bool) -> Receiver<Instant> {
    if resume {
        crossbeam_channel::tick(Duration::from_millis(200))
    } else {
        never()
    }
}

/// Progress of the payload phase as the sink's loop sees it.
struct Progress {
    receivers_left: usize,
    /// The source sent EndOfData.
    eod: bool,
    settle: payload::SettleWatch,
}

impl Progress {
    /// Every first stream's receiver still to end.
    fn new(streams: u16) -> Progress {
        Progress {
            receivers_left: streams as usize,
            eod: false,
            settle: payload::SettleWatch::new(),
        }
    }
}

/// The per-stream keys: open blocks, seal credits.
#[derive(Clone, Copy)]
struct StreamKeys {
    key: Option<Bytes32>,
    cipher: Cipher,
}

impl StreamKeys {
    fn blocks(&self, i: usize, epoch: u16) -> Option<StreamSeal> {
        let c = self.cipher;
        self.key
            .and_then(|k| StreamSeal::new(c, &k, i as u16, epoch))
    }
    /// Credits on a sealed session carry a tag (keyed per stream and
    /// epoch, crypto::StreamSeal::credits) so no one on the path can
    /// forge, replay or alter them.
    fn credits(&self, i: usize, epoch: u16) -> Option<StreamSeal> {
        let c = self.cipher;
        self.key
            .and_then(|k| StreamSeal::credits(c, &k, i as u16, epoch))
    }
}

/// What every writer thread shares (roles::sink::writer).
struct WriterWiring {
    table: Arc<FileTable>,
    pool: Arc<BufferPool>,
    credits: Arc<Vec<CreditReturn>>,
    abort: Arc<AtomicBool>,
    gate: Option<Arc<crate::daemon::site::share::ThreadGate>>,
}

impl WriterWiring {
    /// Start `n` writers draining `rx`; they report on `events` and wake
    /// the loop's settle check on `wake`.
    fn spawn(
        self,
        writers: &mut ramsys_resources::Reservation,
        n: usize,
        rx: Receiver<Buf>,
        events: Sender<WriterEvent>,
        wake: Sender<()>,
    ) -> Vec<JobHandle> {
        (0..n)
            .map(|i| {
                let (t, rx, p) = (self.table.clone(), rx.clone(), self.pool.clone());
                let (c, ev, a) = (self.credits.clone(), events.clone(), self.abort.clone());
                let wake = wake.clone();
                let gate = self.gate.clone().map(|g| (i, g));
                writers.spawn(move || {
                    let w = WriterIo {
                        table: &t,
                        lane: direct_lane(t.storage.lane_bytes, &p, n),
                        pool: p,
                        credits: c,
                        events: ev,
                        settle_wake: wake,
                        abort: a,
                        gate,
                    };
                    run_writer(w, rx)
                })
            })
            .collect()
    }
}

impl<'s> SinkPipeline<'s> {
    /// Start writers and receivers on the opened links, grant the first
    /// credits, start the control reader. The order is the contract:
    /// writers before receivers, credits granted only once every receiver
    /// runs.
    pub(super) fn start(
        s: &'s mut SinkSession<'_>,
        g: Grant<'s>,
        table: Arc<FileTable>,
        sync: Option<SinkSync>,
        o: Opened,
        control: Option<(Receiver<ControlEvent>, Arc<AtomicBool>)>,
        tree: Option<&'s mut Tree>,
    ) -> Result<Self, EngineError> {
        if g.cipher != Cipher::None && o.key.is_none() {
            return Err(EngineError::local("encryption without a session key"));
        }
        let (stats, idle) = (s.stats.clone(), s.opts.idle_timeout);
        let Grant {
            mut receivers,
            mut writers,
            share,
            streams,
            block_size,
            credits_per_stream,
            checksum,
            cipher,
            gate,
        } = g;
        let pool = share.pool().clone();
        let nbuf = pool.count() as u64;
        let keys = StreamKeys { key: o.key, cipher };
        let abort = Arc::new(AtomicBool::new(false));
        let batch = (credits_per_stream as u64 / 4).max(1);
        let most = receivers.pool().size();
        let (returns, shutdown) = credit_returns(&o.links, batch, keys, most)?;
        let (recv_tx, recv_rx) = bounded::<Buf>(pool.count());
        let (wev_tx, wev_rx) = unbounded::<WriterEvent>();
        let (wake_tx, wake_rx) = bounded::<()>(1);
        let (rev_tx, rev_rx) = unbounded::<ReceiverEvent>();
        let (rdone_tx, rdone_rx) = unbounded::<ReceiverDone>();
        // A windowed table starts empty: its trees are many files.
        let nw = match tree {
            Some(_) => writers.len(),
            None => writer_count(s.opts.bulk_writers, &table, writers.len()),
        };
        let wiring = WriterWiring {
            table: table.clone(),
            pool: pool.clone(),
            credits: returns.clone(),
            abort: abort.clone(),
            gate,
        };
        let settlers = Settlers::new(SettlerWiring {
            table: table.clone(),
            pool: writers.pool().clone(),
            events: wev_tx.clone(),
            wake: wake_tx.clone(),
            abort: abort.clone(),
            most: nw.clamp(1, MAX_SETTLERS),
        });
        // The channels' other ends are the writers' and settlers' only:
        // dropped here.
        let writer_jobs = wiring.spawn(&mut writers, nw, recv_rx, wev_tx, wake_tx);
        let make = receiver_factory(
            (block_size as usize, checksum, keys),
            recv_tx,
            &pool,
            rev_tx,
            &abort,
            &stats,
            rdone_tx,
        );
        let handles = shutdown
            .iter()
            .map(|h| h.try_clone_link())
            .collect::<Result<_, _>>()?;
        let (peer, ab) = (s.ctl.link.peer(), abort.clone());
        let streams_st = Streams::new(o.relinks, handles, peer, stats.clone(), ab);
        let jobs = spawn_receivers(&mut receivers, &make, o.links, &returns);
        receivers.release_unused();
        writers.release_unused();
        grant_first_credits(&returns, streams, credits_per_stream as u64)?;
        let (control, records_due) = control_reader(&mut s.ctl, s.keep, control)?;
        let journal_tick = journal_tick(table.resume);
        Ok(SinkPipeline {
            ctl: &mut s.ctl,
            table,
            sync,
            stats,
            abort,
            share,
            pool,
            events: Events::new((wake_rx, journal_tick), control, rdone_rx, wev_rx, rev_rx),
            streams: streams_st,
            receivers: ReceiverSet::new(make, receivers, jobs, shutdown, idle),
            credits: Credits::new(returns, keys, streams, credits_per_stream as u64, nbuf),
            progress: Progress::new(streams),
            writer_jobs,
            settlers,
            _writers: writers,
            session: s.spec.session,
            facts: (streams, block_size, o.desc),
            growth: None,
            window: tree.map(|tree| Window::new(tree, records_due.unwrap_or_default())),
        })
    }

    /// The event loop: until EndOfData came and every receiver ended, or
    /// the first error.
    pub(super) fn run(&mut self) -> Result<(), EngineError> {
        while !(self.progress.eod && self.progress.receivers_left == 0) {
            select! {
                recv(self.events.check_tick) -> _ => self.on_check(),
                recv(self.streams.events) -> ev => self.on_link_event(ev),
                // (After EndOfData it is too late: the source did not wait.)
                recv(self.events.settle_tick) -> _ => self.on_settle_tick(),
                recv(self.events.settle_wake) -> w => self.on_settle_wake(w),
                recv(self.events.journal_tick) -> _ => self.on_journal_tick(),
                recv(self.events.control) -> m => self.on_control(m),
                recv(self.events.receivers_done) -> r => self.on_receiver_done(r),
                recv(self.events.writers) -> ev => self.on_writer_event(ev),
                recv(self.events.corrupt) -> ev => self.on_corrupt(ev),
            }?;
        }
        Ok(())
    }

    /// Payload still flowing: are the links' replacements on time?
    fn on_check(&mut self) -> Step {
        if self.progress.eod || self.progress.settle.settled {
            return Ok(());
        }
        self.streams.check()
    }

    /// A replacement link arrived, or one stream gave up on replacing.
    fn on_link_event(&mut self, ev: Result<LinkEvent, RecvError>) -> Step {
        match ev {
            Ok(LinkEvent::Up(j)) => {
                if let Some(j) = self.streams.arrived(j) {
                    self.start_replacement(j)?;
                    self.progress.receivers_left += 1;
                }
                Ok(())
            }
            Ok(LinkEvent::GaveUp {
                stream,
                attempts,
                reason,
            }) => {
                self.streams.gave_up(stream, attempts, reason);
                self.on_check()
            }
            Err(_) => Ok(()),
        }
    }

    /// A receiver on a replacement link, its credits rebased on what the
    /// stream accepted so far.
    fn start_replacement(&mut self, j: Joined) -> Step {
        let (r, c) = (&mut self.receivers, &self.credits);
        let i = j.stream as usize;
        j.link.set_read_timeout(Some(r.idle))?;
        let seal = c.keys.credits(i, j.epoch);
        let link = j.link.try_clone_link()?;
        let g = c.returns[i].rebase(link, seal, c.windows[i], c.accepted[i])?;
        r.shutdown.push(j.link.try_clone_link()?);
        if self.streams.started(i, j.epoch, j.link.try_clone_link()?) {
            self.facts.0 += 1;
        }
        let f = (r.make)(i, j.epoch, j.link, g);
        // Outside the pool (its threads may all be busy), on its CPUs.
        let pool = r.reservation.pool();
        r.extra.push(pool.spawn_extra(format!("receiver-r{i}"), f)?);
        Ok(())
    }

    /// Tell the source once every file is in place or failed; in a
    /// windowed session, drop the chunks that settled and say so.
    fn on_settle_tick(&mut self) -> Step {
        let progress = payload::progress(&self.stats);
        self.release_settled(progress)?;
        let table = &self.table;
        let all_records = self.window.as_ref().is_none_or(|w| w.meta_end);
        let settled = || all_records && table.all_settled();
        if !self.progress.eod && self.progress.settle.look(progress, settled) {
            self.ctl.send(&Control::Settled)?;
            crate::types::phase::mark("sink_settled_sent");
        }
        Ok(())
    }

    /// A windowed session: drop the chunks that settled since the last
    /// look (`progress`: files settled by the counters) and tell the
    /// source how far.
    fn release_settled(&mut self, progress: u64) -> Step {
        let Some(w) = &mut self.window else {
            return Ok(());
        };
        if (progress, w.ready) != w.last && !self.progress.eod {
            w.last = (progress, w.ready);
            let below = self.table.release(w.ready);
            if below > w.settled {
                w.settled = below;
                // An archive copy's files get their attributes as they
                // settle (storage::archive::apply): none held past here.
                w.tree.settled(below, &self.table.root);
                self.ctl.send(&Control::SettledThrough { through: below })?;
            }
        }
        Ok(())
    }

    /// A writer saw the counters reach every file: look now. (Writers
    /// gone: stop selecting on the disconnected channel.)
    fn on_settle_wake(&mut self, w: Result<(), RecvError>) -> Step {
        match w {
            Ok(()) => self.on_settle_tick(),
            Err(_) => {
                self.events.settle_wake = never();
                Ok(())
            }
        }
    }

    /// Resume: bring the journal up to the written blocks.
    fn on_journal_tick(&mut self) -> Step {
        if let Some(s) = &mut self.sync {
            s.flush(&self.table, false)
        }
        Ok(())
    }

    /// The source asks for one more data stream (issue 21): make room in
    /// the credits and await its link, or refuse (credits 0) when the
    /// receiver pool's threads or the buffers are used up, or the payload
    /// is already settled.
    fn on_add_stream(&mut self, stream: u16) -> Step {
        self.ctl.machine.on_recv(&Control::AddStream { stream })?;
        let n = self.streams.count();
        let open = self.streams.enabled() && !self.progress.settle.settled;
        let credits = if open {
            self.credits.make_room(stream as usize, n)
        } else {
            0
        };
        if credits > 0 {
            self.streams.add();
        }
        tracing::info!("source asks for data stream {stream}: {credits} credits");
        self.ctl.send(&Control::StreamAdded {
            stream,
            credits: credits as u32,
        })
    }

    /// What the control reader delivered: a message, or why it stopped.
    fn on_control(&mut self, m: Result<ControlEvent, RecvError>) -> Step {
        match m {
            Ok(Ok(Control::AddStream { stream })) => self.on_add_stream(stream),
            Ok(Ok(
                m @ (Control::Entries(_)
                | Control::ScanFailed { .. }
                | Control::MetaEnd { .. }
                | Control::SyncMode { .. }
                | Control::Preserve { .. }
                | Control::Attrs(_)
                | Control::DirsDone { .. }),
            )) if self.window.is_some() => self.on_metadata(m),
            Ok(Ok(m @ (Control::Grown { .. } | Control::GrownLinks { .. }))) => {
                self.ctl.machine.on_recv(&m)?;
                self.growth = grown(m);
                Ok(())
            }
            Ok(Ok(m)) => {
                // A Reuse may settle files (kept) without moving the
                // counters: the next look releases what settled.
                if let (Control::Reuse(_), Some(w)) = (&m, &mut self.window) {
                    w.last = (u64::MAX, 0);
                }
                payload::on_control(
                    m,
                    self.ctl,
                    &self.table,
                    &mut self.sync,
                    &mut self.streams,
                    &mut self.settlers,
                    &mut self.progress.eod,
                )?;
                // A digest that came after its data settles the file here.
                if self.table.counted_all_first() {
                    self.on_settle_tick()?;
                }
                Ok(())
            }
            Ok(Err(e))
                if crate::session::control::is_timeout(&e)
                    && self.window.as_ref().is_some_and(|w| !w.meta_end) =>
            {
                Err(EngineError::local(
                    "no word from the source within the idle timeout (--timeout) \
                     while waiting for the file list",
                ))
            }
            Ok(Err(EngineError::PeerClosed)) | Ok(Err(EngineError::Io(_))) => Err(
                EngineError::Lost("connection to the source lost mid-transfer".into()),
            ),
            Ok(Err(e)) => Err(e),
            // A kept link's reader stopped after EndOfData (run_sink_kept):
            // nothing more comes from the source in this session.
            Err(_) if self.progress.eod => {
                self.events.control = never();
                Ok(())
            }
            Err(_) => Err(EngineError::local("control reader stopped")),
        }
    }

    /// A windowed session's record batch, its scan failures or its end:
    /// registered, reachable, then Ready for the source.
    fn on_metadata(&mut self, m: Control) -> Step {
        self.ctl.admit(&m)?;
        if let Control::SyncMode { .. } = m {
            // The journal or sync was set from this end's own options
            // before the table was shared (the same flags).
            return Ok(());
        }
        let Some(w) = &mut self.window else {
            return Ok(());
        };
        let root = self.table.root.clone();
        // An archive copy's flags, a batch's Attrs (right behind its
        // records) or directories done: nothing to register or make ready
        // after them.
        let attrs = matches!(
            m,
            Control::Preserve { .. } | Control::Attrs(_) | Control::DirsDone { .. }
        );
        // The records see the session's sync (the loop holds it for the
        // Reuse verdicts and the journal).
        w.tree.sync = self.sync.take();
        let ended = w.tree.on_message(m, &root);
        self.sync = w.tree.sync.take();
        if attrs {
            return ended.map(|_| ());
        }
        let ended = ended?;
        if ended {
            // Data and digests may now be far apart: no idle timeout.
            w.meta_end = true;
            w.idle.store(false, Ordering::Release);
            self.ctl.link.set_read_timeout(None)?;
        }
        // A sync's answer for these records, before the Ready that lets
        // the source plan their reads (docs/PROTOCOL.md "Windows").
        if let Some(s) = &mut self.sync {
            let ctl = &mut *self.ctl;
            let all_in = w.meta_end;
            s.answer(&self.table, all_in, &mut |batch| {
                ctl.send(&Control::Have(batch))
            })?;
        }
        let through = self.table.publish();
        let stats = &self.stats;
        stats
            .total_files
            .store(self.table.file_count(), Ordering::Relaxed);
        stats
            .total_bytes
            .store(w.tree.total_bytes, Ordering::Relaxed);
        stats
            .setid_dropped
            .store(w.tree.setid_dropped, Ordering::Relaxed);
        let meta_end = w.meta_end;
        if through > w.ready {
            w.ready = through;
            self.ctl.send(&Control::Ready { through })?;
            // A sync's unchanged files settled as they were answered: the
            // source's window moves on with this Ready, not a look later.
            self.release_settled(payload::progress(&self.stats))?;
        }
        // Every record in, and maybe every file settled already.
        if meta_end {
            if ended {
                self.progress.settle.rescan();
            }
            self.on_settle_tick()?;
        }
        Ok(())
    }

    /// A receiver ended: done, its link lost, or failed.
    fn on_receiver_done(&mut self, r: Result<ReceiverDone, RecvError>) -> Step {
        let Ok((i, epoch, n, result)) = r else {
            // Every receiver has ended: a disconnected channel is always
            // ready, so stop selecting on it (else this loop spins).
            self.events.receivers_done = never();
            return Ok(());
        };
        self.credits.accepted[i] += n;
        self.progress.receivers_left -= 1;
        match result {
            Ok(()) => {
                self.streams.ended(i);
                Ok(())
            }
            Err(e)
                if self.streams.enabled()
                    && crate::session::relink::is_link_loss(&e)
                    && !self.abort.load(Ordering::Acquire) =>
            {
                self.on_link_lost(i, epoch, n, e)
            }
            // A writer stopped the session; its event says why.
            Err(_) if self.abort.load(Ordering::Acquire) => Ok(()),
            Err(e) => Err(EngineError::local(format!("data stream {i} failed: {e}"))),
        }
    }

    /// The session goes on without a lost link (crate::session::relink): tell the
    /// source what arrived, replace the link.
    fn on_link_lost(&mut self, i: usize, epoch: u16, n: u64, e: EngineError) -> Step {
        if self.progress.eod || self.progress.settle.settled {
            // Nothing more is needed on any link.
            self.streams.ended(i);
            return Ok(());
        }
        let waiting = self.streams.lost(i, epoch, &e);
        self.ctl.send(&Control::Lost {
            stream: i as u16,
            epoch,
            received: n,
        })?;
        if let Some(j) = waiting {
            self.streams.requeue_arrival(j)?;
        }
        self.streams.check()
    }

    /// A writer failed: the session fails with its reason.
    fn on_writer_event(&mut self, ev: Result<WriterEvent, RecvError>) -> Step {
        match ev {
            Ok(ev) => Err(writer_error(ev)),
            Err(_) => {
                self.events.writers = never();
                Ok(())
            }
        }
    }

    /// A block failed verification: ask for it again (payload::on_corrupt).
    fn on_corrupt(&mut self, ev: Result<ReceiverEvent, RecvError>) -> Step {
        match ev {
            Ok(ReceiverEvent::Corrupt { stream, segs }) => {
                payload::on_corrupt(stream, &segs, self.ctl, &self.table, &self.stats)
            }
            Err(_) => {
                self.events.corrupt = never();
                Ok(())
            }
        }
    }

    /// Every thread joined, the files finalized, the buffer share
    /// returned, in this order; on an error first the Abort that stops
    /// both ends. What is left is the verdict's (SinkSession::verdict).
    pub(super) fn teardown(self, result: Result<(), EngineError>) -> Result<Drained, EngineError> {
        let SinkPipeline {
            ctl,
            table,
            mut sync,
            abort,
            share,
            pool,
            events,
            streams,
            receivers,
            credits,
            writer_jobs,
            settlers,
            session,
            facts,
            growth,
            ..
        } = self;
        if let Err(e) = &result {
            abort.store(true, Ordering::Release);
            tracing::warn!("session {session}: {e}");
            let reason = e.to_string();
            let _ =
                crate::transport::wire::send_control(&mut *ctl.link, &Control::Abort { reason });
            for h in &receivers.shutdown {
                h.shutdown_both();
            }
        }
        let ReceiverSet {
            make, jobs, extra, ..
        } = receivers;
        for j in jobs {
            let _ = j.join();
        }
        for j in extra {
            let _ = j.join();
        }
        drop(make);
        drop(streams);
        for j in writer_jobs {
            let _ = j.join();
        }
        // Before the table is finalized: every digest handed on applied.
        settlers.join();
        // A writer may have failed after the last block arrived (disk full on
        // the final write): that fails the session, with its reason.
        let mut result = result;
        if result.is_ok() {
            if let Ok(ev) = events.writers.try_recv() {
                let e = writer_error(ev);
                tracing::warn!("session {session}: {e}");
                let reason = e.to_string();
                let _ = crate::transport::wire::send_control(
                    &mut *ctl.link,
                    &Control::Abort { reason },
                );
                result = Err(e);
            }
        }
        // Late corrupt-block reports.
        while let Ok(ReceiverEvent::Corrupt { stream, segs }) = events.corrupt.try_recv() {
            for s in segs {
                let reason = format!("block checksum mismatch on stream {stream}");
                table.fail_id(s.file_id, reason);
            }
        }
        // The default journal keeps what an interruption left (a lost peer),
        // not what a local failure left (a full disk gets its space back).
        let local = matches!(result, Err(EngineError::Local(_))) || table.storage_failed();
        let keep = table.resume && (table.journal_min == 0 || !local);
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
        let (streams, block_size, links) = facts;
        Ok(Drained {
            table,
            sync,
            file_failures,
            streams,
            block_size,
            links,
            growth,
            control: events.control,
        })
    }
}

/// A Grown or GrownLinks as the report shows it (transport::grow's units).
fn grown(m: Control) -> Option<Growth> {
    let (stages, links, stopped) = match m {
        Control::Grown { stages, stopped } => (stages, Vec::new(), stopped),
        Control::GrownLinks {
            stages,
            links,
            stopped,
        } => (stages, links, stopped),
        _ => return None,
    };
    let mb = |kb: u64| kb as f64 / 1e3;
    // A plain Grown (an older daemon) carries no links' figures.
    let links = links.into_iter().map(Some).chain(std::iter::repeat(None));
    let stages = stages.into_iter().zip(links).map(|(s, l)| Stage {
        at_s: s.at_ms as f64 / 1e3,
        streams: s.streams,
        mb_s: mb(s.kb_s),
        link_mb_s: s.link_kb_s.into_iter().map(mb).collect(),
        busy_pct: l.and_then(|l| l.busy_pm).map(|b| b as f64 / 10.0),
        rtt_x: l.and_then(|l| l.rtt_x100).map(|q| q as f64 / 100.0),
        then: s.then,
    });
    Some(Growth {
        stages: stages.collect(),
        stopped: (!stopped.is_empty()).then_some(stopped),
    })
}

/// A writer's failure as the session's error.
fn writer_error(ev: WriterEvent) -> EngineError {
    match ev {
        WriterEvent::Fatal(m) => EngineError::local(m),
        WriterEvent::Protocol(m) => EngineError::local(format!("protocol error: {m}")),
    }
}

/// Receiver threads' bodies (see [`ReceiverFactory`]); each reports how
/// many blocks it accepted and how it ended on `done`.
fn receiver_factory(
    (block_size, checksum, keys): (usize, bool, StreamKeys),
    received: Sender<Buf>,
    pool: &Arc<BufferPool>,
    events: Sender<ReceiverEvent>,
    abort: &Arc<AtomicBool>,
    stats: &Arc<Stats>,
    done: Sender<ReceiverDone>,
) -> ReceiverFactory {
    let (p, a, s) = (pool.clone(), abort.clone(), stats.clone());
    Box::new(
        move |i: usize, epoch: u16, l: Box<dyn Link>, g: Arc<AtomicU64>| {
            let (tx, p, ev, a, s, d) = (
                received.clone(),
                p.clone(),
                events.clone(),
                a.clone(),
                s.clone(),
                done.clone(),
            );
            let seal = keys.blocks(i, epoch);
            Box::new(move || {
                let mut n = 0u64;
                let r = run_receiver(
                    i as u16, l, block_size, checksum, p, tx, ev, g, a, s, seal, &mut n,
                );
                let _ = d.send((i, epoch, n, r));
            })
        },
    )
}

#[cfg(test)]
mod tests;
