//! How much of a file the page cache holds, and what the source's read
//! policy makes of it (issue 17).
//!
//! Direct I/O is right for data much larger than memory (seed 000 sec.
//! 6.2.2: it keeps a transfer from thrashing the page cache), but wrong for
//! a file whose pages are already resident: O_DIRECT reads it from the disk
//! again instead of copying it from memory. So a large file is read with
//! O_DIRECT only when most of it is not cached. The probe is cachestat(2)
//! (Linux 6.5, one system call for any length); where the kernel lacks it,
//! mincore(2) over a mapping of the file.

use std::fs::File;
use std::os::fd::AsRawFd;

/// Read a large file buffered when at least this fraction of its pages is
/// in the page cache. Below it the cached part is too small to matter and
/// reading past the cache (O_DIRECT) protects the host's working set.
pub const CACHED_ENOUGH: f64 = 0.5;

/// `--direct`: when the source and sink use O_DIRECT for large files.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DirectMode {
    /// Direct for large files that are not already in the page cache.
    #[default]
    Auto,
    /// Direct for every large file (the behaviour before issue 17).
    Always,
    /// Never (`--no-direct`).
    Never,
}

impl std::str::FromStr for DirectMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(DirectMode::Auto),
            "always" => Ok(DirectMode::Always),
            "never" => Ok(DirectMode::Never),
            _ => Err(format!("expected auto, always or never, got {s:?}")),
        }
    }
}

/// The read policy: whether a file of `size` bytes, `cached` (fraction of
/// its pages resident, None if unknown) of it in the page cache, is read
/// with O_DIRECT. Files below `min` are always buffered.
pub fn read_direct(mode: DirectMode, size: u64, min: u64, cached: Option<f64>) -> bool {
    match mode {
        DirectMode::Never => false,
        _ if size < min => false,
        DirectMode::Always => true,
        DirectMode::Auto => cached.is_none_or(|c| c < CACHED_ENOUGH),
    }
}

/// Bytes of O_DIRECT writes one sink writer keeps in flight on the large
/// files it may also write buffered (StorageCfg::lane_bytes): 64 MiB,
/// `RAMSYS_DIRECT_LANE=N` MiB to change it, 0 to turn the lane off; each
/// writer takes at most half its share of the buffers
/// (roles::sink::writer::direct_lane). Measured on this VM (docs/STORAGE.md
/// "Direct lane"): 4 x 1 GiB warm 1.94-2.50 s against 3.29-3.57 s with
/// every block through the page cache, cold 4.46-4.70 s against
/// 4.81-5.60, at less CPU; the mixed set 1.76-2.35 s at 64 MiB against
/// 2.10-3.06 s at 16 MiB, 20-25 % less CPU.
pub fn direct_lane() -> usize {
    static LANE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LANE.get_or_init(|| {
        std::env::var("RAMSYS_DIRECT_LANE")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map_or(64 << 20, |m| m << 20)
    })
}

