//! Connection setup: version preamble, the handshake (proto::auth: Noise
//! NNpsk0, issue 34) and data-link joins, for both the connecting (client)
//! and accepting (server) side.

pub mod control;
pub mod options;
pub mod relink;
pub mod report;

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Receiver;
use ramsys_proto::auth::{join_mac, ClientHandshake, ServerHandshake};
use ramsys_proto::control::Bytes32;
use ramsys_proto::{Control, ProtoError};

use crate::transport::wire::{connect_err, handshake_data_link, read_preamble, send_batch_flagged};
use crate::transport::wire::{recv_control, send_control};
use crate::transport::{Link, Transport};
use crate::types::error::EngineError;
use ramsys_proto::preamble;

use crate::transport::crypto::random32;

/// The user name we authenticate as: `$RAMSYS_USER` (e.g. a one-time
/// credential's `otp-…` name), else the login name.
pub fn current_user() -> String {
    std::env::var("RAMSYS_USER")
        .ok()
        .filter(|u| !u.is_empty())
        .map_or_else(|| std::env::var("USER"), Ok)
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".into())
}

/// A control connection, client side.
pub struct ClientSession {
    pub ctl: Box<dyn Link>,
    pub session: u64,
    pub session_key: Bytes32,
    pub addr: String,
    /// Auth was sent but AuthOk not yet read (pipelined connect): the
    /// session controller reads it before its first answer.
    pub auth_pending: bool,
    /// The daemon's TCP buffer limits (in its Challenge's Accept); None
    /// when it did not send them.
    pub peer_tcp: Option<ramsys_proto::control::TcpBuffers>,
}

fn auth_refused(addr: &str) -> EngineError {
    EngineError::local(format!(
        "authentication failed: the daemon at {addr} refused our key (check --key-file)"
    ))
}

/// How a client reaches a daemon, in one value (issue 37: it replaces the
/// positional `client_connect{,_as,_pipelined,_pipelined_as}` family).
/// `user` defaults to [`current_user`]; a daemon with a users table picks
/// the key by it (a one-time credential's `otp-…` name).
///
/// ```ignore
/// let s = Connect::new(addr, key, timeout).user("alice").open(&tcp)?;
/// ```
#[derive(Debug, Clone)]
pub struct Connect<'a> {
    pub addr: &'a str,
    pub user: String,
    pub key: &'a [u8],
    pub timeout: Duration,
    pub greeting: Greeting<'a>,
}

impl<'a> Connect<'a> {
    /// A session as the current user.
    pub fn new(addr: &'a str, key: &'a [u8], timeout: Duration) -> Self {
        Connect {
            addr,
            user: current_user(),
            key,
            timeout,
            greeting: Greeting::Session,
        }
    }

    /// Authenticate as `user`.
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.user = user.into();
        self
    }

    /// Open a site link (SiteHello) announcing `me` instead of a session.
    pub fn site(mut self, me: &'a str) -> Self {
        self.greeting = Greeting::Site { me };
        self
    }

    /// Dial, prove the key, and return as soon as our proof is sent: the
    /// caller pipelines its request behind it and reads AuthOk later
    /// ([`finish_auth`]). Preamble and Hello travel in one segment, so the
    /// whole handshake costs one round trip after TCP's.
    pub fn pipelined(&self, transport: &dyn Transport) -> Result<ClientSession, EngineError> {
        self.handshake(dial(transport, self.addr, self.timeout)?)
    }

    /// [`Connect::pipelined`] on a control link already dialled.
    pub fn handshake(&self, ctl: Box<dyn Link>) -> Result<ClientSession, EngineError> {
        let who = (self.user.as_str(), self.key);
        client_handshake(ctl, self.addr, who, self.timeout, self.greeting)
    }

    /// Dial and authenticate completely, AuthOk read (status and token
    /// queries, site links, tests).
    pub fn open(&self, transport: &dyn Transport) -> Result<ClientSession, EngineError> {
        self.finished(self.pipelined(transport)?)
    }

    /// [`Connect::open`] on a control link already dialled.
    pub fn open_on(&self, ctl: Box<dyn Link>) -> Result<ClientSession, EngineError> {
        self.finished(self.handshake(ctl)?)
    }

    fn finished(&self, mut s: ClientSession) -> Result<ClientSession, EngineError> {
        finish_auth(&mut *s.ctl, self.addr, s.session)?;
        s.auth_pending = false;
        Ok(s)
    }
}

