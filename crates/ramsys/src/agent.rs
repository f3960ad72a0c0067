//! `ramsys cp`: the agent. It turns the command line into one session with
//! a daemon (push or pull), or, for two local paths, runs a sink engine in
//! this process behind a loopback daemon so the local copy takes exactly
//! the same path as a remote one.

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ramsys_engine::client::{pull, push, Remote};
use ramsys_engine::fsops::{Confinement, Root};
use ramsys_engine::request::walk::Top;
use ramsys_engine::resources::ResourceConfig;
use ramsys_engine::server::Daemon;
use ramsys_engine::stats::process_cpu_seconds;
use ramsys_engine::transport::tcp::Tcp;
use ramsys_engine::transport::Transport;
use ramsys_engine::{EngineResources, Report, Stats, TransferOptions};

use ramsys_topo::Role;

use crate::args::{CpArgs, SyncArgs};
use crate::numa::Numa;
use crate::progress::Progress;
use crate::spec::{local_sink, parse_endpoint, Endpoint};

/// Top-level sources as the walk names them. `contents[i]`: source i was
/// written `DIR/` (or `.`) in a sync, so its contents land in DST itself
/// (rsync's rule; an empty name is the destination, sync::dest).
fn local_tops(paths: &[PathBuf], contents: &[bool]) -> anyhow::Result<Vec<Top>> {
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
        let rel = abs.as_os_str().as_bytes();
        let rel = rel.strip_prefix(b"/").unwrap_or(rel).to_vec();
        tops.push(Top {
            rel,
            name: name.as_bytes().to_vec(),
        });
    }
    Ok(tops)
}

fn open_root(p: &Path, c: Confinement) -> anyhow::Result<Arc<Root>> {
    Ok(Arc::new(
        Root::open(p, c).with_context(|| format!("cannot open {}", p.display()))?,
    ))
}

pub fn run_sync(a: &SyncArgs) -> anyhow::Result<i32> {
    use ramsys_engine::sync::flags::*;
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
    run_with(&a.cp, f | a.cp.resume_flags())
}

pub fn run(a: &CpArgs) -> anyhow::Result<i32> {
    run_with(a, a.resume_flags())
}

