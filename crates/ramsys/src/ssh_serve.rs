//! `ramsys ssh-serve` (hidden): the remote end of a transfer reached over
//! ssh (issue 9; docs/SECURITY.md "ssh sessions", docs/PROTOCOL.md
//! "ssh-serve"). The agent runs it through the system ssh, as scp runs
//! `scp -t` and bbcp/EScp start their remote copy. It
//!
//! 1. reads a one-time credential (64 hex digits, one line) from stdin:
//!    never on a command line (visible in `ps`) nor in a file;
//! 2. resolves the paths as the agent's local sink/source would, relative
//!    to ssh's working directory (the user's home);
//! 3. binds a daemon keyed with that credential on the address the ssh
//!    connection arrived on, and prints one line
//!    `ramsys-ssh v1 listen ADDR:PORT ...`;
//! 4. serves exactly one session, then exits; it also exits when stdin
//!    reaches EOF (the agent or its ssh died) or when nobody
//!    authenticates within --accept-timeout.
//!
//! It runs with the ssh user's credentials only: no setuid, no privilege
//! change. Data then moves over direct TCP links, not through ssh.

use std::io::{BufRead, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use ramsys_engine::daemon::config::placement::{daemon_placement, ServeInputs};
use ramsys_engine::daemon::config::DaemonConfig;
use ramsys_engine::data::resources::ResourceConfig;
use ramsys_engine::roles::server::Daemon;
use ramsys_engine::{EngineResources, TransferOptions};
use ramsys_proto::control::Role;

use crate::spec::parse_size;

/// The first word of the ready line; the agent skips anything else the
/// remote login prints before it (motd, shell start-up files).
pub const READY_PREFIX: &str = "ramsys-ssh v1";

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ServeRole {
    /// Receive: PATH is the destination, as cp reads DST.
    Sink,
    /// Send: PATH... are the sources.
    Source,
}

impl ServeRole {
    pub fn as_str(self) -> &'static str {
        match self {
            ServeRole::Sink => "sink",
            ServeRole::Source => "source",
        }
    }
}

#[derive(Args, Debug)]
pub struct SshServeArgs {
    /// Which end this host is.
    #[arg(long)]
    pub role: ServeRole,
    /// Largest block size the session may use.
    #[arg(long, default_value = "4M", value_parser = crate::spec::parse_block_size)]
    pub block_size: u64,
    /// Most data streams: what `ramsys serve` allows by default (the
    /// agent may add streams up to it on a long path, issue 21).
    #[arg(long, default_value_t = ramsys_engine::data::resources::DEFAULT_MAX_STREAMS)]
    pub max_streams: usize,
    /// Buffer memory: `ramsys serve`'s default, which gives each of the
    /// most streams 2 credits of 4 MiB (engine resources).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub memory: u64,
    /// Credits per stream when this end is the sink.
    #[arg(long, default_value_t = 8)]
    pub window: u32,
    /// fsync every file before renaming it into place.
    #[arg(long)]
    pub fsync: bool,
    #[command(flatten)]
    pub storage: crate::args::StorageArgs,
    /// Seconds to wait for the agent to authenticate.
    #[arg(long, default_value_t = 60)]
    pub accept_timeout: u64,
    /// Always start a daemon for this session, even if one runs for this
    /// user.
    #[arg(long)]
    pub own_daemon: bool,
    /// Print ADDR in the ready line instead of the address bound (tests
    /// use an unreachable one to exercise the agent's ssh fallback).
    #[arg(long, hide = true, value_name = "ADDR")]
    pub advertise: Option<String>,
    /// Serve every session that authenticates with the credential until
    /// stdin closes (a `sync --watch` job, issue 38), not just one; always
    /// with a daemon of its own.
    #[arg(long, hide = true)]
    pub until_eof: bool,
    /// The destination (sink) or the sources (source), relative to the
    /// working directory (ssh: the home directory) unless absolute.
    #[arg(required = true, num_args = 1..)]
    pub paths: Vec<PathBuf>,
}

