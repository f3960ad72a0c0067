//! The source's data pipeline (seed 000 Fig. 6-4c, seed 002 sec. 7):
//! readers fill buffers from disk, senders (or the readers themselves, on
//! the inline path) put them on the data links; one event loop on the
//! session's thread answers the sink's control messages, the readers'
//! and senders' reports and the links' losses, each with a handler of its
//! own; the verdict and one teardown end the session.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, never, select, unbounded, Receiver, RecvError, Sender};
use ramsys_proto::control::{Bytes32, Complete, GrowStage, StageLinks};
use ramsys_proto::relink::SentLog;
use ramsys_proto::Control;
use ramsys_resources::{Buf, BufferPool, JobHandle, Reservation, ThreadPool};

use super::pipeline::{self, LostLinks, Pipeline};
use super::{dry_list, Names};
use super::{Confirmed, Ctl, Opened, SourceSession, Threads};
use crate::data::inline::InlineLinks;
use crate::data::queue::DeviceQueue;
use crate::data::reader::{run_reader, FileStates, ReaderCtx, ReaderEvent, SrcFileState};
use crate::data::reread::Rereader;
use crate::data::resources::ShareGuard;
use crate::data::sender::{run_sender, LinkDone, StreamOut};
use crate::request::tasks::{assign_homes, plan_source, PlanOptions};
use crate::request::walk::Walk;
use crate::roles::source::sync_plan::SyncPlan;
use crate::session::control::ControlEvent;
use crate::session::options::TransferOptions;
use crate::session::relink::{Joined, LinkEvent, Requeue, State, Streams};
use crate::session::report::Report;
use crate::storage::dirs::ReadDirs;
use crate::storage::fsops::Root;
use crate::storage::StorageCfg;
use crate::transport::crypto::{Cipher, StreamSeal};
use crate::transport::grow::Growth;
use crate::transport::grow::{Grower, Links, Step as GrowStep};
use crate::transport::Link;
use crate::types::error::show;
use crate::types::error::EngineError;
use crate::types::file::{LiveFiles, SourceFile};
use crate::types::sendpath::SendPath;
use crate::types::stats::{FailedPath, Stats};

// The verdict and teardown; the threads, links and queues the loop runs
// on (issue 37: one file was 1,160 lines); a windowed session's records
// and reader generations (issue 36).
mod finish;
mod setup;
mod window;
use setup::*;
use window::{SrcWindow, Template};

/// A queued sender's thread body.
type SenderJob = Box<dyn FnOnce() + Send + 'static>;

/// Makes the sending end of stream i on link incarnation `epoch`: a
/// sender thread's body and the closer that stops it, or nothing on the
/// inline path (the link joins the readers' free set).
type SenderFactory = Box<dyn Fn(usize, u16, Box<dyn Link>) -> Option<(Sender<()>, SenderJob)>>;

/// What one event did to the session: nothing more to say, or the sink's
/// verdict (Complete).
type Step = Result<Option<Complete>, EngineError>;

/// The data pipeline of one source session, from its first block to its
/// teardown.
pub(super) struct Payload<'s> {
    ctl: &'s mut Ctl,
    root: Arc<Root>,
    /// The whole walk's files (empty in a windowed session).
    files: Arc<Vec<SourceFile>>,
    /// The files held, by id: `files`, or a windowed session's
    /// generations until the sink settles them.
    live: LiveFiles,
    /// A windowed session's records and reader generations.
    win: Option<SrcWindow>,
    stats: Arc<Stats>,
    abort: Arc<AtomicBool>,
    /// Returned to the engine last of all, in `teardown`.
    share: ShareGuard<'s>,
    pool: Arc<BufferPool>,
    checksum: bool,
    null: bool,
    /// Blocks for the queued senders (and resends on the inline path).
    filled: Receiver<Buf>,
    events: Events,
    streams: Streams,
    senders: SenderSet,
    resends: Resends,
    progress: Pipeline,
    jobs: Vec<JobHandle>,
    facts: Facts,
    /// More streams while the rate grows (issue 21); None: fixed count.
    grow: Option<Adapt>,
    /// The control link outlives a successful session (run_source_kept).
    keep: bool,
    /// Kept until the end: their unused threads are released already.
    _threads: Threads,
}

