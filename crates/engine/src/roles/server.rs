//! The daemon's connection handling (seed 000 sec. 6.2.1): a link
//! dispatcher accepts every connection and, from its first message,
//! either authenticates a new control connection and runs its session, or
//! hands a data link to the session it joins.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver, Sender};
use ramsys_proto::auth::{seal_token_key, verify_join};
use ramsys_proto::control::{Bytes32, Role};
use ramsys_proto::path::validate_relative;
use ramsys_proto::Control;

use crate::daemon::admit::Dir;
use crate::daemon::credentials::{Credentials, Grant, Refusal, Users};
use crate::daemon::status::{snapshot, Status, UserStatus};
use crate::daemon::users::ExportRoot;
use crate::daemon::{netdev, DaemonState};
use crate::data::resources::EngineResources;
use crate::request::walk::Top;
use crate::roles::sink::{run_sink_with, SinkSpec};
use crate::roles::source::{run_source_with, SourceSpec};
use crate::session::{serve_handshake, ServerLinks};
use crate::transport::crypto::random32;
use crate::transport::wire::{recv_control, send_control};
use crate::transport::Link;
use crate::types::stats::Stats;
use crate::{show, EngineError, TransferOptions};

mod accept;
pub mod limits;
mod relay;

/// A data link for a session: (stream, epoch, link), epoch 0 from Join,
/// higher from Rejoin.
type Arrival = (u16, u16, Box<dyn Link>);

struct Slot {
    key: Bytes32,
    tx: Sender<Arrival>,
}

/// State shared by all connections of one daemon.
pub struct DaemonShared {
    pub root_path: PathBuf,
    /// Shared key or users table, one-time credentials (daemon::users).
    pub creds: Credentials,
    pub res: EngineResources,
    pub opts: TransferOptions,
    registry: Mutex<HashMap<u64, Slot>>,
    /// Signalled when a session is registered (early data-link joins).
    registry_cv: std::sync::Condvar,
    /// Session ids sent in a Challenge whose Auth is still pending.
    announced: Mutex<std::collections::HashSet<u64>>,
    next_session: AtomicU64,
    /// Sessions currently running (observable state).
    pub active: AtomicU64,
    /// Session list, device task queues, task states (crate::daemon).
    pub state: Arc<DaemonState>,
    listen: String,
    /// Hardware view and start-time placement (`serve --config`); set
    /// once before serving. Without it tasks run with the fixed counts.
    pub placement: std::sync::OnceLock<Arc<crate::daemon::config::placement::DaemonPlacement>>,
    /// Set for a daemon started over ssh for one session (`ssh-serve`).
    one_shot: std::sync::OnceLock<OneShot>,
    /// Site membership (`serve --peer`, crate::daemon::site, issue 19).
    pub site: std::sync::OnceLock<Arc<crate::daemon::site::Site>>,
    /// Rate limits: the daemon's, sessions' (daemon::rates).
    pub rates: crate::daemon::rates::DaemonRates,
    /// Drain state and running sessions (daemon::lifecycle).
    pub life: crate::daemon::lifecycle::Lifecycle,
    /// Raw-channel interfaces offered (`serve --raw-iface`, RawOffer).
    raw: std::sync::OnceLock<Vec<ramsys_proto::control::RawIface>>,
    /// Root of the `proc/sys/net/ipv4/tcp_{w,r}mem` read for the Challenge
    /// ("/" unless set: tests inject limits, `serve --tcp-sys-root`).
    tcp_root: std::sync::OnceLock<PathBuf>,
    /// Connections held, in all and per source (server::limits).
    pub conns: Arc<limits::Gate>,
}

/// A daemon that serves one session only (`ramsys ssh-serve`,
/// docs/SECURITY.md): its key is a one-time credential, so the first
/// session to authenticate consumes it; later ones are refused.
struct OneShot {
    role: Role,
    used: std::sync::atomic::AtomicBool,
    done: Sender<Result<(), String>>,
}

/// Reports the one session's outcome when it ends, however it ends.
struct OneShotDone<'a>(&'a OneShot, Result<(), String>);

impl Drop for OneShotDone<'_> {
    fn drop(&mut self) {
        let _ = self.0.done.send(std::mem::replace(&mut self.1, Ok(())));
    }
}

impl DaemonShared {
    /// The daemon's state as `ramsys status` shows it.
    pub fn status(&self) -> Status {
        self.status_for(None)
    }

