//! Selection (issue 20): `--exclude`, `--include`, `--exclude-from`,
//! `--files-from`, `--min-size`, `--max-size` give the tree rsync gives
//! with the same flags, for local, daemon-push and daemon-pull endpoints
//! (ssh: tests/ssh.rs), run twice; `sync --delete` leaves excluded
//! destination files alone; bad patterns and unsafe combinations are one
//! line and a non-zero exit before any data moves.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Local,
    Push,
    Pull,
}

/// A tree with the shapes the rules tell apart: names at several depths,
/// a directory and a file of the same name pattern, sizes on both sides
/// of 1 KiB.
fn make_tree(src: &Path) {
    for d in ["a/b", "build/sub", "logs", "docs/build"] {
        std::fs::create_dir_all(src.join(d)).unwrap();
    }
    let files: &[(&str, usize)] = &[
        ("a/x.c", 10),
        ("a/x.o", 10),
        ("a/b/y.c", 2000),
        ("a/b/y.h", 5),
        ("build/out", 3000),
        ("build/sub/z.c", 7),
        ("logs/l.log", 1),
        ("docs/build", 4), // a file named like the excluded directory
        ("docs/build/README", 4),
        ("top.txt", 1500),
        ("big.bin", 70_000),
    ];
    let mut r = Rng(7);
    for (p, n) in files {
        let p = src.join(p);
        if p.is_dir() {
            continue;
        }
        std::fs::write(p, r.bytes(*n)).unwrap();
    }
}

fn rsync(args: &[&str], from: &Path, to: &Path) {
    let o = Command::new("rsync")
        .args(["-r", "-t"])
        .args(args)
        .arg(from)
        .arg(to)
        .output()
        .unwrap();
    assert!(o.status.success(), "rsync {args:?}: {}", stderr(&o));
}

/// Every path under `dir`, relative, with '/' after directories.
fn listing(dir: &Path) -> Vec<String> {
    fn go(base: &Path, d: &Path, out: &mut Vec<String>) {
        let mut es: Vec<_> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap()).collect();
        es.sort_by_key(|e| e.file_name());
        for e in es {
            let p = e.path();
            let rel = p.strip_prefix(base).unwrap().display().to_string();
            if e.file_type().unwrap().is_dir() {
                out.push(format!("{rel}/"));
                go(base, &p, out);
            } else {
                out.push(rel);
            }
        }
    }
    let mut out = Vec::new();
    go(dir, dir, &mut out);
    out
}

struct Setup {
    _t: tempfile::TempDir,
    key: PathBuf,
    _d: TestDaemon,
    /// (source argument without a trailing slash, its directory)
    src: (String, PathBuf),
    /// (destination argument, its directory)
    dst: (String, PathBuf),
    /// Where rsync's reference copy goes.
    reference: PathBuf,
    plain_src: PathBuf,
}

fn setup(kind: Kind) -> Setup {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = TestDaemon::start(&root, &key);
    let local_src = t.path().join("src");
    let local_dst = t.path().join("dst");
    let (src, dst) = match kind {
        Kind::Local => (
            (local_src.display().to_string(), local_src),
            (local_dst.display().to_string(), local_dst),
        ),
        Kind::Push => (
            (local_src.display().to_string(), local_src),
            (d.url("dst"), root.join("dst")),
        ),
        Kind::Pull => (
            (d.url("src"), root.join("src")),
            (local_dst.display().to_string(), local_dst),
        ),
    };
    make_tree(&src.1);
    Setup {
        reference: t.path().join("ref"),
        plain_src: src.1.clone(),
        key,
        _d: d,
        src,
        dst,
        _t: t,
    }
}

/// `ramsys sync -r FLAGS SRC/ DST` twice, and rsync the same way: the same
/// tree, and the second run moves nothing.
fn sync_like_rsync(kind: Kind, flags: &[&str]) {
    let s = setup(kind);
    let from = format!("{}/", s.src.0);
    let mut args = vec!["sync", "-r", "--json"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&[&from, &s.dst.0]);
    for run in 0..2 {
        let o = ramsys(&s.key, &args);
        assert_ok(&o);
        if run == 1 {
            let v = summary(&o);
            assert_eq!(v["files"], 0, "{kind:?} {flags:?}: run 2 moved files: {v}");
        }
    }
    rsync(flags, &s.plain_src.join(""), &s.reference);
    let (got, want) = (listing(&s.dst.1), listing(&s.reference));
    assert_eq!(got, want, "{kind:?} {flags:?}");
    assert!(!want.is_empty());
}

