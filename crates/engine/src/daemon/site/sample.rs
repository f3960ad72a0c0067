//! This host's load as the site's monitoring publishes it (seed 003 sec.
//! 2.2.4, lines ~597-641: load calculated from /proc every T ms): CPU
//! busy fraction, run queue, interrupt and softirq rates (/proc/stat),
//! NIC rates (/proc/net/dev) and disk rates (/proc/diskstats, whole
//! devices listed in /sys/block). The filesystem root is a parameter so
//! tests inject a fake /proc.
//!
//! Values are rounded (CPU to 1 %, rates to two significant digits) so
//! that an idle host publishes the same bytes tick after tick and the
//! version-based segment moves nothing.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// One member's published state (postcard in its `load` segment).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Load {
    /// Busy fraction of all CPUs over the last interval, 0-1.
    pub cpu_load: f32,
    /// Runnable threads (`procs_running`).
    pub run_queue: u32,
    pub intr_per_s: u64,
    pub softirq_per_s: u64,
    pub net_rx_bps: u64,
    pub net_tx_bps: u64,
    pub disk_read_bps: u64,
    pub disk_write_bps: u64,
    /// The daemon's own state (daemon::status).
    pub sessions: u32,
    pub active_tasks: u32,
    pub queued_tasks: u32,
    pub free_buffer_bytes: u64,
    /// This daemon's own share of the CPUs over the interval, 0-1
    /// (`/proc/self/stat` utime + stime against the `cpu` line): the load
    /// of other work is `cpu_load - own_cpu` (site::share, the plan).
    pub own_cpu: f32,
    /// Shared storage devices in use (site::share), at most
    /// share::MAX_PUBLISHED.
    pub storage: Vec<super::share::StorageUse>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    busy: u64,
    total: u64,
    intr: u64,
    softirq: u64,
    rx: u64,
    tx: u64,
    rd_sectors: u64,
    wr_sectors: u64,
    /// This process's utime + stime, clock ticks.
    own: u64,
}

pub struct Sampler {
    root: PathBuf,
    prev: Option<(Instant, Counters)>,
    /// The CPU counters the busy fraction is measured from, and the last
    /// fraction: an interval shorter than the kernel's tick (1-4 ms at
    /// HZ 250-1000 on few CPUs) sees no jiffy pass, and reporting 0 % then
    /// would make a busy host look idle (and flip the least-loaded
    /// choice); the last value stands until jiffies pass.
    cpu_base: Option<(u64, u64)>,
    cpu_load: f32,
    own_base: u64,
    own_cpu: f32,
}

/// Round to two significant digits.
fn sig2(x: f64) -> u64 {
    if x < 1.0 {
        return 0;
    }
    let mag = 10f64.powi(x.log10().floor() as i32 - 1);
    ((x / mag).round() * mag) as u64
}

fn read(root: &Path, rel: &str) -> String {
    std::fs::read_to_string(root.join(rel)).unwrap_or_default()
}

impl Sampler {
    /// `root`: the filesystem root holding proc/ and sys/ ("/" normally).
    pub fn new(root: &Path) -> Sampler {
        Sampler {
            root: root.to_path_buf(),
            prev: None,
            cpu_base: None,
            cpu_load: 0.0,
            own_base: 0,
            own_cpu: 0.0,
        }
    }

