//! rsync's pattern language (its `lib/wildmatch.c`, issue 35), on bytes.
//!
//! `?` is one byte other than `/`; `*` is any run of bytes without `/`;
//! two or more stars in a row cross `/`; `[...]` is a class (`!` or `^`
//! first negates it; `a-z` ranges; `[:alpha:]`-style names; `\` escapes
//! inside it; a `]` right after the `[` or the negation is a member) and
//! never matches `/`; `\x` is a literal `x`. Matching returns one of four
//! outcomes, as rsync's does: besides yes and no, "abort all" (the text ran
//! out: no later start can match either) and "abort to `**`" (a single `*`
//! met a `/`: only an enclosing `**` may go on). Those two cut the search
//! short, and they also decide some results (`**/bar*` never matches
//! `foo/bar/baz`), which is why this is not a general glob crate: none on
//! crates.io keeps rsync's `*`/`**` split and its abort rules (globset's
//! `**` is only special between slashes), and the rules must give rsync's
//! tree pair for pair (wildtest.txt, the test below).
//!
//! Patterns rsync can never match are refused when compiled, with the
//! reason (one line naming the pattern, in the caller): an unterminated
//! `[`, an unknown `[:name:]`, a lone trailing `\`. A `[:` that has no
//! closing `:]` is, as in rsync, a literal `[` in the class.

/// A compiled pattern.
#[derive(Debug, Clone)]
pub struct Pattern {
    toks: Vec<Tok>,
}

#[derive(Debug, Clone)]
enum Tok {
    Byte(u8),
    /// `?`.
    One,
    /// A run of stars; `cross`: two or more (`**`), which may match `/`.
    Star {
        cross: bool,
    },
    /// A class as the set of bytes it takes (before the `/` rule).
    Class(Box<[bool; 256]>),
}

/// The outcome of matching a pattern at one start (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Res {
    Yes,
    No,
    AbortAll,
    AbortToStarStar,
}

/// Where a pattern may start in the text (rsync's `wildmatch_array`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// At the start only.
    Whole,
    /// At the start or right after any `/`.
    AnySlash,
    /// On the last N `/`-separated components (none if fewer).
    Tail(usize),
}

impl Pattern {
    /// Compile; Err is the reason the pattern can never match anything.
    pub fn new(p: &[u8]) -> Result<Pattern, String> {
        let mut toks = Vec::new();
        let mut i = 0;
        while i < p.len() {
            match p[i] {
                b'\\' => {
                    i += 1;
                    let Some(&c) = p.get(i) else {
                        return Err("it ends in a lone '\\'".into());
                    };
                    toks.push(Tok::Byte(c));
                }
                b'?' => toks.push(Tok::One),
                b'*' => {
                    let run = p[i..].iter().take_while(|&&c| c == b'*').count();
                    toks.push(Tok::Star { cross: run > 1 });
                    i += run - 1;
                }
                b'[' => {
                    let (set, next) = class(p, i + 1)?;
                    toks.push(Tok::Class(set));
                    i = next;
                }
                c => toks.push(Tok::Byte(c)),
            }
            i += 1;
        }
        Ok(Pattern { toks })
    }

    /// Does the whole of `text` match?
    pub fn matches(&self, text: &[u8]) -> bool {
        self.matches_at(text, Start::Whole)
    }

    /// Match from the starts `start` allows.
    pub fn matches_at(&self, text: &[u8], start: Start) -> bool {
        match start {
            Start::Whole => dowild(&self.toks, text) == Res::Yes,
            Start::Tail(n) => tail(text, n).is_some_and(|t| dowild(&self.toks, t) == Res::Yes),
            Start::AnySlash => {
                let mut r = dowild(&self.toks, text);
                if r == Res::Yes {
                    return true;
                }
                // Later starts are tried until one decides: yes, or "abort
                // all" (no later start can match); "abort to **" from a
                // start tells nothing about the next one.
                let mut at = 0;
                while r != Res::AbortAll {
                    let Some(k) = text[at..].iter().position(|&c| c == b'/') else {
                        return false;
                    };
                    at += k + 1;
                    r = dowild(&self.toks, &text[at..]);
                    if r == Res::Yes {
                        return true;
                    }
                    if r == Res::AbortToStarStar {
                        r = Res::No;
                    }
                }
                false
            }
        }
    }
}