const RULE_SETS: &[&[&str]] = &[
    // Unanchored names at any depth; a directory-only rule that leaves
    // the file docs/build alone... but not the directory docs/build.
    &["--exclude", "*.o", "--exclude", "build/"],
    // The include-then-exclude idiom: only .c files, directories kept.
    &["--include", "*/", "--include", "*.c", "--exclude", "*"],
    // Anchored and `**`.
    &["--exclude", "/a/b", "--exclude", "**/sub/*.c"],
    // The other order: the exclude wins.
    &["--exclude", "*.c", "--include", "a/x.c"],
    // Sizes.
    &["--min-size", "1K", "--max-size", "4K"],
    // Issue 35: an anchored directory rule with `SRC/` (nothing of it
    // lands, not even an empty directory); `**` inside a name; `***`; a
    // pattern that starts with `-`; --filter forms.
    &["--exclude", "/build/"],
    &[
        "--exclude",
        "a**c",
        "--exclude",
        "docs/***",
        "--exclude",
        "-x-",
    ],
    &[
        "--filter",
        "- *.o",
        "-f",
        "exclude,! */",
        "--filter",
        "+ *.c",
    ],
    // An excluded directory is not descended: the include of a file in
    // it never sees the file.
    &["--include", "b/y.c", "--exclude", "/a/b/"],
];

/// `--exclude /src/build/` with `SRC` (no slash: the transfer root is
/// SRC's parent, so the rule anchors with SRC's name), in every mode, as
/// rsync.
#[test]
fn anchors_start_at_the_parent_of_a_source_without_slash() {
    for kind in [Kind::Local, Kind::Push, Kind::Pull] {
        let s = setup(kind);
        let flags = ["--exclude", "/src/build/", "--exclude", "/src/a/b/"];
        let mut args = vec!["sync", "-r"];
        args.extend_from_slice(&flags);
        args.extend_from_slice(&[&s.src.0, &s.dst.0]);
        for _ in 0..2 {
            assert_ok(&ramsys(&s.key, &args));
        }
        rsync(&flags, &s.plain_src, &s.reference);
        let got = listing(&s.dst.1);
        assert_eq!(got, listing(&s.reference), "{kind:?}");
        assert!(got.contains(&"src/docs/build/".into()), "{kind:?}: {got:?}");
        assert!(!got.iter().any(|p| p.starts_with("src/build")), "{kind:?}");
    }
}

#[test]
fn rules_give_rsyncs_tree_locally() {
    for r in RULE_SETS {
        sync_like_rsync(Kind::Local, r);
    }
}

#[test]
fn rules_give_rsyncs_tree_pushing_to_a_daemon() {
    for r in RULE_SETS {
        sync_like_rsync(Kind::Push, r);
    }
}

#[test]
fn rules_give_rsyncs_tree_pulling_from_a_daemon() {
    for r in RULE_SETS {
        sync_like_rsync(Kind::Pull, r);
    }
}

#[test]
fn exclude_from_and_files_from_read_files() {
    for kind in [Kind::Local, Kind::Push, Kind::Pull] {
        let s = setup(kind);
        let dir = s.reference.parent().unwrap().to_path_buf();
        let ex = dir.join("ex");
        std::fs::write(&ex, "# comment\n+ *.c\n- a/**\n\nlogs/\n").unwrap();
        let list = dir.join("list");
        std::fs::write(&list, "a/b/y.c\n./top.txt\nbuild\n").unwrap();
        let (ex, list) = (ex.display().to_string(), list.display().to_string());
        for (flags, rflags, recursive) in [
            (
                vec!["--exclude-from", &ex],
                vec!["--exclude-from", &ex],
                true,
            ),
            (
                vec!["--files-from", &list],
                vec!["--files-from", &list],
                false,
            ),
            (
                vec!["--files-from", &list],
                vec!["--files-from", &list],
                true,
            ),
        ] {
            let _ = std::fs::remove_dir_all(&s.dst.1);
            let _ = std::fs::remove_dir_all(&s.reference);
            // cp for --files-from (its sources are contents, so a second
            // run lands in the same place); sync for the rest (cp SRC/
            // into an existing DST nests, as cp does).
            let files_from = flags[0] == "--files-from";
            let mut args = vec![if files_from { "cp" } else { "sync" }];
            if recursive {
                args.push("-r");
            }
            args.extend_from_slice(&flags);
            // --files-from sends SRC as contents whatever its spelling
            // (rsync's rule).
            let from = format!("{}/", s.src.0);
            let from = if files_from { &s.src.0 } else { &from };
            args.extend_from_slice(&[from, &s.dst.0]);
            for _ in 0..2 {
                assert_ok(&ramsys(&s.key, &args));
            }
            let mut r = rflags.clone();
            if !recursive {
                // rsync -r is given by rsync() itself; --files-from with
                // no -r is rsync's --no-r.
                r.push("--no-r");
            }
            rsync(&r, &s.plain_src.join(""), &s.reference);
            assert_eq!(
                listing(&s.dst.1),
                listing(&s.reference),
                "{kind:?} {flags:?} -r {recursive}"
            );
        }
    }
}

