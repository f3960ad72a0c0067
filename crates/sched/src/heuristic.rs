//! Online placement heuristic: locality first, then spread over nodes of the
//! same performance class, within the per-node thread budget.
//!
//! Greedy on the bottleneck: repeatedly take the request that is furthest
//! behind (lowest rate per weight), find its slower stage, and give that
//! stage one thread on the first node, in preference order, that still has
//! budget and path headroom. Preference order for a stage whose device is on
//! node d:
//! 1. performance class of the path (c, d) (seed 001 Tables IV/V: nodes within
//!    [`CLASS_TOLERANCE`] of the class leader's B^0 are one class);
//! 2. within a class, the device node itself first (locality: readers/writers
//!    on the storage node, senders/receivers on the NIC node, seed 000 6.1.5),
//!    then the class mates with the fewest threads of this stage (spreading,
//!    seed 001 V.B: "evenly split the task processes among all nodes in
//!    class 1 and class 2"), nearer nodes first.
//!
//! The device node's budget already excludes the CPU kept for interrupts
//! (seed 000 4.2.2), so a saturated device node overflows to its neighbour of
//! the same class, which is what beat node 7 in the dissertation. A stage
//! whose device node is unknown is spread round-robin over all nodes.
//!
//! Cost: O(threads * nodes * stages) with threads <= 2 * max_threads_per_stage
//! per request; no LP is solved unless requests share a path or device.

use crate::eval::evaluate_resolved;
use crate::model::{path_key, shares_resources, Assignment, Dir, Resolved, Stage};
use std::collections::HashMap;

/// Paths whose single-thread bandwidth is within this fraction of the class
/// leader form one class. Seed 001 Table IV puts 20.3 and 20.4 Gbps in one
/// class and Table V separates 34.7 from 33.1 (4.6 %), so 3 %.
pub const CLASS_TOLERANCE: f64 = 0.03;

/// Class index of every CPU node for a stage (0 = best).
fn classes(st: &Stage) -> Vec<usize> {
    let n = st.b0.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| st.b0[b].total_cmp(&st.b0[a]).then(a.cmp(&b)));
    let mut class = vec![0; n];
    let mut leader = f64::NAN;
    let mut idx = 0;
    for (i, &c) in order.iter().enumerate() {
        if i == 0 {
            leader = st.b0[c];
        } else if st.b0[c] < leader * (1.0 - CLASS_TOLERANCE) {
            idx += 1;
            leader = st.b0[c];
        }
        class[c] = idx;
    }
    class
}

/// Shared-capacity bookkeeping while the greedy runs.
struct Usage {
    path: HashMap<(Dir, usize, usize), f64>,
    dev: HashMap<(usize, Dir), f64>,
}

/// Rate stage `k` achieves with `g` threads, given what the other stages
/// already claim on shared paths and on the device.
fn rate(st: &Stage, g: &[u32], own: &[f64], own_total: f64, u: &Usage) -> (f64, Vec<f64>) {
    let mut per = vec![0.0; g.len()];
    for c in 0..g.len() {
        let mut lim = st.bmax[c];
        if let Some(key) = path_key(st, c) {
            let used = u.path.get(&key).copied().unwrap_or(0.0) - own[c];
            lim = (lim - used).max(0.0);
        }
        per[c] = (f64::from(g[c]) * st.b0[c]).min(lim);
    }
    let dev_used = u.dev.get(&(st.device, st.dir)).copied().unwrap_or(0.0) - own_total;
    let total = per.iter().sum::<f64>().min((st.cap - dev_used).max(0.0));
    (total, per)
}

pub(crate) fn solve(r: &Resolved) -> Assignment {
    // Two greedy passes that break the first tie differently (in-stage or
    // out-stage first); keep the better. Cheap insurance against the greedy
    // handing the device node's scarce cores to the wrong stage.
    let a = greedy(r, false);
    if shares_resources(r) {
        return a;
    }
    let b = greedy(r, true);
    if evaluate_resolved(r, &b) > evaluate_resolved(r, &a) * (1.0 + 1e-9) {
        b
    } else {
        a
    }
}

