//! Prometheus text exposition (format 0.0.4) of a status snapshot; the
//! tiny std-only HTTP responder serving it at `/metrics` is [`http`].

use std::fmt::Write as _;

pub mod http;

use super::rates::RateStatus;
use super::status::{CopyOffload, NicStatus, PoolStatus, QueueStatus, Status, TaskStatus, Totals};

fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Out(String);

impl Out {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }
    fn val(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, lv)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"{}\"", esc(lv));
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {v}");
    }
    /// One value per direction, `in` then `out`, after `labels`.
    fn in_out(&mut self, name: &str, labels: &[(&str, &str)], inv: f64, outv: f64) {
        for (dir, v) in [("in", inv), ("out", outv)] {
            let mut l = labels.to_vec();
            l.push(("direction", dir));
            self.val(name, &l, v);
        }
    }
    fn one(&mut self, name: &str, kind: &str, help: &str, v: f64) {
        self.head(name, kind, help);
        self.val(name, &[], v);
    }
}

/// Render every `ramsys_*` metric (docs/DAEMON.md has the reference), in
/// the order of the reference: one section a function.
pub fn render(s: &Status) -> String {
    let mut o = Out(String::with_capacity(8192));
    daemon(&mut o, s);
    totals(&mut o, &s.totals);
    pools(&mut o, &s.pools);
    devices(&mut o, &s.queues);
    nics(&mut o, &s.nics);
    tasks(&mut o, &s.tasks);
    o.one(
        "ramsys_draining",
        "gauge",
        "1 while the daemon drains (SIGTERM): new sessions are refused.",
        f64::from(u8::from(s.draining)),
    );
    rates(&mut o, &s.rates);
    site(&mut o, s);
    site_shares(&mut o, s);
    copy_offload(&mut o, &s.copy_offload);
    memory(&mut o, &s.memory);
    jobs(&mut o, &s.jobs);
    o.0
}

/// Continuous replication jobs (issue 38): lag, rates, queue, totals.
fn jobs(o: &mut Out, jobs: &[super::jobs::JobStatus]) {
    type Get = fn(&super::jobs::JobStatus) -> f64;
    let series: [(&str, &str, &str, Get); 9] = [
        (
            "ramsys_job_lag_seconds",
            "gauge",
            "Age of the oldest change not yet at the destination.",
            |j| j.lag_s,
        ),
        (
            "ramsys_job_bytes_behind",
            "gauge",
            "Bytes known to be waiting or in flight.",
            |j| j.bytes_behind as f64,
        ),
        (
            "ramsys_job_events_per_second",
            "gauge",
            "Changes reported by the kernel, recent rate.",
            |j| j.events_per_s,
        ),
        (
            "ramsys_job_files_per_second",
            "gauge",
            "Files sent, recent rate.",
            |j| j.files_per_s,
        ),
        (
            "ramsys_job_queue_depth",
            "gauge",
            "Paths and operations waiting or in flight.",
            |j| j.queue_depth as f64,
        ),
        (
            "ramsys_job_files_total",
            "counter",
            "Files whose data a job sent.",
            |j| j.files as f64,
        ),
        (
            "ramsys_job_bytes_total",
            "counter",
            "Bytes of file data a job sent.",
            |j| j.bytes as f64,
        ),
        (
            "ramsys_job_ops_total",
            "counter",
            "Renames, deletes and directory attributes applied.",
            |j| j.ops as f64,
        ),
        (
            "ramsys_job_full_scans_total",
            "counter",
            "Full scans (start, overflow, period).",
            |j| j.full_scans as f64,
        ),
    ];
    if jobs.is_empty() {
        return;
    }
    for (name, kind, help, get) in series {
        o.head(name, kind, help);
        for j in jobs {
            o.val(name, &[("job", &j.name), ("state", &j.state)], get(j));
        }
    }
}