    /// The state as shown to `user` (None: everything, e.g. metrics): with
    /// a users table a user sees only its own sessions and root.
    pub fn status_for(&self, user: Option<&str>) -> Status {
        let mut s = snapshot(
            &self.state,
            &self.res,
            &self.listen,
            &self.root_path.display().to_string(),
        );
        if let Some(p) = self.placement.get() {
            s.placement = p.lines.clone();
        }
        s.users = self
            .creds
            .user_status(user)
            .into_iter()
            .map(|(name, root, sessions, read_only)| UserStatus {
                name,
                root,
                sessions,
                read_only,
            })
            .collect();
        if let Some(site) = self.site.get() {
            s.site = site.members();
        }
        let users = self.creds.users();
        s.rates = self
            .rates
            .status(&users.as_ref().map(|u| u.rates()).unwrap_or_default());
        s.draining = self.life.draining();
        s.raw = self.raw_status();
        let c = ramsys_rawnet::offload::counters();
        s.copy_offload = crate::daemon::status::CopyOffload {
            enabled: ramsys_rawnet::offload::enabled(),
            copies: c.copies,
            bytes: c.bytes,
            fallbacks: c.fallbacks,
            fallback_bytes: c.fallback_bytes,
        };
        if let (Some(u), Some(_)) = (user, users) {
            let mine = |x: &str| x == u || x.starts_with(&format!("{u}/"));
            s.sessions.retain(|x| mine(&x.user));
            let ids: Vec<&str> = s.sessions.iter().map(|x| x.id.as_str()).collect();
            s.rates.retain(|r| match r.scope.as_str() {
                "user" => r.name == u,
                "session" => ids.contains(&r.name.as_str()),
                _ => true,
            });
            s.root = s.users.first().map(|x| x.root.clone()).unwrap_or_default();
        }
        s
    }
}

impl DaemonShared {
    /// The raw-channel interfaces, one line each (`ramsys status`).
    fn raw_status(&self) -> Vec<String> {
        let show = |o: &ramsys_proto::control::RawIface| {
            let node = o.node.map_or("-".to_string(), |n| n.to_string());
            let mac = ramsys_rawnet::channel::mac_string(&o.mac);
            format!("{} {mac} mtu {} node {node}", o.name, o.mtu)
        };
        self.raw
            .get()
            .map(|v| v.iter().map(show).collect())
            .unwrap_or_default()
    }
}

/// A bound, not yet serving daemon.
pub struct Daemon {
    listener: TcpListener,
    shared: Arc<DaemonShared>,
}

impl Daemon {
    /// Bind `listen` and pre-allocate resources. `root` is canonicalized:
    /// every peer path resolves beneath it.
    pub fn bind(
        listen: &str,
        root: &Path,
        key: Vec<u8>,
        opts: TransferOptions,
        res: EngineResources,
    ) -> anyhow::Result<Daemon> {
        let export = Arc::new(ExportRoot::open(root)?);
        let root_path = export.path.clone();
        let listener = TcpListener::bind(listen)
            .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?;
        crate::storage::fsops::raise_nofile_limit();
        // Session ids start at a random point so ids of a restarted daemon
        // do not repeat.
        let r = random32();
        let start = u64::from_le_bytes(r[..8].try_into().unwrap()) >> 16;
        let state = DaemonState::start(opts.idle_timeout);
        let (dev, kind) = netdev::device_of(&root_path);
        state.add_device(&dev, kind);
        let listen = listener.local_addr()?.to_string();
        Ok(Daemon {
            listener,
            shared: Arc::new(DaemonShared {
                root_path,
                creds: Credentials::new(key, export),
                res,
                opts,
                registry: Mutex::new(HashMap::new()),
                registry_cv: std::sync::Condvar::new(),
                announced: Mutex::new(Default::default()),
                next_session: AtomicU64::new(start),
                active: AtomicU64::new(0),
                state,
                listen,
                placement: std::sync::OnceLock::new(),
                one_shot: std::sync::OnceLock::new(),
                site: std::sync::OnceLock::new(),
                rates: Default::default(),
                life: Default::default(),
                raw: std::sync::OnceLock::new(),
                tcp_root: std::sync::OnceLock::new(),
                conns: Default::default(),
            }),
        })
    }

    /// Follow `p` from now on: per-task plans (issue 7) and the placement
    /// shown by `ramsys status`.
    pub fn set_placement(&self, p: crate::daemon::config::placement::DaemonPlacement) {
        let _ = self.shared.placement.set(Arc::new(p));
    }

    /// Serve a users table (per-user keys and export roots) instead of the
    /// shared key; call before serving.
    pub fn set_users(&mut self, users: Users) {
        let sh = Arc::get_mut(&mut self.shared).expect("set_users before serving");
        for r in users.roots() {
            let (dev, kind) = netdev::device_of(&r.path);
            sh.state.add_device(&dev, kind);
        }
        sh.creds.set_users(users);
    }

