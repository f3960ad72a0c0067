//! rsync as the oracle (issue 35): the same command, on the same starting
//! trees, run by rsync and by `ramsys sync`, locally, pushed to a daemon,
//! pulled from a daemon, and pushed and pulled over ssh (rsync to an
//! rsync daemon and over ssh to our own sshd; ramsys to a ramsys daemon
//! and over the same sshd), must leave the same tree: every entry's type,
//! content, mode, mtime, symlink target, hard-link group, owner, device
//! number, xattrs and ACLs (and holes where the scenario says), anywhere
//! in the work directory (so a write through a link to a directory
//! outside the destination shows). Both tools must agree on success. A
//! second ramsys run must change nothing at all (no inode, no ctime) and
//! move no data. Most scenarios run again locally, pushed and pulled with
//! both ramsys ends in windows of two records (issue 36, docs/SCALE.md
//! "Windows"): their small trees then cross window boundaries everywhere.
//!
//! The scenarios re-express those of rsync's own testsuite
//! (RsyncProject/rsync, testsuite/*_test.py, named in each) for every
//! feature ramsys has: trailing slashes, `--delete` and its scope, `-u`,
//! `--ignore-existing`, hard links, symlinks and unsafe links, devices,
//! sparse files, xattrs, ACLs, owners, modes, deep paths, missing parents,
//! several sources, and the cases issue 35 found: directory mtimes after
//! `--delete`, duplicate sources, a trailing slash on a missing DST, a
//! symlink in DST where the source has a directory, a daemon path through
//! a symlink inside its root.
//!
//! Needs root (an rsync daemon that can chroot and keep owners), rsync,
//! cp and sshd (scripts/install-deps.sh); skips with the reason printed
//! otherwise. The ssh modes are skipped where no sshd is installed.
//!
//! (Over 800 lines: every file under tests/ is a test binary of its own
//! that links the whole engine, so one feature's tests stay in one file;
//! shared helpers live in tests/common.)

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::oracle::{differences, have, is_root, touched, tree_of, Look, RsyncDaemon};
use common::sshd::Sshd;
use common::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Local,
    /// Local sources into a daemon (ramsys:// and rsync://).
    Push,
    /// Daemon sources into a local destination.
    Pull,
    /// Local sources to HOST:PATH.
    SshPush,
    /// HOST:PATH sources into a local destination.
    SshPull,
}

const ALL: &[Mode] = &[
    Mode::Local,
    Mode::Push,
    Mode::Pull,
    Mode::SshPush,
    Mode::SshPull,
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tool {
    Ramsys,
    Rsync,
}

struct Scenario {
    name: &'static str,
    /// The rsync testsuite test it re-expresses.
    from: &'static str,
    /// Builds the work directory (sources, and DST as it is before).
    setup: fn(&Path),
    /// `ramsys sync` options.
    ramsys: &'static [&'static str],
    /// rsync's options for the same thing (ramsys always keeps symlinks,
    /// modes, mtimes and hard links: rsync's -lptH).
    rsync: &'static [&'static str],
    /// Sources and destination, relative to the work directory.
    srcs: &'static [&'static str],
    dst: &'static str,
    modes: &'static [Mode],
    /// Directories whose mtime is not compared: both tools change them as
    /// a side effect, at different moments (DST's parent, a new DST no
    /// source directory stands for). The work directory always.
    loose: &'static [&'static str],
    look: Look,
    /// Applied to both trees after the first run; both run again.
    between: Option<fn(&Path)>,
    /// Both tools fail (and must both fail, leaving the same tree).
    fails: bool,
    /// A check of ramsys's first summary.
    summary: Option<fn(&serde_json::Value)>,
    /// A line ramsys's first run prints on stderr (a deliberate difference
    /// from rsync says so at run time).
    stderr_has: Option<&'static str>,
    /// Needs root beyond the lab's own needs (devices, owners).
    root: bool,
    /// A dry run (rsync with `--out-format=%n`): ramsys's first run names
    /// in `would_send` / `would_delete` what rsync's names (directories
    /// aside: ramsys lists no directory).
    dry_names: bool,
    /// rsync runs with `--stats` too: ramsys's first `deleted` is its
    /// "Number of deleted files".
    stats: bool,
    /// Also run locally, pushed and pulled in windows of WINDOW records
    /// at both ends (issue 36): a small tree then spans many windows.
    windowed: bool,
}

const BASE: Scenario = Scenario {
    name: "",
    from: "",
    setup: |_| {},
    ramsys: &["-r"],
    rsync: &["-rlptH"],
    srcs: &["src/"],
    dst: "dst/",
    modes: ALL,
    loose: &[],
    look: Look { holes: false },
    between: None,
    fails: false,
    summary: None,
    stderr_has: None,
    root: false,
    dry_names: false,
    stats: false,
    windowed: false,
};

/// The window (RAMSYS_WINDOW_FILES) of `Scenario::windowed` runs: two
/// records, so every directory of a scenario's tree spans windows
/// (docs/SCALE.md "Windows").
const WINDOW: &str = "2";

/// A daemon of each kind over one base directory, and an sshd.
struct Lab {
    base: tempfile::TempDir,
    key: PathBuf,
    _keys: tempfile::TempDir,
    ramsysd: TestDaemon,
    rsyncd: RsyncDaemon,
    sshd: Option<Sshd>,
    /// RAMSYS_WINDOW_FILES for both ramsys ends (None: the default).
    window: Option<&'static str>,
}

