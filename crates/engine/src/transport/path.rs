//! How many data streams a path needs (issue 21): parallel TCP streams
//! are RFTP's answer to a long fat pipe (seed 004: one stream's window
//! cannot cover the bandwidth-delay product), so the agent sizes the
//! stream count from the path before it dials the data links.
//!
//! The control link is dialled first; its TCP handshake gives the kernel
//! an RTT sample (TCP_INFO min_rtt), which costs no round trip of our
//! own: the data links are dialled while Hello and Challenge are in
//! flight, as before. One stream carries at most its window per round
//! trip; the window is bounded by the sender's `tcp_wmem` maximum (of
//! which about two thirds hold payload, the rest is skb overhead), by
//! half the receiver's `tcp_rmem` maximum (the window it advertises;
//! `tcp_adv_win_scale` 1), and on a long path by loss: a stream's rate is
//! about MSS / (RTT x sqrt(loss)) (Mathis et al. 1997) whatever its
//! buffers. Measured through bench/wanem at 50 ms with 64 MiB buffers and
//! BBR: each of 4 streams held 2.6-2.8 MB per round trip with 23-27 MB
//! queued unsent, receive-window-limited 5 % of the time (`ss -ti`), so
//! the buffers were not the limit. [`STREAM_WINDOW_CAP`] is that
//! measurement (it was 4 MiB, rounded up, until the adaptation below
//! ended at 12-15 streams at 20 ms where 4 MiB started 6-7: a count
//! that is too low costs stages, one too high is bounded by
//! [`START_MAX`]). So
//!
//!   streams = ceil(target rate x RTT / window), within [min, max]
//!
//! with `min` the stream count that is right on a LAN (4, the old
//! default: RTT 0 does not change) and `max` what the buffer pool can
//! feed. The socket buffers are left to the kernel's autotuning: setting
//! SO_SNDBUF/SO_RCVBUF caps them at `net.core.{w,r}mem_max` (here 4 MiB,
//! 208 KiB on many distributions) and turns autotuning off, which is
//! worse on exactly the paths this is for. Pure function plus a reader of
//! the sysctls, so it is tested without sockets.
//!
//! Both hosts' limits count: on a push the agent sends (its `tcp_wmem`)
//! and the daemon receives (its `tcp_rmem`), on a pull the reverse. The
//! daemon sends its own with the Challenge (proto::auth::Accept), which
//! arrives while the data links are being dialled; the agent dials for
//! its own limits at both ends first and corrects the count (more links
//! dialled, or the surplus dropped before they join) when the Challenge
//! says otherwise, before Open carries it. A daemon that does not say
//! (an older one) is taken to have the agent's limits.

use std::path::Path;
use std::time::Duration;

/// The host's TCP buffer limits, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct TcpLimits {
    /// `net.ipv4.tcp_wmem` maximum.
    pub wmem_max: u64,
    /// `net.ipv4.tcp_rmem` maximum.
    pub rmem_max: u64,
}

impl Default for TcpLimits {
    /// Linux's defaults.
    fn default() -> Self {
        TcpLimits {
            wmem_max: 4 << 20,
            rmem_max: 6 << 20,
        }
    }
}

impl TcpLimits {
    /// Read `proc/sys/net/ipv4/tcp_{w,r}mem` under `root` ("/" in
    /// production); a missing or malformed value keeps Linux's default.
    pub fn read(root: &Path) -> TcpLimits {
        let max = |name: &str| {
            std::fs::read_to_string(root.join("proc/sys/net/ipv4").join(name))
                .ok()
                .and_then(|s| s.split_whitespace().nth(2)?.parse::<u64>().ok())
                .filter(|&v| v > 0)
        };
        let d = TcpLimits::default();
        TcpLimits {
            wmem_max: max("tcp_wmem").unwrap_or(d.wmem_max),
            rmem_max: max("tcp_rmem").unwrap_or(d.rmem_max),
        }
    }

