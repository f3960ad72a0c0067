use super::*;
use crate::storage::fsops::Confinement;

/// A slot per announced file (issue 36): what only some files need
/// stays out of it (it was ~260 bytes with five locks and a OnceLock).
#[test]
fn file_slot_stays_small() {
    let n = std::mem::size_of::<SinkFile>();
    eprintln!("SinkFile: {n} bytes");
    assert!(n <= 120, "SinkFile grew to {n} bytes");
}

#[test]
fn all_settled_follows_files_settling_in_any_order() {
    let d = tempfile::tempdir().unwrap();
    let root = Arc::new(Root::open(d.path(), Confinement::Strict).unwrap());
    let t = FileTable::new(root, 1, false, false, Arc::new(Stats::default()));
    for id in 0..4u64 {
        t.push_entry(id, Some((format!("f{id}").into_bytes(), 1, 0o644, (0, 0))));
    }
    assert!(!t.all_settled());
    for id in [2, 0, 3] {
        t.keep(id, false);
        assert!(!t.all_settled());
    }
    t.keep(1, false);
    assert!(t.all_settled());
    assert_eq!(t.unsettled(), 0);
}

/// The writers' hint that the last file may have settled (the sink's
/// loop looks for Settled at once, issue 38): given once, when files in
/// place plus failed reach the table's size, never before.
#[test]
fn counted_all_is_hinted_once_when_the_counters_reach_the_table() {
    let d = tempfile::tempdir().unwrap();
    let root = Arc::new(Root::open(d.path(), Confinement::Strict).unwrap());
    let stats = Arc::new(Stats::default());
    let t = FileTable::new(root, 1, false, false, stats.clone());
    for id in 0..3u64 {
        t.push_entry(id, Some((format!("f{id}").into_bytes(), 1, 0o644, (0, 0))));
    }
    stats.files.store(2, Ordering::Relaxed);
    assert!(!t.counted_all_first(), "two of three files counted");
    stats.failed.store(1, Ordering::Relaxed);
    assert!(t.counted_all_first(), "two in place and one failed are all");
    assert!(!t.counted_all_first(), "the hint is given once");
}

fn small_table(d: &std::path::Path, hook: crate::storage::Hook) -> FileTable {
    let root = Arc::new(Root::open(d, Confinement::Strict).unwrap());
    let mut cfg = StorageCfg::plain(false, crate::storage::IoEngine::Sync);
    cfg.hook = hook;
    let t = FileTable::new(root, 1, true, false, Arc::new(Stats::default())).with_storage(cfg);
    // Nameless temp files are off by default (tmpfile::enabled).
    t.anon_ok.store(true, Ordering::Relaxed);
    t
}

