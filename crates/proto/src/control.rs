//! Control messages, carried in CONTROL frames and encoded with postcard
//! (varint integers, length-prefixed byte strings, enum variants by index;
//! docs/PROTOCOL.md lists every variant and field in wire order).
//!
//! Decoding is bounded: a CONTROL body is at most
//! [`crate::frame::MAX_CONTROL_BODY`] bytes, and every collection inside is
//! bounded by that body, so arbitrary input can never allocate without bound.

use serde::{Deserialize, Serialize};

use crate::frame::MAX_CONTROL_BODY;
use crate::ProtoError;

/// 256-bit nonce or MAC.
pub type Bytes32 = [u8; 32];

/// Which end of a session the *server* (daemon) plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    Source,
    Sink,
}

/// A client's request, sent once on the control link after authentication.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Open {
    /// Which end the server plays in this session.
    pub server_role: Role,
    /// Server is source: the paths to send (relative to its root).
    /// Server is sink: exactly one path, the destination.
    pub paths: Vec<Vec<u8>>,
    /// Copy directories recursively (cp -r).
    pub recursive: bool,
    /// What the client asks for; a server-side source proposes at most
    /// this (a server-side sink gets the source's own Propose).
    pub streams: u16,
    pub block_size: u32,
    pub checksum: bool,
}

/// Capacity proposal, source to sink (seed 000 Fig. 6-4a).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Propose {
    /// Number of top-level source entries (decides how DST is interpreted).
    pub roots: u32,
    /// Data streams the source has senders for.
    pub streams: u16,
    /// Proposed block size in bytes.
    pub block_size: u32,
    /// Task capacity the source can sustain, Mbit/s (0 = unknown).
    pub capacity_mbps: u64,
    /// Per-block checksums and whole-file digests on.
    pub checksum: bool,
    /// DATA block cipher the source asks for: 0 none, 1 ChaCha20-Poly1305,
    /// 2 AES-256-GCM (docs/SECURITY.md).
    pub cipher: u8,
}

/// Confirmation, sink to source: what the sink can serve. The source
/// releases whatever it reserved beyond this.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confirm {
    pub streams: u16,
    pub block_size: u32,
    /// Blocks the source may have in flight per stream (the credit window).
    pub credits_per_stream: u32,
    pub capacity_mbps: u64,
    pub checksum: bool,
    /// DATA block cipher in force: the source's, or the sink's own when the
    /// source asked for none (either end may require encryption).
    pub cipher: u8,
}

/// What a metadata record describes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    Dir,
    File {
        size: u64,
    },
    Symlink {
        target: Vec<u8>,
    },
    /// A further name for the file with id `target_id` (same inode).
    HardLink {
        target_id: u64,
    },
    /// A FIFO, socket or device node (`--specials`, `--devices`): `kind`
    /// from [`crate::attrs::special`], `rdev` the device number of a
    /// device (0 otherwise). Sent only when the client asked for it.
    Special {
        kind: u8,
        rdev: u64,
    },
    /// One piece of a large regular file striped across daemons (issue 19,
    /// docs/SITE.md "A big file's blocks"): bytes `index * piece ..
    /// min((index + 1) * piece, size)` of a file of `size` bytes, written
    /// into a temp file shared by every sink of the stripe and renamed
    /// into place by whichever sink completes the last piece.
    Piece {
        size: u64,
        piece: u64,
        index: u32,
    },
}

/// Most pieces one file may be cut into (each leaves a marker file at the
/// sink until the file is complete).
pub const MAX_PIECES: u64 = 4096;

impl EntryKind {
    /// A piece's byte range (offset, length), checked: `piece` > 0, the
    /// index within the file, at most [`MAX_PIECES`] pieces. None for any
    /// other kind or a malformed piece.
    pub fn piece_range(&self) -> Option<(u64, u64)> {
        let EntryKind::Piece { size, piece, index } = *self else {
            return None;
        };
        if piece == 0 || size.div_ceil(piece) > MAX_PIECES {
            return None;
        }
        let off = (index as u64).checked_mul(piece)?;
        (off < size).then(|| (off, piece.min(size - off)))
    }
}

