//! wanem: a small user-space WAN emulator for the ramsys benchmark suite (issue 3).
//!
//! This kernel has neither netem nor the fq qdisc, so a long-RTT path is emulated
//! in user space: one TUN device is created inside each of two network namespaces
//! (made beforehand by the driver, e.g. `ip netns add rsb-a`), and every IP packet
//! read from one device is written to the other after
//!   1. a bounded FIFO queue (tail drop when `--queue-pkts` packets wait),
//!   2. a token-bucket rate cap (`--rate-mbit`, bucket depth `--burst-kb`),
//!   3. a fixed one-way propagation delay (`--delay-ms`),
//!
//! i.e. the classic "bottleneck link + wire" model of a WAN path. Both directions
//! are shaped independently, so the ping RTT is 2 x delay.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use clap::Parser;

#[derive(Parser, Debug, Clone)]
#[command(about = "User-space WAN emulator between two network namespaces (TUN)")]
struct Args {
    /// Network namespace of side A (must exist: `ip netns add NAME`).
    #[arg(long, default_value = "rsb-a")]
    ns_a: String,
    /// Network namespace of side B.
    #[arg(long, default_value = "rsb-b")]
    ns_b: String,
    /// TUN device name inside namespace A.
    #[arg(long, default_value = "rsbt-a")]
    dev_a: String,
    /// TUN device name inside namespace B.
    #[arg(long, default_value = "rsbt-b")]
    dev_b: String,
    /// Point-to-point address of side A (configured with `ip` if given).
    #[arg(long)]
    addr_a: Option<String>,
    /// Point-to-point address of side B.
    #[arg(long)]
    addr_b: Option<String>,
    /// MTU of both TUN devices (jumbo by default: fewer packets per byte keeps
    /// the per-packet cost of a user-space forwarder off the critical path).
    #[arg(long, default_value_t = 9000)]
    mtu: u32,
    /// One-way delay in milliseconds, applied in each direction (RTT = 2x).
    #[arg(long, default_value_t = 0.0)]
    delay_ms: f64,
    /// Rate cap per direction in Mbit/s; 0 = unlimited.
    #[arg(long, default_value_t = 0.0)]
    rate_mbit: f64,
    /// Bottleneck queue length in packets; arrivals beyond it are dropped.
    #[arg(long, default_value_t = 1000)]
    queue_pkts: usize,
    /// Token bucket depth in KiB (burst allowed at line speed).
    #[arg(long, default_value_t = 64)]
    burst_kb: u64,
    /// Print per-direction counters to stderr every N seconds (0 = only at exit).
    #[arg(long, default_value_t = 0)]
    stats_interval: u64,
}

/// Packets in flight on the "wire" (already shaped, waiting out the delay) are
/// held in a channel; this caps memory if the peer stack floods an unlimited link.
const WIRE_CAP: usize = 1 << 16;
const MAX_PKT: usize = 65536;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

fn die(msg: String) -> ! {
    eprintln!("wanem: {msg}");
    std::process::exit(1);
}