/// Open the control link (its TCP handshake is the path's first RTT
/// sample, transport::path).
pub fn dial(
    transport: &dyn Transport,
    addr: &str,
    timeout: Duration,
) -> Result<Box<dyn Link>, EngineError> {
    transport
        .connect(addr, timeout)
        .map_err(|e| connect_err(addr, e))
}

/// What a client's first message opens: a session (Hello) or a site link
/// (SiteHello, announcing `me`, the dialling daemon's listen address).
#[derive(Debug, Clone, Copy)]
pub enum Greeting<'a> {
    Session,
    Site { me: &'a str },
}

/// The client side of the handshake (proto::auth, issue 34), for every
/// caller: the agent's sessions, status and token queries, relays, site
/// links. Preamble and Hello travel in one segment; the daemon's
/// Challenge proves it holds the key (checked here, before anything else
/// is sent), and we return as soon as our Auth is out: one round trip,
/// AuthOk is read later ([`finish_auth`]), and data links may join now.
fn client_handshake(
    mut ctl: Box<dyn Link>,
    addr: &str,
    (user, key): (&str, &[u8]),
    timeout: Duration,
    greeting: Greeting,
) -> Result<ClientSession, EngineError> {
    ctl.set_read_timeout(Some(timeout))?;
    // The flag asks for the daemon's TCP limits with the Challenge
    // (transport::path); a site link has no use for them.
    let (mut hs, flags) = match greeting {
        Greeting::Session => (
            ClientHandshake::new(key, user),
            ramsys_proto::frame::HELLO_PATH_FLAG,
        ),
        Greeting::Site { me } => (ClientHandshake::site(key, user, me), 0),
    };
    let pre = preamble(ramsys_proto::VERSION);
    send_batch_flagged(&mut *ctl, &pre, &[&hs.hello()?], flags)?;
    read_preamble(&mut *ctl, addr)?;
    let reply = recv_control(&mut *ctl).map_err(|e| match e {
        EngineError::PeerClosed => auth_refused(addr),
        other => other,
    })?;
    if let Control::Error { message, .. } = &reply {
        // A wrong key (or an unknown name) is refused right at the Hello.
        return Err(match message.contains("authentication") {
            true => auth_refused(addr),
            false => EngineError::Refused(message.clone()),
        });
    }
    let auth = hs.on_challenge(&reply).map_err(|e| match e {
        ProtoError::AuthFailed => EngineError::local(format!(
            "authentication failed: the daemon at {addr} does not hold our key (check --key-file)"
        )),
        other => other.into(),
    })?;
    send_control(&mut *ctl, &auth)?;
    let accept = hs
        .accepted()
        .ok_or_else(|| EngineError::local("handshake incomplete"))?;
    let (session, session_key) = hs
        .session()
        .ok_or_else(|| EngineError::local("handshake incomplete"))?;
    Ok(ClientSession {
        ctl,
        session,
        session_key,
        addr: addr.to_string(),
        auth_pending: true,
        peer_tcp: accept.tcp,
    })
}

