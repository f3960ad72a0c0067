//! Small trees generated from a seed, and their comparison.

use std::path::Path;

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

/// A directory in memory (/dev/shm) where there is one: these tests
/// measure sessions, not disks (the pair runs without O_DIRECT).
pub fn tmp() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    match shm.is_dir() {
        true => tempfile::tempdir_in(shm).unwrap(),
        false => tempfile::tempdir().unwrap(),
    }
}

/// `n` files spread over a few directories, sizes from empty to a few
/// blocks of `block` bytes, contents from `seed`. Returns the bytes.
pub fn files(dir: &Path, n: usize, block: usize, seed: u64) -> u64 {
    let mut r = StdRng::seed_from_u64(seed);
    let mut total = 0;
    for i in 0..n {
        let sub = dir.join(format!("d{}", i % 7));
        std::fs::create_dir_all(&sub).unwrap();
        let len = match i % 5 {
            0 => 0,
            1 => r.gen_range(1..block),
            2 => block,
            _ => r.gen_range(block..4 * block),
        };
        std::fs::write(sub.join(format!("f{i}")), bytes(&mut r, len)).unwrap();
        total += len as u64;
    }
    total
}

/// One file of `len` bytes.
pub fn file(path: &Path, len: usize, seed: u64) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut r = StdRng::seed_from_u64(seed);
    std::fs::write(path, bytes(&mut r, len)).unwrap();
}

/// Many empty-ish files (a metadata-heavy tree): `n` files of 0-99 bytes.
pub fn small_files(dir: &Path, n: usize, seed: u64) {
    let mut r = StdRng::seed_from_u64(seed);
    for i in 0..n {
        let sub = dir.join(format!("d{}", i / 500));
        if i % 500 == 0 {
            std::fs::create_dir_all(&sub).unwrap();
        }
        let len = r.gen_range(0..100);
        std::fs::write(sub.join(format!("f{i}")), bytes(&mut r, len)).unwrap();
    }
}

fn bytes(r: &mut StdRng, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    r.fill_bytes(&mut v);
    v
}

/// `b` holds the same names and file contents as `a`.
pub fn same_tree(a: &Path, b: &Path) {
    let mut names = 0;
    for e in std::fs::read_dir(a).unwrap() {
        let e = e.unwrap();
        let (pa, pb) = (e.path(), b.join(e.file_name()));
        if pa.is_dir() {
            same_tree(&pa, &pb);
        } else {
            let (x, y) = (std::fs::read(&pa).unwrap(), std::fs::read(&pb));
            let y = y.unwrap_or_else(|e| panic!("{}: {e}", pb.display()));
            assert!(x == y, "{} differs", pb.display());
        }
        names += 1;
    }
    let there = std::fs::read_dir(b).unwrap().count();
    assert_eq!(there, names, "{} holds other names", b.display());
}

/// Copy tree `a` to `b` with each file's mtime: what an earlier sync
/// left (a sync's quick check compares size and mtime).
pub fn mirror(a: &Path, b: &Path) {
    std::fs::create_dir_all(b).unwrap();
    for e in std::fs::read_dir(a).unwrap() {
        let e = e.unwrap();
        let (pa, pb) = (e.path(), b.join(e.file_name()));
        if pa.is_dir() {
            mirror(&pa, &pb);
        } else {
            std::fs::copy(&pa, &pb).unwrap();
            let mtime = e.metadata().unwrap().modified().unwrap();
            let f = std::fs::File::options().write(true).open(&pb).unwrap();
            f.set_modified(mtime).unwrap();
        }
    }
}
