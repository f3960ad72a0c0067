//! Blocking frame I/O over a [`Link`]: the thin layer between the sans-I/O
//! protocol crate and real streams.

use std::io::{self, IoSlice, Read, Write};

use ramsys_proto::frame::{FrameHeader, FrameKind, HEADER_LEN};
use ramsys_proto::{parse_preamble, preamble, Control, ProtoError, PREAMBLE_LEN, VERSION};

use crate::transport::Link;
use crate::types::error::EngineError;

/// Write all of several slices, with as few syscalls as the kernel allows.
pub fn write_all_vectored(w: &mut dyn Write, bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    let mut bufs = bufs;
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "connection closed",
                ))
            }
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Send our preamble and check the peer's (version handshake).
pub fn exchange_preamble(link: &mut dyn Link) -> Result<(), EngineError> {
    link.write_all(&preamble(VERSION))?;
    link.flush()?;
    let mut p = [0u8; PREAMBLE_LEN];
    let mut got = 0;
    while got < PREAMBLE_LEN {
        match link.read(&mut p[got..]) {
            // Closed before a byte: a client that dialled a link it then
            // did not need (session::PreLinks::resize), not a stranger.
            Ok(0) if got == 0 => return Err(EngineError::PeerClosed),
            Ok(0) => return Err(ProtoError::BadMagic.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let theirs = parse_preamble(&p)?;
    if theirs != VERSION {
        return Err(ProtoError::VersionMismatch {
            ours: VERSION,
            theirs,
        }
        .into());
    }
    Ok(())
}

/// Send one control message.
pub fn send_control(link: &mut dyn Write, m: &Control) -> Result<(), EngineError> {
    send_control_flagged(link, m, 0)
}

/// [`send_control`] with `flags` in the frame header (frame::WINDOWS_FLAG).
pub fn send_control_flagged(
    link: &mut dyn Write,
    m: &Control,
    flags: u8,
) -> Result<(), EngineError> {
    let body = m.encode()?;
    let mut h = FrameHeader::new(FrameKind::Control, 0, body.len() as u32);
    h.flags = flags;
    let h = h.encode();
    write_all_vectored(link, &mut [IoSlice::new(&h), IoSlice::new(&body)])?;
    Ok(())
}

/// Read one frame header; Ok(None) on a clean end of stream.
pub fn read_header(link: &mut dyn Read, max_data: u32) -> Result<Option<FrameHeader>, EngineError> {
    let mut h = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match link.read(&mut h[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Some(FrameHeader::decode(&h, max_data)?))
}

/// Receive one control message; end of stream is an error.
pub fn recv_control(link: &mut dyn Read) -> Result<Control, EngineError> {
    recv_control_flags(link).map(|(m, _)| m)
}

/// [`recv_control`] and its frame's flags (a Hello's
/// frame::HELLO_PATH_FLAG).
pub fn recv_control_flags(link: &mut dyn Read) -> Result<(Control, u8), EngineError> {
    let h = read_header(link, 0)?.ok_or(EngineError::PeerClosed)?;
    if h.kind != FrameKind::Control {
        return Err(ProtoError::Unexpected {
            got: "non-control frame",
            state: "control link",
        }
        .into());
    }
    let body = read_body(link, h.len as usize)?;
    Ok((Control::decode(&body)?, h.flags))
}

/// Read a `len`-byte frame body. The buffer grows with what arrives
/// (issue 34): a peer announcing a 1 MiB message and sending nothing
/// makes the daemon allocate nothing for it.
fn read_body(link: &mut dyn Read, len: usize) -> Result<Vec<u8>, EngineError> {
    let mut body = Vec::with_capacity(len.min(64 << 10));
    link.take(len as u64).read_to_end(&mut body)?;
    if body.len() < len {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
    }
    Ok(body)
}

/// Send a CREDIT frame.
pub fn send_credit(link: &mut dyn Write, n: u32) -> io::Result<()> {
    let mut b = [0u8; HEADER_LEN + 4];
    b[..HEADER_LEN].copy_from_slice(&FrameHeader::new(FrameKind::Credit, 0, 4).encode());
    b[HEADER_LEN..].copy_from_slice(&n.to_le_bytes());
    link.write_all(&b)
}

/// Send a CREDIT frame, sealed when `seal` is given: flag 1, n in clear,
/// then the AEAD tag over header + n (nothing is encrypted; the tag binds
/// n to this link and position, docs/PROTOCOL.md "CREDIT and END").
pub fn send_credit_sealed(
    link: &mut dyn Write,
    n: u32,
    seal: Option<&mut crate::transport::crypto::StreamSeal>,
) -> io::Result<()> {
    let Some(seal) = seal else {
        return send_credit(link, n);
    };
    use ramsys_proto::frame::{CREDIT_SEALED_FLAG, CREDIT_SEALED_LEN};
    let mut b = [0u8; HEADER_LEN + CREDIT_SEALED_LEN as usize];
    let mut h = FrameHeader::new(FrameKind::Credit, 0, CREDIT_SEALED_LEN);
    h.flags = CREDIT_SEALED_FLAG;
    b[..HEADER_LEN].copy_from_slice(&h.encode());
    b[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&n.to_le_bytes());
    let tag = seal.seal(&b[..HEADER_LEN + 4], &mut []);
    b[HEADER_LEN + 4..].copy_from_slice(&tag);
    link.write_all(&b)
}

/// Send an END frame.
pub fn send_end(link: &mut dyn Write) -> io::Result<()> {
    link.write_all(&FrameHeader::new(FrameKind::End, 0, 0).encode())
}

/// Send a final message and close so that the peer can read it: half-close
/// our side, then discard what the peer still sends (bounded), so the
/// kernel does not answer its in-flight data with a reset that would
/// destroy our message before it is read.
pub fn send_final(link: &mut dyn Link, m: &Control) {
    let _ = send_control(link, m);
    let _ = link.flush();
    link.shutdown_write();
    let _ = link.set_read_timeout(Some(std::time::Duration::from_millis(500)));
    let mut sink = [0u8; 65536];
    let mut total = 0usize;
    while total < 64 << 20 {
        match link.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n,
        }
    }
}

// Handshake pieces shared by the control and data links (crate::session)
// and by replacement links (crate::session::relink).

/// The one-line error for a connection that could not be made or broke
/// during the handshake.
pub(crate) fn connect_err(addr: &str, e: std::io::Error) -> EngineError {
    EngineError::local(format!("cannot connect to {addr}: {e}"))
}

/// Send several control messages in one write (one segment on the wire).
pub(crate) fn send_batch(
    link: &mut dyn Link,
    prefix: &[u8],
    msgs: &[&Control],
) -> Result<(), EngineError> {
    send_batch_flagged(link, prefix, msgs, 0)
}

/// [`send_batch`] with `flags` in every frame header (a Hello's
/// frame::HELLO_PATH_FLAG).
pub(crate) fn send_batch_flagged(
    link: &mut dyn Link,
    prefix: &[u8],
    msgs: &[&Control],
    flags: u8,
) -> Result<(), EngineError> {
    let mut buf = prefix.to_vec();
    for m in msgs {
        let body = m.encode()?;
        let mut h = ramsys_proto::frame::FrameHeader::new(
            ramsys_proto::frame::FrameKind::Control,
            0,
            body.len() as u32,
        );
        h.flags = flags;
        buf.extend_from_slice(&h.encode());
        buf.extend_from_slice(&body);
    }
    link.write_all(&buf)?;
    link.flush()?;
    Ok(())
}

pub(crate) fn read_preamble(link: &mut dyn Link, addr: &str) -> Result<(), EngineError> {
    let mut p = [0u8; ramsys_proto::PREAMBLE_LEN];
    link.read_exact(&mut p).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => EngineError::Proto(ProtoError::BadMagic),
        _ => connect_err(addr, e),
    })?;
    let theirs = ramsys_proto::parse_preamble(&p)?;
    if theirs != ramsys_proto::VERSION {
        return Err(ProtoError::VersionMismatch {
            ours: ramsys_proto::VERSION,
            theirs,
        }
        .into());
    }
    Ok(())
}

/// Send preamble + `first` (Join or Rejoin) in one segment and wait for
/// JoinOk.
pub(crate) fn handshake_data_link(
    mut l: Box<dyn Link>,
    addr: &str,
    first: &Control,
) -> Result<Box<dyn Link>, EngineError> {
    send_batch(&mut *l, &preamble(ramsys_proto::VERSION), &[first])?;
    read_preamble(&mut *l, addr)?;
    match recv_control(&mut *l)? {
        Control::JoinOk => Ok(l),
        Control::Error { message, .. } => Err(EngineError::Refused(message)),
        other => Err(ProtoError::Unexpected {
            got: other.name(),
            state: "awaiting JoinOk",
        }
        .into()),
    }
}
