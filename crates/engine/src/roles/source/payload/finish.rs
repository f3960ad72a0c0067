//! The end of the source's payload phase: the report on the sink's
//! Complete, or the Abort that stops both ends, then one teardown.

use super::*;
use ramsys_proto::control::Failure;

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
        if let Some(mut w) = self.win.take() {
            self.facts.unchanged = w.unchanged;
            self.facts.planned = std::mem::take(&mut w.planned);
            if let Some(walk) = w.take_walk() {
                super::super::incomplete(&self.stats, &walk.failures);
                failures.extend(walk.failures);
            }
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
        let sinks = sink_only_failures(&failed, c.failures);
        failed.extend(sinks);
        let planned = f.plan.as_ref().map_or(std::mem::take(&mut f.planned), |p| {
            let ids = p.planned.iter().map(|&i| self.files[i].id);
            dry_list(&f.names, ids, &p.made, &mut Default::default())
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
            unchanged: f.plan.as_ref().map_or(f.unchanged, |p| p.unchanged),
            deleted: std::mem::take(&mut f.deleted),
            planned,
            source_incomplete: self.stats.source_incomplete.load(Ordering::Relaxed),
            placed: f.placed.take(),
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
            keep,
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
        // A kept link carries the next session (run_source_kept).
        if failed || !keep {
            ctl.link.shutdown_both();
        }
        drop(kept);
        drop(pool);
        drop(share);
    }
}

/// The sink's failures that are not echoes of this end's own: the sink
/// reports files the source failed too; keep one line each (this end's,
/// which knows whether its path vanished). The sink names a path from the
/// source root, this end from where it reads: a line is an echo when one
/// of ours ends with it at a `/`, looked up in a set of our paths'
/// suffixes (10,000 scan failures echoed must not cost 10^8 comparisons).
/// The sink's count of the scan failures it did not keep is an echo too:
/// this end lists every one. The rest are the sink's own, and each of
/// those stopped its --delete.
fn sink_only_failures(ours: &[FailedPath], theirs: Vec<Failure>) -> Vec<FailedPath> {
    let suffixes: std::collections::HashSet<&str> = ours
        .iter()
        .flat_map(|y| {
            let p = y.path.as_str();
            std::iter::once(p).chain(p.match_indices('/').map(move |(i, _)| &p[i + 1..]))
        })
        .collect();
    theirs
        .into_iter()
        .filter(|x| !x.counts_more_scan_failures())
        .map(|x| (show(&x.path), x.reason))
        .filter(|(p, _)| !suffixes.contains(p.as_str()))
        .map(|(p, reason)| FailedPath::new(p, reason))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(path: &str, reason: &str) -> Failure {
        Failure {
            path: path.as_bytes().to_vec(),
            reason: reason.into(),
        }
    }

    #[test]
    fn echoes_of_our_failures_are_left_out() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let ours = vec![
            FailedPath::io("/src/top/gone", io.to_string(), &io),
            FailedPath::new("/src/top/d/bad", "Permission denied"),
        ];
        let theirs = vec![
            failure("top/gone", "No such file or directory (os error 2)"),
            failure("d/bad", "Permission denied"),
            Failure::more_scan_failures(12),
            // The sink's own: a file it could not write, and a real file
            // named "(more)" whose reason is an OS error.
            failure("top/full", "No space left on device (os error 28)"),
            failure("(more)", "Permission denied (os error 13)"),
            // A suffix that is not at a '/' is not an echo.
            failure("one", "Input/output error (os error 5)"),
        ];
        let left: Vec<String> = sink_only_failures(&ours, theirs)
            .into_iter()
            .map(|f| f.path)
            .collect();
        assert_eq!(left, ["top/full", "(more)", "one"]);
    }

    #[test]
    fn echo_filter_is_not_quadratic() {
        let ours: Vec<FailedPath> = (0..20_000)
            .map(|i| FailedPath::new(format!("/src/t/d{}/f{i}", i % 100), "x"))
            .collect();
        let theirs: Vec<Failure> = (0..20_000)
            .map(|i| failure(&format!("t/d{}/f{i}", i % 100), "x"))
            .chain([Failure::more_scan_failures(10_000)])
            .collect();
        assert!(sink_only_failures(&ours, theirs).is_empty());
    }
}