/// What the agent needs to reach the session: printed as the ready line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    pub listen: String,
    /// With a credential minted by a running daemon: the name to
    /// authenticate as (`otp-…`).
    pub user: Option<String>,
    /// A credential minted by a running daemon; None: the agent's own.
    pub key: Option<Vec<u8>>,
    /// Sink: the destination beneath the served root.
    pub dest: Option<Vec<u8>>,
    /// Source: the source paths beneath the served root.
    pub srcs: Vec<Vec<u8>>,
}

fn hex_or_dash(b: &[u8]) -> String {
    if b.is_empty() {
        "-".into()
    } else {
        hex::encode(b)
    }
}

impl Offer {
    /// `ramsys-ssh v1 listen ADDR:PORT [user NAME key HEX] (dest HEX | src HEX...)`,
    /// '-' for an empty path (docs/PROTOCOL.md).
    pub fn line(&self) -> String {
        let mut s = format!("{READY_PREFIX} listen {}", self.listen);
        if let Some(u) = &self.user {
            s += &format!(" user {u}");
        }
        if let Some(k) = &self.key {
            s += &format!(" key {}", hex::encode(k));
        }
        if let Some(d) = &self.dest {
            s += &format!(" dest {}", hex_or_dash(d));
        }
        for p in &self.srcs {
            s += &format!(" src {}", hex_or_dash(p));
        }
        s
    }

    /// Parse a ready line; None if `line` is not one. Unknown keys are
    /// skipped so later versions may add fields.
    pub fn parse(line: &str) -> Option<anyhow::Result<Offer>> {
        let rest = line.trim_end().strip_prefix(READY_PREFIX)?;
        let rest = rest.strip_prefix(' ')?;
        Some(Self::parse_fields(rest))
    }

    fn parse_fields(rest: &str) -> anyhow::Result<Offer> {
        let mut o = Offer {
            listen: String::new(),
            user: None,
            key: None,
            dest: None,
            srcs: Vec::new(),
        };
        let hexv = |v: &str| -> anyhow::Result<Vec<u8>> {
            if v == "-" {
                Ok(Vec::new())
            } else {
                hex::decode(v).map_err(|e| anyhow::anyhow!("bad hex {v:?}: {e}"))
            }
        };
        let mut it = rest.split(' ');
        while let Some(k) = it.next() {
            let v = it
                .next()
                .with_context(|| format!("ready line: {k} without a value"))?;
            match k {
                "listen" => o.listen = v.to_string(),
                "user" => o.user = Some(v.to_string()),
                "key" => o.key = Some(hexv(v)?),
                "dest" => o.dest = Some(hexv(v)?),
                "src" => o.srcs.push(hexv(v)?),
                _ => {}
            }
        }
        anyhow::ensure!(!o.listen.is_empty(), "ready line without listen address");
        anyhow::ensure!(
            o.dest.is_some() == o.srcs.is_empty(),
            "ready line needs either dest or src"
        );
        Ok(o)
    }
}

/// Read the one-time credential: one line of 64 hex digits. The key the
/// daemon uses is that text, as with key files (resources::keys).
fn read_credential(r: &mut impl BufRead) -> anyhow::Result<Vec<u8>> {
    let mut line = String::new();
    r.by_ref()
        .take(200)
        .read_line(&mut line)
        .context("reading the credential from stdin")?;
    let t = line.trim();
    anyhow::ensure!(
        t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit()),
        "expected a one-time credential (64 hex digits) on stdin"
    );
    Ok(t.as_bytes().to_vec())
}

/// The address the ssh connection arrived on ($SSH_CONNECTION is
/// "CLIENT_IP CLIENT_PORT SERVER_IP SERVER_PORT"): the agent reached this
/// host there, so it can reach the daemon there too. Loopback otherwise.
pub fn listen_addr(ssh_connection: Option<&str>) -> String {
    let ip = ssh_connection
        .and_then(|s| s.split_whitespace().nth(2))
        .and_then(|s| s.parse::<std::net::IpAddr>().ok())
        .unwrap_or(std::net::Ipv4Addr::LOCALHOST.into());
    std::net::SocketAddr::new(ip, 0).to_string()
}

