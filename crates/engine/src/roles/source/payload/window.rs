//! A windowed session's payload (issue 36, docs/PROTOCOL.md "Windows"):
//! the records go on ahead of the data, a window at most past the sink's
//! settled mark; the files the sink readies become the readers' next
//! generation (its own queues, sorted within it, its own states); the
//! files the sink settled are dropped a generation at a time.

use super::*;
use crate::roles::source::sync_plan::{self, Answer};
use crate::roles::source::window::{account, flush, on_scan, Ahead, ScanMsg, ScanRx};

/// What every generation's readers share, and how its queues are made.
pub(in crate::roles::source) struct Template {
    pub root: Arc<Root>,
    pub pool: Arc<BufferPool>,
    pub filled: Sender<Buf>,
    pub inline: Option<Arc<InlineLinks>>,
    pub events: Sender<ReaderEvent>,
    pub checksum: bool,
    pub abort: Arc<AtomicBool>,
    pub stats: Arc<Stats>,
    pub block_size: usize,
    pub storage: Arc<StorageCfg>,
    pub zerocopy: bool,
    pub plan: PlanOptions,
    pub engine: crate::storage::DataEngine,
}

impl Template {
    /// The readers' context for `files`, read from `queues`.
    pub fn ctx(
        &self,
        files: Arc<Vec<SourceFile>>,
        state: Arc<FileStates>,
        queues: Arc<Vec<DeviceQueue>>,
        nread: usize,
    ) -> ReaderCtx {
        ReaderCtx {
            root: self.root.clone(),
            dirs: Arc::new(ReadDirs::new(files.iter().map(|f| &f.rel[..]))),
            files,
            state,
            homes: assign_homes(&queues, nread),
            queues,
            pool: self.pool.clone(),
            filled: self.filled.clone(),
            inline: self.inline.clone(),
            events: self.events.clone(),
            checksum: self.checksum,
            abort: self.abort.clone(),
            stats: self.stats.clone(),
            block_size: self.block_size,
            storage: self.storage.clone(),
            zerocopy: self.zerocopy,
        }
    }
}

/// The records still to announce and the readers' generations.
pub(in crate::roles::source) struct SrcWindow {
    scan: ScanRx,
    /// The scan sent its end (MetaEnd is out).
    scanned: bool,
    ahead: Ahead,
    /// Files the sink readied that no generation took yet.
    ready: Vec<SourceFile>,
    /// One queue of generations per reader thread; dropped (the readers
    /// then end) once the last generation is done.
    gens: Vec<Sender<Arc<ReaderCtx>>>,
    /// A reader finished its part of the generation.
    gen_done: Receiver<()>,
    /// Readers still on the current generation.
    gen_left: usize,
    /// Dropped with `gens`: it holds the senders' queue open.
    template: Option<Template>,
    /// The session's memory budget (TransferOptions::meta_budget).
    budget: u64,
    /// When the last keepalive went out.
    said: std::time::Instant,
    /// A sync (docs/PROTOCOL.md "Windows"): the sink answers each window
    /// with Have records right before its Ready.
    compare: bool,
    /// Have records of the window the sink is readying now.
    answer: Answer,
    /// Have records of the windows it readied, for the next generation.
    readied: Answer,
    /// Files found unchanged so far (the report's count).
    pub unchanged: u64,
    /// A dry run: nothing is read; the files that differ are named.
    dry: bool,
    /// Wire paths of the files readied that no generation took yet.
    ready_names: Names,
    /// A dry run's files that would be sent (the report's list).
    pub planned: Vec<String>,
    /// Their ids: a further name in a later window is listed with them.
    sent: std::collections::HashSet<u64>,
}

