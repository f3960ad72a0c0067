//! Third-party transfers between the daemons of a site (issue 19,
//! docs/SITE.md "Between two sites"; GridFTP's third-party transfers):
//! an agent asks a source daemon A (Control::RelayOpen) to push a tree to
//! a sink daemon B, a peer of A's site. A runs an ordinary push to B with
//! the engine's client code, authenticated as the site identity, and
//! names the agent's user in Control::OnBehalf, so B runs the session
//! with that user's own grant (root, read-only flag, limits): a user
//! cannot write on B through A what B would refuse them directly. A
//! reports back to the agent (RelayProgress every 500 ms, then one
//! RelayDone). With a Share (a striped transfer over several pairs) A
//! lists the sources and sends only its pair's share of the files
//! (request::shares); an agent that asks (frame::PLACED_FLAG on its
//! RelayOpen) is told, in a RelayPlaced right before RelayDone, which big
//! files the share held pieces of and which of them the sink placed
//! (issue 36), so it can fail a file no pair's sink placed.

use std::sync::Arc;
use std::time::Duration;

use ramsys_proto::control::{Failure, Open, Relay, RelayPlaced, RelayReport, Role, MAX_PLACED};
use ramsys_proto::path::validate_relative;
use ramsys_proto::Control;

use super::open::{archive_options, request_paths, session_options, source_tops};
use super::{refuse, DaemonShared};
use crate::daemon::credentials::Grant;
use crate::request::shares;
use crate::roles::client::{push, Remote};
use crate::session::options::TransferOptions;
use crate::session::report::Report;
use crate::transport::tcp::Tcp;
use crate::transport::wire::{send_control, send_final};
use crate::transport::Link;
use crate::types::error::show;
use crate::types::error::EngineError;
use crate::types::stats::Stats;

/// How often the relaying daemon reports progress to the agent; also the
/// agent's sign that A is alive while a long file moves.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);

/// B's side: a site peer's OnBehalf on a freshly authenticated link,
/// which must be sealed (`sealed`): a claim about a user travels only
/// authenticated (issue 34; an unsealed OnBehalf could have been rewritten
/// on the path). Some(grant of the named user); None: refused (answered
/// on the link).
pub(crate) fn on_behalf(
    sh: &DaemonShared,
    link: &mut Box<dyn Link>,
    grant: &Grant,
    user: &str,
    sealed: bool,
) -> Option<Grant> {
    if !sealed {
        tracing::warn!("{}: OnBehalf on an unsealed link refused", link.peer());
        refuse(
            link,
            3,
            "OnBehalf needs a sealed control link (SealControl first)".into(),
        );
        return None;
    }
    let Some(site) = sh.site.get() else {
        refuse(
            link,
            3,
            "this daemon is not part of a site: it takes no relayed sessions".into(),
        );
        return None;
    };
    match sh.creds.on_behalf(grant, site.credentials().0, user) {
        Ok(g) => {
            tracing::info!("{}: relayed session for user {}", link.peer(), g.shown);
            Some(g)
        }
        Err(m) => {
            tracing::warn!("{}: OnBehalf refused: {m}", link.peer());
            refuse(link, 3, m);
            None
        }
    }
}