/// The sink's write policy under `--direct auto`: how many bytes of large
/// files one session writes through the page cache before the rest goes
/// O_DIRECT. Buffered writes finish in memory (the disk catches up behind
/// the transfer, as it does for cp and rsync); past what memory absorbs
/// they would only push the host's working set out of the cache and stall
/// in the kernel's dirty throttling (balance_dirty_pages), so the rest
/// bypasses the cache (seed 000 sec. 6.2.2's reason for direct I/O).
///
/// The budget is the kernel's own dirty limit (vm.dirty_bytes, or
/// vm.dirty_ratio percent of available memory), capped at half of the
/// memory that is free now: written pages stay cached (clean) after
/// writeback, and free memory is what they can fill without evicting
/// anything.
pub fn write_absorb(meminfo: &str, dirty_ratio: u64, dirty_bytes: u64) -> u64 {
    let kb = |key: &str| -> u64 {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|r| r.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let dirty = if dirty_bytes > 0 {
        dirty_bytes
    } else {
        kb("MemAvailable:") / 100 * dirty_ratio.min(100)
    };
    dirty.min(kb("MemFree:") / 2)
}

/// [`write_absorb`] of this host (/proc/meminfo and /proc/sys/vm); 0 when
/// they cannot be read (then large files are written direct, as before).
///
/// Inside a memory cgroup (a container, a systemd slice) the host's figures
/// overstate what this process may fill: its page cache is charged to the
/// cgroup and reclaimed there, from the cgroup's own working set. So the
/// budget is also capped at half of the cgroup's room (limit less usage).
pub fn host_write_absorb() -> u64 {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let num = |p: &str| read(p).trim().parse::<u64>().unwrap_or(0);
    let host = write_absorb(
        &read("/proc/meminfo"),
        num("/proc/sys/vm/dirty_ratio"),
        num("/proc/sys/vm/dirty_bytes"),
    );
    match cgroup_room(&read("/proc/self/cgroup"), |p| {
        std::fs::read_to_string(p).ok()
    }) {
        Some(room) => host.min(room / 2),
        None => host,
    }
}

/// Bytes this process's memory cgroup may still take (limit less usage),
/// from the text of /proc/self/cgroup and a reader of cgroup files; None
/// when unlimited or unknown. cgroup v1 (a `memory` hierarchy at
/// /sys/fs/cgroup/memory) is preferred where both are mounted, else v2.
pub fn cgroup_room(proc_cgroup: &str, read: impl Fn(&str) -> Option<String>) -> Option<u64> {
    let mut files = None;
    for line in proc_cgroup.lines() {
        let mut it = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        let path = path.trim_end_matches('/');
        if ctrls.split(',').any(|c| c == "memory") {
            let d = format!("/sys/fs/cgroup/memory{path}");
            files = Some((
                format!("{d}/memory.limit_in_bytes"),
                format!("{d}/memory.usage_in_bytes"),
            ));
            break;
        }
        if id == "0" && ctrls.is_empty() {
            let d = format!("/sys/fs/cgroup{path}");
            files = Some((format!("{d}/memory.max"), format!("{d}/memory.current")));
        }
    }
    let (limit, usage) = files?;
    let limit: u64 = read(&limit)?.trim().parse().ok()?; // "max": unlimited
    if limit >= 1 << 60 {
        return None; // v1's unlimited (PAGE_COUNTER_MAX pages)
    }
    let usage: u64 = read(&usage)?.trim().parse().ok()?;
    Some(limit.saturating_sub(usage))
}

/// Largest single write into the page cache (128 KiB; `RAMSYS_WRITE_PIECE`
/// overrides it to repeat the measurement). A buffered write of `len`
/// bytes lets the file system take page-cache folios of up to `len`
/// (ext4 with large folios, Linux 6.16+), and filling large fresh folios
/// costs more per byte than filling small ones: on this project's VM one
/// 4 MiB write per block cost 5.3 CPU-s of kernel copy per 4 GiB, 1 MiB
/// pieces 1.7-2.6, 128 KiB pieces 1.4 (docs/STORAGE.md "Write size"). So a
/// block is written in pieces of at most this size.
pub fn write_piece() -> usize {
    static P: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *P.get_or_init(|| {
        std::env::var("RAMSYS_WRITE_PIECE")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&v| v >= 4096)
            .unwrap_or(128 << 10)
    })
}

/// Positional write of the whole slice into the page cache, in pieces of
/// at most [`write_piece`] bytes.
pub fn pwrite_cached(fd: std::os::fd::RawFd, buf: &[u8], off: u64) -> std::io::Result<()> {
    let piece = write_piece();
    for (i, c) in buf.chunks(piece).enumerate() {
        super::direct::pwrite_all_fd(fd, c, off + (i * piece) as u64)?;
    }
    Ok(())
}

