//! Depth-first scan of the source (seed 000 Fig. 6-4b, step 1).
//!
//! Every entry gets a file id. Directory records are numbered and sent
//! first, then files, symlinks and hard links, so the sink can build the
//! whole tree before any payload arrives. Symlinks are never followed;
//! a second name of an inode already seen becomes a hard-link record.

use std::collections::HashMap;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use ramsys_proto::control::{Entry, EntryKind};

use crate::stats::FailedPath;

/// A regular file to read.
#[derive(Debug, Clone)]
pub struct SourceFile {
    pub id: u64,
    /// Path relative to the source root (for opening).
    pub rel: Vec<u8>,
    pub size: u64,
    pub dev: u64,
    pub ino: u64,
    pub mtime: (i64, u32),
}

/// Result of the scan.
#[derive(Debug, Default)]
pub struct Walk {
    /// Records in send order (ids ascending: directories first).
    pub entries: Vec<Entry>,
    /// Regular files, in id order.
    pub files: Vec<SourceFile>,
    pub failures: Vec<FailedPath>,
    pub total_bytes: u64,
}

/// A top-level source: path relative to the root, and the name its tree
/// gets on the wire.
#[derive(Debug, Clone)]
pub struct Top {
    pub rel: Vec<u8>,
    pub name: Vec<u8>,
}

struct Pending {
    wire: Vec<u8>,
    rel: Vec<u8>,
    kind: PendingKind,
    mode: u32,
    mtime: (i64, u32),
}

enum PendingKind {
    Dir,
    File { size: u64, dev: u64, ino: u64 },
    Symlink(Vec<u8>),
    HardLink { first: usize },
}

fn join(a: &[u8], b: &[u8]) -> Vec<u8> {
    if a.is_empty() {
        return b.to_vec();
    }
    let mut v = Vec::with_capacity(a.len() + 1 + b.len());
    v.extend_from_slice(a);
    v.push(b'/');
    v.extend_from_slice(b);
    v
}

/// Scan `tops` under `base` (the root directory on disk).
pub fn walk(base: &Path, tops: &[Top], recursive: bool) -> Walk {
    let mut dirs: Vec<Pending> = Vec::new();
    let mut others: Vec<Pending> = Vec::new();
    let mut failures = Vec::new();
    let mut inodes: HashMap<(u64, u64), usize> = HashMap::new();
    for t in tops {
        let path = abs(base, &t.rel);
        match fs::symlink_metadata(&path) {
            Ok(md) => {
                if md.is_dir() && !recursive {
                    failures.push(FailedPath {
                        path: path.display().to_string(),
                        reason: "is a directory (use -r to copy directories)".into(),
                    });
                    continue;
                }
                visit(
                    base,
                    &t.rel,
                    &t.name,
                    md,
                    &mut dirs,
                    &mut others,
                    &mut failures,
                    &mut inodes,
                );
            }
            Err(e) => failures.push(FailedPath {
                path: path.display().to_string(),
                reason: e.to_string(),
            }),
        }
    }
    // Number directories first, then everything else, each in DFS order.
    let mut w = Walk {
        failures,
        ..Default::default()
    };
    let ndirs = dirs.len() as u64;
    let mut first_id: HashMap<usize, u64> = HashMap::new();
    for (i, d) in dirs.into_iter().enumerate() {
        w.entries.push(Entry {
            id: i as u64,
            path: d.wire,
            kind: EntryKind::Dir,
            mode: d.mode,
            mtime_s: d.mtime.0,
            mtime_ns: d.mtime.1,
        });
    }
    for (j, o) in others.into_iter().enumerate() {
        let id = ndirs + j as u64;
        let kind = match o.kind {
            PendingKind::Dir => unreachable!("directories are numbered first"),
            PendingKind::File { size, dev, ino } => {
                first_id.insert(j, id);
                w.total_bytes += size;
                w.files.push(SourceFile {
                    id,
                    rel: o.rel,
                    size,
                    dev,
                    ino,
                    mtime: o.mtime,
                });
                EntryKind::File { size }
            }
            PendingKind::Symlink(t) => EntryKind::Symlink { target: t },
            PendingKind::HardLink { first } => EntryKind::HardLink {
                target_id: first_id[&first],
            },
        };
        w.entries.push(Entry {
            id,
            path: o.wire,
            kind,
            mode: o.mode,
            mtime_s: o.mtime.0,
            mtime_ns: o.mtime.1,
        });
    }
    w
}

fn abs(base: &Path, rel: &[u8]) -> PathBuf {
    if rel.is_empty() {
        base.to_path_buf()
    } else {
        base.join(std::ffi::OsStr::from_bytes(rel))
    }
}

