//! The remote end's limits, the auto probe and upload scripts through sh,
//! a third-party source's arguments, and shell quoting.

use super::remote::{probe_script, upload_script, Probe};
use super::third_party::source_cp_args;
use super::*;

#[test]
fn the_remote_end_allows_what_a_daemon_allows() {
    assert_eq!(serve_max_streams(None), 32);
    assert_eq!(serve_max_streams(Some(3)), 32);
    assert_eq!(serve_max_streams(Some(48)), 48);
}
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

#[test]
fn auto_probe_answers() {
    assert_eq!(
        Probe::parse("motd\nuse ramsys\n"),
        Some(Probe::Use("ramsys".into()))
    );
    assert_eq!(
        Probe::parse("need x86_64 /home/a b/.cache/ramsys/bin/ramsys-1-x86_64\n"),
        Some(Probe::Need {
            arch: "x86_64".into(),
            path: "/home/a b/.cache/ramsys/bin/ramsys-1-x86_64".into()
        })
    );
    assert_eq!(Probe::parse("sh: not found"), None);
}

/// The probe and the upload through a real sh, against a fake cache.
#[test]
fn auto_scripts_through_sh() {
    let d = tempfile::tempdir().unwrap();
    let sh = |script: &str, stdin: &[u8]| {
        let mut c = Command::new("sh")
            .arg("-c")
            .arg(script)
            .env("XDG_CACHE_HOME", d.path())
            .env("PATH", "/usr/bin:/bin")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(stdin).unwrap();
        c.wait_with_output().unwrap()
    };
    let o = sh(&probe_script("9.9"), b"");
    let Some(Probe::Need { path, .. }) = Probe::parse(&String::from_utf8_lossy(&o.stdout)) else {
        panic!("{o:?}")
    };
    assert!(path.starts_with(d.path().to_str().unwrap()), "{path}");
    // A binary that is not ours (wrong version) is refused and removed.
    let fake = b"#!/bin/sh\necho ramsys 1.0\n";
    let o = sh(&upload_script("9.9", &path), fake);
    assert!(!o.status.success());
    assert!(!Path::new(&path).exists());
    assert_eq!(
        std::fs::read_dir(Path::new(&path).parent().unwrap())
            .unwrap()
            .count(),
        0
    );
    // Ours is kept, private, and found by the next probe.
    let ours = b"#!/bin/sh\necho ramsys 9.9\n";
    let o = sh(&upload_script("9.9", &path), ours);
    assert!(o.status.success(), "{o:?}");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    let o = sh(&probe_script("9.9"), b"");
    assert_eq!(
        Probe::parse(&String::from_utf8_lossy(&o.stdout)),
        Some(Probe::Use(path))
    );
}

/// A third-party copy's HOST1 is the source: it gets --bwlimit, in
/// bytes per second so no unit is reinterpreted.
#[test]
fn third_party_source_gets_the_rate_limit() {
    #[derive(clap::Parser)]
    struct W {
        #[command(flatten)]
        a: CpArgs,
    }
    let w = <W as clap::Parser>::try_parse_from(["x", "--bwlimit", "20M", "h1:a", "h2:b"]).unwrap();
    let src = SshEndpoint {
        user: None,
        host: "h1".into(),
        path: "a".into(),
    };
    let v = source_cp_args(&w.a, 0, &[&src], "ramsys://h2:1/b");
    assert!(v.contains(&format!("--bwlimit={}B", 20 << 20)), "{v:?}");
    // Rules travel as quoted --filter words (issue 35).
    let mut w = <W as clap::Parser>::try_parse_from([
        "x",
        "--exclude",
        "-a b",
        "-f",
        "+ *.c",
        "h1:a",
        "h2:b",
    ])
    .unwrap();
    w.a.select.rules = vec![b"- -a b".to_vec(), b"+ *.c".to_vec()];
    let v = source_cp_args(&w.a, 0, &[&src], "ramsys://h2:1/b");
    assert!(v.contains(&"'--filter=- -a b'".to_string()), "{v:?}");
    assert!(v.contains(&"'--filter=+ *.c'".to_string()), "{v:?}");
    assert_eq!(
        ramsys_engine::data::rate::parse_rate(&format!("{}B", 20 << 20)),
        Ok(20 << 20)
    );
}

#[test]
fn quoting() {
    assert_eq!(shell_quote("abc/d.e"), "abc/d.e");
    assert_eq!(shell_quote(""), "''");
    assert_eq!(shell_quote("a b"), "'a b'");
    assert_eq!(shell_quote("it's"), r"'it'\''s'");
    assert_eq!(shell_quote("$(rm -rf /)"), "'$(rm -rf /)'");
    assert_eq!(quote_path("~/a b"), "~/'a b'");
    assert_eq!(quote_path("~"), "~");
    assert_eq!(quote_path("~x"), "'~x'");
    assert_eq!(quote_path("/abs;x"), "'/abs;x'");
}

/// The words reach a real shell as the strings they quote.
#[test]
fn quoting_through_sh() {
    let words = [
        "plain", "a b", "it's", "$HOME", "`x`", "\\", "", "ü ñ", "-x",
    ];
    let script = format!(
        "printf '%s\\n' {}",
        words
            .iter()
            .map(|w| shell_quote(w))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let out = Command::new("sh").arg("-c").arg(&script).output().unwrap();
    let got = String::from_utf8(out.stdout).unwrap();
    let got: Vec<&str> = got.lines().collect();
    assert_eq!(got, words);
}
