//! Copy offload (seed 003 ~1155-1292, MCNI; issue 19): one copy thread
//! serves memory copies that application threads post to it, so that the
//! application's core is free while a large copy runs on another one.
//!
//! Each client has a single-producer/single-consumer request ring and a
//! completion ring (`rtrb`) shared with the copy thread only: no lock and
//! no allocation per request. A request is `(src, dst, len)`; the copy
//! thread serves each client's ring in order and posts one completion per
//! request, so completions arrive in request order. The requester spins
//! briefly on its completion ring, then parks; the copy thread unparks it.
//! When every ring is empty the copy thread parks too, and a client that
//! posts to a sleeping copy thread wakes it (an atomic flag, so a busy copy
//! thread costs no syscall per request).
//!
//! The seed's caveat holds: the copy thread needs a core of its own. When
//! every core is busy it only adds a hand-off (and a wake-up) per batch; see
//! docs/SITE.md for the measurement on this machine.
//!
//! Safety model: a [`Copy`] holds raw pointers. [`Client::copy_all`] is the
//! only way to submit them and it returns only after the copy thread posted
//! the completion of every request it submitted, so the buffers (borrowed
//! for the duration of the call by whoever built the `Copy`s) outlive every
//! use the copy thread makes of them. `Copy::new` is `unsafe` because the
//! constructor cannot check that the ranges are valid and disjoint.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, JoinHandle, Thread};
use std::time::Duration;

/// Requests one client may have posted and not yet seen completed.
pub const RING: usize = 128;

/// Calls copying fewer bytes than this are done on the caller's thread:
/// below it the hand-off costs more than the copy (a few µs against ~1 µs
/// per 16 KiB at memory bandwidth).
pub const MIN_BYTES: usize = 16 * 1024;

/// Process-wide counters (the daemon's `/metrics` and `status`): copies
/// done on the copy thread and their bytes, and fallbacks: copies of a
/// channel using the offload that stayed on the caller's thread (below
/// [`MIN_BYTES`]). Added once per batch or call, not per copy.
static COPIES: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
static FALLBACKS: AtomicU64 = AtomicU64::new(0);
static FALLBACK_BYTES: AtomicU64 = AtomicU64::new(0);

/// The copy offload's counters since the process started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Copies done on the copy thread, and their bytes.
    pub copies: u64,
    pub bytes: u64,
    /// Copies done inline on a channel that uses the offload (too small
    /// for the hand-off), and their bytes.
    pub fallbacks: u64,
    pub fallback_bytes: u64,
}

/// Read the counters.
pub fn counters() -> Counters {
    Counters {
        copies: COPIES.load(Ordering::Relaxed),
        bytes: BYTES.load(Ordering::Relaxed),
        fallbacks: FALLBACKS.load(Ordering::Relaxed),
        fallback_bytes: FALLBACK_BYTES.load(Ordering::Relaxed),
    }
}