/// The server side of the handshake (proto::auth), for every listener:
/// daemon sessions (server.rs, ssh-serve's one-session daemon) and site
/// links (site::Site::serve_peer). `first` is the Hello or SiteHello just
/// read, `key` the one its user name selects (daemon::users: a decoy for
/// an unknown name), `accept` what the Challenge tells the client.
/// Some(session key): the client proved the key and this handshake's
/// ephemeral secret. None: it did not (wrong key, unknown name, a
/// replayed Hello, anything but a valid Auth); nothing was answered, the
/// caller refuses as for any failed authentication.
pub fn serve_handshake(
    link: &mut dyn Link,
    first: &Control,
    key: &[u8],
    accept: ramsys_proto::auth::Accept,
) -> Result<Option<Bytes32>, EngineError> {
    let mut hs = match ServerHandshake::accept(key, first) {
        Ok(hs) => hs,
        Err(ProtoError::AuthFailed) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    send_control(link, &hs.challenge(accept)?)?;
    let auth = recv_control(link)?;
    Ok(hs.on_auth(&auth).ok().map(|(_, k)| k))
}

/// Read the AuthOk that [`client_connect_pipelined`] left pending.
pub fn finish_auth(ctl: &mut dyn Link, addr: &str, session: u64) -> Result<(), EngineError> {
    match recv_control(ctl) {
        Ok(Control::AuthOk { session: s }) if s == session => Ok(()),
        Ok(Control::Error { message, .. }) if message.contains("authentication") => {
            Err(auth_refused(addr))
        }
        Ok(Control::Error { message, .. }) => Err(EngineError::Refused(message)),
        Ok(other) => Err(ProtoError::Unexpected {
            got: other.name(),
            state: "awaiting AuthOk",
        }
        .into()),
        Err(EngineError::PeerClosed) | Err(EngineError::Io(_)) => Err(auth_refused(addr)),
        Err(e) => Err(e),
    }
}

/// Opens the data links of a session once the stream count is agreed.
pub trait LinkProvider: Send {
    fn open(&mut self, streams: u16) -> Result<Vec<Box<dyn Link>>, EngineError>;
    /// The session key the links joined with (data keys derive from it,
    /// crate::transport::crypto); None if not known yet.
    fn session_key(&self) -> Option<Bytes32>;
    /// How links lost mid-transfer are replaced (crate::session::relink); call
    /// after [`Self::open`].
    fn relinks(&mut self) -> crate::session::relink::Relinks {
        crate::session::relink::Relinks::None
    }
}

fn dialer(
    transport: &Arc<dyn Transport>,
    addr: &str,
    session: u64,
    key: Bytes32,
    timeout: Duration,
) -> crate::session::relink::Relinks {
    crate::session::relink::Relinks::Dial(Arc::new(crate::session::relink::Dialer {
        transport: transport.clone(),
        addr: addr.to_string(),
        session,
        key,
        timeout,
        backoff: Default::default(),
    }))
}

/// Client side: dial `streams` connections and join each to the session.
pub struct ClientLinks {
    pub transport: Arc<dyn Transport>,
    pub addr: String,
    pub session: u64,
    pub session_key: Bytes32,
    pub timeout: Duration,
}

impl ClientLinks {
    fn join(&self, stream: u16) -> Result<Box<dyn Link>, EngineError> {
        let l = self
            .transport
            .connect(&self.addr, self.timeout)
            .map_err(|e| connect_err(&self.addr, e))?;
        l.set_read_timeout(Some(self.timeout))?;
        join_link(l, &self.addr, self.session, &self.session_key, stream)
    }
}

/// Send preamble + Join in one segment and wait for JoinOk.
fn join_link(
    l: Box<dyn Link>,
    addr: &str,
    session: u64,
    key: &Bytes32,
    stream: u16,
) -> Result<Box<dyn Link>, EngineError> {
    let nonce = random32();
    let mac = join_mac(key, session, stream, &nonce);
    let join = Control::Join {
        session,
        stream,
        nonce,
        mac,
    };
    handshake_data_link(l, addr, &join)
}

/// Data links dialled before the stream count is agreed: TCP connects start
/// together with the control connection and each link joins as soon as the
/// session id and key are known, so links are ready when Confirm arrives
/// instead of costing two more round trips after it. Links beyond the
/// confirmed count are simply dropped.
///
/// A link's JoinOk comes only once the peer takes it, after the whole
/// metadata exchange (a scan and a comparison that grow with the tree), so
/// the dialers wait for it without a clock of their own: [`Self::open`]
/// bounds the wait from the moment the session needs the links (issue 36:
/// no fixed timeout a big tree can outgrow), and a link given up on is
/// shut down so its dialer ends.
pub struct PreLinks {
    dialers: Vec<Dialing>,
    key: Option<Bytes32>,
    /// For replacements (crate::session::relink).
    transport: Arc<dyn Transport>,
    addr: String,
    timeout: Duration,
    join_wait: Duration,
    session: u64,
}

/// One link being dialled on a thread of its own.
struct Dialing {
    result: crossbeam_channel::Receiver<Result<Box<dyn Link>, EngineError>>,
    go: crossbeam_channel::Sender<(u64, Bytes32)>,
    /// A clone of the connection while it waits for JoinOk, to end that
    /// wait when the session gives up on the link.
    conn: Arc<std::sync::Mutex<Option<Box<dyn Link>>>>,
}

impl Drop for Dialing {
    fn drop(&mut self) {
        if let Some(l) = self.conn.lock().unwrap().take() {
            l.shutdown_both();
        }
    }
}

impl PreLinks {
    /// Start connecting `n` links to `addr` (each connect within
    /// `timeout`). Once the session needs them, [`Self::open`] waits up to
    /// `join_wait` (at least `timeout`) for their JoinOk: the server
    /// answers only once the session has its threads, and a daemon may
    /// hold the task suspended until then (docs/DAEMON.md), so this is the
    /// wait for Confirm (the idle timeout), not the connect timeout.
    pub fn start(
        transport: Arc<dyn Transport>,
        addr: &str,
        n: u16,
        timeout: Duration,
        join_wait: Duration,
    ) -> PreLinks {
        let mut p = PreLinks {
            dialers: Vec::new(),
            key: None,
            transport,
            addr: addr.to_string(),
            timeout,
            join_wait,
            session: 0,
        };
        p.resize(n);
        p
    }

    /// Dial more links, or drop the last ones (they have not joined: their
    /// dialers end without a word), before [`Self::join`]: the count
    /// changed once the daemon's limits were known (transport::path).
    pub fn resize(&mut self, n: u16) {
        self.dialers.truncate(n as usize);
        for i in self.dialers.len() as u16..n {
            let (go, go_rx) = crossbeam_channel::bounded::<(u64, Bytes32)>(1);
            let (tx, result) = crossbeam_channel::bounded(1);
            let conn = Arc::new(std::sync::Mutex::new(None));
            let (t, a, c, timeout) = (
                self.transport.clone(),
                self.addr.clone(),
                conn.clone(),
                self.timeout,
            );
            std::thread::Builder::new()
                .name(format!("dial-{i}"))
                .spawn(move || {
                    let r = (|| {
                        let l = t.connect(&a, timeout).map_err(|e| connect_err(&a, e))?;
                        *c.lock().unwrap() = l.try_clone_link().ok();
                        l.set_read_timeout(None)?;
                        let (session, key) = go_rx
                            .recv()
                            .map_err(|_| EngineError::local("session setup abandoned"))?;
                        join_link(l, &a, session, &key, i)
                    })();
                    let _ = tx.send(r);
                })
                .expect("spawn dialer");
            self.dialers.push(Dialing { result, go, conn });
        }
    }

    /// Links dialled (or being dialled).
    pub fn len(&self) -> usize {
        self.dialers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.dialers.is_empty()
    }

    /// The session is known: let every link join it.
    pub fn join(&mut self, session: u64, key: Bytes32) {
        self.key = Some(key);
        self.session = session;
        for d in &self.dialers {
            let _ = d.go.send((session, key));
        }
    }
}

impl LinkProvider for PreLinks {
    fn open(&mut self, streams: u16) -> Result<Vec<Box<dyn Link>>, EngineError> {
        if streams as usize > self.dialers.len() {
            return Err(EngineError::local(format!(
                "peer confirmed {streams} streams, more than the {} proposed",
                self.dialers.len()
            )));
        }
        // Surplus links: dropped; the daemon refuses their stream numbers.
        self.dialers.truncate(streams as usize);
        let wait = self.timeout.max(self.join_wait);
        let deadline = std::time::Instant::now() + wait;
        let mut out = Vec::new();
        for (i, d) in self.dialers.drain(..).enumerate() {
            match d.result.recv_deadline(deadline) {
                Ok(r) => {
                    // Joined (or failed on its own): nothing to shut down.
                    d.conn.lock().unwrap().take();
                    out.push(r?);
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    return Err(EngineError::local(format!(
                        "{} did not accept data connection {i} within {} s of the session \
                         asking for it",
                        self.addr,
                        wait.as_secs()
                    )))
                }
                Err(_) => return Err(EngineError::local("dial thread ended without a word")),
            }
        }
        Ok(out)
    }
    fn session_key(&self) -> Option<Bytes32> {
        self.key
    }
    fn relinks(&mut self) -> crate::session::relink::Relinks {
        match self.key {
            Some(k) => dialer(&self.transport, &self.addr, self.session, k, self.timeout),
            None => crate::session::relink::Relinks::None,
        }
    }
}

impl LinkProvider for ClientLinks {
    fn open(&mut self, streams: u16) -> Result<Vec<Box<dyn Link>>, EngineError> {
        // Dial in parallel: on a long path each join costs round trips.
        let this = &*self;
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..streams)
                .map(|i| s.spawn(move || this.join(i)))
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(EngineError::local("join thread panicked")))
                })
                .collect()
        })
    }
    fn session_key(&self) -> Option<Bytes32> {
        Some(self.session_key)
    }
    fn relinks(&mut self) -> crate::session::relink::Relinks {
        dialer(
            &self.transport,
            &self.addr,
            self.session,
            self.session_key,
            self.timeout,
        )
    }
}

