//! Payload blocks (RFTP-style pipelined blocks, seed 004 sec. 3.2; RAMSYS
//! packs small files, seed 000 sec. 6.1.4).
//!
//! A DATA frame body is
//! ```text
//! | checksum u64 | nseg x (file_id u64, offset u64, len u32) | payload |
//! ```
//! with `nseg` in the frame header's `aux` field. Segment `i` covers
//! `len_i` payload bytes, in table order, and belongs at `offset_i` of file
//! `file_id_i`; several small files share one block, and a large file is
//! cut into many blocks that may arrive on any stream in any order.
//!
//! Integrity: each segment has a hash seeded with its file id and offset
//! (so bytes landing in the wrong place do not verify); the block checksum
//! is the wrapping sum of its segment hashes and a file's digest is the
//! wrapping sum of all its segment hashes. Sums commute, so the sink can
//! verify a whole file no matter in which order its blocks arrived, with
//! one pass over the bytes on each side.

use crate::ProtoError;

/// Bytes per segment-table record.
pub const SEGMENT_LEN: usize = 20;
/// Most segments a block may carry (small-file packing limit).
pub const MAX_SEGMENTS: usize = 4096;
/// Bytes before the segment table.
pub const CHECKSUM_LEN: usize = 8;

/// Where a run of payload bytes belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Segment {
    pub file_id: u64,
    pub offset: u64,
    pub len: u32,
}

/// Flag bit in a segment's `len`: the segment is a hole (sparse file
/// region that reads as zeros) of `len & !HOLE_FLAG` bytes and carries no
/// payload; the sink leaves it unwritten. Appended to the format: a block
/// with no hole segment is encoded exactly as before.
pub const HOLE_FLAG: u32 = 1 << 31;
/// With [`HOLE_FLAG`]: the segment is a *local copy* of `len & !MARKS`
/// bytes and carries no payload either; the sink copies the range from the
/// source file itself (copy_file_range(2)). Only a sink in the same process
/// as its source (a local `ramsys cp`) accepts it; any other sink rejects
/// the block as a protocol error (issue 17).
pub const COPY_FLAG: u32 = 1 << 30;
/// Both marker bits.
pub const MARKS: u32 = HOLE_FLAG | COPY_FLAG;
/// Longest hole or local copy one segment can describe (larger ones take
/// several). Builds before the local copy took 2^31 - 1 for holes.
pub const MAX_HOLE: u32 = COPY_FLAG - 1;

impl Segment {
    /// A hole segment of `len` (≤ [`MAX_HOLE`]) bytes at `offset`.
    pub fn hole(file_id: u64, offset: u64, len: u32) -> Segment {
        debug_assert!(len <= MAX_HOLE);
        Segment {
            file_id,
            offset,
            len: len | HOLE_FLAG,
        }
    }
    /// A local-copy segment of `len` (≤ [`MAX_HOLE`]) bytes at `offset`.
    pub fn copy(file_id: u64, offset: u64, len: u32) -> Segment {
        debug_assert!(len <= MAX_HOLE);
        Segment {
            file_id,
            offset,
            len: len | MARKS,
        }
    }
    /// No payload: a hole or a local copy.
    pub fn is_hole(&self) -> bool {
        self.len & HOLE_FLAG != 0
    }
    /// A local copy (see [`COPY_FLAG`]).
    pub fn is_copy(&self) -> bool {
        self.len & MARKS == MARKS
    }
    /// File bytes covered (data, hole or copy).
    pub fn span(&self) -> u64 {
        if self.is_hole() {
            (self.len & !MARKS) as u64
        } else {
            self.len as u64
        }
    }
    /// Payload bytes carried in the block (0 for a hole).
    pub fn payload_len(&self) -> usize {
        if self.is_hole() {
            0
        } else {
            self.len as usize
        }
    }
}

