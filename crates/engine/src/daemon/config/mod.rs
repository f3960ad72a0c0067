//! `ramsys serve --config FILE`: what hardware detection cannot know (seed
//! 000 sec. 6.1.2, the user-assisted abstraction): the purpose of each
//! device, a capacity that beats the guess from its type, thread counts
//! per device, the I/O model file (`ramsys iomodel -o`), and the daemon's
//! NUMA mode, memory and stream limits. The daemon's placement from it
//! (which device and NIC it serves, how big its pools are and where they
//! live) is [`placement`] (issue 37: split from the file walking).
//!
//! ```toml
//! numa = "auto"              # off | auto | NODE
//! memory = "512M"            # buffer memory (bytes, or 512K/64M/2G)
//! max_streams = 32          # default DEFAULT_MAX_STREAMS (resources.rs)
//! readers = 4                # storage threads when no device entry says
//! writers = 4
//! model = "model.json"       # relative to this file's directory
//! send_path = "auto"         # inline | queued | auto (seed 002 sec. 7)
//! direct = "auto"            # O_DIRECT for large files: auto | always | never
//! max_rate = "200M"          # what the daemon sends, all sessions together
//!                            # (bytes/s or rsync units; data::rate; 0 = none)
//! max_connections = 1024     # connections held at once (server::limits)
//! max_connections_per_addr = 256   # ... from one source address
//! handshake_timeout = 10     # seconds to a connection's first message
//!
//! [devices.sda]
//! capacity_gbps = 4.0        # what the device really sustains
//! threads = 2                # reader and writer threads for it
//!
//! [devices.eth1]
//! purpose = "storage"        # data (default) | storage | ignore
//!
//! [users.alice]              # per-user key and export root (daemon::users)
//! key_file = "keys/alice"
//! root = "/srv/export/alice"
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ramsys_topo::NumaMode;
use serde::Deserialize;

pub mod placement;
pub mod replicate;

use crate::daemon::placement::Capacities;
use crate::daemon::toml::values;
use crate::types::sendpath::SendPath;

/// What a device is for. Detection sees a NIC but not whether it carries
/// replication traffic or the storage traffic of a SAN/NFS mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Purpose {
    /// Carries transfers (the default).
    Data,
    /// A NIC used for storage traffic: never a data channel.
    Storage,
    /// Not used by ramsys at all.
    Ignore,
}

/// One `[devices.NAME]` table.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeviceConfig {
    pub purpose: Option<Purpose>,
    #[serde(deserialize_with = "values::gbps")]
    pub capacity_gbps: Option<f64>,
    #[serde(deserialize_with = "values::positive")]
    pub threads: Option<usize>,
}

impl std::str::FromStr for SendPath {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "queued" => Ok(SendPath::Queued),
            "inline" => Ok(SendPath::Inline),
            "auto" => Ok(SendPath::Auto),
            _ => Err(format!("expected inline, queued or auto, got {s:?}")),
        }
    }
}

/// The parsed config file. Every field is optional: absent means "use the
/// command line or the detected default".
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DaemonConfig {
    pub numa: Option<NumaMode>,
    pub memory: Option<u64>,
    pub max_streams: Option<usize>,
    pub readers: Option<usize>,
    pub writers: Option<usize>,
    pub model: Option<PathBuf>,
    pub send_path: Option<SendPath>,
    /// `direct`: the O_DIRECT policy (storage::cache), under `--direct`.
    pub direct: Option<crate::storage::cache::DirectMode>,
    /// `max_rate`: bytes per second the daemon sends in all sessions
    /// together (data::rate); reloaded on SIGHUP.
    pub max_rate: Option<u64>,
    /// `max_connections`, `max_connections_per_addr`, `handshake_timeout`
    /// (seconds): the connection limits (server::limits, issue 34).
    pub max_connections: Option<usize>,
    pub max_connections_per_addr: Option<usize>,
    pub handshake_timeout: Option<u64>,
    pub devices: BTreeMap<String, DeviceConfig>,
    /// `[users.NAME]` tables (crate::daemon::users): per-user keys and
    /// export roots.
    pub users: Vec<crate::daemon::users::UserSpec>,
    /// `[site]` (crate::daemon::site, docs/SITE.md): `peers = ["ADDR", ...]`,
    /// `interval_ms` (1-1024), `user` (the name this daemon
    /// authenticates as at its peers).
    pub site_peers: Vec<String>,
    pub site_interval_ms: Option<u64>,
    pub site_user: Option<String>,
    /// `[site] max_sessions`, `max_load` (percent): the admission limit
    /// above which new sessions are redirected to a peer (site::redirect).
    pub site_limits: crate::daemon::site::redirect::Limits,
    /// `[site] share_storage` (default true): share the storage-thread
    /// budget of devices other members use too (site::share).
    pub site_share_storage: Option<bool>,
    /// `[site] max_members`: members that joined by dialling in, at most
    /// (site::membership; configured peers aside).
    pub site_max_members: Option<usize>,
    /// `[raw] ifaces = ["IFACE", ...]`: interfaces offering raw-Ethernet
    /// channels (transport::rawlink, docs/TYCHE.md), as `--raw-iface`.
    pub raw_ifaces: Vec<String>,
    /// `[[replicate]]`: continuous replication jobs (config::replicate,
    /// issue 38).
    pub replicate: Vec<replicate::ReplicateSpec>,
}

