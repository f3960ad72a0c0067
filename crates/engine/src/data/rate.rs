//! Rate limits (issue 20: `--bwlimit RATE` per transfer, `max_rate` per
//! daemon and per user): token buckets the source's senders draw a block's
//! bytes from before writing it (sender::StreamOut::send_block, which both
//! send paths of seed 002 sec. 7 use), shared by every stream of a session
//! and, for the daemon's and a user's limit, by every session under it.
//!
//! A bucket is one atomic word, the generic cell rate algorithm's
//! "theoretical arrival time" (the time at which everything taken so far
//! has been paid for at `rate`), so taking a block costs one CAS and no
//! lock: the data path stays free of a global lock per block (COMMON.md).
//! A sender that finds the bucket in debt sleeps until it is paid; the
//! bucket holds at most [`BURST`] worth of unused credit, so an idle
//! session cannot save up and then burst past its rate.
//!
//! Units: the workspace's one rule (ramsys_units::parse_rate, rsync's
//! `--bwlimit`): a bare number is KiB/s; K, M, G (and KiB, MiB, GiB) are
//! powers of 1024, KB, MB, GB powers of 1000, B bytes; fractions are
//! allowed ("1.5M"); 0 means no limit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The most unused credit a bucket keeps: the first blocks of a transfer
/// go at once, after that the rate holds.
pub const BURST: Duration = Duration::from_millis(50);
/// Longest a block should wait for its bytes at the lowest rate in force:
/// blocks are made small enough (see [`Limits::block_cap`]) that a stream
/// sends at least every so often, far inside any idle timeout.
const MAX_BLOCK_TIME: Duration = Duration::from_millis(250);
/// Blocks are never made smaller than this for a rate limit (the
/// smallest block size there is).
const MIN_LIMITED_BLOCK: u64 = 4 << 10;
/// The lowest limit accepted, bytes/s: below it a smallest block would
/// keep a stream silent for seconds (and a sleeping sender from noticing
/// an abort).
pub const MIN_RATE: u64 = 1 << 10;

/// Parse a rate limit (`--bwlimit`, `max_rate`): bytes per second, 0 or
/// at least [`MIN_RATE`].
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let v = ramsys_units::parse_rate(s)?;
    check_rate(v).map_err(|e| format!("rate {s:?}: {e}"))
}

/// 0 (no limit) or at least [`MIN_RATE`].
pub fn check_rate(v: u64) -> Result<u64, String> {
    if v > 0 && v < MIN_RATE {
        return Err(format!("below the lowest limit, {MIN_RATE} bytes/s (1K)"));
    }
    Ok(v)
}

/// A limit for people: "20.0 MiB/s" (ramsys_units::format_rate), or
/// "unlimited" for 0.
pub fn show_rate(bps: u64) -> String {
    match bps {
        0 => "unlimited".into(),
        b => ramsys_units::format_rate(b),
    }
}

/// Nanoseconds on the monotonic clock since this process first asked.
pub fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// One token bucket. `rate` may change while senders use it (a reload of
/// the daemon's config).
#[derive(Debug)]
pub struct Bucket {
    /// What it limits, for status and metrics: "daemon", "user", "session".
    pub scope: &'static str,
    /// The user name or session id ("" for the daemon).
    pub name: String,
    /// Bytes per second; 0 = no limit.
    rate: AtomicU64,
    /// Time (ns, [`now_ns`]'s clock) by which all bytes taken so far are
    /// paid for; may lie in the future (debt) or the past (credit, of
    /// which only BURST counts).
    tat: AtomicU64,
    /// Bytes taken and time senders were told to wait, for metrics.
    bytes: AtomicU64,
    waited_ns: AtomicU64,
}

impl Bucket {
    pub fn new(scope: &'static str, name: impl Into<String>, rate: u64) -> Arc<Bucket> {
        Arc::new(Bucket {
            scope,
            name: name.into(),
            rate: AtomicU64::new(rate),
            tat: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            waited_ns: AtomicU64::new(0),
        })
    }

    pub fn rate(&self) -> u64 {
        self.rate.load(Ordering::Relaxed)
    }

    pub fn set_rate(&self, rate: u64) {
        self.rate.store(rate, Ordering::Relaxed);
    }

    /// Bytes taken so far.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Total time senders waited on this bucket.
    pub fn waited(&self) -> Duration {
        Duration::from_nanos(self.waited_ns.load(Ordering::Relaxed))
    }

