//! `ramsys sync --watch SRC DST` (issue 38): the agent's job, for every
//! kind of DST: a local directory (a daemon in this process on loopback,
//! as a local `cp`), a `ramsys://` daemon, or `[USER@]HOST:PATH` (ssh-serve
//! started with `--until-eof`, serving the job's sessions until the agent
//! goes away).

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use ramsys_engine::daemon::jobs::JobStats;
use ramsys_engine::data::resources::ResourceConfig;
use ramsys_engine::EngineResources;

use super::{JobSpec, Output, Target};
use crate::agent::Plan;
use crate::args::SyncArgs;
use crate::spec::Endpoint;

/// What `--watch` cannot be combined with, in one line each.
fn refuse_combinations(a: &SyncArgs, sync: u32) -> anyhow::Result<()> {
    use ramsys_engine::request::sync::flags::DRY_RUN;
    anyhow::ensure!(
        sync & DRY_RUN == 0,
        "--watch cannot be combined with --dry-run"
    );
    anyhow::ensure!(
        a.cp.select.files_from.is_none(),
        "--watch cannot be combined with --files-from (the job lists what changed)"
    );
    anyhow::ensure!(!a.cp.stripe, "--watch cannot be combined with --stripe");
    Ok(())
}

pub fn run(a: &SyncArgs, sync: u32) -> anyhow::Result<i32> {
    refuse_combinations(a, sync)?;
    let mut plan = Plan::resolve(&a.cp, sync)?;
    ramsys_engine::transport::tcp::use_congestion(a.cp.congestion.as_deref())
        .map_err(|e| anyhow::anyhow!(e))?;
    ramsys_engine::storage::fsops::raise_nofile_limit();
    let src = match plan.srcs.as_slice() {
        [Endpoint::Local(p)] => p.clone(),
        [_] => bail!(
            "--watch needs a local source directory (a daemon replicates its own trees: \
             [[replicate]] in its config, docs/WATCH.md)"
        ),
        _ => bail!("--watch takes one source directory"),
    };
    anyhow::ensure!(
        std::fs::metadata(&src).is_ok_and(|m| m.is_dir()),
        "--watch: {} is not a directory",
        src.display()
    );
    let source = std::path::absolute(&src)?.canonicalize()?;
    let top = crate::agent::local_tops(std::slice::from_ref(&src), &plan.contents)?.remove(0);
    if plan.copy_range && matches!(plan.dst, Endpoint::Local(_)) {
        // Large files go from file to file in the kernel (engine
        // storage::local): the sink is this process's own daemon.
        plan.opts.local_copy = Some(Default::default());
    }
    let target = target(a, &mut plan, &source)?;
    let journal = a.watch.watch_journal.clone().unwrap_or_else(|| {
        super::default_journal(&format!("{} -> {}", source.display(), target.shown))
    });
    let mirror = sync & ramsys_engine::request::sync::flags::DELETE != 0;
    let spec = JobSpec {
        name: "watch".into(),
        source: source.clone(),
        top,
        opts: plan.opts.clone(),
        pending: a.watch.pending(mirror),
        backend: a.watch.watch_backend,
        batch_window: Duration::from_millis(a.watch.watch_batch),
        rescan: (a.watch.watch_rescan > 0).then(|| Duration::from_secs(a.watch.watch_rescan)),
        journal,
        output: if plan.json {
            Output::Json
        } else {
            Output::Human
        },
        max_files: 50_000,
    };
    let src_cfg = ResourceConfig {
        memory: (plan.memory / 3).max(plan.block_size * 8),
        ..plan.res_cfg.clone()
    };
    let res = EngineResources::new(&src_cfg)?;
    let stats = Arc::new(JobStats::new(
        "watch",
        &source.display().to_string(),
        &target.shown,
    ));
    super::run(spec, target, res, stats, Arc::new(AtomicBool::new(false)))?;
    Ok(0)
}

/// Reach DST for the job's life.
fn target(a: &SyncArgs, plan: &mut Plan, source: &Path) -> anyhow::Result<Target> {
    match plan.dst.clone() {
        Endpoint::Local(d) => {
            let abs = std::path::absolute(&d)?;
            let canon = abs.canonicalize().unwrap_or(abs);
            anyhow::ensure!(
                !canon.starts_with(source),
                "--watch: the destination {} is inside the source",
                d.display()
            );
            Target::local(&d, &plan.opts, &plan.res_cfg, plan.connect_timeout)
        }
        Endpoint::Daemon { mut addr, path } => {
            let mut e = Endpoint::Daemon { addr, path };
            crate::pick::resolve(&mut e, &|| a.cp.load_key(), plan.connect_timeout)?;
            let Endpoint::Daemon {
                addr: resolved,
                path,
            } = e
            else {
                unreachable!("pick keeps a daemon a daemon")
            };
            addr = resolved;
            Ok(Target {
                transport: crate::agent::tcp(),
                shown: format!("ramsys://{addr}/{}", String::from_utf8_lossy(&path)),
                addr,
                key: a.cp.load_key()?,
                user: None,
                connect_timeout: plan.connect_timeout,
                dest: path,
                _keep: Vec::new(),
                pools: Vec::new(),
            })
        }
        Endpoint::Ssh(e) => {
            let shown = e.display();
            // ssh-serve keeps serving (one credential, many sessions) until
            // this agent closes its stdin.
            crate::ssh::KEEP_SERVING.store(true, std::sync::atomic::Ordering::Relaxed);
            let ssh = crate::ssh::open(&a.cp, &mut plan.srcs, &mut plan.dst)?;
            let Endpoint::Daemon { addr, path } = plan.dst.clone() else {
                bail!("{shown}: ssh endpoint not resolved")
            };
            let transport = ssh.transport(&a.cp).unwrap_or_else(crate::agent::tcp);
            if let Some(u) = ssh.user() {
                std::env::set_var("RAMSYS_USER", u);
            }
            Ok(Target {
                transport,
                addr,
                key: ssh.key().unwrap_or_default(),
                user: ssh.user(),
                connect_timeout: plan.connect_timeout,
                dest: path,
                shown,
                _keep: vec![Box::new(ssh)],
                pools: Vec::new(),
            })
        }
    }
}
