//! A windowed session's source (issue 36, docs/PROTOCOL.md "Windows"): the
//! scan runs on a thread of its own and hands its records and files over
//! a short queue; the control loop announces them at most a window ahead
//! of the sink's settled mark, the first window in the flight of Propose.
//! A sink that does not take windows (Confirm without the flag) gets the
//! rest of the records at once and today's phases.

use std::collections::VecDeque;

use crossbeam_channel::{bounded, Receiver};
use ramsys_proto::attrs::Attrs;
use ramsys_proto::control::{Entry, EntryKind};
use ramsys_proto::session::{record_bytes, Windows};
use ramsys_proto::Control;

use super::{send_entries, Ctl, SourceSession};
use crate::request::walk::{walk_handing, Walk};
use crate::types::error::EngineError;
use crate::types::file::SourceFile;

/// What the scan thread hands the control loop.
pub(super) enum ScanMsg {
    /// A batch of records (empty: the scan's keepalive), their Attrs (an
    /// archive copy's), the regular files among them and the directories
    /// done once they are out (walk::Done).
    Batch(Vec<Entry>, Vec<Attrs>, Vec<SourceFile>, Vec<u64>),
    /// The scan is over: its failures and totals (no files).
    Done(Walk),
}

pub(super) type ScanRx = Receiver<ScanMsg>;

/// A scan batch: records, their Attrs, the regular files among them, the
/// directories done once they are out.
type Batch = (Vec<Entry>, Vec<Attrs>, Vec<SourceFile>, Vec<u64>);

/// This end's window: RAMSYS_WINDOW_FILES and _BYTES
/// (TransferOptions::meta_window) within what its own memory budget holds
/// (a daemon's pull; docs/SCALE.md "Bounds and reports"). Per file, what
/// `account` counts of it (a `SourceFile`) and the 32 bytes its readers'
/// generation keeps of it (a queue entry, a state).
pub(super) fn own_window(opts: &crate::TransferOptions) -> (u64, u64) {
    let per_file = std::mem::size_of::<SourceFile>() as u64 + 32;
    let w = opts.meta_window;
    match crate::session::options::budget_window(opts.meta_budget, per_file) {
        Some(b) => (w.0.min(b.0), w.1.min(b.1)),
        None => w,
    }
}

/// The walk on a thread of its own (issue 36, docs/SCALE.md "Windows"
/// step 2). Two batches queue at most: a full window stops the scan, so
/// neither end holds more than the window. Dropping the receiver ends it.
pub(super) fn start_scan(s: &SourceSession<'_>) -> Result<ScanRx, EngineError> {
    let mut filter = crate::request::filter::Filter::new(&s.opts.select)
        .map_err(|e| EngineError::local(format!("filter rules: {e}")))?;
    // A replication batch's listed paths may be gone by now (a sync
    // takes windows too; docs/WATCH.md).
    filter.listed_may_vanish = s.opts.listed_may_vanish;
    let (base, tops) = (s.spec.root.path().to_path_buf(), s.spec.tops.clone());
    // Batches of half a window at most: the window then holds two or more.
    let half = (own_window(s.opts).0 / 2).max(1) as usize;
    let how = (s.opts.recursive, half, s.opts.preserve);
    let archive = s.opts.preserve != 0;
    let (tx, rx) = bounded(2);
    std::thread::Builder::new()
        .name("src-scan".into())
        .spawn(move || {
            let walked = walk_handing(&base, &tops, how, &filter, &mut |es, attrs, files, done| {
                let batch = ScanMsg::Batch(es.to_vec(), attrs.to_vec(), files, done);
                tx.send(batch).map_err(|_| ())
            });
            if let Ok(mut w) = walked {
                // Set-ID bits are dropped (and noted) by a plain copy
                // only: an archive copy keeps what the policy allows.
                if archive {
                    w.setid = 0;
                }
                let _ = tx.send(ScanMsg::Done(w));
            }
        })?;
    Ok(rx)
}