/// Sources as the daemon (root "/") names them: absolute path without
/// the leading '/', last component as typed (not a symlink's target). A
/// missing source is kept, as typed, for the scan to report as a failure
/// of this path alone (rsync goes on with the other sources).
fn source_paths(paths: &[PathBuf]) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for p in paths {
        let p = if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p.as_path()
        };
        let missing = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
        match std::fs::symlink_metadata(p) {
            Err(e) if missing(&e) => {
                let abs = std::env::current_dir()?.join(p);
                let b = abs.as_os_str().as_bytes();
                out.push(b.strip_prefix(b"/").unwrap_or(b).to_vec());
                continue;
            }
            r => r.with_context(|| format!("{}", p.display()))?,
        };
        let abs = match (p.parent(), p.file_name()) {
            (Some(parent), Some(name)) => {
                let parent = if parent.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    parent
                };
                parent
                    .canonicalize()
                    .with_context(|| format!("{}", parent.display()))?
                    .join(name)
            }
            // ".", "..", "/" and the like name a directory as it resolves.
            _ => p
                .canonicalize()
                .with_context(|| format!("{}", p.display()))?,
        };
        let b = abs.as_os_str().as_bytes();
        out.push(b.strip_prefix(b"/").unwrap_or(b).to_vec());
    }
    Ok(out)
}

/// Issue 9: "uses the daemon there if one runs for that user". A daemon
/// runs for this user when `$RAMSYS_DAEMON` names one or `ramsys serve
/// --addr-file` left its address file, and the user has a key file (never
/// created here). Then, through this same binary's commands (the users
/// interface, /work/coord and docs/DAEMON.md): `status --json` gives the
/// user's export root, the paths must lie beneath it (a sink also needs a
/// user who may write), the daemon must be reachable where the agent
/// reached us, and `token --json` mints a one-time credential. Any
/// shortfall means "no": ssh-serve then starts its own daemon.
fn running_daemon_offer(
    role: ServeRole,
    paths: &[PathBuf],
    ssh_ip: Option<std::net::IpAddr>,
) -> Option<Offer> {
    match try_running_daemon(role, paths, ssh_ip) {
        Ok(o) => o,
        Err(e) => {
            tracing::info!("not using a running daemon: {e:#}");
            None
        }
    }
}

/// `$XDG_RUNTIME_DIR/ramsys/daemon.addr`, else
/// `$XDG_CONFIG_HOME|~/.config` + `/ramsys/daemon.addr` (where `serve
/// --addr-file` writes by default).
fn default_addr_file() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("ramsys/daemon.addr");
    }
    std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .unwrap_or_else(|| PathBuf::from("/tmp"))
        .join("ramsys/daemon.addr")
}

/// Run one of our own commands; its stdout if it succeeded in time.
fn helper(args: &[&std::ffi::OsStr]) -> anyhow::Result<Vec<u8>> {
    let exe = std::env::current_exe()?;
    let mut c = std::process::Command::new(exe)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let end = Instant::now() + Duration::from_secs(15);
    while c.try_wait()?.is_none() {
        if Instant::now() > end {
            let _ = c.kill();
            let _ = c.wait();
            bail!("{args:?} timed out");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = c.wait_with_output()?;
    anyhow::ensure!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr).trim()
    );
    Ok(o.stdout)
}

/// `path` relative to `root` as wire bytes, if it lies beneath it.
fn beneath(root: &Path, path: &Path) -> Option<Vec<u8>> {
    let rel = path.strip_prefix(root).ok()?;
    Some(rel.as_os_str().as_bytes().to_vec())
}

