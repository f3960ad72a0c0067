//! A file as the source's walk found it and the layers below read it
//! (request::walk makes them; request::tasks, data::reader and
//! storage::extents take them): here so storage need not import the walk
//! (issue 37).

/// A regular file to read. Kept for every file of a session at the
/// source (until windows, docs/SCALE.md), so it is kept small (issue 36):
/// the path lives in a shared arena ([`Rel`]), a piece's range behind a
/// box (pieces are rare); 80 bytes, guarded by a unit test.
#[derive(Debug, Clone)]
pub struct SourceFile {
    pub id: u64,
    /// Path relative to the source root (for opening).
    pub rel: Rel,
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
    pub range: Option<Box<(u64, u64)>>,
}

/// A path kept in a chunk of path bytes shared by many files ([`RelArena`]):
/// 16 bytes and no heap allocation of its own, where a `Vec<u8>` took 24
/// bytes plus a 32-64-byte allocation per file (issue 36). Reads as the
/// path's bytes.
#[derive(Clone)]
pub struct Rel {
    chunk: std::sync::Arc<Vec<u8>>,
    off: u32,
    len: u32,
}

impl Rel {
    /// A path in a chunk of its own (tests, single files, volumes).
    pub fn new(path: &[u8]) -> Rel {
        Rel {
            chunk: std::sync::Arc::new(path.to_vec()),
            off: 0,
            len: path.len() as u32,
        }
    }
}

impl std::ops::Deref for Rel {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.chunk[self.off as usize..(self.off + self.len) as usize]
    }
}

impl std::fmt::Debug for Rel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self))
    }
}

impl PartialEq for Rel {
    fn eq(&self, o: &Rel) -> bool {
        **self == **o
    }
}

/// Packs the paths of a walk's files into shared chunks: the open chunk
/// fills in place; a full one is frozen behind an `Arc` and the files
/// that point into it are given it ([`RelArena::seal`]).
pub struct RelArena {
    open: Vec<u8>,
    /// Index (in the caller's file list) of the first file whose path is
    /// in the open chunk.
    first: usize,
    empty: std::sync::Arc<Vec<u8>>,
}

/// Bytes per chunk: many files' paths per allocation, and little kept
/// alive by a few straggling files.
const REL_CHUNK: usize = 64 << 10;

impl Default for RelArena {
    fn default() -> Self {
        RelArena {
            open: Vec::new(),
            first: 0,
            empty: std::sync::Arc::new(Vec::new()),
        }
    }
}

impl RelArena {
    /// A path for the file about to be pushed at `files.len()`; the chunk
    /// it is in is handed to the files by [`Self::seal`] (before anyone
    /// reads them).
    pub fn add(&mut self, files: &mut [SourceFile], path: &[u8]) -> Rel {
        if self.open.len() + path.len() > REL_CHUNK && !self.open.is_empty() {
            self.seal(files);
        }
        if self.open.is_empty() {
            self.open.reserve_exact(REL_CHUNK.max(path.len()));
            self.first = files.len();
        }
        let off = self.open.len() as u32;
        self.open.extend_from_slice(path);
        Rel {
            chunk: self.empty.clone(),
            off,
            len: path.len() as u32,
        }
    }

    /// Freeze the open chunk and give it to the files that point into it.
    pub fn seal(&mut self, files: &mut [SourceFile]) {
        if self.open.is_empty() {
            return;
        }
        let mut chunk = std::mem::take(&mut self.open);
        chunk.shrink_to_fit();
        let chunk = std::sync::Arc::new(chunk);
        for f in &mut files[self.first..] {
            f.rel.chunk = chunk.clone();
        }
    }
}

