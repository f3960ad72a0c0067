//! rsync's filter-rule syntax (issue 35; rsync(1) "FILTER RULES"): what
//! `--filter`, `--exclude`, `--include`, their `-from` files and merge
//! files say, turned into the plain rules a source and a sink compile
//! (request::filter).
//!
//! The agent resolves everything that reads a file or changes the list
//! (`!`/`clear`, `merge`, `--exclude-from`) while it parses the command
//! line, so what travels (Selection::rules, docs/PROTOCOL.md) is only
//! plain rules, in rsync's own short form: `-` or `+`, modifiers from
//! `!sr`, one space, the pattern's bytes. A peer's rule is read back with
//! [`RuleSpec::from_wire`], which takes nothing else: a client cannot make
//! a daemon open a file through a rule.

use std::path::Path;

/// Which side a rule is for (rsync's `s`/`r` modifiers, hide/show and
/// protect/risk): the sender's scan, the receiver's `--delete`, or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Side {
    #[default]
    Both,
    Sender,
    Receiver,
}

/// One plain rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSpec {
    pub include: bool,
    /// `!`: the rule applies to what does NOT match the pattern.
    pub negate: bool,
    pub side: Side,
    pub pattern: Vec<u8>,
}

/// How a rule's text is read (rsync's templates).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syntax {
    /// `--filter` and merge files: `RULE[,MODIFIERS] PATTERN`.
    Filter,
    /// `--exclude`/`--include` and their `-from` files (`include` says
    /// which): the pattern, optionally after `- ` or `+ `; `!` alone
    /// clears the list.
    Old { include: bool },
    /// A merge file read with the `-` or `+` modifier: every line is a
    /// pattern of that kind.
    Bare { include: bool },
}

/// What one rule's text asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Parsed {
    Rule(RuleSpec),
    /// `!` / `clear`: forget the rules so far.
    Clear,
    /// `merge` / `.`: read the rules of a file here.
    Merge {
        file: Vec<u8>,
        syntax: Syntax,
        exclude_self: bool,
    },
}

/// Merge files within merge files, at most this deep (a loop is an error,
/// not a hang).
const MAX_MERGE_DEPTH: usize = 16;

/// The rules of a command line, in order (first match wins), with clears
/// and merge files already applied.
#[derive(Debug, Default, Clone)]
pub struct RuleList {
    pub rules: Vec<RuleSpec>,
    depth: usize,
}

impl RuleList {
    /// Add one rule's text (a `--filter`, `--exclude` or `--include`
    /// value). Err: one line naming the rule.
    pub fn add(&mut self, text: &[u8], syntax: Syntax) -> Result<(), String> {
        match parse(text, syntax)? {
            None => Ok(()),
            Some(p) => self.apply(p),
        }
    }

    /// Add the rules of a file, one per line (`--exclude-from`,
    /// `--include-from`, `merge`): blank lines and lines starting with `#`
    /// or `;` are skipped; `\n`, `\r\n` and `\r` end lines; `-` is stdin.
    pub fn add_file(&mut self, file: &Path, syntax: Syntax) -> Result<(), String> {
        let text = if file.as_os_str() == "-" {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut v)
                .map_err(|e| format!("cannot read rules from stdin: {e}"))?;
            v
        } else {
            std::fs::read(file)
                .map_err(|e| format!("cannot read rules file {}: {e}", file.display()))?
        };
        self.add_text(&text, syntax)
            .map_err(|e| format!("{}: {e}", file.display()))
    }

    /// [`RuleList::add_file`] on text already read.
    pub fn add_text(&mut self, text: &[u8], syntax: Syntax) -> Result<(), String> {
        for line in text
            .split(|&c| c == b'\n')
            .flat_map(|l| l.split(|&c| c == b'\r'))
        {
            if line.is_empty() || line[0] == b'#' || line[0] == b';' {
                continue;
            }
            self.add(line, syntax)?;
        }
        Ok(())
    }

    fn apply(&mut self, p: Parsed) -> Result<(), String> {
        match p {
            Parsed::Rule(r) => self.rules.push(r),
            Parsed::Clear => self.rules.clear(),
            Parsed::Merge {
                file,
                syntax,
                exclude_self,
            } => {
                if self.depth >= MAX_MERGE_DEPTH {
                    return Err(format!("merge files nest more than {MAX_MERGE_DEPTH} deep"));
                }
                if exclude_self {
                    let base = file.rsplit(|&c| c == b'/').next().unwrap_or(&file);
                    self.rules.push(RuleSpec {
                        include: false,
                        negate: false,
                        side: Side::Both,
                        pattern: base.to_vec(),
                    });
                }
                self.depth += 1;
                let path = std::ffi::OsStr::from_encoded_bytes_checked(&file);
                let r = self.add_file(Path::new(path), syntax);
                self.depth -= 1;
                r?;
            }
        }
        Ok(())
    }
}

