//! A daemon that holds against its own users (issue 34), the limits part:
//! what docs/SECURITY.md's sections "Bounded connections", "Control
//! characters", "Reserved names" and "Symlinked destinations as root" say,
//! each tried as a hostile user would. Every test here failed on main
//! 0449507.
//!
//! Needs root for the symlink-owner case (CI runs as root); it skips with
//! the reason printed otherwise.
//!
//! (Over 800 lines: every file under tests/ is a test binary of its own
//! that links the whole engine, so one feature's tests stay in one file;
//! shared helpers live in tests/common.)

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::FromRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use ramsys_proto::frame::{FrameHeader, FrameKind, HEADER_LEN};
use ramsys_proto::{preamble, Control, VERSION};

fn is_root() -> bool {
    // SAFETY: no failure mode.
    unsafe { libc::geteuid() == 0 }
}

/// A daemon whose stdout lines ("listening on", "metrics on") are read
/// and whose log goes to a file.
struct Served {
    child: Child,
    addr: SocketAddr,
    metrics: Option<SocketAddr>,
    log: PathBuf,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(root: &Path, key: &Path, log: &Path, extra: &[&str]) -> Served {
    let mut c = Command::new(bin());
    c.args(["serve", "--listen", "127.0.0.1:0", "--root"])
        .arg(root)
        .arg("--key-file")
        .arg(key)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap());
    let mut child = c.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .parse()
        .unwrap();
    let metrics = extra.contains(&"--metrics").then(|| {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        line.trim()
            .strip_prefix("metrics on ")
            .unwrap()
            .parse()
            .unwrap()
    });
    // Keep reading stdout so the daemon never blocks on it.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    Served {
        child,
        addr,
        metrics,
        log: log.to_path_buf(),
    }
}

/// (threads, resident kB) of process `pid`, from /proc/PID/status.
fn threads_rss(pid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("Threads:"), field("VmRSS:"))
}

/// Allow this test process the descriptors of a flood.
fn raise_nofile() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid rlimit out-pointer, then the same struct in.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
    }
}

/// A TCP connection to `dst` from source address `src` (any 127/8 address
/// is this host): each hostile "host" of the flood is its own address.
fn connect_from(src: Ipv4Addr, dst: SocketAddr) -> std::io::Result<TcpStream> {
    // SAFETY: plain socket calls on a descriptor this function owns; the
    // sockaddr structs are initialized and of the size passed.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let s = TcpStream::from_raw_fd(fd);
        let sin = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(ip).to_be(),
            },
            sin_zero: [0; 8],
        };
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let a = sin(src, 0);
        if libc::bind(fd, &a as *const _ as *const libc::sockaddr, len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let SocketAddr::V4(d) = dst else {
            panic!("IPv4 only")
        };
        let b = sin(*d.ip(), d.port());
        if libc::connect(fd, &b as *const _ as *const libc::sockaddr, len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(s)
    }
}

/// The kinds of hostile connection of the flood.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    /// Connects and sends nothing.
    Idle,
    /// Connects and closes its sending side at once.
    HalfOpen,
    /// Sends its preamble one byte at a time, one byte a second.
    Slowloris,
    /// Sends a preamble and a control frame header announcing 1 MiB.
    Huge,
}

fn open_one(kind: Kind, src: Ipv4Addr, dst: SocketAddr) -> Option<TcpStream> {
    let mut s = connect_from(src, dst).ok()?;
    match kind {
        Kind::Idle | Kind::Slowloris => {}
        Kind::HalfOpen => {
            let _ = s.shutdown(std::net::Shutdown::Write);
        }
        Kind::Huge => {
            let mut b = preamble(VERSION).to_vec();
            b.extend_from_slice(&FrameHeader::new(FrameKind::Control, 0, 1 << 20).encode());
            let _ = s.write_all(&b);
        }
    }
    Some(s)
}

/// Read the daemon's answer on a hostile connection: its preamble, then
/// an Error frame if it sent one (None when it only closed).
fn error_on(s: &mut TcpStream) -> Option<String> {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    let rest = all.get(8..)?;
    let h = FrameHeader::decode(rest.first_chunk::<HEADER_LEN>()?, 0).ok()?;
    match Control::decode(rest.get(HEADER_LEN..HEADER_LEN + h.len as usize)?) {
        Ok(Control::Error { message, .. }) => Some(message),
        _ => None,
    }
}

