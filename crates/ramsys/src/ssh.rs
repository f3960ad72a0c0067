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

/// `--remote-ramsys auto` (issue 20): the cache of our own binary on a
/// remote host, `${XDG_CACHE_HOME:-$HOME/.cache}/ramsys/bin/`, one file per
/// version and architecture. Nothing outside it is ever written.
const AUTO_CACHE: &str = "${XDG_CACHE_HOME:-$HOME/.cache}/ramsys/bin";

/// What the probe answers: a program to run, or where to put ours.
#[derive(Debug, PartialEq)]
enum Probe {
    Use(String),
    Need { path: String, arch: String },
}

impl Probe {
    fn parse(out: &str) -> Option<Probe> {
        let line = out.lines().rev().find(|l| !l.trim().is_empty())?;
        if let Some(p) = line.strip_prefix("use ") {
            return Some(Probe::Use(p.to_string()));
        }
        let rest = line.strip_prefix("need ")?;
        let (arch, path) = rest.split_once(' ')?;
        Some(Probe::Need {
            path: path.to_string(),
            arch: arch.to_string(),
        })
    }
}

/// The probe, for `sh -c`: a `ramsys` on the remote PATH of our exact
/// version, else our cached copy, else where the copy goes.
fn probe_script(version: &str) -> String {
    let v = shell_quote(&format!("ramsys {version}"));
    let name = shell_quote(&format!("ramsys-{version}-{}", std::env::consts::ARCH));
    format!(
        "v={v}; c=\"{AUTO_CACHE}\"/{name}; \
         if [ \"$(ramsys --version 2>/dev/null)\" = \"$v\" ]; then echo 'use ramsys'; \
         elif [ -x \"$c\" ] && [ \"$(\"$c\" --version 2>/dev/null)\" = \"$v\" ]; then echo \"use $c\"; \
         else echo \"need $(uname -m) $c\"; fi"
    )
}

/// The upload, for `sh -c` with our binary on stdin: into a temp file
/// beside its final name (private, executable), kept only if it runs there
/// and says our version; renamed over nothing but our own cache entry.
fn upload_script(version: &str, path: &str) -> String {
    let v = shell_quote(&format!("ramsys {version}"));
    let c = shell_quote(path);
    format!(
        "set -e; umask 077; v={v}; c={c}; mkdir -p \"$(dirname \"$c\")\"; t=\"$c.tmp.$$\"; \
         trap 'rm -f \"$t\"' EXIT; cat >\"$t\"; chmod 700 \"$t\"; \
         if [ \"$(\"$t\" --version 2>/dev/null)\" = \"$v\" ]; then mv -f \"$t\" \"$c\"; \
         else echo 'the copied ramsys does not run there' >&2; exit 3; fi"
    )
}

impl SshArgs {
    /// The ramsys to run on `host`: `--remote-ramsys` as given, or with
    /// `auto` one of our exact version there, copying our own binary into
    /// the remote user's cache over ssh when there is none.
    fn remote_program(&self, host: &SshEndpoint) -> anyhow::Result<String> {
        if self.remote_ramsys != "auto" {
            return Ok(self.remote_ramsys.clone());
        }
        let version = env!("CARGO_PKG_VERSION");
        let where_ = host.display_host();
        let out = self.run_sh(host, &probe_script(version), None)?;
        let (path, arch) = match Probe::parse(&out) {
            Some(Probe::Use(p)) => return Ok(shell_quote(&p)),
            Some(Probe::Need { path, arch }) => (path, arch),
            None => bail!("{where_}: --remote-ramsys auto: unexpected answer {out:?}"),
        };
        anyhow::ensure!(
            arch == std::env::consts::ARCH,
            "{where_}: --remote-ramsys auto: the host is {arch}, this ramsys is {}; install ramsys there",
            std::env::consts::ARCH
        );
        let exe = std::env::current_exe().context("--remote-ramsys auto: our own binary")?;
        let bin = std::fs::File::open(&exe)
            .with_context(|| format!("--remote-ramsys auto: {}", exe.display()))?;
        say!("ramsys: {where_}: no ramsys {version} there; copying this one to {path}");
        self.run_sh(host, &upload_script(version, &path), Some(bin))
            .map_err(|e| {
                e.context(format!(
                    "{where_}: --remote-ramsys auto: copying ramsys to {path} \
                     (a static build runs on any Linux: scripts/build-static.sh)"
                ))
            })?;
        Ok(shell_quote(&path))
    }

