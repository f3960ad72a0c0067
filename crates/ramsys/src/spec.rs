//! Parsing of command-line values: endpoints and sizes, and where a local
//! destination resolves.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::Context;

/// A transfer endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Local(std::path::PathBuf),
    /// ramsys://HOST:PORT/PATH; path relative to the daemon root.
    Daemon {
        addr: String,
        path: Vec<u8>,
    },
    /// [USER@]HOST:PATH, reached through the system ssh (scp's syntax);
    /// PATH is the remote's, relative to the login directory unless
    /// absolute; empty means that directory.
    Ssh(SshEndpoint),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshEndpoint {
    pub user: Option<String>,
    /// Without IPv6 brackets.
    pub host: String,
    pub path: String,
}

impl SshEndpoint {
    /// How to show it in messages: as the user wrote it.
    pub fn display(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        match &self.user {
            Some(u) => format!("{u}@{host}:{}", self.path),
            None => format!("{host}:{}", self.path),
        }
    }
}

/// scp's rule (OpenSSH misc.c colon()): a ':' before any '/' makes the
/// argument remote; '[...]' brackets an IPv6 host; a leading ':' is local.
fn ssh_split(s: &str) -> Option<(&str, &str)> {
    let b = s.as_bytes();
    if b.first() == Some(&b':') {
        return None;
    }
    let mut bracket = b.first() == Some(&b'[');
    for i in 0..b.len() {
        if b[i] == b'@' && b.get(i + 1) == Some(&b'[') {
            bracket = true;
        }
        if bracket && b[i] == b']' && b.get(i + 1) == Some(&b':') {
            return Some((&s[..i + 1], &s[i + 2..]));
        }
        if !bracket && b[i] == b':' {
            return Some((&s[..i], &s[i + 1..]));
        }
        if b[i] == b'/' {
            return None;
        }
    }
    None
}

fn parse_ssh(s: &str) -> anyhow::Result<Option<SshEndpoint>> {
    let Some((left, path)) = ssh_split(s) else {
        return Ok(None);
    };
    let (user, host) = match left.rfind('@') {
        Some(i) => (Some(&left[..i]), &left[i + 1..]),
        None => (None, left),
    };
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    anyhow::ensure!(!host.is_empty(), "{s}: missing host before ':'");
    // A leading '-' would reach ssh as an option (-oProxyCommand=...).
    anyhow::ensure!(
        !host.starts_with('-') && !user.is_some_and(|u| u.is_empty() || u.starts_with('-')),
        "{s}: invalid user or host"
    );
    anyhow::ensure!(
        !host.contains(|c: char| c.is_whitespace() || c == '@' || c == '/'),
        "{s}: invalid host"
    );
    Ok(Some(SshEndpoint {
        user: user.map(str::to_string),
        host: host.to_string(),
        path: path.to_string(),
    }))
}

pub fn parse_endpoint(s: &str) -> anyhow::Result<Endpoint> {
    if let Some(rest) = s.strip_prefix("ramsys://") {
        let (hostport, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        anyhow::ensure!(!hostport.is_empty(), "{s}: missing HOST:PORT");
        let addr = if hostport.starts_with('[')
            || hostport
                .rsplit_once(':')
                .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            hostport.to_string()
        } else {
            anyhow::bail!("{s}: missing port (ramsys://HOST:PORT/PATH)");
        };
        let path = path.trim_matches('/');
        for c in path.split('/') {
            anyhow::ensure!(c != "..", "{s}: '..' is not allowed in daemon paths");
        }
        let path: String = path
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect::<Vec<_>>()
            .join("/");
        Ok(Endpoint::Daemon {
            addr,
            path: path.into_bytes(),
        })
    } else if let Some(e) = parse_ssh(s)? {
        Ok(Endpoint::Ssh(e))
    } else {
        anyhow::ensure!(!s.is_empty(), "empty path");
        Ok(Endpoint::Local(s.into()))
    }
}

/// Root and destination for a local sink: DST's parent directory (as it
/// resolves) and DST's name in it. The sink reads DST from there (cp's or
/// rsync's rule, engine roles::sink::dest), so the root, and with it the resume
/// journal, is the same whether or not DST exists yet (issue 15).
pub fn local_sink(dst: &Path) -> anyhow::Result<(PathBuf, Vec<u8>)> {
    // As root: no symlink a user put on the way (issue 34, crate::harden).
    crate::harden::check_destination(dst)?;
    let full = match dst.canonicalize() {
        Ok(c) => c,
        Err(_) => {
            let parent = match dst.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            let c = parent.canonicalize().with_context(|| {
                format!("destination directory {} does not exist", parent.display())
            })?;
            anyhow::ensure!(
                c.is_dir(),
                "destination {}: not a directory",
                parent.display()
            );
            let name = dst
                .file_name()
                .filter(|n| *n != "." && *n != "..")
                .with_context(|| format!("invalid destination {}", dst.display()))?;
            c.join(name)
        }
    };
    match (full.parent(), full.file_name()) {
        (Some(p), Some(n)) => Ok((p.to_path_buf(), n.as_bytes().to_vec())),
        _ => Ok((full, Vec::new())),
    }
}

