//! TCP links.

use std::fs::File;
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
        let info = tcp_info(self)?;
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
    fn delivery_rate(&self) -> Option<u64> {
        let r = tcp_info(self)?.tcpi_delivery_rate;
        (r > 0).then_some(r)
    }
    fn bytes_acked(&self) -> Option<u64> {
        Some(tcp_info(self)?.tcpi_bytes_acked)
    }
    fn srtt(&self) -> Option<Duration> {
        let us = tcp_info(self)?.tcpi_rtt;
        (us > 0).then(|| Duration::from_micros(us as u64))
    }
    fn can_send_file(&self) -> bool {
        true
    }
    fn send_file(
        &mut self,
        head: &[&[u8]],
        file: &File,
        off: u64,
        len: usize,
    ) -> io::Result<usize> {
        let fd = self.as_raw_fd();
        // The head waits for the payload (MSG_MORE): they leave in the
        // same segments, as the vectored write of the buffer path does.
        for mut h in head.iter().copied() {
            while !h.is_empty() {
                let flags = libc::MSG_MORE | libc::MSG_NOSIGNAL;
                // SAFETY: send from a valid slice on our socket.
                let n = retry_eintr(|| unsafe {
                    libc::send(fd, h.as_ptr() as *const libc::c_void, h.len(), flags)
                })?;
                if n == 0 {
                    return Err(io::ErrorKind::WriteZero.into());
                }
                h = &h[n..];
            }
        }
        let mut pos = off as libc::off_t;
        let mut sent = 0;
        while sent < len {
            // SAFETY: sendfile between two descriptors we hold; the kernel
            // advances `pos`.
            let n = retry_eintr(|| unsafe {
                libc::sendfile(fd, file.as_raw_fd(), &mut pos, len - sent)
            })?;
            if n == 0 {
                break; // the file ended (truncated since the scan)
            }
            sent += n;
        }
        Ok(sent)
    }
    fn busy_us(&self) -> Option<u64> {
        // 0 on kernels before 4.10, which lack the chronograph: unknown.
        let b = tcp_info(self)?.tcpi_busy_time;
        (b > 0).then_some(b)
    }
}

/// The socket's TCP_INFO, None if the kernel refuses.
fn tcp_info(s: &TcpStream) -> Option<libc::tcp_info> {
    // SAFETY: getsockopt writes at most `len` bytes into a zeroed
    // tcp_info, a plain C struct, and updates `len`.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let r = libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            &mut info as *mut _ as *mut libc::c_void,
            &mut len,
        );
        (r == 0).then_some(info)
    }
}

/// The congestion control this process's TCP links use (issue 21), set
/// once at start by [`use_congestion`]; unset: the system default.
static CONGESTION: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

/// The congestion controls the kernel offers (names, in its order).
pub fn available_congestion(root: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(root.join("proc/sys/net/ipv4/tcp_available_congestion_control"))
        .map(|s| s.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// Which congestion control to use: `asked` (`--congestion NAME`) if the
/// kernel has it, else an error naming what it has; with nothing asked,
/// BBR where the kernel has it (a long path with some loss is where it
/// beats loss-based cubic, and a bulk transfer is what it was made for),
/// else None (the system default).
pub fn pick_congestion(
    asked: Option<&str>,
    available: &[String],
) -> Result<Option<String>, String> {
    match asked {
        Some(n) if available.iter().any(|a| a == n) => Ok(Some(n.to_string())),
        Some(n) => Err(format!(
            "congestion control `{n}` is not available here (available: {})",
            if available.is_empty() {
                "unknown".to_string()
            } else {
                available.join(" ")
            }
        )),
        None => Ok(available.iter().find(|a| *a == "bbr").cloned()),
    }
}

/// Set this process's congestion control once (see [`pick_congestion`]);
/// returns the name in force ("system default" when none is set).
pub fn use_congestion(asked: Option<&str>) -> Result<String, String> {
    let pick = pick_congestion(asked, &available_congestion(std::path::Path::new("/")))?;
    let name = CONGESTION.get_or_init(|| pick).clone();
    Ok(name.unwrap_or_else(|| "system default".into()))
}

/// The congestion control in force, if one was set.
pub fn congestion() -> Option<&'static str> {
    CONGESTION.get().and_then(|c| c.as_deref())
}

/// Tune a data or control socket: no Nagle delay for control messages, and
/// large buffers so one stream can fill a long fat pipe.
pub fn tune(s: &TcpStream, bufsize: Option<usize>) {
    let _ = s.set_nodelay(true);
    if let Some(cc) = congestion() {
        // SAFETY: setsockopt with a valid fd and a byte string of the
        // given length (the kernel copies at most TCP_CA_NAME_MAX).
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_CONGESTION,
                cc.as_ptr() as *const libc::c_void,
                cc.len() as libc::socklen_t,
            );
        }
    }
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
    // Keepalive so a vanished peer is noticed even on an idle link: after
    // 30 s of silence, 3 probes 10 s apart (about a minute; the kernel's
    // default is over two hours). A peer that is alive but busy (a sink
    // hashing a huge tree, a source scanning one) answers the probes, so
    // the waits that have no idle timeout of their own stay tied to the
    // peer being there, never to a fixed time a big tree can outgrow
    // (issue 36).
    for (level, opt, v) in [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 30),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 10),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3),
    ] {
        let v: libc::c_int = v;
        // SAFETY: as above.
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                level,
                opt,
                &v as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
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

/// A system call's byte count, called again while a signal interrupts it.
fn retry_eintr(mut call: impl FnMut() -> isize) -> io::Result<usize> {
    loop {
        let n = call();
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn congestion_is_bbr_where_available_and_a_missing_one_is_one_line() {
        let have = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let both = have(&["reno", "cubic", "bbr"]);
        assert_eq!(
            pick_congestion(None, &both).unwrap().as_deref(),
            Some("bbr")
        );
        assert_eq!(
            pick_congestion(None, &have(&["reno", "cubic"])).unwrap(),
            None
        );
        assert_eq!(
            pick_congestion(Some("cubic"), &both).unwrap().as_deref(),
            Some("cubic")
        );
        let e = pick_congestion(Some("vegas"), &both).unwrap_err();
        assert_eq!(
            e,
            "congestion control `vegas` is not available here (available: reno cubic bbr)"
        );
    }

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

    #[test]
    fn a_link_with_data_waiting_counts_busy_time_an_idle_one_none() {
        use std::io::Write;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_s, _) = l.accept().unwrap();
        // Nothing sent yet: no busy time (None: 0 reads as unknown).
        assert_eq!(Link::busy_us(&c), None);
        // The peer reads nothing: its window fills and data waits in our
        // send queue, which counts as busy (window-limited) time.
        c.set_nonblocking(true).unwrap();
        let block = vec![7u8; 1 << 20];
        let t0 = std::time::Instant::now();
        while t0.elapsed() < Duration::from_millis(100) {
            if c.write(&block).is_err() {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let busy = Link::busy_us(&c).expect("busy time with data waiting");
        assert!((20_000..=1_000_000).contains(&busy), "{busy} us");
        assert!(Link::bytes_acked(&c).unwrap() > 0);
    }
}
