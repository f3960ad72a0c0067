//! Receivers: read blocks from one data link each into free buffers.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Sender;
use ramsys_proto::data::{decode_table, hash_block, table_len, MAX_SEGMENTS};
use ramsys_proto::frame::{FrameHeader, FrameKind, HEADER_LEN};
use ramsys_proto::ProtoError;
use ramsys_resources::{Buf, BufferPool};

use crate::transport::crypto::{StreamSeal, FLAG_SEALED, TAG_LEN};
use crate::transport::wire::read_header;
use crate::transport::Link;
use crate::types::error::EngineError;
use crate::types::stats::Stats;

/// What a receiver reports besides blocks.
#[derive(Debug)]
pub enum ReceiverEvent {
    /// A block failed its checksum or authentication; its segments (as
    /// its table says) must be sent again.
    Corrupt {
        stream: u16,
        segs: Vec<ramsys_proto::data::Segment>,
    },
}

/// Receiver thread body. `granted` counts credits the writers have handed
/// out on this stream (incremented before the credit is sent). With
/// `seal`, every block must be sealed; it is authenticated and decrypted in
/// place in its buffer (crate::transport::crypto). `accepted` counts the blocks
/// handed on whole: what the sink reports if the link breaks
/// (Control::Lost, crate::session::relink).
#[allow(clippy::too_many_arguments)]
pub fn run_receiver(
    stream: u16,
    mut link: Box<dyn Link>,
    block_size: usize,
    checksum: bool,
    pool: Arc<BufferPool>,
    received: Sender<Buf>,
    events: Sender<ReceiverEvent>,
    granted: Arc<AtomicU64>,
    abort: Arc<AtomicBool>,
    stats: Arc<Stats>,
    seal: Option<StreamSeal>,
    accepted: &mut u64,
) -> Result<(), EngineError> {
    let mut f = Frames::new(stream, block_size, seal);
    loop {
        let Some((h, nseg)) = f.next(&mut *link, &granted, &abort)? else {
            return Ok(());
        };
        let (mut buf, declared) = f.read_block(&mut *link, &h, nseg, &pool)?;
        if !f.verify(&mut buf, nseg, declared, checksum, &stats) {
            let _ = events.send(ReceiverEvent::Corrupt {
                stream,
                segs: buf.segs.clone(),
            });
            // Hand the buffer on empty, so its credit returns as usual.
            buf.segs.clear();
            buf.hashes.clear();
            buf.len = 0;
        }
        stats.blocks.fetch_add(1, Ordering::Relaxed);
        if received.send(buf).is_err() {
            return Err(EngineError::local("writers stopped"));
        }
        *accepted += 1;
    }
}

/// One receiver's frame, table and seal state, kept across blocks so
/// nothing is allocated per block.
struct Frames {
    stream: u16,
    block_size: usize,
    seal: Option<StreamSeal>,
    tag_len: usize,
    max_body: u32,
    /// Header and table, kept together: the AEAD's associated data.
    head: Vec<u8>,
    tag: [u8; TAG_LEN],
    /// Blocks read so far: never more than the credits granted.
    count: u64,
}

impl Frames {
    fn new(stream: u16, block_size: usize, seal: Option<StreamSeal>) -> Frames {
        let tag_len = if seal.is_some() { TAG_LEN } else { 0 };
        Frames {
            stream,
            block_size,
            max_body: (table_len(MAX_SEGMENTS) + block_size + tag_len) as u32,
            seal,
            tag_len,
            head: vec![0u8; HEADER_LEN + table_len(MAX_SEGMENTS)],
            tag: [0u8; TAG_LEN],
            count: 0,
        }
    }