/// Whether a source argument names a directory's *contents* under rsync's
/// rule (`ramsys sync`): a trailing `/`, a last component `.`, or an ssh
/// path that is empty (the login directory, like `.`). Without it the
/// source lands as `DST/basename(SRC)`.
pub fn names_contents(arg: &str) -> bool {
    let path = if let Some(rest) = arg.strip_prefix("ramsys://") {
        match rest.find('/') {
            Some(i) => &rest[i..],
            None => return false,
        }
    } else if let Some((_, p)) = ssh_split(arg) {
        if p.is_empty() {
            return true;
        }
        p
    } else {
        arg
    };
    path.ends_with('/') || path == "." || path.ends_with("/.")
}

/// Whether a destination argument names a directory by its trailing `/`
/// (`out/newdir/`, `ramsys://H:P/dir/`, `host:dir/`): the sink then makes
/// a missing DST a directory in a sync, as rsync does, and a copy of one
/// file refuses it (issue 35; sync flag DEST_DIR).
pub fn names_dir(arg: &str) -> bool {
    arg.ends_with('/')
}

/// Every size flag: the workspace's one unit rule (ramsys_units: K, M, G
/// and KiB.. are powers of 1024, KB, MB, GB of 1000; issue 37).
pub fn parse_size(s: &str) -> Result<u64, String> {
    ramsys_units::parse_size(s).map_err(String::from)
}

/// Every block-size flag (--block-size, --max-block-size): blocks go
/// through O_DIRECT and the segment table in 4 KiB pages, so `4MB`
/// (4 000 000 under the one rule) is refused in one line suggesting `4MiB`
/// (clap prefixes the flag: "invalid value '4MB' for '--block-size ..'").
pub fn parse_block_size(s: &str) -> Result<u64, String> {
    ramsys_units::parse_aligned(s, 4096).map_err(String::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            parse_endpoint("ramsys://h:7/a/b/").unwrap(),
            Endpoint::Daemon {
                addr: "h:7".into(),
                path: b"a/b".to_vec()
            }
        );
        assert_eq!(
            parse_endpoint("ramsys://127.0.0.1:9").unwrap(),
            Endpoint::Daemon {
                addr: "127.0.0.1:9".into(),
                path: vec![]
            }
        );
        assert!(parse_endpoint("ramsys://h/a").is_err());
        assert!(parse_endpoint("ramsys://h:1/../x").is_err());
        // scp's rule: a colon before any '/' is remote.
        let ssh = |user: Option<&str>, host: &str, path: &str| {
            Endpoint::Ssh(SshEndpoint {
                user: user.map(Into::into),
                host: host.into(),
                path: path.into(),
            })
        };
        assert_eq!(parse_endpoint("x:y").unwrap(), ssh(None, "x", "y"));
        assert_eq!(
            parse_endpoint("bob@h.example:/a/b:c").unwrap(),
            ssh(Some("bob"), "h.example", "/a/b:c")
        );
        assert_eq!(parse_endpoint("h:").unwrap(), ssh(None, "h", ""));
        assert_eq!(
            parse_endpoint("[::1]:d/x").unwrap(),
            ssh(None, "::1", "d/x")
        );
        assert_eq!(
            parse_endpoint("u@[fe80::1]:/p").unwrap(),
            ssh(Some("u"), "fe80::1", "/p")
        );
        for local in ["./x:y", "/a:b", "a/b:c", ":x", "plain", "dir/"] {
            assert_eq!(
                parse_endpoint(local).unwrap(),
                Endpoint::Local(local.into()),
                "{local}"
            );
        }
        assert!(parse_endpoint("-oProxyCommand=x:y").is_err());
        assert!(parse_endpoint("@h:y").is_err());
        assert_eq!(
            match parse_endpoint("u@[::1]:p").unwrap() {
                Endpoint::Ssh(e) => e.display(),
                _ => unreachable!(),
            },
            "u@[::1]:p"
        );
    }

    #[test]
    fn contents_follow_rsyncs_trailing_slash() {
        for (arg, want) in [
            ("src", false),
            ("src/", true),
            ("a/b/.", true),
            (".", true),
            ("/", true),
            ("ramsys://h:1/x", false),
            ("ramsys://h:1/x/", true),
            ("ramsys://h:1/", true),
            ("ramsys://h:1", false),
            ("host:dir", false),
            ("host:dir/", true),
            ("host:", true),
            ("[::1]:/data/", true),
        ] {
            assert_eq!(names_contents(arg), want, "{arg}");
        }
    }

    #[test]
    fn a_trailing_slash_on_dst_names_a_directory() {
        for (arg, want) in [
            ("out/newdir/", true),
            ("out/newdir", false),
            ("ramsys://h:1/x/", true),
            ("ramsys://h:1/x", false),
            ("host:dir/", true),
            ("host:dir", false),
        ] {
            assert_eq!(names_dir(arg), want, "{arg}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4M"), Ok(4 << 20));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("100"), Ok(100));
        // MB is 10^6 here as in --bwlimit and the config (issue 37).
        assert_eq!(parse_size("512MB"), Ok(512_000_000));
        assert!(parse_size("4Q").is_err());
        assert_eq!(parse_block_size("4MiB"), Ok(4 << 20));
        assert_eq!(
            parse_block_size("4MB"),
            Err("4MB is 4000000 bytes, not a multiple of 4 KiB; use 4MiB".into())
        );
        assert!(parse_size("").is_err());
    }
}
