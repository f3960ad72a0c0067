//! What the source's scan sends: rsync's include/exclude rules and size
//! limits (issue 20), applied while walking, so an excluded directory is
//! never descended and its files never stat'ed.
//!
//! rsync's rules (issue 35; rsync(1) "INCLUDE/EXCLUDE PATTERN RULES" and
//! its `exclude.c`), on the path from the transfer root (for `SRC` that is
//! SRC's parent, so `SRC/x`; for `SRC/` it is SRC itself, so `x`): rules
//! are tried in order and the first that matches decides (none = sent); a
//! trailing `/` matches directories only; a leading `/` anchors the
//! pattern at the transfer root; a pattern with neither `/` nor `**`
//! matches the last component; one with a `/` but no `**` matches the
//! last as many components as it has; one with `**` (not leading) is
//! tried at the start and after every `/`; a leading `**` matches from the
//! start, with `**/` also taking the top level; `dir/***` matches the
//! directory itself and everything in it. A pattern with none of `*?[` is
//! compared byte for byte (so `f\oo` is literal there, as in rsync);
//! otherwise it is rsync's wildmatch (request::wildmatch). An excluded
//! directory is not descended (walk), so nothing below it is sent even
//! if an include matches it.
//!
//! `--files-from` (rsync's): only the listed paths, relative to the
//! source directory, and the directories leading to them; below a listed
//! directory only with `-r`. The agent sends such sources as contents
//! (`SRC/`), so listed paths are paths from the transfer root.
//!
//! The same filter protects excluded destination entries from sync's
//! `--delete` (roles::sink::delete), as rsync's receiver does.

use ramsys_proto::control::{PathList, Selection};

use super::rules::{RuleSpec, Side};
use super::wildmatch::{Pattern, Start};

/// A compiled [`Selection`].
#[derive(Debug, Default)]
pub struct Filter {
    rules: Vec<Rule>,
    min_size: u64,
    max_size: u64,
    /// `--files-from`: the listed paths, and the directories above them.
    files: Option<FilesFrom>,
    /// A striped push's pieces of big files (TransferOptions::pieces).
    pub pieces: Option<std::sync::Arc<super::pieces::Pieces>>,
    /// A listed path that is not there is skipped, not a failure
    /// (TransferOptions::listed_may_vanish).
    pub listed_may_vanish: bool,
}

/// `--files-from`, compiled: the listed paths and the directories above
/// them, each a [`SortedPaths`] (issue 36: a list of millions of lines costs
/// its bytes and 4 more a path, where hash sets of `Vec<u8>` cost ~250 B
/// a line across the three tables this replaced, at each end that
/// compiles the selection).
#[derive(Debug)]
struct FilesFrom {
    listed: SortedPaths,
    parents: SortedPaths,
    recursive: bool,
    /// The list names the transfer root itself (`.`): only then are its
    /// attributes copied, as rsync's are.
    root: bool,
}

impl FilesFrom {
    fn new(files: &PathList, recursive: bool) -> Result<FilesFrom, String> {
        // Every line normalized into one buffer; a parent is a prefix of
        // a line there, so both lists start as spans of the same bytes.
        let mut bytes = Vec::with_capacity(files.byte_len());
        let (mut listed, mut parents) = (Vec::with_capacity(files.len()), Vec::new());
        let mut root = false;
        for f in files.iter() {
            let start = bytes.len();
            normalize_into(&mut bytes, f);
            if bytes.len() == start {
                root |= !f.is_empty();
                continue;
            }
            let end = u32::try_from(bytes.len())
                .map_err(|_| "--files-from: the list is over 4 GiB".to_string())?;
            let start = start as u32;
            for (i, &b) in bytes[start as usize..].iter().enumerate() {
                if b == b'/' {
                    parents.push((start, start + i as u32));
                }
            }
            listed.push((start, end));
        }
        Ok(FilesFrom {
            listed: SortedPaths::new(&bytes, listed),
            parents: SortedPaths::new(&bytes, parents),
            recursive,
            root,
        })
    }

    fn selects(&self, path: &[u8]) -> bool {
        if self.listed.contains(path) || self.parents.contains(path) {
            return true;
        }
        // Below a listed directory: only with -r.
        self.recursive
            && path
                .iter()
                .enumerate()
                .any(|(i, &b)| b == b'/' && self.listed.contains(&path[..i]))
    }

