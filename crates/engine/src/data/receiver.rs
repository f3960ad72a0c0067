//! Receivers: read blocks from one data link each into free buffers.

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Sender;
use ramsys_proto::data::{decode_table, hash_block, table_len, MAX_SEGMENTS};
use ramsys_proto::frame::{FrameKind, HEADER_LEN};
use ramsys_proto::ProtoError;
use ramsys_resources::{Buf, BufferPool};

use crate::crypto::{StreamSeal, FLAG_SEALED, TAG_LEN};
use crate::stats::Stats;
use crate::transport::Link;
use crate::wire::read_header;
use crate::EngineError;

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
/// place in its buffer (crate::crypto). `accepted` counts the blocks
/// handed on whole: what the sink reports if the link breaks
/// (Control::Lost, crate::relink). Long (issue 16 allows it with a
/// reason): the per-block loop of one receiver thread, its frame, table
/// and seal state in locals so nothing is allocated per block.
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
    mut seal: Option<StreamSeal>,
    accepted: &mut u64,
) -> Result<(), EngineError> {
    let tag_len = if seal.is_some() { TAG_LEN } else { 0 };
    let max_body = (table_len(MAX_SEGMENTS) + block_size + tag_len) as u32;
    // Header and table, kept together: the AEAD's associated data.
    let mut head = vec![0u8; HEADER_LEN + table_len(MAX_SEGMENTS)];
    let mut tag = [0u8; TAG_LEN];
    let mut count: u64 = 0;
    loop {
        let h = match read_header(&mut *link, max_body)? {
            Some(h) => h,
            None => {
                if abort.load(Ordering::Relaxed) {
                    return Err(EngineError::local("aborted"));
                }
                return Err(EngineError::PeerClosed);
            }
        };
        match h.kind {
            FrameKind::End => return Ok(()),
            FrameKind::Data => {}
            _ => {
                return Err(ProtoError::Unexpected {
                    got: "non-data frame",
                    state: "receiver",
                }
                .into())
            }
        }
        count += 1;
        if count > granted.load(Ordering::Acquire) {
            return Err(
                ProtoError::Credit(format!("stream {stream}: block sent without credit")).into(),
            );
        }
        if (h.flags & FLAG_SEALED != 0) != seal.is_some() {
            return Err(ProtoError::Malformed {
                what: "data block",
                detail: if seal.is_some() {
                    "unencrypted block in an encrypted session".into()
                } else {
                    "encrypted block in a session without encryption".into()
                },
            }
            .into());
        }
        let nseg = h.aux as usize;
        let tl = table_len(nseg);
        if nseg == 0 || nseg > MAX_SEGMENTS || tl + tag_len > h.len as usize {
            return Err(ProtoError::Malformed {
                what: "data block",
                detail: format!("segment count {nseg}"),
            }
            .into());
        }
        head[..HEADER_LEN].copy_from_slice(&h.encode());
        link.read_exact(&mut head[HEADER_LEN..HEADER_LEN + tl])?;
        let table = &head[HEADER_LEN..HEADER_LEN + tl];
        // Credits guarantee a free buffer; the timeout only guards bugs.
        let mut buf = pool
            .get_timeout(Duration::from_secs(30))
            .ok_or_else(|| EngineError::local("no free buffer despite credit"))?;
        let (declared, plen) = match decode_table(
            table,
            nseg,
            h.len as usize - tag_len,
            block_size,
            &mut buf.segs,
        ) {
            Ok(v) => v,
            Err(e) => {
                pool.put(buf);
                return Err(e.into());
            }
        };
        if let Err(e) = link.read_exact(&mut buf.space()[..plen]) {
            pool.put(buf);
            return Err(e.into());
        }
        if let Err(e) = link.read_exact(&mut tag[..tag_len]) {
            pool.put(buf);
            return Err(e.into());
        }
        buf.len = plen;
        buf.stream = stream;
        let authentic = match seal.as_mut() {
            Some(s) => s
                .open(&head[..HEADER_LEN + tl], &mut buf.space()[..plen], &tag)
                .is_ok(),
            None => true,
        };
        if !authentic {
            // Counted with checksum errors too: daemon metrics report
            // blocks that failed verification, whatever caught them.
            stats.auth_failures.fetch_add(1, Ordering::Relaxed);
            stats.checksum_errors.fetch_add(1, Ordering::Relaxed);
            let _ = events.send(ReceiverEvent::Corrupt {
                stream,
                segs: buf.segs.clone(),
            });
            buf.segs.clear();
            buf.hashes.clear();
            buf.len = 0;
        } else if checksum {
            buf.hashes.resize(nseg, 0);
            let (payload, segs, hashes) = buf.parts_mut();
            let got = hash_block(segs, payload, hashes);
            if got != declared {
                stats.checksum_errors.fetch_add(1, Ordering::Relaxed);
                let _ = events.send(ReceiverEvent::Corrupt {
                    stream,
                    segs: buf.segs.clone(),
                });
                // Hand the buffer on empty, so its credit returns as usual.
                buf.segs.clear();
                buf.hashes.clear();
                buf.len = 0;
            }
        }
        stats.blocks.fetch_add(1, Ordering::Relaxed);
        if received.send(buf).is_err() {
            return Err(EngineError::local("writers stopped"));
        }
        *accepted += 1;
    }
}
