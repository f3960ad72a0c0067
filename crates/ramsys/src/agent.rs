//! `ramsys cp`: the agent. It turns the command line into one session with
//! a daemon (push or pull), or, for two local paths, runs a sink engine in
//! this process behind a loopback daemon so the local copy takes exactly
//! the same path as a remote one.

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ramsys_engine::data::resources::ResourceConfig;
use ramsys_engine::request::walk::Top;
use ramsys_engine::roles::client::{pull, push, Remote};
use ramsys_engine::roles::server::Daemon;
use ramsys_engine::storage::fsops::{Confinement, Root};
use ramsys_engine::transport::path;
use ramsys_engine::transport::tcp::Tcp;
use ramsys_engine::transport::Transport;
use ramsys_engine::types::stats::process_cpu_seconds;
use ramsys_engine::{EngineError, EngineResources, Report, Stats, TransferOptions};

use ramsys_topo::Role;

use crate::args::{CpArgs, SyncArgs};
use crate::numa::{Fixed, Numa};
use crate::progress::Progress;
use crate::spec::{local_sink, parse_endpoint, Endpoint};

/// Top-level sources as the walk names them. `contents[i]`: source i was
/// written `DIR/` (or `.`) in a sync, so its contents land in DST itself
/// (rsync's rule; an empty name is the destination, roles::sink::dest).
pub(crate) fn local_tops(paths: &[PathBuf], contents: &[bool]) -> anyhow::Result<Vec<Top>> {
    let mut tops = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        let abs = std::path::absolute(p).with_context(|| format!("{}", p.display()))?;
        let name = match abs.file_name() {
            _ if contents.get(i) == Some(&true) => Default::default(),
            Some(n) if n != "." && n != ".." => n.to_os_string(),
            _ => abs
                .canonicalize()
                .ok()
                .and_then(|c| c.file_name().map(|n| n.to_os_string()))
                .unwrap_or_else(|| "root".into()),
        };
        // A symlink to a block device (/dev/vg/snap) names the device: it
        // is read under its own path, sent under the link's name.
        let abs = match std::fs::metadata(&abs) {
            Ok(md) if md.file_type().is_block_device() && abs.is_symlink() => {
                abs.canonicalize().unwrap_or(abs)
            }
            _ => abs,
        };
        let rel = abs.as_os_str().as_bytes();
        let rel = rel.strip_prefix(b"/").unwrap_or(rel).to_vec();
        tops.push(Top {
            rel,
            name: name.as_bytes().to_vec(),
        });
    }
    Ok(tops)
}

pub(crate) fn open_root(p: &Path, c: Confinement) -> anyhow::Result<Arc<Root>> {
    Ok(Arc::new(
        Root::open(p, c).with_context(|| format!("cannot open {}", p.display()))?,
    ))
}

pub fn run_sync(a: &SyncArgs) -> anyhow::Result<i32> {
    run_with(&a.cp, sync_flags(a))
}

/// The sync bits `sync`'s flags ask for (docs/SYNC.md).
pub fn sync_flags(a: &SyncArgs) -> u32 {
    use ramsys_engine::request::sync::flags::*;
    let mut f = SYNC;
    if a.checksum {
        f |= CHECKSUM;
    }
    if a.delete {
        f |= DELETE;
    }
    if a.dry_run {
        f |= DRY_RUN;
    }
    f | a.cp.sink_flags()
}

pub fn run(a: &CpArgs) -> anyhow::Result<i32> {
    run_with(a, a.sink_flags())
}

/// A transfer resolved once from cp's or sync's arguments (issue 16): the
/// endpoints, the options every end starts from, the resources an engine
/// of this process gets, and what the NUMA planner may not override. It is
/// handed down whole to the function that runs the transfer.
pub(crate) struct Plan {
    pub(crate) srcs: Vec<Endpoint>,
    pub(crate) dst: Endpoint,
    /// Per source: its contents go into DST (rsync's `SRC/` rule, sync).
    pub(crate) contents: Vec<bool>,
    pub(crate) opts: TransferOptions,
    pub(crate) res_cfg: ResourceConfig,
    fixed: Fixed,
    channels: ramsys_topo::ChannelPolicy,
    /// `--transport`, `--raw-iface` (crate::rawpick).
    raw: crate::rawpick::RawArgs,
    pub(crate) connect_timeout: Duration,
    /// The local copy's source engine takes this share of --memory.
    pub(crate) memory: usize,
    pub(crate) block_size: usize,
    /// A local copy moves large files with copy_file_range.
    pub(crate) copy_range: bool,
    pub(crate) json: bool,
}

/// The most streams the agent sizes a long path to without --streams
/// (transport::path): 100 ms at 10 Gb/s wants 45; the buffer pool's own
/// bound (21 with the default 192 MiB) usually comes first.
const AUTO_MAX_STREAMS: usize = 32;

/// Where the sources are, once ssh endpoints became daemons.
struct Sources {
    local: Vec<PathBuf>,
    /// (daemon address, path); a daemon source names contents with a
    /// trailing '/' (docs/PROTOCOL.md).
    remote: Vec<(String, Vec<u8>)>,
}