/// A's side: serve a RelayOpen from an authenticated agent. Every refusal
/// before the push starts is an Error; everything after, a RelayDone.
pub(crate) fn serve(
    sh: &DaemonShared,
    link: &mut Box<dyn Link>,
    (session, flags): (u64, u8),
    grant: &Grant,
    relay: Relay,
) {
    let asked = flags & ramsys_proto::frame::PLACED_FLAG != 0 && !of_before_fault();
    let (opts, tops, share) = match prepare(sh, grant, &relay) {
        Ok(v) => v,
        Err((code, m)) => {
            tracing::warn!("{}: relay refused: {m}", link.peer());
            refuse(link, code, m);
            return;
        }
    };
    let shown: Vec<String> = relay.paths.iter().map(|p| show(p)).collect();
    sh.state
        .open_session(session, &grant.shown, &link.peer(), "relay", shown);
    sh.active.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tracing::info!(
        "session {session:x}: relay for {} to {}:{}",
        grant.shown,
        relay.sink,
        show(&relay.dest)
    );
    let mut opts = opts;
    let _rate = sh
        .rates
        .for_session(session, relay.bwlimit, grant.rate.clone(), true, &mut opts);
    let stats = Arc::new(Stats::default());
    let (share_files, share_bytes, listing) = share.as_ref().map_or((0, 0, 0), |s| s.counts);
    let r = if share.is_some() && opts.select.files.is_empty() {
        // This pair's share is empty (more pairs than files).
        Ok(Report::default())
    } else {
        run_reporting(sh, link, grant, &relay, tops, &opts, stats)
    };
    sh.active.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    sh.state.close_session(session);
    let mut done = match &r {
        Ok(rep) => report(rep),
        Err(e) => RelayReport {
            error: e.to_string(),
            ..report(&Report::default())
        },
    };
    (done.share_files, done.share_bytes, done.listing) = (share_files, share_bytes, listing);
    match &r {
        Ok(_) => tracing::info!("session {session:x}: relay complete"),
        Err(e) => tracing::warn!("session {session:x}: relay failed: {e}"),
    }
    if let (true, Ok(rep)) = (asked, &r) {
        let cut = share.map(|s| s.cut).unwrap_or_default();
        let m = Control::RelayPlaced(placed(cut, rep.placed.as_deref()));
        // Not sent: the agent is gone, and so is RelayDone.
        let _ = send_control(&mut **link, &m);
    }
    send_final(&mut **link, &Control::RelayDone(done));
}

/// The RelayPlaced of a push that ran: the big files of the share in
/// pieces (`cut`, each path once) and those of them its sink named in its
/// Placed (`placed`; None: a sink of before sent none). Bounded as the
/// agent checks it (RelayPlaced::check): a share holds pieces of 16 files
/// at most, and the sink's list was checked by this end's source machine.
fn placed(mut cut: Vec<Vec<u8>>, placed: Option<&[Vec<u8>]>) -> RelayPlaced {
    cut.truncate(MAX_PLACED);
    let placed = placed.map(|p| {
        let mut v: Vec<Vec<u8>> = p.iter().filter(|f| cut.contains(f)).cloned().collect();
        v.sort_unstable();
        v.dedup();
        v
    });
    RelayPlaced { cut, placed }
}

/// Fault injection for the agent's placed check between two sites
/// (crates/ramsys/tests/pairs.rs): `RAMSYS_FAULT_RELAY_OF_BEFORE=1` makes
/// this daemon ignore PLACED_FLAG on a RelayOpen and send no RelayPlaced,
/// as a daemon of before does. Read once per process.
fn of_before_fault() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("RAMSYS_FAULT_RELAY_OF_BEFORE").is_ok_and(|v| v == "1"))
}

/// A pair's share as the relay deals it: its files, bytes and the digest
/// of the listing it was dealt from (RelayReport), and the big files it
/// holds pieces of (RelayPlaced).
struct Dealt {
    counts: (u64, u64, u64),
    cut: Vec<Vec<u8>>,
}

/// What a relay needs, checked before anything moves: (options, source
/// tops, the share as dealt). Err: (code, one line) to refuse with.
#[allow(clippy::type_complexity)]
fn prepare(
    sh: &DaemonShared,
    grant: &Grant,
    relay: &Relay,
) -> Result<
    (
        TransferOptions,
        Vec<crate::request::walk::Top>,
        Option<Dealt>,
    ),
    (u16, String),
