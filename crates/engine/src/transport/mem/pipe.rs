//! One direction of an in-memory link: a byte queue bounded like a socket
//! buffer, so a writer whose reader does not read blocks for real (the
//! back-pressure and the deadlocks of TCP, issue 37). Time (read
//! timeouts, delivery delay) is the link's [`Clock`].

use std::collections::VecDeque;
use std::io;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::transport::clock::Clock;

pub(super) struct Pipe {
    st: Mutex<State>,
    cv: Condvar,
    clock: Clock,
    /// Bytes queued at most (written, not yet read).
    cap: usize,
}

#[derive(Default)]
struct State {
    chunks: VecDeque<Chunk>,
    queued: usize,
    /// The writing end is done (closed or half-closed): the reader drains
    /// what is queued, then reads end of stream.
    eof: bool,
    /// The reading end is shut or gone: its reads end, writes fail.
    read_shut: bool,
    /// Reset: both ends fail at once; what was queued is lost.
    reset: bool,
    /// Nothing past this stream offset is delivered (a stalled direction).
    stall_at: Option<u64>,
    /// The stream fails at this offset: writes at once, reads once they
    /// have read up to it (a link dying after what was sent before).
    fail_at: Option<u64>,
    /// Each chunk is readable this long after it was written.
    delay: Duration,
    /// Stream offsets: bytes accepted and bytes read so far.
    written: u64,
    read: u64,
}

struct Chunk {
    bytes: Vec<u8>,
    /// Read so far.
    at: usize,
    ready: Instant,
    /// Round trips behind this chunk (its writer's count, mem::link).
    depth: u64,
}

impl Pipe {
    pub fn new(cap: usize, clock: Clock) -> Pipe {
        Pipe {
            st: Mutex::new(State::default()),
            cv: Condvar::new(),
            clock,
            cap: cap.max(1),
        }
    }

    /// Queue what fits of `b`, waiting (without limit, as a socket write
    /// does) while the queue is full. Returns the bytes taken.
    pub fn write(&self, b: &[u8], depth: u64) -> io::Result<usize> {
        if b.is_empty() {
            return Ok(0);
        }
        let mut st = self.st.lock().unwrap();
        loop {
            if st.reset || st.fail_at.is_some() {
                return Err(io::ErrorKind::ConnectionReset.into());
            }
            if st.read_shut || st.eof {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            let room = self.cap.saturating_sub(st.queued);
            if room > 0 {
                let n = room.min(b.len());
                let ready = self.clock.now() + st.delay;
                st.chunks.push_back(Chunk {
                    bytes: b[..n].to_vec(),
                    at: 0,
                    ready,
                    depth,
                });
                st.queued += n;
                st.written += n as u64;
                self.cv.notify_all();
                return Ok(n);
            }
            st = self.cv.wait(st).unwrap();
        }
    }

    /// Whether a write would fail now (a partial frame header is held
    /// by the tap, so a write can take bytes without reaching the pipe).
    pub fn writable(&self) -> io::Result<()> {
        let st = self.st.lock().unwrap();
        if st.reset || st.fail_at.is_some() {
            return Err(io::ErrorKind::ConnectionReset.into());
        }
        if st.read_shut || st.eof {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        Ok(())
    }

    pub fn write_all(&self, mut b: &[u8], depth: u64) -> io::Result<()> {
        while !b.is_empty() {
            let n = self.write(b, depth)?;
            b = &b[n..];
        }
        Ok(())
    }

    /// Read what is deliverable into `out`, waiting up to `timeout` (on
    /// the clock) for some; (0, _) at end of stream. Returns the bytes
    /// and the deepest round-trip count among them.
    pub fn read(&self, out: &mut [u8], timeout: Option<Duration>) -> io::Result<(usize, u64)> {
        let deadline = timeout.map(|t| self.clock.now() + t);
        let mut st = self.st.lock().unwrap();
        loop {
            if st.reset || st.fail_at.is_some_and(|f| st.read >= f) {
                return Err(io::ErrorKind::ConnectionReset.into());
            }
            if st.read_shut || out.is_empty() {
                return Ok((0, 0));
            }
            let now = self.clock.now();
            let (n, depth) = st.take(out, now);
            if n > 0 {
                st.queued -= n;
                st.read += n as u64;
                self.cv.notify_all();
                return Ok((n, depth));
            }
            if st.eof && st.chunks.is_empty() {
                return Ok((0, 0));
            }
            if deadline.is_some_and(|d| now >= d) {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "read timed out (in-memory link)",
                ));
            }
            // Wake for the deadline, or for the next chunk's delivery.
            let next = st.chunks.front().map(|c| c.ready).filter(|&r| r > now);
            let wake = match (deadline, next) {
                (Some(d), Some(r)) => Some(d.min(r)),
                (d, r) => d.or(r),
            };
            st = self.clock.wait_until(&self.cv, st, wake).0;
        }
    }

    /// The writing end is done: end of stream after what is queued.
    pub fn close_write(&self) {
        self.st.lock().unwrap().eof = true;
        self.cv.notify_all();
    }

