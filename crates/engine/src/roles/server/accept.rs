//! The dispatcher's accept loop (issue 34). One thread polls every
//! connection that has not yet sent its first message (the preamble and a
//! Hello, Join, Rejoin or SiteHello): such a connection costs a descriptor
//! and the few bytes received so far, never a thread. A thread is spawned
//! only for a complete, well-formed first message. Every connection holds
//! a limits::Permit from accept on (per daemon and per source address);
//! one over a limit is answered with an Error (code 4) and closed. A first
//! message must be complete within the handshake timeout however slowly it
//! trickles in (slowloris, idle and half-open connections), and its length
//! prefix is checked against limits::FIRST_MESSAGE_MAX before anything is
//! allocated for its body.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ramsys_proto::frame::{FrameHeader, FrameKind, HEADER_LEN};
use ramsys_proto::{parse_preamble, preamble, Control, ProtoError, PREAMBLE_LEN, VERSION};

use super::limits::{LogLimiter, Permit, FIRST_MESSAGE_MAX};
use super::DaemonShared;
use crate::transport::tcp::tune;
use crate::types::error::EngineError;

/// Where a first message stands after the bytes received so far.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// Exactly this many more bytes are needed (never more: what follows
    /// the first message belongs to its handler).
    More(usize),
    /// The message and its frame's flags.
    Done(Control, u8),
    /// Not our protocol (nothing is answered: the peer may not speak it).
    Foreign(ProtoError),
    /// Our protocol, but refused (answered with an Error, code 2).
    Bad(ProtoError),
}

/// Parse a connection's first bytes: the peer's preamble, then one control
/// frame of at most `max` bytes. The length prefix is checked before the
/// body is read, so an oversized one costs nothing.
pub fn first_step(buf: &[u8], max: u32) -> Step {
    let Some(pre) = buf.first_chunk::<PREAMBLE_LEN>() else {
        return Step::More(PREAMBLE_LEN - buf.len());
    };
    match parse_preamble(pre) {
        Err(e) => return Step::Foreign(e),
        Ok(v) if v != VERSION => {
            return Step::Foreign(ProtoError::VersionMismatch {
                ours: VERSION,
                theirs: v,
            })
        }
        Ok(_) => {}
    }
    let rest = &buf[PREAMBLE_LEN..];
    let Some(h) = rest.first_chunk::<HEADER_LEN>() else {
        return Step::More(HEADER_LEN - rest.len());
    };
    let h = match FrameHeader::decode(h, 0) {
        Ok(h) if h.kind != FrameKind::Control => {
            return Step::Bad(ProtoError::Unexpected {
                got: "non-control frame",
                state: "first message",
            })
        }
        Ok(h) if h.len > max => {
            return Step::Bad(ProtoError::FrameTooLarge {
                len: h.len.into(),
                limit: max.into(),
            })
        }
        Ok(h) => h,
        Err(e) => return Step::Bad(e),
    };
    let body = &rest[HEADER_LEN..];
    if body.len() < h.len as usize {
        return Step::More(h.len as usize - body.len());
    }
    match Control::decode(&body[..h.len as usize]) {
        Ok(m) => Step::Done(m, h.flags),
        Err(e) => Step::Bad(e),
    }
}

/// A connection that has not sent its first message yet.
struct Pending {
    s: TcpStream,
    permit: Permit,
    buf: Vec<u8>,
    deadline: Instant,
}

/// A connection being closed after a refusal: its Error is sent and its
/// write side shut; what the peer still sends is read and dropped until it
/// closes (or a short time passes), so that closing does not answer its
/// data with a reset that would destroy the Error before it is read.
struct Closing {
    s: TcpStream,
    until: Instant,
}

/// Connections being closed at once; beyond this a refused connection is
/// closed at once (its peer may then miss the Error).
const MAX_CLOSING: usize = 1024;
/// How long a refused connection is drained before it is closed.
const LINGER: Duration = Duration::from_millis(500);

