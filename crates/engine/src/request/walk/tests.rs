use super::*;

#[test]
fn dirs_first_ids_ascending_hardlinks_and_symlinks() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path().join("t");
    fs::create_dir_all(r.join("a/b")).unwrap();
    fs::write(r.join("a/f"), b"xyz").unwrap();
    fs::hard_link(r.join("a/f"), r.join("a/b/g")).unwrap();
    std::os::unix::fs::symlink("f", r.join("a/s")).unwrap();
    let (w, entries) = walk(
        d.path(),
        &[Top {
            rel: b"t".to_vec(),
            name: b"t".to_vec(),
        }],
        true,
    );
    assert!(w.failures.is_empty());
    let ids: Vec<u64> = entries.iter().map(|e| e.id).collect();
    assert_eq!(ids, (0..w.entries).collect::<Vec<_>>());
    let first_nondir = entries
        .iter()
        .position(|e| e.kind != EntryKind::Dir)
        .unwrap();
    assert!(entries[first_nondir..]
        .iter()
        .all(|e| e.kind != EntryKind::Dir));
    assert_eq!(first_nondir, 3);
    assert_eq!(w.files.len(), 1);
    assert_eq!(w.total_bytes, 3);
    let hl = entries
        .iter()
        .find(|e| matches!(e.kind, EntryKind::HardLink { .. }))
        .unwrap();
    assert_eq!(
        hl.kind,
        EntryKind::HardLink {
            target_id: w.files[0].id
        }
    );
    assert!(entries.iter().any(|e| e.kind
        == EntryKind::Symlink {
            target: b"f".to_vec()
        }));
}

#[test]
fn streamed_batches_are_the_walk_in_order() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path().join("t");
    for i in 0..5 {
        fs::create_dir_all(r.join(format!("d{i}/e"))).unwrap();
        for j in 0..700 {
            fs::write(r.join(format!("d{i}/f{j}")), b"x").unwrap();
        }
    }
    let tops = [Top {
        rel: b"t".to_vec(),
        name: b"t".to_vec(),
    }];
    let mut batches: Vec<Vec<Entry>> = Vec::new();
    let w = walk_streamed(d.path(), &tops, true, &Filter::all(), &mut |es| {
        batches.push(es.to_vec());
        Ok::<(), ()>(())
    })
    .unwrap();
    // Directories alone first, then batches of at most STREAM_BATCH.
    assert_eq!(batches[0].len(), 11);
    assert!(batches[0].iter().all(|e| e.kind == EntryKind::Dir));
    assert!(batches[1..].iter().all(|b| b.len() <= STREAM_BATCH));
    let all: Vec<Entry> = batches.concat();
    assert_eq!(all.len() as u64, w.entries);
    assert_eq!(w.files.len(), 3500);
    assert_eq!(all, walk(d.path(), &tops, true).1);
    // An emit error stops the scan.
    let mut n = 0;
    let r = walk_streamed(d.path(), &tops, true, &Filter::all(), &mut |_| {
        n += 1;
        if n == 2 {
            Err("peer gone")
        } else {
            Ok(())
        }
    });
    assert_eq!(r.err(), Some("peer gone"));
    assert_eq!(n, 2);
}

#[test]
fn several_tops_list_each_path_once_as_rsync_does() {
    // a/: x (file), y (dir with y/in), z (file), same (file);
    // b/: x (file), y (file), z (dir with z/deep), same (hard link to
    // a/same); the same tops named three times.
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    fs::create_dir_all(a.join("y")).unwrap();
    fs::create_dir_all(b.join("z")).unwrap();
    fs::write(a.join("x"), b"first").unwrap();
    fs::write(b.join("x"), b"second").unwrap();
    fs::write(a.join("y/in"), b"in").unwrap();
    fs::write(b.join("y"), b"file").unwrap();
    fs::write(a.join("z"), b"file").unwrap();
    fs::write(b.join("z/deep"), b"deep").unwrap();
    fs::write(a.join("same"), b"s").unwrap();
    fs::hard_link(a.join("same"), b.join("same")).unwrap();
    let top = |n: &str| Top {
        rel: n.as_bytes().to_vec(),
        name: Vec::new(),
    };
    let (w, entries) = walk(d.path(), &[top("a"), top("b"), top("a"), top("b")], true);
    assert!(w.failures.is_empty(), "{:?}", w.failures);
    let mut paths: Vec<(String, bool)> = entries
        .iter()
        .map(|e| (crate::types::error::show(&e.path), e.kind == EntryKind::Dir))
        .collect();
    paths.sort();
    let want = [
        ("", true),
        ("same", false),
        ("x", false),
        ("y", true),
        ("y/in", false),
        ("z", true),
        ("z/deep", false),
    ];
    let want: Vec<(String, bool)> = want.iter().map(|(p, d)| (p.to_string(), *d)).collect();
    assert_eq!(paths, want);
    // The first x; ids dense and ascending; a second name of an inode
    // listed once is not a hard link to itself.
    let x = w.files.iter().find(|f| &f.rel[..] == b"a/x").unwrap();
    assert_eq!(x.size, 5);
    let ids: Vec<u64> = entries.iter().map(|e| e.id).collect();
    assert_eq!(ids, (0..w.entries).collect::<Vec<_>>());
    assert!(!entries
        .iter()
        .any(|e| matches!(e.kind, EntryKind::HardLink { .. })));
    assert_eq!(w.total_bytes, 5 + 2 + 4 + 1);
}

