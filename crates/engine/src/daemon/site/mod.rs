//! A site of daemons (issue 19, seed 003 ch. 2, docs/SITE.md): the
//! daemons named by `serve --peer` / `[site]` share a DDSS substrate
//! (crates/ddss) over authenticated links, and each publishes its load in
//! a version-based segment homed on itself that the others pull every
//! interval (the seed's front-end based, pull monitoring, lines ~599-641,
//! at its default T = 50 ms).
//!
//! Links: a daemon dials each member and sends SiteHello as its first
//! message (the same handshake as every ramsys connection, with the
//! daemon's key or the `[site] user`'s key from the users table), then
//! seals the link (SealControl, transport/sealed.rs): site links are
//! daemon identity, so only the site credential joins (issue 34), and
//! nothing on the path reads or alters what members tell each other.
//! The dialed daemon's dispatcher hands the link to [`Site::serve_peer`],
//! which answers DDSS requests against its store (the responder thread
//! standing in for one-sided RDMA). Who becomes a member: [`membership`].
//!
//! Monitoring pulls each member's load on a thread of its own (a poller),
//! so a member that is slow or gone costs the others nothing.

pub mod member;
pub mod membership;
pub mod redirect;
pub mod sample;
pub mod share;
pub mod storage;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ramsys_ddss::{Error as DdssError, Key, Model, Node, Placement};
use ramsys_proto::auth::Accept;
use ramsys_proto::control::Bytes32;
use ramsys_proto::Control;

use crate::daemon::credentials::Credentials;
use crate::daemon::site::member::SiteMember;
use crate::daemon::site::membership::Membership;
use crate::session::{serve_handshake, Connect};
use crate::transport::crypto::random32;
use crate::transport::crypto::Cipher;
use crate::transport::sealed::{End, SealedLink};
use crate::transport::tcp::Tcp;
use crate::transport::wire::{recv_control, send_control};
use crate::transport::{Link, Transport};
use crate::types::error::EngineError;

pub use sample::{Load, Sampler};

/// Name of every member's load segment (homed on the member).
pub const LOAD_SEGMENT: &str = "load";
/// Capacity of the load segment: the fixed fields (under 100 bytes of
/// postcard) and share::MAX_PUBLISHED storage entries (up to 15 each).
const LOAD_BYTES: u32 = 512;
/// Bytes of the DDSS pool each daemon homes.
pub const POOL_BYTES: usize = 1 << 20;
/// How long a dialer waits to connect, and for each reply.
const DIAL_TIMEOUT: Duration = Duration::from_millis(500);
const REPLY_TIMEOUT: Duration = Duration::from_secs(1);
/// A site link with no request for this long is closed by its home.
const PEER_IDLE: Duration = Duration::from_secs(60);

/// `serve --peer`, `--site-interval` and the config's `[site]` table.
#[derive(Debug, Clone)]
pub struct SiteOptions {
    pub peers: Vec<String>,
    /// Monitoring period, 1-1024 ms (seed: 1-1024, default 50).
    pub interval_ms: u64,
    /// Root holding proc/ and sys/ for the load sampler ("/").
    pub sys_root: PathBuf,
    /// The name this daemon authenticates as at its peers.
    pub user: String,
    /// Admission limits above which new sessions are redirected to a
    /// peer (`[site] max_sessions`, `max_load`; redirect.rs).
    pub limits: redirect::Limits,
    /// Share the storage-thread budget of devices several members use
    /// (`[site] share_storage`, `--site-share-storage`; site::share).
    pub share_storage: bool,
    /// Members that joined by dialling in, at most (`[site] max_members`,
    /// site::membership).
    pub max_members: usize,
}

impl Default for SiteOptions {
    fn default() -> Self {
        SiteOptions {
            peers: vec![],
            interval_ms: 50,
            sys_root: PathBuf::from("/"),
            user: "site".into(),
            limits: Default::default(),
            share_storage: true,
            max_members: membership::MAX_MEMBERS,
        }
    }
}

// The operator's values are checked where the config file is read
// (daemon::toml::values) and on the command line: one rule each.
pub use crate::daemon::toml::values::{check_interval, check_load_pct};

