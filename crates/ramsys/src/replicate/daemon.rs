//! The daemon's `[[replicate]]` jobs (issue 38, engine config::replicate):
//! started with the daemon, one thread each, reported in its status and
//! metrics (engine daemon::jobs), resumed from their journals after a
//! restart. A job that stops on an error (its source gone, its key
//! unreadable) says why in the status and starts again 30 s later.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use ramsys_engine::daemon::config::replicate::ReplicateSpec;
use ramsys_engine::daemon::jobs::JobStats;
use ramsys_engine::data::resources::ResourceConfig;
use ramsys_engine::roles::server::DaemonShared;
use ramsys_engine::{EngineResources, TransferOptions};
use ramsys_proto::control::Selection;

use super::{JobSpec, Output, Target};
use crate::spec::Endpoint;

/// How long a failed job waits before it starts again.
const RESTART: Duration = Duration::from_secs(30);

/// Where a job's journal lives by default: systemd's state directory of
/// the service, else the user's state directory.
fn journal_for(spec: &ReplicateSpec) -> PathBuf {
    if let Some(p) = &spec.journal {
        return p.clone();
    }
    match std::env::var_os("STATE_DIRECTORY").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d).join(format!("replicate-{}.sqlite", spec.name)),
        None => super::default_journal(&format!("replicate {}", spec.name)),
    }
}

fn options(spec: &ReplicateSpec) -> TransferOptions {
    use ramsys_engine::request::sync::flags::{DELETE, JOURNAL, SYNC};
    use ramsys_proto::attrs::preserve::{DEVICES, GROUP, OWNER, SPECIALS};
    TransferOptions {
        recursive: true,
        readers: 2,
        writers: 2,
        sync: SYNC | JOURNAL | if spec.delete { DELETE } else { 0 },
        select: Selection {
            // rsync's short rule form (`- PAT`, `+ PAT`; request::filter).
            rules: spec
                .rules
                .iter()
                .map(|(inc, p)| [if *inc { &b"+ "[..] } else { b"- " }, p].concat())
                .collect(),
            ..Default::default()
        },
        preserve: if spec.archive {
            OWNER | GROUP | SPECIALS | DEVICES
        } else {
            0
        },
        ..Default::default()
    }
}

fn resources() -> ResourceConfig {
    ResourceConfig {
        memory: 64 << 20,
        buffer_size: 4 << 20,
        readers: 2,
        writers: 2,
        max_streams: 4,
        ..Default::default()
    }
}

/// Build and run one job until it fails.
fn run_once(spec: &ReplicateSpec, daemon_key: &Path, stats: &Arc<JobStats>) -> anyhow::Result<()> {
    let src = PathBuf::from(&spec.source);
    anyhow::ensure!(src.is_dir(), "source {} is not a directory", src.display());
    let contents = spec.source.ends_with('/');
    let top = crate::agent::local_tops(std::slice::from_ref(&src), &[contents])?.remove(0);
    let opts = options(spec);
    let timeout = Duration::from_secs(10);
    let target = match crate::spec::parse_endpoint(&spec.dest)? {
        Endpoint::Local(d) => Target::local(&d, &opts, &resources(), timeout)?,
        Endpoint::Daemon { addr, path } => {
            let kf = spec.key_file.as_deref().unwrap_or(daemon_key);
            Target {
                transport: crate::agent::tcp(),
                addr,
                key: ramsys_resources::keys::load_existing(kf)?,
                user: None,
                connect_timeout: timeout,
                dest: path,
                shown: spec.dest.clone(),
                _keep: Vec::new(),
                pools: Vec::new(),
            }
        }
        Endpoint::Ssh(_) => anyhow::bail!(
            "dest {}: a daemon job replicates to a ramsys:// daemon or a local directory",
            spec.dest
        ),
    };
    let job = JobSpec {
        name: spec.name.clone(),
        source: src.canonicalize()?,
        top,
        opts,
        pending: ramsys_watch::PendingConfig {
            quiet: Duration::from_millis(spec.quiet_ms),
            mirror: spec.delete,
            ..Default::default()
        },
        backend: spec
            .backend
            .parse()
            .map_err(|e: String| anyhow::anyhow!(e))?,
        batch_window: Duration::from_millis(spec.batch_ms),
        rescan: (spec.rescan_s > 0).then(|| Duration::from_secs(spec.rescan_s)),
        journal: journal_for(spec),
        output: Output::Log,
        max_files: 50_000,
    };
    let res = EngineResources::new(&resources())?;
    super::run(
        job,
        target,
        res,
        stats.clone(),
        Arc::new(AtomicBool::new(false)),
    )
}

/// Start every job of the config; each runs on its own thread for the
/// daemon's life. `daemon_key`: the key file jobs use for their
/// destination daemon unless they name their own.
pub fn start(specs: &[ReplicateSpec], shared: &DaemonShared, daemon_key: &Path) {
    for spec in specs {
        let stats = Arc::new(JobStats::new(&spec.name, &spec.source, &spec.dest));
        shared.jobs.add(stats.clone());
        let (spec, key) = (spec.clone(), daemon_key.to_path_buf());
        let name = spec.name.clone();
        let started = std::thread::Builder::new()
            .name(format!("job-{name}"))
            .spawn(move || loop {
                JobStats::set(&stats.state, "starting");
                if let Err(e) = run_once(&spec, &key, &stats) {
                    tracing::warn!("replicate {}: {e:#}; starting again in 30 s", spec.name);
                    JobStats::set(&stats.last_error, format!("{e:#}"));
                    JobStats::set(&stats.state, "failed");
                }
                std::thread::sleep(RESTART);
            });
        if let Err(e) = started {
            tracing::warn!("replicate {name}: cannot start: {e}");
        }
    }
}
