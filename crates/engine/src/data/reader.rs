//! Readers: fill buffers from files (the "load" stage).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_channel::Sender;
use ramsys_proto::data::{segment_hash, Segment, MAX_SEGMENTS};
use ramsys_resources::{Buf, BufferPool};

use crate::fsops::{pread_full, Root};
use crate::request::tasks::{DeviceQueue, ReadUnit};
use crate::request::walk::SourceFile;
use crate::stats::Stats;

/// Progress of one source file across readers.
#[derive(Debug)]
pub struct SrcFileState {
    /// Bytes still to read; the reader that takes it to zero reports it.
    pub remaining: AtomicU64,
    /// Sum of segment hashes read so far.
    pub digest: AtomicU64,
    pub failed: AtomicBool,
}

/// What readers tell the source controller.
#[derive(Debug)]
pub enum ReaderEvent {
    FileDone { id: u64, digest: u64 },
    FileFailed { id: u64, path: String, reason: String },
}

/// Everything a reader needs, shared by all readers of a session.
pub struct ReaderCtx {
    pub root: Arc<Root>,
    pub files: Arc<Vec<SourceFile>>,
    pub state: Arc<Vec<SrcFileState>>,
    pub queues: Arc<Vec<DeviceQueue>>,
    pub pool: Arc<BufferPool>,
    pub filled: Sender<Buf>,
    pub events: Sender<ReaderEvent>,
    pub checksum: bool,
    pub abort: Arc<AtomicBool>,
    pub stats: Arc<Stats>,
    /// Payload bytes per block (≤ buffer capacity).
    pub block_size: usize,
}

impl ReaderCtx {
    fn next_unit(&self, home: usize) -> Option<ReadUnit> {
        let n = self.queues.len();
        (0..n).find_map(|k| self.queues[(home + k) % n].pop())
    }

    fn fail(&self, idx: usize, reason: String) {
        let st = &self.state[idx];
        if !st.failed.swap(true, Ordering::AcqRel) {
            let f = &self.files[idx];
            let _ = self.events.send(ReaderEvent::FileFailed {
                id: f.id,
                path: crate::show(&f.rel),
                reason,
            });
        }
    }
}

/// Reader thread body. `home` is the index of its device queue.
pub fn run_reader(ctx: &ReaderCtx, home: usize) {
    let mut cur: Option<Buf> = None;
    let mut open: Option<(u32, std::fs::File)> = None;
    while let Some(u) = ctx.next_unit(home) {
        if ctx.abort.load(Ordering::Relaxed) {
            break;
        }
        let idx = u.file as usize;
        if ctx.state[idx].failed.load(Ordering::Acquire) {
            continue;
        }
        let f = &ctx.files[idx];
        if open.as_ref().map(|(i, _)| *i) != Some(u.file) {
            open = match ctx.root.open_read(&f.rel, false) {
                Ok(fd) => Some((u.file, fd)),
                Err(e) => {
                    ctx.fail(idx, format!("cannot open: {e}"));
                    continue;
                }
            };
        }
        let fd = &open.as_ref().unwrap().1;
        let mut off = u.offset;
        let end = u.offset + u.len;
        let mut ok = true;
        while off < end {
            let mut buf = cur.take().unwrap_or_else(|| ctx.pool.get());
            let room = ctx.block_size - buf.len;
            if room == 0 || buf.segs.len() == MAX_SEGMENTS {
                if ctx.filled.send(buf).is_err() {
                    return;
                }
                continue;
            }
            let want = room.min((end - off) as usize);
            let start = buf.len;
            let n = match pread_full(fd, &mut buf.space()[start..start + want], off) {
                Ok(n) => n,
                Err(e) => {
                    cur = Some(buf);
                    ctx.fail(idx, format!("read error at offset {off}: {e}"));
                    ok = false;
                    break;
                }
            };
            if n < want {
                cur = Some(buf);
                ctx.fail(
                    idx,
                    format!(
                        "file shrank while being read (expected {} bytes, ended at {})",
                        f.size,
                        off + n as u64
                    ),
                );
                ok = false;
                break;
            }
            let seg = Segment {
                file_id: f.id,
                offset: off,
                len: n as u32,
            };
            if ctx.checksum {
                let h = segment_hash(f.id, off, &buf.space()[start..start + n]);
                buf.hashes.push(h);
                buf.checksum = buf.checksum.wrapping_add(h);
                ctx.state[idx].digest.fetch_add(h, Ordering::AcqRel);
            }
            buf.segs.push(seg);
            buf.len += n;
            off += n as u64;
            ctx.stats.add_bytes(n as u64);
            if buf.len == ctx.block_size || buf.segs.len() == MAX_SEGMENTS {
                if ctx.filled.send(buf).is_err() {
                    return;
                }
            } else {
                cur = Some(buf);
            }
        }
        if !ok {
            continue;
        }
        let st = &ctx.state[idx];
        if st.remaining.fetch_sub(u.len, Ordering::AcqRel) == u.len {
            // Last piece of the file: check it did not change under us.
            match fd.metadata() {
                Ok(md) => {
                    use std::os::unix::fs::MetadataExt;
                    if md.len() != f.size || (md.mtime(), md.mtime_nsec() as u32) != f.mtime {
                        ctx.fail(idx, "file changed while being read".into());
                        continue;
                    }
                }
                Err(e) => {
                    ctx.fail(idx, format!("cannot stat: {e}"));
                    continue;
                }
            }
            if !st.failed.load(Ordering::Acquire) {
                let _ = ctx.events.send(ReaderEvent::FileDone {
                    id: f.id,
                    digest: st.digest.load(Ordering::Acquire),
                });
            }
        }
    }
    if let Some(b) = cur {
        if b.len > 0 {
            let _ = ctx.filled.send(b);
        } else {
            ctx.pool.put(b);
        }
    }
}
