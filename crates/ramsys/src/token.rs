//! `ramsys token`: ask a running daemon for a one-time credential (issue
//! 9; docs/SECURITY.md). The ssh helper relays it to the agent on the other
//! end, which authenticates its one session with it.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use ramsys_engine::roles::client::{request_token, Remote};
use ramsys_engine::transport::tcp::Tcp;

use crate::KeyArgs;

#[derive(Args, Debug)]
pub struct TokenArgs {
    /// Daemon to ask (HOST:PORT or ramsys://HOST:PORT). Default:
    /// $RAMSYS_DAEMON, else the address file a `serve --addr-file` wrote.
    #[arg(long, value_name = "HOST:PORT")]
    pub daemon: Option<String>,
    /// Address file to read when no daemon is given (default
    /// $XDG_RUNTIME_DIR/ramsys/daemon.addr, else ~/.config/ramsys/daemon.addr).
    #[arg(long, value_name = "FILE")]
    pub addr_file: Option<PathBuf>,
    #[command(flatten)]
    pub key: KeyArgs,
    /// Seconds the credential stays usable (0: the daemon's default, 60;
    /// at most 3600).
    #[arg(long, default_value_t = 0)]
    pub ttl: u32,
    /// Print {"user","key","expires_s","daemon"} as one JSON line.
    #[arg(long)]
    pub json: bool,
    /// Seconds to wait for the daemon to answer.
    #[arg(long, default_value_t = 10)]
    pub connect_timeout: u64,
}

/// The address a `serve --addr-file` recorded (first line of the file).
pub fn read_addr_file(p: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(p).with_context(|| {
        format!(
            "no daemon address: give --daemon HOST:PORT, set RAMSYS_DAEMON, or start \
             `ramsys serve --addr-file` (cannot read {})",
            p.display()
        )
    })?;
    text.lines()
        .next()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .with_context(|| format!("address file {} is empty", p.display()))
}

pub fn run(a: &TokenArgs) -> anyhow::Result<i32> {
    let (target, from_file) = match a.daemon.clone().or_else(|| {
        std::env::var("RAMSYS_DAEMON")
            .ok()
            .filter(|s| !s.is_empty())
    }) {
        Some(d) => (d, None),
        None => {
            let p = a
                .addr_file
                .clone()
                .unwrap_or_else(ramsys_resources::keys::default_addr_path);
            (read_addr_file(&p)?, Some(p))
        }
    };
    let addr = crate::status::daemon_addr(&target)?;
    let remote = Remote {
        transport: Arc::new(Tcp {
            socket_buffer: None,
        }),
        addr: addr.clone(),
        key: a.key.load()?,
        connect_timeout: Duration::from_secs(a.connect_timeout.max(1)),
        user: None,
    };
    let c = request_token(&remote, a.ttl).map_err(|e| match &from_file {
        Some(p) => anyhow::anyhow!("{e} (daemon address from {}; stale?)", p.display()),
        None => anyhow::anyhow!("{e}"),
    })?;
    let mut o = std::io::stdout().lock();
    if a.json {
        writeln!(o, "{}", serde_json::to_string(&c)?)?;
    } else {
        writeln!(
            o,
            "user {}\nkey {}\nexpires_s {}\ndaemon {}",
            c.user, c.key, c.expires_s, c.daemon
        )?;
    }
    Ok(0)
}