    /// Payload one stream keeps in flight on a long path when both ends
    /// have these limits.
    pub fn window(&self) -> u64 {
        window(*self, *self)
    }
}

impl From<ramsys_proto::control::TcpBuffers> for TcpLimits {
    fn from(b: ramsys_proto::control::TcpBuffers) -> TcpLimits {
        // Zero is no limit anyone runs with: Linux's default instead.
        let d = TcpLimits::default();
        let or = |v: u64, d: u64| if v == 0 { d } else { v };
        TcpLimits {
            wmem_max: or(b.wmem_max, d.wmem_max),
            rmem_max: or(b.rmem_max, d.rmem_max),
        }
    }
}

impl From<TcpLimits> for ramsys_proto::control::TcpBuffers {
    fn from(l: TcpLimits) -> Self {
        ramsys_proto::control::TcpBuffers {
            wmem_max: l.wmem_max,
            rmem_max: l.rmem_max,
        }
    }
}

/// Payload one stream keeps in flight on a long path from `sender` to
/// `receiver`: what the sender's send buffer holds of payload (about two
/// thirds of `tcp_wmem`, the rest is skb overhead), at most the window
/// the receiver advertises (half its `tcp_rmem`), within what one stream
/// sustains ([`STREAM_WINDOW_CAP`]).
pub fn window(sender: TcpLimits, receiver: TcpLimits) -> u64 {
    (sender.wmem_max * 2 / 3)
        .min(receiver.rmem_max / 2)
        .clamp(64 << 10, STREAM_WINDOW_CAP)
}

/// Both ends' limits as the agent knows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ends {
    /// This host's.
    pub local: TcpLimits,
    /// The daemon's (its Challenge's); None: it did not say.
    pub remote: Option<TcpLimits>,
    /// This host sends the payload (a push).
    pub local_sends: bool,
}

impl Ends {
    /// Both ends with this host's limits (before the daemon says).
    pub fn here(local: TcpLimits, local_sends: bool) -> Ends {
        Ends {
            local,
            remote: None,
            local_sends,
        }
    }

    /// (sender, receiver); a silent daemon is taken to be like us.
    fn roles(&self) -> (TcpLimits, TcpLimits) {
        let remote = self.remote.unwrap_or(self.local);
        match self.local_sends {
            true => (self.local, remote),
            false => (remote, self.local),
        }
    }

    pub fn window(&self) -> u64 {
        let (s, r) = self.roles();
        window(s, r)
    }

    /// What bounds the window, for the reason.
    fn why(&self) -> String {
        let (s, r) = self.roles();
        let (sn, rn) = match self.local_sends {
            true => ("this host", "the daemon"),
            false => ("the daemon", "this host"),
        };
        let mib = ramsys_units::format_size;
        let w = window(s, r);
        let by = if w == STREAM_WINDOW_CAP {
            "what one stream sustains".to_string()
        } else if w == s.wmem_max * 2 / 3 {
            format!("2/3 of {sn}'s tcp_wmem max {}", mib(s.wmem_max))
        } else if w == r.rmem_max / 2 {
            format!("half {rn}'s tcp_rmem max {}", mib(r.rmem_max))
        } else {
            "the 64 KiB floor".to_string()
        };
        let unknown = match self.remote {
            Some(_) => "",
            None => "; the daemon's limits unknown: taken as here",
        };
        format!("window {}: {by}{unknown}", ramsys_units::format_size(w))
    }
}

/// What one TCP stream sustains per round trip on a long path, bytes
/// (module docs: 2.6-2.8 MB measured at 50 ms through wanem).
pub const STREAM_WINDOW_CAP: u64 = 2_700_000;

/// The rate the stream count is sized for when the path's capacity is
/// not known: a 10 Gb/s NIC, a transfer node's usual one. More streams
/// than a slower path needs cost a little memory and fairness, too few
/// leave the path idle (the 4 streams at 50 ms: 210 MB/s of 500).
pub const DEFAULT_TARGET_BYTES_S: u64 = 1_250_000_000;

