//! `ramsys serve`: the daemon.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
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
    /// Buffer memory pre-allocated for all sessions.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub memory: u64,
    /// Largest block size served (size of each buffer).
    #[arg(long, default_value = "4M", value_parser = parse_size)]
    pub max_block_size: u64,
    /// Sender and receiver threads (most streams served at once).
    #[arg(long, default_value_t = 16)]
    pub max_streams: usize,
    /// Reader threads.
    #[arg(long, default_value_t = 4)]
    pub readers: usize,
    /// Writer threads.
    #[arg(long, default_value_t = 4)]
    pub writers: usize,
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
    let res = EngineResources::new(&ResourceConfig {
        memory: a.memory as usize,
        buffer_size: a.max_block_size as usize,
        readers: a.readers.max(1),
        writers: a.writers.max(1),
        max_streams: a.max_streams.max(1),
        ..Default::default()
    })?;
    let opts = TransferOptions {
        readers: a.readers.max(1),
        writers: a.writers.max(1),
        window: a.window.max(2),
        fsync: a.fsync,
        ..a.storage.options()
    };
    let d = Daemon::bind(&a.listen, &a.root, key, opts, res)?;
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