impl Plan {
    pub(crate) fn resolve(a: &CpArgs, sync: u32) -> anyhow::Result<Plan> {
        let (dst, srcs) = a.paths.split_last().expect("clap requires two paths");
        // rsync's rule for sync: `SRC/` sends SRC's contents into DST; with
        // --files-from every source is sent as its contents (rsync's too).
        let files_from = a.select.files_from.is_some();
        let sync_on = sync & ramsys_engine::request::sync::flags::SYNC != 0;
        let contents = srcs
            .iter()
            .map(|s| files_from || sync_on && crate::spec::names_contents(s))
            .collect();
        let dst = parse_endpoint(dst)?;
        let srcs: Vec<Endpoint> = srcs
            .iter()
            .map(|s| parse_endpoint(s))
            .collect::<Result<_, _>>()?;
        anyhow::ensure!(
            a.block_size >= 4096 && a.block_size <= 64 << 20,
            "--block-size must be between 4K and 64M"
        );
        let local_copy = matches!(dst, Endpoint::Local(_))
            && srcs.iter().all(|s| matches!(s, Endpoint::Local(_)));
        let mut opts = TransferOptions {
            streams: a.streams.unwrap_or(4),
            // No --streams: sized from the path when connecting (issue
            // 21); a local copy's path is this host's memory.
            auto_streams: a.streams.is_none() && !local_copy,
            block_size: a.block_size as u32,
            checksum: !a.no_checksum,
            // --files-from walks the source directory to reach the listed
            // paths; -r only decides what below a listed directory goes.
            // -a implies -r (rsync's rule).
            recursive: a.recursive || a.archive.archive || files_from,
            readers: a.readers.unwrap_or(4).max(1),
            readers_fixed: a.readers.is_some(),
            writers: a.writers.unwrap_or(4).max(1),
            window: a.window.max(2),
            fsync: a.fsync,
            idle_timeout: ramsys_engine::session::options::idle_timeout(a.timeout),
            sync,
            encrypt: a.encrypt.unwrap_or_default(),
            select: a.select.selection(a.recursive || a.archive.archive)?,
            preserve: a.archive.preserve(),
            ..a.storage.options()
        };
        // --bwlimit: one bucket for all this transfer's streams (data::rate);
        // a daemon or ssh source gets it in Control::BwLimit.
        if let Some(bw) = a.bwlimit.filter(|&b| b > 0) {
            opts.rate = ramsys_engine::data::rate::Limits::session("agent", bw);
            if let Some(cap) = opts.rate.block_cap() {
                opts.block_size = opts.block_size.min(cap);
            }
        }
        // --delete leaves files the rules exclude (the sink gets the rules),
        // but a file skipped for its size at the source cannot be told from
        // one the source no longer has: refuse rather than delete it.
        anyhow::ensure!(
            (opts.select.min_size == 0 && opts.select.max_size == 0)
                || sync & ramsys_engine::request::sync::flags::DELETE == 0,
            "--delete cannot be combined with --min-size/--max-size \
             (it would delete the destination's copies of the skipped files)"
        );
        let res_cfg = ResourceConfig {
            memory: a.memory as usize,
            buffer_size: a.block_size as usize,
            readers: opts.readers,
            writers: opts.writers,
            // Threads for as many streams as a long path may get and the
            // buffer pool can feed (transport::path); created parked.
            max_streams: if opts.auto_streams {
                let buffers = a.memory as usize / (a.block_size as usize).max(1);
                let src = path::pool_max_streams(buffers, opts.readers, 0, true);
                let snk = path::pool_max_streams(buffers, 0, opts.window as usize, false);
                (src.max(snk) as usize).clamp(opts.streams as usize, AUTO_MAX_STREAMS)
            } else {
                opts.streams as usize
            },
            ..Default::default()
        };
        Ok(Plan {
            srcs,
            dst,
            contents,
            opts,
            res_cfg,
            fixed: Fixed {
                streams: a.streams,
                readers: a.readers,
                writers: a.writers,
            },
            channels: a.channels,
            raw: a.raw.clone(),
            connect_timeout: Duration::from_secs(a.connect_timeout.max(1)),
            memory: a.memory as usize,
            block_size: a.block_size as usize,
            // A rate limit counts blocks' payload: no kernel-side copies.
            copy_range: !a.no_copy_range && a.bwlimit.is_none_or(|b| b == 0),
            json: a.json,
        })
    }

    /// Local and remote sources: all local, or all on one daemon.
    fn sources(&self) -> anyhow::Result<Sources> {
        let local: Vec<PathBuf> = self
            .srcs
            .iter()
            .filter_map(|s| match s {
                Endpoint::Local(p) => Some(p.clone()),
                _ => None,
            })
            .collect();
        let remote: Vec<(String, Vec<u8>)> = self
            .srcs
            .iter()
            .zip(&self.contents)
            .filter_map(|(s, &c)| match s {
                Endpoint::Daemon { addr, path } if c => {
                    Some((addr.clone(), [path, &b"/"[..]].concat()))
                }
                Endpoint::Daemon { addr, path } => Some((addr.clone(), path.clone())),
                _ => None,
            })
            .collect();
        if !local.is_empty() && !remote.is_empty() {
            bail!("sources must be all local or all on one daemon");
        }
        if remote.iter().any(|(a, _)| *a != remote[0].0) {
            bail!("all remote sources must be on the same daemon");
        }
        Ok(Sources { local, remote })
    }
}

