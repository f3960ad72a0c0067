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
}

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

/// Bytes and paths moved as one (a file, or an inode's hard links).
type Unit = (u64, Vec<Vec<u8>>);

/// A share: its paths, files and bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Share {
    pub paths: Vec<Vec<u8>>,
    pub files: u64,
    pub bytes: u64,
}

/// Deal `files` into one share per weight: largest first onto the share
/// that would finish first with it (bytes / weight, ties: the lower
/// index), an inode's hard links together; `others` go to share 0.
/// Deterministic for a given set of paths, sizes, link groups and
/// weights (the order of `files` does not matter).
pub fn deal(mut files: Vec<Item>, others: Vec<Vec<u8>>, weights: &[f64]) -> Vec<Share> {
    // Group hard links: one unit per inode, sized once.
    let mut units: BTreeMap<(u64, u64), Unit> = BTreeMap::new();
    let mut singles = Vec::new();
    for f in files.drain(..) {
        if f.inode == (0, 0) {
            singles.push((f.size, vec![f.wire]));
        } else {
            let u = units.entry(f.inode).or_insert((f.size, vec![]));
            u.1.push(f.wire);
        }
    }
    let mut all: Vec<Unit> = singles.into_iter().chain(units.into_values()).collect();
    for u in &mut all {
        u.1.sort_unstable();
    }
    all.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let n = weights.len().max(1);
    let w = |i: usize| weights.get(i).copied().unwrap_or(1.0).max(1e-3);
    let mut shares = vec![Share::default(); n];
    shares[0].paths = others;
    for (size, paths) in all {
        let end = |i: usize| (shares[i].bytes + size) as f64 / w(i);
        let i = (0..n)
            .min_by(|&a, &b| end(a).total_cmp(&end(b)).then(a.cmp(&b)))
            .expect("at least one share");
        shares[i].files += paths.len() as u64;
        shares[i].bytes += size;
        shares[i].paths.extend(paths);
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
        let s = deal(files, others, &[1.0; 3]);
        // 100 -> 0, 60 -> 1, 50 -> 2, 40 -> 2 (50 < 60), links (30) -> 1.
        assert_eq!(names(&s[0]), ["t", "t/sub", "t/a"]);
        assert_eq!(names(&s[1]), ["t/b", "t/l1", "t/sub/l2"]);
        assert_eq!(names(&s[2]), ["t/c", "t/d"]);
        assert_eq!((s[0].bytes, s[1].bytes, s[2].bytes), (100, 90, 90));
        assert_eq!((s[0].files, s[1].files, s[2].files), (1, 3, 2));
        // More daemons than files: the extra shares are empty.
        let s = deal(vec![item("f", 1, 0)], vec![], &[1.0; 3]);
        assert!(s[1].paths.is_empty() && s[2].paths.is_empty());
        // A daemon of weight 0.5 (busy) gets about half the bytes of one
        // of weight 1: of 8 files of 10 bytes, 6 and 2 (ending at 60 and
        // 40 bytes per unit of weight; 4 and 4 would end at 40 and 80).
        let files = (0..8).map(|i| item(&format!("f{i}"), 10, 0)).collect();
        let s = deal(files, vec![], &[1.0, 0.5]);
        assert_eq!((s[0].bytes, s[1].bytes), (60, 20));
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
            deal(a.clone(), o.clone(), &[1.0, 1.0]),
            deal(b.clone(), o.clone(), &[1.0, 1.0])
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
