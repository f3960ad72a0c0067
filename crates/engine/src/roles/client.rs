//! The agent's side of a transfer with a daemon: push (we are the source)
//! or pull (we are the sink).

use std::sync::Arc;
use std::time::Duration;

use ramsys_proto::control::{Bytes32, Open, PathList, Role, Selection};
use ramsys_proto::Control;

use crate::data::resources::EngineResources;
use crate::request::walk::Top;
use crate::roles::sink::{run_sink, SinkSpec};
use crate::roles::source::{run_source, run_source_kept, SourceSpec};
use crate::roles::SessionEnd;
use crate::session::options::TransferOptions;
use crate::session::report::Report;
use crate::session::{dial, ClientSession, Connect, PreLinks};
use crate::storage::fsops::Root;
use crate::transport::crypto::Cipher;
use crate::transport::sealed::{End, SealedLink};
use crate::transport::wire::{send_control, send_control_flagged};
use crate::transport::{path, Transport};
use crate::types::error::EngineError;
use crate::types::stats::Stats;

/// Connection parameters for a daemon.
pub struct Remote {
    pub transport: Arc<dyn Transport>,
    pub addr: String,
    pub key: Vec<u8>,
    pub connect_timeout: Duration,
    /// Authenticate as this user (a one-time credential's `otp-…` name);
    /// None: [`crate::session::current_user`].
    pub user: Option<String>,
}

impl Remote {
    /// How to reach the daemon, as the configured user (or the current one).
    pub fn connect(&self) -> Connect<'_> {
        let c = Connect::new(&self.addr, &self.key, self.connect_timeout);
        match &self.user {
            Some(u) => c.user(u.clone()),
            None => c,
        }
    }
}

/// Connect: the control link first, then the data links, dialled while
/// Hello and Challenge are in flight (they join the session as soon as
/// the Challenge names it). With `auto_streams` their number comes from
/// the control link's handshake RTT (transport::path, issue 21); the
/// returned options carry the count to Open and Propose. `idle` bounds
/// the wait for the data links' JoinOk (a suspended task,
/// crate::session::PreLinks::start).
fn connect(
    remote: &Remote,
    opts: &TransferOptions,
    res: &EngineResources,
    source: bool,
) -> Result<
    (
        ClientSession,
        PreLinks,
        TransferOptions,
        Option<path::StreamChoice>,
    ),
    EngineError,
> {
    let ctl = dial(&*remote.transport, &remote.addr, remote.connect_timeout)?;
    crate::types::phase::mark("connected");
    let mut opts = opts.clone();
    let chooser = Chooser::new(&mut opts, res, source, ctl.rtt());
    // First as if the daemon had this host's limits; corrected below once
    // its Challenge says (transport::path).
    let mut choice = chooser.apply(&mut opts, None);
    let mut pre = pre_links(remote, &opts);
    let s = remote.connect().handshake(ctl)?;
    crate::types::phase::mark("challenge");
    if let (Some(c), Some(tcp)) = (&mut choice, s.peer_tcp) {
        *c = chooser.choose(Some(tcp));
        if c.streams as usize != pre.len() {
            tracing::debug!(
                "the daemon's TCP limits change the streams: {} -> {}",
                pre.len(),
                c.streams
            );
            pre.resize(c.streams);
        }
        opts.streams = c.streams;
    }
    if let Some(c) = &choice {
        tracing::info!("streams: {} ({})", c.streams, c.why);
    }
    pre.join(s.session, s.session_key);
    Ok((s, pre, opts, choice))
}

/// How many data links a session starts with (transport::path): from the
/// control link's RTT and both hosts' TCP limits, between the count asked
/// for and what this host's pools allow.
struct Chooser {
    rtt: Option<Duration>,
    least: u16,
    most: u16,
    /// This host's limits, read when first needed (a kept session's batch
    /// with a fixed count never reads them).
    here: std::cell::OnceCell<path::TcpLimits>,
    source: bool,
}

