//! Length-prefixed frames over byte streams (issue 37: one framer for the
//! crates that frame bytes). A frame is a fixed-size header holding a
//! little-endian u32 body length somewhere in it, then the body. Each user
//! keeps its own header layout (docs/PROTOCOL.md: proto's 8-byte frame
//! header, the ssh tunnel's 9-byte one, ddss's bare 4-byte length); what is
//! shared is the part that must never be wrong: the length is checked
//! against its bound *before* anything is allocated or read, a clean end of
//! stream is told from a torn frame, and an incremental decoder holds at
//! most one header plus one body.
//!
//! Sans dependencies, so the lowest crates (proto, ddss) can use it.

use std::io::{self, Read, Write};

/// The u32 LE length field at `at` of `header`.
pub fn le_len(header: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(header[at..at + 4].try_into().expect("4 bytes"))
}

/// Write `len` as the u32 LE length field at `at` of `header`.
pub fn put_le_len(header: &mut [u8], at: usize, len: usize) {
    let n = u32::try_from(len).expect("frame body over 4 GiB");
    header[at..at + 4].copy_from_slice(&n.to_le_bytes());
}

/// A body length over its bound, refused before allocation.
pub fn oversize(what: &str, len: u64, max: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{what} of {len} bytes (at most {max})"),
    )
}

/// Read one frame: fill `header`, ask `check` for the body length (it
/// refuses a bad header or a length over its bound), then read the body
/// into `body` (resized to it). Ok(false): the stream ended cleanly before
/// a header; a stream ending inside a frame is UnexpectedEof.
pub fn read_frame<R: Read + ?Sized, E: From<io::Error>>(
    r: &mut R,
    header: &mut [u8],
    body: &mut Vec<u8>,
    check: impl FnOnce(&[u8]) -> Result<usize, E>,
) -> Result<bool, E> {
    match r.read_exact(header) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
        Err(e) => return Err(e.into()),
    }
    let n = check(header)?;
    body.clear();
    body.resize(n, 0);
    r.read_exact(body)?;
    Ok(true)
}

/// Header and body as one buffer (one write: a sealed link seals it as one
/// record).
pub fn encode(header: &[u8], body: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(header.len() + body.len());
    b.extend_from_slice(header);
    b.extend_from_slice(body);
    b
}

/// Write header then body (no copy of a large body) and flush.
pub fn write_frame<W: Write + ?Sized>(w: &mut W, header: &[u8], body: &[u8]) -> io::Result<()> {
    w.write_all(header)?;
    w.write_all(body)?;
    w.flush()
}

/// A whole frame: its header bytes and its body.
pub type Frame = (Vec<u8>, Vec<u8>);

