//! `ramsys serve`: the daemon.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use ramsys_engine::daemon::config::placement::{daemon_placement, DaemonPlacement, ServeInputs};
use ramsys_engine::daemon::config::DaemonConfig;
use ramsys_engine::daemon::users::load_users_file;
use ramsys_engine::data::resources::ResourceConfig;
use ramsys_engine::roles::server::limits::ConnLimits;
use ramsys_engine::roles::server::Daemon;
use ramsys_engine::{EngineResources, TransferOptions};

use crate::spec::parse_size;
use crate::KeyArgs;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port, printed on stdout).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: String,
    /// Export root: every peer path resolves beneath it. With a users
    /// table each user has its own root; this one then only places the
    /// pools (default: the first user's root).
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Users table (TOML, `[[user]]` name, key_file, root): each user
    /// authenticates with its own key and lands in its own export root;
    /// the shared key is not used (docs/DAEMON.md).
    #[arg(long, value_name = "FILE")]
    pub users: Option<PathBuf>,
    /// Record the listen address in FILE (default
    /// $XDG_RUNTIME_DIR/ramsys/daemon.addr, else
    /// ~/.config/ramsys/daemon.addr), mode 0600, removed at exit; `ramsys
    /// token` finds the daemon there.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "")]
    pub addr_file: Option<PathBuf>,
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
    #[arg(long, default_value = "4M", value_parser = crate::spec::parse_block_size)]
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
    /// Memory one session may hold for its file list and per-file state
    /// (not the data buffers, which --memory bounds): a windowed session
    /// runs in windows that fit it (smaller windows, more of them); a
    /// whole-tree one (a dry run, --resume) whose tree outgrows it ends
    /// with one line saying so (issue 36; docs/SCALE.md).
    /// Default: a quarter of this host's memory; 0: no bound.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub session_memory: Option<u64>,
    /// Seconds a session waits without a word from its peer (every
    /// message renews it; a scanning source says it is still scanning).
    /// 0: as long as the connection lives (TCP keepalive).
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    pub timeout: u64,
    /// fsync every file before renaming it into place.
    #[arg(long)]
    pub fsync: bool,
    #[command(flatten)]
    pub storage: crate::args::StorageArgs,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics (docs/DAEMON.md);
    /// the bound address is printed on the line after "listening on".
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<String>,
    /// A peer daemon of this site (repeatable; also `[site] peers` in
    /// --config): the daemons share load and soft state (docs/SITE.md).
    /// Peers authenticate with this daemon's key or users table.
    #[arg(long, value_name = "ADDR:PORT")]
    pub peer: Vec<String>,
    /// Site monitoring period in ms, 1-1024 (default: config, else 50).
    #[arg(long, value_name = "MS", value_parser = parse_interval)]
    pub site_interval: Option<u64>,
    /// Root holding proc/ and sys/ for the site's load sampler (tests
    /// inject a fake /proc).
    #[arg(long, value_name = "DIR", hide = true, default_value = "/")]
    pub site_sys_root: PathBuf,
    /// Root holding proc/sys/net/ipv4/tcp_{w,r}mem, whose maxima the
    /// daemon tells clients with the Challenge (tests inject limits).
    #[arg(long, value_name = "DIR", hide = true)]
    pub tcp_sys_root: Option<PathBuf>,
    /// In a site: at this many running sessions, redirect a new one to the
    /// least-loaded peer instead of queueing it (default: config's `[site]
    /// max_sessions`, else only full pools redirect; docs/SITE.md).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub site_max_sessions: Option<u32>,
    /// In a site: at this CPU load (percent, 1-100) redirect new sessions
    /// to a less-loaded peer (default: config's `[site] max_load`, else none).
    #[arg(long, value_name = "PCT", value_parser = parse_load)]
    pub site_max_load: Option<f64>,
    /// In a site: share the storage-thread budget of a device other
    /// members use too (a shared file system), on or off (default: the
    /// config's `[site] share_storage`, else on; docs/SITE.md).
    #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
    pub site_share_storage: Option<bool>,
    /// What the daemon sends, all sessions together, at most (bytes per
    /// second, rsync's units as in `cp --bwlimit`; default: the config's
    /// `max_rate`, else no limit). Users' `max_rate` and clients'
    /// --bwlimit apply on top.
    #[arg(long, value_name = "RATE", value_parser = ramsys_engine::data::rate::parse_rate)]
    pub max_rate: Option<u64>,
    /// Offer raw-Ethernet data channels on IFACE (repeatable; also `[raw]
    /// ifaces` in --config; needs CAP_NET_RAW): agents with `--transport
    /// raw` on the same L2 segment carry their data links in frames of
    /// EtherType 0x88B5 (docs/TYCHE.md). The control link stays TCP.
    #[arg(long, value_name = "IFACE")]
    pub raw_iface: Vec<String>,
    /// Large raw-channel slot copies on a copy thread (seed 003's MCNI;
    /// default: env RAMSYS_COPY_OFFLOAD, else auto = on with >= 4 CPUs;
    /// docs/TYCHE.md).
    #[arg(long, value_name = "on|off|auto")]
    pub copy_offload: Option<ramsys_rawnet::offload::Mode>,
    /// Connections held at once, all sources together (default: config's
    /// `max_connections`, else 1024): one more is refused with an Error
    /// and one log line (docs/SECURITY.md "Bounded connections").
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: Option<u64>,
    /// Connections held at once from one source address, an IPv6 source
    /// by its /64 (default: config's `max_connections_per_addr`, else 256).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections_per_addr: Option<u64>,
    /// Seconds a connection gets to send its first message (default:
    /// config's `handshake_timeout`, else 10); closed after it.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub handshake_timeout: Option<u64>,
    /// On SIGTERM/SIGINT: seconds running sessions get to finish before
    /// they are stopped (resumably); new sessions are refused meanwhile.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    pub drain_timeout: u64,
}