/// The last `n` components of `text`: from after its n-th `/` from the
/// end, or all of it when it has exactly n components; None if fewer.
fn tail(text: &[u8], n: usize) -> Option<&[u8]> {
    let mut left = n;
    for (i, &c) in text.iter().enumerate().rev() {
        if c == b'/' {
            left -= 1;
            if left == 0 {
                return Some(&text[i + 1..]);
            }
        }
    }
    (left == 1).then_some(text)
}

/// The class whose body starts at `p[i]` (after the `[`): its member set
/// and the index of its closing `]`.
fn class(p: &[u8], mut i: usize) -> Result<(Box<[bool; 256]>, usize), String> {
    const OPEN: &str = "a '[' is never closed";
    let mut set = Box::new([false; 256]);
    let negate = matches!(p.get(i), Some(b'!' | b'^'));
    if negate {
        i += 1;
    }
    // `prev`: the last single member, the low end a following `-` may
    // start a range from (none after a range or a [:name:]).
    let mut prev: Option<u8> = None;
    let mut first = true;
    loop {
        let Some(&c) = p.get(i) else {
            return Err(OPEN.into());
        };
        if c == b']' && !first {
            break;
        }
        first = false;
        match c {
            b'\\' => {
                i += 1;
                let &e = p.get(i).ok_or(OPEN)?;
                set[e as usize] = true;
                prev = Some(e);
            }
            b'-' if prev.is_some() && p.get(i + 1).is_some_and(|&n| n != b']') => {
                i += 1;
                let mut hi = p[i];
                if hi == b'\\' {
                    i += 1;
                    hi = *p.get(i).ok_or(OPEN)?;
                }
                // The low end is already a member; a reversed range
                // adds nothing.
                let lo = prev.take().unwrap();
                for b in lo..=hi {
                    set[b as usize] = true;
                }
            }
            b'[' if p.get(i + 1) == Some(&b':') => {
                // `[:name:]` up to the first `]`; without a `:` right
                // before that `]`, the `[` is a plain member.
                let s = i + 2;
                let end = p[s..].iter().position(|&x| x == b']').ok_or(OPEN)? + s;
                if end > s && p[end - 1] == b':' {
                    let name = &p[s..end - 1];
                    let f = named_class(name).ok_or_else(|| {
                        format!("unknown class [:{}:]", String::from_utf8_lossy(name))
                    })?;
                    for b in 0..=255u8 {
                        if f(b) {
                            set[b as usize] = true;
                        }
                    }
                    i = end;
                    prev = None;
                } else {
                    set[b'[' as usize] = true;
                    prev = Some(b'[');
                }
            }
            _ => {
                set[c as usize] = true;
                prev = Some(c);
            }
        }
        i += 1;
    }
    if negate {
        for m in set.iter_mut() {
            *m = !*m;
        }
    }
    Ok((set, i))
}

/// The C locale's character classes (rsync runs them on single bytes; no
/// byte above 127 is in any of them).
fn named_class(name: &[u8]) -> Option<fn(u8) -> bool> {
    Some(match name {
        b"alnum" => |c: u8| c.is_ascii_alphanumeric(),
        b"alpha" => |c: u8| c.is_ascii_alphabetic(),
        b"blank" => |c: u8| c == b' ' || c == b'\t',
        b"cntrl" => |c: u8| c.is_ascii_control(),
        b"digit" => |c: u8| c.is_ascii_digit(),
        b"graph" => |c: u8| c.is_ascii_graphic(),
        b"lower" => |c: u8| c.is_ascii_lowercase(),
        b"print" => |c: u8| c.is_ascii_graphic() || c == b' ',
        b"punct" => |c: u8| c.is_ascii_punctuation(),
        // C's isspace also takes the vertical tab, Rust's does not.
        b"space" => |c: u8| c.is_ascii_whitespace() || c == 0x0b,
        b"upper" => |c: u8| c.is_ascii_uppercase(),
        b"xdigit" => |c: u8| c.is_ascii_hexdigit(),
        _ => return None,
    })
}

/// Match `toks` against all of `text` (rsync's `dowild`).
fn dowild(toks: &[Tok], text: &[u8]) -> Res {
    let mut t = 0;
    for (k, tok) in toks.iter().enumerate() {
        let star = matches!(tok, Tok::Star { .. });
        if t == text.len() && !star {
            return Res::AbortAll;
        }
        match tok {
            Tok::Byte(b) if text[t] != *b => return Res::No,
            Tok::Byte(_) => {}
            Tok::One if text[t] == b'/' => return Res::No,
            Tok::One => {}
            Tok::Class(set) if !set[text[t] as usize] || text[t] == b'/' => return Res::No,
            Tok::Class(_) => {}
            Tok::Star { cross } => return star_rest(&toks[k + 1..], &text[t..], *cross),
        }
        t += 1;
    }
    if t == text.len() {
        Res::Yes
    } else {
        Res::No
    }
}

