//! Placement primitives: pin threads to a node's CPUs (sched_setaffinity)
//! and allocate buffers bound to a node (mbind before first touch, verified
//! with move_pages). Seed 000 sec. 6.1.2 (threads bound to the device's node)
//! and sec. 6.1.5 (NUMA-aware bulk buffer allocation); seed 002 sec. 3
//! (every buffer of a channel on its NIC's node).

use std::collections::BTreeMap;
use std::io;
use std::ptr::NonNull;
use std::sync::Mutex;

/// Pins the calling thread to `cpus`.
pub fn pin_current_thread(cpus: &[usize]) -> io::Result<()> {
    if cpus.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty CPU set"));
    }
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    for &c in cpus {
        if c >= max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cpu {c} beyond CPU_SETSIZE {max}"),
            ));
        }
        // SAFETY: c < CPU_SETSIZE, checked above.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: pid 0 = calling thread; `set` is a valid cpu_set_t.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// CPUs the calling thread may run on (empty if the call fails).
pub fn current_affinity() -> Vec<usize> {
    // SAFETY: as above.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 = calling thread; `set` is writable and correctly sized.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if rc != 0 {
        return Vec::new();
    }
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: indices are below CPU_SETSIZE.
    (0..max)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// CPU the calling thread runs on right now.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu has no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    usize::try_from(c).ok()
}

// <linux/mempolicy.h>; not exported by the libc crate.
const MPOL_PREFERRED: libc::c_int = 1;
const MPOL_BIND: libc::c_int = 2;

/// Memory policy for [`NodeRegion::alloc_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemPolicy {
    /// Pages only from the node; faults fail (SIGBUS/OOM) when it is full.
    Bind,
    /// Pages from the node while it has free memory, elsewhere otherwise.
    Preferred,
}

/// Whether a region's memory policy was applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Binding {
    Bound {
        node: u32,
        policy: MemPolicy,
    },
    /// Left to the kernel's default (first-touch) policy, and why.
    Unbound(String),
}

/// Anonymous, page-aligned memory with a NUMA policy applied before the
/// first touch, then pre-faulted so every page is placed at allocation
/// time, not on the data path.
pub struct NodeRegion {
    ptr: NonNull<u8>,
    len: usize,
    mapped: usize,
    binding: Binding,
}

// SAFETY: the region exclusively owns its mapping; shared access only hands
// out `*const u8` / `&[u8]`, mutation needs `&mut self`.
unsafe impl Send for NodeRegion {}
// SAFETY: see above.
unsafe impl Sync for NodeRegion {}

pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

impl NodeRegion {
    /// `bytes` of memory on `node` (MPOL_PREFERRED, so a full node degrades
    /// to remote memory instead of killing the process; `verify_nodes` tells
    /// where it landed). `None` = kernel default.
    pub fn alloc(bytes: usize, node: Option<u32>) -> io::Result<NodeRegion> {
        Self::alloc_with(bytes, node, MemPolicy::Preferred)
    }

    pub fn alloc_with(
        bytes: usize,
        node: Option<u32>,
        policy: MemPolicy,
    ) -> io::Result<NodeRegion> {
        let page = page_size();
        let mapped = bytes.div_ceil(page).max(1) * page;
        // SAFETY: fresh anonymous private mapping, no address hint.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p as *mut u8).ok_or_else(io::Error::last_os_error)?;
        let binding = match node {
            None => Binding::Unbound("no node requested".into()),
            Some(n) => match mbind(ptr.as_ptr(), mapped, n, policy) {
                Ok(()) => Binding::Bound { node: n, policy },
                Err(e) => Binding::Unbound(format!("mbind to node {n} failed: {e}")),
            },
        };
        // First touch after the policy is set: one write per page.
        for off in (0..mapped).step_by(page) {
            // SAFETY: off < mapped, inside our writable mapping.
            unsafe { ptr.as_ptr().add(off).write_volatile(0) };
        }
        Ok(NodeRegion {
            ptr,
            len: bytes,
            mapped,
            binding,
        })
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Requested length (the mapping is rounded up to whole pages).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: len <= mapped bytes, initialised (anonymous memory is zero).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    pub fn binding(&self) -> &Binding {
        &self.binding
    }

    /// Where the pages really are: (node, pages) pairs from move_pages(2)
    /// in query mode (nodes = NULL). Pages the kernel reports an error for
    /// (e.g. -ENOENT, not present) are left out.
    pub fn verify_nodes(&self) -> io::Result<Vec<(u32, usize)>> {
        let page = page_size();
        let pages: Vec<*mut libc::c_void> = (0..self.mapped)
            .step_by(page)
            // SAFETY: offsets stay within the mapping.
            .map(|off| unsafe { self.ptr.as_ptr().add(off) } as *mut libc::c_void)
            .collect();
        let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
        for chunk in pages.chunks(16 * 1024) {
            let mut status = vec![0 as libc::c_int; chunk.len()];
            // SAFETY: move_pages(pid 0 = self, count, pages, nodes = NULL
            // (query), status, flags 0): reads `chunk`, writes `status`.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_move_pages,
                    0,
                    chunk.len() as libc::c_ulong,
                    chunk.as_ptr(),
                    std::ptr::null::<libc::c_int>(),
                    status.as_mut_ptr(),
                    0,
                )
            };
            if rc < 0 {
                return Err(io::Error::last_os_error());
            }
            for s in status {
                if let Ok(n) = u32::try_from(s) {
                    *counts.entry(n).or_default() += 1;
                }
            }
        }
        Ok(counts.into_iter().collect())
    }
}

