//! One end of a raw channel: the per-channel reliability state machine,
//! sans I/O (seed 002 sec. 2 and 7: pre-allocated slots addressed in the
//! header, positive and negative acks; seed 003 ~1075: credit-based flow
//! control, NACK, retry on a timer). Frames go in through
//! [`Endpoint::handle_frame`], come out of [`Endpoint::poll_transmit`], and
//! time is whatever the caller passes (microseconds): the socket channel
//! passes a monotonic clock, the tests a virtual one.
//!
//! Send side: `slots` (a power of two, at most 64) pre-allocated frame
//! buffers. Sequence number `s` lives in slot `s % slots` on both ends, the
//! slot is written in the header, and the receiver places the payload
//! straight into its own slot of that number (no reassembly queue, no
//! allocation). A slot is reused once the cumulative ack passed it.
//!
//! Flow control: the receiver's credits are the free receive slots
//! (`read + slots - next`); every frame carries them with the cumulative
//! ack and a 64-bit selective ack. A frame past the credit is dropped and
//! answered by a NACK with NO_CREDIT; the sender then waits for a window
//! update and, if none comes within one RTO, probes (the timer retry).
//!
//! Loss: a frame that opens a gap makes the receiver NACK at once, and the
//! sender resends the holes below the highest selectively acked frame
//! (fast retransmit, guarded by one smoothed RTT so reordering does not
//! cause storms: a hole reported sooner is resent when its RTT is up); anything else is resent when its slot's timer (RTO, RFC
//! 6298 estimate, doubled per expiry) runs out. Duplicates and frames of
//! other sessions, channels or senders are dropped and counted.
//!
//! One file per job (issue 37): `mod.rs` the configuration, the state
//! and the application side (write, read, close, abort); `recv.rs` frames
//! coming in (acks, data, selective acks); `transmit.rs` timers and frames
//! going out; `tests.rs` streams through two endpoints.

use crate::frame::{self, FrameError, Header, Kind, Mac, FLAG_FIN, FLAG_NO_CREDIT, OVERHEAD};

/// How many copies of a reset an abort sends (lost independently, three
/// leave the peer hanging to its timeout about once in 10^6 aborts at 1 %
/// loss).
pub const RESET_COPIES: u8 = 3;

/// Parameters of one channel end; session, token and channel come from the
/// control link's negotiation, the MACs from the daemon's advertisement.
#[derive(Clone, Debug)]
pub struct Config {
    pub session: u64,
    pub token: u64,
    pub channel: u16,
    pub local_mac: Mac,
    pub peer_mac: Mac,
    /// IP-level MTU of the path (1500..=9000).
    pub mtu: usize,
    /// Send and receive slots (window), a power of two, at most 64 (the
    /// selective ack's width).
    pub slots: u32,
    /// First sequence number of both directions.
    pub initial_seq: u32,
    /// How long an in-order frame may wait for its ack to be batched.
    pub ack_delay_us: u64,
    pub rto_initial_us: u64,
    pub rto_min_us: u64,
    pub rto_max_us: u64,
    /// Unacknowledged data and nothing heard from the peer for this long:
    /// the channel is dead.
    pub give_up_us: u64,
}

impl Config {
    pub fn new(session: u64, token: u64, channel: u16, local_mac: Mac, peer_mac: Mac) -> Config {
        Config {
            session,
            token,
            channel,
            local_mac,
            peer_mac,
            mtu: frame::MTU_JUMBO,
            slots: 64,
            initial_seq: 0,
            ack_delay_us: 200,
            rto_initial_us: 50_000,
            rto_min_us: 5_000,
            rto_max_us: 1_000_000,
            give_up_us: 30_000_000,
        }
    }

    /// The largest frame this channel sends or accepts (Ethernet header
    /// included): the size of the caller's transmit buffers.
    pub fn frame_size(&self) -> usize {
        frame::ETH_HDR + self.mtu
    }
}

/// Why a channel stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The peer sent a reset (it aborted), or we did.
    Reset,
    /// Unacknowledged data and silence from the peer past `give_up_us`.
    TimedOut,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Failure::Reset => "raw channel reset by peer",
            Failure::TimedOut => "raw channel: peer silent, retransmissions unanswered",
        })
    }
}