/// The daemon itself: up, since when, its sessions (per user too).
fn daemon(o: &mut Out, s: &Status) {
    o.one("ramsys_up", "gauge", "The daemon is serving.", 1.0);
    o.one(
        "ramsys_uptime_seconds",
        "gauge",
        "Seconds since the daemon started.",
        s.uptime_s,
    );
    o.one(
        "ramsys_sessions",
        "gauge",
        "User sessions in the session list.",
        s.sessions.len() as f64,
    );
    if s.users.is_empty() {
        return;
    }
    let name = "ramsys_user_sessions";
    let help = "Sessions per configured user (users table), labelled with its export root.";
    o.head(name, "gauge", help);
    for u in &s.users {
        let l = [("user", u.name.as_str()), ("root", &u.root)];
        o.val(name, &l, u.sessions as f64);
    }
}

/// The daemon's counters since it started, and its tasks by state.
fn totals(o: &mut Out, t: &Totals) {
    o.one(
        "ramsys_sessions_total",
        "counter",
        "Sessions opened.",
        t.sessions as f64,
    );
    let moved: [(&str, &str, u64, u64); 3] = [
        (
            "ramsys_bytes_total",
            "File bytes moved (in: daemon is the sink; out: source).",
            t.bytes_in,
            t.bytes_out,
        ),
        (
            "ramsys_files_total",
            "Files moved.",
            t.files_in,
            t.files_out,
        ),
        (
            "ramsys_blocks_total",
            "Data blocks moved.",
            t.blocks_in,
            t.blocks_out,
        ),
    ];
    for (name, help, inv, outv) in moved {
        o.head(name, "counter", help);
        o.in_out(name, &[], inv as f64, outv as f64);
    }
    let counters: [(&str, &str, u64); 10] = [
        (
            "ramsys_retries_total",
            "Reservations retried by suspended tasks after a wake-up.",
            t.retries,
        ),
        (
            "ramsys_suspensions_total",
            "Tasks suspended for lack of threads or buffers.",
            t.suspensions,
        ),
        (
            "ramsys_steals_total",
            "Grants that used a starving device queue's thread budget.",
            t.steals,
        ),
        (
            "ramsys_redirects_total",
            "New sessions sent to a less-loaded site peer (docs/SITE.md).",
            t.redirects,
        ),
        (
            "ramsys_checksum_errors_total",
            "Blocks that failed their checksum.",
            t.checksum_errors,
        ),
        (
            "ramsys_links_lost_total",
            "Data links that broke mid-transfer.",
            t.links_lost,
        ),
        (
            "ramsys_links_replaced_total",
            "Broken data links replaced by a new one.",
            t.links_replaced,
        ),
        (
            "ramsys_failed_files_total",
            "Files that failed.",
            t.failed_files,
        ),
        ("ramsys_tasks_total", "Tasks created.", t.tasks),
        (
            "ramsys_tasks_failed_total",
            "Tasks that ended in an error.",
            t.tasks_failed,
        ),
    ];
    for (name, help, v) in counters {
        o.one(name, "counter", help, v as f64);
    }
    o.head(
        "ramsys_tasks",
        "gauge",
        "Tasks by state (exit: recently finished tasks kept for status).",
    );
    for (state, n) in &t.tasks_by_state {
        o.val("ramsys_tasks", &[("state", state)], *n as f64);
    }
}

/// Threads and buffers per pool: how many, how many held.
fn pools(o: &mut Out, pools: &[PoolStatus]) {
    type Get = fn(&PoolStatus) -> usize;
    let series: [(&str, &str, Get); 2] = [
        (
            "ramsys_pool_size",
            "Threads (or buffers) pre-allocated per pool.",
            |p| p.size,
        ),
        (
            "ramsys_pool_busy",
            "Threads (or buffers) of a pool held by tasks.",
            |p| p.busy,
        ),
    ];
    for (name, help, get) in series {
        o.head(name, "gauge", help);
        for p in pools {
            o.val(name, &[("pool", &p.pool)], get(p) as f64);
        }
    }
}