    fn counters(&self) -> (Counters, u32) {
        let mut c = Counters::default();
        let mut runq = 0;
        for l in read(&self.root, "proc/stat").lines() {
            let mut f = l.split_whitespace();
            let nums = |f: std::str::SplitWhitespace| -> Vec<u64> {
                f.map(|x| x.parse().unwrap_or(0)).collect()
            };
            match f.next() {
                Some("cpu") => {
                    let v = nums(f);
                    // user nice system idle iowait irq softirq steal
                    let total: u64 = v.iter().take(8).sum();
                    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
                    c.total = total;
                    c.busy = total.saturating_sub(idle);
                }
                Some("procs_running") => runq = nums(f).first().copied().unwrap_or(0) as u32,
                Some("intr") => c.intr = nums(f).first().copied().unwrap_or(0),
                Some("softirq") => c.softirq = nums(f).first().copied().unwrap_or(0),
                _ => {}
            }
        }
        for l in read(&self.root, "proc/net/dev").lines().skip(2) {
            let Some((name, rest)) = l.split_once(':') else {
                continue;
            };
            if name.trim() == "lo" {
                continue;
            }
            let v: Vec<u64> = rest
                .split_whitespace()
                .map(|x| x.parse().unwrap_or(0))
                .collect();
            c.rx += v.first().copied().unwrap_or(0);
            c.tx += v.get(8).copied().unwrap_or(0);
        }
        for l in read(&self.root, "proc/diskstats").lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Whole devices only (partitions would count twice).
            if f.len() < 10 || !self.root.join("sys/block").join(f[2]).exists() {
                continue;
            }
            c.rd_sectors += f[5].parse::<u64>().unwrap_or(0);
            c.wr_sectors += f[9].parse::<u64>().unwrap_or(0);
        }
        // Fields after the command's closing parenthesis: state is 3rd,
        // utime and stime the 14th and 15th of the line.
        let me = read(&self.root, "proc/self/stat");
        if let Some((_, rest)) = me.rsplit_once(')') {
            let f: Vec<u64> = rest
                .split_whitespace()
                .skip(11)
                .take(2)
                .map(|x| x.parse().unwrap_or(0))
                .collect();
            c.own = f.iter().sum();
        }
        (c, runq)
    }

    /// Host load since the previous call (the first call reports rates 0).
    pub fn sample(&mut self) -> Load {
        let now = Instant::now();
        let (c, runq) = self.counters();
        let mut l = Load {
            run_queue: runq,
            ..Load::default()
        };
        if self.prev.is_none() {
            self.own_base = c.own;
        }
        if let Some((t, p)) = self.prev {
            let dt = now.duration_since(t).as_secs_f64().max(1e-3);
            let rate = |a: u64, b: u64| sig2(a.saturating_sub(b) as f64 / dt);
            let (busy0, total0) = self.cpu_base.unwrap_or((p.busy, p.total));
            let dtot = c.total.saturating_sub(total0);
            if dtot > 0 {
                let f = c.busy.saturating_sub(busy0) as f64 / dtot as f64;
                self.cpu_load = ((f * 100.0).round() / 100.0).clamp(0.0, 1.0) as f32;
                let o = c.own.saturating_sub(self.own_base) as f64 / dtot as f64;
                self.own_cpu = ((o * 100.0).round() / 100.0).clamp(0.0, 1.0) as f32;
                self.cpu_base = Some((c.busy, c.total));
                self.own_base = c.own;
            }
            l.cpu_load = self.cpu_load;
            l.own_cpu = self.own_cpu.min(self.cpu_load);
            l.intr_per_s = rate(c.intr, p.intr);
            l.softirq_per_s = rate(c.softirq, p.softirq);
            l.net_rx_bps = rate(c.rx, p.rx);
            l.net_tx_bps = rate(c.tx, p.tx);
            l.disk_read_bps = rate(c.rd_sectors * 512, p.rd_sectors * 512);
            l.disk_write_bps = rate(c.wr_sectors * 512, p.wr_sectors * 512);
        }
        self.prev = Some((now, c));
        l
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_stat(root: &Path, busy: u64, idle: u64) {
        std::fs::create_dir_all(root.join("proc/net")).unwrap();
        std::fs::create_dir_all(root.join("sys/block/sda")).unwrap();
        std::fs::write(
            root.join("proc/stat"),
            format!("cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 2 3\nintr 1000 1 2\nsoftirq 50 1\nprocs_running 3\n"),
        )
        .unwrap();
        std::fs::write(
            root.join("proc/net/dev"),
            "Inter-|\n face |\n    lo: 999 0 0 0 0 0 0 0 999 0\n  eth0: 1000 0 0 0 0 0 0 0 2000 0\n",
        )
        .unwrap();
        std::fs::write(
            root.join("proc/diskstats"),
            "   8 0 sda 1 0 100 0 1 0 200 0 0 0 0\n   8 1 sda1 1 0 100 0 1 0 200 0 0 0 0\n",
        )
        .unwrap();
    }

    #[test]
    fn reads_an_injected_proc() {
        let d = std::env::temp_dir().join(format!("ramsys-sample-{}", std::process::id()));
        write_stat(&d, 100, 900);
        let mut s = Sampler::new(&d);
        let first = s.sample();
        assert_eq!(first.run_queue, 3);
        assert_eq!(first.cpu_load, 0.0);
        // 300 busy of 400 more jiffies: 75 %.
        write_stat(&d, 400, 1000);
        let l = s.sample();
        assert_eq!(l.cpu_load, 0.75);
        // Unchanged counters: zero rates (lo and the partition ignored).
        assert_eq!((l.net_rx_bps, l.disk_read_bps), (0, 0));
        // No jiffy passed (an interval shorter than the tick): the last
        // load stands, not 0 %; the next one is measured from the last
        // counters that moved.
        assert_eq!(s.sample().cpu_load, 0.75);
        write_stat(&d, 500, 1100);
        assert_eq!(s.sample().cpu_load, 0.5);
        // Our own process's ticks: 50 of the next 200 are ours.
        std::fs::create_dir_all(d.join("proc/self")).unwrap();
        let me = |t: u64| format!("42 (ramsys d) S 1 1 1 0 -1 0 0 0 0 0 {t} 0 0 0 20 0 9\n");
        std::fs::write(d.join("proc/self/stat"), me(100)).unwrap();
        write_stat(&d, 600, 1200);
        s.sample();
        std::fs::write(d.join("proc/self/stat"), me(150)).unwrap();
        write_stat(&d, 750, 1250);
        let l = s.sample();
        assert_eq!((l.cpu_load, l.own_cpu), (0.75, 0.25));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// The load record is network input (a peer's segment): any bytes
    /// decode or fail without panicking, every record round-trips, and
    /// the largest fits the segment.
    #[test]
    fn load_decodes_any_bytes_and_the_largest_fits() {
        use crate::daemon::site::share::{StorageUse, MAX_PUBLISHED};
        use proptest::prelude::*;
        let big = Load {
            cpu_load: 1.0,
            run_queue: u32::MAX,
            intr_per_s: u64::MAX,
            softirq_per_s: u64::MAX,
            net_rx_bps: u64::MAX,
            net_tx_bps: u64::MAX,
            disk_read_bps: u64::MAX,
            disk_write_bps: u64::MAX,
            sessions: u32::MAX,
            active_tasks: u32::MAX,
            queued_tasks: u32::MAX,
            free_buffer_bytes: u64::MAX,
            own_cpu: 1.0,
            storage: vec![
                StorageUse {
                    id: u64::MAX,
                    tasks: u16::MAX,
                    threads: u16::MAX,
                };
                MAX_PUBLISHED
            ],
        };
        let b = postcard::to_stdvec(&big).unwrap();
        assert!(
            b.len() <= super::super::LOAD_BYTES as usize,
            "{} bytes",
            b.len()
        );
        proptest!(|(bytes in prop::collection::vec(any::<u8>(), 0..300),
                    ids in prop::collection::vec((any::<u64>(), any::<u16>(), any::<u16>()), 0..9),
                    cpu in 0f32..1.0)| {
            let _ = postcard::from_bytes::<Load>(&bytes);
            let l = Load {
                cpu_load: cpu,
                storage: ids.iter().map(|&(id, tasks, threads)| StorageUse { id, tasks, threads }).collect(),
                ..Load::default()
            };
            let b = postcard::to_stdvec(&l).unwrap();
            prop_assert_eq!(postcard::from_bytes::<Load>(&b).unwrap(), l);
        });
    }

    #[test]
    fn two_significant_digits() {
        assert_eq!(sig2(0.4), 0);
        assert_eq!(sig2(1234.0), 1200);
        assert_eq!(sig2(987_654.0), 990_000);
    }
}
