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
//! `max_rate`. The parser is [`file`]; the authority that opens the
//! table and checks keys is crate::daemon::credentials.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::storage::fsops::{Confinement, Root};

pub mod file;

pub use file::{load_users_file, parse_users_file};

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

impl UserSpec {
    /// Relative paths resolve against `base`, the file's directory.
    pub fn resolve(mut self, base: &Path) -> UserSpec {
        self.key_file = base.join(&self.key_file);
        self.root = base.join(&self.root);
        self
    }
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