/// Count one call's inline copies on an offloading channel.
pub(crate) fn count_fallback(bytes: usize) {
    if bytes > 0 {
        FALLBACKS.fetch_add(1, Ordering::Relaxed);
        FALLBACK_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

/// Spins on an empty ring before parking (client and copy thread alike).
const SPINS: u32 = 2_000;

/// One copy request: `len` bytes from `src` to `dst`.
#[derive(Clone, Copy, Debug)]
pub struct Copy {
    src: *const u8,
    dst: *mut u8,
    len: usize,
}

// SAFETY: a `Copy` is only dereferenced by the copy thread while the
// submitting thread blocks in `copy_all` (see the module comment), i.e.
// while the memory it points to is kept alive and untouched by its owner.
unsafe impl Send for Copy {}

impl Copy {
    /// # Safety
    /// `src` must be valid for reads and `dst` for writes of `len` bytes,
    /// the ranges must not overlap, and both must stay valid and unused by
    /// anything else until the `copy_all` call that submits this request
    /// returns.
    pub unsafe fn new(src: *const u8, dst: *mut u8, len: usize) -> Copy {
        Copy { src, dst, len }
    }

    /// # Safety
    /// The contract of [`Copy::new`].
    unsafe fn run(&self) {
        // SAFETY: forwarded from `Copy::new`'s contract.
        unsafe { std::ptr::copy_nonoverlapping(self.src, self.dst, self.len) }
    }

    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The requester's side of a client, shared with the copy thread.
struct Waiter {
    parked: AtomicBool,
    thread: Mutex<Option<Thread>>,
}

/// The copy thread's side of a client.
struct Served {
    req: rtrb::Consumer<Copy>,
    done: rtrb::Producer<()>,
    waiter: Arc<Waiter>,
}

struct Shared {
    stop: AtomicBool,
    sleeping: AtomicBool,
    joined: Mutex<Vec<Served>>,
    any_joined: AtomicBool,
    thread: OnceLock<Thread>,
}

impl Shared {
    fn wake(&self) {
        if self.sleeping.swap(false, Ordering::SeqCst) {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }
}

/// A copy thread. Dropping it stops the thread once every client is gone.
pub struct Offload {
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
}

impl Offload {
    /// Start the copy thread, pinned to `cpus` (None: it inherits the
    /// caller's CPU set, which is how the raw channels place it on the
    /// NIC's node: see docs/TYCHE.md "Placement").
    pub fn spawn(cpus: Option<&[usize]>) -> std::io::Result<Offload> {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            joined: Mutex::new(Vec::new()),
            any_joined: AtomicBool::new(false),
            thread: OnceLock::new(),
        });
        let cpus = cpus.map(|c| c.to_vec());
        let s2 = shared.clone();
        let handle = thread::Builder::new()
            .name("copy-offload".into())
            .spawn(move || {
                if let Some(cpus) = cpus {
                    if let Err(e) = pin(&cpus) {
                        tracing::warn!("copy offload: not pinned to {cpus:?}: {e}");
                    }
                }
                copy_loop(&s2)
            })?;
        let _ = shared.thread.set(handle.thread().clone());
        Ok(Offload {
            shared,
            handle: Some(handle),
        })
    }

    /// A new client with its own request and completion rings.
    pub fn client(&self) -> Client {
        let (req_tx, req_rx) = rtrb::RingBuffer::new(RING);
        let (done_tx, done_rx) = rtrb::RingBuffer::new(RING);
        let waiter = Arc::new(Waiter {
            parked: AtomicBool::new(false),
            thread: Mutex::new(None),
        });
        self.shared
            .joined
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Served {
                req: req_rx,
                done: done_tx,
                waiter: waiter.clone(),
            });
        self.shared.any_joined.store(true, Ordering::SeqCst);
        Client {
            req: req_tx,
            done: done_rx,
            waiter,
            shared: self.shared.clone(),
        }
    }
}

impl Drop for Offload {
    /// Stops the copy thread after the last client is dropped (a client's
    /// requests are always served, so no requester is left blocked).
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.shared.thread.get() {
            t.unpark();
        }
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// One requester's rings. Not `Sync`: one thread at a time submits (the
/// raw endpoint's mutex guarantees it for channels).
pub struct Client {
    req: rtrb::Producer<Copy>,
    done: rtrb::Consumer<()>,
    waiter: Arc<Waiter>,
    shared: Arc<Shared>,
}

impl Client {
    /// Run every copy in `batch` on the copy thread and return when all are
    /// done. Batches longer than the ring are fed as completions free room.
    pub fn copy_all(&mut self, batch: &[Copy]) {
        let mut posted = 0;
        let mut completed = 0;
        while completed < batch.len() {
            while posted < batch.len() && self.req.push(batch[posted]).is_ok() {
                posted += 1;
            }
            self.shared.wake();
            completed += self.wait_some();
        }
        COPIES.fetch_add(batch.len() as u64, Ordering::Relaxed);
        let bytes: usize = batch.iter().map(|c| c.len).sum();
        BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Wait for at least one completion; returns how many were taken.
    fn wait_some(&mut self) -> usize {
        let mut spins = 0;
        loop {
            let n = self.done.slots();
            if n > 0 {
                if let Ok(chunk) = self.done.read_chunk(n) {
                    chunk.commit_all();
                }
                return n;
            }
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            // Park: publish who to wake, then re-check before sleeping (the
            // copy thread checks `parked` after posting a completion).
            {
                let mut t = self.waiter.thread.lock().unwrap_or_else(|p| p.into_inner());
                let me = thread::current();
                if t.as_ref().map(|t| t.id()) != Some(me.id()) {
                    *t = Some(me);
                }
            }
            self.waiter.parked.store(true, Ordering::SeqCst);
            if self.done.slots() == 0 {
                // Timeout: a safety net only, the unpark is the wake-up.
                thread::park_timeout(Duration::from_millis(10));
            }
            self.waiter.parked.store(false, Ordering::SeqCst);
            self.shared.wake();
        }
    }
}

fn copy_loop(shared: &Shared) {
    let mut clients: Vec<Served> = Vec::new();
    let mut idle = 0u32;
    loop {
        if shared.any_joined.swap(false, Ordering::SeqCst) {
            clients.append(&mut shared.joined.lock().unwrap_or_else(|p| p.into_inner()));
        }
        let mut worked = false;
        for c in &mut clients {
            // Never more requests than completion room: the completion ring
            // has the same size as the request ring, and the client takes
            // completions before posting more than it has room for.
            while c.done.slots() > 0 {
                let Ok(r) = c.req.pop() else { break };
                // SAFETY: see `Copy::new`; the requester blocks in
                // `copy_all` until the completion below is posted.
                unsafe { r.run() };
                let _ = c.done.push(());
                worked = true;
            }
            if worked && c.waiter.parked.load(Ordering::SeqCst) {
                if let Some(t) = c
                    .waiter
                    .thread
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_ref()
                {
                    t.unpark();
                }
            }
        }
        // A dropped client leaves nothing in flight (copy_all returned).
        clients.retain(|c| !c.req.is_abandoned() || !c.req.is_empty());
        if worked {
            idle = 0;
            continue;
        }
        if shared.stop.load(Ordering::SeqCst)
            && clients.is_empty()
            && shared
                .joined
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty()
        {
            return;
        }
        if idle < SPINS {
            idle += 1;
            std::hint::spin_loop();
            continue;
        }
        shared.sleeping.store(true, Ordering::SeqCst);
        if clients.iter().all(|c| c.req.is_empty()) && !shared.any_joined.load(Ordering::SeqCst) {
            thread::park_timeout(Duration::from_millis(50));
        }
        shared.sleeping.store(false, Ordering::SeqCst);
        idle = 0;
    }
}

fn pin(cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET stays within its bounds for
    // ids below CPU_SETSIZE, checked here.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            if c < libc::CPU_SETSIZE as usize {
                libc::CPU_SET(c, &mut set);
            }
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// `--copy-offload` / `RAMSYS_COPY_OFFLOAD`: on, off, or auto (on only
/// when this process may run on at least 4 CPUs, so that the copy thread
/// can have a core of its own; on 2 busy cores it measured slower and
/// costlier, docs/SITE.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    On,
    Off,
    Auto,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "on" => Ok(Mode::On),
            "off" => Ok(Mode::Off),
            "auto" => Ok(Mode::Auto),
            _ => Err(format!("copy offload: {s:?} is not on, off or auto")),
        }
    }
}

