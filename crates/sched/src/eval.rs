//! The MSMRAP objective of a fixed assignment (seed 000 ch. 5): a closed
//! form when no stages share a resource, else the LP (crate::lp).

use crate::model::{feasible, shares_resources, stage_rate, Assignment, Instance, Resolved};

/// Objective of MSMRAP in rate form for fixed gamma: lambda * sum(D_r), the
/// aggregate end-to-end throughput in Gbps. Returns 0 for an infeasible
/// assignment.
pub(crate) fn evaluate_resolved(r: &Resolved, a: &Assignment) -> f64 {
    if !feasible(r, a) {
        return 0.0;
    }
    let wsum: f64 = r.weight.iter().sum();
    if !shares_resources(r) {
        // Closed form: every request is the min of its two stages, and the
        // workload ends when the slowest (per weight) request does.
        let lambda = (0..r.requests())
            .map(|q| {
                let x = stage_rate(&r.stages[2 * q], a.stage(2 * q))
                    .min(stage_rate(&r.stages[2 * q + 1], a.stage(2 * q + 1)));
                x / r.weight[q]
            })
            .fold(f64::INFINITY, f64::min);
        return lambda * wsum;
    }
    crate::lp::lp_fixed(r, a).unwrap_or(0.0)
}

/// End-to-end throughput (Gbps) of assignment `a`: the MSMRAP objective in
/// rate form (min over pipeline stages, shared paths and devices split by
/// an LP when requests compete). 0 when `a` is infeasible or the instance
/// invalid.
pub fn evaluate(instance: &Instance, a: &Assignment) -> f64 {
    match instance.resolve() {
        Ok(r) => evaluate_resolved(&r, a),
        Err(_) => 0.0,
    }
}