/// One metadata record (seed 000 Fig. 6-4b). `path` is relative, '/'
/// separated, and its first component is the top-level source name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// File id: position in the source's depth-first walk.
    pub id: u64,
    pub path: Vec<u8>,
    pub kind: EntryKind,
    /// Permission bits (07777).
    pub mode: u32,
    pub mtime_s: i64,
    pub mtime_ns: u32,
}

/// A path that failed, with the reason, for the final report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub path: Vec<u8>,
    pub reason: String,
}

/// Final report, sink to source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Complete {
    pub files: u64,
    pub bytes: u64,
    pub failures: Vec<Failure>,
    /// CPU seconds the sink's process spent during the session.
    pub cpu_s: f64,
}

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
}

/// Version of the watch operations ([`Control::WatchOpen`]).
pub const WATCH_VERSION: u16 = 1;

/// An operation a replication job applies at its destination before a
/// batch's data (issue 38): paths relative to WatchOpen's `dest`, as the
/// job's sessions name them on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WatchOp {
    /// Rename `from` to `to` (replacing what is there), only if `from` is
    /// a directory when `dir`, a non-directory otherwise.
    Rename {
        from: Vec<u8>,
        to: Vec<u8>,
        dir: bool,
    },
    /// Remove `path` (with everything below it when `dir`), only if it is
    /// of that kind.
    Delete { path: Vec<u8>, dir: bool },
    /// Set a directory's mode (permission bits) and mtime.
    DirAttrs {
        path: Vec<u8>,
        mode: u32,
        mtime_s: i64,
        mtime_ns: u32,
    },
}

/// What became of one [`WatchOp`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WatchResult {
    Done,
    /// The entry to rename, delete or set was not there (or of the other
    /// kind): nothing done. For a rename the client sends `to` as data.
    Missing,
    /// It could not be done: the reason, one line.
    Failed(String),
}

/// A host's TCP buffer limits ([`crate::auth::Accept`]): the maxima of
/// `net.ipv4.tcp_wmem` and `net.ipv4.tcp_rmem`, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpBuffers {
    pub wmem_max: u64,
    pub rmem_max: u64,
}

/// What a stage's links said ([`Control::GrownLinks`]); None where the
/// transport has no TCP_INFO.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageLinks {
    /// Share of the stage the links had data in flight, per mille.
    pub busy_pm: Option<u16>,
    /// The links' smoothed RTT over their minimum, hundredths.
    pub rtt_x100: Option<u32>,
}

/// A third-party transfer request (RelayOpen).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Relay {
    /// The sink daemon (`HOST:PORT`), a member of this daemon's site.
    pub sink: String,
    /// Source paths under the user's root here; a trailing '/' names a
    /// directory's contents (as in Open).
    pub paths: Vec<Vec<u8>>,
    /// The destination path under the user's root at the sink.
    pub dest: Vec<u8>,
    pub recursive: bool,
    /// Streams (0: the relaying daemon sizes them from the path to the
    /// sink), block size and checksums, as in Open.
    pub streams: u16,
    pub block_size: u32,
    pub checksum: bool,
    /// Sync and resume bits ([`sync`]), 0 = copy.
    pub flags: u32,
    /// What the relaying daemon's scan sends (as in SelectOpen).
    pub select: Selection,
    /// Archive bits ([`crate::attrs::preserve`]), as in ArchiveOpen.
    pub preserve: u32,
    /// `--bwlimit`, bytes/s for the push to the sink (0: none).
    pub bwlimit: u64,
    /// DATA block cipher asked for on the link to the sink (ids as in
    /// Propose).
    pub cipher: u8,
    /// Striping (`--stripe`): send only this pair's share of the files.
    pub share: Option<Share>,
}

/// One pair's share of a striped third-party transfer: the relaying
/// daemon lists the sources and deals the files over `weights.len()`
/// pairs exactly as every other pair's daemon does (largest first, to
/// the share that would finish first, bytes / weight), and sends share
/// `index`. `weights` in thousandths (0 counts as 1). `pieces`: cut big
/// files into pieces that are multiples of this many bytes (the engine's
/// request::shares::piece_size; 0 = deal whole files), the same value for
/// every pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    pub index: u16,
    pub weights: Vec<u32>,
    pub pieces: u32,
}

