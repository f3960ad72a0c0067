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

use crossbeam_channel::Sender;
use ramsys_proto::auth::verify_join;
use ramsys_proto::control::{Bytes32, Role};
use ramsys_proto::Control;

use crate::daemon::credentials::{Credentials, Users};
use crate::daemon::status::{snapshot, Status, UserStatus};
use crate::daemon::users::ExportRoot;
use crate::daemon::{netdev, DaemonState};
use crate::data::resources::EngineResources;
use crate::session::options::TransferOptions;
use crate::session::ServerLinks;
use crate::transport::crypto::random32;
use crate::transport::Link;
use crate::types::error::EngineError;

// Accepting connections: one dispatcher thread, limits (issue 34).
mod accept;
// The handshake, sealing, tokens and authorization.
mod auth;
pub mod limits;
// What an Open asks for: paths, options, tops.
mod open;
// The daemon's placement of a task (issue 7).
mod placement;
// The preamble and the site's redirect (issue 19).
mod redirect;
// Third-party transfers through a site peer.
mod relay;
// The request: status, token, relay, or a session run here.
mod request;
// A replication job's channel and the sessions it keeps (issue 38).
mod kept;

use auth::{authenticate, authorize, register, seal};
use redirect::{preamble, sent_elsewhere};
use request::{run_session, serve_request};

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
    /// When the last session ended, until the idle daemon gave its buffer
    /// pool's pages back (server::accept).
    pub idle_since: Mutex<Option<std::time::Instant>>,
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
    /// Continuous replication jobs this daemon runs (`[[replicate]]`,
    /// issue 38): their counters for status and metrics.
    pub jobs: crate::daemon::jobs::JobBoard,
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
        s.memory.session_budget_bytes = self.opts.meta_budget;
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
        s.jobs = self.jobs.snapshot();
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
                idle_since: Mutex::new(None),
                state,
                listen,
                placement: std::sync::OnceLock::new(),
                one_shot: std::sync::OnceLock::new(),
                site: std::sync::OnceLock::new(),
                rates: Default::default(),
                life: Default::default(),
                jobs: Default::default(),
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
    crate::types::phase::start();
    let Some(mut auth) = authenticate(sh, link, hello, user, path)? else {
        return Ok(());
    };
    crate::types::phase::mark("sink_auth_checked");
    let (session, skey) = (auth.session, auth.key);
    // Removed again on every exit from here on.
    let (registered, rx) = register(sh, link, &auth)?;
    let Some((first, flags, sealed)) = seal(link, &skey)? else {
        return Ok(());
    };
    let Some((mut pre, first)) = preamble(sh, link, &mut auth, (first, flags, sealed))? else {
        return Ok(());
    };
    // A replication job's channel (issue 38): its batches' sessions
    // register under keys of their own (server::kept), never this one.
    if let Control::WatchOpen { version, dest } = first {
        drop(registered);
        return kept::serve_watch(sh, link, &mut auth, (version, dest), (path, sealed));
    }
    let Some(req) = serve_request(sh, link, &auth, (first, pre.flags))? else {
        return Ok(());
    };
    let req = match pre.apply(req, path) {
        Ok(r) => r,
        Err(m) => {
            refuse(link, 1, m);
            return Ok(());
        }
    };
    if !authorize(sh, link, &auth.grant, &req.open) {
        return Ok(());
    }
    if sent_elsewhere(sh, link, (session, &skey), &req, &pre) {
        return Ok(());
    }
    if let Some(from) = &pre.redirected {
        tracing::info!("session {session:x}: redirected here by {from}");
    }
    let links = ServerLinks {
        rx,
        timeout: Duration::from_secs(30),
        session_key: Some(skey),
        control: link.try_clone_link().ok(),
    };
    let r = run_counted(sh, link, (session, &auth.grant), req, links, false);
    drop(registered);
    if let Some(d) = &mut auth.one_shot {
        d.1 = r.as_ref().map(|_| ()).map_err(|e| e.to_string());
    }
    r
}

/// Run an authorized session (request::run_session), counted among the
/// daemon's active ones while it runs, its entry closed after; `keep`:
/// hand a sink's control link back into `link` (server::kept).
fn run_counted(
    sh: &Arc<DaemonShared>,
    link: &mut Box<dyn Link>,
    (session, grant): (u64, &crate::daemon::credentials::Grant),
    req: request::Request,
    links: ServerLinks,
    keep: bool,
) -> Result<(), EngineError> {
    sh.active.fetch_add(1, Ordering::Relaxed);
    let r = run_session(sh, link, session, grant, req, links, keep);
    if sh.active.fetch_sub(1, Ordering::Relaxed) == 1 {
        *sh.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now());
    }
    crate::types::phase::mark("sink_session_end");
    sh.state.close_session(session);
    match &r {
        Ok(()) => tracing::info!("session {session:x} complete"),
        Err(e) => tracing::warn!("session {session:x} failed: {e}"),
    }
    crate::types::stats::return_freed_memory();
    r
}

/// Placeholder left behind when a link is handed elsewhere.
pub(crate) use crate::transport::ClosedLink;
