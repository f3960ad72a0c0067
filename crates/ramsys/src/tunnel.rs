//! Data through the ssh connection (issue 20): when a host accepts only
//! ssh (many sites firewall everything else), the agent cannot reach the
//! ephemeral port `ssh-serve` offers. Instead of failing, every link of
//! the session is carried over the ssh channel that already exists (no
//! second login): a small multiplexer frames each link's bytes on the
//! agent's stdin/stdout pipes to ssh, and `ssh-serve` relays each link to
//! its own daemon on the remote host. The engine above sees ordinary
//! [`Link`]s (socketpairs), so nothing else changes. It is slower than
//! direct TCP (one ssh channel, ssh's cipher and window), which is why it
//! is the fallback and not the default.
//!
//! Frame: link id u32 LE, kind u8 (0 OPEN, 1 DATA, 2 CLOSE = the sender
//! will write no more on that link), len u32 LE (DATA only, at most
//! [`MAX_FRAME`]), payload. Both directions use the same format.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ramsys_engine::transport::{Link, Transport};

const OPEN: u8 = 0;
const DATA: u8 = 1;
const CLOSE: u8 = 2;
/// Largest DATA payload; a frame is read whole before it is delivered.
pub const MAX_FRAME: usize = 256 << 10;

type Out = Arc<Mutex<Box<dyn Write + Send>>>;

fn send(out: &Out, id: u32, kind: u8, data: &[u8]) -> io::Result<()> {
    let mut h = [0u8; 9];
    h[..4].copy_from_slice(&id.to_le_bytes());
    h[4] = kind;
    ramsys_framing::put_le_len(&mut h, 5, data.len());
    ramsys_framing::write_frame(&mut **out.lock().unwrap(), &h, data)
}

/// One frame from `r`: Ok(None) at a clean end of stream.
fn recv(r: &mut impl Read, buf: &mut Vec<u8>) -> io::Result<Option<(u32, u8)>> {
    // id u32 LE, kind u8, len u32 LE (ramsys-framing: checked before the
    // body is read).
    let mut h = [0u8; 9];
    let got = ramsys_framing::read_frame(r, &mut h, buf, |h| {
        let len = ramsys_framing::le_len(h, 5) as usize;
        if h[4] > CLOSE || len > MAX_FRAME || (h[4] != DATA && len != 0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad tunnel frame (kind {}, len {len})", h[4]),
            ));
        }
        Ok(len)
    })?;
    if !got {
        return Ok(None);
    }
    let id = u32::from_le_bytes(h[..4].try_into().unwrap());
    Ok(Some((id, h[4])))
}

