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
use ramsys_proto::frame::{
    FrameHeader, FrameKind, CREDIT_SEALED_FLAG, CREDIT_SEALED_LEN, HEADER_LEN,
};
use ramsys_proto::relink::SentLog;
use ramsys_proto::ProtoError;
use ramsys_resources::{Buf, BufferPool};

use crate::transport::crypto::{StreamSeal, FLAG_SEALED, TAG_LEN};
use crate::transport::wire::{read_header, send_end, write_all_vectored};
use crate::transport::Link;
use crate::types::error::EngineError;
use crate::types::stats::Stats;

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
/// Whether the fault hook flips payload bits (zero-copy blocks have none
/// in memory to flip, so such a session keeps them in buffers).
pub fn flips_bits() -> bool {
    flip_every() > 0
}

static SENT: AtomicU64 = AtomicU64::new(0);

/// How a data link ended: the link (kept open until the session ends) or
/// the link and the error that broke it.
pub type LinkOutcome = Result<Box<dyn Link>, (Box<dyn Link>, EngineError)>;

/// What the sending end of one link incarnation reports when it stops:
/// its stream, its epoch (crate::session::relink), how it ended, and the blocks it
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
    /// key the AEAD nonces; crate::session::relink).
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
    /// Sealed sessions: checks the tag of every CREDIT (a forged, replayed
    /// or altered credit fails the session; crypto::StreamSeal::credits).
    credit_open: Option<StreamSeal>,
    /// Rate limits this link draws from (data::rate; shared with the
    /// session's other links and, for daemon/user limits, other sessions).
    rate: crate::data::rate::Limits,
    flip: u64,
    /// The link takes zero-copy blocks (Link::can_send_file), asked once.
    send_file: bool,
}

