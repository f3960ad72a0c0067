//! Writing segments: data, holes, local-copy ranges, and the count of
//! what is on disk (which completes a file).

use super::*;

impl FileTable {
    /// Write one received segment (synchronous engine).
    pub fn write_segment(&self, seg: &Segment, data: &[u8], hash: u64) -> Result<(), WriteError> {
        let Some((f, fd)) = self.prepare(seg)? else {
            return Ok(());
        };
        let f = &f;
        if let Some(fd) = fd {
            if let Some(r) = self.write_marker(f, &fd, seg, hash) {
                return r;
            }
            if let Err(e) = self.write_data(f, &fd, data, seg.offset) {
                return self.write_failed(f, e);
            }
        }
        self.account(f, seg, hash)
    }

    /// A segment without payload, written at once and accounted: a local
    /// copy's range (storage::local) or a hole. None: a data segment.
    pub fn write_marker(
        &self,
        f: &FileRef,
        fd: &SinkFd,
        seg: &Segment,
        hash: u64,
    ) -> Option<Result<(), WriteError>> {
        let r = if seg.is_copy() {
            self.copy_local(f, fd, seg, &mut Vec::new())
        } else if seg.is_hole() {
            self.write_hole(f, fd, seg)
        } else {
            return None;
        };
        Some(match r {
            Ok(()) => self.account(f, seg, hash),
            Err(e) => self.write_failed(f, e),
        })
    }

    /// A local-copy segment: copy its range from the source file in the
    /// kernel (storage::local). Only a sink with a local bridge (the source
    /// runs in this process) takes one; from anyone else it is refused.
    pub fn copy_local(
        &self,
        f: &FileRef,
        fd: &SinkFd,
        seg: &Segment,
        scratch: &mut Vec<u8>,
    ) -> std::io::Result<()> {
        let len = seg.span();
        self.storage
            .hook
            .check(IoOp::Write, self.rel(f), seg.offset, len as usize)?;
        let Some(bridge) = &self.storage.local else {
            return Err(std::io::Error::other(
                "local-copy segment from a peer in another process",
            ));
        };
        let src = match fd.source.get() {
            Some(s) => s,
            None => {
                let s = bridge.open(seg.file_id)?;
                fd.source.get_or_init(|| s)
            }
        };
        crate::storage::local::copy_range(src, &fd.buffered, seg.offset, len, scratch)?;
        fd.written(seg.offset, len as usize);
        self.storage
            .copied_bytes
            .fetch_add(len, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// A hole segment: nothing to do in a fresh temp file (created at its
    /// size, all holes); a device, a file built from a base or a piece's
    /// shared temp file holds old bytes there, which must read as zeros
    /// (storage::volume).
    pub fn write_hole(&self, f: &FileRef, fd: &SinkFd, seg: &Segment) -> std::io::Result<()> {
        if !fd.sized && seg.offset + seg.span() == f.size {
            // Not created at its size: a hole at the end sets it.
            fd.buffered.set_len(f.size)?;
        }
        // A piece's temp file may hold an interrupted earlier attempt's
        // bytes (roles::sink::bigfile): zeroed like a base.
        if !f.is_device() && !f.has_base() && f.piece.is_none() {
            return Ok(());
        }
        self.storage
            .hook
            .check(IoOp::Write, self.rel(f), seg.offset, seg.span() as usize)?;
        crate::storage::volume::zero_range(&fd.buffered, seg.offset, seg.span())
    }

    /// Write a data segment: aligned prefix direct, tail buffered.
    pub fn write_data(
        &self,
        f: &FileRef,
        fd: &SinkFd,
        data: &[u8],
        off: u64,
    ) -> std::io::Result<()> {
        self.storage
            .hook
            .check(IoOp::Write, self.rel(f), off, data.len())?;
        let mut done = 0;
        if fd.lane {
            // No lane on this path (the sync engine waits for each write).
            self.storage.count(f.size, data.len() as u64, false);
        } else if let Some(d) = &fd.direct {
            let pre = direct_prefix(data.as_ptr() as usize, off, data.len());
            if pre > 0 {
                match pwrite_all_fd(d.as_raw_fd(), &data[..pre], off) {
                    Ok(()) => done = pre,
                    Err(e) if is_direct_refusal(&e) => {
                        let dev = fd.buffered.metadata().map(|m| m.dev()).unwrap_or(0);
                        self.storage.refusals.refuse(dev, "sink write", &e);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        crate::storage::cache::pwrite_cached(
            fd.buffered.as_raw_fd(),
            &data[done..],
            off + done as u64,
        )?;
        fd.written(off, data.len());
        Ok(())
    }

    /// A write failed: fatal errors stop the session, others fail the file.
    pub fn write_failed(&self, f: &FileRef, e: std::io::Error) -> Result<(), WriteError> {
        if is_fatal(&e) {
            return Err(self.storage_fatal(&e));
        }
        self.fail(f, format!("write error: {e}"));
        Ok(())
    }

    /// The segment is on disk (or is a hole, or was discarded): count it.
    pub fn account(&self, f: &FileRef, seg: &Segment, hash: u64) -> Result<(), WriteError> {
        if self.checksum {
            f.digest.fetch_add(hash, Ordering::AcqRel);
        }
        let span = seg.span();
        if let Some(log) = f.volume() {
            log.note(seg);
        }
        slow_write_fault();
        // A piece's resume state is its marker (roles::sink::bigfile).
        if self.resume && !self.storage.null && f.size >= self.journal_min && f.piece.is_none() {
            self.note_blocks(f, seg.file_id, seg.offset, span);
        }
        let w = f.written.fetch_add(span, Ordering::AcqRel) + span;
        self.stats.add_bytes(span);
        if w > f.want() {
            self.fail(f, "received more bytes than the file holds".into());
        } else if w == f.want() {
            self.data_complete(f)?;
        }
        Ok(())
    }

    /// Resume: count written bytes per journal block.
    pub(super) fn note_blocks(&self, f: &FileRef, id: u64, off: u64, len: u64) {
        let bs = crate::request::sync::delta_block(f.size) as u64;
        f.rare(|r| {
            let g = &mut r.jblocks;
            if g.is_empty() {
                g.resize(f.size.div_ceil(bs) as usize, 0);
            }
            let (mut o, end) = (off, off + len);
            while o < end {
                let i = (o / bs) as usize;
                let n = ((i as u64 + 1) * bs).min(end) - o;
                if let Some(c) = g.get_mut(i) {
                    *c += n as u32;
                }
                o += n;
            }
        });
        if f.flags.fetch_or(DIRTY, Ordering::AcqRel) & DIRTY == 0 {
            self.dirty.lock().unwrap().push(id);
        }
    }
}
