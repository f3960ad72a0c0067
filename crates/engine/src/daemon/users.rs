//! Who may authenticate to a daemon and what each one gets (issue 9: "a
//! long-running daemon serving several users maps each authenticated user
//! to an export root").
//!
//! - Without a users table (the default) every connection proves the one
//!   shared key, under any user name, and lands in the daemon's `--root`.
//! - With one (`serve --users FILE`, or `[users]` in `serve --config`) the
//!   Hello's user name selects that user's key; the session runs beneath
//!   that user's export root, opened once at start and held. A name not in
//!   the table is answered exactly like a wrong key (a Challenge under a
//!   decoy key derived from a per-daemon secret, then "authentication
//!   failed"), so names cannot be probed.
//! - One-time credentials: an authenticated user asks for a token
//!   (Control::TokenRequest); the daemon mints `otp-<32 hex>` with a random
//!   key, bound to the minter's root and limits, usable for ONE session
//!   started within its lifetime. It is consumed when that session's Auth
//!   succeeds, so a replay fails (docs/SECURITY.md).
//!
//! Users file (TOML; relative paths resolve against the file's directory):
//!
//! ```toml
//! [[user]]
//! name = "alice"
//! key_file = "keys/alice"   # like any key file: mode 0600, >= 16 bytes
//! root = "/srv/export/alice"
//! max_sessions = 4          # optional: sessions at once (default: no limit)
//! read_only = false         # optional: true = may only read (daemon is source)
//! max_rate = "50M"          # optional: what the daemon sends this user, all
//!                           # sessions together (bytes/s or rsync units; data::rate)
//! ```
//!
//! In `serve --config` the same entries are tables under `[users]`:
//! `[users.alice]` with `key_file`, `root`, `max_sessions`, `read_only`,
//! `max_rate`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::storage::fsops::{Confinement, Root};

/// Prefix of minted credential names; no configured user may use it.
pub const TOKEN_PREFIX: &str = "otp-";
/// A token's lifetime when the request leaves it to the daemon.
pub const DEFAULT_TOKEN_TTL_S: u32 = 60;
/// Longest lifetime a token may ask for.
pub const MAX_TOKEN_TTL_S: u32 = 3600;

/// An export root, opened once: the sink side resolves strictly (no
/// symlinks), the source side may read through links that stay inside.
pub struct ExportRoot {
    /// Canonical path.
    pub path: PathBuf,
    pub sink: Arc<Root>,
    pub source: Arc<Root>,
}

impl ExportRoot {
    pub fn open(root: &Path) -> anyhow::Result<ExportRoot> {
        let path = root
            .canonicalize()
            .map_err(|e| anyhow::anyhow!("root {}: {e}", root.display()))?;
        anyhow::ensure!(path.is_dir(), "root {} is not a directory", path.display());
        Ok(ExportRoot {
            sink: Arc::new(Root::open(&path, Confinement::Strict)?),
            source: Arc::new(Root::open(&path, Confinement::Beneath)?),
            path,
        })
    }
}

/// One configured user, as parsed (paths not yet opened).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserSpec {
    pub name: String,
    pub key_file: PathBuf,
    pub root: PathBuf,
    pub max_sessions: Option<u32>,
    pub read_only: bool,
    /// Bytes per second the daemon sends this user, all sessions together.
    pub max_rate: Option<u64>,
}

/// A rate key: bytes per second as an integer, or a string in rsync's
/// units ("20M"; data::rate::parse_rate).
pub fn parse_rate_value(what: &str, v: &toml::Value) -> Result<u64, String> {
    match v {
        toml::Value::Integer(n) if *n >= 0 => {
            crate::data::rate::check_rate(*n as u64).map_err(|e| format!("{what}: {e}"))
        }
        toml::Value::String(s) => {
            crate::data::rate::parse_rate(s).map_err(|e| format!("{what}: {e}"))
        }
        _ => Err(format!(
            "{what}: expected bytes per second or a rate like \"20M\", got {v}"
        )),
    }
}

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 256 {
        return Err(format!("user name {name:?}: must be 1 to 256 bytes"));
    }
    if name.starts_with(TOKEN_PREFIX) {
        return Err(format!(
            "user name {name:?}: names starting with {TOKEN_PREFIX:?} are reserved for one-time credentials"
        ));
    }
    if name.chars().any(|c| c.is_control()) {
        return Err(format!("user name {name:?}: control characters"));
    }
    Ok(())
}