/// What was chosen and why, for `--explain` and the JSON summary.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StreamChoice {
    pub streams: u16,
    /// The path's RTT, microseconds (None: no sample).
    pub rtt_us: Option<u64>,
    /// Payload in flight per stream, bytes.
    pub window: u64,
    pub target_bytes_s: u64,
    pub min: u16,
    pub max: u16,
    /// This host's TCP buffer limits.
    pub tcp_local: TcpLimits,
    /// The daemon's (its Challenge's); None: it did not say, taken
    /// to be like this host's.
    pub tcp_remote: Option<TcpLimits>,
    pub why: String,
    /// Streams added during the transfer (transport::grow; source side).
    pub growth: Option<super::grow::Growth>,
}

/// Streams for a path of round trip `rtt`, between `min` and `max`.
pub fn choose(
    rtt: Option<Duration>,
    ends: Ends,
    target_bytes_s: u64,
    min: u16,
    max: u16,
) -> StreamChoice {
    let max = max.max(1);
    let min = min.clamp(1, max);
    let window = ends.window();
    let (streams, why) = match rtt {
        None => (min, "no RTT sample: the LAN default".to_string()),
        Some(rtt) => {
            let bdp = (target_bytes_s as u128 * rtt.as_micros()).div_ceil(1_000_000);
            let need = bdp.div_ceil(window as u128).min(u16::MAX as u128) as u16;
            let n = need.clamp(min, max);
            let why = format!(
                "{:.1} ms x {} = {} in flight / {} per stream = {need}{} ({})",
                rtt.as_secs_f64() * 1e3,
                ramsys_units::format_rate(target_bytes_s),
                ramsys_units::format_size(bdp as u64),
                ramsys_units::format_size(window),
                match n.cmp(&need) {
                    std::cmp::Ordering::Less => format!(", capped at {max} (buffer pool)"),
                    std::cmp::Ordering::Greater => format!(", at least {min}"),
                    std::cmp::Ordering::Equal => String::new(),
                },
                ends.why()
            );
            (n, why)
        }
    };
    StreamChoice {
        streams,
        rtt_us: rtt.map(|r| r.as_micros() as u64),
        window,
        target_bytes_s,
        min,
        max,
        tcp_local: ends.local,
        tcp_remote: ends.remote,
        why,
        growth: None,
    }
}

/// The most streams a transfer starts with when the path asks for more:
/// it adds streams during the transfer while the delivered rate still
/// grows (transport::grow), and cannot take them back. Through wanem the
/// adaptation ended at 12-15 streams at 20 ms and 18-21 at 50 ms, and
/// hand-picked 16 was the best fixed count at both (docs/BENCHMARKS.md,
/// issue 21); starting at 8 spent the first two stages (3 s of a 12 s
/// transfer) below that. Past 16, 32 streams lost to 16 at 20-100 ms
/// (more loss and CPU), so the path's count is capped here and the
/// measurement finds the rest. Applies to a push and to a pull whose
/// daemon-side source grows (Control::GrowStreams).
pub const START_MAX: u16 = 16;

impl StreamChoice {
    /// Start a transfer with at most [`START_MAX`] streams (never below
    /// `min`); the reason says so.
    pub fn start_low(&mut self) {
        let start = START_MAX.max(self.min);
        if self.streams > start {
            self.why = format!(
                "{}; starting with {start}, more added while the rate grows",
                self.why
            );
            self.streams = start;
        }
    }
}