/// A relay's outcome (RelayDone).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RelayReport {
    pub files: u64,
    pub bytes: u64,
    /// Sync: files the sink already had.
    pub unchanged: u64,
    pub streams: u16,
    pub block_size: u32,
    /// Paths that failed (the session went on without them).
    pub failures: Vec<Failure>,
    /// CPU seconds of the sink's process during the session (< 0: not
    /// reported).
    pub sink_cpu_s: f64,
    /// With a Share: the files and bytes of this pair's share, and a
    /// digest (xxh3-64) of the whole listing the share was dealt from, so
    /// the client can tell whether every pair saw the same tree.
    pub share_files: u64,
    pub share_bytes: u64,
    pub listing: u64,
    /// Empty: done (see `failures`); else why the relay failed, one line.
    pub error: String,
}

/// One stage of a server-side source's stream adaptation ([`Control::Grown`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrowStage {
    /// Milliseconds since the payload began, at the end of the measurement.
    pub at_ms: u32,
    pub streams: u16,
    /// Aggregate delivery rate over the measurement, kB/s (1000 bytes).
    pub kb_s: u64,
    /// The links' own delivery rates at its end, kB/s: lowest, median,
    /// highest (empty where the transport has none).
    pub link_kb_s: Vec<u64>,
    /// What was decided after it.
    pub then: String,
}

/// One interface a daemon offers raw channels on (docs/TYCHE.md,
/// "Negotiation"): the agent pairs its own interfaces with these (same
/// subnet of an address, then a probe channel) and dials data links to
/// `mac`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RawIface {
    pub name: String,
    pub ifindex: u32,
    pub mac: [u8; 6],
    pub mtu: u32,
    /// The NIC's NUMA node, None when unknown.
    pub node: Option<u32>,
    /// The interface's IP addresses (text), for pairing by subnet.
    pub addrs: Vec<String>,
}

/// What a source sends of its tree (rsync's filter rules, engine
/// `request::filter`): `rules` in command-line order, first match wins,
/// each in rsync's short form (`-` or `+`, modifiers from `!sr`, one
/// space, the pattern's bytes; engine `request::rules`);
/// regular files outside [`min_size`, `max_size`] are skipped
/// (`max_size` 0 = no upper limit); with `files` (`--files-from`) only
/// those paths (relative to each source top) and the directories leading
/// to them are sent, and what lies below a listed directory only when
/// `files_recursive`. A sink given a Selection (sync `--delete`) never
/// deletes what the rules exclude, as rsync does.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Selection {
    /// `- PATTERN`, `+ PATTERN`, `-! PATTERN`, `-s PATTERN`, ...
    pub rules: Vec<Vec<u8>>,
    pub min_size: u64,
    pub max_size: u64,
    pub files: Vec<Vec<u8>>,
    pub files_recursive: bool,
}

impl Selection {
    /// Selects everything.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.min_size == 0 && self.max_size == 0 && self.files.is_empty()
    }
}

/// Bits of SyncOpen/SyncMode `flags` (docs/SYNC.md).
pub mod sync {
    /// Skip files the sink holds with the same size and mtime; delta the rest.
    pub const SYNC: u32 = 1;
    /// Compare whole-file content digests instead of size and mtime.
    pub const CHECKSUM: u32 = 2;
    /// Remove sink entries the source no longer has.
    pub const DELETE: u32 = 4;
    /// Change nothing; report what would be sent and removed.
    pub const DRY_RUN: u32 = 8;
    /// Keep interrupted temp files and a journal; reuse them next time.
    pub const RESUME: u32 = 16;
    /// Keep the temp files of interrupted large files and journal their
    /// verified blocks, so a later `--resume` can reuse them (on by
    /// default; issue 15). Without RESUME nothing at the sink is reused.
    pub const JOURNAL: u32 = 32;
    /// A block device DST may be written, in place (`--write-devices`;
    /// docs/STORAGE.md "Volumes"). Without it the sink refuses a device.
    pub const WRITE_DEVICES: u32 = 64;
    /// Leave every entry DST already has as it is (rsync's
    /// `--ignore-existing`, cp's `--no-clobber`); send only missing files.
    pub const IGNORE_EXISTING: u32 = 128;
    /// Leave files that are newer at the sink (rsync's and cp's
    /// `--update`): a regular file whose mtime is later than the source's.
    pub const UPDATE: u32 = 256;
    /// DST was written with a trailing `/` (issue 35): it names a
    /// directory. A sync makes it when it is missing, even for one file
    /// (rsync's rule); a copy of one file refuses (cp's). Read by the sink
    /// from SyncOpen or its own options; a source leaves it out of
    /// SyncMode (a sink of before this bit rejects unknown SyncMode bits).
    pub const DEST_DIR: u32 = 512;
    pub const ALL: u32 = 1023;
}

