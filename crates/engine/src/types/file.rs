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
