use super::*;
use proptest::prelude::*;

/// The table of accepted spellings (docs/CONFIG.md and README quote it).
#[test]
fn accepted_sizes() {
    let table: &[(&str, u64)] = &[
        ("0", 0),
        ("65536", 65536),
        ("1b", 1),
        ("512B", 512),
        ("1K", 1 << 10),
        ("1k", 1 << 10),
        ("1KiB", 1 << 10),
        ("1kib", 1 << 10),
        ("1KB", 1000),
        ("4M", 4 << 20),
        ("4MiB", 4 << 20),
        ("4MB", 4_000_000),
        ("512MB", 512_000_000),
        ("512 MiB", 512 << 20),
        (" 2G ", 2 << 30),
        ("2GB", 2_000_000_000),
        ("1T", 1 << 40),
        ("1TB", 1_000_000_000_000),
        ("1P", 1 << 50),
        ("1.5K", 1536),
        ("1.5G", 3 << 29),
        (".5M", 1 << 19),
        ("1.", 1),
        ("0.0004K", 0),
        ("0.0005K", 1),
        ("16383P", 16383 << 50),
    ];
    for &(s, v) in table {
        assert_eq!(parse_size(s), Ok(v), "{s}");
    }
}

/// Block sizes (4 KiB pages): accepted spellings, and the one line that
/// refuses an unaligned one with the nearest valid spelling.
#[test]
fn aligned_sizes() {
    const PAGE: u64 = 4096;
    for (s, v) in [
        ("4M", 4 << 20),
        ("4MiB", 4 << 20),
        ("4096", 4096),
        ("4K", 4096),
        ("64KiB", 64 << 10),
        ("1.5M", 3 << 19),
        ("4096000B", 4_096_000),
        ("0", 0),
    ] {
        assert_eq!(parse_aligned(s, PAGE), Ok(v), "{s}");
    }
    for (s, msg) in [
        (
            "4MB",
            "4MB is 4000000 bytes, not a multiple of 4 KiB; use 4MiB",
        ),
        (
            "64KB",
            "64KB is 64000 bytes, not a multiple of 4 KiB; use 64KiB",
        ),
        (
            "1 GB",
            "1 GB is 1000000000 bytes, not a multiple of 4 KiB; use 1GiB",
        ),
        (
            "5000",
            "5000 bytes is 5000 bytes, not a multiple of 4 KiB; use 4KiB",
        ),
        (
            "1.1M",
            "1.1M is 1153434 bytes, not a multiple of 4 KiB; use 1128KiB",
        ),
        ("100", "100 is 100 bytes, not a multiple of 4 KiB; use 4KiB"),
    ] {
        let e = parse_aligned(s, PAGE).unwrap_err().to_string();
        assert_eq!(e, msg.replace("5000 bytes is", "5000 is"), "{s}");
        assert!(!e.contains('\n'));
        // The suggestion is itself accepted.
        let hint = e.rsplit("use ").next().unwrap();
        assert!(parse_aligned(hint, PAGE).is_ok(), "{s}: {hint}");
    }
    assert!(parse_aligned("4Q", PAGE).is_err());
}

#[test]
fn accepted_rates() {
    let table: &[(&str, u64)] = &[
        ("100", 100 << 10),
        ("0", 0),
        ("1024b", 1024),
        ("1024B/s", 1024),
        ("512K", 512 << 10),
        ("20M", 20 << 20),
        ("20MiB/s", 20 << 20),
        ("20MB", 20_000_000),
        ("20MB/s", 20_000_000),
        ("1.5G", 3 << 29),
        ("1.5", 1536),
    ];
    for &(s, v) in table {
        assert_eq!(parse_rate(s), Ok(v), "{s}");
    }
}

#[test]
fn refused() {
    for s in [
        "",
        " ",
        ".",
        "K",
        "-1",
        "+1",
        "1X",
        "1KX",
        "1Kb/s",
        "1KiBB",
        "1 2",
        "1..5",
        "1e3",
        "1,5",
        "16384P",
        "99999999999999999999",
        "1M/s",
        "ten",
    ] {
        assert!(parse_size(s).is_err(), "size {s:?}");
    }
    for s in ["", "/s", "1/s/s", "1X/s", "M", "-5", "1e3", "20 M /s x"] {
        assert!(parse_rate(s).is_err(), "rate {s:?}");
    }
    // One line that quotes what the user wrote.
    let e = parse_rate("20Q/s").unwrap_err().to_string();
    assert!(e.contains("\"20Q/s\"") && !e.contains('\n'), "{e}");
    let e = parse_size("16384P").unwrap_err().to_string();
    assert!(e.contains("too large"), "{e}");
}

