//! Settlers: the source's digests (FilesDone) applied off the sink's
//! control thread (issue 36). A digest is what puts a small file in place:
//! an empty file is created at its final name, a file whose data is in is
//! linked or renamed to it (files::settle). On a tree of small files that
//! is one create or link per file, the kernel's directory search and inode
//! allocation, and it all ran on the session's control thread: a push of
//! 10 M empty files held that one thread at 100 % (85 % of it in `openat`)
//! while the second core idled (docs/STORAGE.md "Settlers").
//!
//! Up to `n` settler threads, started at the first batch large enough to
//! be worth one (a big file's session never starts them), pinned like the
//! writers. A directory's files always go to the same settler: a create
//! holds its directory's lock, so two threads in one directory would only
//! wait for each other; the windows keep tens of directories in flight.
//! The control thread checks each id before handing it on (a digest for
//! an unknown file ends the session there, as before); a settler's error
//! reaches the loop as a writer's does, and the teardown joins the
//! settlers before it finalizes the table.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_channel::{unbounded, Sender};
use ramsys_resources::ThreadPool;

use super::WriterEvent;
use crate::roles::sink::files::{FileTable, WriteError};

/// Batches smaller than this are applied on the control thread while no
/// settler runs (a watch batch, a few big files: a thread would cost more
/// than it saves). The source sends at least 64 digests a batch once its
/// readers are ahead (source::pipeline, DIGEST_MIN_BATCH).
const START_AT: usize = 64;

/// Most settlers a session starts, whatever its writers: each is a
/// thread outside the pools (a session's extra), and a file system's
/// creates scale with directories but not without bound (its journal).
pub const MAX_SETTLERS: usize = 4;

/// What the settlers share with the sink's loop.
pub struct SettlerWiring {
    pub table: Arc<FileTable>,
    pub pool: Arc<ThreadPool>,
    pub events: Sender<WriterEvent>,
    pub wake: Sender<()>,
    pub abort: Arc<AtomicBool>,
    /// Most settler threads.
    pub most: usize,
}