/// Hash of a hole, bound to its position and length (holes carry no
/// bytes, so a file's digest covers its data and the layout of its holes).
#[inline]
pub fn hole_hash(file_id: u64, offset: u64, len: u64) -> u64 {
    segment_hash(file_id, offset, &len.to_le_bytes()) ^ 0x686f_6c65_686f_6c65
}

/// Hash of a local copy, bound to its position and length (its bytes never
/// pass through the engine; the kernel copies them).
#[inline]
pub fn copy_hash(file_id: u64, offset: u64, len: u64) -> u64 {
    segment_hash(file_id, offset, &len.to_le_bytes()) ^ 0x636f_7079_636f_7079
}

/// Hash of a payload-free segment (hole or local copy).
#[inline]
pub fn marker_hash(s: &Segment) -> u64 {
    if s.is_copy() {
        copy_hash(s.file_id, s.offset, s.span())
    } else {
        hole_hash(s.file_id, s.offset, s.span())
    }
}

/// Hash of one segment's bytes, bound to its position.
#[inline]
pub fn segment_hash(file_id: u64, offset: u64, bytes: &[u8]) -> u64 {
    let seed = offset.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ file_id.rotate_left(29);
    xxh3::hash64_with_seed(bytes, seed)
}

/// Length of the table (checksum + segments) for `nseg` segments.
#[inline]
pub fn table_len(nseg: usize) -> usize {
    CHECKSUM_LEN + nseg * SEGMENT_LEN
}

/// Write the checksum and segment table into `out`; returns bytes written.
/// `out` must hold [`table_len`] bytes.
pub fn encode_table(checksum: u64, segs: &[Segment], out: &mut [u8]) -> usize {
    out[..8].copy_from_slice(&checksum.to_le_bytes());
    let mut p = 8;
    for s in segs {
        out[p..p + 8].copy_from_slice(&s.file_id.to_le_bytes());
        out[p + 8..p + 16].copy_from_slice(&s.offset.to_le_bytes());
        out[p + 16..p + 20].copy_from_slice(&s.len.to_le_bytes());
        p += SEGMENT_LEN;
    }
    p
}

/// Parse a segment table. `table` must be exactly `table_len(nseg)` bytes
/// and `body_len` the frame's body length. Fills `segs` (cleared first; it
/// is pre-allocated by the caller, so no allocation happens here) and
/// returns (checksum, payload length). Rejects tables whose lengths do not
/// add up to the body, overflowing offsets and payloads over `max_payload`.
pub fn decode_table(
    table: &[u8],
    nseg: usize,
    body_len: usize,
    max_payload: usize,
    segs: &mut Vec<Segment>,
) -> Result<(u64, usize), ProtoError> {
    if nseg == 0 || nseg > MAX_SEGMENTS {
        return Err(ProtoError::malformed(
            "data block",
            format!("segment count {nseg}"),
        ));
    }
    let tl = table_len(nseg);
    if table.len() != tl || body_len < tl {
        return Err(ProtoError::malformed(
            "data block",
            "segment table longer than body",
        ));
    }
    let payload = body_len - tl;
    if payload > max_payload {
        return Err(ProtoError::malformed(
            "data block",
            format!("payload {payload} exceeds block size {max_payload}"),
        ));
    }
    let checksum = u64::from_le_bytes(table[..8].try_into().unwrap());
    segs.clear();
    let mut sum: u64 = 0;
    for i in 0..nseg {
        let r = &table[8 + i * SEGMENT_LEN..8 + (i + 1) * SEGMENT_LEN];
        let s = Segment {
            file_id: u64::from_le_bytes(r[..8].try_into().unwrap()),
            offset: u64::from_le_bytes(r[8..16].try_into().unwrap()),
            len: u32::from_le_bytes(r[16..20].try_into().unwrap()),
        };
        if s.offset.checked_add(s.span()).is_none() {
            return Err(ProtoError::malformed(
                "data block",
                "segment offset overflows",
            ));
        }
        sum += s.payload_len() as u64;
        segs.push(s);
    }
    if sum != payload as u64 {
        return Err(ProtoError::malformed(
            "data block",
            format!("segments cover {sum} bytes, payload is {payload}"),
        ));
    }
    Ok((checksum, payload))
}