fn copy_ok(key: &Path, src: &Path, url: &str) {
    let o = ramsys(key, &["cp", "-r", src.to_str().unwrap(), url]);
    assert_ok(&o);
}

/// Issue 34, bounded connections: 2,000 hostile connections (idle,
/// half-open, slowloris, 1 MiB length prefixes) to the data port from
/// four addresses and to /metrics. The daemon's threads stay within a few
/// of its idle count (main 0449507: one thread per connection, 1,015 for
/// 500 + 500), its memory within a few MB, its log within a few lines; the
/// connections over the per-address limit get an Error saying so, the
/// oversized prefixes one naming the limit; a normal copy works during
/// the flood and after, and the slow ones are closed by the handshake
/// deadline.
#[test]
fn a_flood_of_hostile_connections_is_bounded_and_copies_still_work() {
    raise_nofile();
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    make_varied_tree(&src, 1 << 16);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = serve(
        &root,
        &key,
        &t.path().join("log"),
        &[
            "--metrics",
            "127.0.0.1:0",
            "--max-connections-per-addr",
            "200",
            "--handshake-timeout",
            // Long enough for the flood to be open before the first
            // deadline even on a loaded machine (800 connects reach the
            // limit of one address; at 4 s they did not always).
            "8",
        ],
    );
    let pid = d.child.id();
    copy_ok(&key, &src, &format!("ramsys://{}/warm", d.addr));
    let (threads0, rss0) = threads_rss(pid);

    // 1,500 to the data port from 127.0.0.2-5 (375 each, over the limit
    // of 200 per address), 500 to /metrics.
    let kinds = [Kind::Idle, Kind::HalfOpen, Kind::Slowloris, Kind::Huge];
    let mut data: Vec<(Kind, TcpStream)> = Vec::new();
    for i in 0..1500u32 {
        let kind = kinds[(i % 4) as usize];
        let src_ip = Ipv4Addr::new(127, 0, 0, 2 + (i % 4) as u8);
        if let Some(s) = open_one(kind, src_ip, d.addr) {
            data.push((kind, s));
        }
    }
    let m = d.metrics.unwrap();
    let mut metrics: Vec<TcpStream> = (0..500u32)
        .filter_map(|i| open_one(Kind::Idle, Ipv4Addr::new(127, 0, 0, 6 + (i % 2) as u8), m))
        .collect();
    assert!(
        data.len() > 1400 && metrics.len() > 450,
        "the flood is there"
    );
    // Slowloris: a byte of the preamble a second on every slow one.
    let pre = preamble(VERSION);
    let mut peak = (0, 0);
    let t0 = Instant::now();
    let mut sent = 0;
    while t0.elapsed() < Duration::from_secs(2) {
        for (k, s) in data.iter_mut().filter(|(k, _)| *k == Kind::Slowloris) {
            let _ = (k, s.write_all(&pre[sent % 8..sent % 8 + 1]));
        }
        for s in metrics.iter_mut().step_by(2) {
            let _ = s.write_all(b"G");
        }
        sent += 1;
        let now = threads_rss(pid);
        peak = (peak.0.max(now.0), peak.1.max(now.1));
        std::thread::sleep(Duration::from_millis(500));
    }
    // During the flood: a copy from another address works, and so does a
    // scrape.
    copy_ok(&key, &src, &format!("ramsys://{}/during", d.addr));
    let mut scrape = TcpStream::connect(m).unwrap();
    scrape
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    scrape.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    let _ = scrape.read_to_string(&mut text);
    assert!(
        text.contains("ramsys_up 1"),
        "scrape during the flood: {text:.200}"
    );
    let now = threads_rss(pid);
    peak = (peak.0.max(now.0), peak.1.max(now.1));
    eprintln!(
        "idle: {threads0} threads, {rss0} kB; flood peak: {} threads, {} kB",
        peak.0, peak.1
    );
    assert!(
        peak.0 <= threads0 + 8,
        "threads grew from {threads0} to {} with the flood",
        peak.0
    );
    assert!(
        peak.1 <= rss0 + 32 * 1024,
        "memory grew from {rss0} kB to {} kB with the flood",
        peak.1
    );

    // What the hostile connections were told.
    let mut told = std::collections::BTreeMap::<(String, &str), usize>::new();
    for (kind, mut s) in data {
        let m = error_on(&mut s).unwrap_or_else(|| "(closed)".into());
        let gist = if m.contains("--max-connections-per-addr") {
            "per-address limit"
        } else if m.contains("1048576") && m.contains("65536") {
            "oversized prefix"
        } else if m.contains("first message within 8 s") {
            "handshake deadline"
        } else if m == "(closed)" {
            "closed"
        } else {
            panic!("{kind:?} told {m}")
        };
        *told.entry((format!("{kind:?}"), gist)).or_default() += 1;
    }
    eprintln!("{told:?}");
    let n = |k: &str, g: &str| told.get(&(k.to_string(), g)).copied().unwrap_or(0);
    // Each kind comes from one address: 375 connections against a limit of
    // 200, so up to 200 of the slow kinds meet the deadline (fewer when
    // the flood is slow to open and the limit is reached later).
    assert!(n("Huge", "oversized prefix") > 200, "{told:?}");
    assert!(n("Idle", "handshake deadline") >= 150, "{told:?}");
    assert!(n("Slowloris", "handshake deadline") >= 150, "{told:?}");
    let limited: usize = kinds
        .iter()
        .map(|k| n(&format!("{k:?}"), "per-address limit"))
        .sum();
    assert!(limited > 0, "{told:?}");
    assert_eq!(
        n("Idle", "closed") + n("Slowloris", "closed"),
        0,
        "{told:?}"
    );

    // After: threads back, a copy works, the log said it in a few lines.
    copy_ok(&key, &src, &format!("ramsys://{}/after", d.addr));
    assert_same_tree(&src, &root.join("after"));
    let (threads1, _) = threads_rss(pid);
    assert!(threads1 <= threads0 + 2, "{threads0} -> {threads1}");
    let log = std::fs::read_to_string(&d.log).unwrap();
    eprintln!("daemon log:\n{log}");
    let lines = log.lines().count();
    assert!(lines < 40, "{lines} log lines:\n{log}");
    assert!(log.contains("connection refused"), "{log}");
    assert!(log.contains("no complete first message"), "{log}");
}

