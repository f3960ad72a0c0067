//! Senders: drain filled buffers onto one data link each ("transmit"),
//! paced by the sink's credits (seed 004 sec. 3.2).

use std::io::{IoSlice, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_channel::Receiver;
use ramsys_proto::data::{decode_credit, encode_table, table_len, CreditWindow, MAX_SEGMENTS};
use ramsys_proto::frame::{FrameHeader, FrameKind};
use ramsys_proto::ProtoError;
use ramsys_resources::{Buf, BufferPool};

use crate::stats::Stats;
use crate::transport::Link;
use crate::wire::{read_header, send_end, write_all_vectored};
use crate::EngineError;

/// Sender thread body: returns the link (kept open until the session
/// ends) or the error that broke it.
pub fn run_sender(
    mut link: Box<dyn Link>,
    window: u32,
    filled: Receiver<Buf>,
    pool: Arc<BufferPool>,
    abort: Arc<AtomicBool>,
    stats: Arc<Stats>,
) -> Result<Box<dyn Link>, (Box<dyn Link>, EngineError)> {
    let mut credits = CreditWindow::new(window);
    // One table buffer per sender, allocated once.
    let mut table = vec![0u8; table_len(MAX_SEGMENTS)];
    let r: Result<(), EngineError> = (|| {
        while let Ok(buf) = filled.recv() {
            if abort.load(Ordering::Relaxed) {
                pool.put(buf);
                return Err(EngineError::local("aborted"));
            }
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
            let tl = encode_table(buf.checksum, &buf.segs, &mut table);
            let h = FrameHeader::new(
                FrameKind::Data,
                buf.segs.len() as u16,
                (tl + buf.len) as u32,
            )
            .encode();
            write_all_vectored(
                &mut *link,
                &mut [
                    IoSlice::new(&h),
                    IoSlice::new(&table[..tl]),
                    IoSlice::new(buf.data()),
                ],
            )?;
            stats.blocks.fetch_add(1, Ordering::Relaxed);
            pool.put(buf);
        }
        send_end(&mut *link)?;
        link.flush()?;
        Ok(())
    })();
    match r {
        Ok(()) => Ok(link),
        Err(e) => Err((link, e)),
    }
}
