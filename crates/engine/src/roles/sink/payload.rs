//! The sink's payload phase, taken out of its event loop: what each event
//! does (a control message, a receiver that ended, a corrupt block) and
//! when the sink is settled, as functions and a plain struct the loop in
//! (pipeline.rs, SinkPipeline) calls one line per event.

use std::sync::atomic::Ordering;

use ramsys_proto::Control;

use super::Ctl;
use crate::roles::sink::files::{FileTable, WriteError};
use crate::roles::sink::sync_delta::SinkSync;
use crate::roles::sink::writer::settler::Settlers;
use crate::session::relink::Streams;
use crate::types::error::EngineError;
use crate::types::stats::Stats;

/// When to tell the source the sink is settled (docs/PROTOCOL.md,
/// `Settled`): once every file is in place or failed, no Resend can follow
/// and the source may end its links. Files finish on writer threads, so
/// the loop looks often (every 5 ms), but scans the file table only after
/// progress, or after 40 idle looks (200 ms) in case the last file settled
/// between two looks without moving the counters.
#[derive(Debug)]
pub(super) struct SettleWatch {
    pub settled: bool,
    last_progress: u64,
    idle_ticks: u32,
}

/// Idle looks between two table scans without progress.
const IDLE_SCAN: u32 = 40;

impl SettleWatch {
    pub fn new() -> SettleWatch {
        SettleWatch {
            settled: false,
            last_progress: u64::MAX,
            idle_ticks: 0,
        }
    }

    /// One look, `progress` = files settled so far by the counters. True
    /// when the table should be scanned now.
    pub fn scan_due(&mut self, progress: u64) -> bool {
        self.idle_ticks += 1;
        if progress != self.last_progress || self.idle_ticks >= IDLE_SCAN {
            (self.last_progress, self.idle_ticks) = (progress, 0);
            return true;
        }
        false
    }

    /// Scan the table at the next look whatever the counters say: every
    /// record just came in, and a sync's files may all have settled
    /// already, unchanged, without moving them (else the last scan waits
    /// for 40 idle looks, 200 ms; issue 36).
    pub fn rescan(&mut self) {
        self.last_progress = u64::MAX;
    }

    /// A look at the table (`all_settled` scans only when due). True the
    /// one time the sink becomes settled: then Settled is sent.
    pub fn look(&mut self, progress: u64, all_settled: impl FnOnce() -> bool) -> bool {
        if self.settled || !self.scan_due(progress) || !all_settled() {
            return false;
        }
        self.settled = true;
        true
    }
}

/// Files settled so far (in place or failed), by the counters.
pub(super) fn progress(stats: &Stats) -> u64 {
    stats.files.load(Ordering::Relaxed)
        + stats.failed.load(Ordering::Relaxed)
        + stats.pieces.load(Ordering::Relaxed)
}

/// A writer-side error as the session's error.
pub(super) fn write_error(e: WriteError) -> EngineError {
    match e {
        WriteError::Fatal(s) => EngineError::local(s),
        WriteError::Protocol(s) => EngineError::local(format!("protocol error: {s}")),
    }
}

/// The source's payload-phase control messages. Sets `eod` at EndOfData.
pub(super) fn on_control(
    m: Control,
    ctl: &mut Ctl,
    table: &FileTable,
    sync: &mut Option<SinkSync>,
    streams: &mut Streams,
    settlers: &mut Settlers,
    eod: &mut bool,
) -> Result<(), EngineError> {
    if let Control::Abort { reason } = &m {
        return Err(EngineError::PeerAborted(reason.clone()));
    }
    ctl.machine.on_recv(&m)?;
    match m {
        Control::FilesDone(v) => {
            crate::types::phase::mark("sink_digests_in");
            settlers.digests(table, v).map_err(write_error)?;
        }
        Control::FileFailed { id, reason } => table.source_failed_id(id, reason),
        Control::Reuse(v) => {
            if let Some(s) = sync {
                s.on_reuse(table, v).map_err(write_error)?;
            }
        }
        Control::EndOfData { .. } => {
            crate::types::phase::mark("sink_eod_in");
            *eod = true
        }
        // The source's end broke first: close ours, so its receiver ends
        // and we can report what arrived.
        Control::LinkDown { stream, epoch } => {
            if streams.ran(stream, epoch) {
                streams.close(stream as usize, epoch);
            } else {
                ctl.send(&Control::Lost {
                    stream,
                    epoch,
                    received: 0,
                })?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// A block failed verification: ask for its segments again, if its table
/// names real ranges; a table too damaged to say what was lost leaves no
/// way to complete the files.
pub(super) fn on_corrupt(
    stream: u16,
    segs: &[ramsys_proto::data::Segment],
    ctl: &mut Ctl,
    table: &FileTable,
    stats: &Stats,
) -> Result<(), EngineError> {
    let plausible = segs.iter().all(|s| {
        table.is_released(s.file_id)
            || table
                .get(s.file_id)
                .is_some_and(|f| s.offset.saturating_add(s.span()) <= f.size)
    });
    if !plausible {
        return Err(EngineError::local(format!(
            "corrupt block on stream {stream} with an unusable segment table"
        )));
    }
    // Segments of files already failed (or in place) are not asked for:
    // a file the source failed (e.g. it changed while being read, and a
    // zero-copy block sent its new bytes) can still have blocks in flight
    // after the sink settled, and no Resend may follow Settled.
    let v: Vec<_> = segs
        .iter()
        .filter(|s| !table.is_settled(s.file_id))
        .map(|s| (s.file_id, s.offset, s.len))
        .collect();
    if v.is_empty() {
        tracing::debug!("block on stream {stream} failed verification; its files are settled");
        return Ok(());
    }
    tracing::warn!(
        "block on stream {stream} failed verification; asking for {} segments again",
        v.len()
    );
    stats.resends.fetch_add(v.len() as u64, Ordering::Relaxed);
    ctl.send(&Control::Resend(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settles_once_and_scans_only_after_progress_or_a_pause() {
        let mut w = SettleWatch::new();
        let mut scans = 0;
        // First look scans (progress unknown before).
        assert!(!w.look(0, || {
            scans += 1;
            false
        }));
        assert_eq!(scans, 1);
        // No progress: no scan for 39 looks, the 40th scans.
        for _ in 0..IDLE_SCAN - 1 {
            assert!(!w.scan_due(0));
        }
        assert!(w.scan_due(0));
        // Progress: scan at once.
        assert!(w.scan_due(1));
        // Settled: true exactly once, never scanning again.
        assert!(w.look(2, || true));
        assert!(w.settled);
        assert!(!w.look(3, || panic!("no scan once settled")));
    }

    #[test]
    fn the_last_records_scan_at_once_without_progress() {
        // A windowed no-change sync: the counters never move (every file
        // unchanged), the records end after the first look.
        let mut w = SettleWatch::new();
        assert!(!w.look(0, || false));
        assert!(!w.scan_due(0));
        w.rescan();
        assert!(w.look(0, || true));
    }
}