// ---------------------------------------------------------------------
// Reserved names (docs/SECURITY.md "Reserved names").

use std::sync::Arc;

use ramsys_engine::session::{ClientLinks, Connect, LinkProvider};
use ramsys_engine::transport::tcp::Tcp;
use ramsys_engine::transport::wire::{read_header, recv_control, send_control};
use ramsys_engine::transport::Link;
use ramsys_proto::control::{Entry, EntryKind, Open, Propose, Role};
use ramsys_proto::data::{encode_table, hash_block, table_len, Segment};

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

fn entry(id: u64, path: &[u8], kind: EntryKind) -> Entry {
    Entry {
        id,
        path: path.to_vec(),
        kind,
        mode: 0o644,
        mtime_s: 0,
        mtime_ns: 0,
    }
}

/// A peer that speaks the protocol by hand: pushes `entries` into the
/// daemon's root and sends `files` (id, bytes) as payload; returns the
/// SyncDone and Complete failures as (path, reason).
fn hostile_push(addr: &str, entries: Vec<Entry>, files: &[(u64, &[u8])]) -> Vec<(String, String)> {
    let t = Tcp::default();
    let s = Connect::new(addr, KEY, Duration::from_secs(5))
        .open(&t)
        .unwrap();
    let mut ctl = s.ctl;
    let open = Open {
        server_role: Role::Sink,
        paths: vec![Vec::new()],
        recursive: true,
        streams: 1,
        block_size: 1 << 16,
        checksum: true,
    };
    send_control(&mut *ctl, &Control::Open(open)).unwrap();
    let propose = Propose {
        roots: 1,
        streams: 1,
        block_size: 1 << 16,
        capacity_mbps: 0,
        checksum: true,
        cipher: 0,
    };
    send_control(&mut *ctl, &Control::Propose(propose)).unwrap();
    let Control::Confirm(confirm) = recv_control(&mut *ctl).unwrap() else {
        panic!("expected Confirm")
    };
    let n = entries.len() as u64;
    let bytes: u64 = files.iter().map(|f| f.1.len() as u64).sum();
    send_control(&mut *ctl, &Control::Entries(entries)).unwrap();
    let end = Control::MetaEnd {
        entries: n,
        files: files.len() as u64,
        bytes,
    };
    send_control(&mut *ctl, &end).unwrap();
    let mut out = Vec::new();
    let Control::SyncDone { failures } = recv_control(&mut *ctl).unwrap() else {
        panic!("expected SyncDone")
    };
    out.extend(failures.into_iter().map(|f| (lossy(&f.path), f.reason)));
    let mut links = ClientLinks {
        transport: Arc::new(Tcp::default()),
        addr: addr.to_string(),
        session: s.session,
        session_key: s.session_key,
        timeout: Duration::from_secs(5),
    };
    let mut data = links.open(confirm.streams).unwrap();
    let link = &mut data[0];
    let h = read_header(&mut **link, 0).unwrap().unwrap();
    assert_eq!(h.kind, FrameKind::Credit);
    let mut c = [0u8; 4];
    link.read_exact(&mut c).unwrap();
    let mut done = Vec::new();
    for (id, payload) in files {
        let segs = [Segment {
            file_id: *id,
            offset: 0,
            len: payload.len() as u32,
        }];
        let mut hashes = [0u64];
        let ck = hash_block(&segs, payload, &mut hashes);
        send_block(&mut **link, &segs, ck, payload);
        done.push((*id, hashes[0]));
    }
    link.write_all(&FrameHeader::new(FrameKind::End, 0, 0).encode())
        .unwrap();
    send_control(&mut *ctl, &Control::FilesDone(done)).unwrap();
    let eod = Control::EndOfData {
        files: files.len() as u64,
        bytes,
    };
    send_control(&mut *ctl, &eod).unwrap();
    loop {
        match recv_control(&mut *ctl).unwrap() {
            Control::Settled => {}
            Control::Complete(c) => {
                out.extend(c.failures.into_iter().map(|f| (lossy(&f.path), f.reason)));
                return out;
            }
            m => panic!("expected Complete, got {m:?}"),
        }
    }
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn send_block(link: &mut dyn Link, segs: &[Segment], ck: u64, payload: &[u8]) {
    let mut table = vec![0u8; table_len(segs.len())];
    let tl = encode_table(ck, segs, &mut table);
    let h = FrameHeader::new(
        FrameKind::Data,
        segs.len() as u16,
        (tl + payload.len()) as u32,
    );
    link.write_all(&h.encode()).unwrap();
    link.write_all(&table).unwrap();
    link.write_all(payload).unwrap();
}

/// The names ramsys makes inside a destination, as a hostile peer would
/// send them.
const RESERVED: [&str; 5] = [
    ".ramsys-journal.sqlite",
    ".ramsys-journal.sqlite-wal",
    ".f.ramsys-00000000000000ab.part",
    ".g.ramsys-0123456789abcdef.big",
    ".ramsys-0000000000000001-0.lnk",
];

/// Issue 34, reserved names, written by a peer: a hand-made push of files
/// and a symlink named like the journal, a temp file, a big file's temp
/// file and a temp link is refused entry by entry (one failure line
/// each), nothing is created under those names and the rest lands (main
/// 0449507 wrote them all, the journal's name included).
#[test]
fn a_peer_cannot_write_reserved_names() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = TestDaemon::start(&root, &key);
    let mut es = vec![entry(0, b"d", EntryKind::Dir)];
    let mut files: Vec<(u64, &[u8])> = Vec::new();
    for (i, n) in RESERVED.iter().enumerate() {
        let id = es.len() as u64;
        let path = if i % 2 == 0 {
            n.to_string()
        } else {
            format!("d/{n}")
        };
        es.push(entry(id, path.as_bytes(), EntryKind::File { size: 5 }));
        files.push((id, b"pwned"));
    }
    let id = es.len() as u64;
    es.push(entry(
        id,
        b".ramsys-journal.sqlite-shm",
        EntryKind::Symlink {
            target: b"/etc/passwd".to_vec(),
        },
    ));
    es.push(entry(id + 1, b"d/fine", EntryKind::File { size: 2 }));
    files.push((id + 1, b"ok"));
    let failed = hostile_push(&d.addr, es, &files);
    for n in RESERVED.iter().chain([&".ramsys-journal.sqlite-shm"]) {
        assert!(
            failed
                .iter()
                .any(|(p, r)| p.ends_with(n) && r.contains("reserves")),
            "{n} not refused: {failed:?}"
        );
        assert!(std::fs::symlink_metadata(root.join(n)).is_err(), "{n} made");
        assert!(
            std::fs::symlink_metadata(root.join("d").join(n)).is_err(),
            "d/{n} made"
        );
    }
    // Each once (a symlink refused before the payload is in SyncDone and
    // in Complete, like every entry the sink could not prepare).
    let paths: std::collections::BTreeSet<&String> = failed.iter().map(|f| &f.0).collect();
    assert_eq!(paths.len(), RESERVED.len() + 1, "{failed:?}");
    assert_eq!(std::fs::read(root.join("d/fine")).unwrap(), b"ok");
}

