//! Striped transfers' shares (issue 19, docs/SITE.md "Striping"; GridFTP's
//! striped servers): list the sources' entries once and deal the regular
//! files out to N daemons, largest first onto the share that would finish
//! first with it (LPT scheduling: within 4/3 of the best split), each
//! share's bytes divided by its daemon's weight. Hard links of one inode
//! stay in one share (so they stay links); directories, symlinks and
//! special files go to share 0.
//!
//! Used by the agent for a striped push (it lists its own disk) and by a
//! relaying daemon for a striped third-party transfer (server::relay),
//! where every pair's source daemon lists the same shared tree and deals
//! it the same way: the deal depends only on the paths, sizes, link
//! groups and weights, never on directory order, and [`digest`] lets the
//! agent check that every pair listed the same tree.
//!
//! A file of a large part of the transfer is cut into pieces (issue 19,
//! docs/SITE.md "A big file's blocks"): [`piece_size`] decides, from the
//! file's size, the listing's total and the block size only (never the
//! number of daemons, so a `--resume` over fewer daemons cuts the same
//! pieces and finds the ones already done), and the pieces are dealt like
//! files.

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::request::walk::Top;

/// A regular file: its path from the transfer root (the walk's wire
/// name) and size.
#[derive(Debug, Clone)]
pub struct Item {
    pub wire: Vec<u8>,
    pub size: u64,
    /// Hard links of one inode share this key (0: none).
    pub inode: (u64, u64),
    /// Modification time as listed: a piece's session checks the file is
    /// still this one (every piece must come from the same version).
    pub mtime: (i64, u32),
}

/// Pieces one file is cut into at most (a few more than daemons are
/// likely, so the deal evens out: 32 pieces over 3 daemons end within 3 %
/// of an even split).
pub const PIECES_PER_FILE: u64 = 32;

/// What pieces are multiples of: 1 MiB, a whole number of blocks of any
/// block size up to 1 MiB and a whole number of pages and direct-I/O
/// sectors. Fixed rather than the session's block size, which the agent
/// lowers under `--bwlimit`: a `--resume` must cut the same pieces to find
/// the ones done.
pub const PIECE_ALIGN: u64 = 1 << 20;

/// A big file's piece length, or None to send it whole: cut when it is at
/// least 16 x `align` (16 MiB: four default blocks) and at least 1/16 of
/// the transfer (a tree of many large files stripes well whole, and each
/// piece costs a marker file and a second writer in the file); pieces are
/// multiples of `align`, about 1/32 of the file. `align` 0: never cut.
pub fn piece_size(size: u64, total: u64, align: u64) -> Option<u64> {
    if align == 0 || size < 16 * align || size.saturating_mul(16) < total {
        return None;
    }
    Some(size.div_ceil(PIECES_PER_FILE).div_ceil(align) * align)
}

pub use super::pieces::{PieceSet, Pieces};

/// Every entry below the tops (`root` joined with each top's `rel`), as
/// the walk names them: regular files with their sizes, everything else
/// (directories, links, specials) in the second list. Symlinks are not
/// followed.
pub fn list(root: &Path, tops: &[Top]) -> std::io::Result<(Vec<Item>, Vec<Vec<u8>>)> {
    let (mut files, mut others) = (Vec::new(), Vec::new());
    for t in tops {
        let path = root.join(std::ffi::OsStr::from_bytes(&t.rel));
        scan(&path, t.name.clone(), &mut files, &mut others)?;
    }
    Ok((files, others))
}

fn scan(
    path: &Path,
    wire: Vec<u8>,
    files: &mut Vec<Item>,
    others: &mut Vec<Vec<u8>>,
) -> std::io::Result<()> {
    let at = |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    let md = std::fs::symlink_metadata(path).map_err(at)?;
    if md.is_file() {
        let inode = if md.nlink() > 1 {
            (md.dev(), md.ino())
        } else {
            (0, 0)
        };
        files.push(Item {
            wire,
            size: md.len(),
            inode,
            mtime: (md.mtime(), md.mtime_nsec() as u32),
        });
        return Ok(());
    }
    if !wire.is_empty() {
        others.push(wire.clone());
    }
    if md.is_dir() {
        for e in std::fs::read_dir(path).map_err(at)? {
            let e = e.map_err(at)?;
            let name = e.file_name();
            let w = if wire.is_empty() {
                name.as_bytes().to_vec()
            } else {
                [&wire[..], b"/", name.as_bytes()].concat()
            };
            scan(&e.path(), w, files, others)?;
        }
    }
    Ok(())
}

