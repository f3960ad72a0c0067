//! A session's control link as both ends use it (seed 000 Fig. 6-4): every
//! message sent or received passes the end's protocol machine
//! (ramsys_proto::session), an Abort or Error from the peer becomes an
//! error, and during the payload phase a thread of its own turns the
//! peer's messages into events for the end's select loop.

use crossbeam_channel::{unbounded, Receiver};
use ramsys_proto::session::{Phase, SinkMachine, SourceMachine};
use ramsys_proto::{Control, ProtoError};

use crate::transport::wire::{recv_control, recv_control_flags, send_control_flagged};
use crate::transport::Link;
use crate::types::error::EngineError;

/// The protocol machine of one end (ramsys_proto::session).
/// `flags` are those of the message's CONTROL frame (frame::WINDOWS_FLAG).
pub trait Machine {
    fn on_send(&mut self, m: &Control, flags: u8) -> Result<(), ProtoError>;
    fn on_recv(&mut self, m: &Control, flags: u8) -> Result<(), ProtoError>;
    fn phase(&self) -> Phase;
}

impl Machine for SourceMachine {
    fn on_send(&mut self, m: &Control, flags: u8) -> Result<(), ProtoError> {
        SourceMachine::on_send_flags(self, m, flags)
    }
    fn on_recv(&mut self, m: &Control, flags: u8) -> Result<(), ProtoError> {
        SourceMachine::on_recv_flags(self, m, flags)
    }
    fn phase(&self) -> Phase {
        SourceMachine::phase(self)
    }
}

impl Machine for SinkMachine {
    fn on_send(&mut self, m: &Control, flags: u8) -> Result<(), ProtoError> {
        SinkMachine::on_send_flags(self, m, flags)
    }
    fn on_recv(&mut self, m: &Control, flags: u8) -> Result<(), ProtoError> {
        SinkMachine::on_recv_flags(self, m, flags)
    }
    fn phase(&self) -> Phase {
        SinkMachine::phase(self)
    }
}

/// What the control reader thread delivers: a message or why it stopped.
pub type ControlEvent = Result<Control, EngineError>;

/// The control link and the machine that checks every message on it.
pub struct ControlLink<M> {
    pub link: Box<dyn Link>,
    pub machine: M,
    /// "source" or "sink": named in the error when the link is gone.
    peer: &'static str,
}

impl<M: Machine> ControlLink<M> {
    pub fn new(link: Box<dyn Link>, machine: M, peer: &'static str) -> Self {
        ControlLink {
            link,
            machine,
            peer,
        }
    }

    /// Send `m`, if the machine admits it now.
    pub fn send(&mut self, m: &Control) -> Result<(), EngineError> {
        self.send_flagged(m, 0)
    }

    /// [`Self::send`] with `flags` in the CONTROL frame's header
    /// (frame::WINDOWS_FLAG on Propose and Confirm).
    pub fn send_flagged(&mut self, m: &Control, flags: u8) -> Result<(), EngineError> {
        self.machine.on_send(m, flags)?;
        // A failed write here means the control link is gone: say so.
        send_control_flagged(&mut *self.link, m, flags).map_err(|e| match e {
            EngineError::Io(e) => {
                EngineError::Lost(format!("connection to the {} lost: {e}", self.peer))
            }
            e => e,
        })
    }

    /// Send `items` in as few messages as fit: each message (`wrap`) holds
    /// as many items as fit in half a CONTROL frame by their wire size
    /// (`size`), so a batch never nears the frame limit; nothing is sent
    /// for no items. One rule for every list the protocol batches
    /// (Entries, ScanFailed, Deleted).
    pub fn send_batched<T>(
        &mut self,
        items: impl IntoIterator<Item = T>,
        size: impl Fn(&T) -> usize,
        wrap: impl Fn(Vec<T>) -> Control,
    ) -> Result<(), EngineError> {
        let limit = ramsys_proto::frame::MAX_CONTROL_BODY as usize / 2;
        let (mut batch, mut bytes) = (Vec::new(), 0);
        for it in items {
            let sz = size(&it);
            if bytes + sz > limit && !batch.is_empty() {
                self.send(&wrap(std::mem::take(&mut batch)))?;
                bytes = 0;
            }
            bytes += sz;
            batch.push(it);
        }
        if !batch.is_empty() {
            self.send(&wrap(batch))?;
        }
        Ok(())
    }

    /// Receive the next message; the peer's Abort or Error is an error,
    /// and so is a message the machine does not admit now.
    pub fn recv(&mut self) -> Result<Control, EngineError> {
        self.recv_flagged().map(|(m, _)| m)
    }