> {
    let site = sh.site.get().ok_or_else(|| {
        (
            3,
            "this daemon is not part of a site: a third-party transfer goes to a peer of its site"
                .to_string(),
        )
    })?;
    if !site.is_peer(&relay.sink) {
        return Err((
            3,
            format!(
                "{} is not a peer of this daemon's site ({}): refused",
                relay.sink,
                site.node().me()
            ),
        ));
    }
    if grant.token {
        return Err((
            3,
            "a one-time credential cannot start a third-party transfer".into(),
        ));
    }
    if relay.paths.is_empty() {
        return Err((2, "a relay needs at least one source path".into()));
    }
    if !relay.dest.is_empty() {
        validate_relative(&relay.dest).map_err(|e| (2, e.to_string()))?;
    }
    let open = Open {
        server_role: Role::Source,
        paths: relay.paths.clone(),
        recursive: relay.recursive,
        streams: relay.streams.max(1),
        block_size: relay.block_size,
        checksum: relay.checksum,
    };
    let (rels, contents) = request_paths(&open).map_err(|e| (2, e.to_string()))?;
    let tops = source_tops(&grant.root, rels, contents).map_err(|e| (2, e))?;
    let mut opts =
        session_options(sh, &open, relay.flags, relay.select.clone()).map_err(|e| (2, e))?;
    opts = archive_options(opts, relay.preserve, grant);
    // No stream count asked: sized from the path to the sink, as the agent
    // does for its own pushes (transport::path).
    opts.auto_streams = relay.streams == 0;
    opts.encrypt =
        crate::transport::crypto::Cipher::from_id(relay.cipher).map_err(|e| (2, e.to_string()))?;
    opts.on_behalf = Some(grant.account.clone().unwrap_or_default());
    let mut share = None;
    if let Some(s) = &relay.share {
        let n = s.weights.len();
        if n == 0 || usize::from(s.index) >= n || n > 1024 {
            return Err((2, format!("share {} of {n} pairs", s.index)));
        }
        // Source paths exist (source_tops checked they stay inside).
        let (files, others) =
            shares::list(&grant.root.path, &tops).map_err(|e| (2, e.to_string()))?;
        let listing = shares::digest(&files, &others);
        let weights: Vec<f64> = s
            .weights
            .iter()
            .map(|&w| f64::from(w.max(1)) / 1000.0)
            .collect();
        // Big files in pieces (issue 19) unless an archive copy (or a dry
        // run) asks for whole files: the agent sends the same `pieces` to
        // every pair, so every pair cuts the same pieces.
        let whole = opts.preserve != 0 || opts.sync & crate::request::sync::flags::DRY_RUN != 0;
        let align = if whole { 0 } else { u64::from(s.pieces) };
        let mine = shares::deal(files, others, &weights, align).swap_remove(usize::from(s.index));
        share = Some(Dealt {
            counts: (mine.files, mine.bytes, listing),
            cut: mine.pieces.keys().cloned().collect(),
        });
        opts.pieces = mine.pieces();
        opts.select.files = mine.paths.into();
        opts.select.files_recursive = false;
    }
    Ok((opts, tops, share))
}

/// Run the push on a thread of its own and report its progress to the
/// agent until it ends. An agent that goes away (a progress message that
/// cannot be sent: the agent was interrupted or died) stops the push, as
/// closing a GridFTP control channel aborts its transfer: its links to
/// the sink are shut, the sink keeps its temp files and journal for a
/// `--resume`, and nothing appears under a final name half-written.
fn run_reporting(
    sh: &DaemonShared,
    link: &mut Box<dyn Link>,
    grant: &Grant,
    relay: &Relay,
    tops: Vec<crate::request::walk::Top>,
    opts: &TransferOptions,
    stats: Arc<Stats>,
) -> Result<Report, EngineError> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let links = Arc::new(Abortable::default());
    std::thread::scope(|s| {
        let st = stats.clone();
        let l = links.clone();
        s.spawn(move || {
            let _ = tx.send(push_to_sink(sh, grant, relay, tops, opts, st, l));
        });
        loop {
            match rx.recv_timeout(PROGRESS_EVERY) {
                Ok(r) => return r,
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    return Err(EngineError::local("relay thread ended without a result"))
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    use std::sync::atomic::Ordering::Relaxed;
                    let p = Control::RelayProgress {
                        files: stats.files.load(Relaxed),
                        bytes: stats.bytes.load(Relaxed),
                        total_files: stats.total_files.load(Relaxed),
                        total_bytes: stats.total_bytes.load(Relaxed),
                    };
                    if send_control(&mut **link, &p).is_err() && !links.aborted() {
                        tracing::warn!("relay: the agent went away; stopping the push");
                        links.abort();
                    }
                }
            }
        }
    })
}