/// A star (`cross`: `**`) followed by `rest`, against `text`.
fn star_rest(rest: &[Tok], text: &[u8], cross: bool) -> Res {
    if rest.is_empty() {
        // A trailing `**` takes everything, a trailing `*` what has no `/`.
        return if cross || !text.contains(&b'/') {
            Res::Yes
        } else {
            Res::No
        };
    }
    for i in 0..text.len() {
        match dowild(rest, &text[i..]) {
            Res::No => {
                if !cross && text[i] == b'/' {
                    return Res::AbortToStarStar;
                }
            }
            Res::AbortToStarStar if cross => {}
            r => return r,
        }
    }
    Res::AbortAll
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rsync's own table of wildmatch cases (its wildtest.txt), pair for
    /// pair: (does `text` match `pattern`?, text, pattern). `None` for the
    /// malformed patterns rsync can never match, which ramsys refuses.
    #[rustfmt::skip]
    const TABLE: &[(Option<bool>, &[u8], &[u8])] = &[
        // Basic wildmat features.
        (Some(true), b"foo", b"foo"),
        (Some(false), b"foo", b"bar"),
        (Some(true), b"", b""),
        (Some(true), b"foo", b"???"),
        (Some(false), b"foo", b"??"),
        (Some(true), b"foo", b"*"),
        (Some(true), b"foo", b"f*"),
        (Some(false), b"foo", b"*f"),
        (Some(true), b"foo", b"*foo*"),
        (Some(true), b"foobar", b"*ob*a*r*"),
        (Some(true), b"aaaaaaabababab", b"*ab"),
        (Some(true), b"foo*", b"foo\\*"),
        (Some(false), b"foobar", b"foo\\*bar"),
        (Some(true), b"f\\oo", b"f\\\\oo"),
        (Some(true), b"ball", b"*[al]?"),
        (Some(false), b"ten", b"[ten]"),
        (Some(true), b"ten", b"**[!te]"),
        (Some(false), b"ten", b"**[!ten]"),
        (Some(true), b"ten", b"t[a-g]n"),
        (Some(false), b"ten", b"t[!a-g]n"),
        (Some(true), b"ton", b"t[!a-g]n"),
        (Some(true), b"ton", b"t[^a-g]n"),
        (Some(true), b"a]b", b"a[]]b"),
        (Some(true), b"a-b", b"a[]-]b"),
        (Some(true), b"a]b", b"a[]-]b"),
        (Some(false), b"aab", b"a[]-]b"),
        (Some(true), b"aab", b"a[]a-]b"),
        (Some(true), b"]", b"]"),
        // Extended slash-matching features.
        (Some(false), b"foo/baz/bar", b"foo*bar"),
        (Some(true), b"foo/baz/bar", b"foo**bar"),
        (Some(false), b"foo/bar", b"foo?bar"),
        (Some(false), b"foo/bar", b"foo[/]bar"),
        (Some(false), b"foo/bar", b"f[^eiu][^eiu][^eiu][^eiu][^eiu]r"),
        (Some(true), b"foo-bar", b"f[^eiu][^eiu][^eiu][^eiu][^eiu]r"),
        (Some(false), b"foo", b"**/foo"),
        (Some(true), b"/foo", b"**/foo"),
        (Some(true), b"bar/baz/foo", b"**/foo"),
        (Some(false), b"bar/baz/foo", b"*/foo"),
        (Some(false), b"foo/bar/baz", b"**/bar*"),
        (Some(true), b"deep/foo/bar/baz", b"**/bar/*"),
        (Some(false), b"deep/foo/bar/baz/", b"**/bar/*"),
        (Some(true), b"deep/foo/bar/baz/", b"**/bar/**"),
        (Some(false), b"deep/foo/bar", b"**/bar/*"),
        (Some(true), b"deep/foo/bar/", b"**/bar/**"),
        (Some(true), b"foo/bar/baz", b"**/bar**"),
        (Some(true), b"foo/bar/baz/x", b"*/bar/**"),
        (Some(false), b"deep/foo/bar/baz/x", b"*/bar/**"),
        (Some(true), b"deep/foo/bar/baz/x", b"**/bar/*/*"),
        // Various additional tests.
        (Some(false), b"acrt", b"a[c-c]st"),
        (Some(true), b"acrt", b"a[c-c]rt"),
        (Some(false), b"]", b"[!]-]"),
        (Some(true), b"a", b"[!]-]"),
        (None, b"", b"\\"),
        (None, b"\\", b"\\"),
        (None, b"/\\", b"*/\\"),
        (Some(true), b"/\\", b"*/\\\\"),
        (Some(true), b"foo", b"foo"),
        (Some(true), b"@foo", b"@foo"),
        (Some(false), b"foo", b"@foo"),
        (Some(true), b"[ab]", b"\\[ab]"),
        (Some(true), b"[ab]", b"[[]ab]"),
        (Some(true), b"[ab]", b"[[:]ab]"),
        (None, b"[ab]", b"[[::]ab]"),
        (Some(true), b"[ab]", b"[[:digit]ab]"),
        (Some(true), b"[ab]", b"[\\[:]ab]"),
        (Some(true), b"?a?b", b"\\??\\?b"),
        (Some(true), b"abc", b"\\a\\b\\c"),
        (Some(false), b"foo", b""),
        (Some(true), b"foo/bar/baz/to", b"**/t[o]"),
        // Character classes.
        (Some(true), b"a1B", b"[[:alpha:]][[:digit:]][[:upper:]]"),
        (Some(false), b"a", b"[[:digit:][:upper:][:space:]]"),
        (Some(true), b"A", b"[[:digit:][:upper:][:space:]]"),
        (Some(true), b"1", b"[[:digit:][:upper:][:space:]]"),
        (None, b"1", b"[[:digit:][:upper:][:spaci:]]"),
        (Some(true), b" ", b"[[:digit:][:upper:][:space:]]"),
        (Some(false), b".", b"[[:digit:][:upper:][:space:]]"),
        (Some(true), b".", b"[[:digit:][:punct:][:space:]]"),
        (Some(true), b"5", b"[[:xdigit:]]"),
        (Some(true), b"f", b"[[:xdigit:]]"),
        (Some(true), b"D", b"[[:xdigit:]]"),
        (Some(true), b"_", b"[[:alnum:][:alpha:][:blank:][:cntrl:][:digit:][:graph:][:lower:][:print:][:punct:][:space:][:upper:][:xdigit:]]"),
        (Some(true), b"\x7f", b"[^[:alnum:][:alpha:][:blank:][:digit:][:graph:][:lower:][:print:][:punct:][:space:][:upper:][:xdigit:]]"),
        (Some(true), b".", b"[^[:alnum:][:alpha:][:blank:][:cntrl:][:digit:][:lower:][:space:][:upper:][:xdigit:]]"),
        (Some(true), b"5", b"[a-c[:digit:]x-z]"),
        (Some(true), b"b", b"[a-c[:digit:]x-z]"),
        (Some(true), b"y", b"[a-c[:digit:]x-z]"),
        (Some(false), b"q", b"[a-c[:digit:]x-z]"),
        // Additional tests, including some malformed wildmats.
        (Some(true), b"]", b"[\\\\-^]"),
        (Some(false), b"[", b"[\\\\-^]"),
        (Some(true), b"-", b"[\\-_]"),
        (Some(true), b"]", b"[\\]]"),
        (Some(false), b"\\]", b"[\\]]"),
        (Some(false), b"\\", b"[\\]]"),
        (None, b"ab", b"a[]b"),
        (None, b"a[]b", b"a[]b"),
        (None, b"ab[", b"ab["),
        (None, b"ab", b"[!"),
        (None, b"ab", b"[-"),
        (Some(true), b"-", b"[-]"),
        (None, b"-", b"[a-"),
        (None, b"-", b"[!a-"),
        (Some(true), b"-", b"[--A]"),
        (Some(true), b"5", b"[--A]"),
        (Some(true), b" ", b"[ --]"),
        (Some(true), b"$", b"[ --]"),
        (Some(true), b"-", b"[ --]"),
        (Some(false), b"0", b"[ --]"),
        (Some(true), b"-", b"[---]"),
        (Some(true), b"-", b"[------]"),
        (Some(false), b"j", b"[a-e-n]"),
        (Some(true), b"-", b"[a-e-n]"),
        (Some(true), b"a", b"[!------]"),
        (Some(false), b"[", b"[]-a]"),
        (Some(true), b"^", b"[]-a]"),
        (Some(false), b"^", b"[!]-a]"),
        (Some(true), b"[", b"[!]-a]"),
        (Some(true), b"^", b"[a^bc]"),
        (Some(true), b"-b]", b"[a-]b]"),
        (None, b"\\", b"[\\]"),
        (Some(true), b"\\", b"[\\\\]"),
        (Some(false), b"\\", b"[!\\\\]"),
        (Some(true), b"G", b"[A-\\\\]"),
        (Some(false), b"aaabbb", b"b*a"),
        (Some(false), b"aabcaa", b"*ba*"),
        (Some(true), b",", b"[,]"),
        (Some(true), b",", b"[\\\\,]"),
        (Some(true), b"\\", b"[\\\\,]"),
        (Some(true), b"-", b"[,-.]"),
        (Some(false), b"+", b"[,-.]"),
        (Some(false), b"-.]", b"[,-.]"),
        (Some(true), b"2", b"[\\1-\\3]"),
        (Some(true), b"3", b"[\\1-\\3]"),
        (Some(false), b"4", b"[\\1-\\3]"),
        (Some(true), b"\\", b"[[-\\]]"),
        (Some(true), b"[", b"[[-\\]]"),
        (Some(true), b"]", b"[[-\\]]"),
        (Some(false), b"-", b"[[-\\]]"),
        // Recursion and the abort rules.
        (Some(true), b"-adobe-courier-bold-o-normal--12-120-75-75-m-70-iso8859-1", b"-*-*-*-*-*-*-12-*-*-*-m-*-*-*"),
        (Some(false), b"-adobe-courier-bold-o-normal--12-120-75-75-X-70-iso8859-1", b"-*-*-*-*-*-*-12-*-*-*-m-*-*-*"),
        (Some(false), b"-adobe-courier-bold-o-normal--12-120-75-75-/-70-iso8859-1", b"-*-*-*-*-*-*-12-*-*-*-m-*-*-*"),
        (Some(true), b"/adobe/courier/bold/o/normal//12/120/75/75/m/70/iso8859/1", b"/*/*/*/*/*/*/12/*/*/*/m/*/*/*"),
        (Some(false), b"/adobe/courier/bold/o/normal//12/120/75/75/X/70/iso8859/1", b"/*/*/*/*/*/*/12/*/*/*/m/*/*/*"),
        (Some(true), b"abcd/abcdefg/abcdefghijk/abcdefghijklmnop.txt", b"**/*a*b*g*n*t"),
        (Some(false), b"abcd/abcdefg/abcdefghijk/abcdefghijklmnop.txtz", b"**/*a*b*g*n*t"),
    ];

    #[test]
    fn rsyncs_wildtest_table_pair_for_pair() {
        let mut wrong = Vec::new();
        for (want, text, pat) in TABLE {
            let got = Pattern::new(pat).map(|p| p.matches(text)).ok();
            if got != *want {
                wrong.push(format!(
                    "{:?} vs {:?}: got {got:?}, want {want:?}",
                    String::from_utf8_lossy(text),
                    String::from_utf8_lossy(pat)
                ));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        assert_eq!(TABLE.len(), 144);
    }

    #[test]
    fn malformed_patterns_say_why() {
        for (p, says) in [
            (&b"ab["[..], "never closed"),
            (b"a[]b", "never closed"),
            (b"[\\]", "never closed"),
            (b"x\\", "lone"),
            (b"[[:spaci:]]", "[:spaci:]"),
            (b"[[::]ab]", "[::]"),
        ] {
            let e = Pattern::new(p).unwrap_err();
            assert!(e.contains(says), "{p:?}: {e}");
        }
    }

    #[test]
    fn starts_any_slash_and_tails() {
        let p = Pattern::new(b"foo**too").unwrap();
        assert!(!p.matches(b"bar/down/to/foo/too"));
        assert!(p.matches_at(b"bar/down/to/foo/too", Start::AnySlash));
        assert!(!p.matches_at(b"bar/down/to/foo/tool", Start::AnySlash));
        let p = Pattern::new(b"a/*").unwrap();
        assert!(p.matches_at(b"x/a/b", Start::Tail(2)));
        assert!(p.matches_at(b"a/b", Start::Tail(2)));
        assert!(!p.matches_at(b"b", Start::Tail(2)));
        assert_eq!(tail(b"a/b/c", 1), Some(&b"c"[..]));
        assert_eq!(tail(b"a/b/c", 3), Some(&b"a/b/c"[..]));
        assert_eq!(tail(b"a/b/c", 4), None);
        // "Abort to **" at one start does not end the search.
        let p = Pattern::new(b"a*b").unwrap();
        assert!(p.matches_at(b"a/ab", Start::AnySlash));
        assert!(!p.matches(b"a/ab"));
    }
}