impl Mode {
    fn resolve(self) -> bool {
        match self {
            Mode::On => true,
            Mode::Off => false,
            Mode::Auto => thread::available_parallelism().map_or(1, |n| n.get()) >= 4,
        }
    }
}

/// 0: not set by a flag; else 1 + on.
static FLAG: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// The `--copy-offload` flag: overrides the environment for the channels
/// opened from now on.
pub fn set_mode(m: Mode) {
    FLAG.store(1 + m.resolve() as u8, Ordering::SeqCst);
}

/// Whether raw channels opened now use the copy offload: the flag if one
/// was given, else env `RAMSYS_COPY_OFFLOAD` = on|off|auto (default auto).
pub fn enabled() -> bool {
    match FLAG.load(Ordering::SeqCst) {
        0 => {}
        f => return f == 2,
    }
    static ENV: OnceLock<bool> = OnceLock::new();
    *ENV.get_or_init(|| {
        let v = std::env::var("RAMSYS_COPY_OFFLOAD").unwrap_or_default();
        if v.is_empty() {
            return Mode::Auto.resolve();
        }
        v.parse::<Mode>()
            .unwrap_or_else(|e| {
                tracing::warn!("RAMSYS_COPY_OFFLOAD: {e}; using auto");
                Mode::Auto
            })
            .resolve()
    })
}

