//! A replication job's watch channel (issue 38, docs/PROTOCOL.md "Watch
//! channel" and "Kept sessions"): one authenticated (and, asked for,
//! sealed) control connection for the job's life, carrying its operations
//! (crate::roles::watchops) and, from version WATCH_SESSIONS on, one push
//! session per batch: no connect and no handshake per batch.
//!
//! Each batch's open passes every check a first request passes (the
//! preamble's budget, the open's paths beneath the user's root, a
//! read-only user, the daemon draining or busy); its session registers
//! for its data links under the batch's own id and key
//! (proto::auth::{batch_session, batch_key}), so its AEAD nonces are never
//! used again and a Join of another batch (or of the connection itself)
//! finds no session. The sink hands the control
//! link back after Complete (run_sink_kept) and the channel reads on.

use std::sync::Arc;
use std::time::Duration;

use ramsys_proto::control::{Bytes32, Role, WATCH_SESSIONS};
use ramsys_proto::Control;

use super::auth::{authorize, register_batch, Authenticated};
use super::redirect::{preamble, sent_elsewhere};
use super::request::open_request;
use super::{refuse, run_counted, DaemonShared, Unannounce};
use crate::session::ServerLinks;
use crate::transport::wire::recv_control_flags;
use crate::transport::Link;
use crate::types::error::EngineError;

/// Serve a watch channel opened with WatchOpen (`version`, `dest`) until
/// the client closes it. `(path, sealed)`: the Hello asked for GrownLinks;
/// the link is sealed (a batch's preamble is read as a first one is).
pub(super) fn serve_watch(
    sh: &Arc<DaemonShared>,
    link: &mut Box<dyn Link>,
    auth: &mut Authenticated,
    (version, dest): (u16, Vec<u8>),
    (path, sealed): (bool, bool),
) -> Result<(), EngineError> {
    let (root, ro) = (auth.grant.root.sink.clone(), auth.grant.read_only);
    // The next batch's id is announced ahead (its data links are dialled
    // with its WatchBatch and may arrive first: they wait for it,
    // server::join); a batch's id leaves with its session.
    let mut next = (version >= WATCH_SESSIONS).then(|| announce(sh, &auth.key, 1));
    let mut batch = |link: &mut Box<dyn Link>, n: u64| {
        let this = next.replace(announce(sh, &auth.key, n + 1));
        let r = serve_batch(sh, link, auth, n, (path, sealed));
        drop(this);
        r
    };
    crate::roles::watchops::serve(link, &root, ro, (version, dest), &mut batch)
}

/// Batch `n`'s id, announced until the guard drops.
fn announce(sh: &Arc<DaemonShared>, key: &Bytes32, n: u64) -> Unannounce {
    let id = ramsys_proto::auth::batch_session(key, n);
    sh.announced.lock().unwrap().insert(id);
    Unannounce(sh.clone(), id)
}

/// Batch `n`'s session (WatchBatch just read). A refusal is answered on
/// the link, which then ends (it is not handed back).
fn serve_batch(
    sh: &Arc<DaemonShared>,
    link: &mut Box<dyn Link>,
    auth: &mut Authenticated,
    n: u64,
    (path, sealed): (bool, bool),
) -> Result<(), EngineError> {
    crate::types::phase::start();
    let (first, flags) = recv_control_flags(&mut **link)?;
    // The channel's user runs every batch: no relaying for another.
    if let Control::OnBehalf { .. } = first {
        refuse(
            link,
            3,
            "OnBehalf is not accepted on a watch channel".into(),
        );
        return Ok(());
    }
    let Some((mut pre, first)) = preamble(sh, link, auth, (first, flags, sealed))? else {
        return Ok(());
    };
    let req = match open_request(first) {
        Ok(r) if r.open.server_role == Role::Sink => match pre.apply(r, path) {
            Ok(r) => r,
            Err(m) => {
                refuse(link, 1, m);
                return Ok(());
            }
        },
        Ok(_) => {
            let m = "a watch channel's sessions fill its destination (sink role only)";
            refuse(link, 2, m.into());
            return Ok(());
        }
        Err(m) => {
            let m = format!("expected a session's open in batch {n}, got {}", m.name());
            refuse(link, 2, m);
            return Ok(());
        }
    };
    if !authorize(sh, link, &auth.grant, &req.open) {
        return Ok(());
    }
    let key = ramsys_proto::auth::batch_key(&auth.key, n);
    if sent_elsewhere(sh, link, (auth.session, &key), &req, &pre) {
        return Ok(());
    }
    // Data links find the batch under its id (proto::auth::batch_session);
    // everything else (status, temp names, rates) knows it by an id from
    // the daemon's sequence, as any session.
    let joins = ramsys_proto::auth::batch_session(&auth.key, n);
    let (registered, rx) = register_batch(sh, joins, key);
    let id = sh
        .next_session
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tracing::debug!(
        "session {:x}: batch {n} runs as session {id:x}",
        auth.session
    );
    let links = ServerLinks {
        rx,
        timeout: Duration::from_secs(30),
        session_key: Some(key),
        control: link.try_clone_link().ok(),
    };
    let r = run_counted(sh, link, (id, &auth.grant), req, links, true);
    drop(registered);
    r
}
