//! The end of the source's payload phase: the report on the sink's
//! Complete, or the Abort that stops both ends, then one teardown.

use super::*;

impl Payload<'_> {
    /// The session's end: the report on the sink's Complete, or on an
    /// error the Abort that stops both ends; then the teardown.
    pub(in crate::roles::source) fn finish(
        mut self,
        verdict: Result<Complete, EngineError>,
        mut failures: Vec<FailedPath>,
    ) -> Result<Report, EngineError> {
        // A windowed session's readers wait for generations until their
        // queues close: closed here, on success and on error alike; the
        // scan's failures are for the report.
        if let Some(walk) = self.win.take().and_then(|mut w| w.take_walk()) {
            failures.extend(walk.failures);
        }
        // Senders must see their queue close, on success and on error alike.
        self.resends.tx = None;
        let outcome = match verdict {
            Ok(c) => Ok(self.report(c, failures)),
            Err(e) => {
                self.abort(&e);
                Err(e)
            }
        };
        self.teardown(outcome.is_err());
        outcome
    }

    /// The report: the sink's verdict and what this end saw.
    pub(super) fn report(&mut self, c: Complete, mut failed: Vec<FailedPath>) -> Report {
        let f = &mut self.facts;
        failed.append(&mut f.local_failed);
        // The sink reports files the source failed too; keep one line each
        // (this end's, which knows whether its path vanished). The rest
        // are the sink's own, and each of those stopped its --delete.
        for x in c.failures {
            let p = show(&x.path);
            if !failed.iter().any(|y| y.path.ends_with(&p)) {
                failed.push(FailedPath::new(p, x.reason));
            }
        }
        let planned = f.plan.as_ref().map_or(Vec::new(), |p| {
            // Wire paths (entry ids index the entry list).
            p.planned
                .iter()
                .filter_map(|&i| f.entries.get(self.files[i].id as usize))
                .map(|e| show(&e.path))
                .collect()
        });
        Report {
            files: c.files,
            bytes: c.bytes,
            failed,
            peer_cpu_s: Some(c.cpu_s),
            streams: f.streams,
            block_size: f.block_size as u32,
            links: std::mem::take(&mut f.links),
            send_path: Some(f.path),
            handoffs: self.stats.handoffs.load(Ordering::Relaxed),
            zerocopy_blocks: self.stats.zerocopy_blocks.load(Ordering::Relaxed),
            storage: f.read_storage.usage(false),
            stream_choice: None,
            growth: self.grow.as_ref().map(|a| Growth {
                stages: a.grower.stages.clone(),
                stopped: a.grower.stopped.clone(),
            }),
            unchanged: f.plan.as_ref().map_or(0, |p| p.unchanged),
            deleted: std::mem::take(&mut f.deleted),
            planned,
        }
    }

    /// Stop both ends on an error: the sink hears why, every link shuts.
    pub(super) fn abort(&mut self, e: &EngineError) {
        self.abort.store(true, Ordering::Release);
        let reason = e.to_string();
        let _ = self.ctl.send(&Control::Abort { reason });
        for h in &self.senders.shutdown {
            h.shutdown_both();
        }
        if let Some(l) = &self.senders.inline {
            // Wake readers waiting for a link that will not come.
            l.close();
        }
    }

    /// Every thread joined, every link closed, the buffer share returned,
    /// in this order (each step waits for what the one before released).
    pub(super) fn teardown(self, failed: bool) {
        let Payload {
            ctl,
            filled,
            pool,
            share,
            events,
            streams,
            senders,
            resends,
            mut progress,
            jobs,
            ..
        } = self;
        // Drain so no reader stays blocked on a full queue, then join all.
        if failed {
            while progress.readers_left > 0 {
                while let Ok(b) = filled.try_recv() {
                    pool.put(b);
                }
                if events
                    .readers_done
                    .recv_timeout(Duration::from_millis(20))
                    .is_ok()
                {
                    progress.readers_left -= 1;
                }
            }
        }
        let SenderSet {
            make,
            closers,
            kept,
            inline,
            extra,
            ..
        } = senders;
        drop(make);
        for j in jobs {
            let _ = j.join();
        }
        for j in extra {
            let _ = j.join();
        }
        // Blocks still queued when the senders stopped (a failed session)
        // go back to the pool, or returning the share waits for them in vain.
        while let Ok(b) = filled.try_recv() {
            pool.put(b);
        }
        drop(filled);
        drop(resends);
        drop(streams);
        drop(closers);
        // The inline links hold a reference to the buffer share.
        drop(inline);
        ctl.link.shutdown_both();
        drop(kept);
        drop(pool);
        drop(share);
    }
}
