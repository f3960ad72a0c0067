//! Which key a byte offset of a TOML file belongs to: its dotted path and
//! the section it sits in (`[devices.sda]`, `[[user]] #2 (bob)`), from the
//! spans toml_edit keeps. serde's errors carry only the offset.

use std::ops::Range;

use toml_edit::{Item, Table, Value};

#[derive(Default)]
pub(super) struct Place {
    pub path: Vec<String>,
    /// The enclosing `[table]` or `[[array]] #N`; None at the top level.
    pub section: Option<String>,
    /// The offset is a table's own (a missing key, a whole-entry check).
    pub table: bool,
}

pub(super) fn locate(root: &Table, pos: usize) -> Place {
    let mut path = Vec::new();
    table(root, &mut path, &None, pos).unwrap_or_default()
}

fn within(span: Option<Range<usize>>, pos: usize) -> bool {
    span.is_some_and(|s| s.start <= pos && pos < s.end.max(s.start + 1))
}

fn found(path: &[String], section: &Option<String>, table: bool) -> Option<Place> {
    Some(Place {
        path: path.to_vec(),
        section: section.clone(),
        table,
    })
}

fn table(t: &Table, path: &mut Vec<String>, section: &Option<String>, pos: usize) -> Option<Place> {
    for (k, item) in t.iter() {
        path.push(k.to_string());
        let r = if within(t.key(k).and_then(|k| k.span()), pos) {
            found(path, section, false)
        } else {
            self::item(item, path, section, pos)
        };
        path.pop();
        if r.is_some() {
            return r;
        }
    }
    None
}

fn item(it: &Item, path: &mut Vec<String>, section: &Option<String>, pos: usize) -> Option<Place> {
    match it {
        Item::Table(t) => {
            let own = if t.is_implicit() || t.is_dotted() {
                section.clone()
            } else {
                Some(format!("[{}]", path.join(".")))
            };
            // A table's span covers its body: its keys first.
            table(t, path, &own, pos).or_else(|| {
                within(t.span(), pos)
                    .then(|| found(path, &own, true))
                    .flatten()
            })
        }
        Item::ArrayOfTables(a) => a.iter().enumerate().find_map(|(i, t)| {
            let name = t
                .get("name")
                .and_then(Item::as_str)
                .map(|n| format!(" ({n})"))
                .unwrap_or_default();
            let own = Some(format!("[[{}]] #{}{name}", path.join("."), i + 1));
            table(t, path, &own, pos).or_else(|| {
                within(t.span(), pos)
                    .then(|| found(path, &own, true))
                    .flatten()
            })
        }),
        Item::Value(v) => value(v, path, section, pos),
        Item::None => None,
    }
}

fn value(v: &Value, path: &mut Vec<String>, section: &Option<String>, pos: usize) -> Option<Place> {
    let inner = match v {
        Value::InlineTable(t) => t.iter().find_map(|(k, v)| {
            path.push(k.to_string());
            let r = if within(t.key(k).and_then(|k| k.span()), pos) {
                found(path, section, false)
            } else {
                value(v, path, section, pos)
            };
            path.pop();
            r
        }),
        Value::Array(a) => a.iter().find_map(|v| value(v, path, section, pos)),
        _ => None,
    };
    inner.or_else(|| {
        within(v.span(), pos)
            .then(|| found(path, section, false))
            .flatten()
    })
}