/// What [`Endpoint::read`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    Data(usize),
    Eof,
    WouldBlock,
    Failed(Failure),
}

/// Counters (frames unless named bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub sent: u64,
    pub retransmitted: u64,
    pub acks_sent: u64,
    pub nacks_sent: u64,
    pub received: u64,
    pub accepted: u64,
    pub bytes_delivered: u64,
    pub nacks_received: u64,
    pub timeouts: u64,
    /// Dropped: bad check (corruption).
    pub corrupt: u64,
    /// Dropped: truncated, not our EtherType or version, slot/seq mismatch.
    pub malformed: u64,
    /// Dropped: not addressed to our MAC.
    pub misdirected: u64,
    /// Dropped: source MAC is not the peer's.
    pub forged_mac: u64,
    /// Dropped: another session.
    pub forged_session: u64,
    /// Dropped: wrong token or channel for this session.
    pub forged_token: u64,
    /// Dropped: already received.
    pub duplicates: u64,
    /// Dropped: past the credits we gave.
    pub no_credit: u64,
    /// Acks outside the sent range (late or forged), ignored.
    pub stale_acks: u64,
    /// Ignored: channel setup frames (open.rs) seen by this channel's socket.
    pub handshakes: u64,
}

impl Stats {
    /// Frames dropped as not from our peer (forged or misdirected).
    pub fn forged(&self) -> u64 {
        self.forged_mac + self.forged_session + self.forged_token + self.misdirected
    }
}

struct TxSlot {
    buf: Box<[u8]>,
    len: usize,
    fin: bool,
    sent_at: u64,
    tries: u32,
    sacked: bool,
    rtx: bool,
    /// Reported missing by a NACK that came too soon after sending it:
    /// resent one smoothed RTT after it was sent, not after a full RTO.
    nacked: bool,
}

struct RxSlot {
    buf: Box<[u8]>,
    len: usize,
    fin: bool,
    present: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fin {
    No,
    Wanted,
    Queued,
}

/// `a < b` in sequence space (wrapping).
fn lt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}
fn le(a: u32, b: u32) -> bool {
    a == b || lt(a, b)
}

/// One end of a channel; see the module comment.
pub struct Endpoint {
    cfg: Config,
    cap: usize,
    n: u32,
    tx: Vec<TxSlot>,
    snd_una: u32,
    snd_sent: u32,
    snd_nxt: u32,
    fill: usize,
    fin: Fin,
    peer_limit: u32,
    credit_blocked_since: Option<u64>,
    srtt: Option<u64>,
    rttvar: u64,
    rto: u64,
    last_heard: u64,
    rx: Vec<RxSlot>,
    rcv_read: u32,
    read_off: usize,
    rcv_nxt: u32,
    rcv_high: u32,
    ack_pending: bool,
    ack_due: u64,
    nack_pending: bool,
    no_credit_pending: bool,
    since_ack: u32,
    advertised_limit: u32,
    /// Copies of our reset still to send (an abort sends RESET_COPIES:
    /// nothing acknowledges a reset, so one lost frame would leave the
    /// peer waiting for its timeout).
    reset_pending: u8,
    /// We aborted: every later frame of the peer is answered by a reset,
    /// as TCP answers a segment for a closed connection.
    aborted: bool,
    failed: Option<Failure>,
    stats: Stats,
    /// Copy offload (offload.rs): the client, and the batch of slot copies
    /// of the current read/write (capacity `n + 1`, so never reallocated).
    offload: Option<crate::offload::Client>,
    copies: Vec<crate::offload::Copy>,
}