impl Drop for NodeRegion {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping we created.
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.mapped) };
    }
}

impl std::fmt::Debug for NodeRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeRegion")
            .field("len", &self.len)
            .field("binding", &self.binding)
            .finish()
    }
}

fn mbind(addr: *mut u8, len: usize, node: u32, policy: MemPolicy) -> io::Result<()> {
    let bits = 8 * std::mem::size_of::<libc::c_ulong>();
    let mut mask = vec![0 as libc::c_ulong; node as usize / bits + 1];
    mask[node as usize / bits] |= 1 << (node as usize % bits);
    let mode = match policy {
        MemPolicy::Bind => MPOL_BIND,
        MemPolicy::Preferred => MPOL_PREFERRED,
    };
    // The kernel reads maxnode - 1 bits (an old off-by-one that libnuma
    // also compensates for), hence the + 1.
    let maxnode = (mask.len() * bits + 1) as libc::c_ulong;
    // SAFETY: addr/len is our own page-aligned mapping; mask outlives the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr as *mut libc::c_void,
            len as libc::c_ulong,
            mode,
            mask.as_ptr(),
            maxnode,
            0 as libc::c_uint,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What placement code needs from the OS, so it runs on fixtures with a fake.
pub trait Placer: Send + Sync {
    fn pin(&self, cpus: &[usize]) -> io::Result<()>;
    fn alloc(&self, bytes: usize, node: Option<u32>) -> io::Result<NodeRegion>;
}

/// The real thing: sched_setaffinity and mbind.
#[derive(Debug, Default, Clone, Copy)]
pub struct OsPlacer;

impl Placer for OsPlacer {
    fn pin(&self, cpus: &[usize]) -> io::Result<()> {
        pin_current_thread(cpus)
    }

    fn alloc(&self, bytes: usize, node: Option<u32>) -> io::Result<NodeRegion> {
        NodeRegion::alloc(bytes, node)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlacerCall {
    Pin(Vec<usize>),
    Alloc { bytes: usize, node: Option<u32> },
}

/// Records calls instead of pinning; allocations are real but unbound (the
/// requested node may not exist here).
#[derive(Debug, Default)]
pub struct FakePlacer {
    calls: Mutex<Vec<PlacerCall>>,
}

impl FakePlacer {
    pub fn calls(&self) -> Vec<PlacerCall> {
        self.calls.lock().unwrap().clone()
    }
}

impl Placer for FakePlacer {
    fn pin(&self, cpus: &[usize]) -> io::Result<()> {
        self.calls
            .lock()
            .unwrap()
            .push(PlacerCall::Pin(cpus.to_vec()));
        Ok(())
    }

    fn alloc(&self, bytes: usize, node: Option<u32>) -> io::Result<NodeRegion> {
        self.calls
            .lock()
            .unwrap()
            .push(PlacerCall::Alloc { bytes, node });
        NodeRegion::alloc(bytes, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_to_each_allowed_cpu_and_restore() {
        let orig = current_affinity();
        assert!(!orig.is_empty());
        // Do it on a scratch thread so the test harness thread keeps its mask.
        std::thread::spawn(move || {
            for &c in &orig {
                pin_current_thread(&[c]).unwrap();
                assert_eq!(current_affinity(), vec![c]);
                // The scheduler must move us there by the next check.
                std::thread::yield_now();
                assert_eq!(current_cpu(), Some(c));
            }
            pin_current_thread(&orig).unwrap();
            assert_eq!(current_affinity(), orig);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn pin_rejects_bad_sets() {
        assert!(pin_current_thread(&[]).is_err());
        assert!(pin_current_thread(&[1 << 20]).is_err());
    }

    #[test]
    fn region_is_page_rounded_zeroed_and_writable() {
        let mut r = NodeRegion::alloc(10_000, None).unwrap();
        assert_eq!(r.len(), 10_000);
        assert_eq!(r.as_ptr() as usize % page_size(), 0);
        assert!(r.as_slice().iter().all(|&b| b == 0));
        r.as_mut_slice().fill(7);
        assert!(r.as_slice().iter().all(|&b| b == 7));
        assert!(matches!(r.binding(), Binding::Unbound(_)));
        let empty = NodeRegion::alloc(0, None).unwrap();
        assert!(empty.is_empty());
    }

    #[test]
    fn mbind_failure_falls_back_and_says_why() {
        // No machine has node 1000: mbind fails (EINVAL), the region is
        // still usable and records why it is unbound.
        let mut r = NodeRegion::alloc_with(3 * page_size(), Some(1000), MemPolicy::Bind).unwrap();
        match r.binding() {
            Binding::Unbound(why) => assert!(why.contains("mbind to node 1000"), "{why}"),
            b => panic!("bound to a missing node: {b:?}"),
        }
        r.as_mut_slice()[0] = 1;
        assert_eq!(r.as_slice()[0], 1);
    }

    #[test]
    fn fake_placer_records() {
        let f = FakePlacer::default();
        f.pin(&[8, 9]).unwrap();
        let r = f.alloc(4096, Some(3)).unwrap();
        assert_eq!(r.len(), 4096);
        assert_eq!(
            f.calls(),
            vec![
                PlacerCall::Pin(vec![8, 9]),
                PlacerCall::Alloc {
                    bytes: 4096,
                    node: Some(3)
                }
            ]
        );
    }
}