/// How far the records run ahead of the sink (the source's half of the
/// window): at most `limit.0` ids past the settled mark and `limit.1`
/// bytes of records (proto::session::record_bytes) not settled, as the
/// sink's machine checks them.
pub(super) struct Ahead {
    limit: (u64, u64),
    /// What of the scan's last batch the window had no room for yet (a
    /// window smaller than a batch: the sink's, or the first one).
    carry: Option<Batch>,
    /// Records announced (the next id) and the files among them.
    pub announced: u64,
    pub files: u64,
    /// Bytes of the files announced (the transfer's total so far).
    pub total_bytes: u64,
    /// (one past the batch's last id, its path bytes, its files), until
    /// settled.
    batches: VecDeque<(u64, u64, u64)>,
    bytes: u64,
    /// Files of the batches not yet settled.
    held: u64,
    /// The sink's settled mark.
    pub settled: u64,
    /// Files announced and not yet ready, ascending ids.
    pub pending: VecDeque<SourceFile>,
    /// The scan's end, once it came (MetaEnd is then sent).
    pub walk: Option<Walk>,
    /// A dry run's report names the files it would send: the wire paths
    /// of the files announced and not yet ready, ascending ids (None
    /// otherwise).
    names: Option<VecDeque<super::Named>>,
    /// Directories done whose records are all out, not yet named to the
    /// sink (before Confirm: it may not take DirsDone).
    done: Vec<u64>,
}

impl Ahead {
    pub fn new(limit: (u64, u64)) -> Ahead {
        Ahead {
            limit,
            carry: None,
            announced: 0,
            files: 0,
            total_bytes: 0,
            batches: VecDeque::new(),
            bytes: 0,
            held: 0,
            settled: 0,
            pending: VecDeque::new(),
            walk: None,
            names: None,
            done: Vec::new(),
        }
    }

    /// Keep the files' wire paths until they are ready (a dry run).
    pub fn naming(mut self, on: bool) -> Ahead {
        self.names = on.then(VecDeque::new);
        self
    }

    /// May the scan's next message be taken now?
    pub fn room(&self) -> bool {
        self.walk.is_none()
            && self.carry.is_none()
            && self.announced - self.settled < self.limit.0
            && self.bytes < self.limit.1
    }

    /// The window from now on: the sink's answer was read.
    pub fn set_limit(&mut self, limit: (u64, u64)) {
        self.limit = limit;
    }

    /// How many of `es` (the next ids) fit the window now: ids below the
    /// settled mark plus `limit.0`, record bytes within `limit.1`, the
    /// first record of an empty window whatever its size (the machines'
    /// rule, proto::session::Limit).
    fn fit(&self, es: &[Entry]) -> usize {
        let ids = (self.settled.saturating_add(self.limit.0)).saturating_sub(self.announced);
        let mut held = self.bytes;
        let mut n = 0;
        for e in es.iter().take(ids.min(es.len() as u64) as usize) {
            let b = record_bytes(e);
            if held > 0 && held.saturating_add(b) > self.limit.1 {
                break;
            }
            held += b;
            n += 1;
        }
        n
    }

    /// A batch went out.
    fn sent(&mut self, es: &[Entry], files: Vec<SourceFile>) {
        let bytes: u64 = es.iter().map(record_bytes).sum();
        let n = files.len() as u64;
        self.announced += es.len() as u64;
        self.files += n;
        self.total_bytes += files.iter().map(|f| f.len()).sum::<u64>();
        self.pending.extend(files);
        if let Some(names) = &mut self.names {
            names.extend(super::names_of(es));
        }
        if !es.is_empty() {
            self.batches.push_back((self.announced, bytes, n));
            self.bytes += bytes;
            self.held += n;
        }
    }

    /// The sink settled every id below `through`.
    pub fn settled(&mut self, through: u64) {
        self.settled = through;
        while let Some(&(end, b, n)) = self.batches.front() {
            if end > through {
                break;
            }
            self.batches.pop_front();
            self.bytes -= b;
            self.held -= n;
        }
    }