fn run_with(a: &CpArgs, sync: u32) -> anyhow::Result<i32> {
    let (dst, srcs) = a.paths.split_last().expect("clap requires two paths");
    // rsync's rule for sync: `SRC/` sends SRC's contents into DST; with
    // --files-from every source is sent as its contents (rsync's too).
    let files_from = a.select.files_from.is_some();
    let contents: Vec<bool> = srcs
        .iter()
        .map(|s| {
            files_from
                || sync & ramsys_engine::sync::flags::SYNC != 0 && crate::spec::names_contents(s)
        })
        .collect();
    let mut dst = parse_endpoint(dst)?;
    let mut srcs: Vec<Endpoint> = srcs
        .iter()
        .map(|s| parse_endpoint(s))
        .collect::<Result<_, _>>()?;
    anyhow::ensure!(
        a.block_size >= 4096 && a.block_size <= 64 << 20,
        "--block-size must be between 4K and 64M"
    );
    let mut opts = TransferOptions {
        streams: a.streams.unwrap_or(4),
        block_size: a.block_size as u32,
        checksum: !a.no_checksum,
        // --files-from walks the source directory to reach the listed
        // paths; -r only decides what below a listed directory goes.
        recursive: a.recursive || files_from,
        readers: a.readers.unwrap_or(4).max(1),
        writers: a.writers.unwrap_or(4).max(1),
        window: a.window.max(2),
        fsync: a.fsync,
        sync,
        encrypt: a.encrypt.unwrap_or_default(),
        select: a.select.selection(a.recursive)?,
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
            || sync & ramsys_engine::sync::flags::DELETE == 0,
        "--delete cannot be combined with --min-size/--max-size \
         (it would delete the destination's copies of the skipped files)"
    );
    let res_cfg = ResourceConfig {
        memory: a.memory as usize,
        buffer_size: a.block_size as usize,
        readers: opts.readers,
        writers: opts.writers,
        max_streams: opts.streams as usize,
        ..Default::default()
    };
    let connect_timeout = Duration::from_secs(a.connect_timeout.max(1));
    crate_raise_limits();
    // HOST:PATH endpoints (issue 9): a third-party copy runs on the hosts;
    // otherwise the ssh end becomes a one-session daemon (crate::ssh).
    if let Some(code) = crate::ssh::third_party(a, sync, &srcs, &dst)? {
        return Ok(code);
    }
    let ssh = crate::ssh::open(a, &mut srcs, &mut dst)?;
    if let Some(u) = ssh.user() {
        // A running daemon's one-time credential names the user to
        // authenticate as; session::current_user reads it. Set before any
        // engine thread starts.
        std::env::set_var("RAMSYS_USER", u);
    }
    let load_key = || match ssh.key() {
        Some(k) => Ok(k),
        None => a.load_key(),
    };

    let local_srcs: Vec<PathBuf> = srcs
        .iter()
        .filter_map(|s| match s {
            Endpoint::Local(p) => Some(p.clone()),
            _ => None,
        })
        .collect();
    // A daemon source names contents with a trailing '/' (docs/PROTOCOL.md).
    let remote_srcs: Vec<(String, Vec<u8>)> = srcs
        .iter()
        .zip(&contents)
        .filter_map(|(s, &c)| match s {
            Endpoint::Daemon { addr, path } if c => {
                Some((addr.clone(), [path, &b"/"[..]].concat()))
            }
            Endpoint::Daemon { addr, path } => Some((addr.clone(), path.clone())),
            _ => None,
        })
        .collect();
    if !local_srcs.is_empty() && !remote_srcs.is_empty() {
        bail!("sources must be all local or all on one daemon");
    }
    if remote_srcs.iter().any(|(a, _)| *a != remote_srcs[0].0) {
        bail!("all remote sources must be on the same daemon");
    }

    let mut numa = Numa::new(a.numa, a.explain);
    let stats = Arc::new(Stats::default());
    let t0 = Instant::now();
    let cpu0 = process_cpu_seconds();
    let transport: Arc<dyn Transport> = Arc::new(Tcp {
        socket_buffer: None,
    });
    let result = match (&dst, remote_srcs.is_empty()) {
        (Endpoint::Daemon { addr, path }, true) => {
            let key = load_key()?;
            let cfg = numa.configure(
                "source",
                Role::Source,
                local_srcs.first().map(|p| p.as_path()),
                Some(addr),
                &res_cfg,
            );
            numa.follow("source", Role::Source, &mut opts, a);
            let res = EngineResources::new(&cfg)?;
            numa.buffers("source", &res);
            let transport = numa.channels(addr, a.channels, cfg.buffer_node, transport);
            let remote = Remote {
                transport,
                addr: addr.clone(),
                key,
                connect_timeout,
                user: None,
            };
            let root = open_root(Path::new("/"), Confinement::None)?;
            let progress = Progress::start(stats.clone(), a.json);
            let r = push(
                &remote,
                root,
                local_tops(&local_srcs, &contents)?,
                path.clone(),
                &opts,
                &res,
                stats.clone(),
            );
            progress.finish();
            numa.threads("source", &res);
            r
        }
        (Endpoint::Local(d), false) => {
            let key = load_key()?;
            let cfg = numa.configure(
                "sink",
                Role::Sink,
                Some(d.as_path()),
                Some(&remote_srcs[0].0),
                &res_cfg,
            );
            numa.follow("sink", Role::Sink, &mut opts, a);
            let res = EngineResources::new(&cfg)?;
            numa.buffers("sink", &res);
            let transport =
                numa.channels(&remote_srcs[0].0, a.channels, cfg.buffer_node, transport);
            let remote = Remote {
                transport,
                addr: remote_srcs[0].0.clone(),
                key,
                connect_timeout,
                user: None,
            };
            let (root, dest) = local_sink(d)?;
            let root = open_root(&root, Confinement::Strict)?;
            let progress = Progress::start(stats.clone(), a.json);
            let paths = remote_srcs.into_iter().map(|(_, p)| p).collect();
            let r = pull(&remote, paths, root, dest, &opts, &res, stats.clone());
            progress.finish();
            numa.threads("sink", &res);
            r
        }
        (Endpoint::Local(d), true) => {
            // Local copy: an in-process daemon on loopback is the sink.
            let (root, dest) = local_sink(d)?;
            let mut key = vec![0u8; 32];
            getrandom_fill(&mut key);
            let sink_cfg = numa.configure(
                "sink",
                Role::Sink,
                Some(d.as_path()),
                Some("127.0.0.1:1"),
                &res_cfg,
            );
            let sink_res = EngineResources::new(&sink_cfg)?;
            numa.buffers("sink", &sink_res);
            // A rate limit counts blocks' payload: no kernel-side copies.
            if !a.no_copy_range && opts.rate.is_empty() {
                // Large files' data goes from file to file in the kernel
                // (engine storage::local); the bridge is this process's own.
                opts.local_copy = Some(Default::default());
            }
            let mut sink_opts = opts.clone();
            numa.follow("sink", Role::Sink, &mut sink_opts, a);
            let daemon = Daemon::bind("127.0.0.1:0", &root, key.clone(), sink_opts, sink_res)?;
            let addr = daemon.local_addr().to_string();
            let sink_shared = daemon.shared();
            daemon.spawn();
            let src_cfg = ResourceConfig {
                memory: (a.memory as usize / 3).max(a.block_size as usize * 8),
                ..res_cfg.clone()
            };
            let src_cfg = numa.configure(
                "source",
                Role::Source,
                local_srcs.first().map(|p| p.as_path()),
                Some(&addr),
                &src_cfg,
            );
            numa.follow("source", Role::Source, &mut opts, a);
            let res = EngineResources::new(&src_cfg)?;
            numa.buffers("source", &res);
            let remote = Remote {
                transport,
                addr,
                key,
                connect_timeout,
                user: None,
            };
            let src_root = open_root(Path::new("/"), Confinement::None)?;
            let progress = Progress::start(stats.clone(), a.json);
            let r = push(
                &remote,
                src_root,
                local_tops(&local_srcs, &contents)?,
                dest,
                &opts,
                &res,
                stats.clone(),
            );
            progress.finish();
            numa.threads("source", &res);
            numa.threads("sink", &sink_shared.res);
            r
        }
        (Endpoint::Daemon { .. }, false) => {
            bail!("third-party transfers (daemon to daemon) are not supported yet")
        }
        // crate::ssh::open turned every ssh destination into a daemon.
        (Endpoint::Ssh(e), _) => bail!("{}: ssh endpoint not resolved", e.display()),
    };
    let wall = t0.elapsed().as_secs_f64();
    let cpu = process_cpu_seconds() - cpu0;
    ssh.finish();
    if let Ok(rep) = &result {
        numa.streams(rep);
    }
    numa.print();
    match result {
        Ok(rep) => {
            let resent = stats.resends.load(std::sync::atomic::Ordering::Relaxed);
            if resent > 0 && !a.json {
                eprintln!(
                    "ramsys: {resent} segments failed verification in flight and were sent again"
                );
            }
            let faults = LinkFaults::of(&stats);
            if faults.lost > 0 && !a.json {
                eprintln!(
                    "ramsys: {} data links lost, {} replaced ({} failed reconnect attempts)",
                    faults.lost, faults.replaced, faults.retries
                );
            }
            Ok(summarize(&rep, wall, cpu, a.json, sync, resent, faults))
        }
        Err(e) => {
            if a.json {
                let line = serde_json::json!({
                    "event": "summary", "ok": false, "error": e.to_string(),
                    "files": stats.files.load(std::sync::atomic::Ordering::Relaxed),
                    "bytes": 0, "wall_s": wall, "mb_s": 0.0, "cpu_s": cpu, "failed": [],
                });
                println!("{line}");
            }
            Err(anyhow::anyhow!(e))
        }
    }
}