/// What every way of running a transfer shares.
struct Run<'a> {
    plan: &'a Plan,
    numa: Numa,
    stats: Arc<Stats>,
    key: &'a dyn Fn() -> anyhow::Result<Vec<u8>>,
    /// How to reach an ssh end (direct, or through ssh: crate::tunnel);
    /// None: plain TCP through the NUMA layer's channels.
    via_ssh: Option<Arc<dyn Transport>>,
    /// The daemon that redirected this transfer here (Control::Redirected).
    redirected_from: Option<String>,
    /// `--transport auto` fell back to TCP: why (the summary says so).
    raw_fallback: Option<String>,
}

fn run_with(a: &CpArgs, sync: u32) -> anyhow::Result<i32> {
    // `DST/` names a directory (issue 35): the sink reads it so.
    let sync = match a.paths.last() {
        Some(d) if crate::spec::names_dir(d) => {
            sync | ramsys_engine::request::sync::flags::DEST_DIR
        }
        _ => sync,
    };
    let mut plan = Plan::resolve(a, sync)?;
    // Before any link is opened: every TCP link of this process uses it.
    ramsys_engine::transport::tcp::use_congestion(a.congestion.as_deref())
        .map_err(|e| anyhow::anyhow!(e))?;
    // Daemon to daemon (issue 19): the source daemon pushes (crate::pairs).
    if matches!(plan.dst, Endpoint::Daemon { .. })
        && !plan.srcs.is_empty()
        && plan
            .srcs
            .iter()
            .all(|s| matches!(s, Endpoint::Daemon { .. }))
    {
        return run_pairs(a, &mut plan, sync);
    }
    if a.stripe {
        return run_striped(a, &plan, sync);
    }
    // ramsys://A,B,C/PATH: the least-loaded daemon of the list (pick.rs).
    for e in plan.srcs.iter_mut().chain(std::iter::once(&mut plan.dst)) {
        crate::pick::resolve(e, &|| a.key.load(), plan.connect_timeout)?;
    }
    crate_raise_limits();
    // HOST:PATH endpoints (issue 9): a third-party copy runs on the hosts;
    // otherwise the ssh end becomes a one-session daemon (crate::ssh).
    if let Some(code) = crate::ssh::third_party(a, sync, &plan.srcs, &plan.dst)? {
        return Ok(code);
    }
    let ssh = crate::ssh::open(a, &mut plan.srcs, &mut plan.dst)?;
    if let Some(u) = ssh.user() {
        // A running daemon's one-time credential names the user to
        // authenticate as; session::current_user reads it. Set before any
        // engine thread starts.
        std::env::set_var("RAMSYS_USER", u);
    }
    let ssh_key = ssh.key();
    let load_key = || match ssh_key.clone() {
        Some(k) => Ok(k),
        None => a.load_key(),
    };
    let srcs = plan.sources()?;
    let mut run = Run {
        plan: &plan,
        numa: Numa::new(a.numa, a.explain),
        stats: Arc::new(Stats::default()),
        key: &load_key,
        via_ssh: ssh.transport(a),
        redirected_from: None,
        raw_fallback: None,
    };
    let t0 = Instant::now();
    let cpu0 = process_cpu_seconds();
    let (result, redirect) = run.following_redirect(&srcs)?;
    let wall = t0.elapsed().as_secs_f64();
    let cpu = process_cpu_seconds() - cpu0;
    ssh.finish();
    if let Ok(rep) = &result {
        run.numa.streams(rep);
    }
    let transport = Carried {
        requested: plan.raw.transport,
        fallback: run.raw_fallback.clone(),
        local: matches!(plan.dst, Endpoint::Local(_)) && srcs.remote.is_empty(),
    };
    if let Ok(rep) = &result {
        let why = match &transport.fallback {
            Some(why) => format!("; raw channels not used: {why}"),
            None => String::new(),
        };
        run.numa.note(format!(
            "transport: {} (--transport {}){why}",
            transport.used(rep),
            transport.requested()
        ));
    }
    run.numa.print();
    let extra = Extra {
        redirect,
        stripes: None,
        transport,
    };
    report(result, &run.stats, wall, cpu, plan.json, sync, extra)
}

/// `--stripe` (crate::stripe): one push over every listed daemon.
fn run_striped(a: &CpArgs, plan: &Plan, sync: u32) -> anyhow::Result<i32> {
    let Endpoint::Daemon { addr, path } = &plan.dst else {
        bail!("--stripe: the destination must be ramsys://A,B,C/PATH (daemons sharing PATH)")
    };
    let local: Vec<PathBuf> = plan
        .srcs
        .iter()
        .map(|s| match s {
            Endpoint::Local(p) => Ok(p.clone()),
            _ => Err(anyhow::anyhow!("--stripe: the sources must be local paths")),
        })
        .collect::<anyhow::Result<_>>()?;
    anyhow::ensure!(
        sync & ramsys_engine::request::sync::flags::DELETE == 0,
        "--stripe cannot be combined with --delete (each daemon sees only its share)"
    );
    anyhow::ensure!(
        a.select.files_from.is_none(),
        "--stripe cannot be combined with --files-from (the shares are file lists)"
    );
    crate_raise_limits();
    let job = crate::stripe::Job {
        daemons: addr
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
        dest: path.clone(),
        tops: local_tops(&local, &plan.contents)?,
        opts: plan.opts.clone(),
        res_cfg: plan.res_cfg.clone(),
        connect_timeout: plan.connect_timeout,
        key: a.load_key()?,
    };
    let t0 = Instant::now();
    let cpu0 = process_cpu_seconds();
    let (result, stripes) = crate::stripe::run(job, plan.json)?;
    let (wall, cpu) = (t0.elapsed().as_secs_f64(), process_cpu_seconds() - cpu0);
    if a.explain && !plan.json {
        for s in &stripes {
            say!(
                "stripe {}: share {} files, {} bytes; moved {} files, {} bytes{}",
                s.daemon,
                s.share_files,
                s.share_bytes,
                s.files,
                s.bytes,
                s.error
                    .as_ref()
                    .map(|e| format!("; failed: {e}"))
                    .unwrap_or_default()
            );
        }
    }
    let stats = Stats::default();
    let extra = Extra {
        stripes: Some(stripes),
        ..Default::default()
    };
    report(result, &stats, wall, cpu, plan.json, sync, extra)
}