/// Parse one user's table (`[[user]]` entry or `[users.NAME]`); `name` is
/// given for the latter. Relative paths resolve against `base`.
pub fn parse_user(
    what: &str,
    name: Option<&str>,
    v: &toml::Value,
    base: &Path,
) -> Result<UserSpec, String> {
    let t = v
        .as_table()
        .ok_or_else(|| format!("{what}: expected a table, got {v}"))?;
    let mut name = name.map(str::to_string);
    let (mut key_file, mut root, mut max_sessions, mut read_only) = (None, None, None, false);
    let mut max_rate = None;
    let s = |k: &str, v: &toml::Value| -> Result<String, String> {
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("{what}: key `{k}`: expected a string, got {v}"))
    };
    for (k, v) in t {
        match k.as_str() {
            "name" if name.is_none() => name = Some(s(k, v)?),
            "key_file" => key_file = Some(base.join(s(k, v)?)),
            "root" => root = Some(base.join(s(k, v)?)),
            "max_sessions" => match v.as_integer() {
                Some(n) if n > 0 && n <= u32::MAX as i64 => max_sessions = Some(n as u32),
                _ => {
                    return Err(format!(
                        "{what}: key `max_sessions`: expected a positive integer, got {v}"
                    ))
                }
            },
            "read_only" => {
                read_only = v.as_bool().ok_or_else(|| {
                    format!("{what}: key `read_only`: expected true or false, got {v}")
                })?
            }
            "max_rate" => {
                max_rate = Some(parse_rate_value(&format!("{what}: key `max_rate`"), v)?)
                    .filter(|&r| r > 0)
            }
            _ => {
                return Err(format!(
                    "{what}: unknown key `{k}` (expected name, key_file, root, max_sessions, read_only or max_rate)"
                ))
            }
        }
    }
    let name = name.ok_or_else(|| format!("{what}: missing `name`"))?;
    check_name(&name).map_err(|e| format!("{what}: {e}"))?;
    Ok(UserSpec {
        key_file: key_file.ok_or_else(|| format!("{what} ({name}): missing `key_file`"))?,
        root: root.ok_or_else(|| format!("{what} ({name}): missing `root`"))?,
        name,
        max_sessions,
        read_only,
        max_rate,
    })
}

/// Parse a users file: `[[user]]` entries (or `[users.NAME]` tables).
pub fn parse_users_file(text: &str, base: &Path) -> Result<Vec<UserSpec>, String> {
    users_file(text, base).map_err(crate::daemon::toml::one_line)
}

fn users_file(text: &str, base: &Path) -> Result<Vec<UserSpec>, String> {
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| crate::daemon::toml::toml_error(text, &e))?;
    let mut out = Vec::new();
    for (k, v) in &table {
        match k.as_str() {
            "user" => {
                let a = v
                    .as_array()
                    .ok_or_else(|| format!("`user`: expected [[user]] entries, got {v}"))?;
                for (i, u) in a.iter().enumerate() {
                    out.push(parse_user(&format!("[[user]] #{}", i + 1), None, u, base)?);
                }
            }
            "users" => out.extend(parse_users_section(v, base)?),
            _ => return Err(format!("unknown key `{k}` (expected [[user]] entries)")),
        }
    }
    check_unique(&out)?;
    Ok(out)
}

