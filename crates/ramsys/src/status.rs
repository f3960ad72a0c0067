//! `ramsys status`: ask a daemon for its sessions, tasks, queues, pools
//! and throughput (docs/DAEMON.md). Authenticated like every connection.

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use ramsys_engine::daemon::status::Status;
use ramsys_engine::session::Connect;
use ramsys_engine::transport::tcp::Tcp;
use ramsys_engine::transport::wire::{recv_control, send_control};
use ramsys_proto::Control;

use crate::spec::{parse_endpoint, Endpoint};
use crate::KeyArgs;

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Daemon to ask: ramsys://HOST:PORT (or HOST:PORT). Default:
    /// $RAMSYS_DAEMON.
    #[arg(value_name = "ramsys://HOST:PORT")]
    pub daemon: Option<String>,
    /// Print the status document as JSON.
    #[arg(long)]
    pub json: bool,
    /// Show the whole site this daemon belongs to (`serve --peer`,
    /// docs/SITE.md): every member's load and how old its last update is.
    #[arg(long)]
    pub site: bool,
    /// Show the daemon's continuous replication jobs (`[[replicate]]`,
    /// docs/WATCH.md): lag, bytes behind, events/s, files/s, queue depth.
    #[arg(long)]
    pub jobs: bool,
    #[command(flatten)]
    pub key: KeyArgs,
    /// Seconds to wait for the daemon to answer.
    #[arg(long, default_value_t = 10)]
    pub connect_timeout: u64,
}

/// Address from "ramsys://HOST:PORT[/]" or "HOST:PORT".
pub fn daemon_addr(s: &str) -> anyhow::Result<String> {
    let url = if s.starts_with("ramsys://") {
        s.to_string()
    } else {
        format!("ramsys://{s}")
    };
    match parse_endpoint(&url)? {
        Endpoint::Daemon { addr, .. } => Ok(addr),
        Endpoint::Local(_) | Endpoint::Ssh(_) => anyhow::bail!("{s}: not a daemon address"),
    }
}

/// Fetch the status document of the daemon at `addr`.
pub fn query(addr: &str, key: &[u8], timeout: Duration) -> anyhow::Result<Status> {
    let t = Tcp {
        socket_buffer: None,
    };
    let mut s = Connect::new(addr, key, timeout).open(&t)?;
    send_control(&mut *s.ctl, &Control::StatusQuery)?;
    match recv_control(&mut *s.ctl)? {
        Control::StatusReport { json } => {
            serde_json::from_str(&json).context("daemon sent a malformed status document")
        }
        Control::Error { message, .. } => anyhow::bail!("daemon refused: {message}"),
        other => anyhow::bail!("daemon answered {} to a status query", other.name()),
    }
}

pub fn run(a: &StatusArgs) -> anyhow::Result<i32> {
    let target = match &a.daemon {
        Some(d) => d.clone(),
        None => std::env::var("RAMSYS_DAEMON").map_err(|_| {
            anyhow::anyhow!("give the daemon address (ramsys://HOST:PORT) or set RAMSYS_DAEMON")
        })?,
    };
    let addr = daemon_addr(&target)?;
    let key = a.key.load()?;
    let st = query(&addr, &key, Duration::from_secs(a.connect_timeout.max(1)))?;
    let mut o = std::io::stdout().lock();
    if a.site {
        anyhow::ensure!(
            !st.site.is_empty(),
            "the daemon at {addr} is not part of a site (start it with --peer)"
        );
        if a.json {
            writeln!(o, "{}", serde_json::to_string_pretty(&site_json(&st))?)?;
        } else {
            o.write_all(site_human(&st).as_bytes())?;
        }
        return Ok(0);
    }
    if a.jobs {
        if a.json {
            writeln!(o, "{}", serde_json::to_string_pretty(&st.jobs)?)?;
        } else {
            o.write_all(jobs_human(&st.jobs).as_bytes())?;
        }
        return Ok(0);
    }
    if a.json {
        writeln!(o, "{}", serde_json::to_string_pretty(&st)?)?;
    } else {
        o.write_all(human(&st).as_bytes())?;
    }
    Ok(0)
}

