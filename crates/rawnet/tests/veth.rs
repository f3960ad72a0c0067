//! Raw channels over real AF_PACKET sockets: two network namespaces joined
//! by a veth pair (MTU 9000 and 1500) carry a byte stream identical end to
//! end with faults injected on both receive paths; a third namespace on the
//! same L2 segment forges frames, which are dropped and counted. Needs root
//! (CI runs as root); skipped with the reason otherwise.

mod common;

use std::io;
use std::time::{Duration, Instant};

use common::XorShift;
use ramsys_rawnet::netns::{self, Netns};
use ramsys_rawnet::{Channel, Config, FaultRates, PacketSocket};

fn skip() -> bool {
    if let Some(why) = netns::unavailable() {
        eprintln!("skipped: {why}");
        return true;
    }
    false
}

fn open_in(ns: &Netns, iface: &str) -> PacketSocket {
    let name = iface.to_string();
    ns.run(move || PacketSocket::open(&name)).unwrap().unwrap()
}

fn pair(a: PacketSocket, b: PacketSocket, mtu: usize, faults: Option<f64>) -> (Channel, Channel) {
    let mut r = [0u8; 16];
    getrandom_bytes(&mut r);
    let session = u64::from_le_bytes(r[..8].try_into().unwrap());
    let token = u64::from_le_bytes(r[8..].try_into().unwrap());
    let mk = |l: &PacketSocket, p: &PacketSocket| {
        let mut c = Config::new(session, token, 0, l.info.mac, p.info.mac);
        c.mtu = mtu;
        c
    };
    let (ca, cb) = (mk(&a, &b), mk(&b, &a));
    let f = |seed| faults.map(|p| (FaultRates::all(p), seed));
    (
        Channel::start(a, ca, f(1)).unwrap(),
        Channel::start(b, cb, f(2)).unwrap(),
    )
}

fn getrandom_bytes(b: &mut [u8]) {
    let t = Instant::now().elapsed().as_nanos() as u64 ^ std::process::id() as u64;
    XorShift(t | 1).fill(b);
    let f = std::fs::read("/proc/sys/kernel/random/uuid").unwrap_or_default();
    for (x, y) in b.iter_mut().zip(f) {
        *x ^= y;
    }
}

/// Send `len` bytes a -> b (and len/8 b -> a at the same time), check both
/// arrive identical and end with end of stream.
fn transfer(a: &Channel, b: &Channel, len: usize) -> Duration {
    let t0 = Instant::now();
    std::thread::scope(|s| {
        fn send(c: &Channel, n: usize, seed: u64) {
            let mut g = XorShift(seed);
            let mut buf = vec![0u8; 1 << 20];
            let mut left = n;
            while left > 0 {
                let k = left.min(buf.len());
                g.fill(&mut buf[..k]);
                let mut off = 0;
                while off < k {
                    off += c.write(&buf[off..k]).expect("write");
                }
                left -= k;
            }
            c.shutdown_write();
        }
        fn recv(c: &Channel, n: usize, seed: u64) {
            let mut g = XorShift(seed);
            let mut buf = vec![0u8; 256 << 10];
            let mut want = vec![0u8; 256 << 10];
            let mut got = 0usize;
            loop {
                let k = c.read(&mut buf).expect("read");
                if k == 0 {
                    break;
                }
                g.fill(&mut want[..k]);
                assert!(buf[..k] == want[..k], "stream differs near byte {got}");
                got += k;
            }
            assert_eq!(got, n, "stream length");
        }
        let (a2, b2) = (a.try_clone(), b.try_clone());
        s.spawn(move || send(&a2, len, 7));
        s.spawn(move || send(&b2, len / 8, 9));
        s.spawn(move || recv(b, len, 7));
        recv(a, len / 8, 9);
    });
    assert!(a.wait_acked(Duration::from_secs(10)));
    assert!(b.wait_acked(Duration::from_secs(10)));
    t0.elapsed()
}

fn two_namespaces(tag: &str, mtu: usize) -> io::Result<(Netns, Netns)> {
    let pid = std::process::id();
    let a = Netns::create(&format!("rn{tag}a-{pid}"))?;
    let b = Netns::create(&format!("rn{tag}b-{pid}"))?;
    netns::veth(&a, "vA", &b, "vB", mtu)?;
    Ok((a, b))
}