impl Lab {
    /// None (the reason printed) where this machine cannot run it.
    fn new(window: Option<&'static str>) -> Option<Lab> {
        if !is_root() {
            eprintln!("skipping: not root (the rsync daemon chroots and keeps owners)");
            return None;
        }
        for c in ["rsync", "cp", "mknod", "setfacl"] {
            if !have(c) {
                eprintln!("skipping: {c} not installed (scripts/install-deps.sh)");
                return None;
            }
        }
        let keys = tempfile::tempdir().unwrap();
        let key = key_file(keys.path());
        let base = tempfile::tempdir().unwrap();
        let mut d = Command::new(bin());
        d.args(["serve", "--listen", "127.0.0.1:0", "--root"])
            .arg(base.path())
            .arg("--key-file")
            .arg(&key)
            .stdout(std::process::Stdio::piped());
        if let Some(w) = window {
            d.env("RAMSYS_WINDOW_FILES", w);
        }
        Some(Lab {
            ramsysd: TestDaemon::spawn(d, base.path()),
            rsyncd: RsyncDaemon::start(base.path()),
            // The windowed runs stay off ssh: the remote end would not
            // get the window.
            sshd: window.is_none().then(Sshd::start).flatten(),
            window,
            key,
            _keys: keys,
            base,
        })
    }

    fn ssh_cmd(&self) -> String {
        let s = self.sshd.as_ref().expect("ssh modes need sshd");
        format!(
            "ssh -p {} -i {} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
             -o BatchMode=yes -o LogLevel=ERROR",
            s.port,
            s.key().display()
        )
    }

    /// Where `p` (relative to the work directory `w`, named `wname` under
    /// the base) is for `tool` in `mode`.
    fn place(&self, m: Mode, tool: Tool, w: &Path, p: &str, src: bool) -> String {
        let wname = w.file_name().unwrap().to_string_lossy();
        let local = format!("{}/{p}", w.display());
        let remote = match (m, src) {
            (Mode::Local, _) | (Mode::Push | Mode::SshPush, true) => return local,
            (Mode::Pull | Mode::SshPull, false) => return local,
            (Mode::SshPush | Mode::SshPull, _) => return format!("127.0.0.1:{local}"),
            _ => format!("{wname}/{p}"),
        };
        match tool {
            Tool::Ramsys => self.ramsysd.url(&remote),
            Tool::Rsync => self.rsyncd.url(&remote),
        }
    }

    fn run_rsync(&self, s: &Scenario, m: Mode, w: &Path) -> Output {
        let mut c = Command::new("rsync");
        c.args(s.rsync);
        if s.stats {
            c.arg("--stats");
        }
        if matches!(m, Mode::SshPush | Mode::SshPull) {
            c.arg("-e").arg(self.ssh_cmd());
        }
        for p in s.srcs {
            c.arg(self.place(m, Tool::Rsync, w, p, true));
        }
        c.arg(self.place(m, Tool::Rsync, w, s.dst, false));
        run_with_timeout(c, Duration::from_secs(120))
    }

    /// One `ramsys sync` run: its output and JSON summary (Null when it
    /// printed none).
    fn run_ramsys(&self, s: &Scenario, m: Mode, w: &Path) -> (Output, serde_json::Value) {
        let mut c = Command::new(bin());
        c.arg("sync").arg("--json").args(s.ramsys);
        c.env("RAMSYS_KEY_FILE", &self.key);
        if let Some(w) = self.window {
            c.env("RAMSYS_WINDOW_FILES", w);
        }
        if matches!(m, Mode::SshPush | Mode::SshPull) {
            c.args(self.sshd.as_ref().unwrap().opts());
        }
        for p in s.srcs {
            c.arg(self.place(m, Tool::Ramsys, w, p, true));
        }
        c.arg(self.place(m, Tool::Ramsys, w, s.dst, false));
        let o = run_with_timeout(c, Duration::from_secs(120));
        let out = String::from_utf8_lossy(&o.stdout);
        let sum = out
            .lines()
            .rev()
            .find(|l| l.contains("\"summary\""))
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or(serde_json::Value::Null);
        (o, sum)
    }

    /// The scenario in one mode; Err: what differs from rsync.
    fn run(&self, s: &Scenario, m: Mode) -> Result<(), String> {
        let tag = format!("{}-{m:?}", s.name).to_lowercase();
        let ours = self.base.path().join(format!("{tag}-ramsys"));
        let theirs = self.base.path().join(format!("{tag}-rsync"));
        std::fs::create_dir(&ours).unwrap();
        (s.setup)(&ours);
        let cp = Command::new("cp")
            .arg("-a")
            .arg(&ours)
            .arg(&theirs)
            .output();
        assert!(cp.unwrap().status.success(), "cp -a {}", ours.display());
        let mut loose: Vec<&str> = vec!["."];
        loose.extend_from_slice(s.loose);
        let win = self
            .window
            .map(|w| format!(", window {w}"))
            .unwrap_or_default();
        let what = |step: &str| format!("{} ({}), {m:?}{win}, {step}", s.name, s.from);
        self.both(s, m, &ours, &theirs, &loose, &what("first run"), true)?;
        if let Some(change) = s.between {
            change(&ours);
            change(&theirs);
            self.both(s, m, &ours, &theirs, &loose, &what("after a change"), false)?;
        }
        // Converged: one more run changes nothing and moves nothing.
        let before = tree_of(&ours, s.look);
        let (o, sum) = self.run_ramsys(s, m, &ours);
        let after = tree_of(&ours, s.look);
        let again = what("run again");
        if o.status.success() == s.fails {
            return Err(format!("{again}: exit {:?}: {}", o.status, stderr(&o)));
        }
        let t = touched(&before, &after);
        if !t.is_empty() {
            return Err(format!("{again}: changed {t:?}"));
        }
        // A dry run's `deleted` is what it would delete.
        let dry = sum["dry_run"] == true;
        let moved = ["files", "bytes", "deleted"].map(|k| match k {
            "deleted" if dry => 0,
            _ => sum[k].as_u64().unwrap_or(0),
        });
        if !s.fails && moved != [0, 0, 0] {
            return Err(format!(
                "{again}: moved files/bytes/deleted {moved:?}: {sum}"
            ));
        }
        Ok(())
    }