/// `status --jobs`: one line per replication job (issue 38).
pub fn jobs_human(jobs: &[ramsys_engine::daemon::jobs::JobStatus]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    if jobs.is_empty() {
        s.push_str("no replication jobs ([[replicate]] in the daemon's --config)\n");
        return s;
    }
    let _ = writeln!(
        s,
        "{:<16} {:<10} {:>8} {:>10} {:>9} {:>9} {:>7} {:>10} {:>10}  source -> dest",
        "job", "state", "lag", "behind", "events/s", "files/s", "queue", "files", "sent"
    );
    for j in jobs {
        let _ = writeln!(
            s,
            "{:<16} {:<10} {:>7.1}s {:>10} {:>9.1} {:>9.1} {:>7} {:>10} {:>10}  {} -> {}",
            j.name,
            j.state,
            j.lag_s,
            mb(j.bytes_behind),
            j.events_per_s,
            j.files_per_s,
            j.queue_depth,
            j.files,
            mb(j.bytes),
            j.source,
            j.dest
        );
        if !j.last_error.is_empty() {
            let _ = writeln!(s, "{:<16} last error: {}", "", j.last_error);
        }
    }
    s
}

fn mb(b: u64) -> String {
    ramsys_units::format_size(b)
}

fn rate(bps: f64) -> String {
    ramsys_units::format_rate(bps.max(0.0) as u64)
}

/// `st` with every string in it escaped for a terminal (issue 34,
/// ramsys_proto::text): a path, user name or member address holding a
/// newline or an escape sequence cannot forge rows. Every string field,
/// present and future, by a round trip through its JSON form.
fn printable(st: &Status) -> Status {
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::String(s) => {
                if let std::borrow::Cow::Owned(e) = ramsys_proto::text::escape(s) {
                    *s = e;
                }
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(walk),
            serde_json::Value::Object(o) => o.values_mut().for_each(walk),
            _ => {}
        }
    }
    let Ok(mut v) = serde_json::to_value(st) else {
        return st.clone();
    };
    walk(&mut v);
    serde_json::from_value(v).unwrap_or_else(|_| st.clone())
}

/// The human-readable report: totals, then a table per kind of state.
pub fn human(st: &Status) -> String {
    let st = &printable(st);
    let mut s = String::new();
    totals(&mut s, st);
    rate_limits(&mut s, st);
    users(&mut s, st);
    sessions(&mut s, st);
    tasks(&mut s, st);
    queues_pools_nics(&mut s, st);
    s
}

/// The daemon's line and the task counts by state.
fn totals(s: &mut String, st: &Status) {
    use std::fmt::Write as _;
    let t = &st.totals;
    let _ = writeln!(
        s,
        "daemon {}  root {}  up {:.0}s  sessions {} (total {})  moved in {} out {}",
        st.listen,
        st.root,
        st.uptime_s,
        st.sessions.len(),
        t.sessions,
        mb(t.bytes_in),
        mb(t.bytes_out)
    );
    let states: Vec<String> = t
        .tasks_by_state
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let _ = writeln!(
        s,
        "tasks: {}  (suspensions {}, retries {}, steals {}, failed {})",
        states.join(", "),
        t.suspensions,
        t.retries,
        t.steals,
        t.tasks_failed
    );
    let m = &st.memory;
    if m.peak_rss_bytes > 0 {
        let budget = match m.session_budget_bytes {
            0 => "none".to_string(),
            b => mb(b),
        };
        let _ = writeln!(
            s,
            "memory: rss {} (peak {}), file list per session at most {budget}",
            mb(m.rss_bytes),
            mb(m.peak_rss_bytes)
        );
    }
    if st.draining {
        let _ = writeln!(s, "DRAINING: new sessions are refused (SIGTERM)");
    }
    if !st.raw.is_empty() {
        let _ = writeln!(s, "raw channels on: {}", st.raw.join(", "));
    }
}

/// Rate limits in force and what they held back.
fn rate_limits(s: &mut String, st: &Status) {
    use std::fmt::Write as _;
    if !st.rates.is_empty() {
        let _ = writeln!(
            s,
            "\nRATE LIMIT   NAME              LIMIT        SENT  THROTTLED"
        );
        for r in &st.rates {
            let _ = writeln!(
                s,
                "{:<12} {:<17} {:>12} {:>9} {:>9.1}s",
                r.scope,
                r.name,
                ramsys_engine::data::rate::show_rate(r.bytes_per_s),
                mb(r.bytes),
                r.throttled_s
            );
        }
    }
}