/// Server side: links arrive through the daemon's dispatcher as (stream,
/// epoch, link); epoch 0 is a first Join, higher ones replacements
/// (Rejoin, crate::session::relink).
pub struct ServerLinks {
    pub rx: Receiver<(u16, u16, Box<dyn Link>)>,
    pub timeout: Duration,
    pub session_key: Option<Bytes32>,
    /// The session's control link, watched while waiting: a client that
    /// died during setup must not hold the session's threads and buffers
    /// for the whole timeout (its next run would wait for them).
    pub control: Option<Box<dyn Link>>,
}

impl LinkProvider for ServerLinks {
    fn open(&mut self, streams: u16) -> Result<Vec<Box<dyn Link>>, EngineError> {
        let mut slots: Vec<Option<Box<dyn Link>>> = (0..streams).map(|_| None).collect();
        let mut got = 0;
        let deadline = std::time::Instant::now() + self.timeout;
        while got < streams {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let next = self.rx.recv_timeout(left.min(Duration::from_millis(200)));
            let (i, epoch, mut l) = match next {
                Ok(v) => v,
                Err(_) if self.control.as_ref().is_some_and(|c| c.peer_gone()) => {
                    return Err(EngineError::local(
                        "peer closed the control connection during setup",
                    ))
                }
                Err(_) if left > Duration::from_millis(200) => continue,
                Err(_) => {
                    return Err(EngineError::local(
                        "peer did not open its data connections in time",
                    ))
                }
            };
            match slots.get_mut(i as usize) {
                Some(s @ None) if epoch == 0 => {
                    send_control(&mut *l, &Control::JoinOk)?;
                    *s = Some(l);
                    got += 1;
                }
                _ => {
                    tracing::warn!("refusing data link for stream {i} (duplicate or out of range)");
                    let _ = send_control(
                        &mut *l,
                        &Control::Error {
                            code: 3,
                            message: format!("stream {i} duplicate or out of range"),
                        },
                    );
                }
            }
        }
        Ok(slots.into_iter().map(|s| s.unwrap()).collect())
    }
    fn session_key(&self) -> Option<Bytes32> {
        self.session_key
    }
    fn relinks(&mut self) -> crate::session::relink::Relinks {
        crate::session::relink::Relinks::Accept(self.rx.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Links dialled before the daemon's limits were known are re-sized
    /// before they join: more dialled, the surplus dropped without a word
    /// (the daemon sees a connection closed before its preamble).
    #[test]
    fn pre_dialled_links_grow_and_shrink_before_they_join() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let t: Arc<dyn Transport> = Arc::new(crate::transport::tcp::Tcp::default());
        let s = Duration::from_secs(5);
        let mut p = PreLinks::start(t, &addr, 2, s, s);
        assert_eq!(p.len(), 2);
        p.resize(5);
        assert_eq!(p.len(), 5);
        p.resize(3);
        assert_eq!(p.len(), 3);
        // Five connections arrive; two close before a byte.
        let mut closed = 0;
        for _ in 0..5 {
            let (mut c, _) = l.accept().unwrap();
            c.set_read_timeout(Some(Duration::from_millis(300)))
                .unwrap();
            let mut b = [0u8; 1];
            if matches!(std::io::Read::read(&mut c, &mut b), Ok(0)) {
                closed += 1;
            }
        }
        assert_eq!(closed, 2);
    }
}