/// The sink's last message of a session.
fn is_complete(m: &Control) -> bool {
    matches!(m, Control::Complete(_))
}

/// What the loop waits on, besides the links' own events.
struct Events {
    check_tick: Receiver<Instant>,
    readers: Receiver<ReaderEvent>,
    readers_done: Receiver<()>,
    senders_done: Receiver<LinkDone>,
    control: Receiver<ControlEvent>,
}

/// What the readers start from: the whole walk (and a sync's plan), or a
/// windowed session's scan and window.
enum Begin {
    Whole(Walk, Names, Option<SyncPlan>),
    Windowed(super::window::ScanRx, super::window::Ahead),
}

/// What the readers read: the whole walk's queues, or the windows yet to
/// come (planned one generation at a time).
enum Reads {
    Whole(Arc<Vec<DeviceQueue>>),
    Windowed(super::window::ScanRx, Box<super::window::Ahead>),
}

/// The session's file list as the payload starts (empty when windowed:
/// the windows bring theirs), and what its readers read.
struct Listed {
    files: Arc<Vec<SourceFile>>,
    live: LiveFiles,
    reads: Reads,
    plan: Option<SyncPlan>,
    names: Names,
}

/// The file list published (the local bridge opens files by id from it)
/// and the readers sized: from the whole tree's queues, or from the first
/// window's files.
fn listed(
    s: &SourceSession<'_>,
    what: Begin,
    block_size: usize,
    readers: &mut Reservation,
) -> Listed {
    let (opts, root) = (s.opts, &s.spec.root);
    match what {
        Begin::Whole(w, names, plan) => {
            let (files, live) = publish(opts, &s.stats, root, w);
            let queues = queues(root, &files, opts, block_size, plan.as_ref());
            more_readers_if_cached(s, &queues, readers);
            let reads = Reads::Whole(queues);
            Listed {
                files,
                live,
                reads,
                plan,
                names,
            }
        }
        Begin::Windowed(scan, mut ahead) => {
            let first = ahead.pending.make_contiguous();
            more_readers_if_first_window_cached(s, first, block_size, readers);
            let live = LiveFiles::default();
            if let Some(bridge) = &opts.local_copy {
                bridge.publish(root.clone(), live.clone());
            }
            Listed {
                files: Arc::default(),
                live,
                reads: Reads::Windowed(scan, Box::new(ahead)),
                plan: None,
                names: Vec::new(),
            }
        }
    }
}

/// The data links' sending ends: who sends on them and how they end.
struct SenderSet {
    make: SenderFactory,
    /// Replacement links' senders run outside the pool but on its CPUs.
    pool: Arc<ThreadPool>,
    /// Queued path: dropping a link's closer stops its sender even while
    /// the queue is idle (data::sender).
    closers: Closers,
    /// Shut down on error so no thread stays blocked on a link.
    shutdown: Vec<Box<dyn Link>>,
    /// Links whose sending ended, closed only at teardown.
    kept: Vec<Box<dyn Link>>,
    /// Inline: links the sink saw break, until their reports arrive.
    evicting: HashSet<(usize, u16)>,
    inline: Option<Arc<InlineLinks>>,
    /// Replacement senders, requeue threads and the inline resend thread.
    extra: Vec<std::thread::JoinHandle<()>>,
    idle: Duration,
}

/// A link's closer, by (stream, epoch).
type Closers = HashMap<(usize, u16), Sender<()>>;

