//! The shared key that authenticates every connection.
//!
//! Default location: `$RAMSYS_KEY_FILE`, else `$XDG_CONFIG_HOME/ramsys/key`,
//! else `~/.config/ramsys/key`. Created on first use with 32 random bytes
//! (hex) and mode 0600; a key file others can read is refused, as ssh
//! refuses such private keys.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// Where the per-user key lives when no --key-file is given.
pub fn default_key_path() -> PathBuf {
    if let Some(p) = std::env::var_os("RAMSYS_KEY_FILE") {
        return PathBuf::from(p);
    }
    config_dir().join("key")
}

fn config_dir() -> PathBuf {
    std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .unwrap_or_else(|| PathBuf::from("/tmp"))
        .join("ramsys")
}

/// Where a running `ramsys serve --addr-file` records its address, for
/// local tools (`ramsys token`): `$XDG_RUNTIME_DIR/ramsys/daemon.addr`,
/// else `~/.config/ramsys/daemon.addr`.
pub fn default_addr_path() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("ramsys").join("daemon.addr");
    }
    config_dir().join("daemon.addr")
}

/// Read an existing key file (never created): refused if others can read
/// it or if it holds fewer than 16 bytes.
pub fn load_existing(path: &Path) -> anyhow::Result<Vec<u8>> {
    let md =
        fs::metadata(path).with_context(|| format!("cannot read key file {}", path.display()))?;
    if md.permissions().mode() & 0o077 != 0 {
        bail!(
            "key file {} is accessible by other users (mode {:o}); run: chmod 600 {}",
            path.display(),
            md.permissions().mode() & 0o777,
            path.display()
        );
    }
    let raw = fs::read(path).with_context(|| format!("cannot read key file {}", path.display()))?;
    let key: Vec<u8> = raw.trim_ascii().to_vec();
    if key.len() < 16 {
        bail!("key file {} holds fewer than 16 bytes", path.display());
    }
    Ok(key)
}

/// Read the key at `path`, creating it if it does not exist.
pub fn load_or_create(path: &Path) -> anyhow::Result<Vec<u8>> {
    match fs::metadata(path) {
        Ok(_) => load_existing(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent() {
                fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
            }
            let mut raw = [0u8; 32];
            getrandom::getrandom(&mut raw)
                .map_err(|e| anyhow::anyhow!("no randomness for a new key: {e}"))?;
            let text = hex::encode(raw);
            match fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
            {
                Ok(mut f) => {
                    f.write_all(text.as_bytes())?;
                    f.write_all(b"\n")?;
                    f.sync_all()?;
                    tracing::info!("created new key file {}", path.display());
                    Ok(text.into_bytes())
                }
                // Someone else created it first: use theirs.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => load_or_create(path),
                Err(e) => {
                    Err(e).with_context(|| format!("cannot create key file {}", path.display()))
                }
            }
        }
        Err(e) => Err(e).with_context(|| format!("cannot read key file {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_with_0600_and_stable() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sub/key");
        let k1 = load_or_create(&p).unwrap();
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(k1.len(), 64);
        assert_eq!(load_or_create(&p).unwrap(), k1);
    }

    #[test]
    fn world_readable_key_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("key");
        fs::write(&p, "0123456789abcdef0123").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        let e = load_or_create(&p).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
    }
}
