//! Connection limits (issue 34): how many connections the daemon holds at
//! once, in all and per source address, and how long a connection may take
//! to send its first message. A connection holds a [`Permit`] from the
//! moment it is accepted until its handler ends (a control connection: its
//! whole session) or hands it to its session (a data link: right after its
//! Join), so the permits bound both the descriptors the dispatcher holds and
//! its threads (server::accept spawns one only for a complete first
//! message).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Connections held at once, all sources together (`serve
/// --max-connections`, config `max_connections`). Data links stop
/// counting once they have joined their session, so this bounds the
/// sessions being set up or controlled, not the streams.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Connections held at once from one source address (an IPv6 source
/// counts by its /64: one host owns a whole prefix) (`serve
/// --max-connections-per-addr`, config `max_connections_per_addr`).
/// A session being set up holds its control link and its data links until
/// they join, up to `max_streams` + 1: 256 lets one host start several
/// sessions at once.
pub const DEFAULT_MAX_PER_ADDR: usize = 256;
/// Time from accept to a complete first message (preamble and Hello, Join,
/// Rejoin or SiteHello) (`serve --handshake-timeout`, config
/// `handshake_timeout`): idle, half-open and slowloris connections are
/// closed after it however slowly they trickle bytes.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest first message accepted (its frame's length prefix is checked
/// before anything is allocated for it): the legitimate ones are a few
/// hundred bytes.
pub const FIRST_MESSAGE_MAX: u32 = 64 << 10;

/// The daemon's connection limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnLimits {
    pub max_connections: usize,
    pub max_per_addr: usize,
    pub handshake_timeout: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_per_addr: DEFAULT_MAX_PER_ADDR,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }
}

/// The source a per-address limit counts: the IPv4 address, an IPv6
/// address's /64 (a v4-mapped address as its IPv4 address).
pub fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// Counts the permits out, in all and per source.
pub struct Gate {
    limits: Mutex<ConnLimits>,
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    total: usize,
    by_source: HashMap<IpAddr, usize>,
}

/// One admitted connection's share of the limits, given back on drop.
pub struct Permit {
    gate: Arc<Gate>,
    source: IpAddr,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut h = self.gate.held.lock().unwrap();
        h.total -= 1;
        if let Some(n) = h.by_source.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                h.by_source.remove(&self.source);
            }
        }
    }
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            limits: Mutex::new(ConnLimits::default()),
            held: Mutex::new(Held::default()),
        }
    }
}

impl Gate {
    pub fn set_limits(&self, l: ConnLimits) {
        *self.limits.lock().unwrap() = l;
    }

    pub fn limits(&self) -> ConnLimits {
        *self.limits.lock().unwrap()
    }

    /// Connections held now (all sources).
    pub fn held(&self) -> usize {
        self.held.lock().unwrap().total
    }

    /// A permit for a connection from `ip`, or the one-line reason it is
    /// refused (sent to the peer in an Error, code 4).
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Permit, String> {
        let l = self.limits();
        let source = source_key(ip);
        let mut h = self.held.lock().unwrap();
        if h.total >= l.max_connections {
            return Err(format!(
                "the daemon holds its maximum of {} connections (--max-connections); \
                 try again later",
                l.max_connections
            ));
        }
        let n = h.by_source.entry(source).or_insert(0);
        if *n >= l.max_per_addr {
            return Err(format!(
                "{ip} holds the maximum of {} connections from one address \
                 (--max-connections-per-addr); try again later",
                l.max_per_addr
            ));
        }
        *n += 1;
        h.total += 1;
        Ok(Permit {
            gate: self.clone(),
            source,
        })
    }
}

/// One log line per kind of event, then at most one every `every` saying
/// how many more there were: a flood of hostile connections must not
/// flood the log too.
pub struct LogLimiter {
    every: Duration,
    kinds: Mutex<HashMap<&'static str, (Instant, u64)>>,
}

impl LogLimiter {
    pub fn new(every: Duration) -> LogLimiter {
        LogLimiter {
            every,
            kinds: Mutex::new(HashMap::new()),
        }
    }

    /// Some(suppressed count since the last line) when a line of `kind`
    /// is due now; None when it is to be counted and left out.
    pub fn due(&self, kind: &'static str) -> Option<u64> {
        let now = Instant::now();
        let mut k = self.kinds.lock().unwrap();
        match k.get_mut(kind) {
            Some((last, n)) if now.duration_since(*last) < self.every => {
                *n += 1;
                None
            }
            Some((last, n)) => {
                let more = *n;
                (*last, *n) = (now, 0);
                Some(more)
            }
            None => {
                k.insert(kind, (now, 0));
                Some(0)
            }
        }
    }

    /// Log `msg` as a warning when a line of `kind` is due.
    pub fn warn(&self, kind: &'static str, msg: impl FnOnce() -> String) {
        if let Some(more) = self.due(kind) {
            match more {
                0 => tracing::warn!("{}", msg()),
                n => tracing::warn!("{} ({n} more like it not logged)", msg()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_count_in_all_and_per_source_and_come_back() {
        let g = Arc::new(Gate::default());
        g.set_limits(ConnLimits {
            max_connections: 3,
            max_per_addr: 2,
            ..Default::default()
        });
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let p1 = g.admit(a).unwrap();
        let _p2 = g.admit(a).unwrap();
        let e = g.admit(a).err().unwrap();
        assert!(e.contains("10.0.0.1") && e.contains("--max-connections-per-addr"));
        let _p3 = g.admit(b).unwrap();
        let e = g.admit(b).err().unwrap();
        assert!(e.contains("maximum of 3") && e.contains("--max-connections"));
        drop(p1);
        assert_eq!(g.held(), 2);
        let _p4 = g.admit(a).unwrap();
    }

    #[test]
    fn ipv6_counts_by_its_64_and_mapped_v4_as_v4() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        assert_eq!(source_key(a), source_key(b));
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_ne!(source_key(a), source_key(c));
        let m: IpAddr = "::ffff:10.1.2.3".parse().unwrap();
        assert_eq!(source_key(m), "10.1.2.3".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn log_limiter_says_once_then_counts() {
        let l = LogLimiter::new(Duration::from_millis(50));
        assert_eq!(l.due("x"), Some(0));
        assert_eq!(l.due("x"), None);
        assert_eq!(l.due("x"), None);
        assert_eq!(l.due("y"), Some(0));
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(l.due("x"), Some(2));
    }
}