    /// The next data block's header and segment count, checked against
    /// the credits granted and the session's sealing; None at End.
    fn next(
        &mut self,
        link: &mut dyn Link,
        granted: &AtomicU64,
        abort: &AtomicBool,
    ) -> Result<Option<(FrameHeader, usize)>, EngineError> {
        let h = match read_header(link, self.max_body)? {
            Some(h) => h,
            None if abort.load(Ordering::Relaxed) => return Err(EngineError::local("aborted")),
            None => return Err(EngineError::PeerClosed),
        };
        match h.kind {
            FrameKind::End => return Ok(None),
            FrameKind::Data => {}
            _ => {
                return Err(ProtoError::Unexpected {
                    got: "non-data frame",
                    state: "receiver",
                }
                .into())
            }
        }
        self.count += 1;
        if self.count > granted.load(Ordering::Acquire) {
            let stream = self.stream;
            return Err(
                ProtoError::Credit(format!("stream {stream}: block sent without credit")).into(),
            );
        }
        if (h.flags & FLAG_SEALED != 0) != self.seal.is_some() {
            return Err(ProtoError::Malformed {
                what: "data block",
                detail: if self.seal.is_some() {
                    "unencrypted block in an encrypted session".into()
                } else {
                    "encrypted block in a session without encryption".into()
                },
            }
            .into());
        }
        let nseg = h.aux as usize;
        if nseg == 0 || nseg > MAX_SEGMENTS || table_len(nseg) + self.tag_len > h.len as usize {
            return Err(ProtoError::Malformed {
                what: "data block",
                detail: format!("segment count {nseg}"),
            }
            .into());
        }
        Ok(Some((h, nseg)))
    }

    /// Read the block's table, payload and tag into a free buffer; returns
    /// it with the checksum its table declares. On error the buffer goes
    /// back to the pool.
    fn read_block(
        &mut self,
        link: &mut dyn Link,
        h: &FrameHeader,
        nseg: usize,
        pool: &BufferPool,
    ) -> Result<(Buf, u64), EngineError> {
        let tl = table_len(nseg);
        self.head[..HEADER_LEN].copy_from_slice(&h.encode());
        link.read_exact(&mut self.head[HEADER_LEN..HEADER_LEN + tl])?;
        let table = &self.head[HEADER_LEN..HEADER_LEN + tl];
        // Credits guarantee a free buffer; the timeout only guards bugs.
        let mut buf = pool
            .get_timeout(Duration::from_secs(30))
            .ok_or_else(|| EngineError::local("no free buffer despite credit"))?;
        let body = h.len as usize - self.tag_len;
        let read = decode_table(table, nseg, body, self.block_size, &mut buf.segs)
            .map_err(EngineError::from)
            .and_then(|(declared, plen)| {
                link.read_exact(&mut buf.space()[..plen])?;
                link.read_exact(&mut self.tag[..self.tag_len])?;
                Ok((declared, plen))
            });
        match read {
            Ok((declared, plen)) => {
                buf.len = plen;
                buf.stream = self.stream;
                Ok((buf, declared))
            }
            Err(e) => {
                pool.put(buf);
                Err(e)
            }
        }
    }

    /// Is the block authentic (decrypted in place when sealed) and, with
    /// `checksum`, whole? A failure counts as a checksum error, whatever
    /// caught it, for the daemon's metrics.
    fn verify(
        &mut self,
        buf: &mut Buf,
        nseg: usize,
        declared: u64,
        checksum: bool,
        stats: &Stats,
    ) -> bool {
        let plen = buf.len;
        let aad = &self.head[..HEADER_LEN + table_len(nseg)];
        let authentic = match self.seal.as_mut() {
            Some(s) => s.open(aad, &mut buf.space()[..plen], &self.tag).is_ok(),
            None => true,
        };
        if !authentic {
            stats.auth_failures.fetch_add(1, Ordering::Relaxed);
            stats.checksum_errors.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        if checksum {
            buf.hashes.resize(nseg, 0);
            let (payload, segs, hashes) = buf.parts_mut();
            if hash_block(segs, payload, hashes) != declared {
                stats.checksum_errors.fetch_add(1, Ordering::Relaxed);
                return false;
            }
        }
        true
    }
}