/// The daemon's own state the monitor publishes (daemon::status).
#[derive(Debug, Clone, Default)]
pub struct LocalLoad {
    pub sessions: u32,
    pub active_tasks: u32,
    pub queued_tasks: u32,
    pub free_buffer_bytes: u64,
    /// Shared storage devices in use (site::share).
    pub storage: Vec<share::StorageUse>,
}

/// Called with the site view (self first) after every monitoring round:
/// the daemon re-reads its storage shares from it (site::share).
pub type OnView = Box<dyn Fn(&str, &[SiteMember]) + Send + Sync>;

#[derive(Debug, Clone)]
struct View {
    load: Load,
    last_ok: Option<Instant>,
    error: Option<String>,
    fails: u32,
    /// When this member was first seen (it may never have answered).
    since: Instant,
}

impl Default for View {
    fn default() -> View {
        View {
            load: Load::default(),
            last_ok: None,
            error: None,
            fails: 0,
            since: Instant::now(),
        }
    }
}

/// This daemon's membership in a site.
pub struct Site {
    node: Arc<Node>,
    interval: Duration,
    views: Mutex<BTreeMap<String, View>>,
    started: Instant,
    limits: redirect::Limits,
    /// Sessions we redirected, by peer, and when: counted as that peer's
    /// tasks until its own load can show them (redirect::Sent).
    sent: Mutex<redirect::Sent>,
    /// How we authenticate at the peers: the `[site] user` and its key (a
    /// relay, server::relay, opens its sessions to a peer with them).
    user: String,
    key: Vec<u8>,
    membership: Membership,
    /// The running pollers, by member: set a flag to stop one.
    pollers: Mutex<BTreeMap<String, Arc<AtomicBool>>>,
}

/// Open an authenticated site link to `addr` as `me` (SiteHello; the
/// same handshake as a client session, session::Connect).
pub fn dial(addr: &str, me: &str, user: &str, key: &[u8]) -> Result<Box<dyn Link>, EngineError> {
    let t = Tcp {
        socket_buffer: None,
    };
    let l = t.connect(addr, DIAL_TIMEOUT)?;
    let s = Connect::new(addr, key, REPLY_TIMEOUT)
        .user(user)
        .site(me)
        .open_on(l)?;
    let (mut l, key) = (s.ctl, s.session_key);
    // Always sealed (issue 34): loads, addresses and segment data travel
    // between daemons only authenticated.
    let cipher = Cipher::preferred();
    send_control(
        &mut *l,
        &Control::SealControl {
            cipher: cipher.id(),
        },
    )?;
    Ok(Box::new(SealedLink::new(l, cipher, &key, End::Client, 0)?))
}

impl Site {
    /// Join the site as `me` (our listen address): allocate our load
    /// segment and start the monitor thread. `key` authenticates us at
    /// the peers as `opts.user`; `local` reads the daemon's own state.
    pub fn start(
        me: &str,
        opts: SiteOptions,
        key: Vec<u8>,
        local: Box<dyn Fn() -> LocalLoad + Send + Sync>,
        on_view: OnView,
    ) -> Arc<Site> {
        let (me_s, user) = (me.to_string(), opts.user.clone());
        let site_key = key.clone();
        let dialer: ramsys_ddss::Dialer = Box::new(move |addr: &str| {
            dial(addr, &me_s, &user, &key)
                .map(|l| Box::new(l) as Box<dyn ramsys_ddss::net::Stream>)
                .map_err(|e| std::io::Error::other(e.to_string()))
        });
        let holder = u64::from_le_bytes(random32()[..8].try_into().expect("8 bytes"));
        let node = Arc::new(Node::new(me, holder, POOL_BYTES, dialer));
        for p in &opts.peers {
            node.add_member(p);
        }
        node.allocate(LOAD_SEGMENT, LOAD_BYTES, Model::Version, Placement::Local)
            .expect("a fresh pool holds the load segment");
        let site = Arc::new(Site {
            node,
            interval: Duration::from_millis(opts.interval_ms.clamp(1, 1024)),
            views: Mutex::new(BTreeMap::new()),
            started: Instant::now(),
            limits: opts.limits,
            sent: Mutex::new(Default::default()),
            user: opts.user.clone(),
            key: site_key,
            membership: Membership::new(&opts.peers, opts.max_members),
            pollers: Mutex::new(BTreeMap::new()),
        });
        let s = site.clone();
        std::thread::Builder::new()
            .name("site-monitor".into())
            .spawn(move || s.monitor(Sampler::new(&opts.sys_root), local, on_view))
            .expect("spawn site monitor");
        site
    }

