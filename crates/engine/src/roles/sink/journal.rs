//! The sink's resume journal (`--resume`, issue 9): an embedded SQLite
//! database at `<sink root>/.ramsys-journal.sqlite` (the sink root is the
//! daemon's export root, or the destination's directory for the agent), so
//! it lives with the data it describes, needs no state directory, and is
//! removed as soon as it holds nothing. One row per interrupted file: the
//! destination path, the source version it belongs to (size, mtime), its
//! temp file (`.name.ramsys-<session>.part`, same directory) and a bitmap
//! of the delta blocks (sync::delta_block) written after the receiver had
//! verified their checksums. A resumed run hashes only those blocks of the
//! temp file and offers them to the source (Have::Blocks), which re-sends
//! whatever is missing or differs.

use std::path::PathBuf;

use rusqlite::{params, Connection, OptionalExtension};

use crate::request::reserved::JOURNAL_NAME;

/// One interrupted file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartRec {
    /// Destination path, relative to the sink root.
    pub dest: Vec<u8>,
    pub size: u64,
    pub mtime: (i64, u32),
    /// Temp file name in the destination's directory.
    pub part: Vec<u8>,
    pub block_size: u32,
    /// Bit i set: block i written and verified.
    pub written: Vec<u8>,
}

impl PartRec {
    pub fn has(&self, i: usize) -> bool {
        self.written
            .get(i / 8)
            .is_some_and(|b| b & (1 << (i % 8)) != 0)
    }
}

pub struct Journal {
    conn: Connection,
    path: PathBuf,
}

fn err(e: rusqlite::Error) -> std::io::Error {
    std::io::Error::other(format!("resume journal: {e}"))
}

/// Why a journal could not be opened: it is not a sound journal (moved
/// aside), or the file system said no.
enum OpenError {
    Corrupt(String),
    Io(std::io::Error),
}

impl From<rusqlite::Error> for OpenError {
    fn from(e: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode::{DatabaseCorrupt, NotADatabase};
        match e.sqlite_error_code() {
            Some(DatabaseCorrupt | NotADatabase) => OpenError::Corrupt(e.to_string()),
            _ => OpenError::Io(err(e)),
        }
    }
}

impl Journal {
    /// Open (or create) the journal at `root`. One that is not a sound
    /// SQLite database, or not a regular file (a symlink put there), is
    /// moved aside to `.ramsys-journal.sqlite.corrupt` with one log line
    /// and a new one started (issue 34).
    pub fn open(root: &std::path::Path) -> std::io::Result<Journal> {
        let path = root.join(JOURNAL_NAME);
        match Self::open_at(&path) {
            Ok(j) => Ok(j),
            Err(OpenError::Io(e)) => Err(e),
            Err(OpenError::Corrupt(why)) => {
                let aside = Self::move_aside(&path)?;
                tracing::warn!(
                    "resume journal {} is unusable ({why}); moved aside to {}",
                    path.display(),
                    aside.display()
                );
                match Self::open_at(&path) {
                    Ok(j) => Ok(j),
                    Err(OpenError::Io(e)) => Err(e),
                    Err(OpenError::Corrupt(why)) => Err(std::io::Error::other(format!(
                        "resume journal {}: {why}",
                        path.display()
                    ))),
                }
            }
        }
    }