/// Per storage device: its queue, its threads, what it moved.
fn devices(o: &mut Out, queues: &[QueueStatus]) {
    let name = "ramsys_device_queue_waiting";
    o.head(name, "gauge", "Tasks waiting on a device's queue.");
    for q in queues {
        let l = [("device", q.device.as_str()), ("kind", &q.kind)];
        o.val(name, &l, q.waiting.len() as f64);
    }
    let name = "ramsys_device_threads_held";
    o.head(name, "gauge", "Storage threads held by a device's tasks.");
    for q in queues {
        let l = [("device", q.device.as_str()), ("pool", "readers")];
        o.val(name, &l, q.readers_held as f64);
        let l = [("device", q.device.as_str()), ("pool", "writers")];
        o.val(name, &l, q.writers_held as f64);
    }
    let name = "ramsys_device_steals_total";
    let help = "Grants to this device's tasks beyond its own budget.";
    o.head(name, "counter", help);
    for q in queues {
        o.val(name, &[("device", &q.device)], q.steals as f64);
    }
    let name = "ramsys_device_bytes_total";
    o.head(name, "counter", "File bytes moved per storage device.");
    for q in queues {
        let (i, out) = (q.bytes_in as f64, q.bytes_out as f64);
        o.in_out(name, &[("device", &q.device)], i, out);
    }
    let name = "ramsys_device_throughput_bytes_per_second";
    o.head(name, "gauge", "Recent throughput per storage device.");
    for q in queues {
        o.in_out(
            name,
            &[("device", &q.device)],
            q.rate_in_bps,
            q.rate_out_bps,
        );
    }
}

/// Per NIC: what it moved, and how fast lately.
fn nics(o: &mut Out, nics: &[NicStatus]) {
    let name = "ramsys_nic_bytes_total";
    o.head(name, "counter", "File bytes moved per NIC.");
    for n in nics {
        let (i, out) = (n.bytes_in as f64, n.bytes_out as f64);
        o.in_out(name, &[("nic", &n.nic)], i, out);
    }
    let name = "ramsys_nic_throughput_bytes_per_second";
    o.head(name, "gauge", "Recent throughput per NIC.");
    for n in nics {
        o.in_out(name, &[("nic", &n.nic)], n.rate_in_bps, n.rate_out_bps);
    }
}

/// Per live task: bytes so far, and how fast lately.
fn tasks(o: &mut Out, tasks: &[TaskStatus]) {
    let name = "ramsys_task_bytes";
    o.head(name, "gauge", "Bytes moved so far by a live task.");
    for k in tasks {
        let id = k.id.to_string();
        let l = [
            ("task", id.as_str()),
            ("session", &k.session),
            ("state", k.state.name()),
        ];
        o.val(name, &l, k.bytes as f64);
    }
    let name = "ramsys_task_throughput_bytes_per_second";
    o.head(name, "gauge", "Recent throughput of a live task.");
    for k in tasks {
        let id = k.id.to_string();
        o.val(name, &[("task", &id), ("session", &k.session)], k.rate_bps);
    }
}

/// Rate limits (daemon::rates): one series per limited bucket.
fn rates(o: &mut Out, rates: &[RateStatus]) {
    type Get = fn(&RateStatus) -> f64;
    let series: [(&str, &str, &str, Get); 3] = [
        (
            "ramsys_rate_limit_bytes_per_second",
            "gauge",
            "A rate limit in force: the daemon's or a user's max_rate, a session's --bwlimit.",
            |r| r.bytes_per_s as f64,
        ),
        (
            "ramsys_rate_limited_bytes_total",
            "counter",
            "Bytes sent under a rate limit.",
            |r| r.bytes as f64,
        ),
        (
            "ramsys_rate_throttled_seconds_total",
            "counter",
            "Time senders waited for a rate limit.",
            |r| r.throttled_s,
        ),
    ];
    for (name, kind, help, get) in series {
        o.head(name, kind, help);
        for r in rates {
            o.val(name, &[("scope", &r.scope), ("name", &r.name)], get(r));
        }
    }
}

/// The daemon's memory and the bound on one session's file list (issue 36).
fn memory(o: &mut Out, m: &crate::daemon::status::MemoryStatus) {
    let gauges: [(&str, &str, u64); 3] = [
        (
            "ramsys_memory_rss_bytes",
            "Resident memory of the daemon process (VmRSS).",
            m.rss_bytes,
        ),
        (
            "ramsys_memory_peak_rss_bytes",
            "Peak resident memory of the daemon process (VmHWM).",
            m.peak_rss_bytes,
        ),
        (
            "ramsys_session_memory_budget_bytes",
            "Memory one session may hold for its file list (serve --session-memory; 0: none).",
            m.session_budget_bytes,
        ),
    ];
    for (name, help, v) in gauges {
        o.one(name, "gauge", help, v as f64);
    }
}

