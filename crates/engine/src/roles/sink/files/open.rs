//! Where a file's bytes go: its temp file (named, or nameless with
//! O_TMPFILE), the O_DIRECT lane, or a block device written in place.

use super::*;

impl FileTable {
    /// Entry `id` goes into the block device at its path, in place
    /// (checked by the caller: `--write-devices`, large enough).
    pub fn set_device(&self, id: u64) {
        if let Some(f) = self.get(id) {
            if !f.is_device() {
                f.rare(|r| r.volume = Some(Arc::default()));
                f.flags.fetch_or(DEVICE, Ordering::AcqRel);
            }
        }
    }

    /// Check a segment and find where it goes: None if there is nothing to
    /// do (file failed or already complete); otherwise the file and its
    /// descriptors (None for a null sink), created on first use.
    pub fn prepare(&self, seg: &Segment) -> Result<Prepared, WriteError> {
        let Some(f) = self.get(seg.file_id) else {
            // Late data of a file settled (failed) and dropped since.
            if self.is_released(seg.file_id) {
                return Ok(None);
            }
            return Err(WriteError::Protocol(format!(
                "data for unknown file id {}",
                seg.file_id
            )));
        };
        if seg.is_copy() && self.storage.local.is_none() {
            return Err(WriteError::Protocol(
                "local-copy segment from a peer in another process".into(),
            ));
        }
        let end = seg.offset + seg.span();
        if end > f.size {
            return Err(WriteError::Protocol(format!(
                "data past the end of {} ({end} > {})",
                crate::types::error::show(self.rel(&f)),
                f.size
            )));
        }
        if let Some(p) = &f.piece {
            if seg.offset < p.offset || end > p.offset + p.len {
                return Err(WriteError::Protocol(format!(
                    "data outside piece {} of {}",
                    p.index,
                    crate::types::error::show(self.rel(&f))
                )));
            }
        }
        if f.flags.load(Ordering::Acquire) & (FAILED | FINAL) != 0 {
            return Ok(None);
        }
        if self.storage.null {
            return Ok(Some((f, None)));
        }
        let mut g = f.fd.lock().unwrap();
        if g.is_none() {
            if f.flags.load(Ordering::Acquire) & (TEMP | FAILED) != 0 {
                // Closed after completion or failure: nothing to write.
                return Ok(None);
            }
            match self.create(&f) {
                Ok(fd) => {
                    let anon = if fd.anon { ANON } else { 0 };
                    f.flags.fetch_or(TEMP | anon, Ordering::AcqRel);
                    *g = Some(Arc::new(fd));
                }
                Err(e) if is_fatal(&e) => return Err(self.storage_fatal(&e)),
                Err(e) => {
                    drop(g);
                    self.fail(&f, format!("cannot create: {e}"));
                    return Ok(None);
                }
            }
        }
        let fd = g.clone();
        drop(g);
        Ok(Some((f, fd)))
    }

