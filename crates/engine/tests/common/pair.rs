//! A source session and a sink session run against each other in one
//! process over in-memory links (issue 37; quinn's `Pair`): the engine's
//! own entry points (`run_source`, `run_sink`) and link setup
//! (`PreLinks` on the end that dials, `ServerLinks` on the end that
//! accepts), no sockets, no daemon. The control link is made directly
//! (authentication is the handshake's own test); the data links are
//! dialled through the net, so faults planned on it (cuts, loss,
//! corruption, reordering, stalls, delay) hit them as they would TCP.
//! A watchdog cuts every link if the sessions do not end in time, so a
//! deadlock fails the test instead of hanging it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::unbounded;
use ramsys_engine::data::resources::ResourceConfig;
use ramsys_engine::request::walk::Top;
use ramsys_engine::roles::sink::{run_sink, SinkSpec};
use ramsys_engine::roles::source::{run_source, SourceSpec};
use ramsys_engine::roles::SessionEnd;
use ramsys_engine::session::{PreLinks, ServerLinks};
use ramsys_engine::storage::fsops::{Confinement, Root};
use ramsys_engine::transport::clock::Clock;
use ramsys_engine::transport::mem::{Net, Record};
use ramsys_engine::transport::Link;
use ramsys_engine::{EngineError, EngineResources, Report, Stats, TransferOptions};
use ramsys_proto::frame::FrameKind;

/// Host names of the two ends (and of their links' sides).
pub const SOURCE: &str = "source";
pub const SINK: &str = "sink";
/// Where the accepting end listens for data links.
const DATA: &str = "data";
const SESSION: u64 = 0x5e55;
const KEY: [u8; 32] = [7; 32];

/// Which end dials the data links: the source (a push to a daemon) or
/// the sink (a pull).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialer {
    Source,
    Sink,
}

/// One end's options, resources and counters.
pub struct End {
    pub opts: TransferOptions,
    pub res: ResourceConfig,
    pub stats: Arc<Stats>,
}

impl End {
    fn new() -> End {
        End {
            opts: TransferOptions {
                streams: 2,
                block_size: 16 << 10,
                recursive: true,
                readers: 2,
                writers: 2,
                window: 4,
                idle_timeout: Duration::from_secs(10),
                direct: false,
                ..Default::default()
            },
            res: ResourceConfig {
                memory: 4 << 20,
                buffer_size: 64 << 10,
                readers: 2,
                writers: 2,
                max_streams: 4,
                ..Default::default()
            },
            stats: Arc::new(Stats::default()),
        }
    }
}

pub struct Pair {
    pub net: Net,
    pub source: End,
    pub sink: End,
    pub dialer: Dialer,
    /// What the source sends: `tops` under `src_root`.
    pub src_root: PathBuf,
    pub tops: Vec<Top>,
    /// Where the sink writes: `dest` under `dst_root`.
    pub dst_root: PathBuf,
    pub dest: Vec<u8>,
    /// Cut every link if the sessions have not ended by then.
    pub watchdog: Duration,
}

/// How a run ended.
pub struct Outcome {
    pub source: Result<Report, EngineError>,
    pub sink: Result<Report, EngineError>,
    /// Every frame both ends wrote, in order (transport::mem::Record).
    pub transcript: Vec<Record>,
    pub elapsed: Duration,
    /// The watchdog had to cut the links: the sessions were stuck.
    pub stuck: bool,
}

impl Pair {
    /// Copy directory `src` into directory `dst` (as `dst/NAME`), the
    /// source dialling, on a real clock.
    pub fn new(src: &Path, dst: &Path) -> Pair {
        Pair::with_clock(src, dst, Clock::default())
    }

    /// [`Pair::new`] on `clock` (a simulated one: the test advances it).
    pub fn with_clock(src: &Path, dst: &Path, clock: Clock) -> Pair {
        let name = src.file_name().unwrap().as_encoded_bytes().to_vec();
        Pair {
            net: Net::new(clock),
            source: End::new(),
            sink: End::new(),
            dialer: Dialer::Source,
            src_root: src.parent().unwrap().to_path_buf(),
            tops: vec![Top {
                rel: name.clone(),
                name,
            }],
            dst_root: dst.to_path_buf(),
            dest: Vec::new(),
            watchdog: Duration::from_secs(20),
        }
    }

    /// Both ends' options: `f` applied to each.
    pub fn both(&mut self, f: impl Fn(&mut TransferOptions)) {
        f(&mut self.source.opts);
        f(&mut self.sink.opts);
    }