/// The process's copy thread, started by the first caller (a raw channel's
/// setup, on a thread pinned to the NIC's node, so it inherits that CPU
/// set). None if the thread cannot be started (copies then stay inline).
pub fn global() -> Option<&'static Offload> {
    static G: OnceLock<Option<Offload>> = OnceLock::new();
    G.get_or_init(|| match Offload::spawn(None) {
        Ok(o) => Some(o),
        Err(e) => {
            tracing::warn!("copy offload: no copy thread: {e}");
            None
        }
    })
    .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copies(src: &[Vec<u8>], dst: &mut [Vec<u8>]) -> Vec<Copy> {
        src.iter()
            .zip(dst.iter_mut())
            // SAFETY: distinct vectors of equal length, alive and untouched
            // until copy_all returns.
            .map(|(s, d)| unsafe { Copy::new(s.as_ptr(), d.as_mut_ptr(), s.len()) })
            .collect()
    }

    #[test]
    fn copies_are_correct_under_concurrency() {
        let off = Offload::spawn(None).unwrap();
        thread::scope(|sc| {
            for t in 0..4u8 {
                let mut c = off.client();
                sc.spawn(move || {
                    for round in 0..50u32 {
                        // More requests than the ring holds: exercises refill.
                        let src: Vec<Vec<u8>> = (0..RING + 37)
                            .map(|i| {
                                (0..1000 + i)
                                    .map(|j| (j as u32 ^ round ^ (t as u32 * 7)) as u8)
                                    .collect()
                            })
                            .collect();
                        let mut dst: Vec<Vec<u8>> = src.iter().map(|s| vec![0; s.len()]).collect();
                        let batch = copies(&src, &mut dst);
                        c.copy_all(&batch);
                        assert_eq!(src, dst, "thread {t} round {round}");
                    }
                });
            }
        });
    }

    #[test]
    fn mode_parses_and_the_flag_overrides() {
        assert_eq!("on".parse::<Mode>(), Ok(Mode::On));
        assert_eq!("off".parse::<Mode>(), Ok(Mode::Off));
        assert_eq!("auto".parse::<Mode>(), Ok(Mode::Auto));
        assert!("yes".parse::<Mode>().is_err());
        set_mode(Mode::On);
        assert!(enabled());
        set_mode(Mode::Off);
        assert!(!enabled());
    }

    #[test]
    fn completions_follow_request_order() {
        // Every request writes the same destination: the result is the last
        // request's source only if the copies ran in request order.
        let off = Offload::spawn(None).unwrap();
        let mut c = off.client();
        let srcs: Vec<Vec<u8>> = (0..300u32).map(|i| vec![i as u8; 4096]).collect();
        let mut dst = vec![0u8; 4096];
        let batch: Vec<Copy> = srcs
            .iter()
            // SAFETY: sources and destination live until copy_all returns.
            .map(|s| unsafe { Copy::new(s.as_ptr(), dst.as_mut_ptr(), s.len()) })
            .collect();
        c.copy_all(&batch);
        assert_eq!(dst, vec![(299u32) as u8; 4096]);
    }

    #[test]
    fn client_wakes_parked_copy_thread_and_shutdown_waits_for_clients() {
        let off = Offload::spawn(None).unwrap();
        let mut c = off.client();
        // Let the copy thread go to sleep, then post.
        thread::sleep(Duration::from_millis(100));
        let src = vec![7u8; 64 * 1024];
        let mut dst = vec![0u8; 64 * 1024];
        // SAFETY: both live until copy_all returns.
        c.copy_all(&[unsafe { Copy::new(src.as_ptr(), dst.as_mut_ptr(), src.len()) }]);
        assert_eq!(src, dst);
        // Shutdown with a live client on another thread: the drop returns
        // only once that client is dropped, after its last copy was served.
        let done = Arc::new(AtomicBool::new(false));
        let d2 = done.clone();
        let h = thread::spawn(move || {
            thread::sleep(Duration::from_millis(100));
            let mut dst = vec![0u8; 64 * 1024];
            // SAFETY: both live until copy_all returns.
            c.copy_all(&[unsafe { Copy::new(src.as_ptr(), dst.as_mut_ptr(), src.len()) }]);
            assert_eq!(src, dst);
            d2.store(true, Ordering::SeqCst);
        });
        drop(off);
        assert!(
            done.load(Ordering::SeqCst),
            "copy thread stopped before its client was done"
        );
        h.join().unwrap();
    }
}