impl Chooser {
    /// Clamps `opts.streams` to this host's limit on the way.
    fn new(
        opts: &mut TransferOptions,
        res: &EngineResources,
        source: bool,
        rtt: Option<Duration>,
    ) -> Chooser {
        let most = res.config.max_streams.clamp(1, u16::MAX as usize) as u16;
        opts.streams = opts.streams.clamp(1, most);
        let buffers = res.config.memory / res.config.buffer_size.max(1);
        let pool = path::pool_max_streams(buffers, opts.readers, opts.window as usize, source);
        Chooser {
            rtt,
            least: opts.streams,
            most: most.min(pool),
            here: std::cell::OnceCell::new(),
            source,
        }
    }

    /// With `--streams auto`, the choice for a daemon of these limits (as
    /// if it had ours when None), set into `opts`; else None.
    fn apply(
        &self,
        opts: &mut TransferOptions,
        daemon: Option<ramsys_proto::control::TcpBuffers>,
    ) -> Option<path::StreamChoice> {
        let c = opts.auto_streams.then(|| self.choose(daemon))?;
        opts.streams = c.streams;
        Some(c)
    }

    /// With the daemon's limits (its Challenge's), or as if it had ours.
    /// Both directions grow from the choice (transport::grow): a push's
    /// source is this agent, a pull's the daemon (Control::GrowStreams).
    fn choose(&self, daemon: Option<ramsys_proto::control::TcpBuffers>) -> path::StreamChoice {
        let here = || path::TcpLimits::read(std::path::Path::new("/"));
        let ends = path::Ends {
            local: *self.here.get_or_init(here),
            remote: daemon.map(Into::into),
            local_sends: self.source,
        };
        let target = path::DEFAULT_TARGET_BYTES_S;
        let mut c = path::choose(self.rtt, ends, target, self.least, self.most);
        c.start_low();
        c
    }
}

/// Start dialling the session's data links (joined once its key is known,
/// PreLinks::join); raw channels (transport::rawlink::Split) carry data
/// links only.
fn pre_links(remote: &Remote, opts: &TransferOptions) -> PreLinks {
    let data = remote.transport.data_links();
    PreLinks::start(
        data.unwrap_or_else(|| remote.transport.clone()),
        &remote.addr,
        opts.streams,
        remote.connect_timeout,
        opts.idle_timeout,
    )
}

/// Under `--encrypt`, ask for a sealed control link and switch to it
/// before the request is sent (transport/sealed.rs): paths, sizes and
/// digests then never travel in clear.
pub(crate) fn seal_control(s: &mut ClientSession, cipher: Cipher) -> Result<(), EngineError> {
    if cipher == Cipher::None {
        return Ok(());
    }
    send_control(
        &mut *s.ctl,
        &Control::SealControl {
            cipher: cipher.id(),
        },
    )?;
    let clear = u32::from(s.auth_pending);
    let inner = std::mem::replace(&mut s.ctl, Box::new(crate::transport::ClosedLink));
    s.ctl = Box::new(SealedLink::new(
        inner,
        cipher,
        &s.session_key,
        End::Client,
        clear,
    )?);
    Ok(())
}

fn open_msg(role: Role, paths: Vec<Vec<u8>>, opts: &TransferOptions) -> Control {
    let open = open_struct(role, paths, opts);
    // An archive copy from a server source: what its scan collects
    // (crate::storage::archive); the selection and sync bits ride along.
    if role == Role::Source && opts.preserve != 0 {
        return Control::ArchiveOpen {
            open,
            flags: opts.sync,
            select: opts.select.clone(),
            preserve: opts.preserve,
        };
    }
    // A selection the server's scan applies (request::filter), or that a
    // server sink keeps from --delete, or (a `--files-from` list) reads
    // whether DST's own attributes are copied (Filter::root_attrs).
    let delete = opts.sync & crate::request::sync::flags::DELETE != 0;
    let listed = !opts.select.files.is_empty();
    if !opts.select.is_empty() && (role == Role::Source || delete || listed) {
        return Control::SelectOpen {
            open,
            flags: opts.sync,
            select: opts.select.clone(),
        };
    }
    // Sync and resume ask through SyncOpen (docs/SYNC.md); cp stays Open.
    if opts.sync != 0 {
        return Control::SyncOpen {
            open,
            flags: opts.sync,
        };
    }
    Control::Open(open)
}

