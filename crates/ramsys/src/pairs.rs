//! Third-party transfers, daemon to daemon (issue 19, docs/SITE.md
//! "Between two sites"; GridFTP's third-party and striped transfers):
//! `ramsys cp -r ramsys://A/SRC ramsys://B/DST` asks the source daemon A
//! to push SRC to its site peer B (engine::relay; this process only
//! follows the progress), and with `--stripe` and lists of equal length,
//! `ramsys://A1,A2,A3/SRC ramsys://B1,B2,B3/DST`, pairs Ai with Bi and
//! runs one relay per pair at once, each moving its share of the files
//! (every Ai lists the shared SRC and deals it the same way,
//! request::shares; with `--split-sources` each Ai sends all it holds),
//! with one summary and a `stripes` entry per pair. Each pair's source
//! daemon says which big files its share held pieces of and which its
//! sink placed (RelayPlaced), and a file no sink placed fails the push
//! as for a striped push from here (stripe::fail_unplaced, issue 36).

use std::sync::Arc;
use std::time::Duration;

use ramsys_engine::daemon::site::redirect::{score, FRESH_MS};
use ramsys_engine::roles::client::{relay, Relayed, Remote};
use ramsys_engine::transport::tcp::Tcp;
use ramsys_engine::types::stats::FailedPath;
use ramsys_engine::{show, EngineError, Report, Stats};
use ramsys_proto::control::{Relay, RelayReport, Share};

use crate::stripe::{fail_unplaced, Outcomes, Pieced, Stripe};

/// A third-party transfer as the agent resolved it.
pub struct Job {
    /// Source daemons (one, or the `A1,A2,A3` list with `stripe`).
    pub sources: Vec<String>,
    /// Sink daemons, as many as sources.
    pub sinks: Vec<String>,
    /// The request every pair gets (its `sink` and `share` set per pair).
    pub relay: Relay,
    pub key: Vec<u8>,
    pub connect_timeout: Duration,
    /// Longest silence from a source daemon (it reports every 500 ms).
    pub idle: Duration,
    /// Each source daemon sends all it holds under SRC (no shares).
    pub split: bool,
    pub json: bool,
}

