//! Where a session's setup time goes (issue 38, docs/WATCH.md "Per-batch
//! cost"): with `RAMSYS_PHASES=1` in the environment, each step of a
//! session is logged (target `ramsys::phase`, level info) as `phase STEP
//! MICROSECONDS` since the agent's push or the daemon's control
//! connection started. The start is process-wide (the steps happen on
//! several threads), so the figures mean something for one session at a
//! time, as bench/watch_batch.py runs them. Without the variable a mark
//! costs one load.

use std::sync::{Mutex, OnceLock};
use std::time::Instant;

static START: Mutex<Option<Instant>> = Mutex::new(None);

fn on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("RAMSYS_PHASES").is_some_and(|v| v == "1"))
}

/// A session starts now.
pub fn start() {
    if on() {
        *START.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }
}

/// The session reached `step`.
pub fn mark(step: &str) {
    if !on() {
        return;
    }
    if let Some(t0) = *START.lock().unwrap_or_else(|p| p.into_inner()) {
        let us = t0.elapsed().as_micros();
        tracing::info!(target: "ramsys::phase", "phase {step} {us}");
    }
}
