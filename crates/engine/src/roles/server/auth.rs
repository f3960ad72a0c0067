//! Who is on a control connection (seed 000 sec. 6.2.1; proto::auth,
//! issue 34): the handshake and its credential, registering the session
//! for its data links, sealing the control link, minting one-time
//! credentials, and whether the user may run the request here.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam_channel::{unbounded, Receiver};
use ramsys_proto::auth::seal_token_key;
use ramsys_proto::control::{Bytes32, Role};
use ramsys_proto::Control;

use crate::daemon::credentials::{Grant, Refusal};
use crate::session::serve_handshake;
use crate::transport::wire::{recv_control_flags, send_control};
use crate::transport::Link;
use crate::types::error::EngineError;

use super::{refuse, Arrival, ClosedLink, DaemonShared, OneShotDone, Registered, Slot, Unannounce};

/// An authenticated control connection.
pub(super) struct Authenticated<'a> {
    pub(super) session: u64,
    pub(super) key: Bytes32,
    /// A one-shot daemon's one session: reports its outcome when dropped.
    pub(super) one_shot: Option<OneShotDone<'a>>,
    pub(super) grant: Grant,
    /// The session id stays announced (early joins may wait for it)
    /// until the connection ends.
    pub(super) _announced: Unannounce,
}

/// The handshake (seed 000 sec. 6.2.1; proto::auth, issue 34). The
/// Hello's name selects the key (daemon::users); an unknown name gets a
/// decoy key and fails like a wrong key, at the same step. A one-shot
/// daemon's credential is consumed here. With `path` (the Hello's
/// frame::HELLO_PATH_FLAG) the Challenge carries this host's TCP buffer
/// limits (transport::path).
pub(super) fn authenticate<'a>(
    sh: &'a Arc<DaemonShared>,
    link: &mut Box<dyn Link>,
    hello: &Control,
    user: &str,
    path: bool,
) -> Result<Option<Authenticated<'a>>, EngineError> {
    let pending = sh.creds.lookup(user);
    let session = sh.next_session.fetch_add(1, Ordering::Relaxed);
    let tcp = path.then(|| {
        let root = sh.tcp_root.get().map_or(Path::new("/"), |p| p.as_path());
        crate::transport::path::TcpLimits::read(root).into()
    });
    // Announced but not yet authenticated: early joins may wait.
    sh.announced.lock().unwrap().insert(session);
    let announced = Unannounce(sh.clone(), session);
    let accept = ramsys_proto::auth::Accept { session, tcp };
    let admitted = match serve_handshake(&mut **link, hello, &pending.key, accept)? {
        Some(k) => sh.creds.admit(pending).map(|g| (g, k)),
        None => Err(Refusal::Auth("key not proven".into())),
    };
    let (grant, key) = match admitted {
        Ok(v) => v,
        Err(Refusal::Auth(e)) => {
            tracing::warn!("{}: authentication failed ({e}); closing", link.peer());
            refuse(link, 1, "authentication failed".into());
            return Ok(None);
        }
        Err(Refusal::Limit(m)) => {
            tracing::warn!("{}: {m}; closing", link.peer());
            refuse(link, 4, m);
            return Ok(None);
        }
    };
    let mut one_shot = None;
    if let Some(o) = sh.one_shot.get() {
        if o.used.swap(true, Ordering::SeqCst) {
            tracing::warn!("{}: one-time credential used again; refused", link.peer());
            refuse(link, 1, "credential already used".into());
            return Ok(None);
        }
        one_shot = Some(OneShotDone(o, Err("session ended early".into())));
    }
    Ok(Some(Authenticated {
        session,
        key,
        grant,
        one_shot,
        _announced: announced,
    }))
}

/// Register the session, so its data links find it, and say AuthOk.
pub(super) fn register<'a>(
    sh: &'a DaemonShared,
    link: &mut Box<dyn Link>,
    a: &Authenticated,
) -> Result<(Registered<'a>, Receiver<Arrival>), EngineError> {
    let (tx, rx) = unbounded();
    let session = a.session;
    let slot = Slot { key: a.key, tx };
    sh.registry.lock().unwrap().insert(session, slot);
    let registered = Registered(sh, session);
    sh.registry_cv.notify_all();
    send_control(&mut **link, &Control::AuthOk { session })?;
    tracing::info!(
        "{}: user {} authenticated, session {session:x}",
        link.peer(),
        a.grant.shown
    );
    Ok((registered, rx))
}

/// Register a watch channel's batch under its id and key (server::kept),
/// so its data links find it, until the guard drops; no answer (the
/// connection's AuthOk was its answer).
pub(super) fn register_batch(
    sh: &DaemonShared,
    session: u64,
    key: Bytes32,
) -> (Registered<'_>, Receiver<Arrival>) {
    let (tx, rx) = unbounded();
    sh.registry
        .lock()
        .unwrap()
        .insert(session, Slot { key, tx });
    sh.registry_cv.notify_all();
    (Registered(sh, session), rx)
}

/// The request, behind SealControl if the client asked for one (--encrypt,
/// or a relaying daemon: everything after it is sealed both ways,
/// transport/sealed.rs; AuthOk was the last clear frame), its frame's
/// flags, and whether it was sealed. None: refused.
pub(super) fn seal(
    link: &mut Box<dyn Link>,
    key: &Bytes32,
) -> Result<Option<(Control, u8, bool)>, EngineError> {
    let (first, flags) = recv_control_flags(&mut **link)?;
    let Control::SealControl { cipher } = first else {
        return Ok(Some((first, flags, false)));
    };
    let cipher = match crate::transport::crypto::Cipher::from_id(cipher) {
        Ok(c) if c != crate::transport::crypto::Cipher::None => c,
        _ => {
            let m = format!("cannot seal the control link with cipher {cipher}");
            refuse(link, 1, m);
            return Ok(None);
        }
    };
    let inner = std::mem::replace(link, Box::new(ClosedLink));
    let end = crate::transport::sealed::End::Server;
    *link = Box::new(crate::transport::sealed::SealedLink::new(
        inner, cipher, key, end, 0,
    )?);
    recv_control_flags(&mut **link).map(|(m, f)| Some((m, f, true)))
}

/// A one-time credential for the authenticated user (docs/SECURITY.md).
pub(super) fn mint(
    sh: &DaemonShared,
    link: &mut Box<dyn Link>,
    a: &Authenticated,
    ttl_s: u32,
) -> Result<(), EngineError> {
    match sh.creds.mint(&a.grant, ttl_s) {
        Ok((name, raw, expires_s)) => {
            tracing::info!("{}: minted one-time credential {name}", a.grant.shown);
            let key = seal_token_key(&a.key, &name, &raw);
            let t = Control::Token {
                user: name,
                key,
                expires_s,
            };
            send_control(&mut **link, &t)
        }
        Err(m) => {
            refuse(link, 3, m);
            Ok(())
        }
    }
}

/// May this user run this transfer here: a read-only user never writes,
/// a one-shot daemon serves its one role. False: refused.
pub(super) fn authorize(
    sh: &DaemonShared,
    link: &mut Box<dyn Link>,
    grant: &Grant,
    open: &ramsys_proto::control::Open,
) -> bool {
    if grant.read_only && open.server_role == Role::Sink {
        let m = format!("user {} may only read from this daemon", grant.shown);
        refuse(link, 3, m);
        return false;
    }
    if let Some(o) = sh.one_shot.get().filter(|o| o.role != open.server_role) {
        let m = format!("this session serves the {:?} role only", o.role);
        refuse(link, 2, m);
        return false;
    }
    true
}
