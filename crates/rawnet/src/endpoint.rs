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

    // ---- network side -----------------------------------------------

    /// Process one received Ethernet frame.
    pub fn handle_frame(&mut self, raw: &[u8], now: u64) {
        self.stats.received += 1;
        let (h, payload) = match frame::decode(raw) {
            Ok(x) => x,
            Err(FrameError::Check) => {
                self.stats.corrupt += 1;
                return;
            }
            Err(_) => {
                self.stats.malformed += 1;
                return;
            }
        };
        if matches!(h.kind, Kind::Open | Kind::OpenOk) {
            // Setup of another channel on this interface (open.rs): every
            // socket of the interface sees it; not ours, not forged.
            self.stats.handshakes += 1;
            return;
        }
        if h.dst != self.cfg.local_mac {
            self.stats.misdirected += 1;
            return;
        }
        if h.src != self.cfg.peer_mac {
            self.stats.forged_mac += 1;
            return;
        }
        if h.session != self.cfg.session {
            self.stats.forged_session += 1;
            return;
        }
        if h.token != self.cfg.token || h.channel != self.cfg.channel {
            self.stats.forged_token += 1;
            return;
        }
        if self.failed.is_some() {
            if self.aborted && h.kind != Kind::Reset {
                self.reset_pending = self.reset_pending.max(1);
            }
            return;
        }
        self.last_heard = now;
        if h.kind == Kind::Reset {
            self.failed = Some(Failure::Reset);
            return;
        }
        if h.kind == Kind::Nack {
            self.stats.nacks_received += 1;
        }
        self.on_ack(&h, now);
        if h.kind == Kind::Data {
            self.on_data(&h, payload, now);
        }
    }

    fn rtt_sample(&mut self, r: u64) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(s) => {
                self.rttvar = (3 * self.rttvar + s.abs_diff(r)) / 4;
                self.srtt = Some((7 * s + r) / 8);
            }
        }
        self.rto = (self.srtt.unwrap_or(r) + (4 * self.rttvar).max(100))
            .clamp(self.cfg.rto_min_us, self.cfg.rto_max_us);
    }

    fn on_ack(&mut self, h: &Header, now: u64) {
        let ack = h.ack;
        if !(le(self.snd_una, ack) && le(ack, self.snd_sent)) {
            self.stats.stale_acks += 1;
            return;
        }
        if ack != self.snd_una {
            let mut sample = None;
            let mut s = self.snd_una;
            while s != ack {
                let i = self.idx(s);
                let t = &mut self.tx[i];
                // Karn: only frames sent once give an RTT sample, and
                // not those selectively acked before (their cumulative ack
                // waited for a hole to be filled).
                if t.tries == 1 && !t.sacked {
                    sample = Some(now.saturating_sub(t.sent_at));
                }
                t.tries = 0;
                t.sacked = false;
                t.rtx = false;
                t.nacked = false;
                s = s.wrapping_add(1);
            }
            self.snd_una = ack;
            match sample {
                Some(r) => self.rtt_sample(r),
                // Progress resets the backoff even without a sample.
                None => {
                    self.rto = (self.srtt.unwrap_or(self.cfg.rto_initial_us) + 4 * self.rttvar)
                        .clamp(self.cfg.rto_min_us, self.cfg.rto_max_us)
                }
            }
        }
        let limit = ack.wrapping_add(h.credits as u32);
        if lt(self.peer_limit, limit) {
            self.peer_limit = limit;
        }
        let mut highest = None;
        let mut newly_sacked = None;
        let mut bits = h.sack;
        while bits != 0 {
            let b = bits.trailing_zeros();
            bits &= bits - 1;
            let s = ack.wrapping_add(1 + b);
            if !lt(s, self.snd_sent) {
                break;
            }
            let i = self.idx(s);
            let t = &mut self.tx[i];
            if !t.sacked && t.tries == 1 {
                newly_sacked = Some(now.saturating_sub(t.sent_at));
            }
            t.sacked = true;
            highest = Some(s);
        }
        if let Some(r) = newly_sacked {
            self.rtt_sample(r);
        }
        if h.kind == Kind::Nack && h.flags & FLAG_NO_CREDIT == 0 {
            // Resend the holes below the highest frame the peer has, each
            // at most once per smoothed RTT (a reordered frame is not lost).
            let guard = self.nack_guard();
            let top = highest.unwrap_or(ack.wrapping_add(1));
            let mut s = ack;
            while lt(s, top) && lt(s, self.snd_sent) {
                let i = self.idx(s);
                let t = &mut self.tx[i];
                if !t.sacked && t.tries > 0 {
                    if now.saturating_sub(t.sent_at) >= guard {
                        t.rtx = true;
                    } else {
                        t.nacked = true;
                    }
                }
                s = s.wrapping_add(1);
            }
        }
    }

    fn on_data(&mut self, h: &Header, payload: &[u8], now: u64) {
        let seq = h.seq;
        if h.slot as u32 != seq % self.n || payload.len() > self.cap {
            self.stats.malformed += 1;
            return;
        }
        if lt(seq, self.rcv_nxt) {
            // Our ack was lost or late: repeat it at once so the sender
            // stops resending.
            self.stats.duplicates += 1;
            self.ack_now();
            return;
        }
        if !lt(seq, self.rcv_read.wrapping_add(self.n)) {
            self.stats.no_credit += 1;
            self.no_credit_pending = true;
            self.nack_pending = true;
            self.ack_now();
            return;
        }
        let i = self.idx(seq);
        let s = &mut self.rx[i];
        if s.present {
            self.stats.duplicates += 1;
            self.ack_now();
            return;
        }
        s.buf[..payload.len()].copy_from_slice(payload);
        s.len = payload.len();
        s.fin = h.flags & FLAG_FIN != 0;
        s.present = true;
        self.stats.accepted += 1;
        let fin = s.fin;
        let was_gap = self.rcv_nxt != self.rcv_high;
        if seq == self.rcv_nxt {
            while self.rx[self.idx(self.rcv_nxt)].present
                && lt(self.rcv_nxt, self.rcv_read.wrapping_add(self.n))
            {
                self.rcv_nxt = self.rcv_nxt.wrapping_add(1);
            }
            if lt(self.rcv_high, self.rcv_nxt) {
                self.rcv_high = self.rcv_nxt;
            }
            self.since_ack += 1;
            if fin || was_gap || self.since_ack >= (self.n / 4).max(1) {
                self.ack_now();
            } else if !self.ack_pending {
                self.ack_pending = true;
                self.ack_due = now + self.cfg.ack_delay_us;
            }
        } else {
            // Out of order. A new gap (not just the next frame after an
            // existing one) is reported at once.
            if seq != self.rcv_high {
                self.nack_pending = true;
                self.ack_now();
            } else if !self.ack_pending {
                self.ack_pending = true;
                self.ack_due = now + self.cfg.ack_delay_us;
            }
            if !lt(seq, self.rcv_high) {
                self.rcv_high = seq.wrapping_add(1);
            }
        }
    }

    fn ack_now(&mut self) {
        self.ack_pending = true;
        self.ack_due = 0;
    }

    fn sack_bits(&self) -> u64 {
        let mut bits = 0u64;
        let mut s = self.rcv_nxt.wrapping_add(1);
        let mut b = 0;
        while b < 64 && lt(s, self.rcv_high) {
            if self.rx[self.idx(s)].present {
                bits |= 1 << b;
            }
            s = s.wrapping_add(1);
            b += 1;
        }
        bits
    }

    fn on_timers(&mut self, now: u64) {
        if self.failed.is_some() {
            return;
        }
        let outstanding = self.snd_una != self.snd_sent;
        if outstanding && now.saturating_sub(self.last_heard) > self.cfg.give_up_us {
            self.failed = Some(Failure::TimedOut);
            return;
        }
        // Every slot has its timer, but only the oldest one's expiry backs
        // off (as TCP's single timer would): the later slots of the same
        // burst expire one by one and must not double the RTO each time.
        let mut expired = false;
        let guard = self.nack_guard();
        let mut s = self.snd_una;
        while s != self.snd_sent {
            let i = self.idx(s);
            let t = &mut self.tx[i];
            let age = now.saturating_sub(t.sent_at);
            if !t.sacked && !t.rtx && age >= self.rto {
                t.rtx = true;
                expired |= s == self.snd_una;
            } else if !t.sacked && t.nacked && age >= guard {
                t.rtx = true;
                t.nacked = false;
            }
            s = s.wrapping_add(1);
        }
        if expired {
            self.stats.timeouts += 1;
            self.rto = (self.rto * 2).min(self.cfg.rto_max_us);
        }
    }

    /// How long after sending a frame a NACK for it means loss rather than
    /// reordering: one smoothed RTT.
    fn nack_guard(&self) -> u64 {
        self.srtt.unwrap_or(self.cfg.rto_min_us / 2)
    }

    /// When the caller must call `poll_transmit` again at the latest (µs),
    /// None = only when a frame arrives or the application acts.
    pub fn next_deadline(&self) -> Option<u64> {
        if self.failed.is_some() {
            return (self.reset_pending > 0).then_some(0);
        }
        let mut d: Option<u64> = None;
        let mut at = |t: u64| d = Some(d.map_or(t, |x: u64| x.min(t)));
        if self.ack_pending {
            at(self.ack_due);
        }
        let mut s = self.snd_una;
        while s != self.snd_sent {
            let t = &self.tx[self.idx(s)];
            if !t.sacked {
                at(if t.rtx {
                    0
                } else if t.nacked {
                    t.sent_at + self.nack_guard()
                } else {
                    t.sent_at + self.rto
                });
            }
            s = s.wrapping_add(1);
        }
        if self.snd_una != self.snd_sent {
            at(self.last_heard + self.cfg.give_up_us + 1);
        }
        if let Some(b) = self.credit_blocked_since {
            at(b + self.rto);
        }
        d
    }

    fn header(&mut self, kind: Kind, flags: u16, slot: u16, seq: u32, len: usize) -> Header {
        let h = Header {
            dst: self.cfg.peer_mac,
            src: self.cfg.local_mac,
            kind,
            flags,
            session: self.cfg.session,
            token: self.cfg.token,
            channel: self.cfg.channel,
            slot,
            seq,
            ack: self.rcv_nxt,
            credits: self
                .rcv_read
                .wrapping_add(self.n)
                .wrapping_sub(self.rcv_nxt) as u16,
            len: len as u16,
            sack: self.sack_bits(),
        };
        // Every frame carries the ack: nothing more is owed.
        self.ack_pending = false;
        self.nack_pending = false;
        self.no_credit_pending = false;
        self.since_ack = 0;
        self.advertised_limit = self.rcv_read.wrapping_add(self.n);
        h
    }

    fn emit_data(&mut self, seq: u32, now: u64, out: &mut [u8]) -> usize {
        let i = self.idx(seq);
        let (len, fin) = (self.tx[i].len, self.tx[i].fin);
        let h = self.header(
            Kind::Data,
            if fin { FLAG_FIN } else { 0 },
            i as u16,
            seq,
            len,
        );
        out[OVERHEAD..OVERHEAD + len].copy_from_slice(&self.tx[i].buf[..len]);
        let t = &mut self.tx[i];
        t.tries += 1;
        t.sent_at = now;
        t.rtx = false;
        t.nacked = false;
        self.stats.sent += 1;
        frame::encode(&h, out)
    }

    /// The next frame to send, written into `out` (at least
    /// `Config::frame_size` bytes); its length, or None when nothing is
    /// due. Call until None after every event and at `next_deadline`.
    pub fn poll_transmit(&mut self, now: u64, out: &mut [u8]) -> Option<usize> {
        if self.reset_pending > 0 {
            self.reset_pending -= 1;
            let h = self.header(Kind::Reset, 0, 0, 0, 0);
            return Some(frame::encode(&h, out));
        }
        self.on_timers(now);
        if self.failed.is_some() {
            return None;
        }
        // 1. Retransmissions, oldest first.
        let mut s = self.snd_una;
        while s != self.snd_sent {
            let t = &self.tx[self.idx(s)];
            if t.rtx && !t.sacked {
                self.stats.retransmitted += 1;
                return Some(self.emit_data(s, now, out));
            }
            s = s.wrapping_add(1);
        }
        // 2. New data: a partly filled slot goes out when nothing else is
        // queued (no Nagle delay, but batching while the window is busy).
        if self.snd_sent == self.snd_nxt && self.fill > 0 {
            self.seal();
        }
        if self.fin == Fin::Wanted && self.fill == 0 && self.writable_slot() {
            let i = self.idx(self.snd_nxt);
            self.tx[i].len = 0;
            self.seal();
            self.tx[i].fin = true;
            self.fin = Fin::Queued;
        }
        if self.snd_sent != self.snd_nxt {
            let probe = match self.credit_blocked_since {
                Some(b) => now.saturating_sub(b) >= self.rto,
                None => false,
            };
            if lt(self.snd_sent, self.peer_limit) || probe {
                self.credit_blocked_since = probe.then_some(now);
                let seq = self.snd_sent;
                self.snd_sent = seq.wrapping_add(1);
                return Some(self.emit_data(seq, now, out));
            }
            if self.credit_blocked_since.is_none() {
                self.credit_blocked_since = Some(now);
            }
        } else {
            self.credit_blocked_since = None;
        }
        // 3. A pure ack or nack.
        if self.ack_pending && self.ack_due <= now {
            let nack = self.nack_pending;
            let flags = if self.no_credit_pending {
                FLAG_NO_CREDIT
            } else {
                0
            };
            let h = self.header(if nack { Kind::Nack } else { Kind::Ack }, flags, 0, 0, 0);
            if nack {
                self.stats.nacks_sent += 1;
            } else {
                self.stats.acks_sent += 1;
            }
            return Some(frame::encode(&h, out));
        }
        None
    }

    fn writable_slot(&self) -> bool {
        self.snd_nxt.wrapping_sub(self.snd_una) < self.n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const A: Mac = [2, 0, 0, 0, 0, 1];
    const B: Mac = [2, 0, 0, 0, 0, 2];

    /// A stream through two endpoints whose slot copies both go through
    /// the copy thread (offload.rs) arrives intact; small reads and writes
    /// (below offload::MIN_BYTES) stay inline in the same stream.
    #[test]
    fn stream_with_copy_offload_arrives_intact() {
        let off = crate::offload::Offload::spawn(None).unwrap();
        let mut a = Config::new(9, 8, 7, A, B);
        a.mtu = 9000;
        let mut b = Config::new(9, 8, 7, B, A);
        b.mtu = 9000;
        let (mut tx, mut rx) = (Endpoint::new(a, 0), Endpoint::new(b, 0));
        tx.set_copy_offload(off.client());
        rx.set_copy_offload(off.client());
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i ^ (i >> 11)) as u8).collect();
        let mut got = Vec::new();
        let (mut sent, mut out, mut rb) = (0, vec![0u8; 9014], vec![0u8; 200_000]);
        let mut now = 0u64;
        let mut step = 0usize;
        while got.len() < data.len() {
            now += 10;
            step += 1;
            // Alternate large and small calls on both sides.
            let w = if step.is_multiple_of(3) {
                1000
            } else {
                100_000
            };
            sent += tx.write(&data[sent..(sent + w).min(data.len())]);
            tx.flush();
            while let Some(n) = tx.poll_transmit(now, &mut out) {
                rx.handle_frame(&out[..n], now);
            }
            let r = if step.is_multiple_of(2) {
                777
            } else {
                rb.len()
            };
            if let ReadOutcome::Data(n) = rx.read(&mut rb[..r]) {
                got.extend_from_slice(&rb[..n]);
            }
            while let Some(n) = rx.poll_transmit(now, &mut out) {
                tx.handle_frame(&out[..n], now);
            }
            assert!(step < 100_000, "stalled at {} of {}", got.len(), data.len());
        }
        assert!(got == data, "stream corrupted through the copy offload");
        // Counted (process-wide, so other tests may add to them): large
        // calls on the copy thread, small ones as fallbacks.
        let c = crate::offload::counters();
        assert!(c.copies > 0 && c.bytes >= 2_000_000, "{c:?}");
        assert!(c.fallbacks > 0 && c.fallback_bytes > 0, "{c:?}");
    }

    /// An abort sends its reset RESET_COPIES times (one that arrives is
    /// enough), and answers every later frame of the peer with another.
    #[test]
    fn abort_resets_survive_loss_and_are_repeated_on_demand() {
        let mut a = Endpoint::new(Config::new(9, 8, 7, A, B), 0);
        let mut b = Endpoint::new(Config::new(9, 8, 7, B, A), 0);
        let mut out = vec![0u8; 9100];
        a.abort();
        assert_eq!(a.next_deadline(), Some(0));
        let mut resets = Vec::new();
        while let Some(n) = a.poll_transmit(1, &mut out) {
            resets.push(out[..n].to_vec());
        }
        assert_eq!(resets.len(), RESET_COPIES as usize);
        assert_eq!(a.next_deadline(), None);
        // The first copies are lost; the last one arrives.
        b.handle_frame(resets.last().unwrap(), 2);
        let mut buf = [0u8; 8];
        assert!(matches!(
            b.read(&mut buf),
            ReadOutcome::Failed(Failure::Reset)
        ));

        // A peer that missed every copy and sends: answered by a reset.
        let mut c = Endpoint::new(Config::new(9, 8, 7, B, A), 0);
        c.write(b"late");
        let n = c.poll_transmit(3, &mut out).expect("data frame");
        a.handle_frame(&out[..n], 4);
        let n = a.poll_transmit(5, &mut out).expect("a reset answers it");
        c.handle_frame(&out[..n], 6);
        assert!(matches!(
            c.read(&mut buf),
            ReadOutcome::Failed(Failure::Reset)
        ));
        assert!(a.poll_transmit(7, &mut out).is_none());
    }

    proptest! {
        /// Sealed, correctly addressed frames with arbitrary protocol
        /// fields (what a buggy or hostile peer holding the token could
        /// send) never panic the state machine, interleaved with writes,
        /// reads and transmits.
        #[test]
        fn hostile_peer_never_panics(
            frames in proptest::collection::vec(
                (1u8..6, any::<u16>(), any::<u16>(), any::<u32>(), any::<u32>(),
                 any::<u16>(), any::<u64>(), 0usize..200), 1..60),
            seq_base in any::<u32>())
        {
            let mut c = Config::new(9, 8, 7, B, A);
            c.mtu = 1500;
            c.initial_seq = seq_base;
            let mut e = Endpoint::new(c, 0);
            let mut out = vec![0u8; 1514];
            let mut rb = [0u8; 3000];
            for (t, (kind, flags, slot, seq, ack, credits, sack, len)) in frames.into_iter().enumerate() {
                let kind = match kind { 1 => Kind::Data, 2 => Kind::Ack, 3 => Kind::Nack, 4 => Kind::Reset, _ => Kind::Open };
                // Near the endpoint's own sequence numbers half the time.
                let (seq, ack) = if flags & 1 == 0 {
                    (seq_base.wrapping_add(seq % 80), seq_base.wrapping_add(ack % 80))
                } else { (seq, ack) };
                let h = Header { dst: B, src: A, kind, flags, session: 9, token: 8, channel: 7,
                    slot, seq, ack, credits, len: len as u16, sack };
                let mut f = vec![0u8; OVERHEAD + len];
                frame::encode(&h, &mut f);
                let now = t as u64 * 1000;
                e.handle_frame(&f, now);
                e.write(&rb[..(len * 7) % 3000]);
                let _ = e.read(&mut rb);
                while e.poll_transmit(now, &mut out).is_some() {}
                let _ = e.next_deadline();
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..1600)) {
            let mut e = Endpoint::new(Config::new(9, 8, 7, B, A), 0);
            e.handle_frame(&data, 1);
        }
    }
}
