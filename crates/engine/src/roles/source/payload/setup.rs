//! What the payload loop runs on: sender threads (queued or inline) and
//! their replacements, re-read blocks, the session's buffer share, the
//! readers' device queues, and the pieces `Payload::start` assembles them
//! from (the published file list, the zero-copy decision, the event
//! channels, the sender set).

use super::*;

impl SenderSet {
    /// Start a sender on a replacement link (crate::session::relink). Replacements
    /// are rare, so they run on a thread of their own rather than a pooled
    /// one (the session's pooled senders may all be busy), pinned to the
    /// sender pool's CPUs.
    /// True when the link is an added stream's first (transport::grow).
    pub(super) fn start_replacement(
        &mut self,
        st: &mut Streams,
        j: Joined,
    ) -> Result<bool, EngineError> {
        j.link.set_read_timeout(Some(self.idle))?;
        self.shutdown.push(j.link.try_clone_link()?);
        let added = st.started(j.stream as usize, j.epoch, j.link.try_clone_link()?);
        let (stream, epoch) = (j.stream as usize, j.epoch);
        // Inline: the link joined the free set and needs no thread.
        if let Some((close, f)) = (self.make)(stream, epoch, j.link) {
            self.closers.insert((stream, epoch), close);
            let name = format!("sender-r{stream}");
            self.extra.push(self.pool.spawn_extra(name, f)?);
        }
        Ok(added)
    }
}

impl Resends {
    /// Resends go into `filled`, the senders' queue; re-read blocks of
    /// unreadable files report on `events`.
    pub(super) fn new(
        filled: Sender<Buf>,
        requeue: Arc<Requeue>,
        events: Sender<ReaderEvent>,
    ) -> Resends {
        Resends {
            tx: Some(filled),
            requeue,
            events,
            lost: LostLinks::new(),
        }
    }

    /// Re-queue the blocks each lost link sent that the sink did not
    /// accept, for the links whose log and count are both known
    /// (crate::session::relink); only while the queue to the senders is open.
    pub(super) fn requeue_ready(
        &mut self,
        jobs: &mut Vec<std::thread::JoinHandle<()>>,
    ) -> Result<(), EngineError> {
        let Some(tx) = &self.tx else {
            return Ok(());
        };
        for ((stream, _), log, n) in self.lost.ready() {
            let blocks = log.unreceived(n)?;
            tracing::info!(
                "stream {stream}: sending {} lost blocks again",
                blocks.len()
            );
            let blocks = blocks.into_iter().map(|b| b.to_vec()).collect();
            jobs.push(
                self.requeue
                    .spawn(blocks, tx.clone(), self.events.clone())?,
            );
        }
        Ok(())
    }
}

/// The queued path's sender threads, or on the inline path the readers'
/// free set of links (see [`SenderFactory`]).
pub(super) fn sender_factory(
    keys: StreamKeys,
    filled: &Receiver<Buf>,
    pool: &Arc<BufferPool>,
    abort: &Arc<AtomicBool>,
    stats: &Arc<Stats>,
    done: &Sender<LinkDone>,
    inline: &Option<Arc<InlineLinks>>,
) -> SenderFactory {
    let (rx, p, a, s, d) = (
        filled.clone(),
        pool.clone(),
        abort.clone(),
        stats.clone(),
        done.clone(),
    );
    let inline = inline.clone();
    Box::new(move |i: usize, epoch: u16, l: Box<dyn Link>| {
        let out = keys.out(i, epoch, l);
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
    })
}

/// What the readers, the senders and the event loop share: the session's
/// buffers, the full ones on their way to the links, the readers' reports,
/// and the flag that stops them all.
pub(super) struct Wires {
    pub(super) pool: Arc<BufferPool>,
    pub(super) filled_tx: Sender<Buf>,
    pub(super) filled_rx: Receiver<Buf>,
    pub(super) rev_tx: Sender<ReaderEvent>,
    pub(super) rev_rx: Receiver<ReaderEvent>,
    pub(super) abort: Arc<AtomicBool>,
}

