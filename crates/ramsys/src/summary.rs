//! The end of a run: the engine's report with what the run adds (redirect,
//! stripes, transport, link faults, memory) as one human line or one JSON
//! object, and the exit code (split from agent.rs, issue 37).

use std::io::Write as _;

use ramsys_engine::{Report, Stats};

/// What a run adds to the summary beyond the engine's report.
#[derive(Default)]
pub(crate) struct Extra {
    /// A busy daemon sent the session to a peer (issue 19).
    pub(crate) redirect: Option<crate::pick::Redirect>,
    /// `--stripe`: each daemon's share.
    pub(crate) stripes: Option<Vec<crate::stripe::Stripe>>,
    /// What carried the data (issue 35).
    pub(crate) transport: Carried,
}

/// What carried a run's data, as the summary names it (issue 35).
#[derive(Default)]
pub(crate) struct Carried {
    /// `--transport`.
    pub(crate) requested: ramsys_engine::transport::rawlink::Mode,
    /// `auto` found no raw channel: why.
    pub(crate) fallback: Option<String>,
    /// Both ends on this host (the in-process sink; links on loopback).
    pub(crate) local: bool,
}

impl Carried {
    /// "local", or the data links' kinds ("tcp", "raw", "ssh"; several
    /// joined with "+"); a run without links of its own (daemon to
    /// daemon) is "tcp".
    pub(crate) fn used(&self, rep: &Report) -> String {
        if self.local {
            return "local".into();
        }
        let mut kinds: Vec<&str> = rep.links.iter().map(|l| l.kind).collect();
        kinds.sort_unstable();
        kinds.dedup();
        if kinds.is_empty() {
            "tcp".into()
        } else {
            kinds.join("+")
        }
    }

    pub(crate) fn requested(&self) -> &'static str {
        use ramsys_engine::transport::rawlink::Mode;
        match self.requested {
            Mode::Tcp => "tcp",
            Mode::Raw => "raw",
            Mode::Auto => "auto",
        }
    }
}

/// The summary (or the JSON line), and the exit code.
pub(crate) fn report(
    result: Result<Report, ramsys_engine::EngineError>,
    stats: &Stats,
    wall: f64,
    cpu: f64,
    json: bool,
    sync: u32,
    extra: Extra,
) -> anyhow::Result<i32> {
    match result {
        Ok(rep) => {
            let resent = stats.resends.load(std::sync::atomic::Ordering::Relaxed);
            if resent > 0 && !json {
                say!("ramsys: {resent} segments failed verification in flight and were sent again");
            }
            let setid = stats
                .setid_dropped
                .load(std::sync::atomic::Ordering::Relaxed);
            if setid > 0 {
                // A deliberate difference from rsync -p (issue 34; docs/SYNC.md).
                eprintln!(
                    "ramsys: note: set-user-ID/set-group-ID bits not kept on {} (they are kept \
                     with -a only; rsync -p keeps them; docs/SYNC.md \"Set-ID bits\")",
                    count(setid, "file", "files")
                );
            }
            let faults = LinkFaults::of(stats);
            if faults.lost > 0 && !json {
                say!(
                    "ramsys: {} data links lost, {} replaced ({} failed reconnect attempts)",
                    faults.lost,
                    faults.replaced,
                    faults.retries
                );
            }
            let run = RunFacts {
                wall,
                cpu,
                resent,
                faults,
                extra,
                memory: Memory::of(stats),
            };
            Ok(summarize(&rep, &run, json, sync))
        }
        Err(e) => {
            if json {
                // What moved before the failure, as the progress line had it.
                let bytes = stats.bytes.load(std::sync::atomic::Ordering::Relaxed);
                let mb_s = bytes as f64 / 1e6 / wall.max(1e-9);
                let line = serde_json::json!({
                    "event": "summary", "ok": false, "error": e.to_string(),
                    "files": stats.files.load(std::sync::atomic::Ordering::Relaxed),
                    "bytes": bytes, "wall_s": wall, "mb_s": mb_s, "cpu_s": cpu, "failed": [],
                    "redirect": extra.redirect, "stripes": extra.stripes,
                });
                println!("{line}");
            }
            Err(anyhow::anyhow!(e))
        }
    }
}

/// Data links lost and replaced during the transfer (engine::relink).
pub(crate) struct LinkFaults {
    lost: u64,
    replaced: u64,
    retries: u64,
}

impl LinkFaults {
    fn of(s: &Stats) -> LinkFaults {
        use std::sync::atomic::Ordering::Relaxed;
        LinkFaults {
            lost: s.links_lost.load(Relaxed),
            replaced: s.links_replaced.load(Relaxed),
            retries: s.link_retries.load(Relaxed),
        }
    }
}

/// What the summary says of the run beyond the engine's report.
pub(crate) struct RunFacts {
    wall: f64,
    cpu: f64,
    resent: u64,
    faults: LinkFaults,
    extra: Extra,
    memory: Memory,
}

