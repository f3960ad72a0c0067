//! Striped transfers (issue 19, docs/SITE.md "Striping"; GridFTP's striped
//! servers): `ramsys cp -r SRC ramsys://A,B,C/DST --stripe` splits one
//! transfer over every listed daemon that answers, each daemon receiving
//! its share of the files in a session of its own, all at once, into the
//! same DST on a file system they share. One summary for the whole.
//!
//! The agent lists the sources' regular files, cuts each big one into
//! pieces of whole MiB (request::shares::piece_size: a file of at least
//! 16 MiB and 1/16 of the transfer, ~1/32 of it per piece), and deals
//! files and pieces out largest first to the share that would finish first with it (LPT
//! scheduling, within 4/3 of the best split), each daemon's share sized
//! by its load in the site view (the scheduler reads site state), hard
//! links of one inode in one share (so they stay links); directories and every other entry go
//! to the first share. Each session is an ordinary push whose scan is
//! limited to its share by the `--files-from` selection (request::filter),
//! so a share's parent directories are created by whichever session gets
//! there first. The pieces of a big file meet in one temp file at the
//! sinks and the sink that verifies the last renames it into place
//! (engine roles::sink::bigfile); each sink names the files it saw in
//! place, and a file none named fails the push ([`unplaced`], issue 36).
//! A lost daemon fails its share only; running the same
//! command again with `--resume` over the daemons that answer sends what
//! is missing (the sinks compare with what DST holds).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ramsys_engine::daemon::site::redirect::{score, FRESH_MS};
use ramsys_engine::data::resources::ResourceConfig;
use ramsys_engine::request::shares;
use ramsys_engine::request::walk::Top;
use ramsys_engine::roles::client::{push, Remote};
use ramsys_engine::storage::fsops::{Confinement, Root};
use ramsys_engine::transport::tcp::Tcp;
use ramsys_engine::types::error::show;
use ramsys_engine::types::stats::FailedPath;
use ramsys_engine::{EngineError, EngineResources, Report, Stats, TransferOptions};

/// One striped push, as the agent resolved it.
pub struct Job {
    /// The listed daemons (`A,B,C`).
    pub daemons: Vec<String>,
    pub dest: Vec<u8>,
    pub tops: Vec<Top>,
    pub opts: TransferOptions,
    pub res_cfg: ResourceConfig,
    pub connect_timeout: Duration,
    pub key: Vec<u8>,
}

