//! `ramsys cp`: the agent. It turns the command line into one session with
//! a daemon (push or pull), or, for two local paths, runs a sink engine in
//! this process behind a loopback daemon so the local copy takes exactly
//! the same path as a remote one.

use crate::summary::{report, Carried, Extra};
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

    /// One end of this process: its resources placed by the NUMA layer
    /// (`res_cfg`, near `path` and `peer`) and its options following the
    /// plan. Shared by every mode (issue 37: push, pull and local copy
    /// repeated it).
    fn end(
        &mut self,
        role: Role,
        path: Option<&Path>,
        peer: &str,
        res_cfg: &ResourceConfig,
        mut opts: TransferOptions,
    ) -> anyhow::Result<(TransferOptions, EngineResources)> {
        let (plan, numa) = (self.plan, &mut self.numa);
        let label = match role {
            Role::Source => "source",
            Role::Sink => "sink",
        };
        let cfg = numa.configure(label, role, path, Some(peer), res_cfg);
        opts.redirected_from = self.redirected_from.clone();
        numa.follow(label, role, &mut opts, &plan.fixed);
        let res = EngineResources::new(&cfg)?;
        numa.buffers(label, &res);
        Ok((opts, res))
    }

    /// How to reach the daemon at `addr`: ssh's tunnel, or TCP through the
    /// NUMA layer's channels, or raw-Ethernet links where asked.
    fn remote(&mut self, addr: &str, res: &EngineResources) -> anyhow::Result<Remote> {
        let plan = self.plan;
        let key = (self.key)()?;
        let node = res.config.buffer_node;
        let transport = match &self.via_ssh {
            Some(t) => t.clone(),
            None => self.numa.channels(addr, plan.channels, node, tcp()),
        };
        let ssh = self.via_ssh.is_some();
        let (transport, fallback) = raw_links(plan, ssh, addr, &key, node, transport)?;
        self.raw_fallback = fallback;
        Ok(Remote {
            transport,
            addr: addr.to_string(),
            key,
            connect_timeout: plan.connect_timeout,
            user: None,
        })
    }

    /// Push `local` to `remote`'s `dest`, with progress.
    fn push_tree(
        &mut self,
        remote: &Remote,
        local: &[PathBuf],
        dest: Vec<u8>,
        opts: &TransferOptions,
        res: &EngineResources,
    ) -> Attempt {
        let root = open_root(Path::new("/"), Confinement::None)?;
        let tops = local_tops(local, &self.plan.contents)?;
        let progress = Progress::start(self.stats.clone(), self.plan.json);
        let r = push(remote, root, tops, dest, opts, res, self.stats.clone());
        progress.finish();
        self.numa.threads("source", res);
        Ok(r)
    }

    /// Local sources to a daemon (or an ssh end turned daemon).
    fn push_to(&mut self, addr: &str, path: &[u8], local: &[PathBuf]) -> Attempt {
        let plan = self.plan;
        let src = local.first().map(|p| p.as_path());
        let (opts, res) = self.end(Role::Source, src, addr, &plan.res_cfg, plan.opts.clone())?;
        let remote = self.remote(addr, &res)?;
        self.push_tree(&remote, local, path.to_vec(), &opts, &res)
    }

    /// Sources on a daemon to a local destination.
    fn pull_from(&mut self, d: &Path, remote: Vec<(String, Vec<u8>)>) -> Attempt {
        let plan = self.plan;
        let addr = remote[0].0.clone();
        let (opts, res) = self.end(Role::Sink, Some(d), &addr, &plan.res_cfg, plan.opts.clone())?;
        let remote_end = self.remote(&addr, &res)?;
        let (root, dest) = local_sink(d)?;
        let root = open_root(&root, Confinement::Strict)?;
        let progress = Progress::start(self.stats.clone(), plan.json);
        let paths = remote.into_iter().map(|(_, p)| p).collect();
        let stats = self.stats.clone();
        let r = pull(&remote_end, paths, root, dest, &opts, &res, stats);
        progress.finish();
        self.numa.threads("sink", &res);
        Ok(r)
    }

    /// Local copy: an in-process daemon on loopback is the sink.
    fn copy_locally(&mut self, d: &Path, local: &[PathBuf]) -> Attempt {
        let plan = self.plan;
        if plan.raw.transport == ramsys_engine::transport::rawlink::Mode::Raw {
            bail!("--transport raw: a local copy has no network link (give a ramsys:// end)");
        }
        let (root, dest) = local_sink(d)?;
        let mut key = vec![0u8; 32];
        getrandom_fill(&mut key);
        let mut opts = plan.opts.clone();
        if plan.copy_range {
            // Large files' data goes from file to file in the kernel
            // (engine storage::local); the bridge is this process's own.
            opts.local_copy = Some(Default::default());
        }
        let lo = "127.0.0.1:1";
        let (sink_opts, sink_res) =
            self.end(Role::Sink, Some(d), lo, &plan.res_cfg, opts.clone())?;
        let daemon = Daemon::bind("127.0.0.1:0", &root, key.clone(), sink_opts, sink_res)?;
        let addr = daemon.local_addr().to_string();
        let sink_shared = daemon.shared();
        daemon.spawn();
        let src_cfg = ResourceConfig {
            memory: (plan.memory / 3).max(plan.block_size * 8),
            ..plan.res_cfg.clone()
        };
        let src = local.first().map(|p| p.as_path());
        let (opts, res) = self.end(Role::Source, src, &addr, &src_cfg, opts)?;
        // The in-process sink: plain TCP on loopback, no NUMA channels.
        let remote = Remote {
            transport: tcp(),
            addr,
            key,
            connect_timeout: plan.connect_timeout,
            user: None,
        };
        let r = self.push_tree(&remote, local, dest, &opts, &res);
        self.numa.threads("sink", &sink_shared.res);
        r
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

pub(crate) fn getrandom_fill(b: &mut [u8]) {
    let r = ramsys_engine::transport::crypto::random32();
    b.copy_from_slice(&r[..b.len()]);
}

fn crate_raise_limits() {
    ramsys_engine::storage::fsops::raise_nofile_limit();
}
