//! The pieces of one big file (issue 19): several sessions write one
//! temp file; the last piece verified places it (roles::sink::bigfile).

use super::*;

impl FileTable {
    /// Entry `id` (registered with the whole file's size) is piece `index`
    /// of pieces of `piece` bytes (EntryKind::Piece, checked by the
    /// protocol machine; a bad one is not made a piece and fails); `wire`
    /// is its record's path.
    pub fn set_piece(&self, id: u64, wire: &[u8], piece: u64, index: u32) {
        // Right after its record: its slot is in the chunk being built.
        let mut b = self.building.lock().unwrap();
        let Some(i) = b.slot(id) else { return };
        let Some(c) = Arc::get_mut(&mut b) else {
            return;
        };
        // The slot and the name arena are separate fields: both borrowed.
        let Chunk { files, names, .. } = c;
        let f = &mut files[i];
        let kind = ramsys_proto::control::EntryKind::Piece {
            size: f.size,
            piece,
            index,
        };
        if let Some((offset, len)) = kind.piece_range() {
            f.piece = Some(Box::new(PieceAt {
                offset,
                len,
                index,
                count: f.size.div_ceil(piece) as u32,
                names: bigfile::Names::new(&names[f.name.range()], f.size, f.mtime, piece),
                finished: AtomicBool::new(false),
                wire: wire.into(),
                in_place: AtomicBool::new(false),
            }));
        }
    }

    /// Sync: piece `id` is already in the shared temp file, verified (an
    /// earlier run's marker): nothing to send.
    pub fn piece_done(&self, id: u64) -> bool {
        let Some(f) = &self.get(id) else { return false };
        let Some(p) = &f.piece else { return false };
        self.dir_of(f)
            .is_ok_and(|d| bigfile::piece_done(d.fd(), &p.names, f.size, p.index))
    }

    /// Sync: piece `id` is done already: kept; finish the file if every
    /// other piece is too (an earlier run may have stopped just before).
    pub fn keep_piece(&self, id: u64) {
        let Some(f) = &self.get(id) else { return };
        match self.try_finish(f) {
            Ok(()) => {
                f.flags.fetch_or(KEPT | FINAL, Ordering::AcqRel);
            }
            Err(e) => self.fail(f, format!("cannot rename into place: {e}")),
        }
    }

    /// A verified piece: leave its marker, and place the file if every
    /// piece is now in (roles::sink::bigfile).
    pub(super) fn place_piece(&self, f: &FileRef, p: &PieceAt) {
        // The marker is a link to the file this piece was written into
        // (roles::sink::bigfile): taken before the descriptor closes.
        let fd = self.take_fd(f);
        let marked = self.dir_of(f).and_then(|d| {
            bigfile::mark(
                d.fd(),
                &p.names,
                p.index,
                fd.as_ref().map(|fd| &fd.buffered),
            )
        });
        drop(fd);
        if let Err(e) = marked {
            self.fail(f, format!("cannot mark piece {} done: {e}", p.index));
            return;
        }
        match self.try_finish(f) {
            Ok(()) => {
                f.flags.fetch_or(FINAL, Ordering::AcqRel);
                self.stats.pieces.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => self.fail(f, format!("cannot rename into place: {e}")),
        }
    }

    /// Rename the big file piece `f` belongs to into place if every piece
    /// is verified (and nobody did yet).
    pub(super) fn try_finish(&self, f: &FileRef) -> std::io::Result<()> {
        let Some(p) = &f.piece else { return Ok(()) };
        let dir = self.dir_of(f)?;
        if skip_place_fault() || !bigfile::all_done(dir.fd(), &p.names, f.size, p.count) {
            return Ok(());
        }
        let (_, name) = split_parent(self.rel(f));
        let (size, mode, mtime) = (f.size, f.mode, f.mtime);
        if bigfile::finish(dir.fd(), &p.names, name, size, mode, mtime, p.count)? {
            p.finished.store(true, Ordering::Release);
            self.stats.files.fetch_add(1, Ordering::Relaxed);
        }
        p.in_place.store(true, Ordering::Release);
        Ok(())
    }

    /// The record paths of the big files this session's pieces belong to
    /// that it saw in place (Control::Placed, issue 36), sorted, once each.
    pub fn big_files_placed(&self) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        self.for_each_file(|f| {
            if let Some(p) = f.piece.as_ref() {
                if p.in_place.load(Ordering::Acquire) {
                    v.push(p.wire.to_vec());
                }
            }
        });
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// Fault injection for the agent's placed check (crates/ramsys/tests/
/// stripe_blocks.rs): `RAMSYS_FAULT_SKIP_PLACE=1` makes this sink never
/// place a big file, as if it never saw every marker (the bug of issue
/// 36). Read once per process.
fn skip_place_fault() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("RAMSYS_FAULT_SKIP_PLACE").is_ok_and(|v| v == "1"))
}