/// Hash every segment of a block; returns (block checksum, per-segment
/// hashes written into `hashes`, which must have one slot per segment).
pub fn hash_block(segs: &[Segment], payload: &[u8], hashes: &mut [u64]) -> u64 {
    let mut p = 0usize;
    let mut sum = 0u64;
    for (i, s) in segs.iter().enumerate() {
        let end = p + s.payload_len();
        let h = if s.is_hole() {
            marker_hash(s)
        } else {
            segment_hash(s.file_id, s.offset, &payload[p..end])
        };
        hashes[i] = h;
        sum = sum.wrapping_add(h);
        p = end;
    }
    sum
}

/// Encode a CREDIT frame body.
pub fn encode_credit(n: u32) -> [u8; 4] {
    n.to_le_bytes()
}

/// Decode a CREDIT frame body.
pub fn decode_credit(b: &[u8]) -> Result<u32, ProtoError> {
    let arr: [u8; 4] = b
        .try_into()
        .map_err(|_| ProtoError::malformed("credit", "body must be 4 bytes"))?;
    let n = u32::from_le_bytes(arr);
    if n == 0 {
        return Err(ProtoError::Credit("zero credit grant".into()));
    }
    Ok(n)
}

/// Source-side credit accounting for one data link (seed 004 sec. 3.2:
/// the sink grants credits for buffers it has free; the source never has
/// more blocks in flight than granted, so a slow sink disk bounds memory).
#[derive(Debug, Clone)]
pub struct CreditWindow {
    window: u64,
    granted: u64,
    consumed: u64,
}

impl CreditWindow {
    /// `window` = credits_per_stream from Confirm; nothing is available
    /// until the sink's first grant.
    pub fn new(window: u32) -> Self {
        CreditWindow {
            window: window as u64,
            granted: 0,
            consumed: 0,
        }
    }

    pub fn available(&self) -> u32 {
        (self.granted - self.consumed) as u32
    }

    /// The sink granted `n` more credits. It may only hand back credits for
    /// blocks consumed: total grants never exceed window + consumed.
    pub fn grant(&mut self, n: u32) -> Result<(), ProtoError> {
        if self.granted + n as u64 > self.window + self.consumed {
            return Err(ProtoError::Credit(format!(
                "grant of {n} exceeds window {}",
                self.window
            )));
        }
        self.granted += n as u64;
        Ok(())
    }

    /// Use one credit for a block about to be sent.
    pub fn consume(&mut self) -> Result<(), ProtoError> {
        if self.granted == self.consumed {
            return Err(ProtoError::Credit("send without credit".into()));
        }
        self.consumed += 1;
        Ok(())
    }
}

/// Sink-side check: a source must not send more blocks than granted.
#[derive(Debug, Clone)]
pub struct CreditLedger {
    granted_unused: u64,
}

impl CreditLedger {
    pub fn new() -> Self {
        CreditLedger { granted_unused: 0 }
    }
    pub fn granted(&mut self, n: u32) {
        self.granted_unused += n as u64;
    }
    /// A block arrived; error if the source had no credit for it.
    pub fn received(&mut self) -> Result<(), ProtoError> {
        if self.granted_unused == 0 {
            return Err(ProtoError::Credit("block sent without credit".into()));
        }
        self.granted_unused -= 1;
        Ok(())
    }
}