    /// Take `n` bytes at time `now` (ns): how long the taker must wait
    /// before sending them. One CAS (retried only under contention).
    pub fn take(&self, n: u64, now: u64) -> Duration {
        let rate = self.rate();
        if rate == 0 {
            return Duration::ZERO;
        }
        self.bytes.fetch_add(n, Ordering::Relaxed);
        // Rounded up: rounding never lets more than `rate` through.
        let cost = (n as u128 * 1_000_000_000)
            .div_ceil(rate as u128)
            .min(u64::MAX as u128) as u64;
        let burst = BURST.as_nanos() as u64;
        let mut tat = self.tat.load(Ordering::Relaxed);
        loop {
            // Unused credit older than BURST is forgotten.
            let start = tat.max(now.saturating_sub(burst));
            let next = start.saturating_add(cost);
            match self
                .tat
                .compare_exchange_weak(tat, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    // `tat` may lag `now` by up to BURST (credit); ahead
                    // of it is debt, which the taker waits out.
                    let wait = next.saturating_sub(now);
                    self.waited_ns.fetch_add(wait, Ordering::Relaxed);
                    return Duration::from_nanos(wait);
                }
                Err(t) => tat = t,
            }
        }
    }
}

/// The buckets one session's senders draw from: its own (`--bwlimit`), its
/// user's and the daemon's `max_rate`. Cloned into each stream's sending
/// end when the session starts (no allocation per block).
#[derive(Clone, Debug, Default)]
pub struct Limits(Vec<Arc<Bucket>>);

impl Limits {
    pub fn none() -> Limits {
        Limits(Vec::new())
    }

    /// A session-wide limit of `rate` bytes/s (0: none).
    pub fn session(name: impl Into<String>, rate: u64) -> Limits {
        let mut l = Limits::none();
        if rate > 0 {
            l.push(Bucket::new("session", name, rate));
        }
        l
    }

    pub fn push(&mut self, b: Arc<Bucket>) {
        self.0.push(b);
    }

