//! Re-reading blocks the sink did not get: a block that failed its
//! checksum (Resend, docs/PROTOCOL.md) and the blocks a broken data link
//! lost (crate::session::relink). Both re-read the same segments again, with the
//! same boundaries, so block hashes and file digests come out unchanged.
//! One path for both (issue 16): how a buffer is waited for stays with the
//! caller (a resend may wait, a requeue thread polls for abort).

use std::os::unix::fs::FileExt;

use ramsys_proto::data::Segment;
use ramsys_resources::Buf;

use crate::storage::fsops::Root;
use crate::types::file::{IdIndex, SourceFile};

/// The source's files, indexed by entry id, for re-reading.
pub struct Rereader<'a> {
    root: &'a Root,
    files: &'a [SourceFile],
    by_id: IdIndex,
    checksum: bool,
    /// The null source engine produced the data: nothing to read again.
    null: bool,
}

impl<'a> Rereader<'a> {
    pub fn new(root: &'a Root, files: &'a [SourceFile], checksum: bool, null: bool) -> Self {
        let by_id = IdIndex::new(files);
        Rereader {
            root,
            files,
            by_id,
            checksum,
            null,
        }
    }

    /// The path of file `id` (for failure reports).
    pub fn path(&self, id: u64) -> String {
        self.by_id
            .get(self.files, id)
            .map(|i| crate::types::error::show(&self.files[i].rel))
            .unwrap_or_default()
    }

    /// Fill `buf` (taken from the pool by the caller) with `segs`, hashed
    /// as a reader would. On failure the buffer is left empty and the
    /// file id and reason are returned: that file fails, nothing else.
    pub fn fill(&self, buf: &mut Buf, segs: &[Segment]) -> Result<(), (u64, String)> {
        buf.segs.clear();
        buf.hashes.clear();
        let mut p = 0usize;
        for s in segs {
            match self.read_segment(buf, p, s) {
                Ok(len) => {
                    p += len;
                    buf.segs.push(*s);
                    buf.hashes.push(0);
                }
                Err(e) => {
                    buf.segs.clear();
                    buf.hashes.clear();
                    buf.len = 0;
                    return Err((s.file_id, e));
                }
            }
        }
        buf.len = p;
        buf.checksum = if self.checksum {
            let (payload, segs, hashes) = buf.parts_mut();
            ramsys_proto::data::hash_block(segs, payload, hashes)
        } else {
            0
        };
        Ok(())
    }

    /// Read one segment's payload at `p` in `buf`; its payload length.
    fn read_segment(&self, buf: &mut Buf, p: usize, s: &Segment) -> Result<usize, String> {
        let f = self
            .by_id
            .get(self.files, s.file_id)
            .map(|i| &self.files[i])
            .ok_or("the sink asked for an unknown file")?;
        let len = s.payload_len();
        if s.offset.saturating_add(s.span()) > f.size || p + len > buf.space().len() {
            return Err("the sink asked for a range outside the file".into());
        }
        if len > 0 {
            if self.null {
                return Err("cannot re-send from the null source engine".into());
            }
            let file = self
                .root
                .open_read(&f.rel, false)
                .map_err(|e| format!("cannot re-read: {e}"))?;
            // Changed since the scan (the first read, or for a zero-copy
            // block the send from the page cache, saw other bytes): say so,
            // rather than let the digest fail as corruption in transit.
            if !f.volume && !unchanged(&file, f) {
                return Err("file changed while being read".into());
            }
            file.read_exact_at(&mut buf.space()[p..p + len], s.offset)
                .map_err(|e| format!("cannot re-read: {e}"))?;
        }
        Ok(len)
    }
}

/// Size and mtime as the scan saw them (a failed stat counts as changed).
fn unchanged(file: &std::fs::File, f: &SourceFile) -> bool {
    use std::os::unix::fs::MetadataExt;
    file.metadata()
        .is_ok_and(|m| m.len() == f.size && (m.mtime(), m.mtime_nsec() as u32) == f.mtime)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::fsops::Confinement;
    use ramsys_resources::BufferPool;

    fn file(id: u64, rel: &str, size: u64) -> SourceFile {
        SourceFile {
            id,
            rel: crate::types::file::Rel::new(rel.as_bytes()),
            size,
            dev: 0,
            ino: 0,
            mtime: (0, 0),
            volume: false,
            sparse: false,
            range: None,
        }
    }

    #[test]
    fn rereads_segments_with_their_boundaries_and_refuses_the_rest() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a"), b"0123456789").unwrap();
        let root = Root::open(d.path(), Confinement::Strict).unwrap();
        let mut files = [file(7, "a", 10)];
        let md = std::fs::metadata(d.path().join("a")).unwrap();
        use std::os::unix::fs::MetadataExt;
        files[0].mtime = (md.mtime(), md.mtime_nsec() as u32);
        let pool = BufferPool::allocate(4, 4096).unwrap();
        let rr = Rereader::new(&root, &files, true, false);
        let mut buf = pool.get();
        let segs = [
            Segment {
                file_id: 7,
                offset: 2,
                len: 3,
            },
            Segment {
                file_id: 7,
                offset: 8,
                len: 2,
            },
        ];
        rr.fill(&mut buf, &segs).unwrap();
        assert_eq!(buf.data(), b"23489");
        assert_eq!(buf.segs.len(), 2);
        assert_ne!(buf.checksum, 0);
        assert_eq!(rr.path(7), "a");
        // Outside the file, an unknown id, the null engine: that file fails.
        let e = rr
            .fill(
                &mut buf,
                &[Segment {
                    file_id: 7,
                    offset: 9,
                    len: 2,
                }],
            )
            .unwrap_err();
        assert_eq!(e.0, 7);
        assert!(e.1.contains("outside"), "{e:?}");
        assert!(buf.segs.is_empty() && buf.len == 0);
        let e = rr
            .fill(
                &mut buf,
                &[Segment {
                    file_id: 8,
                    offset: 0,
                    len: 1,
                }],
            )
            .unwrap_err();
        assert!(e.1.contains("unknown file"), "{e:?}");
        let null = Rereader::new(&root, &files, true, true);
        let e = null.fill(&mut buf, &segs).unwrap_err();
        assert!(e.1.contains("null"), "{e:?}");
        // Changed since the scan (same size, other mtime): that file fails
        // as changed, not as corrupted in transit.
        files[0].mtime.0 -= 10;
        let rr = Rereader::new(&root, &files, true, false);
        let e = rr.fill(&mut buf, &segs).unwrap_err();
        assert_eq!(e, (7, "file changed while being read".to_string()));
        pool.put(buf);
    }
}
