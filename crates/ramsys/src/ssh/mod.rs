//! The agent's ssh front end (issue 9): `[USER@]HOST:PATH` endpoints.
//!
//! For each remote host the agent runs `ramsys ssh-serve` there through
//! the system ssh (so every ssh setting, key and agent the user has
//! applies), writes a fresh one-time credential to its stdin, reads back
//! the address of a one-session daemon, and from then on treats the host
//! as a `ramsys://` daemon keyed with that credential: data flows over
//! direct TCP links, not through ssh (as bbcp and EScp do). The ssh
//! process stays open for the session; closing it ends the remote side.
//! Third-party copies (`HOST1:P HOST2:Q`) start a sink on HOST2, then run
//! `ramsys cp --key-stdin` on HOST1 towards it, relaying its JSON output.
//!
//! One file per job (issue 37): `mod.rs` starting the remote end and the
//! sessions of a copy; `remote.rs` finding or uploading the remote program
//! (`--remote-ramsys auto`); `third_party.rs` copies between two remote
//! hosts; `tests.rs` quoting and the scripts through a real sh.

use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use ramsys_engine::data::resources::DEFAULT_MAX_STREAMS;
use ramsys_engine::transport::Transport;

use crate::args::{CpArgs, SshArgs};
use crate::spec::{Endpoint, SshEndpoint};
use crate::ssh_serve::{Offer, ServeRole, READY_PREFIX};

/// Quote one word for the remote POSIX shell.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A remote path as a shell word: quoted, except a leading `~/` (or a
/// lone `~`), which the remote shell expands to the home directory as
/// scp users expect.
pub fn quote_path(p: &str) -> String {
    if p == "~" {
        return "~".into();
    }
    match p.strip_prefix("~/") {
        Some("") => "~/".into(),
        Some(rest) => format!("~/{}", shell_quote(rest)),
        None => shell_quote(p),
    }
}

/// One ssh process running a ramsys command on a host.
pub struct SshProc {
    pub host: String,
    child: Child,
    stdin: Option<ChildStdin>,
    pub stdout: BufReader<ChildStdout>,
    /// ssh's stderr (and the remote command's), collected by a thread.
    stderr: Arc<Mutex<Vec<String>>>,
    stderr_thread: Option<std::thread::JoinHandle<()>>,
}

impl SshArgs {
    /// `ssh ... HOST REMOTE_COMMAND`, scp's hardening options first-wins
    /// after the user's -o options (ssh keeps the first value it sees).
    fn command(&self, host: &SshEndpoint, remote: &str) -> anyhow::Result<Command> {
        let mut words = self.ssh_cmd.split_whitespace();
        let prog = words.next().context("--ssh-cmd is empty")?;
        let mut c = Command::new(prog);
        c.args(words);
        if let Some(p) = self.ssh_port {
            c.arg("-p").arg(p.to_string());
        }
        if let Some(i) = &self.identity {
            c.arg("-i").arg(i);
        }
        for o in &self.ssh_opt {
            c.arg("-o").arg(o);
        }
        // As scp runs ssh: no X11/agent/port forwarding, no tty, no local
        // or configured remote command; the remote command is ours.
        c.args(["-x", "-T", "-a"]);
        for o in [
            "ClearAllForwardings=yes",
            "PermitLocalCommand=no",
            "RequestTTY=no",
            "RemoteCommand=none",
        ] {
            c.arg("-o").arg(o);
        }
        if let Some(u) = &host.user {
            c.arg("-l").arg(u);
        }
        c.arg(&host.host).arg(remote);
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Ok(c)
    }

