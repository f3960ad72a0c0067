//! The metrics HTTP responder: `GET /metrics` answered with the exposition
//! of a fresh status snapshot (super::render), from one thread (issue 34).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use super::render;
use crate::daemon::status::Status;

/// Connections the metrics server holds at once (issue 34); a new one
/// beyond this closes the oldest, so a scraper still gets through a flood
/// of idle or slow connections.
pub(super) const MAX_CONNS: usize = 64;
/// Time a connection gets to send its request and read the answer,
/// however slowly it trickles bytes.
const DEADLINE: Duration = Duration::from_secs(5);
/// Largest request read (the request line is all that matters).
const MAX_REQUEST: usize = 16 << 10;

/// Serve `GET /metrics` on `addr` from one background thread (issue 34:
/// no thread per connection; at most MAX_CONNS held, each for at most
/// DEADLINE); returns the bound address. `snap` renders the current state.
pub fn serve(
    addr: &str,
    snap: impl Fn() -> Status + Send + Sync + 'static,
) -> std::io::Result<SocketAddr> {
    let l = TcpListener::bind(addr)?;
    let local = l.local_addr()?;
    l.set_nonblocking(true)?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            let mut conns: Vec<Conn> = Vec::new();
            loop {
                poll(&l, &mut conns);
                accept(&l, &mut conns);
                conns.retain_mut(|c| c.step(&snap));
            }
        })?;
    Ok(local)
}

/// One scrape: reading its request, then writing its answer.
struct Conn {
    s: TcpStream,
    req: Vec<u8>,
    out: Option<Vec<u8>>,
    sent: usize,
    deadline: std::time::Instant,
    ready: bool,
}

impl Conn {
    /// Make what progress the socket allows; false when the connection is
    /// done (answered, gone or out of time).
    fn step(&mut self, snap: &dyn Fn() -> Status) -> bool {
        if std::time::Instant::now() >= self.deadline {
            return false;
        }
        if !std::mem::take(&mut self.ready) {
            return true;
        }
        if self.out.is_none() {
            let mut buf = [0u8; 2048];
            loop {
                match self.s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        self.req.extend_from_slice(&buf[..n]);
                        if self.req.windows(4).any(|w| w == b"\r\n\r\n")
                            || self.req.len() >= MAX_REQUEST
                        {
                            break;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                    Err(_) => return false,
                }
            }
            self.out = Some(response(&self.req, snap));
        }
        let out = self.out.as_deref().unwrap_or_default();
        while self.sent < out.len() {
            match self.s.write(&out[self.sent..]) {
                Ok(0) => return false,
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                Err(_) => return false,
            }
        }
        false
    }
}

/// Wait until the listener or a connection is ready (or a deadline
/// passes); marks the ready connections.
fn poll(l: &TcpListener, conns: &mut [Conn]) {
    use std::os::fd::AsRawFd;
    let mut fds = vec![libc::pollfd {
        fd: l.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    fds.extend(conns.iter().map(|c| libc::pollfd {
        fd: c.s.as_raw_fd(),
        events: if c.out.is_some() {
            libc::POLLOUT
        } else {
            libc::POLLIN
        },
        revents: 0,
    }));
    let next = conns.iter().map(|c| c.deadline).min();
    let wait = next.map_or(Duration::from_secs(1), |t| {
        t.saturating_duration_since(std::time::Instant::now())
    });
    let ms = wait.as_millis().clamp(1, 1000) as libc::c_int;
    // SAFETY: fds is a valid array of fds.len() pollfd structs.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n > 0 {
        for (c, f) in conns.iter_mut().zip(&fds[1..]) {
            c.ready = f.revents != 0;
        }
    }
}

/// Take every waiting connection; the oldest make room for new ones.
fn accept(l: &TcpListener, conns: &mut Vec<Conn>) {
    loop {
        match l.accept() {
            Ok((s, _)) => {
                if s.set_nonblocking(true).is_err() {
                    continue;
                }
                if conns.len() >= MAX_CONNS {
                    conns.remove(0);
                }
                conns.push(Conn {
                    s,
                    req: Vec::new(),
                    out: None,
                    sent: 0,
                    deadline: std::time::Instant::now() + DEADLINE,
                    // Try at once: the request is often there already.
                    ready: true,
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(_) => {
                // Out of descriptors: pause instead of spinning.
                std::thread::sleep(Duration::from_millis(50));
                return;
            }
        }
    }
}

/// The HTTP answer to `req`.
fn response(req: &[u8], snap: &dyn Fn() -> Status) -> Vec<u8> {
    let line = String::from_utf8_lossy(req);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (code, ctype, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            render(&snap()),
        ),
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "text/plain",
            "not found; try /metrics\n".into(),
        ),
        _ => ("405 Method Not Allowed", "text/plain", "only GET\n".into()),
    };
    let mut out = format!(
        "HTTP/1.1 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if method != "HEAD" {
        out.extend_from_slice(body.as_bytes());
    }
    out
}
