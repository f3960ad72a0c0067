//! Faults on the links that the protocol absorbs: blocks reordered on a
//! link, a corrupt block sent again, latency, a stalled link given up
//! after the idle timeout (on a simulated clock) and replaced; and one it
//! does not: a cut control link ends both sessions cleanly, and a full
//! sink disk ends both with the sink's reason.

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use ramsys_engine::transport::clock::Clock;
use ramsys_engine::transport::mem::{Fate, Fault};

use crate::common::pair::{Pair, SINK, SOURCE};
use crate::common::tree::{files, same_tree, tmp};

fn setup(seed: u64) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let t = tmp();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    files(&src, 80, 16 << 10, seed);
    std::fs::create_dir(&dst).unwrap();
    (t, src, dst)
}

#[test]
fn blocks_reordered_on_a_link_land_by_their_offsets() {
    let (_t, src, dst) = setup(10);
    let p = Pair::new(&src, &dst);
    for (link, n) in [("data0.0", 1), ("data0.0", 4), ("data1.0", 0)] {
        p.net.fault(link, SOURCE, Fault::Swap(n));
    }
    let o = p.run();
    o.reports();
    let overtaken = o.transcript.iter().filter(|r| r.fate == Fate::Overtaken);
    assert_eq!(overtaken.count(), 3);
    same_tree(&src, &dst.join("src"));
}

#[test]
fn a_corrupt_block_is_asked_for_again() {
    let (_t, src, dst) = setup(11);
    let p = Pair::new(&src, &dst);
    p.net.fault("data0.0", SOURCE, Fault::Corrupt(2));
    let o = p.run();
    o.reports();
    assert_eq!(p.sink.stats.checksum_errors.load(Relaxed), 1);
    assert!(o.control(SINK).iter().any(|r| r.name() == "Resend"));
    same_tree(&src, &dst.join("src"));
}

/// 3 ms each way on every link: a copy takes at least its control round
/// trips (metadata, settle, verdict) of latency.
#[test]
fn latency_on_every_link_costs_round_trips_not_correctness() {
    let (_t, src, dst) = setup(12);
    let p = Pair::new(&src, &dst);
    let d = Duration::from_millis(3);
    for link in ["ctl", "data0.0", "data1.0"] {
        for from in [SOURCE, SINK] {
            p.net.fault(link, from, Fault::Delay(d));
        }
    }
    let o = p.run();
    o.reports();
    assert!(o.elapsed >= 6 * d, "{:?}", o.elapsed);
    same_tree(&src, &dst.join("src"));
}

