//! Senders: drain filled buffers onto one data link each ("transmit"),
//! paced by the sink's credits (seed 004 sec. 3.2).

use std::io::{IoSlice, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crossbeam_channel::Receiver;
use ramsys_proto::data::{decode_credit, encode_table, table_len, CreditWindow, MAX_SEGMENTS};
use ramsys_proto::frame::{FrameHeader, FrameKind, HEADER_LEN};
use ramsys_proto::ProtoError;
use ramsys_resources::{Buf, BufferPool};

use crate::crypto::{StreamSeal, FLAG_SEALED, TAG_LEN};
use crate::stats::Stats;
use crate::transport::Link;
use crate::wire::{read_header, send_end, write_all_vectored};
use crate::EngineError;

/// Fault injection (tests, docs/SECURITY.md): `RAMSYS_FAULT_FLIP_EVERY=N`
/// flips one payload bit of every Nth block this process sends, after it
/// is checksummed and sealed, as a bad NIC or switch would. Read once.
fn flip_every() -> u64 {
    static N: OnceLock<u64> = OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("RAMSYS_FAULT_FLIP_EVERY")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    })
}
static SENT: AtomicU64 = AtomicU64::new(0);

/// Sender thread body: returns the link (kept open until the session
/// ends) or the error that broke it. With `seal`, every payload is
/// encrypted in place and followed by its tag (crate::crypto). Every block
/// is recorded in `log` (window + 1 entries) before it is written, so the blocks a broken link
/// lost can be sent again (crate::relink).
#[allow(clippy::too_many_arguments)]
pub fn run_sender(
    mut link: Box<dyn Link>,
    window: u32,
    filled: Receiver<Buf>,
    pool: Arc<BufferPool>,
    abort: Arc<AtomicBool>,
    stats: Arc<Stats>,
    mut seal: Option<StreamSeal>,
    log: &mut ramsys_proto::relink::SentLog,
) -> Result<Box<dyn Link>, (Box<dyn Link>, EngineError)> {
    let mut credits = CreditWindow::new(window);
    // Header and table in one buffer per sender, allocated once: together
    // they are the AEAD's associated data.
    let mut head = vec![0u8; HEADER_LEN + table_len(MAX_SEGMENTS)];
    let tag_len = if seal.is_some() { TAG_LEN } else { 0 };
    let flip = flip_every();
    // The block being sent: back to the pool if the link breaks under it.
    let mut in_hand: Option<Buf> = None;
    let r: Result<(), EngineError> = (|| {
        while let Ok(buf) = filled.recv() {
            if abort.load(Ordering::Relaxed) {
                pool.put(buf);
                return Err(EngineError::local("aborted"));
            }
            // Logged as soon as taken: if the link breaks while we wait
            // for credit, the block still counts as lost here.
            log.record(&buf.segs);
            let buf = in_hand.insert(buf);
            while credits.available() == 0 {
                let h = read_header(&mut *link, 0)?.ok_or(EngineError::PeerClosed)?;
                if h.kind != FrameKind::Credit {
                    return Err(ProtoError::Unexpected {
                        got: "non-credit frame",
                        state: "sender awaiting credit",
                    }
                    .into());
                }
                let mut b = [0u8; 4];
                std::io::Read::read_exact(&mut *link, &mut b)?;
                credits.grant(decode_credit(&b)?)?;
            }
            credits.consume()?;
            let tl = encode_table(buf.checksum, &buf.segs, &mut head[HEADER_LEN..]);
            let mut h = FrameHeader::new(
                FrameKind::Data,
                buf.segs.len() as u16,
                (tl + buf.len + tag_len) as u32,
            );
            if seal.is_some() {
                h.flags = FLAG_SEALED;
            }
            head[..HEADER_LEN].copy_from_slice(&h.encode());
            let len = buf.len;
            let tag = match seal.as_mut() {
                Some(s) => s.seal(&head[..HEADER_LEN + tl], &mut buf.space()[..len]),
                None => [0u8; TAG_LEN],
            };
            if flip > 0
                && len > 0
                && (SENT.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(flip)
            {
                buf.space()[len / 2] ^= 0x10;
            }
            write_all_vectored(
                &mut *link,
                &mut [
                    IoSlice::new(&head[..HEADER_LEN + tl]),
                    IoSlice::new(buf.data()),
                    IoSlice::new(&tag[..tag_len]),
                ],
            )?;
            stats.blocks.fetch_add(1, Ordering::Relaxed);
            pool.put(in_hand.take().expect("block in hand"));
        }
        send_end(&mut *link)?;
        link.flush()?;
        Ok(())
    })();
    if let Some(b) = in_hand.take() {
        pool.put(b);
    }
    match r {
        Ok(()) => Ok(link),
        Err(e) => Err((link, e)),
    }
}
