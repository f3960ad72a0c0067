//! A site member as the monitoring shows it (issue 19, seed 003 ~597-641):
//! the record every daemon publishes and `status --site` lists. Its own
//! module, below the daemon's state and status, since both read it.

use serde::{Deserialize, Serialize};

/// One site member's published load (engine `site`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SiteMember {
    pub addr: String,
    /// Busy fraction of all CPUs, 0-1.
    pub cpu_load: f64,
    /// The member's own share of it (its daemon process), 0-1.
    #[serde(default)]
    pub own_cpu: f64,
    /// Shared storage devices it uses (site::share): id, tasks, threads.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub storage: Vec<crate::daemon::site::storage::StorageUse>,
    pub run_queue: u32,
    pub intr_per_s: u64,
    pub softirq_per_s: u64,
    pub net_rx_bps: u64,
    pub net_tx_bps: u64,
    pub disk_read_bps: u64,
    pub disk_write_bps: u64,
    pub sessions: u32,
    pub active_tasks: u32,
    pub queued_tasks: u32,
    pub free_buffer_bytes: u64,
    /// How old this view of the member is (ms since its home last
    /// answered).
    pub age_ms: u64,
    /// The last failure reaching it, while it lasts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