fn names(d: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Write `data` as file `id` in one segment; its digest.
fn send(t: &FileTable, id: u64, off: u64, data: &[u8]) -> u64 {
    let seg = Segment {
        file_id: id,
        offset: off,
        len: data.len() as u32,
    };
    let h = ramsys_proto::data::segment_hash(id, off, data);
    t.write_segment(&seg, data, h).unwrap();
    h
}

/// Small files are nameless until whole: written, nothing is visible in
/// the directory; the digest links them under their final names with
/// their mode and mtime. A trailing hole gives a file its size; an
/// empty file and an existing final name (replaced) work too.
#[test]
fn small_files_appear_only_whole() {
    use std::os::unix::fs::MetadataExt;
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::create_dir(d.path().join("sub")).unwrap();
    std::fs::write(d.path().join("sub/old"), b"previous contents").unwrap();
    let t = small_table(d.path(), Default::default());
    t.push_entry(0, Some((b"sub/a".to_vec(), 5, 0o640, (1_000_000, 9))));
    t.push_entry(1, Some((b"sub/old".to_vec(), 3, 0o4755, (7, 0))));
    t.push_entry(2, Some((b"sub/holey".to_vec(), 10_000, 0o644, (8, 0))));
    t.push_entry(3, Some((b"sub/empty".to_vec(), 0, 0o600, (9, 0))));
    let ha = send(&t, 0, 0, b"hello");
    let ho = send(&t, 1, 0, b"new");
    let hh = send(&t, 2, 0, &[5u8; 4096]);
    let hole = Segment::hole(2, 4096, 10_000 - 4096);
    let hole_hash = ramsys_proto::data::marker_hash(&hole);
    t.write_segment(&hole, &[], hole_hash).unwrap();
    // All data is written; no digest yet: nothing new under any name
    // (where the file system has O_TMPFILE).
    if t.anon_ok.load(Ordering::Relaxed) {
        assert_eq!(names(&d.path().join("sub")), vec!["old"]);
        assert_eq!(t.anon_open.load(Ordering::Relaxed), 3);
    }
    t.digest_known(0, ha).unwrap();
    t.digest_known(1, ho).unwrap();
    t.digest_known(2, hh.wrapping_add(hole_hash)).unwrap();
    t.digest_known(3, 0).unwrap();
    assert!(t.finish().is_empty());
    assert_eq!(t.anon_open.load(Ordering::Relaxed), 0);
    let sub = d.path().join("sub");
    assert_eq!(names(&sub), vec!["a", "empty", "holey", "old"]);
    assert_eq!(std::fs::read(sub.join("a")).unwrap(), b"hello");
    assert_eq!(std::fs::read(sub.join("old")).unwrap(), b"new");
    let h = std::fs::read(sub.join("holey")).unwrap();
    assert_eq!(h.len(), 10_000);
    assert!(h[..4096].iter().all(|&b| b == 5) && h[4096..].iter().all(|&b| b == 0));
    let md = std::fs::metadata(sub.join("a")).unwrap();
    assert_eq!(md.mode() & 0o7777, 0o640);
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_000_000, 9));
    let md = std::fs::metadata(sub.join("old")).unwrap();
    assert_eq!(md.mode() & 0o7777, 0o4755, "set-uid needs the fchmod");
    assert_eq!(std::fs::metadata(sub.join("empty")).unwrap().len(), 0);
}

struct FailCreate;
impl crate::storage::IoHook for FailCreate {
    fn check(&self, op: IoOp, path: &[u8], _: u64, _: usize) -> std::io::Result<()> {
        match op {
            IoOp::CreateEmpty if path == b"bad" => {
                Err(std::io::Error::from_raw_os_error(libc::EIO))
            }
            _ => Ok(()),
        }
    }
}

/// Empty files are made at their final name (no temp file: nothing in
/// them can be half-written) with their mode and mtime; a name that is
/// taken (a file, a link to outside) is replaced through a temp file as
/// before, never followed; a digest that is not the empty data's fails
/// the file, and so does a failed create, leaving nothing.
#[test]
fn empty_files_are_made_at_their_final_name() {
    use std::os::unix::fs::MetadataExt;
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let out = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::write(d.path().join("old"), b"previous contents").unwrap();
    std::fs::write(out.path().join("target"), b"outside").unwrap();
    std::os::unix::fs::symlink(out.path().join("target"), d.path().join("link")).unwrap();
    let t = small_table(d.path(), crate::storage::Hook(Some(Arc::new(FailCreate))));
    let entries: [(&[u8], u32); 5] = [
        (b"new", 0o4755),
        (b"old", 0o640),
        (b"link", 0o600),
        (b"corrupt", 0o644),
        (b"bad", 0o644),
    ];
    for (id, (name, mode)) in entries.iter().enumerate() {
        t.push_entry(id as u64, Some((name.to_vec(), 0, *mode, (11, 12))));
    }
    for id in 0..3 {
        t.digest_known(id, 0).unwrap();
    }
    t.digest_known(3, 1).unwrap();
    t.digest_known(4, 0).unwrap();
    let failed = t.finish();
    let why: Vec<_> = failed
        .iter()
        .map(|(p, e)| (p.as_slice(), e.as_str()))
        .collect();
    assert_eq!(failed.len(), 2, "{why:?}");
    assert!(
        why.iter()
            .any(|(p, e)| *p == b"corrupt" && e.contains("checksum")),
        "{why:?}"
    );
    assert!(
        why.iter()
            .any(|(p, e)| *p == b"bad" && e.contains("cannot create")),
        "{why:?}"
    );
    assert_eq!(names(d.path()), vec!["link", "new", "old"]);
    for (name, mode) in [("new", 0o4755), ("old", 0o640), ("link", 0o600)] {
        let md = std::fs::symlink_metadata(d.path().join(name)).unwrap();
        assert!(md.is_file(), "{name}");
        assert_eq!((md.len(), md.mode() & 0o7777), (0, mode), "{name}");
        assert_eq!((md.mtime(), md.mtime_nsec()), (11, 12), "{name}");
    }
    assert_eq!(
        std::fs::read(out.path().join("target")).unwrap(),
        b"outside"
    );
}

