//! Who may be a member of the site (issue 34, docs/SECURITY.md "Threat
//! model"). The seed's DDSS (seed 003 ch. 2) assumes every node is a
//! trusted peer; a daemon that serves many users cannot: a member receives
//! redirected sessions, stripes and relays, so a member is a daemon that
//! holds the site credential, nothing else.
//!
//! - Configured peers (`serve --peer`, `[site] peers`) are members from
//!   the start and never aged out (the operator named them).
//! - A daemon that dials in (SiteHello, authenticated as the site
//!   identity) announces its own address; it becomes a member only once
//!   that address answers the same site handshake, dialled back from here
//!   (so no one can make the site send data to a third-party address).
//!   At most [`MAX_PENDING`] such checks run at once, and the members that
//!   joined this way are capped (`[site] max_members`).
//! - A member that joined this way and has not answered for [`AGE_OUT`] is
//!   dropped (it dials in again when it comes back).

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

/// Members that joined by dialling in, at most (`[site] max_members`).
pub const MAX_MEMBERS: usize = 64;
/// Announced addresses being checked at once.
pub const MAX_PENDING: usize = 8;
/// A member that dialled in and has not answered for this long is dropped.
pub const AGE_OUT: Duration = Duration::from_secs(30);

/// An address a member may announce: `HOST:PORT`, the host a name or an
/// IPv4 address, or an IPv6 address in brackets; printable ASCII only, so
/// it cannot forge lines where it is shown.
pub fn check_addr(a: &str) -> Result<(), String> {
    let bad = || format!("{:?} is not a HOST:PORT address", a);
    if a.is_empty() || a.len() > 256 {
        return Err(bad());
    }
    let (host, port) = a.rsplit_once(':').ok_or_else(bad)?;
    port.parse::<u16>().map_err(|_| bad())?;
    let ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        }
    };
    if ok {
        Ok(())
    } else {
        Err(bad())
    }
}

/// The membership rules' state: configured peers and the checks under way.
pub struct Membership {
    configured: BTreeSet<String>,
    pending: Mutex<BTreeSet<String>>,
    max: usize,
}

impl Membership {
    pub fn new(configured: &[String], max: usize) -> Membership {
        Membership {
            configured: configured.iter().cloned().collect(),
            pending: Mutex::new(BTreeSet::new()),
            max: max.max(1),
        }
    }

    pub fn is_configured(&self, addr: &str) -> bool {
        self.configured.contains(addr)
    }

    /// Start checking `addr`, announced by a daemon that dialled in, with
    /// `members` (configured or not) already known. Err: why it is not
    /// checked (already being checked, too many checks, the cap).
    pub fn begin(&self, addr: &str, members: &[String]) -> Result<(), String> {
        check_addr(addr)?;
        let joined = members.iter().filter(|m| !self.is_configured(m)).count();
        if joined >= self.max {
            return Err(format!(
                "the site already has {joined} members that dialled in (max_members = {})",
                self.max
            ));
        }
        let mut p = self.pending.lock().unwrap();
        if p.contains(addr) {
            return Err("already being checked".into());
        }
        if p.len() >= MAX_PENDING {
            return Err(format!("{MAX_PENDING} other addresses are being checked"));
        }
        p.insert(addr.to_string());
        Ok(())
    }

    /// The check of `addr` ended (either way).
    pub fn end(&self, addr: &str) {
        self.pending.lock().unwrap().remove(addr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announced_addresses_are_host_port_and_printable() {
        for ok in [
            "127.0.0.1:7070",
            "dtn2.example.org:1",
            "[::1]:7070",
            "a-b:65535",
        ] {
            assert!(check_addr(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "127.0.0.1",
            "host:99999",
            "host:port",
            "a\nb:7070",
            "ev\u{1b}[31mil:7070",
            ":7070",
            "[zz]:1",
            "::1:7070",
            "a b:1",
        ] {
            assert!(check_addr(bad).is_err(), "{bad:?}");
        }
        assert!(check_addr(&format!("{}:1", "a".repeat(300))).is_err());
    }

    #[test]
    fn checks_are_capped_and_not_repeated() {
        let m = Membership::new(&["10.0.0.1:1".into()], 2);
        let members = vec!["10.0.0.1:1".to_string(), "10.0.0.2:1".to_string()];
        m.begin("10.0.0.3:1", &members).unwrap();
        assert!(m.begin("10.0.0.3:1", &members).is_err(), "twice at once");
        m.end("10.0.0.3:1");
        m.begin("10.0.0.3:1", &members).unwrap();
        // Two members that dialled in: the cap (configured ones aside).
        let full = vec![
            "10.0.0.1:1".to_string(),
            "10.0.0.2:1".to_string(),
            "10.0.0.4:1".to_string(),
        ];
        assert!(m
            .begin("10.0.0.5:1", &full)
            .unwrap_err()
            .contains("max_members"));
        let m = Membership::new(&[], 100);
        for i in 0..MAX_PENDING {
            m.begin(&format!("10.1.0.{i}:1"), &[]).unwrap();
        }
        assert!(m.begin("10.2.0.1:1", &[]).is_err());
    }
}