/// A digest (xxh3-64) of a listing: every file's path and size and every
/// other entry's path, in path order, so two listings of the same tree
/// give the same value whatever the directory order.
pub fn digest(files: &[Item], others: &[Vec<u8>]) -> u64 {
    let mut f: Vec<(&[u8], u64)> = files.iter().map(|i| (&i.wire[..], i.size)).collect();
    f.sort_unstable();
    let mut o: Vec<&[u8]> = others.iter().map(|p| &p[..]).collect();
    o.sort_unstable();
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for (p, s) in f {
        h.update(&(p.len() as u64).to_le_bytes());
        h.update(p);
        h.update(&s.to_le_bytes());
    }
    h.update(b"\0others");
    for p in o {
        h.update(&(p.len() as u64).to_le_bytes());
        h.update(p);
    }
    h.digest()
}

/// Bytes and paths moved as one (a file, an inode's hard links, or one
/// piece of a big file: its (size, mtime, piece length, index)).
type Unit = (u64, Vec<Vec<u8>>, Option<(u64, (i64, u32), u64, u32)>);

/// A share: its paths, files and bytes, and the pieces of big files it
/// holds (their paths are in `paths` too, once).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Share {
    pub paths: Vec<Vec<u8>>,
    pub files: u64,
    pub bytes: u64,
    pub pieces: BTreeMap<Vec<u8>, PieceSet>,
}

impl Share {
    /// The pieces as the walk takes them (None: no piece).
    pub fn pieces(&self) -> Option<std::sync::Arc<Pieces>> {
        (!self.pieces.is_empty()).then(|| {
            let m = self.pieces.iter().map(|(k, v)| (k.clone(), v.clone()));
            std::sync::Arc::new(m.collect())
        })
    }
}