/// A file that fails or never completes leaves nothing behind.
#[test]
fn incomplete_small_files_leave_nothing() {
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let t = small_table(d.path(), Default::default());
    t.push_entry(0, Some((b"half".to_vec(), 10, 0o644, (0, 0))));
    t.push_entry(1, Some((b"bad".to_vec(), 4, 0o644, (0, 0))));
    send(&t, 0, 0, b"12345");
    let h = send(&t, 1, 0, b"abcd");
    t.digest_known(1, h ^ 1).unwrap();
    let f = t.finish();
    assert_eq!(f.len(), 2, "{f:?}");
    assert!(f.iter().any(|(_, r)| r.contains("checksum")));
    assert!(names(d.path()).is_empty(), "{:?}", names(d.path()));
}

/// Past the cap of open nameless files, a file gets a named temp
/// file (visible only under its temp name until whole); both kinds
/// land whole, and the cap follows the open-file limit.
#[test]
fn past_the_anon_cap_files_get_named_temp_files() {
    assert!(anon_cap() >= 1024);
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let mut t = small_table(d.path(), Default::default());
    t.anon_cap = 2;
    for (id, n) in [(0, "a"), (1, "b"), (2, "c")] {
        t.push_entry(id, Some((n.as_bytes().to_vec(), 3, 0o644, (5, 0))));
    }
    let h: Vec<u64> = (0..3).map(|id| send(&t, id, 0, b"xyz")).collect();
    if !t.anon_ok.load(Ordering::Relaxed) {
        return; // no O_TMPFILE here: the fallback test covers named files
    }
    assert_eq!(t.anon_open.load(Ordering::Relaxed), 2);
    assert_eq!(names(d.path()), vec![".c.ramsys-0000000000000001.part"]);
    for (id, h) in h.into_iter().enumerate() {
        t.digest_known(id as u64, h).unwrap();
    }
    assert!(t.finish().is_empty());
    assert_eq!(t.anon_open.load(Ordering::Relaxed), 0);
    assert_eq!(names(d.path()), vec!["a", "b", "c"]);
    for n in ["a", "b", "c"] {
        assert_eq!(std::fs::read(d.path().join(n)).unwrap(), b"xyz");
    }
}