    /// The site identity: the user name and key this daemon
    /// authenticates with at its peers.
    pub fn credentials(&self) -> (&str, &[u8]) {
        (&self.user, &self.key)
    }

    /// Is `addr` another member of the site (configured, or dialled in and
    /// verified: site::membership)?
    pub fn is_peer(&self, addr: &str) -> bool {
        addr != self.node.me() && self.node.members().iter().any(|m| m == addr)
    }

    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Publish ours every interval, forever; keep one poller per member
    /// (pulling its load) and drop members that aged out.
    fn monitor(
        self: &Arc<Self>,
        mut sampler: Sampler,
        local: Box<dyn Fn() -> LocalLoad + Send + Sync>,
        on_view: OnView,
    ) {
        let me = Key {
            name: LOAD_SEGMENT.into(),
            home: self.node.me().to_string(),
        };
        let mut last: Vec<u8> = vec![];
        loop {
            let t0 = Instant::now();
            let l = local();
            let load = Load {
                sessions: l.sessions,
                active_tasks: l.active_tasks,
                queued_tasks: l.queued_tasks,
                free_buffer_bytes: l.free_buffer_bytes,
                storage: l.storage,
                ..sampler.sample()
            };
            let bytes = postcard::to_stdvec(&load).expect("Load serializes");
            // Version-based: an unchanged load is not even re-put.
            if bytes != last && self.node.put(&me, &bytes, 0).is_ok() {
                last = bytes;
            }
            self.update(self.node.me(), Ok(load));
            self.reconcile();
            on_view(self.node.me(), &self.members());
            std::thread::sleep(self.interval.saturating_sub(t0.elapsed()));
        }
    }

    /// One poller per member; members that dialled in and have not
    /// answered for membership::AGE_OUT go (their poller with them).
    fn reconcile(self: &Arc<Self>) {
        let members = self.node.members();
        let mut pollers = self.pollers.lock().unwrap();
        for m in &members {
            if !self.membership.is_configured(m) && self.aged_out(m) {
                tracing::warn!(
                    "site member {}: no answer for {} s; dropped",
                    m.escape_debug(),
                    membership::AGE_OUT.as_secs()
                );
                self.node.remove_member(m);
                self.views.lock().unwrap().remove(m);
                continue;
            }
            if !pollers.contains_key(m) {
                let stop = Arc::new(AtomicBool::new(false));
                let (s, m2, st) = (self.clone(), m.clone(), stop.clone());
                let spawned = std::thread::Builder::new()
                    .name("site-poll".into())
                    .spawn(move || s.poll(&m2, &st));
                if spawned.is_ok() {
                    pollers.insert(m.clone(), stop);
                }
            }
        }
        let live = self.node.members();
        pollers.retain(|m, stop| {
            let keep = live.contains(m);
            if !keep {
                stop.store(true, Ordering::Relaxed);
            }
            keep
        });
    }

    fn aged_out(&self, m: &str) -> bool {
        let views = self.views.lock().unwrap();
        views.get(m).is_some_and(|v| {
            v.error.is_some() && v.last_ok.unwrap_or(v.since).elapsed() > membership::AGE_OUT
        })
    }