/// The most streams a source share of `buffers` pool buffers can feed
/// with `readers` readers (resources: 2 x streams + readers + 2), or a
/// sink share can grant `window` credits each.
pub fn pool_max_streams(buffers: usize, readers: usize, window: usize, source: bool) -> u16 {
    let n = if source {
        buffers.saturating_sub(readers + 2) / 2
    } else {
        buffers / window.max(1)
    };
    n.clamp(1, u16::MAX as usize) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    const HERE: TcpLimits = TcpLimits {
        wmem_max: 4 << 20,
        rmem_max: 32 << 20,
    };

    /// A push between two hosts with `l`.
    fn same(l: TcpLimits) -> Ends {
        Ends::here(l, true)
    }

    fn n(rtt_ms: f64) -> u16 {
        let rtt = Duration::from_secs_f64(rtt_ms / 1e3);
        choose(Some(rtt), same(HERE), DEFAULT_TARGET_BYTES_S, 4, 32).streams
    }

    #[test]
    fn a_lan_keeps_four_streams_and_long_paths_get_more() {
        assert_eq!(n(0.05), 4);
        assert_eq!(n(2.0), 4);
        // 20 ms: 25 MB in flight over 2.7 MB windows.
        assert_eq!(n(20.0), 10);
        assert_eq!(n(50.0), 24);
        // Large buffers: the per-stream cap decides (50 ms: 24 streams).
        let big = TcpLimits {
            wmem_max: 64 << 20,
            rmem_max: 64 << 20,
        };
        assert_eq!(big.window(), STREAM_WINDOW_CAP);
        let c = choose(
            Some(Duration::from_millis(50)),
            same(big),
            DEFAULT_TARGET_BYTES_S,
            4,
            32,
        );
        assert_eq!(c.streams, 24);
        // Never past the pool's limit, and the reason says so.
        let c = choose(
            Some(Duration::from_millis(100)),
            same(HERE),
            DEFAULT_TARGET_BYTES_S,
            4,
            32,
        );
        assert_eq!(c.streams, 32);
        assert!(c.why.contains("capped at 32"), "{}", c.why);
        assert_eq!(c.rtt_us, Some(100_000));
    }

    #[test]
    fn a_push_starts_low_and_says_why() {
        let mut c = choose(
            Some(Duration::from_millis(50)),
            same(HERE),
            DEFAULT_TARGET_BYTES_S,
            4,
            32,
        );
        assert_eq!(c.streams, 24);
        c.start_low();
        assert_eq!(c.streams, START_MAX);
        assert!(c
            .why
            .ends_with("starting with 16, more added while the rate grows"));
        // A short path's count stands.
        let mut c = choose(Some(Duration::from_millis(2)), same(HERE), 1, 4, 32);
        c.start_low();
        assert_eq!(c.streams, 4);
    }

    #[test]
    fn no_sample_means_the_minimum() {
        let c = choose(None, same(HERE), DEFAULT_TARGET_BYTES_S, 4, 32);
        assert_eq!(c.streams, 4);
        assert!(c.why.contains("no RTT"));
        // A pool that cannot feed the minimum wins over it.
        let c = choose(Some(Duration::from_millis(50)), same(HERE), 1, 4, 2);
        assert_eq!((c.min, c.streams), (2, 2));
    }

    #[test]
    fn smaller_buffers_need_more_streams() {
        let small = TcpLimits {
            wmem_max: 4 << 20,
            rmem_max: 4 << 20,
        };
        assert_eq!(small.window(), 2 << 20);
        assert_eq!(HERE.window(), STREAM_WINDOW_CAP);
        let tight = TcpLimits {
            wmem_max: 3 << 20,
            rmem_max: 32 << 20,
        };
        assert_eq!(tight.window(), (3 << 20) * 2 / 3);
        let rtt = Some(Duration::from_millis(20));
        let a = choose(rtt, same(small), DEFAULT_TARGET_BYTES_S, 1, 64).streams;
        let b = choose(rtt, same(HERE), DEFAULT_TARGET_BYTES_S, 1, 64).streams;
        assert!(a >= b, "{a} < {b}");
    }

    #[test]
    fn the_window_is_the_senders_wmem_and_the_receivers_rmem() {
        let lo = TcpLimits {
            wmem_max: 1 << 20,
            rmem_max: 1 << 20,
        };
        let hi = TcpLimits {
            wmem_max: 64 << 20,
            rmem_max: 64 << 20,
        };
        // Sender 1 MiB wmem: 2/3 of it, whatever the receiver.
        assert_eq!(window(lo, hi), (1 << 20) * 2 / 3);
        // Receiver 1 MiB rmem: half of it advertised.
        assert_eq!(window(hi, lo), 512 << 10);
        assert_eq!(window(hi, hi), STREAM_WINDOW_CAP);
        // Tiny buffers still count 64 KiB (TCP's unscaled window).
        let tiny = TcpLimits {
            wmem_max: 4096,
            rmem_max: 4096,
        };
        assert_eq!(window(tiny, tiny), 64 << 10);
        // A push sends from here to the daemon, a pull from the daemon.
        let push = Ends {
            local: hi,
            remote: Some(lo),
            local_sends: true,
        };
        let pull = Ends {
            local_sends: false,
            ..push
        };
        assert_eq!(push.window(), 512 << 10);
        assert_eq!(pull.window(), (1 << 20) * 2 / 3);
        // A daemon that does not say is taken to be like this host.
        assert_eq!(Ends::here(hi, true).window(), STREAM_WINDOW_CAP);
        assert_eq!(Ends::here(lo, false).window(), window(lo, lo));
        // A zero from the wire is Linux's default, not a zero window.
        let z = ramsys_proto::control::TcpBuffers {
            wmem_max: 0,
            rmem_max: 1 << 20,
        };
        let l = TcpLimits::from(z);
        assert_eq!((l.wmem_max, l.rmem_max), (4 << 20, 1 << 20));
    }

    #[test]
    fn the_daemons_small_receive_buffer_asks_for_more_streams_and_says_so() {
        let rtt = Some(Duration::from_millis(20));
        let mine = |remote| Ends {
            local: HERE,
            remote,
            local_sends: true,
        };
        let big = TcpLimits {
            wmem_max: 8 << 20,
            rmem_max: 8 << 20,
        };
        let small = TcpLimits {
            wmem_max: 8 << 20,
            rmem_max: 1 << 20,
        };
        let a = choose(rtt, mine(Some(big)), DEFAULT_TARGET_BYTES_S, 4, 64);
        let b = choose(rtt, mine(Some(small)), DEFAULT_TARGET_BYTES_S, 4, 64);
        // 25 MB in flight: 10 streams of 2.7 MB, 48 of 512 KiB.
        assert_eq!((a.streams, b.streams), (10, 48));
        assert!(
            b.why.contains("half the daemon's tcp_rmem max 1.0 MiB"),
            "{}",
            b.why
        );
        assert_eq!(b.tcp_remote, Some(small));
        assert_eq!(b.tcp_local, HERE);
        // On a pull the daemon's small rmem does not matter: it sends.
        let pull = Ends {
            local_sends: false,
            ..mine(Some(small))
        };
        let c = choose(rtt, pull, DEFAULT_TARGET_BYTES_S, 4, 64);
        assert_eq!(c.streams, a.streams);
        let silent = choose(rtt, mine(None), DEFAULT_TARGET_BYTES_S, 4, 64);
        assert!(
            silent.why.contains("unknown: taken as here"),
            "{}",
            silent.why
        );
    }

    #[test]
    fn limits_come_from_the_sysctls_or_linuxs_defaults() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("proc/sys/net/ipv4");
        std::fs::create_dir_all(&p).unwrap();
        assert_eq!(TcpLimits::read(d.path()), TcpLimits::default());
        std::fs::write(p.join("tcp_wmem"), "4096\t16384\t8388608\n").unwrap();
        std::fs::write(p.join("tcp_rmem"), "garbage").unwrap();
        let l = TcpLimits::read(d.path());
        assert_eq!(l.wmem_max, 8 << 20);
        assert_eq!(l.rmem_max, TcpLimits::default().rmem_max);
    }

    #[test]
    fn pool_limits() {
        // The agent's default pool: 192 MiB of 4 MiB buffers, 4 readers.
        assert_eq!(pool_max_streams(48, 4, 4, true), 21);
        assert_eq!(pool_max_streams(64, 4, 4, false), 16);
        assert_eq!(pool_max_streams(0, 4, 4, true), 1);
    }
}
