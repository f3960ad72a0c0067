//! In-memory links (issue 37): both ends of a session in one process,
//! without sockets, so every protocol path is a fast, repeatable test
//! (crates/engine/tests/pair/). A [`Net`] holds named listeners; a host's
//! [`Net::host`] transport dials them. Each direction of a link is a byte
//! queue bounded like a socket buffer ([`Net::set_buffer`]): a writer
//! whose peer does not read blocks, so back-pressure and deadlocks are
//! real. Faults are planned per link and direction ([`Net::fault`]), and
//! every frame is recorded with the round trips behind it
//! ([`Net::transcript`]). Time is the net's [`Clock`]: real, or simulated
//! and advanced by the test.

mod link;
mod pipe;
mod tap;

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender};

pub use link::MemLink;
pub use tap::{Fate, Fault, Record};

use super::clock::Clock;
use super::{Link, Transport};
use link::LinkCore;

/// Where a listener's connections go.
type Incoming = Sender<Box<dyn Link>>;

/// Socket-buffer-sized queues unless set otherwise.
pub const DEFAULT_BUFFER: usize = 64 << 10;

/// An in-memory network. Clones share it.
#[derive(Clone)]
pub struct Net(Arc<NetInner>);

pub(crate) struct NetInner {
    clock: Clock,
    buffer: AtomicUsize,
    /// Per address: the listening host, and where its connections go.
    listeners: Mutex<HashMap<String, (String, Incoming)>>,
    /// Faults for links not yet named: (label, from host, fault).
    rules: Mutex<Vec<(String, String, Fault)>>,
    /// Per address: connects still to let through, then to refuse.
    refusals: Mutex<HashMap<String, (u32, u32)>>,
    links: Mutex<Vec<Weak<LinkCore>>>,
    transcript: Mutex<Vec<Record>>,
    next_id: AtomicUsize,
}

impl NetInner {
    fn buffer(&self) -> usize {
        self.buffer.load(Ordering::Relaxed)
    }

    fn record(&self, r: Record) {
        self.transcript.lock().unwrap().push(r);
    }

    /// A link got its name: the faults planned for it attach.
    fn attach(&self, core: &LinkCore, label: &str) {
        let mut rules = self.rules.lock().unwrap();
        rules.retain(|(l, from, f)| {
            let side = core.hosts.iter().position(|h| h == from);
            match side {
                Some(side) if l == label => {
                    core.plan(side, f.clone());
                    false
                }
                _ => true,
            }
        });
    }

    fn live(&self) -> Vec<Arc<LinkCore>> {
        let mut links = self.links.lock().unwrap();
        links.retain(|w| w.strong_count() > 0);
        links.iter().filter_map(Weak::upgrade).collect()
    }

    fn new_link(self: &Arc<Self>, label: &str, hosts: [String; 2]) -> Arc<LinkCore> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let core = Arc::new(LinkCore::new(id, self.clone(), label.into(), hosts));
        self.links.lock().unwrap().push(Arc::downgrade(&core));
        if !label.is_empty() {
            self.attach(&core, label);
        }
        core
    }
}

impl Default for Net {
    fn default() -> Self {
        Net::new(Clock::default())
    }
}

impl Net {
    pub fn new(clock: Clock) -> Net {
        Net(Arc::new(NetInner {
            clock,
            buffer: AtomicUsize::new(DEFAULT_BUFFER),
            listeners: Mutex::default(),
            rules: Mutex::default(),
            refusals: Mutex::default(),
            links: Mutex::default(),
            transcript: Mutex::default(),
            next_id: AtomicUsize::new(0),
        }))
    }

    pub fn clock(&self) -> Clock {
        self.0.clock.clone()
    }

    /// Bytes each direction of links made from now on queues at most.
    pub fn set_buffer(&self, bytes: usize) {
        self.0.buffer.store(bytes, Ordering::Relaxed);
    }

    /// The transport `host` dials with (its name marks its links' ends).
    pub fn host(&self, host: &str) -> Arc<dyn Transport> {
        Arc::new(MemTransport {
            net: self.0.clone(),
            host: host.into(),
        })
    }

    /// Accept connections to `addr` as `host`.
    pub fn listen(&self, addr: &str, host: &str) -> Listener {
        let (tx, rx) = unbounded();
        self.0
            .listeners
            .lock()
            .unwrap()
            .insert(addr.into(), (host.into(), tx));
        Listener {
            rx,
            addr: addr.into(),
            net: self.clone(),
        }
    }

    /// Stop accepting on `addr`: its listener's accept returns None once
    /// the connections already made are taken; later connects are refused.
    pub fn unlisten(&self, addr: &str) {
        self.0.listeners.lock().unwrap().remove(addr);
    }