/// Users and their sessions.
fn users(s: &mut String, st: &Status) {
    use std::fmt::Write as _;
    if !st.users.is_empty() {
        let _ = writeln!(s, "\nUSER         SESSIONS  ROOT");
        for u in &st.users {
            let ro = if u.read_only { "  (read-only)" } else { "" };
            let _ = writeln!(s, "{:<12} {:>8}  {}{ro}", u.name, u.sessions, u.root);
        }
    }
}

/// Running sessions.
fn sessions(s: &mut String, st: &Status) {
    use std::fmt::Write as _;
    let _ = writeln!(
        s,
        "\nSESSION           ROLE    USER        PEER                   AGE  PATHS"
    );
    for x in &st.sessions {
        let _ = writeln!(
            s,
            "{:<17} {:<7} {:<11} {:<21} {:>4.0}s {}",
            x.id,
            x.role,
            x.user,
            x.peer,
            x.age_s,
            x.paths.join(" ")
        );
    }
}

/// Running tasks and the five most recently finished.
fn tasks(s: &mut String, st: &Status) {
    use std::fmt::Write as _;
    let _ = writeln!(
        s,
        "\nTASK  SESSION           ROLE    DEVICE   STATE         STREAMS THREADS  BYTES/TOTAL            FILES/TOTAL    RATE        FILE LIST"
    );
    for k in st.tasks.iter().chain(st.finished.iter().rev().take(5)) {
        let _ = writeln!(
            s,
            "{:<5} {:<17} {:<7} {:<8} {:<13} {:>7} {:>7}  {:<22} {:<14} {:<11} {}{}",
            k.id,
            k.session,
            k.role,
            k.device,
            k.state.name(),
            k.streams,
            match k.site_limit {
                Some(l) if l < k.threads => format!("{l}/{}", k.threads),
                _ => k.threads.to_string(),
            },
            format!("{}/{}", mb(k.bytes), mb(k.total_bytes)),
            format!("{}/{}", k.files, k.total_files),
            rate(k.rate_bps),
            mb(k.meta_bytes),
            k.error
                .as_deref()
                .map(|e| format!("  error: {e}"))
                .unwrap_or_default()
        );
    }
}

/// Per-device queues, the thread pools and the NICs.
fn queues_pools_nics(s: &mut String, st: &Status) {
    use std::fmt::Write as _;
    let _ = writeln!(
        s,
        "\nQUEUE (device)  KIND  WAITING  BUDGET  READERS WRITERS  STEALS  IN            OUT"
    );
    for q in &st.queues {
        let inb = format!("{} {}", mb(q.bytes_in), rate(q.rate_in_bps));
        let outb = format!("{} {}", mb(q.bytes_out), rate(q.rate_out_bps));
        let _ = writeln!(
            s,
            "{:<15} {:<5} {:>7}  {:>6}  {:>7} {:>7}  {:>6}  {:<13} {}",
            q.device,
            q.kind,
            q.waiting.len(),
            q.budget,
            q.readers_held,
            q.writers_held,
            q.steals,
            inb,
            outb,
        );
        // A device other site members use too (docs/SITE.md, shares).
        if let Some(x) = &q.site {
            let _ = writeln!(
                s,
                "  shared over the site ({}): {} members, {} tasks, {} threads; \
                 budget {}, this daemon's share {}",
                q.storage, x.members, x.tasks, x.threads, x.budget, x.share
            );
        }
    }
    let _ = writeln!(s, "\nPOOL       BUSY/SIZE");
    for p in &st.pools {
        let _ = writeln!(s, "{:<10} {}/{}", p.pool, p.busy, p.size);
    }
    let _ = writeln!(s, "\nNIC        IN                  OUT");
    for n in &st.nics {
        let inb = format!("{} {}", mb(n.bytes_in), rate(n.rate_in_bps));
        let outb = format!("{} {}", mb(n.bytes_out), rate(n.rate_out_bps));
        let _ = writeln!(s, "{:<10} {:<19} {}", n.nic, inb, outb);
    }
}

/// A member whose view is older than this is shown as stale.
pub const STALE_MS: u64 = 1000;