/// This process's memory for the summary (issue 36): its peak RSS, the
/// per-file state it accounted, and the peak per file of the tree.
pub(crate) struct Memory {
    peak_rss: u64,
    meta_bytes: u64,
    files: u64,
}

impl Memory {
    fn of(s: &Stats) -> Memory {
        use std::sync::atomic::Ordering::Relaxed;
        Memory {
            peak_rss: ramsys_engine::types::stats::process_rss().1,
            meta_bytes: s.meta_bytes.load(Relaxed),
            files: s.total_files.load(Relaxed),
        }
    }
}

pub(crate) fn summarize(rep: &Report, run: &RunFacts, json: bool, sync: u32) -> i32 {
    let RunFacts {
        wall,
        cpu,
        resent,
        ref faults,
        ..
    } = *run;
    let mb_s = rep.bytes as f64 / 1e6 / wall.max(1e-9);
    let dry = sync & ramsys_engine::request::sync::flags::DRY_RUN != 0;
    let carried = &run.extra.transport;
    let transport = carried.used(rep);
    if json {
        let mut line = serde_json::json!({
            "event": "summary",
            "ok": rep.failed.is_empty(),
            "files": rep.files,
            "bytes": rep.bytes,
            "wall_s": wall,
            "mb_s": mb_s,
            "files_s": rep.files as f64 / wall.max(1e-9),
            "cpu_s": cpu,
            "peer_cpu_s": rep.peer_cpu_s,
            "streams": rep.streams,
            "stream_choice": rep.stream_choice,
            "congestion": ramsys_engine::transport::tcp::congestion(),
            "block_size": rep.block_size,
            "failed": rep.failed,
            "resent": resent,
            "links_lost": faults.lost,
            "links_replaced": faults.replaced,
            "link_retries": faults.retries,
            "send_path": rep.send_path,
            "handoffs": rep.handoffs,
            "zerocopy_blocks": rep.zerocopy_blocks,
            "storage": rep.storage,
            "redirect": run.extra.redirect,
            // What carried the data (issue 35): "local", "tcp", "raw",
            // "ssh"; what was asked; why `auto` did not use raw channels;
            // each data link with its kind.
            "transport": transport,
            "transport_requested": carried.requested(),
            "transport_fallback": carried.fallback,
            "links": rep.links,
            // Memory (issue 36): this process's peak RSS, the per-file
            // state it accounted, and peak RSS per file of the tree.
            "peak_rss_bytes": run.memory.peak_rss,
            "meta_bytes": run.memory.meta_bytes,
            "rss_bytes_per_file": run.memory.peak_rss / run.memory.files.max(1),
        });
        if let Some(s) = &run.extra.stripes {
            line["stripes"] = serde_json::json!(s);
        }
        if sync & ramsys_engine::request::sync::COMPARE != 0 {
            // bytes = file data sent, files = files whose data was sent,
            // unchanged = files skipped (issue 10).
            line["unchanged"] = rep.unchanged.into();
            line["deleted"] = rep.deleted.len().into();
            line["deletions_skipped"] = deletions_skipped(rep, sync).into();
            line["dry_run"] = dry.into();
            if dry {
                line["would_send"] = serde_json::json!(rep.planned);
                line["would_delete"] = serde_json::json!(rep.deleted);
            }
        }
        let mut o = std::io::stdout().lock();
        let _ = writeln!(o, "{line}");
    } else {
        for f in &rep.failed {
            say!("ramsys: failed: {}: {}", f.path, f.reason);
        }
        if let Some(why) = &carried.fallback {
            eprintln!(
                "ramsys: --transport auto: raw channels not used ({why}); data went over TCP"
            );
        }
        if dry {
            for p in &rep.planned {
                tell!("would send {p}");
            }
            for p in &rep.deleted {
                tell!("would delete {p}");
            }
            println!(
                "dry run: {} would be sent, {} unchanged, {} would be deleted",
                count(rep.planned.len() as u64, "file", "files"),
                rep.unchanged,
                count(rep.deleted.len() as u64, "entry", "entries")
            );
            return i32::from(!rep.failed.is_empty());
        }
        println!("{}", human_line(rep, run, sync, &transport));
    }
    if rep.failed.is_empty() {
        0
    } else {
        1
    }
}

/// --delete was asked for and the source could not list or read all it
/// was asked for (any error but a vanished path, rsync's IOERR_GENERAL):
/// the sink deleted nothing (sink::tree::sync_epilogue). The sink's own
/// errors do not stop it, as rsync's receiver's do not.
fn deletions_skipped(rep: &Report, sync: u32) -> bool {
    sync & ramsys_engine::request::sync::flags::DELETE != 0 && rep.source_incomplete
}