fn stream_over_veth(tag: &str, mtu: usize, loss: f64, len: usize) {
    if skip() {
        return;
    }
    let (na, nb) = two_namespaces(tag, mtu).unwrap();
    let (a, b) = pair(open_in(&na, "vA"), open_in(&nb, "vB"), mtu, Some(loss));
    let t = transfer(&a, &b, len);
    let (sa, sb) = (a.stats(), b.stats());
    let (fa, fb) = (a.fault_counts(), b.fault_counts());
    eprintln!(
        "mtu {mtu}, faults {loss}: {} MiB in {:.2} s ({:.0} MB/s); a {sa:?} {fa:?}; b {sb:?} {fb:?}",
        len >> 20,
        t.as_secs_f64(),
        len as f64 / t.as_secs_f64() / 1e6
    );
    if loss > 0.0 {
        assert!(fb.lost > 0 && fb.corrupted > 0 && fb.duplicated > 0 && fb.reordered > 0);
        assert!(sa.retransmitted > 0 && sb.corrupt > 0 && sb.duplicates > 0);
    }
}

#[test]
fn jumbo_64mib_with_one_percent_faults() {
    stream_over_veth("j", 9000, 0.01, 64 << 20);
}

#[test]
fn standard_mtu_with_five_percent_faults() {
    stream_over_veth("s", 1500, 0.05, 16 << 20);
}

#[test]
fn mtu_above_the_interface_is_refused() {
    if skip() {
        return;
    }
    let (na, nb) = two_namespaces("m", 1500).unwrap();
    let (sa, sb) = (open_in(&na, "vA"), open_in(&nb, "vB"));
    let c = Config::new(1, 2, 0, sa.info.mac, sb.info.mac);
    let e = Channel::start(sa, c, None)
        .err()
        .expect("mtu 9000 on a 1500 link");
    assert!(e.to_string().contains("above the interface's 1500"), "{e}");
    assert!(PacketSocket::open("no-such-if0").is_err());
}

/// A, B and a forger X on one L2 segment (a bridge in X's namespace, MAC
/// learning off so forged source addresses do not steal A's port). X sends
/// frames with its own MAC, and with A's MAC and a guessed token: B drops
/// and counts them, and the transfer is intact.
#[test]
fn forged_frames_from_a_third_namespace_are_dropped() {
    if skip() {
        return;
    }
    let pid = std::process::id();
    let na = Netns::create(&format!("rnfa-{pid}")).unwrap();
    let nb = Netns::create(&format!("rnfb-{pid}")).unwrap();
    let nx = Netns::create(&format!("rnfx-{pid}")).unwrap();
    netns::veth(&na, "vA", &nx, "pA", 9000).unwrap();
    netns::veth(&nb, "vB", &nx, "pB", 9000).unwrap();
    netns::veth(&nx, "xX", &nx, "pX", 9000).unwrap();
    nx.ip(&["link", "add", "br0", "type", "bridge"]).unwrap();
    for p in ["pA", "pB", "pX"] {
        nx.ip(&["link", "set", p, "master", "br0"]).unwrap();
        nx.ip(&[
            "link",
            "set",
            "dev",
            p,
            "type",
            "bridge_slave",
            "learning",
            "off",
        ])
        .unwrap();
    }
    nx.ip(&["link", "set", "br0", "mtu", "9000", "up"]).unwrap();
    let (sa, sb) = (open_in(&na, "vA"), open_in(&nb, "vB"));
    let (amac, bmac) = (sa.info.mac, sb.info.mac);
    let (a, b) = pair(sa, sb, 9000, None);
    let sx = open_in(&nx, "xX");
    let xmac = sx.info.mac;
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut batch = ramsys_rawnet::socket::Batch::new(9014);
            use ramsys_rawnet::frame::{encode, Header, Kind, OVERHEAD};
            for i in 0..20u32 {
                for (k, src) in [xmac, amac].into_iter().enumerate() {
                    let h = Header {
                        dst: bmac,
                        src,
                        kind: Kind::Data,
                        flags: 0,
                        session: 0x1234,
                        token: 0x5678 + i as u64,
                        channel: 0,
                        slot: (i % 64) as u16,
                        seq: i,
                        ack: 0,
                        credits: 64,
                        len: 100,
                        sack: 0,
                    };
                    let buf = batch.buf_mut(k);
                    buf[OVERHEAD..OVERHEAD + 100].fill(0xee);
                    let n = encode(&h, buf);
                    batch.set_len(k, n);
                }
                batch.count = 2;
                assert_eq!(batch.send(&sx).unwrap(), 2);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let t = transfer(&a, &b, 8 << 20);
        eprintln!("8 MiB without faults in {:.2} s", t.as_secs_f64());
    });
    let s = b.stats();
    eprintln!("b: {s:?}");
    assert!(s.forged_mac >= 20, "{s:?}");
    assert!(s.forged_session >= 20, "{s:?}");
    assert_eq!(
        s.forged(),
        s.forged_mac + s.forged_session + s.forged_token + s.misdirected
    );
}

