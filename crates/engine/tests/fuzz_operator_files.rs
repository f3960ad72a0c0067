//! Property tests for the parsers of operator files (issue 34: "fuzz every
//! parser that takes input from an operator file"): the daemon config
//! (`serve --config`) and the users table. On any input, generated from
//! the real keys with values of every TOML type or as arbitrary text,
//! neither panics, and a refusal is one line, as SIGHUP's reload and
//! `serve` print it.

use std::path::Path;

use proptest::prelude::*;
use ramsys_engine::daemon::config::DaemonConfig;
use ramsys_engine::daemon::users::parse_users_file;

const TOP: &[&str] = &[
    "numa",
    "memory",
    "max_streams",
    "max_connections",
    "max_connections_per_addr",
    "handshake_timeout",
    "readers",
    "writers",
    "model",
    "send_path",
    "direct",
    "max_rate",
    "unknown_key",
];
const USER: &[&str] = &[
    "name",
    "key_file",
    "root",
    "max_sessions",
    "read_only",
    "max_rate",
    "what",
];
const SITE: &[&str] = &[
    "user",
    "max_members",
    "max_sessions",
    "share_storage",
    "max_load",
    "peers",
    "interval_ms",
];
const DEVICE: &[&str] = &["path", "purpose", "capacity_gbps", "threads", "name"];
const REPLICATE: &[&str] = &["src", "dst", "delete", "filter", "name", "archive"];

/// A TOML value of any type, including the awkward ones (negative,
/// huge, empty, non-ASCII, control characters, nested).
fn value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        Just("0".to_string()),
        Just("-1".to_string()),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| format!("{f:?}")),
        any::<bool>().prop_map(|b| b.to_string()),
        "[a-zA-Z0-9 ./_-]{0,12}".prop_map(|s| format!("{s:?}")),
        Just("\"512MB\"".to_string()),
        Just("\"10 Gbit/s\"".to_string()),
        Just("\"\\u0000\\n../..\"".to_string()),
        Just("\"/nonexistent\"".to_string()),
        Just("1979-05-27T07:32:00Z".to_string()),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop::collection::vec(inner, 0..4).prop_map(|v| format!("[{}]", v.join(", ")))
    })
}

fn table(header: &'static str, keys: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop::collection::vec((prop::sample::select(keys), value()), 0..6).prop_map(move |kv| {
        let body: Vec<String> = kv.iter().map(|(k, v)| format!("{k} = {v}")).collect();
        format!("{header}\n{}\n", body.join("\n"))
    })
}

fn config_text() -> impl Strategy<Value = String> {
    (
        table("", TOP),
        prop::collection::vec(
            prop_oneof![
                table("[site]", SITE),
                table("[[users]]", USER),
                table("[[devices]]", DEVICE),
                table("[[replicate]]", REPLICATE),
                table("[raw]", &["ifaces", "mtu"]),
            ],
            0..4,
        ),
    )
        .prop_map(|(top, rest)| format!("{top}{}", rest.concat()))
}

fn one_line(r: Result<(), String>, text: &str) -> Result<(), TestCaseError> {
    if let Err(e) = r {
        prop_assert!(!e.trim().is_empty(), "empty error for {text:?}");
        prop_assert!(
            !e.trim_end().contains('\n'),
            "not one line: {e:?} for {text:?}"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]

    #[test]
    fn config_never_panics_and_refuses_in_one_line(text in config_text()) {
        one_line(DaemonConfig::parse(&text, Path::new("/etc/ramsys")).map(|_| ()), &text)?;
    }

    #[test]
    fn config_arbitrary_text(text in "\\PC{0,200}") {
        one_line(DaemonConfig::parse(&text, Path::new("/etc/ramsys")).map(|_| ()), &text)?;
    }

    #[test]
    fn users_table_never_panics_and_refuses_in_one_line(
        users in prop::collection::vec(table("[[user]]", USER), 0..4),
        text in "\\PC{0,120}",
    ) {
        let t = users.concat();
        one_line(parse_users_file(&t, Path::new("/etc/ramsys")).map(|_| ()), &t)?;
        one_line(parse_users_file(&text, Path::new("/etc/ramsys")).map(|_| ()), &text)?;
    }
}