    /// The names directly in `dir` (a path from the root, "" the root)
    /// that are listed or lead to a listed path, sorted. Paths beginning
    /// with `dir/` are one run of each sorted list, so a call costs the
    /// paths below `dir`, and a walk the list times its depth.
    fn children(&self, dir: &[u8]) -> Vec<Vec<u8>> {
        let mut prefix = dir.to_vec();
        if !prefix.is_empty() {
            prefix.push(b'/');
        }
        let mut names: Vec<Vec<u8>> = [&self.listed, &self.parents]
            .into_iter()
            .flat_map(|l| l.with_prefix(&prefix))
            .map(|p| &p[prefix.len()..])
            .filter(|name| !name.contains(&b'/'))
            .map(<[u8]>::to_vec)
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }
}

/// Paths sorted and deduplicated, packed ([`PathList`]: a path costs its
/// bytes and a 4-byte end), found by binary search.
#[derive(Debug, Default)]
struct SortedPaths(PathList);

impl SortedPaths {
    /// The paths `spans` (start, end) of `from` names, sorted, once each.
    fn new(from: &[u8], mut spans: Vec<(u32, u32)>) -> SortedPaths {
        let at = |&(s, e): &(u32, u32)| &from[s as usize..e as usize];
        spans.sort_unstable_by(|x, y| at(x).cmp(at(y)));
        spans.dedup_by(|x, y| at(x) == at(y));
        let mut l = PathList::default();
        for sp in &spans {
            // Within 4 GiB: no longer than `from`, whose end was checked.
            l.push(at(sp)).expect("checked");
        }
        SortedPaths(l)
    }

    fn contains(&self, p: &[u8]) -> bool {
        let i = self.first_not_below(p);
        i < self.0.len() && self.0.get(i) == p
    }

