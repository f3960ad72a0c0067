//! Control messages, carried in CONTROL frames and encoded with postcard
//! (varint integers, length-prefixed byte strings, enum variants by index;
//! docs/PROTOCOL.md lists every variant and field in wire order).
//!
//! Decoding is bounded: a CONTROL body is at most
//! [`crate::frame::MAX_CONTROL_BODY`] bytes, and every collection inside is
//! bounded by that body, so arbitrary input can never allocate without bound.
//!
//! One file per job, so the wire enum reads on its own (issue 37):
//! - `mod.rs`: the [`Control`] enum, the wire tags, and the re-exports that
//!   keep every message at `control::NAME`.
//! - `open.rs`: opening and negotiating a session (Open, Propose, Confirm,
//!   Selection).
//! - `meta.rs`: metadata records and the final report (Entry, Failure,
//!   Complete).
//! - `sync.rs`: the SyncOpen/SyncMode flag bits; `delta.rs`: what the sink
//!   has and the source's verdict on it (Have, Reuse).
//! - `paths.rs`: `--files-from`'s list, packed (PathList).
//! - `relay.rs`: third-party transfers (Relay, Share, RelayReport,
//!   RelayPlaced).
//! - `transport.rs`: what links and hosts report (TCP buffers, stream growth,
//!   raw interfaces).
//! - `watch.rs`: a watch channel's operations.
//! - `codec.rs`: encoding, bounded decoding and message names.
//! - `tests.rs`: round trips of every variant.

use serde::{Deserialize, Serialize};

mod codec;
mod delta;
mod meta;
mod open;
mod paths;
mod relay;
pub mod sync;
mod transport;
mod watch;

pub use codec::entry_wire_size;
pub use delta::{Have, HaveState, Reuse, ReuseKind};
pub use meta::{Complete, Entry, EntryKind, Failure, MAX_PIECES, SCAN_FAILURES_KEPT};
pub use open::{Confirm, Open, Propose, Role, Selection};
pub use paths::{PathList, PathListFull};
pub use relay::{Relay, RelayPlaced, RelayReport, Share};
pub use transport::{GrowStage, RawIface, StageLinks, TcpBuffers};
pub use watch::{WatchOp, WatchResult, WATCH_SESSIONS, WATCH_VERSION};

/// 256-bit nonce or MAC.
pub type Bytes32 = [u8; 32];

