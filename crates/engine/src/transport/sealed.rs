//! A sealed link: the control link under `--encrypt` (docs/SECURITY.md).
//!
//! Under `--encrypt` the DATA blocks are sealed one by one
//! (`crypto::StreamSeal`), but paths, sizes, modes and digests travel on
//! the control link. After authentication the client asks for a sealed
//! control link (`SealControl`), and from then on both directions of the
//! control link are a stream of AEAD records, like TLS records:
//!
//! ```text
//! record = len:u32 LE | ciphertext (len bytes) | tag (16 bytes)
//! ```
//!
//! The length is the associated data; the nonce is the record counter of
//! that direction, and each direction has its own key derived from the
//! session key, so records cannot be altered, dropped, replayed, reordered
//! or reflected back. The wrapper sits below the frame layer: control
//! frames are unchanged inside it, so no call site knows.
//!
//! The client switches right after sending `SealControl`, but the server's
//! `AuthOk` (or its authentication `Error`) was sent before it saw the
//! request: the client's receive side therefore passes `clear_frames`
//! whole frames through in clear before it expects records.

use std::io::{self, IoSlice, Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ramsys_proto::control::Bytes32;
use ramsys_proto::frame::{FrameHeader, HEADER_LEN};

use super::Link;
use crate::transport::crypto::{control_key, Cipher, RecordSeal, TAG_LEN};

/// Largest plaintext in one record (control messages are small; a large
/// write is split over several records).
pub const MAX_RECORD: usize = 64 << 10;

struct Tx {
    seal: RecordSeal,
    scratch: Vec<u8>,
}

struct Rx {
    seal: RecordSeal,
    /// Whole clear frames still to pass through before records start.
    clear_frames: u32,
    /// Bytes of the clear frame being passed through still to come.
    clear_left: usize,
    /// Incoming bytes of the record (or clear frame header) being read.
    pending: Vec<u8>,
    /// Plaintext ready for the reader, and how much of it was read.
    plain: Vec<u8>,
    pos: usize,
    /// An authentication failure is final.
    broken: bool,
}

/// Both halves share the sealing state, so clones (a reader thread and a
/// writer) continue one record stream each way.
pub struct SealedLink {
    inner: Box<dyn Link>,
    tx: Arc<Mutex<Tx>>,
    rx: Arc<Mutex<Rx>>,
}

/// Which end of the control link we are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Client,
    Server,
}

impl SealedLink {
    /// Wrap `inner`; `clear_frames` frames are still read in clear first.
    /// Fails for [`Cipher::None`].
    pub fn new(
        inner: Box<dyn Link>,
        cipher: Cipher,
        session_key: &Bytes32,
        end: End,
        clear_frames: u32,
    ) -> io::Result<Self> {
        let c2s = control_key(session_key, cipher, true);
        let s2c = control_key(session_key, cipher, false);
        let (txk, rxk) = match end {
            End::Client => (c2s, s2c),
            End::Server => (s2c, c2s),
        };
        let none = || io::Error::new(io::ErrorKind::InvalidInput, "no cipher to seal with");
        Ok(SealedLink {
            inner,
            tx: Arc::new(Mutex::new(Tx {
                seal: RecordSeal::new(cipher, &txk).ok_or_else(none)?,
                scratch: Vec::with_capacity(4 + MAX_RECORD + TAG_LEN),
            })),
            rx: Arc::new(Mutex::new(Rx {
                seal: RecordSeal::new(cipher, &rxk).ok_or_else(none)?,
                clear_frames,
                clear_left: 0,
                pending: Vec::new(),
                plain: Vec::new(),
                pos: 0,
                broken: false,
            })),
        })
    }

    /// Seal `parts` (at most MAX_RECORD bytes in all) as one record.
    fn write_record(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        // The lock is held across the write so that records from two
        // handles (each with its own dup of the socket) never interleave
        // and their counters stay in wire order.
        let mut tx = self.tx.lock().unwrap();
        let tx = &mut *tx;
        let n: usize = parts.iter().map(|p| p.len()).sum();
        tx.scratch.clear();
        tx.scratch.extend_from_slice(&(n as u32).to_le_bytes());
        for p in parts {
            tx.scratch.extend_from_slice(p);
        }
        let (aad, body) = tx.scratch.split_at_mut(4);
        let tag = tx.seal.seal(aad, body);
        tx.scratch.extend_from_slice(&tag);
        self.inner.write_all(&tx.scratch)?;
        self.inner.flush()
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("sealed control link: {what}"),
    )
}

