//! TOML helpers shared by the daemon's config (crate::daemon::config) and the
//! users table (crate::daemon::users): sizes, typed values, and syntax
//! errors as one line with a line number.

/// A size key: the workspace's one unit rule (ramsys_units, issue 37), so
/// `memory = "512MB"` means what `serve --memory 512MB` means.
pub fn parse_size(s: &str) -> Result<u64, String> {
    ramsys_units::parse_size(s).map_err(String::from)
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