/// The file as written: serde refuses unknown keys at every level and
/// checks each value (toml::values); [`DaemonConfig::parse`] resolves paths.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct File {
    #[serde(deserialize_with = "values::parsed")]
    numa: Option<NumaMode>,
    #[serde(deserialize_with = "values::size")]
    memory: Option<u64>,
    #[serde(deserialize_with = "values::positive")]
    max_streams: Option<usize>,
    #[serde(deserialize_with = "values::positive")]
    readers: Option<usize>,
    #[serde(deserialize_with = "values::positive")]
    writers: Option<usize>,
    model: Option<PathBuf>,
    #[serde(deserialize_with = "values::parsed")]
    send_path: Option<SendPath>,
    #[serde(deserialize_with = "values::parsed")]
    direct: Option<crate::storage::cache::DirectMode>,
    #[serde(deserialize_with = "values::rate")]
    max_rate: Option<u64>,
    #[serde(deserialize_with = "values::positive")]
    max_connections: Option<usize>,
    #[serde(deserialize_with = "values::positive")]
    max_connections_per_addr: Option<usize>,
    #[serde(deserialize_with = "values::positive")]
    handshake_timeout: Option<u64>,
    devices: BTreeMap<String, DeviceConfig>,
    #[serde(deserialize_with = "crate::daemon::users::file::section")]
    users: Vec<crate::daemon::users::UserSpec>,
    site: Site,
    raw: Raw,
    replicate: Vec<replicate::ReplicateSpec>,
}

/// `[site]`.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Site {
    peers: Vec<String>,
    #[serde(deserialize_with = "values::interval_ms")]
    interval_ms: Option<u64>,
    user: Option<String>,
    #[serde(deserialize_with = "values::positive_u32")]
    max_sessions: Option<u32>,
    #[serde(deserialize_with = "values::load_pct")]
    max_load: Option<f64>,
    share_storage: Option<bool>,
    #[serde(deserialize_with = "values::positive")]
    max_members: Option<usize>,
}

/// `[raw]`: interfaces offering raw-Ethernet channels.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Raw {
    ifaces: Vec<String>,
}

impl DaemonConfig {
    /// Parse config text. Relative paths (the model file, users' key files
    /// and roots, jobs' key files and journals) resolve against `base`
    /// (the config file's directory). Errors are one line naming the
    /// offending key.
    pub fn parse(text: &str, base: &Path) -> Result<DaemonConfig, String> {
        Self::parse_text(text, base).map_err(crate::daemon::toml::one_line)
    }

    fn parse_text(text: &str, base: &Path) -> Result<DaemonConfig, String> {
        let f: File = crate::daemon::toml::from_str(text)?;
        let replicate = replicate::resolve(f.replicate, base)?;
        Ok(DaemonConfig {
            numa: f.numa,
            memory: f.memory,
            max_streams: f.max_streams,
            readers: f.readers,
            writers: f.writers,
            model: f.model.map(|m| base.join(m)),
            send_path: f.send_path,
            direct: f.direct,
            max_rate: f.max_rate,
            max_connections: f.max_connections,
            max_connections_per_addr: f.max_connections_per_addr,
            handshake_timeout: f.handshake_timeout,
            devices: f.devices,
            users: f.users.into_iter().map(|u| u.resolve(base)).collect(),
            site_peers: f.site.peers,
            site_interval_ms: f.site.interval_ms,
            site_user: f.site.user,
            site_limits: crate::daemon::site::redirect::Limits {
                max_sessions: f.site.max_sessions,
                max_load: f.site.max_load,
            },
            site_share_storage: f.site.share_storage,
            site_max_members: f.site.max_members,
            raw_ifaces: f.raw.ifaces,
            replicate,
        })
    }

