//! Exact MSMRAP solver: the whole corrected model (seed 000 Eqs. 5.1-5.6) as
//! one mixed-integer LP solved by branch and bound in `microlp`.
//!
//! The dissertation (seed 000 5.1.3) only sketches a divide-and-conquer
//! solver (enumerate thread vectors, one LP each) and never implemented it.
//! Because the rate form of the model is linear in gamma and beta together
//! (`beta <= gamma * B0` replaces the ratio in Eq. 5.1), one MILP gives the
//! same global optimum without enumerating; the enumeration survives as the
//! brute-force cross-check in the tests.

use crate::lp::build_lp;
use crate::model::{feasible, Assignment, Resolved};
use microlp::{ComparisonOp, Variable};
use std::time::Duration;

/// Per-thread penalty in the MILP objective, so that among equally fast
/// placements the one with fewest threads wins. Small enough (1e-6 Gbps per
/// thread) not to trade real throughput for threads.
const THREAD_PENALTY: f64 = 1e-6;

/// Budget for one exact solve; beyond it the instance is not "small".
const TIME_LIMIT: Duration = Duration::from_secs(20);

/// Solve the whole MILP. `None` if the solver gives no proven optimum within
/// the time limit.
pub(crate) fn solve(r: &Resolved) -> Option<Assignment> {
    let mut lp = build_lp(r, |_, _| f64::INFINITY);
    let mut gamma: Vec<Vec<Variable>> = Vec::with_capacity(r.stages.len());
    let mut per_node: Vec<Vec<(Variable, f64)>> = vec![Vec::new(); r.n];
    for (k, st) in r.stages.iter().enumerate() {
        let row: Vec<Variable> = (0..r.n)
            .map(|c| {
                // Ties go to fewer threads, then to faster (more local) paths.
                let best = st.b0.iter().copied().fold(0.0, f64::max).max(1e-12);
                let pen = THREAD_PENALTY * (2.0 - st.b0[c] / best);
                lp.p.add_integer_var(-pen, (0, st.ub[c].min(i32::MAX as u32) as i32))
            })
            .collect();
        for c in 0..r.n {
            // Eq. 5.1 / corrected 5.6: beta only where gamma, linear in gamma.
            lp.p.add_constraint(
                [(lp.beta[k][c], 1.0), (row[c], -st.b0[c])],
                ComparisonOp::Le,
                0.0,
            );
            per_node[c].push((row[c], 1.0));
        }
        let total: Vec<(Variable, f64)> = row.iter().map(|&v| (v, 1.0)).collect();
        lp.p.add_constraint(
            total.as_slice(),
            ComparisonOp::Le,
            f64::from(r.max_per_stage),
        );
        gamma.push(row);
    }
    for (c, vars) in per_node.iter().enumerate() {
        // Corrected Eq. 5.4: storage *and network* threads share the budget.
        lp.p.add_constraint(vars.as_slice(), ComparisonOp::Le, f64::from(r.budget[c]));
    }
    lp.p.set_time_limit(TIME_LIMIT);
    let sol = lp.p.solve().ok()?.into_solution().ok()?;
    let mut a = Assignment::zero(r);
    for (k, row) in gamma.iter().enumerate() {
        for (c, &v) in row.iter().enumerate() {
            a.threads[k / 2][k % 2][c] = sol.var_value(v).round().max(0.0) as u32;
        }
    }
    trim(r, &mut a);
    feasible(r, &a).then_some(a)
}

/// Drop threads that carry nothing: repeatedly remove one thread whenever
/// the objective does not drop (the MILP penalty already prefers this; the
/// trim makes it exact despite solver tolerances).
pub(crate) fn trim(r: &Resolved, a: &mut Assignment) {
    let mut best = crate::eval::evaluate_resolved(r, a);
    loop {
        let mut improved = false;
        for k in 0..r.stages.len() {
            for c in 0..r.n {
                if a.threads[k / 2][k % 2][c] == 0 {
                    continue;
                }
                a.threads[k / 2][k % 2][c] -= 1;
                let v = crate::eval::evaluate_resolved(r, a);
                if v >= best - 1e-9 {
                    best = best.max(v);
                    improved = true;
                } else {
                    a.threads[k / 2][k % 2][c] += 1;
                }
            }
        }
        if !improved {
            return;
        }
    }
}