impl Wires {
    /// As many full buffers queue as the share holds.
    pub(super) fn new(pool: Arc<BufferPool>) -> Wires {
        let (filled_tx, filled_rx) = bounded::<Buf>(pool.count());
        let (rev_tx, rev_rx) = unbounded::<ReaderEvent>();
        Wires {
            pool,
            filled_tx,
            filled_rx,
            rev_tx,
            rev_rx,
            abort: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The inline path's links (crate::data::inline): every first link's
    /// sending end, taken from `links`, which the readers share.
    pub(super) fn inline_links(
        &self,
        keys: &StreamKeys,
        links: &mut Vec<Box<dyn Link>>,
        done: &Sender<LinkDone>,
        stats: &Arc<Stats>,
    ) -> Arc<InlineLinks> {
        let outs = links.drain(..).enumerate();
        let outs = outs.map(|(i, l)| keys.out(i, 0, l)).collect();
        let (tx, pool, abort) = (done.clone(), self.pool.clone(), self.abort.clone());
        Arc::new(InlineLinks::new(outs, tx, pool, abort, stats.clone()))
    }

    /// What every generation of readers shares (a whole walk has one).
    pub(super) fn template(
        &self,
        opts: &TransferOptions,
        c: &Confirmed,
        root: &Arc<Root>,
        stats: &Arc<Stats>,
        inline: Option<Arc<InlineLinks>>,
        zerocopy: bool,
    ) -> Template {
        Template {
            root: root.clone(),
            pool: self.pool.clone(),
            filled: self.filled_tx.clone(),
            inline,
            events: self.rev_tx.clone(),
            checksum: c.checksum,
            abort: self.abort.clone(),
            stats: stats.clone(),
            block_size: c.block_size,
            storage: Arc::new(opts.source_storage(c.block_size)),
            zerocopy,
            plan: PlanOptions {
                block_size: c.block_size as u64,
                sort: opts.sort,
                threads: opts.device_threads,
            },
            engine: opts.source_engine,
        }
    }

    /// How lost links' blocks are read again (crate::session::relink).
    pub(super) fn requeue(
        &self,
        root: &Arc<Root>,
        live: &LiveFiles,
        checksum: bool,
        null: bool,
    ) -> Arc<Requeue> {
        Arc::new(Requeue {
            root: root.clone(),
            files: live.clone(),
            pool: self.pool.clone(),
            checksum,
            null,
            abort: self.abort.clone(),
        })
    }
}

/// The first readers: on the whole walk's queues (`first`: its files, a
/// sync's plan, the reader count), or a windowed session's generations
/// (issue 36), each planned as the sink readies its window.
pub(super) fn spawn_reads(
    opts: &TransferOptions,
    reads: Reads,
    template: Template,
    (files, plan, nread): (&Arc<Vec<SourceFile>>, Option<&SyncPlan>, usize),
    readers: &mut Reservation,
) -> (Vec<JobHandle>, Receiver<()>, Option<SrcWindow>) {
    match reads {
        Reads::Whole(queues) => {
            report_nothing_to_read(files, plan, &template.events);
            let state = file_states(files, plan);
            let ctx = template.ctx(files.clone(), state, queues, nread);
            let (jobs, rdone) = spawn_readers(readers, ctx);
            (jobs, rdone, None)
        }
        Reads::Windowed(scan, ahead) => {
            let compare = opts.sync & crate::request::sync::COMPARE != 0;
            let dry = opts.sync & crate::request::sync::flags::DRY_RUN != 0;
            let how = (opts.meta_budget, compare, dry);
            let (jobs, rdone, win) = SrcWindow::spawn(readers, template, (scan, *ahead), how);
            (jobs, rdone, Some(win))
        }
    }
}

/// More streams while the rate grows (issue 21), unless the count is
/// fixed. The inline path's link set is fixed. The client dials: a push's
/// source itself, a pull's sink (its daemon-side source asks).
pub(super) fn adapt(
    s: &SourceSession<'_>,
    streams: u16,
    links: &Streams,
    path: SendPath,
) -> Option<Adapt> {
    let opts = s.opts;
    (opts.auto_streams && links.enabled() && path != SendPath::Inline).then(|| {
        let (rtt, max) = (s.ctl.link.rtt(), s.res.config.max_streams);
        Adapt::new(rtt, streams, max, opts.grown_links)
    })
}

/// Inline: re-sent blocks (Resend, and those lost links lost) still come
/// through `filled`; one thread sends them, and ends the links once the
/// queue closes, as the queued senders would.
pub(super) fn spawn_inline_resender(
    links: Arc<InlineLinks>,
    rx: Receiver<Buf>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("src-resend".into())
        .spawn(move || {
            for b in rx.iter() {
                links.send(b);
            }
            links.end();
        })
}

/// The send path (seed 002 sec. 7): on the inline path readers own the
/// links' sending ends in turn and no sender thread runs
/// (crate::data::inline). The control link has seen several round trips
/// by now, so the kernel's RTT estimate is a fair measure of the path.
pub(super) fn send_path(s: &SourceSession<'_>, nread: usize, streams: u16) -> SendPath {
    let rtt = s.ctl.link.rtt();
    let path = s.opts.send_path.resolve(nread, streams as usize, rtt);
    tracing::info!(
        "source: send path {} ({nread} readers, {streams} streams, rtt {})",
        path.name(),
        rtt.map_or("unknown".to_string(), |r| format!(
            "{:.2} ms",
            r.as_secs_f64() * 1e3
        ))
    );
    path
}

/// A rotational device found cached is read by as many readers as memory
/// gets (request::tasks::mostly_cached), unless --readers fixed the count.
pub(super) fn more_readers_if_cached(
    s: &SourceSession<'_>,
    queues: &[DeviceQueue],
    readers: &mut Reservation,
) {
    let cached: usize = queues.iter().filter(|q| q.cached).map(|q| q.threads).sum();
    readers_for_cached(s, cached, readers);
}

/// A windowed session's readers, from its first window's files (they are
/// planned per window, later: crate::request::tasks::cached_threads).
pub(super) fn more_readers_if_first_window_cached(
    s: &SourceSession<'_>,
    first: &[SourceFile],
    block_size: usize,
    readers: &mut Reservation,
) {
    let po = crate::request::tasks::PlanOptions {
        block_size: block_size as u64,
        sort: s.opts.sort,
        threads: s.opts.device_threads,
    };
    let cached =
        crate::request::tasks::cached_threads(&s.spec.root, first, &po, s.opts.source_engine);
    readers_for_cached(s, cached, readers);
}

/// Up to `cached` readers, unless --readers fixed the count.
fn readers_for_cached(s: &SourceSession<'_>, cached: usize, readers: &mut Reservation) {
    let short = cached.saturating_sub(readers.len());
    if !s.opts.readers_fixed && short > 0 {
        s.adm.more_readers(s.res, readers, short);
    }
}

/// The session's buffers: two a stream (credits) and one a reader, plus
/// two; at least two, or none free within 30 s.
pub(super) fn take_share<'r>(
    res: &'r crate::data::resources::EngineResources,
    streams: u16,
    nread: usize,
) -> Result<ShareGuard<'r>, EngineError> {
    let want = streams as usize * 2 + nread + 2;
    let share = res
        .take_buffers(2, want, Duration::from_secs(30))
        .ok_or_else(|| EngineError::local("no buffers free"))?;
    Ok(ShareGuard::new(res, share))
}