impl Rx {
    /// Fill `pending` to `want` bytes from `r`; false on a clean EOF at a
    /// record boundary.
    fn fill(&mut self, r: &mut dyn Read, want: usize) -> io::Result<bool> {
        let mut tmp = [0u8; 8192];
        while self.pending.len() < want {
            let ask = (want - self.pending.len()).min(tmp.len());
            match r.read(&mut tmp[..ask]) {
                Ok(0) if self.pending.is_empty() => return Ok(false),
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.pending.extend_from_slice(&tmp[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // A timeout keeps what was read: the next call continues
                // the same record.
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Make the next plaintext available; false on a clean EOF.
    fn next(&mut self, r: &mut dyn Read) -> io::Result<bool> {
        if self.broken {
            return Err(bad("authentication failed earlier"));
        }
        if self.clear_left > 0 {
            // Rest of a clear frame: pass through as it comes.
            let mut tmp = vec![0u8; self.clear_left.min(65536)];
            let n = r.read(&mut tmp)?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            tmp.truncate(n);
            self.clear_left -= n;
            self.plain = tmp;
            self.pos = 0;
            return Ok(true);
        }
        if self.clear_frames > 0 {
            if !self.fill(r, HEADER_LEN)? {
                return Ok(false);
            }
            let mut h = [0u8; HEADER_LEN];
            h.copy_from_slice(&self.pending);
            let hdr = FrameHeader::decode(&h, 0).map_err(|e| bad(&e.to_string()))?;
            self.pending.clear();
            self.clear_frames -= 1;
            self.clear_left = hdr.len as usize;
            self.plain = h.to_vec();
            self.pos = 0;
            return Ok(true);
        }
        if !self.fill(r, 4)? {
            return Ok(false);
        }
        let n = u32::from_le_bytes(self.pending[..4].try_into().unwrap()) as usize;
        if n > MAX_RECORD {
            self.broken = true;
            return Err(bad(&format!("record of {n} bytes (limit {MAX_RECORD})")));
        }
        self.fill(r, 4 + n + TAG_LEN)?;
        let mut rec = std::mem::take(&mut self.pending);
        let (aad, rest) = rec.split_at_mut(4);
        let (body, tag) = rest.split_at_mut(n);
        let tag: [u8; TAG_LEN] = (&*tag).try_into().unwrap();
        if self.seal.open(aad, body, &tag).is_err() {
            self.broken = true;
            return Err(bad(
                "record failed authentication (tampered, replayed or reordered)",
            ));
        }
        rec.truncate(4 + n);
        rec.drain(..4);
        self.plain = rec;
        self.pos = 0;
        Ok(true)
    }
}

impl Read for SealedLink {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut rx = self.rx.lock().unwrap();
        while rx.pos == rx.plain.len() {
            if !rx.next(&mut *self.inner)? {
                return Ok(0);
            }
        }
        let n = (rx.plain.len() - rx.pos).min(buf.len());
        let pos = rx.pos;
        buf[..n].copy_from_slice(&rx.plain[pos..pos + n]);
        rx.pos += n;
        Ok(n)
    }
}

impl Write for SealedLink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(MAX_RECORD);
        if n == 0 {
            return Ok(0);
        }
        self.write_record(&[&buf[..n]])?;
        Ok(n)
    }

    /// A control frame (header and body) becomes one record.
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut parts: Vec<&[u8]> = Vec::with_capacity(bufs.len());
        let mut total = 0;
        for b in bufs {
            if total == MAX_RECORD {
                break;
            }
            let take = b.len().min(MAX_RECORD - total);
            parts.push(&b[..take]);
            total += take;
        }
        if total == 0 {
            return Ok(0);
        }
        self.write_record(&parts)?;
        Ok(total)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Link for SealedLink {
    fn try_clone_link(&self) -> io::Result<Box<dyn Link>> {
        Ok(Box::new(SealedLink {
            inner: self.inner.try_clone_link()?,
            tx: self.tx.clone(),
            rx: self.rx.clone(),
        }))
    }
    fn shutdown_both(&self) {
        self.inner.shutdown_both()
    }
    fn shutdown_write(&self) {
        self.inner.shutdown_write()
    }
    fn peer(&self) -> String {
        self.inner.peer()
    }
    fn local(&self) -> String {
        self.inner.local()
    }
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        self.inner.set_read_timeout(d)
    }
    fn peer_gone(&self) -> bool {
        self.inner.peer_gone()
    }
    fn rtt(&self) -> Option<Duration> {
        self.inner.rtt()
    }
}

/// Decode a whole record stream as the `end` side would receive it (no
/// clear frames); for the fuzzer and tests of the decoder alone.
pub fn open_records(
    cipher: Cipher,
    session_key: &Bytes32,
    end: End,
    mut bytes: &[u8],
) -> io::Result<Vec<u8>> {
    let peer_to_us = end == End::Server;
    let key = control_key(session_key, cipher, peer_to_us);
    let mut rx = Rx {
        seal: RecordSeal::new(cipher, &key)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no cipher"))?,
        clear_frames: 0,
        clear_left: 0,
        pending: Vec::new(),
        plain: Vec::new(),
        pos: 0,
        broken: false,
    };
    let mut out = Vec::new();
    while rx.next(&mut bytes)? {
        out.extend_from_slice(&rx.plain);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::wire::{recv_control, send_control};
    use ramsys_proto::Control;
    use std::net::{TcpListener, TcpStream};

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    const KEY: Bytes32 = [9; 32];

    #[test]
    fn both_directions_after_one_clear_frame() {
        for cipher in [Cipher::ChaCha20Poly1305, Cipher::Aes256Gcm] {
            let (c, s) = pair();
            let mut s: Box<dyn Link> = Box::new(s);
            // The server's AuthOk goes out before it knows about sealing.
            send_control(&mut *s, &Control::AuthOk { session: 7 }).unwrap();
            let mut s = SealedLink::new(s, cipher, &KEY, End::Server, 0).unwrap();
            let mut c = SealedLink::new(Box::new(c), cipher, &KEY, End::Client, 1).unwrap();
            assert_eq!(
                recv_control(&mut c).unwrap(),
                Control::AuthOk { session: 7 }
            );
            let big = Control::Deleted(vec![vec![b'x'; 200_000]]);
            send_control(&mut c, &big).unwrap();
            send_control(&mut c, &Control::Settled).unwrap();
            assert_eq!(recv_control(&mut s).unwrap(), big, "split over records");
            assert_eq!(recv_control(&mut s).unwrap(), Control::Settled);
            // A clone (the controller's reader thread) continues the stream.
            let mut s2 = s.try_clone_link().unwrap();
            send_control(&mut s, &Control::JoinOk).unwrap();
            send_control(&mut *s2, &Control::Settled).unwrap();
            let mut c2 = c.try_clone_link().unwrap();
            assert_eq!(recv_control(&mut *c2).unwrap(), Control::JoinOk);
            assert_eq!(recv_control(&mut c).unwrap(), Control::Settled);
        }
    }

    /// Bytes the client side puts on the wire for `msgs`.
    fn wire_bytes(msgs: &[Control]) -> Vec<u8> {
        let (c, mut s) = pair();
        let mut c =
            SealedLink::new(Box::new(c), Cipher::ChaCha20Poly1305, &KEY, End::Client, 0).unwrap();
        for m in msgs {
            send_control(&mut c, m).unwrap();
        }
        drop(c);
        let mut v = Vec::new();
        s.read_to_end(&mut v).unwrap();
        v
    }

    #[test]
    fn nothing_in_clear_and_every_change_is_caught() {
        let secret = b"very-secret-file-name.dat".to_vec();
        let msgs = [Control::Deleted(vec![secret.clone()]), Control::Settled];
        let v = wire_bytes(&msgs);
        assert!(!v.windows(secret.len()).any(|w| w == secret));
        let c = Cipher::ChaCha20Poly1305;
        let plain = open_records(c, &KEY, End::Server, &v).unwrap();
        let mut expect = Vec::new();
        for m in &msgs {
            send_control(&mut expect, m).unwrap();
        }
        assert_eq!(plain, expect);
        // Any flipped bit fails; so does the other direction's key
        // (reflection), dropping the first record, or truncation.
        for i in 0..v.len() {
            let mut t = v.clone();
            t[i] ^= 0x10;
            assert!(open_records(c, &KEY, End::Server, &t).is_err(), "bit {i}");
        }
        assert!(open_records(c, &KEY, End::Client, &v).is_err());
        let first = 4 + u32::from_le_bytes(v[..4].try_into().unwrap()) as usize + TAG_LEN;
        assert!(open_records(c, &KEY, End::Server, &v[first..]).is_err());
        assert!(open_records(c, &KEY, End::Server, &v[..v.len() - 1]).is_err());
        assert!(open_records(c, &[8; 32], End::Server, &v).is_err());
    }

    #[test]
    fn oversized_record_refused_before_reading_it() {
        let mut v = ((MAX_RECORD + 1) as u32).to_le_bytes().to_vec();
        v.extend_from_slice(&[0; 64]);
        let e = open_records(Cipher::Aes256Gcm, &KEY, End::Server, &v).unwrap_err();
        assert!(e.to_string().contains("limit"), "{e}");
    }

    #[test]
    fn no_cipher_no_seal() {
        let (c, _s) = pair();
        assert!(SealedLink::new(Box::new(c), Cipher::None, &KEY, End::Client, 0).is_err());
    }
}