/// Start writeback of a range just written through the cache
/// (sync_file_range(2) with SYNC_FILE_RANGE_WRITE only: it queues the
/// pages and does not wait for them), so the transfer's dirty pages go to
/// the disk behind the write front instead of piling up until the
/// kernel's background threshold and then throttling the writers.
pub fn start_writeback(fd: std::os::fd::RawFd, off: u64, len: usize) {
    // SAFETY: plain syscall on a descriptor the caller holds open; an
    // error (e.g. a file system without it) only means no early writeback.
    unsafe {
        libc::sync_file_range(fd, off as i64, len as i64, libc::SYNC_FILE_RANGE_WRITE);
    }
}

#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

const SYS_CACHESTAT: libc::c_long = 451;

/// Fraction of `file`'s first `len` bytes resident in the page cache.
pub fn resident_fraction(file: &File, len: u64) -> Option<f64> {
    if len == 0 {
        return Some(1.0);
    }
    let page = 4096u64;
    let pages = len.div_ceil(page) as f64;
    let range = CachestatRange { off: 0, len };
    let mut cs = Cachestat::default();
    // SAFETY: valid fd, pointers to live structs of the kernel's layout.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const CachestatRange,
            &mut cs as *mut Cachestat,
            0u32,
        )
    };
    if r == 0 {
        return Some((cs.nr_cache as f64 / pages).min(1.0));
    }
    mincore_fraction(file, len)
}