    /// Read and parse a config file; errors name the file and the key.
    pub fn load(path: &Path) -> anyhow::Result<DaemonConfig> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("config {}: {e}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        DaemonConfig::parse(&text, base)
            .map_err(|e| anyhow::anyhow!("config {}: {e}", path.display()))
    }

    /// Capacity overrides for the scheduler.
    pub fn capacities(&self) -> Capacities {
        self.devices
            .iter()
            .filter_map(|(n, d)| d.capacity_gbps.map(|c| (n.clone(), c)))
            .collect()
    }

    fn purpose(&self, name: &str) -> Purpose {
        self.devices
            .get(name)
            .and_then(|d| d.purpose)
            .unwrap_or(Purpose::Data)
    }

    fn threads(&self, name: &str) -> Option<usize> {
        self.devices.get(name).and_then(|d| d.threads)
    }
}

#[cfg(test)]
mod site_tests {
    use super::*;

    #[test]
    fn site_table() {
        let c = DaemonConfig::parse(
            "[site]\npeers = [\"10.0.0.2:4000\", \"10.0.0.3:4000\"]\ninterval_ms = 20\nuser = \"siteuser\"\n",
            Path::new("."),
        )
        .unwrap();
        assert_eq!(c.site_peers.len(), 2);
        assert_eq!(c.site_interval_ms, Some(20));
        assert_eq!(c.site_user.as_deref(), Some("siteuser"));
        let e = DaemonConfig::parse("[site]\ninterval_ms = 2000\n", Path::new(".")).unwrap_err();
        assert!(e.contains("1-1024"), "{e}");
        assert!(DaemonConfig::parse("[site]\nbogus = 1\n", Path::new(".")).is_err());
        let c = DaemonConfig::parse("[site]\nmax_sessions = 4\nmax_load = 90\n", Path::new("."))
            .unwrap();
        assert_eq!(c.site_limits.max_sessions, Some(4));
        assert_eq!(c.site_limits.max_load, Some(0.9));
        let c = DaemonConfig::parse("[site]\nshare_storage = false\n", Path::new(".")).unwrap();
        assert_eq!(c.site_share_storage, Some(false));
        let e = DaemonConfig::parse("[site]\nshare_storage = 1\n", Path::new(".")).unwrap_err();
        assert!(e.contains("share_storage"), "{e}");
        let e = DaemonConfig::parse("[site]\nmax_load = 150\n", Path::new(".")).unwrap_err();
        assert!(e.contains("1-100"), "{e}");
    }
}

#[cfg(test)]
mod raw_tests {
    use super::*;

    #[test]
    fn raw_table() {
        let c =
            DaemonConfig::parse("[raw]\nifaces = [\"eth2\", \"eth3\"]\n", Path::new(".")).unwrap();
        assert_eq!(c.raw_ifaces, ["eth2", "eth3"]);
        let e = DaemonConfig::parse("[raw]\nifaces = \"eth2\"\n", Path::new(".")).unwrap_err();
        assert!(e.contains("raw.ifaces"), "{e}");
        assert!(DaemonConfig::parse("[raw]\nmtu = 9000\n", Path::new(".")).is_err());
    }
}

#[cfg(test)]
mod limit_tests {
    use super::*;

    #[test]
    fn connection_limits() {
        let c = DaemonConfig::parse(
            "max_connections = 300\nmax_connections_per_addr = 20\nhandshake_timeout = 3\n",
            Path::new("."),
        )
        .unwrap();
        assert_eq!(c.max_connections, Some(300));
        assert_eq!(c.max_connections_per_addr, Some(20));
        assert_eq!(c.handshake_timeout, Some(3));
        let e = DaemonConfig::parse("max_connections = 0\n", Path::new(".")).unwrap_err();
        assert!(e.contains("max_connections"), "{e}");
    }
}
