//! The network side, outbound: retransmit and probe timers, the next
//! deadline, and the frames (data, acks, NACKs, resets) this end sends.

use super::*;

impl Endpoint {
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
    pub(super) fn nack_guard(&self) -> u64 {
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