fn getrandom_fill(b: &mut [u8]) {
    let r = ramsys_engine::session::random32();
    b.copy_from_slice(&r[..b.len()]);
}

fn crate_raise_limits() {
    ramsys_engine::fsops::raise_nofile_limit();
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

fn summarize(
    rep: &Report,
    wall: f64,
    cpu: f64,
    json: bool,
    sync: u32,
    resent: u64,
    faults: LinkFaults,
) -> i32 {
    let mb_s = rep.bytes as f64 / 1e6 / wall.max(1e-9);
    let dry = sync & ramsys_engine::sync::flags::DRY_RUN != 0;
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
            "block_size": rep.block_size,
            "failed": rep.failed,
            "resent": resent,
            "links_lost": faults.lost,
            "links_replaced": faults.replaced,
            "link_retries": faults.retries,
            "send_path": rep.send_path,
            "handoffs": rep.handoffs,
            "storage": rep.storage,
        });
        if sync & ramsys_engine::sync::COMPARE != 0 {
            // bytes = file data sent, files = files whose data was sent,
            // unchanged = files skipped (issue 10).
            line["unchanged"] = rep.unchanged.into();
            line["deleted"] = rep.deleted.len().into();
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
            eprintln!("ramsys: failed: {}: {}", f.path, f.reason);
        }
        if dry {
            for p in &rep.planned {
                println!("would send {p}");
            }
            for p in &rep.deleted {
                println!("would delete {p}");
            }
            println!(
                "dry run: {} files would be sent, {} unchanged, {} entries would be deleted",
                rep.planned.len(),
                rep.unchanged,
                rep.deleted.len()
            );
            return i32::from(!rep.failed.is_empty());
        }
        if sync & ramsys_engine::sync::COMPARE != 0 {
            println!(
                "{} files unchanged, {} entries deleted",
                rep.unchanged,
                rep.deleted.len()
            );
        }
        println!(
            "copied {} files, {:.1} MB in {:.2} s ({:.1} MB/s), cpu {:.2} s{}",
            rep.files,
            rep.bytes as f64 / 1e6,
            wall,
            mb_s,
            cpu,
            if rep.failed.is_empty() {
                String::new()
            } else {
                format!(", {} failed", rep.failed.len())
            }
        );
    }
    if rep.failed.is_empty() {
        0
    } else {
        1
    }
}
