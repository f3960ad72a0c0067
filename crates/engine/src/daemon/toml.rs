//! TOML helpers shared by the daemon's config (crate::daemon::config) and the
//! users table (crate::daemon::users): sizes, typed values, and syntax
//! errors as one line with a line number.

/// Parse a size: a number of bytes, or with a K/M/G/T suffix (binary).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                'B' => 1,
                _ => return Err(format!("unknown size suffix in {s:?}")),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("expected a size like 512M, got {s:?}"))
}

pub(crate) fn positive(key: &str, v: &toml::Value) -> Result<usize, String> {
    match v.as_integer() {
        Some(n) if n > 0 => Ok(n as usize),
        _ => Err(format!("key `{key}`: expected a positive integer, got {v}")),
    }
}

pub(crate) fn string<'a>(key: &str, v: &'a toml::Value) -> Result<&'a str, String> {
    v.as_str()
        .ok_or_else(|| format!("key `{key}`: expected a string, got {v}"))
}

/// A TOML syntax error as one line with its line number.
pub(crate) fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let line = e
        .span()
        .map(|s| text[..s.start.min(text.len())].lines().count().max(1));
    let msg = e.message().replace('\n', " ");
    match line {
        Some(l) => format!("TOML syntax error on line {l}: {msg}"),
        None => format!("TOML syntax error: {msg}"),
    }
}

/// A refusal as one line (issue 34): messages quote the operator's values,
/// and a TOML string may hold a newline or a control character that would
/// otherwise split or forge the line a reload or `serve` prints
/// (tests/fuzz_operator_files.rs).
pub(crate) fn one_line(e: String) -> String {
    ramsys_proto::text::escape(e.trim_end()).into_owned()
}