/// `OsStr` from bytes on Unix.
trait FromBytes {
    fn from_encoded_bytes_checked(b: &[u8]) -> &std::ffi::OsStr;
}

impl FromBytes for std::ffi::OsStr {
    fn from_encoded_bytes_checked(b: &[u8]) -> &std::ffi::OsStr {
        std::os::unix::ffi::OsStrExt::from_bytes(b)
    }
}

impl RuleSpec {
    /// The rule as it travels: `-`/`+`, modifiers, a space, the pattern.
    pub fn to_wire(&self) -> Vec<u8> {
        let mut v = vec![if self.include { b'+' } else { b'-' }];
        if self.negate {
            v.push(b'!');
        }
        match self.side {
            Side::Both => {}
            Side::Sender => v.push(b's'),
            Side::Receiver => v.push(b'r'),
        }
        v.push(b' ');
        v.extend_from_slice(&self.pattern);
        v
    }

    /// A peer's rule: exactly what [`RuleSpec::to_wire`] makes.
    pub fn from_wire(b: &[u8]) -> Result<RuleSpec, String> {
        let bad = || format!("bad rule from peer {:?}", String::from_utf8_lossy(b));
        let include = match b.first() {
            Some(b'+') => true,
            Some(b'-') => false,
            _ => return Err(bad()),
        };
        let sp = b.iter().position(|&c| c == b' ').ok_or_else(bad)?;
        let (mut negate, mut side) = (false, Side::Both);
        for &m in &b[1..sp] {
            match m {
                b'!' if !negate => negate = true,
                b's' if side == Side::Both => side = Side::Sender,
                b'r' if side == Side::Both => side = Side::Receiver,
                _ => return Err(bad()),
            }
        }
        let pattern = b[sp + 1..].to_vec();
        if pattern.is_empty() {
            return Err(bad());
        }
        Ok(RuleSpec {
            include,
            negate,
            side,
            pattern,
        })
    }
}

/// One rule's text. None: nothing (an empty `--exclude ''`, as rsync).
fn parse(s: &[u8], syntax: Syntax) -> Result<Option<Parsed>, String> {
    if s.is_empty() {
        return Ok(None);
    }
    let show = || String::from_utf8_lossy(s).into_owned();
    let plain = |include: bool, pat: &[u8]| {
        if pat.is_empty() {
            return Err(format!("rule {:?} has no pattern", show()));
        }
        Ok(Some(Parsed::Rule(RuleSpec {
            include,
            negate: false,
            side: Side::Both,
            pattern: pat.to_vec(),
        })))
    };
    match syntax {
        Syntax::Bare { include } => plain(include, s),
        Syntax::Old { include } => match s {
            b"!" => Ok(Some(Parsed::Clear)),
            [b'-', b' ', pat @ ..] => plain(false, pat),
            [b'+', b' ', pat @ ..] => plain(true, pat),
            pat => plain(include, pat),
        },
        Syntax::Filter => parse_filter(s).map(Some),
    }
}

/// The long names of rules (`exclude, PAT`) and their one-letter forms.
const NAMES: &[(&[u8], u8)] = &[
    (b"clear", b'!'),
    (b"dir-merge", b':'),
    (b"exclude", b'-'),
    (b"hide", b'H'),
    (b"include", b'+'),
    (b"merge", b'.'),
    (b"protect", b'P'),
    (b"risk", b'R'),
    (b"show", b'S'),
];

