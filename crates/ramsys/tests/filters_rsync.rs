//! Filter rules against rsync itself (issue 35): seeded random trees (odd
//! names included: `-f-`, `f\o`, `[x]`, `a*b`, spaces) and random rule sets
//! (wildcards, classes, ranges, escapes, `**`, `***`, anchors, dir-only,
//! negation, every option form, rules files) run through rsync (the oracle) and ramsys,
//! locally, pushed to a daemon and pulled from one, with and without
//! `--delete`; the trees must be the same, entry for entry and byte for
//! byte (every fourth case after a second run too), and again with both
//! ramsys ends in windows of two records (issue 36). Bounded (a fixed number of cases, a few seconds) so CI stays fast;
//! `RAMSYS_FILTER_SEED=N` reruns another seed, and a failure prints the
//! seed, the case and its command line.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::*;

/// Names the trees draw from: rule metacharacters as plain bytes, a name
/// like an option, one with a space, names the patterns reuse.
const NAMES: &[&str] = &[
    "a", "b", "ab", "abc", "foo", "bar", "to", "too", "x.c", "x.o", "-f-", "f\\o", "s p", "[x]",
    "a*b", "q?", "d1", "D2", "new", "keep", "lose", "sub",
];

fn pick<'a, T>(r: &mut Rng, v: &'a [T]) -> &'a T {
    &v[(r.next() % v.len() as u64) as usize]
}

fn chance(r: &mut Rng, pct: u64) -> bool {
    r.next() % 100 < pct
}

/// A random tree under `dir`, at most 3 levels deep.
fn make_tree(r: &mut Rng, dir: &Path, depth: usize) {
    std::fs::create_dir_all(dir).unwrap();
    let n = 1 + r.next() % 5;
    for _ in 0..n {
        let name = *pick(r, NAMES);
        let p = dir.join(name);
        if p.exists() {
            continue;
        }
        if depth < 3 && chance(r, 40) {
            make_tree(r, &p, depth + 1);
        } else {
            let len = (r.next() % 64) as usize;
            std::fs::write(&p, r.bytes(len)).unwrap();
        }
    }
}

/// One component of a pattern: a name, maybe with wildcards, a class, a
/// range or an escape worked in.
fn component(r: &mut Rng) -> String {
    let name = pick(r, NAMES).to_string();
    // Metacharacters in a name are escaped when the pattern is wild, so
    // they stand for themselves.
    let esc = |s: &str| {
        s.chars()
            .map(|c| match c {
                '*' | '?' | '[' | ']' | '\\' => format!("\\{c}"),
                c => c.to_string(),
            })
            .collect::<String>()
    };
    let first = name.chars().next().unwrap();
    let rest: String = name.chars().skip(1).collect();
    match r.next() % 12 {
        0 => "*".into(),
        1 => format!("{}*", esc(&first.to_string())),
        2 => format!("*{}", esc(&rest)),
        3 => format!("?{}", esc(&rest)),
        4 => format!("[{}]{}", esc(&first.to_string()), esc(&rest)),
        5 => format!("[!{}]{}", esc(&first.to_string()), esc(&rest)),
        6 => format!("[a-e]{}", esc(&rest)),
        7 => format!("[[:alpha:][:digit:]]{}", esc(&rest)),
        8 => format!("{}*", esc(&name)),
        // Literal (rsync compares byte for byte when nothing is wild).
        _ => name,
    }
}

/// A random pattern: one or two components joined by `/`, `**` or
/// `/**/`, maybe `***` after, a leading `/`, a trailing `/`.
fn pattern(r: &mut Rng) -> String {
    let mut p = component(r);
    match r.next() % 8 {
        0 => p = format!("{p}/{}", component(r)),
        1 => p = format!("{p}**{}", component(r)),
        2 => p = format!("**/{p}"),
        3 => p = format!("{p}/***"),
        4 => p = format!("{p}/**"),
        5 => p = format!("{p}/**/{}", component(r)),
        _ => {}
    }
    if chance(r, 20) {
        p = format!("/{p}");
    }
    if chance(r, 25) && !p.ends_with("***") {
        p.push('/');
    }
    p
}

