//! AF_PACKET sockets for raw channels (seed 002 sec. 2, "a network thread
//! per NIC"; issue 18: AF_PACKET as the portable kernel path). One
//! SOCK_RAW socket bound to one interface and to our EtherType, so the
//! kernel hands it only our frames; frames move in batches with
//! recvmmsg/sendmmsg (one syscall per up to BATCH frames, one copy each
//! way between the kernel's skb and our buffers).
//!
//! Not TPACKET_V3: a mapped ring would save the receive copy and the
//! syscall per batch (the kernel fills blocks the reader polls), but needs
//! its own block/frame bookkeeping and a V2 TX ring for the send side;
//! recvmmsg/sendmmsg is what the time allowed (docs/TYCHE.md, "kernel
//! path").

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::frame::{Mac, ETHERTYPE};

/// Frames per recvmmsg/sendmmsg call.
pub const BATCH: usize = 32;

const PACKET_IGNORE_OUTGOING: libc::c_int = 23;

/// An interface as the socket sees it (in the socket's network namespace).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfaceInfo {
    pub name: String,
    pub ifindex: i32,
    pub mac: Mac,
    pub mtu: usize,
    pub up: bool,
}

/// One AF_PACKET socket bound to an interface and to [`ETHERTYPE`].
pub struct PacketSocket {
    fd: OwnedFd,
    pub info: IfaceInfo,
}

fn ifreq_for(name: &str) -> io::Result<libc::ifreq> {
    let c = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name with NUL"))?;
    let b = c.as_bytes_with_nul();
    if b.len() > libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {name:?} too long"),
        ));
    }
    // SAFETY: ifreq is a plain C struct; all-zero is a valid value.
    let mut r: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in r.ifr_name.iter_mut().zip(b) {
        *d = *s as libc::c_char;
    }
    Ok(r)
}

fn ioctl(fd: RawFd, req: libc::c_ulong, r: &mut libc::ifreq) -> io::Result<()> {
    // SAFETY: the SIOCGIF* requests used here read ifr_name and write the
    // ifreq union, which `r` owns.
    if unsafe { libc::ioctl(fd, req as _, r as *mut libc::ifreq) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Look an interface up through `fd` (any socket of the namespace).
fn iface_info(fd: RawFd, name: &str) -> io::Result<IfaceInfo> {
    let ctx = |e: io::Error| io::Error::new(e.kind(), format!("interface {name}: {e}"));
    let mut r = ifreq_for(name)?;
    ioctl(fd, libc::SIOCGIFINDEX, &mut r).map_err(ctx)?;
    // SAFETY: SIOCGIFINDEX filled the ifindex member.
    let ifindex = unsafe { r.ifr_ifru.ifru_ifindex };
    let mut r = ifreq_for(name)?;
    ioctl(fd, libc::SIOCGIFHWADDR, &mut r).map_err(ctx)?;
    // SAFETY: SIOCGIFHWADDR filled the hwaddr member.
    let hw = unsafe { r.ifr_ifru.ifru_hwaddr };
    if hw.sa_family != libc::ARPHRD_ETHER {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("interface {name} is not Ethernet (ARPHRD {})", hw.sa_family),
        ));
    }
    let mut mac = [0u8; 6];
    for (m, d) in mac.iter_mut().zip(hw.sa_data.iter()) {
        *m = *d as u8;
    }
    let mut r = ifreq_for(name)?;
    ioctl(fd, libc::SIOCGIFMTU, &mut r).map_err(ctx)?;
    // SAFETY: SIOCGIFMTU filled the mtu member.
    let mtu = unsafe { r.ifr_ifru.ifru_mtu } as usize;
    let mut r = ifreq_for(name)?;
    ioctl(fd, libc::SIOCGIFFLAGS, &mut r).map_err(ctx)?;
    // SAFETY: SIOCGIFFLAGS filled the flags member.
    let flags = unsafe { r.ifr_ifru.ifru_flags } as libc::c_int;
    Ok(IfaceInfo {
        name: name.to_string(),
        ifindex,
        mac,
        mtu,
        // Administratively up; a missing carrier shows as loss.
        up: flags & libc::IFF_UP != 0,
    })
}

impl PacketSocket {
    /// Open a socket on `iface`. Without CAP_NET_RAW: one clear error.
    pub fn open(iface: &str) -> io::Result<PacketSocket> {
        // SAFETY: plain socket(2) call.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                (ETHERTYPE).to_be() as libc::c_int,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            if matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES)) {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "raw channel on {iface}: CAP_NET_RAW is missing (run as root or \
                         `setcap cap_net_raw+ep` the binary, or use --transport tcp)"
                    ),
                ));
            }
            return Err(io::Error::new(
                e.kind(),
                format!("raw channel on {iface}: AF_PACKET socket: {e}"),
            ));
        }
        // SAFETY: fd is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let info = iface_info(fd.as_raw_fd(), iface)?;
        if !info.up {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                format!("raw channel on {iface}: interface is down"),
            ));
        }
        // SAFETY: sockaddr_ll is a plain C struct; zero is valid.
        let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sa.sll_family = libc::AF_PACKET as u16;
        sa.sll_protocol = ETHERTYPE.to_be();
        sa.sll_ifindex = info.ifindex;
        // SAFETY: bind with a valid sockaddr_ll and its size.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &sa as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("raw channel on {iface}: bind: {e}"),
            ));
        }
        // Our own transmissions are not looped back to us (4.20+; without
        // it they are dropped as misdirected by the endpoint anyway).
        setopt(fd.as_raw_fd(), libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, 1);
        // Room for a burst of jumbo frames while the I/O thread is off the
        // CPU (the machine is shared); FORCE needs CAP_NET_ADMIN, the plain
        // option is capped by rmem_max.
        for (force, plain) in [
            (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
            (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
        ] {
            if !setopt(fd.as_raw_fd(), libc::SOL_SOCKET, force, 8 << 20) {
                setopt(fd.as_raw_fd(), libc::SOL_SOCKET, plain, 8 << 20);
            }
        }
        Ok(PacketSocket { fd, info })
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Another socket on the same interface, in this socket's network
    /// namespace even when the calling thread is in another one (a
    /// listener opened inside a test namespace, accepting from any
    /// thread): SIOCGSKNS gives the namespace, a short-lived thread enters
    /// it and opens the socket.
    pub fn open_sibling(&self) -> io::Result<PacketSocket> {
        const SIOCGSKNS: libc::c_ulong = 0x894C;
        // SAFETY: SIOCGSKNS takes no argument and returns a new fd.
        let ns = unsafe { libc::ioctl(self.fd(), SIOCGSKNS as _) };
        if ns < 0 {
            return PacketSocket::open(&self.info.name);
        }
        // SAFETY: fresh descriptor we own.
        let ns = unsafe { OwnedFd::from_raw_fd(ns) };
        let name = self.info.name.clone();
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: setns with a namespace fd; affects only this
                // scoped thread.
                if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                PacketSocket::open(&name)
            })
            .join()
            .map_err(|_| io::Error::other("socket thread panicked"))?
        })
    }
}

