//! Channel setup between two hosts that know only each other's MAC (seed
//! 002: a channel per NIC between initiator and target; issue 18: the
//! daemon advertises its MAC, MTU and ifindex, the agent opens channels).
//! The dialer sends OPEN (session, a fresh random token, channel number;
//! payload: its MTU and slots) every 50 ms until the listener answers
//! OPEN-OK with the agreed MTU (the smaller) or RESET (refused); both then
//! start a [`Channel`] with those parameters. Authenticating the channel is
//! the stream's business (the engine's Join, HMAC over the session key),
//! exactly as on a fresh TCP connection.

use std::io;
use std::time::{Duration, Instant};

use crate::channel::{mac_string, Channel};
use crate::endpoint::Config;
use crate::fault::FaultRates;
use crate::frame::{self, Header, Kind, Mac, OVERHEAD};
use crate::socket::{Batch, PacketSocket};

/// An OPEN as the listener sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offer {
    pub peer: Mac,
    pub session: u64,
    pub token: u64,
    pub channel: u16,
    pub mtu: usize,
}

const RETRY: Duration = Duration::from_millis(50);

/// An OPEN, OPEN-OK or RESET from `src` to `o.peer` about `o`.
fn setup_frame(buf: &mut [u8], kind: Kind, src: Mac, o: &Offer) -> usize {
    let (dst, session, token, channel, mtu) = (o.peer, o.session, o.token, o.channel, o.mtu);
    buf[OVERHEAD..OVERHEAD + 2].copy_from_slice(&(mtu as u16).to_be_bytes());
    buf[OVERHEAD + 2..OVERHEAD + 4].copy_from_slice(&64u16.to_be_bytes());
    let h = Header {
        dst,
        src,
        kind,
        flags: 0,
        session,
        token,
        channel,
        slot: 0,
        seq: 0,
        ack: 0,
        credits: 0,
        len: if kind == Kind::Reset { 0 } else { 4 },
        sack: 0,
    };
    frame::encode(&h, buf)
}

fn send_one(sock: &PacketSocket, batch: &mut Batch, n: usize) -> io::Result<()> {
    batch.set_len(0, n);
    batch.count = 1;
    batch.send(sock).map(|_| ())
}

/// The MTU field of an OPEN/OPEN-OK, clamped to what channels support.
fn payload_mtu(p: &[u8]) -> Option<usize> {
    let m = u16::from_be_bytes([*p.first()?, *p.get(1)?]) as usize;
    (frame::MTU_STD..=frame::MTU_JUMBO)
        .contains(&m)
        .then_some(m)
        .or(if m > frame::MTU_JUMBO {
            Some(frame::MTU_JUMBO)
        } else {
            None
        })
}

fn wait_readable(sock: &PacketSocket, d: Duration) {
    let mut p = libc::pollfd {
        fd: sock.fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one valid pollfd.
    unsafe { libc::poll(&mut p, 1, d.as_millis().max(1) as libc::c_int) };
}

/// Open channel `channel` of `session` to the host with MAC `peer` through
/// `sock`; `mtu` is ours (at most the interface's).
pub fn dial(
    sock: PacketSocket,
    peer: Mac,
    session: u64,
    channel: u16,
    mtu: usize,
    timeout: Duration,
    faults: Option<(FaultRates, u64)>,
) -> io::Result<Channel> {
    let mtu = mtu.min(sock.info.mtu).min(frame::MTU_JUMBO);
    if mtu < frame::MTU_STD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("raw channel on {}: MTU {mtu} below 1500", sock.info.name),
        ));
    }
    let token: u64 = rand::random();
    let me = sock.info.mac;
    // Only our channel's frames reach this socket (filter.rs): the
    // OPEN-OK, then the channel's traffic once it starts on it.
    let _ = crate::filter::attach(sock.fd(), &crate::filter::channel_program(channel));
    let mut tx = Batch::new(OVERHEAD + 4);
    let mut rx = Batch::new(frame::ETH_HDR + frame::MTU_JUMBO);
    let end = Instant::now() + timeout;
    let mut next_send = Instant::now();
    loop {
        let now = Instant::now();
        if now >= end {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "raw channel on {}: no answer from {} within {:.1} s (not on this \
                     interface's L2 segment, or not offering raw channels)",
                    sock.info.name,
                    mac_string(&peer),
                    timeout.as_secs_f64()
                ),
            ));
        }
        if now >= next_send {
            let o = Offer {
                peer,
                session,
                token,
                channel,
                mtu,
            };
            let n = setup_frame(tx.buf_mut(0), Kind::Open, me, &o);
            send_one(&sock, &mut tx, n)?;
            next_send = now + RETRY;
        }
        wait_readable(&sock, next_send.min(end).saturating_duration_since(now));
        let got = rx.recv(&sock)?;
        for i in 0..got {
            let Ok((h, p)) = frame::decode(rx.frame(i)) else {
                continue;
            };
            if h.src != peer
                || h.dst != me
                || h.session != session
                || h.token != token
                || h.channel != channel
            {
                continue;
            }
            match h.kind {
                Kind::OpenOk => {
                    let agreed = payload_mtu(p).unwrap_or(frame::MTU_STD).min(mtu);
                    let mut c = Config::new(session, token, channel, me, peer);
                    c.mtu = agreed;
                    return Channel::start(sock, c, faults);
                }
                Kind::Reset => {
                    return Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!(
                            "raw channel on {}: {} refused channel {channel} of session {session}",
                            sock.info.name,
                            mac_string(&peer)
                        ),
                    ))
                }
                _ => {}
            }
        }
    }
}