/// What the sink holds of one announced file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Have {
    pub id: u64,
    pub state: HaveState,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HaveState {
    /// Same size and mtime (or resumed and verified): nothing to send; the
    /// sink applies the mode itself.
    Unchanged,
    /// `--checksum`: the sink's file has the announced size and this
    /// content digest (xxh3-64 of the whole file).
    Digest(u64),
    /// The sink has an older version (or an interrupted temp file) of
    /// `size` bytes: one hash per `block_size` block (segment hash keyed by
    /// the file id and offset; 0 = block missing, always sent).
    Blocks {
        block_size: u32,
        size: u64,
        sums: Vec<u64>,
    },
}

/// The source's verdict on a file the sink offered a Digest or Blocks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reuse {
    pub id: u64,
    pub what: ReuseKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReuseKind {
    /// Content identical: keep the sink's file, apply mode and mtime.
    Keep,
    /// Build the file from the sink's base: `bytes` of it are reused (the
    /// blocks that matched), the rest arrives as data.
    Base { bytes: u64 },
}

impl Control {
    /// Short name for logs and state-machine errors.
    pub fn name(&self) -> &'static str {
        match self {
            Control::Hello { .. } => "Hello",
            Control::Challenge { .. } => "Challenge",
            Control::Auth { .. } => "Auth",
            Control::AuthOk { .. } => "AuthOk",
            Control::Open(_) => "Open",
            Control::Join { .. } => "Join",
            Control::JoinOk => "JoinOk",
            Control::Propose(_) => "Propose",
            Control::Confirm(_) => "Confirm",
            Control::Entries(_) => "Entries",
            Control::MetaEnd { .. } => "MetaEnd",
            Control::SyncDone { .. } => "SyncDone",
            Control::FilesDone(_) => "FilesDone",
            Control::FileFailed { .. } => "FileFailed",
            Control::EndOfData { .. } => "EndOfData",
            Control::Complete(_) => "Complete",
            Control::Abort { .. } => "Abort",
            Control::Error { .. } => "Error",
            Control::StatusQuery => "StatusQuery",
            Control::StatusReport { .. } => "StatusReport",
            Control::SyncOpen { .. } => "SyncOpen",
            Control::SyncMode { .. } => "SyncMode",
            Control::Have(_) => "Have",
            Control::Reuse(_) => "Reuse",
            Control::Deleted(_) => "Deleted",
            Control::Resend(_) => "Resend",
            Control::Settled => "Settled",
            Control::TokenRequest { .. } => "TokenRequest",
            Control::Token { .. } => "Token",
            Control::SealControl { .. } => "SealControl",
            Control::Rejoin { .. } => "Rejoin",
            Control::Lost { .. } => "Lost",
            Control::LinkDown { .. } => "LinkDown",
            Control::SelectOpen { .. } => "SelectOpen",
            Control::SiteHello { .. } => "SiteHello",
            Control::ArchiveOpen { .. } => "ArchiveOpen",
            Control::Preserve { .. } => "Preserve",
            Control::Attrs(_) => "Attrs",
            Control::BwLimit { .. } => "BwLimit",
            Control::Redirect { .. } => "Redirect",
            Control::Redirected { .. } => "Redirected",
            Control::RawQuery => "RawQuery",
            Control::RawOffer { .. } => "RawOffer",
            Control::AddStream { .. } => "AddStream",
            Control::StreamAdded { .. } => "StreamAdded",
            Control::RelayOpen(_) => "RelayOpen",
            Control::OnBehalf { .. } => "OnBehalf",
            Control::RelayProgress { .. } => "RelayProgress",
            Control::RelayDone(_) => "RelayDone",
            Control::GrowStreams => "GrowStreams",
            Control::Grown { .. } => "Grown",
            Control::RetiredChallengeTcp => "RetiredChallengeTcp",
            Control::GrownLinks { .. } => "GrownLinks",
            Control::ScanFailed { .. } => "ScanFailed",
            Control::WatchOpen { .. } => "WatchOpen",
            Control::WatchReady { .. } => "WatchReady",
            Control::WatchOps { .. } => "WatchOps",
            Control::WatchDone { .. } => "WatchDone",
            Control::SelectFiles { .. } => "SelectFiles",
        }
    }

    /// Encode into a CONTROL frame body.
    pub fn encode(&self) -> Result<Vec<u8>, ProtoError> {
        let v = postcard::to_stdvec(self)
            .map_err(|e| ProtoError::malformed("control message", e.to_string()))?;
        if v.len() > MAX_CONTROL_BODY as usize {
            return Err(ProtoError::FrameTooLarge {
                len: v.len() as u64,
                limit: MAX_CONTROL_BODY as u64,
            });
        }
        Ok(v)
    }

    /// Decode a CONTROL frame body. Trailing bytes are an error.
    pub fn decode(body: &[u8]) -> Result<Self, ProtoError> {
        if body.len() > MAX_CONTROL_BODY as usize {
            return Err(ProtoError::FrameTooLarge {
                len: body.len() as u64,
                limit: MAX_CONTROL_BODY as u64,
            });
        }
        let (msg, rest) = postcard::take_from_bytes::<Control>(body)
            .map_err(|e| ProtoError::malformed("control message", e.to_string()))?;
        if !rest.is_empty() {
            return Err(ProtoError::malformed(
                "control message",
                format!("{} trailing bytes", rest.len()),
            ));
        }
        Ok(msg)
    }
}