impl Endpoint {
    pub fn new(cfg: Config, now: u64) -> Endpoint {
        assert!(
            (frame::MTU_STD..=frame::MTU_JUMBO).contains(&cfg.mtu),
            "mtu {} outside 1500..=9000",
            cfg.mtu
        );
        assert!(
            cfg.slots.is_power_of_two() && cfg.slots <= 64,
            "slots must be a power of two <= 64"
        );
        let cap = frame::payload_capacity(cfg.mtu);
        let n = cfg.slots;
        let tx = (0..n)
            .map(|_| TxSlot {
                buf: vec![0u8; cap].into_boxed_slice(),
                len: 0,
                fin: false,
                sent_at: 0,
                tries: 0,
                sacked: false,
                rtx: false,
                nacked: false,
            })
            .collect();
        let rx = (0..n)
            .map(|_| RxSlot {
                buf: vec![0u8; cap].into_boxed_slice(),
                len: 0,
                fin: false,
                present: false,
            })
            .collect();
        let s = cfg.initial_seq;
        Endpoint {
            cap,
            n,
            tx,
            snd_una: s,
            snd_sent: s,
            snd_nxt: s,
            fill: 0,
            fin: Fin::No,
            // Until the first ack: the peer has all its slots free.
            peer_limit: s.wrapping_add(n),
            credit_blocked_since: None,
            srtt: None,
            rttvar: 0,
            rto: cfg.rto_initial_us,
            last_heard: now,
            rx,
            rcv_read: s,
            read_off: 0,
            rcv_nxt: s,
            rcv_high: s,
            ack_pending: false,
            ack_due: 0,
            nack_pending: false,
            no_credit_pending: false,
            since_ack: 0,
            advertised_limit: s.wrapping_add(n),
            reset_pending: 0,
            aborted: false,
            failed: None,
            stats: Stats::default(),
            offload: None,
            copies: Vec::with_capacity(n as usize + 1),
            cfg,
        }
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }
    pub fn stats(&self) -> Stats {
        self.stats
    }
    pub fn failure(&self) -> Option<Failure> {
        self.failed
    }
    /// Payload bytes per frame.
    pub fn payload_capacity(&self) -> usize {
        self.cap
    }
    /// The current retransmission timeout and smoothed RTT (µs).
    pub fn rto_us(&self) -> u64 {
        self.rto
    }
    pub fn srtt_us(&self) -> Option<u64> {
        self.srtt
    }

    /// Hand the slot copies of reads and writes of at least
    /// `offload::MIN_BYTES` to a copy thread (seed 003's MCNI).
    pub fn set_copy_offload(&mut self, client: crate::offload::Client) {
        self.offload = Some(client);
    }

    /// Run the batch collected by read/write on the copy thread.
    fn run_copies(&mut self) {
        if let Some(c) = self.offload.as_mut() {
            c.copy_all(&self.copies);
        }
        self.copies.clear();
    }

    fn idx(&self, seq: u32) -> usize {
        (seq % self.n) as usize
    }

    // ---- application side -------------------------------------------

    /// Copy as much of `data` as free send slots hold; 0 = window full (or
    /// the write side is closed or the channel failed: see `failure`).
    pub fn write(&mut self, data: &[u8]) -> usize {
        if self.failed.is_some() || self.fin != Fin::No {
            return 0;
        }
        let offload = self.offload.is_some() && data.len() >= crate::offload::MIN_BYTES;
        let mut done = 0;
        while done < data.len() && self.snd_nxt.wrapping_sub(self.snd_una) < self.n {
            let (fill, cap) = (self.fill, self.cap);
            let i = self.idx(self.snd_nxt);
            let k = (cap - fill).min(data.len() - done);
            let dst = &mut self.tx[i].buf[fill..fill + k];
            if offload {
                // SAFETY: `data` is borrowed and the slot is owned by `self`
                // for this whole call; run_copies below returns only after
                // the copy thread finished, and nothing reads the slot first.
                let c = unsafe {
                    crate::offload::Copy::new(data[done..].as_ptr(), dst.as_mut_ptr(), k)
                };
                self.copies.push(c);
            } else {
                dst.copy_from_slice(&data[done..done + k]);
            }
            self.fill += k;
            done += k;
            if self.fill == cap {
                self.seal();
            }
        }
        if offload {
            self.run_copies();
        } else if self.offload.is_some() {
            crate::offload::count_fallback(done);
        }
        done
    }

    /// Whether `write` would accept at least one byte.
    pub fn writable(&self) -> bool {
        self.failed.is_none()
            && self.fin == Fin::No
            && self.snd_nxt.wrapping_sub(self.snd_una) < self.n
    }

    /// Whether writing is still allowed (no close_write yet).
    pub fn write_open(&self) -> bool {
        self.fin == Fin::No
    }