/// Channel setup by MAC only (open.rs): a listener in B admits session 42;
/// A dials two channels at once over the same interfaces (the smaller MTU
/// wins on one), both carry their streams intact with 1 % faults; a
/// refused session and a MAC nobody has give one clear error each.
#[test]
fn dial_and_accept_two_channels_on_one_interface() {
    use ramsys_rawnet::open::{dial, Listener};
    if skip() {
        return;
    }
    let (na, nb) = two_namespaces("o", 9000).unwrap();
    let mut l = nb.run(|| Listener::open("vB")).unwrap().unwrap();
    let bmac = l.mac();
    let f = Some((FaultRates::all(0.01), 5));
    let (server, client) = std::thread::scope(|s| {
        let acc = s.spawn(|| {
            let mut v = Vec::new();
            while v.len() < 2 {
                let c = l
                    .accept(Duration::from_secs(10), |o| o.session == 42, f)
                    .unwrap()
                    .expect("an OPEN within 10 s");
                v.push(c);
            }
            v
        });
        let mut v = Vec::new();
        for (ch, mtu) in [(0u16, 9000usize), (1, 1500)] {
            let sock = open_in(&na, "vA");
            v.push(dial(sock, bmac, 42, ch, mtu, Duration::from_secs(5), f).unwrap());
        }
        (acc.join().unwrap(), v)
    });
    assert_eq!(client[0].mtu(), 9000);
    assert_eq!(client[1].mtu(), 1500);
    assert_eq!(server[1].mtu(), 1500);
    std::thread::scope(|s| {
        s.spawn(|| transfer(&client[0], &server[0], 16 << 20));
        transfer(&client[1], &server[1], 4 << 20);
    });
    // Each channel's socket keeps only its own channel's frames (the
    // socket filter, filter.rs): none of the other channel's frames reach
    // its endpoint.
    for c in server.iter().chain(client.iter()) {
        assert_eq!(c.stats().forged_token, 0, "{:?}", c.stats());
    }

    let (refused, accepted) = std::thread::scope(|s| {
        let h = s.spawn(|| l.accept(Duration::from_secs(1), |o| o.session == 42, None));
        let sock = open_in(&na, "vA");
        let e = dial(sock, bmac, 43, 0, 9000, Duration::from_secs(5), None);
        (
            e.err().expect("session 43 refused"),
            h.join().unwrap().unwrap(),
        )
    });
    assert!(accepted.is_none());
    assert_eq!(refused.kind(), io::ErrorKind::PermissionDenied);
    assert!(
        refused
            .to_string()
            .contains("refused channel 0 of session 43"),
        "{refused}"
    );
    let nobody = [2, 0, 0, 0x12, 0x34, 0x56];
    let e = dial(
        open_in(&na, "vA"),
        nobody,
        42,
        0,
        9000,
        Duration::from_millis(300),
        None,
    )
    .err()
    .expect("nobody answers");
    assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    assert!(
        e.to_string().contains("no answer from 02:00:00:12:34:56"),
        "{e}"
    );
}