    /// Run `sh -c SCRIPT` on `host` with `input` (or nothing) on stdin; its
    /// stdout, or one line saying why it failed.
    fn run_sh(
        &self,
        host: &SshEndpoint,
        script: &str,
        input: Option<std::fs::File>,
    ) -> anyhow::Result<String> {
        let mut c = self.command(host, &format!("sh -c {}", shell_quote(script)))?;
        let mut child = c
            .spawn()
            .with_context(|| format!("cannot run {:?}", self.ssh_cmd))?;
        let mut stdin = child.stdin.take().expect("piped");
        let feeder = std::thread::spawn(move || {
            if let Some(mut f) = input {
                let _ = std::io::copy(&mut f, &mut stdin);
            }
        });
        let o = child.wait_with_output()?;
        let _ = feeder.join();
        if !o.status.success() {
            let err = String::from_utf8_lossy(&o.stderr);
            let err: Vec<&str> = err
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with("Warning: Permanently added"))
                .collect();
            bail!(
                "ssh exited with status {}: {}",
                o.status.code().map_or("?".into(), |c| c.to_string()),
                err.join("; ")
            );
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
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

/// `HOST1:P... HOST2:Q`: if this is a third-party copy, run it and return
/// the exit code; data moves HOST1 -> HOST2 directly.
pub fn third_party(
    a: &CpArgs,
    sync: u32,
    srcs: &[Endpoint],
    dst: &Endpoint,
) -> anyhow::Result<Option<i32>> {
    let Endpoint::Ssh(d) = dst else {
        return Ok(None);
    };
    let ssh_srcs: Vec<&SshEndpoint> = srcs
        .iter()
        .filter_map(|s| match s {
            Endpoint::Ssh(e) => Some(e),
            _ => None,
        })
        .collect();
    if ssh_srcs.is_empty() {
        return Ok(None);
    }
    if ssh_srcs.len() != srcs.len() {
        bail!("sources must be all local or all on one ssh host");
    }
    let h = ssh_srcs[0];
    if ssh_srcs
        .iter()
        .any(|e| e.host != h.host || e.user != h.user)
    {
        bail!("all remote sources must be on the same host");
    }
    anyhow::ensure!(
        a.select.files_from.is_none(),
        "--files-from is not supported for a copy between two ssh hosts (the list is here)"
    );
    let sink = serve(a, d, ServeRole::Sink, &[d.path.as_str()]).with_context(|| d.display())?;
    let dest = String::from_utf8(sink.offer.dest.clone().unwrap_or_default())
        .map_err(|_| anyhow::anyhow!("{}: destination name is not UTF-8", d.display()))?;
    let url = format!("ramsys://{}/{}", sink.addr, dest);
    let args = source_cp_args(a, sync, &ssh_srcs, &url);
    let mut p = a.ssh.spawn(h, &args, &sink.key, sink.user.as_deref())?;
    let code = relay(a, &mut p);
    let code = match code {
        Some(c) => {
            p.wait(Duration::from_secs(10));
            let err = p.stderr_text();
            if !err.is_empty() && c != 0 {
                say!("ramsys: {}: {err}", p.host);
            }
            c
        }
        None => {
            let e = p.failure(&a.ssh.remote_ramsys);
            return Err(e.context(h.display()));
        }
    };
    sink.finish();
    Ok(Some(code))
}

/// HOST1's command line: `cp|sync --key-stdin --json OPTIONS -- SRC... URL`.
fn source_cp_args(a: &CpArgs, sync: u32, srcs: &[&SshEndpoint], url: &str) -> Vec<String> {
    use ramsys_engine::request::sync::flags::*;
    let mut v: Vec<String> = vec![if sync & SYNC != 0 { "sync" } else { "cp" }.into()];
    v.extend(["--key-stdin".into(), "--json".into()]);
    for (flag, on) in [
        ("--checksum", sync & SYNC != 0 && sync & CHECKSUM != 0),
        ("--delete", sync & DELETE != 0),
        ("--dry-run", sync & DRY_RUN != 0),
        ("--resume", sync & RESUME != 0),
        ("--no-resume", sync & JOURNAL == 0),
        ("--write-devices", sync & WRITE_DEVICES != 0),
        ("--ignore-existing", sync & IGNORE_EXISTING != 0),
        ("--update", sync & UPDATE != 0),
        ("-r", a.recursive || a.archive.archive),
        ("--no-checksum", a.no_checksum),
    ] {
        if on {
            v.push(flag.into());
        }
    }
    v.push(format!("--block-size={}", a.block_size));
    v.extend(a.archive.to_args());
    // The selection, rules in order (HOST1's scan applies it), each as the
    // --filter rule it is on the wire (clears and merges already applied).
    // These words go through HOST1's shell: quoted.
    for r in &a.select.rules {
        v.push(shell_quote(&format!(
            "--filter={}",
            String::from_utf8_lossy(r)
        )));
    }
    if let Some(n) = a.select.min_size {
        v.push(format!("--min-size={n}"));
    }
    if let Some(n) = a.select.max_size {
        v.push(format!("--max-size={n}"));
    }
    if let Some(s) = a.streams {
        v.push(format!("--streams={s}"));
    }
    // HOST1 is the source: its senders apply the limit (in bytes/s).
    if let Some(b) = a.bwlimit {
        v.push(format!("--bwlimit={b}B"));
    }
    if let Some(r) = a.readers {
        v.push(format!("--readers={r}"));
    }
    v.push(format!("--memory={}", a.memory));
    v.push(format!("--connect-timeout={}", a.connect_timeout));
    v.push(format!("--numa={}", a.numa));
    if let Some(c) = a.encrypt {
        use ramsys_engine::transport::crypto::Cipher;
        v.push(
            match c {
                Cipher::None => "--encrypt=none",
                Cipher::Aes256Gcm => "--encrypt=aes-256-gcm",
                Cipher::ChaCha20Poly1305 => "--encrypt=chacha20-poly1305",
            }
            .into(),
        );
    }
    if let Ok(serde_json::Value::String(c)) = serde_json::to_value(a.channels) {
        v.push(format!("--channels={c}"));
    }
    v.extend(storage_args(a, false));
    v.push("--".into());
    v.extend(srcs.iter().map(|e| quote_path(&e.path)));
    v.push(shell_quote(url));
    v
}

/// Relay HOST1's `--json` output: progress and the summary line as they
/// are with --json, else a bar on a terminal and cp's summary line.
/// Returns cp's exit code, or None if it ended without a summary.
fn relay(a: &CpArgs, p: &mut SshProc) -> Option<i32> {
    let bar = (!a.json && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(0);
        if let Ok(s) =
            indicatif::ProgressStyle::with_template("{bar:30} {bytes}/{total_bytes} {msg}")
        {
            b.set_style(s);
        }
        b
    });
    let mut summary = None;
    let mut line = String::new();
    loop {
        line.clear();
        match p.stdout.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line.trim()) else {
            continue;
        };
        if a.json {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(line.as_bytes());
            let _ = o.flush();
        }
        match v["event"].as_str() {
            Some("progress") => {
                if let Some(b) = &bar {
                    b.set_length(v["total_bytes"].as_u64().unwrap_or(0));
                    b.set_position(v["bytes"].as_u64().unwrap_or(0));
                    let bps = v["mb_s"].as_f64().unwrap_or(0.0) * 1e6;
                    b.set_message(ramsys_units::format_rate(bps as u64));
                }
            }
            Some("summary") => summary = Some(v),
            _ => {}
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let v = summary?;
    let ok = v["ok"].as_bool() == Some(true);
    if !a.json {
        print_summary(&v, &p.host);
    }
    Some(i32::from(!ok))
}

fn print_summary(v: &serde_json::Value, host: &str) {
    if let Some(e) = v["error"].as_str() {
        say!("ramsys: error: {host}: {e}");
        return;
    }
    for f in v["failed"].as_array().into_iter().flatten() {
        say!(
            "ramsys: failed: {}: {}",
            f["path"].as_str().unwrap_or("?"),
            f["reason"].as_str().unwrap_or("?")
        );
    }
    if v.get("unchanged").is_some() {
        println!(
            "{} files unchanged, {} entries deleted",
            v["unchanged"].as_u64().unwrap_or(0),
            v["deleted"].as_u64().unwrap_or(0)
        );
    }
    tell!(
        "copied {} files, {} in {:.2} s ({}), from {host}",
        v["files"].as_u64().unwrap_or(0),
        ramsys_units::format_size(v["bytes"].as_u64().unwrap_or(0)),
        v["wall_s"].as_f64().unwrap_or(0.0),
        // mb_s in the JSON summary is 10^6 bytes/s (bench/README.md).
        ramsys_units::format_rate((v["mb_s"].as_f64().unwrap_or(0.0) * 1e6) as u64),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_remote_end_allows_what_a_daemon_allows() {
        assert_eq!(serve_max_streams(None), 32);
        assert_eq!(serve_max_streams(Some(3)), 32);
        assert_eq!(serve_max_streams(Some(48)), 48);
    }
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    #[test]
    fn auto_probe_answers() {
        assert_eq!(
            Probe::parse("motd\nuse ramsys\n"),
            Some(Probe::Use("ramsys".into()))
        );
        assert_eq!(
            Probe::parse("need x86_64 /home/a b/.cache/ramsys/bin/ramsys-1-x86_64\n"),
            Some(Probe::Need {
                arch: "x86_64".into(),
                path: "/home/a b/.cache/ramsys/bin/ramsys-1-x86_64".into()
            })
        );
        assert_eq!(Probe::parse("sh: not found"), None);
    }

    /// The probe and the upload through a real sh, against a fake cache.
    #[test]
    fn auto_scripts_through_sh() {
        let d = tempfile::tempdir().unwrap();
        let sh = |script: &str, stdin: &[u8]| {
            let mut c = Command::new("sh")
                .arg("-c")
                .arg(script)
                .env("XDG_CACHE_HOME", d.path())
                .env("PATH", "/usr/bin:/bin")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            c.stdin.take().unwrap().write_all(stdin).unwrap();
            c.wait_with_output().unwrap()
        };
        let o = sh(&probe_script("9.9"), b"");
        let Some(Probe::Need { path, .. }) = Probe::parse(&String::from_utf8_lossy(&o.stdout))
        else {
            panic!("{o:?}")
        };
        assert!(path.starts_with(d.path().to_str().unwrap()), "{path}");
        // A binary that is not ours (wrong version) is refused and removed.
        let fake = b"#!/bin/sh\necho ramsys 1.0\n";
        let o = sh(&upload_script("9.9", &path), fake);
        assert!(!o.status.success());
        assert!(!Path::new(&path).exists());
        assert_eq!(
            std::fs::read_dir(Path::new(&path).parent().unwrap())
                .unwrap()
                .count(),
            0
        );
        // Ours is kept, private, and found by the next probe.
        let ours = b"#!/bin/sh\necho ramsys 9.9\n";
        let o = sh(&upload_script("9.9", &path), ours);
        assert!(o.status.success(), "{o:?}");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        let o = sh(&probe_script("9.9"), b"");
        assert_eq!(
            Probe::parse(&String::from_utf8_lossy(&o.stdout)),
            Some(Probe::Use(path))
        );
    }

    /// A third-party copy's HOST1 is the source: it gets --bwlimit, in
    /// bytes per second so no unit is reinterpreted.
    #[test]
    fn third_party_source_gets_the_rate_limit() {
        #[derive(clap::Parser)]
        struct W {
            #[command(flatten)]
            a: CpArgs,
        }
        let w =
            <W as clap::Parser>::try_parse_from(["x", "--bwlimit", "20M", "h1:a", "h2:b"]).unwrap();
        let src = SshEndpoint {
            user: None,
            host: "h1".into(),
            path: "a".into(),
        };
        let v = source_cp_args(&w.a, 0, &[&src], "ramsys://h2:1/b");
        assert!(v.contains(&format!("--bwlimit={}B", 20 << 20)), "{v:?}");
        // Rules travel as quoted --filter words (issue 35).
        let mut w = <W as clap::Parser>::try_parse_from([
            "x",
            "--exclude",
            "-a b",
            "-f",
            "+ *.c",
            "h1:a",
            "h2:b",
        ])
        .unwrap();
        w.a.select.rules = vec![b"- -a b".to_vec(), b"+ *.c".to_vec()];
        let v = source_cp_args(&w.a, 0, &[&src], "ramsys://h2:1/b");
        assert!(v.contains(&"'--filter=- -a b'".to_string()), "{v:?}");
        assert!(v.contains(&"'--filter=+ *.c'".to_string()), "{v:?}");
        assert_eq!(
            ramsys_engine::data::rate::parse_rate(&format!("{}B", 20 << 20)),
            Ok(20 << 20)
        );
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("abc/d.e"), "abc/d.e");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("$(rm -rf /)"), "'$(rm -rf /)'");
        assert_eq!(quote_path("~/a b"), "~/'a b'");
        assert_eq!(quote_path("~"), "~");
        assert_eq!(quote_path("~x"), "'~x'");
        assert_eq!(quote_path("/abs;x"), "'/abs;x'");
    }

    /// The words reach a real shell as the strings they quote.
    #[test]
    fn quoting_through_sh() {
        let words = [
            "plain", "a b", "it's", "$HOME", "`x`", "\\", "", "ü ñ", "-x",
        ];
        let script = format!(
            "printf '%s\\n' {}",
            words
                .iter()
                .map(|w| shell_quote(w))
                .collect::<Vec<_>>()
                .join(" ")
        );
        let out = Command::new("sh").arg("-c").arg(&script).output().unwrap();
        let got = String::from_utf8(out.stdout).unwrap();
        let got: Vec<&str> = got.lines().collect();
        assert_eq!(got, words);
    }
}