impl SrcWindow {
    /// One reader thread per reserved reader, each running the
    /// generations it is handed until their queue closes.
    pub fn spawn(
        readers: &mut Reservation,
        template: Template,
        (scan, ahead): (ScanRx, Ahead),
        (budget, compare, dry): (u64, bool, bool),
    ) -> (Vec<JobHandle>, Receiver<()>, SrcWindow) {
        let (rdone_tx, rdone_rx) = unbounded::<()>();
        let (gd_tx, gd_rx) = unbounded::<()>();
        let mut gens = Vec::new();
        let mut jobs = Vec::new();
        for i in 0..readers.len() {
            let (tx, rx) = unbounded::<Arc<ReaderCtx>>();
            gens.push(tx);
            let (d, gd) = (rdone_tx.clone(), gd_tx.clone());
            jobs.push(readers.spawn(move || {
                for ctx in rx {
                    run_reader(&ctx, i);
                    drop(ctx);
                    let _ = gd.send(());
                }
                let _ = d.send(());
            }));
        }
        let scanned = ahead.walk.is_some();
        let win = SrcWindow {
            scan,
            scanned,
            ahead,
            ready: Vec::new(),
            gens,
            gen_done: gd_rx,
            gen_left: 0,
            template: Some(template),
            budget,
            said: std::time::Instant::now(),
            compare,
            answer: Answer::default(),
            readied: Answer::default(),
            unchanged: 0,
            dry,
            ready_names: Vec::new(),
            planned: Vec::new(),
            sent: Default::default(),
        };
        (jobs, rdone_rx, win)
    }

    /// The scan's end, if it came: its failures for the report.
    pub fn take_walk(&mut self) -> Option<Walk> {
        self.ahead.walk.take()
    }
}