    /// Create the temp file at its final size, with an O_DIRECT descriptor
    /// for large files where the file system takes one.
    pub(super) fn create(&self, f: &FileRef) -> std::io::Result<SinkFd> {
        if f.is_device() {
            return self.open_device(f);
        }
        let (parent, _) = split_parent(self.rel(f));
        let dir = self.dir_of(f)?;
        let base = f.base();
        if base.is_none() && f.piece.is_none() {
            if let Some(fd) = self.create_anon(f, &dir)? {
                return Ok(fd);
            }
        }
        let tmp = match &f.piece {
            Some(p) => p.names.tmp.clone(),
            None => self.tmp_name(f),
        };
        let buffered = match &base {
            // A piece: the temp file shared by the stripe, sized by
            // whoever opens it first (roles::sink::bigfile).
            _ if f.piece.is_some() => {
                let p = f.piece.as_ref().expect("a piece");
                bigfile::open(dir.fd(), &p.names, f.size)?
            }
            Some(Base::Part(name)) => {
                self.root.rename_in(parent, name, &tmp)?;
                let mut rel = parent.to_vec();
                if !rel.is_empty() {
                    rel.push(b'/');
                }
                rel.extend_from_slice(&tmp);
                File::from(
                    self.root
                        .openat(&rel, libc::O_WRONLY | libc::O_NOFOLLOW, 0)?,
                )
            }
            _ => crate::storage::fsops::create_temp_in(dir.fd(), &tmp)?,
        };
        // A small fresh file is not sized up front: its data fills it and
        // a hole at its end sets the size. Large files are (the O_DIRECT
        // prefix and the buffered tail of a block write disjoint pages of
        // a file that already has its size), and so is one built on a base.
        let sized = base.is_some() || f.size >= DIRECT_MIN || f.piece.is_some();
        let made = (|| {
            if base == Some(Base::Old) {
                let old = self.root.open_read(self.rel(f), false)?;
                crate::request::sync::copy_base(&old, &buffered, f.size)?;
            }
            if sized && f.piece.is_none() {
                buffered.set_len(f.size)?;
            }
            let mut direct = None;
            let forced = self.storage.write_direct(f.size);
            let lane = !forced && self.storage.lane(f.size);
            if forced || lane {
                let mut rel = parent.to_vec();
                if !rel.is_empty() {
                    rel.push(b'/');
                }
                rel.extend_from_slice(&tmp);
                direct = self.open_direct(f, &buffered, || {
                    let fl = libc::O_WRONLY | libc::O_DIRECT | libc::O_NOFOLLOW;
                    self.root.openat(&rel, fl, 0).map(File::from)
                })?;
            }
            Ok((direct, lane))
        })();
        match made {
            Ok((direct, lane)) => {
                let lane = lane && direct.is_some();
                if !lane {
                    self.storage.count(f.size, f.want(), direct.is_some());
                }
                Ok(SinkFd {
                    source: std::sync::OnceLock::new(),
                    writeback: direct.is_none() && self.storage.writeback && f.size >= DIRECT_MIN,
                    buffered,
                    direct,
                    lane,
                    anon: false,
                    sized,
                })
            }
            Err(e) => {
                // Another sink's pieces may be in a shared one.
                if f.piece.is_none() {
                    let _ = crate::storage::fsops::unlink_in(dir.fd(), &tmp);
                }
                Err(e)
            }
        }
    }

