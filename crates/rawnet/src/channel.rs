//! A raw channel as a blocking byte stream (seed 002 sec. 2 and 5: one
//! network thread per channel, bound with its buffers to the channel's
//! NIC): an [`Endpoint`] behind a mutex, an I/O thread that moves frames
//! between it and a [`PacketSocket`], and handles with read/write that
//! the engine's `Link` wraps. The application threads copy into and out of
//! the endpoint's slots (the seed's inline mode for the copy; the frames
//! themselves always leave from the I/O thread, its queue mode, which
//! batches them into one sendmmsg).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::endpoint::{Config, Endpoint, Failure, ReadOutcome, Stats};
use crate::fault::{FaultCounts, FaultRates, Faults};
use crate::frame::Mac;
use crate::socket::{Batch, PacketSocket, BATCH};

/// How long a closed channel keeps acknowledging and resending after its
/// last handle is gone, waiting for its data to be acknowledged.
const LINGER: Duration = Duration::from_secs(5);

struct Inner {
    ep: Mutex<Endpoint>,
    /// Signalled when the endpoint may have become readable or writable.
    cv: Condvar,
    sock: PacketSocket,
    wake: OwnedFd,
    sleeping: AtomicBool,
    handles: AtomicUsize,
    read_timeout: Mutex<Option<Duration>>,
    faults: Mutex<FaultCounts>,
    epoch: Instant,
    peer: Mac,
}

impl Inner {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }
    fn lock(&self) -> MutexGuard<'_, Endpoint> {
        self.ep.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// Wake the I/O thread if it sleeps (one eventfd write; none while it
    /// is busy).
    fn kick(&self) {
        if self.sleeping.swap(false, Ordering::SeqCst) {
            // SAFETY: eventfd_write on our eventfd.
            unsafe { libc::eventfd_write(self.wake.as_raw_fd(), 1) };
        }
    }
}

/// A handle to one raw channel; clones share it.
pub struct Channel {
    inner: Arc<Inner>,
}

fn failure_error(f: Failure) -> io::Error {
    let kind = match f {
        Failure::Reset => io::ErrorKind::ConnectionReset,
        Failure::TimedOut => io::ErrorKind::TimedOut,
    };
    io::Error::new(kind, f.to_string())
}

pub fn mac_string(m: &Mac) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