fn open_struct(role: Role, paths: Vec<Vec<u8>>, opts: &TransferOptions) -> Open {
    Open {
        server_role: role,
        paths,
        recursive: opts.recursive,
        streams: opts.streams,
        block_size: opts.block_size,
        checksum: opts.checksum,
    }
}

/// A session opened on a daemon, its request sent: what push and pull
/// share (issue 37: one connect path for both directions).
struct Opened {
    s: ClientSession,
    links: PreLinks,
    opts: TransferOptions,
    choice: Option<path::StreamChoice>,
}

/// Connect, seal the control link if asked, send the preamble the
/// daemon's role wants, then the Open: `server_role` is the daemon's end
/// (Sink for a push, Source for a pull). Everything leaves before any
/// answer is read (seed 000 Fig. 6-4b).
fn open_session(
    remote: &Remote,
    server_role: Role,
    paths: Vec<Vec<u8>>,
    opts: &TransferOptions,
    res: &EngineResources,
) -> Result<Opened, EngineError> {
    let push = server_role == Role::Sink;
    let (mut s, links, opts, choice) = connect(remote, opts, res, push)?;
    // A relay's link (daemon to daemon) is always sealed: OnBehalf names a
    // user, and the sink grants that user's rights on it (issue 34).
    let control = match (opts.encrypt, &opts.on_behalf) {
        (Cipher::None, Some(_)) if push => Cipher::preferred(),
        (c, _) => c,
    };
    seal_control(&mut s, control)?;
    let (ahead, files, request) = request_parts(server_role, paths, &opts);
    let files = files.iter().flat_map(files_chunks);
    for m in ahead.into_iter().chain(files).chain([request]) {
        send_control(&mut *s.ctl, &m)?;
    }
    Ok(Opened {
        s,
        links,
        opts,
        choice,
    })
}

/// The request, in order: what goes ahead of it (preamble, a long
/// `--files-from` list), then the open.
fn request_msgs(server_role: Role, paths: Vec<Vec<u8>>, opts: &TransferOptions) -> Vec<Control> {
    let (mut out, files, request) = request_parts(server_role, paths, opts);
    out.extend(files.iter().flat_map(files_chunks));
    out.push(request);
    out
}

/// The preamble, a `--files-from` list too long for the open (sent ahead
/// of it in chunks), and the open.
fn request_parts(
    server_role: Role,
    paths: Vec<Vec<u8>>,
    opts: &TransferOptions,
) -> (Vec<Control>, Option<PathList>, Control) {
    let mut request = open_msg(server_role, paths, opts);
    let files = match &mut request {
        Control::SelectOpen { select, .. } | Control::ArchiveOpen { select, .. } => {
            files_ahead(select)
        }
        _ => None,
    };
    (preamble(server_role, opts), files, request)
}

/// `--files-from` lists up to this size (encoded) ride in the request;
/// longer ones go ahead of it in SelectFiles chunks (a control frame holds
/// 1 MiB: a pull of 200,000 listed paths failed with "frame of 3000020
/// bytes exceeds the limit").
const FILES_INLINE: usize = 256 << 10;
/// Encoded bytes per SelectFiles chunk, well inside a control frame.
const FILES_CHUNK: usize = 512 << 10;

/// A path's size in a SelectFiles message: its length prefix is at most 3
/// bytes (paths < 2 MiB).
fn listed_size(f: &[u8]) -> usize {
    f.len() + 3
}

/// Take a long `--files-from` list out of `select`, to go ahead of the
/// request (None when it fits in the request).
fn files_ahead(select: &mut Selection) -> Option<PathList> {
    let total: usize = select.files.iter().map(listed_size).sum();
    (total > FILES_INLINE).then(|| std::mem::take(&mut select.files))
}

/// `files` as SelectFiles chunks, in order, each built when the one
/// before has gone out: the list (shared with the options) is not copied
/// whole.
fn files_chunks(files: &PathList) -> impl Iterator<Item = Control> + '_ {
    let mut next = files.iter().peekable();
    std::iter::from_fn(move || {
        let (mut chunk, mut bytes) = (Vec::new(), 0);
        while let Some(f) =
            next.next_if(|f| chunk.is_empty() || bytes + listed_size(f) <= FILES_CHUNK)
        {
            bytes += listed_size(f);
            chunk.push(f.to_vec());
        }
        (!chunk.is_empty()).then_some(Control::SelectFiles { files: chunk })
    })
}