/// The copy thread of raw channels (MCNI): on or off, what it copied.
fn copy_offload(o: &mut Out, c: &CopyOffload) {
    o.one(
        "ramsys_copy_offload_enabled",
        "gauge",
        "Raw channels opened now copy large slots on the copy thread (MCNI).",
        f64::from(u8::from(c.enabled)),
    );
    let counters: [(&str, &str, u64); 4] = [
        (
            "ramsys_copy_offload_copies_total",
            "Slot copies done on the copy thread.",
            c.copies,
        ),
        (
            "ramsys_copy_offload_bytes_total",
            "Bytes copied on the copy thread.",
            c.bytes,
        ),
        (
            "ramsys_copy_offload_fallbacks_total",
            "Copies of an offloading channel done inline (below 16 KiB).",
            c.fallbacks,
        ),
        (
            "ramsys_copy_offload_fallback_bytes_total",
            "Bytes of those inline copies.",
            c.fallback_bytes,
        ),
    ];
    for (name, help, v) in counters {
        o.one(name, "counter", help, v as f64);
    }
}

/// Storage-thread budgets shared over the site (site::share): per device
/// other members use too.
fn site_shares(o: &mut Out, s: &Status) {
    if !s.queues.iter().any(|q| q.site.is_some()) {
        return;
    }
    type Get = fn(&super::status::QueueSite) -> u32;
    let series: [(&str, &str, Get); 4] = [
        (
            "ramsys_device_site_share",
            "This daemon's storage threads on a device shared over the site.",
            |q| q.share,
        ),
        (
            "ramsys_device_site_budget",
            "A shared device's budget: threads one daemon alone runs on it.",
            |q| q.budget,
        ),
        (
            "ramsys_device_site_members",
            "Site members using a shared device (this one included).",
            |q| q.members,
        ),
        (
            "ramsys_device_site_tasks",
            "Tasks of the site's members on a shared device.",
            |q| q.tasks,
        ),
    ];
    for (name, help, get) in series {
        o.head(name, "gauge", help);
        for q in &s.queues {
            if let Some(x) = &q.site {
                let l = [("device", q.device.as_str()), ("storage_id", &q.storage_id)];
                o.val(name, &l, get(x) as f64);
            }
        }
    }
}