fn parse_load(s: &str) -> Result<f64, String> {
    let n: u64 = s.parse().map_err(|e| format!("{s}: {e}"))?;
    ramsys_engine::daemon::site::check_load_pct(n)
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("{s:?}: expected on or off")),
    }
}

fn parse_interval(s: &str) -> Result<u64, String> {
    let n: u64 = s.parse().map_err(|e| format!("{s}: {e}"))?;
    ramsys_engine::daemon::site::check_interval(n)
}

/// `ramsys serve`: load the config and users, place and size the pools,
/// bind, start the optional raw listeners, site membership and metrics,
/// print "listening on", then serve until a signal ends it.
pub fn run(a: &ServeArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(
        a.max_block_size >= 4096,
        "--max-block-size must be at least 4K"
    );
    // Users from --users and the config's [users] section (daemon::users);
    // read the same way again on SIGHUP (crate::signals).
    let (cfg, users) = crate::signals::load(a.config.as_deref(), a.users.as_deref())?;
    let root = serve_root(a, &cfg)?;
    // With a users table the shared key is not used: do not create one.
    let key = match users {
        None => a.key.load()?,
        Some(_) => ramsys_engine::transport::crypto::random32().to_vec(),
    };
    // Blocked before any thread starts, so only the waiter below sees them.
    let addr_file = a.addr_file.as_ref().map(|p| {
        if p.as_os_str().is_empty() {
            ramsys_resources::keys::default_addr_path()
        } else {
            p.clone()
        }
    });
    // Before any thread starts: only the signal thread takes them.
    crate::signals::block();
    let (placement, rcfg) = place(a, &cfg, &root)?;
    let res = EngineResources::new(&rcfg)?;
    // A pull's payload leaves from here: BBR where the kernel has it
    // (issue 21), as the agent does.
    let cc = ramsys_engine::transport::tcp::use_congestion(None).map_err(|e| anyhow::anyhow!(e))?;
    tracing::info!("congestion control: {cc}");
    if let Some(p) = &placement {
        for l in &p.lines {
            tracing::info!("placement: {l}");
        }
        if let Some(Ok(v)) = res.verify_buffers() {
            tracing::info!("placement: buffer pages by node (move_pages): {v:?}");
        }
    }
    let mut d = Daemon::bind(&a.listen, &root, key, transfer_options(a, &cfg, &rcfg), res)?;
    start_raw(&mut d, a, &cfg)?;
    if let Some(u) = users {
        d.set_users(u);
    }
    if let Some(p) = placement {
        d.set_placement(p);
    }
    d.set_limits(conn_limits(a, &cfg));
    start_site(&mut d, a, &cfg);
    if let Some(r) = &a.tcp_sys_root {
        d.set_tcp_sys_root(r.clone());
    }
    d.shared()
        .rates
        .daemon
        .set_rate(a.max_rate.or(cfg.max_rate).unwrap_or(0));
    // Before "listening on": whoever waits for that line finds the file.
    if let Some(p) = &addr_file {
        write_addr_file(p, d.local_addr())?;
    }
    crate::signals::spawn(crate::signals::Ctl {
        shared: d.shared(),
        config: a.config.clone(),
        users: a.users.clone(),
        max_rate_flag: a.max_rate,
        drain_timeout: Duration::from_secs(a.drain_timeout),
        addr_file: addr_file.clone(),
    })?;
    println!("listening on {}", d.local_addr());
    std::io::stdout().flush()?;
    if let Some(m) = &a.metrics {
        let at = d.serve_metrics(m).map_err(|e| {
            if let Some(p) = &addr_file {
                let _ = std::fs::remove_file(p);
            }
            anyhow::anyhow!("cannot serve metrics on {m}: {e}")
        })?;
        // After "listening on" (readers may stop after that line), and
        // never fatal if stdout is gone.
        let mut o = std::io::stdout();
        let _ = writeln!(o, "metrics on {at}").and_then(|_| o.flush());
        tracing::info!("metrics on http://{at}/metrics");
    }
    // Continuous replication jobs (issue 38, crate::replicate::daemon).
    let key_path = a
        .key
        .key_file
        .clone()
        .unwrap_or_else(ramsys_resources::keys::default_key_path);
    crate::replicate::daemon::start(&cfg.replicate, &d.shared(), &key_path);
    tracing::info!("serving {} on {}", root.display(), d.local_addr());
    d.serve();
    Ok(0)
}

