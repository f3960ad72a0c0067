//! What one direction of an in-memory link writes, seen frame by frame
//! (docs/PROTOCOL.md framing): each frame is recorded in the net's
//! transcript with its round-trip depth, and the faults planned for the
//! direction act on whole frames (issue 37): a DATA frame lost, corrupted
//! or overtaken, the link cut after so many bytes. A stream that does not
//! parse as frames (a sealed control link) passes through unobserved.

use std::io;
use std::time::Duration;

use ramsys_proto::frame::{FrameHeader, FrameKind, HEADER_LEN, MAX_DATA_BODY};
use ramsys_proto::{Control, PREAMBLE_LEN};

use super::pipe::Pipe;

/// A fault planned for one direction of a link ([`super::Net::fault`]).
/// DATA frames are counted from 0 on that direction.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Reset the link once this many bytes have passed: a connection cut
    /// mid-stream (both ends fail at once, what was in flight is lost).
    CutAfter(u64),
    /// DATA frames `first..first + count` vanish (their writer saw them
    /// sent), then the link dies: what a dying TCP connection loses in
    /// flight. What was sent before arrives, then both ends fail. The
    /// sink reports what it got (Lost), the source sends the rest again
    /// (crate::session::relink).
    Lose { first: u64, count: u64 },
    /// One bit of DATA frame n's last byte flipped: a corrupt block the
    /// checksum (or the seal) catches, and the sink asks for again.
    Corrupt(u64),
    /// DATA frame n delivered after frame n + 1 (blocks carry their
    /// offsets, so order within a link does not matter to the sink).
    Swap(u64),
    /// Nothing past this many bytes is delivered, until lifted
    /// ([`super::Net::unstall`]): a stalled direction.
    StallAfter(u64),
    /// Every byte is delivered this long after it was written (on the
    /// net's clock).
    Delay(Duration),
}

/// What became of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    Delivered,
    /// Lost by [`Fault::Lose`] or by a cut in its middle.
    Lost,
    Corrupted,
    /// Held back by [`Fault::Swap`] and delivered after the next frame.
    Overtaken,
}

/// One frame (or preamble) as its writer sent it.
#[derive(Debug, Clone)]
pub struct Record {
    /// The link's label: "ctl", "data{stream}.{epoch}", or the name given.
    pub link: String,
    /// The writing end's host name.
    pub from: String,
    /// None for the version preamble.
    pub header: Option<FrameHeader>,
    /// Round trips behind it on this link: 1 for what an end writes
    /// before it has read anything, else one more than the deepest frame
    /// it had read (a Lamport clock per link end).
    pub depth: u64,
    /// The message of a CONTROL frame.
    pub control: Option<Control>,
    pub fate: Fate,
}

impl Record {
    pub fn kind(&self) -> Option<FrameKind> {
        self.header.map(|h| h.kind)
    }
    /// The control message's name, "" for other frames.
    pub fn name(&self) -> &'static str {
        self.control.as_ref().map_or("", |c| c.name())
    }
}

/// Where a tap's frames go.
pub(super) trait Sink {
    fn pipe(&self) -> &Pipe;
    /// Reset the whole link (both directions).
    fn reset(&self);
    /// End the whole link after what each direction has queued.
    fn die(&self);
    /// A frame passed: record it; a first control message may name the
    /// link (Join: "data{stream}.0").
    fn record(&self, r: Record);
    fn label(&self) -> String;
    fn name_by(&self, first: &Control);
    fn from(&self) -> String;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing seen yet: a preamble may come first.
    Start,
    Frames,
    /// Not frames: bytes pass unobserved.
    Opaque,
}

/// What happens to the frame passing now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    Pass,
    /// Lost; the last of a [`Fault::Lose`] run ends the link after it.
    Drop {
        reset: bool,
    },
    /// Its last byte flipped as it passes.
    Corrupt,
    /// Held until the next frame has passed.
    Hold,
}

/// The frame passing now: header known, body streaming through.
struct Current {
    header: FrameHeader,
    left: usize,
    depth: u64,
    act: Act,
    /// A CONTROL frame's body, kept to decode it.
    body: Vec<u8>,
    /// A held frame, whole.
    held: Vec<u8>,
}

/// One direction's frame splitter and fault plan. Bytes pass as they
/// come; only a frame header (8 bytes) waits for its rest, and a frame
/// held for a swap.
pub(super) struct Tap {
    mode: Mode,
    head: Vec<u8>,
    current: Option<Current>,
    data_frames: u64,
    passed: u64,
    held: Option<(Vec<u8>, u64)>,
    pub faults: Vec<Fault>,
    named: bool,
}

const _: () = assert!(PREAMBLE_LEN == HEADER_LEN);

impl Tap {
    pub fn new() -> Tap {
        Tap {
            mode: Mode::Start,
            head: Vec::with_capacity(HEADER_LEN),
            current: None,
            data_frames: 0,
            passed: 0,
            held: None,
            faults: Vec::new(),
            named: false,
        }
    }