    /// The index of the first path not sorted below `p`.
    fn first_not_below(&self, p: &[u8]) -> usize {
        let (mut lo, mut hi) = (0, self.0.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.0.get(mid) < p {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// The paths that begin with `prefix`, in order.
    fn with_prefix<'a>(&'a self, prefix: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
        (self.first_not_below(prefix)..self.0.len())
            .map(|i| self.0.get(i))
            .take_while(move |p| p.starts_with(prefix))
    }
}

/// A `--files-from` line as a path from the transfer root, appended to
/// `out`: no leading `/` or `./`, no trailing `/`, no empty or `.`
/// components.
fn normalize_into(out: &mut Vec<u8>, p: &[u8]) {
    let start = out.len();
    for c in p.split(|&b| b == b'/') {
        if c.is_empty() || c == b"." {
            continue;
        }
        if out.len() > start {
            out.push(b'/');
        }
        out.extend_from_slice(c);
    }
}

/// A compiled rule (rsync's `filter_rule` and its flags).
#[derive(Debug)]
struct Rule {
    include: bool,
    negate: bool,
    side: Side,
    /// A trailing `/`: directories only.
    dir_only: bool,
    /// A leading `/`: from the transfer root only.
    anchored: bool,
    /// Neither `/` nor `**`: the last component only.
    last_only: bool,
    /// Where the pattern may start (for one with `/` or `**`).
    start: Start,
    /// Starts with `**`: a `/` is put before the path, so `**/x` also
    /// matches `x` at the top.
    lead_slash: bool,
    /// Ends with `***`: a directory is matched with a `/` after it, so
    /// `dir/***` matches `dir` itself.
    dir_slash: bool,
    /// The pattern (without the leading and trailing `/`); None when it
    /// has no wildcard and is compared byte for byte.
    wild: Option<Pattern>,
    literal: Vec<u8>,
}

impl Filter {
    /// Selects everything.
    pub fn all() -> Filter {
        Filter::default()
    }

    /// Compile; a bad pattern is a one-line error naming it.
    pub fn new(sel: &Selection) -> Result<Filter, String> {
        let mut rules = Vec::with_capacity(sel.rules.len());
        for r in &sel.rules {
            rules.push(Rule::new(&RuleSpec::from_wire(r)?)?);
        }
        if let Some(bad) = sel
            .files
            .iter()
            .find(|f| f.split(|&b| b == b'/').any(|c| c == b".."))
        {
            return Err(format!(
                "--files-from: {:?} leaves the source directory",
                String::from_utf8_lossy(bad)
            ));
        }
        Ok(Filter {
            rules,
            min_size: sel.min_size,
            max_size: sel.max_size,
            files: if sel.files.is_empty() {
                None
            } else {
                Some(FilesFrom::new(&sel.files, sel.files_recursive)?)
            },
            pieces: None,
            listed_may_vanish: false,
        })
    }

    /// With `--files-from`: the names below directory `dir` (a path from
    /// the transfer root) that the list selects, when `dir` only leads to
    /// listed paths (not listed itself, nor below a listed directory); None
    /// when the whole directory must be read.
    pub fn listed_children(&self, dir: &[u8]) -> Option<Vec<Vec<u8>>> {
        let f = self.files.as_ref()?;
        if f.listed.contains(dir) || (!dir.is_empty() && !f.parents.contains(dir)) {
            return None;
        }
        if f.recursive
            && dir
                .iter()
                .enumerate()
                .any(|(i, &b)| b == b'/' && f.listed.contains(&dir[..i]))
        {
            return None;
        }
        Some(f.children(dir))
    }

    /// Whether the transfer root's own mode and mtime are copied: always,
    /// but under `--files-from` only where the list names it (`.`), as
    /// rsync does (issue 36; else DST keeps its own).
    pub fn root_attrs(&self) -> bool {
        self.files.as_ref().is_none_or(|f| f.root)
    }

    pub fn is_all(&self) -> bool {
        self.rules.is_empty() && self.min_size == 0 && self.max_size == 0 && self.files.is_none()
    }

    /// Is `path` (relative to the transfer root, `/`-separated) left out
    /// of what the source sends?
    pub fn excluded(&self, path: &[u8], is_dir: bool) -> bool {
        if path.is_empty() {
            return false;
        }
        if self.files.as_ref().is_some_and(|f| !f.selects(path)) {
            return true;
        }
        self.first_hit(path, is_dir, Side::Receiver) == Some(false)
    }

    /// Does `--delete` leave the destination's `path` alone (an exclude,
    /// or a protect rule, matches it first)?
    /// Outside a `--files-from` list counts as excluded too.
    pub fn protects(&self, path: &[u8], is_dir: bool) -> bool {
        if path.is_empty() {
            return false;
        }
        if self.files.as_ref().is_some_and(|f| !f.selects(path)) {
            return true;
        }
        self.first_hit(path, is_dir, Side::Sender) == Some(false)
    }

    /// The first rule (not for side `skip`) that matches: include?
    fn first_hit(&self, path: &[u8], is_dir: bool, skip: Side) -> Option<bool> {
        self.rules
            .iter()
            .filter(|r| r.side != skip)
            .find(|r| r.hits(path, is_dir))
            .map(|r| r.include)
    }

    /// Is a regular file of `size` bytes left out by --min-size/--max-size?
    pub fn size_excluded(&self, size: u64) -> bool {
        size < self.min_size || (self.max_size > 0 && size > self.max_size)
    }
}

impl Rule {
    /// Compile; a pattern that can never match is a one-line error
    /// naming it.
    fn new(spec: &RuleSpec) -> Result<Rule, String> {
        let mut pat = spec.pattern.as_slice();
        if pat.is_empty() {
            return Err("empty pattern".into());
        }
        let dir_only = pat.len() > 1 && pat.ends_with(b"/");
        if dir_only {
            pat = &pat[..pat.len() - 1];
        }
        // rsync counts the slashes with the leading one, and looks for
        // `**` and `***` in the pattern as written.
        let slashes = pat.iter().filter(|&&c| c == b'/').count();
        let wild = pat.iter().any(|c| b"*?[".contains(c));
        let wild2 = wild && pat.windows(2).any(|w| w == b"**");
        let lead_slash = wild2 && pat.starts_with(b"**");
        let dir_slash = wild2 && pat.ends_with(b"***");
        let anchored = pat.starts_with(b"/");
        let body = if anchored { &pat[1..] } else { pat };
        let start = if !anchored && slashes > 0 && !wild2 {
            Start::Tail(slashes + 1)
        } else if !anchored && wild2 && !lead_slash {
            Start::AnySlash
        } else {
            Start::Whole
        };
        let compiled = if wild {
            Some(Pattern::new(body).map_err(|e| {
                format!(
                    "bad pattern {:?}: {e}",
                    String::from_utf8_lossy(&spec.pattern)
                )
            })?)
        } else {
            None
        };
        Ok(Rule {
            include: spec.include,
            negate: spec.negate,
            side: spec.side,
            dir_only,
            anchored,
            last_only: slashes == 0 && !wild2,
            start,
            lead_slash,
            dir_slash,
            wild: compiled,
            literal: body.to_vec(),
        })
    }

    /// Does the rule apply to `path` (rsync's `rule_matches`)?
    fn hits(&self, path: &[u8], is_dir: bool) -> bool {
        if path.is_empty() {
            return false;
        }
        if self.dir_only && !is_dir {
            // A negated directory rule takes every non-directory.
            return self.negate;
        }
        self.matches(path, is_dir) != self.negate
    }

    fn matches(&self, path: &[u8], is_dir: bool) -> bool {
        let name = if self.last_only {
            path.rsplit(|&c| c == b'/').next().unwrap_or(path)
        } else {
            path
        };
        let Some(p) = &self.wild else {
            // No wildcard: the whole path, or its tail at a component
            // boundary.
            let l = &self.literal;
            return if self.anchored {
                name == l.as_slice()
            } else {
                name.ends_with(l)
                    && (name.len() == l.len() || name[name.len() - l.len() - 1] == b'/')
            };
        };
        let (before, after) = (self.lead_slash, self.dir_slash && is_dir);
        if !before && !after {
            return p.matches_at(name, self.start);
        }
        let mut text = Vec::with_capacity(name.len() + 2);
        if before {
            text.push(b'/');
        }
        text.extend_from_slice(name);
        if after {
            text.push(b'/');
        }
        p.matches_at(&text, self.start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(rules: &[(bool, &str)]) -> Filter {
        Filter::new(&Selection {
            rules: rules
                .iter()
                .map(|(i, p)| [if *i { "+ " } else { "- " }, p].concat().into_bytes())
                .collect(),
            ..Default::default()
        })
        .unwrap()
    }

    fn out(f: &Filter, p: &str) -> bool {
        f.excluded(p.as_bytes(), false)
    }

    #[test]
    fn a_pattern_without_slash_matches_the_last_component_anywhere() {
        let x = f(&[(false, "*.o")]);
        assert!(out(&x, "a.o") && out(&x, "src/sub/a.o"));
        assert!(!out(&x, "a.o/b") && !out(&x, "src/a.c"));
        // `*` matches a whole name but never crosses `/`.
        let x = f(&[(false, "build")]);
        assert!(x.excluded(b"src/build", true) && !out(&x, "src/builder"));
    }

    #[test]
    fn anchored_patterns_start_at_the_transfer_root() {
        let x = f(&[(false, "/src/tmp")]);
        assert!(out(&x, "src/tmp") && !out(&x, "src/a/src/tmp"));
        // A slash inside: matches the end of the path at a boundary.
        let x = f(&[(false, "a/b")]);
        assert!(out(&x, "a/b") && out(&x, "x/a/b") && !out(&x, "xa/b"));
        assert!(!out(&x, "a/b/c"));
    }

    #[test]
    fn double_star_crosses_slashes_and_single_does_not() {
        let x = f(&[(false, "/src/*/x")]);
        assert!(out(&x, "src/a/x") && !out(&x, "src/a/b/x"));
        let x = f(&[(false, "/src/**/x")]);
        assert!(out(&x, "src/a/x") && out(&x, "src/a/b/x"));
        let x = f(&[(false, "**/cache")]);
        assert!(out(&x, "cache") && out(&x, "a/b/cache"));
    }

    #[test]
    fn trailing_slash_matches_directories_only() {
        let x = f(&[(false, "logs/")]);
        assert!(x.excluded(b"a/logs", true));
        assert!(!x.excluded(b"a/logs", false));
    }

    #[test]
    fn first_match_wins_so_an_include_before_an_exclude_keeps_files() {
        // rsync -r --include '*.c' --exclude '*' : only .c files (and,
        // since directories are excluded too, only at the top).
        let x = f(&[(true, "*.c"), (false, "*")]);
        assert!(!out(&x, "a.c") && out(&x, "a.h"));
        assert!(x.excluded(b"dir", true));
        // The usual idiom: directories first, then the files wanted.
        let x = f(&[(true, "*/"), (true, "*.c"), (false, "*")]);
        assert!(!x.excluded(b"dir", true) && !out(&x, "dir/a.c") && out(&x, "dir/a.h"));
        // The other order: the exclude wins.
        let x = f(&[(false, "*"), (true, "*.c")]);
        assert!(out(&x, "a.c"));
    }

    #[test]
    fn sizes_and_bad_patterns() {
        let x = Filter::new(&Selection {
            min_size: 10,
            max_size: 100,
            ..Default::default()
        })
        .unwrap();
        assert!(x.size_excluded(9) && !x.size_excluded(10) && !x.size_excluded(100));
        assert!(x.size_excluded(101));
        assert!(!Filter::all().size_excluded(u64::MAX));
        let e = Filter::new(&Selection {
            rules: vec![b"- a[".to_vec()],
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.contains("a["), "{e}");
    }

    #[test]
    fn files_from_selects_listed_paths_their_parents_and_with_r_their_contents() {
        let sel = |recursive| Selection {
            files: vec![b"./a/b/c.txt".to_vec(), b"/d/".to_vec(), b"".to_vec()].into(),
            files_recursive: recursive,
            ..Default::default()
        };
        let x = Filter::new(&sel(false)).unwrap();
        assert!(!x.excluded(b"a", true) && !x.excluded(b"a/b", true));
        assert!(!out(&x, "a/b/c.txt") && out(&x, "a/b/other") && out(&x, "a/x"));
        assert!(!x.excluded(b"d", true) && out(&x, "d/inside") && out(&x, "e"));
        let x = Filter::new(&sel(true)).unwrap();
        assert!(!out(&x, "d/inside") && !out(&x, "d/sub/deeper") && out(&x, "dd/x"));
        // The scan stats only the names leading to listed paths; a listed
        // directory (or one below it) is read whole.
        let names = |d: &str| x.listed_children(d.as_bytes());
        assert_eq!(names(""), Some(vec![b"a".to_vec(), b"d".to_vec()]));
        assert_eq!(names("a/b"), Some(vec![b"c.txt".to_vec()]));
        assert_eq!((names("d"), names("d/sub")), (None, None));
        assert_eq!(Filter::all().listed_children(b""), None);
        // Rules still apply to what the list selects.
        let mut s = sel(true);
        s.rules = vec![b"- *.tmp".to_vec()];
        let x = Filter::new(&s).unwrap();
        assert!(out(&x, "d/x.tmp") && !out(&x, "d/x.dat"));
        // A path that climbs out is refused.
        let e = Filter::new(&Selection {
            files: vec![b"a/../../etc/passwd".to_vec()].into(),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.contains("leaves the source"), "{e}");
    }

    /// The compiled list against the plain definition (hash sets of every
    /// listed path and every directory above one) on random lists.
    #[test]
    fn files_from_lists_agree_with_hash_sets() {
        use proptest::prelude::*;
        use std::collections::HashSet;
        let comp = "[abc]{1,2}";
        let line = proptest::collection::vec(comp, 1..4)
            .prop_map(|c| c.join("/"))
            .prop_map(|p| p.into_bytes());
        let lines = proptest::collection::vec(line, 1..40);
        let probe = proptest::collection::vec(comp, 0..4).prop_map(|c| c.join("/").into_bytes());
        proptest!(|(files in lines, probes in proptest::collection::vec(probe, 1..20), rec: bool)| {
            let f = FilesFrom::new(&files.clone().into(), rec).unwrap();
            let listed: HashSet<Vec<u8>> = files.iter().cloned().collect();
            let parents: HashSet<Vec<u8>> = files
                .iter()
                .flat_map(|p| {
                    p.iter()
                        .enumerate()
                        .filter(|&(_, &b)| b == b'/')
                        .map(|(i, _)| p[..i].to_vec())
                        .collect::<Vec<_>>()
                })
                .collect();
            for p in &probes {
                let below = p
                    .iter()
                    .enumerate()
                    .any(|(i, &b)| b == b'/' && listed.contains(&p[..i]));
                let want = listed.contains(p) || parents.contains(p) || rec && below;
                prop_assert_eq!(f.selects(p), want);
                let mut kids: Vec<Vec<u8>> = listed
                    .iter()
                    .chain(&parents)
                    .filter_map(|q| {
                        let rest = if p.is_empty() {
                            &q[..]
                        } else {
                            q.strip_prefix(&p[..])?.strip_prefix(b"/")?
                        };
                        (!rest.contains(&b'/')).then(|| rest.to_vec())
                    })
                    .collect();
                kids.sort();
                kids.dedup();
                prop_assert_eq!(f.children(p), kids);
            }
        });
    }

    fn wire(rules: &[&str]) -> Filter {
        Filter::new(&Selection {
            rules: rules.iter().map(|r| r.as_bytes().to_vec()).collect(),
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn rsyncs_pattern_forms_from_its_exclude_test() {
        // `**` inside a pattern without `/`: tried after every slash.
        let x = wire(&["- foo**too"]);
        assert!(x.excluded(b"bar/down/to/foo/too", true));
        assert!(x.excluded(b"foo/x/too", false) && !x.excluded(b"bar/foo/tool", false));
        // `***`: the directory and everything in it; `**`: only inside.
        let x = wire(&["- new/keep/**", "- new/lose/***"]);
        assert!(!x.excluded(b"new/keep", true) && x.excluded(b"new/keep/this", true));
        assert!(x.excluded(b"new/lose", true) && x.excluded(b"new/lose/this", true));
        assert!(x.excluded(b"a/new/lose", true));
        // A `/` inside floats at the end of the path: as many components.
        let x = wire(&["+ foo/s?b/", "- foo/*/"]);
        assert!(!x.excluded(b"foo/sub", true) && x.excluded(b"foo/down", true));
        assert!(x.excluded(b"x/foo/down", true) && !x.excluded(b"foo/down", false));
        // Classes, ranges, negated classes.
        let x = wire(&["+ t[o]/", "- to", "+ file4", "- file[2-9]"]);
        assert!(!x.excluded(b"a/to", true) && x.excluded(b"a/to", false));
        assert!(!x.excluded(b"file4", false) && x.excluded(b"d/file3", false));
        assert!(!x.excluded(b"file1", false));
    }

    #[test]
    fn a_pattern_without_wildcards_is_literal_backslash_and_all() {
        let x = wire(&["- f\\oo"]);
        assert!(x.excluded(b"f\\oo", false) && !x.excluded(b"foo", false));
        // With a wildcard, `\` escapes.
        let x = wire(&["- f\\o*"]);
        assert!(x.excluded(b"foo", false) && !x.excluded(b"f\\oo", false));
    }

    #[test]
    fn anchored_directory_rules_and_the_transfer_root() {
        // `SRC/`: paths start inside SRC.
        let x = wire(&["- /skip/"]);
        assert!(x.excluded(b"skip", true) && !x.excluded(b"skip", false));
        assert!(!x.excluded(b"a/skip", true));
        // `SRC`: paths start with SRC's name.
        let x = wire(&["- /src/skip/"]);
        assert!(x.excluded(b"src/skip", true) && !x.excluded(b"skip", true));
        // `**/` at the start also takes the top level.
        let x = wire(&["- **/cache/"]);
        assert!(x.excluded(b"cache", true) && x.excluded(b"a/b/cache", true));
    }

    #[test]
    fn negated_rules_and_sides() {
        // `-! */`: every non-directory.
        let x = wire(&["-! */"]);
        assert!(x.excluded(b"a/f", false) && !x.excluded(b"a/d", true));
        let x = wire(&["-! *.c"]);
        assert!(x.excluded(b"a.h", false) && !x.excluded(b"a.c", false));
        // hide (sender only) does not protect from --delete; protect
        // (receiver only) does not hide from the scan.
        let x = wire(&["-s h", "-r p", "- both"]);
        assert!(x.excluded(b"h", false) && !x.protects(b"h", false));
        assert!(!x.excluded(b"p", false) && x.protects(b"p", false));
        assert!(x.excluded(b"both", false) && x.protects(b"both", false));
        // risk: an include for the receiver only.
        let x = wire(&["+r *.o", "- *.o"]);
        assert!(x.excluded(b"a.o", false) && !x.protects(b"a.o", false));
    }

    #[test]
    fn bad_wire_rules_and_patterns_are_refused() {
        for (r, says) in [
            ("merge /etc/passwd", "bad rule from peer"),
            ("- [a", "a '[' is never closed"),
            ("- x*\\", "lone"),
            ("- [[:nope:]]", "[:nope:]"),
        ] {
            let e = Filter::new(&Selection {
                rules: vec![r.as_bytes().to_vec()],
                ..Default::default()
            })
            .unwrap_err();
            assert!(e.contains(says) && !e.contains('\n'), "{r}: {e}");
        }
    }
}
