//! The source's payload phase, taken out of its event loop: when digests
//! are flushed, when EndOfData is due, when re-sends can no longer come,
//! and which lost links are ready to re-queue, as plain structs with unit
//! tests that need no threads or sockets (in the manner of quinn-proto's
//! in-memory tests); plus the handler of the sink's Resend.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use crossbeam_channel::Sender;
use ramsys_proto::data::Segment;
use ramsys_proto::Control;
use ramsys_resources::{Buf, BufferPool};

use super::Ctl;
use crate::data::reread::Rereader;
use crate::types::error::EngineError;
use crate::types::stats::Stats;

/// Digests are sent in batches of at most this many files.
const DIGEST_BATCH: usize = 4096;

/// A batch this large goes as soon as the event queue runs dry; a smaller
/// one waits up to DIGEST_WAIT for more (issue 17): readers finish small
/// files one at a time, so "flush when dry" sent one FilesDone per file
/// (a writev here, a recvfrom and wake-ups at the sink, per file), while
/// a digest only helps the sink once the block holding the file's last
/// bytes has arrived, which takes longer than this anyway.
const DIGEST_MIN_BATCH: usize = 64;
const DIGEST_WAIT: std::time::Duration = std::time::Duration::from_millis(2);

/// Progress of the payload phase as the source's loop sees it.
#[derive(Debug)]
pub(super) struct Pipeline {
    pub readers_left: usize,
    pub senders_left: usize,
    /// The sink said every file is in place or failed (no Resend follows).
    pub settled: bool,
    pub eod_sent: bool,
    pub files_done: u64,
    /// (entry id, digest) of files read whole, not yet sent in FilesDone.
    pub done_batch: Vec<(u64, u64)>,
    /// When the oldest digest of `done_batch` was added.
    pub batch_since: Option<std::time::Instant>,
}

impl Pipeline {
    pub fn new(readers: usize, senders: usize) -> Pipeline {
        Pipeline {
            readers_left: readers,
            senders_left: senders,
            settled: false,
            eod_sent: false,
            files_done: 0,
            done_batch: Vec::new(),
            batch_since: None,
        }
    }

    /// A reader finished file `id` with this digest.
    pub fn file_done(&mut self, id: u64, digest: u64) {
        crate::types::phase::mark("file_read");
        self.files_done += 1;
        if self.done_batch.is_empty() {
            self.batch_since = Some(std::time::Instant::now());
        }
        self.done_batch.push((id, digest));
    }

    /// Re-sends can no longer be asked for and every block was read: the
    /// queue to the senders may close (`events_empty`: no reader event is
    /// waiting).
    pub fn resends_over(&self, events_empty: bool) -> bool {
        self.settled && self.readers_left == 0 && events_empty
    }

    /// Send the digests now: the event queue ran dry or the batch is big.
    pub fn flush_due(&self, events_empty: bool) -> bool {
        self.flush_due_at(events_empty, std::time::Instant::now())
    }

    /// How long the loop may wait for an event before a pending batch of
    /// digests is due by age (so a stalled reader never holds them back).
    pub fn flush_wait(&self) -> std::time::Duration {
        match (self.done_batch.is_empty(), self.batch_since) {
            (false, Some(t)) => DIGEST_WAIT.saturating_sub(t.elapsed()),
            _ => std::time::Duration::from_secs(3600),
        }
    }

    /// [`Self::flush_due`] at time `now`: a full batch at once; otherwise
    /// when the event queue is dry and the batch is big enough, old
    /// enough, or the last (every reader is done).
    pub fn flush_due_at(&self, events_empty: bool, now: std::time::Instant) -> bool {
        let n = self.done_batch.len();
        if n == 0 {
            return false;
        }
        if n >= DIGEST_BATCH {
            return true;
        }
        let waited = self
            .batch_since
            .is_none_or(|t| now.saturating_duration_since(t) >= DIGEST_WAIT);
        events_empty && (self.readers_left == 0 || n >= DIGEST_MIN_BATCH || waited)
    }

    /// EndOfData is due (once): every reader and sender is done and no
    /// reader event (a digest, a failure) is still waiting to be sent
    /// before it.
    pub fn eod_due(&mut self, events_empty: bool) -> bool {
        if self.readers_left == 0 && self.senders_left == 0 && events_empty && !self.eod_sent {
            self.eod_sent = true;
            return true;
        }
        false
    }
}

/// A lost link (stream, epoch) is re-queued once both halves are known:
/// its sender's log of what it sent (when the sender ends) and the count
/// of blocks the sink accepted (its Lost message); they arrive in either
/// order.
#[derive(Debug)]
pub(super) struct LostLinks<L> {
    logs: HashMap<(usize, u16), L>,
    counts: HashMap<(usize, u16), u64>,
}