/// A nameless file of the lane's size gets a second, O_DIRECT
/// descriptor (counted against the cap) and its size at creation; it
/// lands whole, and both descriptors are given back.
#[test]
fn a_nameless_lane_file_has_two_descriptors() {
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let root = Arc::new(Root::open(d.path(), Confinement::Strict).unwrap());
    let mut cfg = StorageCfg::plain(true, crate::storage::IoEngine::Sync);
    cfg.lane_bytes = 1 << 20;
    let t = FileTable::new(root, 1, true, false, Arc::new(Stats::default())).with_storage(cfg);
    t.anon_ok.store(true, Ordering::Relaxed);
    let size = crate::storage::lane_min() as usize + 5000;
    t.push_entry(0, Some((b"mid".to_vec(), size as u64, 0o644, (7, 0))));
    let data: Vec<u8> = (0..size).map(|i| (i * 31 + 7) as u8).collect();
    let h = send(&t, 0, 0, &data);
    if !t.anon_ok.load(Ordering::Relaxed) {
        return; // no O_TMPFILE here
    }
    let fd = t.get(0).unwrap().fd.lock().unwrap().clone().unwrap();
    if fd.direct.is_some() {
        assert!(fd.lane && fd.sized);
        assert_eq!(t.anon_open.load(Ordering::Relaxed), 2);
        assert_eq!(fd.buffered.metadata().unwrap().len(), size as u64);
    } else {
        assert_eq!(t.anon_open.load(Ordering::Relaxed), 1); // O_DIRECT refused here
    }
    drop(fd);
    t.digest_known(0, h).unwrap();
    assert!(t.finish().is_empty());
    assert_eq!(t.anon_open.load(Ordering::Relaxed), 0);
    assert_eq!(std::fs::read(d.path().join("mid")).unwrap(), data);
}

struct NoTmpFile;
impl crate::storage::IoHook for NoTmpFile {
    fn check(&self, op: IoOp, _: &[u8], _: u64, _: usize) -> std::io::Result<()> {
        match op {
            IoOp::TmpFile => Err(std::io::Error::from_raw_os_error(libc::EOPNOTSUPP)),
            _ => Ok(()),
        }
    }
}

/// Where O_TMPFILE is refused (injected EOPNOTSUPP), files get named
/// temp files, renamed into place: the temp name is what is visible
/// until the file is whole, and nothing is left after.
#[test]
fn o_tmpfile_refused_falls_back_to_named_temp_files() {
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let t = small_table(d.path(), crate::storage::Hook(Some(Arc::new(NoTmpFile))));
    t.push_entry(0, Some((b"a".to_vec(), 5, 0o640, (3, 0))));
    t.push_entry(1, Some((b"b".to_vec(), 3, 0o644, (3, 0))));
    t.push_entry(2, Some((b"e".to_vec(), 0, 0o644, (3, 0))));
    let ha = send(&t, 0, 0, b"hello");
    assert!(!t.anon_ok.load(Ordering::Relaxed));
    assert_eq!(names(d.path()), vec![".a.ramsys-0000000000000001.part"]);
    let hb = send(&t, 1, 0, b"xyz");
    t.digest_known(0, ha).unwrap();
    t.digest_known(1, hb).unwrap();
    t.digest_known(2, 0).unwrap();
    assert!(t.finish().is_empty());
    assert_eq!(names(d.path()), vec!["a", "b", "e"]);
    assert_eq!(std::fs::read(d.path().join("a")).unwrap(), b"hello");
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(d.path().join("a")).unwrap();
    assert_eq!((md.mode() & 0o777, md.mtime()), (0o640, 3));
}

/// Resume journals name their temp files: with a journal, small files
/// are named too, and a short one is completed by its trailing hole.
#[test]
fn journalled_files_keep_named_temp_files() {
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let mut t = small_table(d.path(), Default::default());
    t.resume = true;
    t.journal_min = 0;
    t.push_entry(0, Some((b"j".to_vec(), 8, 0o644, (0, 0))));
    send(&t, 0, 0, b"1234");
    assert_eq!(names(d.path()), vec![".j.ramsys-0000000000000001.part"]);
    assert_eq!(t.journal_rows(true).len(), 1);
}

