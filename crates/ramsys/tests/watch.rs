//! Continuous replication (issue 38): `sync --watch` into real daemons on
//! loopback (and over ssh, and into a local directory), the daemon's
//! `[[replicate]]` jobs, and the fault promises: a renamed big file and a
//! renamed directory move 0 bytes, deletes arrive, killing the agent or the
//! destination daemon mid-stream loses nothing, an overflowed event queue
//! is caught up by a full scan, a full DST disk is reported and caught up
//! once space is freed.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use common::*;

/// A running `sync --watch` with its JSON batch lines.
struct Watch {
    child: Child,
    lines: Receiver<serde_json::Value>,
}

impl Watch {
    fn start(key: &Path, journal: &Path, extra: &[&str], env: &[(&str, &Path)]) -> Watch {
        let mut c = Command::new(bin());
        c.args(["sync", "-r", "--delete", "--watch", "--json"]);
        if !extra.contains(&"--watch-quiet") {
            c.args(["--watch-quiet", "300"]);
        }
        c.arg("--watch-journal")
            .arg(journal)
            .args(extra)
            .env("RAMSYS_KEY_FILE", key)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c.spawn().expect("start sync --watch");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&l) {
                    let _ = tx.send(v);
                }
            }
        });
        Watch { child, lines }
    }

    /// Batch lines that arrived so far.
    fn drain(&self) -> Vec<serde_json::Value> {
        self.lines.try_iter().collect()
    }

    /// Wait for the first full sync to succeed.
    fn first_sync(&self) -> Vec<serde_json::Value> {
        let end = Instant::now() + Duration::from_secs(60);
        let mut seen = Vec::new();
        while Instant::now() < end {
            if let Ok(v) = self.lines.recv_timeout(Duration::from_millis(200)) {
                let done = v["full"] == true && v["ok"] == true;
                seen.push(v);
                if done {
                    return seen;
                }
            }
        }
        panic!("no full sync within 60 s: {seen:?}");
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Poll until DST equals SRC (bytes and metadata), or fail after `t`.
fn wait_same(src: &Path, dst: &Path, t: Duration) {
    if !converges(src, dst, t) {
        assert_same_tree(src, dst);
    }
}

/// Whether DST comes to equal SRC (bytes and metadata) within `t`.
fn converges(src: &Path, dst: &Path, t: Duration) -> bool {
    let end = Instant::now() + t;
    while Instant::now() < end {
        // The job may be changing DST under the walk (an entry gone
        // between its listing and its stat): such a look is just "not yet".
        let same = std::panic::catch_unwind(|| snapshot(src) == snapshot(dst));
        if dst.exists() && same.unwrap_or(false) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

fn sum(lines: &[serde_json::Value], field: &str) -> u64 {
    lines.iter().map(|v| v[field].as_u64().unwrap_or(0)).sum()
}

fn write(p: &Path, data: &[u8]) {
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(p, data).unwrap();
}

struct Setup {
    _t: tempfile::TempDir,
    key: PathBuf,
    src: PathBuf,
    export: PathBuf,
    journal: PathBuf,
}

fn setup() -> Setup {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let (src, export) = (t.path().join("src"), t.path().join("export"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&export).unwrap();
    let journal = t.path().join("journal.sqlite");
    Setup {
        key,
        src,
        export,
        journal,
        _t: t,
    }
}

#[test]
fn renames_move_no_bytes_and_deletes_arrive() {
    let s = setup();
    let d = TestDaemon::start(&s.export, &s.key);
    write(&s.src.join("a.txt"), b"first");
    let src_arg = format!("{}/", s.src.display());
    let w = Watch::start(&s.key, &s.journal, &[&src_arg, &d.url("m")], &[]);
    w.first_sync();
    let dst = s.export.join("m");
    // A big file and a directory of many files arrive...
    let big: Vec<u8> = (0..64u32 << 20).map(|i| (i % 251) as u8).collect();
    write(&s.src.join("big.bin"), &big);
    for i in 0..1000 {
        write(
            &s.src.join(format!("dir/f{i}")),
            format!("file {i}").as_bytes(),
        );
    }
    wait_same(&s.src, &dst, Duration::from_secs(60));
    let before = w.drain();
    assert!(sum(&before, "bytes") >= 64 << 20, "{before:?}");
    // ...and renaming them moves nothing.
    std::fs::rename(s.src.join("big.bin"), s.src.join("renamed.bin")).unwrap();
    std::fs::rename(s.src.join("dir"), s.src.join("moved")).unwrap();
    wait_same(&s.src, &dst, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(500));
    let after = w.drain();
    assert_eq!(sum(&after, "bytes"), 0, "renames moved data: {after:?}");
    assert!(sum(&after, "ops") >= 2, "{after:?}");
    // Deletes travel as deletes (a file, then a whole directory).
    std::fs::remove_file(s.src.join("a.txt")).unwrap();
    std::fs::remove_dir_all(s.src.join("moved")).unwrap();
    wait_same(&s.src, &dst, Duration::from_secs(30));
    assert!(!dst.join("moved").exists() && !dst.join("a.txt").exists());
    assert!(temp_files(&dst).is_empty());
}

/// Every small batch with data runs as a session on the job's one watch
/// channel (issue 38, docs/PROTOCOL.md "Kept sessions"): no connection per
/// batch, plain and under --encrypt, with renames and deletes between
/// them; the full scan runs in windows on a connection of its own.
#[test]
fn many_batches_run_on_one_connection() {
    for extra in [&[][..], &["--encrypt"][..]] {
        let s = setup();
        let d = TestDaemon::start(&s.export, &s.key);
        // DST exists: the channel opens before the first full sync.
        std::fs::create_dir(s.export.join("m")).unwrap();
        write(&s.src.join("a.txt"), b"first");
        let src_arg = format!("{}/", s.src.display());
        let mut args = extra.to_vec();
        let url = d.url("m");
        args.extend([src_arg.as_str(), url.as_str()]);
        let w = Watch::start(&s.key, &s.journal, &args, &[]);
        let mut lines = w.first_sync();
        for i in 0..12 {
            if i == 6 {
                // Between batches (the last write went 150 ms ago): a
                // rename racing the batch that reads its tree is the
                // pending set's case, not this test's.
                std::fs::rename(s.src.join("d0"), s.src.join("d0-moved")).unwrap();
                std::fs::remove_file(s.src.join("a.txt")).unwrap();
                std::thread::sleep(Duration::from_millis(150));
            }
            let f = s.src.join(format!("d{}/f{i}", i % 3));
            write(&f, &vec![i as u8; 5000]);
            std::thread::sleep(Duration::from_millis(150));
        }
        wait_same(&s.src, &s.export.join("m"), Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(300));
        lines.extend(w.drain());
        let data: Vec<_> = lines
            .iter()
            .filter(|l| l["full"] == true || l["listed"].as_u64() > Some(0))
            .collect();
        assert!(data.len() >= 5, "{extra:?}: too few batches: {lines:?}");
        for l in &data {
            assert_eq!(l["ok"], true, "{extra:?}: {l}");
            // A full scan goes on a connection of its own, in windows
            // (replicate::job::fits_kept); a tree that appeared (the
            // rename, in copy mode) too.
            let small = l["full"] == false && l["listed"].as_u64() == Some(1);
            if small {
                assert_eq!(l["kept"], true, "{extra:?}: not on the channel: {l}");
            }
            if l["full"] == true {
                assert_eq!(
                    l["kept"], false,
                    "{extra:?}: a full scan on the channel: {l}"
                );
            }
            assert_eq!(l["channels"], 1, "{extra:?}: a second connection: {l}");
        }
    }
}

/// A file still being written is not sent until closed (or quiet).
#[test]
fn a_half_written_file_waits_for_its_close() {
    use std::io::Write;
    let s = setup();
    let d = TestDaemon::start(&s.export, &s.key);
    let src_arg = format!("{}/", s.src.display());
    let w = Watch::start(&s.key, &s.journal, &[&src_arg, &d.url("m")], &[]);
    w.first_sync();
    let mut f = std::fs::File::create(s.src.join("slow")).unwrap();
    f.write_all(b"part one, ").unwrap();
    // Writes keep coming, closer together than the quiet time (300 ms).
    for _ in 0..8 {
        std::thread::sleep(Duration::from_millis(100));
        f.write_all(b"more, ").unwrap();
        let at_dst = s.export.join("m/slow");
        assert!(!at_dst.exists(), "sent while still being written");
    }
    f.write_all(b"end").unwrap();
    drop(f);
    wait_same(&s.src, &s.export.join("m"), Duration::from_secs(20));
    // The same in a directory that is new: the directory goes at once, as
    // a tree, but without the file still being written (pending::Batch::
    // hold), which follows once closed.
    std::fs::create_dir(s.src.join("new")).unwrap();
    let mut f = std::fs::File::create(s.src.join("new/slow")).unwrap();
    f.write_all(b"part one, ").unwrap();
    for _ in 0..8 {
        std::thread::sleep(Duration::from_millis(100));
        f.write_all(b"more, ").unwrap();
        let at_dst = s.export.join("m/new/slow");
        assert!(
            !at_dst.exists(),
            "sent with its new directory while still being written"
        );
    }
    assert!(
        s.export.join("m/new").is_dir(),
        "the new directory went at once"
    );
    f.write_all(b"end").unwrap();
    drop(f);
    wait_same(&s.src, &s.export.join("m"), Duration::from_secs(20));
}

/// Kill the agent mid-stream, change more while it is down, start it
/// again with the same journal: nothing lost.
#[test]
fn killing_the_agent_mid_stream_loses_nothing() {
    let s = setup();
    let d = TestDaemon::start(&s.export, &s.key);
    let src_arg = format!("{}/", s.src.display());
    let args = [src_arg.as_str(), &d.url("m")];
    let mut w = Watch::start(&s.key, &s.journal, &args, &[]);
    w.first_sync();
    let writer = {
        let src = s.src.clone();
        std::thread::spawn(move || {
            for i in 0..3000 {
                write(&src.join(format!("d{}/f{i}", i % 10)), &vec![i as u8; 4096]);
            }
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    w.kill();
    writer.join().unwrap();
    std::fs::rename(s.src.join("d1"), s.src.join("d1-renamed")).unwrap();
    std::fs::remove_dir_all(s.src.join("d2")).unwrap();
    let w = Watch::start(&s.key, &s.journal, &args, &[]);
    w.first_sync();
    wait_same(&s.src, &s.export.join("m"), Duration::from_secs(60));
}

/// Kill the destination daemon mid-stream and start it again on the same
/// port: the job falls behind, retries, and catches up.
#[test]
fn killing_the_destination_daemon_loses_nothing() {
    let s = setup();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let start = || {
        let mut c = Command::new(bin());
        c.args(["serve", "--listen", &listen, "--root"])
            .arg(&s.export)
            .arg("--key-file")
            .arg(&s.key)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        TestDaemon::spawn(c, &s.export)
    };
    let mut d = start();
    let src_arg = format!("{}/", s.src.display());
    let w = Watch::start(&s.key, &s.journal, &[&src_arg, &d.url("m")], &[]);
    w.first_sync();
    for i in 0..500 {
        write(&s.src.join(format!("a/f{i}")), &vec![1u8; 8192]);
    }
    d.kill();
    for i in 0..500 {
        write(&s.src.join(format!("b/f{i}")), &vec![2u8; 8192]);
    }
    std::fs::rename(s.src.join("a"), s.src.join("a2")).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let _d = start();
    wait_same(&s.src, &s.export.join("m"), Duration::from_secs(90));
    // The job opened a new channel to the restarted daemon and kept its
    // sessions on it (the batch's line follows its data at DST).
    // (Whether a channel was open before the kill depends on whether the
    // first batch after the full sync left before it: count none.)
    let reopened = |ls: &[serde_json::Value]| {
        ls.iter()
            .skip_while(|l| l["ok"] != false)
            .any(|l| l["kept"] == true && l["ok"] == true)
    };
    let mut lines = w.drain();
    let end = Instant::now() + Duration::from_secs(10);
    while !reopened(&lines) && Instant::now() < end {
        lines.extend(w.lines.recv_timeout(Duration::from_millis(200)));
    }
    // On a loaded machine the restarted daemon may refuse the first
    // channel (busy), and that batch goes on connections of its own; the
    // next change must then find the channel reopened.
    if !reopened(&lines) {
        write(&s.src.join("b/late"), b"late");
        let end = Instant::now() + Duration::from_secs(30);
        while !reopened(&lines) && Instant::now() < end {
            lines.extend(w.lines.recv_timeout(Duration::from_millis(200)));
        }
        wait_same(&s.src, &s.export.join("m"), Duration::from_secs(30));
    }
    assert!(
        lines.iter().any(|l| l["ok"] == false),
        "no batch failed while DST was down"
    );
    assert!(
        reopened(&lines),
        "no batch on a reopened channel: {lines:?}"
    );
}

/// Stall the reader (test hook) until the kernel queue overflows: the full
/// scan that follows catches everything.
#[test]
fn an_overflowed_event_queue_is_caught_up_by_a_full_scan() {
    let s = setup();
    let d = TestDaemon::start(&s.export, &s.key);
    let stall = s.journal.with_extension("stall");
    let src_arg = format!("{}/", s.src.display());
    let w = Watch::start(
        &s.key,
        &s.journal,
        &[&src_arg, &d.url("m")],
        &[("RAMSYS_WATCH_STALL_FILE", &stall)],
    );
    w.first_sync();
    std::fs::write(&stall, b"").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    for i in 0..20_000 {
        std::fs::File::create(s.src.join(format!("f{i}"))).unwrap();
    }
    std::fs::remove_file(&stall).unwrap();
    wait_same(&s.src, &s.export.join("m"), Duration::from_secs(120));
    std::thread::sleep(Duration::from_millis(500));
    let lines = w.drain();
    assert!(
        lines.iter().any(|l| l["overflows"].as_u64() >= Some(1)),
        "no overflow reported: {:?}",
        lines.last()
    );
    assert!(
        lines.iter().any(|l| l["full"] == true),
        "no full scan after the overflow"
    );
}

/// A local DST (a loopback daemon in the agent), with inotify.
#[test]
fn local_destination_with_inotify() {
    let s = setup();
    let dst = s.export.join("copy");
    let args = [
        "--watch-backend",
        "inotify",
        s.src.to_str().unwrap(),
        dst.to_str().unwrap(),
    ];
    let w = Watch::start(&s.key, &s.journal, &args, &[]);
    w.first_sync();
    std::fs::create_dir(s.src.join("sub")).unwrap();
    write(&s.src.join("sub/x"), b"x");
    // Large files take the kernel-copy path of a local DST, in every
    // session of the job (each publishes its own file list).
    write(&s.src.join("big1"), &vec![7u8; 2 << 20]);
    wait_same(&s.src, &dst.join("src"), Duration::from_secs(30));
    write(&s.src.join("big2"), &vec![9u8; 3 << 20]);
    std::fs::rename(s.src.join("sub"), s.src.join("sub2")).unwrap();
    // rsync's rule: SRC without '/' lands as DST/src.
    wait_same(&s.src, &dst.join("src"), Duration::from_secs(30));
}

/// A file written into a directory renamed right after (issue 38): a
/// batch that reads the old name after the rename finds the file gone, the
/// rename's event comes after the batch, and the file must still reach DST
/// under its new name, without the hourly full scan. With fanotify the
/// file's events may already name the new directory (a handle resolved
/// after the rename): they must survive the rename's event.
#[test]
fn a_file_in_a_directory_renamed_right_after_reaches_dst() {
    renamed_right_after("auto");
    renamed_right_after("inotify");
}

fn renamed_right_after(backend: &str) {
    let s = setup();
    let dst = s.export.join("copy");
    let rounds = 120;
    for i in 0..rounds {
        std::fs::create_dir(s.src.join(format!("d{i}"))).unwrap();
    }
    let w = Watch::start(
        &s.key,
        &s.journal,
        &[
            "--watch-backend",
            backend,
            s.src.to_str().unwrap(),
            dst.to_str().unwrap(),
        ],
        &[],
    );
    w.first_sync();
    wait_same(&s.src, &dst.join("src"), Duration::from_secs(30));
    for i in 0..rounds {
        write(&s.src.join(format!("d{i}/f")), format!("{i}").as_bytes());
        // 0-4 ms: the rename lands before, during and after the batch is
        // cut.
        std::thread::sleep(Duration::from_micros(1000 * (i % 5)));
        std::fs::rename(s.src.join(format!("d{i}")), s.src.join(format!("e{i}"))).unwrap();
    }
    wait_same(&s.src, &dst.join("src"), Duration::from_secs(10));
    let full = w.drain().iter().filter(|v| v["full"] == true).count();
    assert_eq!(
        full, 0,
        "{backend}: caught up by its batches, not a full scan"
    );
}

/// `mv d e; mkdir d` and files written into the new `d` while the watcher
/// is behind (test hook), read by a batch (the periodic full scan) before
/// the rename's event (issue 38, docs/WATCH.md "Renames behind a batch"):
/// that event must not carry DST's new `d` onto `e`, and DST must be SRC
/// again by the batches that follow, not by the next full scan.
#[test]
fn a_directory_renamed_and_made_again_behind_a_batch_converges() {
    replaced_behind_a_batch("auto");
    replaced_behind_a_batch("inotify");
}

/// fanotify's queue holds the whole file system's events: other work on
/// the machine (builds) can overflow it during the stall, and the full scan
/// that follows hides what the test looks at. So fanotify stalls for at
/// most a second (a full scan every second), and a round where the queue
/// overflowed, or the next periodic scan came too soon, is run again; when
/// none of 5 can tell, it is skipped. inotify's queue holds this tree's
/// events only: its round must tell.
fn replaced_behind_a_batch(backend: &str) {
    let fan = backend != "inotify";
    for _ in 0..5 {
        if replaced_once(backend, if fan { "1" } else { "3" }) || !fan {
            return;
        }
        eprintln!("{backend}: the queue overflowed or a full scan came; again");
    }
    eprintln!("skipped: {backend}: the file system is too busy to stall fanotify's queue");
}

/// One round; false when it cannot tell (the kernel queue overflowed, or a
/// periodic full scan ran after the stall).
fn replaced_once(backend: &str, rescan: &str) -> bool {
    let s = setup();
    let dst = s.export.join("copy");
    let stall = s.journal.with_extension("stall");
    write(&s.src.join("d/x"), b"old");
    write(&s.src.join("d/keep"), b"old too");
    let w = Watch::start(
        &s.key,
        &s.journal,
        &[
            "--watch-backend",
            backend,
            "--watch-rescan",
            rescan,
            s.src.to_str().unwrap(),
            dst.to_str().unwrap(),
        ],
        &[("RAMSYS_WATCH_STALL_FILE", &stall)],
    );
    w.first_sync();
    let mirror = dst.join("src");
    wait_same(&s.src, &mirror, Duration::from_secs(30));
    std::fs::write(&stall, b"").unwrap();
    // The reader's wait (100 ms) ends and it stalls.
    std::thread::sleep(Duration::from_millis(300));
    std::fs::rename(s.src.join("d"), s.src.join("e")).unwrap();
    write(&s.src.join("d/x"), b"new");
    write(&s.src.join("d/extra"), b"new only");
    // The periodic full scan reads the new d (once it ended, DST is SRC);
    // the events wait.
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(
            Instant::now() < end,
            "{backend}: no full scan read the new d"
        );
        let Ok(v) = w.lines.recv_timeout(Duration::from_millis(200)) else {
            continue;
        };
        if v["full"] == true && v["ok"] == true && snapshot(&s.src) == snapshot(&mirror) {
            break;
        }
    }
    std::fs::remove_file(&stall).unwrap();
    // The events' batches: until none comes for 300 ms, with one at least.
    let mut lines = Vec::new();
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        match w.lines.recv_timeout(Duration::from_millis(300)) {
            Ok(v) => lines.push(v),
            Err(_) if !lines.is_empty() => break,
            Err(_) => {}
        }
    }
    assert!(!lines.is_empty(), "{backend}: no batch after the stall");
    let overflow = lines.iter().any(|v| v["overflows"].as_u64() > Some(0));
    let full = lines.iter().any(|v| v["full"] == true);
    if backend != "inotify" && (overflow || full) {
        return false;
    }
    assert!(!full, "{backend}: a full scan ran: {lines:?}");
    assert_same_tree(&s.src, &mirror);
    true
}

/// Runs `round` for `backend` until it can tell (at most 5 times for
/// fanotify, whose queue holds the whole file system's events: other work
/// on the machine can overflow it while the watcher is stalled, and the full
/// scan that follows hides what the test looks at; skipped when none of 5
/// can tell). inotify's queue holds this tree's events only: its first round
/// must tell.
fn told(backend: &str, round: fn(&str) -> bool) {
    for _ in 0..5 {
        if round(backend) {
            return;
        }
        assert_ne!(backend, "inotify", "inotify: a round could not tell");
        eprintln!("{backend}: could not tell (the queue overflowed); again");
    }
    eprintln!("skipped: {backend}: the file system is too busy to stall fanotify's queue");
}

/// A job for the rounds below: `--watch-rescan 0` (the only full scans are
/// the first and an overflow's), the pause hook (a batch waits before it
/// reads while `pause` exists) and the stall hook (the watcher reads nothing
/// while `stall` exists).
struct Paused {
    s: Setup,
    w: Watch,
    pause: PathBuf,
    stall: PathBuf,
    /// DST's copy of SRC.
    mirror: PathBuf,
}

impl Paused {
    /// With `files` in SRC before the job starts (its first sync sends
    /// them: no batch is left to wait but the test's).
    fn start(backend: &str, quiet: &str, files: &[(&str, &[u8])]) -> Paused {
        let s = setup();
        for (p, data) in files {
            write(&s.src.join(p), data);
        }
        let dst = s.export.join("copy");
        let pause = s.journal.with_extension("pause");
        let stall = s.journal.with_extension("stall");
        let w = Watch::start(
            &s.key,
            &s.journal,
            &[
                "--watch-backend",
                backend,
                "--watch-rescan",
                "0",
                "--watch-quiet",
                quiet,
                s.src.to_str().unwrap(),
                dst.to_str().unwrap(),
            ],
            &[
                ("RAMSYS_WATCH_PAUSE_FILE", &pause),
                ("RAMSYS_WATCH_STALL_FILE", &stall),
            ],
        );
        w.first_sync();
        let mirror = dst.join("src");
        wait_same(&s.src, &mirror, Duration::from_secs(30));
        Paused {
            s,
            w,
            pause,
            stall,
            mirror,
        }
    }

    fn src(&self, p: &str) -> PathBuf {
        self.s.src.join(p)
    }

    /// Wait until a batch listing `path` waits (the hook writes what it
    /// lists into the pause file).
    fn paused_with(&self, path: &str) {
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let listed = std::fs::read_to_string(&self.pause).unwrap_or_default();
            if listed.lines().any(|l| l == path) {
                return;
            }
            assert!(Instant::now() < end, "no batch listing {path}: {listed:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Batch lines until none comes for `quiet`, with one at least.
    fn batches(&self, quiet: Duration) -> Vec<serde_json::Value> {
        let mut lines = Vec::new();
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end {
            match self.w.lines.recv_timeout(quiet) {
                Ok(v) => lines.push(v),
                Err(_) if !lines.is_empty() => break,
                Err(_) => {}
            }
        }
        assert!(!lines.is_empty(), "no batch");
        lines
    }

    /// DST must be SRC again by the batches, with no full scan; false when
    /// the round cannot tell (fanotify's queue overflowed). `lines`: the
    /// batch lines since the pause.
    fn converged(&self, backend: &str, mut lines: Vec<serde_json::Value>) -> bool {
        let same = converges(&self.s.src, &self.mirror, Duration::from_secs(15));
        // The batches that made it so report after it.
        std::thread::sleep(Duration::from_millis(300));
        lines.extend(self.w.drain());
        let overflow = lines.iter().any(|v| v["overflows"].as_u64() > Some(0));
        if overflow && backend != "inotify" {
            return false;
        }
        let full = lines.iter().any(|v| v["full"] == true);
        assert!(!full, "{backend}: a full scan ran: {lines:?}");
        if !same {
            assert_same_tree(&self.s.src, &self.mirror);
        }
        true
    }
}

/// docs/WATCH.md "Deletes behind a batch" on a real file system: b/x waits
/// as a file and its batch is taken (held before it reads by the pause
/// hook); rm b/x; mv b c; mkdir b, read by the watcher while the batch waits;
/// then, with the watcher stalled, mv c b/x; mkdir c. The batch reads b/x, a
/// directory now, and puts it at DST's b/x. The delete of the file b/x must
/// take it: else the rename b -> c carries it onto c/x, and the late rename
/// c -> b/x brings it back as b/x/x, where SRC has nothing (until a full
/// scan, which this job never runs).
#[test]
fn a_name_deleted_behind_a_batch_that_read_it_converges() {
    told("auto", deleted_behind_once);
    told("inotify", deleted_behind_once);
}

fn deleted_behind_once(backend: &str) -> bool {
    let p = Paused::start(backend, "300", &[("b/keep", b"keep")]);
    std::fs::write(&p.pause, b"").unwrap();
    write(&p.src("b/x"), b"x");
    p.paused_with("b/x");
    std::fs::remove_file(p.src("b/x")).unwrap();
    std::fs::rename(p.src("b"), p.src("c")).unwrap();
    std::fs::create_dir(p.src("b")).unwrap();
    // Time for the watcher to read these while the batch waits; if it has
    // not (a busy machine), they come after the batch too, which is the
    // model's late case (the same bug with fanotify's names).
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(&p.stall, b"").unwrap();
    std::fs::rename(p.src("c"), p.src("b/x")).unwrap();
    std::fs::create_dir(p.src("c")).unwrap();
    std::fs::remove_file(&p.pause).unwrap();
    // The batch that waited, and the one of the events read meanwhile.
    let lines = p.batches(Duration::from_millis(500));
    std::fs::remove_file(&p.stall).unwrap();
    p.converged(backend, lines)
}

/// docs/WATCH.md "Files held out of a mirror" on a real file system: the
/// new tree b goes out and its batch waits (pause hook); with the watcher
/// stalled, mv b a; mkdir -p b/x; b/x/y written; a/x opened and written. The batch reads
/// the new b and puts the directory b/x at DST; the rename's late event
/// carries it onto a/x and makes `a` a mirror, which holds a/x out (still
/// being written) and so keeps that directory. Once closed, a/x must
/// replace it (it failed at the sink until a full scan).
#[test]
fn a_file_held_out_of_a_mirror_replaces_a_directory_at_its_name() {
    told("auto", held_out_once);
    told("inotify", held_out_once);
}

fn held_out_once(backend: &str) -> bool {
    // a/x waits for its close, not for a quiet time, all along.
    let p = Paused::start(backend, "60000", &[]);
    std::fs::write(&p.pause, b"").unwrap();
    std::fs::create_dir(p.src("b")).unwrap();
    p.paused_with("b");
    std::fs::write(&p.stall, b"").unwrap();
    std::fs::rename(p.src("b"), p.src("a")).unwrap();
    // Not empty: the sink would replace an empty directory with the file.
    write(&p.src("b/x/y"), b"y");
    let mut f = std::fs::File::create(p.src("a/x")).unwrap();
    std::io::Write::write_all(&mut f, b"half").unwrap();
    std::fs::remove_file(&p.pause).unwrap();
    let mut lines = p.batches(Duration::from_millis(300));
    assert!(p.mirror.join("b/x").is_dir(), "{backend}: {lines:?}");
    std::fs::remove_file(&p.stall).unwrap();
    // The rename's batch: the mirror of a holds a/x out and keeps the
    // directory the rename op carried there.
    lines.extend(p.batches(Duration::from_millis(500)));
    if !p.mirror.join("a/x").is_dir() {
        // Only an overflow's full scan can have made it otherwise.
        assert_ne!(backend, "inotify", "{lines:?}");
        return false;
    }
    std::io::Write::write_all(&mut f, b" and whole").unwrap();
    drop(f);
    p.converged(backend, lines)
}

/// An ssh destination: ssh-serve keeps serving the job's sessions.
#[test]
fn ssh_destination() {
    let Some(sshd) = sshd::Sshd::start() else {
        return;
    };
    let s = setup();
    let dst = s.export.join("viassh");
    let mut args: Vec<String> = sshd.opts();
    args.push(format!("{}/", s.src.display()));
    args.push(format!("127.0.0.1:{}", dst.display()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let w = Watch::start(&s.key, &s.journal, &args, &[]);
    w.first_sync();
    write(&s.src.join("one"), b"1");
    write(&s.src.join("two/three"), b"3");
    wait_same(&s.src, &dst, Duration::from_secs(30));
    std::fs::rename(s.src.join("two"), s.src.join("four")).unwrap();
    wait_same(&s.src, &dst, Duration::from_secs(30));
}

/// A daemon's `[[replicate]]` job: started with the daemon, shown by
/// `status --jobs` and /metrics, resumed after a restart.
#[test]
fn daemon_replication_job() {
    let s = setup();
    let sink = TestDaemon::start(&s.export, &s.key);
    let here = s.journal.parent().unwrap().join("here");
    std::fs::create_dir_all(&here).unwrap();
    let cfg = here.join("ramsys.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[replicate]]\nname = \"mirror\"\nsource = \"{}/\"\ndest = \"{}\"\n\
             delete = true\nquiet_ms = 300\nexclude = [\"*.tmp\"]\njournal = \"{}\"\n",
            s.src.display(),
            sink.url("mirror"),
            s.journal.display()
        ),
    )
    .unwrap();
    write(&s.src.join("before"), b"present at start");
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let maddr = format!("127.0.0.1:{metrics_port}");
    let extra = ["--config", cfg.to_str().unwrap(), "--metrics", &maddr];
    let mut a = TestDaemon::start_with(&here, &s.key, &extra);
    let dst = s.export.join("mirror");
    wait_same(&s.src, &dst, Duration::from_secs(60));
    write(&s.src.join("later/x"), b"after");
    write(&s.src.join("later/scratch.tmp"), b"excluded");
    write(&s.src.join("later/y"), b"after the excluded one");
    let end = Instant::now() + Duration::from_secs(30);
    while !dst.join("later/y").exists() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        !dst.join("later/scratch.tmp").exists(),
        "an excluded file was sent"
    );
    std::fs::remove_file(s.src.join("later/scratch.tmp")).unwrap();
    wait_same(&s.src, &dst, Duration::from_secs(30));
    let o = ramsys(
        &s.key,
        &[
            "status",
            "--jobs",
            "--json",
            &format!("ramsys://{}", a.addr),
        ],
    );
    assert_ok(&o);
    let jobs: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(jobs[0]["name"], "mirror", "{jobs}");
    assert!(jobs[0]["files"].as_u64() >= Some(2), "{jobs}");
    let o = ramsys(
        &s.key,
        &["status", "--jobs", &format!("ramsys://{}", a.addr)],
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("mirror"));
    let m = http_get(&maddr, "/metrics");
    assert!(m.contains("ramsys_job_lag_seconds{job=\"mirror\""), "{m}");
    assert!(
        m.contains("ramsys_job_files_per_second{job=\"mirror\""),
        "{m}"
    );
    // Down, changed, up again: the job resumes.
    a.kill();
    write(&s.src.join("while-down"), b"missed by no one");
    std::fs::remove_file(s.src.join("before")).unwrap();
    let _a = TestDaemon::start_with(&here, &s.key, &["--config", cfg.to_str().unwrap()]);
    wait_same(&s.src, &dst, Duration::from_secs(60));
}

/// DST's disk fills up (a 16 MiB tmpfs as the daemon's export, nearly
/// full): the job reports it, keeps the changes pending, and catches up
/// once space is freed; nothing appears at DST half-written.
#[test]
fn a_full_destination_disk_is_reported_and_caught_up() {
    let Some(fs) = SmallFs::mount("16m", "") else {
        return;
    };
    let s = setup();
    let export = fs.dir.path();
    let d = TestDaemon::start(export, &s.key);
    // There before the job: a new directory is sent as a tree at once,
    // with files still being written in it as they are then (docs/WATCH.md).
    std::fs::create_dir(s.src.join("small")).unwrap();
    let src_arg = format!("{}/", s.src.display());
    let w = Watch::start(&s.key, &s.journal, &[&src_arg, &d.url("m")], &[]);
    w.first_sync();
    // Outside the job's DST: leaves about 1 MiB free.
    let filler = export.join("filler");
    write(&filler, &vec![0u8; 15 << 20]);
    let mut r = Rng(38);
    for i in 0..6 {
        write(&s.src.join(format!("big{i}")), &r.bytes(1 << 20));
    }
    for i in 0..50 {
        write(&s.src.join(format!("small/s{i}")), &r.bytes(3000));
    }
    // The job says so, in its batch lines.
    let end = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    let said = loop {
        assert!(Instant::now() < end, "no failure reported: {seen:?}");
        let Ok(l) = w.lines.recv_timeout(Duration::from_millis(200)) else {
            continue;
        };
        let failed = l["ok"] == false || l["failed"].as_u64() > Some(0);
        seen.push(l.clone());
        if failed {
            break l;
        }
    };
    eprintln!("reported: {said}");
    if said["ok"] == false {
        let e = said["error"].as_str().unwrap_or_default();
        assert!(e.contains("disk full"), "{said}");
        assert!(!e.contains('\n'), "one line: {said}");
    }
    // While full: not everything arrived, and what did is whole.
    let dst = export.join("m");
    std::thread::sleep(Duration::from_secs(1));
    let arrived = (0..6)
        .filter(|i| dst.join(format!("big{i}")).exists())
        .count();
    assert!(arrived < 6, "the disk never filled");
    for p in walk_paths(&dst).iter().filter(|p| p.is_file()) {
        if p.to_string_lossy().contains(".ramsys-") {
            continue;
        }
        let rel = p.strip_prefix(&dst).unwrap();
        let a = std::fs::read(s.src.join(rel)).unwrap();
        assert_eq!(
            a,
            std::fs::read(p).unwrap(),
            "{} half-written",
            rel.display()
        );
    }
    // Space freed: the job catches up, nothing lost, no temp files left.
    std::fs::remove_file(&filler).unwrap();
    wait_same(&s.src, &dst, Duration::from_secs(90));
    assert!(temp_files(&dst).is_empty(), "{:?}", temp_files(&dst));
}

fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    write!(c, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut s = String::new();
    c.read_to_string(&mut s).unwrap();
    s
}