struct Acceptor {
    sh: Arc<DaemonShared>,
    listener: TcpListener,
    pending: Vec<Pending>,
    closing: Vec<Closing>,
    log: LogLimiter,
}

/// Accept and dispatch connections on `listener` forever.
pub(super) fn run(listener: TcpListener, sh: Arc<DaemonShared>) {
    if let Err(e) = listener.set_nonblocking(true) {
        tracing::error!("listener: {e}");
        return;
    }
    let mut a = Acceptor {
        sh,
        listener,
        pending: Vec::new(),
        closing: Vec::new(),
        log: LogLimiter::new(Duration::from_secs(10)),
    };
    loop {
        a.expire();
        a.release_when_idle();
        let ready = a.poll();
        if ready.listener {
            a.accept_all();
        }
        a.serve_ready(&ready);
    }
}

/// What poll found readable: the listener, and indexes into `pending` and
/// `closing` (as they were when polled).
struct Ready {
    listener: bool,
    pending: Vec<usize>,
    closing: Vec<usize>,
}

/// A daemon this long without a session gives its buffer pool's pages back
/// to the system: sessions touch the pool progressively (a big transfer
/// most of `--memory`) and the pages would stay resident for the daemon's
/// life. Long enough that back-to-back sessions do not fault them in again
/// (about 0.1-0.2 s per 192 MiB on the measurement VM).
const POOL_IDLE: Duration = Duration::from_secs(30);

impl Acceptor {
    /// Idle since POOL_IDLE: the pool's pages go (a pool with any buffer
    /// out, a session starting meanwhile, keeps them: BufferPool::
    /// release_idle), and the heap sessions freed (malloc_trim).
    fn release_when_idle(&self) {
        let mut idle = self.sh.idle_since.lock().unwrap_or_else(|p| p.into_inner());
        if idle.is_some_and(|t| t.elapsed() >= POOL_IDLE)
            && self.sh.active.load(std::sync::atomic::Ordering::Relaxed) == 0
        {
            *idle = None;
            let bytes = self.sh.res.buffers.release_idle();
            crate::types::stats::return_freed_memory();
            tracing::debug!("idle: {bytes} bytes of buffer pool released");
        }
    }

    /// Wait until something is readable or the next deadline.
    fn poll(&self) -> Ready {
        let fd = |s: &TcpStream| libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let mut fds = Vec::with_capacity(1 + self.pending.len() + self.closing.len());
        fds.push(libc::pollfd {
            fd: self.listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        fds.extend(self.pending.iter().map(|p| fd(&p.s)));
        fds.extend(self.closing.iter().map(|c| fd(&c.s)));
        let next = self
            .pending
            .iter()
            .map(|p| p.deadline)
            .chain(self.closing.iter().map(|c| c.until))
            .min();
        let wait = next.map_or(Duration::from_secs(1), |t| {
            t.saturating_duration_since(Instant::now())
        });
        let ms = wait.as_millis().clamp(1, 1000) as libc::c_int;
        // SAFETY: fds is a valid array of fds.len() pollfd structs.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        let np = self.pending.len();
        let mut r = Ready {
            listener: false,
            pending: Vec::new(),
            closing: Vec::new(),
        };
        if n <= 0 {
            return r;
        }
        r.listener = fds[0].revents != 0;
        for (i, _) in fds[1..].iter().enumerate().filter(|(_, f)| f.revents != 0) {
            if i < np {
                r.pending.push(i);
            } else {
                r.closing.push(i - np);
            }
        }
        r
    }

    /// Close what ran out of time: first messages not complete within the
    /// handshake timeout, refused connections drained long enough.
    fn expire(&mut self) {
        let now = Instant::now();
        let timeout = self.sh.conns.limits().handshake_timeout;
        let (late, on_time): (Vec<_>, Vec<_>) =
            self.pending.drain(..).partition(|p| now >= p.deadline);
        self.pending = on_time;
        for p in late {
            let peer = peer_of(&p.s);
            self.log.warn("handshake timeout", || {
                format!(
                    "{peer}: no complete first message within {} s (received {} bytes); closed",
                    timeout.as_secs_f64(),
                    p.buf.len()
                )
            });
            let m = format!(
                "no complete first message within {} s",
                timeout.as_secs_f64()
            );
            // Not drained: a peer that sent nothing in time gets no
            // more of the daemon's time.
            let mut s = p.s;
            let _ = s.write_all(&error_frame(4, m));
        }
        self.closing.retain(|c| now < c.until);
    }

    /// Accept everything waiting; admit each against the limits.
    fn accept_all(&mut self) {
        loop {
            let s = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors (EMFILE) or memory: the listener
                    // stays readable; pause instead of spinning.
                    self.log.warn("accept", || format!("accept: {e}"));
                    std::thread::sleep(Duration::from_millis(50));
                    return;
                }
            };
            self.admit(s);
        }
    }