/// Blocks sent again: those the sink asked for (Resend) and those lost
/// links lost (crate::session::relink), through the same queue as the first send.
struct Resends {
    /// The senders end only once the sink has Settled and this is dropped.
    tx: Option<Sender<Buf>>,
    requeue: Arc<Requeue>,
    /// Re-read lost blocks report unreadable files here too.
    events: Sender<ReaderEvent>,
    /// Per lost link (stream, epoch): what its sender sent, and how many
    /// blocks the sink says it accepted; both are needed to re-queue.
    lost: LostLinks<SentLog>,
}

/// The adaptation of the stream count under way (transport::grow): the
/// AddStreams asked and the links accepted but not yet up.
struct Adapt {
    grower: Grower,
    t0: Instant,
    asked: u16,
    joining: u16,
    refused: bool,
    next: u16,
    /// Report as GrownLinks (opts.grown_links).
    links: bool,
}

impl Adapt {
    /// Growth from `streams` up to the daemon's `max_streams`, judged in
    /// RTTs of the control link (transport::grow).
    fn new(rtt: Option<Duration>, streams: u16, max_streams: usize, links: bool) -> Adapt {
        let most = max_streams.clamp(1, u16::MAX as usize) as u16;
        Adapt {
            grower: Grower::new(rtt, Duration::ZERO, streams, most),
            t0: Instant::now(),
            asked: 0,
            joining: 0,
            refused: false,
            next: streams,
            links,
        }
    }
}

/// What the report says besides the sink's verdict.
struct Facts {
    streams: u16,
    block_size: usize,
    links: Vec<crate::types::stats::LinkDesc>,
    path: SendPath,
    read_storage: Arc<StorageCfg>,
    plan: Option<SyncPlan>,
    /// A windowed sync's unchanged files and a windowed dry run's files
    /// to send (its plans are per window).
    unchanged: u64,
    planned: Vec<String>,
    /// A dry run's files' wire paths by id (the whole-tree phases).
    names: Names,
    local_failed: Vec<FailedPath>,
    deleted: Vec<String>,
    /// The sink's Placed (a session of pieces, issue 36).
    placed: Option<Vec<Vec<u8>>>,
}

impl Facts {
    fn new(
        c: &Confirmed,
        links: Vec<crate::types::stats::LinkDesc>,
        path: SendPath,
        read_storage: Arc<StorageCfg>,
        plan: Option<SyncPlan>,
        names: Names,
    ) -> Facts {
        Facts {
            streams: c.streams,
            block_size: c.block_size,
            links,
            path,
            read_storage,
            plan,
            unchanged: 0,
            planned: Vec::new(),
            names,
            local_failed: Vec::new(),
            deleted: Vec::new(),
            placed: None,
        }
    }
}

/// The per-stream keys: seal blocks, open the sink's credits; and the
/// rate limits every stream draws from (data::rate).
#[derive(Clone)]
struct StreamKeys {
    key: Option<Bytes32>,
    cipher: Cipher,
    window: u32,
    rate: crate::data::rate::Limits,
}

impl StreamKeys {
    /// The sending end of stream i on link incarnation `epoch` (0 =
    /// first; replacements, crate::session::relink, take higher ones, which key
    /// the AEAD nonces).
    fn out(&self, i: usize, epoch: u16, l: Box<dyn Link>) -> StreamOut {
        let (c, i) = (self.cipher, i as u16);
        let seal = self.key.and_then(|k| StreamSeal::new(c, &k, i, epoch));
        let credits = self.key.and_then(|k| StreamSeal::credits(c, &k, i, epoch));
        StreamOut::new(i as usize, epoch, l, self.window, seal)
            .with_credit_seal(credits)
            .with_rate(self.rate.clone())
    }
}