/// Encoded size of one entry, used to split metadata into bounded batches.
pub fn entry_wire_size(e: &Entry) -> usize {
    postcard::experimental::serialized_size(e).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_every_variant() {
        let msgs = vec![
            Control::Hello {
                user: "alice".into(),
                noise: vec![1; 48],
            },
            Control::Challenge { noise: vec![2; 80] },
            Control::Auth { proof: [4; 32] },
            Control::AuthOk { session: 77 },
            Control::Open(Open {
                server_role: Role::Sink,
                paths: vec![b"dst".to_vec()],
                recursive: true,
                streams: 4,
                block_size: 1 << 20,
                checksum: true,
            }),
            Control::Join {
                session: 77,
                stream: 3,
                nonce: [5; 32],
                mac: [6; 32],
            },
            Control::JoinOk,
            Control::Propose(Propose {
                roots: 1,
                streams: 4,
                block_size: 1 << 22,
                capacity_mbps: 0,
                checksum: true,
                cipher: 0,
            }),
            Control::Confirm(Confirm {
                streams: 4,
                block_size: 1 << 22,
                credits_per_stream: 8,
                capacity_mbps: 10_000,
                checksum: true,
                cipher: 0,
            }),
            Control::Entries(vec![Entry {
                id: 9,
                path: "a/ü b".as_bytes().to_vec(),
                kind: EntryKind::Symlink {
                    target: b"../x".to_vec(),
                },
                mode: 0o755,
                mtime_s: -5,
                mtime_ns: 999,
            }]),
            Control::MetaEnd {
                entries: 1,
                files: 2,
                bytes: 3,
            },
            Control::SyncDone { failures: vec![] },
            Control::FilesDone(vec![(1, 2), (3, 4)]),
            Control::FileFailed {
                id: 1,
                reason: "EIO".into(),
            },
            Control::EndOfData { files: 1, bytes: 2 },
            Control::Complete(Complete {
                files: 1,
                bytes: 2,
                failures: vec![Failure {
                    path: b"x".to_vec(),
                    reason: "disk full".into(),
                }],
                cpu_s: 0.5,
            }),
            Control::Abort {
                reason: "disk full".into(),
            },
            Control::Error {
                code: 2,
                message: "no".into(),
            },
            Control::StatusQuery,
            Control::StatusReport {
                json: "{\"version\":1}".into(),
            },
            Control::SyncMode { flags: 5 },
            Control::Have(vec![
                Have {
                    id: 3,
                    state: HaveState::Unchanged,
                },
                Have {
                    id: 4,
                    state: HaveState::Digest(7),
                },
                Have {
                    id: 5,
                    state: HaveState::Blocks {
                        block_size: 1 << 18,
                        size: 9,
                        sums: vec![1, 0],
                    },
                },
            ]),
            Control::Reuse(vec![
                Reuse {
                    id: 4,
                    what: ReuseKind::Keep,
                },
                Reuse {
                    id: 5,
                    what: ReuseKind::Base { bytes: 1 },
                },
            ]),
            Control::Deleted(vec![b"a/b".to_vec()]),
            Control::Resend(vec![(3, 1 << 20, 4096), (4, 0, 1 << 31 | 512)]),
            Control::Settled,
            Control::TokenRequest { ttl_s: 60 },
            Control::Token {
                user: "otp-00ff".into(),
                key: [7; 32],
                expires_s: 60,
            },
            Control::SealControl { cipher: 2 },
            Control::Rejoin {
                session: 9,
                stream: 3,
                epoch: 2,
                nonce: [1; 32],
                mac: [2; 32],
            },
            Control::Lost {
                stream: 3,
                epoch: 1,
                received: 77,
            },
            Control::LinkDown {
                stream: 3,
                epoch: 1,
            },
            Control::SelectOpen {
                open: Open {
                    server_role: Role::Source,
                    paths: vec![b"data".to_vec()],
                    recursive: true,
                    streams: 4,
                    block_size: 1 << 22,
                    checksum: true,
                },
                flags: 1,
                select: Selection {
                    rules: vec![b"+ *.c".to_vec(), b"- /build/".to_vec()],
                    min_size: 1,
                    max_size: 1 << 30,
                    files: vec![b"a/b".to_vec()],
                    files_recursive: true,
                },
            },
            Control::SiteHello {
                user: "site".into(),
                addr: "127.0.0.1:4000".into(),
                noise: vec![4; 48],
            },
            Control::Entries(vec![Entry {
                id: 3,
                path: b"p".to_vec(),
                kind: EntryKind::Special {
                    kind: crate::attrs::special::CHAR,
                    rdev: 0x0103,
                },
                mode: 0o666,
                mtime_s: 1,
                mtime_ns: 2,
            }]),
            Control::ArchiveOpen {
                open: Open {
                    server_role: Role::Source,
                    paths: vec![b"data".to_vec()],
                    recursive: true,
                    streams: 4,
                    block_size: 1 << 22,
                    checksum: true,
                },
                flags: 0,
                select: Selection::default(),
                preserve: crate::attrs::preserve::ALL,
            },
            Control::Preserve { flags: 3 },
            Control::Attrs(vec![crate::attrs::Attrs {
                id: 4,
                owner: Some(crate::attrs::Principal {
                    id: 65534,
                    name: b"nobody".to_vec(),
                }),
                group: None,
                xattrs: vec![(b"user.k".to_vec(), vec![0, 1, 2])],
                acl: vec![crate::attrs::AclEntry {
                    tag: crate::attrs::acl_tag::USER,
                    perm: 6,
                    who: crate::attrs::Principal {
                        id: 1000,
                        name: b"alice".to_vec(),
                    },
                }],
                default_acl: vec![],
                atime: Some((5, 6)),
            }]),
            Control::BwLimit {
                bytes_per_s: 20 << 20,
            },
            Control::Redirect {
                addr: "10.0.0.2:7070".into(),
                reason: "4 sessions running (max_sessions = 4)".into(),
                mac: [6; 32],
            },
            Control::Redirected {
                from: "10.0.0.1:7070".into(),
            },
            Control::RawQuery,
            Control::RawOffer {
                ifaces: vec![RawIface {
                    name: "eth2".into(),
                    ifindex: 4,
                    mac: [2, 0, 0, 0, 0, 9],
                    mtu: 9000,
                    node: Some(1),
                    addrs: vec!["10.1.0.2".into()],
                }],
            },
            Control::AddStream { stream: 5 },
            Control::StreamAdded {
                stream: 5,
                credits: 6,
            },
            Control::RelayOpen(Relay {
                sink: "10.0.0.2:7070".into(),
                paths: vec![b"run7/".to_vec()],
                dest: b"archive".to_vec(),
                recursive: true,
                streams: 0,
                block_size: 4 << 20,
                checksum: true,
                flags: sync::SYNC | sync::RESUME,
                select: Selection {
                    rules: vec![b"- *.tmp".to_vec()],
                    ..Default::default()
                },
                preserve: 3,
                bwlimit: 25_000_000,
                cipher: 1,
                share: Some(Share {
                    index: 1,
                    weights: vec![1000, 500, 1000],
                    pieces: 4 << 20,
                }),
            }),
            Control::OnBehalf {
                user: "alice".into(),
            },
            Control::RelayProgress {
                files: 3,
                bytes: 9 << 20,
                total_files: 10,
                total_bytes: 30 << 20,
            },
            Control::RelayDone(RelayReport {
                files: 10,
                bytes: 30 << 20,
                unchanged: 2,
                streams: 4,
                block_size: 4 << 20,
                failures: vec![Failure {
                    path: b"run7/x".to_vec(),
                    reason: "Permission denied".into(),
                }],
                sink_cpu_s: 0.25,
                share_files: 10,
                share_bytes: 30 << 20,
                listing: 0xfeed,
                error: String::new(),
            }),
            Control::GrowStreams,
            Control::Grown {
                stages: vec![GrowStage {
                    at_ms: 2500,
                    streams: 4,
                    kb_s: 120_000,
                    link_kb_s: vec![20_000, 30_000, 40_000],
                    then: "add 2".into(),
                }],
                stopped: "stop: at the limit (32)".into(),
            },
            Control::RetiredChallengeTcp,
            Control::GrownLinks {
                stages: vec![GrowStage {
                    at_ms: 2500,
                    streams: 4,
                    kb_s: 120_000,
                    link_kb_s: vec![],
                    then: "add 2".into(),
                }],
                links: vec![StageLinks {
                    busy_pm: Some(950),
                    rtt_x100: None,
                }],
                stopped: String::new(),
            },
            Control::ScanFailed {
                failures: vec![Failure {
                    path: b"sub/dir".to_vec(),
                    reason: "cannot read directory: Permission denied".into(),
                }],
                io_error: true,
            },
            Control::WatchOpen {
                version: WATCH_VERSION,
                dest: b"mirror".to_vec(),
            },
            Control::WatchReady { version: 1 },
            Control::WatchOps {
                seq: 7,
                ops: vec![
                    WatchOp::Rename {
                        from: b"a".to_vec(),
                        to: b"b/c".to_vec(),
                        dir: true,
                    },
                    WatchOp::Delete {
                        path: b"x".to_vec(),
                        dir: false,
                    },
                    WatchOp::DirAttrs {
                        path: vec![],
                        mode: 0o755,
                        mtime_s: -1,
                        mtime_ns: 5,
                    },
                ],
            },
            Control::WatchDone {
                seq: 7,
                results: vec![
                    WatchResult::Done,
                    WatchResult::Missing,
                    WatchResult::Failed("no".into()),
                ],
            },
            Control::SelectFiles {
                files: vec![b"a/b".to_vec(), b"c".to_vec()],
            },
        ];
        for m in msgs {
            let b = m.encode().unwrap();
            assert_eq!(Control::decode(&b).unwrap(), m);
        }
    }

    #[test]
    fn trailing_bytes_rejected() {
        let mut b = Control::JoinOk.encode().unwrap();
        b.push(0);
        assert!(Control::decode(&b).is_err());
    }
}