#[test]
fn missing_and_nonrecursive_reported() {
    let d = tempfile::tempdir().unwrap();
    fs::create_dir(d.path().join("dir")).unwrap();
    let (w, entries) = walk(
        d.path(),
        &[
            Top {
                rel: b"nope".to_vec(),
                name: b"nope".to_vec(),
            },
            Top {
                rel: b"dir".to_vec(),
                name: b"dir".to_vec(),
            },
        ],
        false,
    );
    assert_eq!(w.failures.len(), 2);
    assert!(entries.is_empty());
    assert_eq!(w.entries, 0);
}

/// A source that is not there is vanished (rsync's IOERR_VANISHED: the
/// source still sends ScanFailed with io_error false, and --delete runs);
/// any other error reading the tree is not (IOERR_GENERAL: --delete
/// deletes nothing). The flag comes from the io::Error's kind, not from
/// the reason's text.
#[test]
fn a_missing_top_is_vanished_other_scan_errors_are_not() {
    let d = tempfile::tempdir().unwrap();
    fs::write(d.path().join("f"), b"x").unwrap();
    fs::create_dir_all(d.path().join("t/shut")).unwrap();
    let top = |p: &str| Top {
        rel: p.as_bytes().to_vec(),
        name: p.rsplit('/').next().unwrap().as_bytes().to_vec(),
    };
    let (w, _) = walk(d.path(), &[top("missing"), top("f/under")], true);
    let flags: Vec<(bool, &str)> = w
        .failures
        .iter()
        .map(|f| (f.vanished, f.path.rsplit('/').next().unwrap()))
        .collect();
    assert_eq!(
        flags,
        [(true, "missing"), (false, "under")],
        "{:?}",
        w.failures
    );
    // ENOTDIR says "(os error 20)": not vanished, whatever the text.
    assert!(
        w.failures[1].reason.contains("os error 20"),
        "{:?}",
        w.failures
    );
    // An unreadable directory; root reads it anyway.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        use std::os::unix::fs::PermissionsExt;
        let shut = d.path().join("t/shut");
        fs::set_permissions(&shut, fs::Permissions::from_mode(0o000)).unwrap();
        let (w, _) = walk(d.path(), &[top("t")], true);
        fs::set_permissions(&shut, fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(w.failures.len(), 1, "{:?}", w.failures);
        assert!(!w.failures[0].vanished, "{:?}", w.failures);
        assert!(w.failures[0].reason.starts_with("cannot read directory"));
    }
}