/// The connection limits: flags, else the config, else the defaults
/// (server::limits).
fn conn_limits(a: &ServeArgs, cfg: &DaemonConfig) -> ConnLimits {
    let d = ConnLimits::default();
    ConnLimits {
        max_connections: a
            .max_connections
            .map(|n| n as usize)
            .or(cfg.max_connections)
            .unwrap_or(d.max_connections),
        max_per_addr: a
            .max_connections_per_addr
            .map(|n| n as usize)
            .or(cfg.max_connections_per_addr)
            .unwrap_or(d.max_per_addr),
        handshake_timeout: a
            .handshake_timeout
            .or(cfg.handshake_timeout)
            .map_or(d.handshake_timeout, Duration::from_secs),
    }
}

/// The exported root: --root, else the first user's root of the users
/// table (--users or the config's [users]).
fn serve_root(a: &ServeArgs, cfg: &DaemonConfig) -> anyhow::Result<PathBuf> {
    let first_root = match &a.users {
        Some(p) if cfg.users.is_empty() => load_users_file(p)?.first().map(|u| u.root.clone()),
        _ => cfg.users.first().map(|u| u.root.clone()),
    };
    match (&a.root, first_root) {
        (Some(r), _) => Ok(r.clone()),
        (None, Some(r)) => Ok(r),
        (None, None) => anyhow::bail!("give --root DIR, or a users table (--users FILE)"),
    }
}

/// The daemon's placement (None without hardware discovery, e.g. a
/// container hiding /sys: the daemon still serves with unpinned pools)
/// and the pool sizes it leads to.
fn place(
    a: &ServeArgs,
    cfg: &DaemonConfig,
    root: &Path,
) -> anyhow::Result<(Option<DaemonPlacement>, ResourceConfig)> {
    let cli = ServeInputs {
        numa: a.numa,
        memory: a.memory,
        max_streams: a.max_streams,
        readers: a.readers,
        writers: a.writers,
        buffer_size: a.max_block_size as usize,
    };
    let placement = match ramsys_topo::discover(Path::new("/")) {
        Ok(topo) => Some(daemon_placement(topo, true, cfg, &cli, root, &a.listen)?),
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
            max_streams: cli
                .max_streams
                .or(cfg.max_streams)
                .unwrap_or(ramsys_engine::data::resources::DEFAULT_MAX_STREAMS)
                .max(1),
            ..Default::default()
        },
    };
    Ok((placement, rcfg))
}

