//! Frame header: every byte after the preamble travels in frames.
//!
//! ```text
//! 0      1      2             4                    8
//! | kind | flags|   aux (u16) |   body length (u32) |  body ...
//! ```
//! All integers are little endian. `aux` carries the segment count of a DATA
//! frame and is zero otherwise. Limits are enforced *before* any body byte is
//! read, so a peer can never make us allocate more than the limit.

use crate::ProtoError;

/// Header length on the wire.
pub const HEADER_LEN: usize = 8;
/// Largest control message body we accept (metadata batches are split to fit).
pub const MAX_CONTROL_BODY: u32 = 1 << 20;
/// Absolute ceiling for a DATA body (block size is negotiated below this).
pub const MAX_DATA_BODY: u32 = 64 << 20;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// A postcard-encoded [`crate::Control`] message.
    Control = 1,
    /// A payload block: checksum, segment table, bytes ([`crate::data`]).
    Data = 2,
    /// Sink to source on a data link: `u32` more blocks may be sent.
    Credit = 3,
    /// Source to sink on a data link: no more blocks on this link.
    End = 4,
}

impl FrameKind {
    pub fn from_u8(v: u8) -> Result<Self, ProtoError> {
        Ok(match v {
            1 => FrameKind::Control,
            2 => FrameKind::Data,
            3 => FrameKind::Credit,
            4 => FrameKind::End,
            other => return Err(ProtoError::UnknownFrame(other)),
        })
    }
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub flags: u8,
    pub aux: u16,
    pub len: u32,
}

impl FrameHeader {
    pub fn new(kind: FrameKind, aux: u16, len: u32) -> Self {
        FrameHeader {
            kind,
            flags: 0,
            aux,
            len,
        }
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = self.kind as u8;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.aux.to_le_bytes());
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decode and check the header against the limits for its kind.
    /// `max_data` is the negotiated DATA body limit (block size + table).
    pub fn decode(b: &[u8; HEADER_LEN], max_data: u32) -> Result<Self, ProtoError> {
        let kind = FrameKind::from_u8(b[0])?;
        let h = FrameHeader {
            kind,
            flags: b[1],
            aux: u16::from_le_bytes([b[2], b[3]]),
            len: ramsys_framing::le_len(b, 4),
        };
        let limit = match kind {
            FrameKind::Control => MAX_CONTROL_BODY,
            FrameKind::Data => max_data.min(MAX_DATA_BODY),
            FrameKind::Credit => CREDIT_SEALED_LEN,
            FrameKind::End => 0,
        };
        if h.len > limit {
            return Err(ProtoError::FrameTooLarge {
                len: h.len as u64,
                limit: limit as u64,
            });
        }
        // A credit is n (4 bytes), plus a 16-byte tag when the link is
        // sealed (flag 1; docs/PROTOCOL.md "CREDIT and END").
        if kind == FrameKind::Credit {
            let want = match h.flags {
                0 => 4,
                CREDIT_SEALED_FLAG => CREDIT_SEALED_LEN,
                _ => return Err(ProtoError::malformed("credit frame", "unknown flags")),
            };
            if h.len != want {
                return Err(ProtoError::malformed(
                    "credit frame",
                    format!("body must be {want} bytes"),
                ));
            }
        }
        if kind != FrameKind::Data && h.aux != 0 {
            return Err(ProtoError::malformed("frame header", "aux must be 0"));
        }
        Ok(h)
    }
}

/// Header flag of a sealed frame (a DATA payload or a CREDIT followed by
/// its AEAD tag).
pub const CREDIT_SEALED_FLAG: u8 = 1;
/// Header flag of the CONTROL frame carrying a client's Hello: the client
/// takes the daemon's TCP limits in its Challenge ([`crate::auth::Accept`])
/// and [`crate::Control::GrownLinks`] in place of Grown (issue 21). A
/// daemon never sends either to a client that did not set it.
pub const HELLO_PATH_FLAG: u8 = 1;
/// Header flag of the CONTROL frame carrying a Propose (the source can
/// run the metadata in windows) and of the one carrying the Confirm that
/// answers it (the sink takes them: a windowed session, issue 36;
/// docs/PROTOCOL.md "Windows"). A peer of before ignores CONTROL flags, so
/// it keeps today's whole-tree phases.
pub const WINDOWS_FLAG: u8 = 2;
/// Header flag of the CONTROL frame carrying a Propose, in place of
/// [`WINDOWS_FLAG`], for a session a sink of before would refuse in
/// windows: an archive copy (Preserve) or a `--delete` sync. A sink of
/// before ignores it and keeps the whole-tree phases; a sink of now takes
/// it as [`WINDOWS_FLAG`] and answers with WINDOWS_FLAG on its Confirm.
pub const WIDE_WINDOWS_FLAG: u8 = 4;
/// Header flag of the CONTROL frame carrying a Propose, in place of the
/// two above, for a dry run (SyncMode DRY_RUN), which a sink of before
/// refused in windows: it ignores this flag and keeps the whole-tree
/// phases; a sink of now takes it as [`WINDOWS_FLAG`].
pub const DRY_WINDOWS_FLAG: u8 = 16;
/// Likewise for a resume (SyncMode RESUME), which a sink of before refused
/// in windows.
pub const RESUME_WINDOWS_FLAG: u8 = 32;
/// Any of them on a Propose: the source can run windows.
pub const ANY_WINDOWS: u8 =
    WINDOWS_FLAG | WIDE_WINDOWS_FLAG | DRY_WINDOWS_FLAG | RESUME_WINDOWS_FLAG;
