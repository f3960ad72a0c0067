//! `ramsys serve`: the daemon.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use ramsys_engine::config::{daemon_placement, DaemonConfig, ServeInputs};
use ramsys_engine::resources::ResourceConfig;
use ramsys_engine::server::Daemon;
use ramsys_engine::{EngineResources, TransferOptions};

use crate::spec::parse_size;
use crate::KeyArgs;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port, printed on stdout).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: String,
    /// Export root: every peer path resolves beneath it.
    #[arg(long, value_name = "DIR")]
    pub root: PathBuf,
    #[command(flatten)]
    pub key: KeyArgs,
    /// Daemon config (TOML): device purposes, capacities, thread counts,
    /// the I/O model file, NUMA mode, memory, max streams (crates/engine/
    /// src/config.rs, docs/NUMA.md). Command-line flags win over it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// NUMA placement of the pools: off, auto (storage threads on the
    /// root's device node, network threads and buffers on the listen NIC's
    /// node; seed 000 6.1.5) or a node number. Default: config, else auto.
    #[arg(long, value_name = "off|auto|NODE")]
    pub numa: Option<ramsys_topo::NumaMode>,
    /// Buffer memory pre-allocated for all sessions (default 256M).
    #[arg(long, value_parser = parse_size)]
    pub memory: Option<u64>,
    /// Largest block size served (size of each buffer).
    #[arg(long, default_value = "4M", value_parser = parse_size)]
    pub max_block_size: u64,
    /// Sender and receiver threads (most streams served at once; default
    /// 16).
    #[arg(long)]
    pub max_streams: Option<usize>,
    /// Reader threads (default: config, else by the root device's type).
    #[arg(long)]
    pub readers: Option<usize>,
    /// Writer threads (default: config, else by the root device's type).
    #[arg(long)]
    pub writers: Option<usize>,
    /// Credits (blocks in flight) granted per stream.
    #[arg(long, default_value_t = 8)]
    pub window: u32,
    /// fsync every file before renaming it into place.
    #[arg(long)]
    pub fsync: bool,
    #[command(flatten)]
    pub storage: crate::agent::StorageArgs,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics (docs/DAEMON.md);
    /// the bound address is printed on the line after "listening on".
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<String>,
}

pub fn run(a: &ServeArgs) -> anyhow::Result<i32> {
    let key = a.key.load()?;
    anyhow::ensure!(
        a.max_block_size >= 4096,
        "--max-block-size must be at least 4K"
    );
    let cfg = match &a.config {
        Some(p) => DaemonConfig::load(p)?,
        None => DaemonConfig::default(),
    };
    let cli = ServeInputs {
        numa: a.numa,
        memory: a.memory,
        max_streams: a.max_streams,
        readers: a.readers,
        writers: a.writers,
        buffer_size: a.max_block_size as usize,
    };
    // The placement needs the hardware; without discovery (a container
    // hiding /sys) the daemon still serves with unpinned pools.
    let placement = match ramsys_topo::discover(Path::new("/")) {
        Ok(topo) => Some(daemon_placement(
            topo, true, &cfg, &cli, &a.root, &a.listen,
        )?),
        Err(e) => {
            tracing::warn!("hardware discovery failed ({e}); pools left to the OS");
            None
        }
    };
    let rcfg = match &placement {
        Some(p) => p.resources.clone(),
        None => ResourceConfig {
            memory: cli.memory.or(cfg.memory).unwrap_or(256 << 20) as usize,
            buffer_size: cli.buffer_size,
            readers: cli.readers.or(cfg.readers).unwrap_or(4).max(1),
            writers: cli.writers.or(cfg.writers).unwrap_or(4).max(1),
            max_streams: cli.max_streams.or(cfg.max_streams).unwrap_or(16).max(1),
            ..Default::default()
        },
    };
    let res = EngineResources::new(&rcfg)?;
    if let Some(p) = &placement {
        for l in &p.lines {
            tracing::info!("placement: {l}");
        }
        if let Some(Ok(v)) = res.verify_buffers() {
            tracing::info!("placement: buffer pages by node (move_pages): {v:?}");
        }
    }
    let opts = TransferOptions {
        readers: rcfg.readers,
        writers: rcfg.writers,
        window: a.window.max(2),
        fsync: a.fsync,
        // Where the daemon is the source (pulls): flag, else config.
        send_path: a.storage.send_path.or(cfg.send_path).unwrap_or_default(),
        ..a.storage.options()
    };
    let d = Daemon::bind(&a.listen, &a.root, key, opts, res)?;
    if let Some(p) = placement {
        d.set_placement(p);
    }
    println!("listening on {}", d.local_addr());
    std::io::stdout().flush()?;
    if let Some(m) = &a.metrics {
        let at = d
            .serve_metrics(m)
            .map_err(|e| anyhow::anyhow!("cannot serve metrics on {m}: {e}"))?;
        // After "listening on" (readers may stop after that line), and
        // never fatal if stdout is gone.
        let mut o = std::io::stdout();
        let _ = writeln!(o, "metrics on {at}").and_then(|_| o.flush());
        tracing::info!("metrics on http://{at}/metrics");
    }
    tracing::info!("serving {} on {}", a.root.display(), d.local_addr());
    d.serve();
    Ok(0)
}
