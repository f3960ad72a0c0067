//! The operator's TOML files (the daemon config, crate::daemon::config, and
//! the users table, crate::daemon::users::file) read through serde derive
//! with `deny_unknown_fields` (issue 37). This module turns any refusal
//! into one line with the line number, the key's dotted path and its
//! section: `line 3: unknown key `memroy` at the top level (expected ...)`.
//! The loaders put the file name in front.

mod locate;
pub(crate) mod values;

use serde::de::DeserializeOwned;

/// Parse `text` into `T`; a refusal is one line naming the key.
pub(crate) fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    let doc = toml_edit::ImDocument::parse(text).map_err(|e| {
        let msg = e.message().replace('\n', " ");
        match e.span() {
            Some(s) => format!(
                "TOML syntax error on line {}: {msg}",
                line_of(text, s.start)
            ),
            None => format!("TOML syntax error: {msg}"),
        }
    })?;
    toml::from_str(text).map_err(|e| describe(&doc, text, &e))
}

fn line_of(text: &str, pos: usize) -> usize {
    let end = pos.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// serde's message with where it happened. serde words an unknown key
/// "unknown field `k`, expected one of ..." and a missing one "missing
/// field `k`"; toml's span points at the key, the value or the table.
fn describe(doc: &toml_edit::ImDocument<&str>, text: &str, e: &toml::de::Error) -> String {
    let msg = e.message().replace('\n', " ");
    let Some(span) = e.span() else { return msg };
    let line = line_of(text, span.start);
    let at = locate::locate(doc.as_table(), span.start);
    let key = at.path.join(".");
    let within = match &at.section {
        Some(s) => format!(" in {s}"),
        None => " at the top level".into(),
    };
    if let Some(rest) = msg.strip_prefix("unknown field `") {
        let expected = rest.split_once(", ").map_or("", |(_, x)| x);
        return format!("line {line}: unknown key `{key}`{within} ({expected})");
    }
    if let Some(field) = msg.strip_prefix("missing field ") {
        return format!("line {line}: missing {field}{within}");
    }
    match (&at.section, at.table) {
        (Some(s), true) => format!("line {line}: {s}: {msg}"),
        _ if key.is_empty() => format!("line {line}: {msg}"),
        (Some(s), false) if s.starts_with("[[") => {
            format!("line {line}: key `{key}` in {s}: {msg}")
        }
        _ => format!("line {line}: key `{key}`: {msg}"),
    }
}

/// A refusal as one line (issue 34): messages quote the operator's values,
/// and a TOML string may hold a newline or a control character that would
/// otherwise split or forge the line a reload or `serve` prints
/// (tests/fuzz_operator_files.rs).
pub(crate) fn one_line(e: String) -> String {
    ramsys_proto::text::escape(e.trim_end()).into_owned()
}
