//! `deserialize_with` helpers for the values of the operator's files: each
//! size through the workspace's one size parser and each rate through the
//! one rate parser (ramsys_units, issue 37), so `memory = "512MB"` means
//! what `serve --memory 512MB` means. A refusal says "expected X, got V";
//! super::from_str puts the key and line in front.

use std::fmt;
use std::str::FromStr;

use serde::de::{Deserializer, Error, Visitor};

/// A TOML scalar, whatever its type.
enum Scalar {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Scalar::Int(n) => write!(f, "{n}"),
            Scalar::Float(x) => write!(f, "{x}"),
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Str(s) => write!(f, "{s:?}"),
        }
    }
}

struct ScalarVisitor(&'static str);

impl Visitor<'_> for ScalarVisitor {
    type Value = Scalar;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.0)
    }
    fn visit_i64<E: Error>(self, v: i64) -> Result<Scalar, E> {
        Ok(Scalar::Int(v))
    }
    fn visit_u64<E: Error>(self, v: u64) -> Result<Scalar, E> {
        Ok(i64::try_from(v).map_or(Scalar::Float(v as f64), Scalar::Int))
    }
    fn visit_f64<E: Error>(self, v: f64) -> Result<Scalar, E> {
        Ok(Scalar::Float(v))
    }
    fn visit_bool<E: Error>(self, v: bool) -> Result<Scalar, E> {
        Ok(Scalar::Bool(v))
    }
    fn visit_str<E: Error>(self, v: &str) -> Result<Scalar, E> {
        Ok(Scalar::Str(v.to_string()))
    }
}

fn scalar<'de, D: Deserializer<'de>>(d: D, expecting: &'static str) -> Result<Scalar, D::Error> {
    d.deserialize_any(ScalarVisitor(expecting))
}

fn refuse<E: Error>(expecting: &str, got: &Scalar) -> E {
    E::custom(format!("expected {expecting}, got {got}"))
}

/// An integer of 1 or more.
pub(crate) fn positive<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64>,
{
    const E: &str = "a positive integer";
    match scalar(d, E)? {
        Scalar::Int(n) if n > 0 => T::try_from(n)
            .map(Some)
            .map_err(|_| D::Error::custom(format!("{n} is too large"))),
        got => Err(refuse(E, &got)),
    }
}

/// An integer of 1 or more, held as u32 (larger counts mean "no limit").
pub(crate) fn positive_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    Ok(positive::<D, u64>(d)?.map(|n| n.min(u32::MAX as u64) as u32))
}

/// An integer of 0 or more.
pub(crate) fn count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    const E: &str = "a number of 0 or more";
    match scalar(d, E)? {
        Scalar::Int(n) if n >= 0 => Ok(Some(n as u64)),
        got => Err(refuse(E, &got)),
    }
}

/// A size: bytes as a positive integer, or a string in the one unit rule
/// ("512MB" = 512,000,000, "512M" = "512MiB" = 2^29).
pub(crate) fn size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    const E: &str = "a size (bytes, or like \"512MiB\")";
    match scalar(d, E)? {
        Scalar::Int(n) if n > 0 => Ok(Some(n as u64)),
        Scalar::Str(s) => ramsys_units::parse_size(&s)
            .map(Some)
            .map_err(|e| D::Error::custom(String::from(e))),
        got => Err(refuse(E, &got)),
    }
}

/// A rate: bytes per second as an integer (0 = no limit), or a string in
/// rsync's units ("20M"; data::rate::parse_rate).
pub(crate) fn rate<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    const E: &str = "bytes per second or a rate like \"20M\"";
    match scalar(d, E)? {
        Scalar::Int(n) if n >= 0 => crate::data::rate::check_rate(n as u64).map(Some),
        Scalar::Str(s) => crate::data::rate::parse_rate(&s).map(Some),
        got => Err(format!("expected {E}, got {got}")),
    }
    .map_err(D::Error::custom)
}

/// A value with a FromStr (send_path, direct, numa): a string, or an
/// integer read as its digits (`numa = 1`).
pub(crate) fn parsed<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr<Err = String>,
{
    match scalar(d, "a string")? {
        Scalar::Str(s) => s.parse(),
        Scalar::Int(n) => n.to_string().parse(),
        got => Err(format!("expected a string, got {got}")),
    }
    .map(Some)
    .map_err(D::Error::custom)
}

/// A positive, finite number (Gbit/s).
pub(crate) fn gbps<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    const E: &str = "a positive number of Gbit/s";
    match scalar(d, E)? {
        Scalar::Int(n) if n > 0 => Ok(Some(n as f64)),
        Scalar::Float(g) if g > 0.0 && g.is_finite() => Ok(Some(g)),
        got => Err(refuse(E, &got)),
    }
}

/// `[site] interval_ms`: 1-1024 (check_interval).
pub(crate) fn interval_ms<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    match positive::<D, u64>(d)? {
        Some(n) => check_interval(n).map(Some).map_err(D::Error::custom),
        None => Ok(None),
    }
}

/// `[site] max_load`: percent, 1-100, held as the busy fraction.
pub(crate) fn load_pct<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    match positive::<D, u64>(d)? {
        Some(n) => check_load_pct(n).map(Some).map_err(D::Error::custom),
        None => Ok(None),
    }
}

/// Check an interval given by a user.
pub fn check_interval(ms: u64) -> Result<u64, String> {
    if (1..=1024).contains(&ms) {
        Ok(ms)
    } else {
        Err(format!("site interval {ms} ms: must be 1-1024"))
    }
}

/// Check a `max_load` given by a user, in percent; the busy fraction.
pub fn check_load_pct(pct: u64) -> Result<f64, String> {
    if (1..=100).contains(&pct) {
        Ok(pct as f64 / 100.0)
    } else {
        Err(format!("max load {pct} %: must be 1-100"))
    }
}
