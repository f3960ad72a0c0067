//! The daemon's request-management state (seed 000 sec. 6.1.3 and 6.2.1,
//! Fig. 6-3, Fig. 6-5b, Fig. 6-6), kept explicit so it can be observed
//! (`ramsys status`, `/metrics`) and later shared as soft state (seed 003,
//! DDSS).
//!
//! - [`admit`]: the session list, per-device task waiting queues, the task
//!   poller, the task states and the reservation rules (all-or-nothing,
//!   fair shares, work stealing between device queues).
//! - [`status`]: a serializable snapshot of all of it.
//! - [`metrics`]: the Prometheus text endpoint.
//! - [`netdev`]: names of NICs and storage devices for labels.
//! - [`rates`]: the daemon's, users' and sessions' rate limits.
//! - [`lifecycle`]: draining (refuse new sessions, stop running ones).
//! - [`jobs`]: continuous replication jobs' counters (issue 38).
//! - [`users`]: the credential store: shared key or users table (per-user
//!   keys and export roots) and one-time credentials.

pub mod admit;
pub mod config;
pub mod credentials;
pub mod jobs;
pub mod lifecycle;
pub mod metrics;
pub mod netdev;
pub mod placement;
pub mod rates;
pub mod site;
pub mod status;
pub mod toml;
pub mod users;

use ramsys_resources::{BufferPool, Reservation};
use std::time::Duration;

use crate::data::resources::EngineResources;
use crate::types::error::EngineError;

pub use admit::{DaemonState, TaskGuard, TaskState};

/// Threads and buffers a sink end works with.
pub struct SinkGrant {
    pub receivers: Reservation,
    pub writers: Reservation,
    pub buffers: BufferPool,
}

/// How a session end obtains its threads and buffers. The daemon's tasks
/// go through [`TaskGuard`] (queues, suspension, fair shares); an agent's
/// own engine serves one session and uses [`Unmanaged`].
pub trait Admission: Send + Sync {
    /// Source: up to `streams` senders and `readers` readers, at least one
    /// of each (seed 000 Fig. 6-4a: the source reserves before proposing).
    fn reserve_source(
        &self,
        res: &EngineResources,
        streams: usize,
        readers: usize,
    ) -> Result<(Reservation, Reservation), EngineError>;

    /// Sink: up to `streams` receivers and `writers` writers, and between
    /// 2 and `window` buffers per granted stream.
    fn reserve_sink(
        &self,
        res: &EngineResources,
        streams: usize,
        writers: usize,
        window: usize,
    ) -> Result<SinkGrant, EngineError>;

    /// Source: the read queues want `n` more readers than were reserved
    /// (a rotational device's files found cached, request::tasks): take
    /// what is idle. A daemon task keeps what admission granted.
    fn more_readers(&self, _res: &EngineResources, _readers: &mut Reservation, _n: usize) {}

    /// Negotiation is over: `streams` data streams agreed; the task moves
    /// to "transferring" (Fig. 6-6).
    fn transferring(&self, _streams: u16) {}

    /// The limit on how many storage threads run at once (the task's
    /// share of a device shared over a site, site::share); None: all.
    fn storage_gate(&self) -> Option<std::sync::Arc<crate::daemon::site::share::ThreadGate>> {
        None
    }
}

/// The engine's behaviour without a daemon around it: take what is free,
/// waiting up to 30 s per pool.
pub struct Unmanaged;

const UNMANAGED_WAIT: Duration = Duration::from_secs(30);

impl Admission for Unmanaged {
    fn reserve_source(
        &self,
        res: &EngineResources,
        streams: usize,
        readers: usize,
    ) -> Result<(Reservation, Reservation), EngineError> {
        let s = res
            .senders
            .reserve(1, streams.max(1), UNMANAGED_WAIT)
            .ok_or_else(|| EngineError::local("no sender threads free"))?;
        let r = res
            .readers
            .reserve(1, readers.max(1), UNMANAGED_WAIT)
            .ok_or_else(|| EngineError::local("no reader threads free"))?;
        Ok((s, r))
    }

    fn more_readers(&self, _res: &EngineResources, readers: &mut Reservation, n: usize) {
        readers.grow(n);
    }

    fn reserve_sink(
        &self,
        res: &EngineResources,
        streams: usize,
        writers: usize,
        window: usize,
    ) -> Result<SinkGrant, EngineError> {
        let receivers = res
            .receivers
            .reserve(1, streams.max(1), UNMANAGED_WAIT)
            .ok_or_else(|| EngineError::local("no receiver threads free"))?;
        let writers = res
            .writers
            .reserve(1, writers.max(1), UNMANAGED_WAIT)
            .ok_or_else(|| EngineError::local("no writer threads free"))?;
        let n = receivers.len();
        let buffers = res
            .take_buffers(n * 2, n * window.max(2), UNMANAGED_WAIT)
            .ok_or_else(|| EngineError::local("no buffers free"))?;
        Ok(SinkGrant {
            receivers,
            writers,
            buffers,
        })
    }
}