fn greedy(r: &Resolved, out_first: bool) -> Assignment {
    let n = r.n;
    let ns = r.stages.len();
    let mut a = Assignment::zero(r);
    let class: Vec<Vec<usize>> = r.stages.iter().map(classes).collect();
    let mut used = vec![0u32; n];
    let mut usage = Usage {
        path: HashMap::new(),
        dev: HashMap::new(),
    };
    // What each stage currently claims per node, and its rate.
    let mut claim = vec![vec![0.0; n]; ns];
    let mut srate: Vec<f64> = vec![0.0; ns];
    let mut done = vec![false; r.requests()];
    // Each round: the request furthest behind, by rate per weight.
    while let Some(q) = (0..r.requests()).filter(|&q| !done[q]).min_by(|&x, &y| {
        let rx = srate[2 * x].min(srate[2 * x + 1]) / r.weight[x];
        let ry = srate[2 * y].min(srate[2 * y + 1]) / r.weight[y];
        rx.total_cmp(&ry).then(x.cmp(&y))
    }) {
        // Its bottleneck stage (ties broken by `out_first`).
        let tie = srate[2 * q + 1] == srate[2 * q];
        let k = if srate[2 * q + 1] < srate[2 * q] || (tie && out_first) {
            2 * q + 1
        } else {
            2 * q
        };
        let st = &r.stages[k];
        let g = a.threads[k / 2][k % 2].clone();
        if g.iter().sum::<u32>() >= r.max_per_stage {
            done[q] = true;
            continue;
        }
        let mut best: Option<(usize, f64, Vec<f64>)> = None;
        let mut best_key = (usize::MAX, usize::MAX, u32::MAX, 0.0f64, usize::MAX);
        for c in 0..n {
            if used[c] >= r.budget[c] || g[c] >= st.ub[c] {
                continue;
            }
            let mut g2 = g.clone();
            g2[c] += 1;
            let (t, per) = rate(st, &g2, &claim[k], srate[k], &usage);
            if t <= srate[k] + 1e-9 {
                continue;
            }
            let key = match st.dev_node {
                // Locality, then spread in the class, then faster, then index.
                Some(d) => (class[k][c], usize::from(c != d), g[c], -st.b0[c], c),
                // Unknown device node: round-robin over all nodes.
                None => (0, 0, g[c], -st.b0[c], c),
            };
            if best.is_none() || cmp_key(&key, &best_key) {
                best_key = key;
                best = Some((c, t, per));
            }
        }
        let Some((c, t, per)) = best else {
            // The bottleneck cannot grow: this request is as fast as it gets.
            done[q] = true;
            continue;
        };
        a.threads[k / 2][k % 2][c] += 1;
        used[c] += 1;
        for (cc, &p) in per.iter().enumerate() {
            if let Some(key) = path_key(st, cc) {
                *usage.path.entry(key).or_default() += p - claim[k][cc];
            }
        }
        *usage.dev.entry((st.device, st.dir)).or_default() += t - srate[k];
        claim[k] = per;
        srate[k] = t;
    }
    if !shares_resources(r) {
        improve(r, &mut a);
    }
    a
}

/// Exchange nodes between two stages: stage k moves a thread c -> c2 while
/// stage k2 moves one c2 -> c. Node budgets are unchanged, so this escapes
/// the case where each stage sits on the other's better node, which no
/// single move improves (both stages bound the min at once).
fn try_swap(r: &Resolved, a: &mut Assignment, best: &mut f64) -> bool {
    let ns = r.stages.len();
    for k in 0..ns {
        for k2 in k + 1..ns {
            for c in 0..r.n {
                for c2 in 0..r.n {
                    if c == c2
                        || a.threads[k / 2][k % 2][c] == 0
                        || a.threads[k2 / 2][k2 % 2][c2] == 0
                    {
                        continue;
                    }
                    a.threads[k / 2][k % 2][c] -= 1;
                    a.threads[k / 2][k % 2][c2] += 1;
                    a.threads[k2 / 2][k2 % 2][c2] -= 1;
                    a.threads[k2 / 2][k2 % 2][c] += 1;
                    let v = evaluate_resolved(r, a);
                    if v > *best * (1.0 + 1e-9) + 1e-12 {
                        *best = v;
                        return true;
                    }
                    a.threads[k / 2][k % 2][c] += 1;
                    a.threads[k / 2][k % 2][c2] -= 1;
                    a.threads[k2 / 2][k2 % 2][c2] += 1;
                    a.threads[k2 / 2][k2 % 2][c] -= 1;
                }
            }
        }
    }
    false
}