/// TCP to the sink, keeping a handle on every link dialled so that the
/// relay can shut them all when its agent goes away; once aborted it
/// dials no more (no replacement or added links).
#[derive(Default)]
struct Abortable {
    links: std::sync::Mutex<Vec<Box<dyn Link>>>,
    aborted: std::sync::atomic::AtomicBool,
}

impl Abortable {
    fn aborted(&self) -> bool {
        self.aborted.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn abort(&self) {
        self.aborted
            .store(true, std::sync::atomic::Ordering::SeqCst);
        for l in self.links.lock().unwrap().iter() {
            l.shutdown_both();
        }
    }
}

impl crate::transport::Transport for Abortable {
    fn connect(&self, addr: &str, timeout: Duration) -> std::io::Result<Box<dyn Link>> {
        let stopped = || std::io::Error::other("the relay was stopped (its agent went away)");
        if self.aborted() {
            return Err(stopped());
        }
        let tcp = Tcp {
            socket_buffer: None,
        };
        let l = crate::transport::Transport::connect(&tcp, addr, timeout)?;
        let mut links = self.links.lock().unwrap();
        // Checked again under the lock: abort() shuts what is listed.
        if self.aborted() {
            return Err(stopped());
        }
        links.push(l.try_clone_link()?);
        Ok(l)
    }

    fn name(&self) -> &'static str {
        "tcp"
    }
}

/// The push itself: to the sink as the site identity, on behalf of the
/// user. The sink never redirects a relayed session (it queues it), so a
/// Redirect can only come from a daemon predating that rule: one line.
fn push_to_sink(
    sh: &DaemonShared,
    grant: &Grant,
    relay: &Relay,
    tops: Vec<crate::request::walk::Top>,
    opts: &TransferOptions,
    stats: Arc<Stats>,
    links: Arc<Abortable>,
) -> Result<Report, EngineError> {
    let site = sh.site.get().expect("prepare checked the site");
    let (user, key) = site.credentials();
    let remote = Remote {
        transport: links,
        addr: relay.sink.clone(),
        key: key.to_vec(),
        connect_timeout: Duration::from_secs(10),
        user: Some(user.to_string()),
    };
    let root = grant.root.source.clone();
    match push(
        &remote,
        root,
        tops,
        relay.dest.clone(),
        opts,
        &sh.res,
        stats,
    ) {
        Err(EngineError::Redirected { to, reason, .. }) => Err(EngineError::local(format!(
            "sink {} is busy ({reason}) and redirected to {to}; a relay goes to its own sink only",
            relay.sink
        ))),
        Err(EngineError::Local(m)) => Err(EngineError::Local(format!("sink {}: {m}", relay.sink))),
        r => r,
    }
}

/// The engine's report as RelayDone carries it.
fn report(r: &Report) -> RelayReport {
    RelayReport {
        files: r.files,
        bytes: r.bytes,
        unchanged: r.unchanged,
        streams: r.streams,
        block_size: r.block_size,
        failures: r
            .failed
            .iter()
            .map(|f| Failure {
                path: f.path.clone().into_bytes(),
                reason: f.reason.clone(),
            })
            .collect(),
        sink_cpu_s: r.peer_cpu_s.unwrap_or(-1.0),
        share_files: 0,
        share_bytes: 0,
        listing: 0,
        error: String::new(),
    }
}