/// A `[users]` section: one table per user, keyed by name.
pub fn parse_users_section(v: &toml::Value, base: &Path) -> Result<Vec<UserSpec>, String> {
    let t = v
        .as_table()
        .ok_or_else(|| format!("key `users`: expected a table, got {v}"))?;
    t.iter()
        .map(|(n, u)| parse_user(&format!("[users.{n}]"), Some(n), u, base))
        .collect()
}

pub(crate) fn check_unique(users: &[UserSpec]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for u in users {
        if !seen.insert(&u.name) {
            return Err(format!("user {:?} is defined twice", u.name));
        }
    }
    Ok(())
}

/// Read and parse a users file; errors name the file.
pub fn load_users_file(path: &Path) -> anyhow::Result<Vec<UserSpec>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("users file {}: {e}", path.display()))?;
    let base = path.parent().unwrap_or(Path::new("."));
    parse_users_file(&text, base).map_err(|e| anyhow::anyhow!("users file {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_users_file_and_config_section() {
        let base = Path::new("/etc/ramsys");
        let u = parse_users_file(
            "[[user]]\nname = \"alice\"\nkey_file = \"k/alice\"\nroot = \"/srv/a\"\n\
             max_sessions = 2\nmax_rate = \"20M\"\n\n[[user]]\nname = \"bob\"\nkey_file = \"/k/bob\"\n\
             root = \"b\"\nread_only = true\nmax_rate = 4096\n",
            base,
        )
        .unwrap();
        assert_eq!(
            u,
            vec![
                UserSpec {
                    name: "alice".into(),
                    key_file: "/etc/ramsys/k/alice".into(),
                    root: "/srv/a".into(),
                    max_sessions: Some(2),
                    read_only: false,
                    max_rate: Some(20 << 20),
                },
                UserSpec {
                    name: "bob".into(),
                    key_file: "/k/bob".into(),
                    root: "/etc/ramsys/b".into(),
                    max_sessions: None,
                    read_only: true,
                    max_rate: Some(4096),
                },
            ]
        );
        let t: toml::Table = "[users.carol]\nkey_file = \"c\"\nroot = \"/r\"\n"
            .parse()
            .unwrap();
        let c = parse_users_section(&t["users"], base).unwrap();
        assert_eq!(c[0].name, "carol");
        assert_eq!(c[0].key_file, PathBuf::from("/etc/ramsys/c"));
    }

    #[test]
    fn bad_users_files_say_what_is_wrong() {
        let b = Path::new("/");
        let cases = [
            (
                "[[user]]\nname = \"a\"\nroot = \"/r\"\n",
                "missing `key_file`",
            ),
            (
                "[[user]]\nname = \"a\"\nkey_file = \"k\"\n",
                "missing `root`",
            ),
            (
                "[[user]]\nkey_file = \"k\"\nroot = \"/r\"\n",
                "missing `name`",
            ),
            (
                "[[user]]\nname = \"a\"\nkey_file = \"k\"\nroot = \"/r\"\nkey = \"x\"\n",
                "unknown key `key`",
            ),
            (
                "[[user]]\nname = \"otp-1\"\nkey_file = \"k\"\nroot = \"/r\"\n",
                "reserved",
            ),
            (
                "[[user]]\nname = \"a\"\nkey_file = \"k\"\nroot = \"/r\"\nmax_sessions = 0\n",
                "max_sessions",
            ),
            (
                "[[user]]\nname = \"a\"\nkey_file = \"k\"\nroot = \"/r\"\n\
                 [[user]]\nname = \"a\"\nkey_file = \"k\"\nroot = \"/s\"\n",
                "defined twice",
            ),
            (
                "[[user]]\nname = \"a\"\nkey_file = \"k\"\nroot = \"/r\"\nmax_rate = \"fast\"\n",
                "max_rate",
            ),
            ("[[user]\nname = 1", "line 1"),
            ("user = 3", "expected [[user]] entries"),
            ("group = 3", "unknown key `group`"),
        ];
        for (text, want) in cases {
            let e = parse_users_file(text, b).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }
}