/// Issue 34, reserved names through the agent: a tree holding them sends
/// everything else (they are not part of what a session reads); naming one
/// as a source or as DST is refused in one line; a pull can neither name
/// the daemon's journal nor get it with a tree; `--delete` leaves them.
#[test]
fn reserved_names_are_neither_read_nor_written_nor_deleted() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = TestDaemon::start(&root, &key);
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("a"), b"a").unwrap();
    for n in RESERVED {
        std::fs::write(src.join(n), b"x").unwrap();
        std::fs::write(src.join("sub").join(n), b"x").unwrap();
    }
    // A tree: all but the reserved names.
    let o = ramsys(&key, &["cp", "-r", src.to_str().unwrap(), &d.url("t")]);
    assert_ok(&o);
    let got: Vec<PathBuf> = walk_paths(&root.join("t"));
    assert!(got.iter().all(|p| {
        let n = p.file_name().unwrap().to_str().unwrap();
        !RESERVED.contains(&n)
    }));
    assert!(root.join("t/a").exists());
    // A reserved name as the source, or as DST: one line, non-zero.
    let j = src.join(RESERVED[0]);
    let o = ramsys(&key, &["cp", j.to_str().unwrap(), &d.url("x")]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("reserves"), "{}", stderr(&o));
    assert!(!root.join("x").exists());
    let a = src.join("a");
    let o = ramsys(&key, &["cp", a.to_str().unwrap(), &d.url(RESERVED[0])]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("reserves") && e.lines().count() == 1, "{e}");
    assert!(!root.join(RESERVED[0]).exists());
    // The daemon's own journal: not by name, not with the tree.
    std::fs::write(root.join(RESERVED[0]), b"rows naming other files").unwrap();
    let out = t.path().join("out");
    let o = ramsys(&key, &["cp", &d.url(RESERVED[0]), out.to_str().unwrap()]);
    assert!(
        !o.status.success() && stderr(&o).contains("reserves"),
        "{}",
        stderr(&o)
    );
    assert!(!out.exists());
    let o = ramsys(&key, &["cp", "-r", &d.url(""), out.to_str().unwrap()]);
    assert_ok(&o);
    assert!(out.join("t/a").exists());
    assert!(!out.join(RESERVED[0]).exists());
    // --delete leaves every reserved name in DST.
    for n in RESERVED {
        std::fs::write(root.join("t/sub").join(n), b"ours").unwrap();
    }
    let src_slash = format!("{}/", src.display());
    let o = ramsys(&key, &["sync", "-r", "--delete", &src_slash, &d.url("t")]);
    assert_ok(&o);
    for n in RESERVED {
        assert_eq!(
            std::fs::read(root.join("t/sub").join(n)).unwrap(),
            b"ours",
            "{n}"
        );
    }
}