impl Channel {
    /// Start a channel on `sock` (whose MAC must be `cfg.local_mac`), with
    /// an optional fault hook on its receive path (tests, --raw-faults).
    pub fn start(
        sock: PacketSocket,
        cfg: Config,
        faults: Option<(FaultRates, u64)>,
    ) -> io::Result<Channel> {
        if cfg.mtu > sock.info.mtu {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "raw channel on {}: MTU {} is above the interface's {}",
                    sock.info.name, cfg.mtu, sock.info.mtu
                ),
            ));
        }
        // Only this channel's frames from now on (filter.rs); a socket
        // without it still works, every other channel's frame is then
        // dropped by the endpoint.
        if let Err(e) =
            crate::filter::attach(sock.fd(), &crate::filter::channel_program(cfg.channel))
        {
            tracing::debug!("raw channel on {}: no socket filter: {e}", sock.info.name);
        }
        // SAFETY: plain eventfd(2) call.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if wake < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh descriptor we own.
        let wake = unsafe { OwnedFd::from_raw_fd(wake) };
        let epoch = Instant::now();
        let frame_size = cfg.frame_size();
        let peer = cfg.peer_mac;
        let name = format!("raw-{}-{}", sock.info.name, cfg.channel);
        let mut ep = Endpoint::new(cfg, 0);
        // Large slot copies on the process's copy thread (offload.rs; env
        // RAMSYS_COPY_OFFLOAD). Started here, on a thread pinned to the
        // NIC's node, so it inherits that CPU set like the I/O thread.
        if crate::offload::enabled() {
            if let Some(o) = crate::offload::global() {
                ep.set_copy_offload(o.client());
            }
        }
        let inner = Arc::new(Inner {
            ep: Mutex::new(ep),
            cv: Condvar::new(),
            sock,
            wake,
            sleeping: AtomicBool::new(false),
            handles: AtomicUsize::new(1),
            read_timeout: Mutex::new(None),
            faults: Mutex::new(FaultCounts::default()),
            epoch,
            peer,
        });
        let faults = faults.map(|(r, seed)| Faults::new(r, seed, frame_size));
        let i2 = inner.clone();
        // Detached: it ends by itself once the channel failed, or once the
        // last handle is gone and its data is acknowledged (LINGER).
        std::thread::Builder::new()
            .name(name)
            .spawn(move || io_loop(&i2, faults, frame_size))?;
        Ok(Channel { inner })
    }

    pub fn stats(&self) -> Stats {
        self.inner.lock().stats()
    }
    pub fn fault_counts(&self) -> FaultCounts {
        *self.inner.faults.lock().unwrap_or_else(|p| p.into_inner())
    }
    pub fn interface(&self) -> &str {
        &self.inner.sock.info.name
    }
    pub fn peer_mac(&self) -> Mac {
        self.inner.peer
    }
    pub fn local_mac(&self) -> Mac {
        self.inner.sock.info.mac
    }
    /// The channel's MTU (agreed at setup).
    pub fn mtu(&self) -> usize {
        self.inner.lock().config().mtu
    }
    pub fn srtt(&self) -> Option<Duration> {
        self.inner.lock().srtt_us().map(Duration::from_micros)
    }

    pub fn try_clone(&self) -> Channel {
        self.inner.handles.fetch_add(1, Ordering::SeqCst);
        Channel {
            inner: self.inner.clone(),
        }
    }

    pub fn set_read_timeout(&self, d: Option<Duration>) {
        *self
            .inner
            .read_timeout
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = d;
    }

    /// Blocking read; Ok(0) at end of stream.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let timeout = *self
            .inner
            .read_timeout
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let deadline = timeout.map(|d| Instant::now() + d);
        let mut ep = self.inner.lock();
        loop {
            match ep.read(buf) {
                ReadOutcome::Data(n) => {
                    let due = ep.transmit_due(self.inner.now());
                    drop(ep);
                    if due {
                        self.inner.kick();
                    }
                    return Ok(n);
                }
                ReadOutcome::Eof => return Ok(0),
                ReadOutcome::Failed(f) => return Err(failure_error(f)),
                ReadOutcome::WouldBlock => {}
            }
            let wait = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(io::Error::new(
                            io::ErrorKind::WouldBlock,
                            "raw channel: read timed out",
                        ));
                    }
                    left
                }
                None => Duration::from_secs(1),
            };
            ep = self
                .inner
                .cv
                .wait_timeout(ep, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Blocking write of at least one byte.
    pub fn write(&self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut ep = self.inner.lock();
        loop {
            if let Some(f) = ep.failure() {
                return Err(failure_error(f));
            }
            let n = ep.write(buf);
            if n > 0 {
                drop(ep);
                self.inner.kick();
                return Ok(n);
            }
            if !ep.writable() && ep.failure().is_none() && !ep.write_open() {
                return Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "raw channel: write side closed",
                ));
            }
            ep = self
                .inner
                .cv
                .wait_timeout(ep, Duration::from_secs(1))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Send the partly filled frame now.
    pub fn flush(&self) {
        self.inner.lock().flush();
        self.inner.kick();
    }

    pub fn shutdown_write(&self) {
        self.inner.lock().close_write();
        self.inner.kick();
    }

    pub fn shutdown_both(&self) {
        self.inner.lock().abort();
        self.inner.cv.notify_all();
        self.inner.kick();
    }

    /// Whether the peer reset the channel, stopped answering, or closed
    /// its side and everything it sent was read.
    pub fn peer_gone(&self) -> bool {
        let ep = self.inner.lock();
        ep.failure().is_some() || ep.peer_finished()
    }

    pub fn describe_peer(&self) -> String {
        format!("raw:{}", mac_string(&self.inner.peer))
    }
    pub fn describe_local(&self) -> String {
        format!(
            "raw:{}@{}",
            mac_string(&self.inner.sock.info.mac),
            self.inner.sock.info.name
        )
    }

    /// Wait until everything written is acknowledged (or the channel
    /// failed); false on timeout.
    pub fn wait_acked(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        let mut ep = self.inner.lock();
        while !ep.all_acked() && ep.failure().is_none() {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            ep = self
                .inner
                .cv
                .wait_timeout(ep, left.min(Duration::from_millis(50)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        ep.failure().is_none()
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        if self.inner.handles.fetch_sub(1, Ordering::SeqCst) == 1 {
            // Last handle: finish like a closed TCP socket, the I/O thread
            // lingers until the data is acknowledged.
            self.inner.lock().close_write();
            self.inner.kick();
        }
    }
}

fn io_loop(inner: &Inner, mut faults: Option<Faults>, frame_size: usize) {
    let mut rx = Batch::new(frame_size);
    let mut tx = Batch::new(frame_size);
    let mut closed_at: Option<Instant> = None;
    loop {
        let got = match rx.recv(&inner.sock) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!("raw channel on {}: receive: {e}", inner.sock.info.name);
                inner.lock().abort();
                0
            }
        };
        let (deadline, done) = {
            let mut ep = inner.lock();
            let now = inner.now();
            for i in 0..got {
                match faults.as_mut() {
                    Some(f) => f.apply(rx.frame_mut(i), |fr| ep.handle_frame(fr, now)),
                    None => ep.handle_frame(rx.frame(i), now),
                }
            }
            // A frame held back for reordering goes in once the socket is
            // drained: it is delivered late, not lost before a sleep.
            if got < BATCH {
                if let Some(f) = faults.as_mut() {
                    f.flush(|fr| ep.handle_frame(fr, now));
                }
            }
            while tx.count < BATCH {
                let i = tx.count;
                match ep.poll_transmit(now, tx.buf_mut(i)) {
                    Some(n) => {
                        tx.set_len(i, n);
                        tx.count += 1;
                    }
                    None => break,
                }
            }
            if let Some(f) = faults.as_ref() {
                *inner.faults.lock().unwrap_or_else(|p| p.into_inner()) = f.counts;
            }
            let last_handle_gone = inner.handles.load(Ordering::SeqCst) == 0;
            if last_handle_gone && closed_at.is_none() {
                closed_at = Some(Instant::now());
            }
            let done = ep.failure().is_some() && ep.next_deadline().is_none()
                || (last_handle_gone
                    && (ep.all_acked() || closed_at.is_some_and(|t| t.elapsed() > LINGER)));
            (ep.next_deadline(), done)
        };
        inner.cv.notify_all();
        let sent_full = tx.count == BATCH;
        if let Err(e) = tx.send(&inner.sock) {
            tracing::warn!("raw channel on {}: send: {e}", inner.sock.info.name);
            inner.lock().abort();
        }
        if done {
            return;
        }
        if got == BATCH || sent_full {
            continue;
        }
        // Sleep until a frame, a kick, or the endpoint's next deadline.
        inner.sleeping.store(true, Ordering::SeqCst);
        let now = inner.now();
        let busy = inner.lock().transmit_due(now);
        if busy {
            inner.sleeping.store(false, Ordering::SeqCst);
            continue;
        }
        let wait_us = match deadline {
            Some(d) => d.saturating_sub(now),
            None => 200_000,
        }
        .min(200_000);
        let ts = libc::timespec {
            tv_sec: (wait_us / 1_000_000) as libc::time_t,
            tv_nsec: ((wait_us % 1_000_000) * 1000) as libc::c_long,
        };
        let mut fds = [
            libc::pollfd {
                fd: inner.sock.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: inner.wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: ppoll on two valid pollfds with a valid timeout.
        unsafe { libc::ppoll(fds.as_mut_ptr(), 2, &ts, std::ptr::null()) };
        inner.sleeping.store(false, Ordering::SeqCst);
        if fds[1].revents != 0 {
            let mut v: libc::eventfd_t = 0;
            // SAFETY: eventfd_read on our nonblocking eventfd.
            unsafe { libc::eventfd_read(inner.wake.as_raw_fd(), &mut v) };
        }
    }
}

impl io::Read for Channel {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Channel::read(self, buf)
    }
}

impl io::Write for Channel {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Channel::write(self, buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Channel::flush(self);
        Ok(())
    }
}
