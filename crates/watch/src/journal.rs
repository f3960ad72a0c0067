//! The pending set on disk (issue 38: "the job's pending set survives a
//! crash"): an SQLite database per job, written from the pending set's
//! log ([`LogRec`]) in one transaction per batch of changes. On restart
//! the job replays it: operations DST has not applied (a renamed 1 GiB
//! file is still a rename after a crash), paths not yet sent, and whether
//! a full scan was due. The job also scans the whole tree at start (what
//! changed while nothing watched), so the journal is about *how* changes
//! travel (renames as renames), not whether they do.
//!
//! Like the sink's resume journal (engine sync::journal) it never fsyncs
//! (`synchronous=OFF`): it survives the process being killed; a power loss
//! at worst turns pending renames into data sent again by the start scan.

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension};

use crate::change::{moved, under};
use crate::pending::{Kind, LogRec, Op};

pub struct Journal {
    conn: Connection,
}

fn err(e: rusqlite::Error) -> std::io::Error {
    std::io::Error::other(format!("watch journal: {e}"))
}

/// What a journal held: paths to send, operations in order, whether a
/// full scan was due.
pub type Restored = (Vec<(Vec<u8>, Kind)>, Vec<(u64, Op)>, bool);

impl Journal {
    /// Open (or create) the journal at `path` for the job `job` (a text
    /// naming source and destination). A journal of another job is
    /// refused: its paths would be applied to the wrong tree.
    pub fn open(path: &Path, job: &str) -> std::io::Result<Journal> {
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d)?;
        }
        let conn = Connection::open(path).map_err(err)?;
        conn.execute_batch(
            "PRAGMA synchronous=OFF; PRAGMA journal_mode=WAL;
             CREATE TABLE IF NOT EXISTS dirty (path BLOB PRIMARY KEY, kind INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS ops (seq INTEGER PRIMARY KEY, kind INTEGER NOT NULL,
                 a BLOB NOT NULL, b BLOB NOT NULL, dir INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);",
        )
        .map_err(err)?;
        let have: Option<String> = conn
            .query_row("SELECT v FROM meta WHERE k = 'job'", [], |r| r.get(0))
            .optional()
            .map_err(err)?;
        match have {
            Some(h) if h != job => {
                return Err(std::io::Error::other(format!(
                    "watch journal {} belongs to another job ({h}); give this one its own",
                    path.display()
                )))
            }
            Some(_) => {}
            None => {
                conn.execute("INSERT INTO meta (k, v) VALUES ('job', ?1)", [job])
                    .map_err(err)?;
            }
        }
        Ok(Journal { conn })
    }

    /// What the journal holds.
    pub fn load(&self) -> std::io::Result<Restored> {
        let mut st = self
            .conn
            .prepare("SELECT path, kind FROM dirty ORDER BY path")
            .map_err(err)?;
        let paths = st
            .query_map([], |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, u8>(1)?)))
            .map_err(err)?
            .filter_map(|r| r.ok())
            .filter_map(|(p, k)| Kind::from_u8(k).map(|k| (p, k)))
            .collect();
        let mut st = self
            .conn
            .prepare("SELECT seq, kind, a, b, dir FROM ops ORDER BY seq")
            .map_err(err)?;
        let ops = st
            .query_map([], |r| {
                let (seq, kind, a, b, dir): (i64, u8, Vec<u8>, Vec<u8>, bool) =
                    (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?);
                Ok((seq as u64, kind, a, b, dir))
            })
            .map_err(err)?
            .filter_map(|r| r.ok())
            .map(|(seq, kind, a, b, dir)| {
                let op = match kind {
                    0 => Op::Rename {
                        from: a,
                        to: b,
                        dir,
                    },
                    _ => Op::Delete { path: a, dir },
                };
                (seq, op)
            })
            .collect();
        let full: Option<String> = self
            .conn
            .query_row("SELECT v FROM meta WHERE k = 'full'", [], |r| r.get(0))
            .optional()
            .map_err(err)?;
        Ok((paths, ops, full.as_deref() == Some("1")))
    }

    /// Write the pending set's mutations, in one transaction.
    pub fn apply(&mut self, recs: &[LogRec]) -> std::io::Result<()> {
        if recs.is_empty() {
            return Ok(());
        }
        let tx = self.conn.transaction().map_err(err)?;
        for r in recs {
            apply_one(&tx, r).map_err(err)?;
        }
        tx.commit().map_err(err)
    }

    /// Rows held (paths + operations), for tests and status.
    pub fn rows(&self) -> std::io::Result<u64> {
        self.conn
            .query_row(
                "SELECT (SELECT COUNT(*) FROM dirty) + (SELECT COUNT(*) FROM ops)",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as u64)
            .map_err(err)
    }
}