/// Issue 34: the daemon's resume journal is 0600 (main 0449507: 0644, and
/// it names the user's files), and one that is corrupt is moved aside
/// with one log line instead of failing every later resume.
#[test]
fn journal_is_private_and_a_corrupt_one_is_moved_aside() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let log = t.path().join("log");
    let d = serve(&root, &key, &log, &[]);
    let url = format!("ramsys://{}/big", d.addr);
    let big = t.path().join("big");
    std::fs::write(&big, vec![7u8; 8 << 20]).unwrap();
    // Interrupt a resumable push: the journal stays behind.
    let mut c = Command::new(bin());
    c.args([
        "cp",
        "--resume",
        "--bwlimit",
        "1M",
        big.to_str().unwrap(),
        &url,
    ])
    .env("RAMSYS_KEY_FILE", &key)
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let _ = child.kill();
    let _ = child.wait();
    // The daemon's session ends when it sees the agent gone; then the
    // journal is closed (its -wal file goes with the last connection).
    let j = root.join(".ramsys-journal.sqlite");
    let wal = root.join(".ramsys-journal.sqlite-wal");
    let t0 = Instant::now();
    let closed = || j.exists() && !wal.exists();
    while !closed() && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let mode = std::fs::metadata(&j).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "journal mode {mode:o}");
    // Corrupt it: the next resume moves it aside, says so once, and works.
    std::fs::write(&j, vec![0x5au8; 4096]).unwrap();
    for s in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(root.join(format!(".ramsys-journal.sqlite{s}")));
    }
    let o = ramsys(&key, &["cp", "--resume", big.to_str().unwrap(), &url]);
    assert_ok(&o);
    assert_eq!(std::fs::read(root.join("big")).unwrap().len(), 8 << 20);
    let aside = root.join(".ramsys-journal.sqlite.corrupt");
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        std::fs::read(&aside).ok(),
        Some(vec![0x5au8; 4096]),
        "{text}"
    );
    let said: Vec<&str> = text.lines().filter(|l| l.contains("moved aside")).collect();
    assert_eq!(said.len(), 1, "{text}");
}

