//! A site of daemons (issue 19, seed 003 ch. 2, docs/SITE.md): the
//! daemons named by `serve --peer` / `[site]` share a DDSS substrate
//! (crates/ddss) over authenticated links, and each publishes its load in
//! a version-based segment homed on itself that the others pull every
//! interval (the seed's front-end based, pull monitoring, lines ~599-641,
//! at its default T = 50 ms).
//!
//! Links: a daemon dials each member and sends SiteHello as its first
//! message (the same challenge/response as every ramsys connection, with
//! the daemon's key or the `[site] user`'s key from the users table);
//! the dialed daemon's dispatcher hands the link to [`Site::serve_peer`],
//! which answers DDSS requests against its store (the responder thread
//! standing in for one-sided RDMA).

pub mod member;
pub mod redirect;
pub mod sample;
pub mod share;
pub mod storage;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ramsys_ddss::{Error as DdssError, Key, Model, Node, Placement};
use ramsys_proto::auth::{ClientHandshake, ServerHandshake};
use ramsys_proto::Control;

use crate::daemon::users::Credentials;
use crate::session::random32;
use crate::site::member::SiteMember;
use crate::transport::tcp::Tcp;
use crate::transport::{Link, Transport};
use crate::wire::{exchange_preamble, recv_control, send_control};
use crate::EngineError;

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
        }
    }
}

/// Check an interval given by a user.
pub fn check_interval(ms: u64) -> Result<u64, String> {
    if (1..=1024).contains(&ms) {
        Ok(ms)
    } else {
        Err(format!("site interval {ms} ms: must be 1-1024"))
    }
}

/// Check a `max_load` given by a user, in percent; the busy fraction.
pub fn check_load_pct(pct: u64) -> Result<f64, String> {
    if (1..=100).contains(&pct) {
        Ok(pct as f64 / 100.0)
    } else {
        Err(format!("max load {pct} %: must be 1-100"))
    }
}

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

#[derive(Debug, Clone, Default)]
struct View {
    load: Load,
    last_ok: Option<Instant>,
    error: Option<String>,
    retry_at: Option<Instant>,
    fails: u32,
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
}

/// Open an authenticated site link to `addr` as `me` (SiteHello; the
/// same challenge/response as a client session).
pub fn dial(addr: &str, me: &str, user: &str, key: &[u8]) -> Result<Box<dyn Link>, EngineError> {
    let t = Tcp {
        socket_buffer: None,
    };
    let mut l = t.connect(addr, DIAL_TIMEOUT)?;
    l.set_read_timeout(Some(REPLY_TIMEOUT))?;
    exchange_preamble(&mut *l)?;
    let mut hs = ClientHandshake::new(key, user, random32());
    let Control::Hello { nonce, user } = hs.hello() else {
        unreachable!("hello() returns Hello")
    };
    send_control(
        &mut *l,
        &Control::SiteHello {
            nonce,
            user,
            addr: me.to_string(),
        },
    )?;
    let ch = recv_control(&mut *l)?;
    if let Control::Error { message, .. } = &ch {
        return Err(EngineError::Refused(message.clone()));
    }
    let auth = hs.on_challenge(&ch)?;
    send_control(&mut *l, &auth)?;
    match recv_control(&mut *l)? {
        Control::AuthOk { .. } => Ok(l),
        Control::Error { message, .. } => Err(EngineError::Refused(message)),
        other => Err(EngineError::local(format!(
            "site peer {addr} answered {} to Auth",
            other.name()
        ))),
    }
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

    /// Is `addr` another member of the site (configured or dialled in)?
    pub fn is_peer(&self, addr: &str) -> bool {
        addr != self.node.me() && self.node.members().iter().any(|m| m == addr)
    }

    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Publish ours and pull everyone's, every interval, forever.
    fn monitor(
        &self,
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
            for m in self.node.members() {
                let due = {
                    let v = self.views.lock().unwrap();
                    v.get(&m).and_then(|v| v.retry_at).is_none_or(|t| t <= t0)
                };
                if !due {
                    continue;
                }
                let k = Key {
                    name: LOAD_SEGMENT.into(),
                    home: m.clone(),
                };
                let r = match self.node.get(&k) {
                    Ok(v) => postcard::from_bytes::<Load>(&v.data)
                        .map_err(|e| format!("malformed load: {e}")),
                    // Up, but has not published yet.
                    Err(DdssError::NoSuchKey(_)) => Err(String::new()),
                    Err(e) => Err(e.to_string()),
                };
                self.update(&m, r);
            }
            on_view(self.node.me(), &self.members());
            std::thread::sleep(self.interval.saturating_sub(t0.elapsed()));
        }
    }

    fn update(&self, m: &str, r: Result<Load, String>) {
        let mut views = self.views.lock().unwrap();
        let v = views.entry(m.to_string()).or_default();
        match r {
            Ok(l) => {
                v.load = l;
                v.last_ok = Some(Instant::now());
                v.error = None;
                v.fails = 0;
                v.retry_at = None;
            }
            Err(e) if e.is_empty() => v.last_ok = Some(Instant::now()),
            Err(e) => {
                // Back off a dead member (up to 1 s) so it cannot stall
                // the monitoring of the others.
                v.fails += 1;
                let wait = (self.interval * v.fails.min(20)).min(Duration::from_secs(1));
                v.retry_at = Some(Instant::now() + wait);
                if v.error.is_none() {
                    tracing::warn!("site member {m}: {e}");
                }
                v.error = Some(e);
            }
        }
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
    /// like a Hello, then serve its DDSS requests until it closes.
    pub fn serve_peer(
        &self,
        creds: &Credentials,
        link: &mut Box<dyn Link>,
        hello: &Control,
    ) -> Result<(), EngineError> {
        let Control::SiteHello { nonce, user, addr } = hello else {
            return Err(EngineError::local("serve_peer without SiteHello"));
        };
        let pending = creds.lookup(user);
        let mut hs = ServerHandshake::new(&pending.key, random32());
        let ch = hs.on_hello(
            &Control::Hello {
                nonce: *nonce,
                user: user.clone(),
            },
            0,
        )?;
        send_control(&mut **link, &ch)?;
        let auth = recv_control(&mut **link)?;
        let grant = match hs.on_auth(&auth) {
            Ok(_) => creds.admit(pending).ok(),
            Err(_) => None,
        };
        // One-time credentials are for transfers, not site membership.
        let Some(_grant) = grant.filter(|g| !g.token) else {
            tracing::warn!("{}: site peer failed authentication; closing", link.peer());
            crate::wire::send_final(
                &mut **link,
                &Control::Error {
                    code: 1,
                    message: "authentication failed".into(),
                },
            );
            return Ok(());
        };
        send_control(&mut **link, &Control::AuthOk { session: 0 })?;
        if !addr.is_empty() && addr.len() <= 256 {
            self.node.add_member(addr);
        }
        // A member pulls at least every second (its back-off's cap), so a
        // link silent this long belongs to a peer that died without
        // closing it: end the responder thread.
        link.set_read_timeout(Some(PEER_IDLE))?;
        tracing::info!("{}: site link from {addr}", link.peer());
        self.node.serve_peer(link)?;
        Ok(())
    }
}