/// Paths at or below `dir`: `dir` itself, then the range of `dir/`..`dir0`
/// ('0' follows '/').
fn rows_under(tx: &rusqlite::Transaction, dir: &[u8]) -> rusqlite::Result<Vec<(Vec<u8>, u8)>> {
    let lo = [dir, b"/"].concat();
    let hi = [dir, b"0"].concat();
    let mut st = tx.prepare_cached(
        "SELECT path, kind FROM dirty WHERE path = ?1 OR (path >= ?2 AND path < ?3)",
    )?;
    let rows = st
        .query_map(params![dir, lo, hi], |r| {
            Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, u8>(1)?))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows.into_iter().filter(|(p, _)| under(p, dir)).collect())
}

fn apply_one(tx: &rusqlite::Transaction, r: &LogRec) -> rusqlite::Result<()> {
    match r {
        LogRec::Mark { path, kind } => {
            tx.prepare_cached("INSERT OR REPLACE INTO dirty (path, kind) VALUES (?1, ?2)")?
                .execute(params![path, *kind as u8])?;
        }
        LogRec::Unmark { path, tree: false } => {
            tx.prepare_cached("DELETE FROM dirty WHERE path = ?1")?
                .execute([path])?;
        }
        LogRec::Unmark { path, tree: true } => {
            for (p, _) in rows_under(tx, path)? {
                tx.prepare_cached("DELETE FROM dirty WHERE path = ?1")?
                    .execute([p])?;
            }
        }
        LogRec::Move { from, to } => {
            let rows = rows_under(tx, from)?;
            for (p, _) in &rows {
                tx.prepare_cached("DELETE FROM dirty WHERE path = ?1")?
                    .execute([p])?;
            }
            for (p, k) in rows {
                tx.prepare_cached("INSERT OR REPLACE INTO dirty (path, kind) VALUES (?1, ?2)")?
                    .execute(params![moved(&p, from, to), k])?;
            }
        }
        LogRec::Op { seq, op } => {
            let (kind, a, b, dir) = match op {
                Op::Rename { from, to, dir } => (0, from.as_slice(), to.as_slice(), *dir),
                Op::Delete { path, dir } => (1, path.as_slice(), &b""[..], *dir),
            };
            tx.prepare_cached(
                "INSERT OR REPLACE INTO ops (seq, kind, a, b, dir) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![*seq as i64, kind, a, b, dir])?;
        }
        LogRec::OpsDone { upto } => {
            tx.prepare_cached("DELETE FROM ops WHERE seq <= ?1")?
                .execute([*upto as i64])?;
        }
        LogRec::Full(on) => {
            tx.prepare_cached("INSERT OR REPLACE INTO meta (k, v) VALUES ('full', ?1)")?
                .execute([if *on { "1" } else { "0" }])?;
        }
        LogRec::Reset => {
            tx.execute_batch("DELETE FROM dirty; DELETE FROM ops;")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::change::Change;
    use crate::pending::{Pending, PendingConfig};

    /// The journal replays to the same pending set, after each kind of
    /// mutation and a batch that failed, then one that succeeded.
    #[test]
    fn replays_the_pending_set() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("j.sqlite");
        let mut j = Journal::open(&path, "a -> b").unwrap();
        let mut p = Pending::new(PendingConfig::default());
        let t = Instant::now();
        let ch = [
            Change::Closed(b"d/f".to_vec()),
            Change::Closed(b"d/g".to_vec()),
            Change::Created {
                path: b"n".to_vec(),
                dir: true,
                settled: true,
            },
            Change::Renamed {
                from: b"d".to_vec(),
                to: b"e".to_vec(),
                dir: true,
            },
            Change::Deleted {
                path: b"e/g".to_vec(),
                dir: false,
            },
        ];
        for c in ch {
            p.apply(c, t, 0);
        }
        j.apply(&p.drain_log()).unwrap();
        let (paths, ops, full) = j.load().unwrap();
        let names: Vec<&[u8]> = paths.iter().map(|(p, _)| p.as_slice()).collect();
        assert_eq!(names, vec![&b""[..], b"e", b"e/f", b"n"]);
        assert_eq!(ops.len(), 2);
        assert!(!full);
        // A failed batch leaves the journal as it was; a delivered one
        // empties it.
        let _ = p.take(t, 100);
        p.finish(false, &[], t);
        j.apply(&p.drain_log()).unwrap();
        assert_eq!(j.rows().unwrap(), 6);
        let _ = p.take(t, 100);
        p.ops_applied(&[], t);
        p.finish(true, &[], t);
        j.apply(&p.drain_log()).unwrap();
        assert_eq!(j.rows().unwrap(), 0);
        drop(j);
        // Another job's journal is refused.
        assert!(Journal::open(&path, "x -> y").is_err());
        let j = Journal::open(&path, "a -> b").unwrap();
        let mut q = Pending::new(PendingConfig::default());
        let (paths, ops, full) = j.load().unwrap();
        q.restore(paths, ops, full);
        assert_eq!(q.depth(), 0);
    }
}
