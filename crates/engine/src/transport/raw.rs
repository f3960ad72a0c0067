//! Raw-Ethernet links (seed 002, Tyche; issue 18): a raw channel of
//! `ramsys-rawnet` (its own EtherType, slots, credits, acks, NACKs,
//! retransmission) is a reliable ordered byte stream, so it implements
//! [`Link`] and carries the existing data links, sealing (`--encrypt`)
//! included, unchanged.

use std::io;
use std::time::Duration;

use ramsys_rawnet::Channel;

use super::Link;

impl Link for Channel {
    fn try_clone_link(&self) -> io::Result<Box<dyn Link>> {
        Ok(Box::new(self.try_clone()))
    }
    fn shutdown_both(&self) {
        Channel::shutdown_both(self)
    }
    fn shutdown_write(&self) {
        Channel::shutdown_write(self)
    }
    fn peer(&self) -> String {
        self.describe_peer()
    }
    fn local(&self) -> String {
        self.describe_local()
    }
    fn kind(&self) -> &'static str {
        "raw"
    }
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        Channel::set_read_timeout(self, d);
        Ok(())
    }
    fn peer_gone(&self) -> bool {
        Channel::peer_gone(self)
    }
    fn rtt(&self) -> Option<Duration> {
        self.srtt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::sealed::{End, SealedLink};
    use crate::transport::wire::{exchange_preamble, read_header, recv_control, send_control};
    use ramsys_proto::Control;
    use ramsys_rawnet::netns::{self, Netns};
    use ramsys_rawnet::{Config, FaultRates, PacketSocket};

    /// Two raw channel ends across a veth pair between two namespaces,
    /// with 1 % faults; None (and the reason printed) without root.
    fn raw_pair(tag: &str) -> Option<(Netns, Netns, Channel, Channel)> {
        if let Some(why) = netns::unavailable() {
            eprintln!("skipped: {why}");
            return None;
        }
        let pid = std::process::id();
        let a = Netns::create(&format!("rl{tag}a-{pid}")).unwrap();
        let b = Netns::create(&format!("rl{tag}b-{pid}")).unwrap();
        netns::veth(&a, "ra", &b, "rb", 9000).unwrap();
        let sa = a.run(|| PacketSocket::open("ra")).unwrap().unwrap();
        let sb = b.run(|| PacketSocket::open("rb")).unwrap().unwrap();
        let ca = Config::new(77, 0xfeed, 3, sa.info.mac, sb.info.mac);
        let cb = Config::new(77, 0xfeed, 3, sb.info.mac, sa.info.mac);
        let f = |s| Some((FaultRates::all(0.01), s));
        let ca = Channel::start(sa, ca, f(1)).unwrap();
        let cb = Channel::start(sb, cb, f(2)).unwrap();
        Some((a, b, ca, cb))
    }

    /// The engine's wire protocol (preamble, control messages, sealed
    /// records, end of stream, abort) runs unchanged over raw links.
    #[test]
    fn engine_framing_and_sealing_over_a_raw_link() {
        let Some((_na, _nb, ca, cb)) = raw_pair("w") else {
            return;
        };
        let mut c: Box<dyn Link> = Box::new(ca);
        let mut s: Box<dyn Link> = Box::new(cb);
        assert!(c.peer().starts_with("raw:") && c.local().contains("@ra"));
        let mut s2 = s.try_clone_link().unwrap();
        let t = std::thread::spawn(move || {
            exchange_preamble(&mut *s2).unwrap();
            s2
        });
        exchange_preamble(&mut *c).unwrap();
        let s2 = t.join().unwrap();
        drop(s2);
        let big = Control::Deleted((0..20).map(|i| vec![i as u8; 40_000]).collect());
        send_control(&mut *c, &big).unwrap();
        c.flush().unwrap();
        assert_eq!(recv_control(&mut *s).unwrap(), big);

        let cipher = crate::transport::crypto::Cipher::ChaCha20Poly1305;
        let key = [5u8; 32];
        let mut sc = SealedLink::new(c, cipher, &key, End::Client, 0).unwrap();
        let mut ss = SealedLink::new(s, cipher, &key, End::Server, 0).unwrap();
        send_control(&mut sc, &big).unwrap();
        send_control(&mut sc, &Control::Settled).unwrap();
        assert_eq!(recv_control(&mut ss).unwrap(), big);
        assert_eq!(recv_control(&mut ss).unwrap(), Control::Settled);
        assert!(sc.rtt().is_some());

        // Half-close: the peer reads a clean end of stream.
        assert!(!ss.peer_gone());
        sc.shutdown_write();
        assert!(read_header(&mut ss, 0).unwrap().is_none());
        assert!(ss.peer_gone(), "end of stream read: the peer is gone");
        // The other direction is still open; an abort there fails the
        // peer's pending read, and so does every later write.
        send_control(&mut ss, &Control::JoinOk).unwrap();
        assert_eq!(recv_control(&mut sc).unwrap(), Control::JoinOk);
        sc.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut sc2 = sc.try_clone_link().unwrap();
        let r = std::thread::spawn(move || {
            let mut b = [0u8; 8];
            io::Read::read(&mut sc2, &mut b)
        });
        std::thread::sleep(Duration::from_millis(50));
        ss.shutdown_both();
        let e = r.join().unwrap().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}");
        assert!(sc.peer_gone());
        assert!(send_control(&mut ss, &Control::Settled).is_err());
    }
}