/// What one daemon's share did, for the summary.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Stripe {
    /// The daemon (the source daemon of a pair between two sites).
    pub daemon: String,
    /// Between two sites: the pair's sink daemon.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sink: Option<String>,
    /// Files and bytes of the share (planned).
    pub share_files: u64,
    pub share_bytes: u64,
    /// What the session reports it moved.
    pub files: u64,
    pub bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The daemons of the list that answer a status query (one line for each
/// that does not), each with its weight: from the site view of the first
/// that answers, `1 / (1 + score)` (site::redirect::score: CPU load plus a
/// quarter per task), so a fully busy daemon gets half the bytes of an idle
/// one; 1 for a daemon that is not in that view (daemons outside a site).
fn answering(
    daemons: &[String],
    key: &[u8],
    timeout: Duration,
    json: bool,
) -> (Vec<String>, Vec<f64>) {
    let mut view = None;
    let up: Vec<String> = daemons
        .iter()
        .filter(|d| match crate::status::query(d, key, timeout) {
            Ok(st) => {
                view.get_or_insert(st.site);
                true
            }
            Err(e) => {
                if !json {
                    say!("ramsys: {d} does not answer ({e:#}); striping without it");
                }
                false
            }
        })
        .cloned()
        .collect();
    let view = view.unwrap_or_default();
    let w = up
        .iter()
        .map(|d| {
            view.iter()
                .find(|m| &m.addr == d && m.age_ms <= FRESH_MS && m.error.is_none())
                .map_or(1.0, |m| 1.0 / (1.0 + score(m)))
        })
        .collect();
    (up, w)
}

/// Run the stripes; the merged report (a failed share is one failed
/// entry naming its daemon) and each stripe's outcome.
pub fn run(job: Job, json: bool) -> anyhow::Result<(Result<Report, EngineError>, Vec<Stripe>)> {
    let (daemons, weights) = answering(&job.daemons, &job.key, job.connect_timeout, json);
    anyhow::ensure!(
        !daemons.is_empty(),
        "none of the daemons {} answered",
        job.daemons.join(",")
    );
    let root = Path::new("/");
    let (files, others) = shares::list(root, &job.tops)?;
    // Big files are cut into pieces dealt like files (shares::piece_size),
    // except where the sink could not assemble them as asked: an archive
    // copy (attributes per file) or a dry run (nothing is written).
    let whole =
        job.opts.preserve != 0 || job.opts.sync & ramsys_engine::request::sync::flags::DRY_RUN != 0;
    let align = if whole { 0 } else { shares::PIECE_ALIGN };
    let shares = shares::deal(files, others, &weights, align);
    let n = daemons.len();
    let res_cfg = ResourceConfig {
        // The agent's --memory, split between the stripes.
        memory: (job.res_cfg.memory / n).max(job.res_cfg.buffer_size * 8),
        ..job.res_cfg.clone()
    };
    let mut handles = Vec::new();
    for (daemon, share) in daemons.iter().zip(shares) {
        let pieces = share.pieces();
        let cut: Vec<Vec<u8>> = share.pieces.keys().cloned().collect();
        let (paths, nfiles, nbytes) = (share.paths, share.files, share.bytes);
        if paths.is_empty() {
            continue; // more daemons than entries (an empty list selects all)
        }
        let mut opts = job.opts.clone();
        opts.pieces = pieces;
        // Every daemon must read DST the same way whichever session
        // reaches it first: rsync's rule (DST receives the sources, made
        // when missing), not cp's (a missing DST becomes the copy, which
        // only the first session would see missing).
        opts.sync |= ramsys_engine::request::sync::flags::SYNC;
        opts.select.files = paths.into();
        opts.select.files_recursive = false;
        let (daemon, key, tops, dest) = (
            daemon.clone(),
            job.key.clone(),
            job.tops.clone(),
            job.dest.clone(),
        );
        let (cfg, timeout) = (res_cfg.clone(), job.connect_timeout);
        let h = std::thread::Builder::new()
            .name("stripe".into())
            .spawn(move || {
                let r = one(&daemon, key, tops, dest, &opts, &cfg, timeout);
                (daemon, nfiles, nbytes, cut, r)
            })?;
        handles.push(h);
    }
    let mut outcomes = Outcomes::default();
    let mut stripes = Vec::new();
    let mut pieced = Vec::new();
    for h in handles {
        let (daemon, share_files, share_bytes, cut, r) = h.join().expect("stripe thread");
        pieced.push(Pieced {
            cut,
            placed: r.as_ref().ok().map(|rep| rep.placed.clone()),
        });
        let mut s = Stripe {
            daemon: daemon.clone(),
            sink: None,
            share_files,
            share_bytes,
            files: 0,
            bytes: 0,
            error: None,
        };
        outcomes.add(&mut s, r);
        stripes.push(s);
    }
    let share = |s: &Stripe| format!("(share of {}: {} files)", s.daemon, s.share_files);
    let mut report = outcomes.report(&stripes, share);
    fail_unplaced(&mut report, &pieced);
    Ok((report, stripes))
}

/// The failure of a big file whose pieces all verified but that no sink
/// placed (issue 36).
const UNPLACED: &str =
    "every piece verified but no sink placed the file; run again with --resume to place it";

/// A push (here, or between two sites: pairs::striped) that ended without
/// a failure fails each big file no sink placed ([`unplaced`]), one line
/// each. The lists only decide this verdict: nothing is read or written
/// by them (docs/SECURITY.md).
pub(crate) fn fail_unplaced(report: &mut Result<Report, EngineError>, pieced: &[Pieced]) {
    if let Ok(rep) = report {
        if rep.failed.is_empty() {
            for f in unplaced(pieced) {
                rep.failed.push(FailedPath::new(show(&f), UNPLACED));
            }
        }
    }
}

/// One share's big files cut into pieces, and what its session said of
/// them: None when it failed (or, between two sites, its relaying daemon
/// of before did not say which files it cut: then nothing is judged),
/// Some(None) when its sink sent no Placed (a sink of before), else the
/// record paths in place at its end.
pub(crate) struct Pieced {
    pub(crate) cut: Vec<Vec<u8>>,
    pub(crate) placed: Option<Option<Vec<Vec<u8>>>>,
}

/// The big files no sink placed (docs/SITE.md "A big file's blocks"):
/// every session ran, and none of those holding its pieces saw it in
/// place. A file is placed by the sink that verifies its last piece, or
/// found in place (a `--resume`, a run again), before that sink's
/// Complete, so a file every session is silent on is not in place. Not
/// judged when a session failed (the push fails anyway, its pieces named),
/// nor for a file whose pieces went to a sink of before (it cannot say).
fn unplaced(sessions: &[Pieced]) -> Vec<Vec<u8>> {
    use std::collections::BTreeMap;
    if sessions.iter().any(|s| s.placed.is_none()) {
        return Vec::new();
    }
    // Per file: judged (every sink of its pieces answers) and placed.
    let mut files: BTreeMap<&[u8], (bool, bool)> = BTreeMap::new();
    for s in sessions {
        let placed = s.placed.as_ref().and_then(|p| p.as_ref());
        for f in &s.cut {
            let e = files.entry(f).or_insert((true, false));
            match placed {
                None => e.0 = false,
                Some(p) => e.1 |= p.contains(f),
            }
        }
    }
    files
        .into_iter()
        .filter(|(_, (judged, placed))| *judged && !placed)
        .map(|(f, _)| f.to_vec())
        .collect()
}

/// The stripes' reports merged as they come in (here and
/// pairs::striped).
#[derive(Default)]
pub(crate) struct Outcomes {
    total: Option<Report>,
    first_err: Option<EngineError>,
}

impl Outcomes {
    /// One stripe's result: its counts into `s` and its report into the
    /// total, or its error into `s`.
    pub(crate) fn add(&mut self, s: &mut Stripe, r: Result<Report, EngineError>) {
        match r {
            Ok(rep) => {
                (s.files, s.bytes) = (rep.files, rep.bytes);
                self.total = Some(match self.total.take() {
                    None => rep,
                    Some(t) => merge(t, rep),
                });
            }
            Err(e) => {
                s.error = Some(e.to_string());
                self.first_err.get_or_insert(e);
            }
        }
    }

    /// The merged report, with one failed entry per failed stripe (named
    /// by `share`) to finish with --resume; the first error when no
    /// stripe ran.
    pub(crate) fn report(
        self,
        stripes: &[Stripe],
        share: impl Fn(&Stripe) -> String,
    ) -> Result<Report, EngineError> {
        let Some(mut t) = self.total else {
            return Err(self.first_err.expect("no stripe ran without an error"));
        };
        for s in stripes.iter().filter(|s| s.error.is_some()) {
            t.failed.push(FailedPath::new(
                share(s),
                format!(
                    "{}; run again with --resume to finish",
                    s.error.as_deref().unwrap_or_default()
                ),
            ));
        }
        Ok(t)
    }
}

/// One share: an ordinary push to `daemon` with the share's selection.
fn one(
    daemon: &str,
    key: Vec<u8>,
    tops: Vec<Top>,
    dest: Vec<u8>,
    opts: &TransferOptions,
    cfg: &ResourceConfig,
    timeout: Duration,
) -> Result<Report, EngineError> {
    let res = EngineResources::new(cfg).map_err(|e| EngineError::local(e.to_string()))?;
    let remote = Remote {
        transport: Arc::new(Tcp {
            socket_buffer: None,
        }),
        addr: daemon.to_string(),
        key,
        connect_timeout: timeout,
        user: None,
    };
    let root = Arc::new(
        Root::open(Path::new("/"), Confinement::None)
            .map_err(|e| EngineError::local(format!("cannot open /: {e}")))?,
    );
    let stats = Arc::new(Stats::default());
    let r = push(
        &remote,
        root.clone(),
        tops.clone(),
        dest.clone(),
        opts,
        &res,
        stats,
    );
    // A busy daemon may send its share to a peer (Control::Redirect):
    // follow it once, as a plain push does (crate::pick::follow).
    let Err(EngineError::Redirected { to, reason, .. }) = r else {
        return r;
    };
    crate::pick::follow(None, daemon, &to, &reason).map_err(EngineError::Local)?;
    // Said in every mode (issue 34): a share of the files goes elsewhere.
    say!(
        "ramsys: stripe: {}",
        crate::pick::redirect_line(daemon, &to, &reason)
    );
    let remote = Remote { addr: to, ..remote };
    let mut opts = opts.clone();
    opts.redirected_from = Some(daemon.to_string());
    let stats = Arc::new(Stats::default());
    match push(&remote, root, tops, dest, &opts, &res, stats) {
        Err(EngineError::Redirected { to, reason, .. }) => Err(EngineError::Local(
            crate::pick::follow(
                Some(&crate::pick::Redirect {
                    from: daemon.into(),
                    to: remote.addr.clone(),
                    reason: String::new(),
                }),
                &remote.addr,
                &to,
                &reason,
            )
            .expect_err("a second redirect is a chain"),
        )),
        r => r,
    }
}

/// One report for the whole transfer.
pub(crate) fn merge(mut a: Report, b: Report) -> Report {
    a.files += b.files;
    a.bytes += b.bytes;
    a.failed.extend(b.failed);
    a.peer_cpu_s = match (a.peer_cpu_s, b.peer_cpu_s) {
        (Some(x), Some(y)) => Some(x + y),
        (x, y) => x.or(y),
    };
    a.streams += b.streams;
    a.links.extend(b.links);
    a.unchanged += b.unchanged;
    a.handoffs += b.handoffs;
    a.zerocopy_blocks += b.zerocopy_blocks;
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(cut: &[&str], placed: Option<Option<&[&str]>>) -> Pieced {
        let v = |l: &[&str]| l.iter().map(|s| s.as_bytes().to_vec()).collect();
        Pieced {
            cut: v(cut),
            placed: placed.map(|p| p.map(v)),
        }
    }

    /// A big file is placed when any session of its pieces saw it in
    /// place; one no session saw is named; nothing is judged when a
    /// session failed, nor a file whose pieces went to a sink of before.
    #[test]
    fn a_big_file_no_sink_placed_is_named() {
        let all = [
            session(&["a", "b"], Some(Some(&[]))),
            session(&["a", "b", "c"], Some(Some(&["a"]))),
            session(&["c"], Some(Some(&[]))),
        ];
        assert_eq!(unplaced(&all), vec![b"b".to_vec(), b"c".to_vec()]);
        // A resume that found every file in place: each says so.
        let again = [
            session(&["a"], Some(Some(&["a"]))),
            session(&["a"], Some(Some(&["a"]))),
        ];
        assert!(unplaced(&again).is_empty());
        // A sink of before cannot say: its files are not judged.
        let old = [
            session(&["a", "b"], Some(None)),
            session(&["b", "c"], Some(Some(&[]))),
        ];
        assert_eq!(unplaced(&old), vec![b"c".to_vec()]);
        // A failed session: the push fails on its own.
        let failed = [session(&["a"], None), session(&["a"], Some(Some(&[])))];
        assert!(unplaced(&failed).is_empty());
        // No pieces at all.
        assert!(unplaced(&[session(&[], Some(None))]).is_empty());
    }
}