/// Copy `from` into DATA frames of link `id` until it ends, then CLOSE.
fn pump(mut from: impl Read, out: Out, id: u32) {
    let mut buf = vec![0u8; MAX_FRAME];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if send(&out, id, DATA, &buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
    let _ = send(&out, id, CLOSE, &[]);
}

/// Something a frame's payload is delivered to (written through `&self`,
/// so the link table's lock is not held while a write blocks).
trait Half: Send + Sync {
    fn put(&self, b: &[u8]) -> io::Result<()>;
    fn close_write(&self);
}

impl Half for TcpStream {
    fn put(&self, b: &[u8]) -> io::Result<()> {
        (&*self).write_all(b)
    }
    fn close_write(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
}

impl Half for UnixStream {
    fn put(&self, b: &[u8]) -> io::Result<()> {
        (&*self).write_all(b)
    }
    fn close_write(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
}

/// Deliver frames from `input` to the links in `links` until it ends.
/// `open` makes a link for an OPEN (the relay's side); None refuses it.
fn demux<H: Half>(
    mut input: impl Read,
    links: &Mutex<HashMap<u32, Arc<H>>>,
    mut open: impl FnMut(u32) -> Option<H>,
) -> io::Result<()> {
    let mut buf = Vec::with_capacity(MAX_FRAME);
    while let Some((id, kind)) = recv(&mut input, &mut buf)? {
        match kind {
            OPEN => {
                if let Some(h) = open(id) {
                    links.lock().unwrap().insert(id, Arc::new(h));
                }
            }
            DATA => {
                // A link whose reader is gone drops its bytes: its peer
                // learns of it through the CLOSE its pump sends.
                let h = links.lock().unwrap().get(&id).cloned();
                if h.is_some_and(|h| h.put(&buf).is_err()) {
                    links.lock().unwrap().remove(&id);
                }
            }
            _ => {
                if let Some(h) = links.lock().unwrap().remove(&id) {
                    h.close_write();
                }
            }
        }
    }
    Ok(())
}

/// `ssh-serve`'s side: relay each link opened on `input` to `target` (its
/// daemon) until `input` ends (the agent or its ssh is gone).
pub fn relay(input: impl Read, output: Box<dyn Write + Send>, target: SocketAddr) {
    let out: Out = Arc::new(Mutex::new(output));
    let links: Mutex<HashMap<u32, Arc<TcpStream>>> = Mutex::new(HashMap::new());
    let r = demux(input, &links, |id| {
        let s = match TcpStream::connect(target) {
            Ok(s) => s,
            Err(_) => {
                let _ = send(&out, id, CLOSE, &[]);
                return None;
            }
        };
        let _ = s.set_nodelay(true);
        let reader = s.try_clone().ok()?;
        let o = out.clone();
        std::thread::Builder::new()
            .name(format!("tunnel-{id}"))
            .spawn(move || pump(reader, o, id))
            .ok()?;
        Some(s)
    });
    if let Err(e) = r {
        tracing::warn!("tunnel: {e}");
    }
}

/// The agent's side: a [`Transport`] whose links travel as frames over
/// ssh's stdin (`output`) and stdout (`input`).
pub struct Tunnel {
    out: Out,
    next: AtomicU32,
    links: Arc<Mutex<HashMap<u32, Arc<UnixStream>>>>,
}

impl Tunnel {
    pub fn start(input: Box<dyn Read + Send>, output: Box<dyn Write + Send>) -> Arc<Tunnel> {
        let t = Arc::new(Tunnel {
            out: Arc::new(Mutex::new(output)),
            next: AtomicU32::new(1),
            links: Arc::new(Mutex::new(HashMap::new())),
        });
        let links = t.links.clone();
        std::thread::Builder::new()
            .name("tunnel-demux".into())
            .spawn(move || {
                let _ = demux(input, &links, |_| None);
                // ssh is gone: every link ends.
                for (_, h) in links.lock().unwrap().drain() {
                    let _ = h.shutdown(Shutdown::Both);
                }
            })
            .expect("spawn tunnel demux");
        t
    }

    /// End of our side: ssh's stdin closes (once the links' pumps are
    /// done with it), so the remote relay and ssh-serve exit.
    pub fn close(&self) {
        *self.out.lock().unwrap() = Box::new(io::sink());
    }
}

impl Transport for Tunnel {
    fn connect(&self, _addr: &str, _timeout: Duration) -> io::Result<Box<dyn Link>> {
        let (mine, theirs) = UnixStream::pair()?;
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.links
            .lock()
            .unwrap()
            .insert(id, Arc::new(theirs.try_clone()?));
        send(&self.out, id, OPEN, &[])?;
        let out = self.out.clone();
        std::thread::Builder::new()
            .name(format!("tunnel-{id}"))
            .spawn(move || pump(theirs, out, id))?;
        Ok(Box::new(TunnelLink { s: mine, id }))
    }

    fn name(&self) -> &'static str {
        "ssh-tunnel"
    }
}

/// One link through the tunnel (the engine's end of a socketpair).
struct TunnelLink {
    s: UnixStream,
    id: u32,
}

impl Read for TunnelLink {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        self.s.read(b)
    }
}

impl Write for TunnelLink {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.s.write(b)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.s.flush()
    }
}

impl Link for TunnelLink {
    fn try_clone_link(&self) -> io::Result<Box<dyn Link>> {
        Ok(Box::new(TunnelLink {
            s: self.s.try_clone()?,
            id: self.id,
        }))
    }
    fn shutdown_both(&self) {
        let _ = self.s.shutdown(Shutdown::Both);
    }
    fn shutdown_write(&self) {
        let _ = self.s.shutdown(Shutdown::Write);
    }
    fn peer(&self) -> String {
        format!("ssh-tunnel link {}", self.id)
    }
    fn local(&self) -> String {
        "ssh".into()
    }
    fn kind(&self) -> &'static str {
        "ssh"
    }
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        self.s.set_read_timeout(d)
    }
}

/// Direct TCP first; if the first connection (the control link, dialled
/// before any data link) cannot be made, one line says so and this and
/// every later link goes through the tunnel. Once a direct connection has
/// worked, a later failure is an ordinary error (e.g. the remote end
/// exited after refusing the session), never a switch.
pub struct Fallback {
    pub direct: Arc<dyn Transport>,
    pub tunnel: Arc<Tunnel>,
    pub host: String,
    tunneled: AtomicBool,
    direct_ok: AtomicBool,
}

impl Fallback {
    pub fn new(direct: Arc<dyn Transport>, tunnel: Arc<Tunnel>, host: &str, forced: bool) -> Self {
        Fallback {
            direct,
            tunnel,
            host: host.to_string(),
            tunneled: AtomicBool::new(forced),
            direct_ok: AtomicBool::new(false),
        }
    }
}

impl Transport for Fallback {
    fn connect(&self, addr: &str, timeout: Duration) -> io::Result<Box<dyn Link>> {
        if !self.tunneled.load(Ordering::Acquire) {
            match self.direct.connect(addr, timeout) {
                Ok(l) => {
                    self.direct_ok.store(true, Ordering::Release);
                    return Ok(l);
                }
                Err(e) if self.direct_ok.load(Ordering::Acquire) => return Err(e),
                Err(e) => {
                    if !self.tunneled.swap(true, Ordering::AcqRel) {
                        say!(
                            "ramsys: {}: no direct connection to {addr} ({e}); carrying the data \
                             through ssh (slower; --ssh-tunnel asks for this at once)",
                            self.host
                        );
                    }
                }
            }
        }
        self.tunnel.connect(addr, timeout)
    }

