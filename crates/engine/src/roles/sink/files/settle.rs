//! Settling files: sync's kept and reused files, completion and the
//! digest check, the rename into place, journal rows, and the verdict.

use super::*;

impl FileTable {
    /// Sync: build file `id` from `base` (set during metadata, before any
    /// data can arrive).
    pub fn set_base(&self, id: u64, base: Base) {
        if let Some(f) = self.get(id) {
            f.rare(|r| r.base = Some(base));
        }
    }

    /// Sync: the sink's file is kept as it is; give it the source's mode
    /// and mtime (a metadata-only change moves no data).
    pub fn keep(&self, id: u64, apply_attrs: bool) {
        let Some(f) = &self.get(id) else { return };
        if apply_attrs && !self.storage.null {
            if let Err(e) = self.root.set_dir_attrs(self.rel(f), f.mode, f.mtime) {
                self.fail(f, format!("attributes: {e}"));
                return;
            }
        }
        f.flags.fetch_or(KEPT | FINAL, Ordering::AcqRel);
        if let Some(p) = &f.piece {
            // Kept: the big file is in place (or left as it is, by
            // --ignore-existing or -u); markers an interrupted finish
            // left linked to it go (the session of its first piece).
            p.in_place.store(true, Ordering::Release);
            if p.index == 0 && !self.storage.null {
                if let Ok(dir) = self.dir_of(f) {
                    let (_, name) = split_parent(self.rel(f));
                    bigfile::forget(dir.fd(), &p.names, name, p.count);
                }
            }
        }
    }

    /// Sync: the source reuses `bytes` of file `id`'s base; only the rest
    /// arrives as data. Creates the temp file from the base now, so a file
    /// with no differing block completes here.
    pub fn reuse(&self, id: u64, bytes: u64) -> Result<(), WriteError> {
        let Some(f) = &self.get(id) else {
            return Err(WriteError::Protocol(format!(
                "reuse of unknown file id {id}"
            )));
        };
        if bytes > f.size || !f.has_base() {
            return Err(WriteError::Protocol(format!(
                "reuse of {} without a base the sink offered",
                crate::types::error::show(self.rel(f))
            )));
        }
        if bytes == 0 {
            return Ok(());
        }
        let seg = Segment {
            file_id: id,
            offset: 0,
            len: 0,
        };
        if self.prepare(&seg)?.is_none() {
            return Ok(());
        }
        f.rare(|r| r.reused += bytes);
        if self.resume && f.size >= self.journal_min {
            // Reused blocks count as written for the journal too.
            let bs = crate::request::sync::delta_block(f.size) as u64;
            f.rare(|r| r.jblocks.resize(f.size.div_ceil(bs) as usize, 0));
        }
        let w = f.written.fetch_add(bytes, Ordering::AcqRel) + bytes;
        if w > f.size {
            self.fail(f, "received more bytes than the file holds".into());
        } else if w == f.size {
            self.data_complete(f)?;
        }
        Ok(())
    }

    /// File bytes that crossed the wire for files now in place.
    pub fn bytes_moved(&self) -> u64 {
        let mut n = self.released.lock().unwrap().bytes_moved;
        self.for_each_file(|f| {
            if f.flags.load(Ordering::Acquire) & (FINAL | KEPT) == FINAL {
                n += f.want() - f.reused().min(f.want());
            }
        });
        n
    }

    /// Files now in place whose data (some of it) crossed the wire.
    pub fn files_moved(&self) -> u64 {
        let mut n = self.released.lock().unwrap().files_moved;
        self.for_each_file(|f| {
            let moved = f.flags.load(Ordering::Acquire) & (FINAL | KEPT) == FINAL
                && (f.size == 0 || f.reused() < f.size)
                // A big file counts once, at the sink that placed it.
                && f
                    .piece
                    .as_ref()
                    .is_none_or(|p| p.finished.load(Ordering::Acquire));
            n += moved as u64;
        });
        n
    }

    /// Files kept as they were at the sink.
    pub fn kept(&self) -> u64 {
        let mut n = self.released.lock().unwrap().kept;
        self.for_each_file(|f| {
            // A big file counts once: at the sink of its first piece.
            let kept = f.flags.load(Ordering::Acquire) & KEPT != 0
                && f.piece.as_ref().is_none_or(|p| p.index == 0);
            n += kept as u64;
        });
        n
    }