impl<'s> Payload<'s> {
    /// Start readers and senders on the opened links. The order is the
    /// contract: the buffer share before any thread, readers before
    /// senders, the sending ends' report channel closed on our side before
    /// the link supervisor starts, the control reader last.
    pub(super) fn start(
        s: &'s mut SourceSession<'_>,
        threads: Threads,
        (w, names): (Walk, Names),
        plan: Option<SyncPlan>,
        c: Confirmed,
        o: Opened,
    ) -> Result<Self, EngineError> {
        Self::begin(s, threads, Begin::Whole(w, names, plan), c, o)
    }

    /// [`Self::start`] of a windowed session (issue 36): no file yet; the
    /// readers take each batch the sink readies, the records go on.
    pub(super) fn start_windowed(
        s: &'s mut SourceSession<'_>,
        threads: Threads,
        (scan, ahead): (super::window::ScanRx, super::window::Ahead),
        c: Confirmed,
        o: Opened,
    ) -> Result<Self, EngineError> {
        Self::begin(s, threads, Begin::Windowed(scan, ahead), c, o)
    }

    fn begin(
        s: &'s mut SourceSession<'_>,
        threads: Threads,
        what: Begin,
        c: Confirmed,
        o: Opened,
    ) -> Result<Self, EngineError> {
        let (opts, res, stats, root) = (s.opts, s.res, s.stats.clone(), s.spec.root.clone());
        let Threads {
            mut senders,
            mut readers,
        } = threads;
        let Listed {
            files,
            live,
            reads,
            plan,
            names,
        } = listed(s, what, c.block_size, &mut readers);
        let nread = readers.len();
        let share = take_share(res, c.streams, nread)?;
        let w = Wires::new(share.pool().clone());
        // Every sending end reports on `sdone` (data::sender::LinkDone).
        let (sdone_tx, sdone_rx) = unbounded::<LinkDone>();
        let shutdown = clone_links(&o.links)?;
        let keys = StreamKeys {
            key: o.key,
            cipher: c.cipher,
            window: c.window,
            rate: opts.rate.clone(),
        };
        let path = send_path(s, nread, c.streams);
        let zerocopy = zerocopy_allowed(opts, &c, &o);
        let mut data_links = o.links;
        let inline = (path == SendPath::Inline)
            .then(|| w.inline_links(&keys, &mut data_links, &sdone_tx, &stats));
        let template = w.template(opts, &c, &root, &stats, inline.clone(), zerocopy);
        let read_storage = template.storage.clone();
        let first = (&files, plan.as_ref(), nread);
        let (mut jobs, rdone_rx, win) = spawn_reads(opts, reads, template, first, &mut readers);
        let make = sender_factory(
            keys,
            &w.filled_rx,
            &w.pool,
            &w.abort,
            &stats,
            &sdone_tx,
            &inline,
        );
        let closers = spawn_senders(&make, data_links, &mut senders, &mut jobs);
        let mut extra = Vec::new();
        if let Some(links) = &inline {
            extra.push(spawn_inline_resender(links.clone(), w.filled_rx.clone())?);
        }
        drop(sdone_tx);
        let (peer, ab) = (s.ctl.link.peer(), w.abort.clone());
        let streams = Streams::new(o.relinks, clone_links(&shutdown)?, peer, stats.clone(), ab);
        let grow = adapt(s, c.streams, &streams, path);
        let null = opts.source_engine == crate::storage::DataEngine::Null;
        let requeue = w.requeue(&root, &live, c.checksum, null);
        let ends = (closers, shutdown, extra);
        let senders_set = SenderSet::new(make, senders.pool(), ends, inline, opts.idle_timeout);
        senders.release_unused();
        readers.release_unused();
        // Control reader: sink messages become events; on a kept link it
        // stops at Complete (run_source_kept).
        let last = s.keep.then_some(is_complete as fn(&Control) -> bool);
        let control = s.ctl.spawn_reader("src-ctl", last)?;
        let keep = s.keep;
        Ok(Payload {
            ctl: &mut s.ctl,
            root,
            files,
            live,
            win,
            stats,
            abort: w.abort,
            share,
            pool: w.pool,
            checksum: c.checksum,
            null,
            filled: w.filled_rx,
            events: Events::new(w.rev_rx, rdone_rx, sdone_rx, control),
            streams,
            senders: senders_set,
            resends: Resends::new(w.filled_tx, requeue, w.rev_tx),
            progress: Pipeline::new(nread, c.streams as usize),
            jobs,
            grow,
            facts: Facts::new(&c, o.desc, path, read_storage, plan, names),
            keep,
            _threads: Threads { senders, readers },
        })
    }

