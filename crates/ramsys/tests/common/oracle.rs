//! rsync as the oracle (issue 35): an rsync daemon of our own on loopback,
//! and a tree snapshot that sees everything a sync promises to keep
//! (type, content, mode, mtime, symlink target, hard-link groups, owners,
//! device numbers, xattrs and ACLs, holes where asked), with each entry's
//! inode and ctime so a second run can be shown to change nothing.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether `cmd` is on PATH.
pub fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

pub fn is_root() -> bool {
    // SAFETY: no failure mode.
    unsafe { libc::geteuid() == 0 }
}

/// An `rsync --daemon` serving `root` as module `m` on 127.0.0.1, as
/// root (chroot, so symlinks are not munged; uid and gid 0 so it can
/// write and keep owners); killed on drop.
pub struct RsyncDaemon {
    child: Child,
    pub port: u16,
    _conf: tempfile::TempDir,
}

impl RsyncDaemon {
    pub fn start(root: &Path) -> RsyncDaemon {
        let conf = tempfile::tempdir().unwrap();
        let cfg = conf.path().join("rsyncd.conf");
        std::fs::write(
            &cfg,
            format!(
                "use chroot = yes\nuid = 0\ngid = 0\n\n[m]\npath = {}\nread only = no\n",
                root.display()
            ),
        )
        .unwrap();
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let mut child = Command::new("rsync")
                .arg("--daemon")
                .arg("--no-detach")
                .arg("--address=127.0.0.1")
                .arg(format!("--port={port}"))
                .arg(format!("--config={}", cfg.display()))
                .arg(format!("--log-file={}", conf.path().join("log").display()))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start rsync --daemon");
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(10) {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return RsyncDaemon {
                        child,
                        port,
                        _conf: conf,
                    };
                }
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("rsync --daemon did not start");
    }

    /// `rsync://127.0.0.1:PORT/m/PATH`.
    pub fn url(&self, path: &str) -> String {
        format!("rsync://127.0.0.1:{}/m/{path}", self.port)
    }
}

impl Drop for RsyncDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What to look at besides what every snapshot has.
#[derive(Clone, Copy, Default)]
pub struct Look {
    /// Regular files of 1 MiB and more: whether they have holes.
    pub holes: bool,
}

/// One entry as the comparison sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// d, f, l, c, b, p, s.
    pub kind: char,
    /// Permission bits (none for a symlink).
    pub mode: u32,
    pub mtime: (i64, i64),
    pub uid: u32,
    pub gid: u32,
    /// Content hash of a file, target of a symlink, rdev of a device.
    pub data: String,
    /// The first path (sorted) of a multiply linked file's inode.
    pub link_group: Option<String>,
    /// Every xattr (ACLs are system.posix_acl_* xattrs), name -> value.
    pub xattrs: BTreeMap<String, Vec<u8>>,
    /// `Look::holes`: fewer blocks than the size needs.
    pub holes: Option<bool>,
}

/// Inode and ctime: what a run that changes nothing leaves as it was.
pub type Ident = (u64, i64, i64);

/// A tree: relative path -> entry, and relative path -> identity.
pub struct Tree {
    pub entries: BTreeMap<String, Entry>,
    pub idents: BTreeMap<String, Ident>,
}

fn fnv(data: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    format!("{h:016x}:{}", data.len())
}

fn walk(root: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(root) else {
        return;
    };
    for e in rd {
        let e = e.unwrap();
        let p = e.path();
        let dir = e.file_type().unwrap().is_dir();
        out.push(p.clone());
        if dir {
            walk(&p, out);
        }
    }
}

fn kind_of(ft: &std::fs::FileType) -> char {
    if ft.is_dir() {
        'd'
    } else if ft.is_symlink() {
        'l'
    } else if ft.is_char_device() {
        'c'
    } else if ft.is_block_device() {
        'b'
    } else if ft.is_fifo() {
        'p'
    } else if ft.is_socket() {
        's'
    } else {
        'f'
    }
}

/// The tree under `root` (its own attributes included, as path ".").
pub fn tree_of(root: &Path, look: Look) -> Tree {
    let mut paths = vec![root.to_path_buf()];
    walk(root, &mut paths);
    paths.sort();
    let mut groups: BTreeMap<(u64, u64), String> = BTreeMap::new();
    let mut entries = BTreeMap::new();
    let mut idents = BTreeMap::new();
    for p in paths {
        let Ok(md) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        let rel = match p.strip_prefix(root).unwrap().to_string_lossy() {
            r if r.is_empty() => ".".to_string(),
            r => r.into_owned(),
        };
        let ft = md.file_type();
        let kind = kind_of(&ft);
        let data = match kind {
            'f' => fnv(&std::fs::read(&p).unwrap()),
            'l' => std::fs::read_link(&p).unwrap().display().to_string(),
            'c' | 'b' => format!("rdev {:x}", md.rdev()),
            _ => String::new(),
        };
        let link_group = (kind == 'f' && md.nlink() > 1).then(|| {
            groups
                .entry((md.dev(), md.ino()))
                .or_insert_with(|| rel.clone())
                .clone()
        });
        let xattrs = xattr::list(&p)
            .map(|names| {
                names
                    .filter_map(|n| {
                        let v = xattr::get(&p, &n).ok().flatten()?;
                        Some((n.to_string_lossy().into_owned(), v))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let holes = (look.holes && kind == 'f' && md.len() >= 1 << 20)
            .then(|| md.blocks() * 512 < md.len());
        idents.insert(rel.clone(), (md.ino(), md.ctime(), md.ctime_nsec()));
        entries.insert(
            rel,
            Entry {
                kind,
                mode: if kind == 'l' { 0 } else { md.mode() & 0o7777 },
                mtime: (md.mtime(), md.mtime_nsec()),
                uid: md.uid(),
                gid: md.gid(),
                data,
                link_group,
                xattrs,
                holes,
            },
        );
    }
    Tree { entries, idents }
}

/// How two trees differ, one line per difference (empty: the same).
/// `loose`: paths whose mtime is not compared (directories both tools
/// change as a side effect, at different moments: DST's parent, a DST
/// that no source directory stands for).
pub fn differences(ours: &Tree, theirs: &Tree, loose: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for (p, a) in &ours.entries {
        let Some(b) = theirs.entries.get(p) else {
            out.push(format!("{p}: only ramsys has it ({})", a.kind));
            continue;
        };
        let mut a = a.clone();
        if loose.contains(&p.as_str()) {
            a.mtime = b.mtime;
        }
        if a != *b {
            out.push(format!("{p}: ramsys {a:?}\n      rsync  {b:?}"));
        }
    }
    for (p, b) in &theirs.entries {
        if !ours.entries.contains_key(p) {
            out.push(format!("{p}: only rsync has it ({})", b.kind));
        }
    }
    out
}

/// Entries whose inode or ctime a run changed.
pub fn touched(before: &Tree, after: &Tree) -> Vec<String> {
    after
        .idents
        .iter()
        .filter(|(p, id)| before.idents.get(*p) != Some(id))
        .map(|(p, _)| p.clone())
        .collect()
}
