//! The raw-Ethernet frame format (seed 002 sec. 2, "request and data
//! messages ... in small and jumbo Ethernet frames"; the seed leaves the
//! wire format undefined, ~305, so it is designed here in the manner of
//! AoE: its own EtherType, every frame self-describing and tagged).
//!
//! ```text
//! Ethernet: dst MAC (6) | src MAC (6) | EtherType 0x88B5 (2)
//! ramsys header (48 bytes, big endian):
//!   0 check   u32  xxh3-64 (seeded by session ^ token) of bytes 4.. of the
//!                  header and the payload, low 32 bits
//!   4 version u8   1
//!   5 kind    u8   1 data, 2 ack, 3 nack, 4 reset, 5 open, 6 open-ok
//!   6 flags   u16  bit 0 FIN (data: end of stream), bit 1 NO_CREDIT (nack)
//!   8 session u64  the session this channel belongs to
//!  16 token   u64  per-channel random token (from the control link)
//!  24 channel u16  channel number within the session
//!  26 slot    u16  the receive slot the sender placed this frame in
//!  28 seq     u32  data: the frame's sequence number (the retransmission tag)
//!  32 ack     u32  cumulative ack: next sequence number expected
//!  36 credits u16  frames beyond `ack` the sender of this frame can accept
//!  38 len     u16  payload bytes
//!  40 sack    u64  selective ack: bit i = frame ack+1+i received
//! payload (len bytes)
//! ```
//!
//! Every frame carries the reverse direction's ack, sack and credits, so
//! data frames piggyback acknowledgements and a pure ack is needed only
//! when one side has nothing to send.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// IEEE 802 "local experimental" EtherType 1: ours is a private protocol
/// between hosts of one L2 segment, which is what this range is for.
pub const ETHERTYPE: u16 = 0x88B5;
pub const ETH_HDR: usize = 14;
pub const HDR: usize = 48;
/// Bytes of the frame before the payload.
pub const OVERHEAD: usize = ETH_HDR + HDR;
pub const VERSION: u8 = 1;
pub const MTU_JUMBO: usize = 9000;
pub const MTU_STD: usize = 1500;

pub const FLAG_FIN: u16 = 1;
pub const FLAG_NO_CREDIT: u16 = 2;

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Data = 1,
    Ack = 2,
    Nack = 3,
    Reset = 4,
    /// Channel setup (open.rs): payload = MTU u16, slots u16.
    Open = 5,
    OpenOk = 6,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Data,
            2 => Kind::Ack,
            3 => Kind::Nack,
            4 => Kind::Reset,
            5 => Kind::Open,
            6 => Kind::OpenOk,
            _ => return None,
        })
    }
}

pub type Mac = [u8; 6];

/// A decoded header (Ethernet addresses included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub dst: Mac,
    pub src: Mac,
    pub kind: Kind,
    pub flags: u16,
    pub session: u64,
    pub token: u64,
    pub channel: u16,
    pub slot: u16,
    pub seq: u32,
    pub ack: u32,
    pub credits: u16,
    pub len: u16,
    pub sack: u64,
}

/// Why a frame was rejected by the decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// Shorter than the headers, or `len` runs past the frame.
    Truncated,
    /// Not our EtherType.
    EtherType,
    /// Unknown version or kind.
    Malformed,
    /// The check does not match (corrupted, or sealed with another
    /// session/token: the caller tells them apart by the header fields).
    Check,
}

/// The payload bytes one frame carries at `mtu` (the IP-level MTU: the
/// Ethernet header is not part of it).
pub fn payload_capacity(mtu: usize) -> usize {
    mtu - HDR
}

fn check_seed(session: u64, token: u64) -> u64 {
    session ^ token.rotate_left(17)
}