/// Switch the calling thread into network namespace `ns` (a name under /run/netns).
fn enter_netns(path: &str) -> std::io::Result<()> {
    let f = File::open(path)?;
    // SAFETY: setns on a valid namespace fd only changes this thread's netns.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Create TUN device `name`. The device lands in the netns of the thread that
/// opens /dev/net/tun, which is why the caller enters the namespace first.
fn open_tun(name: &str) -> std::io::Result<File> {
    if name.len() >= libc::IFNAMSIZ {
        return Err(std::io::Error::other(format!(
            "device name too long: {name}"
        )));
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: IFF_TUN | IFF_NO_PI,
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads/writes a struct ifreq, which IfReq mirrors (40 bytes).
    if unsafe { libc::ioctl(f.as_raw_fd(), TUNSETIFF, &mut req) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(f)
}

fn ip(args: &[&str]) {
    match Command::new("ip").args(args).status() {
        Ok(s) if s.success() => {}
        Ok(s) => die(format!("`ip {}` failed: {s}", args.join(" "))),
        Err(e) => die(format!("cannot run ip: {e}")),
    }
}

fn configure(ns: &str, dev: &str, mtu: u32, local: Option<&str>, peer: Option<&str>) {
    let mtu = mtu.to_string();
    // A deep device queue: the emulated bottleneck queue is ours, not the kernel's.
    ip(&[
        "-n",
        ns,
        "link",
        "set",
        dev,
        "mtu",
        &mtu,
        "txqueuelen",
        "10000",
        "up",
    ]);
    if let (Some(l), Some(p)) = (local, peer) {
        ip(&["-n", ns, "addr", "add", l, "peer", p, "dev", dev]);
    }
}

/// Token bucket + bounded FIFO on a virtual clock: each admitted packet gets the
/// instant it finishes leaving the bottleneck; packets whose departure is still
/// in the future are "in the queue".
struct Shaper {
    bytes_per_s: f64, // 0 = unlimited
    burst: f64,
    tokens: f64,
    last: Instant, // departure time of the previous packet; tokens are valid at it
    backlog: VecDeque<Instant>,
    qlimit: usize,
}

impl Shaper {
    fn new(rate_mbit: f64, burst_kb: u64, qlimit: usize) -> Self {
        let burst = (burst_kb * 1024) as f64;
        Shaper {
            bytes_per_s: rate_mbit * 1e6 / 8.0,
            burst,
            tokens: burst,
            last: Instant::now(),
            backlog: VecDeque::new(),
            qlimit: qlimit.max(1),
        }
    }

    /// Departure instant of a packet of `len` bytes arriving at `now`, or None
    /// if the queue is full (tail drop).
    fn admit(&mut self, now: Instant, len: usize) -> Option<Instant> {
        if self.bytes_per_s <= 0.0 {
            return Some(now);
        }
        while self.backlog.front().is_some_and(|&d| d <= now) {
            self.backlog.pop_front();
        }
        if self.backlog.len() >= self.qlimit {
            return None;
        }
        let t0 = now.max(self.last);
        let refill = t0.duration_since(self.last).as_secs_f64() * self.bytes_per_s;
        self.tokens = (self.tokens + refill).min(self.burst);
        let len = len as f64;
        let dep = if self.tokens >= len {
            self.tokens -= len;
            t0
        } else {
            let wait = (len - self.tokens) / self.bytes_per_s;
            self.tokens = 0.0;
            t0 + Duration::from_secs_f64(wait)
        };
        self.last = dep;
        if dep > now {
            self.backlog.push_back(dep);
        }
        Some(dep)
    }
}

#[derive(Default)]
struct Counters {
    pkts: AtomicU64,
    bytes: AtomicU64,
    dropped_queue: AtomicU64,
    dropped_wire: AtomicU64,
}

fn reader(
    mut src: File,
    tx: SyncSender<(Instant, Vec<u8>)>,
    args: Args,
    c: Arc<Counters>,
    name: &'static str,
) {
    let delay = Duration::from_secs_f64(args.delay_ms.max(0.0) / 1000.0);
    let mut shaper = Shaper::new(args.rate_mbit, args.burst_kb, args.queue_pkts);
    let mut buf = vec![0u8; MAX_PKT];
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => die(format!("{name}: read: {e}")),
        };
        let now = Instant::now();
        let Some(dep) = shaper.admit(now, n) else {
            c.dropped_queue.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        match tx.try_send((dep + delay, buf[..n].to_vec())) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                c.dropped_wire.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Disconnected(_)) => return,
        }
    }
}