/// The site's members as this daemon's monitoring sees them (issue 19,
/// docs/SITE.md), one series per member and value.
fn site(o: &mut Out, s: &Status) {
    if s.site.is_empty() {
        return;
    }
    type Get = fn(&super::status::SiteMember) -> f64;
    let series: [(&str, &str, Get); 13] = [
        (
            "ramsys_site_cpu_load",
            "Busy fraction of a member's CPUs (0-1).",
            |m| m.cpu_load,
        ),
        (
            "ramsys_site_own_cpu",
            "A member's daemon process's share of its CPUs (0-1).",
            |m| m.own_cpu,
        ),
        (
            "ramsys_site_run_queue",
            "Runnable threads on a member.",
            |m| m.run_queue as f64,
        ),
        (
            "ramsys_site_interrupts_per_second",
            "Interrupt rate of a member.",
            |m| m.intr_per_s as f64,
        ),
        (
            "ramsys_site_softirqs_per_second",
            "Softirq rate of a member.",
            |m| m.softirq_per_s as f64,
        ),
        (
            "ramsys_site_net_rx_bytes_per_second",
            "NIC receive rate of a member (lo excluded).",
            |m| m.net_rx_bps as f64,
        ),
        (
            "ramsys_site_net_tx_bytes_per_second",
            "NIC transmit rate of a member (lo excluded).",
            |m| m.net_tx_bps as f64,
        ),
        (
            "ramsys_site_disk_read_bytes_per_second",
            "Disk read rate of a member.",
            |m| m.disk_read_bps as f64,
        ),
        (
            "ramsys_site_disk_write_bytes_per_second",
            "Disk write rate of a member.",
            |m| m.disk_write_bps as f64,
        ),
        (
            "ramsys_site_sessions",
            "Sessions running on a member.",
            |m| m.sessions as f64,
        ),
        (
            "ramsys_site_free_buffer_bytes",
            "Free buffer bytes of a member.",
            |m| m.free_buffer_bytes as f64,
        ),
        (
            "ramsys_site_age_seconds",
            "Age of this daemon's view of a member.",
            |m| m.age_ms as f64 / 1e3,
        ),
        ("ramsys_site_active_tasks", "Live tasks on a member.", |m| {
            m.active_tasks as f64
        }),
    ];
    for (name, help, get) in series {
        o.head(name, "gauge", help);
        for m in &s.site {
            o.val(name, &[("member", &m.addr)], get(m));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::http::{serve, MAX_CONNS};
    use super::*;
    use crate::daemon::status::{PoolStatus, Totals};
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Duration;

    fn empty() -> Status {
        Status {
            placement: vec![],
            users: vec![],
            rates: vec![crate::daemon::rates::RateStatus {
                scope: "user".into(),
                name: "alice".into(),
                bytes_per_s: 1 << 20,
                bytes: 7,
                throttled_s: 0.5,
            }],
            draining: true,
            site: vec![],
            raw: vec![],
            copy_offload: crate::daemon::status::CopyOffload {
                enabled: true,
                copies: 12,
                bytes: 12 << 20,
                fallbacks: 3,
                fallback_bytes: 3000,
            },
            jobs: vec![],
            memory: crate::daemon::status::MemoryStatus {
                rss_bytes: 5 << 20,
                peak_rss_bytes: 6 << 20,
                session_budget_bytes: 1 << 30,
            },
            version: 1,
            listen: "x".into(),
            root: "/".into(),
            uptime_s: 1.0,
            sessions: vec![],
            tasks: vec![],
            finished: vec![],
            queues: vec![],
            pools: vec![PoolStatus {
                pool: "readers".into(),
                size: 4,
                busy: 1,
            }],
            nics: vec![],
            totals: Totals {
                bytes_in: 42,
                ..Default::default()
            },
        }
    }

    #[test]
    fn renders_and_serves_over_http() {
        let text = render(&empty());
        assert!(text.contains("ramsys_bytes_total{direction=\"in\"} 42\n"));
        assert!(text.contains(
            "ramsys_rate_limit_bytes_per_second{scope=\"user\",name=\"alice\"} 1048576\n"
        ));
        assert!(text
            .contains("ramsys_rate_throttled_seconds_total{scope=\"user\",name=\"alice\"} 0.5\n"));
        assert!(text.contains("ramsys_draining 1\n"));
        assert!(text.contains("ramsys_pool_busy{pool=\"readers\"} 1\n"));
        // Every sample line belongs to a declared ramsys_ family.
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(l.starts_with("ramsys_"), "{l}");
        }
        let a = serve("127.0.0.1:0", empty).unwrap();
        let mut c = TcpStream::connect(a).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut s = String::new();
        c.read_to_string(&mut s).unwrap();
        assert!(s.starts_with("HTTP/1.1 200 OK\r\n"), "{s}");
        assert!(s.contains("ramsys_up 1\n"));
        let mut c = TcpStream::connect(a).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let mut s = String::new();
        c.read_to_string(&mut s).unwrap();
        assert!(s.starts_with("HTTP/1.1 404"));
    }

    /// Issue 34: idle connections beyond MAX_CONNS neither hold threads
    /// nor keep a scraper out; each is closed by its deadline at the
    /// latest.
    #[test]
    fn idle_connections_do_not_keep_a_scrape_out() {
        let a = serve("127.0.0.1:0", empty).unwrap();
        let idle: Vec<TcpStream> = (0..MAX_CONNS + 20)
            .map(|_| {
                let mut c = TcpStream::connect(a).unwrap();
                c.write_all(b"GET /met").unwrap();
                c
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        let mut c = TcpStream::connect(a).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut s = String::new();
        c.read_to_string(&mut s).unwrap();
        assert!(s.contains("ramsys_up 1\n"), "{s}");
        // The oldest idle ones were closed to make room.
        let mut first = &idle[0];
        first
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let mut b = [0u8; 16];
        assert_eq!(first.read(&mut b).unwrap_or(0), 0);
    }

    #[test]
    fn exports_copy_offload_and_site_shares() {
        let mut st = empty();
        let t = render(&st);
        assert!(t.contains("ramsys_copy_offload_enabled 1\n"), "{t}");
        assert!(t.contains("ramsys_memory_peak_rss_bytes 6291456\n"), "{t}");
        assert!(
            t.contains("ramsys_session_memory_budget_bytes 1073741824\n"),
            "{t}"
        );
        assert!(t.contains("ramsys_copy_offload_copies_total 12\n"));
        assert!(t.contains("ramsys_copy_offload_bytes_total 12582912\n"));
        assert!(t.contains("ramsys_copy_offload_fallbacks_total 3\n"));
        assert!(t.contains("ramsys_copy_offload_fallback_bytes_total 3000\n"));
        assert!(!t.contains("ramsys_device_site_share"));
        st.queues = vec![crate::daemon::status::QueueStatus {
            device: "0:52".into(),
            kind: "ssd".into(),
            waiting: vec![],
            budget: 4,
            readers_held: 0,
            writers_held: 4,
            steals: 0,
            bytes_in: 0,
            bytes_out: 0,
            rate_in_bps: 0.0,
            rate_out_bps: 0.0,
            storage: "nfs4 fs1:/x root /".into(),
            storage_id: "00000000000000ab".into(),
            site: Some(crate::daemon::status::QueueSite {
                members: 3,
                tasks: 3,
                threads: 12,
                budget: 4,
                share: 2,
            }),
        }];
        let t = render(&st);
        let l = "{device=\"0:52\",storage_id=\"00000000000000ab\"}";
        assert!(
            t.contains(&format!("ramsys_device_site_share{l} 2\n")),
            "{t}"
        );
        assert!(t.contains(&format!("ramsys_device_site_budget{l} 4\n")));
        assert!(t.contains(&format!("ramsys_device_site_members{l} 3\n")));
        assert!(t.contains(&format!("ramsys_device_site_tasks{l} 3\n")));
    }

    #[test]
    fn exports_replication_jobs() {
        let mut st = empty();
        let j = crate::daemon::jobs::JobStats::new("mirror", "/data", "ramsys://b/m");
        j.lag_ms.store(1500, std::sync::atomic::Ordering::Relaxed);
        crate::daemon::jobs::JobStats::set(&j.state, "watching");
        st.jobs = vec![j.status()];
        let text = render(&st);
        assert!(
            text.contains("ramsys_job_lag_seconds{job=\"mirror\",state=\"watching\"} 1.5"),
            "{text}"
        );
        assert!(text.contains("ramsys_job_files_per_second{job=\"mirror\""));
    }

    #[test]
    fn exports_site_members() {
        let mut st = empty();
        st.site = vec![crate::daemon::status::SiteMember {
            addr: "10.0.0.2:4000".into(),
            cpu_load: 0.75,
            own_cpu: 0.0,
            storage: vec![],
            run_queue: 3,
            intr_per_s: 0,
            softirq_per_s: 0,
            net_rx_bps: 0,
            net_tx_bps: 0,
            disk_read_bps: 0,
            disk_write_bps: 0,
            sessions: 2,
            active_tasks: 1,
            queued_tasks: 0,
            free_buffer_bytes: 4096,
            age_ms: 40,
            error: None,
        }];
        let t = render(&st);
        assert!(
            t.contains("ramsys_site_cpu_load{member=\"10.0.0.2:4000\"} 0.75\n"),
            "{t}"
        );
        assert!(t.contains("ramsys_site_age_seconds{member=\"10.0.0.2:4000\"} 0.04\n"));
        assert!(t.contains("ramsys_site_active_tasks{member=\"10.0.0.2:4000\"} 1\n"));
    }
}