/// The same with mincore(2) over a read-only mapping (kernels before 6.5).
fn mincore_fraction(file: &File, len: u64) -> Option<f64> {
    let len = usize::try_from(len).ok()?;
    // SAFETY: read-only shared mapping of an open file, unmapped below;
    // mincore writes one byte per page into a vector of that many bytes.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        );
        if p == libc::MAP_FAILED {
            return None;
        }
        let pages = len.div_ceil(4096);
        let mut v = vec![0u8; pages];
        let r = libc::mincore(p, len, v.as_mut_ptr());
        libc::munmap(p, len);
        if r != 0 {
            return None;
        }
        Some(v.iter().filter(|&&b| b & 1 != 0).count() as f64 / pages as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The read signal from a fixture sysfs tree: busy until sampled,
    /// quiet, then 64 MiB read in 100 ms (busy, held 500 ms), quiet again;
    /// no stat file, no signal.
    #[test]
    fn disk_reads_from_a_fixture_counter() {
        use std::os::unix::fs::MetadataExt;
        use std::time::{Duration, Instant};
        let t = tempfile::tempdir().unwrap();
        let dev = std::fs::metadata(t.path()).unwrap().dev();
        let sys = t.path().join("sys");
        assert!(DiskReads::for_dir(&sys, t.path()).is_none());
        let d = sys.join(format!(
            "dev/block/{}:{}",
            libc::major(dev),
            libc::minor(dev)
        ));
        std::fs::create_dir_all(&d).unwrap();
        let write = |sectors: u64| {
            let line = format!("  100 0 {sectors} 5 200 0 4000 9 0 10 20 0 0 0 0 0 0\n");
            std::fs::write(d.join("stat"), line).unwrap();
        };
        write(1000);
        let mut r = DiskReads::for_dir(&sys, t.path()).unwrap();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        assert!(r.busy(t0), "busy until two samples say otherwise");
        assert!(!r.busy(at(100)), "quiet: no reads in 100 ms");
        write(1000 + (64 << 20) / 512);
        assert!(!r.busy(at(150)), "sampled at most every 100 ms");
        assert!(r.busy(at(200)), "640 MiB/s of reads");
        assert!(r.busy(at(250)), "kept between samples");
        assert!(r.busy(at(300)), "no reads since, but held");
        assert!(r.busy(at(600)), "held 500 ms");
        assert!(!r.busy(at(700)), "quiet for 500 ms");
        std::fs::remove_file(d.join("stat")).unwrap();
        assert!(!r.busy(at(900)), "counter gone: no signal");
    }

    #[test]
    fn cached_writes_land_whole_across_pieces() {
        // A length that is no multiple of the piece, at an odd offset, so
        // every piece boundary and the short last piece are exercised.
        let piece = write_piece();
        let data: Vec<u8> = (0..3 * piece + 777).map(|i| (i % 251) as u8).collect();
        let dir = tempfile::tempdir().unwrap();
        let f = File::create(dir.path().join("f")).unwrap();
        pwrite_cached(f.as_raw_fd(), &data, 4097).unwrap();
        let got = std::fs::read(dir.path().join("f")).unwrap();
        assert_eq!(got.len(), 4097 + data.len());
        assert!(
            got[..4097].iter().all(|&b| b == 0),
            "the hole before stays zero"
        );
        assert!(got[4097..] == data[..], "every piece at its offset");
    }

    #[test]
    fn policy_reads_cached_files_through_the_cache() {
        let min = 1 << 20;
        for mode in [DirectMode::Auto, DirectMode::Always, DirectMode::Never] {
            assert!(
                !read_direct(mode, 1000, min, Some(0.0)),
                "small files: buffered"
            );
        }
        assert!(read_direct(DirectMode::Auto, 1 << 30, min, Some(0.1)));
        assert!(read_direct(DirectMode::Auto, 1 << 30, min, None));
        assert!(!read_direct(DirectMode::Auto, 1 << 30, min, Some(0.9)));
        assert!(read_direct(DirectMode::Always, 1 << 30, min, Some(1.0)));
        assert!(!read_direct(DirectMode::Never, 1 << 30, min, Some(0.0)));
    }

    const MEMINFO: &str =
        "MemTotal:       24683656 kB\nMemFree:        20000000 kB\nMemAvailable:   24000000 kB\n";

    #[test]
    fn write_budget_is_the_dirty_limit_within_half_of_free_memory() {
        // 20 % of 24,000,000 kB available.
        assert_eq!(write_absorb(MEMINFO, 20, 0), 4_800_000 * 1024);
        // vm.dirty_bytes wins over the ratio.
        assert_eq!(write_absorb(MEMINFO, 20, 1 << 30), 1 << 30);
        // Little free memory (a cache full of other data): half of it.
        let tight = MEMINFO.replace("20000000", "2000000");
        assert_eq!(write_absorb(&tight, 20, 0), 1_000_000 * 1024);
        // Unreadable: nothing buffered.
        assert_eq!(write_absorb("", 20, 0), 0);
    }

    #[test]
    fn a_file_just_written_is_resident_and_one_dropped_is_not() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, vec![7u8; 1 << 20]).unwrap();
        let f = File::open(&p).unwrap();
        let both = [
            resident_fraction(&f, 1 << 20),
            mincore_fraction(&f, 1 << 20),
        ];
        for r in both {
            assert!(r.unwrap() > 0.9, "{r:?}");
        }
        // Written back and dropped from the cache: (nearly) nothing left.
        f.sync_all().unwrap();
        // SAFETY: valid fd.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        let r = resident_fraction(&f, 1 << 20).unwrap();
        assert!(r < 0.5, "{r}");
    }

    #[test]
    fn cgroup_room_v1_v2_and_unlimited() {
        let files = |want: &'static [(&'static str, &'static str)]| {
            move |p: &str| {
                want.iter()
                    .find(|(k, _)| *k == p)
                    .map(|(_, v)| v.to_string())
            }
        };
        let v1 = "4:memory:/bench\n0::/\n";
        let f = files(&[
            (
                "/sys/fs/cgroup/memory/bench/memory.limit_in_bytes",
                "6442450944\n",
            ),
            (
                "/sys/fs/cgroup/memory/bench/memory.usage_in_bytes",
                "1073741824\n",
            ),
        ]);
        assert_eq!(cgroup_room(v1, f), Some(5 << 30));
        let v2 = "0::/system.slice/x.scope\n";
        let f = files(&[
            (
                "/sys/fs/cgroup/system.slice/x.scope/memory.max",
                "2147483648\n",
            ),
            (
                "/sys/fs/cgroup/system.slice/x.scope/memory.current",
                "3000000000\n",
            ),
        ]);
        assert_eq!(cgroup_room(v2, f), Some(0), "over the limit: no room");
        let f = files(&[
            ("/sys/fs/cgroup/memory.max", "max\n"),
            ("/sys/fs/cgroup/memory.current", "1\n"),
        ]);
        assert_eq!(cgroup_room("0::/\n", f), None);
        let f = files(&[
            (
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
            ("/sys/fs/cgroup/memory/memory.usage_in_bytes", "1\n"),
        ]);
        assert_eq!(cgroup_room("4:memory:/\n", f), None);
        assert_eq!(cgroup_room("", |_| None), None);
    }
}