/// What a client may send before its request, in the order the daemon
/// reads it (roles::server::redirect): OnBehalf (a relayed push), BwLimit
/// (a pull: the daemon's senders apply our --bwlimit), Redirected (a
/// session a busy daemon sent here, issue 19: this one admits it rather
/// than redirecting it again), GrowStreams (a pull whose daemon source
/// measures and asks for streams; our sink dials).
fn preamble(server_role: Role, opts: &TransferOptions) -> Vec<Control> {
    let pull = server_role == Role::Source;
    let mut out = Vec::new();
    if let Some(user) = opts.on_behalf.clone().filter(|_| !pull) {
        out.push(Control::OnBehalf { user });
    }
    let bps = opts.rate.session_rate();
    if pull && bps > 0 {
        out.push(Control::BwLimit { bytes_per_s: bps });
    }
    if let Some(from) = opts.redirected_from.clone() {
        out.push(Control::Redirected { from });
    }
    if pull && opts.auto_streams {
        out.push(Control::GrowStreams);
    }
    out
}

/// The session's report with the stream choice and the growth its source
/// saw (ours on a push, the daemon's Control::Grown on a pull), after the
/// redirect check.
fn finish(
    r: Result<Report, EngineError>,
    choice: Option<path::StreamChoice>,
    key: &Bytes32,
) -> Result<Report, EngineError> {
    let r = r.map(|mut r| {
        r.stream_choice = choice.map(|mut c| {
            c.growth = r.growth.take();
            c
        });
        r
    });
    redirect_checked(r, key)
}

/// Send local `tops` (under `root`) to `dest` on the daemon. Auth, Open,
/// Propose and the whole metadata stream leave in one flight.
pub fn push(
    remote: &Remote,
    root: Arc<Root>,
    tops: Vec<Top>,
    dest: Vec<u8>,
    opts: &TransferOptions,
    res: &EngineResources,
    stats: Arc<Stats>,
) -> Result<Report, EngineError> {
    crate::types::phase::start();
    let mut o = open_session(remote, Role::Sink, vec![dest], opts, res)?;
    crate::types::phase::mark("request_sent");
    let spec = SourceSpec {
        root,
        tops,
        pending_auth: Some((o.s.addr.clone(), o.s.session)),
    };
    let key = o.s.session_key;
    let r = run_source(
        o.s.ctl,
        spec,
        SessionEnd::new(&mut o.links, &o.opts, res, stats),
    );
    drop(o.links);
    crate::types::phase::mark("closed");
    finish(r, o.choice, &key)
}

/// Send local `tops` to `dest` as batch `batch` of a watch channel's kept
/// link `kept` (issue 38, docs/PROTOCOL.md "Kept sessions"): WatchBatch,
/// the request and the metadata in one flight, no connect and no
/// handshake; the data links are dialled at once and join the batch's id
/// under its key (proto::auth::{batch_session, batch_key}). The link is handed back into
/// `kept` once the sink's Complete is read; after an error it is left
/// closed (the job opens a new channel).
#[allow(clippy::too_many_arguments)]
pub fn push_kept(
    kept: &mut ClientSession,
    batch: u64,
    remote: &Remote,
    root: Arc<Root>,
    tops: Vec<Top>,
    dest: Vec<u8>,
    opts: &TransferOptions,
    res: &EngineResources,
    stats: Arc<Stats>,
) -> Result<Report, EngineError> {
    crate::types::phase::start();
    let key = ramsys_proto::auth::batch_key(&kept.session_key, batch);
    let mut opts = opts.clone();
    let chooser = Chooser::new(&mut opts, res, true, kept.ctl.rtt());
    // The daemon's limits came with the channel's Challenge.
    let choice = chooser.apply(&mut opts, kept.peer_tcp);
    let mut links = pre_links(remote, &opts);
    links.join(
        ramsys_proto::auth::batch_session(&kept.session_key, batch),
        key,
    );
    // One write: the daemon wakes once for the whole request.
    let mut msgs = vec![Control::WatchBatch { batch }];
    msgs.extend(request_msgs(Role::Sink, vec![dest], &opts));
    let msgs: Vec<&Control> = msgs.iter().collect();
    crate::transport::wire::send_batch(&mut *kept.ctl, &[], &msgs)?;
    crate::types::phase::mark("request_sent");
    let spec = SourceSpec {
        root,
        tops,
        pending_auth: None,
    };
    let ctl = std::mem::replace(&mut kept.ctl, Box::new(crate::transport::ClosedLink));
    let r = run_source_kept(ctl, spec, SessionEnd::new(&mut links, &opts, res, stats));
    drop(links);
    crate::types::phase::mark("closed");
    let r = r.map(|(report, ctl)| {
        kept.ctl = ctl;
        report
    });
    finish(r, choice, &key)
}