    /// The event loop: until the sink's Complete or the first error, which
    /// yields to the sink's reason if it gave one (whichever write failed
    /// first: a block, or FilesDone between events).
    pub(super) fn run(&mut self) -> Result<Complete, EngineError> {
        self.events_loop().map_err(|e| self.sink_reason(e))
    }

    fn events_loop(&mut self) -> Result<Complete, EngineError> {
        let (root, files) = (self.root.clone(), self.files.clone());
        let resender = Rereader::new(&root, &files, self.checksum, self.null);
        // A windowed tree announced whole and holding no file: no Ready
        // will start a generation, so the readers' queues close here.
        self.next_generation()?;
        loop {
            self.between_events()?;
            let (scan, gens) = self.window_events();
            let step = select! {
                recv(scan) -> m => self.on_scan(m),
                recv(gens) -> g => self.on_generation_done(g),
                recv(self.events.check_tick) -> _ => self.on_tick(),
                recv(self.streams.events) -> ev => self.on_link_event(ev),
                recv(self.events.readers) -> ev => self.on_reader_event(ev),
                recv(self.events.readers_done) -> r => self.on_reader_done(r),
                recv(self.events.senders_done) -> r => self.on_sender_done(r),
                recv(self.events.control) -> m => self.on_control(m, &resender),
                // Pending digests come due by age (pipeline::DIGEST_WAIT).
                default(self.progress.flush_wait()) => Ok(None),
            };
            if let Some(c) = step? {
                return Ok(c);
            }
        }
    }

    /// Our error `e`, unless the sink said why it gave up: its Abort often
    /// crosses our next write on the link it closed (which then fails with
    /// a broken pipe), and "disk full" is what the user needs to read.
    /// Waits up to 2 s for the sink's messages, stopping when its link
    /// reports closed.
    fn sink_reason(&self, e: EngineError) -> EngineError {
        if matches!(
            e,
            EngineError::PeerAborted(_) | EngineError::Refused(_) | EngineError::Redirected { .. }
        ) {
            return e;
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while let Ok(Ok(m)) = self
            .events
            .control
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            if let Err(said) = crate::session::control::check_abort(&m) {
                return said;
            }
        }
        e
    }

    /// Between two events: close the resend queue, flush digests, send
    /// EndOfData, re-queue lost blocks, when each is due.
    fn between_events(&mut self) -> Result<(), EngineError> {
        if self.progress.resends_over(self.events.readers.is_empty()) {
            self.resends.tx = None;
        }
        // Flush digests whenever the event queue runs dry or grows big.
        if self.progress.flush_due(self.events.readers.is_empty()) {
            let batch = std::mem::take(&mut self.progress.done_batch);
            self.ctl.send(&Control::FilesDone(batch))?;
            crate::types::phase::mark("digests_sent");
        }
        if self.progress.eod_due(self.events.readers.is_empty()) {
            self.report_growth()?;
            let files = self.progress.files_done;
            let bytes = self.stats.bytes.load(Ordering::Relaxed);
            self.ctl.send(&Control::EndOfData { files, bytes })?;
            crate::types::phase::mark("eod_sent");
        }
        // Re-queue what a lost link lost, once both halves are known.
        self.resends.requeue_ready(&mut self.senders.extra)?;
        if let Some(l) = &self.senders.inline {
            // A link put back just after the last sweep is caught here.
            for &(i, epoch) in &self.senders.evicting {
                l.evict(i, epoch);
            }
        }
        if self.resends.tx.is_none() {
            // Settled: lost links need no replacement any more.
            self.progress.senders_left -= self.streams.settle();
        }
        Ok(())
    }

