//! Admission on site state (issue 19, seed 003 sec. 2.2.4-2.2.5: load
//! balancing on fine-grained monitoring): a daemon at its admission limit
//! sends a new session to the least-loaded peer of its site
//! (Control::Redirect) instead of queueing it, and an agent given several
//! daemons starts on the least-loaded one. Both read the same site view
//! (`Site::members`), so the rules live here, free of I/O.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::daemon::site::member::SiteMember;

/// A member's view older than this does not count (it may be gone).
pub const FRESH_MS: u64 = 1000;

/// `[site] max_sessions` / `max_load` (`serve --site-max-sessions`,
/// `--site-max-load`): the admission limit above the daemon's own pools.
/// Taken to be the same on every member of a site (a peer is a redirect
/// target only while it is under them in our view).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Limits {
    /// Sessions running at once; at this many, new ones go elsewhere.
    pub max_sessions: Option<u32>,
    /// CPU busy fraction (0-1] at which new sessions go elsewhere.
    pub max_load: Option<f64>,
}

/// Lower is better: CPU busy fraction plus a quarter per live or queued
/// task (a transfer's own cost shows in tasks before it shows in CPU).
pub fn score(m: &SiteMember) -> f64 {
    m.cpu_load + 0.25 * (m.active_tasks + m.queued_tasks) as f64
}

pub(crate) fn fresh(m: &SiteMember) -> bool {
    m.age_ms <= FRESH_MS && m.error.is_none()
}

/// The least-loaded of `cands` in `view` (fresh members only; ties go to
/// the earlier in the list), or None if none is fresh in the view.
pub fn least_loaded<'a>(cands: &[&'a str], view: &[SiteMember]) -> Option<&'a str> {
    let mut best: Option<(&str, f64)> = None;
    for c in cands {
        let Some(m) = view.iter().find(|m| m.addr == *c && fresh(m)) else {
            continue;
        };
        let s = score(m);
        if best.is_none_or(|(_, b)| s < b) {
            best = Some((c, s));
        }
    }
    best.map(|(c, _)| c)
}

/// Why a daemon whose own record is `me` cannot take one more session
/// without queueing it: its running `sessions` reached `max_sessions`,
/// its CPU load reached `max_load`, or `would_wait` (its pools have no
/// thread or buffer for the new session's direction, or tasks already
/// wait for them). None: admit.
pub fn busy(
    l: &Limits,
    me: &SiteMember,
    sessions: u32,
    would_wait: Option<String>,
) -> Option<String> {
    if let Some(max) = l.max_sessions.filter(|&m| sessions >= m) {
        return Some(format!(
            "{sessions} sessions running (max_sessions = {max})"
        ));
    }
    if let Some(max) = l.max_load.filter(|&m| me.cpu_load >= m) {
        return Some(format!(
            "CPU load {:.0} % (max_load = {:.0} %)",
            me.cpu_load * 100.0,
            max * 100.0
        ));
    }
    would_wait
}

/// Where a busy daemon `me` sends a new session: the fresh peer with the
/// lowest score that is under the limits itself and scores lower than
/// `below` (a busy daemon passes its own score: sending work to a busier
/// daemon helps nobody; a draining one passes infinity). None: keep it
/// (the session queues here as it would outside a site).
pub fn target(l: &Limits, me: &str, view: &[SiteMember], below: f64) -> Option<String> {
    view.iter()
        .filter(|m| m.addr != me && fresh(m))
        .filter(|m| l.max_sessions.is_none_or(|max| m.sessions < max))
        .filter(|m| l.max_load.is_none_or(|max| m.cpu_load < max))
        .map(|m| (m, score(m)))
        .filter(|(_, s)| *s < below)
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(m, _)| m.addr.clone())
}

/// Sessions this daemon redirected, by peer: each counts as one more task
/// of that peer in our decisions until the peer's own published load can
/// show it. Without this, every session arriving within one interval
/// would go to the same peer (the view says it is idle until its next
/// sample): the herd a redirector must not make.
#[derive(Debug, Default)]
pub struct Sent(BTreeMap<String, Vec<Instant>>);

impl Sent {
    /// How long a redirect counts: the client reconnects (a few ms on a
    /// LAN), the peer samples, we pull: two intervals, plus slack.
    fn window(interval: Duration) -> Duration {
        interval * 2 + Duration::from_millis(100)
    }

    /// `view` with our recent redirects added to their peers' tasks;
    /// forgets the expired ones.
    pub fn apply(&mut self, mut view: Vec<SiteMember>, interval: Duration) -> Vec<SiteMember> {
        let w = Self::window(interval);
        self.0.retain(|_, v| {
            v.retain(|t| t.elapsed() < w);
            !v.is_empty()
        });
        for m in &mut view {
            if let Some(v) = self.0.get(&m.addr) {
                m.active_tasks += v.len() as u32;
                m.sessions += v.len() as u32;
            }
        }
        view
    }

    pub fn record(&mut self, to: &str) {
        self.0
            .entry(to.to_string())
            .or_default()
            .push(Instant::now());
    }
}