fn try_running_daemon(
    role: ServeRole,
    paths: &[PathBuf],
    ssh_ip: Option<std::net::IpAddr>,
) -> anyhow::Result<Option<Offer>> {
    use std::ffi::OsStr;
    let key_file = ramsys_resources::keys::default_key_path();
    if !key_file.exists() {
        return Ok(None);
    }
    let daemon = match std::env::var("RAMSYS_DAEMON")
        .ok()
        .filter(|s| !s.is_empty())
    {
        Some(d) => d
            .trim_start_matches("ramsys://")
            .trim_end_matches('/')
            .to_string(),
        None => match std::fs::read_to_string(default_addr_file()) {
            Ok(t) => t.lines().next().unwrap_or("").trim().to_string(),
            Err(_) => return Ok(None),
        },
    };
    if daemon.is_empty() {
        return Ok(None);
    }
    // The address file names loopback for a wildcard listener: the agent
    // reaches the daemon where it reached sshd, so ask it there (the
    // status query doubles as the reachability check).
    use std::net::ToSocketAddrs;
    let mut addr = daemon
        .to_socket_addrs()?
        .next()
        .context("daemon address does not resolve")?;
    if let Some(ip) = ssh_ip {
        if (addr.ip().is_loopback() || addr.ip().is_unspecified()) && !ip.is_loopback() {
            addr.set_ip(ip);
        }
    }
    let daemon = addr.to_string();
    let kf = OsStr::new("--key-file");
    let url = format!("ramsys://{daemon}");
    let st: serde_json::Value = serde_json::from_slice(&helper(&[
        OsStr::new("status"),
        OsStr::new("--json"),
        OsStr::new("--connect-timeout"),
        OsStr::new("3"),
        kf,
        key_file.as_os_str(),
        OsStr::new(&url),
    ])?)?;
    // A daemon with a users table shows the asking user only.
    let me = &st["users"][0];
    let root = me["root"]
        .as_str()
        .or(st["root"].as_str())
        .context("status without a root")?;
    let root = Path::new(root).canonicalize()?;
    let (dest, srcs) = match role {
        ServeRole::Sink => {
            if me["read_only"].as_bool() == Some(true) {
                return Ok(None);
            }
            let (dir, name) = crate::spec::local_sink(&paths[0])?;
            let Some(rel) = beneath(&root, &dir.join(std::ffi::OsStr::from_bytes(&name))) else {
                return Ok(None);
            };
            (Some(rel), Vec::new())
        }
        ServeRole::Source => {
            let mut v = Vec::new();
            for p in source_paths(paths)? {
                let abs = Path::new("/").join(std::ffi::OsStr::from_bytes(&p));
                let Some(rel) = beneath(&root, &abs) else {
                    return Ok(None);
                };
                v.push(rel);
            }
            (None, v)
        }
    };
    let tok: serde_json::Value = serde_json::from_slice(&helper(&[
        OsStr::new("token"),
        OsStr::new("--json"),
        kf,
        key_file.as_os_str(),
        OsStr::new("--daemon"),
        OsStr::new(&daemon),
    ])?)?;
    let user = tok["user"].as_str().context("token without user")?;
    let key = tok["key"].as_str().context("token without key")?;
    anyhow::ensure!(
        !user.is_empty() && !user.contains(char::is_whitespace),
        "bad token user"
    );
    Ok(Some(Offer {
        listen: daemon,
        user: Some(user.to_string()),
        key: Some(key.as_bytes().to_vec()),
        dest,
        srcs,
    }))
}