    /// Pull `m`'s load every interval (backing off while it fails) until
    /// `stop`. Its own thread: a member that does not answer delays only
    /// its own view (issue 34).
    fn poll(&self, m: &str, stop: &AtomicBool) {
        let k = Key {
            name: LOAD_SEGMENT.into(),
            home: m.to_string(),
        };
        while !stop.load(Ordering::Relaxed) {
            let t0 = Instant::now();
            let r = match self.node.get(&k) {
                Ok(v) => postcard::from_bytes::<Load>(&v.data)
                    .map_err(|e| format!("malformed load: {e}")),
                // Up, but has not published yet.
                Err(DdssError::NoSuchKey(_)) => Err(String::new()),
                Err(e) => Err(e.to_string()),
            };
            let wait = self.update(m, r);
            std::thread::sleep(wait.saturating_sub(t0.elapsed()));
        }
    }

    /// Record a pull of `m`; returns how long its poller waits before the
    /// next one (the interval, or a back-off of up to 1 s while it fails).
    fn update(&self, m: &str, r: Result<Load, String>) -> Duration {
        let mut views = self.views.lock().unwrap();
        let v = views.entry(m.to_string()).or_default();
        match r {
            Ok(l) => {
                v.load = l;
                v.last_ok = Some(Instant::now());
                v.error = None;
                v.fails = 0;
            }
            Err(e) if e.is_empty() => v.last_ok = Some(Instant::now()),
            Err(e) => {
                v.fails += 1;
                if v.error.is_none() {
                    tracing::warn!("site member {}: {}", m.escape_debug(), e.escape_debug());
                }
                v.error = Some(e);
                return (self.interval * v.fails.min(20)).min(Duration::from_secs(1));
            }
        }
        self.interval
    }

    /// The site as `ramsys status --site` shows it: every member, self
    /// first, with how old our view of it is.
    pub fn members(&self) -> Vec<SiteMember> {
        let views = self.views.lock().unwrap();
        let me = self.node.me().to_string();
        let mut names = vec![me.clone()];
        names.extend(self.node.members());
        names
            .into_iter()
            .map(|m| {
                let v = views.get(&m).cloned().unwrap_or_default();
                let age = v
                    .last_ok
                    .map(|t| t.elapsed())
                    .unwrap_or_else(|| self.started.elapsed());
                let l = &v.load;
                SiteMember {
                    addr: m.clone(),
                    // f32 on the wire; shown with its 1 % rounding.
                    cpu_load: (l.cpu_load as f64 * 100.0).round() / 100.0,
                    own_cpu: (l.own_cpu as f64 * 100.0).round() / 100.0,
                    storage: l.storage.clone(),
                    run_queue: l.run_queue,
                    intr_per_s: l.intr_per_s,
                    softirq_per_s: l.softirq_per_s,
                    net_rx_bps: l.net_rx_bps,
                    net_tx_bps: l.net_tx_bps,
                    disk_read_bps: l.disk_read_bps,
                    disk_write_bps: l.disk_write_bps,
                    sessions: l.sessions,
                    active_tasks: l.active_tasks,
                    queued_tasks: l.queued_tasks,
                    free_buffer_bytes: l.free_buffer_bytes,
                    age_ms: age.as_millis() as u64,
                    error: v.error.clone(),
                }
            })
            .collect()
    }

    /// Admission on site state (redirect.rs): with `sessions` running
    /// and `would_wait` from the daemon's pools, is this daemon at its
    /// limit, and which peer should take a new session instead? Some((peer,
    /// why)): redirect; None: admit here (not busy, or no peer is better).
    pub fn redirect(&self, sessions: u32, would_wait: Option<String>) -> Option<(String, String)> {
        let mut sent = self.sent.lock().unwrap();
        let view = sent.apply(self.members(), self.interval);
        let me = view.first()?;
        let why = redirect::busy(&self.limits, me, sessions, would_wait)?;
        let mine = redirect::score(me);
        let to = redirect::target(&self.limits, self.node.me(), &view, mine)?;
        sent.record(&to);
        Some((to, why))
    }

    /// The least-loaded fresh peer under the limits, whatever our own
    /// load: where a draining daemon sends new sessions.
    pub fn least_loaded_peer(&self) -> Option<String> {
        let mut sent = self.sent.lock().unwrap();
        let view = sent.apply(self.members(), self.interval);
        let to = redirect::target(&self.limits, self.node.me(), &view, f64::INFINITY)?;
        sent.record(&to);
        Some(to)
    }