#[test]
fn delete_leaves_excluded_destination_files() {
    for kind in [Kind::Local, Kind::Push] {
        let s = setup(kind);
        let from = format!("{}/", s.src.0);
        let sync = |extra: &[&str]| {
            let mut a = vec!["sync", "-r", "--json", "--exclude", "*.o"];
            a.extend_from_slice(extra);
            a.extend_from_slice(&[&from, &s.dst.0]);
            let o = ramsys(&s.key, &a);
            assert_ok(&o);
            summary(&o)
        };
        sync(&[]);
        // The destination's own *.o and a file the source no longer has.
        std::fs::write(s.dst.1.join("a/mine.o"), b"keep").unwrap();
        std::fs::write(s.dst.1.join("a/stale.c"), b"go").unwrap();
        std::fs::create_dir(s.dst.1.join("objs.o")).unwrap();
        let v = sync(&["--delete"]);
        assert_eq!(v["deleted"], 1, "{kind:?}: {v}");
        assert!(s.dst.1.join("a/mine.o").exists(), "{kind:?}");
        assert!(s.dst.1.join("objs.o").is_dir(), "{kind:?}");
        assert!(!s.dst.1.join("a/stale.c").exists(), "{kind:?}");
        assert!(!s.dst.1.join("a/x.o").exists(), "{kind:?}");
    }
}

#[test]
fn bad_selections_are_one_line_before_any_data() {
    let s = setup(Kind::Push);
    let from = format!("{}/", s.src.0);
    for (flags, says) in [
        (vec!["--exclude", "a["], "never closed"),
        (vec!["--exclude-from", "/nonexistent/x"], "--exclude-from"),
        (vec!["--files-from", "/nonexistent/x"], "--files-from"),
        (vec!["--delete", "--max-size", "1K"], "--max-size"),
        (vec!["--max-size", "0"], "--max-size"),
    ] {
        let mut a = vec!["sync", "-r"];
        a.extend_from_slice(&flags);
        a.extend_from_slice(&[&from, &s.dst.0]);
        let o = ramsys(&s.key, &a);
        let err = stderr(&o);
        assert!(!o.status.success(), "{flags:?} succeeded");
        assert_eq!(err.trim().lines().count(), 1, "{flags:?}: {err}");
        assert!(err.contains(says), "{flags:?}: {err}");
        assert!(!s.dst.1.exists(), "{flags:?} wrote the destination");
    }
}

/// A `--files-from` list longer than a control frame (1 MiB) travels ahead
/// of the request in chunks (issue 36): a pull and a `sync --delete` push
/// of 2,400 listed paths of ~530 bytes (1.3 MB of list) give rsync's tree,
/// and the second sync moves nothing.
#[test]
fn a_files_from_list_longer_than_a_frame() {
    for kind in [Kind::Pull, Kind::Push] {
        let s = setup(kind);
        let long = "d".repeat(250);
        let mut list = String::new();
        for i in 0..2400 {
            let dir = format!("long/{long}{}/{long}", i % 40);
            std::fs::create_dir_all(s.src.1.join(&dir)).unwrap();
            let p = format!("{dir}/f{i}");
            std::fs::write(s.src.1.join(&p), i.to_string()).unwrap();
            list.push_str(&p);
            list.push('\n');
        }
        // Not listed: stays behind.
        std::fs::write(s.src.1.join("long/unlisted"), b"x").unwrap();
        assert!(list.len() > 1 << 20);
        let file = s.reference.parent().unwrap().join("biglist");
        std::fs::write(&file, &list).unwrap();
        let file = file.display().to_string();
        let from = format!("{}/", s.src.0);
        let args: Vec<&str> = match kind {
            Kind::Pull => vec!["cp", "--files-from", &file, &from, &s.dst.0],
            _ => vec![
                "sync",
                "--delete",
                "--json",
                "--files-from",
                &file,
                &from,
                &s.dst.0,
            ],
        };
        assert_ok(&ramsys(&s.key, &args));
        if matches!(kind, Kind::Push) {
            let o = ramsys(&s.key, &args);
            assert_ok(&o);
            assert_eq!(summary(&o)["files"], 0, "second sync moved files");
        }
        rsync(
            &["--files-from", &file, "--no-r"],
            &s.plain_src.join(""),
            &s.reference,
        );
        assert_eq!(listing(&s.dst.1), listing(&s.reference), "{kind:?}");
        assert!(!s.dst.1.join("long/unlisted").exists());
    }
}