/// A journal tick costs the files written since the last one, not a
/// walk of the table (issue 36): of 1,000 journalled files, the one
/// written is the one row, once; the session's end still saves every
/// unfinished temp file.
#[test]
fn journal_ticks_take_only_dirty_files() {
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let mut t = small_table(d.path(), Default::default());
    t.resume = true;
    t.journal_min = 0;
    for id in 0..1000u64 {
        t.push_entry(id, Some((format!("f{id}").into_bytes(), 8, 0o644, (0, 0))));
    }
    send(&t, 0, 0, b"12");
    send(&t, 1, 0, b"34");
    assert!(
        t.dirty.lock().unwrap().len() <= 2,
        "one entry per dirty file"
    );
    let rows: Vec<_> = t.journal_rows(false).into_iter().map(|r| r.dest).collect();
    assert_eq!(rows, vec![b"f0".to_vec(), b"f1".to_vec()]);
    assert!(t.journal_rows(false).is_empty(), "nothing written since");
    send(&t, 0, 2, b"56");
    assert_eq!(t.journal_rows(false).len(), 1);
    assert_eq!(t.journal_rows(true).len(), 2, "temp files not in place");
}

/// Two sessions (two daemons of a stripe) receive the pieces of one big
/// file into one directory: data outside a piece is a protocol error;
/// the file appears under its final name, with its mode and mtime, only
/// when the last piece verified, placed by exactly one of them; a
/// piece with a bad digest leaves no marker.
#[test]
fn pieces_of_one_file_from_two_sessions_meet_and_one_places_it() {
    use std::os::unix::fs::MetadataExt;
    let d = tempfile::tempdir().unwrap();
    let table = |session: u64, pieces: &[u32]| {
        let root = Arc::new(Root::open(d.path(), Confinement::Strict).unwrap());
        let t = FileTable::new(root, session, true, false, Arc::new(Stats::default()));
        for (id, &i) in pieces.iter().enumerate() {
            t.push_entry(id as u64, Some((b"big".to_vec(), 10, 0o640, (7, 8))));
            t.set_piece(id as u64, b"big", 4, i);
        }
        t
    };
    let data = b"0123456789";
    let piece = |t: &FileTable, id: u64, i: usize| {
        let (o, e) = (i * 4, (i * 4 + 4).min(10));
        send(t, id, o as u64, &data[o..e])
    };
    let a = table(1, &[0, 2]);
    let b = table(2, &[1]);
    let bad = Segment {
        file_id: 0,
        offset: 4,
        len: 1,
    };
    assert!(matches!(
        a.write_segment(&bad, b"x", 0),
        Err(WriteError::Protocol(_))
    ));
    let h0 = piece(&a, 0, 0);
    let h2 = piece(&a, 1, 2);
    a.digest_known(0, h0).unwrap();
    // A corrupt piece: failed, no marker, nothing placed.
    a.digest_known(1, h2 ^ 1).unwrap();
    let h1 = piece(&b, 0, 1);
    b.digest_known(0, h1).unwrap();
    assert!(!d.path().join("big").exists());
    assert_eq!(b.files_moved(), 0);
    // The piece again (a resume's session): the last one, it places it.
    let c = table(3, &[2]);
    let h2 = piece(&c, 0, 2);
    c.digest_known(0, h2).unwrap();
    assert!(a.finish().len() == 1 && b.finish().is_empty() && c.finish().is_empty());
    assert_eq!(std::fs::read(d.path().join("big")).unwrap(), data);
    let md = std::fs::metadata(d.path().join("big")).unwrap();
    assert_eq!(
        (md.mode() & 0o7777, md.mtime(), md.mtime_nsec()),
        (0o640, 7, 8)
    );
    assert_eq!(names(d.path()), vec!["big"]);
    // Said in place (Placed, issue 36) by the session that placed it
    // only: the others finished before it was.
    assert_eq!(c.big_files_placed(), vec![b"big".to_vec()]);
    assert!(a.big_files_placed().is_empty() && b.big_files_placed().is_empty());
    // Counted once, where it was placed; bytes where they arrived.
    assert_eq!((b.files_moved(), c.files_moved()), (0, 1));
    assert_eq!((b.bytes_moved(), c.bytes_moved()), (4, 2));
}

