//! The users file (`serve --users FILE`: `[[user]]` entries or
//! `[users.NAME]` tables) and the config's `[users]` section, read through
//! serde with unknown keys refused (issue 37). The credential authority
//! that opens the table is crate::daemon::credentials.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

use super::{check_unique, UserSpec, TOKEN_PREFIX};
use crate::daemon::toml::values;

/// A `[[user]]` entry.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    #[serde(deserialize_with = "name")]
    name: String,
    key_file: PathBuf,
    root: PathBuf,
    #[serde(default, deserialize_with = "values::positive")]
    max_sessions: Option<u32>,
    #[serde(default)]
    read_only: bool,
    #[serde(default, deserialize_with = "values::rate")]
    max_rate: Option<u64>,
}

/// A `[users.NAME]` table: an entry whose name is the table's.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Table {
    key_file: PathBuf,
    root: PathBuf,
    #[serde(default, deserialize_with = "values::positive")]
    max_sessions: Option<u32>,
    #[serde(default)]
    read_only: bool,
    #[serde(default, deserialize_with = "values::rate")]
    max_rate: Option<u64>,
}

impl From<Entry> for UserSpec {
    fn from(e: Entry) -> UserSpec {
        UserSpec {
            name: e.name,
            key_file: e.key_file,
            root: e.root,
            max_sessions: e.max_sessions,
            read_only: e.read_only,
            // 0 = no limit.
            max_rate: e.max_rate.filter(|&r| r > 0),
        }
    }
}

/// The file as written.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct File {
    #[serde(deserialize_with = "entries")]
    user: Vec<UserSpec>,
    #[serde(deserialize_with = "section")]
    users: Vec<UserSpec>,
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

fn name<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let n = String::deserialize(d)?;
    check_name(&n).map_err(serde::de::Error::custom)?;
    Ok(n)
}

/// `[[user]]` entries; anything else under `user` is refused as such.
fn entries<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<UserSpec>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Vec<UserSpec>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("[[user]] entries")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Vec<UserSpec>, A::Error> {
            let mut v = Vec::new();
            while let Some(e) = a.next_element::<Entry>()? {
                v.push(e.into());
            }
            Ok(v)
        }
    }
    d.deserialize_seq(V)
}

/// A `[users]` section (users file or `serve --config`): one table per
/// user, keyed by name; paths not yet resolved.
pub(crate) fn section<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<UserSpec>, D::Error> {
    BTreeMap::<String, Table>::deserialize(d)?
        .into_iter()
        .map(|(name, t)| {
            check_name(&name)
                .map_err(|e| serde::de::Error::custom(format!("[users.{name}]: {e}")))?;
            Ok(Entry {
                name,
                key_file: t.key_file,
                root: t.root,
                max_sessions: t.max_sessions,
                read_only: t.read_only,
                max_rate: t.max_rate,
            }
            .into())
        })
        .collect()
}

/// Parse a users file: `[[user]]` entries (or `[users.NAME]` tables).
/// Relative paths resolve against `base`; errors are one line.
pub fn parse_users_file(text: &str, base: &Path) -> Result<Vec<UserSpec>, String> {
    let f: File = crate::daemon::toml::from_str(text).map_err(crate::daemon::toml::one_line)?;
    let out: Vec<UserSpec> = f
        .user
        .into_iter()
        .chain(f.users)
        .map(|u| u.resolve(base))
        .collect();
    check_unique(&out).map_err(crate::daemon::toml::one_line)?;
    Ok(out)
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
        let c = parse_users_file("[users.carol]\nkey_file = \"c\"\nroot = \"/r\"\n", base).unwrap();
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
                "unknown key `user.key`",
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