    fn admit(&mut self, mut s: TcpStream) {
        let Ok(ip) = s.peer_addr().map(|a| a.ip()) else {
            return;
        };
        if s.set_nonblocking(true).is_err() {
            return;
        }
        tune(&s, None);
        match self.sh.conns.admit(ip) {
            Ok(permit) => {
                // Ours first (exchange_preamble's order); a new socket's
                // buffer takes these 8 bytes at once.
                if s.write_all(&preamble(VERSION)).is_ok() {
                    let deadline = Instant::now() + self.sh.conns.limits().handshake_timeout;
                    self.pending.push(Pending {
                        s,
                        permit,
                        buf: Vec::new(),
                        deadline,
                    });
                }
            }
            Err(why) => {
                self.log.warn("connection limit", || {
                    format!("{ip}: connection refused: {why}")
                });
                let mut b = preamble(VERSION).to_vec();
                b.extend_from_slice(&error_frame(4, why));
                self.close_gently(s, &b);
            }
        }
    }

    /// Send `last`, shut the write side, and drain the connection a while
    /// before closing it (send_final's order, without a thread).
    fn close_gently(&mut self, mut s: TcpStream, last: &[u8]) {
        let _ = s.write_all(last);
        let _ = s.shutdown(std::net::Shutdown::Write);
        if self.closing.len() < MAX_CLOSING {
            self.closing.push(Closing {
                s,
                until: Instant::now() + LINGER,
            });
        }
    }

    /// Read what the ready connections sent; dispatch complete first
    /// messages, refuse bad ones, drop those that closed.
    fn serve_ready(&mut self, r: &Ready) {
        let mut buf = [0u8; 4096];
        let mut done_closing = Vec::new();
        for &i in &r.closing {
            let c = &mut self.closing[i];
            loop {
                match c.s.read(&mut buf) {
                    Ok(0) => break done_closing.push(i),
                    Ok(_) => continue,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(_) => break done_closing.push(i),
                }
            }
        }
        remove_indexes(&mut self.closing, &done_closing);
        let mut finished = Vec::new();
        for &i in &r.pending {
            if let Some(outcome) = read_first(&mut self.pending[i]) {
                finished.push((i, outcome));
            }
        }
        let idx: Vec<usize> = finished.iter().map(|(i, _)| *i).collect();
        let taken = take_indexes(&mut self.pending, &idx);
        for (p, (_, outcome)) in taken.into_iter().zip(finished) {
            self.finish(p, outcome);
        }
    }

    /// A pending connection's first message is complete, bad, or gone.
    fn finish(&mut self, p: Pending, outcome: Step) {
        let peer = peer_of(&p.s);
        match outcome {
            Step::Done(first, flags) => dispatch(&self.sh, p, first, flags),
            Step::Foreign(e) => {
                self.log.warn("foreign", || format!("{peer}: {e}; closed"));
                self.close_gently(p.s, &[]);
            }
            Step::Bad(e) => {
                self.log
                    .warn("bad first message", || format!("{peer}: {e}; refused"));
                let m = format!("refused first message: {e}");
                self.close_gently(p.s, &error_frame(2, m));
            }
            // The peer closed (or reset) before a whole message: a client
            // that dialled a link it then did not need
            // (session::PreLinks::resize), or a half-open probe.
            Step::More(_) => tracing::debug!("{peer}: closed before its first message"),
        }
    }
}