    fn open_at(path: &std::path::Path) -> Result<Journal, OpenError> {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        // Created 0600 here, before SQLite (which would make it 0644 and
        // its -wal/-shm files like it): it names the user's files. Never
        // through a symlink.
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(path);
        let f = match f {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(OpenError::Corrupt("a symlink".into()))
            }
            Err(e) => return Err(OpenError::Io(e)),
        };
        let md = f.metadata().map_err(OpenError::Io)?;
        if !md.is_file() {
            return Err(OpenError::Corrupt("not a regular file".into()));
        }
        // One made 0644 by an older version.
        if md.permissions().mode() & 0o077 != 0 {
            f.set_permissions(std::fs::Permissions::from_mode(0o600))
                .map_err(OpenError::Io)?;
        }
        drop(f);
        use rusqlite::OpenFlags as F;
        let flags = F::SQLITE_OPEN_READ_WRITE | F::SQLITE_OPEN_NO_MUTEX | F::SQLITE_OPEN_NOFOLLOW;
        let conn = Connection::open_with_flags(path, flags)?;
        // Survives the process being killed (the OS has the pages). No
        // fsync ever (synchronous=OFF, set before WAL so that the switch
        // does not sync either): on ext4 an fsync of this small file at the
        // end of a large transfer commits the file system journal, which
        // waits for the data just written (measured: 2 s of a 4 s copy of
        // 2 GiB, docs/SYNC.md). A power loss may lose or corrupt the
        // journal; the next run then re-sends what it cannot vouch for.
        conn.execute_batch(
            "PRAGMA synchronous=OFF; PRAGMA journal_mode=WAL;
             CREATE TABLE IF NOT EXISTS parts(
               dest BLOB PRIMARY KEY, size INTEGER NOT NULL, mtime_s INTEGER NOT NULL,
               mtime_ns INTEGER NOT NULL, part BLOB NOT NULL, block_size INTEGER NOT NULL,
               written BLOB NOT NULL);
             CREATE TABLE IF NOT EXISTS dests(dest BLOB PRIMARY KEY, top BLOB NOT NULL);",
        )?;
        // Damage past the header shows here, not at the first lookup.
        let check: String = conn.query_row("PRAGMA quick_check(1)", [], |r| r.get(0))?;
        if check != "ok" {
            return Err(OpenError::Corrupt(check));
        }
        Ok(Journal {
            conn,
            path: path.to_path_buf(),
        })
    }

    /// Rename the journal and its -wal/-shm files to `.corrupt` names
    /// (replacing an older set); returns the new name of the journal.
    fn move_aside(path: &std::path::Path) -> std::io::Result<PathBuf> {
        let named = |p: &std::path::Path, suffix: &str| {
            let mut s = p.as_os_str().to_owned();
            s.push(suffix);
            PathBuf::from(s)
        };
        let aside = named(path, ".corrupt");
        for suffix in ["-wal", "-shm", ""] {
            match std::fs::rename(named(path, suffix), named(&aside, suffix)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    let _ = std::fs::remove_file(named(&aside, suffix));
                }
                Err(e) => {
                    return Err(std::io::Error::other(format!(
                        "resume journal {} is unusable and cannot be moved aside: {e}",
                        path.display()
                    )))
                }
            }
        }
        Ok(aside)
    }

    pub fn lookup(&self, dest: &[u8]) -> std::io::Result<Option<PartRec>> {
        self.conn
            .query_row(
                "SELECT size, mtime_s, mtime_ns, part, block_size, written FROM parts WHERE dest = ?1",
                params![dest],
                |r| {
                    Ok(PartRec {
                        dest: dest.to_vec(),
                        size: r.get::<_, i64>(0)? as u64,
                        mtime: (r.get(1)?, r.get::<_, i64>(2)? as u32),
                        part: r.get(3)?,
                        block_size: r.get::<_, i64>(4)? as u32,
                        written: r.get(5)?,
                    })
                },
            )
            .optional()
            .map_err(err)
    }

    /// Insert or replace rows, in one transaction.
    pub fn put(&mut self, recs: &[PartRec]) -> std::io::Result<()> {
        let tx = self.conn.transaction().map_err(err)?;
        {
            let mut st = tx
                .prepare_cached("INSERT OR REPLACE INTO parts VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)")
                .map_err(err)?;
            for r in recs {
                st.execute(params![
                    r.dest,
                    r.size as i64,
                    r.mtime.0,
                    r.mtime.1 as i64,
                    r.part,
                    r.block_size as i64,
                    r.written
                ])
                .map_err(err)?;
            }
        }
        tx.commit().map_err(err)
    }

    pub fn remove(&mut self, dests: &[&[u8]]) -> std::io::Result<()> {
        let tx = self.conn.transaction().map_err(err)?;
        {
            let mut st = tx
                .prepare_cached("DELETE FROM parts WHERE dest = ?1")
                .map_err(err)?;
            for d in dests {
                st.execute(params![d]).map_err(err)?;
            }
        }
        tx.commit().map_err(err)
    }

    /// A copy made DST the copy of its one directory `top` and has not
    /// finished (roles::sink::dest): a retry must read DST the same way.
    pub fn mark_dest(&mut self, dest: &[u8], top: &[u8]) -> std::io::Result<()> {
        self.conn
            .execute(
                "INSERT OR REPLACE INTO dests VALUES (?1, ?2)",
                params![dest, top],
            )
            .map(|_| ())
            .map_err(err)
    }

    /// The top an unfinished copy made DST the copy of.
    pub fn dest_top(&self, dest: &[u8]) -> std::io::Result<Option<Vec<u8>>> {
        self.conn
            .query_row(
                "SELECT top FROM dests WHERE dest = ?1",
                params![dest],
                |r| r.get(0),
            )
            .optional()
            .map_err(err)
    }

    pub fn unmark_dest(&mut self, dest: &[u8]) -> std::io::Result<()> {
        self.conn
            .execute("DELETE FROM dests WHERE dest = ?1", params![dest])
            .map(|_| ())
            .map_err(err)
    }

    /// Whether any row names a path strictly under directory `dir`
    /// ("" = anything): how a resumed copy finds where the interrupted run
    /// put its files (roles::sink::dest).
    pub fn any_under(&self, dir: &[u8]) -> std::io::Result<bool> {
        if dir.is_empty() {
            return self.count().map(|n| n > 0);
        }
        // Paths under "d/" sort in ["d/", "d0"): '0' follows '/'.
        let lo = [dir, b"/"].concat();
        let hi = [dir, b"0"].concat();
        self.conn
            .query_row(
                "SELECT EXISTS(SELECT 1 FROM parts WHERE dest >= ?1 AND dest < ?2)",
                params![lo, hi],
                |r| r.get::<_, bool>(0),
            )
            .map_err(err)
    }

    /// Every row under directory `dir` ("" = all), for orphan cleaning.
    pub fn rows_under(&self, dir: &[u8]) -> std::io::Result<Vec<PartRec>> {
        let lo = if dir.is_empty() {
            Vec::new()
        } else {
            [dir, b"/"].concat()
        };
        let hi = if dir.is_empty() {
            vec![0xff; 4097]
        } else {
            [dir, b"0"].concat()
        };
        let mut st = self
            .conn
            .prepare_cached(
                "SELECT dest, size, mtime_s, mtime_ns, part, block_size, written FROM parts
                 WHERE dest >= ?1 AND dest < ?2",
            )
            .map_err(err)?;
        let rows = st
            .query_map(params![lo, hi], |r| {
                Ok(PartRec {
                    dest: r.get(0)?,
                    size: r.get::<_, i64>(1)? as u64,
                    mtime: (r.get(2)?, r.get::<_, i64>(3)? as u32),
                    part: r.get(4)?,
                    block_size: r.get::<_, i64>(5)? as u32,
                    written: r.get(6)?,
                })
            })
            .map_err(err)?;
        rows.collect::<Result<_, _>>().map_err(err)
    }

    /// Every destination path with a row: few (interrupted large files),
    /// so the session's end looks its files up here instead of deleting a
    /// row per file of the tree (issue 36).
    pub fn dests(&self) -> std::io::Result<std::collections::HashSet<Vec<u8>>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT dest FROM parts")
            .map_err(err)?;
        let rows = st.query_map([], |r| r.get::<_, Vec<u8>>(0)).map_err(err)?;
        rows.map(|r| r.map_err(err)).collect()
    }

    /// Rows left: interrupted files and unfinished destinations.
    pub fn count(&self) -> std::io::Result<u64> {
        self.conn
            .query_row(
                "SELECT (SELECT COUNT(*) FROM parts) + (SELECT COUNT(*) FROM dests)",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as u64)
            .map_err(err)
    }

    /// Close; delete the database when no interrupted file is left.
    pub fn close(self) {
        let empty = self.count().map(|n| n == 0).unwrap_or(false);
        let path = self.path.clone();
        drop(self.conn);
        if empty {
            for suffix in ["", "-wal", "-shm"] {
                let mut p = path.clone().into_os_string();
                p.push(suffix);
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_lookup_remove_and_cleanup() {
        let d = tempfile::tempdir().unwrap();
        let mut j = Journal::open(d.path()).unwrap();
        let r = PartRec {
            dest: b"a/b".to_vec(),
            size: 10,
            mtime: (5, 6),
            part: b".b.ramsys-1.part".to_vec(),
            block_size: 4,
            written: vec![0b101],
        };
        j.put(std::slice::from_ref(&r)).unwrap();
        let got = j.lookup(b"a/b").unwrap().unwrap();
        assert_eq!(got, r);
        assert!(got.has(0) && !got.has(1) && got.has(2) && !got.has(9));
        j.close();
        assert!(d.path().join(JOURNAL_NAME).exists());
        let mut j = Journal::open(d.path()).unwrap();
        j.remove(&[b"a/b"]).unwrap();
        assert!(j.lookup(b"a/b").unwrap().is_none());
        j.close();
        assert!(!d.path().join(JOURNAL_NAME).exists());
    }

    fn mode(p: &std::path::Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
    }

    /// Issue 34: the journal names the user's files: 0600, and its WAL
    /// and shared-memory files too; an older 0644 one is made 0600.
    #[test]
    fn created_0600_with_its_wal() {
        let d = tempfile::tempdir().unwrap();
        let mut j = Journal::open(d.path()).unwrap();
        j.mark_dest(b"x", b"y").unwrap();
        for suffix in ["", "-wal", "-shm"] {
            let p = d.path().join(format!("{JOURNAL_NAME}{suffix}"));
            assert_eq!(mode(&p), 0o600, "{}", p.display());
        }
        drop(j);
        use std::os::unix::fs::PermissionsExt;
        let p = d.path().join(JOURNAL_NAME);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let j = Journal::open(d.path()).unwrap();
        assert_eq!(mode(&p), 0o600);
        assert_eq!(j.dest_top(b"x").unwrap().as_deref(), Some(&b"y"[..]));
    }

    /// Issue 34: a corrupt journal, or a symlink in its place, is moved
    /// aside (never followed, never left to fail every later run) and a
    /// new one works.
    #[test]
    fn unusable_journal_moved_aside() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(JOURNAL_NAME);
        let aside = d.path().join(format!("{JOURNAL_NAME}.corrupt"));
        std::fs::write(&p, vec![0x5a; 8192]).unwrap();
        let mut j = Journal::open(d.path()).unwrap();
        j.mark_dest(b"a", b"b").unwrap();
        assert_eq!(std::fs::read(&aside).unwrap(), vec![0x5a; 8192]);
        drop(j);
        // A symlink planted there: renamed, its target untouched.
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        for s in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(d.path().join(format!("{JOURNAL_NAME}{s}")));
        }
        std::os::unix::fs::symlink(&victim, &p).unwrap();
        let j = Journal::open(d.path()).unwrap();
        assert_eq!(j.count().unwrap(), 0);
        assert!(std::fs::symlink_metadata(&aside).unwrap().is_symlink());
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert!(std::fs::symlink_metadata(&p).unwrap().is_file());
    }
}