    /// rsync and ramsys once each; the same verdict and the same tree.
    #[allow(clippy::too_many_arguments)]
    fn both(
        &self,
        s: &Scenario,
        m: Mode,
        ours: &Path,
        theirs: &Path,
        loose: &[&str],
        what: &str,
        first: bool,
    ) -> Result<(), String> {
        let r = self.run_rsync(s, m, theirs);
        let (o, sum) = self.run_ramsys(s, m, ours);
        let ok = (o.status.success(), r.status.success());
        if ok != (!s.fails, !s.fails) {
            return Err(format!(
                "{what}: success ramsys {} rsync {} (expected {}):\nramsys: {}{}\nrsync: {}",
                ok.0,
                ok.1,
                !s.fails,
                String::from_utf8_lossy(&o.stdout),
                stderr(&o),
                stderr(&r)
            ));
        }
        let d = differences(&tree_of(ours, s.look), &tree_of(theirs, s.look), loose);
        if !d.is_empty() {
            return Err(format!("{what}: trees differ:\n  {}", d.join("\n  ")));
        }
        if let (true, Some(check)) = (first, s.summary) {
            check(&sum);
        }
        if first && s.stats {
            let out = String::from_utf8_lossy(&r.stdout);
            let theirs = out
                .lines()
                .find_map(|l| l.strip_prefix("Number of deleted files: "))
                .and_then(|n| n.split_whitespace().next()?.parse::<u64>().ok());
            if theirs != sum["deleted"].as_u64() {
                return Err(format!(
                    "{what}: deleted {} where rsync --stats says {theirs:?}",
                    sum["deleted"]
                ));
            }
        }
        if first && s.dry_names {
            let (send, delete) = rsync_names(&r.stdout);
            let got = |k: &str| -> Vec<String> {
                let mut v: Vec<String> = (sum[k].as_array().into_iter().flatten())
                    .map(|n| n.as_str().unwrap_or_default().to_string())
                    .collect();
                v.sort();
                v
            };
            let ours = (got("would_send"), got("would_delete"));
            if ours != (send.clone(), delete.clone()) {
                return Err(format!(
                    "{what}: ramsys would send {:?}, delete {:?}; rsync {send:?}, {delete:?}",
                    ours.0, ours.1
                ));
            }
        }
        if let (true, Some(line)) = (first, s.stderr_has) {
            if !stderr(&o).contains(line) {
                return Err(format!("{what}: no {line:?} in {}", stderr(&o)));
            }
        }
        Ok(())
    }
}

/// What `rsync -n --out-format=%n` printed: the names it would send or
/// make and those it would delete, each sorted, directories left out.
fn rsync_names(out: &[u8]) -> (Vec<String>, Vec<String>) {
    let (mut send, mut delete) = (Vec::new(), Vec::new());
    for l in String::from_utf8_lossy(out).lines() {
        match l.strip_prefix("deleting ") {
            Some(p) => delete.push(p.trim_end_matches('/').to_string()),
            None if l.ends_with('/') || l.is_empty() => {}
            None => send.push(l.to_string()),
        }
    }
    send.sort();
    delete.sort();
    (send, delete)
}