    /// A link named `label` between hosts `a` and `b`, made directly
    /// (no listener): e.g. a session's control link.
    pub fn pair(&self, label: &str, a: &str, b: &str) -> (Box<dyn Link>, Box<dyn Link>) {
        let core = self.0.new_link(label, [a.into(), b.into()]);
        (
            Box::new(MemLink::new(core.clone(), 0)),
            Box::new(MemLink::new(core, 1)),
        )
    }

    /// Plan `fault` for what host `from` writes on the link named `link`
    /// (now, if it exists; else once a link gets that name: data links are
    /// named "data{stream}.{epoch}" by their Join or Rejoin).
    pub fn fault(&self, link: &str, from: &str, fault: Fault) {
        let existing = self.0.live().into_iter().find(|c| c.label() == link);
        match existing.and_then(|c| Some((c.hosts.iter().position(|h| h == from)?, c))) {
            Some((side, c)) => c.plan(side, fault),
            None => {
                let rule = (link.to_string(), from.to_string(), fault);
                self.0.rules.lock().unwrap().push(rule);
            }
        }
    }

    /// Let `after` more connects to `addr` through, then refuse `n`.
    pub fn refuse(&self, addr: &str, after: u32, n: u32) {
        let r = (after, n);
        self.0.refusals.lock().unwrap().insert(addr.into(), r);
    }

    /// Deliver again what `from` writes on `link` (ends a stall).
    pub fn unstall(&self, link: &str, from: &str) {
        self.each(link, from, |c, side| c.pipes[side].stall_at(None));
    }

    /// Stop delivering what `from` writes on `link`, from now on.
    pub fn stall(&self, link: &str, from: &str) {
        self.each(link, from, |c, side| c.pipes[side].stall_now());
    }

    /// Reset the link named `link` (a cut connection).
    pub fn cut(&self, link: &str) {
        self.each(link, "", |c, _| c.reset());
    }

    /// Reset every link: ends whatever still waits on one (a test's
    /// watchdog).
    pub fn cut_all(&self) {
        for c in self.0.live() {
            c.reset();
        }
        self.0.listeners.lock().unwrap().clear();
    }

    /// (bytes written, bytes read) by `from` on `link`, if it exists.
    pub fn offsets(&self, link: &str, from: &str) -> Option<(u64, u64)> {
        let mut r = None;
        self.each(link, from, |c, side| r = Some(c.pipes[side].offsets()));
        r
    }

    /// Names of the links alive now.
    pub fn links(&self) -> Vec<String> {
        self.0.live().iter().map(|c| c.label()).collect()
    }

    /// Every frame written so far, in the order written.
    pub fn transcript(&self) -> Vec<Record> {
        self.0.transcript.lock().unwrap().clone()
    }

    /// Apply `f` to the live links named `link` (and the side `from`
    /// writes; any side for "").
    fn each(&self, link: &str, from: &str, mut f: impl FnMut(&LinkCore, usize)) {
        for c in self.0.live().iter().filter(|c| c.label() == link) {
            let side = c.hosts.iter().position(|h| h == from).unwrap_or(0);
            f(c, side);
        }
    }
}

/// Connections arriving at one address.
pub struct Listener {
    rx: Receiver<Box<dyn Link>>,
    addr: String,
    net: Net,
}

impl Listener {
    /// The next connection; None once the net stopped listening here.
    pub fn accept(&self) -> Option<Box<dyn Link>> {
        self.rx.recv().ok()
    }

    /// [`Self::accept`] waiting at most `d` (real time).
    pub fn accept_timeout(&self, d: Duration) -> Result<Box<dyn Link>, RecvTimeoutError> {
        self.rx.recv_timeout(d)
    }
}

/// Connections until the net stops listening (a daemon's dispatch loop,
/// server::Daemon::serve_links).
impl Iterator for Listener {
    type Item = Box<dyn Link>;
    fn next(&mut self) -> Option<Box<dyn Link>> {
        self.accept()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.net.unlisten(&self.addr);
    }
}

/// A host's way into the net.
struct MemTransport {
    net: Arc<NetInner>,
    host: String,
}

