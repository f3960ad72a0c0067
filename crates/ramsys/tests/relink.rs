//! Lost data links (issue 9): a transfer survives data links cut through a
//! proxy by replacing them, fails with one clear line when no link can be
//! re-established, and a cut control link fails cleanly and resumes.
//! The source's side of recovery differs between the send paths (seed 002
//! sec. 7: sender threads, or readers sending inline), so the cut-link
//! tests run on both.

mod common;
mod proxy;

use std::path::Path;
use std::sync::atomic::Ordering;

use common::*;
use proxy::LinkProxy;

const MB: usize = 1 << 20;

/// Eight files of 1-9 MB plus a few small ones: about 40 MB, so each of 4
/// streams carries several MB.
fn make_src(src: &Path) {
    let mut r = Rng(0xfa17);
    std::fs::create_dir_all(src.join("small")).unwrap();
    for i in 0..8 {
        std::fs::write(src.join(format!("big{i}")), r.bytes((i + 1) * MB + i * 977)).unwrap();
    }
    for i in 0..30 {
        std::fs::write(src.join(format!("small/s{i}")), r.bytes(i * 101)).unwrap();
    }
    std::os::unix::fs::symlink("big0", src.join("link")).unwrap();
}

fn summary(o: &std::process::Output) -> serde_json::Value {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["event"] == "summary")
        .unwrap_or_else(|| panic!("no summary: {}", String::from_utf8_lossy(&o.stdout)))
}

fn cp(key: &Path, from: &str, to: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "cp",
        "-r",
        "--json",
        "--streams",
        "4",
        "--block-size",
        "262144",
    ];
    args.extend_from_slice(extra);
    args.push(from);
    args.push(to);
    ramsys(key, &args)
}

struct Setup {
    t: tempfile::TempDir,
    key: std::path::PathBuf,
    src: std::path::PathBuf,
    root: std::path::PathBuf,
    d: TestDaemon,
}

fn setup() -> Setup {
    setup_with(&[])
}