// ---------------------------------------------------------------------
// Control characters (docs/SECURITY.md "Control characters").

/// A name that would forge a row of `ramsys status`, a line of the log or
/// of the agent's output, and drive the terminal.
const FORGE: &str = "x\nSESSION 1 sink root 6.6.6.6:1 0s forged\r\x1b[2J\x1b]0;pwned\x07";

/// No line of `out` starts with something `ok` rejects, and nothing in it
/// drives a terminal.
fn clean(what: &str, out: &str, ok: impl Fn(&str) -> bool) {
    for bad in ['\x1b', '\r', '\x07'] {
        assert!(!out.contains(bad), "{what}: {bad:?} in {out:?}");
    }
    for l in out.lines() {
        assert!(ok(l), "{what}: forged line {l:?} in:\n{out}");
    }
}

/// Issue 34, control characters: a destination, a file name and a missing
/// path holding a newline, a carriage return and escape sequences appear
/// escaped in `ramsys status`, the agent's dry-run lines, its error line
/// and the daemon's log: no forged row, no escape sequence (main 0449507
/// printed them raw).
#[test]
fn names_with_control_characters_are_escaped_everywhere() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let log = t.path().join("log");
    let d = serve(&root, &key, &log, &[]);
    let url = |p: &str| format!("ramsys://{}/{p}", d.addr);
    // `status` while a session to a forged DST runs.
    let big = t.path().join("big");
    std::fs::write(&big, vec![1u8; 4 << 20]).unwrap();
    let mut c = Command::new(bin());
    c.args(["cp", "--bwlimit", "1M", big.to_str().unwrap(), &url(FORGE)])
        .env("RAMSYS_KEY_FILE", &key)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut slow = c.spawn().unwrap();
    let addr = d.addr.to_string();
    let t0 = Instant::now();
    let status = loop {
        let o = ramsys(&key, &["status", &addr]);
        assert_ok(&o);
        let s = String::from_utf8_lossy(&o.stdout).into_owned();
        if s.contains("forged") || t0.elapsed() > Duration::from_secs(10) {
            break s;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = slow.kill();
    let _ = slow.wait();
    assert!(status.contains("x\\nSESSION 1 sink"), "{status}");
    clean("status", &status, |l| {
        !l.starts_with("SESSION 1 sink root 6.6.6.6")
    });
    // Dry-run lines name files: one line each.
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join(FORGE), b"x").unwrap();
    let src_slash = format!("{}/", src.display());
    let o = ramsys(&key, &["sync", "-r", "--dry-run", &src_slash, &url("dry")]);
    assert_ok(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    clean("dry run", &out, |l| {
        l.starts_with("would ") || l.starts_with("dry run:")
    });
    assert!(out.contains("would send x\\nSESSION"), "{out}");
    // A refused request: the agent's error line and the daemon's log line
    // name the path, one line each however it is named.
    let o = ramsys(
        &key,
        &[
            "cp",
            big.to_str().unwrap(),
            &url(&format!("{FORGE}/.ramsys-journal.sqlite")),
        ],
    );
    assert!(!o.status.success());
    let err = stderr(&o);
    clean("error", &err, |l| l.starts_with("ramsys: "));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("x\\nSESSION 1 sink"), "{err}");
    drop(d);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("SESSION 1 sink"),
        "the log names the path:\n{text}"
    );
    clean("daemon log", &text, |l| {
        l.starts_with("20") && l.as_bytes().get(4) == Some(&b'-')
    });
}