/// A `--files-from` name not there (removed or renamed since it was
/// listed: a watch job's batch) is a vanished path, named by its topmost
/// missing directory; the listed paths that are there are sent
/// (docs/WATCH.md "Vanished paths").
#[test]
fn a_listed_name_not_there_is_vanished() {
    let d = tempfile::tempdir().unwrap();
    fs::create_dir_all(d.path().join("t/e")).unwrap();
    fs::write(d.path().join("t/e/f"), b"x").unwrap();
    fs::write(d.path().join("t/g"), b"y").unwrap();
    let sel = ramsys_proto::control::Selection {
        files: vec![b"t/d/f".to_vec(), b"t/g".to_vec(), b"t/h".to_vec()].into(),
        files_recursive: true,
        ..Default::default()
    };
    // A replication batch's list: vanished. The user's own: a failure
    // that stops --delete (rsync's link_stat error, exit 23).
    for may_vanish in [true, false] {
        let mut filter = Filter::new(&sel).unwrap();
        filter.listed_may_vanish = may_vanish;
        let top = Top {
            rel: b"t".to_vec(),
            name: b"t".to_vec(),
        };
        let mut names = Vec::new();
        let w = walk_streamed(d.path(), &[top], true, &filter, &mut |es: &[Entry]| {
            names.extend(es.iter().map(|e| e.path.clone()));
            Ok::<(), ()>(())
        })
        .unwrap();
        let gone: Vec<(bool, &str)> = w
            .failures
            .iter()
            .map(|f| {
                (
                    f.vanished,
                    f.path.strip_prefix(d.path().to_str().unwrap()).unwrap(),
                )
            })
            .collect();
        let want = [(may_vanish, "/t/d"), (may_vanish, "/t/h")];
        assert_eq!(gone, want, "{:?}", w.failures);
        assert!(names.contains(&b"t/g".to_vec()), "{names:?}");
        assert!(!names.iter().any(|n| n.starts_with(b"t/e")), "{names:?}");
    }
}

