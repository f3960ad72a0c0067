//! The watch channel (issue 38, docs/WATCH.md, docs/PROTOCOL.md "Watch
//! channel"): a replication job's renames, deletes and directory
//! attributes, applied at its destination before each batch's data, on one
//! control connection kept for the job's life (no handshake per batch).
//! A renamed 1 GiB file moves 0 bytes.
//!
//! The server side resolves every path beneath the user's export root as
//! the sink does (openat2, no symlink followed: crate::storage::fsops), and renames
//! or removes an entry only when it is of the kind the source named: a
//! later batch may already have put something else there, which must not
//! be moved or lost (the job then sends the rename's target as data).

use ramsys_proto::control::{WatchOp, WatchResult, WATCH_SESSIONS, WATCH_VERSION};
use ramsys_proto::path::validate_relative;
use ramsys_proto::Control;

use crate::request::reserved::{names_reserved, REFUSED};
use crate::roles::client::Remote;
use crate::session::{current_user, ClientSession, Connect};
use crate::storage::fsops::{split_parent, Root};
use crate::transport::wire::{recv_control, send_control};
use crate::transport::Link;
use crate::EngineError;

fn join(a: &[u8], b: &[u8]) -> Vec<u8> {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_vec(),
        (_, true) => a.to_vec(),
        _ => [a, b"/", b].concat(),
    }
}

