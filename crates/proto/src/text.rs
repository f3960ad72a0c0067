//! Text from a peer or the file system made safe to print (issue 34): a
//! file name, a user name or a site member's address may hold a newline,
//! a carriage return or a terminal escape sequence, which in `ramsys
//! status`, an error line or a log line would forge rows or take over the
//! terminal. Every human output escapes them with [`escape`] (JSON output
//! is escaped by JSON itself).
//!
//! Escaped: C0 controls and DEL (`\n`, `\r`, `\t`, else `\xNN`), C1
//! controls (`\u{NN}`), and the characters that reorder or hide text on a
//! terminal: bidirectional overrides and isolates, the line and paragraph
//! separators (`\u{NNNN}`). Everything else, other non-ASCII text
//! included, is printed as it is.

use std::borrow::Cow;
use std::fmt::{self, Write};

fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{200e}' | '\u{200f}' | '\u{061c}'   // marks: LRM, RLM, ALM
            | '\u{202a}'..='\u{202e}'              // embeddings, overrides
            | '\u{2066}'..='\u{2069}'              // isolates
            | '\u{2028}' | '\u{2029}') // line, paragraph separators
}

fn write_escaped(out: &mut impl Write, c: char) -> fmt::Result {
    match c {
        '\n' => out.write_str("\\n"),
        '\r' => out.write_str("\\r"),
        '\t' => out.write_str("\\t"),
        c if (c as u32) < 0x80 => write!(out, "\\x{:02x}", c as u32),
        c => write!(out, "\\u{{{:x}}}", c as u32),
    }
}

/// `s` with every character that could forge a line or drive a terminal
/// escaped; borrowed when there is none.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if needs_escape(c) {
            let _ = write_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// [`escape`] of bytes read as UTF-8 (invalid sequences as U+FFFD).
pub fn escape_bytes(b: &[u8]) -> String {
    escape(&String::from_utf8_lossy(b)).into_owned()
}

/// Displays its text escaped, padded as `{:<20}` asks (the width counts
/// the escaped text).
pub struct Escaped<'a>(pub &'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&escape(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn forged_rows_and_escape_sequences_are_escaped() {
        assert_eq!(escape("plain/ñame.txt"), "plain/ñame.txt");
        assert!(matches!(escape("plain"), Cow::Borrowed(_)));
        assert_eq!(
            escape("a\nevil 100% up\r\x1b[2J\x07"),
            "a\\nevil 100% up\\r\\x1b[2J\\x07"
        );
        assert_eq!(escape("x\u{9b}31m"), "x\\u{9b}31m");
        assert_eq!(escape("abc\u{202e}txt.exe"), "abc\\u{202e}txt.exe");
        assert_eq!(escape("\t\x7f"), "\\t\\x7f");
        assert_eq!(escape_bytes(b"n\xff\n"), "n\u{fffd}\\n");
        assert_eq!(format!("[{:<6}]", Escaped("a\nb")), "[a\\nb  ]");
    }

    proptest! {
        /// Whatever the input, the output holds no character a terminal
        /// or a log reader acts on, and is unchanged when there was none.
        #[test]
        fn nothing_active_survives(s in any::<String>()) {
            let e = escape(&s);
            prop_assert!(!e.chars().any(needs_escape));
            if !s.chars().any(needs_escape) {
                prop_assert_eq!(e.as_ref(), s.as_str());
            }
        }
    }
}