/// Second handles on links, to shut them down from another thread.
pub(super) fn clone_links(links: &[Box<dyn Link>]) -> Result<Vec<Box<dyn Link>>, EngineError> {
    let clones = links.iter().map(|l| l.try_clone_link());
    Ok(clones.collect::<Result<Vec<_>, _>>()?)
}

/// Files with nothing to read are done before any reader starts: their
/// digest is that of no data.
pub(super) fn report_nothing_to_read(
    files: &[SourceFile],
    plan: Option<&SyncPlan>,
    events: &Sender<ReaderEvent>,
) {
    for f in nothing_to_read(files, plan) {
        let _ = events.send(ReaderEvent::FileDone {
            id: f.id,
            digest: 0,
        });
    }
}

/// A sender on each first link, from the sender pool (none on the inline
/// path); returns the closers that stop them.
pub(super) fn spawn_senders(
    make: &SenderFactory,
    links: Vec<Box<dyn Link>>,
    senders: &mut Reservation,
    jobs: &mut Vec<JobHandle>,
) -> HashMap<(usize, u16), Sender<()>> {
    let mut closers = HashMap::new();
    for (i, l) in links.into_iter().enumerate() {
        if let Some((c, job)) = make(i, 0, l) {
            closers.insert((i, 0), c);
            jobs.push(senders.spawn(job));
        }
    }
    closers
}

/// One reader thread per reserved reader; each says when it ends.
pub(super) fn spawn_readers(
    readers: &mut Reservation,
    ctx: ReaderCtx,
) -> (Vec<JobHandle>, Receiver<()>) {
    let ctx = Arc::new(ctx);
    let (rdone_tx, rdone_rx) = unbounded::<()>();
    let mut jobs = Vec::new();
    for i in 0..readers.len() {
        let (c, d) = (ctx.clone(), rdone_tx.clone());
        jobs.push(readers.spawn(move || {
            run_reader(&c, i);
            drop(c);
            let _ = d.send(());
        }));
    }
    (jobs, rdone_rx)
}