fn is_dir(st: &crate::storage::fsops::Stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// The path under the root, checked like a metadata record's: relative,
/// no `..`, and no name ramsys reserves (crate::request::reserved: a peer renaming
/// over, out of or deleting the journal or a temp file is refused, as the
/// sink refuses such an entry). Empty (DST itself) only where `empty_ok`:
/// a job never renames or deletes its own DST.
fn target(dest: &[u8], rel: &[u8], empty_ok: bool) -> Result<Vec<u8>, String> {
    if !(rel.is_empty() && empty_ok) {
        validate_relative(rel).map_err(|e| e.to_string())?;
    }
    if names_reserved(rel) {
        return Err(format!("{:?}: {REFUSED}", crate::show(rel)));
    }
    Ok(join(dest, rel))
}

/// Make `rel`'s missing parent directories (a rename into a directory the
/// next batch's data brings): mode 0755 until its DirAttrs or data.
fn make_parents(root: &Root, rel: &[u8]) -> std::io::Result<()> {
    let (parent, _) = split_parent(rel);
    if parent.is_empty() || root.lstat(parent)?.is_some() {
        return Ok(());
    }
    make_parents(root, parent)?;
    root.mkdir(parent, 0o755)
}

fn rename(root: &Root, from: &[u8], to: &[u8]) -> std::io::Result<()> {
    make_parents(root, to)?;
    let (fp, fname) = split_parent(from);
    let (tp, tname) = split_parent(to);
    let (fd, td) = (root.open_dir(fp)?, root.open_dir(tp)?);
    let c = |b: &[u8]| {
        if b.contains(&0) {
            return Err(std::io::Error::other("NUL in path"));
        }
        Ok(())
    };
    c(fname)?;
    c(tname)?;
    if let Err(e) = rustix::fs::renameat(&fd, fname, &td, tname) {
        let e = std::io::Error::from(e);
        // A directory onto a non-empty one: what was there goes (the
        // source replaced it), then again.
        if matches!(e.raw_os_error(), Some(libc::ENOTEMPTY) | Some(libc::EEXIST)) {
            crate::roles::sink::delete::remove(root, to)?;
            return rename(root, from, to);
        }
        return Err(e);
    }
    Ok(())
}

/// Apply one operation under `dest`.
pub fn apply(root: &Root, dest: &[u8], op: &WatchOp) -> WatchResult {
    let r = match op {
        WatchOp::Rename { from, to, dir } => (|| {
            let (f, t) = (target(dest, from, false)?, target(dest, to, false)?);
            match root.lstat(&f).map_err(|e| e.to_string())? {
                Some(st) if is_dir(&st) == *dir => {
                    rename(root, &f, &t).map_err(|e| e.to_string())?;
                    Ok(WatchResult::Done)
                }
                _ => Ok(WatchResult::Missing),
            }
        })(),
        WatchOp::Delete { path, dir } => (|| {
            let p = target(dest, path, false)?;
            match root.lstat(&p).map_err(|e| e.to_string())? {
                Some(st) if is_dir(&st) == *dir => {
                    crate::roles::sink::delete::remove(root, &p).map_err(|e| e.to_string())?;
                    Ok(WatchResult::Done)
                }
                _ => Ok(WatchResult::Missing),
            }
        })(),
        WatchOp::DirAttrs {
            path,
            mode,
            mtime_s,
            mtime_ns,
        } => (|| {
            let p = target(dest, path, true)?;
            if *mode & !0o7777 != 0 || *mtime_ns >= 1_000_000_000 {
                return Err("mode or mtime out of range".to_string());
            }
            match root.lstat(&p).map_err(|e| e.to_string())? {
                Some(st) if is_dir(&st) => {
                    root.set_dir_attrs(&p, *mode, (*mtime_s, *mtime_ns))
                        .map_err(|e| e.to_string())?;
                    Ok(WatchResult::Done)
                }
                _ => Ok(WatchResult::Missing),
            }
        })(),
    };
    r.unwrap_or_else(WatchResult::Failed)
}

/// Most operations in one WatchOps: a control frame holds 1 MiB, a path at
/// most 4 KiB (two per rename).
pub const MAX_OPS: usize = 100;

/// What serves a batch's session on a watch channel (server::kept): the
/// link and the batch number, checked to follow the last one.
pub(crate) type BatchSession<'a> =
    dyn FnMut(&mut Box<dyn Link>, u64) -> Result<(), EngineError> + 'a;

/// Serve a watch channel opened with WatchOpen (server.rs dispatches it):
/// answer WatchReady, then apply WatchOps, and from WATCH_SESSIONS on run
/// each WatchBatch's session through `batch`, until the client closes.
/// `root` is the user's sink root; a read-only user is refused.
pub(crate) fn serve(
    link: &mut Box<dyn Link>,
    root: &Root,
    read_only: bool,
    (version, dest): (u16, Vec<u8>),
    batch: &mut BatchSession,
) -> Result<(), EngineError> {
    let refuse = |link: &mut Box<dyn Link>, code: u16, message: String| {
        crate::transport::wire::send_final(&mut **link, &Control::Error { code, message });
    };
    if read_only {
        refuse(link, 3, "this user may only read from this daemon".into());
        return Ok(());
    }
    if version == 0 {
        refuse(link, 2, format!("watch version {version} not served"));
        return Ok(());
    }
    if !dest.is_empty() {
        if let Err(e) = validate_relative(&dest) {
            refuse(link, 2, e.to_string());
            return Ok(());
        }
    }
    if names_reserved(&dest) {
        refuse(link, 2, format!("{:?}: {REFUSED}", crate::show(&dest)));
        return Ok(());
    }
    match root.lstat(&dest) {
        Ok(Some(st)) if is_dir(&st) => {}
        _ => {
            let m = format!(
                "watch destination {:?} is not a directory",
                crate::show(&dest)
            );
            refuse(link, 2, m);
            return Ok(());
        }
    }
    let version = WATCH_VERSION.min(version);
    send_control(&mut **link, &Control::WatchReady { version })?;
    let mut last = 0u64;
    loop {
        // A job may be idle for hours between batches (a session set its
        // own timeouts).
        link.set_read_timeout(None)?;
        let (seq, ops) = match recv_control(&mut **link) {
            Ok(Control::WatchOps { seq, ops }) => (seq, ops),
            Ok(Control::WatchBatch { batch: n }) if version >= WATCH_SESSIONS => {
                // In order, each once: a batch number (and so its key,
                // proto::auth::batch_key) is never used twice.
                if n != last + 1 {
                    let m = format!("batch {n} out of order (expected {})", last + 1);
                    refuse(link, 2, m);
                    return Ok(());
                }
                last = n;
                batch(link, n)?;
                continue;
            }
            Ok(m) => {
                refuse(link, 1, format!("expected WatchOps, got {}", m.name()));
                return Ok(());
            }
            Err(EngineError::PeerClosed) => return Ok(()),
            Err(e) => return Err(e),
        };
        let results = ops.iter().map(|op| apply(root, &dest, op)).collect();
        send_control(&mut **link, &Control::WatchDone { seq, results })?;
    }
}

/// The client end: a connection to the destination daemon that applies
/// operations batch after batch and, when the daemon serves
/// WATCH_SESSIONS, carries each batch's session too.
pub struct WatchChannel {
    s: ClientSession,
    seq: u64,
    /// The version in force (WatchReady's).
    version: u16,
    /// Batches sent as sessions on this link so far.
    batch: u64,
    /// How long an answer may take (a session sets its own in between).
    timeout: std::time::Duration,
}

impl WatchChannel {
    /// Connect, authenticate, seal the link under `cipher` (`--encrypt`:
    /// operations and sessions then travel sealed) and open the channel
    /// for `dest`.
    pub fn open(
        remote: &Remote,
        dest: &[u8],
        cipher: crate::transport::crypto::Cipher,
    ) -> Result<WatchChannel, EngineError> {
        let user = remote.user.clone().unwrap_or_else(current_user);
        let mut s = Connect::new(&remote.addr, &remote.key, remote.connect_timeout)
            .user(user)
            .open(&*remote.transport)?;
        crate::roles::client::seal_control(&mut s, cipher)?;
        send_control(
            &mut *s.ctl,
            &Control::WatchOpen {
                version: WATCH_VERSION,
                dest: dest.to_vec(),
            },
        )?;
        let timeout = remote
            .connect_timeout
            .max(std::time::Duration::from_secs(30));
        s.ctl.set_read_timeout(Some(timeout))?;
        match recv_control(&mut *s.ctl) {
            Ok(Control::WatchReady { version }) => Ok(WatchChannel {
                s,
                seq: 0,
                version,
                batch: 0,
                timeout,
            }),
            Ok(Control::Error { message, .. }) => Err(EngineError::Refused(message)),
            Ok(m) => Err(EngineError::local(format!(
                "watch channel: expected WatchReady, got {}",
                m.name()
            ))),
            // A daemon older than the watch channel cannot decode WatchOpen.
            Err(EngineError::PeerClosed) => Err(EngineError::Refused(
                "the destination daemon does not serve continuous replication \
                 (WatchOpen); upgrade it"
                    .into(),
            )),
            Err(e) => Err(e),
        }
    }

    /// Does the daemon run the job's sessions on this link (an older one
    /// answers a lower version: a session per batch on its own
    /// connection, client::push)?
    pub fn keeps_sessions(&self) -> bool {
        self.version >= WATCH_SESSIONS
    }

    /// Send `tops` to `dest` as the next batch's session on this link
    /// (client::push_kept); only when [`Self::keeps_sessions`]. After an
    /// error the channel is spent: open a new one.
    #[allow(clippy::too_many_arguments)]
    pub fn push(
        &mut self,
        remote: &Remote,
        root: std::sync::Arc<Root>,
        tops: Vec<crate::request::walk::Top>,
        dest: Vec<u8>,
        opts: &crate::TransferOptions,
        res: &crate::EngineResources,
        stats: std::sync::Arc<crate::Stats>,
    ) -> Result<crate::Report, EngineError> {
        self.batch += 1;
        let (s, n) = (&mut self.s, self.batch);
        crate::roles::client::push_kept(s, n, remote, root, tops, dest, opts, res, stats)
    }

    /// Apply `ops` in order; one result each.
    pub fn apply(&mut self, ops: &[WatchOp]) -> Result<Vec<WatchResult>, EngineError> {
        self.s.ctl.set_read_timeout(Some(self.timeout))?;
        let mut out = Vec::with_capacity(ops.len());
        for chunk in ops.chunks(MAX_OPS) {
            self.seq += 1;
            let seq = self.seq;
            send_control(
                &mut *self.s.ctl,
                &Control::WatchOps {
                    seq,
                    ops: chunk.to_vec(),
                },
            )?;
            match recv_control(&mut *self.s.ctl)? {
                Control::WatchDone { seq: got, results }
                    if got == seq && results.len() == chunk.len() =>
                {
                    out.extend(results)
                }
                Control::Error { message, .. } => return Err(EngineError::Refused(message)),
                m => {
                    return Err(EngineError::local(format!(
                        "watch channel: unexpected {}",
                        m.name()
                    )))
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::fsops::Confinement;

    #[test]
    fn applies_only_to_the_kind_named_and_never_outside() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        std::fs::create_dir_all(d.join("m/dir/sub")).unwrap();
        std::fs::write(d.join("m/dir/sub/f"), b"x").unwrap();
        std::fs::write(d.join("m/file"), b"y").unwrap();
        std::os::unix::fs::symlink("/etc", d.join("m/esc")).unwrap();
        let root = Root::open(d, Confinement::Strict).unwrap();
        let b = |s: &str| s.as_bytes().to_vec();
        let r = |op| apply(&root, b"m", &op);
        // A rename into a directory not there yet makes it.
        let op = WatchOp::Rename {
            from: b("dir"),
            to: b("new/place"),
            dir: true,
        };
        assert_eq!(r(op), WatchResult::Done);
        assert!(d.join("m/new/place/sub/f").exists());
        // The wrong kind is missing, not moved.
        let op = WatchOp::Rename {
            from: b("file"),
            to: b("g"),
            dir: true,
        };
        assert_eq!(r(op), WatchResult::Missing);
        let op = WatchOp::Delete {
            path: b("new"),
            dir: false,
        };
        assert_eq!(r(op), WatchResult::Missing);
        let op = WatchOp::Delete {
            path: b("new"),
            dir: true,
        };
        assert_eq!(r(op), WatchResult::Done);
        assert!(!d.join("m/new").exists());
        // Never through a symlink, never out of the root.
        let op = WatchOp::Rename {
            from: b("esc/passwd"),
            to: b("stolen"),
            dir: false,
        };
        assert_ne!(r(op), WatchResult::Done);
        assert!(!d.join("m/stolen").exists());
        for bad in [b("../x"), b("/etc"), b("a/../../x")] {
            let op = WatchOp::Delete {
                path: bad,
                dir: false,
            };
            assert!(matches!(r(op), WatchResult::Failed(_)));
        }
        // Reserved names (crate::reserved) are never renamed over, out of
        // or deleted, and DST itself is never renamed or deleted.
        std::fs::write(d.join("m/.ramsys-journal.sqlite"), b"j").unwrap();
        let ren = |from: &str, to: &str| WatchOp::Rename {
            from: b(from),
            to: b(to),
            dir: false,
        };
        let del = |p: &str| WatchOp::Delete {
            path: b(p),
            dir: false,
        };
        for op in [
            ren("file", ".ramsys-journal.sqlite"),
            ren(".ramsys-journal.sqlite", "j"),
            ren("file", "sub/.f.ramsys-00000000000000ab.part"),
            del(".ramsys-journal.sqlite"),
            del(".ramsys-journal.sqlite-wal"),
            del(""),
            ren("", "x"),
            ren("file", ""),
        ] {
            match r(op.clone()) {
                WatchResult::Failed(m) => assert!(!m.contains('\n'), "{m}"),
                other => panic!("{op:?}: {other:?}"),
            }
        }
        assert_eq!(
            std::fs::read(d.join("m/.ramsys-journal.sqlite")).unwrap(),
            b"j"
        );
        assert_eq!(std::fs::read(d.join("m/file")).unwrap(), b"y");
        let op = WatchOp::DirAttrs {
            path: vec![],
            mode: 0o750,
            mtime_s: 1_000_000,
            mtime_ns: 7,
        };
        assert_eq!(r(op), WatchResult::Done);
        let md = std::fs::metadata(d.join("m")).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!((md.mode() & 0o7777, md.mtime()), (0o750, 1_000_000));
        assert!(d.join("m/esc").is_symlink());
    }
}