    pub fn extend(&mut self, b: impl IntoIterator<Item = Arc<Bucket>>) {
        self.0.extend(b);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn buckets(&self) -> &[Arc<Bucket>] {
        &self.0
    }

    /// The lowest rate in force (0: none).
    pub fn min_rate(&self) -> u64 {
        self.0
            .iter()
            .map(|b| b.rate())
            .filter(|&r| r > 0)
            .min()
            .unwrap_or(0)
    }

    /// The session's own limit (`--bwlimit`, 0: none): what a client asks
    /// a daemon source to apply (Control::BwLimit).
    pub fn session_rate(&self) -> u64 {
        self.0
            .iter()
            .filter(|b| b.scope == "session")
            .map(|b| b.rate())
            .min()
            .unwrap_or(0)
    }

    /// Largest block size that keeps a block's wait under
    /// MAX_BLOCK_TIME at the lowest rate (4 KiB multiple, at least
    /// MIN_LIMITED_BLOCK), so slow limits mean small blocks rather than
    /// streams silent for minutes; None without a limit.
    pub fn block_cap(&self) -> Option<u32> {
        let r = self.min_rate();
        if r == 0 {
            return None;
        }
        let b = (r as u128 * MAX_BLOCK_TIME.as_millis() / 1000) as u64;
        let b = b.max(MIN_LIMITED_BLOCK).min(u32::MAX as u64) & !4095;
        Some(b as u32)
    }

    /// Take `n` bytes from every bucket at `now`: the longest wait.
    pub fn take(&self, n: u64, now: u64) -> Duration {
        self.0
            .iter()
            .map(|b| b.take(n, now))
            .max()
            .unwrap_or(Duration::ZERO)
    }

    /// Take `n` bytes and sleep until they are paid for. Nothing at all
    /// (not even a clock read) without a limit.
    pub fn pace(&self, n: u64) {
        // A daemon's buckets are always there (a reload may set a rate
        // for running sessions); unlimited ones cost one load each.
        if self.0.iter().all(|b| b.rate() == 0) {
            return;
        }
        let w = self.take(n, now_ns());
        if !w.is_zero() {
            std::thread::sleep(w);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

    #[test]
    fn parses_rsync_units() {
        assert_eq!(parse_rate("20M").unwrap(), 20 << 20);
        assert_eq!(parse_rate("20MB").unwrap(), 20_000_000);
        assert_eq!(parse_rate("20MiB/s").unwrap(), 20 << 20);
        assert_eq!(parse_rate("100").unwrap(), 100 << 10);
        assert_eq!(parse_rate("512K").unwrap(), 512 << 10);
        assert_eq!(parse_rate("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_rate("1024b").unwrap(), 1024);
        assert_eq!(parse_rate("0").unwrap(), 0);
        for bad in ["", "M", "20X", "-1", "1e99G", "2..5M", "1000b", "0.5"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
    }

    /// With a clock we drive: the bucket hands out exactly `rate` bytes
    /// per second once its burst is spent.
    #[test]
    fn holds_the_rate_with_an_injected_clock() {
        let b = Bucket::new("session", "t", 10 << 20); // 10 MiB/s
        let block = 1u64 << 20;
        let mut now = 5 * S;
        let mut sent = 0u64;
        // A sender that sends as soon as it may, for 10 simulated seconds.
        while now < 15 * S {
            now += b.take(block, now).as_nanos() as u64;
            sent += block;
        }
        let secs = 10.0;
        let rate = sent as f64 / secs;
        assert!(
            (rate - (10u64 << 20) as f64).abs() / ((10u64 << 20) as f64) < 0.02,
            "{rate}"
        );
    }

    #[test]
    fn the_first_bytes_go_at_once_then_debt_means_waiting() {
        let b = Bucket::new("daemon", "", 1 << 20); // 1 MiB/s: 1 KiB per ~1 ms
        let t = 100 * S;
        // 50 ms of burst: 50 KiB-ish go without waiting.
        assert_eq!(b.take(40 << 10, t), Duration::ZERO);
        // The next 1 MiB costs ~1 s, less the burst left.
        let w = b.take(1 << 20, t);
        let expect = (40u64 << 10) * S / (1 << 20) + S - 50 * MS;
        assert!(w.as_nanos().abs_diff(expect as u128) < MS as u128, "{w:?}");
        assert_eq!(b.waited(), w);
        assert_eq!(b.bytes(), (40 << 10) + (1 << 20));
    }

    #[test]
    fn idle_time_saves_no_more_than_the_burst() {
        let b = Bucket::new("user", "alice", 1 << 20);
        assert_eq!(b.take(1 << 20, S), Duration::from_nanos(S - 50 * MS));
        // An hour idle: still only BURST of credit.
        let t = 3600 * S;
        let w = b.take(1 << 20, t);
        assert_eq!(w, Duration::from_nanos(S - 50 * MS));
    }

    #[test]
    fn streams_share_one_bucket() {
        // Four streams taking in turn at the same instant queue behind one
        // another: the fourth waits for the three before it.
        let b = Bucket::new("session", "s", 4 << 20);
        let t = 10 * S;
        let waits: Vec<u64> = (0..4)
            .map(|_| b.take(1 << 20, t).as_nanos() as u64)
            .collect();
        assert_eq!(
            waits,
            vec![
                S / 4 - 50 * MS,
                S / 2 - 50 * MS,
                3 * S / 4 - 50 * MS,
                S - 50 * MS
            ]
        );
    }

    #[test]
    fn limits_wait_for_the_slowest_and_a_rate_can_change() {
        let fast = Bucket::new("daemon", "", 100 << 20);
        let slow = Bucket::new("session", "s", 1 << 20);
        let mut l = Limits::none();
        l.push(fast.clone());
        l.push(slow.clone());
        assert_eq!(l.min_rate(), 1 << 20);
        assert_eq!(l.session_rate(), 1 << 20);
        let w = l.take(1 << 20, S);
        assert_eq!(w, Duration::from_nanos(S - 50 * MS));
        // Unlimited now: no wait, whatever the debt.
        slow.set_rate(0);
        fast.set_rate(0);
        assert_eq!(l.take(1 << 30, S), Duration::ZERO);
        assert_eq!(Limits::none().take(1 << 30, 0), Duration::ZERO);
    }

    #[test]
    fn many_threads_take_exactly_what_they_are_charged() {
        // Concurrent takers (the CAS path): total waits add up to the
        // bytes at the rate, none lost to a race.
        let b = Bucket::new("session", "s", 1 << 30);
        let t = 1000 * S;
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || {
                    (0..1000)
                        .map(|_| b.take(1 << 20, t).as_nanos() as u64)
                        .max()
                        .unwrap()
                })
            })
            .collect();
        let last = hs.into_iter().map(|h| h.join().unwrap()).max().unwrap();
        // 4000 MiB at 1 GiB/s = 3.90625 s, less the burst (each take
        // rounds its cost up by under 1 ns).
        let expect = 4000 * S / 1024 - 50 * MS;
        assert!(
            last >= expect && last - expect <= 4000,
            "{last} vs {expect}"
        );
    }

    #[test]
    fn block_cap_keeps_blocks_short_at_low_rates() {
        assert_eq!(Limits::none().block_cap(), None);
        assert_eq!(Limits::session("s", 20 << 20).block_cap(), Some(5 << 20));
        assert_eq!(Limits::session("s", 100 << 10).block_cap(), Some(24 << 10));
        assert_eq!(Limits::session("s", 1 << 10).block_cap(), Some(4 << 10));
    }
}
