//! The roles: who drives a transfer. The agent-facing [`client`] and the
//! daemon-facing [`server`] open sessions; each session has a [`source`]
//! end and a [`sink`] end (seed 000, sec. 6.1.4: the data source and data
//! sink of the negotiation protocol).

pub mod client;
pub mod server;
pub mod sink;
pub mod source;
pub mod watchops;

use std::sync::Arc;

use crate::daemon::{Admission, Unmanaged};
use crate::data::resources::EngineResources;
use crate::session::options::TransferOptions;
use crate::session::LinkProvider;
use crate::types::stats::Stats;

/// What one session end runs with besides its control link and its spec
/// (issue 37: one value instead of the positional parameters of
/// `run_source_with`/`run_sink_with`): where its data links come from,
/// its options, the engine's pools, its live counters, and who reserves
/// its threads (the daemon's task controller, or [`Unmanaged`] for an
/// agent serving one session).
pub struct SessionEnd<'a> {
    pub links: &'a mut dyn LinkProvider,
    pub opts: &'a TransferOptions,
    pub res: &'a EngineResources,
    pub stats: Arc<Stats>,
    pub adm: &'a dyn Admission,
}

impl<'a> SessionEnd<'a> {
    /// An end whose threads nobody else manages (the agent's).
    pub fn new(
        links: &'a mut dyn LinkProvider,
        opts: &'a TransferOptions,
        res: &'a EngineResources,
        stats: Arc<Stats>,
    ) -> Self {
        SessionEnd {
            links,
            opts,
            res,
            stats,
            adm: &Unmanaged,
        }
    }

    /// Threads reserved through `adm` (the daemon's task controller).
    pub fn managed(mut self, adm: &'a dyn Admission) -> Self {
        self.adm = adm;
        self
    }
}