impl StreamOut {
    /// With `seal`, every payload is encrypted in place and followed by
    /// its tag (crate::transport::crypto).
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
            log: SentLog::new(window + 1),
            credits: CreditWindow::new(window),
            head: vec![0u8; HEADER_LEN + table_len(MAX_SEGMENTS)],
            seal,
            credit_open: None,
            rate: Default::default(),
            flip: flip_every(),
            send_file: link.can_send_file(),
            link,
        }
    }

    /// Require sealed CREDIT frames checked with `open` (None: plain).
    pub fn with_credit_seal(mut self, open: Option<StreamSeal>) -> StreamOut {
        self.credit_open = open;
        self
    }

    /// Draw every block's bytes from `rate` before sending it.
    pub fn with_rate(mut self, rate: crate::data::rate::Limits) -> StreamOut {
        self.rate = rate;
        self
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
            // Sealed and plain credits never mix on one link: a plain one
            // on a sealed session would be the unauthenticated kind.
            let sealed = h.flags == CREDIT_SEALED_FLAG;
            if sealed != self.credit_open.is_some() {
                return Err(ProtoError::Credit(if sealed {
                    "sealed credit on a plain link".into()
                } else {
                    "unsealed credit on an encrypted link".into()
                })
                .into());
            }
            let mut b = [0u8; CREDIT_SEALED_LEN as usize];
            let len = h.len as usize;
            std::io::Read::read_exact(&mut *self.link, &mut b[..len])?;
            if let Some(open) = self.credit_open.as_mut() {
                let mut aad = [0u8; HEADER_LEN + 4];
                aad[..HEADER_LEN].copy_from_slice(&h.encode());
                aad[HEADER_LEN..].copy_from_slice(&b[..4]);
                let tag: [u8; TAG_LEN] = b[4..len].try_into().expect("20-byte body");
                open.open(&aad, &mut [], &tag)
                    .map_err(|_| ProtoError::Credit("credit frame failed authentication".into()))?;
            }
            self.credits.grant(decode_credit(&b[..4])?)?;
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
        // Paced after the credit: the sink's pace and the rate limit both
        // hold, and a block waiting for the bucket already has its slot.
        self.rate.pace(buf.len as u64);
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
        if !buf.files.is_empty() {
            if self.send_file && self.seal.is_none() && self.flip == 0 {
                // Payload order: the buffer's own bytes before each file
                // piece go out with it (MSG_MORE), the piece by sendfile,
                // whatever follows the last piece by a plain write.
                let data = buf.data();
                let mut head: &[u8] = &head[..HEADER_LEN + tl];
                let mut pos = 0;
                for r in &buf.files {
                    let sent =
                        self.link
                            .send_file(&[head, &data[pos..r.at]], &r.file, r.off, r.len)?;
                    if sent < r.len {
                        // The file was cut short after the reader hashed
                        // it: finish its piece with zeros, so the stream
                        // stays in step and the sink's check fails the
                        // block (its re-read then reports the file).
                        pad_zeros(&mut *self.link, r.len - sent)?;
                    }
                    head = &[];
                    pos = r.at + r.len;
                }
                if pos < len {
                    self.link.write_all(&data[pos..len])?;
                }
                stats.blocks.fetch_add(1, Ordering::Relaxed);
                stats.zerocopy_blocks.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            // A link that needs the payload in memory: read it in.
            materialize(buf)?;
        }
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

/// Read a zero-copy block's payload into its buffer (a link that cannot
/// send from the file; rare: the session decides once).
fn materialize(buf: &mut Buf) -> std::io::Result<()> {
    let mut files = std::mem::take(&mut buf.files);
    let r = files.iter().try_for_each(|r| {
        let dst = &mut buf.space()[r.at..r.at + r.len];
        let n = crate::storage::fsops::pread_full(&r.file, dst, r.off)?;
        // A file cut short: zeros, which fail the sink's check.
        dst[n..].fill(0);
        Ok(())
    });
    // Keep the reserved capacity with the buffer.
    files.clear();
    buf.files = files;
    r
}

/// Write `n` zero bytes (the rest of a frame whose file ended early).
fn pad_zeros(w: &mut dyn Write, mut n: usize) -> std::io::Result<()> {
    static ZEROS: [u8; 64 << 10] = [0u8; 64 << 10];
    while n > 0 {
        let k = n.min(ZEROS.len());
        w.write_all(&ZEROS[..k])?;
        n -= k;
    }
    Ok(())
}

/// Sender thread body (queued send path): drains `filled` onto `out`'s
/// link until the queue closes (then END), the link breaks, or the
/// controller closes the link (`closed` disconnects: the sink saw it
/// break first, crate::session::relink). Waiting on `closed` too matters when the
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::crypto::Cipher;
    use crate::transport::wire::{send_credit, send_credit_sealed};
    use ramsys_proto::data::Segment;
    use ramsys_resources::{FileRange, MAX_FILE_RANGES};
    use std::net::{TcpListener, TcpStream};

    const KEY: [u8; 32] = [5u8; 32];

    fn pair() -> (Box<dyn Link>, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (Box::new(c), s)
    }

    /// A sealed source end of (stream 2, epoch 1) with no credit yet.
    fn sealed_out(l: Box<dyn Link>) -> StreamOut {
        let c = Cipher::ChaCha20Poly1305;
        StreamOut::new(2, 1, l, 8, StreamSeal::new(c, &KEY, 2, 1))
            .with_credit_seal(StreamSeal::credits(c, &KEY, 2, 1))
    }

    fn credits_of(stream: u16, epoch: u16) -> StreamSeal {
        StreamSeal::credits(Cipher::ChaCha20Poly1305, &KEY, stream, epoch).unwrap()
    }

    /// Try to send one block; the peer has written `credit` bytes first.
    fn send_after(credit: &[u8]) -> Result<(), EngineError> {
        let (l, mut peer) = pair();
        peer.write_all(credit).unwrap();
        let mut out = sealed_out(l);
        let pool = BufferPool::allocate(1, 4096).unwrap();
        let mut b = pool.get();
        b.reset();
        b.len = 10;
        b.segs.push(Segment {
            file_id: 1,
            offset: 0,
            len: 10,
        });
        let r = out.send_block(&mut b, &Stats::default());
        pool.put(b);
        r
    }

    fn sealed(n: u32, seal: &mut StreamSeal) -> Vec<u8> {
        let mut v = Vec::new();
        send_credit_sealed(&mut v, n, Some(seal)).unwrap();
        v
    }

    #[test]
    fn a_sealed_credit_of_this_link_is_accepted() {
        assert!(send_after(&sealed(4, &mut credits_of(2, 1))).is_ok());
    }

    /// Every single-bit flip of a sealed credit (header, n or tag) fails,
    /// as do a credit keyed for another stream or epoch, a replayed one
    /// and a plain one: all as protocol violations, never link losses.
    #[test]
    fn forged_altered_replayed_or_plain_credits_fail() {
        let good = sealed(4, &mut credits_of(2, 1));
        for bit in 0..good.len() * 8 {
            let mut f = good.clone();
            f[bit / 8] ^= 1 << (bit % 8);
            let e = send_after(&f).expect_err("a flipped credit was accepted");
            assert!(!crate::session::relink::is_link_loss(&e), "bit {bit}: {e}");
        }
        for (s, e) in [(3, 1), (2, 0), (2, 2)] {
            assert!(send_after(&sealed(4, &mut credits_of(s, e))).is_err());
        }
        // The second credit of a link, replayed as the first.
        let mut seal = credits_of(2, 1);
        let _first = sealed(4, &mut seal);
        assert!(send_after(&sealed(4, &mut seal)).is_err());
        let mut plain = Vec::new();
        send_credit(&mut plain, 4).unwrap();
        let e = send_after(&plain).unwrap_err();
        assert!(e.to_string().contains("unsealed credit"), "{e}");
    }

    /// Read one DATA frame (header, table, payload) off `peer`.
    fn frame(peer: &mut TcpStream) -> Vec<u8> {
        use std::io::Read;
        let mut h = [0u8; HEADER_LEN];
        peer.read_exact(&mut h).unwrap();
        let len = FrameHeader::decode(&h, u32::MAX).unwrap().len as usize;
        let mut v = h.to_vec();
        v.resize(HEADER_LEN + len, 0);
        peer.read_exact(&mut v[HEADER_LEN..]).unwrap();
        v
    }

    /// A zero-copy block is the same frame on the wire as the buffered
    /// one; a file cut short after the hash still makes a whole frame
    /// (zeros where the bytes were), so the stream stays in step and the
    /// sink's check fails the block.
    #[test]
    fn a_zero_copy_block_is_the_same_frame_and_a_short_file_is_padded() {
        let (l, mut peer) = pair();
        let mut credit = Vec::new();
        send_credit(&mut credit, 8).unwrap();
        peer.write_all(&credit).unwrap();
        let mut out = StreamOut::new(0, 0, l, 8, None);
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 13 + 1) as u8).collect();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&data).unwrap();
        let f = Arc::new(f);
        let pool = BufferPool::allocate(2, 256 << 10).unwrap();
        let seg = Segment {
            file_id: 3,
            offset: 4096,
            len: 200_000,
        };
        let block = |file: bool| {
            let mut b = pool.get();
            b.segs.push(seg);
            b.len = 200_000;
            b.checksum = 42;
            if file {
                b.files.push(FileRange {
                    file: f.clone(),
                    off: 4096,
                    at: 0,
                    len: 200_000,
                });
            } else {
                b.space()[..200_000].copy_from_slice(&data[4096..204_096]);
            }
            b
        };
        let stats = Stats::default();
        for file in [false, true] {
            let mut b = block(file);
            out.send_block(&mut b, &stats).unwrap();
            pool.put(b);
        }
        let (a, b) = (frame(&mut peer), frame(&mut peer));
        assert_eq!(a, b);
        assert_eq!(stats.zerocopy_blocks.load(Ordering::Relaxed), 1);
        // Cut the file 1000 bytes into the block: the frame keeps its
        // length, the rest is zeros.
        f.set_len(5096).unwrap();
        let mut b = block(true);
        out.send_block(&mut b, &stats).unwrap();
        pool.put(b);
        let c = frame(&mut peer);
        assert_eq!(c.len(), a.len());
        let p = c.len() - 200_000;
        assert_eq!(&c[p..p + 1000], &data[4096..5096]);
        assert!(c[p + 1000..].iter().all(|&x| x == 0));
    }

    /// A packed block mixing the buffer's own bytes with zero-copy pieces
    /// of two files (and of one file twice) is the frame the same block
    /// makes from memory; on a link that cannot send files, the pieces are
    /// read into the buffer first.
    #[test]
    fn a_packed_block_of_file_pieces_and_buffer_bytes_is_the_same_frame() {
        let (l, mut peer) = pair();
        let mut credit = Vec::new();
        send_credit(&mut credit, 8).unwrap();
        peer.write_all(&credit).unwrap();
        let mut out = StreamOut::new(0, 0, l, 8, None);
        let mk = |seed: u32| -> (Vec<u8>, Arc<std::fs::File>) {
            let d: Vec<u8> = (0..100_000u32).map(|i| (i * seed + 7) as u8).collect();
            let mut f = tempfile::tempfile().unwrap();
            f.write_all(&d).unwrap();
            (d, Arc::new(f))
        };
        let ((da, fa), (db, fb)) = (mk(13), mk(29));
        // Payload: 1000 own bytes, a[0..50000], 3000 own, b[10..70010],
        // a[60000..90000], 500 own.
        // (file and its bytes, or the buffer's own; offset; length)
        type Piece<'a> = (Option<(&'a Arc<std::fs::File>, &'a [u8])>, usize, usize);
        let pieces: [Piece; 6] = [
            (None, 0, 1000),
            (Some((&fa, &da)), 0, 50_000),
            (None, 0, 3000),
            (Some((&fb, &db)), 10, 60_000),
            (Some((&fa, &da)), 60_000, 30_000),
            (None, 0, 500),
        ];
        let pool = BufferPool::allocate(2, 256 << 10).unwrap();
        let block = |zc: bool| {
            let mut b = pool.get();
            let mut at = 0;
            for (i, (src, off, len)) in pieces.iter().enumerate() {
                b.segs.push(Segment {
                    file_id: i as u64,
                    offset: *off as u64,
                    len: *len as u32,
                });
                match src {
                    Some((f, d)) if zc => {
                        // Garbage where the piece would be: must not be sent.
                        b.space()[at..at + len].fill(0xee);
                        b.files.push(FileRange {
                            file: (*f).clone(),
                            off: *off as u64,
                            at,
                            len: *len,
                        })
                    }
                    Some((_, d)) => b.space()[at..at + len].copy_from_slice(&d[*off..off + len]),
                    None => b.space()[at..at + len].fill(i as u8),
                }
                at += len;
            }
            b.len = at;
            b.checksum = 7;
            b
        };
        let stats = Stats::default();
        for zc in [false, true] {
            let mut b = block(zc);
            out.send_block(&mut b, &stats).unwrap();
            pool.put(b);
        }
        let (a, b) = (frame(&mut peer), frame(&mut peer));
        assert_eq!(a, b);
        assert_eq!(stats.zerocopy_blocks.load(Ordering::Relaxed), 1);
        // Read into the buffer where the link needs the payload in memory.
        let mut b = block(true);
        materialize(&mut b).unwrap();
        assert!(b.files.is_empty() && b.files.capacity() >= MAX_FILE_RANGES);
        let p = a.len() - b.len;
        assert_eq!(b.data(), &a[p..]);
        pool.put(b);
    }

    /// On a plain link a sealed-looking credit is refused too.
    #[test]
    fn a_plain_link_refuses_sealed_credits() {
        let (l, mut peer) = pair();
        peer.write_all(&sealed(4, &mut credits_of(0, 0))).unwrap();
        let mut out = StreamOut::new(0, 0, l, 8, None);
        let pool = BufferPool::allocate(1, 4096).unwrap();
        let mut b = pool.get();
        b.reset();
        let e = out.send_block(&mut b, &Stats::default()).unwrap_err();
        pool.put(b);
        assert!(
            e.to_string().contains("sealed credit on a plain link"),
            "{e}"
        );
    }
}