    /// The files the sink has slots for now (ids below `through`), and
    /// their wire paths if named.
    pub fn ready(&mut self, through: u64) -> (Vec<SourceFile>, super::Names) {
        let n = self.pending.partition_point(|f| f.id < through);
        let names = self.names.as_mut().map_or(Vec::new(), |v| {
            let k = v.partition_point(|(id, _, _)| *id < through);
            v.drain(..k).collect()
        });
        (self.pending.drain(..n).collect(), names)
    }
}

/// Records as the windows allow them: a second name is a LinkTo once the
/// sink took windows, else (an old sink) a HardLink, which names its
/// target by id alone (before Confirm, `flush` holds it back).
fn wire(mut es: Vec<Entry>, on: bool) -> Vec<Entry> {
    if !on {
        for e in &mut es {
            if let EntryKind::LinkTo { target_id, .. } = e.kind {
                e.kind = EntryKind::HardLink { target_id };
            }
        }
    }
    es
}

/// One message of the scan: its records go out as far as the window
/// goes ([`flush`]; an empty batch is the scan's keepalive); or its end:
/// ScanFailed and MetaEnd. False once it has ended.
pub(super) fn on_scan(
    ctl: &mut Ctl,
    ahead: &mut Ahead,
    m: ScanMsg,
    root: &crate::storage::fsops::Root,
) -> Result<bool, EngineError> {
    match m {
        ScanMsg::Batch(es, _, _, done) if es.is_empty() && done.is_empty() => {
            send_entries(ctl, &[])?;
            Ok(true)
        }
        ScanMsg::Batch(es, _, _, done) if es.is_empty() => {
            ahead.done.extend(done);
            dirs_done(ctl, ahead)?;
            Ok(true)
        }
        ScanMsg::Batch(es, attrs, files, done) => {
            ahead.carry = Some((es, attrs, files, done));
            flush(ctl, ahead)?;
            Ok(true)
        }
        ScanMsg::Done(w) => {
            dirs_done(ctl, ahead)?;
            // None after MetaEnd: the sink deletes in the rest at the end.
            ahead.done = Vec::new();
            super::send_scan_failures(ctl, &w.failures, &root.path().to_string_lossy())?;
            ctl.send(&Control::MetaEnd {
                entries: w.entries,
                files: ahead.files,
                bytes: w.total_bytes,
            })?;
            ahead.walk = Some(w);
            Ok(false)
        }
    }
}

/// What of the carried batch the window has room for now goes out: its
/// records, their Attrs right behind them (docs/PROTOCOL.md "Windows"),
/// their files waiting for Ready; the rest stays carried until the sink
/// settles more (a window smaller than the scan's batch: the sink's
/// memory budget, docs/SCALE.md "Bounds and reports").
pub(super) fn flush(ctl: &mut Ctl, ahead: &mut Ahead) -> Result<(), EngineError> {
    let Some((mut es, mut attrs, mut files, done)) = ahead.carry.take() else {
        return dirs_done(ctl, ahead);
    };
    let mut n = ahead.fit(&es);
    // Before Confirm a second name would go as a HardLink, whose target
    // the sink may have settled and dropped by the time it comes (a
    // sync's unchanged file settles as it is answered: a protocol error
    // at the sink). It waits for Confirm and goes as a LinkTo, by path.
    if ctl.machine.windows() == Windows::Proposed {
        let link = es
            .iter()
            .position(|e| matches!(e.kind, EntryKind::LinkTo { .. }));
        n = n.min(link.unwrap_or(n));
    }
    if n == 0 {
        ahead.carry = Some((es, attrs, files, done));
        return dirs_done(ctl, ahead);
    }
    let rest = es.split_off(n);
    let end = es[n - 1].id + 1;
    let rest_attrs = attrs.split_off(attrs.partition_point(|a| a.id < end));
    let rest_files = files.split_off(files.partition_point(|f| f.id < end));
    let on = ctl.machine.windows() == Windows::On;
    send_entries(ctl, &wire(es.clone(), on))?;
    crate::storage::archive::collect::send_attrs(&attrs, &mut |m| ctl.send(&m))?;
    ahead.sent(&es, files);
    if rest.is_empty() {
        // The batch's records are all out: its directories are done.
        ahead.done.extend(done);
    } else {
        ahead.carry = Some((rest, rest_attrs, rest_files, done));
    }
    dirs_done(ctl, ahead)
}