    /// Resume: journal rows of temp files whose written blocks changed
    /// since the last call (`all`: every temp file not in place, once at
    /// the session's end). A tick takes the dirty list, not the table.
    pub fn journal_rows(&self, all: bool) -> Vec<crate::roles::sink::journal::PartRec> {
        let dirty = std::mem::take(&mut *self.dirty.lock().unwrap());
        let mut rows = Vec::new();
        if all {
            self.for_each_ref(|f| rows.extend(self.journal_row(&f, all)));
        } else {
            for f in dirty.iter().filter_map(|&id| self.get(id)) {
                rows.extend(self.journal_row(&f, all));
            }
        }
        rows
    }

    /// The journal row of one file, if it has one to write now.
    pub(super) fn journal_row(
        &self,
        f: &FileRef,
        all: bool,
    ) -> Option<crate::roles::sink::journal::PartRec> {
        let fl = f.flags.load(Ordering::Acquire);
        if fl & TEMP == 0
            || fl & (FINAL | ANON) != 0
            || (!all && fl & DIRTY == 0)
            || f.size < self.journal_min
            || f.piece.is_some()
        {
            return None;
        }
        f.flags.fetch_and(!DIRTY, Ordering::AcqRel);
        let bs = crate::request::sync::delta_block(f.size);
        let written = f.rare(|r| {
            let mut written = vec![0u8; r.jblocks.len().div_ceil(8)];
            for (i, c) in r.jblocks.iter().enumerate() {
                let blen = (f.size - i as u64 * bs as u64).min(bs as u64);
                if *c as u64 >= blen {
                    written[i / 8] |= 1 << (i % 8);
                }
            }
            written
        });
        Some(crate::roles::sink::journal::PartRec {
            dest: self.rel(f).to_vec(),
            size: f.size,
            mtime: f.mtime,
            part: self.tmp_name(f),
            block_size: bs,
            written,
        })
    }