/// With `daemon` arguments (a pull's source is the daemon).
fn setup_with(daemon: &[&str]) -> Setup {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    make_src(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = TestDaemon::start_with(&root, &key, daemon);
    Setup {
        t,
        key,
        src,
        root,
        d,
    }
}

#[test]
fn push_survives_one_cut_data_link_queued() {
    push_survives_one_cut_data_link("queued");
}

#[test]
fn push_survives_one_cut_data_link_inline() {
    push_survives_one_cut_data_link("inline");
}

fn push_survives_one_cut_data_link(path: &str) {
    let s = setup();
    let p = LinkProxy::start(&s.d.addr);
    p.rules
        .cut_data_after
        .store(2 * MB as u64, Ordering::Relaxed);
    p.rules.cut_data_max.store(1, Ordering::Relaxed);
    let o = cp(
        &s.key,
        s.src.to_str().unwrap(),
        &format!("ramsys://{}/dst", p.addr),
        &["--send-path", path],
    );
    assert_ok(&o);
    assert_eq!(p.seen.data_cuts.load(Ordering::Relaxed), 1);
    assert_same_tree(&s.src, &s.root.join("dst"));
    let j = summary(&o);
    assert_eq!(j["send_path"], path, "{j}");
    assert_eq!(j["links_lost"], 1, "{j}");
    assert_eq!(j["links_replaced"], 1, "{j}");
    assert!(p.seen.rejoins.load(Ordering::Relaxed) >= 1);
    assert!(temp_files(&s.root).is_empty());
    // The daemon (sink) counts the replacement too (status, /metrics).
    let st = ramsys(
        &s.key,
        &["status", "--json", &format!("ramsys://{}", s.d.addr)],
    );
    assert_ok(&st);
    let st: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(st["totals"]["links_replaced"], 1, "{st}");
}

#[test]
fn pull_survives_one_cut_data_link_queued() {
    pull_survives_one_cut_data_link("queued");
}

#[test]
fn pull_survives_one_cut_data_link_inline() {
    pull_survives_one_cut_data_link("inline");
}

fn pull_survives_one_cut_data_link(path: &str) {
    let s = setup_with(&["--send-path", path]);
    // The daemon serves the source tree; pull it through the proxy.
    std::fs::rename(&s.src, s.root.join("src")).unwrap();
    let p = LinkProxy::start(&s.d.addr);
    p.rules
        .cut_data_after
        .store(2 * MB as u64, Ordering::Relaxed);
    p.rules.cut_data_max.store(1, Ordering::Relaxed);
    let dst = s.t.path().join("dst");
    let o = cp(
        &s.key,
        &format!("ramsys://{}/src", p.addr),
        dst.to_str().unwrap(),
        &[],
    );
    assert_ok(&o);
    assert_eq!(p.seen.data_cuts.load(Ordering::Relaxed), 1);
    assert_same_tree(&s.root.join("src"), &dst);
    let j = summary(&o);
    assert_eq!(j["links_replaced"], 1, "{j}");
    assert!(temp_files(&dst).is_empty());
}

#[test]
fn every_data_link_cut_again_and_again_still_completes_queued() {
    every_data_link_cut_again_and_again_still_completes("queued");
}

#[test]
fn every_data_link_cut_again_and_again_still_completes_inline() {
    every_data_link_cut_again_and_again_still_completes("inline");
}

fn every_data_link_cut_again_and_again_still_completes(path: &str) {
    let s = setup();
    let p = LinkProxy::start(&s.d.addr);
    // Every data link (replacements too) dies after 3 MB, 10 times over.
    p.rules
        .cut_data_after
        .store(3 * MB as u64, Ordering::Relaxed);
    p.rules.cut_data_max.store(10, Ordering::Relaxed);
    let o = cp(
        &s.key,
        s.src.to_str().unwrap(),
        &format!("ramsys://{}/dst", p.addr),
        &["--encrypt", "--send-path", path],
    );
    assert_ok(&o);
    let cuts = p.seen.data_cuts.load(Ordering::Relaxed);
    assert!(cuts >= 4, "only {cuts} cuts");
    assert_same_tree(&s.src, &s.root.join("dst"));
    let j = summary(&o);
    // A cut that lands after the sink has settled (the data is all in)
    // ends that link normally instead of losing it, so it is not counted.
    let lost = j["links_lost"].as_u64().unwrap();
    assert!(lost <= cuts && lost >= 4, "{cuts} cuts: {j}");
    assert!(j["links_replaced"].as_u64().unwrap() + 3 >= lost, "{j}");
}

#[test]
fn no_reconnect_possible_fails_with_one_line_and_no_half_file_queued() {
    no_reconnect_possible_fails_with_one_line_and_no_half_file("queued");
}

#[test]
fn no_reconnect_possible_fails_with_one_line_and_no_half_file_inline() {
    no_reconnect_possible_fails_with_one_line_and_no_half_file("inline");
}

fn no_reconnect_possible_fails_with_one_line_and_no_half_file(path: &str) {
    let s = setup();
    let p = LinkProxy::start(&s.d.addr);
    p.rules.cut_data_after.store(MB as u64, Ordering::Relaxed);
    // Every data link, not just the first 4: a link replaced before the
    // first cut (one lost to a stall on a loaded machine) is a fifth that
    // would otherwise carry the whole push (seen once in CI).
    p.rules.cut_data_max.store(u64::MAX, Ordering::Relaxed);
    p.rules.refuse_after_cut.store(true, Ordering::Relaxed);
    let o = cp(
        &s.key,
        s.src.to_str().unwrap(),
        &format!("ramsys://{}/dst", p.addr),
        &["--send-path", path],
    );
    // Seen succeed once in CI (2026-11-26); say what the links did if again.
    assert!(
        !o.status.success(),
        "push succeeded: joins {} rejoins {} cuts {} refused {} data bytes {}\n{}\n{}",
        p.seen.joins.load(Ordering::Relaxed),
        p.seen.rejoins.load(Ordering::Relaxed),
        p.seen.data_cuts.load(Ordering::Relaxed),
        p.seen.refused.load(Ordering::Relaxed),
        p.seen.data_bytes.load(Ordering::Relaxed),
        String::from_utf8_lossy(&o.stdout),
        stderr(&o)
    );
    let e = stderr(&o);
    let j = summary(&o);
    let msg = j["error"].as_str().unwrap();
    assert!(
        msg.contains("all data links lost to") && msg.contains("reconnect attempts failed"),
        "{msg}\n{e}"
    );
    assert!(!msg.contains('\n'));
    assert!(p.seen.refused.load(Ordering::Relaxed) >= 1);
    // The summary says what moved before the failure (1 MB per link at
    // least went through the proxy), not 0.
    assert!(j["bytes"].as_u64().unwrap() >= MB as u64, "{j}");
    // Whatever made it under a final name is complete; no temp file stays.
    let dst = s.root.join("dst");
    wait_no_temp(&s.root);
    for e in std::fs::read_dir(&dst).into_iter().flatten().flatten() {
        let rel = e.file_name();
        let a = s.src.join(&rel);
        if e.file_type().unwrap().is_file() {
            assert_eq!(std::fs::read(e.path()).unwrap(), std::fs::read(&a).unwrap());
        }
    }
}

/// No temp file left. The journal may stay: it marks the unfinished
/// copy's destination so that a retry continues it (issue 15).
fn wait_no_temp(root: &Path) {
    let temps = || -> Vec<_> {
        temp_files(root)
            .into_iter()
            .filter(|p| !p.to_string_lossy().contains(".ramsys-journal.sqlite"))
            .collect()
    };
    let t0 = std::time::Instant::now();
    while !temps().is_empty() && t0.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(temps().is_empty(), "{:?}", temps());
}

#[test]
fn cut_control_link_fails_cleanly_then_resume_completes() {
    let s = setup();
    let p = LinkProxy::start(&s.d.addr);
    p.rules
        .cut_control_after_data
        .store(8 * MB as u64, Ordering::Relaxed);
    // An existing directory, so both runs copy src into it.
    std::fs::create_dir(s.root.join("dst")).unwrap();
    let to = format!("ramsys://{}/dst", p.addr);
    let o = cp(&s.key, s.src.to_str().unwrap(), &to, &["--resume"]);
    assert!(!o.status.success(), "{}", stderr(&o));
    assert_eq!(p.seen.control_cuts.load(Ordering::Relaxed), 1);
    let msg = summary(&o)["error"].as_str().unwrap().to_string();
    assert!(msg.contains("lost"), "{msg}");
    // Nothing half-written under a final name.
    let dst = s.root.join("dst/src");
    for e in std::fs::read_dir(&dst).into_iter().flatten().flatten() {
        if e.file_type().unwrap().is_file() && !e.file_name().to_string_lossy().starts_with('.') {
            let a = s.src.join(e.file_name());
            assert_eq!(std::fs::read(e.path()).unwrap(), std::fs::read(&a).unwrap());
        }
    }
    // Same arguments again, the proxy now harmless.
    let o = cp(&s.key, s.src.to_str().unwrap(), &to, &["--resume"]);
    assert_ok(&o);
    assert_same_tree(&s.src, &dst);
    assert!(temp_files(&s.root).is_empty(), "{:?}", temp_files(&s.root));
}

/// The tail case: every block is already written when a link breaks, so
/// the source has nothing more to send on it and only the sink notices.
/// The source must still hand over what that link carried (the sink's
/// Lost closes its idle end) and send it again, on either send path.
#[test]
fn a_link_cut_after_the_source_went_idle_is_recovered_queued() {
    link_cut_after_the_source_went_idle("queued");
}

#[test]
fn a_link_cut_after_the_source_went_idle_is_recovered_inline() {
    link_cut_after_the_source_went_idle("inline");
}

fn link_cut_after_the_source_went_idle(path: &str) {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    // 2 MB over 2 streams in 256 KiB blocks: 4 blocks a stream, fewer than
    // the credit window, so the source writes them all at once and waits.
    std::fs::write(src.join("f"), Rng(0x7a11).bytes(2 * MB)).unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = TestDaemon::start(&root, &key);
    let p = LinkProxy::start(&d.addr);
    // Cut one link after 600 KB, having swallowed the rest of what the
    // source wrote on it for a second first: the source is idle by then.
    p.rules.cut_data_after.store(600_000, Ordering::Relaxed);
    p.rules.cut_data_max.store(1, Ordering::Relaxed);
    p.rules.hold_before_cut_ms.store(1000, Ordering::Relaxed);
    let t0 = std::time::Instant::now();
    let o = ramsys(
        &key,
        &[
            "cp",
            "-r",
            "--json",
            "--streams",
            "2",
            "--readers",
            "2",
            "--block-size",
            "262144",
            "--send-path",
            path,
            src.to_str().unwrap(),
            &format!("ramsys://{}/dst", p.addr),
        ],
    );
    assert_ok(&o);
    assert!(t0.elapsed() < std::time::Duration::from_secs(30));
    assert_eq!(p.seen.data_cuts.load(Ordering::Relaxed), 1);
    assert_same_tree(&src, &root.join("dst"));
    let j = summary(&o);
    assert_eq!(j["links_lost"], 1, "{j}");
}

/// Under --encrypt every CREDIT carries a tag (docs/SECURITY.md): one bit
/// changed on the path fails the session as a protocol violation, with one
/// line, without re-dialling (a forger must not be able to make the
/// session reconnect forever) and without a half-written file.
#[test]
fn an_altered_credit_fails_an_encrypted_session_cleanly() {
    let s = setup();
    let p = LinkProxy::start(&s.d.addr);
    p.rules.flip_reverse_after.store(200, Ordering::Relaxed);
    let o = cp(
        &s.key,
        s.src.to_str().unwrap(),
        &format!("ramsys://{}/dst", p.addr),
        &["--encrypt"],
    );
    assert!(!o.status.success(), "an altered credit went unnoticed");
    let j = summary(&o);
    let msg = j["error"].as_str().unwrap();
    assert!(msg.contains("credit"), "{msg}");
    assert!(!msg.contains('\n'));
    assert_eq!(j["links_replaced"].as_u64().unwrap_or(0), 0, "{j}");
    assert_eq!(p.seen.rejoins.load(Ordering::Relaxed), 0);
    wait_no_temp(&s.root);
    let dst = s.root.join("dst");
    for e in std::fs::read_dir(&dst).into_iter().flatten().flatten() {
        if e.file_type().unwrap().is_file() {
            let a = s.src.join(e.file_name());
            assert_eq!(std::fs::read(e.path()).unwrap(), std::fs::read(&a).unwrap());
        }
    }
}