/// `n thing` or `n things`.
fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The one summary line of a run (a sync's counts on the same line; issue
/// 35), e.g. `copied 1 file, 1.9 MiB in 0.50 s (3.8 MiB/s) over tcp (4
/// streams), cpu 0.01 s; 2 unchanged, 1 deleted`.
fn human_line(rep: &Report, run: &RunFacts, sync: u32, transport: &str) -> String {
    use ramsys_engine::request::sync::{flags::DELETE, COMPARE};
    // Sizes and rates in ramsys_units' one form (issue 37).
    let rate = ramsys_units::format_rate((rep.bytes as f64 / run.wall.max(1e-9)) as u64);
    let over = match transport {
        "local" => "locally".to_string(),
        t if rep.streams > 0 => format!(
            "over {t} ({})",
            count(rep.streams as u64, "stream", "streams")
        ),
        t => format!("over {t}"),
    };
    let mut line = format!(
        "copied {}, {} in {:.2} s ({rate}) {over}, cpu {:.2} s",
        count(rep.files, "file", "files"),
        ramsys_units::format_size(rep.bytes),
        run.wall,
        run.cpu,
    );
    let mut tail = Vec::new();
    if sync & COMPARE != 0 {
        tail.push(format!("{} unchanged", rep.unchanged));
    }
    if deletions_skipped(rep, sync) {
        // rsync's "IO error encountered -- skipping file deletion": an
        // unreadable source directory must not empty its copy.
        tail.push("nothing deleted after errors".to_string());
    } else if sync & DELETE != 0 || !rep.deleted.is_empty() {
        tail.push(format!("{} deleted", rep.deleted.len()));
    }
    if !rep.failed.is_empty() {
        tail.push(format!("{} failed", rep.failed.len()));
    }
    if !tail.is_empty() {
        line.push_str("; ");
        line.push_str(&tail.join(", "));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(transport: Carried) -> RunFacts {
        RunFacts {
            wall: 0.5,
            cpu: 0.25,
            resent: 0,
            faults: LinkFaults {
                lost: 0,
                replaced: 0,
                retries: 0,
            },
            extra: Extra {
                transport,
                ..Default::default()
            },
            memory: Memory {
                peak_rss: 0,
                meta_bytes: 0,
                files: 0,
            },
        }
    }

    #[test]
    fn one_summary_line_in_english_naming_the_transport() {
        use ramsys_engine::request::sync::flags::{DELETE, SYNC};
        use ramsys_engine::types::stats::LinkDesc;
        let link = |kind| LinkDesc {
            local: "a".into(),
            peer: "b".into(),
            kind,
        };
        let mut rep = Report {
            files: 1,
            bytes: 2_000_000,
            streams: 4,
            unchanged: 3,
            deleted: vec!["x".into()],
            links: vec![link("raw"), link("raw")],
            ..Default::default()
        };
        let run = facts(Carried::default());
        let t = run.extra.transport.used(&rep);
        assert_eq!(t, "raw");
        assert_eq!(
            human_line(&rep, &run, SYNC | DELETE, &t),
            "copied 1 file, 1.9 MiB in 0.50 s (3.8 MiB/s) over raw (4 streams), cpu 0.25 s; \
             3 unchanged, 1 deleted"
        );
        rep.files = 2;
        rep.deleted.clear();
        rep.links = vec![link("tcp")];
        let t = run.extra.transport.used(&rep);
        assert_eq!(
            human_line(&rep, &run, SYNC, &t),
            "copied 2 files, 1.9 MiB in 0.50 s (3.8 MiB/s) over tcp (4 streams), cpu 0.25 s; \
             3 unchanged"
        );
        assert_eq!(human_line(&rep, &run, 0, &t).matches("copied").count(), 1);
        assert!(!human_line(&rep, &run, 0, &t).contains(';'));
        let local = facts(Carried {
            local: true,
            ..Default::default()
        });
        assert_eq!(local.extra.transport.used(&rep), "local");
        assert!(human_line(&rep, &local, 0, "local").contains(" locally, "));
        rep.links = vec![link("raw"), link("tcp")];
        assert_eq!(run.extra.transport.used(&rep), "raw+tcp");
        assert_eq!(count(1, "entry", "entries"), "1 entry");
        assert_eq!(count(0, "entry", "entries"), "0 entries");
    }

    /// "deletions skipped" follows the typed flag the end that built the
    /// report set (the source's listing or reads incomplete), not the
    /// failures: a sink's own errors do not stop its --delete.
    #[test]
    fn deletions_skipped_only_when_the_source_was_incomplete() {
        use ramsys_engine::request::sync::flags::{DELETE, SYNC};
        use ramsys_engine::types::stats::FailedPath;
        let enoent = "No such file or directory (os error 2)";
        let mut rep = Report {
            failed: vec![FailedPath::new("dst/d/f", enoent)],
            ..Default::default()
        };
        assert!(!deletions_skipped(&rep, SYNC | DELETE));
        rep.source_incomplete = true;
        assert!(deletions_skipped(&rep, SYNC | DELETE));
        assert!(
            !deletions_skipped(&rep, SYNC),
            "no --delete, nothing skipped"
        );
    }
}