/// Delivery is FIFO and due times are non-decreasing, so sleeping until the
/// head packet is due is exact without a timer heap.
fn writer(mut dst: File, rx: Receiver<(Instant, Vec<u8>)>, c: Arc<Counters>, name: &'static str) {
    // Default 50 us timer slack would add straight onto every packet's delay.
    // SAFETY: prctl(PR_SET_TIMERSLACK) only affects this thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    for (due, pkt) in rx {
        let now = Instant::now();
        if due > now {
            thread::sleep(due - now);
        }
        match dst.write(&pkt) {
            Ok(_) => {
                c.pkts.fetch_add(1, Ordering::Relaxed);
                c.bytes.fetch_add(pkt.len() as u64, Ordering::Relaxed);
            }
            // The receiving stack may reject a packet (e.g. device going down);
            // a real link would lose it too.
            Err(e) if e.raw_os_error() == Some(libc::EIO) => {}
            Err(e) => die(format!("{name}: write: {e}")),
        }
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn report(ab: &Counters, ba: &Counters) {
    for (dir, c) in [("a->b", ab), ("b->a", ba)] {
        eprintln!(
            "wanem: {dir} pkts={} bytes={} drop_queue={} drop_wire={}",
            c.pkts.load(Ordering::Relaxed),
            c.bytes.load(Ordering::Relaxed),
            c.dropped_queue.load(Ordering::Relaxed),
            c.dropped_wire.load(Ordering::Relaxed)
        );
    }
}

fn main() {
    let args = Args::parse();
    let home = "/proc/thread-self/ns/net";
    let home_fd = File::open(home).unwrap_or_else(|e| die(format!("{home}: {e}")));

    let mut tuns = Vec::new();
    for (ns, dev) in [(&args.ns_a, &args.dev_a), (&args.ns_b, &args.dev_b)] {
        let path = format!("/run/netns/{ns}");
        enter_netns(&path).unwrap_or_else(|e| die(format!("setns {path}: {e}")));
        tuns.push(open_tun(dev).unwrap_or_else(|e| die(format!("tun {dev} in {ns}: {e}"))));
    }
    // Back home so the forwarding threads (which inherit nothing of this) and
    // any `ip` child run in the original namespace.
    // SAFETY: valid netns fd.
    if unsafe { libc::setns(home_fd.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        die(format!("setns home: {}", std::io::Error::last_os_error()));
    }
    configure(
        &args.ns_a,
        &args.dev_a,
        args.mtu,
        args.addr_a.as_deref(),
        args.addr_b.as_deref(),
    );
    configure(
        &args.ns_b,
        &args.dev_b,
        args.mtu,
        args.addr_b.as_deref(),
        args.addr_a.as_deref(),
    );

    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }

    let tun_b = tuns.pop().unwrap();
    let tun_a = tuns.pop().unwrap();
    let ab = Arc::new(Counters::default());
    let ba = Arc::new(Counters::default());
    let clone = |f: &File| f.try_clone().unwrap_or_else(|e| die(format!("dup: {e}")));

    let (tx_ab, rx_ab) = sync_channel(WIRE_CAP);
    let (tx_ba, rx_ba) = sync_channel(WIRE_CAP);
    {
        let (src, a, c) = (clone(&tun_a), args.clone(), ab.clone());
        thread::spawn(move || reader(src, tx_ab, a, c, "a->b"));
        let (dst, c) = (clone(&tun_b), ab.clone());
        thread::spawn(move || writer(dst, rx_ab, c, "a->b"));
        let (src, a, c) = (clone(&tun_b), args.clone(), ba.clone());
        thread::spawn(move || reader(src, tx_ba, a, c, "b->a"));
        let (dst, c) = (clone(&tun_a), ba.clone());
        thread::spawn(move || writer(dst, rx_ba, c, "b->a"));
    }

    println!(
        "wanem: ready {}/{} <-> {}/{} delay_ms={} rate_mbit={} queue_pkts={} mtu={}",
        args.ns_a,
        args.dev_a,
        args.ns_b,
        args.dev_b,
        args.delay_ms,
        args.rate_mbit,
        args.queue_pkts,
        args.mtu
    );
    let _ = std::io::stdout().flush();

    let mut last_stats = Instant::now();
    while !STOP.load(Ordering::SeqCst) {
        thread::sleep(Duration::from_millis(100));
        if args.stats_interval > 0
            && last_stats.elapsed() >= Duration::from_secs(args.stats_interval)
        {
            report(&ab, &ba);
            last_stats = Instant::now();
        }
    }
    report(&ab, &ba);
    // Exiting closes the TUN fds, which deletes both devices.
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlimited_rate_departs_immediately() {
        let mut s = Shaper::new(0.0, 64, 10);
        let now = Instant::now();
        assert_eq!(s.admit(now, 1500), Some(now));
    }

    #[test]
    fn rate_spaces_packets_and_queue_drops() {
        // 8 Mbit/s = 1 byte/us; no burst beyond one 1000-byte packet.
        let mut s = Shaper::new(8.0, 0, 3);
        let now = Instant::now();
        s.last = now;
        let d: Vec<_> = (0..3).map(|_| s.admit(now, 1000).unwrap()).collect();
        assert_eq!(d[0] - now, Duration::from_millis(1));
        assert_eq!(d[2] - now, Duration::from_millis(3));
        // Three packets are waiting: the fourth is tail-dropped.
        assert_eq!(s.admit(now, 1000), None);
        // After the first departs there is room again.
        assert!(s.admit(now + Duration::from_millis(1), 1000).is_some());
    }
}