impl Payload<'_> {
    /// What the loop waits on for a windowed session: the scan while the
    /// window has room, the readers' generations (never, otherwise).
    pub(super) fn window_events(&self) -> (Receiver<ScanMsg>, Receiver<()>) {
        match &self.win {
            Some(w) => {
                let scan = match !w.scanned && w.ahead.room() {
                    true => w.scan.clone(),
                    false => never(),
                };
                // Once the readers' queues closed, no generation ends.
                let gens = match w.template.is_some() {
                    true => w.gen_done.clone(),
                    false => never(),
                };
                (scan, gens)
            }
            None => (never(), never()),
        }
    }

    /// A batch of the scan: announced; or its end: MetaEnd.
    pub(super) fn on_scan(&mut self, m: Result<ScanMsg, RecvError>) -> Step {
        let Some(w) = &mut self.win else {
            return Ok(None);
        };
        let Ok(m) = m else {
            return Err(EngineError::local("the scan stopped"));
        };
        if !on_scan(self.ctl, &mut w.ahead, m, &self.root)? {
            w.scanned = true;
            if let Some(walk) = &w.ahead.walk {
                self.stats
                    .setid_dropped
                    .store(walk.setid, Ordering::Relaxed);
            }
        }
        account(&self.stats, &w.ahead, w.budget)?;
        self.next_generation()?;
        Ok(None)
    }

    /// While records are still to come, an empty Entries every 2 s (the
    /// scan's keepalive, request::walk::SCAN_KEEPALIVE): the sink waits
    /// for them with its idle timeout, and a full window or a stalled
    /// scan sends nothing else on the control link.
    pub(super) fn keepalive(&mut self) -> Result<(), EngineError> {
        let Some(w) = &mut self.win else {
            return Ok(());
        };
        if w.scanned || w.said.elapsed() < crate::request::walk::SCAN_KEEPALIVE {
            return Ok(());
        }
        w.said = std::time::Instant::now();
        self.ctl.send(&Control::Entries(Vec::new()))
    }

    /// A sync's Have records, for the window the sink readies next
    /// (SourceMachine: none outside it).
    pub(super) fn on_have(&mut self, v: Vec<ramsys_proto::control::Have>) {
        if let Some(w) = self.win.as_mut().filter(|w| w.compare) {
            w.answer.extend(v);
        }
    }

    /// The sink has slots for every id below `through`: those files are
    /// the next generation's, with the answer the sink gave for them.
    pub(super) fn on_ready(&mut self, through: u64) -> Result<(), EngineError> {
        if let Some(w) = &mut self.win {
            let (files, names) = w.ahead.ready(through);
            w.ready.extend(files);
            w.ready_names.extend(names);
            let answer = std::mem::take(&mut w.answer);
            w.readied.append(answer);
        }
        self.next_generation()
    }

    /// Every id below `through` is settled: their files go, and the window
    /// moves on (first over what it carries of the scan's last batch).
    pub(super) fn on_settled_through(&mut self, through: u64) -> Result<(), EngineError> {
        if let Some(w) = &mut self.win {
            w.ahead.settled(through);
            self.live.drop_below(through);
            flush(self.ctl, &mut w.ahead)?;
            account(&self.stats, &w.ahead, w.budget)?;
        }
        Ok(())
    }

    /// A reader is done with its part of the generation.
    pub(super) fn on_generation_done(&mut self, g: Result<(), RecvError>) -> Step {
        if let (Ok(()), Some(w)) = (g, &mut self.win) {
            w.gen_left = w.gen_left.saturating_sub(1);
            self.next_generation()?;
        }
        Ok(None)
    }

    /// Between generations: the files readied since become the next one
    /// (queues planned and sorted within it); with none left to come, the
    /// readers' queues close and they end.
    pub(super) fn next_generation(&mut self) -> Result<(), EngineError> {
        let Some(w) = &mut self.win else {
            return Ok(());
        };
        if w.gen_left > 0 {
            return Ok(());
        }
        if w.ready.is_empty() {
            // A dry run's window of records but files (further names,
            // symlinks): listed all the same, what the sink would make by
            // its Have.
            if w.dry && !w.ready_names.is_empty() {
                let names = std::mem::take(&mut w.ready_names);
                let made = std::mem::take(&mut w.readied).made();
                w.planned.extend(dry_list(&names, [], &made, &mut w.sent));
            }
            if w.scanned && w.ahead.pending.is_empty() {
                w.gens.clear();
                w.template = None;
            }
            return Ok(());
        }
        let Some(t) = &w.template else {
            return Ok(());
        };
        let files = Arc::new(std::mem::take(&mut w.ready));
        // A sync: our side of the sink's comparisons for these files
        // (sync_plan), what it may reuse told before any of their data.
        let mut plan = None;
        if w.compare {
            let answer = std::mem::take(&mut w.readied);
            let max_run = crate::request::tasks::stripe_chunk(t.block_size as u64);
            let p = sync_plan::plan(&t.root, &files, answer, w.dry, max_run);
            w.unchanged += p.unchanged;
            if w.dry {
                // Named as the whole-tree phases name them (wire paths).
                let names = std::mem::take(&mut w.ready_names);
                let ids = p.planned.iter().map(|&i| files[i].id);
                w.planned
                    .extend(dry_list(&names, ids, &p.made, &mut w.sent));
            }
            for chunk in p.reuse.chunks(16_384) {
                self.ctl.send(&Control::Reuse(chunk.to_vec()))?;
            }
            plan = Some(p);
        }
        let root = &t.root;
        let skip = |i: usize| plan.as_ref().is_some_and(|p| p.skipped(i));
        let mut queues = plan_source(root, &files, &t.plan, t.engine, &skip);
        if let Some(p) = &plan {
            sync_plan::restrict(&mut queues, p);
        }
        report_nothing_to_read(&files, plan.as_ref(), &t.events);
        let state = file_states(&files, plan.as_ref());
        self.live.push(files.clone());
        let ctx = Arc::new(t.ctx(files, state, Arc::new(queues), w.gens.len()));
        for g in &w.gens {
            if g.send(ctx.clone()).is_err() {
                return Err(EngineError::local("a reader thread ended early"));
            }
        }
        w.gen_left = w.gens.len();
        Ok(())
    }
}