/// Split `A,B,C` into its daemons.
pub fn daemons(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// One pair's relay; its outcome as the engine reports it. A pair of a
/// striped transfer asks what its sink placed.
fn one(
    src: &str,
    relay_req: Relay,
    key: Vec<u8>,
    timeout: Duration,
    idle: Duration,
    stats: &Stats,
) -> Result<Relayed, EngineError> {
    let remote = Remote {
        transport: Arc::new(Tcp {
            socket_buffer: None,
        }),
        addr: src.to_string(),
        key,
        connect_timeout: timeout,
        user: None,
    };
    let sink = relay_req.sink.clone();
    let at = |m: String| EngineError::Local(format!("{src} -> {sink}: {m}"));
    let ask = relay_req.share.is_some();
    match relay(&remote, relay_req, stats, idle, ask) {
        Ok(r) if r.0.error.is_empty() => Ok(r),
        Ok((r, _)) => Err(at(r.error)),
        Err(EngineError::Refused(m)) => Err(at(format!("refused: {m}"))),
        Err(EngineError::PeerClosed) => Err(at(format!(
            "the source daemon {src} closed the connection (stopped?)"
        ))),
        Err(e) => Err(at(e.to_string())),
    }
}

/// A RelayDone as the summary's report.
fn to_report(r: &RelayReport) -> Report {
    Report {
        files: r.files,
        bytes: r.bytes,
        failed: r
            .failures
            .iter()
            // Over the wire only as text: the proto's one reading of it.
            .map(|f| FailedPath {
                vanished: f.reason_says_vanished(),
                ..FailedPath::new(show(&f.path), f.reason.clone())
            })
            .collect(),
        peer_cpu_s: (r.sink_cpu_s >= 0.0).then_some(r.sink_cpu_s),
        streams: r.streams,
        block_size: r.block_size,
        unchanged: r.unchanged,
        // Only the failures' text comes back: any but a vanished path is
        // taken as the source's (the sink's own errors may have let its
        // --delete run; RelayReport does not say).
        source_incomplete: r.failures.iter().any(|f| !f.reason_says_vanished()),
        ..Default::default()
    }
}

/// One pair, no striping: the relay with progress shown as for a push.
pub fn single(job: Job, stats: Arc<Stats>) -> Result<Report, EngineError> {
    let mut req = job.relay.clone();
    req.sink = job.sinks[0].clone();
    let progress = crate::progress::Progress::start(stats.clone(), job.json);
    let r = one(
        &job.sources[0],
        req,
        job.key,
        job.connect_timeout,
        job.idle,
        &stats,
    );
    progress.finish();
    r.map(|(r, _)| to_report(&r))
}

/// The pairs whose two daemons answer a status query (one line for each
/// pair that does not), with each pair's weight: the smaller of its two
/// daemons' `1 / (1 + score)` in the site view of the first source
/// (sink) daemon that answers (stripe.rs's rule), 1 when not in a view.
fn answering(job: &Job) -> Vec<(String, String, f64)> {
    let t = job.connect_timeout;
    let mut views = [None, None];
    let mut up = Vec::new();
    for (a, b) in job.sources.iter().zip(&job.sinks) {
        let qa = crate::status::query(a, &job.key, t);
        let qb = qa
            .as_ref()
            .ok()
            .map(|_| crate::status::query(b, &job.key, t));
        match (qa, qb) {
            (Ok(sa), Some(Ok(sb))) => {
                views[0].get_or_insert(sa.site);
                views[1].get_or_insert(sb.site);
                up.push((a.clone(), b.clone()));
            }
            (Err(e), _) | (_, Some(Err(e))) => {
                if !job.json {
                    say!("ramsys: pair {a} -> {b} does not answer ({e:#}); striping without it");
                }
            }
            (Ok(_), None) => unreachable!("a sink is queried when its source answered"),
        }
    }
    let w = |d: &str, v: &Option<Vec<ramsys_engine::daemon::status::SiteMember>>| {
        v.iter()
            .flatten()
            .find(|m| m.addr == d && m.age_ms <= FRESH_MS && m.error.is_none())
            .map_or(1.0, |m| 1.0 / (1.0 + score(m)))
    };
    up.into_iter()
        .map(|(a, b)| {
            let weight = w(&a, &views[0]).min(w(&b, &views[1]));
            (a, b, weight)
        })
        .collect()
}

/// Striped over pairs: every pair at once, one merged report (a failed
/// pair is one failed entry naming it) and each pair's outcome.
pub fn striped(job: Job) -> anyhow::Result<(Result<Report, EngineError>, Vec<Stripe>)> {
    anyhow::ensure!(
        job.sources.len() == job.sinks.len(),
        "--stripe between two sites pairs the i-th source daemon with the i-th sink: \
         {} source daemons, {} sink daemons",
        job.sources.len(),
        job.sinks.len()
    );
    let pairs = answering(&job);
    anyhow::ensure!(
        !pairs.is_empty(),
        "none of the pairs {} -> {} answered",
        job.sources.join(","),
        job.sinks.join(",")
    );
    let weights: Vec<u32> = pairs
        .iter()
        .map(|p| (p.2 * 1000.0).round().clamp(1.0, 1e6) as u32)
        .collect();
    let results = std::thread::scope(|s| {
        let hs: Vec<_> = pairs
            .iter()
            .enumerate()
            .map(|(i, (a, b, _))| {
                let mut req = job.relay.clone();
                req.sink = b.clone();
                // Every pair must read DST the same way whichever session
                // reaches it first: rsync's rule (DST receives SRC, made
                // when missing), not cp's (a missing DST becomes the copy,
                // which only the first session would see missing).
                req.flags |= ramsys_engine::request::sync::flags::SYNC;
                req.share = (!job.split).then(|| Share {
                    index: i as u16,
                    weights: weights.clone(),
                    // Big files in pieces (issue 19), the same for every pair.
                    pieces: ramsys_engine::request::shares::PIECE_ALIGN as u32,
                });
                let key = job.key.clone();
                let (t, idle) = (job.connect_timeout, job.idle);
                s.spawn(move || one(a, req, key, t, idle, &Stats::default()))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("pair thread"))
            .collect::<Vec<_>>()
    });
    let mut outcomes = Outcomes::default();
    let mut stripes = Vec::new();
    let mut listings = Vec::new();
    let mut pieced = Vec::new();
    for ((a, b, _), r) in pairs.iter().zip(results) {
        pieced.push(pair_pieced(&r));
        let mut s = Stripe {
            daemon: a.clone(),
            sink: Some(b.clone()),
            share_files: 0,
            share_bytes: 0,
            files: 0,
            bytes: 0,
            error: None,
        };
        let r = r.map(|(rep, _)| {
            (s.share_files, s.share_bytes) = (rep.share_files, rep.share_bytes);
            if !job.split {
                listings.push(rep.listing);
            }
            to_report(&rep)
        });
        outcomes.add(&mut s, r);
        stripes.push(s);
    }
    let share = |s: &Stripe| {
        let sink = s.sink.as_deref().unwrap_or_default();
        format!("(share of {} -> {sink})", s.daemon)
    };
    let mut result = outcomes.report(&stripes, share).map(|mut t| {
        // Every pair dealt its share from its own listing of the shared
        // tree: if they differ, a file may be in no share.
        if listings.windows(2).any(|w| w[0] != w[1]) {
            t.failed.push(FailedPath::new(
                "(shares)",
                "the source daemons listed different trees under the source \
                 (not one shared file system, or it changed meanwhile; \
                 --split-sources if each holds its own part); \
                 run again with --resume to finish",
            ));
        }
        t
    });
    fail_unplaced(&mut result, &pieced);
    Ok((result, stripes))
}

/// What a pair said of its share's big files in pieces. A pair whose
/// relay failed, or whose source daemon of before sent no RelayPlaced
/// (which files it cut is unknown), makes nothing judged, as a failed
/// session does in a striped push from here.
fn pair_pieced(r: &Result<Relayed, EngineError>) -> Pieced {
    match r {
        Ok((_, Some(p))) => Pieced {
            cut: p.cut.clone(),
            placed: Some(p.placed.clone()),
        },
        _ => Pieced {
            cut: Vec::new(),
            placed: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ramsys_proto::control::RelayPlaced;

    fn relayed(placed: Option<(&[&str], Option<&[&str]>)>) -> Result<Relayed, EngineError> {
        let v = |l: &[&str]| l.iter().map(|s| s.as_bytes().to_vec()).collect();
        let done = RelayReport {
            files: 0,
            bytes: 0,
            unchanged: 0,
            streams: 1,
            block_size: 1 << 20,
            failures: vec![],
            sink_cpu_s: -1.0,
            share_files: 0,
            share_bytes: 0,
            listing: 0,
            error: String::new(),
        };
        let p = placed.map(|(cut, placed)| RelayPlaced {
            cut: v(cut),
            placed: placed.map(v),
        });
        Ok((done, p))
    }

    /// The failed paths of a push whose pairs said `rs`.
    fn verdict(rs: &[Result<Relayed, EngineError>]) -> Vec<String> {
        let pieced: Vec<Pieced> = rs.iter().map(pair_pieced).collect();
        let mut r = Ok(Report::default());
        fail_unplaced(&mut r, &pieced);
        r.unwrap().failed.into_iter().map(|f| f.path).collect()
    }

    /// Between two sites a big file no pair's sink placed is failed, one
    /// named by a pair's sink is not; a pair whose source daemon is of
    /// before (no RelayPlaced: which files it cut is unknown) or whose
    /// relay failed makes nothing judged; a sink of before leaves its
    /// files unjudged.
    #[test]
    fn a_pair_of_before_is_not_judged() {
        let a = relayed(Some((&["src/big", "src/huge"], Some(&["src/huge"]))));
        let b = relayed(Some((&["src/big"], Some(&[]))));
        assert_eq!(verdict(&[a, b]), vec!["src/big"]);
        let a = relayed(Some((&["src/big"], Some(&[]))));
        assert!(verdict(&[a, relayed(None)]).is_empty());
        let a = relayed(Some((&["src/big"], Some(&[]))));
        let failed = Err(EngineError::local("A -> B: refused"));
        assert!(verdict(&[a, failed]).is_empty());
        let a = relayed(Some((&["src/big"], None)));
        let b = relayed(Some((&["src/big", "src/x"], Some(&[]))));
        assert_eq!(verdict(&[a, b]), vec!["src/x"]);
    }
}