    fn name(&self) -> &'static str {
        if self.tunneled.load(Ordering::Relaxed) {
            "ssh-tunnel"
        } else {
            self.direct.name()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// An echo "daemon", a relay and a tunnel joined by socketpairs in
    /// place of ssh's pipes.
    fn setup() -> Arc<Tunnel> {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let mut c = c.unwrap();
                std::thread::spawn(move || {
                    let mut r = c.try_clone().unwrap();
                    let _ = io::copy(&mut r, &mut c);
                    let _ = c.shutdown(Shutdown::Write);
                });
            }
        });
        let (agent_out, relay_in) = UnixStream::pair().unwrap();
        let (relay_out, agent_in) = UnixStream::pair().unwrap();
        std::thread::spawn(move || relay(relay_in, Box::new(relay_out), target));
        Tunnel::start(Box::new(agent_in), Box::new(agent_out))
    }

    #[test]
    fn links_carry_bytes_both_ways_independently() {
        let t = setup();
        let mut hs = Vec::new();
        for i in 0..4u8 {
            let mut l = t.connect("x", Duration::from_secs(1)).unwrap();
            hs.push(std::thread::spawn(move || {
                // More than one frame, with a distinct pattern per link.
                let data: Vec<u8> = (0..700_000u32).map(|j| (j as u8) ^ i).collect();
                let mut w = l.try_clone_link().unwrap();
                let d2 = data.clone();
                let wt = std::thread::spawn(move || {
                    w.write_all(&d2).unwrap();
                    w.shutdown_write();
                });
                let mut got = Vec::new();
                l.read_to_end(&mut got).unwrap();
                wt.join().unwrap();
                assert_eq!(got, data, "link {i}");
            }));
        }
        for h in hs {
            h.join().unwrap();
        }
    }

    #[test]
    fn a_refused_target_closes_the_link_and_bad_frames_end_the_relay() {
        let (agent_out, relay_in) = UnixStream::pair().unwrap();
        let (relay_out, agent_in) = UnixStream::pair().unwrap();
        // Port 1 on loopback: nothing listens.
        let target: SocketAddr = "127.0.0.1:1".parse().unwrap();
        std::thread::spawn(move || relay(relay_in, Box::new(relay_out), target));
        let t = Tunnel::start(Box::new(agent_in), Box::new(agent_out.try_clone().unwrap()));
        let mut l = t.connect("x", Duration::from_secs(1)).unwrap();
        let mut b = Vec::new();
        assert_eq!(l.read_to_end(&mut b).unwrap(), 0);
        // A frame longer than MAX_FRAME is refused, never allocated.
        let mut buf = Vec::new();
        let mut bad = [0u8; 9];
        bad[4] = DATA;
        bad[5..].copy_from_slice(&(u32::MAX).to_le_bytes());
        let e = recv(&mut &bad[..], &mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(buf.capacity() < MAX_FRAME);
        let mut unknown = [0u8; 9];
        unknown[4] = 9;
        assert!(recv(&mut &unknown[..], &mut buf).is_err());
    }

    #[test]
    fn fallback_switches_once_when_direct_fails() {
        struct Refuse;
        impl Transport for Refuse {
            fn connect(&self, _: &str, _: Duration) -> io::Result<Box<dyn Link>> {
                Err(io::ErrorKind::ConnectionRefused.into())
            }
            fn name(&self) -> &'static str {
                "refuse"
            }
        }
        let f = Fallback::new(Arc::new(Refuse), setup(), "h", false);
        assert_eq!(f.name(), "refuse");
        let mut l = f.connect("x", Duration::from_secs(1)).unwrap();
        l.write_all(b"ping").unwrap();
        let mut b = [0u8; 4];
        l.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"ping");
        assert_eq!(f.name(), "ssh-tunnel");
    }

    #[test]
    fn after_a_direct_link_worked_a_failure_is_an_error_not_a_switch() {
        // The first dial works, later ones are refused (the remote end
        // exited after refusing the session): no switch, no line.
        struct Once(AtomicBool, Arc<Tunnel>);
        impl Transport for Once {
            fn connect(&self, a: &str, t: Duration) -> io::Result<Box<dyn Link>> {
                if self.0.swap(false, Ordering::AcqRel) {
                    self.1.connect(a, t)
                } else {
                    Err(io::ErrorKind::ConnectionRefused.into())
                }
            }
            fn name(&self) -> &'static str {
                "once"
            }
        }
        let t = setup();
        let f = Fallback::new(
            Arc::new(Once(AtomicBool::new(true), t.clone())),
            t,
            "h",
            false,
        );
        assert!(f.connect("x", Duration::from_secs(1)).is_ok());
        let e = f.connect("x", Duration::from_secs(1)).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
        assert_eq!(f.name(), "once");
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Tunnel frames come from the remote host: no input panics the
        /// decoder or makes it allocate past MAX_FRAME.
        #[test]
        fn frame_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut r = &bytes[..];
            let mut buf = Vec::new();
            while let Ok(Some(_)) = recv(&mut r, &mut buf) {
                prop_assert!(buf.len() <= MAX_FRAME);
            }
        }
    }
}