    /// Start `REMOTE_RAMSYS ARGS...` on `host`, writing `secret` (one line)
    /// to its stdin. `args` are shell-quoted here; paths must already be
    /// words (see [`quote_path`]).
    pub fn spawn(
        &self,
        host: &SshEndpoint,
        args: &[String],
        secret: &[u8],
        as_user: Option<&str>,
    ) -> anyhow::Result<SshProc> {
        // A one-time credential's user name goes in the environment of
        // the remote command (not secret; the key stays on stdin).
        let env = as_user
            .map(|u| format!("RAMSYS_USER={} ", shell_quote(u)))
            .unwrap_or_default();
        let prog = self.remote_program(host)?;
        let remote = format!("{env}{prog} {}", args.join(" "));
        tracing::debug!("ssh {}: {remote}", host.host);
        let mut c = self.command(host, &remote)?;
        let mut child = c
            .spawn()
            .with_context(|| format!("cannot run {:?}", self.ssh_cmd))?;
        let mut stdin = child.stdin.take().expect("piped");
        // The pipe holds it until ssh has a channel; a failure here shows
        // up as ssh's exit status below.
        let _ = stdin
            .write_all(secret)
            .and_then(|_| stdin.write_all(b"\n"))
            .and_then(|_| stdin.flush());
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let err = child.stderr.take().expect("piped");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let lines = stderr.clone();
        let stderr_thread = std::thread::Builder::new()
            .name("ssh-stderr".into())
            .spawn(move || {
                for l in BufReader::new(err).lines() {
                    let Ok(l) = l else { break };
                    lines.lock().unwrap().push(l);
                }
            })?;
        Ok(SshProc {
            host: host.display_host(),
            child,
            stdin: Some(stdin),
            stdout,
            stderr,
            stderr_thread: Some(stderr_thread),
        })
    }
}

impl SshEndpoint {
    fn display_host(&self) -> String {
        match &self.user {
            Some(u) => format!("{u}@{}", self.host),
            None => self.host.clone(),
        }
    }
}

impl SshProc {
    /// Wait for ssh to exit (up to `t`, then kill it); its exit code.
    /// A tunnel over this ssh's pipes (crate::tunnel): duplicates of its
    /// stdin and stdout, taken once the ready line is read (nothing else
    /// arrives on stdout until the agent opens a link).
    fn tunnel(&self) -> anyhow::Result<Arc<crate::tunnel::Tunnel>> {
        use std::os::fd::AsFd;
        anyhow::ensure!(
            self.stdout.buffer().is_empty(),
            "{}: output after the ready line",
            self.host
        );
        let input = self.stdout.get_ref().as_fd().try_clone_to_owned()?;
        let stdin = self.stdin.as_ref().context("ssh's stdin is closed")?;
        let output = stdin.as_fd().try_clone_to_owned()?;
        Ok(crate::tunnel::Tunnel::start(
            Box::new(std::fs::File::from(input)),
            Box::new(std::fs::File::from(output)),
        ))
    }

