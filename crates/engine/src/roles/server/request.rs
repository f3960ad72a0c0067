//! The request on an authenticated control connection: a status query, a
//! token, a relay, or a transfer, which runs as a session element on the
//! session list and a task on its storage device's queue (seed 000 sec.
//! 6.2.1, Fig. 6-3), with the source or sink end of this daemon.

use std::sync::Arc;

use ramsys_proto::control::Role;
use ramsys_proto::Control;

use crate::daemon::admit::Dir;
use crate::daemon::credentials::Grant;
use crate::daemon::netdev;
use crate::daemon::users::ExportRoot;
use crate::request::walk::Top;
use crate::roles::sink::{run_sink, run_sink_kept, SinkSpec};
use crate::roles::source::{run_source, SourceSpec};
use crate::roles::SessionEnd;
use crate::session::options::TransferOptions;
use crate::session::ServerLinks;
use crate::transport::wire::send_control;
use crate::transport::Link;
use crate::types::error::show;
use crate::types::error::EngineError;
use crate::types::stats::Stats;

use super::auth::{mint, Authenticated};
use super::open::{archive_options, request_paths, session_options, source_tops};
use super::placement::{follow_plan, Place};
use super::relay;
use super::{refuse, ClosedLink, DaemonShared};

/// Serve a status query or a token request at once; a transfer request
/// is returned to be run. None: served or refused.
pub(super) fn serve_request(
    sh: &DaemonShared,
    link: &mut Box<dyn Link>,
    a: &Authenticated,
    (first, flags): (Control, u8),
) -> Result<Option<Request>, EngineError> {
    let first = match open_request(first) {
        Ok(req) => return Ok(Some(req)),
        Err(other) => *other,
    };
    match first {
        Control::StatusQuery => {
            let json = serde_json::to_string(&sh.status_for(a.grant.account.as_deref()))
                .map_err(|e| EngineError::local(format!("status: {e}")))?;
            send_control(&mut **link, &Control::StatusReport { json })?;
        }
        Control::TokenRequest { ttl_s } => mint(sh, link, a, ttl_s)?,
        // A third-party transfer from here to a site peer (server::relay);
        // the agent may ask what its sink placed (frame::PLACED_FLAG).
        Control::RelayOpen(relay) => relay::serve(sh, link, (a.session, flags), &a.grant, relay),
        // `--transport raw|auto` (transport::rawlink): our interfaces.
        Control::RawQuery => {
            let ifaces = sh.raw.get().cloned().unwrap_or_default();
            send_control(&mut **link, &Control::RawOffer { ifaces })?;
        }
        other => refuse(link, 1, format!("expected Open, got {}", other.name())),
    }
    Ok(None)
}

/// A transfer's open as the request it asks for; any other message is
/// given back. The one reading of the opens, for a first request and for
/// a watch channel's batch (server::kept).
pub(super) fn open_request(m: Control) -> Result<Request, Box<Control>> {
    let req = match m {
        Control::Open(open) => Request {
            open,
            sync: 0,
            select: Default::default(),
            preserve: 0,
            bwlimit: 0,
            grow: false,
            grown_links: false,
        },
        // Sync and resume (docs/SYNC.md): flags for a server source.
        Control::SyncOpen { open, flags } => Request {
            open,
            sync: flags & crate::request::sync::flags::ALL,
            select: Default::default(),
            preserve: 0,
            bwlimit: 0,
            grow: false,
            grown_links: false,
        },
        // A selection for a server source (request::filter).
        Control::SelectOpen {
            open,
            flags,
            select,
        } => Request {
            open,
            sync: flags & crate::request::sync::flags::ALL,
            select,
            preserve: 0,
            bwlimit: 0,
            grow: false,
            grown_links: false,
        },
        // An archive copy from a server source (crate::storage::archive).
        Control::ArchiveOpen {
            open,
            flags,
            select,
            preserve,
        } => Request {
            open,
            sync: flags & crate::request::sync::flags::ALL,
            select,
            preserve: preserve & ramsys_proto::attrs::preserve::ALL,
            bwlimit: 0,
            grow: false,
            grown_links: false,
        },
        other => return Err(Box::new(other)),
    };
    Ok(req)
}

/// What the client asked for in its first message.
pub(super) struct Request {
    pub(super) open: ramsys_proto::control::Open,
    /// SyncOpen's flags (docs/SYNC.md), 0 for a copy.
    pub(super) sync: u32,
    /// SelectOpen's selection, for a server source.
    pub(super) select: ramsys_proto::control::Selection,
    /// ArchiveOpen's bits, for a server source (crate::storage::archive).
    pub(super) preserve: u32,
    /// BwLimit's rate, bytes/s (0: none).
    pub(super) bwlimit: u64,
    /// GrowStreams: a server source adds streams while the rate grows.
    pub(super) grow: bool,
    /// The client takes GrownLinks (its Hello's frame::HELLO_PATH_FLAG).
    pub(super) grown_links: bool,
}