    /// A nameless temp file for a small fresh file no journal will name,
    /// while O_TMPFILE works here and fewer than `anon_cap` are open;
    /// None: use a named one.
    pub(super) fn create_anon(&self, f: &FileRef, dir: &DirRef) -> std::io::Result<Option<SinkFd>> {
        let journalled = self.resume && f.size >= self.journal_min;
        if f.size >= DIRECT_MIN
            || journalled
            || !self.anon_ok.load(Ordering::Relaxed)
            || self.anon_open.load(Ordering::Relaxed) >= self.anon_cap
        {
            return Ok(None);
        }
        let made = self
            .storage
            .hook
            .check(IoOp::TmpFile, self.rel(f), 0, 0)
            .and_then(|_| tmpfile::create(dir.fd(), f.mode));
        match made {
            Ok(buffered) => {
                // Also a direct lane file: sized now (its O_DIRECT pages and
                // buffered tail then write disjoint pages of a file that
                // has its size, as a large file's), with a second,
                // O_DIRECT descriptor.
                let direct = match self.storage.lane(f.size) {
                    true => self.anon_direct(f, &buffered)?,
                    false => None,
                };
                let fd = SinkFd {
                    buffered,
                    sized: direct.is_some(),
                    lane: direct.is_some(),
                    direct,
                    source: std::sync::OnceLock::new(),
                    writeback: false,
                    anon: true,
                };
                self.anon_open.fetch_add(fd.fds(), Ordering::AcqRel);
                Ok(Some(fd))
            }
            Err(e) if tmpfile::is_unsupported(&e) => {
                if self.anon_ok.swap(false, Ordering::AcqRel) {
                    tracing::info!("O_TMPFILE refused ({e}): temp files are named and renamed");
                }
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// An empty file made at its final name at once, where no base, piece
    /// or device concerns it: it has no data to be seen half-written, and
    /// O_TMPFILE's orphan-list work and its linkat cost about a third more
    /// kernel time per file (trees of millions of files, issue 36). The
    /// create is exclusive and follows no link; the mode it gets (masked
    /// by the umask, or the directory's default ACL) grants no more than
    /// the one set next. A crash before the mtime is set leaves an empty
    /// file of today's mtime, which the next sync sees as changed. None:
    /// the name is taken (the file replaces it through a temp file, as
    /// any other) or the path does not apply.
    pub(super) fn create_empty_in_place(&self, f: &FileRef) -> Option<std::io::Result<()>> {
        if f.piece.is_some() || f.is_device() || f.has_base() {
            return None;
        }
        let (_, name) = split_parent(self.rel(f));
        let made = self
            .storage
            .hook
            .check(IoOp::CreateEmpty, self.rel(f), 0, 0)
            .and_then(|_| self.dir_of(f))
            .and_then(|dir| {
                let file = crate::storage::fsops::create_new_in(dir.fd(), name, f.mode)?;
                let acl = dir.dir().default_acl;
                let chmod = tmpfile::chmod_needed(f.mode, tmpfile::umask(), acl).then_some(f.mode);
                tmpfile::set_attrs(&file, chmod, f.mtime)
            });
        match made {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => None,
            r => Some(r),
        }
    }

    /// The O_DIRECT descriptor of a nameless lane file, sized; None where
    /// the device refuses O_DIRECT (or /proc is not there to reopen it).
    pub(super) fn anon_direct(
        &self,
        f: &FileRef,
        buffered: &File,
    ) -> std::io::Result<Option<File>> {
        match self.open_direct(f, buffered, || tmpfile::reopen_direct(buffered)) {
            Ok(Some(d)) => {
                buffered.set_len(f.size)?;
                Ok(Some(d))
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            r => r,
        }
    }

    /// A second, O_DIRECT descriptor of the temp file `buffered`, made by
    /// `open`; None where its device refuses O_DIRECT (remembered per
    /// device, so each is tried once per session).
    pub(super) fn open_direct(
        &self,
        f: &FileRef,
        buffered: &File,
        open: impl FnOnce() -> std::io::Result<File>,
    ) -> std::io::Result<Option<File>> {
        let dev = buffered.metadata()?.dev();
        if self.storage.refusals.refused(dev) {
            return Ok(None);
        }
        let r = self
            .storage
            .hook
            .check(IoOp::OpenDirect, self.rel(f), 0, 0)
            .and_then(|_| open());
        match r {
            Ok(d) => Ok(Some(d)),
            Err(e) if is_direct_refusal(&e) => {
                self.storage.refusals.refuse(dev, "sink", &e);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Give a nameless temp file its mtime (and mode where creation could
    /// not set it) and link it under its final name; where the name is
    /// taken (an overwrite), under the temp name, renamed over it.
    pub(super) fn link_anon(
        &self,
        f: &FileRef,
        fd: &SinkFd,
        dir: &DirRef,
        name: &[u8],
    ) -> std::io::Result<()> {
        let acl = dir.dir().default_acl;
        let chmod = tmpfile::chmod_needed(f.mode, tmpfile::umask(), acl).then_some(f.mode);
        tmpfile::set_attrs(&fd.buffered, chmod, f.mtime)?;
        match tmpfile::link(&fd.buffered, dir.fd(), name) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                let tmp = self.tmp_name(f);
                tmpfile::link(&fd.buffered, dir.fd(), &tmp)?;
                crate::storage::fsops::rename_in_dir(dir.fd(), &tmp, name).inspect_err(|_| {
                    let _ = crate::storage::fsops::unlink_in(dir.fd(), &tmp);
                })
            }
            r => r,
        }
    }

    /// A device destination: opened in place for writing (never created,
    /// never truncated), with an O_DIRECT descriptor for the aligned part.
    pub(super) fn open_device(&self, f: &FileRef) -> std::io::Result<SinkFd> {
        let fl = libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        let buffered = File::from(self.root.openat(self.rel(f), fl, 0)?);
        let direct = if self.storage.write_direct(f.size) {
            self.root
                .openat(self.rel(f), fl | libc::O_DIRECT, 0)
                .ok()
                .map(File::from)
        } else {
            None
        };
        self.storage.count(f.size, f.size, direct.is_some());
        Ok(SinkFd {
            source: std::sync::OnceLock::new(),
            writeback: false,
            buffered,
            direct,
            lane: false,
            anon: false,
            sized: true,
        })
    }
}