/// The directory pass keeps a slot per directory holding something else
/// than directories, not a name per file (issue 36, docs/SCALE.md
/// "Windows" step 2); the second pass reads each such directory again:
/// a name created in between is listed, one removed in between is not a
/// failure, and what the filter leaves out stays out.
#[test]
fn the_directory_pass_keeps_a_slot_per_directory_not_a_name_per_file() {
    let d = tempfile::tempdir().unwrap();
    let t = d.path().join("t");
    fs::create_dir_all(t.join("a/b/c")).unwrap();
    fs::create_dir_all(t.join("e")).unwrap();
    for i in 0..100 {
        fs::write(t.join(format!("a/f{i}")), b"x").unwrap();
    }
    for i in 0..50 {
        fs::write(t.join(format!("a/b/c/g{i}.tmp")), b"y").unwrap();
    }
    std::os::unix::fs::symlink("g1", t.join("a/b/c/s")).unwrap();
    let sel = ramsys_proto::control::Selection {
        rules: vec![b"- *.tmp".to_vec()],
        ..Default::default()
    };
    let filter = Filter::new(&sel).unwrap();
    let tops = [Top {
        rel: b"t".to_vec(),
        name: b"t".to_vec(),
    }];
    let col = Collector::new(0);
    let (dirs, later, failures) = first_pass(d.path(), &tops, true, &filter, &col, &mut || true);
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(dirs.len(), 5);
    // t/a and t/a/b/c: the only directories with other entries.
    assert_eq!(later.items.len(), 2);
    fs::remove_file(t.join("a/f7")).unwrap();
    fs::write(t.join("a/new"), b"z").unwrap();
    let mut listed = Vec::new();
    let mut failures = Vec::new();
    for item in &later.items {
        let Deferred::Dir(i) = item else {
            panic!("a directory's names were kept one by one")
        };
        let dir = &dirs[*i as usize];
        let mut names = DirNames::open(d.path(), dir, &mut failures).unwrap();
        while let Some(p) = names.next(d.path(), dir, &filter, &col, &mut failures) {
            listed.push(String::from_utf8(p.wire).unwrap());
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
    listed.sort();
    let mut want: Vec<String> = (0..100)
        .filter(|&i| i != 7)
        .map(|i| format!("t/a/f{i}"))
        .collect();
    want.push("t/a/new".into());
    want.push("t/a/b/c/s".into());
    want.sort();
    assert_eq!(listed, want);
}

/// A handing walk over `tops`: every record with the number of the batch
/// it went in, and (batch, id) of each directory named done.
type Handed = (Walk, Vec<(usize, Entry)>, Vec<(usize, u64)>);

fn handed(base: &Path, tops: &[Top], batch: usize) -> Handed {
    let (mut records, mut done, mut n) = (Vec::new(), Vec::new(), 0);
    let w: Result<Walk, ()> = walk_handing(
        base,
        tops,
        (true, batch, 0),
        &Filter::all(),
        &mut |es, _, _, d| {
            records.extend(es.iter().map(|e| (n, e.clone())));
            done.extend(d.into_iter().map(|id| (n, id)));
            n += 1;
            Ok(())
        },
    );
    (w.unwrap(), records, done)
}

/// Directories done (docs/PROTOCOL.md "Directories done"): each directory
/// is named once, in the batch of its last entry or later, never before
/// an entry of its own (a hard link or symlink in it included); those
/// holding only directories at once; two tops merged into one wire
/// directory (`a/ b/`) only after both tops' entries in it went.
#[test]
fn each_directory_is_done_once_after_its_last_entry() {
    let d = tempfile::tempdir().unwrap();
    for top in ["a", "b"] {
        let t = d.path().join(top);
        fs::create_dir_all(t.join("x/only/deep")).unwrap();
        for i in 0..30 {
            fs::write(t.join(format!("x/{top}{i}")), b"z").unwrap();
        }
        fs::write(t.join(format!("x/only/deep/{top}")), b"z").unwrap();
        let first = t.join(format!("x/{top}0"));
        fs::hard_link(first, t.join(format!("x/{top}-link"))).unwrap();
        std::os::unix::fs::symlink("x", t.join(format!("{top}-sym"))).unwrap();
    }
    let contents = |p: &str| Top {
        rel: p.as_bytes().to_vec(),
        name: Vec::new(),
    };
    let (w, records, done) = handed(d.path(), &[contents("a"), contents("b")], 7);
    assert!(w.failures.is_empty(), "{:?}", w.failures);
    let dirs: Vec<&Entry> = records
        .iter()
        .map(|(_, e)| e)
        .filter(|e| e.kind == EntryKind::Dir)
        .collect();
    let mut ids: Vec<u64> = done.iter().map(|(_, id)| *id).collect();
    ids.sort();
    assert_eq!(
        ids,
        dirs.iter().map(|e| e.id).collect::<Vec<_>>(),
        "each once"
    );
    for (b, id) in &done {
        let dir = &dirs.iter().find(|e| e.id == *id).unwrap().path;
        let last = records
            .iter()
            .filter(|(_, e)| crate::storage::fsops::split_parent(&e.path).0 == &dir[..])
            .filter(|(_, e)| e.path != *dir)
            .map(|(b, _)| *b)
            .max()
            .unwrap_or(0);
        assert!(
            *b >= last,
            "{} done in batch {b}, its last entry in {last}",
            show(dir)
        );
    }
    // "x/only" holds a directory only: done with the first batch after
    // the directories'.
    let id = dirs.iter().find(|e| e.path == b"x/only").unwrap().id;
    assert_eq!(done.iter().find(|(_, i)| *i == id).unwrap().0, 1);
}

/// After a scan failure no directory is done: an entry not sent must not
/// be deleted at the sink (rsync: "IO error encountered -- skipping file
/// deletion"); those done before it stay done. A failure of the
/// directory pass: none at all.
#[test]
fn no_directory_is_done_after_a_scan_failure() {
    let d = tempfile::tempdir().unwrap();
    let t = d.path().join("t");
    for i in 0..3 {
        fs::create_dir_all(t.join(format!("d{i}"))).unwrap();
        fs::write(t.join(format!("d{i}/f")), b"z").unwrap();
    }
    // A FIFO without --specials: a failure of the second pass, in d1.
    let fifo = std::ffi::CString::new(t.join("d1/p").as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let top = |p: &str| Top {
        rel: p.as_bytes().to_vec(),
        name: p.rsplit('/').next().unwrap().as_bytes().to_vec(),
    };
    let (w, records, done) = handed(d.path(), &[top("t")], 1024);
    assert_eq!(w.failures.len(), 1, "{:?}", w.failures);
    let name = |id: u64| show(&records.iter().find(|(_, e)| e.id == id).unwrap().1.path);
    let mut named: Vec<String> = done.iter().map(|(_, id)| name(*id)).collect();
    named.sort();
    // t/d0 is listed before t/d1 (the first pass's order), t/d2 after.
    let order: Vec<String> = records
        .iter()
        .filter(|(_, e)| e.kind == EntryKind::Dir)
        .map(|(_, e)| show(&e.path))
        .collect();
    // "t" holds directories only: done at once.
    let d1 = order.iter().position(|p| p == "t/d1").unwrap();
    let mut before = order[..d1].to_vec();
    before.sort();
    assert_eq!(named, before, "{order:?}");
    // A failure of the directory pass (a top not there): none done.
    let (w, _, done) = handed(d.path(), &[top("t"), top("missing")], 1024);
    assert_eq!(w.failures.len(), 2);
    assert!(done.is_empty(), "{done:?}");
}

fn show(p: &[u8]) -> String {
    String::from_utf8_lossy(p).into_owned()
}
