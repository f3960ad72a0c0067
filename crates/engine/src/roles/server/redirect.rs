//! Whether a session runs here at all: the preamble a client sends before
//! its request (relay, rate, redirected, grow), and the site's answer
//! when this daemon is draining or at its limit (issue 19: a Redirect to
//! a less loaded member, authenticated under the session key).

use std::sync::atomic::Ordering;

use ramsys_proto::control::PathList;
use ramsys_proto::control::{Bytes32, Role};
use ramsys_proto::Control;

use crate::transport::wire::recv_control_flags;
use crate::transport::Link;
use crate::types::error::EngineError;

use super::auth::Authenticated;
use super::relay;
use super::request::Request;
use super::{refuse, DaemonShared};

/// What a client may send before its request, each optional, in this
/// order.
pub(super) struct Preamble {
    /// A site peer relaying for one of its users (server::relay).
    pub(super) relayed: bool,
    /// `--bwlimit` of a client pulling from this daemon (daemon::rates).
    pub(super) bwlimit: u64,
    /// Another daemon of the site redirected the session here (issue 19).
    pub(super) redirected: Option<String>,
    /// A pull that lets this daemon's source add streams (issue 21).
    pub(super) grow: bool,
    /// A long `--files-from` list sent ahead of the request (SelectFiles).
    pub(super) files: PathList,
    /// The request's frame flags (a RelayOpen's frame::PLACED_FLAG).
    pub(super) flags: u8,
}

impl Preamble {
    /// `req` with what the client sent ahead of it and whether its Hello
    /// asked for GrownLinks. Err: the list sent ahead and the request's
    /// own exceed what a packed list holds (4 GiB), a line for the client.
    pub(super) fn apply(&mut self, mut req: Request, grown_links: bool) -> Result<Request, String> {
        req.bwlimit = self.bwlimit;
        req.grow = self.grow;
        if !self.files.is_empty() {
            let mut all = std::mem::take(&mut self.files);
            all.extend(&req.select.files)
                .map_err(|e| format!("the --files-from list: {e}; split it"))?;
            req.select.files = all;
        }
        req.grown_links = grown_links;
        Ok(req)
    }

    /// Relayed and redirected sessions are never redirected: the agent
    /// chose the pair, and a peer of the site may serve another namespace
    /// (the source site's daemons); a redirect is followed once.
    pub(super) fn may_redirect(&self) -> bool {
        self.redirected.is_none() && !self.relayed
    }
}

/// Read the preamble; returns it with the message after it (the request).
/// A relayed session runs with its user's grant here (put in `auth`).
/// None: refused (answered on the link).
pub(super) fn preamble(
    sh: &DaemonShared,
    link: &mut Box<dyn Link>,
    auth: &mut Authenticated,
    (first, flags, sealed): (Control, u8, bool),
) -> Result<Option<(Preamble, Control)>, EngineError> {
    // Each message read here, keeping the last one's frame flags: the
    // request's, once the preamble is read.
    let mut flags = flags;
    let mut next = |link: &mut Box<dyn Link>| -> Result<Control, EngineError> {
        let (m, f) = recv_control_flags(&mut **link)?;
        flags = f;
        Ok(m)
    };
    let (relayed, first) = match first {
        Control::OnBehalf { user } => {
            let Some(g) = relay::on_behalf(sh, link, &auth.grant, &user, sealed) else {
                return Ok(None);
            };
            auth.grant = g;
            (true, next(link)?)
        }
        first => (false, first),
    };
    let (bwlimit, first) = match first {
        Control::BwLimit { bytes_per_s } => {
            (bytes_per_s.max(crate::data::rate::MIN_RATE), next(link)?)
        }
        first => (0, first),
    };
    let (redirected, first) = match first {
        Control::Redirected { from } => (Some(from), next(link)?),
        first => (None, first),
    };
    let (grow, mut first) = match first {
        Control::GrowStreams => (true, next(link)?),
        first => (false, first),
    };
    let (mut files, mut bytes) = (PathList::default(), 0u64);
    while let Control::SelectFiles { files: chunk } = first {
        // The list is held until the scan, packed (a path's bytes and 4
        // more): it counts against the memory budget per session (serve
        // --session-memory), so a user cannot grow the daemon with an
        // endless one.
        bytes += chunk.iter().map(|f| f.len() as u64 + 4).sum::<u64>();
        let full = chunk.iter().try_for_each(|f| files.push(f)).is_err();
        let budget = sh.opts.meta_budget;
        if full || budget > 0 && bytes > budget {
            let msg = format!(
                "the --files-from list ({} paths so far) is larger than this daemon's memory \
                 budget per session ({}, serve --session-memory); split it",
                files.len(),
                ramsys_units::format_size(budget.min(u32::MAX as u64))
            );
            refuse(link, 1, msg);
            return Ok(None);
        }
        first = next(link)?;
    }
    let pre = Preamble {
        relayed,
        bwlimit,
        redirected,
        grow,
        files,
        flags,
    };
    Ok(Some((pre, first)))
}