/// Both data links stop delivering after 40 KB (1.3 MB to move, so at
/// least one of them gets there, whichever way the source spreads its
/// blocks). Once a link's bytes pile up past its stall, the simulated
/// clock jumps past the idle timeout: the sink gives the link up, the
/// source rejoins and the copy completes, in far less real time than the
/// timeout. A jump the sink's wait missed (it took its deadline after the
/// jump, on a busy machine) is made again while more links sit stalled
/// than were given up; the clock thread ends when the run does, so a run
/// that never reached a stall fails on its assertions instead of hanging.
#[test]
fn a_stalled_link_is_given_up_after_the_idle_timeout_and_replaced() {
    let (_t, src, dst) = setup(13);
    let clock = Clock::simulated();
    let p = Pair::with_clock(&src, &dst, clock.clone());
    const AT: u64 = 40_000;
    const LINKS: [&str; 2] = ["data0.0", "data1.0"];
    for link in LINKS {
        p.net.fault(link, SOURCE, Fault::StallAfter(AT));
    }
    let (net, stats) = (p.net.clone(), p.sink.stats.clone());
    let done = Arc::new(AtomicBool::new(false));
    let ended = done.clone();
    let jump = std::thread::spawn(move || {
        let mut jumps = 0;
        let mut last = std::time::Instant::now();
        while !ended.load(Relaxed) {
            // The stall holds: bytes written past it, none read.
            let stalled = LINKS
                .iter()
                .filter(|l| {
                    net.offsets(l, SOURCE)
                        .is_some_and(|(w, r)| r == AT && w > AT)
                })
                .count() as u64;
            let lost = stats.links_lost.load(Relaxed);
            if stalled > lost && (jumps == 0 || last.elapsed() > Duration::from_millis(200)) {
                std::thread::sleep(Duration::from_millis(20));
                clock.advance(Duration::from_secs(11));
                (jumps, last) = (jumps + 1, std::time::Instant::now());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        jumps
    });
    let o = p.run();
    done.store(true, Relaxed);
    let jumps = jump.join().unwrap();
    assert!(jumps > 0, "no data link reached its stall");
    o.reports();
    assert!(p.sink.stats.links_lost.load(Relaxed) >= 1);
    let replaced = |link: &str| o.transcript.iter().any(|r| r.link == link);
    assert!(replaced("data0.1") || replaced("data1.1"));
    assert!(o.elapsed < Duration::from_secs(5), "{:?}", o.elapsed);
    same_tree(&src, &dst.join("src"));
}

/// The control link cut during the payload: both ends fail with one
/// line, and every file the sink left under its name is whole (the
/// others are gone with their temp files).
#[test]
fn a_cut_control_link_ends_both_sessions_cleanly() {
    let (_t, src, dst) = setup(14);
    let p = Pair::new(&src, &dst);
    p.net.fault("ctl", SOURCE, Fault::CutAfter(3000));
    let o = p.run();
    assert!(!o.stuck);
    for e in [o.source.as_ref().err(), o.sink.as_ref().err()] {
        let e = e.expect("a session survived its control link").to_string();
        assert!(!e.is_empty() && !e.contains('\n'), "{e}");
    }
    let metadata_done = o.control(SOURCE).iter().any(|r| r.name() == "MetaEnd");
    assert!(metadata_done, "cut before the payload");
    // In memory the payload may be done by the time the cut lands (the
    // cut falls just past MetaEnd): then every file is there, and whole,
    // and both ends must still fail in one line.
    let left = walk(&dst.join("src"));
    for f in left {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        assert!(!name.starts_with(".ramsys"), "temp file left: {name}");
        let rel = f.strip_prefix(dst.join("src")).unwrap();
        let whole = std::fs::read(src.join(rel)).unwrap() == std::fs::read(&f).unwrap();
        assert!(whole, "{} half-written", f.display());
    }
}

/// The sink's disk fills mid-payload: the sink aborts and closes its
/// links, and the source, whichever of its writes then fails first (a
/// block on a data link, FilesDone or EndOfData on the control link),
/// reports the sink's reason, not a broken pipe (the watch job's batch
/// line said "connection to the sink lost: Broken pipe" once in CI).
/// Run 12 times: the race differs from run to run.
#[test]
fn a_full_sink_disk_is_the_reason_the_source_gives() {
    let (_t, src, _) = setup(15);
    let Some(fs) = SmallTmpfs::mount("256k") else {
        return;
    };
    for round in 0..12 {
        let dst = fs.0.path().join(format!("r{round}"));
        std::fs::create_dir(&dst).unwrap();
        let p = Pair::new(&src, &dst);
        let o = p.run();
        assert!(!o.stuck, "round {round}: stuck");
        let sink = o.sink.as_ref().expect_err("the sink fit 1.3 MB in 256 KiB");
        assert!(
            sink.to_string().contains("disk full"),
            "round {round}: {sink}"
        );
        let e = o.source.as_ref().expect_err("the source did not fail");
        let e = e.to_string();
        assert!(
            e.contains("disk full") && !e.contains('\n'),
            "round {round}: {e}"
        );
        for f in walk(&dst) {
            let rel = f.strip_prefix(dst.join("src")).unwrap();
            let whole = std::fs::read(src.join(rel)).unwrap() == std::fs::read(&f).unwrap();
            assert!(whole, "round {round}: {} half-written", f.display());
        }
        std::fs::remove_dir_all(&dst).unwrap();
    }
}

/// A tmpfs of `size` mounted for a test (needs root: skipped otherwise),
/// unmounted on drop.
struct SmallTmpfs(tempfile::TempDir);

impl SmallTmpfs {
    fn mount(size: &str) -> Option<SmallTmpfs> {
        let dir = tmp();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("skipping: cannot mount tmpfs (not root?)");
        }
        ok.then_some(SmallTmpfs(dir))
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.path())
            .status();
    }
}

fn walk(d: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(d) else {
        return out;
    };
    for e in rd {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