#[test]
fn formats() {
    assert_eq!(format_size(0), "0 B");
    assert_eq!(format_size(512), "512 B");
    assert_eq!(format_size(1023), "1023 B");
    assert_eq!(format_size(1024), "1.0 KiB");
    assert_eq!(format_size(5 << 20), "5.0 MiB");
    assert_eq!(format_size((1 << 20) - 1), "1.0 MiB");
    assert_eq!(format_size(64 << 30), "64.0 GiB");
    assert_eq!(format_size(u64::MAX), "16384.0 PiB");
    assert_eq!(format_rate(20 << 20), "20.0 MiB/s");
}

const SUFFIXES: &[(&str, u64)] = &[
    ("", 1),
    ("B", 1),
    ("K", 1 << 10),
    ("KiB", 1 << 10),
    ("KB", 1000),
    ("M", 1 << 20),
    ("mib", 1 << 20),
    ("MB", 1_000_000),
    ("G", 1 << 30),
    ("GiB", 1 << 30),
    ("gb", 1_000_000_000),
    ("T", 1 << 40),
    ("TB", 1_000_000_000_000),
];

proptest! {
    /// Any text: an answer or an error, never a panic.
    #[test]
    fn never_panics(s in "\\PC{0,24}") {
        let _ = parse_size(&s);
        let _ = parse_rate(&s);
    }

    /// Text that looks almost right (digits, dots, unit letters, blanks).
    #[test]
    fn near_misses_never_panic(s in "[0-9. kKmMgGtTpPiIbB/s]{0,16}") {
        if let Ok(v) = parse_size(&s) {
            // Whatever is accepted is accepted as a rate (bare counts KiB).
            let r = parse_rate(&s);
            prop_assert!(r.is_ok() || v > u64::MAX / 1024, "{s:?}");
        }
    }

    /// n with every suffix, with and without blanks and case changes, is
    /// exactly n times the suffix's factor, or "too large".
    #[test]
    fn integer_times_factor(n in 0u64..1 << 40, i in 0..SUFFIXES.len(), blank in any::<bool>(), upper in any::<bool>()) {
        let (suf, mult) = SUFFIXES[i];
        let suf = if upper { suf.to_ascii_uppercase() } else { suf.to_ascii_lowercase() };
        let s = format!("{n}{}{suf}", if blank { " " } else { "" });
        match n.checked_mul(mult) {
            Some(v) => prop_assert_eq!(parse_size(&s), Ok(v)),
            None => prop_assert!(parse_size(&s).is_err()),
        }
        if !suf.is_empty() {
            prop_assert_eq!(parse_rate(&format!("{s}/s")).ok(), parse_size(&s).ok());
        }
    }

    /// A fraction is rounded to the nearest byte.
    #[test]
    fn fractions_round(int in 0u64..1 << 20, frac in 0u32..1000, i in 0..SUFFIXES.len()) {
        let (suf, mult) = SUFFIXES[i];
        let s = format!("{int}.{frac:03}{suf}");
        let exact = (int as u128 * 1000 + frac as u128) * mult as u128;
        let want = ((exact + 500) / 1000) as u64;
        prop_assert_eq!(parse_size(&s), Ok(want));
    }

    /// The formatter's text parses back to within its rounding (0.05 of
    /// its unit) and never shows 1024 or more of a unit.
    #[test]
    fn format_round_trips(b in any::<u64>()) {
        let text = format_size(b);
        let num: f64 = text.split(' ').next().unwrap().parse().unwrap();
        prop_assert!(num < 1024.0 || text.ends_with("PiB"), "{text}");
        let unit = text.split(' ').nth(1).unwrap();
        let mult = factor(unit, 1).unwrap() as f64;
        let back = parse_size(&text.replace(' ', ""));
        if b < 1 << 60 {
            let back = back.unwrap() as f64;
            prop_assert!((back - b as f64).abs() <= 0.051 * mult, "{b} -> {text} -> {back}");
        }
        prop_assert_eq!(format_rate(b), format!("{text}/s"));
    }
}
