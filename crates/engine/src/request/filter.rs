//! What the source's scan sends: rsync's include/exclude rules and size
//! limits (issue 20), applied while walking, so an excluded directory is
//! never descended and its files never stat'ed.
//!
//! rsync's rules, as `rsync(1)` "INCLUDE/EXCLUDE PATTERN RULES" states
//! them: rules are tried in the order given and the first match decides
//! (nothing matching = included); a pattern starting with `/` is anchored
//! at the transfer root (for `SRC` that is SRC's parent, so `/SRC/x`; for
//! `SRC/` it is SRC itself); a pattern ending in `/` matches directories
//! only; a pattern with no other `/` matches the last component at any
//! depth, one with a `/` matches the end of the path at a component
//! boundary; `*` and `?` stop at `/`, `**` crosses it. Patterns are
//! compiled with the maintained `globset` crate (ripgrep's), with literal
//! separators, which is that `*`/`**` distinction.
//!
//! `--files-from` (rsync's): only the listed paths, relative to the
//! source directory, and the directories leading to them; below a listed
//! directory only with `-r`. The agent sends such sources as contents
//! (`SRC/`), so listed paths are paths from the transfer root.
//!
//! The same filter protects excluded destination entries from sync's
//! `--delete` (sync::delete), as rsync's receiver does.

use std::collections::HashSet;

use globset::{GlobBuilder, GlobMatcher};
use ramsys_proto::control::Selection;

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
}

#[derive(Debug)]
struct FilesFrom {
    listed: HashSet<Vec<u8>>,
    parents: HashSet<Vec<u8>>,
    recursive: bool,
}

impl FilesFrom {
    fn new(files: &[Vec<u8>], recursive: bool) -> FilesFrom {
        let mut listed = HashSet::new();
        let mut parents = HashSet::new();
        for f in files {
            let p = normalize(f);
            if p.is_empty() {
                continue;
            }
            for (i, &b) in p.iter().enumerate() {
                if b == b'/' {
                    parents.insert(p[..i].to_vec());
                }
            }
            listed.insert(p);
        }
        FilesFrom {
            listed,
            parents,
            recursive,
        }
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
}

/// A `--files-from` line as a path from the transfer root: no leading
/// `/` or `./`, no trailing `/`, no empty or `.` components.
fn normalize(p: &[u8]) -> Vec<u8> {
    let parts: Vec<&[u8]> = p
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .collect();
    parts.join(&b'/')
}

#[derive(Debug)]
struct Rule {
    include: bool,
    dir_only: bool,
    /// Matches the whole path (anchored) or, unanchored, any tail of it
    /// that starts at a component (`**/` prefixed).
    matcher: GlobMatcher,
    /// Unanchored pattern without `/`: matched against the last component.
    last_only: bool,
}

impl Filter {
    /// Selects everything.
    pub fn all() -> Filter {
        Filter::default()
    }

    /// Compile; a bad pattern is a one-line error naming it.
    pub fn new(sel: &Selection) -> Result<Filter, String> {
        let mut rules = Vec::with_capacity(sel.rules.len());
        for (include, pat) in &sel.rules {
            let p = std::str::from_utf8(pat)
                .map_err(|_| format!("pattern {:?} is not UTF-8", String::from_utf8_lossy(pat)))?;
            rules.push(Rule::new(*include, p)?);
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
            files: (!sel.files.is_empty()).then(|| FilesFrom::new(&sel.files, sel.files_recursive)),
            pieces: None,
        })
    }

    pub fn is_all(&self) -> bool {
        self.rules.is_empty() && self.min_size == 0 && self.max_size == 0 && self.files.is_none()
    }

    /// Is `path` (relative to the transfer root, `/`-separated) left out?
    pub fn excluded(&self, path: &[u8], is_dir: bool) -> bool {
        if path.is_empty() {
            return false;
        }
        if self.files.as_ref().is_some_and(|f| !f.selects(path)) {
            return true;
        }
        if self.rules.is_empty() {
            return false;
        }
        let Ok(path) = std::str::from_utf8(path) else {
            // Patterns are UTF-8; a name that is not cannot match one
            // spelled in it except through wildcards: match lossily.
            return self.excluded(String::from_utf8_lossy(path).as_bytes(), is_dir);
        };
        let last = path.rsplit('/').next().unwrap_or(path);
        for r in &self.rules {
            if r.dir_only && !is_dir {
                continue;
            }
            let hit = if r.last_only {
                r.matcher.is_match(last)
            } else {
                r.matcher.is_match(path)
            };
            if hit {
                return !r.include;
            }
        }
        false
    }