/// `ramsys://A/SRC ramsys://B/DST` (crate::pairs): the source daemon
/// pushes to the sink daemon; with `--stripe`, pair by pair over lists.
fn run_pairs(a: &CpArgs, plan: &mut Plan, sync: u32) -> anyhow::Result<i32> {
    use ramsys_engine::request::sync::flags::{DELETE, DRY_RUN};
    anyhow::ensure!(
        sync & (DELETE | DRY_RUN) == 0,
        "a third-party transfer (daemon to daemon) cannot be combined with --delete or --dry-run"
    );
    anyhow::ensure!(
        !a.stripe || a.select.files_from.is_none(),
        "--stripe cannot be combined with --files-from (the shares are file lists)"
    );
    anyhow::ensure!(
        !a.split_sources || a.stripe,
        "--split-sources goes with --stripe"
    );
    if !a.stripe {
        // ramsys://A,B,C/PATH: the least-loaded daemon of each list.
        for e in plan.srcs.iter_mut().chain(std::iter::once(&mut plan.dst)) {
            crate::pick::resolve(e, &|| a.load_key(), plan.connect_timeout)?;
        }
    }
    let srcs = plan.sources()?;
    let Endpoint::Daemon { addr: sinks, path } = &plan.dst else {
        unreachable!("run_pairs is called with a daemon destination")
    };
    let o = &plan.opts;
    let req = ramsys_proto::control::Relay {
        sink: String::new(),
        paths: srcs.remote.iter().map(|(_, p)| p.clone()).collect(),
        dest: path.clone(),
        recursive: o.recursive,
        streams: if o.auto_streams { 0 } else { o.streams },
        block_size: o.block_size,
        checksum: o.checksum,
        flags: sync,
        select: o.select.clone(),
        preserve: o.preserve,
        bwlimit: a.bwlimit.unwrap_or(0),
        cipher: o.encrypt.id(),
        share: None,
    };
    let job = crate::pairs::Job {
        sources: crate::pairs::daemons(&srcs.remote[0].0),
        sinks: crate::pairs::daemons(sinks),
        relay: req,
        key: a.load_key()?,
        connect_timeout: plan.connect_timeout,
        idle: o.idle_timeout,
        split: a.split_sources,
        json: plan.json,
    };
    let t0 = Instant::now();
    let cpu0 = process_cpu_seconds();
    let stats = Arc::new(Stats::default());
    let (result, stripes) = if a.stripe {
        let (r, s) = crate::pairs::striped(job)?;
        (r, Some(s))
    } else {
        (crate::pairs::single(job, stats.clone()), None)
    };
    let (wall, cpu) = (t0.elapsed().as_secs_f64(), process_cpu_seconds() - cpu0);
    if a.explain && !plan.json {
        for s in stripes.iter().flatten() {
            say!(
                "pair {} -> {}: share {} files, {} bytes; moved {} files, {} bytes{}",
                s.daemon,
                s.sink.as_deref().unwrap_or_default(),
                s.share_files,
                s.share_bytes,
                s.files,
                s.bytes,
                s.error
                    .as_ref()
                    .map(|e| format!("; failed: {e}"))
                    .unwrap_or_default()
            );
        }
    }
    let extra = Extra {
        stripes,
        ..Default::default()
    };
    report(result, &stats, wall, cpu, plan.json, sync, extra)
}

/// What a run adds to the summary beyond the engine's report.
#[derive(Default)]
struct Extra {
    /// A busy daemon sent the session to a peer (issue 19).
    redirect: Option<crate::pick::Redirect>,
    /// `--stripe`: each daemon's share.
    stripes: Option<Vec<crate::stripe::Stripe>>,
    /// What carried the data (issue 35).
    transport: Carried,
}

/// What carried a run's data, as the summary names it (issue 35).
#[derive(Default)]
struct Carried {
    /// `--transport`.
    requested: ramsys_engine::transport::rawlink::Mode,
    /// `auto` found no raw channel: why.
    fallback: Option<String>,
    /// Both ends on this host (the in-process sink; links on loopback).
    local: bool,
}

impl Carried {
    /// "local", or the data links' kinds ("tcp", "raw", "ssh"; several
    /// joined with "+"); a run without links of its own (daemon to
    /// daemon) is "tcp".
    fn used(&self, rep: &Report) -> String {
        if self.local {
            return "local".into();
        }
        let mut kinds: Vec<&str> = rep.links.iter().map(|l| l.kind).collect();
        kinds.sort_unstable();
        kinds.dedup();
        if kinds.is_empty() {
            "tcp".into()
        } else {
            kinds.join("+")
        }
    }

