//! What the live data links' TCP_INFO says, summed over the session's
//! links and kept across replacements: the readings stream growth sizes
//! the stream count from (transport::grow, issue 21). Split from the link
//! replacement bookkeeping (issue 37); it reads the same slots.

use super::{State, Streams};

impl Streams {
    /// Delivery rates (bytes/s, TCP_INFO) of the live links that report one.
    pub fn delivery_rates(&self) -> Vec<u64> {
        let live = self.slots.iter().filter(|s| s.state == State::Live);
        live.filter_map(|s| s.handle.as_ref()?.delivery_rate())
            .collect()
    }

    /// Bytes the peer acknowledged over every link of the session so far
    /// (TCP_INFO bytes_acked; a link's last reading counts after it
    /// ended), the delivered payload the stream count adapts to; None
    /// when no link reports it.
    pub fn acked(&mut self) -> Option<u64> {
        let mut any = false;
        let mut sum = 0;
        for s in &mut self.slots {
            if let Some(n) = s.handle.as_ref().and_then(|h| h.bytes_acked()) {
                s.acked_now = s.acked_now.max(n);
                any = true;
            }
            sum += s.acked_before + s.acked_now;
        }
        any.then_some(sum)
    }

    /// How long the live links' packets wait in queues on the path: the
    /// median over links of smoothed RTT / minimum RTT (TCP_INFO), None
    /// without samples. Near 1: nothing queues; a full bottleneck (or an
    /// emulator short of CPU) shows as a rise (transport::grow).
    pub fn queueing(&self) -> Option<f64> {
        let live = self.slots.iter().filter(|s| s.state == State::Live);
        let mut r: Vec<f64> = live
            .filter_map(|s| {
                let h = s.handle.as_ref()?;
                Some(h.srtt()?.as_secs_f64() / h.rtt()?.as_secs_f64())
            })
            .collect();
        if r.is_empty() {
            return None;
        }
        r.sort_unstable_by(f64::total_cmp);
        Some(r[r.len() / 2])
    }

    /// Microseconds the session's links had data in flight so far, summed
    /// over links (TCP_INFO busy_time, kept across replacements like
    /// [`Streams::acked`]): over a stage with n links and t seconds, the
    /// share of time the links, not the ends, were the limit.
    pub fn busy(&mut self) -> Option<u64> {
        let mut any = false;
        let mut sum = 0;
        for s in &mut self.slots {
            if let Some(n) = s.handle.as_ref().and_then(|h| h.busy_us()) {
                s.busy_now = s.busy_now.max(n);
                any = true;
            }
            sum += s.busy_before + s.busy_now;
        }
        any.then_some(sum)
    }
}
