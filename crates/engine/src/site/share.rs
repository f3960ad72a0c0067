//! Storage thread budgets shared over a site (issue 19; seed 000 ch. 5
//! Eq. 5.4-5.5 and Fig. 6-3 read per site instead of per daemon). Free
//! of I/O: the daemon (daemon::admit) feeds it its own tasks and the site
//! view, and sets each task's [`ThreadGate`] from the result.
//!
//! Daemons of a site that write (or read) the same shared storage, e.g.
//! three daemons striping onto one NFS or Lustre export, would each run
//! the full writer count against it: three times the concurrency the
//! device was sized for. Instead each member publishes, per shared device
//! in use (its [`StorageUse`]: the device's identity, its tasks there and
//! the storage threads they hold), and every member splits the device's
//! budget (the threads one daemon alone would run on it) over the members
//! using it, in proportion to their tasks, by the same deterministic rule,
//! so the members agree on the split without talking about it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvError, TryRecvError};
use serde::{Deserialize, Serialize};

/// Shared devices a member publishes at most (the load segment is small).
pub const MAX_PUBLISHED: usize = 8;

/// One shared storage device in use by a member (in its `load` segment).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageUse {
    /// The device's identity (site::storage: a hash of the file system's
    /// mount source and type, the same on every host that mounts it).
    pub id: u64,
    /// Tasks of the member holding storage threads on it.
    pub tasks: u16,
    /// Storage threads those tasks hold (granted, before the share).
    pub threads: u16,
}

/// One claimant on a budget: a member of the site (key: its address) or
/// a task of this daemon (key: its id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// Breaks ties; every member orders claims the same way.
    pub key: String,
    /// Tasks behind the claim (the split is proportional to it).
    pub weight: u32,
    /// Threads the claimant could use at most.
    pub want: u32,
}

/// Split `budget` threads over `claims`: every claim with a weight and a
/// want gets at least one thread (a task with none would stall), none gets
/// more than it wants, and the rest goes by the Sainte-Laguë highest
/// averages rule (seat after seat to the highest weight / (2 seats + 1),
/// ties to the smaller key): proportional to the weights, and the same
/// result whatever order the claims come in. Work-conserving: the seats
/// handed out are min(max(budget, claimants), total want).
pub fn split(budget: u32, claims: &[Claim]) -> Vec<u32> {
    let mut seats: Vec<u32> = claims
        .iter()
        .map(|c| u32::from(c.weight > 0 && c.want > 0))
        .collect();
    let mut left = budget.saturating_sub(seats.iter().sum());
    while left > 0 {
        let mut best: Option<usize> = None;
        for (i, c) in claims.iter().enumerate() {
            if seats[i] == 0 || seats[i] >= c.want {
                continue;
            }
            let better = match best {
                None => true,
                Some(b) => {
                    // weight_i / (2 s_i + 1) vs weight_b / (2 s_b + 1).
                    let l = u64::from(c.weight) * (2 * u64::from(seats[b]) + 1);
                    let r = u64::from(claims[b].weight) * (2 * u64::from(seats[i]) + 1);
                    l > r || (l == r && c.key < claims[b].key)
                }
            };
            if better {
                best = Some(i);
            }
        }
        let Some(b) = best else { break };
        seats[b] += 1;
        left -= 1;
    }
    seats
}

/// This member's threads on one shared device: `budget` split between
/// its own claim (`me`) and the peers' (fresh members using the device).
/// A member alone on the device gets the whole budget (capped by its want).
pub fn member_share(budget: u32, me: &Claim, peers: &[Claim]) -> u32 {
    let mut all = Vec::with_capacity(peers.len() + 1);
    all.push(me.clone());
    all.extend(peers.iter().filter(|p| p.key != me.key).cloned());
    split(budget, &all)[0]
}

/// A limit on how many of a task's storage threads run at once, set from
/// the site share and read by each thread before it takes work: one
/// relaxed load per block on the hot path, no lock. Thread `i` runs while
/// `i < limit`; the others park (polling every 5 ms) until the limit rises
/// or their work ends.
#[derive(Debug)]
pub struct ThreadGate {
    limit: AtomicUsize,
}

impl Default for ThreadGate {
    fn default() -> Self {
        ThreadGate {
            limit: AtomicUsize::new(usize::MAX),
        }
    }
}

const PARK: Duration = Duration::from_millis(5);

impl ThreadGate {
    /// Let `n` threads run (at least one: the task must progress).
    pub fn set(&self, n: usize) {
        self.limit.store(n.max(1), Ordering::Relaxed);
    }

    /// Lift the limit (the task is not sharing a device).
    pub fn open(&self) {
        self.limit.store(usize::MAX, Ordering::Relaxed);
    }

    /// The limit, None when open.
    pub fn limit(&self) -> Option<usize> {
        match self.limit.load(Ordering::Relaxed) {
            usize::MAX => None,
            n => Some(n),
        }
    }

    pub fn admits(&self, i: usize) -> bool {
        i < self.limit.load(Ordering::Relaxed)
    }