impl Default for CreditLedger {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_roundtrip_and_hashes() {
        let payload: Vec<u8> = (0..100u8).collect();
        let segs = vec![
            Segment {
                file_id: 1,
                offset: 0,
                len: 30,
            },
            Segment {
                file_id: 2,
                offset: 4096,
                len: 70,
            },
        ];
        let mut hashes = [0u64; 2];
        let ck = hash_block(&segs, &payload, &mut hashes);
        let mut table = vec![0u8; table_len(2)];
        encode_table(ck, &segs, &mut table);
        let mut out = Vec::with_capacity(4);
        let (ck2, plen) = decode_table(&table, 2, table.len() + 100, 1 << 20, &mut out).unwrap();
        assert_eq!((ck2, plen), (ck, 100));
        assert_eq!(out, segs);
        // Same bytes at another offset hash differently.
        assert_ne!(
            segment_hash(1, 0, &payload[..30]),
            segment_hash(1, 30, &payload[..30])
        );
        assert_ne!(
            segment_hash(1, 0, &payload[..30]),
            segment_hash(2, 0, &payload[..30])
        );
    }

    #[test]
    fn table_lengths_must_add_up() {
        let segs = [Segment {
            file_id: 1,
            offset: 0,
            len: 10,
        }];
        let mut table = vec![0u8; table_len(1)];
        encode_table(0, &segs, &mut table);
        let mut out = Vec::new();
        assert!(decode_table(&table, 1, table.len() + 11, 1 << 20, &mut out).is_err());
        assert!(decode_table(&table, 1, table.len() + 10, 5, &mut out).is_err());
        assert!(decode_table(&table, 0, table.len(), 5, &mut out).is_err());
    }

    #[test]
    fn hole_segments_carry_no_payload() {
        let payload = vec![3u8; 10];
        let segs = vec![
            Segment::hole(1, 0, 1 << 20),
            Segment {
                file_id: 1,
                offset: 1 << 20,
                len: 10,
            },
        ];
        assert!(segs[0].is_hole() && segs[0].span() == 1 << 20 && segs[0].payload_len() == 0);
        let mut hashes = [0u64; 2];
        let ck = hash_block(&segs, &payload, &mut hashes);
        assert_eq!(hashes[0], hole_hash(1, 0, 1 << 20));
        let mut table = vec![0u8; table_len(2)];
        encode_table(ck, &segs, &mut table);
        let mut out = Vec::new();
        let (_, plen) = decode_table(&table, 2, table.len() + 10, 1 << 20, &mut out).unwrap();
        assert_eq!(plen, 10);
        assert_eq!(out, segs);
        assert_ne!(hole_hash(1, 0, 4096), hole_hash(1, 0, 8192));
    }

    #[test]
    fn xxh3_matches_the_reference_implementation() {
        // The wire format is XXH3-64: any implementation must agree.
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        for len in [
            0usize, 1, 3, 16, 17, 128, 129, 240, 241, 1024, 4096, 100_000,
        ] {
            for seed in [0u64, 1, 0xdead_beef_cafe_f00d] {
                assert_eq!(
                    xxh3::hash64_with_seed(&data[..len], seed),
                    xxhash_rust::xxh3::xxh3_64_with_seed(&data[..len], seed),
                    "len {len} seed {seed}"
                );
            }
        }
    }

    #[test]
    fn digest_is_order_independent() {
        let data = vec![7u8; 1000];
        let a = segment_hash(5, 0, &data[..400]);
        let b = segment_hash(5, 400, &data[400..]);
        assert_eq!(a.wrapping_add(b), b.wrapping_add(a));
    }

    #[test]
    fn credit_window_bounds() {
        let mut w = CreditWindow::new(4);
        assert!(w.consume().is_err());
        w.grant(4).unwrap();
        assert!(w.grant(1).is_err());
        let mut w = CreditWindow::new(4);
        w.grant(4).unwrap();
        for _ in 0..4 {
            w.consume().unwrap();
        }
        assert!(w.consume().is_err());
        w.grant(2).unwrap();
        w.grant(2).unwrap();
        assert_eq!(w.available(), 4);
        assert!(w.grant(1).is_err());
        let mut l = CreditLedger::new();
        assert!(l.received().is_err());
        l.granted(1);
        l.received().unwrap();
    }
}