/// A random rule in one of the option forms both tools take, and the
/// same rule as a line of a rules file (filter syntax).
fn rule(r: &mut Rng) -> (Vec<String>, String) {
    let p = pattern(r);
    match r.next() % 7 {
        0 | 1 => (vec!["--exclude".into(), p.clone()], format!("- {p}")),
        2 => (vec!["--include".into(), p.clone()], format!("+ {p}")),
        3 => (vec![format!("--exclude={p}")], format!("exclude {p}")),
        4 => (vec!["--filter".into(), format!("- {p}")], format!("-_{p}")),
        5 => (vec!["-f".into(), format!("+ {p}")], format!("include,_{p}")),
        _ => (
            vec!["--filter".into(), format!("-! {p}")],
            format!("-! {p}"),
        ),
    }
}

/// Every entry under `dir`: relative path -> None for a directory, the
/// bytes for a file.
fn tree(dir: &Path) -> BTreeMap<String, Option<Vec<u8>>> {
    let mut m = BTreeMap::new();
    if !dir.exists() {
        return m;
    }
    for p in walk_paths(dir) {
        let rel = p.strip_prefix(dir).unwrap().display().to_string();
        if rel.is_empty() {
            continue;
        }
        let v = if p.is_dir() {
            None
        } else {
            Some(std::fs::read(&p).unwrap())
        };
        m.insert(rel, v);
    }
    m
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    Local,
    Push,
    Pull,
}