/// Local-copy segments make the sink read a file of its own choosing:
/// only a sink whose source runs in the same process takes them.
#[test]
fn local_copy_segments_only_from_an_in_process_source() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("s"), vec![9u8; 3 << 20]).unwrap();
    let root = Arc::new(Root::open(d.path(), Confinement::Strict).unwrap());
    let seg = Segment::copy(0, 0, 3 << 20);
    let hash = ramsys_proto::data::marker_hash(&seg);
    let table = |local| {
        let mut t = FileTable::new(root.clone(), 1, true, false, Arc::new(Stats::default()));
        let mut cfg = StorageCfg::plain(false, crate::storage::IoEngine::Sync);
        cfg.local = local;
        t = t.with_storage(cfg);
        t.push_entry(0, Some((b"d".to_vec(), 3 << 20, 0o644, (0, 0))));
        t
    };
    let network = table(None);
    assert!(matches!(
        network.write_segment(&seg, &[], hash),
        Err(WriteError::Protocol(_))
    ));
    let bridge = Arc::new(crate::storage::local::LocalBridge::default());
    let src = crate::types::file::SourceFile::plain(0, b"s", 3 << 20);
    bridge.publish(
        root.clone(),
        crate::types::file::LiveFiles::whole(Arc::new(vec![src])),
    );
    let local = table(Some(bridge));
    local.write_segment(&seg, &[], hash).unwrap();
    local.digest_known(0, hash).unwrap();
    assert_eq!(
        std::fs::read(d.path().join("d")).unwrap(),
        vec![9u8; 3 << 20]
    );
}

/// A windowed sink's chunks (issue 36): published per batch, found by id
/// through any number of them, dropped whole only up to the Ready mark
/// and once every file in them settled; what the verdict needs of a
/// dropped chunk stays (counts, a failure and its reason), late data and
/// digests for its ids are dropped, a hard link to one of its files knows
/// whether the file was placed.
#[test]
fn settled_chunks_are_dropped_and_leave_the_verdict() {
    let d = tempfile::tempdir().unwrap();
    let root = Arc::new(Root::open(d.path(), Confinement::Strict).unwrap());
    let t = FileTable::new(root, 1, false, false, Arc::new(Stats::default()));
    let add = |ids: std::ops::Range<u64>| {
        for id in ids {
            t.push_entry(id, Some((format!("f{id}").into_bytes(), 1, 0o644, (0, 0))));
        }
    };
    add(0..3);
    t.push_entry(3, None);
    assert_eq!(t.publish(), 4);
    add(4..6);
    assert_eq!(t.publish(), 6);
    add(6..8);
    assert!(t.get(7).is_some(), "a slot is found before it is published");
    assert!(t.get(3).is_none(), "not a file");
    for id in [0, 2, 4, 5] {
        t.keep(id, false);
    }
    t.fail_id(1, "gone".into());
    // Only what Ready covered: the chunk of 6..8 stays though settled.
    t.keep(6, false);
    t.keep(7, false);
    t.publish();
    assert_eq!(t.release(6), 6);
    assert!(t.is_released(5) && !t.is_released(6));
    assert!(t.get(0).is_none() && t.get(6).is_some());
    assert_eq!(t.placed(0), Some(true));
    assert_eq!(t.placed(1), Some(false));
    assert_eq!(t.kept(), 6, "0, 2, 4, 5 dropped, 6 and 7 held");
    // Late data and a late digest of a dropped file are dropped.
    let seg = Segment {
        file_id: 2,
        offset: 0,
        len: 1,
    };
    assert!(t.prepare(&seg).unwrap().is_none());
    assert!(t.digest_known(2, 0).is_ok());
    assert!(t.is_settled(2));
    assert_eq!(t.release(8), 8);
    let failed = t.finish();
    assert_eq!(failed, vec![(b"f1".to_vec(), "gone".to_string())]);
}
