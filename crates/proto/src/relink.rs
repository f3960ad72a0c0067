//! Lost data links and their replacements, without I/O
//! (docs/PROTOCOL.md, "Lost links").
//!
//! A data link can break mid-transfer while the control link and the other
//! links carry on. What was in flight on it is identified by *sequence
//! number*: both ends count the DATA blocks of each link incarnation
//! (stream, epoch) from 1. The sink reports how many it accepted
//! (Control::Lost); the source keeps the segment tables of the last
//! `window` blocks it sent ([`SentLog`]) and sends the rest again, same
//! segment boundaries, so segment hashes and file digests are unchanged and
//! no block is written twice. Credits bound what can be missing: the sink
//! never grants more than `window` beyond the blocks it accepted on a link
//! ([`rebase_grant`]), so the log never needs more than `window` entries.

use std::time::Duration;

use crate::data::Segment;
use crate::ProtoError;

/// The segment tables of the last `window` blocks sent on one link
/// incarnation. Slots are reused, so recording allocates only until each
/// slot has grown to the largest table it held.
#[derive(Debug)]
pub struct SentLog {
    slots: Vec<Vec<Segment>>,
    sent: u64,
}

impl SentLog {
    pub fn new(window: u32) -> SentLog {
        SentLog {
            slots: (0..window.max(1)).map(|_| Vec::new()).collect(),
            sent: 0,
        }
    }

    /// Record the next block (call before writing it: a block that broke
    /// mid-write counts as sent, and the sink's count says if it arrived).
    pub fn record(&mut self, segs: &[Segment]) {
        let n = self.slots.len() as u64;
        let slot = &mut self.slots[(self.sent % n) as usize];
        slot.clear();
        slot.extend_from_slice(segs);
        self.sent += 1;
    }

    /// Blocks recorded so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// Start a new incarnation (sequence numbers from 1 again).
    pub fn reset(&mut self) {
        self.sent = 0;
    }

    /// The blocks after the first `received`, oldest first: what the peer
    /// never got. An error if the peer claims more than was sent or if more
    /// is missing than credits could have allowed (a peer out of step).
    pub fn unreceived(&self, received: u64) -> Result<Vec<&[Segment]>, ProtoError> {
        let n = self.slots.len() as u64;
        if received > self.sent {
            return Err(ProtoError::malformed(
                "lost",
                format!("{received} blocks received of {} sent", self.sent),
            ));
        }
        if self.sent - received > n {
            return Err(ProtoError::Credit(format!(
                "{} blocks missing on a link with a window of {n}",
                self.sent - received
            )));
        }
        Ok((received..self.sent)
            .map(|i| self.slots[(i % n) as usize].as_slice())
            .collect())
    }
}

/// Credits to grant on a replacement link: the window less the buffers
/// still held for blocks that arrived on the stream's earlier links
/// (`received` accepted in total, `released` of them freed so far). Later
/// frees of those buffers grant on the new link as usual, so its total
/// grants never exceed the window plus the blocks it carries.
pub fn rebase_grant(window: u64, received: u64, released: u64) -> u64 {
    window.saturating_sub(received.saturating_sub(released))
}

/// How a lost link is dialled again: `tries` attempts, waiting `first`
/// before the second and doubling, all within `budget`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub tries: u32,
    pub first: Duration,
    pub budget: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            tries: 5,
            first: Duration::from_millis(200),
            budget: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// How long to wait before attempt `attempt` (0-based) when `elapsed`
    /// has passed since the link was lost; None when no attempt is left
    /// (out of tries, or the wait would end past the budget).
    pub fn delay(&self, attempt: u32, elapsed: Duration) -> Option<Duration> {
        if attempt >= self.tries {
            return None;
        }
        let d = if attempt == 0 {
            Duration::ZERO
        } else {
            self.first.saturating_mul(1 << (attempt - 1).min(20))
        };
        (elapsed + d <= self.budget).then_some(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(id: u64) -> Segment {
        Segment {
            file_id: id,
            offset: id * 10,
            len: 10,
        }
    }

    #[test]
    fn log_returns_what_the_sink_did_not_accept() {
        let mut l = SentLog::new(3);
        for i in 1..=5 {
            l.record(&[seg(i), seg(i + 100)]);
        }
        assert_eq!(l.sent(), 5);
        let miss = l.unreceived(3).unwrap();
        assert_eq!(miss.len(), 2);
        assert_eq!(miss[0], &[seg(4), seg(104)]);
        assert_eq!(miss[1], &[seg(5), seg(105)]);
        assert!(l.unreceived(5).unwrap().is_empty());
        // More missing than the window allows, or more received than sent.
        assert!(l.unreceived(1).is_err());
        assert!(l.unreceived(6).is_err());
        l.reset();
        assert_eq!(l.sent(), 0);
        assert!(l.unreceived(0).unwrap().is_empty());
    }

    #[test]
    fn rebase_keeps_the_window() {
        assert_eq!(rebase_grant(8, 10, 10), 8);
        assert_eq!(rebase_grant(8, 10, 7), 5);
        assert_eq!(rebase_grant(8, 20, 7), 0);
    }

    #[test]
    fn backoff_doubles_within_tries_and_budget() {
        let b = Backoff::default();
        let ds: Vec<_> = (0..6).map(|i| b.delay(i, Duration::ZERO)).collect();
        assert_eq!(ds[0], Some(Duration::ZERO));
        assert_eq!(ds[1], Some(Duration::from_millis(200)));
        assert_eq!(ds[2], Some(Duration::from_millis(400)));
        assert_eq!(ds[4], Some(Duration::from_millis(1600)));
        assert_eq!(ds[5], None);
        assert_eq!(b.delay(3, Duration::from_secs(30)), None);
    }

    /// Property: whatever the sink accepted, the log's answer and the
    /// accepted prefix together are exactly the blocks sent, in order.
    #[test]
    fn prefix_and_rest_cover_every_block() {
        for window in 1..6u32 {
            for sent in 0..12u64 {
                let mut l = SentLog::new(window);
                for i in 0..sent {
                    l.record(&[seg(i)]);
                }
                for rec in sent.saturating_sub(window as u64)..=sent {
                    let rest = l.unreceived(rec).unwrap();
                    let ids: Vec<u64> = rest.iter().map(|s| s[0].file_id).collect();
                    assert_eq!(ids, (rec..sent).collect::<Vec<_>>());
                }
            }
        }
    }
}