    fn requested(&self) -> &'static str {
        use ramsys_engine::transport::rawlink::Mode;
        match self.requested {
            Mode::Tcp => "tcp",
            Mode::Raw => "raw",
            Mode::Auto => "auto",
        }
    }
}

/// `--transport raw|auto`: data links as raw channels (crate::rawpick).
fn raw_links(
    plan: &Plan,
    via_ssh: bool,
    addr: &str,
    key: &[u8],
    buffer_node: Option<u32>,
    control: Arc<dyn Transport>,
) -> anyhow::Result<(Arc<dyn Transport>, Option<String>)> {
    let d = crate::rawpick::Daemon {
        addr,
        key,
        timeout: plan.connect_timeout,
        via_ssh,
    };
    crate::rawpick::data_transport(&plan.raw, &d, plan.channels, buffer_node, control)
}

impl Run<'_> {
    /// The transfer; a busy daemon may send the session to a peer of its
    /// site (issue 19): run it there instead, once. The outcome, and the
    /// redirect followed.
    fn following_redirect(
        &mut self,
        srcs: &Sources,
    ) -> anyhow::Result<(Result<Report, EngineError>, Option<crate::pick::Redirect>)> {
        let mut redirect: Option<crate::pick::Redirect> = None;
        let result = loop {
            let to = redirect.as_ref().map(|r| r.to.clone());
            let (from, r) = self.attempt(srcs, to)?;
            let Err(EngineError::Redirected { to, reason, .. }) = r else {
                break r;
            };
            match crate::pick::follow(redirect.as_ref(), &from, &to, &reason) {
                Ok(r) => {
                    // Every mode says where the data goes (issue 34); the
                    // JSON summary names it too ("redirect").
                    say!(
                        "ramsys: {}",
                        crate::pick::redirect_line(&from, &to, &reason)
                    );
                    self.redirected_from = Some(from);
                    self.stats = Arc::new(Stats::default());
                    redirect = Some(r);
                }
                Err(e) => break Err(EngineError::Local(e)),
            }
        };
        Ok((result, redirect))
    }

    /// One attempt: a push, a pull or a local copy, to the daemon `to` a
    /// Redirect named when there is one; the daemon it went to, and how it
    /// ended.
    fn attempt(
        &mut self,
        srcs: &Sources,
        to: Option<String>,
    ) -> anyhow::Result<(String, Result<Report, EngineError>)> {
        let plan = self.plan;
        Ok(match (&plan.dst, srcs.remote.is_empty()) {
            (Endpoint::Daemon { addr, path }, true) => {
                let addr = to.unwrap_or_else(|| addr.clone());
                let r = self.push_to(&addr, path, &srcs.local)?;
                (addr, r)
            }
            (Endpoint::Local(d), false) => {
                let mut remote = srcs.remote.clone();
                if let Some(to) = to {
                    remote.iter_mut().for_each(|r| r.0 = to.clone());
                }
                let addr = remote[0].0.clone();
                (addr, self.pull_from(d, remote)?)
            }
            (Endpoint::Local(d), true) => (String::new(), self.copy_locally(d, &srcs.local)?),
            (Endpoint::Daemon { .. }, false) => {
                bail!(
                    "an ssh source to a daemon destination is not supported \
                     (between two daemons, ramsys://A/SRC ramsys://B/DST is)"
                )
            }
            // crate::ssh::open turned every ssh destination into a daemon.
            (Endpoint::Ssh(e), _) => bail!("{}: ssh endpoint not resolved", e.display()),
        })
    }

    /// Local sources to a daemon (or an ssh end turned daemon).
    fn push_to(&mut self, addr: &str, path: &[u8], local: &[PathBuf]) -> Attempt {
        let (plan, numa) = (self.plan, &mut self.numa);
        let key = (self.key)()?;
        let src = local.first().map(|p| p.as_path());
        let cfg = numa.configure("source", Role::Source, src, Some(addr), &plan.res_cfg);
        let mut opts = plan.opts.clone();
        opts.redirected_from = self.redirected_from.clone();
        numa.follow("source", Role::Source, &mut opts, &plan.fixed);
        let res = EngineResources::new(&cfg)?;
        numa.buffers("source", &res);
        let transport = match &self.via_ssh {
            Some(t) => t.clone(),
            None => numa.channels(addr, plan.channels, cfg.buffer_node, tcp()),
        };
        let (transport, fallback) = raw_links(
            plan,
            self.via_ssh.is_some(),
            addr,
            &key,
            cfg.buffer_node,
            transport,
        )?;
        self.raw_fallback = fallback;
        let remote = Remote {
            transport,
            addr: addr.to_string(),
            key,
            connect_timeout: plan.connect_timeout,
            user: None,
        };
        let root = open_root(Path::new("/"), Confinement::None)?;
        let tops = local_tops(local, &plan.contents)?;
        let progress = Progress::start(self.stats.clone(), plan.json);
        let r = push(
            &remote,
            root,
            tops,
            path.to_vec(),
            &opts,
            &res,
            self.stats.clone(),
        );
        progress.finish();
        numa.threads("source", &res);
        Ok(r)
    }

    /// Sources on a daemon to a local destination.
    fn pull_from(&mut self, d: &Path, remote: Vec<(String, Vec<u8>)>) -> Attempt {
        let (plan, numa) = (self.plan, &mut self.numa);
        let key = (self.key)()?;
        let addr = remote[0].0.clone();
        let cfg = numa.configure("sink", Role::Sink, Some(d), Some(&addr), &plan.res_cfg);
        let mut opts = plan.opts.clone();
        opts.redirected_from = self.redirected_from.clone();
        numa.follow("sink", Role::Sink, &mut opts, &plan.fixed);
        let res = EngineResources::new(&cfg)?;
        numa.buffers("sink", &res);
        let transport = match &self.via_ssh {
            Some(t) => t.clone(),
            None => numa.channels(&addr, plan.channels, cfg.buffer_node, tcp()),
        };
        let (transport, fallback) = raw_links(
            plan,
            self.via_ssh.is_some(),
            &addr,
            &key,
            cfg.buffer_node,
            transport,
        )?;
        self.raw_fallback = fallback;
        let remote_end = Remote {
            transport,
            addr,
            key,
            connect_timeout: plan.connect_timeout,
            user: None,
        };
        let (root, dest) = local_sink(d)?;
        let root = open_root(&root, Confinement::Strict)?;
        let progress = Progress::start(self.stats.clone(), plan.json);
        let paths = remote.into_iter().map(|(_, p)| p).collect();
        let r = pull(
            &remote_end,
            paths,
            root,
            dest,
            &opts,
            &res,
            self.stats.clone(),
        );
        progress.finish();
        numa.threads("sink", &res);
        Ok(r)
    }

    /// Local copy: an in-process daemon on loopback is the sink.
    fn copy_locally(&mut self, d: &Path, local: &[PathBuf]) -> Attempt {
        let (plan, numa) = (self.plan, &mut self.numa);
        if plan.raw.transport == ramsys_engine::transport::rawlink::Mode::Raw {
            bail!("--transport raw: a local copy has no network link (give a ramsys:// end)");
        }
        let (root, dest) = local_sink(d)?;
        let mut key = vec![0u8; 32];
        getrandom_fill(&mut key);
        let lo = Some("127.0.0.1:1");
        let sink_cfg = numa.configure("sink", Role::Sink, Some(d), lo, &plan.res_cfg);
        let sink_res = EngineResources::new(&sink_cfg)?;
        numa.buffers("sink", &sink_res);
        let mut opts = plan.opts.clone();
        if plan.copy_range {
            // Large files' data goes from file to file in the kernel
            // (engine storage::local); the bridge is this process's own.
            opts.local_copy = Some(Default::default());
        }
        let mut sink_opts = opts.clone();
        numa.follow("sink", Role::Sink, &mut sink_opts, &plan.fixed);
        let daemon = Daemon::bind("127.0.0.1:0", &root, key.clone(), sink_opts, sink_res)?;
        let addr = daemon.local_addr().to_string();
        let sink_shared = daemon.shared();
        daemon.spawn();
        let src_cfg = ResourceConfig {
            memory: (plan.memory / 3).max(plan.block_size * 8),
            ..plan.res_cfg.clone()
        };
        let src = local.first().map(|p| p.as_path());
        let src_cfg = numa.configure("source", Role::Source, src, Some(&addr), &src_cfg);
        numa.follow("source", Role::Source, &mut opts, &plan.fixed);
        let res = EngineResources::new(&src_cfg)?;
        numa.buffers("source", &res);
        let remote = Remote {
            transport: tcp(),
            addr,
            key,
            connect_timeout: plan.connect_timeout,
            user: None,
        };
        let src_root = open_root(Path::new("/"), Confinement::None)?;
        let tops = local_tops(local, &plan.contents)?;
        let progress = Progress::start(self.stats.clone(), plan.json);
        let r = push(
            &remote,
            src_root,
            tops,
            dest,
            &opts,
            &res,
            self.stats.clone(),
        );
        progress.finish();
        numa.threads("source", &res);
        numa.threads("sink", &sink_shared.res);
        Ok(r)
    }
}