    /// Serve exactly one session, in `role` (ssh-serve): the first
    /// authenticated session consumes the key, later ones are refused.
    /// The receiver gets the session's outcome when it ends.
    pub fn one_session(&self, role: Role) -> crossbeam_channel::Receiver<Result<(), String>> {
        let (done, rx) = crossbeam_channel::bounded(1);
        let _ = self.shared.one_shot.set(OneShot {
            role,
            used: false.into(),
            done,
        });
        rx
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound listener")
    }

    pub fn shared(&self) -> Arc<DaemonShared> {
        self.shared.clone()
    }

    /// Serve Prometheus metrics at http://ADDR/metrics (background
    /// thread); returns the bound address.
    pub fn serve_metrics(&self, addr: &str) -> std::io::Result<SocketAddr> {
        let sh = self.shared.clone();
        crate::daemon::metrics::http::serve(addr, move || sh.status())
    }

    /// Join a site (`serve --peer`, crate::daemon::site): publish this daemon's
    /// load and pull its peers'. Call once, before serving.
    pub fn start_site(&self, opts: crate::daemon::site::SiteOptions) {
        let key = self.shared.creds.lookup(&opts.user).key;
        let sh = Arc::downgrade(&self.shared);
        let share = opts.share_storage;
        let local = move || {
            let Some(sh) = sh.upgrade() else {
                return crate::daemon::site::LocalLoad::default();
            };
            let st = snapshot(&sh.state, &sh.res, "", "");
            crate::daemon::site::LocalLoad {
                sessions: st.sessions.len() as u32,
                active_tasks: st.tasks.len() as u32,
                queued_tasks: st.queues.iter().map(|q| q.waiting.len() as u32).sum(),
                free_buffer_bytes: (sh.res.buffers.free() * sh.res.buffers.buf_size()) as u64,
                storage: if share {
                    sh.state.storage_use()
                } else {
                    vec![]
                },
            }
        };
        // Storage shares re-read from every new view (site::share).
        let state = Arc::downgrade(&self.shared.state);
        let on_view = move |me: &str, view: &[crate::daemon::status::SiteMember]| {
            if let Some(st) = state.upgrade().filter(|_| share) {
                st.apply_site(me, view);
            }
        };
        let me = self.local_addr().to_string();
        let _ = self.shared.site.set(crate::daemon::site::Site::start(
            &me,
            opts,
            key,
            Box::new(local),
            Box::new(on_view),
        ));
    }

    /// Offer raw-Ethernet channels (issue 18, transport::rawlink): the
    /// listeners' channels go through the same dispatch as TCP
    /// connections, and RawQuery is answered with their interfaces.
    pub fn serve_raw(&self, l: crate::transport::rawlink::RawListeners) {
        let _ = self.shared.raw.set(l.offer().to_vec());
        let sh = self.shared.clone();
        l.spawn(Arc::new(move |link| handle(sh.clone(), link)));
    }

    /// Serve connections that arrive other than on the TCP listener
    /// (in-memory links in tests, transport::mem; issue 37): each goes
    /// through the same dispatch as an accepted connection.
    pub fn serve_links<I>(&self, incoming: I)
    where
        I: IntoIterator<Item = Box<dyn Link>>,
        I::IntoIter: Send + 'static,
    {
        let (sh, incoming) = (self.shared.clone(), incoming.into_iter());
        let _ = std::thread::Builder::new()
            .name("dispatcher-links".into())
            .spawn(move || {
                for link in incoming {
                    let sh = sh.clone();
                    let _ = std::thread::Builder::new()
                        .name("conn".into())
                        .spawn(move || handle(sh, link));
                }
            });
    }

    /// Read the TCP buffer limits sent to clients (in the Challenge) under
    /// `root` instead of "/" (tests).
    pub fn set_tcp_sys_root(&self, root: PathBuf) {
        let _ = self.shared.tcp_root.set(root);
    }

    /// Limit the connections held at once and the time to a first
    /// message (server::limits, issue 34).
    pub fn set_limits(&self, l: limits::ConnLimits) {
        self.shared.conns.set_limits(l);
    }

    /// Accept connections forever (server::accept).
    pub fn serve(self) {
        accept::run(self.listener, self.shared);
    }

    /// Serve on a background thread.
    pub fn spawn(self) -> std::thread::JoinHandle<()> {
        std::thread::Builder::new()
            .name("dispatcher".into())
            .spawn(move || self.serve())
            .expect("spawn dispatcher")
    }
}

/// How long a read on a connection past its first message may wait.
const IDLE_READ: Duration = Duration::from_secs(30);

/// A link from a raw-Ethernet listener (transport::rawlink): its first
/// message is read here, under the same limits as a TCP connection's
/// (server::accept).
fn handle(sh: Arc<DaemonShared>, mut link: Box<dyn Link>) {
    let peer = link.peer();
    let timeout = sh.conns.limits().handshake_timeout;
    let r = accept::read_first_blocking(&mut *link, timeout).and_then(|(first, flags)| {
        link.set_read_timeout(Some(IDLE_READ))?;
        handle_first(&sh, &mut link, first, flags)
    });
    log_outcome(&peer, r);
}