/// `RULE[,MODIFIERS] PATTERN` (rsync's `--filter` form): the rule as a
/// word or one letter, an optional `,`, modifier letters, then one space
/// or `_`, then the pattern, verbatim to the end.
fn parse_filter(s: &[u8]) -> Result<Parsed, String> {
    let show = || String::from_utf8_lossy(s).into_owned();
    let word = NAMES.iter().find_map(|(name, ch)| {
        let rest = s.strip_prefix(*name)?;
        match rest.first() {
            None | Some(b' ' | b'_') => Some((*ch, rest)),
            Some(b',') => Some((*ch, &rest[1..])),
            _ => None,
        }
    });
    let (ch, rest) = match word {
        Some(w) => w,
        None => {
            let rest = &s[1..];
            (s[0], rest.strip_prefix(b",").unwrap_or(rest))
        }
    };
    let (include, side) = match ch {
        b'-' => (false, Side::Both),
        b'+' => (true, Side::Both),
        b'H' => (false, Side::Sender),
        b'S' => (true, Side::Sender),
        b'P' => (false, Side::Receiver),
        b'R' => (true, Side::Receiver),
        // Nothing may follow a clear (rsync: "trailing characters").
        b'!' if rest.is_empty() => return Ok(Parsed::Clear),
        b'!' => return Err(format!("rule {:?}: '!' takes no pattern", show())),
        b'.' => (false, Side::Both),
        b':' => {
            return Err(format!(
                "rule {:?}: per-directory merge files (dir-merge, ':', -F) are not supported",
                show()
            ))
        }
        _ => return Err(format!("unknown filter rule {:?}", show())),
    };
    let merge = ch == b'.';
    let sided = side != Side::Both;
    let (mut negate, mut bare, mut exclude_self) = (false, None, false);
    let (mut sender, mut receiver) = (side == Side::Sender, side == Side::Receiver);
    let mut i = 0;
    while i < rest.len() && rest[i] != b' ' && rest[i] != b'_' {
        let m = rest[i];
        match m {
            b'!' if !merge => negate = true,
            b's' if !sided => sender = true,
            b'r' if !sided => receiver = true,
            b'-' | b'+' if merge && bare.is_none() => bare = Some(m == b'+'),
            b'e' if merge => exclude_self = true,
            b'n' if merge => {}
            b'/' | b'p' | b'x' | b'C' | b'w' => {
                return Err(format!(
                    "rule {:?}: modifier '{}' is not supported",
                    show(),
                    m as char
                ))
            }
            _ => {
                return Err(format!(
                    "rule {:?}: invalid modifier '{}'",
                    show(),
                    m as char
                ))
            }
        }
        i += 1;
    }
    let pat = rest.get(i + 1..).unwrap_or_default();
    if pat.is_empty() {
        return Err(format!("rule {:?} has no pattern", show()));
    }
    if merge {
        return Ok(Parsed::Merge {
            file: pat.to_vec(),
            syntax: bare.map_or(Syntax::Filter, |include| Syntax::Bare { include }),
            exclude_self,
        });
    }
    Ok(Parsed::Rule(RuleSpec {
        include,
        negate,
        // Both letters: both sides, as rsync.
        side: match (sender, receiver) {
            (true, false) => Side::Sender,
            (false, true) => Side::Receiver,
            _ => Side::Both,
        },
        pattern: pat.to_vec(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn list(items: &[(&str, Syntax)]) -> Result<Vec<String>, String> {
        let mut l = RuleList::default();
        for (t, s) in items {
            l.add(t.as_bytes(), *s)?;
        }
        Ok(l.rules
            .iter()
            .map(|r| String::from_utf8(r.to_wire()).unwrap())
            .collect())
    }

    const F: Syntax = Syntax::Filter;
    const EX: Syntax = Syntax::Old { include: false };
    const IN: Syntax = Syntax::Old { include: true };

    #[test]
    fn filter_rules_in_short_and_long_forms() {
        let got = list(&[
            ("- *.o", F),
            ("+ keep/", F),
            ("exclude, -foo-", F),
            ("include tmp", F),
            ("-! */", F),
            ("exclude,! */", F),
            ("-_under", F),
            ("hide h", F),
            ("show s", F),
            ("protect p", F),
            ("risk r", F),
            ("-s snd", F),
            ("+r rcv", F),
            ("-  two spaces", F),
        ])
        .unwrap();
        assert_eq!(
            got,
            [
                "- *.o",
                "+ keep/",
                "- -foo-",
                "+ tmp",
                "-! */",
                "-! */",
                "- under",
                "-s h",
                "+s s",
                "-r p",
                "+r r",
                "-s snd",
                "+r rcv",
                "-  two spaces",
            ]
        );
    }

    #[test]
    fn clear_forgets_the_rules_so_far() {
        let got = list(&[("- a", F), ("!", F), ("- b", F), ("clear", F), ("- c", EX)]);
        assert_eq!(got.unwrap(), ["- c"]);
        let got = list(&[("- a", EX), ("!", EX), ("b", IN)]);
        assert_eq!(got.unwrap(), ["+ b"]);
        // `!x` is a pattern for --exclude, an error for --filter.
        assert_eq!(list(&[("!x", EX)]).unwrap(), ["- !x"]);
        assert!(list(&[("! x", F)]).unwrap_err().contains("no pattern"));
        assert!(list(&[("clear x", F)]).is_err());
    }

    #[test]
    fn old_prefixes_for_exclude_and_include() {
        let got = list(&[
            ("- a", IN),
            ("+ b", EX),
            ("-foo-", EX),
            ("c d", IN),
            ("", EX),
        ]);
        assert_eq!(got.unwrap(), ["- a", "+ b", "- -foo-", "+ c d"]);
    }

    #[test]
    fn bad_rules_are_one_line_naming_the_rule() {
        for (r, says) in [
            ("-", "no pattern"),
            ("+", "no pattern"),
            ("-foo-", "invalid modifier 'f'"),
            ("x foo", "unknown filter rule"),
            (": .rsync-filter", "not supported"),
            ("dir-merge .f", "not supported"),
            ("-p perish", "modifier 'p' is not supported"),
            ("hide,s x", "invalid modifier 's'"),
            ("hides x", "unknown filter rule"),
            ("merge", "no pattern"),
            ("merge /nonexistent/rules", "/nonexistent/rules"),
        ] {
            let e = list(&[(r, F)]).unwrap_err();
            assert!(e.contains(says), "{r:?}: {e}");
            assert!(!e.contains('\n'), "{r:?}: {e}");
        }
    }

    #[test]
    fn files_skip_comments_and_blank_lines_and_take_every_line_end() {
        let mut l = RuleList::default();
        let text = b"# comment\n\n+ *.c\r\n- *.o\rbuild/\n; also\n- -foo-\n!x\n \n";
        l.add_text(text, EX).unwrap();
        let got: Vec<_> = l.rules.iter().map(|r| r.to_wire()).collect();
        let want: Vec<&[u8]> = vec![b"+ *.c", b"- *.o", b"- build/", b"- -foo-", b"- !x", b"-  "];
        assert_eq!(got, want);
        // `!` in a file clears what came before it.
        let mut l = RuleList::default();
        l.add_text(b"- a\n!\n- b\n", EX).unwrap();
        assert_eq!(l.rules.len(), 1);
    }

    #[test]
    fn merge_files_are_read_in_place_with_their_modifiers() {
        let d = tempfile::tempdir().unwrap();
        let m = d.path().join("m");
        std::fs::write(&m, "- one\n+ two\n").unwrap();
        let bare = d.path().join("bare");
        std::fs::write(&bare, "x\ny\n").unwrap();
        let looped = d.path().join("loop");
        std::fs::write(&looped, format!("merge {}\n", looped.display())).unwrap();
        let (m, bare, looped) = (m.display(), bare.display(), looped.display());
        let got = list(&[
            ("- first", F),
            (&format!("merge {m}"), F),
            (&format!(".e {m}"), F),
            (&format!("merge,+ {bare}"), F),
        ])
        .unwrap();
        assert_eq!(
            got,
            ["- first", "- one", "+ two", "- m", "- one", "+ two", "+ x", "+ y"]
        );
        let e = list(&[(&format!("merge {looped}"), F)]).unwrap_err();
        assert!(e.contains("nest more than"), "{e}");
    }

    #[test]
    fn a_peer_may_send_only_plain_rules() {
        for ok in ["- a", "+ b/", "-! */", "+s x", "-r y", "- -foo-", "-  sp"] {
            let r = RuleSpec::from_wire(ok.as_bytes()).unwrap();
            assert_eq!(r.to_wire(), ok.as_bytes());
        }
        for bad in [
            "merge /etc/shadow",
            ". /etc/shadow",
            "!",
            ": .f",
            "-",
            "- ",
            "-x a",
            "-!! a",
            "a",
        ] {
            assert!(RuleSpec::from_wire(bad.as_bytes()).is_err(), "{bad:?}");
        }
    }

    proptest! {
        /// Wire form round trip for every rule, and no panic on any bytes
        /// (a peer's rules are network input).
        #[test]
        fn wire_round_trip_and_no_panics(
            include: bool, negate: bool, side in 0..3u8,
            pattern in proptest::collection::vec(any::<u8>(), 1..40),
            junk in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            let side = [Side::Both, Side::Sender, Side::Receiver][side as usize];
            let r = RuleSpec { include, negate, side, pattern };
            prop_assert_eq!(RuleSpec::from_wire(&r.to_wire()).unwrap(), r);
            let _ = RuleSpec::from_wire(&junk);
            let _ = parse(&junk, Syntax::Filter);
            let _ = parse(&junk, Syntax::Old { include });
        }
    }
}