/// Answers OPENs on one interface.
pub struct Listener {
    sock: PacketSocket,
    rx: Batch,
    tx: Batch,
    /// Channels opened lately: a repeated OPEN (our OPEN-OK was lost) is
    /// answered again instead of opening a second channel.
    recent: Vec<(Offer, usize)>,
}

impl Listener {
    pub fn open(iface: &str) -> io::Result<Listener> {
        let sock = PacketSocket::open(iface)?;
        // OPENs only: the listener does not wake for data frames of the
        // channels it started (filter.rs).
        let _ = crate::filter::attach(sock.fd(), &crate::filter::open_program());
        Ok(Listener {
            sock,
            rx: Batch::new(frame::ETH_HDR + frame::MTU_JUMBO),
            tx: Batch::new(OVERHEAD + 4),
            recent: Vec::new(),
        })
    }

    pub fn mac(&self) -> Mac {
        self.sock.info.mac
    }

    /// The interface the listener answers on.
    pub fn info(&self) -> &crate::socket::IfaceInfo {
        &self.sock.info
    }

    /// Wait up to `timeout` for an OPEN that `admit` accepts (refused ones
    /// get a RESET) and start its channel; None on timeout.
    pub fn accept(
        &mut self,
        timeout: Duration,
        admit: impl Fn(&Offer) -> bool,
        faults: Option<(FaultRates, u64)>,
    ) -> io::Result<Option<Channel>> {
        let end = Instant::now() + timeout;
        let me = self.sock.info.mac;
        loop {
            let now = Instant::now();
            if now >= end {
                return Ok(None);
            }
            wait_readable(&self.sock, end - now);
            let got = self.rx.recv(&self.sock)?;
            for i in 0..got {
                let Ok((h, p)) = frame::decode(self.rx.frame(i)) else {
                    continue;
                };
                if h.kind != Kind::Open || h.dst != me {
                    continue;
                }
                let Some(their_mtu) = payload_mtu(p) else {
                    continue;
                };
                let offer = Offer {
                    peer: h.src,
                    session: h.session,
                    token: h.token,
                    channel: h.channel,
                    mtu: their_mtu.min(self.sock.info.mtu).min(frame::MTU_JUMBO),
                };
                if let Some(&(o, mtu)) = self.recent.iter().find(|(o, _)| *o == offer) {
                    self.reply(Kind::OpenOk, &o, mtu)?;
                    continue;
                }
                if !admit(&offer) {
                    self.reply(Kind::Reset, &offer, 0)?;
                    continue;
                }
                // The channel's socket exists before the OPEN-OK leaves, so
                // the dialer's first data frame finds it.
                let sock = self.sock.open_sibling()?;
                let mut c = Config::new(offer.session, offer.token, offer.channel, me, offer.peer);
                c.mtu = offer.mtu;
                let ch = Channel::start(sock, c, faults)?;
                self.reply(Kind::OpenOk, &offer, offer.mtu)?;
                if self.recent.len() >= 64 {
                    self.recent.remove(0);
                }
                self.recent.push((offer, offer.mtu));
                return Ok(Some(ch));
            }
        }
    }

    fn reply(&mut self, kind: Kind, o: &Offer, mtu: usize) -> io::Result<()> {
        let o = Offer { mtu, ..*o };
        let n = setup_frame(self.tx.buf_mut(0), kind, self.sock.info.mac, &o);
        send_one(&self.sock, &mut self.tx, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn mtu_field() {
        assert_eq!(payload_mtu(&[0x23, 0x28, 0, 64]), Some(9000));
        assert_eq!(payload_mtu(&[0x05, 0xdc]), Some(1500));
        assert_eq!(payload_mtu(&[0xff, 0xff]), Some(9000), "clamped");
        assert_eq!(payload_mtu(&[0x05, 0x78]), None, "1400 is too small");
        assert_eq!(payload_mtu(&[0x05]), None);
        let mut b = vec![0u8; OVERHEAD + 4];
        let o = Offer {
            peer: [4; 6],
            session: 1,
            token: 2,
            channel: 3,
            mtu: 1500,
        };
        let n = setup_frame(&mut b, Kind::Open, [2; 6], &o);
        let (h, p) = frame::decode(&b[..n]).unwrap();
        assert_eq!(
            (h.kind, h.session, h.token, h.channel),
            (Kind::Open, 1, 2, 3)
        );
        assert_eq!(payload_mtu(p), Some(1500));
    }

    proptest! {
        #[test]
        fn mtu_field_never_panics(p in proptest::collection::vec(any::<u8>(), 0..8)) {
            if let Some(m) = payload_mtu(&p) {
                prop_assert!((frame::MTU_STD..=frame::MTU_JUMBO).contains(&m));
            }
        }
    }
}