    /// Every 250 ms: are the links' replacements on time, and does the
    /// stream count still grow (transport::grow)?
    fn on_tick(&mut self) -> Step {
        self.streams.check()?;
        self.keepalive()?;
        let Some(a) = &mut self.grow else {
            return Ok(None);
        };
        if a.grower.done() {
            return Ok(None);
        }
        if self.progress.settled || self.progress.eod_sent {
            a.grower.end("the payload is over");
            return Ok(None);
        }
        // Delivered, not read: readers fill the queue ahead of the links,
        // which would make the first stage look faster than the path.
        let read = self.stats.bytes.load(Ordering::Relaxed);
        let bytes = self.streams.acked().unwrap_or(read);
        let total = self.stats.total_bytes.load(Ordering::Relaxed);
        // An empty send queue: reading, not the links, is the limit now.
        let starved = self.filled.is_empty();
        let links = Links {
            busy_us: self.streams.busy(),
            queueing: self.streams.queueing(),
        };
        let left = total.saturating_sub(bytes);
        let step = a.grower.poll(a.t0.elapsed(), bytes, links, left, starved);
        if !matches!(step, GrowStep::Wait) {
            a.grower.note_links(self.streams.delivery_rates());
        }
        match step {
            GrowStep::Add(k) => {
                for _ in 0..k {
                    self.ctl.send(&Control::AddStream { stream: a.next })?;
                    if !self.streams.dials() {
                        // The client dials it as soon as it has answered:
                        // its Rejoin may overtake the answer here.
                        self.streams.add();
                    }
                    a.next += 1;
                    a.asked += 1;
                }
            }
            GrowStep::Stop(why) => tracing::info!("streams: {why}"),
            GrowStep::Wait => {}
        }
        Ok(None)
    }

    /// The sink answered an AddStream: dial the stream, or stop asking.
    fn on_stream_added(&mut self, stream: u16, credits: u32) {
        let Some(a) = &mut self.grow else {
            return;
        };
        a.asked = a.asked.saturating_sub(1);
        if !self.streams.dials() {
            // Its slot was made when asked: await the client's Rejoin,
            // unless it already came (a Live slot) or was refused.
            match self.streams.state(stream as usize) {
                State::Joining if credits > 0 => a.joining += 1,
                State::Joining => {
                    self.streams.unwanted(stream);
                    a.refused = true;
                }
                _ => {}
            }
        } else if credits > 0 && stream as usize == self.streams.count() {
            self.streams.add();
            a.joining += 1;
        } else {
            a.refused = true;
        }
        self.grow_settled();
    }

    /// A server-side source tells the client what its adaptation did
    /// (Control::Grown), once, right before EndOfData.
    fn report_growth(&mut self) -> Result<(), EngineError> {
        let Some(a) = &mut self.grow else {
            return Ok(());
        };
        if self.streams.dials() {
            return Ok(());
        }
        a.grower.end("the payload is over");
        let kb = |mb: f64| (mb * 1e3).round() as u64;
        let stages = a.grower.stages.iter().map(|s| GrowStage {
            at_ms: (s.at_s * 1e3) as u32,
            streams: s.streams,
            kb_s: kb(s.mb_s),
            link_kb_s: s.link_mb_s.iter().map(|&m| kb(m)).collect(),
            then: s.then.clone(),
        });
        let stages: Vec<_> = stages
            .take(ramsys_proto::session::MAX_GROW_STAGES)
            .collect();
        let stopped = a.grower.stopped.clone().unwrap_or_default();
        if !a.links {
            self.ctl.send(&Control::Grown { stages, stopped })?;
            return Ok(());
        }
        // What the links said, for a client that takes it (GrownLinks).
        let links = a
            .grower
            .stages
            .iter()
            .take(stages.len())
            .map(|s| StageLinks {
                busy_pm: s
                    .busy_pct
                    .map(|b| (b * 10.0).round().clamp(0.0, 1000.0) as u16),
                rtt_x100: s
                    .rtt_x
                    .map(|q| (q * 100.0).round().clamp(0.0, u32::MAX as f64) as u32),
            });
        let links = links.collect();
        self.ctl.send(&Control::GrownLinks {
            stages,
            links,
            stopped,
        })?;
        Ok(())
    }

