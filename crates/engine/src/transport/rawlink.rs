//! Raw-Ethernet data links between an agent and a daemon (seed 002, Tyche
//! sec. 3, 5, 6.3; issue 18; docs/TYCHE.md "Negotiation").
//!
//! - Daemon: [`RawListeners`] opens one `open::Listener` per `serve
//!   --raw-iface` interface at start and hands every channel it accepts to
//!   the same link dispatcher TCP connections go through, so Join (or
//!   Hello) runs inside the channel exactly as on TCP. [`offer`] is what
//!   the daemon advertises (RawOffer: name, ifindex, MAC, MTU, NUMA node,
//!   addresses).
//! - Agent: [`pair`] matches its interfaces with the advertised ones (same
//!   subnet first; a probe channel confirms the L2 segment), and
//!   [`RawTransport`] dials each data link from one of its interfaces to
//!   the paired MAC, the interface chosen by the channel scheduler (round
//!   robin, affinity-aware, dynamic). [`Split`] keeps the control link on
//!   TCP while the session's data links (and their replacements) go raw.
//! - Placement: a channel's I/O thread is started from a thread pinned to
//!   its NIC's node ([`nic_cpus`]), so it inherits that CPU set, and its
//!   slots are first touched there (the default local allocation policy
//!   puts them on that node).

use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ramsys_proto::control::RawIface;
use ramsys_rawnet::channel::mac_string;
use ramsys_rawnet::frame::Mac;
use ramsys_rawnet::open::{self, Listener};
use ramsys_rawnet::{fault, Channel, PacketSocket};
use ramsys_topo::{ChannelPolicy, ChannelScheduler, Topology};

use super::{Link, Transport};

/// How the agent's data links travel (`--transport`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    #[default]
    Tcp,
    Raw,
    /// Raw when the daemon offers it on this host's segment, else TCP.
    Auto,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "tcp" => Ok(Mode::Tcp),
            "raw" => Ok(Mode::Raw),
            "auto" => Ok(Mode::Auto),
            _ => Err(format!("expected tcp, raw or auto, got {s:?}")),
        }
    }
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    getrandom::getrandom(&mut b).expect("OS randomness");
    u64::from_le_bytes(b)
}

/// The NUMA node of NIC `name` and that node's CPUs (empty: unknown node,
/// do not pin), from a topology discovered under any sysfs root.
pub fn nic_cpus(topo: &Topology, name: &str) -> (Option<u32>, Vec<usize>) {
    let node = topo.nic(name).and_then(|n| n.numa_node);
    let cpus = node
        .and_then(|n| topo.node(n))
        .map(|n| n.cpus.clone())
        .unwrap_or_default();
    (node, cpus)
}

/// Run `f` on a thread pinned to `cpus` (none: unpinned); threads it
/// starts (a channel's I/O thread) inherit the CPU set.
fn on_cpus<T: Send>(cpus: &[usize], f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            if !cpus.is_empty() {
                let _ = ramsys_topo::placement::pin_current_thread(cpus);
            }
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("raw dial thread panicked")))
    })
}

/// What a daemon advertises for one of its listeners.
fn offer_for(l: &Listener, topo: Option<&Topology>) -> RawIface {
    let i = l.info();
    let nic = topo.and_then(|t| t.nic(&i.name));
    RawIface {
        name: i.name.clone(),
        ifindex: i.ifindex.max(0) as u32,
        mac: i.mac,
        mtu: i.mtu as u32,
        node: nic.and_then(|n| n.numa_node),
        addrs: nic
            .map(|n| n.addresses.iter().map(|a| a.addr.to_string()).collect())
            .unwrap_or_default(),
    }
}

/// The daemon's raw listeners, one per interface, opened at start.
pub struct RawListeners {
    listeners: Vec<(Listener, Vec<usize>)>,
    offer: Vec<RawIface>,
}

/// Channels of one interface at most in the dispatcher at once (joining
/// their session, or a control connection's handler): a data link leaves
/// it as soon as its Join is checked, so only channels that have not
/// authenticated yet, or sessions whose control link came over raw, count.
pub const MAX_PENDING: usize = 256;