/// Every control message. Variant order is the wire tag; append only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Control {
    /// Client to server: start authentication (crate::auth). `user`
    /// selects the key; `noise` is the Noise handshake's first message
    /// (the client's ephemeral key and a tag under the PSK).
    Hello {
        user: String,
        noise: Vec<u8>,
    },
    /// Server to client: the Noise handshake's second message (the
    /// server's ephemeral key and, encrypted and authenticated,
    /// [`crate::auth::Accept`]: the id the session will have once the
    /// client proves itself, so data links need not wait for AuthOk).
    /// Only a holder of the key can produce it: the server's proof.
    Challenge {
        noise: Vec<u8>,
    },
    /// Client to server: the client's proof of the key and of this
    /// handshake's ephemeral secret (an HMAC of the handshake hash).
    Auth {
        proof: Bytes32,
    },
    /// Server to client: authenticated; data links join with this id.
    AuthOk {
        session: u64,
    },
    /// Client to server: the request.
    Open(Open),
    /// First message of a data link: join `session` as stream `stream`.
    Join {
        session: u64,
        stream: u16,
        nonce: Bytes32,
        mac: Bytes32,
    },
    /// Server to client on a data link: joined.
    JoinOk,
    Propose(Propose),
    Confirm(Confirm),
    /// A batch of metadata records.
    Entries(Vec<Entry>),
    /// All metadata sent.
    MetaEnd {
        entries: u64,
        files: u64,
        bytes: u64,
    },
    /// Sink to source: directories exist, file table ready; failures of
    /// entries the sink could not prepare.
    SyncDone {
        failures: Vec<Failure>,
    },
    /// Source to sink: whole-file digests of files fully read (id, digest).
    FilesDone(Vec<(u64, u64)>),
    /// Source to sink: a file could not be read; the sink discards it.
    FileFailed {
        id: u64,
        reason: String,
    },
    /// Source to sink: every block has been sent on every stream.
    EndOfData {
        files: u64,
        bytes: u64,
    },
    Complete(Complete),
    /// Either side: the session cannot go on.
    Abort {
        reason: String,
    },
    /// Server to client: request refused.
    Error {
        code: u16,
        message: String,
    },
    /// Client to server, instead of Open: ask for the daemon's state
    /// (`ramsys status`; docs/DAEMON.md).
    StatusQuery,
    /// Server to client: the state as a JSON document (schema versioned
    /// inside, so it can grow without a wire change).
    StatusReport {
        json: String,
    },
    /// Client to server, instead of Open: the same request as a sync
    /// (`ramsys sync`, `cp --resume`); `flags` are the [`sync`] bits.
    SyncOpen {
        open: Open,
        flags: u32,
    },
    /// Source to sink, right after Propose: compare with what the sink
    /// holds ([`sync`] bits). Without it a session is a plain copy.
    SyncMode {
        flags: u32,
    },
    /// Sink to source, after MetaEnd and before SyncDone (same round
    /// trip): what the sink already holds of the announced files.
    Have(Vec<Have>),
    /// Source to sink, after SyncDone, before any data of the files named:
    /// the source's verdict on the files the sink offered digests or
    /// blocks for.
    Reuse(Vec<Reuse>),
    /// Sink to source, after EndOfData and before Complete: entries the
    /// sink removed (`--delete`), or would remove (`--dry-run`).
    Deleted(Vec<Vec<u8>>),
    /// Sink to source during the payload: these segments (file id, offset,
    /// len with the hole bit, as in a DATA table) arrived in a block that
    /// failed its checksum or authentication; send them again.
    Resend(Vec<(u64, u64, u32)>),
    /// Sink to source during the payload: every file is in place or has
    /// failed, no Resend will follow; the source may end its data links.
    Settled,
    /// Client to server, instead of Open: mint a one-time credential bound
    /// to the authenticated user's export root, valid for `ttl_s` seconds
    /// (0 = the daemon's default; docs/SECURITY.md).
    TokenRequest {
        ttl_s: u32,
    },
    /// Server to client: the credential. `key` is sealed under the session
    /// key ([`crate::auth::seal_token_key`]); the usable key is the hex text
    /// of the unsealed bytes. `expires_s`: seconds left to start the session.
    Token {
        user: String,
        key: Bytes32,
        expires_s: u32,
    },
    /// Client to server, right after Auth (`--encrypt`): from the next
    /// byte on, both directions of this control link are AEAD records
    /// under `cipher` (ids as in Propose; docs/SECURITY.md). The server's
    /// AuthOk, sent before it read this, is the last clear frame.
    SealControl {
        cipher: u8,
    },
    /// Client to server, first message of a *replacement* data link
    /// (docs/PROTOCOL.md, "Lost links"): take the place of `stream`, whose
    /// link broke. `epoch` numbers the link's incarnations (the first link
    /// is 0); each dial attempt takes a fresh, higher one, and it keys the
    /// link's AEAD nonces, so no nonce repeats across incarnations.
    Rejoin {
        session: u64,
        stream: u16,
        epoch: u16,
        nonce: Bytes32,
        mac: Bytes32,
    },
    /// Sink to source during the payload: data link (`stream`, `epoch`)
    /// ended without END; the sink accepted exactly `received` DATA blocks
    /// on it. The source sends the rest of what it sent there again.
    Lost {
        stream: u16,
        epoch: u16,
        received: u64,
    },
    /// Source to sink during the payload: the source's end of (`stream`,
    /// `epoch`) failed; the sink closes its end (if still open) and
    /// answers Lost.
    LinkDown {
        stream: u16,
        epoch: u16,
    },
    /// Client to server, instead of Open or SyncOpen, when the server is
    /// the source and the user selected what to send (`--exclude`,
    /// `--include`, `--min-size`, `--max-size`; rsync's rules): the
    /// server's scan applies `select`. `flags` as in SyncOpen (0 = copy).
    SelectOpen {
        open: Open,
        flags: u32,
        select: Selection,
    },
    /// Daemon to daemon, as the first message instead of Hello: open a
    /// site link (issue 19, docs/SITE.md). Authenticated exactly as Hello
    /// (Challenge, Auth, AuthOk with session 0); after AuthOk the link
    /// carries DDSS frames (crates/ddss) for the rest of its life. `addr`
    /// is the dialing daemon's listen address, its name in the site, bound
    /// into the handshake (crate::auth's prologue).
    SiteHello {
        user: String,
        addr: String,
        noise: Vec<u8>,
    },
    /// Client to server, instead of the opens above, when the client asks
    /// for an archive copy from a server source (`-a`, `-X`, `-A`, ...):
    /// `preserve` bits ([`crate::attrs::preserve`]) say what the server's
    /// scan collects; `flags` and `select` as in SelectOpen.
    ArchiveOpen {
        open: Open,
        flags: u32,
        select: Selection,
        preserve: u32,
    },
    /// Source to sink, right behind Propose (and SyncMode), before any
    /// Entries: the records are followed by Attrs for what `flags`
    /// ([`crate::attrs::preserve`]) names, and the sink applies it.
    Preserve {
        flags: u32,
    },
    /// Source to sink, after the Entries batch holding these ids.
    Attrs(Vec<crate::attrs::Attrs>),
    /// Client to server, right before its Open/SyncOpen/SelectOpen/ArchiveOpen when
    /// the server is the source and the user limited the transfer's rate
    /// (`--bwlimit`): the server's senders send at most `bytes_per_s` for
    /// this session, across all its streams, on top of the daemon's and
    /// the user's own `max_rate` (docs/DAEMON.md). No answer.
    BwLimit {
        bytes_per_s: u64,
    },
    /// Server to client, instead of running the session its Open asked
    /// for, then the server closes the connection: this daemon is at its
    /// admission limit (`reason`, one line) and `addr` (a peer of its
    /// site, less loaded in its site view) should serve it instead
    /// (issue 19, docs/SITE.md). The client opens the session again at
    /// `addr`, once, announcing it with Redirected. `mac` authenticates
    /// both under the session key (auth::redirect_mac, issue 34): the
    /// control link may be unsealed, and a redirect moves the user's data.
    Redirect {
        addr: String,
        reason: String,
        mac: Bytes32,
    },
    /// Client to server, right before the request (and after BwLimit, if
    /// any): this session was redirected here by the daemon at `from`.
    /// The server does not redirect it again (it admits it, queueing it if
    /// it must), so a redirect never chains. No answer.
    Redirected {
        from: String,
    },
    /// Client to server, instead of Open (`--transport raw|auto`, issue
    /// 18): which interfaces does the daemon offer raw-Ethernet channels
    /// on? Answered by one [`Control::RawOffer`]; the server then closes.
    RawQuery,
    /// Server to client: the daemon's raw-channel interfaces (`serve
    /// --raw-iface`); empty when it offers none. docs/TYCHE.md.
    RawOffer {
        ifaces: Vec<RawIface>,
    },
    /// Source to sink during the payload, before EndOfData, when the
    /// source is the client (issue 21, docs/PROTOCOL.md "Adding
    /// streams"): the aggregate rate still grows with more links, so the
    /// source asks to open data stream `stream` (= the streams so far).
    AddStream {
        stream: u16,
    },
    /// Sink to source, the answer to AddStream: `credits` > 0: dial
    /// `stream` (Rejoin, epoch 1), the sink grants that many credits on
    /// it; 0: refused (no thread or buffers left), ask no more.
    StreamAdded {
        stream: u16,
        credits: u32,
    },
    /// Client to server, instead of Open (issue 19, docs/SITE.md
    /// "Between two sites"): a third-party transfer. This daemon pushes
    /// `paths` to `dest` on the daemon `sink`, a member of its site, as an
    /// ordinary client of it, on behalf of the authenticated user
    /// (OnBehalf), and reports back with RelayProgress and RelayDone.
    RelayOpen(Relay),
    /// Daemon to daemon, the first message after AuthOk (and SealControl):
    /// the link authenticated as the site identity (the `[site] user`'s
    /// key, or the shared key) runs the session with the grant of `user`
    /// here (its root, read-only flag and limits). Empty `user`: the
    /// relaying daemon has no users table (shared key); refused by a
    /// daemon that has one. No answer; refusals are Error.
    OnBehalf {
        user: String,
    },
    /// Server to client during a relay, about every 500 ms: what the push
    /// to the sink has moved so far (files and bytes) of the total it
    /// announced (0 until its scan ends).
    RelayProgress {
        files: u64,
        bytes: u64,
        total_files: u64,
        total_bytes: u64,
    },
    /// Server to client: the relay ended (the last message; the server
    /// closes). `error` non-empty: it failed as a whole (the sink
    /// unreachable or refusing, the session broken).
    RelayDone(RelayReport),
    /// Client to server, before Open (after BwLimit and Redirected, if
    /// any), on a pull with no `--streams` (issue 21): the server-side
    /// source may add streams (AddStream) while the rate grows, the client
    /// dials them. Without it a server-side source keeps its count. No
    /// answer.
    GrowStreams,
    /// Source to sink, in the payload right before EndOfData, when the
    /// source is the server and the client sent GrowStreams: what the
    /// adaptation did, for the client's --explain and JSON summary.
    Grown {
        stages: Vec<GrowStage>,
        /// Why it stopped; empty: the transfer ended first.
        stopped: String,
    },
    /// The ChallengeTcp of protocols 1 and 2, kept so later variants keep their tags:
    /// never sent, refused wherever it arrives. Since protocol 3 the
    /// server's TCP limits travel inside the Challenge
    /// ([`crate::auth::Accept`]), authenticated.
    RetiredChallengeTcp,
    /// Instead of Grown, to a client whose Hello carried
    /// [`crate::frame::HELLO_PATH_FLAG`]: the same stages and, for each,
    /// what the links said (busy share, queueing).
    GrownLinks {
        stages: Vec<GrowStage>,
        /// One per stage, in the same order.
        links: Vec<StageLinks>,
        stopped: String,
    },
    /// Source to sink, right before MetaEnd: source paths its scan could
    /// not read (a missing top, an unreadable directory). The sink reports
    /// them as failures; when `io_error` (anything but a vanished path:
    /// rsync's IOERR_GENERAL), it deletes nothing, as rsync does: an
    /// unreadable source directory must not empty its copy.
    ScanFailed {
        failures: Vec<Failure>,
        io_error: bool,
    },
    /// Client to server, instead of the opens above (continuous
    /// replication, issue 38, docs/WATCH.md): open a channel that applies
    /// [`WatchOp`]s under `dest` (a directory beneath the user's root, the
    /// one a sync to `dest` fills), for as long as the client keeps the
    /// connection. `version`: of the watch operations (WATCH_VERSION).
    /// Answered by WatchReady, or Error.
    WatchOpen {
        version: u16,
        dest: Vec<u8>,
    },
    /// Server to client: the channel is open; the server's own version.
    WatchReady {
        version: u16,
    },
    /// Client to server on a watch channel: apply `ops` in order.
    WatchOps {
        seq: u64,
        ops: Vec<WatchOp>,
    },
    /// Server to client: one result per op of WatchOps `seq`, in order.
    WatchDone {
        seq: u64,
        results: Vec<WatchResult>,
    },
    /// Client to server, any number right before a SelectOpen or
    /// ArchiveOpen (after the rest of the preamble): a `--files-from`
    /// list too long for the request's one control frame (issue 36: lists
    /// of a million paths), in order, each chunk within a frame. The
    /// server puts them ahead of the request's own `select.files`; their
    /// total counts against its memory budget per session. No answer.
    SelectFiles {
        files: Vec<Vec<u8>>,
    },
    /// Client to server on a watch channel of version
    /// [`WATCH_SESSIONS`](watch::WATCH_SESSIONS) or later (issue 38,
    /// docs/PROTOCOL.md "Kept sessions"): batch `batch` (1, then one more
    /// each time) runs a push session on this link now: its preamble and
    /// open follow exactly as after AuthOk, checked as a first request is;
    /// its data links join under the batch's key
    /// ([`crate::auth::batch_key`]). The session ends with Complete and the
    /// link carries on. No answer of its own.
    WatchBatch {
        batch: u64,
    },
    /// Sink to source during the payload of a windowed session (issue 36,
    /// frame::WINDOWS_FLAG): every id below `through` has its slot; the
    /// source may read and send those files. Increasing, never past the
    /// records received.
    Ready {
        through: u64,
    },
    /// Sink to source during the payload of a windowed session: every file
    /// of an id below `through` is in place or failed; the source drops
    /// their state and may announce up to `through` + its window.
    /// Increasing, never past the last Ready.
    SettledThrough {
        through: u64,
    },
    /// Sink to source, right behind a Confirm carrying
    /// frame::WINDOW_LIMIT_FLAG (only if the Propose carried it; issue 36,
    /// docs/PROTOCOL.md "Windows"): from here on the source announces at
    /// most `files` ids past the settled mark and `bytes` of records
    /// (session::record_bytes) not yet settled, so the window fits the
    /// sink's memory budget. Within session::MIN_WINDOW and
    /// (MAX_WINDOW_IDS, MAX_WINDOW_BYTES).
    Window {
        files: u64,
        bytes: u64,
    },
    /// Sink to source, once, right before Complete, only when the Propose
    /// carried frame::PLACED_FLAG (issue 36, docs/PROTOCOL.md "Pieces of
    /// a big file"): the record paths of the big files this session's
    /// pieces belong to that are in place at the sink's end of the session
    /// (this sink renamed the file, found it renamed by another, or found
    /// it in place unchanged). At most [`MAX_PLACED`] paths, each a valid
    /// relative path.
    Placed {
        files: Vec<Vec<u8>>,
    },
    /// Server to client during a relay, once, right before RelayDone,
    /// only when the RelayOpen frame carried frame::PLACED_FLAG and the
    /// push ran (issue 36): the big files of the pair's share in pieces
    /// and those its sink placed ([`RelayPlaced::check`]).
    RelayPlaced(RelayPlaced),
    /// Source to sink, in a windowed session whose Propose and Confirm
    /// carried frame::DIRS_DONE_FLAG, after records and before MetaEnd
    /// (issue 36, docs/PROTOCOL.md "Directories done"): every entry of
    /// these directories (ids of Dir records sent, each at most once) has
    /// been sent, so the sink may delete their extra entries now.
    DirsDone {
        ids: Vec<u64>,
    },
}

/// Most paths a Placed may name: a big file is cut only when it is at
/// least 1/16 of the transfer, so a session holds pieces of 16 at most;
/// a margin for rounding.
pub const MAX_PLACED: usize = 64;

#[cfg(test)]
mod tests;
