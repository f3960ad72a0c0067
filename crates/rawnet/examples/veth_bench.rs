//! Raw channel vs TCP over the same veth pair between two network
//! namespaces (issue 18's bench; docs/TYCHE.md has the numbers): one byte
//! stream one way, MB/s and CPU seconds per GB (user + system of this
//! process, which runs both ends, softirq work included when it runs on
//! our threads). Needs root.
//!
//! cargo run --release -p ramsys-rawnet --example veth_bench -- [MiB] [reps]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use ramsys_rawnet::netns::{self, Netns};
use ramsys_rawnet::{Channel, Config, FaultRates, PacketSocket};

fn cpu_s() -> f64 {
    // SAFETY: getrusage fills a plain C struct.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// Stream `bytes` through `w` into `r`; `done` ends the stream (a handle
/// dropped is not a close while others live, as with a dup'ed socket).
fn pump(
    mut w: impl Write,
    mut r: impl Read + Send,
    bytes: usize,
    done: impl FnOnce(),
) -> (f64, f64) {
    let c0 = cpu_s();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        s.spawn(move || {
            let mut b = vec![0u8; 1 << 20];
            let mut got = 0;
            loop {
                let n = r.read(&mut b).unwrap();
                if n == 0 {
                    break;
                }
                got += n;
            }
            assert_eq!(got, bytes);
        });
        let b = vec![0x5au8; 1 << 20];
        let mut left = bytes;
        while left > 0 {
            let k = left.min(b.len());
            w.write_all(&b[..k]).unwrap();
            left -= k;
        }
        w.flush().unwrap();
        done();
    });
    let t = t0.elapsed().as_secs_f64();
    let c = cpu_s() - c0;
    (bytes as f64 / t / 1e6, c / (bytes as f64 / 1e9))
}

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(512);
    let reps: usize = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(3);
    if let Some(why) = netns::unavailable() {
        eprintln!("cannot run: {why}");
        std::process::exit(1);
    }
    let bytes = mib << 20;
    let pid = std::process::id();
    let mtus: Vec<usize> = std::env::var("MTUS")
        .map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or(vec![9000, 1500]);
    for mtu in mtus {
        let a = Netns::create(&format!("rbench-a-{pid}")).unwrap();
        let b = Netns::create(&format!("rbench-b-{pid}")).unwrap();
        netns::veth(&a, "ba", &b, "bb", mtu).unwrap();
        a.ip(&["addr", "add", "10.211.0.1/24", "dev", "ba"])
            .unwrap();
        b.ip(&["addr", "add", "10.211.0.2/24", "dev", "bb"])
            .unwrap();
        for rep in 0..reps {
            for faults in [0.0, 0.01] {
                let sa = a.run(|| PacketSocket::open("ba")).unwrap().unwrap();
                let sb = b.run(|| PacketSocket::open("bb")).unwrap().unwrap();
                let mut ca = Config::new(1, 2, 0, sa.info.mac, sb.info.mac);
                let mut cb = Config::new(1, 2, 0, sb.info.mac, sa.info.mac);
                ca.mtu = mtu;
                cb.mtu = mtu;
                if let Some(n) = std::env::var("SLOTS").ok().and_then(|v| v.parse().ok()) {
                    ca.slots = n;
                    cb.slots = n;
                }
                let f = (faults > 0.0).then_some((FaultRates::all(faults), rep as u64));
                let ca = Channel::start(sa, ca, f).unwrap();
                let cb = Channel::start(sb, cb, f).unwrap();
                let (mbs, cpu) = pump(ca.try_clone(), cb.try_clone(), bytes, || {
                    ca.shutdown_write()
                });
                let st = ca.stats();
                println!(
                    "mtu {mtu} raw faults {faults:.2}: {mbs:7.0} MB/s {cpu:6.2} CPU s/GB (resent {} of {} frames)",
                    st.retransmitted, st.sent
                );
            }
            let l = b
                .run(|| TcpListener::bind("10.211.0.2:5999"))
                .unwrap()
                .unwrap();
            let c = a
                .run(|| TcpStream::connect("10.211.0.2:5999"))
                .unwrap()
                .unwrap();
            let (s, _) = l.accept().unwrap();
            let c2 = c.try_clone().unwrap();
            let (mbs, cpu) = pump(c, s, bytes, || {
                let _ = c2.shutdown(std::net::Shutdown::Write);
            });
            println!("mtu {mtu} tcp            : {mbs:7.0} MB/s {cpu:6.2} CPU s/GB");
        }
    }
}
