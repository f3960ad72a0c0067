//! The daemon's rate limits (issue 20): its own `max_rate` (config), each
//! user's (users table) and a session's `--bwlimit` (Control::BwLimit).
//! The buckets themselves are data::rate's; this module decides which a
//! session draws from and shows them in `ramsys status` and `/metrics`.
//!
//! Which end applies a limit: the source's senders (data::sender), so a
//! daemon's and a user's `max_rate` cap what the daemon *sends* (pulls);
//! a push to a daemon is paced by the agent's own `--bwlimit`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::data::rate::{Bucket, Limits};
use crate::session::options::TransferOptions;

/// One bucket as status and metrics show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RateStatus {
    /// "daemon" (`max_rate` in the config), "user" (its `max_rate`) or
    /// "session" (`--bwlimit`).
    pub scope: String,
    /// User name or session id (hex); "" for the daemon.
    pub name: String,
    /// The limit, bytes per second.
    pub bytes_per_s: u64,
    /// Bytes sent under it so far.
    pub bytes: u64,
    /// Time senders spent waiting for it, seconds.
    pub throttled_s: f64,
}

impl RateStatus {
    fn of(b: &Bucket) -> RateStatus {
        RateStatus {
            scope: b.scope.into(),
            name: b.name.clone(),
            bytes_per_s: b.rate(),
            bytes: b.bytes(),
            throttled_s: b.waited().as_secs_f64(),
        }
    }
}

/// The daemon-wide bucket and the buckets of running sessions.
pub struct DaemonRates {
    pub daemon: Arc<Bucket>,
    sessions: Mutex<BTreeMap<u64, Arc<Bucket>>>,
}

/// A session's own bucket stays listed while this lives.
pub struct SessionRate<'a>(&'a DaemonRates, u64);

impl Drop for SessionRate<'_> {
    fn drop(&mut self) {
        self.0.sessions.lock().unwrap().remove(&self.1);
    }
}

impl Default for DaemonRates {
    fn default() -> Self {
        DaemonRates {
            daemon: Bucket::new("daemon", "", 0),
            sessions: Mutex::new(BTreeMap::new()),
        }
    }
}

impl DaemonRates {
    /// Set a session's limits into `opts` (the daemon is the source when
    /// `source`): its own `bwlimit` (0: none), its user's bucket and the
    /// daemon's. The daemon's and user's buckets are included even when
    /// unlimited, so a reload that sets a rate reaches running sessions.
    /// A limited source also proposes smaller blocks (Limits::block_cap).
    pub fn for_session(
        &self,
        session: u64,
        bwlimit: u64,
        user: Option<Arc<Bucket>>,
        source: bool,
        opts: &mut TransferOptions,
    ) -> SessionRate<'_> {
        let guard = SessionRate(self, session);
        if !source {
            return guard;
        }
        let mut l = Limits::session(format!("{session:x}"), bwlimit);
        if let Some(b) = l.buckets().first() {
            self.sessions.lock().unwrap().insert(session, b.clone());
        }
        l.extend(user);
        l.push(self.daemon.clone());
        if let Some(cap) = l.block_cap() {
            opts.block_size = opts.block_size.min(cap);
        }
        opts.rate = l;
        guard
    }

    /// Limited buckets (rate > 0) of the daemon, `users` and sessions.
    pub fn status(&self, users: &[Arc<Bucket>]) -> Vec<RateStatus> {
        let sessions = self.sessions.lock().unwrap();
        std::iter::once(&self.daemon)
            .chain(users.iter())
            .chain(sessions.values())
            .filter(|b| b.rate() > 0)
            .map(|b| RateStatus::of(b))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_session_draws_from_its_own_its_users_and_the_daemons_bucket() {
        let r = DaemonRates::default();
        r.daemon.set_rate(100 << 20);
        let user = Bucket::new("user", "alice", 50 << 20);
        let mut o = TransferOptions::default();
        let g = r.for_session(0xab, 1 << 20, Some(user.clone()), true, &mut o);
        assert_eq!(o.rate.buckets().len(), 3);
        assert_eq!(o.rate.min_rate(), 1 << 20);
        assert_eq!(o.rate.session_rate(), 1 << 20);
        // 1 MiB/s: blocks of 256 KiB, not 4 MiB.
        assert_eq!(o.block_size, 256 << 10);
        let s = r.status(&[user]);
        let names: Vec<_> = s
            .iter()
            .map(|x| (x.scope.as_str(), x.name.as_str()))
            .collect();
        assert_eq!(
            names,
            vec![("daemon", ""), ("user", "alice"), ("session", "ab")]
        );
        drop(g);
        assert_eq!(r.status(&[]).len(), 1);
        // Unlimited daemon: not listed; a sink session gets no limits.
        r.daemon.set_rate(0);
        assert!(r.status(&[]).is_empty());
        let mut o = TransferOptions::default();
        let _g = r.for_session(1, 1 << 20, None, false, &mut o);
        assert!(o.rate.is_empty());
        assert_eq!(o.block_size, 4 << 20);
    }
}