/// Make room on a node: move a thread of stage k from node c to node c2
/// (where budget is left) and give the freed core on c to stage k3. Covers
/// a stage that is stuck because the other stage holds its only good node.
#[allow(clippy::needless_range_loop)] // index math over stages and nodes
fn try_make_room(r: &Resolved, a: &mut Assignment, best: &mut f64) -> bool {
    let ns = r.stages.len();
    let used = a.per_node(r.n);
    for k in 0..ns {
        for c in 0..r.n {
            if a.threads[k / 2][k % 2][c] == 0 {
                continue;
            }
            for c2 in 0..r.n {
                if c2 == c || used[c2] >= r.budget[c2] {
                    continue;
                }
                a.threads[k / 2][k % 2][c] -= 1;
                a.threads[k / 2][k % 2][c2] += 1;
                for k3 in 0..ns {
                    if k3 == k {
                        continue;
                    }
                    a.threads[k3 / 2][k3 % 2][c] += 1;
                    let v = evaluate_resolved(r, a);
                    if v > *best * (1.0 + 1e-9) + 1e-12 {
                        *best = v;
                        return true;
                    }
                    a.threads[k3 / 2][k3 % 2][c] -= 1;
                }
                a.threads[k / 2][k % 2][c] += 1;
                a.threads[k / 2][k % 2][c2] -= 1;
            }
        }
    }
    false
}

/// Local search after the greedy: move single threads between stages and
/// nodes while that strictly raises the objective. The greedy fills nodes in
/// preference order per stage and can hand a scarce core to the stage that
/// needs it less (both stages of a request compete for the device node's
/// budget, corrected Eq. 5.4); one-thread moves repair that. Locality stays
/// the tie-breaker: a move must gain, not merely match. Only used with the
/// closed-form objective (no shared path or device), so each probe is O(n).
#[allow(clippy::needless_range_loop)] // index math over stages and nodes
fn improve(r: &Resolved, a: &mut Assignment) {
    let ns = r.stages.len();
    let mut best = evaluate_resolved(r, a);
    // Each accepted move gains > 1e-9 relative; bound the passes anyway.
    for _ in 0..4 * r.n * ns {
        let mut moved = false;
        // Plain additions where budget is left (a move may have shifted the
        // bottleneck to a stage the greedy had already closed).
        let used = a.per_node(r.n);
        'add: for k in 0..ns {
            for c in 0..r.n {
                if used[c] < r.budget[c] {
                    a.threads[k / 2][k % 2][c] += 1;
                    let v = evaluate_resolved(r, a);
                    if v > best * (1.0 + 1e-9) + 1e-12 {
                        best = v;
                        moved = true;
                        break 'add;
                    }
                    a.threads[k / 2][k % 2][c] -= 1;
                }
            }
        }
        if moved {
            continue;
        }
        'search: for k in 0..ns {
            for c in 0..r.n {
                if a.threads[k / 2][k % 2][c] == 0 {
                    continue;
                }
                a.threads[k / 2][k % 2][c] -= 1;
                for k2 in 0..ns {
                    for c2 in 0..r.n {
                        if (k2, c2) == (k, c) {
                            continue;
                        }
                        a.threads[k2 / 2][k2 % 2][c2] += 1;
                        let v = evaluate_resolved(r, a);
                        if v > best * (1.0 + 1e-9) + 1e-12 {
                            best = v;
                            moved = true;
                            break 'search;
                        }
                        a.threads[k2 / 2][k2 % 2][c2] -= 1;
                    }
                }
                a.threads[k / 2][k % 2][c] += 1;
            }
        }
        if !moved {
            moved = try_swap(r, a, &mut best);
        }
        if !moved {
            moved = try_make_room(r, a, &mut best);
        }
        if !moved {
            break;
        }
    }
    // Drop threads that no longer carry anything.
    for k in 0..ns {
        for c in 0..r.n {
            while a.threads[k / 2][k % 2][c] > 0 {
                a.threads[k / 2][k % 2][c] -= 1;
                if evaluate_resolved(r, a) < best - 1e-9 {
                    a.threads[k / 2][k % 2][c] += 1;
                    break;
                }
            }
        }
    }
}

fn cmp_key(a: &(usize, usize, u32, f64, usize), b: &(usize, usize, u32, f64, usize)) -> bool {
    (a.0, a.1, a.2)
        .cmp(&(b.0, b.1, b.2))
        .then(a.3.total_cmp(&b.3))
        .then(a.4.cmp(&b.4))
        .is_lt()
}