/// What the daemon's listeners hand accepted channels to.
pub type Handler = Arc<dyn Fn(Box<dyn Link>) + Send + Sync>;

impl RawListeners {
    /// Open `ifaces` (missing CAP_NET_RAW, an unknown, down or
    /// non-Ethernet interface: one line naming it).
    pub fn open(ifaces: &[String], topo: Option<&Topology>) -> Result<RawListeners, String> {
        let mut listeners = Vec::new();
        let mut offer = Vec::new();
        for name in ifaces {
            if listeners
                .iter()
                .any(|(l, _): &(Listener, _)| l.info().name == *name)
            {
                continue;
            }
            let l = Listener::open(name).map_err(|e| format!("--raw-iface {name}: {e}"))?;
            offer.push(offer_for(&l, topo));
            let cpus = topo.map(|t| nic_cpus(t, name).1).unwrap_or_default();
            listeners.push((l, cpus));
        }
        Ok(RawListeners { listeners, offer })
    }

    /// The RawOffer entries, in `--raw-iface` order.
    pub fn offer(&self) -> &[RawIface] {
        &self.offer
    }

    /// One thread per interface (pinned to its NIC's node, so the
    /// channels it starts are too): an OPEN is admitted while fewer than
    /// [`MAX_PENDING`] channels of this interface are still in the
    /// dispatcher (the channel authenticates with Join inside, as a TCP
    /// connection does; the cap bounds what OPENs from a stranger on the
    /// segment can pin down, beyond it they are refused with RESET) and
    /// the channel goes to `handler` on a thread of its own.
    pub fn spawn(self, handler: Handler) {
        self.spawn_with(handler, MAX_PENDING)
    }

    fn spawn_with(self, handler: Handler, max_pending: usize) {
        for (mut l, cpus) in self.listeners {
            let h = handler.clone();
            let name = format!("raw-listen-{}", l.info().name);
            let pending = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let _ = std::thread::Builder::new().name(name).spawn(move || {
                if !cpus.is_empty() {
                    let _ = ramsys_topo::placement::pin_current_thread(&cpus);
                }
                let room = |_: &open::Offer| pending.load(Ordering::Relaxed) < max_pending;
                loop {
                    match l.accept(Duration::from_secs(1), room, fault::from_env()) {
                        Ok(Some(ch)) => {
                            let h = h.clone();
                            let p = pending.clone();
                            p.fetch_add(1, Ordering::Relaxed);
                            let _ = std::thread::Builder::new().name("conn-raw".into()).spawn(
                                move || {
                                    h(Box::new(ch));
                                    p.fetch_sub(1, Ordering::Relaxed);
                                },
                            );
                        }
                        Ok(None) => {}
                        Err(e) => {
                            tracing::warn!("raw listener on {}: {e}", l.info().name);
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                }
            });
        }
    }
}

/// One of the agent's interfaces paired with one the daemon advertised.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawPair {
    pub local: String,
    pub peer: String,
    pub peer_mac: Mac,
    /// The smaller of both interfaces' MTUs.
    pub mtu: usize,
    pub node: Option<u32>,
    /// CPUs of `node` (empty: unpinned).
    pub cpus: Vec<usize>,
}

/// The daemon interfaces worth probing from local interface `local`: the
/// ones with an address inside one of `local`'s subnets, else (no IP
/// addresses to tell by) all of them.
pub fn candidates<'a>(
    local: Option<&ramsys_topo::Nic>,
    offer: &'a [RawIface],
) -> Vec<&'a RawIface> {
    let by_subnet: Vec<&RawIface> = offer
        .iter()
        .filter(|o| {
            o.addrs.iter().any(|a| {
                a.parse::<IpAddr>().is_ok_and(|ip| {
                    local.is_some_and(|n| n.addresses.iter().any(|na| na.contains(ip)))
                })
            })
        })
        .collect();
    if by_subnet.is_empty() {
        offer.iter().collect()
    } else {
        by_subnet
    }
}

