//! The linear program of MSMRAP's continuous part (seed 000 Eqs. 5.1-5.6
//! in rate form): built once for the exact solver (crate::exact) and for
//! evaluating a fixed thread assignment (crate::eval).

use std::collections::HashMap;

use microlp::{ComparisonOp, OptimizationDirection, Problem, Variable};

use crate::model::{path_key, Assignment, Resolved};

/// Variables of the continuous part: beta per (stage, node) and lambda.
pub(crate) struct Lp {
    pub(crate) p: Problem,
    pub(crate) beta: Vec<Vec<Variable>>,
    pub(crate) lambda: Variable,
}

/// Build the LP part shared by the exact solver and the evaluator: beta
/// bounded by `ub(k, c)`, shared B^max per path and device ceilings,
/// conservation (Eqs. 5.2/5.3 in rate form), objective lambda * sum(D).
pub(crate) fn build_lp(r: &Resolved, ub: impl Fn(usize, usize) -> f64) -> Lp {
    let mut p = Problem::new(OptimizationDirection::Maximize);
    let wsum: f64 = r.weight.iter().sum();
    let lambda = p.add_var(wsum, (0.0, f64::INFINITY));
    let mut beta = Vec::with_capacity(r.stages.len());
    let mut paths: HashMap<_, Vec<(Variable, f64)>> = HashMap::new();
    let mut devs: HashMap<_, Vec<(Variable, f64)>> = HashMap::new();
    for (k, st) in r.stages.iter().enumerate() {
        let row: Vec<Variable> = (0..r.n)
            .map(|c| p.add_var(0.0, (0.0, ub(k, c).min(st.bmax[c]).max(0.0))))
            .collect();
        for (c, &v) in row.iter().enumerate() {
            if let Some(key) = path_key(st, c) {
                paths.entry(key).or_default().push((v, 1.0));
            }
            devs.entry((st.device, st.dir)).or_default().push((v, 1.0));
        }
        // Eqs. 5.2/5.3: each stage carries the request's whole rate.
        let mut flow: Vec<(Variable, f64)> = row.iter().map(|&v| (v, 1.0)).collect();
        flow.push((lambda, -r.weight[k / 2]));
        p.add_constraint(flow.as_slice(), ComparisonOp::Ge, 0.0);
        beta.push(row);
    }
    for (key, vars) in &paths {
        let (_, c, _) = *key;
        let st = r
            .stages
            .iter()
            .find(|s| path_key(s, c) == Some(*key))
            .expect("path from a stage");
        if vars.len() > 1 {
            p.add_constraint(vars.as_slice(), ComparisonOp::Le, st.bmax[c]);
        }
    }
    for (key, vars) in &devs {
        let cap = r
            .stages
            .iter()
            .find(|s| (s.device, s.dir) == *key)
            .map(|s| s.cap)
            .unwrap_or(0.0);
        p.add_constraint(vars.as_slice(), ComparisonOp::Le, cap);
    }
    Lp { p, beta, lambda }
}

/// Objective for fixed thread counts (one LP of the divide-and-conquer
/// scheme). `None` if the solver fails.
pub(crate) fn lp_fixed(r: &Resolved, a: &Assignment) -> Option<f64> {
    let lp = build_lp(r, |k, c| f64::from(a.stage(k)[c]) * r.stages[k].b0[c]);
    let sol = lp.p.solve().ok()?.into_solution().ok()?;
    Some(sol.var_value(lp.lambda) * r.weight.iter().sum::<f64>())
}