#[allow(clippy::too_many_arguments)]
fn visit(
    base: &Path,
    rel: &[u8],
    wire: &[u8],
    md: fs::Metadata,
    dirs: &mut Vec<Pending>,
    others: &mut Vec<Pending>,
    failures: &mut Vec<FailedPath>,
    inodes: &mut HashMap<(u64, u64), usize>,
) {
    let mode = md.mode() & 0o7777;
    let mtime = (md.mtime(), md.mtime_nsec() as u32);
    let ft = md.file_type();
    if ft.is_dir() {
        dirs.push(Pending {
            wire: wire.to_vec(),
            rel: rel.to_vec(),
            kind: PendingKind::Dir,
            mode,
            mtime,
        });
        let path = abs(base, rel);
        let rd = match fs::read_dir(&path) {
            Ok(rd) => rd,
            Err(e) => {
                failures.push(FailedPath {
                    path: path.display().to_string(),
                    reason: format!("cannot read directory: {e}"),
                });
                return;
            }
        };
        for de in rd {
            let de = match de {
                Ok(d) => d,
                Err(e) => {
                    failures.push(FailedPath {
                        path: path.display().to_string(),
                        reason: format!("cannot read directory: {e}"),
                    });
                    break;
                }
            };
            let name = de.file_name();
            let name = name.as_bytes();
            let crel = join(rel, name);
            let cwire = join(wire, name);
            match de.metadata() {
                Ok(cmd) => visit(base, &crel, &cwire, cmd, dirs, others, failures, inodes),
                Err(e) => failures.push(FailedPath {
                    path: abs(base, &crel).display().to_string(),
                    reason: e.to_string(),
                }),
            }
        }
    } else if ft.is_file() {
        if md.nlink() > 1 {
            if let Some(&first) = inodes.get(&(md.dev(), md.ino())) {
                others.push(Pending {
                    wire: wire.to_vec(),
                    rel: rel.to_vec(),
                    kind: PendingKind::HardLink { first },
                    mode,
                    mtime,
                });
                return;
            }
            inodes.insert((md.dev(), md.ino()), others.len());
        }
        others.push(Pending {
            wire: wire.to_vec(),
            rel: rel.to_vec(),
            kind: PendingKind::File {
                size: md.len(),
                dev: md.dev(),
                ino: md.ino(),
            },
            mode,
            mtime,
        });
    } else if ft.is_symlink() {
        match fs::read_link(abs(base, rel)) {
            Ok(t) => others.push(Pending {
                wire: wire.to_vec(),
                rel: rel.to_vec(),
                kind: PendingKind::Symlink(t.as_os_str().as_bytes().to_vec()),
                mode: 0o777,
                mtime,
            }),
            Err(e) => failures.push(FailedPath {
                path: abs(base, rel).display().to_string(),
                reason: format!("cannot read symlink: {e}"),
            }),
        }
    } else {
        failures.push(FailedPath {
            path: abs(base, rel).display().to_string(),
            reason: "special file (device, fifo or socket) skipped".into(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirs_first_ids_ascending_hardlinks_and_symlinks() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path().join("t");
        fs::create_dir_all(r.join("a/b")).unwrap();
        fs::write(r.join("a/f"), b"xyz").unwrap();
        fs::hard_link(r.join("a/f"), r.join("a/b/g")).unwrap();
        std::os::unix::fs::symlink("f", r.join("a/s")).unwrap();
        let w = walk(
            d.path(),
            &[Top {
                rel: b"t".to_vec(),
                name: b"t".to_vec(),
            }],
            true,
        );
        assert!(w.failures.is_empty());
        let ids: Vec<u64> = w.entries.iter().map(|e| e.id).collect();
        assert_eq!(ids, (0..w.entries.len() as u64).collect::<Vec<_>>());
        let first_nondir = w
            .entries
            .iter()
            .position(|e| e.kind != EntryKind::Dir)
            .unwrap();
        assert!(w.entries[first_nondir..]
            .iter()
            .all(|e| e.kind != EntryKind::Dir));
        assert_eq!(first_nondir, 3);
        assert_eq!(w.files.len(), 1);
        assert_eq!(w.total_bytes, 3);
        let hl = w
            .entries
            .iter()
            .find(|e| matches!(e.kind, EntryKind::HardLink { .. }))
            .unwrap();
        assert_eq!(
            hl.kind,
            EntryKind::HardLink {
                target_id: w.files[0].id
            }
        );
        assert!(w.entries.iter().any(|e| e.kind
            == EntryKind::Symlink {
                target: b"f".to_vec()
            }));
    }

    #[test]
    fn missing_and_nonrecursive_reported() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir(d.path().join("dir")).unwrap();
        let w = walk(
            d.path(),
            &[
                Top {
                    rel: b"nope".to_vec(),
                    name: b"nope".to_vec(),
                },
                Top {
                    rel: b"dir".to_vec(),
                    name: b"dir".to_vec(),
                },
            ],
            false,
        );
        assert_eq!(w.failures.len(), 2);
        assert!(w.entries.is_empty());
    }
}