/// The settlers of one sink session.
pub struct Settlers {
    wiring: SettlerWiring,
    lanes: Vec<Sender<Vec<(u64, u64)>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Settlers {
    pub fn new(wiring: SettlerWiring) -> Settlers {
        Settlers {
            wiring,
            lanes: Vec::new(),
            threads: Vec::new(),
        }
    }

    /// Apply a FilesDone batch: here, or on the settlers.
    pub fn digests(&mut self, table: &FileTable, v: Vec<(u64, u64)>) -> Result<(), WriteError> {
        if self.lanes.is_empty() && (v.len() < START_AT || !self.start()) {
            return v
                .into_iter()
                .try_for_each(|(id, d)| table.digest_known(id, d));
        }
        let n = self.lanes.len();
        let mut per: Vec<Vec<(u64, u64)>> = vec![Vec::new(); n];
        for (id, d) in v {
            let lane = match table.get(id) {
                Some(f) => f.dir_index() as usize % n,
                // Failed here and released before its digest came.
                None if table.is_released(id) => continue,
                None => {
                    return Err(WriteError::Protocol(format!(
                        "digest for unknown file id {id}"
                    )))
                }
            };
            per[lane].push((id, d));
        }
        for (tx, batch) in self.lanes.iter().zip(per) {
            if !batch.is_empty() {
                // A settler gone has reported why (the loop ends on it).
                let _ = tx.send(batch);
            }
        }
        Ok(())
    }

    /// Start the threads; false (digests stay on the control thread) if
    /// not even one could be.
    fn start(&mut self) -> bool {
        let w = &self.wiring;
        for i in 0..w.most.max(1) {
            let (tx, rx) = unbounded::<Vec<(u64, u64)>>();
            let (table, events) = (w.table.clone(), w.events.clone());
            let (wake, abort) = (w.wake.clone(), w.abort.clone());
            let body = move || {
                while let Ok(batch) = rx.recv() {
                    if abort.load(Ordering::Acquire) {
                        continue;
                    }
                    if let Err(e) = batch
                        .into_iter()
                        .try_for_each(|(id, d)| table.digest_known(id, d))
                    {
                        abort.store(true, Ordering::Release);
                        let _ = events.send(match e {
                            WriteError::Fatal(m) => WriterEvent::Fatal(m),
                            WriteError::Protocol(m) => WriterEvent::Protocol(m),
                        });
                    }
                    if table.counted_all_first() {
                        let _ = wake.try_send(());
                    }
                }
            };
            match w.pool.spawn_extra(format!("settler-{i}"), body) {
                Ok(h) => {
                    self.lanes.push(tx);
                    self.threads.push(h);
                }
                Err(e) => {
                    tracing::warn!("cannot start a settler thread: {e}");
                    break;
                }
            }
        }
        !self.lanes.is_empty()
    }

    /// Every batch handed on is applied (or dropped after an abort).
    pub fn join(self) {
        drop(self.lanes);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::fsops::{Confinement, Root};
    use crate::storage::{Hook, IoHook, IoOp, StorageCfg};
    use crate::types::stats::Stats;

    /// Fails the create of the empty files named in it, with its errno.
    struct Fail(&'static [u8], i32);
    impl IoHook for Fail {
        fn check(&self, op: IoOp, path: &[u8], _: u64, _: usize) -> std::io::Result<()> {
            match op {
                IoOp::CreateEmpty if path == self.0 => {
                    Err(std::io::Error::from_raw_os_error(self.1))
                }
                _ => Ok(()),
            }
        }
    }

    /// Four directories of 100 empty files and one more that fails.
    fn table(d: &std::path::Path, fail: Fail) -> Arc<FileTable> {
        let root = Arc::new(Root::open(d, Confinement::Strict).unwrap());
        let mut cfg = StorageCfg::plain(false, crate::storage::IoEngine::Sync);
        cfg.hook = Hook(Some(Arc::new(fail)));
        let t = FileTable::new(root, 1, false, false, Arc::new(Stats::default()));
        let t = t.with_storage(cfg);
        for k in 0..4 {
            std::fs::create_dir(d.join(format!("d{k}"))).unwrap();
        }
        for id in 0..400u64 {
            let name = format!("d{}/f{}", id / 100, id % 100).into_bytes();
            t.push_entry(id, Some((name, 0, 0o640, (7, 8))));
        }
        t.push_entry(400, Some((b"d1/bad".to_vec(), 0, 0o644, (7, 8))));
        Arc::new(t)
    }

    fn settlers(t: &Arc<FileTable>) -> (Settlers, crossbeam_channel::Receiver<WriterEvent>) {
        let (events, rx) = unbounded();
        let (wake, _) = crossbeam_channel::bounded(1);
        let wiring = SettlerWiring {
            table: t.clone(),
            pool: ThreadPool::new("test-writers", 1, Vec::new()).unwrap(),
            events,
            wake,
            abort: Arc::new(AtomicBool::new(false)),
            most: 2,
        };
        (Settlers::new(wiring), rx)
    }

    /// A batch large enough starts the settlers, which place every file
    /// (a directory's on one thread), fail only the one whose create
    /// fails, and are done when joined; a digest for an id the table
    /// never had is refused at once, on the loop's thread.
    #[test]
    fn settlers_place_the_files_and_fail_only_the_bad_one() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        let t = table(d.path(), Fail(b"d1/bad", libc::EIO));
        let (mut s, events) = settlers(&t);
        // Below START_AT, with none started: applied here.
        s.digests(&t, (0..10).map(|id| (id, 0)).collect()).unwrap();
        assert!(s.threads.is_empty());
        assert!(d.path().join("d0/f9").exists());
        s.digests(&t, (10..401).map(|id| (id, 0)).collect())
            .unwrap();
        assert_eq!(s.threads.len(), 2);
        let e = s.digests(&t, vec![(401, 0)]).unwrap_err();
        assert!(matches!(e, WriteError::Protocol(m) if m.contains("unknown file id 401")));
        s.join();
        assert!(
            events.try_recv().is_err(),
            "a per-file failure is not fatal"
        );
        let failed = t.finish();
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert!(failed[0].0.ends_with(b"d1/bad") && failed[0].1.contains("cannot create"));
        for id in 0..400 {
            let p = d.path().join(format!("d{}/f{}", id / 100, id % 100));
            let md = std::fs::metadata(&p).unwrap();
            assert_eq!(
                (md.len(), md.mode() & 0o777, md.mtime()),
                (0, 0o640, 7),
                "{p:?}"
            );
        }
        assert!(!d.path().join("d1/bad").exists());
    }

    /// A full disk on a settler stops the session: the loop hears it as a
    /// writer's fatal error, and the other settlers stop taking batches.
    #[test]
    fn a_full_disk_on_a_settler_is_the_sessions_error() {
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        let t = table(d.path(), Fail(b"d2/f5", libc::ENOSPC));
        let (mut s, events) = settlers(&t);
        s.digests(&t, (0..401).map(|id| (id, 0)).collect()).unwrap();
        let abort = s.wiring.abort.clone();
        s.join();
        match events.try_recv() {
            Ok(WriterEvent::Fatal(m)) => assert!(m.contains("disk full"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert!(abort.load(Ordering::Acquire));
        assert!(!d.path().join("d2/f5").exists());
    }
}