    /// A peer's SiteHello (first message of a connection): authenticate it
    /// like a Hello, as the site identity only (issue 34), seal the link,
    /// check the address it announces (site::membership), then serve its
    /// DDSS requests until it closes.
    pub fn serve_peer(
        self: &Arc<Self>,
        creds: &Credentials,
        link: &mut Box<dyn Link>,
        hello: &Control,
    ) -> Result<(), EngineError> {
        let Control::SiteHello { user, addr, .. } = hello else {
            return Err(EngineError::local("serve_peer without SiteHello"));
        };
        let pending = creds.lookup(user);
        let accept = Accept {
            session: 0,
            tcp: None,
        };
        let (grant, key) = match serve_handshake(&mut **link, hello, &pending.key, accept)? {
            Some(key) => (creds.admit(pending).ok(), key),
            None => (None, [0; 32]),
        };
        let Some(grant) = grant else {
            tracing::warn!("{}: site peer failed authentication; closing", link.peer());
            refuse_peer(link, "authentication failed");
            return Ok(());
        };
        // Site links are daemon identity: a user's own key (or a one-time
        // credential) authenticates, but joins nothing.
        if !creds.is_site(&grant, &self.user) {
            tracing::warn!(
                "{}: user {} tried to join the site; only the site identity ({}) may",
                link.peer(),
                grant.shown.escape_debug(),
                self.user
            );
            refuse_peer(link, "only the site identity may join the site");
            return Ok(());
        }
        send_control(&mut **link, &Control::AuthOk { session: 0 })?;
        if !self.sealed(link, &key)? {
            return Ok(());
        }
        if !addr.is_empty() {
            self.propose(addr);
        }
        // A member pulls at least every second (its back-off's cap), so a
        // link silent this long belongs to a peer that died without
        // closing it: end the responder thread.
        link.set_read_timeout(Some(PEER_IDLE))?;
        tracing::info!("{}: site link from {}", link.peer(), addr.escape_debug());
        self.node.serve_peer(link)?;
        Ok(())
    }

    /// The dialler's SealControl, then the link sealed both ways; false:
    /// refused (a site link is never clear after AuthOk).
    fn sealed(&self, link: &mut Box<dyn Link>, key: &Bytes32) -> Result<bool, EngineError> {
        let cipher = match recv_control(&mut **link)? {
            Control::SealControl { cipher } => Cipher::from_id(cipher).ok(),
            _ => None,
        };
        let Some(cipher) = cipher.filter(|c| *c != Cipher::None) else {
            refuse_peer(link, "a site link must be sealed (SealControl)");
            return Ok(false);
        };
        let inner = std::mem::replace(link, Box::new(crate::transport::ClosedLink));
        *link = Box::new(SealedLink::new(inner, cipher, key, End::Server, 0)?);
        Ok(true)
    }

    /// A daemon holding the site credential dialled in and announced
    /// `addr`: admit it once `addr` answers the site handshake, dialled
    /// back from here on a thread of its own (site::membership).
    fn propose(self: &Arc<Self>, addr: &str) {
        if addr == self.node.me() || self.is_peer(addr) {
            return;
        }
        if let Err(why) = self.membership.begin(addr, &self.node.members()) {
            tracing::warn!("site member {} not admitted: {why}", addr.escape_debug());
            return;
        }
        let (s, a) = (self.clone(), addr.to_string());
        let r = std::thread::Builder::new()
            .name("site-verify".into())
            .spawn(move || {
                match dial(&a, s.node.me(), &s.user, &s.key) {
                    Ok(_) => {
                        s.node.add_member(&a);
                        tracing::info!("site member {a} admitted: it answered the site handshake");
                    }
                    Err(e) => tracing::warn!(
                        "site member {a} not admitted: it did not answer the site handshake: {}",
                        e.to_string().escape_debug()
                    ),
                }
                s.membership.end(&a);
            });
        if r.is_err() {
            self.membership.end(addr);
        }
    }
}

fn refuse_peer(link: &mut Box<dyn Link>, message: &str) {
    crate::transport::wire::send_final(
        &mut **link,
        &Control::Error {
            code: 1,
            message: message.into(),
        },
    );
}
