//! `ramsys://A,B,C/PATH` (issue 19, docs/SITE.md): the transfer goes to
//! the least-loaded of the listed daemons, chosen from the site's state
//! (seed 003 sec. 2.2.4-2.2.5: load balancing on fine-grained monitoring)
//! with one status round trip to the first daemon that answers. The listed
//! daemons must serve the same PATH namespace (a shared file system, or
//! copies of the data).

use std::time::Duration;

use ramsys_engine::daemon::status::SiteMember;

use crate::spec::Endpoint;

/// A view older than this does not count (the member may be gone).
const FRESH_MS: u64 = 1000;

/// Lower is better: CPU busy fraction plus a quarter per live or queued
/// task (a transfer's own cost shows in tasks before it shows in CPU).
pub fn score(m: &SiteMember) -> f64 {
    m.cpu_load + 0.25 * (m.active_tasks + m.queued_tasks) as f64
}

/// The least-loaded of `cands` in `view` (fresh members only; ties go to
/// the earlier in the list), or None if none is fresh in the view.
pub fn least_loaded<'a>(cands: &[&'a str], view: &[SiteMember]) -> Option<&'a str> {
    let mut best: Option<(&str, f64)> = None;
    for c in cands {
        let Some(m) = view
            .iter()
            .find(|m| m.addr == *c && m.age_ms <= FRESH_MS && m.error.is_none())
        else {
            continue;
        };
        let s = score(m);
        if best.is_none_or(|(_, b)| s < b) {
            best = Some((c, s));
        }
    }
    best.map(|(c, _)| c)
}

/// Replace a daemon endpoint's address list by the chosen daemon.
pub fn resolve(
    e: &mut Endpoint,
    key: &dyn Fn() -> anyhow::Result<Vec<u8>>,
    timeout: Duration,
) -> anyhow::Result<()> {
    let Endpoint::Daemon { addr, .. } = e else {
        return Ok(());
    };
    if !addr.contains(',') {
        return Ok(());
    }
    let list = addr.clone();
    let cands: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let key = key()?;
    let mut last_err = None;
    for c in &cands {
        match crate::status::query(c, &key, timeout) {
            Ok(st) => {
                let pick = least_loaded(&cands, &st.site).unwrap_or(c);
                tracing::info!("{list}: chose {pick} (site view of {c})");
                *addr = pick.to_string();
                return Ok(());
            }
            Err(err) => last_err = Some(err),
        }
    }
    Err(last_err
        .unwrap_or_else(|| anyhow::anyhow!("empty daemon list"))
        .context(format!("none of the daemons {list} answered")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(addr: &str, cpu: f64, tasks: u32, age: u64) -> SiteMember {
        SiteMember {
            addr: addr.into(),
            cpu_load: cpu,
            run_queue: 0,
            intr_per_s: 0,
            softirq_per_s: 0,
            net_rx_bps: 0,
            net_tx_bps: 0,
            disk_read_bps: 0,
            disk_write_bps: 0,
            sessions: 0,
            active_tasks: tasks,
            queued_tasks: 0,
            free_buffer_bytes: 0,
            age_ms: age,
            error: None,
        }
    }

    #[test]
    fn picks_the_least_loaded_fresh_member() {
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
}
