//! --encrypt end to end: both ciphers, both directions, either end asking
//! for it; an eavesdropper on the data links sees no plaintext.

mod common;
mod proxy;

use common::*;

fn marker_file(p: &std::path::Path) {
    // Compressible, unmistakable plaintext: 2 MiB of a repeated phrase.
    let phrase = b"RAMSYS-PLAINTEXT-MARKER-0123456789;";
    let mut v = Vec::new();
    while v.len() < 2 << 20 {
        v.extend_from_slice(phrase);
    }
    std::fs::write(p, v).unwrap();
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn encrypted_push_and_pull_with_both_ciphers() {
    let TreeAndDaemon {
        t,
        key,
        src,
        root,
        d,
    } = tree_and_daemon(65536);
    // Push: the agent is the source and proposes the cipher.
    assert_ok(&ramsys(
        &key,
        &[
            "cp",
            "-r",
            "--block-size",
            "64K",
            "--streams",
            "3",
            "--encrypt=aes-256-gcm",
            src.to_str().unwrap(),
            &d.url(""),
        ],
    ));
    assert_same_tree(&src, &root.join("src"));
    // Pull: the daemon's source proposes none; the agent's sink adds it.
    let back = t.path().join("back");
    assert_ok(&ramsys(
        &key,
        &[
            "cp",
            "-r",
            "--block-size",
            "64K",
            "--encrypt=chacha20-poly1305",
            &d.url("src"),
            back.to_str().unwrap(),
        ],
    ));
    assert_same_tree(&src, &back);
    assert!(temp_files(&root).is_empty() && temp_files(&back).is_empty());
}

#[test]
fn eavesdropper_sees_plaintext_only_without_encrypt() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let f = t.path().join("secret.txt");
    marker_file(&f);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = TestDaemon::start(&root, &key);
    for encrypt in [false, true] {
        let p = proxy::Proxy::start(&d.addr);
        let url = format!("ramsys://{}/{}", p.addr, if encrypt { "e" } else { "p" });
        let mut args = vec!["cp", "--block-size", "256K", f.to_str().unwrap(), &url];
        if encrypt {
            args.insert(1, "--encrypt");
        }
        assert_ok(&ramsys(&key, &args));
        let got = std::fs::read(root.join(if encrypt { "e" } else { "p" })).unwrap();
        assert_eq!(got, std::fs::read(&f).unwrap());
        let cap = p.captured.lock().unwrap();
        assert!(cap.len() > 2 << 20, "proxy saw only {} bytes", cap.len());
        assert_eq!(
            contains(&cap, b"PLAINTEXT-MARKER"),
            !encrypt,
            "encrypt={encrypt}: plaintext visibility on the wire"
        );
    }
}

/// Under --encrypt the control link is sealed too: file names, sizes and
/// digests are on neither direction of any connection, push or pull.
#[test]
fn eavesdropper_sees_no_names_under_encrypt() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let name = "Quarterly-Report-CONFIDENTIAL-7431";
    std::fs::write(src.join(format!("{name}.txt")), b"x".repeat(5000)).unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = TestDaemon::start(&root, &key);
    for encrypt in [false, true] {
        let sub = if encrypt { "e" } else { "p" };
        // Push through the proxy, then pull the copy back through another.
        let p = proxy::Proxy::start(&d.addr);
        let mut args = vec!["cp", "-r", src.to_str().unwrap()];
        let url = format!("ramsys://{}/{sub}", p.addr);
        args.push(&url);
        if encrypt {
            args.insert(1, "--encrypt");
        }
        std::fs::create_dir(root.join(sub)).unwrap();
        assert_ok(&ramsys(&key, &args));
        let back = t.path().join(format!("back-{sub}"));
        let q = proxy::Proxy::start(&d.addr);
        let url = format!("ramsys://{}/{sub}/src", q.addr);
        let mut args = vec!["cp", "-r", url.as_str(), back.to_str().unwrap()];
        if encrypt {
            args.insert(1, "--encrypt");
        }
        assert_ok(&ramsys(&key, &args));
        assert_same_tree(&src, &back);
        for (what, cap) in [
            ("push, client to server", &p.captured),
            ("push, server to client", &p.captured_back),
            ("pull, client to server", &q.captured),
            ("pull, server to client", &q.captured_back),
        ] {
            let cap = cap.lock().unwrap();
            assert!(!cap.is_empty(), "{what}: nothing captured");
            assert_eq!(
                contains(&cap, b"CONFIDENTIAL"),
                !encrypt && what != "push, server to client" && what != "pull, client to server",
                "encrypt={encrypt}, {what}: file name visibility"
            );
        }
    }
}

/// Flip one bit in every 7th block in flight (fault hook in the sender):
/// each is caught (checksum, or authentication with --encrypt), asked for
/// again and re-sent; the copy is byte-identical and the re-sends counted.
#[test]
fn flipped_bits_in_flight_are_detected_and_resent() {
    let TreeAndDaemon {
        t: _t,
        key,
        src,
        root,
        d,
    } = tree_and_daemon(65536);
    for (i, enc) in ["--encrypt=none", "--encrypt=chacha20-poly1305"]
        .iter()
        .enumerate()
    {
        let dest = format!("d{i}");
        let mut c = std::process::Command::new(bin());
        c.args([
            "cp",
            "-r",
            "--json",
            "--block-size",
            "64K",
            "--streams",
            "3",
            enc,
        ])
        .arg(&src)
        .arg(d.url(&dest))
        .env("RAMSYS_KEY_FILE", &key)
        .env("RAMSYS_FAULT_FLIP_EVERY", "7");
        let o = run_with_timeout(c, std::time::Duration::from_secs(120));
        assert_ok(&o);
        assert_same_tree(&src, &root.join(&dest));
        let out = String::from_utf8_lossy(&o.stdout);
        let summary: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        let resent = summary["resent"].as_u64().unwrap();
        assert!(resent > 0, "{enc}: nothing re-sent: {out}");
        assert!(temp_files(&root).is_empty());
    }
}