// ---------------------------------------------------------------------
// Symlinked destinations as root (docs/SECURITY.md).

/// Issue 34, rsync 3.5's hardening: running as root, a DST that is (or
/// goes through) a symlink owned by nobody pointing at root's directory is
/// refused in one line, for a local copy, a pull and the ssh-serve sink;
/// nothing lands in the directory the link points to. The same link owned
/// by root, or a user's link to its own directory, is followed (main
/// 0449507 followed them all).
#[test]
fn a_strangers_symlink_as_root_destination_is_refused() {
    if !is_root() {
        eprintln!("skipped: needs root (chowns a symlink to nobody)");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let victim = t.path().join("victim");
    std::fs::create_dir_all(victim.join("sub")).unwrap();
    let link = t.path().join("link");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
    let f = t.path().join("f");
    std::fs::write(&f, b"data").unwrap();
    let refused = |o: &std::process::Output, what: &str| {
        assert!(!o.status.success(), "{what}: copied");
        let e = stderr(o);
        assert!(
            e.contains("refusing to follow") && e.contains("uid 65534"),
            "{what}: {e}"
        );
        assert_eq!(e.lines().count(), 1, "{what}: {e}");
    };
    let (lk, fs) = (link.to_str().unwrap(), f.to_str().unwrap());
    // Local copy: the link as DST, and as a parent of DST.
    refused(
        &ramsys(&key, &["cp", fs, &format!("{lk}/")]),
        "cp into the link",
    );
    refused(
        &ramsys(&key, &["cp", fs, &format!("{lk}/sub/g")]),
        "cp below it",
    );
    let src_slash = format!("{}/", t.path().join("victim").display());
    let o = ramsys(&key, &["sync", "-r", &src_slash, &format!("{lk}/sub")]);
    refused(&o, "sync below it");
    // A pull to it.
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("p"), b"pulled").unwrap();
    let d = TestDaemon::start(&root, &key);
    refused(&ramsys(&key, &["cp", &d.url("p"), lk]), "pull into it");
    // The ssh-serve sink (what `cp f host:LINK` runs on the remote host).
    let mut c = Command::new(bin());
    c.args(["ssh-serve", "--role", "sink", "--own-daemon", lk])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{}\n", "ab".repeat(32)).as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    refused(&o, "ssh-serve sink");
    assert_eq!(walk_paths(&victim).len(), 1, "only victim/sub is there");
    // Root's own link, and nobody's link to nobody's directory: followed.
    std::os::unix::fs::lchown(&link, Some(0), Some(0)).unwrap();
    assert_ok(&ramsys(&key, &["cp", fs, &format!("{lk}/")]));
    assert_eq!(std::fs::read(victim.join("f")).unwrap(), b"data");
    let theirs = t.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let own = t.path().join("own");
    std::os::unix::fs::symlink(&theirs, &own).unwrap();
    std::os::unix::fs::lchown(&own, Some(65534), Some(65534)).unwrap();
    assert_ok(&ramsys(&key, &["cp", fs, &format!("{}/", own.display())]));
    assert!(theirs.join("f").exists());
}