fn log_outcome(peer: &str, r: Result<(), EngineError>) {
    match r {
        Ok(()) => {}
        Err(EngineError::PeerClosed) => tracing::debug!("{peer}: closed"),
        Err(e) => tracing::warn!("{peer}: {e}"),
    }
}

/// A session's registration (data links find their session by id in the
/// registry): removed on every exit of the control handler (issue 16).
struct Registered<'a>(&'a DaemonShared, u64);

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.0.registry.lock().unwrap().remove(&self.1);
    }
}

/// Drops a session id from the announced set when the handshake ends,
/// whatever the outcome, and wakes joins waiting for it.
struct Unannounce(Arc<DaemonShared>, u64);

impl Drop for Unannounce {
    fn drop(&mut self) {
        self.0.announced.lock().unwrap().remove(&self.1);
        let _g = self.0.registry.lock().unwrap();
        self.0.registry_cv.notify_all();
    }
}

pub(crate) fn refuse(link: &mut Box<dyn Link>, code: u16, message: String) {
    crate::transport::wire::send_final(&mut **link, &Control::Error { code, message });
}

/// Dispatch on a connection's first message (seed 000 sec. 6.2.1): a
/// data link joining its session, a replacement link rejoining one, a
/// control connection's Hello, or a site peer's SiteHello.
fn handle_first(
    sh: &Arc<DaemonShared>,
    link: &mut Box<dyn Link>,
    first: Control,
    flags: u8,
) -> Result<(), EngineError> {
    match &first {
        Control::Join {
            session,
            stream,
            nonce,
            mac,
        } => {
            join(sh, link, *session, *stream, nonce, mac);
            Ok(())
        }
        Control::Rejoin {
            session,
            stream,
            epoch,
            nonce,
            mac,
        } => {
            rejoin(sh, link, (*session, *stream, *epoch), nonce, mac);
            Ok(())
        }
        Control::Hello { user, .. } => {
            let path = flags & ramsys_proto::frame::HELLO_PATH_FLAG != 0;
            serve_control(sh, link, &first, user, path)
        }
        // A site peer (crate::daemon::site, docs/SITE.md): its own handler.
        Control::SiteHello { .. } => match sh.site.get() {
            Some(site) => site.serve_peer(&sh.creds, link, &first),
            None => {
                refuse(link, 3, "this daemon is not part of a site".into());
                Ok(())
            }
        },
        other => {
            let m = format!("unexpected first message {}", other.name());
            refuse(link, 1, m);
            Ok(())
        }
    }
}

/// A data link joins its session, found by id in the registry.
fn join(
    sh: &DaemonShared,
    link: &mut Box<dyn Link>,
    session: u64,
    stream: u16,
    nonce: &Bytes32,
    mac: &Bytes32,
) {
    // The client joins as soon as it knows the session id (from the
    // Challenge), possibly before its Auth has been checked: wait a
    // little for the session to be registered.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut reg = sh.registry.lock().unwrap();
    while !reg.contains_key(&session)
        && sh.announced.lock().unwrap().contains(&session)
        && std::time::Instant::now() < deadline
    {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        reg = sh.registry_cv.wait_timeout(reg, left).unwrap().0;
    }
    let tx = reg
        .get(&session)
        .filter(|s| verify_join(&s.key, session, stream, nonce, mac))
        .map(|s| s.tx.clone());
    drop(reg);
    match tx {
        Some(tx) => {
            let l = std::mem::replace(link, Box::new(ClosedLink));
            let _ = tx.send((stream, 0, l));
        }
        None => {
            tracing::warn!("{}: data link with bad credentials refused", link.peer());
            refuse(link, 1, "unknown session or bad credentials".into());
        }
    }
}

/// A replacement for a data link that broke (crate::session::relink): only for a
/// session already running; its controller answers.
fn rejoin(
    sh: &DaemonShared,
    link: &mut Box<dyn Link>,
    (session, stream, epoch): (u64, u16, u16),
    nonce: &Bytes32,
    mac: &Bytes32,
) {
    let reg = sh.registry.lock().unwrap();
    let tx = reg
        .get(&session)
        .filter(|s| {
            epoch > 0
                && ramsys_proto::auth::verify_rejoin(&s.key, session, stream, epoch, nonce, mac)
        })
        .map(|s| s.tx.clone());
    drop(reg);
    match tx {
        Some(tx) => {
            let l = std::mem::replace(link, Box::new(ClosedLink));
            let _ = tx.send((stream, epoch, l));
        }
        None => {
            tracing::warn!(
                "{}: replacement link with bad credentials refused",
                link.peer()
            );
            refuse(link, 1, "unknown session or bad credentials".into());
        }
    }
}

