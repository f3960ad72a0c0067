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

use serde::Deserialize;

use crate::daemon::toml::values;

/// One `[[replicate]]` table.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(try_from = "Table")]
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
    /// Relative to the config file's directory once [`resolve`]d.
    pub key_file: Option<PathBuf>,
    pub journal: Option<PathBuf>,
}

#[derive(Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Backend {
    #[default]
    Auto,
    Fanotify,
    Inotify,
}

/// The table as written.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Table {
    name: Option<String>,
    source: Option<String>,
    dest: Option<String>,
    delete: bool,
    archive: bool,
    exclude: Vec<String>,
    include: Vec<String>,
    #[serde(deserialize_with = "values::count")]
    quiet_ms: Option<u64>,
    #[serde(deserialize_with = "values::count")]
    batch_ms: Option<u64>,
    #[serde(deserialize_with = "values::count")]
    rescan_s: Option<u64>,
    backend: Backend,
    key_file: Option<PathBuf>,
    journal: Option<PathBuf>,
}

impl TryFrom<Table> for ReplicateSpec {
    type Error = String;
    fn try_from(t: Table) -> Result<ReplicateSpec, String> {
        let [name, source, dest] = [("name", t.name), ("source", t.source), ("dest", t.dest)]
            .map(|(k, v)| v.filter(|v| !v.is_empty()).ok_or(k));
        let (name, source, dest) = match (name, source, dest) {
            (Ok(n), Ok(s), Ok(d)) => (n, s, d),
            (Err(k), _, _) | (_, Err(k), _) | (_, _, Err(k)) => {
                return Err(format!("[[replicate]] without `{k}`"))
            }
        };
        if !Path::new(&source).is_absolute() {
            return Err(format!(
                "replicate {name:?}: source must be an absolute path"
            ));
        }
        let excl = t.exclude.into_iter().map(|p| (false, p.into_bytes()));
        let incl = t.include.into_iter().map(|p| (true, p.into_bytes()));
        Ok(ReplicateSpec {
            name,
            source,
            dest,
            delete: t.delete,
            archive: t.archive,
            rules: excl.chain(incl).collect(),
            quiet_ms: t.quiet_ms.unwrap_or(2000),
            batch_ms: t.batch_ms.unwrap_or(20),
            rescan_s: t.rescan_s.unwrap_or(3600),
            backend: match t.backend {
                Backend::Auto => "auto",
                Backend::Fanotify => "fanotify",
                Backend::Inotify => "inotify",
            }
            .into(),
            key_file: t.key_file,
            journal: t.journal,
        })
    }
}

/// The jobs as parsed: names unique, paths resolved against `base`.
pub fn resolve(jobs: Vec<ReplicateSpec>, base: &Path) -> Result<Vec<ReplicateSpec>, String> {
    let mut out: Vec<ReplicateSpec> = Vec::new();
    for mut s in jobs {
        if out.iter().any(|o| o.name == s.name) {
            return Err(format!("two [[replicate]] jobs named {:?}", s.name));
        }
        s.key_file = s.key_file.map(|p| base.join(p));
        s.journal = s.journal.map(|p| base.join(p));
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