/// Per-session defaults: storage flags, else the config.
/// A quarter of this host's memory (MemTotal), else 4 GiB.
fn default_session_memory() -> u64 {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            let l = s.lines().find(|l| l.starts_with("MemTotal:"))?;
            l.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map(|kb| kb * 1024);
    total.map_or(4 << 30, |t| t / 4)
}

fn transfer_options(a: &ServeArgs, cfg: &DaemonConfig, rcfg: &ResourceConfig) -> TransferOptions {
    let opts = TransferOptions {
        readers: rcfg.readers,
        writers: rcfg.writers,
        window: a.window.max(2),
        fsync: a.fsync,
        idle_timeout: ramsys_engine::session::options::idle_timeout(a.timeout),
        meta_budget: a.session_memory.unwrap_or_else(default_session_memory),
        // Where the daemon is the source (pulls): flag, else config.
        send_path: a.storage.send_path.or(cfg.send_path).unwrap_or_default(),
        // Its senders are not its own OS user: set-ID bits only with the
        // source's owner (archive::SetId::Owner; a users table confines
        // further, server::archive_options).
        archive_policy: ramsys_engine::storage::archive::Policy::daemon(),
        ..a.storage.options()
    };
    // O_DIRECT policy: flag, else config (docs/STORAGE.md, issue 17).
    match (a.storage.direct, a.storage.no_direct, cfg.direct) {
        (None, false, Some(m)) => TransferOptions {
            direct: m != ramsys_engine::storage::cache::DirectMode::Never,
            direct_mode: m,
            ..opts
        },
        _ => opts,
    }
}

/// Raw channels (issue 18): opened before "listening on", so a missing
/// CAP_NET_RAW or a wrong interface stops the daemon first.
fn start_raw(d: &mut Daemon, a: &ServeArgs, cfg: &DaemonConfig) -> anyhow::Result<()> {
    let mut raw = a.raw_iface.clone();
    raw.extend(cfg.raw_ifaces.iter().cloned());
    if raw.is_empty() {
        return Ok(());
    }
    if let Some(m) = a.copy_offload {
        ramsys_rawnet::offload::set_mode(m);
    }
    let topo = ramsys_topo::discover(Path::new("/")).ok();
    let l = ramsys_engine::transport::rawlink::RawListeners::open(&raw, topo.as_ref())
        .map_err(|e| anyhow::anyhow!(e))?;
    for o in l.offer() {
        tracing::info!(
            "raw channels on {} ({}, MTU {})",
            o.name,
            ramsys_rawnet::channel::mac_string(&o.mac),
            o.mtu
        );
    }
    d.serve_raw(l);
    Ok(())
}

/// A site (issue 19): flags first, then the config's [site].
fn start_site(d: &mut Daemon, a: &ServeArgs, cfg: &DaemonConfig) {
    let mut peers = a.peer.clone();
    peers.extend(cfg.site_peers.iter().cloned());
    if peers.is_empty() && a.site_interval.is_none() && cfg.site_interval_ms.is_none() {
        return;
    }
    d.start_site(ramsys_engine::daemon::site::SiteOptions {
        peers,
        interval_ms: a.site_interval.or(cfg.site_interval_ms).unwrap_or(50),
        sys_root: a.site_sys_root.clone(),
        user: cfg.site_user.clone().unwrap_or_else(|| "site".into()),
        limits: ramsys_engine::daemon::site::redirect::Limits {
            max_sessions: a.site_max_sessions.or(cfg.site_limits.max_sessions),
            max_load: a.site_max_load.or(cfg.site_limits.max_load),
        },
        share_storage: a
            .site_share_storage
            .or(cfg.site_share_storage)
            .unwrap_or(true),
        max_members: cfg
            .site_max_members
            .unwrap_or(ramsys_engine::daemon::site::membership::MAX_MEMBERS),
    });
}

/// `HOST:PORT\nPID\n`, mode 0600, replaced atomically; a wildcard listen
/// address is recorded as loopback (the file is for local tools).
fn write_addr_file(path: &Path, addr: std::net::SocketAddr) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut a = addr;
    if a.ip().is_unspecified() {
        a.set_ip(if a.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    let err = |e: std::io::Error| anyhow::anyhow!("address file {}: {e}", path.display());
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(err)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err)?;
    writeln!(f, "{a}\n{}", std::process::id()).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)?;
    Ok(())
}
