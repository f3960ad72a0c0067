//! Helpers for integration tests: real daemons on loopback, generated
//! trees, and a tree comparator that checks bytes and metadata.
#![allow(dead_code)]

pub mod loopdev;
pub mod oracle;
pub mod sshd;
pub mod stripe;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The ramsys binary under test: this build's, or `RAMSYS_TEST_BIN`
/// (e.g. to show that a conformance scenario fails on another build).
pub fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("RAMSYS_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_ramsys").into())
    })
}

/// A daemon process on an ephemeral loopback port, killed on drop.
pub struct TestDaemon {
    pub child: Child,
    pub addr: String,
    pub root: PathBuf,
}

impl TestDaemon {
    pub fn start(root: &Path, key: &Path) -> TestDaemon {
        Self::start_with(root, key, &[])
    }

    pub fn start_with(root: &Path, key: &Path, extra: &[&str]) -> TestDaemon {
        let mut c = Command::new(bin());
        c.args(["serve", "--listen", "127.0.0.1:0", "--root"])
            .arg(root)
            .arg("--key-file")
            .arg(key)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        Self::spawn(c, root)
    }

    /// Run the daemon command `c` (stdout piped) serving `root`, once it
    /// says where it listens.
    pub fn spawn(mut c: Command, root: &Path) -> TestDaemon {
        let mut child = c.spawn().expect("start daemon");
        let addr = listening_addr(&mut child);
        TestDaemon {
            child,
            addr,
            root: root.to_path_buf(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("ramsys://{}/{}", self.addr, path)
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A daemon's address, from the first line of its stdout ("listening on
/// ADDR"); the rest of stdout is not read.
pub fn listening_addr(child: &mut Child) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("daemon prints its address");
    line.trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string()
}

/// Run `ramsys ARGS` with a key file, with a time limit.
pub fn ramsys(key: &Path, args: &[&str]) -> Output {
    let mut c = Command::new(bin());
    c.args(args).env("RAMSYS_KEY_FILE", key);
    run_with_timeout(c, Duration::from_secs(120))
}

pub fn run_with_timeout(mut c: Command, t: Duration) -> Output {
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ramsys");
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > t {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "ramsys timed out after {t:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn assert_ok(o: &Output) {
    assert!(
        o.status.success(),
        "ramsys failed ({:?}): stdout {} stderr {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        stderr(o)
    );
}

/// The summary of a `--json` run: its last `"summary"` line.
pub fn summary(o: &Output) -> serde_json::Value {
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out
        .lines()
        .rev()
        .find(|l| l.contains("\"summary\""))
        .unwrap_or_else(|| panic!("no summary in {out:?}; stderr {}", stderr(o)));
    serde_json::from_str(line).unwrap()
}

/// Small deterministic PRNG (xorshift) so trees are reproducible.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// Set mtime of a path (not following symlinks).
pub fn set_mtime(p: &Path, secs: i64, nsec: i64) {
    use rustix::fs::{AtFlags, Timespec, Timestamps, CWD, UTIME_OMIT};
    let times = Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        },
        last_modification: Timespec {
            tv_sec: secs,
            tv_nsec: nsec as _,
        },
    };
    // As before, a failure here is the assertion that follows it.
    let _ = rustix::fs::utimensat(CWD, p, &times, AtFlags::SYMLINK_NOFOLLOW);
}

/// A tree with every awkward case of the core issue.
pub fn make_varied_tree(root: &Path, block: usize) {
    let mut r = Rng(0x5eed);
    std::fs::create_dir_all(root.join("empty dir")).unwrap();
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("empty file"), b"").unwrap();
    for (i, n) in [
        1usize,
        block - 1,
        block,
        block + 1,
        3 * block + 17,
        10 * block,
    ]
    .iter()
    .enumerate()
    {
        std::fs::write(root.join(format!("sub/size_{i}_{n}")), r.bytes(*n)).unwrap();
    }
    std::fs::write(root.join("ünïcødé ñame ✓.txt"), b"unicode\n").unwrap();
    std::fs::write(root.join("sub/with space and 'quote'"), b"q").unwrap();
    let mut deep = root.join("deep");
    for i in 0..20 {
        deep = deep.join(format!("d{i}"));
    }
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.join("bottom"), b"depth 20").unwrap();
    std::os::unix::fs::symlink("sub/size_0_1", root.join("link to file")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/absolute", root.join("dangling")).unwrap();
    std::os::unix::fs::symlink("deep", root.join("dirlink")).unwrap();
    std::fs::write(root.join("sub/hard_a"), r.bytes(5000)).unwrap();
    std::fs::hard_link(root.join("sub/hard_a"), root.join("hard_b")).unwrap();
    std::fs::hard_link(root.join("sub/hard_a"), root.join("deep/hard_c")).unwrap();
    for (name, mode) in [
        ("m600", 0o600),
        ("m755", 0o755),
        ("m444", 0o444),
        ("m4750", 0o750),
    ] {
        let p = root.join(name);
        std::fs::write(&p, name.as_bytes()).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::fs::set_permissions(
        root.join("empty dir"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    // Distinct mtimes, set last (children first so dirs keep theirs).
    let mut all: Vec<PathBuf> = walk_paths(root);
    all.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for (i, p) in all.iter().enumerate() {
        set_mtime(
            p,
            1_600_000_000 + i as i64 * 101,
            (i as i64 * 7919) % 1_000_000_000,
        );
    }
}

pub fn walk_paths(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}

/// What a tree looks like: per relative path, type, mode, mtime, content
/// hash or link target, and a hard-link group id.
#[derive(Debug, PartialEq)]
pub struct Node {
    kind: &'static str,
    mode: u32,
    mtime: (i64, i64),
    content: Vec<u8>,
    link_group: Option<usize>,
}

pub fn snapshot(root: &Path) -> BTreeMap<String, Node> {
    let mut inode_groups: BTreeMap<(u64, u64), usize> = BTreeMap::new();
    let mut m = BTreeMap::new();
    let mut paths = walk_paths(root);
    paths.sort();
    for p in paths {
        let md = std::fs::symlink_metadata(&p).unwrap();
        let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        let ft = md.file_type();
        let (kind, content) = if ft.is_dir() {
            ("dir", Vec::new())
        } else if ft.is_symlink() {
            (
                "symlink",
                std::fs::read_link(&p)
                    .unwrap()
                    .as_os_str()
                    .as_encoded_bytes()
                    .to_vec(),
            )
        } else {
            ("file", std::fs::read(&p).unwrap())
        };
        let link_group = if ft.is_file() && md.nlink() > 1 {
            let n = inode_groups.len();
            Some(*inode_groups.entry((md.dev(), md.ino())).or_insert(n))
        } else {
            None
        };
        m.insert(
            rel,
            Node {
                kind,
                mode: if ft.is_symlink() {
                    0
                } else {
                    md.mode() & 0o7777
                },
                mtime: if ft.is_symlink() {
                    (0, 0)
                } else {
                    (md.mtime(), md.mtime_nsec())
                },
                content,
                link_group,
            },
        );
    }
    m
}

/// Assert two trees are identical in bytes and metadata.
pub fn assert_same_tree(a: &Path, b: &Path) {
    let sa = snapshot(a);
    let sb = snapshot(b);
    let ka: Vec<_> = sa.keys().collect();
    let kb: Vec<_> = sb.keys().collect();
    assert_eq!(ka, kb, "different entries");
    for (k, va) in &sa {
        let vb = &sb[k];
        assert_eq!(va.kind, vb.kind, "{k}: kind");
        assert!(va.content == vb.content, "{k}: content differs");
        assert_eq!(va.mode, vb.mode, "{k}: mode");
        assert_eq!(va.mtime, vb.mtime, "{k}: mtime");
        assert_eq!(va.link_group, vb.link_group, "{k}: hard link group");
    }
}

/// Names in a directory tree that look like our temp files.
pub fn temp_files(root: &Path) -> Vec<PathBuf> {
    walk_paths(root)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(".ramsys-"))
        .collect()
}

pub fn key_file(dir: &Path) -> PathBuf {
    let p = dir.join("key");
    std::fs::write(&p, "0123456789abcdef0123456789abcdef\n").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// The usual set-up of a daemon test: a temp dir holding a key, a varied
/// source tree `src` (made with `block`) and a daemon serving `root`.
pub struct TreeAndDaemon {
    pub t: tempfile::TempDir,
    pub key: PathBuf,
    pub src: PathBuf,
    pub root: PathBuf,
    pub d: TestDaemon,
}

pub fn tree_and_daemon(block: usize) -> TreeAndDaemon {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let src = t.path().join("src");
    make_varied_tree(&src, block);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = TestDaemon::start(&root, &key);
    TreeAndDaemon {
        t,
        key,
        src,
        root,
        d,
    }
}

/// A fake proc/ whose CPU counters a thread advances: `busy` of every 100
/// jiffies are busy. Written with rename so the sampler never reads half.
pub fn fake_proc(root: &Path, busy: u64, idle: u64) {
    std::fs::create_dir_all(root.join("proc/net")).unwrap();
    std::fs::create_dir_all(root.join("sys/block")).unwrap();
    let tmp = root.join("proc/.stat");
    std::fs::write(
        &tmp,
        format!("cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\nintr 100 0\nsoftirq 10 0\nprocs_running 7\n"),
    )
    .unwrap();
    std::fs::rename(&tmp, root.join("proc/stat")).unwrap();
}

/// Busy fraction `pct` on a fake proc/, advanced by a thread until `stop`.
pub fn burn(
    root: &Path,
    pct: u64,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let root = root.to_path_buf();
    fake_proc(&root, 0, 0);
    std::thread::spawn(move || {
        let (mut busy, mut idle) = (0u64, 0u64);
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            busy += pct;
            idle += 100 - pct;
            fake_proc(&root, busy, idle);
            std::thread::sleep(Duration::from_millis(5));
        }
    })
}

/// A small tmpfs mounted for the test (needs root; skipped otherwise).
pub struct SmallFs {
    pub dir: tempfile::TempDir,
}
impl SmallFs {
    pub fn mount(size: &str, opts: &str) -> Option<SmallFs> {
        let dir = tempfile::tempdir().ok()?;
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}{opts}"), "tmpfs"])
            .arg(dir.path())
            .stderr(Stdio::null())
            .status()
            .ok()?;
        if !st.success() {
            eprintln!("skipping: cannot mount tmpfs (not root?)");
            return None;
        }
        Some(SmallFs { dir })
    }
}
impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Network namespaces a test made, deleted on drop.
pub struct Netns(pub Vec<String>);

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", n])
                .status();
        }
    }
}

pub fn ip(args: &[&str]) -> bool {
    std::process::Command::new("ip")
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A daemon started through `ip netns exec`, killed on drop.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