    /// The reading end is shut: what is queued is dropped, writes fail.
    pub fn shut_read(&self) {
        let mut st = self.st.lock().unwrap();
        st.read_shut = true;
        st.chunks.clear();
        st.queued = 0;
        self.cv.notify_all();
    }

    pub fn reset(&self) {
        let mut st = self.st.lock().unwrap();
        st.reset = true;
        st.chunks.clear();
        st.queued = 0;
        self.cv.notify_all();
    }

    /// Fail once what is queued now has been read; writes fail at once.
    pub fn fail_after_queued(&self) {
        let mut st = self.st.lock().unwrap();
        st.fail_at = Some(st.written);
        self.cv.notify_all();
    }

    /// Deliver nothing past stream offset `at` (None: deliver again).
    pub fn stall_at(&self, at: Option<u64>) {
        self.st.lock().unwrap().stall_at = at;
        self.cv.notify_all();
    }

    /// Stall right where the reader is now.
    pub fn stall_now(&self) {
        let mut st = self.st.lock().unwrap();
        st.stall_at = Some(st.read);
    }

    pub fn set_delay(&self, d: Duration) {
        self.st.lock().unwrap().delay = d;
    }

    /// Whether the reader would see the stream end or fail now (the
    /// writer is gone and nothing is left to read).
    pub fn ended(&self) -> bool {
        let st = self.st.lock().unwrap();
        st.reset || st.fail_at.is_some_and(|f| st.read >= f) || (st.eof && st.chunks.is_empty())
    }

    /// (bytes written, bytes read) so far.
    pub fn offsets(&self) -> (u64, u64) {
        let st = self.st.lock().unwrap();
        (st.written, st.read)
    }
}

impl State {
    /// Copy what is deliverable at `now` (ready, short of a stall) into
    /// `out`; returns the bytes and their deepest round-trip count.
    fn take(&mut self, out: &mut [u8], now: Instant) -> (usize, u64) {
        let limit = self
            .stall_at
            .map_or(u64::MAX, |s| s.saturating_sub(self.read));
        let mut n = 0;
        let mut depth = 0;
        while n < out.len() && (n as u64) < limit {
            let Some(c) = self.chunks.front_mut() else {
                break;
            };
            if c.ready > now {
                break;
            }
            let k = (c.bytes.len() - c.at)
                .min(out.len() - n)
                .min((limit - n as u64).min(usize::MAX as u64) as usize);
            out[n..n + k].copy_from_slice(&c.bytes[c.at..c.at + k]);
            c.at += k;
            n += k;
            depth = depth.max(c.depth);
            if c.at == c.bytes.len() {
                self.chunks.pop_front();
            }
        }
        (n, depth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_full_pipe_blocks_its_writer_until_read() {
        let p = Arc::new(Pipe::new(4, Clock::default()));
        assert_eq!(p.write(b"abcdef", 1).unwrap(), 4);
        let w = {
            let p = p.clone();
            std::thread::spawn(move || p.write_all(b"gh", 2))
        };
        std::thread::sleep(Duration::from_millis(20));
        assert!(!w.is_finished(), "wrote past the bound");
        let mut b = [0u8; 8];
        assert_eq!(p.read(&mut b, None).unwrap(), (4, 1));
        w.join().unwrap().unwrap();
        assert_eq!(p.read(&mut b, None).unwrap(), (2, 2));
        assert_eq!(&b[..2], b"gh");
        p.close_write();
        assert_eq!(p.read(&mut b, None).unwrap().0, 0);
    }

    /// Advance `c` by `d` once the caller waits on it (an advance before
    /// the caller's read took its deadline would leave it waiting forever).
    fn advance_soon(c: &Clock, d: Duration) -> std::thread::JoinHandle<()> {
        let c = c.clone();
        std::thread::spawn(move || c.advance_once_waited(d))
    }

    #[test]
    fn stalls_delays_and_timeouts_follow_the_clock() {
        let c = Clock::simulated();
        let p = Pipe::new(64, c.clone());
        p.stall_at(Some(3));
        p.write_all(b"hello", 1).unwrap();
        let mut b = [0u8; 8];
        assert_eq!(p.read(&mut b, None).unwrap().0, 3);
        // Stalled: the read times out in clock time, not wall time.
        let soon = advance_soon(&c, Duration::from_secs(61));
        let e = p.read(&mut b, Some(Duration::from_secs(60))).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        soon.join().unwrap();
        p.stall_at(None);
        assert_eq!(p.read(&mut b, None).unwrap().0, 2);
        // Delayed: readable only once the clock passed the delay.
        p.set_delay(Duration::from_millis(30));
        p.write_all(b"x", 1).unwrap();
        let soon = advance_soon(&c, Duration::from_millis(10));
        assert!(p.read(&mut b, Some(Duration::from_millis(10))).is_err());
        soon.join().unwrap();
        let soon = advance_soon(&c, Duration::from_millis(20));
        assert_eq!(p.read(&mut b, None).unwrap().0, 1);
        soon.join().unwrap();
        p.reset();
        assert_eq!(
            p.read(&mut b, None).unwrap_err().kind(),
            io::ErrorKind::ConnectionReset
        );
        assert!(p.write(b"y", 1).is_err());
    }
}
