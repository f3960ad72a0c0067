//! `[[replicate]]` tables of the daemon config (issue 38, docs/WATCH.md):
//! continuous replication jobs the daemon starts, reports (`ramsys status
//! --jobs`, `/metrics`) and resumes from their journals after a restart.
//!
//! ```toml
//! [[replicate]]
//! name = "mirror"                       # unique; labels status and metrics
//! source = "/data/in/"                  # a directory here; trailing '/' = its contents
//! dest = "ramsys://dtn2:7070/mirror"    # a daemon, or a local directory
//! delete = true                         # sync --delete: renames and deletes travel too
//! archive = false                       # sync -a
//! exclude = ["*.tmp"]                   # rsync rules, in order, before `include`
//! include = []
//! quiet_ms = 2000                       # --watch-quiet
//! batch_ms = 20                         # --watch-batch
//! rescan_s = 3600                       # --watch-rescan (0: start and overflows only)
//! backend = "auto"                      # auto | fanotify | inotify
//! key_file = "/etc/ramsys/dtn2.key"     # for dest's daemon (default: this daemon's key)
//! journal = "/var/lib/ramsys/mirror.sqlite"  # default: under the state directory
//! ```

use std::path::{Path, PathBuf};

use crate::daemon::toml::string;

/// One `[[replicate]]` table.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicateSpec {
    pub name: String,
    /// As written (a trailing '/' means the contents).
    pub source: String,
    pub dest: String,
    pub delete: bool,
    pub archive: bool,
    /// rsync rules: (include, pattern), excludes first.
    pub rules: Vec<(bool, Vec<u8>)>,
    pub quiet_ms: u64,
    pub batch_ms: u64,
    pub rescan_s: u64,
    pub backend: String,
    pub key_file: Option<PathBuf>,
    pub journal: Option<PathBuf>,
}

fn boolean(k: &str, v: &::toml::Value) -> Result<bool, String> {
    v.as_bool()
        .ok_or_else(|| format!("key `replicate.{k}`: expected true or false, got {v}"))
}

fn number(k: &str, v: &::toml::Value) -> Result<u64, String> {
    v.as_integer()
        .filter(|n| *n >= 0)
        .map(|n| n as u64)
        .ok_or_else(|| format!("key `replicate.{k}`: expected a number of 0 or more, got {v}"))
}

fn patterns(k: &str, v: &::toml::Value, include: bool) -> Result<Vec<(bool, Vec<u8>)>, String> {
    let a = v
        .as_array()
        .ok_or_else(|| format!("key `replicate.{k}`: expected a list of patterns, got {v}"))?;
    a.iter()
        .map(|p| {
            Ok((
                include,
                string(&format!("replicate.{k}"), p)?.as_bytes().to_vec(),
            ))
        })
        .collect()
}

fn one(t: &::toml::Table, base: &Path) -> Result<ReplicateSpec, String> {
    let mut s = ReplicateSpec {
        name: String::new(),
        source: String::new(),
        dest: String::new(),
        delete: false,
        archive: false,
        rules: Vec::new(),
        quiet_ms: 2000,
        batch_ms: 20,
        rescan_s: 3600,
        backend: "auto".into(),
        key_file: None,
        journal: None,
    };
    let (mut excl, mut incl) = (Vec::new(), Vec::new());
    for (k, v) in t {
        let text = || string(&format!("replicate.{k}"), v).map(str::to_string);
        match k.as_str() {
            "name" => s.name = text()?,
            "source" => s.source = text()?,
            "dest" => s.dest = text()?,
            "delete" => s.delete = boolean(k, v)?,
            "archive" => s.archive = boolean(k, v)?,
            "exclude" => excl = patterns(k, v, false)?,
            "include" => incl = patterns(k, v, true)?,
            "quiet_ms" => s.quiet_ms = number(k, v)?,
            "batch_ms" => s.batch_ms = number(k, v)?,
            "rescan_s" => s.rescan_s = number(k, v)?,
            "backend" => {
                s.backend = text()?;
                if !["auto", "fanotify", "inotify"].contains(&s.backend.as_str()) {
                    return Err(format!(
                        "key `replicate.backend`: expected auto, fanotify or inotify, got {v}"
                    ));
                }
            }
            "key_file" => s.key_file = Some(base.join(text()?)),
            "journal" => s.journal = Some(base.join(text()?)),
            _ => {
                return Err(format!(
                    "unknown key `replicate.{k}` (expected name, source, dest, delete, archive, \
                     exclude, include, quiet_ms, batch_ms, rescan_s, backend, key_file, journal)"
                ))
            }
        }
    }
    for (k, empty) in [
        ("name", s.name.is_empty()),
        ("source", s.source.is_empty()),
        ("dest", s.dest.is_empty()),
    ] {
        if empty {
            return Err(format!("[[replicate]] without `{k}`"));
        }
    }
    if !Path::new(&s.source).is_absolute() {
        return Err(format!(
            "replicate {:?}: source must be an absolute path",
            s.name
        ));
    }
    s.rules = excl.into_iter().chain(incl).collect();
    Ok(s)
}

/// The `replicate` key: an array of tables, names unique.
pub fn parse(v: &::toml::Value, base: &Path) -> Result<Vec<ReplicateSpec>, String> {
    let a = v
        .as_array()
        .ok_or_else(|| format!("key `replicate`: expected [[replicate]] tables, got {v}"))?;
    let mut out: Vec<ReplicateSpec> = Vec::new();
    for t in a {
        let t = t
            .as_table()
            .ok_or_else(|| format!("key `replicate`: expected a table, got {t}"))?;
        let s = one(t, base)?;
        if out.iter().any(|o| o.name == s.name) {
            return Err(format!("two [[replicate]] jobs named {:?}", s.name));
        }
        out.push(s);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::config::DaemonConfig;

    #[test]
    fn parses_jobs_and_refuses_mistakes_in_one_line() {
        let text = r#"
            [[replicate]]
            name = "m"
            source = "/data/in/"
            dest = "ramsys://b:7070/mirror"
            delete = true
            exclude = ["*.tmp"]
            include = ["keep.tmp"]
            key_file = "k"
        "#;
        let c = DaemonConfig::parse(text, Path::new("/etc/ramsys")).unwrap();
        let j = &c.replicate[0];
        assert_eq!((j.name.as_str(), j.delete, j.quiet_ms), ("m", true, 2000));
        assert_eq!(
            j.rules,
            vec![(false, b"*.tmp".to_vec()), (true, b"keep.tmp".to_vec())]
        );
        assert_eq!(j.key_file.as_deref(), Some(Path::new("/etc/ramsys/k")));
        for (bad, why) in [
            ("[[replicate]]\nname = \"m\"\ndest = \"/x\"", "without `source`"),
            ("[[replicate]]\nname=\"m\"\nsource=\"rel\"\ndest=\"/x\"", "absolute"),
            ("[[replicate]]\nname=\"m\"\nsource=\"/a\"\ndest=\"/x\"\nwat=1", "unknown key `replicate.wat`"),
            ("[[replicate]]\nname=\"m\"\nsource=\"/a\"\ndest=\"/x\"\nbackend=\"kq\"", "backend"),
            ("[[replicate]]\nname=\"m\"\nsource=\"/a\"\ndest=\"/x\"\n[[replicate]]\nname=\"m\"\nsource=\"/b\"\ndest=\"/y\"", "two"),
        ] {
            let e = DaemonConfig::parse(bad, Path::new("/")).unwrap_err();
            assert!(e.contains(why) && !e.contains('\n'), "{e}");
        }
    }
}