/// Incremental splitter for bytes that arrive in pieces: holds at most one
/// header plus one (checked) body beyond what the caller fed at once.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    pub fn new() -> Self {
        Decoder::default()
    }

    /// Append bytes received from the peer.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame (header bytes, body), if one is held.
    /// `check` sees each header once it is whole and returns its body
    /// length or refuses it; a refusal leaves the bytes held (the stream
    /// is unusable after it).
    pub fn next_frame<E>(
        &mut self,
        header_len: usize,
        check: impl FnOnce(&[u8]) -> Result<usize, E>,
    ) -> Result<Option<Frame>, E> {
        if self.buf.len() < header_len {
            return Ok(None);
        }
        let n = check(&self.buf[..header_len])?;
        let total = header_len.saturating_add(n);
        if self.buf.len() < total {
            return Ok(None);
        }
        let body = self.buf[header_len..total].to_vec();
        let header = self.buf.drain(..total).take(header_len).collect();
        Ok(Some((header, body)))
    }

    /// Bytes held but not yet returned as frames.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MAX: usize = 300;

    /// A test format: [tag u8, len u32 LE], tag < 3.
    fn check(h: &[u8]) -> io::Result<usize> {
        if h[0] > 2 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "bad tag"));
        }
        let n = le_len(h, 1) as usize;
        if n > MAX {
            return Err(oversize("test frame", n as u64, MAX as u64));
        }
        Ok(n)
    }

    fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut h = [tag, 0, 0, 0, 0];
        put_le_len(&mut h, 1, body.len());
        encode(&h, body)
    }

    #[test]
    fn oversize_refused_before_the_body_is_read() {
        let mut h = [0u8; 5];
        put_le_len(&mut h, 1, MAX + 1);
        // No body follows: the refusal comes from the header alone.
        let (mut hb, mut body) = ([0u8; 5], Vec::new());
        let e = read_frame(&mut &h[..], &mut hb, &mut body, check).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("301 bytes"), "{e}");
        let mut d = Decoder::new();
        d.feed(&h);
        assert!(d.next_frame(5, check).is_err());
        // A u32::MAX length does not allocate either.
        let h = [0, 0xff, 0xff, 0xff, 0xff];
        assert!(read_frame(&mut &h[..], &mut hb, &mut body, check).is_err());
    }

    #[test]
    fn clean_end_and_torn_frame() {
        let (mut hb, mut body) = ([0u8; 5], Vec::new());
        assert!(!read_frame(&mut &[][..], &mut hb, &mut body, check).unwrap());
        let f = frame(1, b"hello");
        let e = read_frame(&mut &f[..7], &mut hb, &mut body, check).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(read_frame(&mut &f[..], &mut hb, &mut body, check).unwrap());
        assert_eq!(body, b"hello");
    }

    proptest! {
        /// Arbitrary bytes, fed split at arbitrary points: never a panic,
        /// every frame returned is within bounds, and the stream reader
        /// agrees with the incremental decoder.
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..2000),
                                       cuts in proptest::collection::vec(0usize..2000, 0..8)) {
            let mut d = Decoder::new();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(data.len())).collect();
            cuts.push(0);
            cuts.push(data.len());
            cuts.sort();
            let mut inc = Vec::new();
            let mut refused = false;
            'outer: for w in cuts.windows(2) {
                d.feed(&data[w[0]..w[1]]);
                loop {
                    match d.next_frame(5, check) {
                        Ok(Some((h, b))) => { prop_assert!(b.len() <= MAX); inc.push((h, b)); }
                        Ok(None) => break,
                        Err(_) => { refused = true; break 'outer; }
                    }
                }
            }
            let mut r = &data[..];
            let (mut hb, mut body) = ([0u8; 5], Vec::new());
            let mut whole = Vec::new();
            while let Ok(true) = read_frame(&mut r, &mut hb, &mut body, check) {
                whole.push((hb.to_vec(), body.clone()));
            }
            prop_assert!(whole.len() >= inc.len());
            prop_assert_eq!(&whole[..inc.len()], &inc[..]);
            if !refused {
                prop_assert_eq!(whole.len(), inc.len());
            }
        }

        /// Frames encoded, concatenated and split anywhere come back whole
        /// and in order.
        #[test]
        fn round_trip_split_anywhere(
            frames in proptest::collection::vec((0u8..3, proptest::collection::vec(any::<u8>(), 0..MAX)), 0..6),
            cuts in proptest::collection::vec(any::<usize>(), 0..10)) {
            let wire: Vec<u8> = frames.iter().flat_map(|(t, b)| frame(*t, b)).collect();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (wire.len() + 1)).collect();
            cuts.push(0);
            cuts.push(wire.len());
            cuts.sort();
            let mut d = Decoder::new();
            let mut got = Vec::new();
            for w in cuts.windows(2) {
                d.feed(&wire[w[0]..w[1]]);
                while let Some((h, b)) = d.next_frame(5, check).unwrap() {
                    got.push((h[0], b));
                }
            }
            prop_assert_eq!(d.pending(), 0);
            prop_assert_eq!(&got, &frames);
            let mut out = Vec::new();
            for (t, b) in &frames {
                let mut h = [*t, 0, 0, 0, 0];
                put_le_len(&mut h, 1, b.len());
                write_frame(&mut out, &h, b).unwrap();
            }
            prop_assert_eq!(out, wire);
        }
    }
}
