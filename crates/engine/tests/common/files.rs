//! File helpers the engine's end-to-end tests shared by copy (issue 37).

use std::path::Path;

/// A scratch directory on /var/tmp: ext4 here (O_DIRECT, FIEMAP,
/// SEEK_HOLE); /tmp may be tmpfs.
pub fn tmp() -> tempfile::TempDir {
    tempfile::tempdir_in("/var/tmp").unwrap()
}

/// `b` holds exactly what `a` holds: the same names and the same bytes.
pub fn same_tree(a: &Path, b: &Path) {
    let mut n = 0;
    for e in std::fs::read_dir(a).unwrap() {
        let e = e.unwrap();
        let (pa, pb) = (e.path(), b.join(e.file_name()));
        if pa.is_dir() {
            same_tree(&pa, &pb);
        } else {
            let (x, y) = (std::fs::read(&pa).unwrap(), std::fs::read(&pb).unwrap());
            assert!(
                x == y,
                "{} differs ({} vs {} bytes)",
                pb.display(),
                x.len(),
                y.len()
            );
            n += 1;
        }
    }
    let m = std::fs::read_dir(b).unwrap().count();
    assert_eq!(
        m,
        std::fs::read_dir(a).unwrap().count(),
        "{}: {n} files",
        b.display()
    );
}
