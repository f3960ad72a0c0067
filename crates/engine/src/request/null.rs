//! Null engines (seed 004 Fig. 4: RFTP's /dev/zero to /dev/null run
//! separates network cost from storage cost).
//!
//! - Null source: readers fill blocks without touching storage (the bytes
//!   are whatever the buffer holds) and hash them as usual. With
//!   `--null-size N` the scan is replaced by one synthetic file of N bytes
//!   named after the first source, so no data set is needed at all.
//! - Null sink: writers verify segment hashes and whole-file digests as
//!   usual but create and write nothing.

use ramsys_proto::control::{Entry, EntryKind};

use crate::request::walk::{Top, Walk};
use crate::types::file::SourceFile;

/// The walk of a null source with `--null-size`: one file of `size` bytes,
/// and its record.
pub fn synthetic_walk(tops: &[Top], size: u64) -> (Walk, Vec<Entry>) {
    let name = tops
        .first()
        .map(|t| t.name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| b"null".to_vec());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let entry = Entry {
        id: 0,
        path: name.clone(),
        kind: EntryKind::File { size },
        mode: 0o644,
        mtime_s: now,
        mtime_ns: 0,
    };
    let w = Walk {
        entries: 1,
        setid: 0,
        files: vec![SourceFile {
            id: 0,
            rel: crate::types::file::Rel::new(&name),
            size,
            dev: 0,
            ino: 0,
            mtime: (now, 0),
            volume: false,
            sparse: false,
            range: None,
        }],
        failures: Vec::new(),
        total_bytes: size,
    };
    (w, vec![entry])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_synthetic_file() {
        let (w, entries) = synthetic_walk(
            &[Top {
                rel: b"x/y".to_vec(),
                name: b"y".to_vec(),
            }],
            12345,
        );
        assert_eq!(w.files.len(), 1);
        assert_eq!(w.files[0].size, 12345);
        assert_eq!(entries[0].path, b"y");
        assert_eq!(w.entries, 1);
        assert_eq!(w.total_bytes, 12345);
    }
}