    /// Run both sessions to their end (or the watchdog's).
    pub fn run(&self) -> Outcome {
        let t0 = Instant::now();
        let (ctl_src, ctl_sink) = self.net.pair("ctl", SOURCE, SINK);
        let (dial_host, accept_host) = match self.dialer {
            Dialer::Source => (SOURCE, SINK),
            Dialer::Sink => (SINK, SOURCE),
        };
        let arrivals = super::accept::data_links(self.net.listen(DATA, accept_host), SESSION, KEY);
        let dialling = match self.dialer {
            Dialer::Source => &self.source.opts,
            Dialer::Sink => &self.sink.opts,
        };
        let mut dialled = PreLinks::start(
            self.net.host(dial_host),
            DATA,
            self.source.opts.streams,
            Duration::from_secs(5),
            dialling.idle_timeout,
        );
        dialled.join(SESSION, KEY);
        let accept_ctl = match self.dialer {
            Dialer::Source => &ctl_sink,
            Dialer::Sink => &ctl_src,
        };
        let accepted = ServerLinks {
            rx: arrivals,
            timeout: Duration::from_secs(30),
            session_key: Some(KEY),
            control: accept_ctl.try_clone_link().ok(),
        };
        let (src_links, sink_links): (Provider, Provider) = match self.dialer {
            Dialer::Source => (Box::new(dialled), Box::new(accepted)),
            Dialer::Sink => (Box::new(accepted), Box::new(dialled)),
        };
        let (done_tx, done_rx) = unbounded();
        let tx = done_tx.clone();
        let (src, tops, o) = (
            self.src_root.clone(),
            self.tops.clone(),
            self.source.opts.clone(),
        );
        let (res, stats) = (self.source.res.clone(), self.source.stats.clone());
        spawn("pair-source", move || {
            let r = source(ctl_src, src_links, &src, tops, &o, &res, stats);
            let _ = tx.send((true, r));
        });
        let (dst, dest, o) = (
            self.dst_root.clone(),
            self.dest.clone(),
            self.sink.opts.clone(),
        );
        let (res, stats) = (self.sink.res.clone(), self.sink.stats.clone());
        spawn("pair-sink", move || {
            let r = sink(ctl_sink, sink_links, &dst, dest, &o, &res, stats);
            let _ = done_tx.send((false, r));
        });
        let mut results = (None, None);
        let mut stuck = false;
        let deadline = t0 + self.watchdog;
        for _ in 0..2 {
            let r = done_rx.recv_deadline(deadline).or_else(|_| {
                stuck = true;
                self.net.cut_all();
                done_rx.recv_timeout(Duration::from_secs(15))
            });
            match r.expect("a session still ran 15 s after every link was cut") {
                (true, r) => results.0 = Some(r),
                (false, r) => results.1 = Some(r),
            }
        }
        self.net.unlisten(DATA);
        Outcome {
            source: results.0.unwrap(),
            sink: results.1.unwrap(),
            transcript: self.net.transcript(),
            elapsed: t0.elapsed(),
            stuck,
        }
    }
}

type Provider = Box<dyn ramsys_engine::session::LinkProvider>;

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .unwrap();
}

fn source(
    ctl: Box<dyn Link>,
    mut links: Provider,
    root: &Path,
    tops: Vec<Top>,
    opts: &TransferOptions,
    res: &ResourceConfig,
    stats: Arc<Stats>,
) -> Result<Report, EngineError> {
    let res = EngineResources::new(res).map_err(|e| EngineError::local(e.to_string()))?;
    let spec = SourceSpec {
        root: Arc::new(Root::open(root, Confinement::None)?),
        tops,
        pending_auth: None,
    };
    let r = run_source(ctl, spec, SessionEnd::new(&mut *links, opts, &res, stats));
    assert_eq!(
        res.buffers.free(),
        res.buffers.count(),
        "source leaked buffers"
    );
    r
}

fn sink(
    ctl: Box<dyn Link>,
    mut links: Provider,
    root: &Path,
    dest: Vec<u8>,
    opts: &TransferOptions,
    res: &ResourceConfig,
    stats: Arc<Stats>,
) -> Result<Report, EngineError> {
    let res = EngineResources::new(res).map_err(|e| EngineError::local(e.to_string()))?;
    let spec = SinkSpec {
        root: Arc::new(Root::open(root, Confinement::Strict)?),
        dest,
        session: SESSION,
        pending_auth: None,
    };
    let r = run_sink(ctl, spec, SessionEnd::new(&mut *links, opts, &res, stats));
    assert_eq!(
        res.buffers.free(),
        res.buffers.count(),
        "sink leaked buffers"
    );
    r
}

impl Outcome {
    /// Both reports; panics with both ends' errors otherwise.
    pub fn reports(&self) -> (&Report, &Report) {
        match (&self.source, &self.sink, self.stuck) {
            (Ok(a), Ok(b), false) => (a, b),
            (a, b, stuck) => panic!(
                "session failed (stuck: {stuck}, {:?}):\n source: {:?}\n sink: {:?}",
                self.elapsed,
                a.as_ref().err(),
                b.as_ref().err()
            ),
        }
    }

    /// Control messages `from` wrote on the control link.
    pub fn control(&self, from: &str) -> Vec<&Record> {
        let on_ctl = |r: &&Record| r.link == "ctl" && r.from == from && r.control.is_some();
        self.transcript.iter().filter(on_ctl).collect()
    }

    /// The first control message called `name`, from either end.
    pub fn first(&self, name: &str) -> &Record {
        self.transcript
            .iter()
            .find(|r| r.name() == name)
            .unwrap_or_else(|| panic!("no {name} on any link"))
    }

    /// Frames of `kind` that `from` wrote on links whose name starts
    /// with `link`.
    pub fn frames(&self, link: &str, from: &str, kind: FrameKind) -> Vec<&Record> {
        let hit = |r: &&Record| r.link.starts_with(link) && r.from == from;
        let hit = move |r: &&Record| hit(r) && r.kind() == Some(kind);
        self.transcript.iter().filter(hit).collect()
    }
}