/// Run an authorized transfer: the request poller's step (seed 000 sec.
/// 6.2.1), a session element in the session list, then a task on the
/// queue of the storage device the request touches (Fig. 6-3). With
/// `keep` (a watch channel's batch, server::kept) a sink session hands the
/// control link back into `link` once its Complete is out; otherwise, and
/// after any refusal or error, `link` is left closed.
pub(super) fn run_session(
    sh: &Arc<DaemonShared>,
    link: &mut Box<dyn Link>,
    session: u64,
    grant: &Grant,
    req: Request,
    mut links: ServerLinks,
    keep: bool,
) -> Result<(), EngineError> {
    let Request {
        open,
        sync,
        select,
        preserve,
        bwlimit,
        grow,
        grown_links,
    } = req;
    let role = match open.server_role {
        Role::Sink => "sink",
        Role::Source => "source",
    };
    let shown: Vec<String> = open.paths.iter().map(|p| show(p)).collect();
    sh.state
        .open_session(session, &grant.shown, &link.peer(), role, shown);
    let (rels, contents) = match request_paths(&open) {
        Ok(v) => v,
        Err(e) => {
            refuse(link, 2, e.to_string());
            return Err(e.into());
        }
    };
    let at = Place {
        nic: netdev::nic_for(&link.local()),
        local_addr: link.local(),
        stats: Arc::new(Stats::default()),
    };
    let mut ctl = std::mem::replace(link, Box::new(ClosedLink));
    let mut opts = match session_options(sh, &open, sync, select)
        .map(|o| archive_options(o, preserve, grant))
    {
        Ok(o) => o,
        Err(reason) => {
            refuse(&mut ctl, 2, reason);
            return Ok(());
        }
    };
    let source = open.server_role == Role::Source;
    // The client dials what this source asks for (transport::grow),
    // within this daemon's max_streams and the client's receivers.
    opts.auto_streams = grow && source;
    opts.grown_links = grown_links;
    let _rate = sh
        .rates
        .for_session(session, bwlimit, grant.rate.clone(), source, &mut opts);
    let _live = sh.life.track(session, &*ctl);
    // Every path resolves beneath the user's export root (daemon::users).
    let ex = &*grant.root;
    match open.server_role {
        Role::Sink => {
            let back = serve_sink(sh, ctl, &mut links, (session, keep), ex, rels, opts, at)?;
            if let Some(ctl) = back {
                *link = ctl;
            }
            Ok(())
        }
        Role::Source => match source_tops(ex, rels, contents) {
            Ok(tops) => serve_source(sh, ctl, &mut links, session, ex, tops, opts, at),
            Err(reason) => {
                refuse(&mut ctl, 2, reason);
                Ok(())
            }
        },
    }
}

/// The daemon as the sink: one destination. Some(link): the control
/// link handed back (`keep`, run_sink_kept).
#[allow(clippy::too_many_arguments)]
pub(super) fn serve_sink(
    sh: &Arc<DaemonShared>,
    mut ctl: Box<dyn Link>,
    links: &mut ServerLinks,
    (session, keep): (u64, bool),
    ex: &ExportRoot,
    mut rels: Vec<Vec<u8>>,
    mut opts: TransferOptions,
    at: Place,
) -> Result<Option<Box<dyn Link>>, EngineError> {
    if rels.len() != 1 {
        refuse(&mut ctl, 2, "a sink takes exactly one destination".into());
        return Ok(None);
    }
    let spec = SinkSpec {
        root: ex.sink.clone(),
        dest: rels.pop().unwrap(),
        session,
        pending_auth: None,
    };
    let dest = ex.path.join(std::ffi::OsStr::new(&show(&spec.dest)));
    let (dev, kind) = netdev::device_of(&dest);
    let task = sh
        .state
        .new_task(session, Dir::In, &dev, kind, &at.nic, at.stats.clone());
    follow_plan(sh, &task, true, &dest, &at.local_addr, &mut opts);
    let end = SessionEnd::new(links, &opts, &sh.res, at.stats).managed(&task);
    let r = match keep {
        true => run_sink_kept(ctl, spec, end).map(|(_, l)| Some(l)),
        false => run_sink(ctl, spec, end).map(|_| None),
    };
    task.finish(&r);
    r
}

/// The daemon as the source.
#[allow(clippy::too_many_arguments)]
pub(super) fn serve_source(
    sh: &Arc<DaemonShared>,
    ctl: Box<dyn Link>,
    links: &mut ServerLinks,
    session: u64,
    ex: &ExportRoot,
    tops: Vec<Top>,
    mut opts: TransferOptions,
    at: Place,
) -> Result<(), EngineError> {
    // The task's queue is the device of the first source path; readers
    // inside the session still split by device (request::tasks) and steal
    // across devices.
    let first = tops.first().map(|t| show(&t.rel)).unwrap_or_default();
    let first = ex.path.join(std::ffi::OsStr::new(&first));
    let (dev, kind) = netdev::device_of(&first);
    let spec = SourceSpec {
        root: ex.source.clone(),
        tops,
        pending_auth: None,
    };
    let task = sh
        .state
        .new_task(session, Dir::Out, &dev, kind, &at.nic, at.stats.clone());
    follow_plan(sh, &task, false, &first, &at.local_addr, &mut opts);
    let end = SessionEnd::new(links, &opts, &sh.res, at.stats).managed(&task);
    let r = run_source(ctl, spec, end).map(|_| ());
    task.finish(&r);
    r
}