impl SourceFile {
    /// A whole regular file `rel` of `size` bytes with entry id `id`.
    pub fn plain(id: u64, rel: &[u8], size: u64) -> SourceFile {
        SourceFile {
            id,
            rel: Rel::new(rel),
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
        self.range
            .as_deref()
            .map_or((0, self.size), |&(o, l)| (o, o + l))
    }

    /// Bytes to send.
    pub fn len(&self) -> u64 {
        self.range.as_deref().map_or(self.size, |r| r.1)
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

/// A session's source files by entry id, as lists of ascending ids: the
/// whole walk's list, or in a windowed session one list per batch the
/// readers took (issue 36), dropped a list at a time once the sink has
/// settled it. Shared by the re-readers and a local copy's in-process
/// sink, which look files up by id.
#[derive(Clone, Default)]
pub struct LiveFiles(
    std::sync::Arc<std::sync::RwLock<std::collections::VecDeque<std::sync::Arc<Vec<SourceFile>>>>>,
);

impl LiveFiles {
    /// The whole walk's list.
    pub fn whole(files: std::sync::Arc<Vec<SourceFile>>) -> LiveFiles {
        let l = LiveFiles::default();
        l.push(files);
        l
    }

    /// A list of ids above every list held.
    pub fn push(&self, files: std::sync::Arc<Vec<SourceFile>>) {
        if !files.is_empty() {
            self.0.write().unwrap().push_back(files);
        }
    }

    /// Drop the lists whose files all have ids below `through`.
    pub fn drop_below(&self, through: u64) {
        let mut l = self.0.write().unwrap();
        while l
            .front()
            .and_then(|f| f.last())
            .is_some_and(|f| f.id < through)
        {
            l.pop_front();
        }
    }

    /// File `id`, if held.
    pub fn find(&self, id: u64) -> Option<SourceFile> {
        let l = self.0.read().unwrap();
        let k = l.partition_point(|f| f.last().is_some_and(|f| f.id < id));
        let list = l.get(k)?;
        let i = list.binary_search_by_key(&id, |f| f.id).ok()?;
        Some(list[i].clone())
    }

    /// Every file held, in one list (the one list itself when there is
    /// one; a copy of a window's lists otherwise, for a re-read).
    pub fn snapshot(&self) -> std::sync::Arc<Vec<SourceFile>> {
        let l = self.0.read().unwrap();
        match l.len() {
            1 => l[0].clone(),
            _ => std::sync::Arc::new(l.iter().flat_map(|f| f.iter().cloned()).collect()),
        }
    }

    /// Files held now.
    pub fn len(&self) -> usize {
        self.0.read().unwrap().iter().map(|f| f.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_files_find_by_id_and_drop_whole_lists() {
        let list = |ids: &[u64]| {
            let v = ids
                .iter()
                .map(|&i| SourceFile::plain(i, format!("f{i}").as_bytes(), 1));
            std::sync::Arc::new(v.collect::<Vec<_>>())
        };
        let l = LiveFiles::default();
        l.push(list(&[1, 3]));
        l.push(list(&[]));
        l.push(list(&[4, 9]));
        assert_eq!(l.find(3).map(|f| f.id), Some(3));
        assert_eq!(l.find(9).map(|f| &*f.rel.to_vec() == b"f9"), Some(true));
        assert!(l.find(2).is_none() && l.find(10).is_none());
        assert_eq!(l.snapshot().len(), 4);
        // A list goes only when all of it is below the mark.
        l.drop_below(4);
        assert!(l.find(3).is_none() && l.find(4).is_some());
        assert!(
            std::sync::Arc::ptr_eq(&l.snapshot(), &l.snapshot()),
            "one list: no copy"
        );
        l.drop_below(10);
        assert!(l.is_empty());
    }

    #[test]
    fn source_file_stays_small() {
        assert!(std::mem::size_of::<SourceFile>() <= 80);
        assert_eq!(std::mem::size_of::<Rel>(), 16);
    }

    #[test]
    fn rel_arena_packs_paths_into_shared_chunks() {
        let mut files: Vec<SourceFile> = Vec::new();
        let mut arena = RelArena::default();
        let names: Vec<Vec<u8>> = (0..20_000)
            .map(|i| format!("d{}/f{i}", i / 1000).into_bytes())
            .collect();
        for (i, n) in names.iter().enumerate() {
            let mut f = SourceFile::plain(i as u64, b"", 1);
            f.rel = arena.add(&mut files, n);
            files.push(f);
        }
        arena.seal(&mut files);
        for (f, n) in files.iter().zip(&names) {
            assert_eq!(&f.rel[..], &n[..]);
        }
        // Several chunks, each shared by many files.
        let chunks: std::collections::HashSet<*const Vec<u8>> = files
            .iter()
            .map(|f| std::sync::Arc::as_ptr(&f.rel.chunk))
            .collect();
        assert!(
            chunks.len() > 1 && chunks.len() < 20,
            "{} chunks",
            chunks.len()
        );
        // A path longer than a chunk still fits.
        let long = vec![b'x'; REL_CHUNK + 10];
        let mut f = SourceFile::plain(0, b"", 1);
        f.rel = arena.add(&mut files, &long);
        files.push(f);
        arena.seal(&mut files);
        assert_eq!(&files.last().unwrap().rel[..], &long[..]);
    }

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