    /// Every AddStream answered and every accepted link up (or given up):
    /// the grower measures the new count from now.
    fn grow_settled(&mut self) {
        if let Some(a) = &mut self.grow {
            if a.asked == 0 && a.joining == 0 {
                a.grower
                    .changed(a.t0.elapsed(), self.facts.streams, a.refused);
                a.refused = false;
            }
        }
    }

    /// A replacement link arrived, or one stream gave up on replacing.
    fn on_link_event(&mut self, ev: Result<LinkEvent, RecvError>) -> Step {
        match ev {
            Ok(LinkEvent::Up(j)) => {
                if let Some(j) = self.streams.arrived(j) {
                    if self.senders.start_replacement(&mut self.streams, j)? {
                        // An added stream's first link: one more sender.
                        self.progress.senders_left += 1;
                        self.facts.streams += 1;
                        if let Some(a) = &mut self.grow {
                            a.joining = a.joining.saturating_sub(1);
                        }
                        self.grow_settled();
                    }
                }
            }
            Ok(LinkEvent::GaveUp {
                stream,
                attempts,
                reason,
            }) => {
                if self.streams.state(stream as usize) == State::Joining {
                    if let Some(a) = &mut self.grow {
                        a.joining = a.joining.saturating_sub(1);
                        a.refused = true;
                    }
                    self.streams.gave_up(stream, attempts, reason);
                    self.grow_settled();
                } else if self.streams.gave_up(stream, attempts, reason) {
                    self.progress.senders_left -= 1;
                }
                self.streams.check()?;
            }
            Err(_) => {}
        }
        Ok(None)
    }

    /// A reader finished or failed a file.
    fn on_reader_event(&mut self, ev: Result<ReaderEvent, RecvError>) -> Step {
        match ev {
            Ok(ReaderEvent::FileDone { id, digest }) => self.progress.file_done(id, digest),
            Ok(ReaderEvent::FileFailed { id, path, reason }) => {
                tracing::warn!("{path}: {reason}");
                let full = self.root.path().join(std::ffi::OsStr::new(&path));
                // Not vanished even when the file was removed since the
                // scan: the sink's --delete stops on a FileFailed.
                let full = full.display().to_string();
                (self.stats.source_incomplete).store(true, Ordering::Relaxed);
                self.facts
                    .local_failed
                    .push(FailedPath::new(full, reason.clone()));
                self.ctl.send(&Control::FileFailed { id, reason })?;
            }
            // All readers gone: a disconnected channel is always ready,
            // so stop selecting on it (else this loop spins).
            Err(_) => self.events.readers = never(),
        }
        Ok(None)
    }

    /// A reader thread ended.
    fn on_reader_done(&mut self, r: Result<(), RecvError>) -> Step {
        match r {
            Ok(()) => {
                crate::types::phase::mark("reader_done");
                self.progress.readers_left -= 1
            }
            Err(_) => self.events.readers_done = never(),
        }
        Ok(None)
    }