    /// Whether everything written (and the FIN, if any) is acknowledged.
    pub fn all_acked(&self) -> bool {
        self.fill == 0 && self.snd_una == self.snd_nxt && self.fin != Fin::Wanted
    }

    /// Queue the partly filled slot now instead of waiting for more bytes.
    pub fn flush(&mut self) {
        if self.fill > 0 {
            self.seal();
        }
    }

    fn seal(&mut self) {
        let i = self.idx(self.snd_nxt);
        let s = &mut self.tx[i];
        s.len = self.fill;
        s.fin = false;
        s.tries = 0;
        s.sacked = false;
        s.rtx = false;
        s.nacked = false;
        self.fill = 0;
        self.snd_nxt = self.snd_nxt.wrapping_add(1);
    }

    /// Half-close: after the data written so far, the peer reads end of
    /// stream.
    pub fn close_write(&mut self) {
        if self.fin == Fin::No {
            self.fin = Fin::Wanted;
        }
    }

    /// Abort: send a reset and fail every later call.
    pub fn abort(&mut self) {
        if self.failed.is_none() {
            self.failed = Some(Failure::Reset);
            self.reset_pending = RESET_COPIES;
            self.aborted = true;
        }
    }

    /// Copy in-order bytes into `buf`.
    pub fn read(&mut self, buf: &mut [u8]) -> ReadOutcome {
        if let Some(f) = self.failed {
            return ReadOutcome::Failed(f);
        }
        let offload = self.offload.is_some() && buf.len() >= crate::offload::MIN_BYTES;
        let mut done = 0;
        while done < buf.len() && self.rcv_read != self.rcv_nxt {
            let i = self.idx(self.rcv_read);
            let s = &mut self.rx[i];
            if s.fin {
                // Left in place: every later read sees end of stream too.
                break;
            }
            let k = (s.len - self.read_off).min(buf.len() - done);
            let src = &s.buf[self.read_off..self.read_off + k];
            if offload {
                // SAFETY: `buf` is borrowed and the slot is owned by `self`
                // for this whole call; marking the slot free below only
                // lets the I/O thread reuse it after we return (it needs
                // our `&mut self`), and run_copies returns after the copy.
                let c =
                    unsafe { crate::offload::Copy::new(src.as_ptr(), buf[done..].as_mut_ptr(), k) };
                self.copies.push(c);
            } else {
                buf[done..done + k].copy_from_slice(src);
            }
            self.read_off += k;
            done += k;
            if self.read_off == s.len {
                s.present = false;
                self.read_off = 0;
                self.rcv_read = self.rcv_read.wrapping_add(1);
            }
        }
        if offload {
            self.run_copies();
        } else if self.offload.is_some() {
            crate::offload::count_fallback(done);
        }
        if done > 0 {
            self.stats.bytes_delivered += done as u64;
            // Window update: the peer may be stalled on credits we have
            // now freed; tell it without waiting for its probe.
            let limit = self.rcv_read.wrapping_add(self.n);
            if limit.wrapping_sub(self.advertised_limit) >= self.n / 2 {
                self.ack_pending = true;
                self.ack_due = 0;
            }
            return ReadOutcome::Data(done);
        }
        if self.rcv_read != self.rcv_nxt {
            return ReadOutcome::Eof;
        }
        ReadOutcome::WouldBlock
    }

    /// Whether the peer closed its write side and every byte before it was
    /// read (what a TCP peek returning 0 means).
    pub fn peer_finished(&self) -> bool {
        self.rcv_read != self.rcv_nxt && self.rx[self.idx(self.rcv_read)].fin
    }

    /// Whether a frame is due now (the I/O loop should call poll_transmit
    /// without waiting), e.g. after a read freed credits.
    pub fn transmit_due(&self, now: u64) -> bool {
        self.reset_pending > 0
            || (self.ack_pending && self.ack_due <= now)
            || (self.failed.is_none()
                && (self.fill > 0
                    || self.fin == Fin::Wanted
                    || (self.snd_sent != self.snd_nxt && lt(self.snd_sent, self.peer_limit))))
    }
}

mod recv;
mod transmit;

#[cfg(test)]
mod tests;
