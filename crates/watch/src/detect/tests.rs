//! Both backends against real file system changes: the changes a job
//! needs come out with paths relative to the tree, nothing from outside
//! it, and a queue that overflowed says so.

use std::path::Path;
use std::time::{Duration, Instant};

use super::*;

fn collect_until(d: &mut Detector, want: &[Change], out: &mut Vec<Change>) {
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end && !want.iter().all(|w| out.contains(w)) {
        d.read(out, Duration::from_millis(50)).unwrap();
    }
    for w in want {
        assert!(out.contains(w), "{} missed {w:?}; got {out:?}", d.name());
    }
}

fn b(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

fn exercise(want: Backend) {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("tree");
    let outside = t.path().join("outside");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&outside).unwrap();
    let mut d = Detector::open(&root, want).unwrap();
    let mut out = Vec::new();
    let r = |p: &str| root.join(p);
    std::fs::create_dir(r("d")).unwrap();
    // inotify watches d once it has seen it; what is made in d before
    // that is found by the job's scan of the new tree.
    collect_until(
        &mut d,
        &[Change::Created {
            path: b("d"),
            dir: true,
            settled: true,
        }],
        &mut out,
    );
    std::fs::write(r("d/f"), b"hello").unwrap();
    std::fs::write(outside.join("x"), b"not ours").unwrap();
    collect_until(&mut d, &[Change::Closed(b("d/f"))], &mut out);
    std::fs::rename(r("d/f"), r("d/g")).unwrap();
    std::fs::rename(r("d"), r("e")).unwrap();
    std::fs::write(r("e/h"), b"after the move").unwrap();
    std::fs::remove_file(r("e/g")).unwrap();
    std::os::unix::fs::symlink("h", r("e/l")).unwrap();
    collect_until(
        &mut d,
        &[
            Change::Renamed {
                from: b("d/f"),
                to: b("d/g"),
                dir: false,
            },
            Change::Renamed {
                from: b("d"),
                to: b("e"),
                dir: true,
            },
            Change::Closed(b("e/h")),
            Change::Deleted {
                path: b("e/g"),
                dir: false,
            },
            Change::Created {
                path: b("e/l"),
                dir: false,
                settled: true,
            },
        ],
        &mut out,
    );
    // Moved out of the tree: a delete; moved in: a created tree.
    std::fs::rename(r("e"), outside.join("e")).unwrap();
    std::fs::rename(outside.join("e"), r("back")).unwrap();
    collect_until(
        &mut d,
        &[
            Change::Deleted {
                path: b("e"),
                dir: true,
            },
            Change::Created {
                path: b("back"),
                dir: true,
                settled: true,
            },
        ],
        &mut out,
    );
    let stray =
        |c: &Change| format!("{c:?}").contains("not ours") || format!("{c:?}").contains("\"x\"");
    assert!(!out.iter().any(stray), "{out:?}");
    for c in &out {
        if let Change::Closed(p) | Change::Modified(p) = c {
            assert!(!p.starts_with(b"/") && !p.starts_with(b"outside"), "{c:?}");
        }
    }
}

fn overflow(want: Backend) {
    let t = tempfile::tempdir().unwrap();
    let mut d = Detector::open(t.path(), want).unwrap();
    for i in 0..20_000 {
        std::fs::File::create(t.path().join(i.to_string())).unwrap();
    }
    let mut out = Vec::new();
    collect_until(&mut d, &[Change::Overflow], &mut out);
}

fn root() -> bool {
    // SAFETY: plain getter.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn inotify_reports_what_a_job_needs() {
    exercise(Backend::Inotify);
}

#[test]
fn fanotify_reports_what_a_job_needs() {
    if !root() {
        eprintln!("skipped: fanotify needs root");
        return;
    }
    exercise(Backend::Fanotify);
}

#[test]
fn queues_overflow_visibly() {
    overflow(Backend::Inotify);
    if root() {
        overflow(Backend::Fanotify);
    }
}

/// The backlog is empty only once what the kernel queued has been read
/// and applied (docs/WATCH.md "Renames behind a batch"), and a read says
/// whether it found the queue empty. fanotify's queue also holds what the
/// rest of the file system does (other tests): only inotify's is sure to
/// be empty here.
fn backlog(want: Backend) {
    let t = tempfile::tempdir().unwrap();
    let mut d = Detector::open(t.path(), want).unwrap();
    let q = d.backlog().unwrap();
    let ours = want == Backend::Inotify;
    let mut out = Vec::new();
    if ours {
        assert!(d.read(&mut out, Duration::ZERO).unwrap(), "nothing queued");
        assert!(q.empty());
    }
    std::fs::create_dir(t.path().join("d")).unwrap();
    std::fs::rename(t.path().join("d"), t.path().join("e")).unwrap();
    assert!(!q.empty(), "{}: queued", d.name());
    let end = Instant::now() + Duration::from_secs(5);
    while out.len() < 2 && Instant::now() < end {
        let drained = d.read(&mut out, Duration::from_millis(50)).unwrap();
        if ours {
            assert!(drained);
        }
        assert!(!q.empty(), "{}: read, not applied", d.name());
    }
    assert!(out.contains(&Change::Renamed {
        from: b("d"),
        to: b("e"),
        dir: true,
    }));
    d.applied();
    if ours {
        assert!(q.empty(), "applied");
    }
}

#[test]
fn the_backlog_counts_what_is_read_but_not_applied() {
    backlog(Backend::Inotify);
    if root() {
        backlog(Backend::Fanotify);
    }
}

#[test]
fn auto_picks_one_and_says_which() {
    let t = tempfile::tempdir().unwrap();
    let d = Detector::open(Path::new(t.path()), Backend::Auto).unwrap();
    assert!(d.note.contains(d.name()), "{}", d.note);
    assert_eq!("inotify".parse::<Backend>().unwrap(), Backend::Inotify);
    assert!("kqueue".parse::<Backend>().is_err());
}