    /// Paths of files now in place that the journal holds a row for
    /// (`held`: its rows, few): their rows can go. One DELETE per row, not
    /// per file of the tree.
    pub fn final_paths(&self, held: &std::collections::HashSet<Vec<u8>>) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        if held.is_empty() {
            return out;
        }
        self.for_each_ref(|f| {
            let fin = f.flags.load(Ordering::Acquire) & FINAL != 0 && f.piece.is_none();
            if fin && held.contains(f.rel()) {
                out.push(f.rel().to_vec());
            }
        });
        out
    }

    pub(super) fn data_complete(&self, f: &FileRef) -> Result<(), WriteError> {
        // A nameless file stays open: it is linked through its descriptor.
        let file = {
            let mut g = f.fd.lock().unwrap();
            match &*g {
                Some(d) if d.anon => g.clone(),
                _ => g.take(),
            }
        };
        if let Some(file) = file {
            if self.fsync {
                if let Err(e) = file.buffered.sync_all() {
                    if is_fatal(&e) {
                        return Err(self.storage_fatal(&e));
                    }
                    self.fail(f, format!("fsync: {e}"));
                    return Ok(());
                }
            }
        }
        let prev = f.flags.fetch_or(DATA_DONE, Ordering::AcqRel);
        if prev & DIGEST_KNOWN != 0 {
            self.finalize(f);
        }
        Ok(())
    }

    /// The source reported the file fully read with this digest.
    pub fn digest_known(&self, id: u64, digest: u64) -> Result<(), WriteError> {
        if self.is_released(id) {
            // Settled (failed here) and dropped before its digest came.
            return Ok(());
        }
        let f = match self.get(id) {
            Some(f) => f,
            // Released since the look above (a settler runs beside the
            // loop that releases: writer::settler).
            None if self.is_released(id) => return Ok(()),
            None => {
                return Err(WriteError::Protocol(format!(
                    "digest for unknown file id {id}"
                )))
            }
        };
        let f = &f;
        f.expected.store(digest, Ordering::Release);
        if f.size == 0 && !self.storage.null && f.is_device() {
            f.flags.fetch_or(TEMP | DATA_DONE, Ordering::AcqRel);
        } else if f.size == 0 && !self.storage.null {
            // No payload will come: create the empty file now, at its
            // final name where nothing is there, unless its digest is not
            // the empty data's (it fails in finalize, as any other) or a
            // temp file was made for it (a zero-length segment: linked as
            // before).
            let direct = (!self.checksum || f.digest.load(Ordering::Acquire) == digest)
                && f.flags.load(Ordering::Acquire) & TEMP == 0;
            match direct.then(|| self.create_empty_in_place(f)).flatten() {
                Some(Ok(())) => {
                    f.flags.fetch_or(DATA_DONE | DIGEST_KNOWN, Ordering::AcqRel);
                    self.in_place(f);
                    return Ok(());
                }
                Some(Err(e)) if is_fatal(&e) => return Err(self.storage_fatal(&e)),
                Some(Err(e)) => {
                    self.fail(f, format!("cannot create: {e}"));
                    return Ok(());
                }
                None => {}
            }
            let mut g = f.fd.lock().unwrap();
            match self.create(f) {
                Ok(fd) => {
                    let anon = if fd.anon { ANON } else { 0 };
                    f.flags.fetch_or(TEMP | DATA_DONE | anon, Ordering::AcqRel);
                    // Closed (a named file) or linked (nameless) by finalize.
                    *g = Some(Arc::new(fd));
                }
                Err(e) if is_fatal(&e) => return Err(self.storage_fatal(&e)),
                Err(e) => {
                    drop(g);
                    self.fail(f, format!("cannot create: {e}"));
                    return Ok(());
                }
            }
        }
        let prev = f.flags.fetch_or(DIGEST_KNOWN, Ordering::AcqRel);
        if prev & DATA_DONE != 0 || f.size == 0 {
            self.finalize(f);
        }
        Ok(())
    }

    pub(super) fn finalize(&self, f: &FileRef) {
        if f.flags.load(Ordering::Acquire) & FAILED != 0 {
            return;
        }
        if self.checksum && f.digest.load(Ordering::Acquire) != f.expected.load(Ordering::Acquire) {
            self.fail(f, "checksum mismatch: file corrupted in transit".into());
            return;
        }
        if self.storage.null {
            // Verified and discarded: as good as placed.
            f.flags.fetch_or(FINAL, Ordering::AcqRel);
            self.stats.files.fetch_add(1, Ordering::Relaxed);
            if let Some(p) = &f.piece {
                p.in_place.store(true, Ordering::Release);
            }
            return;
        }
        if let Some(p) = &f.piece {
            self.place_piece(f, p);
            return;
        }
        if let Some(log) = f.volume() {
            // In place: nothing to rename; read back what was written.
            match self.verify_device(f, &log) {
                Ok(()) => {
                    f.flags.fetch_or(FINAL, Ordering::AcqRel);
                    self.stats.files.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => self.fail(f, e),
            }
            return;
        }
        let (_, name) = split_parent(self.rel(f));
        let fd = self.take_fd(f);
        let placed = self.dir_of(f).and_then(|dir| match &fd {
            Some(fd) if fd.anon => self.link_anon(f, fd, &dir, name),
            _ if f.flags.load(Ordering::Acquire) & ANON != 0 => Err(std::io::Error::other(
                "temp file closed before it was linked",
            )),
            _ => crate::storage::fsops::finalize_in(
                dir.fd(),
                &self.tmp_name(f),
                name,
                f.mode,
                f.mtime,
            ),
        });
        drop(fd);
        match placed {
            Ok(()) => self.in_place(f),
            Err(e) => self.fail(f, format!("cannot rename into place: {e}")),
        }
    }

    /// File `f` is under its final name.
    fn in_place(&self, f: &FileRef) {
        f.flags.fetch_or(FINAL, Ordering::AcqRel);
        self.stats.files.fetch_add(1, Ordering::Relaxed);
        crate::types::phase::mark("sink_file_in_place");
    }

    /// Re-read the ranges this session wrote into a device and compare
    /// their segment hashes with the source's digest (without checksums
    /// there is no digest to compare: fsync only).
    pub(super) fn verify_device(&self, f: &FileRef, log: &VolumeLog) -> Result<(), String> {
        crate::storage::volume::corrupt_fault(&self.root, self.rel(f));
        let dev = self
            .root
            .open_read(self.rel(f), false)
            .map_err(|e| format!("cannot reopen device to verify: {e}"))?;
        if !self.checksum {
            return dev.sync_all().map_err(|e| format!("fsync: {e}"));
        }
        // Local copies are compared with the file they were copied from.
        let source = self.storage.local.as_ref().and_then(|b| b.open(f.id).ok());
        let got = log
            .reread_digest(&dev, f.id, source.as_ref())
            .map_err(|e| format!("verification after writing: {e}"))?;
        if got != f.expected.load(Ordering::Acquire) {
            return Err(
                "verification after writing failed: the device does not read back \
                        what was written"
                    .into(),
            );
        }
        Ok(())
    }

    /// Files neither in place nor failed yet (the sink tells the source
    /// it may end the payload when none is left; docs/PROTOCOL.md).
    pub fn unsettled(&self) -> usize {
        let mut n = 0;
        self.for_each_file(|f| {
            n += (f.flags.load(Ordering::Acquire) & (FINAL | FAILED) == 0) as usize;
        });
        n
    }

    /// True once, for the first caller that sees the counters (files in
    /// place + failed) reach the table's size: the last file has likely
    /// just settled, and the sink's loop looks now rather than at its
    /// next 5 ms tick (a one-file batch of `sync --watch` waited 2.5 ms on
    /// average for it; issue 38). Only a hint: [`Self::all_settled`]
    /// decides, and the tick still looks if the counters never get there.
    pub fn counted_all_first(&self) -> bool {
        let n =
            self.stats.files.load(Ordering::Relaxed) + self.stats.failed.load(Ordering::Relaxed);
        n >= self.file_count()
            && !self.counted_all.load(Ordering::Relaxed)
            && !self.counted_all.swap(true, Ordering::AcqRel)
    }

    /// `unsettled() == 0`, amortized O(1): the sink asks every 5 ms during
    /// the payload, and a full scan of a 48,000-file table each time cost
    /// more than the rest of its control loop. Settled is final, so the
    /// scan resumes at the first file that was not settled last time.
    pub fn all_settled(&self) -> bool {
        let from = self.settled_upto.load(Ordering::Relaxed);
        let chunks = self.chunk_list();
        let k = chunks.partition_point(|c| c.end() <= from);
        let first = (chunks[k..].iter())
            .flat_map(|c| c.files.iter())
            .find(|f| f.id >= from && f.flags.load(Ordering::Acquire) & (FINAL | FAILED) == 0)
            .map(|f| f.id);
        let all = self.ids.load(Ordering::Acquire);
        self.settled_upto
            .store(first.unwrap_or(all), Ordering::Relaxed);
        first.is_none()
    }

    /// Whether file `id` is in place or failed (nothing more to ask for).
    pub fn is_settled(&self, id: u64) -> bool {
        self.is_released(id)
            || self
                .get(id)
                .is_some_and(|f| f.flags.load(Ordering::Acquire) & (FINAL | FAILED) != 0)
    }

    /// Whether a file made it to its final name.
    pub fn is_final(&self, f: &FileRef) -> bool {
        f.flags.load(Ordering::Acquire) & FINAL != 0 && f.piece.is_none()
    }

    /// After the transfer: fail what is incomplete, remove every temp file
    /// left, and list failures as (path, reason).
    pub fn finish(&self) -> Vec<(Vec<u8>, String)> {
        self.finish_keeping(false)
    }

    /// [`Self::finish`]; with `keep_parts` (resume), temp files that hold
    /// data stay for the next run (the journal names them).
    pub fn finish_keeping(&self, keep_parts: bool) -> Vec<(Vec<u8>, String)> {
        let mut out = std::mem::take(&mut self.released.lock().unwrap().failures);
        self.for_each_ref(|f| self.finish_one(&f, keep_parts, &mut out));
        out
    }

    /// [`Self::finish_keeping`] for one file: failed if not in place, its
    /// temp file removed unless kept, (path, reason) added to `out`.
    pub(super) fn finish_one(
        &self,
        f: &FileRef,
        keep_parts: bool,
        out: &mut Vec<(Vec<u8>, String)>,
    ) {
        let fl = f.flags.load(Ordering::Acquire);
        if fl & FINAL != 0 {
            return;
        }
        // The default journal keeps what the interruption cut short,
        // not files that failed on their own (changed while read...).
        let failed_alone = fl & FAILED != 0 && self.journal_min > 0;
        if fl & FAILED == 0 {
            let w = f.written.load(Ordering::Acquire);
            let why = if w < f.want() {
                format!("incomplete: received {w} of {} bytes", f.want())
            } else {
                "source never confirmed the file".into()
            };
            self.fail(f, why);
        }
        self.take_fd(f);
        let keep = keep_parts
            && !failed_alone
            && f.written.load(Ordering::Acquire) > 0
            && f.size >= self.journal_min;
        let fl = f.flags.load(Ordering::Acquire);
        // A piece's temp file is shared with the other sinks of the
        // stripe and holds the verified pieces `--resume` reuses.
        if fl & TEMP != 0 && fl & ANON == 0 && !keep && !f.is_device() && f.piece.is_none() {
            if let Ok(dir) = self.dir_of(f) {
                let _ = crate::storage::fsops::unlink_in(dir.fd(), &self.tmp_name(f));
            }
        }
        out.push((self.rel(f).to_vec(), f.reason()));
    }
}