    /// A sending end ended: done, its link lost, or failed.
    fn on_sender_done(&mut self, r: Result<LinkDone, RecvError>) -> Step {
        let Ok((i, epoch, outcome, log)) = r else {
            self.events.senders_done = never();
            return Ok(None);
        };
        match outcome {
            Ok(link) => {
                self.senders.evicting.remove(&(i, epoch));
                self.progress.senders_left -= 1;
                self.senders.kept.push(link);
                self.streams.ended(i);
            }
            Err((link, e))
                if self.streams.enabled()
                    && crate::session::relink::is_link_loss(&e)
                    && !self.abort.load(Ordering::Acquire) =>
            {
                self.on_link_lost(i, epoch, link, e, log)?
            }
            Err((link, e)) => {
                self.senders.kept.push(link);
                // The sink usually says why it dropped the stream (disk
                // full, protocol error): run() prefers its reason.
                return Err(EngineError::local(format!("data stream {i} failed: {e}")));
            }
        }
        Ok(None)
    }

    /// The session goes on without a lost link (crate::session::relink): ask the
    /// sink what arrived, replace the link.
    fn on_link_lost(
        &mut self,
        i: usize,
        epoch: u16,
        link: Box<dyn Link>,
        e: EngineError,
        log: SentLog,
    ) -> Result<(), EngineError> {
        self.senders.evicting.remove(&(i, epoch));
        self.senders.closers.remove(&(i, epoch));
        self.senders.kept.push(link);
        if self.resends.tx.is_none() {
            // Settled: nothing left to send on any link.
            self.progress.senders_left -= 1;
            self.streams.ended(i);
            return Ok(());
        }
        let waiting = self.streams.lost(i, epoch, &e);
        self.resends.lost.log((i, epoch), log);
        self.ctl.send(&Control::LinkDown {
            stream: i as u16,
            epoch,
        })?;
        if let Some(j) = waiting {
            self.senders.start_replacement(&mut self.streams, j)?;
        }
        self.streams.check()
    }

    /// What the control reader delivered: a message, or why it stopped.
    fn on_control(&mut self, m: Result<ControlEvent, RecvError>, rr: &Rereader) -> Step {
        match m {
            Ok(Ok(m)) => self.on_message(m, rr),
            Ok(Err(EngineError::PeerClosed)) | Ok(Err(EngineError::Io(_))) => Err(
                EngineError::Lost("connection to the sink lost mid-transfer".into()),
            ),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(EngineError::local("control reader stopped")),
        }
    }

    /// One message of the sink's during the payload phase.
    fn on_message(&mut self, m: Control, rr: &Rereader) -> Step {
        self.ctl.admit(&m)?;
        match m {
            Control::Deleted(v) => self.facts.deleted.extend(v.iter().map(|p| show(p))),
            Control::Placed { files } => self.facts.placed = Some(files),
            Control::Settled => {
                crate::types::phase::mark("settled_in");
                self.progress.settled = true
            }
            Control::Lost {
                stream,
                epoch,
                received,
            } => {
                let (i, e) = (stream as usize, epoch);
                // Our end may not have noticed yet: close it, so its
                // sender ends and hands over its log.
                self.streams.close(i, e);
                self.senders.closers.remove(&(i, e));
                if let Some(l) = &self.senders.inline {
                    self.senders.evicting.insert((i, e));
                    l.evict(i, e);
                }
                self.resends.lost.received((i, e), received);
            }
            Control::Resend(v) => {
                if let Some(tx) = &self.resends.tx {
                    // Windowed: the window's files, not the (empty) walk's.
                    let held = self.win.as_ref().map(|_| self.live.snapshot());
                    let own = held
                        .as_ref()
                        .map(|f| Rereader::new(&self.root, f, self.checksum, self.null));
                    let rr = own.as_ref().unwrap_or(rr);
                    pipeline::on_resend(&v, tx, rr, &self.pool, &self.stats, self.ctl)?;
                }
            }
            Control::Have(v) => self.on_have(v),
            Control::Ready { through } => self.on_ready(through)?,
            Control::SettledThrough { through } => self.on_settled_through(through)?,
            Control::StreamAdded { stream, credits } => self.on_stream_added(stream, credits),
            Control::Complete(c) => return Ok(Some(c)),
            _ => {}
        }
        Ok(None)
    }
}