/// Pair each of `locals` with the first advertised interface of
/// [`candidates`] that answers a probe channel (opened, then closed):
/// this proves the L2 segment, CAP_NET_RAW and the MTU before the
/// session starts. Err: one line (no pair at all, or a local interface
/// that cannot be opened).
pub fn pair(
    locals: &[String],
    offer: &[RawIface],
    topo: Option<&Topology>,
    daemon: &str,
) -> Result<Vec<RawPair>, String> {
    if offer.is_empty() {
        return Err(format!(
            "raw transport: the daemon at {daemon} offers no raw channels (serve --raw-iface)"
        ));
    }
    if locals.is_empty() {
        return Err(format!(
            "raw transport: no local interface on the route to {daemon} (give --raw-iface)"
        ));
    }
    let probe_tag: u64 = random_u64();
    let mut pairs = Vec::new();
    for (k, local) in locals.iter().enumerate() {
        let sock = PacketSocket::open(local).map_err(|e| format!("raw transport: {e}"))?;
        let my_mtu = sock.info.mtu;
        drop(sock);
        let (node, cpus) = topo.map(|t| nic_cpus(t, local)).unwrap_or_default();
        for o in candidates(topo.and_then(|t| t.nic(local)), offer) {
            let mtu = my_mtu.min(o.mtu as usize);
            let probe = PacketSocket::open(local).and_then(|s| {
                open::dial(
                    s,
                    o.mac,
                    probe_tag,
                    k as u16,
                    mtu,
                    Duration::from_millis(500),
                    None,
                )
            });
            match probe {
                Ok(ch) => {
                    // Our preamble, then end of stream: the daemon's
                    // connection handler sees a peer that closed (logged
                    // quietly), not a protocol error.
                    let _ = ch.write(&ramsys_proto::preamble(ramsys_proto::VERSION));
                    ch.shutdown_write();
                    pairs.push(RawPair {
                        local: local.clone(),
                        peer: o.name.clone(),
                        peer_mac: o.mac,
                        mtu,
                        node,
                        cpus: cpus.clone(),
                    });
                    break;
                }
                Err(e) => tracing::debug!("raw probe {local} -> {}: {e}", o.name),
            }
        }
    }
    if pairs.is_empty() {
        let theirs: Vec<String> = offer
            .iter()
            .map(|o| format!("{} {}", o.name, mac_string(&o.mac)))
            .collect();
        return Err(format!(
            "raw transport: the daemon's interfaces ({}) are not on the L2 segment of {} \
             (no answer to a probe channel)",
            theirs.join(", "),
            locals.join(", ")
        ));
    }
    Ok(pairs)
}

/// Data links as raw channels over `pairs`, the pair of each link chosen
/// by the channel scheduler.
pub struct RawTransport {
    pairs: Vec<RawPair>,
    sched: Mutex<ChannelScheduler>,
    buffer_node: Option<u32>,
    /// The OPEN frames' session field: random per transport, so the
    /// daemon's listener tells our channels from another agent's.
    tag: u64,
    next: AtomicU16,
}

impl RawTransport {
    pub fn new(
        pairs: Vec<RawPair>,
        policy: ChannelPolicy,
        buffer_node: Option<u32>,
    ) -> anyhow::Result<RawTransport> {
        let chans = pairs
            .iter()
            .map(|p| ramsys_topo::Channel {
                nic: p.local.clone(),
                node: p.node,
                capacity_mbps: ramsys_topo::channel::DEFAULT_CAPACITY_MBPS,
            })
            .collect();
        Ok(RawTransport {
            sched: Mutex::new(ChannelScheduler::new(chans, policy)?),
            pairs,
            buffer_node,
            tag: random_u64(),
            // Channel numbers from a random start: the daemon's sockets
            // filter by number (rawnet filter.rs), so two agents' channels
            // on one interface rarely share one.
            next: AtomicU16::new(random_u64() as u16),
        })
    }

    pub fn pairs(&self) -> &[RawPair] {
        &self.pairs
    }

    /// The pair the next link takes (one unit of work per link, as
    /// `ChannelTcp`).
    fn next_pair(&self) -> &RawPair {
        let i = self.sched.lock().unwrap().pick(self.buffer_node, 1);
        &self.pairs[i]
    }
}