/// A `--files-from` path that is not there is a failure, as rsync's
/// `link_stat ... failed` (exit 23): named in one line, the rest copied,
/// a non-zero exit, and `--delete` deletes nothing after it (rsync's
/// IOERR_GENERAL). Locally, pushed and pulled.
#[test]
fn a_listed_path_that_is_not_there_fails_like_rsync() {
    for kind in [Kind::Local, Kind::Push, Kind::Pull] {
        let s = setup(kind);
        let file = s.reference.parent().unwrap().join("list");
        std::fs::write(&file, "a/x.c\na/nope.c\nno/such/file\n").unwrap();
        let file = file.display().to_string();
        let from = format!("{}/", s.src.0);
        // DST holds an entry the list does not name: --delete may remove
        // it only when nothing failed.
        let extra = s.dst.1.join("a/extra");
        std::fs::create_dir_all(extra.parent().unwrap()).unwrap();
        std::fs::write(&extra, b"keep").unwrap();
        let args = ["sync", "--delete", "--files-from", &file, &from, &s.dst.0];
        let o = ramsys(&s.key, &args);
        assert!(
            !o.status.success(),
            "{kind:?}: a missing listed path passed"
        );
        let err = stderr(&o);
        assert!(
            err.contains("a/nope.c") && err.contains("No such file"),
            "{kind:?}: {err}"
        );
        assert!(
            err.contains("no/such") || err.contains("/no:"),
            "{kind:?}: {err}"
        );
        assert!(s.dst.1.join("a/x.c").is_file(), "{kind:?}: the listed file");
        assert!(extra.is_file(), "{kind:?}: --delete ran after a failure");
    }
}

/// `--files-from` leaves DST's own mode and mtime unless the list names
/// `.` (issue 36): rsync copies the root's attributes only then, and
/// those of the directories leading to a listed path always (with -t);
/// ramsys set DST's mtime every time. Local, pushed and pulled.
#[test]
fn files_from_keeps_the_destination_root_unless_it_lists_dot() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // DST's own: whether it has the source's mtime (else both tools leave
    // the time their new entries gave it), and its mode; exact below it.
    let mtimes = |d: &Path| -> Vec<(i64, i64, u32)> {
        ["", "a", "a/b"]
            .iter()
            .map(|p| {
                let m = std::fs::metadata(d.join(p)).unwrap();
                match *p {
                    "" => ((m.mtime() == 1_500_000_000).into(), 0, m.mode()),
                    _ => (m.mtime(), m.mtime_nsec(), m.mode()),
                }
            })
            .collect()
    };
    for kind in [Kind::Local, Kind::Push, Kind::Pull] {
        for list in ["a/b/y.c\ntop.txt\n", ".\na/b/y.c\n"] {
            let s = setup(kind);
            set_mtime(&s.plain_src, 1_500_000_000, 0);
            set_mtime(&s.plain_src.join("a"), 1_500_000_100, 0);
            set_mtime(&s.plain_src.join("a/b"), 1_500_000_200, 0);
            let file = s.reference.parent().unwrap().join("list");
            std::fs::write(&file, list).unwrap();
            let file = file.display().to_string();
            for d in [&s.dst.1, &s.reference] {
                std::fs::create_dir_all(d).unwrap();
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o750)).unwrap();
                set_mtime(d, 1_600_000_000, 0);
            }
            let from = format!("{}/", s.src.0);
            let to = format!("{}/", s.dst.0);
            for _ in 0..2 {
                let o = ramsys(&s.key, &["sync", "--files-from", &file, &from, &to]);
                assert_ok(&o);
            }
            let reference = format!("{}/", s.reference.display());
            rsync(
                &["-lpH", "--files-from", &file],
                &s.plain_src.join(""),
                Path::new(&reference),
            );
            let (got, want) = (mtimes(&s.dst.1), mtimes(&s.reference));
            assert_eq!(got, want, "{kind:?}, list {list:?}");
        }
    }
}