/// True when the session does not run here: draining (SIGTERM) refuses it,
/// or in a site sends it to the least-loaded peer; at its admission limit,
/// a site member sends it to a less loaded peer instead of queueing it.
/// Answered on the link.
pub(super) fn sent_elsewhere(
    sh: &DaemonShared,
    link: &mut Box<dyn Link>,
    (session, key): (u64, &Bytes32),
    req: &Request,
    pre: &Preamble,
) -> bool {
    if sh.life.draining() {
        let peer = pre.may_redirect().then(|| sh.site.get()).flatten();
        match peer.and_then(|site| site.least_loaded_peer()) {
            Some(addr) => {
                sh.state.counters.redirects.fetch_add(1, Ordering::Relaxed);
                send_redirect(link, key, addr, "shutting down".into());
            }
            None => refuse(link, 5, crate::daemon::lifecycle::DRAINING.into()),
        }
        return true;
    }
    let redirect = pre.may_redirect().then(|| busy(sh, &req.open)).flatten();
    let Some((addr, reason)) = redirect else {
        return false;
    };
    tracing::info!("session {session:x}: busy ({reason}); redirected to {addr}");
    sh.state.counters.redirects.fetch_add(1, Ordering::Relaxed);
    send_redirect(link, key, addr, reason);
    true
}

/// A Redirect to a verified member of the site (site::Site only lists
/// those), authenticated under the session key (issue 34).
pub(super) fn send_redirect(link: &mut Box<dyn Link>, key: &Bytes32, addr: String, reason: String) {
    let mac = ramsys_proto::auth::redirect_mac(key, &addr, &reason);
    crate::transport::wire::send_final(&mut **link, &Control::Redirect { addr, reason, mac });
}

/// Admission on site state (site::redirect): Some((peer, why)) when this
/// daemon is at its limit and a peer of its site is less loaded. Besides
/// the site's limits, the session is busy here when the pools of its
/// direction have nothing free or tasks already wait for them: it would
/// queue.
pub(super) fn busy(
    sh: &DaemonShared,
    open: &ramsys_proto::control::Open,
) -> Option<(String, String)> {
    let site = sh.site.get()?;
    let r = &sh.res;
    let waiting = sh
        .state
        .tasks_in(crate::daemon::admit::TaskState::Suspended);
    let would_wait = match open.server_role {
        Role::Sink if r.receivers.idle() == 0 => Some("no receiver thread free"),
        Role::Sink if r.writers.idle() == 0 => Some("no writer thread free"),
        Role::Sink if r.buffers.free() < 2 => Some("no buffer memory free"),
        Role::Source if r.senders.idle() == 0 => Some("no sender thread free"),
        Role::Source if r.readers.idle() == 0 => Some("no reader thread free"),
        _ if waiting > 0 => Some("tasks already wait for threads or buffers"),
        _ => None,
    };
    let sessions = sh.active.load(Ordering::Relaxed) as u32;
    site.redirect(sessions, would_wait.map(String::from))
}
