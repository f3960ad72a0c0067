//! A file as the source's walk found it and the layers below read it
//! (request::walk makes them; request::tasks, data::reader and
//! storage::extents take them): here so storage need not import the walk
//! (issue 37).

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
    /// A block device named as a top-level source (storage::volume): read
    /// as a file of the device's size; `dev` is the device itself.
    pub volume: bool,
    /// Fewer blocks allocated than its size needs, by the scan's stat
    /// (storage::sparse::may_be_sparse): only such files are probed for
    /// holes, and the reader needs no second stat to know it.
    pub sparse: bool,
    /// A piece of a big file (issue 19, EntryKind::Piece): only this byte
    /// range (offset, length) is read and sent under this id.
    pub range: Option<(u64, u64)>,
}

impl SourceFile {
    /// A whole regular file `rel` of `size` bytes with entry id `id`.
    pub fn plain(id: u64, rel: &[u8], size: u64) -> SourceFile {
        SourceFile {
            id,
            rel: rel.to_vec(),
            size,
            dev: 0,
            ino: 0,
            mtime: (0, 0),
            volume: false,
            sparse: false,
            range: None,
        }
    }

    /// Where its bytes to send start and end.
    pub fn span(&self) -> (u64, u64) {
        self.range.map_or((0, self.size), |(o, l)| (o, o + l))
    }

    /// Bytes to send.
    pub fn len(&self) -> u64 {
        self.range.map_or(self.size, |r| r.1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Index into a list of [`SourceFile`]s by entry id. The walk lists them in
/// id order, so a binary search finds one with no per-file cost up front;
/// a list out of order (none is today) gets a map. A HashMap built for
/// every session cost two SipHash inserts and ~40 bytes per file even on a
/// no-change re-sync, where nothing is looked up (issue 36).
pub struct IdIndex {
    map: Option<std::collections::HashMap<u64, usize>>,
}

impl IdIndex {
    pub fn new(files: &[SourceFile]) -> IdIndex {
        let sorted = files.windows(2).all(|w| w[0].id < w[1].id);
        IdIndex {
            map: (!sorted).then(|| files.iter().enumerate().map(|(i, f)| (f.id, i)).collect()),
        }
    }

    /// The position of file `id` in `files` (the list this index was built for).
    pub fn get(&self, files: &[SourceFile], id: u64) -> Option<usize> {
        match &self.map {
            Some(m) => m.get(&id).copied(),
            None => files.binary_search_by_key(&id, |f| f.id).ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_index_finds_in_order_and_out_of_order() {
        let sorted: Vec<SourceFile> = [3, 5, 9]
            .iter()
            .map(|&i| SourceFile::plain(i, b"f", 1))
            .collect();
        let ix = IdIndex::new(&sorted);
        assert!(ix.map.is_none());
        assert_eq!(ix.get(&sorted, 5), Some(1));
        assert_eq!(ix.get(&sorted, 9), Some(2));
        assert_eq!(ix.get(&sorted, 4), None);
        let shuffled: Vec<SourceFile> = [9, 3, 5]
            .iter()
            .map(|&i| SourceFile::plain(i, b"f", 1))
            .collect();
        let ix = IdIndex::new(&shuffled);
        assert!(ix.map.is_some());
        assert_eq!(ix.get(&shuffled, 3), Some(1));
        assert_eq!(ix.get(&shuffled, 9), Some(0));
        assert_eq!(ix.get(&shuffled, 7), None);
    }
}
