//! Pre-allocated I/O thread pools (seed 000 sec. 6.1.2 and 6.2.1).
//!
//! Threads are spawned once, optionally pinned to the CPUs of the device's
//! NUMA node, and park on their own job channel when idle (the seed's
//! "self-suspendable" I/O threads). A session reserves workers, hands each
//! one job, and the worker returns itself to the pool when the job ends, so
//! no thread is created or destroyed per transfer.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};

/// Work handed to a reserved thread.
pub type Job = Box<dyn FnOnce() + Send + 'static>;

struct Worker {
    tx: Sender<(Job, Sender<Result<(), String>>)>,
}

struct Shared {
    idle: Mutex<Vec<Worker>>,
    cv: Condvar,
    /// CPUs the pool's threads were seen running on (for --explain).
    observed: Mutex<std::collections::BTreeSet<usize>>,
}

/// A pool of pre-spawned threads for one role on one device.
pub struct ThreadPool {
    name: String,
    size: usize,
    cpus: Vec<usize>,
    shared: Arc<Shared>,
}

/// Pin the calling thread to `cpus` (no-op for an empty list).
pub fn pin_current_thread(cpus: &[usize]) -> std::io::Result<()> {
    if cpus.is_empty() {
        return Ok(());
    }
    // SAFETY: cpu_set_t is plain data; CPU_SET writes within it.
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

/// CPUs the calling thread may run on.
pub fn current_affinity() -> Vec<usize> {
    // SAFETY: as above.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

impl ThreadPool {
    /// Spawn `size` threads named `name-N`, pinned to `cpus` if non-empty.
    pub fn new(name: &str, size: usize, cpus: Vec<usize>) -> std::io::Result<Arc<Self>> {
        let shared = Arc::new(Shared {
            idle: Mutex::new(Vec::with_capacity(size)),
            cv: Condvar::new(),
            observed: Mutex::new(Default::default()),
        });
        for id in 0..size {
            let (tx, rx) = bounded::<(Job, Sender<Result<(), String>>)>(1);
            let sh = shared.clone();
            let cpus2 = cpus.clone();
            let me_tx = tx.clone();
            std::thread::Builder::new()
                .name(format!("{name}-{id}"))
                .spawn(move || worker_loop(rx, me_tx, sh, cpus2))?;
            shared.idle.lock().unwrap().push(Worker { tx });
        }
        Ok(Arc::new(ThreadPool {
            name: name.to_string(),
            size,
            cpus,
            shared,
        }))
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn size(&self) -> usize {
        self.size
    }
    /// CPUs the pool's threads are pinned to (empty = not pinned).
    pub fn cpus(&self) -> &[usize] {
        &self.cpus
    }
    /// CPUs this pool's threads were seen on at the end of their jobs.
    pub fn observed_cpus(&self) -> Vec<usize> {
        self.shared
            .observed
            .lock()
            .unwrap()
            .iter()
            .copied()
            .collect()
    }

    /// Run `job` on a new thread outside the pool, pinned like the pool's
    /// threads and counted in its observed CPUs. For rare extra work of the
    /// pool's role, such as the thread of a replacement data link (crate
    /// ramsys-engine relink), which must not wait for a pooled thread that a
    /// running session holds, but should still run next to its device.
    pub fn spawn_extra(
        &self,
        name: String,
        job: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let (cpus, shared) = (self.cpus.clone(), self.shared.clone());
        std::thread::Builder::new().name(name).spawn(move || {
            if let Err(e) = pin_current_thread(&cpus) {
                tracing::warn!("cannot pin I/O thread to {cpus:?}: {e}");
            }
            job();
            // SAFETY: sched_getcpu has no preconditions.
            let cpu = unsafe { libc::sched_getcpu() };
            if cpu >= 0 {
                shared.observed.lock().unwrap().insert(cpu as usize);
            }
        })
    }

    /// Threads idle right now.
    pub fn idle(&self) -> usize {
        self.shared.idle.lock().unwrap().len()
    }

    /// Reserve between `min` and `max` threads, waiting up to `wait` for
    /// `min` to be idle. All-or-nothing below `min`, so two sessions that
    /// each hold part of what they need cannot deadlock each other.
    pub fn reserve(
        self: &Arc<Self>,
        min: usize,
        max: usize,
        wait: Duration,
    ) -> Option<Reservation> {
        let deadline = Instant::now() + wait;
        let mut idle = self.shared.idle.lock().unwrap();
        loop {
            if idle.len() >= min.max(1) || (min == 0 && !idle.is_empty()) {
                let n = idle.len().min(max);
                let at = idle.len() - n;
                let workers = idle.split_off(at);
                return Some(Reservation {
                    pool: self.clone(),
                    workers,
                    handles: 0,
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            idle = self.shared.cv.wait_timeout(idle, deadline - now).unwrap().0;
        }
    }
}

fn worker_loop(
    rx: Receiver<(Job, Sender<Result<(), String>>)>,
    me: Sender<(Job, Sender<Result<(), String>>)>,
    shared: Arc<Shared>,
    cpus: Vec<usize>,
) {
    if let Err(e) = pin_current_thread(&cpus) {
        tracing::warn!("cannot pin I/O thread to {cpus:?}: {e}");
    }
    while let Ok((job, done)) = rx.recv() {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).map_err(|p| {
            p.downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "I/O thread panicked".into())
        });
        // SAFETY: sched_getcpu has no preconditions.
        let cpu = unsafe { libc::sched_getcpu() };
        if cpu >= 0 {
            shared.observed.lock().unwrap().insert(cpu as usize);
        }
        // Back to the pool before reporting, so the next reservation that
        // the completion triggers finds this thread idle.
        shared.idle.lock().unwrap().push(Worker { tx: me.clone() });
        shared.cv.notify_all();
        let _ = done.send(r);
    }
}

/// Threads reserved by one session.
pub struct Reservation {
    pool: Arc<ThreadPool>,
    workers: Vec<Worker>,
    handles: usize,
}

/// Completion of one job.
pub struct JobHandle {
    rx: Receiver<Result<(), String>>,
}

impl JobHandle {
    /// Wait for the job; Err carries a panic message.
    pub fn join(self) -> Result<(), String> {
        self.rx
            .recv()
            .unwrap_or_else(|_| Err("I/O thread vanished".into()))
    }
}

impl Reservation {
    /// Threads still unused in this reservation.
    pub fn len(&self) -> usize {
        self.workers.len()
    }
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }
    pub fn pool(&self) -> &Arc<ThreadPool> {
        &self.pool
    }
    /// Jobs started from this reservation.
    pub fn started(&self) -> usize {
        self.handles
    }

    /// Run `job` on one reserved thread. Panics if none is left.
    pub fn spawn(&mut self, job: impl FnOnce() + Send + 'static) -> JobHandle {
        let w = self.workers.pop().expect("spawn beyond reservation");
        let (dtx, drx) = bounded(1);
        w.tx.send((Box::new(job), dtx))
            .expect("worker thread alive");
        self.handles += 1;
        JobHandle { rx: drx }
    }

    /// Take up to `n` more threads that are idle right now, never
    /// waiting; returns how many were added.
    pub fn grow(&mut self, n: usize) -> usize {
        let mut idle = self.pool.shared.idle.lock().unwrap();
        let k = n.min(idle.len());
        let at = idle.len() - k;
        self.workers.extend(idle.drain(at..));
        k
    }

    /// Give back threads that were reserved but not used (the source's
    /// "relinquish the rest" step of seed 000 Fig. 6-4a).
    pub fn release_unused(&mut self) {
        let mut idle = self.pool.shared.idle.lock().unwrap();
        idle.append(&mut self.workers);
        self.pool.shared.cv.notify_all();
    }

    /// Keep at most `n` unused threads, returning the rest.
    pub fn shrink_to(&mut self, n: usize) {
        if self.workers.len() > n {
            let extra = self.workers.split_off(n);
            let mut idle = self.pool.shared.idle.lock().unwrap();
            idle.extend(extra);
            self.pool.shared.cv.notify_all();
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.release_unused();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn extra_threads_run_pinned_like_the_pool() {
        // Pinned to CPU 0, which every machine has; verified from inside.
        let p = ThreadPool::new("x", 1, vec![0]).unwrap();
        let h = p
            .spawn_extra("x-extra".into(), || {
                assert_eq!(current_affinity(), vec![0]);
                assert_eq!(std::thread::current().name(), Some("x-extra"));
            })
            .unwrap();
        h.join().unwrap();
        assert_eq!(p.observed_cpus(), vec![0]);
        assert_eq!(p.idle(), 1, "the pool's own thread is untouched");
    }

    #[test]
    fn a_reservation_grows_only_by_idle_threads() {
        let p = ThreadPool::new("g", 3, vec![]).unwrap();
        let mut a = p.reserve(1, 1, Duration::ZERO).unwrap();
        let b = p.reserve(1, 1, Duration::ZERO).unwrap();
        assert_eq!(a.grow(5), 1, "one thread idle");
        assert_eq!((a.len(), p.idle()), (2, 0));
        assert_eq!(a.grow(1), 0);
        drop(b);
        drop(a);
        assert_eq!(p.idle(), 3);
    }

    #[test]
    fn threads_are_reused_and_returned() {
        let p = ThreadPool::new("t", 3, vec![]).unwrap();
        assert_eq!(p.idle(), 3);
        let hits = Arc::new(AtomicUsize::new(0));
        let mut r = p.reserve(2, 2, Duration::from_secs(1)).unwrap();
        assert_eq!(p.idle(), 1);
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let h = hits.clone();
                r.spawn(move || {
                    h.fetch_add(1, Ordering::SeqCst);
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        drop(r);
        assert_eq!(hits.load(Ordering::SeqCst), 2);
        assert_eq!(p.idle(), 3);
    }

    #[test]
    fn reservation_waits_for_min_then_times_out() {
        let p = ThreadPool::new("w", 2, vec![]).unwrap();
        let r = p.reserve(2, 2, Duration::from_millis(10)).unwrap();
        assert!(p.reserve(1, 1, Duration::from_millis(20)).is_none());
        drop(r);
        assert!(p.reserve(2, 2, Duration::from_millis(20)).is_some());
    }

    #[test]
    fn panicking_job_reports_and_thread_survives() {
        let p = ThreadPool::new("p", 1, vec![]).unwrap();
        let mut r = p.reserve(1, 1, Duration::from_secs(1)).unwrap();
        let e = r.spawn(|| panic!("boom")).join().unwrap_err();
        assert!(e.contains("boom"));
        drop(r);
        let mut r = p.reserve(1, 1, Duration::from_secs(1)).unwrap();
        r.spawn(|| {}).join().unwrap();
    }

    #[test]
    fn pinning_runs_here() {
        let cpus = current_affinity();
        assert!(!cpus.is_empty());
        let p = ThreadPool::new("pin", 1, vec![cpus[0]]).unwrap();
        let mut r = p.reserve(1, 1, Duration::from_secs(1)).unwrap();
        let (tx, rx) = bounded(1);
        r.spawn(move || tx.send(current_affinity()).unwrap())
            .join()
            .unwrap();
        assert_eq!(rx.recv().unwrap(), vec![cpus[0]]);
    }
}