    /// [`Self::recv`] and the flags of the message's CONTROL frame.
    pub fn recv_flagged(&mut self) -> Result<(Control, u8), EngineError> {
        let (m, flags) = recv_control_flags(&mut *self.link).map_err(|e| self.named_timeout(e))?;
        check_abort(&m)?;
        self.machine.on_recv(&m, flags)?;
        Ok((m, flags))
    }

    /// A read that timed out says what it waited for (issue 36): every
    /// wait is an idle timeout, renewed by each message (a scanning source
    /// sends an empty Entries batch now and then, request::walk).
    fn named_timeout(&self, e: EngineError) -> EngineError {
        match &e {
            EngineError::Io(io)
                if matches!(
                    io.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                let waited = match self.machine.phase() {
                    Phase::Negotiate => "its proposal or answer",
                    Phase::Metadata => "the file list",
                    Phase::Syncing => "the end of its comparison",
                    Phase::Payload => "data or its verdict",
                    Phase::Completing => "its verdict",
                    Phase::Done | Phase::Aborted => "its close",
                };
                EngineError::local(format!(
                    "no word from the {} within the idle timeout (--timeout) while waiting for {waited}",
                    self.peer
                ))
            }
            _ => e,
        }
    }

    /// Check a message the reader thread delivered, as [`Self::recv`] does.
    pub fn admit(&mut self, m: &Control) -> Result<(), EngineError> {
        check_abort(m)?;
        self.machine.on_recv(m, 0)?;
        Ok(())
    }

    /// The phase the machine is in.
    pub fn phase(&self) -> Phase {
        self.machine.phase()
    }

    /// Payload phase: a thread (named `name`) reads the peer's messages
    /// and hands them over as events, until the link fails or the
    /// receiving end is dropped. Its messages still pass [`Self::admit`].
    /// With `last` (a session on a kept link, issue 38) it also stops
    /// after the message `last` names (the peer's last of the session) and
    /// after an Abort or Error: the link's next message belongs to the
    /// next session, read by the link's owner. A sealed link's clones share
    /// its record state (transport::sealed), so nothing read is lost.
    pub fn spawn_reader(
        &self,
        name: &str,
        last: Option<fn(&Control) -> bool>,
    ) -> Result<Receiver<ControlEvent>, EngineError> {
        self.spawn_reader_idle(name, last, None)
    }

    /// [`Self::spawn_reader`] on a link whose reads may time out: while
    /// `idle` holds, a timeout is delivered (and the reader stops); once it
    /// is cleared, a read that times out is read again. A windowed sink
    /// waits for the records with its idle timeout (the source speaks at
    /// least every 2 s while it has records to send), then for data and
    /// digests with none (issue 36).
    pub fn spawn_reader_idle(
        &self,
        name: &str,
        last: Option<fn(&Control) -> bool>,
        idle: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    ) -> Result<Receiver<ControlEvent>, EngineError> {
        let (tx, rx) = unbounded();
        let mut link = self.link.try_clone_link()?;
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || loop {
                let r = recv_control(&mut *link);
                if let (Err(e), Some(idle)) = (&r, &idle) {
                    if is_timeout(e) && !idle.load(std::sync::atomic::Ordering::Acquire) {
                        continue;
                    }
                }
                let stop = match (&r, last) {
                    (Err(_), _) => true,
                    (Ok(m), Some(last)) => {
                        last(m) || matches!(m, Control::Abort { .. } | Control::Error { .. })
                    }
                    (Ok(_), None) => false,
                };
                if tx.send(r).is_err() || stop {
                    break;
                }
            })?;
        Ok(rx)
    }
}

/// A read that ran into the link's read timeout.
pub fn is_timeout(e: &EngineError) -> bool {
    matches!(e, EngineError::Io(io) if matches!(
        io.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    ))
}

/// The peer's Abort, Error or Redirect as the error it means.
pub fn check_abort(m: &Control) -> Result<(), EngineError> {
    match m {
        Control::Abort { reason } => Err(EngineError::PeerAborted(reason.clone())),
        Control::Error { message, .. } => Err(EngineError::Refused(message.clone())),
        Control::Redirect { addr, reason, mac } => Err(EngineError::Redirected {
            to: addr.clone(),
            reason: reason.clone(),
            mac: *mac,
        }),
        _ => Ok(()),
    }
}

/// A message the machine admitted but this phase of the end does not
/// handle: a protocol error rather than a panic.
pub fn unexpected(m: &Control, phase: Phase) -> EngineError {
    EngineError::local(format!(
        "protocol error: unexpected {} in phase {phase:?}",
        m.name()
    ))
}