/// A transfer's outcome: setting it up may fail (the outer error, a
/// plain message), and so may the session (the engine's error, which the
/// summary reports).
type Attempt = anyhow::Result<Result<Report, ramsys_engine::EngineError>>;

/// Plain TCP; the NUMA layer may replace it with per-NIC channels.
pub(crate) fn tcp() -> Arc<dyn Transport> {
    Arc::new(Tcp {
        socket_buffer: None,
    })
}

/// The summary (or the JSON line), and the exit code.
fn report(
    result: Result<Report, ramsys_engine::EngineError>,
    stats: &Stats,
    wall: f64,
    cpu: f64,
    json: bool,
    sync: u32,
    extra: Extra,
) -> anyhow::Result<i32> {
    match result {
        Ok(rep) => {
            let resent = stats.resends.load(std::sync::atomic::Ordering::Relaxed);
            if resent > 0 && !json {
                say!("ramsys: {resent} segments failed verification in flight and were sent again");
            }
            let setid = stats
                .setid_dropped
                .load(std::sync::atomic::Ordering::Relaxed);
            if setid > 0 {
                // A deliberate difference from rsync -p (issue 34; docs/SYNC.md).
                eprintln!(
                    "ramsys: note: set-user-ID/set-group-ID bits not kept on {} (they are kept \
                     with -a only; rsync -p keeps them; docs/SYNC.md \"Set-ID bits\")",
                    count(setid, "file", "files")
                );
            }
            let faults = LinkFaults::of(stats);
            if faults.lost > 0 && !json {
                say!(
                    "ramsys: {} data links lost, {} replaced ({} failed reconnect attempts)",
                    faults.lost,
                    faults.replaced,
                    faults.retries
                );
            }
            let run = RunFacts {
                wall,
                cpu,
                resent,
                faults,
                extra,
                memory: Memory::of(stats),
            };
            Ok(summarize(&rep, &run, json, sync))
        }
        Err(e) => {
            if json {
                // What moved before the failure, as the progress line had it.
                let bytes = stats.bytes.load(std::sync::atomic::Ordering::Relaxed);
                let mb_s = bytes as f64 / 1e6 / wall.max(1e-9);
                let line = serde_json::json!({
                    "event": "summary", "ok": false, "error": e.to_string(),
                    "files": stats.files.load(std::sync::atomic::Ordering::Relaxed),
                    "bytes": bytes, "wall_s": wall, "mb_s": mb_s, "cpu_s": cpu, "failed": [],
                    "redirect": extra.redirect, "stripes": extra.stripes,
                });
                println!("{line}");
            }
            Err(anyhow::anyhow!(e))
        }
    }
}

