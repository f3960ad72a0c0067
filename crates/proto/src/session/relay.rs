//! The agent's end of a third-party transfer (issue 19, docs/PROTOCOL.md
//! "Third-party transfers"): after RelayOpen the relaying daemon sends
//! RelayProgress any number of times, at most one RelayPlaced (issue 36)
//! and only when the RelayOpen frame asked for it, then RelayDone; an
//! Error instead refuses the relay.

use crate::control::Control;
use crate::frame::PLACED_FLAG;
use crate::ProtoError;

/// What the agent has received of a relay so far.
#[derive(Debug, Default)]
pub struct RelayMachine {
    /// The RelayOpen frame carried PLACED_FLAG.
    asked: bool,
    /// A RelayPlaced arrived.
    placed: bool,
    /// RelayDone or Error arrived: nothing more may.
    done: bool,
}

impl RelayMachine {
    /// A relay whose RelayOpen was sent with frame `flags`.
    pub fn new(flags: u8) -> Self {
        RelayMachine {
            asked: flags & PLACED_FLAG != 0,
            ..Default::default()
        }
    }

    /// Check a message from the relaying daemon: RelayPlaced unasked,
    /// twice, after RelayDone, or malformed ([`crate::control::RelayPlaced::check`]),
    /// and anything but RelayProgress, RelayPlaced, RelayDone and Error
    /// are protocol errors.
    pub fn on_recv(&mut self, m: &Control) -> Result<(), ProtoError> {
        let unexpected = |state| ProtoError::Unexpected {
            got: m.name(),
            state,
        };
        if self.done {
            return Err(unexpected("relay done"));
        }
        match m {
            Control::RelayProgress { .. } if !self.placed => {}
            Control::RelayPlaced(p) if self.asked && !self.placed => {
                p.check()?;
                self.placed = true;
            }
            Control::RelayDone(_) | Control::Error { .. } => self.done = true,
            _ if self.placed => return Err(unexpected("awaiting RelayDone")),
            _ => return Err(unexpected("awaiting RelayProgress or RelayDone")),
        }
        Ok(())
    }
}
