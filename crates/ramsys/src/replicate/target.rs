//! Where a job's batches go: a daemon (given as `ramsys://`, started over
//! ssh for the job, or run in this process for a local DST), reached the
//! same way for every batch and kept for the job's life.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ramsys_engine::data::resources::ResourceConfig;
use ramsys_engine::roles::client::Remote;
use ramsys_engine::roles::server::Daemon;
use ramsys_engine::transport::Transport;
use ramsys_engine::{EngineResources, TransferOptions};

/// A destination daemon and the path on it that the job fills.
pub struct Target {
    pub transport: Arc<dyn Transport>,
    pub addr: String,
    pub key: Vec<u8>,
    pub user: Option<String>,
    pub connect_timeout: Duration,
    /// The sync's DST on that daemon.
    pub dest: Vec<u8>,
    /// DST as the user wrote it.
    pub shown: String,
    /// What must live as long as the job (a loopback daemon, an ssh
    /// session).
    pub _keep: Vec<Box<dyn std::any::Any + Send>>,
    /// Buffer pools in this process that receive (a local DST's daemon):
    /// given back to the system when the job is idle.
    pub pools: Vec<Arc<ramsys_resources::BufferPool>>,
}

impl Target {
    pub fn remote(&self) -> Remote {
        Remote {
            transport: self.transport.clone(),
            addr: self.addr.clone(),
            key: self.key.clone(),
            connect_timeout: self.connect_timeout,
            user: self.user.clone(),
        }
    }

    /// A local DST: a daemon in this process on loopback receives it, as a
    /// local `cp` does (agent::copy_locally), kept for the job.
    pub fn local(
        d: &Path,
        opts: &TransferOptions,
        res_cfg: &ResourceConfig,
        connect_timeout: Duration,
    ) -> anyhow::Result<Target> {
        let (root, dest) = crate::spec::local_sink(d)?;
        let mut key = vec![0u8; 32];
        crate::agent::getrandom_fill(&mut key);
        let res = EngineResources::new(res_cfg)?;
        let pools = vec![res.buffers.clone()];
        let daemon = Daemon::bind("127.0.0.1:0", &root, key.clone(), opts.clone(), res)?;
        let addr = daemon.local_addr().to_string();
        let handle = daemon.spawn();
        Ok(Target {
            transport: crate::agent::tcp(),
            addr,
            key,
            user: None,
            connect_timeout,
            dest,
            shown: d.display().to_string(),
            _keep: vec![Box::new(handle)],
            pools,
        })
    }
}
