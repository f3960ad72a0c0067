//! The operator's files read through serde with unknown keys refused (issue
//! 37): every level of the config and the users file refuses an unknown
//! key in one line naming the key, the file, the line and the section;
//! every size key takes the workspace's one unit rule.

use std::path::Path;

use ramsys_engine::daemon::config::DaemonConfig;
use ramsys_engine::daemon::users::load_users_file;

fn refusal(name: &str, text: &str, load: fn(&Path) -> anyhow::Result<()>) -> String {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    let e = format!("{:#}", load(&p).unwrap_err());
    assert!(e.contains(&p.display().to_string()), "no file name: {e}");
    assert!(!e.contains('\n'), "not one line: {e}");
    e
}

fn config(p: &Path) -> anyhow::Result<()> {
    DaemonConfig::load(p).map(|_| ())
}

fn users(p: &Path) -> anyhow::Result<()> {
    load_users_file(p).map(|_| ())
}

#[test]
fn unknown_keys_at_every_level_are_refused_with_key_file_and_section() {
    for (text, want) in [
        (
            "memroy = \"1G\"",
            "line 1: unknown key `memroy` at the top level",
        ),
        (
            "[devices.sda]\nthreads = 2\nspeed = 1",
            "line 3: unknown key `devices.sda.speed` in [devices.sda]",
        ),
        (
            "devices = { sda = { speed = 1 } }",
            "unknown key `devices.sda.speed`",
        ),
        (
            "[site]\npeer = [\"a:1\"]",
            "line 2: unknown key `site.peer` in [site]",
        ),
        ("[raw]\nmtu = 9000", "unknown key `raw.mtu` in [raw]"),
        (
            "[users.alice]\nkey_file = \"k\"\nroot = \"/r\"\nname = \"a\"",
            "line 4: unknown key `users.alice.name` in [users.alice]",
        ),
        (
            "[[replicate]]\nname = \"a\"\nsource = \"/a\"\ndest = \"/b\"\n\
             [[replicate]]\nname = \"b\"\nsource = \"/c\"\ndest = \"/d\"\nfilter = 1",
            "line 9: unknown key `replicate.filter` in [[replicate]] #2 (b)",
        ),
        // A wrong type names the key as well.
        (
            "[site]\nshare_storage = \"yes\"",
            "line 2: key `site.share_storage`",
        ),
        (
            "readers = \"four\"",
            "key `readers`: expected a positive integer, got \"four\"",
        ),
    ] {
        let e = refusal("ramsys.toml", text, config);
        assert!(e.contains(want), "{text:?}: {e}");
    }
}

#[test]
fn a_users_file_with_an_unknown_key_is_refused() {
    for (text, want) in [
        (
            "[[user]]\nname = \"alice\"\nkey_file = \"k\"\nroot = \"/r\"\nrate = 1",
            "line 5: unknown key `user.rate` in [[user]] #1 (alice)",
        ),
        (
            "[users.bob]\nkey_file = \"k\"\nroot = \"/r\"\nrom = true",
            "line 4: unknown key `users.bob.rom` in [users.bob]",
        ),
        ("groups = []", "unknown key `groups` at the top level"),
        (
            "[[user]]\nname = \"alice\"\nroot = \"/r\"",
            "missing `key_file` in [[user]] #1 (alice)",
        ),
    ] {
        let e = refusal("users.toml", text, users);
        assert!(e.starts_with("users file "), "{e}");
        assert!(e.contains(want), "{text:?}: {e}");
    }
}

#[test]
fn sizes_and_rates_take_the_one_unit_rule() {
    for (value, bytes) in [
        ("536870912", 1 << 29),
        ("\"512MB\"", 512_000_000),
        ("\"512MiB\"", 1 << 29),
        ("\"512M\"", 1 << 29),
        ("\"1.5G\"", 3 << 29),
        ("\"64K\"", 64 << 10),
        ("\"1 GB\"", 1_000_000_000),
    ] {
        let c = DaemonConfig::parse(&format!("memory = {value}"), Path::new(".")).unwrap();
        assert_eq!(c.memory, Some(bytes), "{value}");
    }
    for (value, bps) in [
        ("4096", 4096),
        ("0", 0),
        ("\"20M\"", 20 << 20),
        ("\"20MB/s\"", 20_000_000),
        ("\"100\"", 100 << 10),
    ] {
        let c = DaemonConfig::parse(&format!("max_rate = {value}"), Path::new(".")).unwrap();
        assert_eq!(c.max_rate, Some(bps), "{value}");
    }
    for bad in ["0", "-1", "1.5", "\"12Q\"", "true", "[1]"] {
        let e = DaemonConfig::parse(&format!("memory = {bad}"), Path::new(".")).unwrap_err();
        assert!(e.starts_with("line 1: key `memory`: "), "{bad}: {e}");
    }
}

/// Every key the parser accepts is in docs/DAEMON.md's key table: serde
/// lists the accepted keys of a table in its refusal of an unknown one.
#[test]
fn every_accepted_key_is_documented() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/DAEMON.md"))
        .unwrap();
    let start = doc
        .find("## The config file: every key")
        .expect("the key table");
    let table = &doc[start..start + doc[start..].find("\n## ").unwrap()];
    let mut seen = 0;
    for text in [
        "zz = 1",
        "[devices.x]\nzz = 1",
        "[site]\nzz = 1",
        "[raw]\nzz = 1",
        "[users.a]\nzz = 1",
        "[[replicate]]\nzz = 1",
    ] {
        let e = DaemonConfig::parse(text, Path::new(".")).unwrap_err();
        let listed = e.split_once("(expected ").expect(&e).1;
        for key in listed.split('`').skip(1).step_by(2) {
            // A section is documented by its header (`[site]`, `[devices.NAME]`).
            assert!(
                table.contains(&format!("`{key}`"))
                    || table.contains(&format!("`[{key}"))
                    || table.contains(&format!("`[[{key}")),
                "`{key}` is not in docs/DAEMON.md: {e}"
            );
            seen += 1;
        }
    }
    assert!(seen > 40, "{seen} keys");
}

/// The packaged /etc/ramsys/ramsys.toml, every key uncommented, parses.
#[test]
fn the_packaged_config_parses_with_every_key_uncommented() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../packaging/etc/ramsys.toml"
    ))
    .unwrap();
    let on: String = text
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .filter(|l| l.starts_with(|c: char| c.is_ascii_lowercase() || c == '['))
        .map(|l| format!("{l}\n"))
        .collect();
    let c =
        DaemonConfig::parse(&on, Path::new("/etc/ramsys")).unwrap_or_else(|e| panic!("{e}\n{on}"));
    assert_eq!(
        (c.users.len(), c.replicate.len(), c.devices.len()),
        (1, 1, 2)
    );
}