    fn wait(&mut self, t: Duration) -> Option<i32> {
        drop(self.stdin.take());
        let end = Instant::now() + t;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = self.child.kill();
                    break self.child.wait().ok();
                }
            }
        };
        if let Some(h) = self.stderr_thread.take() {
            let _ = h.join();
        }
        status.and_then(|s| s.code())
    }

    /// ssh's stderr without its host-key notices, as one line.
    fn stderr_text(&self) -> String {
        let lines = self.stderr.lock().unwrap();
        lines
            .iter()
            .map(|l| l.trim())
            .filter(|l| !l.is_empty() && !l.starts_with("Warning: Permanently added"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Why the remote command failed, in one line, from ssh's exit status
    /// and stderr (callers add which endpoint it was).
    fn failure(&mut self, remote_ramsys: &str) -> anyhow::Error {
        let code = self.wait(Duration::from_secs(10));
        let err = self.stderr_text();
        let detail = if err.is_empty() {
            String::new()
        } else {
            format!(": {err}")
        };
        // The remote ramsys's own one-line error, if it gave one.
        let own = self
            .stderr
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find_map(|l| l.strip_prefix("ramsys: error: ").map(str::to_string));
        match (code, own) {
            // ssh's own failures: connection, host key, authentication.
            (Some(255), _) => anyhow::anyhow!("ssh failed{detail}"),
            (Some(127), _) => anyhow::anyhow!(
                "ramsys not found on the remote host as {remote_ramsys:?} (set --remote-ramsys){detail}"
            ),
            (Some(126), _) => anyhow::anyhow!(
                "cannot run {remote_ramsys:?} on the remote host (set --remote-ramsys){detail}"
            ),
            (_, Some(m)) => anyhow::anyhow!("{m}"),
            (c, None) => anyhow::anyhow!(
                "remote ramsys exited with status {}{detail}",
                c.map_or("unknown".to_string(), |c| c.to_string())
            ),
        }
    }
}

impl Drop for SshProc {
    fn drop(&mut self) {
        // Closing stdin ends the remote side; give it a moment, then make
        // sure no ssh outlives the agent.
        if self.stderr_thread.is_some() {
            self.wait(Duration::from_secs(5));
        }
    }
}

/// A session started over ssh: the daemon to talk to and how.
pub struct SshSession {
    pub ssh: SshProc,
    pub addr: String,
    pub key: Vec<u8>,
    /// The name to authenticate as, when a running daemon minted the
    /// credential (None: our own user name).
    pub user: Option<String>,
    pub offer: Offer,
    /// Links through this ssh connection (crate::tunnel), if needed.
    pub tunnel: Arc<crate::tunnel::Tunnel>,
}

impl SshSession {
    /// End the session: close ssh's stdin and reap it.
    pub fn finish(mut self) {
        self.tunnel.close();
        self.ssh.wait(Duration::from_secs(10));
        // The remote end's one-line notes (e.g. what an archive copy could
        // not keep there, engine archive::apply) reach the user.
        for l in self.ssh.stderr.lock().unwrap().iter() {
            if l.starts_with("ramsys: note: ") {
                say!("{}: {}", self.ssh.host, &l["ramsys: ".len()..]);
            }
        }
    }
}

fn fresh_credential() -> String {
    hex::encode(ramsys_engine::transport::crypto::random32())
}

/// The remote daemon's stream limit: as many as `ramsys serve` allows,
/// since with no --streams the transfer may add streams on a long path
/// (engine transport::grow); an explicit count above that, that count.
fn serve_max_streams(streams: Option<u16>) -> usize {
    streams.map_or(DEFAULT_MAX_STREAMS, |n| {
        (n as usize).max(DEFAULT_MAX_STREAMS)
    })
}

/// Set by a continuous replication job (`sync --watch`, issue 38): the
/// remote end serves session after session with one credential until the
/// agent closes its stdin (`ssh-serve --until-eof`).
pub static KEEP_SERVING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Start `ssh-serve` on `host` for `role` and wait for its ready line.
pub fn serve(
    a: &CpArgs,
    host: &SshEndpoint,
    role: ServeRole,
    paths: &[&str],
) -> anyhow::Result<SshSession> {
    let cred = fresh_credential();
    let mut args = vec![
        "ssh-serve".to_string(),
        "--role".into(),
        role.as_str().into(),
        "--block-size".into(),
        a.block_size.to_string(),
        "--max-streams".into(),
        serve_max_streams(a.streams).to_string(),
        "--window".into(),
        a.window.to_string(),
        "--accept-timeout".into(),
        (a.connect_timeout.max(1) * 6).to_string(),
    ];
    args.extend(storage_args(a, role == ServeRole::Sink));
    if KEEP_SERVING.load(std::sync::atomic::Ordering::Relaxed) {
        args.push("--until-eof".into());
    }
    args.push("--".into());
    args.extend(paths.iter().map(|p| quote_path(p)));
    let mut p = a.ssh.spawn(host, &args, cred.as_bytes(), None)?;
    let mut noise = Vec::new();
    loop {
        let mut line = String::new();
        match p.stdout.read_line(&mut line) {
            Ok(0) | Err(_) => {
                let e = p.failure(&a.ssh.remote_ramsys);
                return Err(if noise.is_empty() {
                    e
                } else {
                    e.context(format!("remote output: {}", noise.join("; ")))
                });
            }
            Ok(_) => {}
        }
        match Offer::parse(&line) {
            Some(Ok(offer)) => {
                let key = offer.key.clone().unwrap_or_else(|| cred.into_bytes());
                let tunnel = p.tunnel()?;
                return Ok(SshSession {
                    tunnel,
                    ssh: p,
                    addr: offer.listen.clone(),
                    key,
                    user: offer.user.clone(),
                    offer,
                });
            }
            Some(Err(e)) => bail!("{}: bad {READY_PREFIX} line: {e}", p.host),
            None if noise.len() < 5 => noise.push(line.trim().to_string()),
            None => {}
        }
    }
}

/// Storage options that shape the remote end, as ssh-serve/cp flags.
fn storage_args(a: &CpArgs, remote_is_sink: bool) -> Vec<String> {
    let s = &a.storage;
    let mut v = Vec::new();
    if a.fsync {
        v.push("--fsync".into());
    }
    if s.no_direct {
        v.push("--no-direct".into());
    }
    if let Some(d) = s.direct {
        v.push(format!("--direct={}", format!("{d:?}").to_lowercase()));
    }
    if s.no_sort {
        v.push("--no-sort".into());
    }
    if let Some(e) = s.io_engine {
        v.push(format!("--io-engine={}", format!("{e:?}").to_lowercase()));
    }
    if remote_is_sink {
        v.push(format!(
            "--sink-engine={}",
            format!("{:?}", s.sink_engine).to_lowercase()
        ));
    } else {
        v.push(format!(
            "--source-engine={}",
            format!("{:?}", s.source_engine).to_lowercase()
        ));
        v.push(format!("--null-size={}", s.null_size));
    }
    v
}

/// Sessions this agent opened over ssh, ended when the transfer is over.
#[derive(Default)]
pub struct Opened {
    pub sessions: Vec<SshSession>,
}

impl Opened {
    /// The credential of the ssh session, if the transfer uses one.
    pub fn key(&self) -> Option<Vec<u8>> {
        self.sessions.first().map(|s| s.key.clone())
    }

    /// The user name to authenticate as, if not ours (a running daemon's
    /// one-time credential).
    pub fn user(&self) -> Option<String> {
        self.sessions.first().and_then(|s| s.user.clone())
    }

    pub fn finish(self) {
        for s in self.sessions {
            s.finish();
        }
    }

    /// How to reach the remote end: direct TCP, falling back to links
    /// through the ssh connection (at once with --ssh-tunnel); None when
    /// no ssh end is in the transfer.
    pub fn transport(&self, a: &CpArgs) -> Option<Arc<dyn Transport>> {
        let s = self.sessions.first()?;
        let direct: Arc<dyn Transport> = Arc::new(ramsys_engine::transport::tcp::Tcp {
            socket_buffer: None,
        });
        Some(Arc::new(crate::tunnel::Fallback::new(
            direct,
            s.tunnel.clone(),
            &s.ssh.host,
            a.ssh.ssh_tunnel,
        )))
    }
}

/// Turn ssh endpoints into daemon endpoints by starting their remote end:
/// a sink for an ssh destination, a source for ssh sources (all on one
/// host). Third-party copies are handled by [`third_party`] before this.
pub fn open(a: &CpArgs, srcs: &mut [Endpoint], dst: &mut Endpoint) -> anyhow::Result<Opened> {
    let mut opened = Opened::default();
    let ssh_srcs: Vec<SshEndpoint> = srcs
        .iter()
        .filter_map(|s| match s {
            Endpoint::Ssh(e) => Some(e.clone()),
            _ => None,
        })
        .collect();
    if let Endpoint::Ssh(d) = dst {
        if srcs.iter().any(|s| matches!(s, Endpoint::Daemon { .. })) {
            bail!("copying from a ramsys:// daemon to an ssh destination is not supported");
        }
        let s = serve(a, d, ServeRole::Sink, &[d.path.as_str()]).with_context(|| d.display())?;
        *dst = Endpoint::Daemon {
            addr: s.addr.clone(),
            path: s.offer.dest.clone().unwrap_or_default(),
        };
        opened.sessions.push(s);
    } else if !ssh_srcs.is_empty() {
        if ssh_srcs.len() != srcs.len() {
            bail!("sources must be all local, all on one daemon or all on one ssh host");
        }
        let h = &ssh_srcs[0];
        if ssh_srcs
            .iter()
            .any(|e| e.host != h.host || e.user != h.user)
        {
            bail!("all remote sources must be on the same host");
        }
        let paths: Vec<&str> = ssh_srcs.iter().map(|e| e.path.as_str()).collect();
        let s = serve(a, h, ServeRole::Source, &paths).with_context(|| h.display())?;
        anyhow::ensure!(
            s.offer.srcs.len() == srcs.len(),
            "{}: ready line names {} sources, expected {}",
            h.host,
            s.offer.srcs.len(),
            srcs.len()
        );
        for (e, p) in srcs.iter_mut().zip(&s.offer.srcs) {
            *e = Endpoint::Daemon {
                addr: s.addr.clone(),
                path: p.clone(),
            };
        }
        opened.sessions.push(s);
    }
    Ok(opened)
}

mod remote;
mod third_party;

pub use third_party::third_party;

#[cfg(test)]
mod tests;