/// A Redirect is followed only if our own daemon sent it (its MAC under
/// the session key, issue 34): a forged one ends the session in one line.
fn redirect_checked(r: Result<Report, EngineError>, key: &Bytes32) -> Result<Report, EngineError> {
    match r {
        Err(EngineError::Redirected { to, reason, mac })
            if !ramsys_proto::auth::verify_redirect(key, &to, &reason, &mac) =>
        {
            Err(EngineError::local(format!(
                "refused a redirect to {} that the daemon did not authenticate",
                crate::types::error::show(to.as_bytes())
            )))
        }
        r => r,
    }
}

/// Fetch `paths` from the daemon into `dest` under the local `root`.
pub fn pull(
    remote: &Remote,
    paths: Vec<Vec<u8>>,
    root: Arc<Root>,
    dest: Vec<u8>,
    opts: &TransferOptions,
    res: &EngineResources,
    stats: Arc<Stats>,
) -> Result<Report, EngineError> {
    let mut o = open_session(remote, Role::Source, paths, opts, res)?;
    let spec = SinkSpec {
        root,
        dest,
        session: o.s.session,
        pending_auth: Some(o.s.addr.clone()),
    };
    let key = o.s.session_key;
    let r = run_sink(
        o.s.ctl,
        spec,
        SessionEnd::new(&mut o.links, &o.opts, res, stats),
    );
    finish(r, o.choice, &key)
}

/// The daemon's raw-channel interfaces (RawQuery on a control connection
/// of its own, before the session: the agent needs the MACs before it
/// dials its data links; docs/TYCHE.md "Negotiation"). A daemon that
/// predates RawQuery, or refuses it, offers none.
pub fn raw_offer(remote: &Remote) -> Result<Vec<ramsys_proto::control::RawIface>, EngineError> {
    let mut s = remote.connect().open(&*remote.transport)?;
    send_control(&mut *s.ctl, &Control::RawQuery)?;
    match crate::transport::wire::recv_control(&mut *s.ctl) {
        Ok(Control::RawOffer { ifaces }) => Ok(ifaces),
        Ok(Control::Error { message, .. }) => {
            tracing::debug!("RawQuery refused: {message}");
            Ok(Vec::new())
        }
        Ok(other) => Err(ramsys_proto::ProtoError::Unexpected {
            got: other.name(),
            state: "awaiting RawOffer",
        }
        .into()),
        // An older daemon cannot decode RawQuery and closes.
        Err(e) => {
            tracing::debug!("RawQuery: {e}");
            Ok(Vec::new())
        }
    }
}

/// A one-time credential minted by a daemon (docs/SECURITY.md).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OneTimeCredential {
    /// The name to authenticate as (`otp-…`).
    pub user: String,
    /// The key, as the 64 hex digits a key file would hold.
    pub key: String,
    /// Seconds left to start the one session it allows.
    pub expires_s: u32,
    /// The daemon that minted it.
    pub daemon: String,
}