/// Directories done (docs/PROTOCOL.md "Directories done"): named to a
/// sink that took DIRS_DONE_FLAG once the payload runs (its SyncDone
/// came); held while Confirm is unread; dropped for any other sink, which
/// deletes at the end.
fn dirs_done(ctl: &mut Ctl, ahead: &mut Ahead) -> Result<(), EngineError> {
    if ahead.done.is_empty() || ctl.machine.windows() == Windows::Proposed {
        return Ok(());
    }
    let done = std::mem::take(&mut ahead.done);
    match ctl.machine.dirs_done() {
        true if ctl.phase() == ramsys_proto::session::Phase::Payload => {
            // A varint id is at most 10 bytes.
            ctl.send_batched(done, |_| 10, |ids| Control::DirsDone { ids })
        }
        true => {
            ahead.done = done;
            Ok(())
        }
        false => Ok(()),
    }
}

/// The first window, in the flight of Propose: records until the window
/// is full or the scan is over (a tree smaller than the window is then
/// announced whole, MetaEnd included, before Confirm is read).
pub(super) fn first_window(
    s: &mut SourceSession<'_>,
    scan: &ScanRx,
    ahead: &mut Ahead,
) -> Result<(), EngineError> {
    while ahead.room() {
        let Ok(m) = scan.recv() else {
            return Err(EngineError::local("the scan stopped"));
        };
        on_scan(&mut s.ctl, ahead, m, &s.spec.root.clone())?;
        account(&s.stats, ahead, s.opts.meta_budget)?;
    }
    // A tree the first window held whole: the scan's count of set-ID bits
    // a plain copy drops (the agent's note) is known now; later, when the
    // payload loop takes the scan's end.
    if let Some(w) = &ahead.walk {
        let dropped = &s.stats.setid_dropped;
        dropped.store(w.setid, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(())
}

/// A sink that did not take windows: every record now, the files kept
/// whole, as the scan of today's phases leaves them (and a dry run's
/// names).
pub(super) fn whole(
    s: &mut SourceSession<'_>,
    scan: ScanRx,
    mut ahead: Ahead,
) -> Result<(Walk, super::Names), EngineError> {
    // No window: what the first one left carried goes now.
    ahead.set_limit((u64::MAX, u64::MAX));
    flush(&mut s.ctl, &mut ahead)?;
    let mut files: Vec<SourceFile> = Vec::new();
    let mut names = super::Names::new();
    let root = s.spec.root.clone();
    loop {
        let (f, n) = ahead.ready(u64::MAX);
        files.extend(f);
        names.extend(n);
        if ahead.walk.is_some() {
            break;
        }
        let Ok(m) = scan.recv() else {
            return Err(EngineError::local("the scan stopped"));
        };
        on_scan(&mut s.ctl, &mut ahead, m, &root)?;
    }
    let mut w = ahead.walk.take().expect("the scan's end");
    files.shrink_to_fit();
    w.files = files;
    Ok((w, names))
}

/// The records' totals so far, for the progress and the stream growth
/// (transport::grow reads what is left to send), and what the window
/// holds, against the session's budget (issue 36's accounting: a
/// `SourceFile` and its path per file not yet settled).
pub(super) fn account(
    stats: &crate::types::stats::Stats,
    ahead: &Ahead,
    budget: u64,
) -> Result<(), EngineError> {
    use std::sync::atomic::Ordering;
    stats
        .total_bytes
        .store(ahead.total_bytes, Ordering::Relaxed);
    stats.total_files.store(ahead.files, Ordering::Relaxed);
    let each = std::mem::size_of::<SourceFile>() as u64;
    let held = ahead.bytes + ahead.held * each;
    stats
        .meta_used(held, ahead.held, budget)
        .map_err(EngineError::Local)
}