impl Transport for MemTransport {
    fn connect(&self, addr: &str, _timeout: Duration) -> io::Result<Box<dyn Link>> {
        let refused = || io::Error::new(io::ErrorKind::ConnectionRefused, "connection refused");
        if let Some((after, n)) = self.net.refusals.lock().unwrap().get_mut(addr) {
            if *after > 0 {
                *after -= 1;
            } else if *n > 0 {
                *n -= 1;
                return Err(refused());
            }
        }
        let Some((host, tx)) = self.net.listeners.lock().unwrap().get(addr).cloned() else {
            return Err(refused());
        };
        let core = self.net.new_link("", [self.host.clone(), host]);
        tx.send(Box::new(MemLink::new(core.clone(), 1)))
            .map_err(|_| refused())?;
        Ok(Box::new(MemLink::new(core, 0)))
    }
    fn name(&self) -> &'static str {
        "mem"
    }
    fn clock(&self) -> Clock {
        self.net.clock.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::wire::{recv_control, send_control};
    use ramsys_proto::frame::FrameKind;
    use ramsys_proto::Control;
    use std::io::{Read, Write};

    fn join(stream: u16) -> Control {
        Control::Join {
            session: 7,
            stream,
            nonce: [0; 32],
            mac: [0; 32],
        }
    }

    #[test]
    fn a_dialled_link_is_named_by_its_join_and_records_round_trips() {
        let net = Net::default();
        let l = net.listen("b:1", "b");
        let mut a = net.host("a").connect("b:1", Duration::ZERO).unwrap();
        let mut b = l.accept().unwrap();
        a.write_all(&ramsys_proto::preamble(ramsys_proto::VERSION))
            .unwrap();
        send_control(&mut *a, &join(3)).unwrap();
        let mut p = [0u8; 8];
        b.read_exact(&mut p).unwrap();
        assert!(matches!(
            recv_control(&mut *b).unwrap(),
            Control::Join { .. }
        ));
        send_control(&mut *b, &Control::JoinOk).unwrap();
        assert_eq!(recv_control(&mut *a).unwrap(), Control::JoinOk);
        send_control(&mut *a, &Control::Settled).unwrap();
        let t = net.transcript();
        let names: Vec<_> = t
            .iter()
            .map(|r| (r.link.as_str(), r.name(), r.depth))
            .collect();
        assert_eq!(
            names,
            [
                ("", "", 1),
                ("data3.0", "Join", 1),
                ("data3.0", "JoinOk", 2),
                ("data3.0", "Settled", 3)
            ]
        );
        assert_eq!(net.links(), ["data3.0"]);
        assert_eq!(a.peer(), "mem:b/data3.0");
    }

    #[test]
    fn closing_an_end_ends_the_peer_and_refused_connects_fail() {
        let net = Net::default();
        let (mut a, mut b) = net.pair("ctl", "x", "y");
        a.write_all(b"tail").unwrap();
        let a2 = a.try_clone_link().unwrap();
        drop(a);
        assert!(!b.peer_gone(), "a clone still holds the end");
        drop(a2);
        let mut s = String::new();
        b.read_to_string(&mut s).unwrap();
        assert_eq!(s, "tail");
        assert!(b.peer_gone());
        assert!(b.write_all(b"x").is_err());
        let _l = net.listen("z:1", "z");
        net.refuse("z:1", 1, 1);
        let t = net.host("x");
        assert!(t.connect("z:1", Duration::ZERO).is_ok());
        assert!(t.connect("z:1", Duration::ZERO).is_err());
        assert!(t.connect("z:1", Duration::ZERO).is_ok());
        assert!(t.connect("nowhere:1", Duration::ZERO).is_err());
    }

    /// Lose, corrupt and swap act on DATA frames only, counted per
    /// direction; a cut resets both directions.
    #[test]
    fn frame_faults_act_on_data_frames() {
        let net = Net::default();
        let (mut a, mut b) = net.pair("d", "src", "snk");
        net.fault("d", "src", Fault::Swap(0));
        net.fault("d", "src", Fault::Corrupt(2));
        net.fault("d", "src", Fault::Lose { first: 3, count: 1 });
        let frame = |i: u8| {
            let mut f = ramsys_proto::frame::FrameHeader::new(FrameKind::Data, 1, 4)
                .encode()
                .to_vec();
            f.extend_from_slice(&[i; 4]);
            f
        };
        for i in 0..3 {
            a.write_all(&frame(i)).unwrap();
        }
        let mut got = [0u8; 36];
        b.read_exact(&mut got).unwrap();
        let firsts: Vec<u8> = got.chunks(12).map(|c| c[8]).collect();
        assert_eq!(firsts, [1, 0, 2], "frame 0 overtaken by frame 1");
        assert_eq!(got[35], 2 ^ 0x20, "frame 2 corrupted");
        // Frame 3 vanishes and the link dies: the writer fails at once,
        // the reader after what came before (frame 4 never comes).
        a.write_all(&frame(3)).unwrap();
        assert!(a.write_all(&frame(4)).is_err());
        assert!(b.read(&mut got).is_err());
        assert!(b.write_all(&frame(5)).is_err());
        let fates: Vec<_> = net.transcript().iter().map(|r| r.fate).collect();
        use Fate::*;
        assert_eq!(fates, [Overtaken, Delivered, Corrupted, Lost]);
    }

    #[test]
    fn a_cut_after_n_bytes_delivers_exactly_n() {
        let net = Net::default();
        let (mut a, mut b) = net.pair("c", "x", "y");
        net.fault("c", "x", Fault::CutAfter(5));
        // A partial header waits for its rest; these 8 bytes are no frame.
        a.write_all(b"abc").unwrap();
        assert!(a.write_all(b"defghij").is_err());
        let mut buf = [0u8; 8];
        // Reset: what was queued is gone with the connection.
        assert!(b.read(&mut buf).is_err());
        assert_eq!(net.offsets("c", "x"), Some((5, 0)));
    }
}
