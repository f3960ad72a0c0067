//! Sizes and rates as people write and read them: the one parser and the
//! one formatter of the workspace (issue 37: five parsers and four
//! formatters used to disagree on what `MB` means).
//!
//! # The unit rule (rsync's, `--max-size` and `--bwlimit`)
//!
//! | suffix (case-insensitive)  | factor   |
//! |----------------------------|----------|
//! | none, `B`                  | 1 (sizes); 1024 for a bare rate (KiB/s, as rsync's `--bwlimit`) |
//! | `K`, `KiB`                 | 1024     |
//! | `KB`                       | 1000     |
//! | `M`, `MiB` / `MB`          | 1024^2 / 1000^2 |
//! | `G`, `GiB` / `GB`          | 1024^3 / 1000^3 |
//! | `T`, `TiB` / `TB`          | 1024^4 / 1000^4 |
//! | `P`, `PiB` / `PB`          | 1024^5 / 1000^5 |
//!
//! So a single letter and the IEC `xiB` names are powers of 1024, the SI
//! `xB` names powers of 1000. The number may have a fraction (`1.5M`),
//! rounded to the nearest byte; blanks around the number and the unit are
//! allowed (`512 MiB`). A rate may end in `/s` (`20MiB/s`).
//!
//! Output ([`format_size`], [`format_rate`]) always uses the IEC names,
//! which read the same under every convention: `5.0 MiB`, `20.0 MiB/s`.
//! The sysfs sizes the topology readers parse (`107520K`) follow the
//! kernel's rule, which is the same as this one for single letters.

use std::fmt;

/// Why a size or a rate was refused: one line naming the text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitError(String);

impl fmt::Display for UnitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UnitError {}

impl From<UnitError> for String {
    fn from(e: UnitError) -> String {
        e.0
    }
}

/// The factor of a unit suffix (already trimmed), or None if unknown.
/// `bare` is the factor of no suffix at all.
fn factor(unit: &str, bare: u64) -> Option<u64> {
    let u = unit.to_ascii_lowercase();
    let (letter, rest) = match u.char_indices().nth(1) {
        Some((i, _)) => u.split_at(i),
        None if u.is_empty() => return Some(bare),
        None => (u.as_str(), ""),
    };
    let power = match letter {
        "b" if rest.is_empty() => return Some(1),
        "k" => 1,
        "m" => 2,
        "g" => 3,
        "t" => 4,
        "p" => 5,
        _ => return None,
    };
    let base: u64 = match rest {
        "" | "ib" => 1024,
        "b" => 1000,
        _ => return None,
    };
    Some(base.pow(power))
}

/// `int[.frac] * mult`, rounded to the nearest integer, in u64.
fn scale(int: &str, frac: &str, mult: u64) -> Option<u64> {
    let whole = if int.is_empty() {
        0u128
    } else {
        int.parse::<u128>().ok()?
    };
    let mut v = whole.checked_mul(mult as u128)?;
    if !frac.is_empty() {
        // Only as many digits as can matter (mult < 10^16): the rest
        // cannot change the rounded result.
        let digits = &frac[..frac.len().min(20)];
        let den = 10u128.pow(digits.len() as u32);
        let num: u128 = digits.parse().ok()?;
        v = v.checked_add((num * mult as u128 + den / 2) / den)?;
    }
    u64::try_from(v).ok()
}

/// Parse `t` (`s` without a rate's `/s`); messages quote `s`.
fn parse_with(s: &str, t: &str, what: &str, bare: u64, example: &str) -> Result<u64, UnitError> {
    let t = t.trim();
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(end);
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    let digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
    if int.is_empty() && frac.is_empty() || !digits(int) || !digits(frac) {
        return Err(UnitError(format!(
            "invalid {what} {s:?} (expected a number with an optional unit, e.g. {example})"
        )));
    }
    let mult = factor(unit.trim(), bare).ok_or_else(|| {
        UnitError(format!(
            "invalid {what} unit in {s:?} (K, M, G, T and KiB, MiB, GiB, TiB are powers of 1024; \
             KB, MB, GB, TB of 1000; B is bytes)"
        ))
    })?;
    scale(int, frac, mult).ok_or_else(|| UnitError(format!("{what} {s:?} is too large")))
}

/// A size in bytes: `65536`, `512K`, `4MiB`, `1.5G`, `20MB` (20 000 000).
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    parse_with(s, s, "size", 1, "4M")
}

/// A size that must be a multiple of `align` (a power of two): a block
/// size goes through O_DIRECT and the segment table in 4 KiB pages. Since
/// `MB` is 10^6 (the rule above), `4MB` = 4 000 000 is refused in one
/// line that says why and suggests the nearest spelling that is valid:
/// the same number in the binary unit when that fits (`4MiB`), else the
/// nearest multiple (`3908KiB`). Callers put the flag or key in front.
pub fn parse_aligned(s: &str, align: u64) -> Result<u64, UnitError> {
    debug_assert!(align.is_power_of_two());
    let v = parse_size(s)?;
    if v.is_multiple_of(align) {
        return Ok(v);
    }
    Err(UnitError(format!(
        "{} is {v} bytes, not a multiple of {}; use {}",
        s.trim(),
        format_size(align).replace(".0 ", " "),
        suggest_aligned(s, v, align)
    )))
}

/// The valid spelling nearest to what was meant: an SI suffix read as its
/// binary twin if that is aligned (`4MB` -> `4MiB`), else the nearest
/// non-zero multiple of `align` in the largest unit that divides it.
fn suggest_aligned(s: &str, v: u64, align: u64) -> String {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    for (si, iec) in [
        ("kb", "KiB"),
        ("mb", "MiB"),
        ("gb", "GiB"),
        ("tb", "TiB"),
        ("pb", "PiB"),
    ] {
        if let Some(num) = lower.strip_suffix(si) {
            let twin = format!("{}{iec}", num.trim());
            if parse_size(&twin).is_ok_and(|b| b.is_multiple_of(align) && b > 0) {
                return twin;
            }
        }
    }
    let near = ((v + align / 2) / align).max(1) * align;
    let mut unit = 0;
    let mut n = near;
    while n.is_multiple_of(1024) && unit < 5 {
        n /= 1024;
        unit += 1;
    }
    format!("{n}{}", ["", "KiB", "MiB", "GiB", "TiB", "PiB"][unit])
}

/// A rate in bytes per second, as rsync's `--bwlimit`: like a size, with
/// an optional `/s`, and a bare number counts KiB/s (`100` = 102 400).
pub fn parse_rate(s: &str) -> Result<u64, UnitError> {
    let t = s.trim();
    let t = t
        .strip_suffix("/s")
        .or_else(|| t.strip_suffix("/S"))
        .unwrap_or(t);
    parse_with(s, t, "rate", 1024, "20M")
}

/// A size for people: `512 B`, `5.0 MiB`, `64.0 GiB` (IEC names, one
/// decimal above a KiB).
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64;
    let mut u = 0;
    // Up while the one-decimal rendering would read 1024.0 or more.
    while v >= 1023.95 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// A rate for people: [`format_size`] per second (`20.0 MiB/s`).
pub fn format_rate(bytes_per_s: u64) -> String {
    format!("{}/s", format_size(bytes_per_s))
}

#[cfg(test)]
mod tests;