    /// Thread `i`'s next item from `rx`: blocks as `rx.recv()` while the
    /// gate admits it; otherwise parks until it does, `abort` is set (then
    /// it takes the next item as usual, so the session ends as before), or
    /// the channel is empty and closed (its work ended while parked).
    pub fn recv<T>(&self, i: usize, rx: &Receiver<T>, abort: &AtomicBool) -> Result<T, RecvError> {
        while !self.admits(i) && !abort.load(Ordering::Relaxed) {
            if rx.is_empty() {
                match rx.try_recv() {
                    Err(TryRecvError::Disconnected) => return Err(RecvError),
                    // Raced with a sender: take it (one item over the limit).
                    Ok(t) => return Ok(t),
                    Err(TryRecvError::Empty) => {}
                }
            }
            std::thread::sleep(PARK);
        }
        rx.recv()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn c(key: &str, weight: u32, want: u32) -> Claim {
        Claim {
            key: key.into(),
            weight,
            want,
        }
    }

    #[test]
    fn three_daemons_on_one_export_share_its_writers() {
        // Each would run 4 writers alone; three striping at once: 4 in all,
        // not 12, and every member keeps at least one.
        let claims = [c("a", 1, 4), c("b", 1, 4), c("c", 1, 4)];
        let s = split(4, &claims);
        assert_eq!(s.iter().sum::<u32>(), 4);
        assert!(s.iter().all(|&n| n >= 1));
        // Ties to the smaller key: a gets the fourth.
        assert_eq!(s, vec![2, 1, 1]);
        // Alone: the whole budget.
        assert_eq!(member_share(4, &c("b", 1, 4), &[]), 4);
        // Two tasks against one: proportional.
        assert_eq!(split(6, &[c("a", 2, 6), c("b", 1, 6)]), vec![4, 2]);
        // Capped by what a member can use; the rest goes to the others.
        assert_eq!(split(8, &[c("a", 1, 1), c("b", 1, 8)]), vec![1, 7]);
        // More members than threads: one each (oversubscribed, none stalls).
        assert_eq!(
            split(2, &[c("a", 1, 4), c("b", 1, 4), c("c", 1, 4)]),
            [1, 1, 1]
        );
        // No tasks, no seat.
        assert_eq!(split(4, &[c("a", 0, 4), c("b", 1, 4)]), vec![0, 4]);
    }

    #[test]
    fn gate_parks_excess_threads_and_lets_them_finish() {
        let g = ThreadGate::default();
        assert_eq!(g.limit(), None);
        g.set(0);
        assert_eq!(g.limit(), Some(1));
        assert!(g.admits(0) && !g.admits(1));
        let (tx, rx) = crossbeam_channel::unbounded::<u32>();
        let abort = AtomicBool::new(false);
        tx.send(7).unwrap();
        // Admitted thread takes work.
        assert_eq!(g.recv(0, &rx, &abort), Ok(7));
        // A parked thread ends when the channel closes empty.
        drop(tx);
        assert_eq!(g.recv(1, &rx, &abort), Err(RecvError));
        // ... and resumes when the limit rises.
        let (tx, rx) = crossbeam_channel::unbounded::<u32>();
        let g = std::sync::Arc::new(g);
        let g2 = g.clone();
        let t = std::thread::spawn(move || {
            let abort = AtomicBool::new(false);
            g2.recv(1, &rx, &abort)
        });
        std::thread::sleep(Duration::from_millis(20));
        g.set(2);
        tx.send(9).unwrap();
        assert_eq!(t.join().unwrap(), Ok(9));
    }

    fn claims() -> impl Strategy<Value = Vec<Claim>> {
        prop::collection::vec((0u32..5, 0u32..10), 0..7).prop_map(|v| {
            v.into_iter()
                .enumerate()
                .map(|(i, (w, want))| c(&format!("m{i}"), w, want))
                .collect()
        })
    }

    proptest! {
        #[test]
        fn split_is_bounded_fair_and_order_free(budget in 0u32..24, cl in claims(), rot in 0usize..7) {
            let s = split(budget, &cl);
            let live = cl.iter().filter(|c| c.weight > 0 && c.want > 0).count() as u32;
            let want: u32 = cl.iter().filter(|c| c.weight > 0).map(|c| c.want).sum();
            // Every live claim runs, none over its want, none without tasks.
            for (c, n) in cl.iter().zip(&s) {
                if c.weight > 0 && c.want > 0 {
                    prop_assert!(*n >= 1 && *n <= c.want);
                } else {
                    prop_assert_eq!(*n, 0);
                }
            }
            // Work-conserving within the budget (or one each if fewer).
            prop_assert_eq!(s.iter().sum::<u32>(), budget.max(live).min(want));
            // Same seats whatever order the claims arrive in (members see
            // the view in different orders).
            let mut r = cl.clone();
            if !r.is_empty() {
                let k = rot % r.len();
                r.rotate_left(k);
                let sr = split(budget, &r);
                for (i, c) in r.iter().enumerate() {
                    let j = cl.iter().position(|x| x.key == c.key).unwrap();
                    prop_assert_eq!(sr[i], s[j]);
                }
            }
            // Every member computes the same split from the same view, so
            // the members' own shares add up to the split.
            let total: u32 = (0..cl.len())
                .map(|i| member_share(budget, &cl[i], &cl))
                .sum();
            prop_assert_eq!(total, s.iter().sum::<u32>());
            // Proportional: a claim with more tasks and room for another
            // seat never has fewer seats than one with fewer tasks.
            for (i, a) in cl.iter().enumerate() {
                for (j, b) in cl.iter().enumerate() {
                    if a.weight > b.weight && s[i] < a.want && b.want > 0 && b.weight > 0 {
                        prop_assert!(s[i] + 1 >= s[j], "{:?} {:?}", cl, s);
                    }
                }
            }
        }
    }
}