/// Read what `p` has sent, never past its first message. None: more is to
/// come; Some(Step::More) means the peer closed first.
fn read_first(p: &mut Pending) -> Option<Step> {
    loop {
        let need = match first_step(&p.buf, FIRST_MESSAGE_MAX) {
            Step::More(n) => n,
            done => return Some(done),
        };
        let have = p.buf.len();
        // At most what arrives (the need was checked against the limit).
        p.buf.resize(have + need.min(16 << 10), 0);
        match p.s.read(&mut p.buf[have..]) {
            Ok(0) => return Some(Step::More(need)),
            Ok(n) => p.buf.truncate(have + n),
            Err(e) => {
                p.buf.truncate(have);
                match e.kind() {
                    ErrorKind::WouldBlock => return None,
                    ErrorKind::Interrupted => {}
                    _ => return Some(Step::More(need)),
                }
            }
        }
    }
}

/// Run the connection's handler on a thread of its own; the permit goes
/// with it.
fn dispatch(sh: &Arc<DaemonShared>, p: Pending, first: Control, flags: u8) {
    let Pending { s, permit, .. } = p;
    if s.set_nonblocking(false).is_err() {
        return;
    }
    let sh = sh.clone();
    let spawned = std::thread::Builder::new()
        .name("conn".into())
        .spawn(move || {
            let _permit = permit;
            let mut link: Box<dyn crate::transport::Link> = Box::new(s);
            let peer = link.peer();
            let r = link
                .set_read_timeout(Some(super::IDLE_READ))
                .map_err(EngineError::from)
                .and_then(|_| super::handle_first(&sh, &mut link, first, flags));
            super::log_outcome(&peer, r);
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start a connection thread: {e}");
    }
}

fn peer_of(s: &TcpStream) -> String {
    s.peer_addr().map(|a| a.to_string()).unwrap_or_default()
}

/// An Error message as a whole frame.
fn error_frame(code: u16, message: String) -> Vec<u8> {
    let body = Control::Error { code, message }
        .encode()
        .unwrap_or_default();
    let mut b = FrameHeader::new(FrameKind::Control, 0, body.len() as u32)
        .encode()
        .to_vec();
    b.extend_from_slice(&body);
    b
}

/// Remove the entries at `idx` (ascending) from `v`.
fn remove_indexes<T>(v: &mut Vec<T>, idx: &[usize]) {
    drop(take_indexes(v, idx));
}

/// Take the entries at `idx` (ascending) out of `v`, in that order.
fn take_indexes<T>(v: &mut Vec<T>, idx: &[usize]) -> Vec<T> {
    let mut out = Vec::with_capacity(idx.len());
    for &i in idx.iter().rev() {
        out.push(v.swap_remove(i));
    }
    out.reverse();
    out
}

/// The first message of a link that is not a TCP connection of the
/// listener (raw-Ethernet channels, transport::rawlink): the same parser
/// and limits, read blocking against the same deadline.
pub(super) fn read_first_blocking(
    link: &mut dyn crate::transport::Link,
    timeout: Duration,
) -> Result<(Control, u8), EngineError> {
    let deadline = Instant::now() + timeout;
    link.write_all(&preamble(VERSION))?;
    link.flush()?;
    let mut buf = Vec::new();
    loop {
        let need = match first_step(&buf, FIRST_MESSAGE_MAX) {
            Step::More(n) => n,
            Step::Done(m, flags) => return Ok((m, flags)),
            Step::Foreign(e) | Step::Bad(e) => return Err(e.into()),
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(EngineError::local(format!(
                "no complete first message within {} s",
                timeout.as_secs_f64()
            )));
        }
        link.set_read_timeout(Some(left))?;
        let have = buf.len();
        buf.resize(have + need.min(16 << 10), 0);
        match link.read(&mut buf[have..]) {
            Ok(0) if have == 0 => return Err(EngineError::PeerClosed),
            Ok(0) => return Err(std::io::Error::from(ErrorKind::UnexpectedEof).into()),
            Ok(n) => buf.truncate(have + n),
            Err(e) if e.kind() == ErrorKind::Interrupted => buf.truncate(have),
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn framed(m: &Control, flags: u8) -> Vec<u8> {
        let body = m.encode().unwrap();
        let mut h = FrameHeader::new(FrameKind::Control, 0, body.len() as u32);
        h.flags = flags;
        let mut b = preamble(VERSION).to_vec();
        b.extend_from_slice(&h.encode());
        b.extend_from_slice(&body);
        b
    }

    #[test]
    fn a_first_message_byte_by_byte_asks_for_exactly_what_is_missing() {
        let m = Control::Hello {
            user: "alice".into(),
            noise: vec![7; 48],
        };
        let b = framed(&m, 3);
        let mut got = Vec::new();
        loop {
            match first_step(&got, FIRST_MESSAGE_MAX) {
                Step::More(n) => {
                    assert!(got.len() + n <= b.len(), "asks past the message");
                    got.push(b[got.len()]);
                }
                Step::Done(x, f) => {
                    assert_eq!((x, f), (m, 3));
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(got.len(), b.len());
    }

    #[test]
    fn an_oversized_length_prefix_is_refused_before_its_body() {
        let mut b = preamble(VERSION).to_vec();
        b.extend_from_slice(&FrameHeader::new(FrameKind::Control, 0, 1 << 20).encode());
        assert!(matches!(
            first_step(&b, FIRST_MESSAGE_MAX),
            Step::Bad(ProtoError::FrameTooLarge { len: 1048576, .. })
        ));
        let mut b = preamble(VERSION).to_vec();
        b.extend_from_slice(&FrameHeader::new(FrameKind::Data, 0, 16).encode());
        assert!(matches!(first_step(&b, FIRST_MESSAGE_MAX), Step::Bad(_)));
    }

    #[test]
    fn foreign_bytes_and_other_versions_are_not_answered() {
        assert!(matches!(
            first_step(b"GET / HTTP/1.0\r\n", FIRST_MESSAGE_MAX),
            Step::Foreign(ProtoError::BadMagic)
        ));
        let b = preamble(VERSION.wrapping_add(1));
        assert!(matches!(
            first_step(&b, FIRST_MESSAGE_MAX),
            Step::Foreign(ProtoError::VersionMismatch { .. })
        ));
    }

    proptest! {
        /// Whatever the bytes, the parser never asks for more than the
        /// limit allows, never panics, and is prefix-stable: more bytes
        /// after a verdict do not change it.
        #[test]
        fn any_bytes(tail in proptest::collection::vec(any::<u8>(), 0..300), cut in 0usize..400) {
            let mut b = preamble(VERSION).to_vec();
            b.extend_from_slice(&tail);
            let b = &b[..cut.min(b.len())];
            match first_step(b, 256) {
                Step::More(n) => prop_assert!(b.len() + n <= PREAMBLE_LEN + HEADER_LEN + 256),
                verdict => {
                    let mut longer = b.to_vec();
                    longer.extend_from_slice(&[0xAA; 64]);
                    let again = first_step(&longer, 256);
                    prop_assert_eq!(format!("{verdict:?}"), format!("{again:?}"));
                }
            }
        }
    }

    #[test]
    fn take_and_remove_indexes() {
        let mut v: Vec<u32> = (0..6).collect();
        assert_eq!(take_indexes(&mut v, &[1, 3, 4]), vec![1, 3, 4]);
        v.sort();
        assert_eq!(v, vec![0, 2, 5]);
        remove_indexes(&mut v, &[0, 2]);
        assert_eq!(v, vec![2]);
    }
}
