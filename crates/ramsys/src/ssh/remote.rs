//! `--remote-ramsys auto` (issue 20): probe the remote host for a ramsys
//! of our version, else upload this binary into its cache, and the sh
//! scripts that do it.

use super::*;

/// `--remote-ramsys auto` (issue 20): the cache of our own binary on a
/// remote host, `${XDG_CACHE_HOME:-$HOME/.cache}/ramsys/bin/`, one file per
/// version and architecture. Nothing outside it is ever written.
const AUTO_CACHE: &str = "${XDG_CACHE_HOME:-$HOME/.cache}/ramsys/bin";

/// What the probe answers: a program to run, or where to put ours.
#[derive(Debug, PartialEq)]
pub(super) enum Probe {
    Use(String),
    Need { path: String, arch: String },
}

impl Probe {
    pub(super) fn parse(out: &str) -> Option<Probe> {
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
pub(super) fn probe_script(version: &str) -> String {
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
pub(super) fn upload_script(version: &str, path: &str) -> String {
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
    pub(super) fn remote_program(&self, host: &SshEndpoint) -> anyhow::Result<String> {
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
