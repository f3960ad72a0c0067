//! NUMA operations behind a trait, so Algorithm 1 runs on the real host
//! (mmap + mbind + sched_setaffinity + move_pages) and on fixture topologies
//! (a simulator that fakes bandwidth from a configurable matrix).

use crate::layout::HostLayout;
use crate::Mode;
use anyhow::{anyhow, bail, Result};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A buffer placed on one NUMA node. Real buffers are anonymous mappings;
/// simulated ones are virtual (no memory behind them, `ptr` is null).
#[derive(Debug)]
pub struct NodeBuf {
    ptr: *mut u8,
    len: usize,
    node: u32,
}

// SAFETY: NodeBuf exclusively owns its mapping; sharing &NodeBuf only allows reads.
unsafe impl Send for NodeBuf {}
unsafe impl Sync for NodeBuf {}

impl NodeBuf {
    /// A buffer with no memory behind it (simulators).
    pub fn virtual_on(node: u32, len: usize) -> Self {
        NodeBuf {
            ptr: std::ptr::null_mut(),
            len,
            node,
        }
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn node(&self) -> u32 {
        self.node
    }
    pub fn is_virtual(&self) -> bool {
        self.ptr.is_null()
    }
    pub fn as_slice(&self) -> &[u8] {
        if self.ptr.is_null() {
            return &[];
        }
        // SAFETY: ptr/len describe a live private mapping owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.ptr.is_null() {
            return &mut [];
        }
        // SAFETY: as above, and &mut self guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for NodeBuf {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: the mapping was created by mmap with this length.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }
}

/// What one copy thread is doing, so a simulator can look up the bandwidth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyCtx {
    /// The target node k (threads run here, it stands in for the device).
    pub target: u32,
    /// The varying node i.
    pub other: u32,
    pub mode: Mode,
    /// Number of concurrent copy threads (the cores of k).
    pub threads: usize,
}

/// NUMA primitives used by the characterization.
pub trait NumaOps: Send + Sync {
    /// Allocate `bytes` bound to `node`, pre-faulted (every page touched).
    fn alloc_on_node(&self, node: u32, bytes: usize) -> Result<NodeBuf>;
    /// Pin the calling thread to `cpus`.
    fn pin_current_thread(&self, cpus: &[u32]) -> Result<()>;
    /// Node of up to `samples` pages spread over `buf`; `Ok(None)` when the
    /// kernel cannot tell (no NUMA support).
    fn page_nodes(&self, buf: &NodeBuf, samples: usize) -> Result<Option<Vec<u32>>>;
    /// Copy `src` into `dst` `iters` times; returns the elapsed time.
    fn timed_copy(&self, _ctx: &CopyCtx, src: &NodeBuf, dst: &mut NodeBuf, iters: u32) -> Duration {
        let n = src.len().min(dst.len());
        let t = Instant::now();
        for _ in 0..iters {
            // Bulk memcpy stands in for the device DMA engine (seed 001 sec. V-A).
            dst.as_mut_slice()[..n].copy_from_slice(&src.as_slice()[..n]);
            std::hint::black_box(dst.as_slice().as_ptr());
        }
        t.elapsed()
    }
    /// Short description for the report.
    fn describe(&self) -> String;
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

const MPOL_BIND: libc::c_int = 2;
const MPOL_MF_STRICT: libc::c_uint = 1;
const MPOL_MF_MOVE: libc::c_uint = 2;

/// Real Linux implementation.
#[derive(Debug, Default, Clone, Copy)]
pub struct LinuxNuma;

impl LinuxNuma {
    fn page_size() -> usize {
        // SAFETY: sysconf has no memory-safety preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 {
            p as usize
        } else {
            4096
        }
    }
}

