//! The network side, inbound: a received frame checked and dispatched, the
//! peer's acks applied to the send slots, its data placed in the receive
//! slots, and the acks this end owes.

use super::*;

impl Endpoint {
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

    pub(super) fn sack_bits(&self) -> u64 {
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
}