impl<L> LostLinks<L> {
    pub fn new() -> LostLinks<L> {
        LostLinks {
            logs: HashMap::new(),
            counts: HashMap::new(),
        }
    }
    pub fn log(&mut self, link: (usize, u16), log: L) {
        self.logs.insert(link, log);
    }
    pub fn received(&mut self, link: (usize, u16), n: u64) {
        self.counts.insert(link, n);
    }
    /// The links whose log and count are both known, taken out.
    pub fn ready(&mut self) -> Vec<((usize, u16), L, u64)> {
        let keys: Vec<_> = self
            .logs
            .keys()
            .filter(|k| self.counts.contains_key(k))
            .copied()
            .collect();
        keys.into_iter()
            .filter_map(|k| Some((k, self.logs.remove(&k)?, self.counts.remove(&k)?)))
            .collect()
    }
}

/// The sink's Resend: re-read each segment (same boundaries, so hashes
/// and digests are unchanged; data::reread) and queue it; a file that
/// cannot be re-read is failed at the sink.
pub(super) fn on_resend(
    v: &[(u64, u64, u32)],
    tx: &Sender<Buf>,
    resender: &Rereader,
    pool: &BufferPool,
    stats: &Stats,
    ctl: &mut Ctl,
) -> Result<(), EngineError> {
    for &(id, offset, len) in v {
        let seg = Segment {
            file_id: id,
            offset,
            len,
        };
        match resend_block(resender, seg, pool) {
            Ok(buf) => {
                stats.resends.fetch_add(1, Ordering::Relaxed);
                let _ = tx.send(buf);
            }
            Err(reason) => {
                tracing::warn!("cannot re-send file id {id}: {reason}");
                (stats.source_incomplete).store(true, Ordering::Relaxed);
                ctl.send(&Control::FileFailed { id, reason })?;
            }
        }
    }
    Ok(())
}

/// One block holding segment `seg` read again.
fn resend_block(rr: &Rereader, seg: Segment, pool: &BufferPool) -> Result<Buf, String> {
    let mut buf = pool
        .get_timeout(std::time::Duration::from_secs(30))
        .ok_or("no free buffer to re-send a block")?;
    match rr.fill(&mut buf, &[seg]) {
        Ok(()) => Ok(buf),
        Err((_, reason)) => {
            pool.put(buf);
            Err(reason)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_of_data_waits_for_every_reader_sender_and_event_and_comes_once() {
        let mut p = Pipeline::new(2, 1);
        p.file_done(7, 99);
        let t0 = p.batch_since.unwrap();
        // One digest waits for company while readers still run...
        assert!(!p.flush_due_at(true, t0));
        // ...until it is DIGEST_WAIT old, or there are DIGEST_MIN_BATCH.
        assert!(p.flush_due_at(true, t0 + DIGEST_WAIT) && !p.flush_due_at(false, t0 + DIGEST_WAIT));
        for i in 1..DIGEST_MIN_BATCH as u64 {
            p.file_done(7 + i, 99);
        }
        assert!(p.flush_due_at(true, t0) && !p.flush_due_at(false, t0));
        p.done_batch.truncate(1);
        p.readers_left = 0;
        assert!(p.flush_due_at(true, t0), "the last digests go at once");
        p.files_done = 1;
        p.readers_left = 0;
        assert!(!p.eod_due(true), "a sender is still sending");
        p.senders_left = 0;
        assert!(!p.eod_due(false), "an event is still queued");
        assert!(p.eod_due(true));
        assert!(!p.eod_due(true), "once");
        assert_eq!(p.files_done, 1);
        assert!(!p.resends_over(true), "not settled");
        p.settled = true;
        assert!(p.resends_over(true) && !p.resends_over(false));
        // A full batch goes even while events keep coming.
        p.done_batch = vec![(0, 0); DIGEST_BATCH];
        assert!(p.flush_due(false));
    }

    #[test]
    fn a_lost_link_is_ready_when_its_log_and_count_are_both_known() {
        let mut l = LostLinks::new();
        l.log((0, 0), "log a");
        l.received((1, 2), 5);
        assert!(l.ready().is_empty());
        l.received((0, 0), 3);
        assert_eq!(l.ready(), vec![((0, 0), "log a", 3)]);
        assert!(l.ready().is_empty(), "taken out");
        l.log((1, 2), "log b");
        assert_eq!(l.ready(), vec![((1, 2), "log b", 5)]);
    }
}
