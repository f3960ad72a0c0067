//! Time as a transport sees it (issue 37): the real clock, or a simulated
//! one that a test advances by hand, so waits measured on the links pass
//! in microseconds: read timeouts of in-memory links (transport::mem), the
//! relink budget and back-off (crate::session::relink). Only those waits ask it;
//! the data path never does.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The real clock (default), or a simulated one shared by its clones.
#[derive(Clone, Default)]
pub struct Clock(Option<Arc<Sim>>);

struct Sim {
    base: Instant,
    /// Time advanced so far.
    now: Mutex<Duration>,
    advanced: Condvar,
    /// Threads now in a wait measured on this clock: a test advances time
    /// only once the wait it means has begun (else the wait's deadline is
    /// taken from the advanced time and never comes).
    waiting: AtomicUsize,
}

/// How often a wait on simulated time looks at the clock again: waits on
/// other conditions (a pipe's data) are not woken by [`Clock::advance`].
const SIM_POLL: Duration = Duration::from_millis(1);

impl Clock {
    /// A simulated clock standing still until [`Self::advance`].
    pub fn simulated() -> Clock {
        Clock(Some(Arc::new(Sim {
            base: Instant::now(),
            now: Mutex::new(Duration::ZERO),
            advanced: Condvar::new(),
            waiting: AtomicUsize::new(0),
        })))
    }

    pub fn is_simulated(&self) -> bool {
        self.0.is_some()
    }

    pub fn now(&self) -> Instant {
        match &self.0 {
            None => Instant::now(),
            Some(s) => s.base + *s.now.lock().unwrap(),
        }
    }

    /// Time since `t` (an instant of this clock).
    pub fn since(&self, t: Instant) -> Duration {
        self.now().saturating_duration_since(t)
    }

    /// Sleep `d`: really, or until simulated time has moved on by `d`.
    pub fn sleep(&self, d: Duration) {
        let Some(s) = &self.0 else {
            return std::thread::sleep(d);
        };
        let mut now = s.now.lock().unwrap();
        let until = *now + d;
        s.waiting.fetch_add(1, Relaxed);
        while *now < until {
            now = s.advanced.wait(now).unwrap();
        }
        s.waiting.fetch_sub(1, Relaxed);
    }

    /// Move simulated time on by `d` (ignored by the real clock).
    pub fn advance(&self, d: Duration) {
        if let Some(s) = &self.0 {
            *s.now.lock().unwrap() += d;
            s.advanced.notify_all();
        }
    }

    /// [`Self::advance`] once some thread is waiting on this clock's time
    /// (a sleep, or a wait with a deadline): the wait a test means to end
    /// has taken its deadline from the time before the advance, however
    /// late the machine ran that thread. Returns at once on the real clock.
    pub fn advance_once_waited(&self, d: Duration) {
        let Some(s) = &self.0 else { return };
        while s.waiting.load(Relaxed) == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
        self.advance(d);
    }

    /// Wait on `cv` (guarding `g`) until notified or until `deadline` of
    /// this clock has passed; true if it has. Spurious wake-ups return
    /// false: callers loop on their condition.
    pub fn wait_until<'a, T>(
        &self,
        cv: &Condvar,
        g: MutexGuard<'a, T>,
        deadline: Option<Instant>,
    ) -> (MutexGuard<'a, T>, bool) {
        let Some(deadline) = deadline else {
            return (cv.wait(g).unwrap(), false);
        };
        let left = deadline.saturating_duration_since(self.now());
        if left.is_zero() {
            return (g, true);
        }
        let Some(s) = &self.0 else {
            let g = cv.wait_timeout(g, left).unwrap().0;
            return (g, Instant::now() >= deadline);
        };
        s.waiting.fetch_add(1, Relaxed);
        let g = cv.wait_timeout(g, SIM_POLL).unwrap().0;
        s.waiting.fetch_sub(1, Relaxed);
        let passed = self.now() >= deadline;
        (g, passed)
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            None => f.write_str("Clock::Real"),
            Some(s) => write!(f, "Clock::Simulated(+{:?})", *s.now.lock().unwrap()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulated_time_moves_only_when_advanced() {
        let c = Clock::simulated();
        let t0 = c.now();
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(c.since(t0), Duration::ZERO);
        let c2 = c.clone();
        let sleeper = std::thread::spawn(move || c2.sleep(Duration::from_secs(30)));
        // Only once the sleeper waits: a sleeper the machine started late
        // would count its 30 s from the advanced time (and never wake).
        c.advance_once_waited(Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(20));
        assert!(!sleeper.is_finished());
        c.advance(Duration::from_secs(25));
        sleeper.join().unwrap();
        assert_eq!(c.since(t0), Duration::from_secs(35));
    }

    #[test]
    fn a_wait_ends_at_its_deadline_in_clock_time() {
        let c = Clock::simulated();
        let (m, cv) = (Mutex::new(()), Condvar::new());
        let deadline = Some(c.now() + Duration::from_secs(60));
        let (g, passed) = c.wait_until(&cv, m.lock().unwrap(), deadline);
        assert!(!passed, "a minute passed in a millisecond");
        drop(g);
        c.advance(Duration::from_secs(61));
        assert!(c.wait_until(&cv, m.lock().unwrap(), deadline).1);
        // The real clock waits really.
        let r = Clock::default();
        let t = Instant::now();
        let soon = Some(r.now() + Duration::from_millis(20));
        let mut g = m.lock().unwrap();
        loop {
            let (g2, passed) = r.wait_until(&cv, g, soon);
            g = g2;
            if passed {
                break;
            }
        }
        assert!(t.elapsed() >= Duration::from_millis(20));
    }
}