/// Each file's bytes still to read (a sync reads only what differs).
pub(super) fn file_states(files: &[SourceFile], plan: Option<&SyncPlan>) -> Arc<FileStates> {
    let states = files.iter().enumerate().map(|(i, f)| SrcFileState {
        remaining: AtomicU64::new(plan.map_or(f.len(), |p| p.bytes(i, f.len()))),
        digest: AtomicU64::new(0),
    });
    Arc::new(FileStates::new(states.collect()))
}

/// Files with nothing to read: empty ones, and delta files with no
/// differing block (their digest is the sum over no segment).
pub(super) fn nothing_to_read<'f>(
    files: &'f [SourceFile],
    plan: Option<&'f SyncPlan>,
) -> impl Iterator<Item = &'f SourceFile> {
    files.iter().enumerate().filter_map(move |(i, f)| {
        let none = match plan {
            None => f.is_empty(),
            Some(p) => !p.skipped(i) && p.bytes(i, f.len()) == 0,
        };
        none.then_some(f)
    })
}

/// The readers' queues, per device (request::tasks); a sync reads only
/// what it planned.
pub(super) fn queues(
    root: &Root,
    files: &[SourceFile],
    opts: &crate::session::options::TransferOptions,
    block_size: usize,
    plan: Option<&SyncPlan>,
) -> Arc<Vec<DeviceQueue>> {
    let skip = |i: usize| plan.is_some_and(|p| p.skipped(i));
    let po = PlanOptions {
        block_size: block_size as u64,
        sort: opts.sort,
        threads: opts.device_threads,
    };
    let mut queues = plan_source(root, files, &po, opts.source_engine, &skip);
    if let Some(p) = plan {
        crate::roles::source::sync_plan::restrict(&mut queues, p);
    }
    Arc::new(queues)
}

/// The scanned list, shared: a local copy's in-process sink opens large
/// files by entry id from it. Without an archive copy the sink keeps no
/// set-ID bit (archive::Policy::wanted_mode): the agent says how many.
pub(super) fn publish(
    opts: &TransferOptions,
    stats: &Stats,
    root: &Arc<Root>,
    w: Walk,
) -> (Arc<Vec<SourceFile>>, LiveFiles) {
    let files = Arc::new(w.files);
    let live = LiveFiles::whole(files.clone());
    if let Some(bridge) = &opts.local_copy {
        bridge.publish(root.clone(), live.clone());
    }
    if opts.preserve == 0 {
        stats.setid_dropped.store(w.setid, Ordering::Relaxed);
    }
    (files, live)
}

/// Zero-copy sends (storage::zerocopy), decided once: plain TCP links,
/// payload not sealed, the sink checks every block.
pub(super) fn zerocopy_allowed(opts: &TransferOptions, c: &Confirmed, o: &Opened) -> bool {
    opts.send_zerocopy
        && crate::storage::zerocopy::allowed_by_env()
        && o.key
            .is_none_or(|k| StreamSeal::new(c.cipher, &k, 0, 0).is_none())
        && c.checksum
        && !crate::data::sender::flips_bits()
        && !o.links.is_empty()
        && o.links.iter().all(|l| l.can_send_file())
}

impl Events {
    pub(super) fn new(
        readers: Receiver<ReaderEvent>,
        readers_done: Receiver<()>,
        senders_done: Receiver<LinkDone>,
        control: Receiver<ControlEvent>,
    ) -> Events {
        Events {
            check_tick: crossbeam_channel::tick(Duration::from_millis(250)),
            readers,
            readers_done,
            senders_done,
            control,
        }
    }
}

impl SenderSet {
    /// `ends`: the queued senders' closers, the links to shut down on
    /// error, the threads besides the pool's.
    pub(super) fn new(
        make: SenderFactory,
        pool: &Arc<ThreadPool>,
        ends: (
            Closers,
            Vec<Box<dyn Link>>,
            Vec<std::thread::JoinHandle<()>>,
        ),
        inline: Option<Arc<InlineLinks>>,
        idle: Duration,
    ) -> SenderSet {
        let (closers, shutdown, extra) = ends;
        SenderSet {
            make,
            pool: pool.clone(),
            closers,
            shutdown,
            kept: Vec::new(),
            evicting: HashSet::new(),
            inline,
            extra,
            idle,
        }
    }
}
