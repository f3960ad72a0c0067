//! Where a session's setup time goes (issue 38, docs/WATCH.md "Per-batch
//! cost"): `RUST_LOG=ramsys::phase=debug` logs each step of a session
//! with the microseconds since the agent's push or the daemon's control
//! connection started. The start is process-wide (the steps happen on
//! several threads), so the figures are meaningful for one session at a
//! time, as bench/watch_batch.py runs them. Off (one disabled-level check
//! per mark) otherwise.

use std::sync::Mutex;
use std::time::Instant;

static START: Mutex<Option<Instant>> = Mutex::new(None);

fn on() -> bool {
    tracing::enabled!(target: "ramsys::phase", tracing::Level::DEBUG)
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
        tracing::debug!(target: "ramsys::phase", "phase {step} {us}");
    }
}