/// `ramsys ssh-serve`: the remote end of an ssh transfer. Hands the agent
/// to a daemon already running on this host when one serves the paths,
/// else runs a one-session daemon of its own until the session ends or
/// the agent goes away.
pub fn run(a: &SshServeArgs) -> anyhow::Result<i32> {
    let key = read_credential(&mut std::io::stdin().lock())?;
    let ssh_connection = std::env::var("SSH_CONNECTION").ok();
    let paths = serve_paths(a)?;
    let listen = listen_addr(ssh_connection.as_deref());
    if !a.own_daemon && !a.until_eof {
        let ip = listen.parse::<std::net::SocketAddr>().ok().map(|s| s.ip());
        if let Some(offer) = running_daemon_offer(a.role, &paths, ip) {
            print_offer(&offer)?;
            // Stay for the agent's links through ssh, if it needs them
            // (crate::tunnel), until it closes our stdin.
            if let Ok(target) = offer.listen.parse() {
                crate::tunnel::relay(std::io::stdin(), Box::new(std::io::stdout()), target);
            }
            return Ok(0);
        }
    }
    anyhow::ensure!(
        a.block_size >= 4096 && a.block_size <= 64 << 20,
        "--block-size must be between 4K and 64M"
    );
    let (root, dest, srcs) = match a.role {
        ServeRole::Sink => {
            let (root, dest) = crate::spec::local_sink(&paths[0])?;
            (root, Some(dest), Vec::new())
        }
        ServeRole::Source => (PathBuf::from("/"), None, source_paths(&paths)?),
    };
    let d = own_daemon(a, key, &root, &listen)?;
    let done = match a.until_eof {
        // Never signalled: the loop below ends at stdin's EOF.
        true => crossbeam_channel::never(),
        false => d.one_session(match a.role {
            ServeRole::Sink => Role::Sink,
            ServeRole::Source => Role::Source,
        }),
    };
    let shared = d.shared();
    let target = d.local_addr();
    let offer = Offer {
        listen: a.advertise.clone().unwrap_or_else(|| target.to_string()),
        user: None,
        key: None,
        dest,
        srcs,
    };
    d.spawn();
    print_offer(&offer)?;
    // The agent keeps our stdin open for the whole session: EOF means it
    // (or its ssh) is gone, and nothing must outlive it. Until then stdin
    // carries the links the agent could not open directly (crate::tunnel).
    let (eof_tx, eof) = crossbeam_channel::bounded::<()>(1);
    std::thread::spawn(move || {
        crate::tunnel::relay(std::io::stdin(), Box::new(std::io::stdout()), target);
        let _ = eof_tx.send(());
    });
    let deadline = Instant::now() + Duration::from_secs(a.accept_timeout.max(1));
    loop {
        crossbeam_channel::select! {
            recv(done) -> r => {
                return match r {
                    Ok(Ok(())) => Ok(0),
                    Ok(Err(e)) => bail!("session failed: {e}"),
                    Err(_) => bail!("session ended"),
                };
            }
            recv(eof) -> _ => {
                if a.until_eof {
                    return Ok(0);
                }
                bail!("the agent went away (stdin closed); session abandoned")
            }
            default(Duration::from_millis(200)) => {
                if Instant::now() > deadline && shared.active.load(Ordering::Relaxed) == 0 {
                    bail!(
                        "no agent connected within {} s; giving up",
                        a.accept_timeout
                    );
                }
            }
        }
    }
}

/// The paths as given (an empty one means the login directory, as scp's
/// `host:`); a sink takes exactly one.
fn serve_paths(a: &SshServeArgs) -> anyhow::Result<Vec<PathBuf>> {
    let paths: Vec<PathBuf> = a
        .paths
        .iter()
        .map(|p| {
            if p.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                p.clone()
            }
        })
        .collect();
    if a.role == ServeRole::Sink && paths.len() != 1 {
        bail!("a sink takes exactly one destination");
    }
    Ok(paths)
}

/// The ready line the agent reads from our stdout.
fn print_offer(offer: &Offer) -> anyhow::Result<()> {
    let mut o = std::io::stdout().lock();
    writeln!(o, "{}", offer.line())?;
    o.flush()?;
    Ok(())
}