impl NumaOps for LinuxNuma {
    fn alloc_on_node(&self, node: u32, bytes: usize) -> Result<NodeBuf> {
        if bytes == 0 {
            bail!("zero-sized buffer");
        }
        // SAFETY: anonymous private mapping, checked for MAP_FAILED below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            bail!("mmap {bytes} bytes: {}", errno());
        }
        let buf = NodeBuf {
            ptr: ptr.cast(),
            len: bytes,
            node,
        };
        let words = node as usize / 64 + 1;
        let mut mask = vec![0u64; words];
        mask[node as usize / 64] |= 1u64 << (node % 64);
        // SAFETY: addr/len is our mapping; mask has `words` u64 = maxnode-1 bits.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_mbind,
                buf.ptr,
                bytes,
                MPOL_BIND,
                mask.as_ptr(),
                (words * 64 + 1) as libc::c_ulong,
                MPOL_MF_STRICT | MPOL_MF_MOVE,
            )
        };
        if rc != 0 {
            let e = errno();
            // A kernel without NUMA support has exactly one node: nothing to bind.
            if !(e.raw_os_error() == Some(libc::ENOSYS) && node == 0) {
                bail!("mbind to node {node}: {e}");
            }
        }
        // Pre-fault: first touch after mbind places every page on `node`.
        let page = Self::page_size();
        let mut off = 0;
        while off < bytes {
            // SAFETY: off < bytes, inside the mapping.
            unsafe { buf.ptr.add(off).write_volatile(0x5a) };
            off += page;
        }
        Ok(buf)
    }

    fn pin_current_thread(&self, cpus: &[u32]) -> Result<()> {
        if cpus.is_empty() {
            bail!("empty cpu set");
        }
        // SAFETY: cpu_set_t is plain data; CPU_SET bounds are checked below.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &c in cpus {
                if c as usize >= libc::CPU_SETSIZE as usize {
                    bail!("cpu {c} beyond CPU_SETSIZE");
                }
                libc::CPU_SET(c as usize, &mut set);
            }
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                bail!("sched_setaffinity {cpus:?}: {}", errno());
            }
        }
        Ok(())
    }

    fn page_nodes(&self, buf: &NodeBuf, samples: usize) -> Result<Option<Vec<u32>>> {
        if buf.is_virtual() || buf.is_empty() {
            return Ok(Some(Vec::new()));
        }
        let page = Self::page_size();
        let pages = buf.len().div_ceil(page);
        let n = samples.clamp(1, pages);
        let addrs: Vec<*mut libc::c_void> = (0..n)
            .map(|j| {
                let pg = j * pages / n;
                // SAFETY: pg < pages, so the address is inside the mapping.
                unsafe { buf.ptr.add(pg * page).cast() }
            })
            .collect();
        let mut status = vec![-1i32; n];
        // SAFETY: nodes == NULL means "query"; arrays have n entries.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_move_pages,
                0,
                n as libc::c_ulong,
                addrs.as_ptr(),
                std::ptr::null::<libc::c_int>(),
                status.as_mut_ptr(),
                0,
            )
        };
        if rc != 0 {
            let e = errno();
            if e.raw_os_error() == Some(libc::ENOSYS) {
                return Ok(None);
            }
            bail!("move_pages query: {e}");
        }
        status
            .into_iter()
            .map(|s| {
                u32::try_from(s)
                    .map_err(|_| anyhow!("page not resident (status {s}) after pre-fault"))
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    fn describe(&self) -> String {
        "linux (mmap+mbind, sched_setaffinity, move_pages)".into()
    }
}

thread_local! {
    static SIM_PINNED: Cell<Option<u32>> = const { Cell::new(None) };
}

/// Simulated host: buffers are virtual and `timed_copy` returns the time the
/// configured aggregate bandwidth implies, so an 8-node fixture characterizes
/// in milliseconds.
#[derive(Debug)]
pub struct SimNuma {
    layout: HostLayout,
    /// `write_gbps[k][i]`: aggregate Gbps, threads on k, source on i, sink on k.
    pub write_gbps: Vec<Vec<f64>>,
    /// `read_gbps[k][i]`: aggregate Gbps, threads on k, source on k, sink on i.
    pub read_gbps: Vec<Vec<f64>>,
    /// Relative jitter amplitude (e.g. 0.02 = +-2 %), deterministic.
    pub jitter: f64,
    /// Pretend pages of buffers bound to this node land elsewhere.
    pub misplace_node: Option<u32>,
    counter: AtomicU64,
}

impl SimNuma {
    /// Matrices are indexed by node id.
    pub fn new(layout: HostLayout, write_gbps: Vec<Vec<f64>>, read_gbps: Vec<Vec<f64>>) -> Self {
        SimNuma {
            layout,
            write_gbps,
            read_gbps,
            jitter: 0.0,
            misplace_node: None,
            counter: AtomicU64::new(0),
        }
    }

    fn lookup(&self, ctx: &CopyCtx) -> f64 {
        let m = match ctx.mode {
            Mode::Write => &self.write_gbps,
            Mode::Read => &self.read_gbps,
        };
        m.get(ctx.target as usize)
            .and_then(|r| r.get(ctx.other as usize))
            .copied()
            .unwrap_or(1.0)
    }
}

impl NumaOps for SimNuma {
    fn alloc_on_node(&self, node: u32, bytes: usize) -> Result<NodeBuf> {
        if self.layout.node(node).is_none() {
            bail!("no node {node}");
        }
        Ok(NodeBuf::virtual_on(node, bytes))
    }

    fn pin_current_thread(&self, cpus: &[u32]) -> Result<()> {
        let node = cpus
            .first()
            .and_then(|c| self.layout.node_of_cpu(*c))
            .ok_or_else(|| anyhow!("cpus {cpus:?} not in layout"))?;
        SIM_PINNED.with(|p| p.set(Some(node)));
        Ok(())
    }

    fn page_nodes(&self, buf: &NodeBuf, samples: usize) -> Result<Option<Vec<u32>>> {
        let node = match self.misplace_node {
            Some(m) if m == buf.node() => m + 1,
            _ => buf.node(),
        };
        Ok(Some(vec![node; samples.max(1)]))
    }

    fn timed_copy(&self, ctx: &CopyCtx, src: &NodeBuf, dst: &mut NodeBuf, iters: u32) -> Duration {
        // Sanity: the runner must have pinned this thread to the target node.
        let pinned = SIM_PINNED.with(|p| p.get());
        assert_eq!(pinned, Some(ctx.target), "copy thread not pinned to target");
        let c = self.counter.fetch_add(1, Ordering::Relaxed);
        let wobble = ((c.wrapping_mul(2_654_435_761) % 1000) as f64 / 1000.0 - 0.5) * 2.0;
        let agg = self.lookup(ctx) * (1.0 + self.jitter * wobble);
        let per_thread = agg / ctx.threads.max(1) as f64;
        let bits = src.len().min(dst.len()) as f64 * 8.0 * iters as f64;
        Duration::from_secs_f64(bits / (per_thread * 1e9))
    }

    fn describe(&self) -> String {
        format!("simulated ({} nodes)", self.layout.nodes.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_alloc_is_prefaulted_and_on_node() {
        let ops = LinuxNuma;
        let layout = HostLayout::from_sysfs(std::path::Path::new("/")).unwrap();
        let node = layout.nodes[0].id;
        let mut a = ops.alloc_on_node(node, 1 << 20).unwrap();
        let b = ops.alloc_on_node(node, 1 << 20).unwrap();
        assert_eq!(a.len(), 1 << 20);
        assert_eq!(b.as_slice()[0], 0x5a);
        if let Some(nodes) = ops.page_nodes(&a, 16).unwrap() {
            assert_eq!(nodes.len(), 16);
            assert!(nodes.iter().all(|&n| n == node), "{nodes:?}");
        }
        let ctx = CopyCtx {
            target: node,
            other: node,
            mode: Mode::Write,
            threads: 1,
        };
        let d = ops.timed_copy(&ctx, &b, &mut a, 2);
        assert!(d > Duration::ZERO);
        assert_eq!(a.as_slice(), b.as_slice());
    }

    #[test]
    fn linux_pin_to_own_cpus() {
        let layout = HostLayout::from_sysfs(std::path::Path::new("/")).unwrap();
        let cpus = layout
            .nodes
            .iter()
            .find(|n| !n.cpus.is_empty())
            .unwrap()
            .cpus
            .clone();
        std::thread::spawn(move || LinuxNuma.pin_current_thread(&cpus).unwrap())
            .join()
            .unwrap();
        assert!(LinuxNuma.pin_current_thread(&[]).is_err());
    }

    #[test]
    fn sim_time_matches_matrix() {
        let layout = HostLayout::synthetic(2, 2, 1, 1 << 20, vec![0]);
        let sim = SimNuma::new(layout, vec![vec![16.0, 8.0]; 2], vec![vec![16.0, 4.0]; 2]);
        sim.pin_current_thread(&[0]).unwrap();
        let src = sim.alloc_on_node(1, 1_000_000).unwrap();
        let mut dst = sim.alloc_on_node(0, 1_000_000).unwrap();
        let ctx = CopyCtx {
            target: 0,
            other: 1,
            mode: Mode::Write,
            threads: 2,
        };
        // 8 Mbit per iter at 4 Gbps per thread = 2 ms.
        let d = sim.timed_copy(&ctx, &src, &mut dst, 1);
        assert!((d.as_secs_f64() - 0.002).abs() < 1e-9, "{d:?}");
        assert!(sim.alloc_on_node(5, 10).is_err());
    }
}