pub(crate) fn getrandom_fill(b: &mut [u8]) {
    let r = ramsys_engine::transport::crypto::random32();
    b.copy_from_slice(&r[..b.len()]);
}

fn crate_raise_limits() {
    ramsys_engine::storage::fsops::raise_nofile_limit();
}

/// Data links lost and replaced during the transfer (engine::relink).
struct LinkFaults {
    lost: u64,
    replaced: u64,
    retries: u64,
}

impl LinkFaults {
    fn of(s: &Stats) -> LinkFaults {
        use std::sync::atomic::Ordering::Relaxed;
        LinkFaults {
            lost: s.links_lost.load(Relaxed),
            replaced: s.links_replaced.load(Relaxed),
            retries: s.link_retries.load(Relaxed),
        }
    }
}

/// What the summary says of the run beyond the engine's report.
struct RunFacts {
    wall: f64,
    cpu: f64,
    resent: u64,
    faults: LinkFaults,
    extra: Extra,
    memory: Memory,
}

/// This process's memory for the summary (issue 36): its peak RSS, the
/// per-file state it accounted, and the peak per file of the tree.
struct Memory {
    peak_rss: u64,
    meta_bytes: u64,
    files: u64,
}

impl Memory {
    fn of(s: &Stats) -> Memory {
        use std::sync::atomic::Ordering::Relaxed;
        Memory {
            peak_rss: ramsys_engine::types::stats::process_rss().1,
            meta_bytes: s.meta_bytes.load(Relaxed),
            files: s.total_files.load(Relaxed),
        }
    }
}

fn summarize(rep: &Report, run: &RunFacts, json: bool, sync: u32) -> i32 {
    let RunFacts {
        wall,
        cpu,
        resent,
        ref faults,
        ..
    } = *run;
    let mb_s = rep.bytes as f64 / 1e6 / wall.max(1e-9);
    let dry = sync & ramsys_engine::request::sync::flags::DRY_RUN != 0;
    let carried = &run.extra.transport;
    let transport = carried.used(rep);
    if json {
        let mut line = serde_json::json!({
            "event": "summary",
            "ok": rep.failed.is_empty(),
            "files": rep.files,
            "bytes": rep.bytes,
            "wall_s": wall,
            "mb_s": mb_s,
            "files_s": rep.files as f64 / wall.max(1e-9),
            "cpu_s": cpu,
            "peer_cpu_s": rep.peer_cpu_s,
            "streams": rep.streams,
            "stream_choice": rep.stream_choice,
            "congestion": ramsys_engine::transport::tcp::congestion(),
            "block_size": rep.block_size,
            "failed": rep.failed,
            "resent": resent,
            "links_lost": faults.lost,
            "links_replaced": faults.replaced,
            "link_retries": faults.retries,
            "send_path": rep.send_path,
            "handoffs": rep.handoffs,
            "zerocopy_blocks": rep.zerocopy_blocks,
            "storage": rep.storage,
            "redirect": run.extra.redirect,
            // What carried the data (issue 35): "local", "tcp", "raw",
            // "ssh"; what was asked; why `auto` did not use raw channels;
            // each data link with its kind.
            "transport": transport,
            "transport_requested": carried.requested(),
            "transport_fallback": carried.fallback,
            "links": rep.links,
            // Memory (issue 36): this process's peak RSS, the per-file
            // state it accounted, and peak RSS per file of the tree.
            "peak_rss_bytes": run.memory.peak_rss,
            "meta_bytes": run.memory.meta_bytes,
            "rss_bytes_per_file": run.memory.peak_rss / run.memory.files.max(1),
        });
        if let Some(s) = &run.extra.stripes {
            line["stripes"] = serde_json::json!(s);
        }
        if sync & ramsys_engine::request::sync::COMPARE != 0 {
            // bytes = file data sent, files = files whose data was sent,
            // unchanged = files skipped (issue 10).
            line["unchanged"] = rep.unchanged.into();
            line["deleted"] = rep.deleted.len().into();
            line["deletions_skipped"] = deletions_skipped(rep, sync).into();
            line["dry_run"] = dry.into();
            if dry {
                line["would_send"] = serde_json::json!(rep.planned);
                line["would_delete"] = serde_json::json!(rep.deleted);
            }
        }
        let mut o = std::io::stdout().lock();
        let _ = writeln!(o, "{line}");
    } else {
        for f in &rep.failed {
            say!("ramsys: failed: {}: {}", f.path, f.reason);
        }
        if let Some(why) = &carried.fallback {
            eprintln!(
                "ramsys: --transport auto: raw channels not used ({why}); data went over TCP"
            );
        }
        if dry {
            for p in &rep.planned {
                tell!("would send {p}");
            }
            for p in &rep.deleted {
                tell!("would delete {p}");
            }
            println!(
                "dry run: {} would be sent, {} unchanged, {} would be deleted",
                count(rep.planned.len() as u64, "file", "files"),
                rep.unchanged,
                count(rep.deleted.len() as u64, "entry", "entries")
            );
            return i32::from(!rep.failed.is_empty());
        }
        println!("{}", human_line(rep, run, sync, &transport));
    }
    if rep.failed.is_empty() {
        0
    } else {
        1
    }
}