fn setopt(fd: RawFd, level: libc::c_int, opt: libc::c_int, v: libc::c_int) -> bool {
    // SAFETY: setsockopt with an int value and its size.
    unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            &v as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ) == 0
    }
}

/// BATCH frame buffers and the mmsghdr/iovec arrays that point at them,
/// allocated once per channel.
pub struct Batch {
    bufs: Vec<Box<[u8]>>,
    lens: [usize; BATCH],
    iov: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
    pub count: usize,
}

// SAFETY: the raw pointers in iov/msgs point only into `bufs`, which the
// Batch owns; they are rebuilt before every call.
unsafe impl Send for Batch {}

impl Batch {
    pub fn new(frame_size: usize) -> Batch {
        Batch {
            bufs: (0..BATCH)
                .map(|_| vec![0u8; frame_size].into_boxed_slice())
                .collect(),
            lens: [0; BATCH],
            // SAFETY: iovec and mmsghdr are plain C structs; zero is valid.
            iov: (0..BATCH).map(|_| unsafe { std::mem::zeroed() }).collect(),
            msgs: (0..BATCH).map(|_| unsafe { std::mem::zeroed() }).collect(),
            count: 0,
        }
    }

    /// Buffer `i` to fill (send) or read (receive).
    pub fn buf_mut(&mut self, i: usize) -> &mut [u8] {
        &mut self.bufs[i]
    }
    pub fn set_len(&mut self, i: usize, n: usize) {
        self.lens[i] = n;
    }
    /// Received frame `i`.
    pub fn frame(&self, i: usize) -> &[u8] {
        &self.bufs[i][..self.lens[i]]
    }
    pub fn frame_mut(&mut self, i: usize) -> &mut [u8] {
        let n = self.lens[i];
        &mut self.bufs[i][..n]
    }

    fn prepare(&mut self, n: usize, full: bool) {
        for i in 0..n {
            let len = if full {
                self.bufs[i].len()
            } else {
                self.lens[i]
            };
            self.iov[i] = libc::iovec {
                iov_base: self.bufs[i].as_mut_ptr() as *mut libc::c_void,
                iov_len: len,
            };
            // SAFETY: zeroed msghdr is valid; we set the iovec fields.
            let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
            h.msg_iov = &mut self.iov[i];
            h.msg_iovlen = 1;
            self.msgs[i] = libc::mmsghdr {
                msg_hdr: h,
                msg_len: 0,
            };
        }
    }

    /// Receive up to BATCH frames without blocking; how many arrived.
    pub fn recv(&mut self, s: &PacketSocket) -> io::Result<usize> {
        self.prepare(BATCH, true);
        // SAFETY: msgs[..BATCH] point at owned buffers of their stated size.
        let n = unsafe {
            libc::recvmmsg(
                s.fd(),
                self.msgs.as_mut_ptr(),
                BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
                _ => Err(e),
            };
        }
        let n = n as usize;
        for i in 0..n {
            // Truncated (MSG_TRUNC) frames are longer than our MTU: the
            // decoder rejects them by their length field.
            self.lens[i] = (self.msgs[i].msg_len as usize).min(self.bufs[i].len());
        }
        Ok(n)
    }

    /// Send frames `0..count`; frames the kernel refuses (queue full) are
    /// left to the retransmission timer, as a lossy wire would.
    pub fn send(&mut self, s: &PacketSocket) -> io::Result<usize> {
        let n = self.count;
        self.count = 0;
        if n == 0 {
            return Ok(0);
        }
        self.prepare(n, false);
        let mut off = 0;
        while off < n {
            // SAFETY: msgs[off..n] point at owned buffers of their lengths.
            let r = unsafe {
                libc::sendmmsg(
                    s.fd(),
                    self.msgs[off..].as_mut_ptr(),
                    (n - off) as libc::c_uint,
                    0,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EAGAIN) | Some(libc::ENOBUFS) => {
                        // Socket buffer full: wait a little for room, then
                        // leave the rest to the retransmission timer.
                        if !wait_writable(s.fd()) {
                            return Ok(off);
                        }
                        continue;
                    }
                    _ => return Err(e),
                }
            }
            off += r as usize;
        }
        Ok(n)
    }
}

fn wait_writable(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: poll on one valid pollfd.
    unsafe { libc::poll(&mut p, 1, 2) > 0 }
}