/// Ask the daemon at `remote` (authenticated as `remote.user` or the
/// current user) for a one-time credential bound to our export root, valid
/// `ttl_s` seconds (0: the daemon's default).
pub fn request_token(remote: &Remote, ttl_s: u32) -> Result<OneTimeCredential, EngineError> {
    let mut s = remote.connect().open(&*remote.transport)?;
    send_control(&mut *s.ctl, &Control::TokenRequest { ttl_s })?;
    match crate::transport::wire::recv_control(&mut *s.ctl)? {
        Control::Token {
            user,
            key,
            expires_s,
        } => {
            let raw = ramsys_proto::auth::seal_token_key(&s.session_key, &user, &key);
            Ok(OneTimeCredential {
                user,
                key: hex::encode(raw),
                expires_s,
                daemon: remote.addr.clone(),
            })
        }
        Control::Error { message, .. } => Err(EngineError::Refused(message)),
        other => Err(ramsys_proto::ProtoError::Unexpected {
            got: other.name(),
            state: "awaiting Token",
        }
        .into()),
    }
}

/// A relay's outcome as the agent gets it: the RelayDone, and the
/// RelayPlaced before it (None: not asked, the relay failed, or a daemon
/// of before sent none).
pub type Relayed = (
    ramsys_proto::control::RelayReport,
    Option<ramsys_proto::control::RelayPlaced>,
);

/// A third-party transfer (issue 19, server::relay): ask the daemon at
/// `remote` (the source) to push to the sink `relay.sink`, and follow its
/// progress into `stats` until its RelayDone. `idle` bounds the wait for
/// any message (the source reports every 500 ms). `ask_placed`: ask which
/// big files in pieces the sink placed (frame::PLACED_FLAG, issue 36; a
/// striped transfer's pairs).
pub fn relay(
    remote: &Remote,
    relay: ramsys_proto::control::Relay,
    stats: &Stats,
    idle: Duration,
    ask_placed: bool,
) -> Result<Relayed, EngineError> {
    use std::sync::atomic::Ordering::Relaxed;
    let cipher = Cipher::from_id(relay.cipher)?;
    let mut s = remote.connect().open(&*remote.transport)?;
    seal_control(&mut s, cipher)?;
    let flags = if ask_placed {
        ramsys_proto::frame::PLACED_FLAG
    } else {
        0
    };
    send_control_flagged(&mut *s.ctl, &Control::RelayOpen(relay), flags)?;
    s.ctl.set_read_timeout(Some(idle))?;
    // The daemon's messages in their order, RelayPlaced checked.
    let mut machine = ramsys_proto::session::RelayMachine::new(flags);
    let mut placed = None;
    loop {
        let m = crate::transport::wire::recv_control(&mut *s.ctl)?;
        machine.on_recv(&m)?;
        match m {
            Control::RelayProgress {
                files,
                bytes,
                total_files,
                total_bytes,
            } => {
                stats.files.store(files, Relaxed);
                stats.bytes.store(bytes, Relaxed);
                stats.total_files.store(total_files, Relaxed);
                stats.total_bytes.store(total_bytes, Relaxed);
            }
            Control::RelayPlaced(p) => placed = Some(p),
            Control::RelayDone(r) => {
                stats.files.store(r.files, Relaxed);
                stats.bytes.store(r.bytes, Relaxed);
                return Ok((r, placed));
            }
            Control::Error { message, .. } => return Err(EngineError::Refused(message)),
            other => unreachable!("the relay machine refuses {}", other.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a Redirect our own daemon authenticated reaches the agent (who
    /// would follow it); a forged or altered one is a one-line error.
    #[test]
    fn only_authenticated_redirects_are_followed() {
        let key = [5u8; 32];
        let good = ramsys_proto::auth::redirect_mac(&key, "10.0.0.2:7070", "busy");
        let r = |to: &str, mac| {
            redirect_checked(
                Err(EngineError::Redirected {
                    to: to.into(),
                    reason: "busy".into(),
                    mac,
                }),
                &key,
            )
        };
        assert!(matches!(
            r("10.0.0.2:7070", good),
            Err(EngineError::Redirected { .. })
        ));
        let e = r("10.6.6.6:7070", good).unwrap_err().to_string();
        assert!(e.contains("did not authenticate"), "{e}");
        assert!(matches!(
            r("10.0.0.2:7070", [0; 32]),
            Err(EngineError::Local(_))
        ));
        assert!(redirect_checked(Ok(Report::default()), &key).is_ok());
    }
}