impl crate::daemon::site::share::Member for SiteMember {
    fn addr(&self) -> &str {
        &self.addr
    }
    fn fresh(&self) -> bool {
        fresh(self)
    }
    fn storage(&self) -> &[crate::daemon::site::storage::StorageUse] {
        &self.storage
    }
}

#[cfg(test)]
pub(crate) fn member(addr: &str, cpu: f64, tasks: u32, sessions: u32, age: u64) -> SiteMember {
    SiteMember {
        addr: addr.into(),
        cpu_load: cpu,
        own_cpu: 0.0,
        storage: vec![],
        run_queue: 0,
        intr_per_s: 0,
        softirq_per_s: 0,
        net_rx_bps: 0,
        net_tx_bps: 0,
        disk_read_bps: 0,
        disk_write_bps: 0,
        sessions,
        active_tasks: tasks,
        queued_tasks: 0,
        free_buffer_bytes: 0,
        age_ms: age,
        error: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_least_loaded_fresh_member() {
        let m = |a, c, t, age| member(a, c, t, 0, age);
        let view = [m("a", 0.9, 0, 10), m("b", 0.2, 0, 10), m("c", 0.1, 0, 5000)];
        // c is idle but stale: b wins.
        assert_eq!(least_loaded(&["a", "b", "c"], &view), Some("b"));
        // Two tasks outweigh 0.4 of CPU.
        let view = [m("a", 0.5, 0, 10), m("b", 0.1, 2, 10)];
        assert_eq!(least_loaded(&["a", "b"], &view), Some("a"));
        // Ties: list order.
        let view = [m("a", 0.5, 0, 10), m("b", 0.5, 0, 10)];
        assert_eq!(least_loaded(&["b", "a"], &view), Some("b"));
        assert_eq!(least_loaded(&["x"], &view), None);
    }

    #[test]
    fn busy_at_each_limit() {
        let l = Limits {
            max_sessions: Some(2),
            max_load: Some(0.8),
        };
        let me = member("a", 0.5, 1, 1, 0);
        assert_eq!(busy(&l, &me, 1, None), None);
        let r = busy(&l, &me, 2, None).unwrap();
        assert_eq!(r, "2 sessions running (max_sessions = 2)");
        let hot = member("a", 0.85, 1, 1, 0);
        assert_eq!(
            busy(&l, &hot, 0, None).unwrap(),
            "CPU load 85 % (max_load = 80 %)"
        );
        let pools = Some("no receiver thread free".to_string());
        assert_eq!(busy(&l, &me, 0, pools.clone()), pools);
        // No limits configured: only the pools make it busy.
        assert_eq!(busy(&Limits::default(), &hot, 100, None), None);
    }

    #[test]
    fn recent_redirects_count_until_the_peer_can_show_them() {
        let l = Limits::default();
        let mut sent = Sent::default();
        let view = || {
            vec![
                member("me", 0.9, 4, 4, 0),
                member("b", 0.30, 0, 0, 10),
                member("c", 0.35, 0, 0, 10),
            ]
        };
        let pick = |sent: &mut Sent| {
            let v = sent.apply(view(), Duration::from_millis(50));
            let to = target(&l, "me", &v, score(&v[0])).unwrap();
            sent.record(&to);
            to
        };
        // Three sessions in one interval: b, then c (b now has one more
        // task), then b again (c has one too, and b is lighter on CPU).
        assert_eq!(pick(&mut sent), "b");
        assert_eq!(pick(&mut sent), "c");
        assert_eq!(pick(&mut sent), "b");
        // Expired: the peers' own loads count again.
        let mut old = Sent::default();
        old.0
            .insert("b".into(), vec![Instant::now() - Duration::from_secs(1)]);
        let v = old.apply(view(), Duration::from_millis(50));
        assert_eq!(v[1].active_tasks, 0);
        assert!(old.0.is_empty());
    }

    #[test]
    fn target_is_a_fresh_less_loaded_peer_under_the_limits() {
        let l = Limits {
            max_sessions: Some(2),
            max_load: None,
        };
        let view = [
            member("me", 0.6, 2, 2, 0),
            member("full", 0.0, 0, 2, 10),    // at max_sessions itself
            member("stale", 0.0, 0, 0, 5000), // no fresh view
            member("ok", 0.3, 1, 1, 10),
            member("best", 0.2, 0, 0, 10),
        ];
        let mine = score(&view[0]);
        assert_eq!(target(&l, "me", &view, mine).as_deref(), Some("best"));
        // Nobody is less loaded than us: keep the session; draining (no
        // bound), any fresh peer under the limits will do.
        let view = [member("me", 0.1, 0, 2, 0), member("b", 0.5, 0, 0, 10)];
        assert_eq!(target(&l, "me", &view, score(&view[0])), None);
        assert_eq!(target(&l, "me", &view, f64::INFINITY).as_deref(), Some("b"));
        // A peer we cannot reach is never a target.
        let mut gone = member("b", 0.0, 0, 0, 10);
        gone.error = Some("connection refused".into());
        let view = [member("me", 0.9, 3, 2, 0), gone];
        assert_eq!(target(&l, "me", &view, f64::INFINITY), None);
    }
}
