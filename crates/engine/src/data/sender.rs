//! Senders: drain filled buffers onto one data link each ("transmit"),
//! paced by the sink's credits (seed 004 sec. 3.2).
//!
//! The per-link sending state and the per-block send ([`StreamOut`]) are
//! shared by both send paths of seed 002 sec. 7: the queued path (this
//! file's [`run_sender`] threads drain the `filled` queue) and the inline
//! path (crate::data::inline, readers send their own blocks). Framing,
//! sealing, credit accounting and the fault hook therefore exist once.

use std::io::{IoSlice, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crossbeam_channel::{select, Receiver};
use ramsys_proto::data::{decode_credit, encode_table, table_len, CreditWindow, MAX_SEGMENTS};
use ramsys_proto::frame::{FrameHeader, FrameKind, HEADER_LEN};
use ramsys_proto::relink::SentLog;
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

/// How a data link ended: the link (kept open until the session ends) or
/// the link and the error that broke it.
pub type LinkOutcome = Result<Box<dyn Link>, (Box<dyn Link>, EngineError)>;

/// What the sending end of one link incarnation reports when it stops:
/// its stream, its epoch (crate::relink), how it ended, and the blocks it
/// sent last (so those a broken link lost can be sent again).
pub type LinkDone = (usize, u16, LinkOutcome, SentLog);

/// The sending end of one data link: its credits, its frame-head scratch
/// and its AEAD state. Owned by one thread at a time (a sender thread, or
/// whichever reader holds it on the inline path), so nothing in it is
/// locked.
pub struct StreamOut {
    /// Stream number (index of the link in the session).
    pub stream: usize,
    /// Link incarnation (0 = first; replacements take higher ones, which
    /// key the AEAD nonces; crate::relink).
    pub epoch: u16,
    link: Box<dyn Link>,
    /// The last `window + 1` blocks taken for this link: a block is
    /// recorded before its credit wait, so a block in hand when the link
    /// breaks counts as lost here.
    log: SentLog,
    credits: CreditWindow,
    /// Header and table in one buffer, allocated once per link: together
    /// they are the AEAD's associated data.
    head: Vec<u8>,
    seal: Option<StreamSeal>,
    flip: u64,
}

impl StreamOut {
    /// With `seal`, every payload is encrypted in place and followed by
    /// its tag (crate::crypto).
    pub fn new(
        stream: usize,
        epoch: u16,
        link: Box<dyn Link>,
        window: u32,
        seal: Option<StreamSeal>,
    ) -> StreamOut {
        StreamOut {
            stream,
            epoch,
            link,
            log: SentLog::new(window + 1),
            credits: CreditWindow::new(window),
            head: vec![0u8; HEADER_LEN + table_len(MAX_SEGMENTS)],
            seal,
            flip: flip_every(),
        }
    }

    /// Block until the sink has granted at least one credit.
    fn await_credit(&mut self) -> Result<(), EngineError> {
        while self.credits.available() == 0 {
            let h = read_header(&mut *self.link, 0)?.ok_or(EngineError::PeerClosed)?;
            if h.kind != FrameKind::Credit {
                return Err(ProtoError::Unexpected {
                    got: "non-credit frame",
                    state: "sender awaiting credit",
                }
                .into());
            }
            let mut b = [0u8; 4];
            std::io::Read::read_exact(&mut *self.link, &mut b)?;
            self.credits.grant(decode_credit(&b)?)?;
        }
        Ok(())
    }

    /// Send one block as a DATA frame: wait for a credit, frame it, seal
    /// it in place, write header + payload + tag with one vectored write.
    /// The buffer stays with the caller (its payload is ciphertext after a
    /// sealed send).
    pub fn send_block(&mut self, buf: &mut Buf, stats: &Stats) -> Result<(), EngineError> {
        self.log.record(&buf.segs);
        self.await_credit()?;
        self.credits.consume()?;
        let tag_len = if self.seal.is_some() { TAG_LEN } else { 0 };
        let head = &mut self.head;
        let tl = encode_table(buf.checksum, &buf.segs, &mut head[HEADER_LEN..]);
        let mut h = FrameHeader::new(
            FrameKind::Data,
            buf.segs.len() as u16,
            (tl + buf.len + tag_len) as u32,
        );
        if self.seal.is_some() {
            h.flags = FLAG_SEALED;
        }
        head[..HEADER_LEN].copy_from_slice(&h.encode());
        let len = buf.len;
        let tag = match self.seal.as_mut() {
            Some(s) => s.seal(&head[..HEADER_LEN + tl], &mut buf.space()[..len]),
            None => [0u8; TAG_LEN],
        };
        if self.flip > 0
            && len > 0
            && (SENT.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(self.flip)
        {
            buf.space()[len / 2] ^= 0x10;
        }
        write_all_vectored(
            &mut *self.link,
            &mut [
                IoSlice::new(&head[..HEADER_LEN + tl]),
                IoSlice::new(buf.data()),
                IoSlice::new(&tag[..tag_len]),
            ],
        )?;
        stats.blocks.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// End of data on this link: an END frame, flushed.
    pub fn end(&mut self) -> Result<(), EngineError> {
        send_end(&mut *self.link)?;
        self.link.flush()?;
        Ok(())
    }

    /// Give the link back with the result of its last operation, and the
    /// log of what it sent.
    pub fn finish(self, r: Result<(), EngineError>) -> LinkDone {
        let outcome = match r {
            Ok(()) => Ok(self.link),
            Err(e) => Err((self.link, e)),
        };
        (self.stream, self.epoch, outcome, self.log)
    }
}

/// Sender thread body (queued send path): drains `filled` onto `out`'s
/// link until the queue closes (then END), the link breaks, or the
/// controller closes the link (`closed` disconnects: the sink saw it
/// break first, crate::relink). Waiting on `closed` too matters when the
/// queue is idle: a sender blocked on an empty queue would otherwise never
/// notice its link is gone, and the blocks it lost would never be re-sent.
pub fn run_sender(
    mut out: StreamOut,
    filled: Receiver<Buf>,
    closed: Receiver<()>,
    pool: Arc<BufferPool>,
    abort: Arc<AtomicBool>,
    stats: Arc<Stats>,
) -> LinkDone {
    let r: Result<(), EngineError> = (|| loop {
        let mut buf = select! {
            recv(filled) -> b => match b {
                Ok(b) => b,
                Err(_) => return out.end(),
            },
            recv(closed) -> _ => return Err(EngineError::PeerClosed),
        };
        if abort.load(Ordering::Relaxed) {
            pool.put(buf);
            return Err(EngineError::local("aborted"));
        }
        let r = out.send_block(&mut buf, &stats);
        pool.put(buf);
        r?;
    })();
    out.finish(r)
}