/// A one-session daemon on `root`, placed and sized as `ramsys serve`
/// would be on this host (fallback sizes when topology discovery fails).
fn own_daemon(a: &SshServeArgs, key: Vec<u8>, root: &Path, listen: &str) -> anyhow::Result<Daemon> {
    let cli = ServeInputs {
        numa: None,
        memory: Some(a.memory),
        max_streams: Some(a.max_streams.max(1)),
        readers: None,
        writers: None,
        buffer_size: a.block_size as usize,
    };
    let cfg = DaemonConfig::default();
    let rcfg = match ramsys_topo::discover(Path::new("/")) {
        Ok(topo) => daemon_placement(topo, true, &cfg, &cli, root, listen)?.resources,
        Err(_) => ResourceConfig {
            memory: a.memory as usize,
            buffer_size: a.block_size as usize,
            readers: 4,
            writers: 4,
            max_streams: a.max_streams.max(1),
            ..Default::default()
        },
    };
    let res = EngineResources::new(&rcfg)?;
    let opts = TransferOptions {
        readers: rcfg.readers,
        writers: rcfg.writers,
        window: a.window.max(2),
        fsync: a.fsync,
        ..a.storage.options()
    };
    Daemon::bind(listen, root, key, opts, res)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_a_daemons() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            a: SshServeArgs,
        }
        let c = Cli::try_parse_from(["x", "--role", "sink", "d"]).unwrap();
        let d = ramsys_engine::data::resources::ResourceConfig::default();
        assert_eq!(c.a.max_streams, d.max_streams);
        assert_eq!(c.a.memory as usize, d.memory);
    }

    #[test]
    fn ready_line_round_trip() {
        let o = Offer {
            listen: "[::1]:4000".into(),
            user: None,
            key: None,
            dest: Some(b"new name".to_vec()),
            srcs: vec![],
        };
        let l = o.line();
        assert_eq!(l, "ramsys-ssh v1 listen [::1]:4000 dest 6e6577206e616d65");
        assert_eq!(Offer::parse(&l).unwrap().unwrap(), o);
        let o = Offer {
            listen: "10.0.0.1:5".into(),
            user: Some("otp-ab".into()),
            key: Some(vec![1, 2]),
            dest: None,
            srcs: vec![b"a".to_vec(), vec![]],
        };
        assert_eq!(Offer::parse(&o.line()).unwrap().unwrap(), o);
        // Lines before the ready line (motd) are not ready lines.
        assert!(Offer::parse("Welcome to host").is_none());
        // Unknown fields are skipped; broken ones are errors.
        let l = "ramsys-ssh v1 listen h:1 future x dest -";
        assert_eq!(Offer::parse(l).unwrap().unwrap().dest, Some(vec![]));
        assert!(Offer::parse("ramsys-ssh v1 listen h:1").unwrap().is_err());
        assert!(Offer::parse("ramsys-ssh v1 listen h:1 dest zz")
            .unwrap()
            .is_err());
        assert!(Offer::parse("ramsys-ssh v1 listen").unwrap().is_err());
    }

    #[test]
    fn credential_format() {
        let good = "ab".repeat(32);
        let mut r = std::io::Cursor::new(format!("{good}\nrest"));
        assert_eq!(read_credential(&mut r).unwrap(), good.as_bytes());
        for bad in ["", "abc\n", &"zz".repeat(32), &"ab".repeat(40)] {
            let mut r = std::io::Cursor::new(bad.to_string());
            assert!(read_credential(&mut r).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn listen_on_the_ssh_server_address() {
        assert_eq!(listen_addr(Some("10.1.1.1 5000 10.1.1.2 22")), "10.1.1.2:0");
        assert_eq!(listen_addr(Some("::1 5000 fe80::2 22")), "[fe80::2]:0");
        assert_eq!(listen_addr(None), "127.0.0.1:0");
        assert_eq!(listen_addr(Some("garbage")), "127.0.0.1:0");
    }

    #[test]
    fn sources_resolve_like_the_agent() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().canonicalize().unwrap();
        std::fs::create_dir(d.join("dir")).unwrap();
        std::fs::write(d.join("dir/f"), b"x").unwrap();
        std::os::unix::fs::symlink("dir", d.join("link")).unwrap();
        let rel = |p: &Path| p.as_os_str().as_bytes()[1..].to_vec();
        assert_eq!(
            source_paths(&[d.join("dir/f"), d.join("link"), d.join("dir/.")]).unwrap(),
            vec![
                rel(&d.join("dir/f")),
                rel(&d.join("link")),
                rel(&d.join("dir"))
            ]
        );
        // A missing source stays, as typed, for the scan to report alone.
        assert_eq!(
            source_paths(&[d.join("missing")]).unwrap(),
            vec![rel(&d.join("missing"))]
        );
    }

    #[test]
    fn paths_beneath_an_export_root() {
        let r = Path::new("/srv/export/alice");
        assert_eq!(
            beneath(r, Path::new("/srv/export/alice/a/b")),
            Some(b"a/b".to_vec())
        );
        assert_eq!(beneath(r, r), Some(vec![]));
        assert_eq!(beneath(r, Path::new("/srv/export/alicex")), None);
        assert_eq!(beneath(r, Path::new("/etc")), None);
    }
}