    /// Is a regular file of `size` bytes left out by --min-size/--max-size?
    pub fn size_excluded(&self, size: u64) -> bool {
        size < self.min_size || (self.max_size > 0 && size > self.max_size)
    }
}

impl Rule {
    fn new(include: bool, pat: &str) -> Result<Rule, String> {
        if pat.is_empty() {
            return Err("empty pattern".into());
        }
        let dir_only = pat.len() > 1 && pat.ends_with('/');
        let body = pat.strip_suffix('/').filter(|_| dir_only).unwrap_or(pat);
        let anchored = body.starts_with('/');
        let body = body.trim_start_matches('/');
        let last_only = !anchored && !body.contains('/') && !body.contains("**");
        let glob = if anchored || last_only {
            body.to_string()
        } else {
            format!("{{{body},**/{body}}}")
        };
        let matcher = GlobBuilder::new(&glob)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|e| format!("bad pattern {pat:?}: {e}"))?
            .compile_matcher();
        Ok(Rule {
            include,
            dir_only,
            matcher,
            last_only,
        })
    }
}

/// Read an `--exclude-from` file: one pattern per line; blank lines and
/// lines starting with `#` or `;` are skipped; `+ PAT` includes and
/// `- PAT` excludes (rsync's rule prefixes), anything else excludes.
pub fn rules_from_text(text: &str) -> Vec<(bool, Vec<u8>)> {
    text.lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#') && !l.starts_with(';'))
        .map(|l| match l.split_at_checked(2) {
            Some(("+ ", p)) => (true, p.as_bytes().to_vec()),
            Some(("- ", p)) => (false, p.as_bytes().to_vec()),
            _ => (false, l.as_bytes().to_vec()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(rules: &[(bool, &str)]) -> Filter {
        Filter::new(&Selection {
            rules: rules
                .iter()
                .map(|(i, p)| (*i, p.as_bytes().to_vec()))
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
            rules: vec![(false, b"a[".to_vec())],
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.contains("a["), "{e}");
    }

    #[test]
    fn files_from_selects_listed_paths_their_parents_and_with_r_their_contents() {
        let sel = |recursive| Selection {
            files: vec![b"./a/b/c.txt".to_vec(), b"/d/".to_vec(), b"".to_vec()],
            files_recursive: recursive,
            ..Default::default()
        };
        let x = Filter::new(&sel(false)).unwrap();
        assert!(!x.excluded(b"a", true) && !x.excluded(b"a/b", true));
        assert!(!out(&x, "a/b/c.txt") && out(&x, "a/b/other") && out(&x, "a/x"));
        assert!(!x.excluded(b"d", true) && out(&x, "d/inside") && out(&x, "e"));
        let x = Filter::new(&sel(true)).unwrap();
        assert!(!out(&x, "d/inside") && !out(&x, "d/sub/deeper") && out(&x, "dd/x"));
        // Rules still apply to what the list selects.
        let mut s = sel(true);
        s.rules = vec![(false, b"*.tmp".to_vec())];
        let x = Filter::new(&s).unwrap();
        assert!(out(&x, "d/x.tmp") && !out(&x, "d/x.dat"));
        // A path that climbs out is refused.
        let e = Filter::new(&Selection {
            files: vec![b"a/../../etc/passwd".to_vec()],
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.contains("leaves the source"), "{e}");
    }

    #[test]
    fn exclude_from_files_take_rsync_prefixes_and_comments() {
        let r = rules_from_text("# comment\n\n+ *.c\n- *.o\nbuild/\n; also a comment\r\n");
        assert_eq!(
            r,
            vec![
                (true, b"*.c".to_vec()),
                (false, b"*.o".to_vec()),
                (false, b"build/".to_vec())
            ]
        );
    }
}
