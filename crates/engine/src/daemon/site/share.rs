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

/// Shared devices a member publishes at most (the load segment is small).
pub const MAX_PUBLISHED: usize = 8;

pub use super::storage::StorageUse;

/// What the split reads of a site member: kept to a trait (implemented for
/// the daemon's `SiteMember` in site::redirect) so this rule depends on
/// nothing of the daemon's.
pub trait Member {
    fn addr(&self) -> &str;
    /// Its last update is recent enough to count (site::redirect::fresh).
    fn fresh(&self) -> bool;
    fn storage(&self) -> &[StorageUse];
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

/// One device's split over the site, as this daemon sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceShare {
    /// Members using the device (this daemon included).
    pub members: u32,
    /// Their tasks on it, and the threads those would run alone.
    pub tasks: u32,
    pub threads: u32,
    /// The device's budget: what one task of ours alone runs on it.
    pub budget: u32,
    /// This daemon's share of the budget.
    pub share: u32,
}

/// The whole rule, from (this daemon's plan, the site view) to thread
/// counts: `mine` are our tasks on device `id` with the storage threads
/// each would run alone (the plan's count within the pool), `view` the
/// site (`me` is our address; only fresh members count). Returns the split
/// and each of our tasks' limit, in `mine`'s order; None when no fresh
/// peer uses the device (run as outside a site).
pub fn device_shares<M: Member>(
    me: &str,
    id: u64,
    mine: &[(u64, u32)],
    view: &[M],
) -> Option<(DeviceShare, Vec<u32>)> {
    if mine.is_empty() {
        return None;
    }
    let peers: Vec<Claim> = view
        .iter()
        .filter(|m| m.addr() != me && m.fresh())
        .filter_map(|m| {
            let u = m.storage().iter().find(|u| u.id == id && u.tasks > 0)?;
            Some(Claim {
                key: m.addr().to_string(),
                weight: u32::from(u.tasks),
                want: u32::from(u.threads),
            })
        })
        .collect();
    if peers.is_empty() {
        return None;
    }
    // The threads one daemon alone would run against the device.
    let budget = mine.iter().map(|t| t.1).max().unwrap_or(1).max(1);
    let my = Claim {
        key: me.to_string(),
        weight: mine.len() as u32,
        want: mine.iter().map(|t| t.1).sum(),
    };
    let share = member_share(budget, &my, &peers);
    let per_task: Vec<Claim> = mine
        .iter()
        .map(|(id, n)| Claim {
            key: format!("{id:020}"),
            weight: 1,
            want: *n,
        })
        .collect();
    let d = DeviceShare {
        members: 1 + peers.len() as u32,
        tasks: my.weight + peers.iter().map(|p| p.weight).sum::<u32>(),
        threads: my.want + peers.iter().map(|p| p.want).sum::<u32>(),
        budget,
        share,
    };
    Some((d, split(share, &per_task)))
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
    fn device_shares_from_a_made_up_view() {
        use crate::daemon::site::redirect::member;
        let peer = |addr: &str, id: u64, tasks: u16, age: u64| {
            let mut m = member(addr, 0.0, 1, 1, age);
            m.storage = vec![StorageUse {
                id,
                tasks,
                threads: 4 * tasks,
            }];
            m
        };
        let me = member("b:1", 0.0, 1, 1, 0);
        // Alone (no peer on the device, a stale one, another device): None.
        assert_eq!(
            device_shares("b:1", 7, &[(1, 4)], std::slice::from_ref(&me)),
            None
        );
        let stale = peer("a:1", 7, 1, 5_000);
        assert_eq!(
            device_shares("b:1", 7, &[(1, 4)], &[me.clone(), stale]),
            None
        );
        let other = peer("a:1", 8, 1, 0);
        assert_eq!(
            device_shares("b:1", 7, &[(1, 4)], &[me.clone(), other]),
            None
        );
        // Two peers with one task each and our two tasks: budget 4 split
        // 2 tasks : 1 : 1, our two seats one per task.
        let view = [me.clone(), peer("a:1", 7, 1, 0), peer("c:1", 7, 1, 0)];
        let (d, per) = device_shares("b:1", 7, &[(5, 4), (6, 4)], &view).unwrap();
        assert_eq!(
            d,
            DeviceShare {
                members: 3,
                tasks: 4,
                threads: 16,
                budget: 4,
                share: 2
            }
        );
        assert_eq!(per, vec![1, 1]);
        // Each member, computing from the same view, gets its part of 4.
        let a = device_shares(
            "a:1",
            7,
            &[(1, 4)],
            &[peer("b:1", 7, 2, 0), view[2].clone()],
        );
        let c = device_shares(
            "c:1",
            7,
            &[(1, 4)],
            &[peer("b:1", 7, 2, 0), view[1].clone()],
        );
        assert_eq!(a.unwrap().0.share + c.unwrap().0.share + d.share, 4);
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