/// Deal `files` into one share per weight: largest first onto the share
/// that would finish first with it (bytes / weight, ties: the lower
/// index), an inode's hard links together; `others` go to share 0. With
/// `align` > 0 (normally [`PIECE_ALIGN`]), files [`piece_size`] cuts are
/// dealt as pieces (a file counts in the share of its first piece).
/// Deterministic for a given set of paths, sizes, link groups, weights and
/// alignment (the order of `files` does not matter).
pub fn deal(mut files: Vec<Item>, others: Vec<Vec<u8>>, weights: &[f64], align: u64) -> Vec<Share> {
    let total: u64 = files.iter().map(|f| f.size).sum();
    // Group hard links: one unit per inode, sized once.
    let mut units: BTreeMap<(u64, u64), Unit> = BTreeMap::new();
    let mut singles = Vec::new();
    for f in files.drain(..) {
        if f.inode != (0, 0) {
            let u = units.entry(f.inode).or_insert((f.size, vec![], None));
            u.1.push(f.wire);
        } else if let Some(p) = piece_size(f.size, total, align) {
            for (i, off) in (0..f.size).step_by(p as usize).enumerate() {
                let len = p.min(f.size - off);
                singles.push((
                    len,
                    vec![f.wire.clone()],
                    Some((f.size, f.mtime, p, i as u32)),
                ));
            }
        } else {
            singles.push((f.size, vec![f.wire], None));
        }
    }
    let mut all: Vec<Unit> = singles.into_iter().chain(units.into_values()).collect();
    for u in &mut all {
        u.1.sort_unstable();
    }
    let idx = |u: &Unit| u.2.map(|p| p.3);
    all.sort_by(|a, b| {
        b.0.cmp(&a.0)
            .then_with(|| a.1.cmp(&b.1))
            .then_with(|| idx(a).cmp(&idx(b)))
    });
    let n = weights.len().max(1);
    let w = |i: usize| weights.get(i).copied().unwrap_or(1.0).max(1e-3);
    let mut shares = vec![Share::default(); n];
    shares[0].paths = others;
    for (size, paths, piece) in all {
        let end = |i: usize| (shares[i].bytes + size) as f64 / w(i);
        let i = (0..n)
            .min_by(|&a, &b| end(a).total_cmp(&end(b)).then(a.cmp(&b)))
            .expect("at least one share");
        let s = &mut shares[i];
        s.bytes += size;
        match piece {
            None => {
                s.files += paths.len() as u64;
                s.paths.extend(paths);
            }
            Some((fsize, mtime, piece, index)) => {
                s.files += u64::from(index == 0);
                let wire = paths.into_iter().next().expect("a piece has its path");
                let set = s.pieces.entry(wire.clone()).or_insert_with(|| PieceSet {
                    size: fsize,
                    mtime,
                    piece,
                    indices: Vec::new(),
                });
                if set.indices.is_empty() {
                    s.paths.push(wire);
                }
                set.indices.push(index);
            }
        }
    }
    for s in &mut shares {
        for p in s.pieces.values_mut() {
            p.indices.sort_unstable();
        }
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(w: &str, size: u64, inode: u64) -> Item {
        Item {
            wire: w.as_bytes().to_vec(),
            size,
            inode: (if inode > 0 { 1 } else { 0 }, inode),
            mtime: (0, 0),
        }
    }

    fn names(s: &Share) -> Vec<String> {
        s.paths
            .iter()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect()
    }

    #[test]
    fn deals_largest_first_keeps_links_together_and_others_on_share_0() {
        let files = vec![
            item("t/a", 100, 0),
            item("t/b", 60, 0),
            item("t/c", 50, 0),
            item("t/d", 40, 0),
            item("t/l1", 30, 7),
            item("t/sub/l2", 30, 7),
        ];
        let others = vec![b"t".to_vec(), b"t/sub".to_vec()];
        let s = deal(files, others, &[1.0; 3], 0);
        // 100 -> 0, 60 -> 1, 50 -> 2, 40 -> 2 (50 < 60), links (30) -> 1.
        assert_eq!(names(&s[0]), ["t", "t/sub", "t/a"]);
        assert_eq!(names(&s[1]), ["t/b", "t/l1", "t/sub/l2"]);
        assert_eq!(names(&s[2]), ["t/c", "t/d"]);
        assert_eq!((s[0].bytes, s[1].bytes, s[2].bytes), (100, 90, 90));
        assert_eq!((s[0].files, s[1].files, s[2].files), (1, 3, 2));
        // More daemons than files: the extra shares are empty.
        let s = deal(vec![item("f", 1, 0)], vec![], &[1.0; 3], 0);
        assert!(s[1].paths.is_empty() && s[2].paths.is_empty());
        // A daemon of weight 0.5 (busy) gets about half the bytes of one
        // of weight 1: of 8 files of 10 bytes, 6 and 2 (ending at 60 and
        // 40 bytes per unit of weight; 4 and 4 would end at 40 and 80).
        let files = (0..8).map(|i| item(&format!("f{i}"), 10, 0)).collect();
        let s = deal(files, vec![], &[1.0, 0.5], 0);
        assert_eq!((s[0].bytes, s[1].bytes), (60, 20));
    }

    #[test]
    fn big_files_are_dealt_as_pieces_independent_of_the_daemon_count() {
        // 16 x align and 1/16 of the transfer: cut; less of either: whole.
        assert_eq!(piece_size(64, 64, 4), Some(4));
        assert_eq!(piece_size(63, 63, 4), None);
        assert_eq!(piece_size(64, 64 * 17, 4), None);
        assert_eq!(piece_size(64, 64, 0), None);
        // 256 MiB: 32 pieces of 8 MiB; 24 MiB: 24 of 1 MiB.
        let a = PIECE_ALIGN;
        assert_eq!(piece_size(256 << 20, 300 << 20, a), Some(8 << 20));
        assert_eq!(piece_size(24 << 20, 24 << 20, a), Some(1 << 20));
        assert_eq!(piece_size(15 << 20, 15 << 20, a), None);
        // One big file (100 units of 1) and two small ones over 3 daemons.
        let files = vec![item("t/big", 100, 0), item("t/a", 2, 0), item("t/b", 1, 0)];
        let s = deal(files.clone(), vec![b"t".to_vec()], &[1.0; 3], 1);
        let bytes: Vec<u64> = s.iter().map(|s| s.bytes).collect();
        assert_eq!(bytes.iter().sum::<u64>(), 103);
        assert!(bytes.iter().all(|&b| (33..=36).contains(&b)), "{bytes:?}");
        // Every piece exactly once, each share naming the file once.
        let mut all: Vec<u32> = s
            .iter()
            .flat_map(|s| s.pieces.get(&b"t/big"[..]).into_iter())
            .flat_map(|p| p.indices.clone())
            .collect();
        all.sort();
        assert_eq!(
            all,
            (0..25).collect::<Vec<u32>>(),
            "100 bytes / 32 -> 25 pieces of 4"
        );
        for sh in &s {
            let n = sh.paths.iter().filter(|p| *p == b"t/big").count();
            assert_eq!(n, usize::from(sh.pieces.contains_key(&b"t/big"[..])));
            assert_eq!(
                sh.pieces.get(&b"t/big"[..]).map(|p| p.piece),
                sh.pieces.get(&b"t/big"[..]).map(|_| 4)
            );
        }
        assert_eq!(
            s.iter().map(|s| s.files).sum::<u64>(),
            3,
            "the big file counts once"
        );
        // Over 2 daemons: the same pieces (what --resume finds done).
        let s2 = deal(files, vec![], &[1.0; 2], 1);
        let p2: Vec<(u64, u32)> = s2
            .iter()
            .flat_map(|s| {
                s.pieces
                    .values()
                    .flat_map(|p| p.indices.iter().map(|&i| (p.piece, i)))
            })
            .collect();
        assert_eq!(p2.len(), 25);
        assert!(p2.iter().all(|&(p, _)| p == 4));
    }

    #[test]
    fn the_deal_and_digest_ignore_listing_order() {
        // Two daemons listing one shared tree may read directories in
        // different orders (and see other inode numbers): same shares.
        let a = vec![
            item("t/x", 7, 0),
            item("t/y", 7, 0),
            item("t/l1", 5, 3),
            item("t/l2", 5, 3),
            item("t/z", 9, 0),
        ];
        let mut b: Vec<Item> = a.iter().rev().cloned().collect();
        for i in &mut b {
            if i.inode != (0, 0) {
                i.inode = (2, 99);
            }
        }
        let o = vec![b"t".to_vec()];
        assert_eq!(
            deal(a.clone(), o.clone(), &[1.0, 1.0], 1),
            deal(b.clone(), o.clone(), &[1.0, 1.0], 1)
        );
        assert_eq!(digest(&a, &o), digest(&b, &o));
        // A file of another size is another tree.
        b[0].size += 1;
        assert_ne!(digest(&a, &o), digest(&b, &o));
    }

    #[test]
    fn lists_a_tree_as_the_walk_names_it() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("top");
        std::fs::create_dir_all(t.join("sub/empty")).unwrap();
        std::fs::write(t.join("sub/f"), b"12345").unwrap();
        std::fs::hard_link(t.join("sub/f"), t.join("g")).unwrap();
        std::os::unix::fs::symlink("f", t.join("sub/link")).unwrap();
        let rel = t.as_os_str().as_bytes()[1..].to_vec();
        let tops = [Top {
            rel,
            name: b"top".to_vec(),
        }];
        let (mut files, mut others) = list(Path::new("/"), &tops).unwrap();
        files.sort_by(|a, b| a.wire.cmp(&b.wire));
        others.sort();
        let w: Vec<_> = files.iter().map(|f| (&f.wire[..], f.size)).collect();
        assert_eq!(w, [(&b"top/g"[..], 5), (&b"top/sub/f"[..], 5)]);
        assert_eq!(files[0].inode, files[1].inode);
        assert_ne!(files[0].inode, (0, 0));
        assert_eq!(
            others,
            [&b"top"[..], b"top/sub", b"top/sub/empty", b"top/sub/link"]
        );
    }
}