/// Run `cases` random cases in `mode`, both ramsys ends in windows of
/// `window` records (RAMSYS_WINDOW_FILES; None: the default); returns how
/// many had a non-empty difference between the source and the result
/// (the rules did work).
fn run(mode: Mode, cases: usize, salt: u64, window: Option<&str>) -> usize {
    let seed: u64 = std::env::var("RAMSYS_FILTER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x35_f117e5);
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let mut c = Command::new(bin());
    c.args(["serve", "--listen", "127.0.0.1:0", "--root"])
        .arg(&root)
        .arg("--key-file")
        .arg(&key)
        .envs(window.map(|w| ("RAMSYS_WINDOW_FILES", w)))
        .stdout(std::process::Stdio::piped());
    let d = TestDaemon::spawn(c, &root);
    let mut filtered = 0;
    for case in 0..cases {
        let mut r =
            Rng(seed ^ (salt << 32) ^ (case as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let c = t.path().join(format!("case{case}"));
        std::fs::create_dir_all(&c).unwrap();
        // The source lives where the mode reads it from.
        let src = match mode {
            Mode::Pull => root.join(format!("src{case}")),
            _ => c.join("src"),
        };
        make_tree(&mut r, &src, 0);
        let mut args: Vec<String> = Vec::new();
        let mut lines = vec!["# rules".to_string(), String::new()];
        for _ in 0..1 + r.next() % 4 {
            let (a, l) = rule(&mut r);
            args.extend(a);
            lines.push(l);
        }
        if chance(&mut r, 20) {
            // The same rules from a file, read by a merge rule.
            let f = c.join("rules");
            std::fs::write(&f, lines.join("\n")).unwrap();
            args = vec!["--filter".into(), format!("merge {}", f.display())];
        }
        // `SRC/` (the root inside SRC) or `SRC` (its parent), and
        // sometimes --delete over a destination that already holds
        // entries of its own.
        let contents = chance(&mut r, 70);
        let delete = chance(&mut r, 30);
        let reference = c.join("ref");
        let dst = match mode {
            Mode::Push => root.join(format!("dst{case}")),
            _ => c.join("dst"),
        };
        if delete {
            // Entries of the destination's own, where the source's tree
            // goes (in SRC's name without the slash), none of them of
            // another type than the source's entry of the same name.
            let junk = c.join("junk");
            make_tree(&mut r, &junk, 1);
            let base = if contents {
                reference.clone()
            } else {
                reference.join(src.file_name().unwrap())
            };
            merge_junk(&junk, &src, &base);
            copy_tree(&reference, &dst);
            args.push("--delete".into());
        }
        let slash = if contents { "/" } else { "" };
        let from = format!("{}{slash}", src.display());
        let o = Command::new("rsync")
            .arg("-r")
            .args(&args)
            .arg(&from)
            .arg(format!("{}/", reference.display()))
            .output()
            .unwrap();
        assert!(o.status.success(), "rsync {args:?}: {}", stderr(&o));
        let (from, to) = match mode {
            Mode::Local => (from, dst.display().to_string()),
            Mode::Push => (from, d.url(&format!("dst{case}"))),
            Mode::Pull => (
                d.url(&format!("src{case}{slash}")),
                dst.display().to_string(),
            ),
        };
        let mut a: Vec<&str> = vec!["sync", "-r"];
        a.extend(args.iter().map(|s| s.as_str()));
        a.extend([from.as_str(), to.as_str()]);
        let what = format!("seed {seed} {mode:?} window {window:?} case {case}: ramsys {a:?}");
        // Every fourth case runs twice: the second run must not change
        // the tree (issue 35: rsync's tree, twice in a row).
        for _ in 0..1 + usize::from(case % 4 == 0) {
            let mut c = Command::new(bin());
            c.args(&a)
                .env("RAMSYS_KEY_FILE", &key)
                .envs(window.map(|w| ("RAMSYS_WINDOW_FILES", w)));
            let o = run_with_timeout(c, std::time::Duration::from_secs(120));
            assert!(o.status.success(), "{what}: {}", stderr(&o));
        }
        let (got, want) = (tree(&dst), tree(&reference));
        let only = |a: &BTreeMap<_, _>, b: &BTreeMap<_, _>| -> Vec<String> {
            a.keys().filter(|k| !b.contains_key(*k)).cloned().collect()
        };
        let differ: Vec<&String> = got
            .keys()
            .filter(|k| want.get(*k).is_some_and(|w| w != &got[*k]))
            .collect();
        assert!(
            got == want,
            "{what}\nonly ramsys: {:?}\nonly rsync: {:?}\ndiffer: {differ:?}",
            only(&got, &want),
            only(&want, &got)
        );
        let whole = tree(&src).len() + usize::from(!contents);
        if !delete && want.len() < whole {
            filtered += 1;
        }
    }
    filtered
}

/// Copy `junk` into `to`, leaving out what has another type in `src`.
fn merge_junk(junk: &Path, src: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(junk).unwrap() {
        let e = e.unwrap();
        let (s, t) = (src.join(e.file_name()), to.join(e.file_name()));
        let src_dir = s.is_dir();
        if e.file_type().unwrap().is_dir() {
            if s.exists() && !src_dir {
                continue;
            }
            merge_junk(&e.path(), &s, &t);
        } else if !src_dir {
            std::fs::copy(e.path(), &t).unwrap();
        }
    }
}

fn copy_tree(from: &Path, to: &Path) {
    let o = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .output()
        .unwrap();
    assert!(o.status.success(), "cp -a: {}", stderr(&o));
}

#[test]
fn random_rules_give_rsyncs_tree_locally() {
    let n = run(Mode::Local, 80, 1, None);
    // The generator must exercise the rules, not just copy everything.
    assert!(n >= 12, "only {n} cases left anything out");
}

#[test]
fn random_rules_give_rsyncs_tree_pushing_to_a_daemon() {
    run(Mode::Push, 30, 2, None);
}

#[test]
fn random_rules_give_rsyncs_tree_pulling_from_a_daemon() {
    run(Mode::Pull, 30, 3, None);
}

/// Windows of two records at both ends (issue 36, docs/SCALE.md
/// "Windows"): every directory of the small trees spans windows, and
/// `--delete` with its excluded (protected) entries still gives rsync's
/// tree.
#[test]
fn random_rules_give_rsyncs_tree_in_windows_of_two() {
    for (mode, cases, salt) in [
        (Mode::Local, 30, 4),
        (Mode::Push, 15, 5),
        (Mode::Pull, 15, 6),
    ] {
        run(mode, cases, salt, Some("2"));
    }
}