/// A control connection: authenticate -> register -> seal -> serve the
/// request -> authorize, then run the session. A refusal has been
/// answered on the link and ends the connection quietly.
fn serve_control(
    sh: &Arc<DaemonShared>,
    link: &mut Box<dyn Link>,
    hello: &Control,
    user: &str,
    path: bool,
) -> Result<(), EngineError> {
    let Some(mut auth) = authenticate(sh, link, hello, user, path)? else {
        return Ok(());
    };
    let (session, skey) = (auth.session, auth.key);
    // Removed again on every exit from here on.
    let (registered, rx) = register(sh, link, &auth)?;
    let Some((first, sealed)) = seal(link, &skey)? else {
        return Ok(());
    };
    let Some((pre, first)) = preamble(sh, link, &mut auth, (first, sealed))? else {
        return Ok(());
    };
    let Some(mut req) = serve_request(sh, link, &auth, first)? else {
        return Ok(());
    };
    req.bwlimit = pre.bwlimit;
    req.grow = pre.grow;
    req.grown_links = path;
    if !authorize(sh, link, &auth.grant, &req.open) {
        return Ok(());
    }
    if sent_elsewhere(sh, link, (session, &skey), &req, &pre) {
        return Ok(());
    }
    if let Some(from) = &pre.redirected {
        tracing::info!("session {session:x}: redirected here by {from}");
    }
    sh.active.fetch_add(1, Ordering::Relaxed);
    let links = ServerLinks {
        rx,
        timeout: Duration::from_secs(30),
        session_key: Some(skey),
        control: link.try_clone_link().ok(),
    };
    let r = run_session(sh, link, session, &auth.grant, req, links);
    sh.active.fetch_sub(1, Ordering::Relaxed);
    drop(registered);
    sh.state.close_session(session);
    match &r {
        Ok(()) => tracing::info!("session {session:x} complete"),
        Err(e) => tracing::warn!("session {session:x} failed: {e}"),
    }
    if let Some(d) = &mut auth.one_shot {
        d.1 = r.as_ref().map(|_| ()).map_err(|e| e.to_string());
    }
    r
}

/// What a client may send before its request, each optional, in this
/// order.
struct Preamble {
    /// A site peer relaying for one of its users (server::relay).
    relayed: bool,
    /// `--bwlimit` of a client pulling from this daemon (daemon::rates).
    bwlimit: u64,
    /// Another daemon of the site redirected the session here (issue 19).
    redirected: Option<String>,
    /// A pull that lets this daemon's source add streams (issue 21).
    grow: bool,
}

impl Preamble {
    /// Relayed and redirected sessions are never redirected: the agent
    /// chose the pair, and a peer of the site may serve another namespace
    /// (the source site's daemons); a redirect is followed once.
    fn may_redirect(&self) -> bool {
        self.redirected.is_none() && !self.relayed
    }
}

/// Read the preamble; returns it with the message after it (the request).
/// A relayed session runs with its user's grant here (put in `auth`).
/// None: refused (answered on the link).
fn preamble(
    sh: &DaemonShared,
    link: &mut Box<dyn Link>,
    auth: &mut Authenticated,
    (first, sealed): (Control, bool),
) -> Result<Option<(Preamble, Control)>, EngineError> {
    let (relayed, first) = match first {
        Control::OnBehalf { user } => {
            let Some(g) = relay::on_behalf(sh, link, &auth.grant, &user, sealed) else {
                return Ok(None);
            };
            auth.grant = g;
            (true, recv_control(&mut **link)?)
        }
        first => (false, first),
    };
    let (bwlimit, first) = match first {
        Control::BwLimit { bytes_per_s } => (
            bytes_per_s.max(crate::data::rate::MIN_RATE),
            recv_control(&mut **link)?,
        ),
        first => (0, first),
    };
    let (redirected, first) = match first {
        Control::Redirected { from } => (Some(from), recv_control(&mut **link)?),
        first => (None, first),
    };
    let (grow, first) = match first {
        Control::GrowStreams => (true, recv_control(&mut **link)?),
        first => (false, first),
    };
    let pre = Preamble {
        relayed,
        bwlimit,
        redirected,
        grow,
    };
    Ok(Some((pre, first)))
}

