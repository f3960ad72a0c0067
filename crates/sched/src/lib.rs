//! NUMA- and contention-aware scheduler for ramsys (issue 7).
//!
//! Decides, when a task starts, how many reader/writer/sender/receiver
//! threads to run, on which CPUs, where their buffers live and how many
//! streams each NIC carries. The model is MSMRAP (seed 000 ch. 5, Eqs.
//! 5.1-5.6) with the corrections listed in the seeds' README, see
//! [`model`]. Two solvers:
//! * [`plan`]: the online heuristic ([`heuristic`]), microseconds;
//! * [`plan_exact`]: the exact MILP ([`exact`]) for small hosts, the test
//!   oracle.
//!
//! See docs/SCHEDULER.md for the design, the measured gap and re-planning.

pub mod eval;
pub mod exact;
pub mod heuristic;
mod lp;
pub mod model;
pub mod plan;

pub use eval::evaluate;
pub use model::{
    busy_from_load, Assignment, Device, DeviceKind, Host, Instance, IoModel, Node, Params, Path,
    Request, Role, SchedError,
};
pub use plan::{render_text, BufferAlloc, Plan, Prediction, StreamAlloc, ThreadGroup};

/// Largest number of integer variables (stages x nodes) [`plan_exact`]
/// accepts; beyond it the host is not "small" and the MILP may take seconds.
pub const EXACT_MAX_INT_VARS: usize = 16;

/// Thread counts the heuristic chooses (for comparing with [`solve_exact`]).
pub fn solve_heuristic(instance: &Instance) -> Result<Assignment, SchedError> {
    let r = instance.resolve()?;
    Ok(heuristic::solve(&r))
}

/// Optimal thread counts, `Ok(None)` when the host is too large or the
/// solver gives up.
pub fn solve_exact(instance: &Instance) -> Result<Option<Assignment>, SchedError> {
    let r = instance.resolve()?;
    if r.stages.len() * r.n > EXACT_MAX_INT_VARS {
        return Ok(None);
    }
    Ok(exact::solve(&r))
}

/// The plan the daemon follows for a task: the heuristic. An invalid
/// instance yields an empty plan whose note says why.
pub fn plan(instance: &Instance) -> Plan {
    match instance.resolve() {
        Ok(r) => {
            let a = heuristic::solve(&r);
            plan::build(instance, &r, &a)
        }
        Err(e) => Plan::empty(e.to_string()),
    }
}

/// The optimal plan, for small hosts (at most [`EXACT_MAX_INT_VARS`]
/// stage-node pairs); `None` if the instance is invalid or too large.
pub fn plan_exact(instance: &Instance) -> Option<Plan> {
    let r = instance.resolve().ok()?;
    if r.stages.len() * r.n > EXACT_MAX_INT_VARS {
        return None;
    }
    let a = exact::solve(&r)?;
    Some(plan::build(instance, &r, &a))
}

#[cfg(test)]
mod tests;
