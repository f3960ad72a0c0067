//! The sink's file table: where each file id goes, how much of it has
//! arrived, and its verification state.
//!
//! A file is written under a temporary name in its destination directory
//! and renamed into place only when (a) every byte has been written and
//! (b) the source's whole-file digest has arrived and matches what was
//! written. Either event may come first (data and control travel on
//! different links); whichever completes the pair finalizes the file, so
//! files appear under their final names while the transfer is still
//! running, and never half-written.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use ramsys_proto::data::Segment;

use crate::fsops::{split_parent, Root};
use crate::stats::Stats;

const DATA_DONE: u8 = 1;
const DIGEST_KNOWN: u8 = 2;
const FAILED: u8 = 4;
const FINAL: u8 = 8;
const TEMP: u8 = 16;

/// One regular file being received.
pub struct SinkFile {
    pub id: u64,
    /// Final path relative to the sink root.
    pub rel: Vec<u8>,
    pub size: u64,
    pub mode: u32,
    pub mtime: (i64, u32),
    written: AtomicU64,
    digest: AtomicU64,
    expected: AtomicU64,
    flags: AtomicU8,
    fd: Mutex<Option<File>>,
    reason: Mutex<Option<String>>,
}

/// Outcome of writing one segment.
#[derive(Debug)]
pub enum WriteError {
    /// The peer broke the protocol (unknown id, data past end of file).
    Protocol(String),
    /// The destination cannot take more (disk full, quota, read-only):
    /// the whole session stops.
    Fatal(String),
}

/// All files of a session, indexed by entry id.
pub struct FileTable {
    pub root: Arc<Root>,
    files: Vec<SinkFile>,
    /// entry id -> index in `files` (u32::MAX: not a regular file).
    by_id: Vec<u32>,
    tmp_suffix: String,
    checksum: bool,
    fsync: bool,
    stats: Arc<Stats>,
}

fn is_fatal(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EROFS)
    )
}

fn fatal_msg(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => "sink disk full (No space left on device)".into(),
        Some(libc::EDQUOT) => "sink disk quota exceeded".into(),
        Some(libc::EROFS) => "sink file system is read-only".into(),
        _ => e.to_string(),
    }
}

impl FileTable {
    pub fn new(root: Arc<Root>, session: u64, checksum: bool, fsync: bool, stats: Arc<Stats>) -> Self {
        FileTable {
            root,
            files: Vec::new(),
            by_id: Vec::new(),
            tmp_suffix: format!(".ramsys-{session:016x}.part"),
            checksum,
            fsync,
            stats,
        }
    }

    /// Register entry `id` (ids arrive in order; non-files get no slot).
    pub fn push_entry(&mut self, id: u64, file: Option<(Vec<u8>, u64, u32, (i64, u32))>) {
        debug_assert_eq!(id as usize, self.by_id.len());
        match file {
            Some((rel, size, mode, mtime)) => {
                self.by_id.push(self.files.len() as u32);
                self.files.push(SinkFile {
                    id,
                    rel,
                    size,
                    mode,
                    mtime,
                    written: AtomicU64::new(0),
                    digest: AtomicU64::new(0),
                    expected: AtomicU64::new(0),
                    flags: AtomicU8::new(0),
                    fd: Mutex::new(None),
                    reason: Mutex::new(None),
                });
            }
            None => self.by_id.push(u32::MAX),
        }
    }

    pub fn get(&self, id: u64) -> Option<&SinkFile> {
        let i = *self.by_id.get(id as usize)?;
        self.files.get(i as usize)
    }

    pub fn files(&self) -> &[SinkFile] {
        &self.files
    }

    fn tmp_name(&self, f: &SinkFile) -> Vec<u8> {
        let (_, name) = split_parent(&f.rel);
        // Keep the temp name within NAME_MAX.
        let keep = name.len().min(255 - 1 - self.tmp_suffix.len());
        let mut t = Vec::with_capacity(keep + 1 + self.tmp_suffix.len());
        t.push(b'.');
        t.extend_from_slice(&name[..keep]);
        t.extend_from_slice(self.tmp_suffix.as_bytes());
        t
    }

    /// Mark a file failed (first reason wins) and close it.
    pub fn fail(&self, f: &SinkFile, reason: String) {
        let prev = f.flags.fetch_or(FAILED, Ordering::AcqRel);
        if prev & (FAILED | FINAL) == 0 {
            *f.reason.lock().unwrap() = Some(reason);
            self.stats.failed.fetch_add(1, Ordering::Relaxed);
        }
        f.fd.lock().unwrap().take();
    }

    pub fn fail_id(&self, id: u64, reason: String) {
        if let Some(f) = self.get(id) {
            self.fail(f, reason);
        }
    }