impl Transport for RawTransport {
    fn connect(&self, _addr: &str, timeout: Duration) -> io::Result<Box<dyn Link>> {
        let p = self.next_pair();
        let ch = self.next.fetch_add(1, Ordering::Relaxed);
        let tag = self.tag;
        let c: Channel = on_cpus(&p.cpus, || {
            let sock = PacketSocket::open(&p.local)?;
            open::dial(sock, p.peer_mac, tag, ch, p.mtu, timeout, fault::from_env())
        })?;
        Ok(Box::new(c))
    }
    fn name(&self) -> &'static str {
        "raw"
    }
}

/// The control link over `control` (TCP), data links over `data`.
pub struct Split {
    pub control: Arc<dyn Transport>,
    pub data: Arc<dyn Transport>,
}

impl Transport for Split {
    fn connect(&self, addr: &str, timeout: Duration) -> io::Result<Box<dyn Link>> {
        self.control.connect(addr, timeout)
    }
    fn name(&self) -> &'static str {
        "tcp+raw"
    }
    fn data_links(&self) -> Option<Arc<dyn Transport>> {
        Some(self.data.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn fixture(name: &str) -> Topology {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../topo/tests/fixtures")
            .join(name);
        ramsys_topo::discover(&root).unwrap()
    }

    /// Seed 004's front end: eth0 on node 0, eth2 on node 1; a channel on
    /// eth2 is pinned to node 1's CPUs, one on a NIC of unknown node is
    /// not pinned.
    #[test]
    fn channel_threads_follow_their_nic_node() {
        let t = fixture("seed004-frontend");
        let (n0, c0) = nic_cpus(&t, "eth0");
        let (n2, c2) = nic_cpus(&t, "eth2");
        assert_eq!((n0, n2), (Some(0), Some(1)));
        assert_eq!(c0, t.node(0).unwrap().cpus);
        assert_eq!(c2, t.node(1).unwrap().cpus);
        assert!(c0.iter().all(|c| !c2.contains(c)));
        assert_eq!(nic_cpus(&t, "lo"), (None, vec![]));
        assert_eq!(nic_cpus(&t, "nosuch"), (None, vec![]));
        let v = fixture("no-numa");
        assert_eq!(nic_cpus(&v, "eth0").1, Vec::<usize>::new());
    }

    fn pair_on(local: &str, node: u32) -> RawPair {
        RawPair {
            local: local.into(),
            peer: "p".into(),
            peer_mac: [2, 0, 0, 0, 0, node as u8],
            mtu: 9000,
            node: Some(node),
            cpus: vec![],
        }
    }

    /// Round robin spreads links over both pairs; affinity-aware with the
    /// buffers on node 1 keeps them on node 1's NIC.
    #[test]
    fn links_are_spread_by_the_channel_scheduler() {
        let pairs = vec![pair_on("a1", 0), pair_on("a2", 1)];
        let t = RawTransport::new(pairs.clone(), ChannelPolicy::RoundRobin, None).unwrap();
        let got: Vec<&str> = (0..4).map(|_| t.next_pair().local.as_str()).collect();
        assert_eq!(got, ["a1", "a2", "a1", "a2"]);
        let t = RawTransport::new(pairs, ChannelPolicy::AffinityAware, Some(1)).unwrap();
        assert!((0..3).all(|_| t.next_pair().local == "a2"));
    }

    fn iface(name: &str, addr: &str) -> RawIface {
        RawIface {
            name: name.into(),
            ifindex: 1,
            mac: [2; 6],
            mtu: 1500,
            node: None,
            addrs: vec![addr.into()],
        }
    }

    /// Pairing candidates: an advertised address in one of our subnets
    /// wins; without any, every advertised interface is probed.
    #[test]
    fn candidates_by_subnet() {
        let t = fixture("seed004-frontend");
        let nic = t
            .nics
            .iter()
            .find(|n| {
                n.addresses
                    .iter()
                    .any(|a| a.addr.is_ipv4() && a.prefix_len < 32)
            })
            .expect("a NIC with an IPv4 subnet");
        let a = nic.addresses.iter().find(|a| a.addr.is_ipv4()).unwrap();
        let IpAddr::V4(v4) = a.addr else {
            unreachable!()
        };
        let mut o = v4.octets();
        o[3] = o[3].wrapping_add(1);
        let inside = std::net::Ipv4Addr::from(o).to_string();
        let offer = vec![iface("x", "192.0.2.77"), iface("y", &inside)];
        let c = candidates(Some(nic), &offer);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].name, "y");
        let offer = vec![iface("x", "192.0.2.77"), iface("z", "198.51.100.1")];
        assert_eq!(candidates(Some(nic), &offer).len(), 2);
        assert_eq!(candidates(None, &offer).len(), 2);
    }

    /// A channel's I/O thread is started inside `on_cpus`: threads
    /// started there inherit the pinned CPU set.
    #[test]
    fn threads_started_on_a_node_inherit_its_cpus() {
        let got = on_cpus(&[0], || {
            Ok(std::thread::spawn(ramsys_topo::placement::current_affinity)
                .join()
                .unwrap())
        })
        .unwrap();
        assert_eq!(got, vec![0]);
        // Unpinned (unknown node): the caller's set, untouched.
        let mine = ramsys_topo::placement::current_affinity();
        let got = on_cpus(&[], || Ok(ramsys_topo::placement::current_affinity())).unwrap();
        assert_eq!(got, mine);
    }

    /// A daemon's listener on a veth pair between two namespaces, with
    /// room for one channel in the dispatcher: the first OPEN is admitted
    /// and handed over (Box<dyn Link>), a second while the first is still
    /// held is refused, and admitted again once the first is released.
    #[test]
    fn listener_hands_channels_over_and_caps_pending_ones() {
        use ramsys_rawnet::netns;
        if let Some(why) = netns::unavailable() {
            eprintln!("skipped: {why}");
            return;
        }
        let pid = std::process::id();
        let a = netns::Netns::create(&format!("rkla-{pid}")).unwrap();
        let b = netns::Netns::create(&format!("rklb-{pid}")).unwrap();
        netns::veth(&a, "la", &b, "lb", 1500).unwrap();
        let l = b
            .run(|| RawListeners::open(&["lb".to_string()], None))
            .unwrap()
            .unwrap();
        assert_eq!(l.offer().len(), 1);
        let (bmac, mtu) = (l.offer()[0].mac, l.offer()[0].mtu);
        assert_eq!(mtu, 1500);
        let (got_tx, got_rx) = crossbeam_channel::unbounded::<String>();
        let (release_tx, release_rx) = crossbeam_channel::unbounded::<()>();
        let release_rx = Arc::new(Mutex::new(release_rx));
        l.spawn_with(
            Arc::new(move |link: Box<dyn Link>| {
                let _ = got_tx.send(link.local());
                let _ = release_rx.lock().unwrap().recv();
            }),
            1,
        );
        let dial = |ch: u16| {
            a.run(|| {
                let s = PacketSocket::open("la")?;
                open::dial(s, bmac, 7, ch, 1500, Duration::from_secs(2), None)
            })
            .unwrap()
        };
        let first = dial(1).unwrap();
        let local = got_rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(local.contains("@lb"), "{local}");
        let e = dial(2).err().expect("a second pending channel is refused");
        assert!(e.to_string().contains("refused"), "{e}");
        release_tx.send(()).unwrap();
        // The handler returns at once, but on a loaded machine a moment
        // later than the send: retry until there is room again.
        let third = (3..50)
            .find_map(|ch| {
                std::thread::sleep(Duration::from_millis(50));
                dial(ch).ok()
            })
            .expect("room again once the first channel left the dispatcher");
        assert!(got_rx.recv_timeout(Duration::from_secs(5)).is_ok());
        release_tx.send(()).unwrap();
        drop((first, third));
    }

    #[test]
    fn mode_parses() {
        assert_eq!("raw".parse::<Mode>(), Ok(Mode::Raw));
        assert_eq!("auto".parse::<Mode>(), Ok(Mode::Auto));
        assert!("udp".parse::<Mode>().is_err());
    }
}