    /// Pass `b` on to the pipe (blocking while it is full), frame by frame.
    pub fn write(&mut self, mut b: &[u8], depth: u64, out: &dyn Sink) -> io::Result<()> {
        while !b.is_empty() {
            if self.mode == Mode::Opaque {
                return self.send(b, depth, out);
            }
            let Some(cur) = &mut self.current else {
                let take = (HEADER_LEN - self.head.len()).min(b.len());
                self.head.extend_from_slice(&b[..take]);
                b = &b[take..];
                if self.head.len() == HEADER_LEN {
                    self.start(depth, out)?;
                }
                continue;
            };
            let k = cur.left.min(b.len());
            let (part, rest) = b.split_at(k);
            b = rest;
            cur.left -= k;
            if cur.header.kind == FrameKind::Control {
                cur.body.extend_from_slice(part);
            }
            let (act, last) = (cur.act, cur.left == 0);
            match act {
                Act::Pass => self.send(part, depth, out)?,
                Act::Corrupt if last && !part.is_empty() => {
                    let mut p = part.to_vec();
                    *p.last_mut().unwrap() ^= 0x20;
                    self.send(&p, depth, out)?;
                }
                Act::Corrupt => self.send(part, depth, out)?,
                Act::Drop { .. } => {}
                Act::Hold => cur.held.extend_from_slice(part),
            }
            if last {
                self.end(out)?;
            }
        }
        Ok(())
    }

    /// The writer is done: a held frame and a partial header go out now.
    pub fn flush(&mut self, out: &dyn Sink) -> io::Result<()> {
        if let Some((f, d)) = self.held.take() {
            self.send(&f, d, out)?;
        }
        let head = std::mem::take(&mut self.head);
        self.send(&head, 0, out)
    }

    /// A header (or the preamble) is complete.
    fn start(&mut self, depth: u64, out: &dyn Sink) -> io::Result<()> {
        let h: [u8; HEADER_LEN] = self.head[..].try_into().unwrap();
        let head = std::mem::take(&mut self.head);
        if self.mode == Mode::Start && ramsys_proto::parse_preamble(&h).is_ok() {
            self.mode = Mode::Frames;
            out.record(self.record(None, None, depth, Fate::Delivered, out));
            return self.send(&head, depth, out);
        }
        self.mode = Mode::Frames;
        let Ok(header) = FrameHeader::decode(&h, MAX_DATA_BODY) else {
            self.mode = Mode::Opaque;
            return self.send(&head, depth, out);
        };
        let act = self.act(&header);
        if header.kind != FrameKind::Data {
            // A held block goes before anything but another block.
            if let Some((f, d)) = self.held.take() {
                self.send(&f, d, out)?;
            }
        }
        let mut cur = Current {
            header,
            left: header.len as usize,
            depth,
            act,
            body: Vec::new(),
            held: Vec::new(),
        };
        match act {
            Act::Pass | Act::Corrupt => self.send(&head, depth, out)?,
            Act::Drop { .. } => {}
            Act::Hold => cur.held = head,
        }
        self.current = Some(cur);
        if header.len == 0 {
            self.end(out)?;
        }
        Ok(())
    }

    /// What the faults do to this frame (DATA frames count from 0).
    fn act(&mut self, h: &FrameHeader) -> Act {
        if h.kind != FrameKind::Data {
            return Act::Pass;
        }
        let n = self.data_frames;
        self.data_frames += 1;
        let mut act = Act::Pass;
        for f in &self.faults {
            match *f {
                Fault::Lose { first, count } if (first..first + count).contains(&n) => {
                    return Act::Drop {
                        reset: n + 1 == first + count,
                    }
                }
                Fault::Corrupt(k) if k == n => act = Act::Corrupt,
                Fault::Swap(k) if k == n => act = Act::Hold,
                _ => {}
            }
        }
        act
    }

    /// A frame has passed (or was dropped, or is held): record it.
    fn end(&mut self, out: &dyn Sink) -> io::Result<()> {
        let cur = self.current.take().expect("a frame in progress");
        let control = (cur.header.kind == FrameKind::Control)
            .then(|| Control::decode(&cur.body).ok())
            .flatten();
        if let (false, Some(c)) = (self.named, &control) {
            out.name_by(c);
            self.named = true;
        }
        let fate = match cur.act {
            Act::Pass => Fate::Delivered,
            Act::Drop { .. } => Fate::Lost,
            Act::Corrupt => Fate::Corrupted,
            Act::Hold => Fate::Overtaken,
        };
        let (h, depth) = (cur.header, cur.depth);
        out.record(self.record(Some(h), control, depth, fate, out));
        match cur.act {
            Act::Drop { reset: true } => out.die(),
            Act::Hold => self.held = Some((cur.held, depth)),
            // The frame that overtook a held one has passed.
            _ if h.kind == FrameKind::Data => {
                if let Some((f, d)) = self.held.take() {
                    self.send(&f, d, out)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Bytes onto the pipe, cut where a [`Fault::CutAfter`] says.
    fn send(&mut self, b: &[u8], depth: u64, out: &dyn Sink) -> io::Result<()> {
        let cut = self.faults.iter().find_map(|f| match f {
            Fault::CutAfter(n) if self.passed + b.len() as u64 > *n => Some(*n),
            _ => None,
        });
        if let Some(n) = cut {
            let keep = n.saturating_sub(self.passed) as usize;
            out.pipe().write_all(&b[..keep], depth)?;
            self.passed += keep as u64;
            out.reset();
            return Err(io::ErrorKind::ConnectionReset.into());
        }
        out.pipe().write_all(b, depth)?;
        self.passed += b.len() as u64;
        Ok(())
    }

    fn record(
        &self,
        header: Option<FrameHeader>,
        control: Option<Control>,
        depth: u64,
        fate: Fate,
        out: &dyn Sink,
    ) -> Record {
        Record {
            link: out.label(),
            from: out.from(),
            header,
            depth,
            control,
            fate,
        }
    }
}