    /// Write one received segment.
    pub fn write_segment(&self, seg: &Segment, data: &[u8], hash: u64) -> Result<(), WriteError> {
        let f = self
            .get(seg.file_id)
            .ok_or_else(|| WriteError::Protocol(format!("data for unknown file id {}", seg.file_id)))?;
        let end = seg.offset + seg.len as u64;
        if end > f.size {
            return Err(WriteError::Protocol(format!(
                "data past the end of {} ({end} > {})",
                crate::show(&f.rel),
                f.size
            )));
        }
        if f.flags.load(Ordering::Acquire) & (FAILED | FINAL) != 0 {
            return Ok(());
        }
        let raw = {
            let mut g = f.fd.lock().unwrap();
            if g.is_none() {
                if f.flags.load(Ordering::Acquire) & (TEMP | FAILED) != 0 {
                    // Closed after completion or failure: nothing to write.
                    return Ok(());
                }
                let (parent, _) = split_parent(&f.rel);
                match self.root.create_temp(parent, &self.tmp_name(f)) {
                    Ok(file) => {
                        f.flags.fetch_or(TEMP, Ordering::AcqRel);
                        *g = Some(file);
                    }
                    Err(e) if is_fatal(&e) => return Err(WriteError::Fatal(fatal_msg(&e))),
                    Err(e) => {
                        drop(g);
                        self.fail(f, format!("cannot create: {e}"));
                        return Ok(());
                    }
                }
            }
            g.as_ref().unwrap().as_raw_fd()
        };
        // The fd stays open until this file's last byte is counted below,
        // so writing through the raw fd outside the lock is safe.
        if let Err(e) = pwrite_raw(raw, data, seg.offset) {
            if is_fatal(&e) {
                return Err(WriteError::Fatal(fatal_msg(&e)));
            }
            self.fail(f, format!("write error: {e}"));
            return Ok(());
        }
        if self.checksum {
            f.digest.fetch_add(hash, Ordering::AcqRel);
        }
        let w = f.written.fetch_add(seg.len as u64, Ordering::AcqRel) + seg.len as u64;
        self.stats.add_bytes(seg.len as u64);
        if w > f.size {
            self.fail(f, "received more bytes than the file holds".into());
        } else if w == f.size {
            self.data_complete(f)?;
        }
        Ok(())
    }

    fn data_complete(&self, f: &SinkFile) -> Result<(), WriteError> {
        if let Some(file) = f.fd.lock().unwrap().take() {
            if self.fsync {
                if let Err(e) = file.sync_all() {
                    if is_fatal(&e) {
                        return Err(WriteError::Fatal(fatal_msg(&e)));
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
        let f = self
            .get(id)
            .ok_or_else(|| WriteError::Protocol(format!("digest for unknown file id {id}")))?;
        f.expected.store(digest, Ordering::Release);
        if f.size == 0 {
            // No payload will come: create the empty file now.
            let (parent, _) = split_parent(&f.rel);
            match self.root.create_temp(parent, &self.tmp_name(f)) {
                Ok(_) => {
                    f.flags.fetch_or(TEMP | DATA_DONE, Ordering::AcqRel);
                }
                Err(e) if is_fatal(&e) => return Err(WriteError::Fatal(fatal_msg(&e))),
                Err(e) => {
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

    fn finalize(&self, f: &SinkFile) {
        if f.flags.load(Ordering::Acquire) & FAILED != 0 {
            return;
        }
        if self.checksum && f.digest.load(Ordering::Acquire) != f.expected.load(Ordering::Acquire) {
            self.fail(f, "checksum mismatch: file corrupted in transit".into());
            return;
        }
        let (parent, name) = split_parent(&f.rel);
        match self.root.finalize(parent, &self.tmp_name(f), name, f.mode, f.mtime) {
            Ok(()) => {
                f.flags.fetch_or(FINAL, Ordering::AcqRel);
                self.stats.files.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => self.fail(f, format!("cannot rename into place: {e}")),
        }
    }

    /// Whether a file made it to its final name.
    pub fn is_final(&self, f: &SinkFile) -> bool {
        f.flags.load(Ordering::Acquire) & FINAL != 0
    }

    /// After the transfer: fail what is incomplete, remove every temp file
    /// left, and list failures as (path, reason).
    pub fn finish(&self) -> Vec<(Vec<u8>, String)> {
        let mut out = Vec::new();
        for f in &self.files {
            let fl = f.flags.load(Ordering::Acquire);
            if fl & FINAL != 0 {
                continue;
            }
            if fl & FAILED == 0 {
                let w = f.written.load(Ordering::Acquire);
                let why = if w < f.size {
                    format!("incomplete: received {w} of {} bytes", f.size)
                } else {
                    "source never confirmed the file".into()
                };
                self.fail(f, why);
            }
            f.fd.lock().unwrap().take();
            if f.flags.load(Ordering::Acquire) & TEMP != 0 {
                let (parent, _) = split_parent(&f.rel);
                let _ = self.root.unlink(parent, &self.tmp_name(f));
            }
            let reason = f.reason.lock().unwrap().clone().unwrap_or_default();
            out.push((f.rel.clone(), reason));
        }
        out
    }
}

fn pwrite_raw(fd: i32, mut buf: &[u8], mut off: u64) -> std::io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: fd is open for writing; buf is a valid slice.
        let n = unsafe { libc::pwrite(fd, buf.as_ptr() as *const libc::c_void, buf.len(), off as libc::off_t) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::WriteZero, "short write"));
        }
        buf = &buf[n as usize..];
        off += n as u64;
    }
    Ok(())
}