/// Run `s` in each of its modes, and windowed ones locally, pushed and
/// pulled in windows of WINDOW records; every difference is reported at
/// once.
fn check(s: Scenario) {
    if s.root && !is_root() {
        eprintln!("skipping {}: needs root", s.name);
        return;
    }
    let mut errors = Vec::new();
    let windows: &[Option<&'static str>] = match s.windowed {
        true => &[None, Some(WINDOW)],
        false => &[None],
    };
    for &window in windows {
        let Some(lab) = Lab::new(window) else { return };
        for &m in s.modes {
            if matches!(m, Mode::SshPush | Mode::SshPull) && lab.sshd.is_none() {
                if window.is_none() {
                    eprintln!("{}: {m:?} skipped (no sshd)", s.name);
                }
                continue;
            }
            if let Err(e) = lab.run(&s, m) {
                errors.push(e);
            }
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n\n"));
}

// ---- building trees ----

fn write(p: &Path, data: &[u8]) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

fn symlink(target: &str, p: &Path) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(target, p).unwrap();
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn sh(cmd: &mut Command) {
    let o = cmd.output().expect("run helper");
    assert!(o.status.success(), "{cmd:?}: {}", stderr(&o));
}

/// Distinct, old mtimes on everything under `w` (children before their
/// directories, so those keep theirs): no two runs tell "now" apart.
fn age(w: &Path) {
    let mut all = walk_paths(w);
    all.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for (i, p) in all.iter().enumerate() {
        set_mtime(
            p,
            1_500_000_000 + i as i64 * 97,
            (i as i64 * 7919) % 1_000_000_000,
        );
    }
}

/// rsync's make_tree(depth 3): f0, d1/f1, d1/d2/f2, d1/d2/d3/f3.
fn make_tree(root: &Path) {
    write(&root.join("f0"), b"file at depth 0\n");
    write(&root.join("d1/f1"), b"file at depth 1\n");
    write(&root.join("d1/d2/f2"), b"file at depth 2\n");
    write(&root.join("d1/d2/d3/f3"), b"file at depth 3\n");
}

/// `src` as make_tree, and `dst` an older copy of it with `extra` in it.
fn tree_and_copy(w: &Path) {
    make_tree(&w.join("src"));
    make_tree(&w.join("dst"));
}

// ---- scenarios ----

#[test]
fn a_varied_tree_into_a_new_destination() {
    check(Scenario {
        name: "varied",
        from: "hands_test.py, variety_test.py",
        setup: |w| {
            make_varied_tree(&w.join("src"), 4096);
            age(w);
        },
        windowed: true,
        ..BASE
    });
}

#[test]
fn trailing_slash_on_the_source_fills_a_new_destination() {
    check(Scenario {
        name: "slash-src",
        from: "trimslash_test.py, relative_test.py",
        setup: |w| {
            make_tree(&w.join("src"));
            age(w);
        },
        dst: "dst",
        ..BASE
    });
}

#[test]
fn no_slash_lands_inside_an_existing_destination() {
    check(Scenario {
        name: "noslash-existing",
        from: "trimslash_test.py, relative_test.py",
        setup: |w| {
            make_tree(&w.join("src"));
            std::fs::create_dir(w.join("dst")).unwrap();
            age(w);
        },
        srcs: &["src"],
        // DST is not part of the transfer: a new entry in it changes its
        // mtime, which neither tool restores.
        loose: &["dst"],
        ..BASE
    });
}

#[test]
fn no_slash_into_a_missing_destination_makes_it() {
    check(Scenario {
        name: "noslash-missing",
        from: "trimslash_test.py, mkpath_test.py",
        setup: |w| {
            make_tree(&w.join("src"));
            age(w);
        },
        srcs: &["src"],
        dst: "dst",
        // DST is made by the run: no source directory stands for it.
        loose: &["dst"],
        ..BASE
    });
}

#[test]
fn one_file_onto_a_missing_name_becomes_it() {
    check(Scenario {
        name: "file-missing",
        from: "hardlinks_test.py (solo copy), mkpath_test.py",
        setup: |w| {
            write(&w.join("file"), b"one file\n");
            age(w);
        },
        srcs: &["file"],
        dst: "newname",
        ..BASE
    });
}

#[test]
fn one_file_onto_a_missing_name_with_a_slash_makes_a_directory() {
    // issue 35: ramsys made a file named newdir.
    check(Scenario {
        name: "file-slash",
        from: "file-to-file-mkpath-dry-run_test.py, mkpath_test.py",
        setup: |w| {
            write(&w.join("file"), b"one file\n");
            std::fs::create_dir(w.join("out")).unwrap();
            age(w);
        },
        srcs: &["file"],
        dst: "out/newdir/",
        loose: &["out", "out/newdir"],
        ..BASE
    });
}

#[test]
fn one_file_into_an_existing_directory() {
    check(Scenario {
        name: "file-into-dir",
        from: "hardlinks_test.py (solo copy)",
        setup: |w| {
            write(&w.join("file"), b"one file\n");
            std::fs::create_dir(w.join("out")).unwrap();
            age(w);
        },
        srcs: &["file"],
        dst: "out/",
        loose: &["out"],
        ..BASE
    });
}

#[test]
fn a_missing_parent_fails_and_creates_nothing() {
    check(Scenario {
        name: "missing-parent",
        from: "mkpath_test.py (without --mkpath)",
        setup: |w| {
            make_tree(&w.join("src"));
            age(w);
        },
        dst: "nope/dst/",
        fails: true,
        ..BASE
    });
}

#[test]
fn delete_removes_extras_at_depth_and_restores_directory_mtimes() {
    // issue 35: the directories --delete removed from kept the deletion
    // time until the next run.
    check(Scenario {
        name: "delete",
        from: "delete_test.py, delete-deep_test.py",
        setup: |w| {
            tree_and_copy(w);
            let d = w.join("dst");
            write(&d.join("remove1"), b"extra\n");
            write(&d.join("extradir/remove3"), b"extra\n");
            write(&d.join("emptydir/subdir/remove4"), b"extra\n");
            write(&d.join("d1/d2/extra/junk"), b"x\n");
            write(&d.join("d1/d2/orphan"), b"y\n");
            symlink("f2", &d.join("d1/d2/link-extra"));
            age(w);
        },
        ramsys: &["-r", "--delete"],
        rsync: &["-rlptH", "--delete"],
        windowed: true,
        ..BASE
    });
}

#[test]
fn delete_stays_inside_the_directories_sent() {
    check(Scenario {
        name: "delete-scope",
        from: "delete-deep_test.py, malicious-sender-delete-scope_test.py",
        setup: |w| {
            tree_and_copy(w);
            write(&w.join("dst/outside-scope"), b"stays\n");
            write(&w.join("dst/d1/d2/inside-scope"), b"goes\n");
            age(w);
        },
        ramsys: &["-r", "--delete"],
        rsync: &["-rlptH", "--delete"],
        srcs: &["src/d1"],
        windowed: true,
        ..BASE
    });
}

#[test]
fn dry_run_with_delete_changes_nothing() {
    check(Scenario {
        name: "dry-run",
        from: "delete_test.py (-n --del), missing_test.py",
        setup: |w| {
            tree_and_copy(w);
            write(&w.join("src/d1/new"), b"new\n");
            write(&w.join("dst/d1/d2/orphan"), b"y\n");
            age(w);
        },
        ramsys: &["-r", "--delete", "-n"],
        rsync: &["-rlptH", "--delete", "-n"],
        // Named from DST in every mode, as rsync -n names them.
        summary: Some(|s| {
            let sent = s["would_send"].as_array().expect("would_send");
            assert!(sent.contains(&"d1/new".into()), "{s}");
            assert_eq!(
                s["would_delete"],
                serde_json::json!(["d1/d2/orphan"]),
                "{s}"
            );
        }),
        windowed: true,
        ..BASE
    });
}

#[test]
fn dry_run_names_links_and_symlinks_as_rsync_does() {
    // issue 36: `sync -n` named one name of a hard-link group and no
    // symlink that replaces a file.
    check(Scenario {
        name: "dry-names",
        from: "hardlinks_test.py, daemon-gzip-download_test.py (-n), itemize_test.py",
        setup: |w| {
            // A new group of three names, one in a new directory.
            write(&w.join("src/g1"), b"group one\n");
            std::fs::hard_link(w.join("src/g1"), w.join("src/g2")).unwrap();
            std::fs::create_dir(w.join("src/sub")).unwrap();
            std::fs::hard_link(w.join("src/g1"), w.join("src/sub/g3")).unwrap();
            // A group DST holds linked (stays), one whose data changed
            // (every name is made again). (Not a group DST holds unlinked:
            // which name leads a group is each tool's walk order.)
            for (g, dst) in [("same", "same"), ("chg", "chg-old")] {
                write(&w.join(format!("src/{g}1")), g.as_bytes());
                std::fs::hard_link(w.join(format!("src/{g}1")), w.join(format!("src/{g}2")))
                    .unwrap();
                write(&w.join(format!("dst/{g}1")), dst.as_bytes());
                std::fs::hard_link(w.join(format!("dst/{g}1")), w.join(format!("dst/{g}2")))
                    .unwrap();
            }
            // Symlinks: over a file, new, the same, another target.
            symlink("t1", &w.join("src/over-file"));
            write(&w.join("dst/over-file"), b"a file\n");
            symlink("t2", &w.join("src/new-link"));
            symlink("t3", &w.join("src/same-link"));
            symlink("t3", &w.join("dst/same-link"));
            symlink("t4", &w.join("src/moved-link"));
            symlink("old", &w.join("dst/moved-link"));
            write(&w.join("src/plain"), b"plain\n");
            write(&w.join("dst/plain"), b"plain\n");
            write(&w.join("dst/orphan"), b"goes\n");
            age(w);
            // DST's copies of unchanged names as the source's.
            for n in ["same1", "plain", "same-link"] {
                use std::os::unix::fs::MetadataExt;
                let m = std::fs::symlink_metadata(w.join("src").join(n)).unwrap();
                set_mtime(&w.join("dst").join(n), m.mtime(), m.mtime_nsec());
            }
        },
        ramsys: &["-r", "-n", "--delete"],
        rsync: &["-rlptH", "-n", "--delete", "--out-format=%n"],
        dry_names: true,
        windowed: true,
        ..BASE
    });
}

#[test]
fn update_keeps_newer_destination_files() {
    check(Scenario {
        name: "update",
        from: "update_test.py",
        setup: |w| {
            tree_and_copy(w);
            write(&w.join("src/d1/d2/d3/f3"), b"new source content\n");
            write(
                &w.join("dst/d1/d2/d3/f3"),
                b"destination is newer - keep me\n",
            );
            write(&w.join("src/d1/f1"), b"newer source\n");
            write(&w.join("dst/d1/f1"), b"older destination\n");
            write(&w.join("src/foo"), b"regular source file\n");
            symlink("/should/not/exist", &w.join("dst/foo"));
            // A hard-link group whose names DST has, newer, as files of
            // its own: both stay (one was relinked to the other).
            write(&w.join("src/hl1"), b"linked source\n");
            std::fs::hard_link(w.join("src/hl1"), w.join("src/hl2")).unwrap();
            write(&w.join("dst/hl1"), b"newer destination 1\n");
            write(&w.join("dst/hl2"), b"newer destination 2\n");
            age(w);
            set_mtime(&w.join("dst/hl1"), 1_700_000_000, 0);
            set_mtime(&w.join("dst/hl2"), 1_700_000_000, 0);
            set_mtime(&w.join("dst/d1/d2/d3/f3"), 1_700_000_000, 0);
            set_mtime(&w.join("dst/d1/f1"), 1_400_000_000, 0);
            set_mtime(&w.join("dst/foo"), 1_700_000_000, 0);
        },
        ramsys: &["-r", "-u"],
        rsync: &["-rlptH", "-u"],
        windowed: true,
        ..BASE
    });
}

#[test]
fn ignore_existing_leaves_what_is_there() {
    check(Scenario {
        name: "ignore-existing",
        from: "delete-deep_test.py (--ignore-existing)",
        setup: |w| {
            make_tree(&w.join("src"));
            write(&w.join("dst/d1/f1"), b"KEEP THIS\n");
            age(w);
        },
        ramsys: &["-r", "--ignore-existing"],
        rsync: &["-rlptH", "--ignore-existing"],
        windowed: true,
        ..BASE
    });
}

#[test]
fn ignore_existing_leaves_links_and_what_is_in_their_place() {
    // rsync's recv_generator skips every existing non-directory under
    // --ignore-existing: a hard link of the source whose names DST has
    // (a file, a directory), a symlink over a file or another symlink.
    // ramsys replaced them (a link onto a directory failed with EPERM
    // and stopped --delete).
    check(Scenario {
        name: "ignore-existing-links",
        from: "generator.c recv_generator (ignore_existing)",
        setup: |w| {
            write(&w.join("src/name1"), b"the source's file\n");
            std::fs::hard_link(w.join("src/name1"), w.join("src/name2")).unwrap();
            symlink("name1", &w.join("src/sym"));
            symlink("name1", &w.join("src/sym2"));
            write(&w.join("src/new"), b"new\n");
            write(&w.join("dst/name1/in"), b"KEEP: a directory\n");
            write(&w.join("dst/name2"), b"KEEP: not a link of name1\n");
            write(
                &w.join("dst/sym"),
                b"KEEP: a file where the source has a link\n",
            );
            symlink("elsewhere", &w.join("dst/sym2"));
            write(&w.join("dst/extra"), b"deleted\n");
            age(w);
        },
        ramsys: &["-r", "--ignore-existing", "--delete"],
        rsync: &["-rlptH", "--ignore-existing", "--delete"],
        windowed: true,
        ..BASE
    });
}

#[test]
fn hard_links_are_kept_and_repaired() {
    check(Scenario {
        name: "hardlinks",
        from: "hardlinks_test.py, hardlinks-deep_test.py",
        setup: |w| {
            let f = w.join("src");
            write(&f.join("name1"), b"This is the file\n");
            std::fs::hard_link(f.join("name1"), f.join("name2")).unwrap();
            std::fs::hard_link(f.join("name2"), f.join("name3")).unwrap();
            write(&f.join("name4"), b"This is the file\n");
            write(&f.join("text"), &Rng(35).bytes(300_000));
            std::fs::create_dir_all(f.join("subdir/down/deep")).unwrap();
            for x in ["a", "b", "c"] {
                write(&f.join(format!("subdir/{x}{x}")), b"");
            }
            std::fs::hard_link(f.join("name1"), f.join("subdir/down/deep/new-file")).unwrap();
            age(w);
        },
        // The destination's name1 grows: its links with it.
        between: Some(|w| {
            let p = w.join("dst/name1");
            let mut data = std::fs::read(&p).unwrap();
            data.extend_from_slice(b"extra extra\n");
            std::fs::write(&p, data).unwrap();
            std::fs::remove_file(w.join("dst/text")).unwrap();
        }),
        windowed: true,
        ..BASE
    });
}

#[test]
fn symlinks_safe_unsafe_absolute_and_dangling_are_copied_as_links() {
    check(Scenario {
        name: "symlinks",
        from: "links_test.py, unsafe-links_test.py, safe-links_test.py",
        setup: |w| {
            let f = w.join("from");
            write(&f.join("safe/files/file1"), b"");
            write(&f.join("safe/files/file2"), b"");
            write(&f.join("unsafe/unsafefile"), b"");
            symlink("../files/file1", &f.join("safe/links/file1"));
            symlink("../files/file2", &f.join("safe/links/file2"));
            symlink("../../unsafe/unsafefile", &f.join("safe/links/unsafefile"));
            symlink("/etc/passwd", &f.join("safe/links/absolute"));
            symlink("nowhere", &f.join("safe/links/dangling"));
            symlink("files", &f.join("safe/dirlink"));
            age(w);
        },
        srcs: &["from/safe/"],
        dst: "to",
        windowed: true,
        ..BASE
    });
}

#[test]
fn a_directory_replaces_a_symlink_in_dst_without_following_it() {
    // issue 35: 'exists and is not a directory' on every run before; the
    // link points at a directory beside DST, which must stay untouched.
    check(Scenario {
        name: "dir-over-link",
        from: "symlink-race-dest_test.py, keep-dirlinks-symlinked-dest_test.py",
        setup: |w| {
            write(&w.join("src/d/a"), b"a\n");
            write(&w.join("src/d/link/f"), b"from the source\n");
            write(&w.join("dst/d/a"), b"a\n");
            write(&w.join("outside/f"), b"behind the link: untouched\n");
            write(&w.join("outside/keep"), b"keep\n");
            symlink("../../outside", &w.join("dst/d/link"));
            age(w);
        },
        windowed: true,
        ..BASE
    });
}

#[test]
fn a_directory_replaces_a_file_in_dst() {
    check(Scenario {
        name: "dir-over-file",
        from: "update_test.py, itemize_test.py",
        setup: |w| {
            write(&w.join("src/x/a"), b"a\n");
            write(&w.join("dst/x"), b"a file in the way\n");
            age(w);
        },
        windowed: true,
        ..BASE
    });
}

#[test]
fn a_file_and_a_link_replace_empty_directories() {
    check(Scenario {
        name: "file-over-empty-dir",
        from: "update_test.py (--force)",
        setup: |w| {
            write(&w.join("src/x"), b"now a regular file\n");
            symlink("x", &w.join("src/l"));
            std::fs::create_dir_all(w.join("dst/x")).unwrap();
            std::fs::create_dir_all(w.join("dst/l")).unwrap();
            age(w);
        },
        // A type change is no deletion: rsync --stats counts none (it
        // was "1 deleted" until issue 36).
        stats: true,
        windowed: true,
        ..BASE
    });
}

#[test]
fn delete_lets_a_file_replace_a_full_directory() {
    check(Scenario {
        name: "file-over-full-dir",
        from: "update_test.py (--force at depth)",
        setup: |w| {
            write(&w.join("src/d1/d2/d3/f3"), b"now a regular file\n");
            write(&w.join("dst/d1/d2/d3/f3/occupant"), b"blocker\n");
            age(w);
        },
        ramsys: &["-r", "--delete"],
        rsync: &["-rlptH", "--delete"],
        // rsync counts what the directory held, not the directory.
        stats: true,
        windowed: true,
        ..BASE
    });
}

#[test]
fn without_delete_a_full_directory_stays_and_both_fail() {
    check(Scenario {
        name: "file-over-full-dir-kept",
        from: "update_test.py (without --force)",
        setup: |w| {
            write(&w.join("src/d1/f3"), b"now a regular file\n");
            write(&w.join("src/d1/other"), b"other\n");
            write(&w.join("dst/d1/f3/occupant"), b"blocker\n");
            age(w);
        },
        fails: true,
        // rsync sets d1's mtime after its failed entry; so does ramsys,
        // at its own moment.
        loose: &["dst/d1"],
        windowed: true,
        ..BASE
    });
}

#[test]
fn a_missing_source_fails_and_delete_still_runs() {
    // A missing source: rsync reports it and exits 23, and, the path
    // having vanished rather than failed to read (IOERR_VANISHED, not
    // IOERR_GENERAL), still deletes. A pull of a missing path from a
    // daemon exited 0 with "copied 0 files". (An unreadable directory
    // stops --delete: failures.rs, as it needs a user other than root.)
    check(Scenario {
        name: "missing-source-delete",
        from: "flist.c send_file_list link_stat (IOERR_VANISHED)",
        setup: |w| {
            write(&w.join("src/kept"), b"sent\n");
            write(&w.join("dst/extra"), b"not in the source, kept\n");
            age(w);
        },
        ramsys: &["-r", "--delete"],
        rsync: &["-rlptH", "--delete"],
        srcs: &["src/", "missing"],
        fails: true,
        summary: Some(|s| {
            assert_eq!(s["deletions_skipped"], false, "{s}");
            let failed = s["failed"].as_array().unwrap();
            assert!(
                failed
                    .iter()
                    .any(|f| f["path"].as_str().unwrap().ends_with("missing")),
                "{s}"
            );
        }),
        windowed: true,
        ..BASE
    });
}

#[test]
fn errors_at_the_destination_do_not_stop_delete() {
    // issue 36: rsync's receiver-side errors (here --ignore-existing
    // keeps a file where the source has a directory, so nothing can be
    // made inside it) exit 23 and still delete, with --delete-after too;
    // only the sender's I/O errors skip deletion ("IO error encountered
    // -- skipping file deletion"; failures.rs
    // an_unreadable_source_directory_stops_delete). ramsys deleted
    // nothing after any error.
    check(Scenario {
        name: "dst-errors-delete",
        from: "generator.c delete_in_dir (IOERR_GENERAL only), delete-deep_test.py",
        setup: |w| {
            write(&w.join("src/d/x"), b"cannot land\n");
            write(&w.join("src/y"), b"new\n");
            write(
                &w.join("dst/d"),
                b"a file where the source has a directory\n",
            );
            write(&w.join("dst/orphan"), b"goes\n");
            age(w);
        },
        ramsys: &["-r", "--ignore-existing", "--delete"],
        rsync: &["-rlptH", "--ignore-existing", "--delete"],
        // rsync puts the source directory's mtime on DST's file it kept
        // in its place (its directory pass at the end); not copied.
        loose: &["dst/d"],
        fails: true,
        summary: Some(|s| {
            assert_eq!(s["deletions_skipped"], false, "{s}");
            assert_eq!(s["deleted"], 1, "{s}");
        }),
        windowed: true,
        ..BASE
    });
}

#[test]
fn one_source_named_ten_times_is_sent_once() {
    // issue 35: ramsys sent the files ten times.
    check(Scenario {
        name: "duplicates",
        from: "duplicates_test.py",
        setup: |w| {
            write(&w.join("src/name1"), b"This is the file\n");
            symlink("name1", &w.join("src/name2"));
            age(w);
        },
        srcs: &[
            "src/", "src/", "src/", "src/", "src/", "src/", "src/", "src/", "src/", "src/",
        ],
        summary: Some(|s| assert_eq!(s["files"], 1, "{s}")),
        ..BASE
    });
}

#[test]
fn several_sources_keep_the_first_name_and_a_directory_over_a_file() {
    // issue 35: the later source won, and a directory against a file
    // failed with 'cannot rename into place: Is a directory'.
    check(Scenario {
        name: "several-sources",
        from: "duplicates_test.py, flist.c flist_sort_and_clean",
        setup: |w| {
            write(&w.join("a/x"), b"first\n");
            write(&w.join("b/x"), b"second, longer\n");
            write(&w.join("a/y/in"), b"a directory in a\n");
            write(&w.join("b/y"), b"a file in b\n");
            write(&w.join("a/z"), b"a file in a\n");
            write(&w.join("b/z/deep"), b"a directory in b\n");
            write(&w.join("a/both/one"), b"1\n");
            write(&w.join("b/both/two"), b"2\n");
            age(w);
            chmod(&w.join("b/both"), 0o700);
        },
        srcs: &["a/", "b/"],
        windowed: true,
        ..BASE
    });
}

#[test]
fn a_seventy_deep_tree() {
    check(Scenario {
        name: "deep-path",
        from: "deep-path_test.py",
        setup: |w| {
            let mut p = w.join("src");
            for i in 0..70 {
                p = p.join(format!("d{i}"));
                write(&p.join("f"), format!("depth {i}\n").as_bytes());
            }
            age(w);
        },
        ..BASE
    });
}

/// Files and directories of every mode, set-ID bits included.
fn modes_tree(w: &Path) {
    for (n, m) in [("m600", 0o600), ("m755", 0o755), ("m444", 0o444)] {
        write(&w.join("src").join(n), n.as_bytes());
        chmod(&w.join("src").join(n), m);
    }
    for (n, m) in [("suid", 0o4755), ("sgid", 0o2755)] {
        write(&w.join("src").join(n), n.as_bytes());
        chmod(&w.join("src").join(n), m);
    }
    write(&w.join("src/ro/f"), b"in a read-only directory\n");
    write(&w.join("src/sticky/f"), b"sticky\n");
    write(&w.join("src/setgid-dir/f"), b"f\n");
    write(&w.join("dst/m600"), b"m600");
    chmod(&w.join("dst/m600"), 0o666);
    age(w);
    chmod(&w.join("src/ro"), 0o555);
    chmod(&w.join("src/sticky"), 0o1777);
    chmod(&w.join("src/setgid-dir"), 0o2755);
}

#[test]
fn modes_and_set_id_bits_with_archive() {
    check(Scenario {
        name: "modes-archive",
        from: "chmod_test.py, chmod-setid_test.py, executability_test.py",
        setup: modes_tree,
        ramsys: &["-a"],
        rsync: &["-aH"],
        root: true,
        windowed: true,
        ..BASE
    });
}

#[test]
fn without_archive_set_id_bits_are_dropped_and_said_so() {
    // A deliberate difference (issue 34; docs/SYNC.md "Set-ID bits"):
    // without -a ramsys keeps no set-user-ID or set-group-ID bit on a
    // file, where rsync -p keeps them: rsync's --chmod=Fug-s is the same
    // rule. Directories keep theirs. The run says so in one line.
    check(Scenario {
        name: "modes",
        from: "chmod_test.py, chmod-setid_test.py",
        setup: modes_tree,
        rsync: &["-rlptH", "--chmod=Fug-s"],
        stderr_has: Some("set-user-ID/set-group-ID bits not kept on 2 files"),
        ..BASE
    });
}

#[test]
fn owners_with_archive() {
    check(Scenario {
        name: "owners",
        from: "chown_test.py, chgrp_test.py",
        setup: |w| {
            write(&w.join("src/nobody"), b"nobody's\n");
            write(&w.join("src/numeric"), b"no name for these ids\n");
            write(&w.join("src/d/f"), b"f\n");
            std::os::unix::fs::chown(w.join("src/nobody"), Some(65534), Some(65534)).unwrap();
            std::os::unix::fs::chown(w.join("src/numeric"), Some(4321), Some(8765)).unwrap();
            std::os::unix::fs::chown(w.join("src/d"), Some(65534), None).unwrap();
            age(w);
        },
        ramsys: &["-a"],
        rsync: &["-aH"],
        root: true,
        ..BASE
    });
}

#[test]
fn devices_fifos_and_sockets() {
    check(Scenario {
        name: "devices",
        from: "devices_test.py",
        setup: |w| {
            std::fs::create_dir_all(w.join("src/dev")).unwrap();
            sh(Command::new("mknod")
                .arg(w.join("src/dev/char"))
                .args(["c", "1", "3"]));
            sh(Command::new("mknod")
                .arg(w.join("src/dev/block"))
                .args(["b", "7", "250"]));
            sh(Command::new("mkfifo").arg(w.join("src/dev/fifo")));
            drop(std::os::unix::net::UnixListener::bind(w.join("src/dev/sock")).unwrap());
            age(w);
        },
        ramsys: &["-a"],
        rsync: &["-aH"],
        root: true,
        ..BASE
    });
}

#[test]
fn a_sparse_file_keeps_its_hole() {
    check(Scenario {
        name: "sparse",
        from: "sparse_test.py",
        setup: |w| {
            let p = w.join("src/d1/d2/d3/holey");
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            let f = std::fs::File::create(&p).unwrap();
            use std::os::unix::fs::FileExt;
            f.write_all_at(b"head", 0).unwrap();
            f.write_all_at(b"tail", (4 << 20) - 4).unwrap();
            age(w);
        },
        rsync: &["-rlptHS"],
        look: Look { holes: true },
        ..BASE
    });
}

#[test]
fn xattrs_on_files_and_directories() {
    check(Scenario {
        name: "xattrs",
        from: "xattrs_test.py, xattrs-hlink_test.py",
        setup: |w| {
            make_tree(&w.join("src"));
            let s = w.join("src");
            xattr::set(s.join("f0"), "user.foo", b"foo").unwrap();
            xattr::set(s.join("f0"), "user.bar", &[0u8, 1, 255]).unwrap();
            xattr::set(s.join("d1"), "user.dir", b"on a directory").unwrap();
            xattr::set(s.join("d1/d2/f2"), "user.empty", b"").unwrap();
            std::fs::hard_link(s.join("f0"), s.join("d1/f0-link")).unwrap();
            // DST has one to keep in sync and one to remove.
            write(&w.join("dst/f0"), b"file at depth 0\n");
            xattr::set(w.join("dst/f0"), "user.stale", b"gone").unwrap();
            age(w);
        },
        ramsys: &["-r", "-X"],
        rsync: &["-rlptHX"],
        windowed: true,
        ..BASE
    });
}

#[test]
fn access_and_default_acls() {
    check(Scenario {
        name: "acls",
        from: "acls_test.py, acls-default_test.py",
        setup: |w| {
            make_tree(&w.join("src"));
            let s = w.join("src");
            sh(Command::new("setfacl")
                .args(["-m", "u:nobody:rw,g:nogroup:r"])
                .arg(s.join("f0")));
            sh(Command::new("setfacl")
                .args(["-d", "-m", "u:nobody:rx,g::r-x"])
                .arg(s.join("d1")));
            sh(Command::new("setfacl")
                .args(["-m", "u:65534:r"])
                .arg(s.join("d1/d2")));
            age(w);
        },
        ramsys: &["-r", "-A"],
        rsync: &["-rlptHA"],
        ..BASE
    });
}

/// `mod/inner` with files, `mod/in-link -> inner` (inside the root) and
/// `mod/out-link -> /etc` (outside it).
fn linked_module(w: &Path) {
    write(&w.join("mod/inner/f"), b"in inner\n");
    write(&w.join("mod/inner/sub/g"), b"deeper\n");
    symlink("inner", &w.join("mod/in-link"));
    symlink("/etc", &w.join("mod/out-link"));
    age(w);
}

#[test]
fn a_source_path_through_a_symlink_inside_the_root_is_followed() {
    // issue 35: through a daemon, 'protocol error: bad path from peer:
    // empty path'. rsync's daemon follows the link.
    check(Scenario {
        name: "in-link",
        from: "daemon-subdir-climb-symlink_test.py, daemon-symlink-escape-matrix_test.py",
        setup: linked_module,
        srcs: &["mod/in-link/"],
        ..BASE
    });
}

#[test]
fn a_daemon_source_path_leading_out_of_the_root_is_refused() {
    check(Scenario {
        name: "out-link",
        from: "daemon-symlink-escape-matrix_test.py",
        setup: linked_module,
        srcs: &["mod/out-link/"],
        modes: &[Mode::Pull],
        fails: true,
        ..BASE
    });
}
