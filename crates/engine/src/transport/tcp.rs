//! TCP links.

use std::io;
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::Duration;

use super::{Link, Transport};

impl Link for TcpStream {
    fn try_clone_link(&self) -> io::Result<Box<dyn Link>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn shutdown_both(&self) {
        let _ = self.shutdown(Shutdown::Both);
    }
    fn shutdown_write(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
    fn peer(&self) -> String {
        self.peer_addr().map(|a| a.to_string()).unwrap_or_default()
    }
    fn local(&self) -> String {
        self.local_addr().map(|a| a.to_string()).unwrap_or_default()
    }
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        TcpStream::set_read_timeout(self, d)
    }
    fn peer_gone(&self) -> bool {
        let mut b = [0u8; 1];
        // SAFETY: recv into a valid 1-byte buffer; MSG_PEEK | MSG_DONTWAIT
        // neither consumes input nor changes the descriptor's flags.
        let n = unsafe {
            libc::recv(
                self.as_raw_fd(),
                b.as_mut_ptr() as *mut libc::c_void,
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n == 0 {
            return true;
        }
        n < 0
            && !matches!(
                io::Error::last_os_error().kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            )
    }
    /// Path round trip: TCP_INFO's min_rtt.
    fn rtt(&self) -> Option<Duration> {
        // SAFETY: getsockopt writes at most `len` bytes into a zeroed
        // tcp_info, a plain C struct, and updates `len`.
        let info = unsafe {
            let mut info: libc::tcp_info = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
            let r = libc::getsockopt(
                self.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                &mut info as *mut _ as *mut libc::c_void,
                &mut len,
            );
            if r != 0 {
                return None;
            }
            info
        };
        // The windowed minimum, not the smoothed RTT: samples on a control
        // link include the peer's think time and delayed ACKs, the minimum
        // (first taken from the handshake) is the path. Microseconds; 0
        // when the kernel has no sample (or predates min_rtt, 4.6).
        let us = if info.tcpi_min_rtt > 0 {
            info.tcpi_min_rtt
        } else {
            info.tcpi_rtt
        };
        (us > 0).then(|| Duration::from_micros(us as u64))
    }
}

/// Tune a data or control socket: no Nagle delay for control messages, and
/// large buffers so one stream can fill a long fat pipe.
pub fn tune(s: &TcpStream, bufsize: Option<usize>) {
    let _ = s.set_nodelay(true);
    if let Some(sz) = bufsize {
        let v = sz as libc::c_int;
        for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
            // SAFETY: setsockopt with a valid fd and an int option value.
            unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    &v as *const _ as *const libc::c_void,
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
    }
    // Keepalive so a vanished peer is noticed even on an idle link.
    let on: libc::c_int = 1;
    // SAFETY: as above.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_KEEPALIVE,
            &on as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// The TCP transport.
#[derive(Default, Clone)]
pub struct Tcp {
    pub socket_buffer: Option<usize>,
}

impl Transport for Tcp {
    fn connect(&self, addr: &str, timeout: Duration) -> io::Result<Box<dyn Link>> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{addr}: no address"));
        let addrs = addr
            .to_socket_addrs()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot resolve {addr}: {e}")))?;
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(s) => {
                    tune(&s, self.socket_buffer);
                    return Ok(Box::new(s));
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }
    fn name(&self) -> &'static str {
        "tcp"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Loopback has a round trip, and a short one: the kernel's minimum
    /// comes from the handshake, so it is there before any data moved.
    #[test]
    fn loopback_rtt_is_known_and_short() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        for end in [&c, &s] {
            let r = Link::rtt(end).expect("an RTT sample after the handshake");
            assert!(r < Duration::from_millis(500), "{r:?}");
        }
    }
}