/// True when the session does not run here: draining (SIGTERM) refuses it,
/// or in a site sends it to the least-loaded peer; at its admission limit,
/// a site member sends it to a less loaded peer instead of queueing it.
/// Answered on the link.
fn sent_elsewhere(
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
fn send_redirect(link: &mut Box<dyn Link>, key: &Bytes32, addr: String, reason: String) {
    let mac = ramsys_proto::auth::redirect_mac(key, &addr, &reason);
    crate::transport::wire::send_final(&mut **link, &Control::Redirect { addr, reason, mac });
}

/// Admission on site state (site::redirect): Some((peer, why)) when this
/// daemon is at its limit and a peer of its site is less loaded. Besides
/// the site's limits, the session is busy here when the pools of its
/// direction have nothing free or tasks already wait for them: it would
/// queue.
fn busy(sh: &DaemonShared, open: &ramsys_proto::control::Open) -> Option<(String, String)> {
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

/// An authenticated control connection.
struct Authenticated<'a> {
    session: u64,
    key: Bytes32,
    /// A one-shot daemon's one session: reports its outcome when dropped.
    one_shot: Option<OneShotDone<'a>>,
    grant: Grant,
    /// The session id stays announced (early joins may wait for it)
    /// until the connection ends.
    _announced: Unannounce,
}

/// The handshake (seed 000 sec. 6.2.1; proto::auth, issue 34). The
/// Hello's name selects the key (daemon::users); an unknown name gets a
/// decoy key and fails like a wrong key, at the same step. A one-shot
/// daemon's credential is consumed here. With `path` (the Hello's
/// frame::HELLO_PATH_FLAG) the Challenge carries this host's TCP buffer
/// limits (transport::path).
fn authenticate<'a>(
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
fn register<'a>(
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

/// The request, behind SealControl if the client asked for one (--encrypt,
/// or a relaying daemon: everything after it is sealed both ways,
/// transport/sealed.rs; AuthOk was the last clear frame), and whether it
/// was sealed. None: refused.
fn seal(link: &mut Box<dyn Link>, key: &Bytes32) -> Result<Option<(Control, bool)>, EngineError> {
    let first = recv_control(&mut **link)?;
    let Control::SealControl { cipher } = first else {
        return Ok(Some((first, false)));
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
    recv_control(&mut **link).map(|m| Some((m, true)))
}

/// Serve a status query or a token request at once; a transfer request
/// is returned to be run. None: served or refused.
fn serve_request(
    sh: &DaemonShared,
    link: &mut Box<dyn Link>,
    a: &Authenticated,
    first: Control,
) -> Result<Option<Request>, EngineError> {
    let req = match first {
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
        Control::StatusQuery => {
            let json = serde_json::to_string(&sh.status_for(a.grant.account.as_deref()))
                .map_err(|e| EngineError::local(format!("status: {e}")))?;
            send_control(&mut **link, &Control::StatusReport { json })?;
            return Ok(None);
        }
        Control::TokenRequest { ttl_s } => {
            mint(sh, link, a, ttl_s)?;
            return Ok(None);
        }
        // A third-party transfer from here to a site peer (server::relay).
        Control::RelayOpen(relay) => {
            relay::serve(sh, link, a.session, &a.grant, relay);
            return Ok(None);
        }
        // `--transport raw|auto` (transport::rawlink): our interfaces.
        Control::RawQuery => {
            let ifaces = sh.raw.get().cloned().unwrap_or_default();
            send_control(&mut **link, &Control::RawOffer { ifaces })?;
            return Ok(None);
        }
        other => {
            refuse(link, 1, format!("expected Open, got {}", other.name()));
            return Ok(None);
        }
    };
    Ok(Some(req))
}

/// A one-time credential for the authenticated user (docs/SECURITY.md).
fn mint(
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
fn authorize(
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

/// What the client asked for in its first message.
struct Request {
    open: ramsys_proto::control::Open,
    /// SyncOpen's flags (docs/SYNC.md), 0 for a copy.
    sync: u32,
    /// SelectOpen's selection, for a server source.
    select: ramsys_proto::control::Selection,
    /// ArchiveOpen's bits, for a server source (crate::storage::archive).
    preserve: u32,
    /// BwLimit's rate, bytes/s (0: none).
    bwlimit: u64,
    /// GrowStreams: a server source adds streams while the rate grows.
    grow: bool,
    /// The client takes GrownLinks (its Hello's frame::HELLO_PATH_FLAG).
    grown_links: bool,
}

/// Run an authorized transfer: the request poller's step (seed 000 sec.
/// 6.2.1), a session element in the session list, then a task on the
/// queue of the storage device the request touches (Fig. 6-3).
fn run_session(
    sh: &Arc<DaemonShared>,
    link: &mut Box<dyn Link>,
    session: u64,
    grant: &Grant,
    req: Request,
    mut links: ServerLinks,
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
        Role::Sink => serve_sink(sh, ctl, &mut links, session, ex, rels, opts, at),
        Role::Source => match source_tops(ex, rels, contents) {
            Ok(tops) => serve_source(sh, ctl, &mut links, session, ex, tops, opts, at),
            Err(reason) => {
                refuse(&mut ctl, 2, reason);
                Ok(())
            }
        },
    }
}

/// Where a session's task runs: its NIC and local address, its counters.
struct Place {
    nic: String,
    local_addr: String,
    stats: Arc<Stats>,
}

/// The request's paths, each relative to the export root ("" = the root
/// itself), and whether each names its contents: a source path ending in
/// '/' does (rsync's rule; the walk gives it an empty name, which the
/// sink maps to DST itself).
pub(crate) fn request_paths(
    open: &ramsys_proto::control::Open,
) -> Result<(Vec<Vec<u8>>, Vec<bool>), ramsys_proto::ProtoError> {
    let mut rels = Vec::new();
    let mut contents = Vec::new();
    for p in &open.paths {
        let c = open.server_role == Role::Source && p.ends_with(b"/");
        contents.push(c);
        let p = if c { &p[..p.len() - 1] } else { &p[..] };
        if !p.is_empty() {
            validate_relative(p)?;
        }
        // Our own working files are neither read nor written through a
        // session (issue 34, crate::request::reserved).
        if crate::request::reserved::names_reserved(p) {
            return Err(ramsys_proto::ProtoError::BadPath(format!(
                "{}: {}",
                show(p),
                crate::request::reserved::REFUSED
            )));
        }
        rels.push(p.to_vec());
    }
    Ok((rels, contents))
}

/// An archive copy's bits (ArchiveOpen, for a source) and what a sink may
/// apply: a user of a multi-user daemon never creates files owned by
/// another user, device nodes, or privileged xattrs (crate::storage::archive,
/// docs/SECURITY.md).
pub(crate) fn archive_options(
    mut opts: TransferOptions,
    preserve: u32,
    grant: &Grant,
) -> TransferOptions {
    opts.preserve = preserve;
    if grant.account.is_some() {
        opts.archive_policy = crate::storage::archive::Policy::confined();
    }
    opts
}

/// The client's wishes, within what this daemon serves. Err: the reason
/// to refuse, in one line, before any scan.
pub(crate) fn session_options(
    sh: &DaemonShared,
    open: &ramsys_proto::control::Open,
    sync: u32,
    select: ramsys_proto::control::Selection,
) -> Result<TransferOptions, String> {
    let mut opts = sh.opts.clone();
    opts.recursive = open.recursive;
    opts.streams = open.streams.clamp(1, sh.res.config.max_streams as u16);
    opts.block_size = open
        .block_size
        .clamp(4096, sh.res.buffers.buf_size() as u32);
    opts.checksum = open.checksum;
    opts.sync = sync;
    if !select.is_empty() {
        // A source applies the selection to its scan, a sink to --delete.
        if let Err(e) = crate::request::filter::Filter::new(&select) {
            return Err(format!("filter rules: {e}"));
        }
        opts.select = select;
    }
    Ok(opts)
}

/// The daemon as the sink: one destination.
#[allow(clippy::too_many_arguments)]
fn serve_sink(
    sh: &Arc<DaemonShared>,
    mut ctl: Box<dyn Link>,
    links: &mut ServerLinks,
    session: u64,
    ex: &ExportRoot,
    mut rels: Vec<Vec<u8>>,
    mut opts: TransferOptions,
    at: Place,
) -> Result<(), EngineError> {
    if rels.len() != 1 {
        refuse(&mut ctl, 2, "a sink takes exactly one destination".into());
        return Ok(());
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
    let r = run_sink_with(ctl, links, spec, &opts, &sh.res, at.stats, &task).map(|_| ());
    task.finish(&r);
    r
}

/// The source's top-level paths and the names their trees get on the
/// wire. Err: a path resolves outside the export root.
pub(crate) fn source_tops(
    ex: &ExportRoot,
    rels: Vec<Vec<u8>>,
    contents: Vec<bool>,
) -> Result<Vec<Top>, String> {
    let mut tops = Vec::new();
    for (r, c) in rels.into_iter().zip(contents) {
        let name = match r.iter().rposition(|&b| b == b'/') {
            _ if c => Vec::new(),
            Some(i) => r[i + 1..].to_vec(),
            None if r.is_empty() => ex
                .path
                .file_name()
                .map(|n| n.as_encoded_bytes().to_vec())
                .unwrap_or_else(|| b"root".to_vec()),
            None => r.clone(),
        };
        let rel = resolve_top(ex, &r, c)?;
        tops.push(Top { rel, name });
    }
    Ok(tops)
}

/// Where a source path is inside the export (issue 35): symlinks on the
/// way are followed when they stay inside the root, as rsync's daemon
/// does (`mod/in-link/` with `in-link -> inner` sends inner's contents),
/// the whole resolution confined by openat2 RESOLVE_BENEATH (the source
/// root's Beneath rule: `..` above the root, an absolute link and a
/// magic link all fail). The last component is followed only for a
/// contents path (`DIR/`); otherwise a symlink is sent as what it is. The
/// resolved path has no symlink left, and is what the scan reads. Err:
/// one line naming the path that leads outside.
fn resolve_top(ex: &ExportRoot, rel: &[u8], contents: bool) -> Result<Vec<u8>, String> {
    let (dir, last) = match (contents, rel.iter().rposition(|&b| b == b'/')) {
        (true, _) => (rel, &b""[..]),
        (false, Some(i)) => (&rel[..i], &rel[i + 1..]),
        (false, None) => return Ok(rel.to_vec()),
    };
    if dir.is_empty() {
        return Ok(rel.to_vec());
    }
    let mut out = match ex.source.resolve_beneath(dir) {
        Ok(p) => p,
        // Missing: the scan reports it, as for any missing source.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(rel.to_vec()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EXDEV | libc::ELOOP)) => {
            return Err(format!(
                "{} resolves outside the daemon root (a symlink on the way leads out of it)",
                show(rel)
            ))
        }
        Err(e) => return Err(format!("{}: {e}", show(rel))),
    };
    if !last.is_empty() {
        if !out.is_empty() {
            out.push(b'/');
        }
        out.extend_from_slice(last);
    }
    Ok(out)
}

/// The daemon as the source.
#[allow(clippy::too_many_arguments)]
fn serve_source(
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
    let r = run_source_with(ctl, links, spec, &opts, &sh.res, at.stats, &task).map(|_| ());
    task.finish(&r);
    r
}

/// Issue 7: when a task starts, plan it (MSMRAP heuristic over the
/// topology, the I/O model if configured, the task's storage device and
/// NIC) and run its storage threads with the plan's count, within the pools
/// (admission may still grant fewer). The plan shows in `ramsys status`.
/// The stream count stays the one agreed with the client, capped by the
/// pools: the agent plans its own end. Re-planning: docs/SCHEDULER.md.
fn follow_plan(
    sh: &DaemonShared,
    task: &crate::daemon::TaskGuard,
    sink: bool,
    path: &Path,
    local: &str,
    opts: &mut TransferOptions,
) {
    let Some(p) = sh.placement.get() else {
        return;
    };
    // The host's load as the site sees it (our own record, the same a
    // peer reads), less the daemon's own share: CPUs other work keeps busy
    // are out of the plan's budget, so a busy host runs fewer threads.
    let load = sh
        .site
        .get()
        .and_then(|s| s.members().into_iter().next())
        .map(|m| (m.cpu_load, m.own_cpu));
    let busy = load.map_or(0, |(l, own)| {
        ramsys_sched::busy_from_load(l - own, p.topo.nodes.iter().map(|n| n.cpus.len()).sum())
    });
    let Some((plan, storage, nic, busy)) =
        p.task_plan(sink, path, local, opts.block_size as u64, busy)
    else {
        return;
    };
    let configured = p.device_threads.get(&storage).copied();
    // Floor 1 for readers: the storage layer already gives a rotational
    // device one thread per device queue (seed 000 6.1.2), so the plan
    // cannot starve it; writers: SINK_WRITERS_MIN (buffered writes).
    let floor = if sink {
        crate::daemon::config::placement::SINK_WRITERS_MIN
    } else {
        1
    };
    let c = crate::daemon::config::placement::task_counts(
        &plan,
        sink,
        &storage,
        &nic,
        configured,
        &sh.res.config,
        floor,
    );
    if sink {
        let plain = crate::daemon::config::placement::task_counts(
            &plan,
            sink,
            &storage,
            &nic,
            configured,
            &sh.res.config,
            1,
        );
        opts.bulk_writers = (plain.storage < c.storage).then_some(plain.storage);
        opts.writers = c.storage;
    } else {
        opts.readers = c.storage;
    }
    tracing::info!(
        "task {}: plan {storage} {} {nic}: {} storage threads, {:.1} Gbps predicted ({} bound)",
        task.id(),
        if sink { "<-" } else { "->" },
        c.storage,
        plan.predicted.gbps,
        plan.predicted.bottleneck
    );
    if let Ok(mut v) = serde_json::to_value(&plan) {
        v["storage_device"] = storage.into();
        v["nic"] = nic.into();
        v["followed"] =
            serde_json::json!({"storage_threads": c.storage, "planned_network_threads": c.network});
        if let Some((l, own)) = load {
            v["host_load"] = serde_json::json!({"cpu_load": l, "own_cpu": own, "busy_cpus": busy});
        }
        task.set_plan(v);
    }
}

/// Placeholder left behind when a link is handed elsewhere.
pub(crate) use crate::transport::ClosedLink;