/// The direct lane's width while the sink's disk is also serving reads
/// (DiskReads): O_DIRECT writes then compete with those reads for the
/// disk, where buffered ones would wait for writeback after them.
pub const LANE_CONTENDED: usize = 16 << 20;
/// Reads at or above this rate make the disk count as busy reading.
pub const READS_BUSY: u64 = 32 << 20;
/// How often the read counter is sampled.
const READS_SAMPLE: std::time::Duration = std::time::Duration::from_millis(100);
/// How long the disk counts as busy after the last busy sample: a cold
/// reader pauses while its blocks wait for credits, and a lane that widens
/// in each pause starves the reads again.
const READS_HOLD: std::time::Duration = std::time::Duration::from_millis(500);

/// Reads on one disk, from its block-layer counters
/// (the whole disk's `stat` under `SYS/dev/block/MAJ:MIN`, field 3:
/// sectors read): the sink's
/// signal that its direct writes compete with reads (a cold source on the
/// same disk, or anyone else's). Measured here (docs/STORAGE.md "Direct
/// lane"): 4 x 1 GiB read cold from the sink's own disk took 4.79-4.90 s
/// with a 64 MiB lane against 4.25-4.38 s with 16 MiB, while a warm
/// source ran faster with 64.
#[derive(Debug)]
pub struct DiskReads {
    stat: std::path::PathBuf,
    last: Option<(std::time::Instant, u64)>,
    /// The last sample that saw reads.
    seen: Option<std::time::Instant>,
    busy: bool,
}

impl DiskReads {
    /// The counters of the disk holding `dir` (the whole disk, for a
    /// partition: storage::device::disk_dir), under the sysfs root `sys`
    /// (`/sys`; a fixture tree in tests). None where there are none
    /// (tmpfs, overlay and other file systems without a block device).
    pub fn for_dir(sys: &std::path::Path, dir: &std::path::Path) -> Option<DiskReads> {
        use std::os::unix::fs::MetadataExt;
        let dev = std::fs::metadata(dir).ok()?.dev();
        let stat = super::device::disk_dir(sys, dev)?.join("stat");
        // Busy until the first sample says otherwise: a lane that starts
        // wide fills the disk's queue before the first sample is in.
        stat.is_file().then_some(DiskReads {
            stat,
            last: None,
            seen: None,
            busy: true,
        })
    }

    /// Whether the disk read at least READS_BUSY bytes/s between two
    /// samples in the last READS_HOLD (and until the first two samples);
    /// samples at most every READS_SAMPLE, so a call per block costs
    /// nothing most of the time.
    pub fn busy(&mut self, now: std::time::Instant) -> bool {
        if self
            .last
            .is_some_and(|(t, _)| now.duration_since(t) < READS_SAMPLE)
        {
            return self.busy;
        }
        let Some(sectors) = std::fs::read_to_string(&self.stat)
            .ok()
            .and_then(|s| s.split_whitespace().nth(2)?.parse::<u64>().ok())
        else {
            self.busy = false;
            return false;
        };
        if let Some((t, s0)) = self.last {
            let secs = now.duration_since(t).as_secs_f64();
            let rate = sectors.saturating_sub(s0) as f64 * 512.0 / secs;
            if rate >= READS_BUSY as f64 {
                self.seen = Some(now);
            }
            self.busy = self
                .seen
                .is_some_and(|s| now.duration_since(s) < READS_HOLD);
        }
        self.last = Some((now, sectors));
        self.busy
    }
}