/// Header flag of the CONTROL frame carrying a Propose that proposes
/// windows: the source keeps its records within
/// [`crate::session::FIRST_WINDOW`] until it has read the answer, and takes
/// a window from the sink. On the Confirm that takes windows: a
/// [`crate::Control::Window`] follows right behind it (the sink's memory
/// budget per session, issue 36; docs/PROTOCOL.md "Windows"). A peer of
/// before ignores it: an old sink sends no Window, an old source gets none.
pub const WINDOW_LIMIT_FLAG: u8 = 8;
/// Header flag of the CONTROL frame carrying a Propose of a session that
/// sends pieces of big files (a striped push, issue 36): the sink names
/// the big files in place in a [`crate::Control::Placed`] right before its
/// Complete, so the agent can tell a file no sink placed. A sink of before
/// ignores it and sends none. On the CONTROL frame of a RelayOpen (a
/// striped transfer between two sites): the relaying daemon sends a
/// [`crate::Control::RelayPlaced`] right before its RelayDone; a daemon of
/// before ignores it and sends none.
pub const PLACED_FLAG: u8 = 64;
/// Header flag of the CONTROL frame carrying a windowed Propose of a
/// `--delete` or resume sync, and of the Confirm that takes it: the source
/// names each directory whose every entry it has sent
/// ([`crate::Control::DirsDone`]), and the sink deletes that directory's
/// extra entries then and forgets its names (issue 36, docs/PROTOCOL.md
/// "Windows", "Directories done"). A sink of before ignores it and sends
/// a Confirm without it: the source then sends no DirsDone, and the sink
/// deletes at the session's end as before.
pub const DIRS_DONE_FLAG: u8 = 128;

/// Body of a sealed CREDIT: n (u32 LE) and a 16-byte tag over header + n.
pub const CREDIT_SEALED_LEN: u32 = 4 + 16;

/// Incremental frame splitter for byte streams that arrive in pieces
/// (used by tests and fuzzing; the engine reads headers directly into
/// pre-allocated buffers). Buffers at most one header plus one body.
pub struct FrameDecoder {
    inner: ramsys_framing::Decoder,
    max_data: u32,
}

impl FrameDecoder {
    pub fn new(max_data: u32) -> Self {
        FrameDecoder {
            inner: ramsys_framing::Decoder::new(),
            max_data,
        }
    }

    /// Append bytes received from the peer.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.inner.feed(bytes);
    }

    /// Take the next complete frame, if any.
    pub fn next_frame(&mut self) -> Result<Option<(FrameHeader, Vec<u8>)>, ProtoError> {
        let max = self.max_data;
        let decode = |b: &[u8]| FrameHeader::decode(b.try_into().expect("header"), max);
        let Some((hb, body)) = self
            .inner
            .next_frame(HEADER_LEN, |b| Ok(decode(b)?.len as usize))?
        else {
            return Ok(None);
        };
        Ok(Some((decode(&hb)?, body)))
    }

    /// Bytes held but not yet returned as frames.
    pub fn pending(&self) -> usize {
        self.inner.pending()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn credit_frames_are_4_bytes_or_20_sealed() {
        let enc = |flags: u8, len: u32| {
            let mut h = FrameHeader::new(FrameKind::Credit, 0, len);
            h.flags = flags;
            FrameHeader::decode(&h.encode(), 1 << 20)
        };
        assert!(enc(0, 4).is_ok());
        assert!(enc(CREDIT_SEALED_FLAG, CREDIT_SEALED_LEN).is_ok());
        assert!(enc(0, CREDIT_SEALED_LEN).is_err());
        assert!(enc(CREDIT_SEALED_FLAG, 4).is_err());
        assert!(enc(2, 4).is_err());
        assert!(enc(CREDIT_SEALED_FLAG, 21).is_err());
    }

    use super::*;

    #[test]
    fn header_roundtrip() {
        let h = FrameHeader::new(FrameKind::Data, 3, 4096);
        assert_eq!(FrameHeader::decode(&h.encode(), 1 << 20).unwrap(), h);
    }

    #[test]
    fn oversized_rejected_before_body() {
        let h = FrameHeader::new(FrameKind::Control, 0, MAX_CONTROL_BODY + 1);
        assert!(matches!(
            FrameHeader::decode(&h.encode(), 1 << 20),
            Err(ProtoError::FrameTooLarge { .. })
        ));
        let h = FrameHeader::new(FrameKind::Data, 1, (1 << 20) + 1);
        assert!(FrameHeader::decode(&h.encode(), 1 << 20).is_err());
    }

    #[test]
    fn unknown_kind_rejected() {
        let mut b = FrameHeader::new(FrameKind::End, 0, 0).encode();
        b[0] = 99;
        assert_eq!(
            FrameHeader::decode(&b, 0),
            Err(ProtoError::UnknownFrame(99))
        );
    }

    #[test]
    fn decoder_splits_stream() {
        let mut d = FrameDecoder::new(1024);
        let mut bytes = FrameHeader::new(FrameKind::Credit, 0, 4).encode().to_vec();
        bytes.extend_from_slice(&7u32.to_le_bytes());
        bytes.extend_from_slice(&FrameHeader::new(FrameKind::End, 0, 0).encode());
        d.feed(&bytes[..5]);
        assert!(d.next_frame().unwrap().is_none());
        d.feed(&bytes[5..]);
        let (h, body) = d.next_frame().unwrap().unwrap();
        assert_eq!(h.kind, FrameKind::Credit);
        assert_eq!(body, 7u32.to_le_bytes());
        let (h, _) = d.next_frame().unwrap().unwrap();
        assert_eq!(h.kind, FrameKind::End);
        assert_eq!(d.pending(), 0);
    }
}