/// --delete was asked for and a failure (at either end, the source's scan
/// included) made the sink delete nothing (sink::tree::sync_epilogue):
/// any but a vanished source path (rsync's IOERR_VANISHED).
fn deletions_skipped(rep: &Report, sync: u32) -> bool {
    sync & ramsys_engine::request::sync::flags::DELETE != 0
        && rep.failed.iter().any(|f| !f.vanished())
}

/// `n thing` or `n things`.
fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The one summary line of a run (a sync's counts on the same line; issue
/// 35), e.g. `copied 1 file, 0.0 MB in 0.01 s (0.0 MB/s) over tcp (4
/// streams), cpu 0.01 s; 2 unchanged, 1 deleted`.
fn human_line(rep: &Report, run: &RunFacts, sync: u32, transport: &str) -> String {
    use ramsys_engine::request::sync::{flags::DELETE, COMPARE};
    let mb_s = rep.bytes as f64 / 1e6 / run.wall.max(1e-9);
    let over = match transport {
        "local" => "locally".to_string(),
        t if rep.streams > 0 => format!(
            "over {t} ({})",
            count(rep.streams as u64, "stream", "streams")
        ),
        t => format!("over {t}"),
    };
    let mut line = format!(
        "copied {}, {:.1} MB in {:.2} s ({:.1} MB/s) {over}, cpu {:.2} s",
        count(rep.files, "file", "files"),
        rep.bytes as f64 / 1e6,
        run.wall,
        mb_s,
        run.cpu,
    );
    let mut tail = Vec::new();
    if sync & COMPARE != 0 {
        tail.push(format!("{} unchanged", rep.unchanged));
    }
    if deletions_skipped(rep, sync) {
        // rsync's "IO error encountered -- skipping file deletion": an
        // unreadable source directory must not empty its copy.
        tail.push("nothing deleted after errors".to_string());
    } else if sync & DELETE != 0 || !rep.deleted.is_empty() {
        tail.push(format!("{} deleted", rep.deleted.len()));
    }
    if !rep.failed.is_empty() {
        tail.push(format!("{} failed", rep.failed.len()));
    }
    if !tail.is_empty() {
        line.push_str("; ");
        line.push_str(&tail.join(", "));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(transport: Carried) -> RunFacts {
        RunFacts {
            wall: 0.5,
            cpu: 0.25,
            resent: 0,
            faults: LinkFaults {
                lost: 0,
                replaced: 0,
                retries: 0,
            },
            extra: Extra {
                transport,
                ..Default::default()
            },
            memory: Memory {
                peak_rss: 0,
                meta_bytes: 0,
                files: 0,
            },
        }
    }

    #[test]
    fn one_summary_line_in_english_naming_the_transport() {
        use ramsys_engine::request::sync::flags::{DELETE, SYNC};
        use ramsys_engine::types::stats::LinkDesc;
        let link = |kind| LinkDesc {
            local: "a".into(),
            peer: "b".into(),
            kind,
        };
        let mut rep = Report {
            files: 1,
            bytes: 2_000_000,
            streams: 4,
            unchanged: 3,
            deleted: vec!["x".into()],
            links: vec![link("raw"), link("raw")],
            ..Default::default()
        };
        let run = facts(Carried::default());
        let t = run.extra.transport.used(&rep);
        assert_eq!(t, "raw");
        assert_eq!(
            human_line(&rep, &run, SYNC | DELETE, &t),
            "copied 1 file, 2.0 MB in 0.50 s (4.0 MB/s) over raw (4 streams), cpu 0.25 s; \
             3 unchanged, 1 deleted"
        );
        rep.files = 2;
        rep.deleted.clear();
        rep.links = vec![link("tcp")];
        let t = run.extra.transport.used(&rep);
        assert_eq!(
            human_line(&rep, &run, SYNC, &t),
            "copied 2 files, 2.0 MB in 0.50 s (4.0 MB/s) over tcp (4 streams), cpu 0.25 s; \
             3 unchanged"
        );
        assert_eq!(human_line(&rep, &run, 0, &t).matches("copied").count(), 1);
        assert!(!human_line(&rep, &run, 0, &t).contains(';'));
        let local = facts(Carried {
            local: true,
            ..Default::default()
        });
        assert_eq!(local.extra.transport.used(&rep), "local");
        assert!(human_line(&rep, &local, 0, "local").contains(" locally, "));
        rep.links = vec![link("raw"), link("tcp")];
        assert_eq!(run.extra.transport.used(&rep), "raw+tcp");
        assert_eq!(count(1, "entry", "entries"), "1 entry");
        assert_eq!(count(0, "entry", "entries"), "0 entries");
    }
}