/// `status --site --json`: `{"members": [{"addr", "cpu_load", "sessions",
/// "active_tasks", "free_buffer_bytes", "age_ms"}, ...]}` (issue 19).
pub fn site_json(st: &Status) -> serde_json::Value {
    let members: Vec<serde_json::Value> = st
        .site
        .iter()
        .map(|m| {
            serde_json::json!({
                "addr": m.addr,
                "cpu_load": m.cpu_load,
                "sessions": m.sessions,
                "active_tasks": m.active_tasks,
                "free_buffer_bytes": m.free_buffer_bytes,
                "age_ms": m.age_ms,
            })
        })
        .collect();
    serde_json::json!({ "members": members })
}

fn site_human(st: &Status) -> String {
    use std::fmt::Write as _;
    let st = &printable(st);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<22} {:>5} {:>4} {:>9} {:>9} {:>5} {:>5} {:>10} {:>8}  state",
        "member", "cpu", "runq", "net MB/s", "disk MB/s", "sess", "tasks", "free buf", "age ms"
    );
    for m in &st.site {
        let state = match (&m.error, m.age_ms > STALE_MS) {
            (Some(e), _) => format!("gone ({e})"),
            (None, true) => "stale".into(),
            (None, false) => "up".into(),
        };
        let _ = writeln!(
            s,
            "{:<22} {:>4.0}% {:>4} {:>9.1} {:>9.1} {:>5} {:>5} {:>10} {:>8}  {state}",
            m.addr,
            m.cpu_load * 100.0,
            m.run_queue,
            (m.net_rx_bps + m.net_tx_bps) as f64 / 1e6,
            (m.disk_read_bps + m.disk_write_bps) as f64 / 1e6,
            m.sessions,
            m.active_tasks,
            mb(m.free_buffer_bytes),
            m.age_ms
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(
            daemon_addr("ramsys://127.0.0.1:7000").unwrap(),
            "127.0.0.1:7000"
        );
        assert_eq!(
            daemon_addr("ramsys://127.0.0.1:7000/").unwrap(),
            "127.0.0.1:7000"
        );
        assert_eq!(daemon_addr("127.0.0.1:7000").unwrap(), "127.0.0.1:7000");
        assert!(daemon_addr("ramsys://host").is_err());
    }

    /// Issue 34: a member address, root or raw interface line holding a
    /// newline or an escape sequence neither forges a row nor reaches the
    /// terminal, in `status` and `status --site`.
    #[test]
    fn names_cannot_forge_rows_or_drive_the_terminal() {
        let forged = "10.0.0.1:4000\n10.6.6.6:4000          0%    0       0.0       0.0     0     0      0.0MB        0  up";
        let member = serde_json::json!({
            "addr": forged, "cpu_load": 0.1, "run_queue": 0, "intr_per_s": 0,
            "softirq_per_s": 0, "net_rx_bps": 0, "net_tx_bps": 0, "disk_read_bps": 0,
            "disk_write_bps": 0, "sessions": 0, "active_tasks": 0, "queued_tasks": 0,
            "free_buffer_bytes": 0, "age_ms": 0, "error": "reset\r\x1b[2Kup"
        });
        let doc = serde_json::json!({
            "version": 1, "listen": "127.0.0.1:1", "root": "/r\nDRAINING: forged",
            "uptime_s": 1.0, "sessions": [], "tasks": [], "finished": [], "queues": [],
            "pools": [], "nics": [],
            "totals": serde_json::to_value(ramsys_engine::daemon::status::Totals::default()).unwrap(),
            "raw": ["eth0\u{1b}]0;pwned\u{7}"], "site": [member],
        });
        let st: Status = serde_json::from_value(doc).unwrap();
        let h = human(&st);
        assert!(!h.contains('\x1b') && !h.contains('\r'), "{h}");
        assert!(!h.lines().any(|l| l.starts_with("DRAINING")), "{h}");
        assert!(h.contains("/r\\nDRAINING: forged"), "{h}");
        let s = site_human(&st);
        assert_eq!(s.lines().count(), 2, "one header, one member:\n{s}");
        assert!(!s.contains('\x1b') && !s.contains('\r'), "{s}");
        assert!(s.contains("10.0.0.1:4000\\n10.6.6.6:4000"), "{s}");
    }
}
