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

pub const JOURNAL_NAME: &str = ".ramsys-journal.sqlite";

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

impl Journal {
    pub fn open(root: &std::path::Path) -> std::io::Result<Journal> {
        let path = root.join(JOURNAL_NAME);
        let conn = Connection::open(&path).map_err(err)?;
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
        )
        .map_err(err)?;
        Ok(Journal { conn, path })
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
    /// finished (sync::dest): a retry must read DST the same way.
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
    /// put its files (sync::dest).
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
}