/// Write the header for `h` into `frame[..OVERHEAD]` and seal the frame,
/// whose payload (h.len bytes) is already at `frame[OVERHEAD..]`. Returns
/// the frame's length.
pub fn encode(h: &Header, frame: &mut [u8]) -> usize {
    let len = h.len as usize;
    frame[0..6].copy_from_slice(&h.dst);
    frame[6..12].copy_from_slice(&h.src);
    frame[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
    let b = &mut frame[ETH_HDR..OVERHEAD];
    b[4] = VERSION;
    b[5] = h.kind as u8;
    b[6..8].copy_from_slice(&h.flags.to_be_bytes());
    b[8..16].copy_from_slice(&h.session.to_be_bytes());
    b[16..24].copy_from_slice(&h.token.to_be_bytes());
    b[24..26].copy_from_slice(&h.channel.to_be_bytes());
    b[26..28].copy_from_slice(&h.slot.to_be_bytes());
    b[28..32].copy_from_slice(&h.seq.to_be_bytes());
    b[32..36].copy_from_slice(&h.ack.to_be_bytes());
    b[36..38].copy_from_slice(&h.credits.to_be_bytes());
    b[38..40].copy_from_slice(&h.len.to_be_bytes());
    b[40..48].copy_from_slice(&h.sack.to_be_bytes());
    let check = xxh3_64_with_seed(
        &frame[ETH_HDR + 4..OVERHEAD + len],
        check_seed(h.session, h.token),
    ) as u32;
    frame[ETH_HDR..ETH_HDR + 4].copy_from_slice(&check.to_be_bytes());
    OVERHEAD + len
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

/// Decode and verify a received frame. Trailing bytes past `len` (the
/// Ethernet minimum-size padding) are ignored. Never panics.
pub fn decode(frame: &[u8]) -> Result<(Header, &[u8]), FrameError> {
    if frame.len() < OVERHEAD {
        return Err(FrameError::Truncated);
    }
    if be16(&frame[12..14]) != ETHERTYPE {
        return Err(FrameError::EtherType);
    }
    let b = &frame[ETH_HDR..OVERHEAD];
    let kind = Kind::from_u8(b[5]).ok_or(FrameError::Malformed)?;
    if b[4] != VERSION {
        return Err(FrameError::Malformed);
    }
    let len = be16(&b[38..40]);
    if frame.len() < OVERHEAD + len as usize {
        return Err(FrameError::Truncated);
    }
    let mut dst = [0u8; 6];
    let mut src = [0u8; 6];
    dst.copy_from_slice(&frame[0..6]);
    src.copy_from_slice(&frame[6..12]);
    let h = Header {
        dst,
        src,
        kind,
        flags: be16(&b[6..8]),
        session: be64(&b[8..16]),
        token: be64(&b[16..24]),
        channel: be16(&b[24..26]),
        slot: be16(&b[26..28]),
        seq: be32(&b[28..32]),
        ack: be32(&b[32..36]),
        credits: be16(&b[36..38]),
        len,
        sack: be64(&b[40..48]),
    };
    let want = xxh3_64_with_seed(
        &frame[ETH_HDR + 4..OVERHEAD + len as usize],
        check_seed(h.session, h.token),
    ) as u32;
    if be32(&b[0..4]) != want {
        return Err(FrameError::Check);
    }
    Ok((h, &frame[OVERHEAD..OVERHEAD + len as usize]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header(len: u16) -> Header {
        Header {
            dst: [2, 0, 0, 0, 0, 1],
            src: [2, 0, 0, 0, 0, 2],
            kind: Kind::Data,
            flags: FLAG_FIN,
            session: 0x1122_3344_5566_7788,
            token: 0xdead_beef_cafe_f00d,
            channel: 3,
            slot: 17,
            seq: 0xffff_fff0,
            ack: 42,
            credits: 64,
            len,
            sack: 0b1011,
        }
    }

    #[test]
    fn roundtrip_and_padding() {
        let mut f = vec![0u8; OVERHEAD + 100];
        f[OVERHEAD..OVERHEAD + 5].copy_from_slice(b"hello");
        let n = encode(&header(5), &mut f);
        assert_eq!(n, OVERHEAD + 5);
        // Ethernet pads short frames: trailing bytes are not payload.
        let (h, p) = decode(&f).unwrap();
        assert_eq!(h, header(5));
        assert_eq!(p, b"hello");
    }

    #[test]
    fn any_flipped_bit_is_caught() {
        let mut f = vec![0u8; OVERHEAD + 64];
        for (i, b) in f[OVERHEAD..].iter_mut().enumerate() {
            *b = i as u8;
        }
        let n = encode(&header(64), &mut f);
        for bit in (ETH_HDR * 8)..(n * 8) {
            let mut g = f.clone();
            g[bit / 8] ^= 1 << (bit % 8);
            assert!(decode(&g[..n]).is_err(), "bit {bit} flip accepted");
        }
    }

    #[test]
    fn wrong_token_fails_the_check() {
        let mut f = vec![0u8; OVERHEAD];
        encode(&header(0), &mut f);
        // Rewriting the token in clear without the seal is caught.
        f[ETH_HDR + 16] ^= 0x80;
        assert_eq!(decode(&f).unwrap_err(), FrameError::Check);
    }

    proptest! {
        #[test]
        fn decode_never_panics(data in proptest::collection::vec(any::<u8>(), 0..2000)) {
            let _ = decode(&data);
        }

        #[test]
        fn decode_never_panics_on_plausible_headers(
            mut data in proptest::collection::vec(any::<u8>(), OVERHEAD..OVERHEAD + 300),
            kind in 0u8..8, len in any::<u16>())
        {
            data[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
            data[ETH_HDR + 4] = VERSION;
            data[ETH_HDR + 5] = kind;
            data[ETH_HDR + 38..ETH_HDR + 40].copy_from_slice(&len.to_be_bytes());
            let _ = decode(&data);
        }

        #[test]
        fn encode_decode_roundtrip(seq in any::<u32>(), ack in any::<u32>(), sack in any::<u64>(),
                                   session in any::<u64>(), token in any::<u64>(),
                                   payload in proptest::collection::vec(any::<u8>(), 0..1452)) {
            let mut h = header(payload.len() as u16);
            h.seq = seq; h.ack = ack; h.sack = sack; h.session = session; h.token = token;
            let mut f = vec![0u8; OVERHEAD + payload.len()];
            f[OVERHEAD..].copy_from_slice(&payload);
            encode(&h, &mut f);
            let (d, p) = decode(&f).unwrap();
            prop_assert_eq!(d, h);
            prop_assert_eq!(p, &payload[..]);
        }
    }
}
