//! `ramsys serve`'s signals (issue 20): SIGHUP reloads `--config` and
//! `--users` without dropping running sessions; SIGTERM and SIGINT drain
//! (new sessions refused with a clear message, running ones given
//! `--drain-timeout` to finish, then stopped so that `--resume` continues
//! them); a second SIGTERM/SIGINT ends the grace period at once.
//!
//! The signals are blocked in every thread before any starts and taken by
//! one thread with sigwait, so no handler runs in an arbitrary thread and
//! the work (file reads, logging) happens in ordinary code.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ramsys_engine::daemon::config::DaemonConfig;
use ramsys_engine::daemon::credentials::Users;
use ramsys_engine::daemon::users::load_users_file;
use ramsys_engine::roles::server::DaemonShared;

const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// How long stopped sessions get to clean up (close links, keep their
/// journals) after the grace period, before the process exits anyway.
const STOP_WAIT: Duration = Duration::from_secs(10);

fn sigset() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in SIGNALS {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Block SIGINT/SIGTERM/SIGHUP in this thread and every thread it starts
/// afterwards, so only [`spawn`]'s thread receives them.
pub fn block() {
    let set = sigset();
    // SAFETY: a valid set; only this thread's mask changes.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// The next blocked signal, or None after `timeout` (None: wait forever).
fn wait(timeout: Option<Duration>) -> Option<libc::c_int> {
    let set = sigset();
    match timeout {
        None => {
            let mut sig: libc::c_int = 0;
            // SAFETY: valid set and out-pointer.
            let r = unsafe { libc::sigwait(&set, &mut sig) };
            (r == 0).then_some(sig)
        }
        Some(t) => {
            let ts = libc::timespec {
                tv_sec: t.as_secs() as libc::time_t,
                tv_nsec: t.subsec_nanos() as libc::c_long,
            };
            // SAFETY: valid set and timespec; no siginfo wanted.
            let r = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &ts) };
            (r > 0).then_some(r)
        }
    }
}

/// What a reload re-reads and where it applies it.
pub struct Ctl {
    pub shared: Arc<DaemonShared>,
    pub config: Option<PathBuf>,
    pub users: Option<PathBuf>,
    /// `--max-rate` (wins over the config's, so a reload keeps it).
    pub max_rate_flag: Option<u64>,
    pub drain_timeout: Duration,
    pub addr_file: Option<PathBuf>,
}

/// Start the signal thread.
pub fn spawn(ctl: Ctl) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            match wait(None) {
                Some(libc::SIGHUP) => reload(&ctl),
                Some(sig) => drain_and_exit(&ctl, sig),
                None => std::thread::sleep(Duration::from_millis(10)),
            }
        })
        .map(|_| ())
}

/// The users table and daemon rate the files on disk describe now.
/// `Ok(None)` for the table: the daemon serves the shared key (no users
/// configured at all).
pub fn load(
    config: Option<&Path>,
    users: Option<&Path>,
) -> anyhow::Result<(DaemonConfig, Option<Users>)> {
    let cfg = match config {
        Some(p) => DaemonConfig::load(p)?,
        None => DaemonConfig::default(),
    };
    let mut specs = cfg.users.clone();
    if let Some(p) = users {
        specs.extend(load_users_file(p)?);
    }
    let table = if specs.is_empty() {
        None
    } else {
        Some(Users::open(&specs)?)
    };
    Ok((cfg, table))
}

/// SIGHUP: re-read both files; apply the users table and `max_rate`
/// (running sessions keep what they were granted, and users present before
/// and after keep their rate bucket). Anything invalid keeps the old
/// configuration, with one line in the log. Other settings (pools,
/// placement) are fixed at start.
fn reload(c: &Ctl) {
    let sh = &c.shared;
    let (cfg, users) = match load(c.config.as_deref(), c.users.as_deref()) {
        Ok(v) => v,
        Err(e) => {
            tracing::error!("reload failed, keeping the running configuration: {e:#}");
            return;
        }
    };
    let had_users = sh.creds.users().is_some();
    let n = match users {
        Some(u) => {
            for r in u.roots() {
                let (dev, kind) = ramsys_engine::daemon::netdev::device_of(&r.path);
                sh.state.add_device(&dev, kind);
            }
            let n = u.len();
            sh.creds.replace_users(u);
            n
        }
        None if had_users => {
            tracing::error!(
                "reload failed, keeping the running configuration: the users table names no user"
            );
            return;
        }
        None => 0,
    };
    let rate = c.max_rate_flag.or(cfg.max_rate).unwrap_or(0);
    sh.rates.daemon.set_rate(rate);
    tracing::warn!(
        "reloaded: {n} users, max_rate {}",
        ramsys_engine::data::rate::show_rate(rate)
    );
}

/// SIGTERM/SIGINT: refuse new sessions, wait for the running ones up to
/// the grace period (a second signal cuts it short), stop the rest, exit.
fn drain_and_exit(c: &Ctl, sig: libc::c_int) -> ! {
    let sh = &c.shared;
    sh.life.start_drain();
    let running = || sh.active.load(Ordering::Relaxed);
    let deadline = Instant::now() + c.drain_timeout;
    if running() > 0 {
        tracing::warn!(
            "signal {sig}: draining {} running sessions (up to {:?}); new sessions are refused",
            running(),
            c.drain_timeout
        );
    }
    while running() > 0 && Instant::now() < deadline {
        match wait(Some(Duration::from_millis(100))) {
            Some(libc::SIGHUP) => reload(c),
            Some(_) => break,
            None => {}
        }
    }
    if running() > 0 {
        let n = sh.life.stop_all();
        tracing::warn!(
            "drain: stopping {n} sessions still running; their large files are kept for --resume"
        );
        let stop = Instant::now() + STOP_WAIT;
        while running() > 0 && Instant::now() < stop {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    if let Some(p) = &c.addr_file {
        let _ = std::fs::remove_file(p);
    }
    tracing::info!("signal {sig}: exiting");
    std::process::exit(128 + sig);
}
