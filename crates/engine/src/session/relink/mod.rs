//! Lost data links: replace them and carry on (issue 9; docs/PROTOCOL.md,
//! "Lost links"; the accounting is `ramsys_proto::relink`).
//!
//! When a data link breaks mid-transfer the session goes on over the other
//! links. The sink reports how many blocks it accepted on the broken link
//! (Lost); the source re-reads what it sent there beyond that count and
//! queues it for whichever sender is free ([`requeue`]). The client (the end
//! that dials) dials a replacement (Rejoin, a fresh epoch per attempt) with
//! exponential back-off ([`Dialer`]); the server takes it from its
//! dispatcher. The transfer fails only when the control link dies or no
//! data link is left and none can be re-established within the budget.
//!
//! Both controllers (source.rs, sink.rs) keep one [`Streams`] and feed it
//! the events of their select loop; it owns the per-stream bookkeeping so
//! the controllers only start and stop threads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Sender};
use ramsys_proto::auth::rejoin_mac;
use ramsys_proto::control::Bytes32;
use ramsys_proto::relink::Backoff;
use ramsys_proto::Control;

use crate::transport::clock::Clock;
use crate::transport::wire::send_control;
use crate::transport::{Link, Transport};
use crate::types::error::EngineError;
use crate::types::stats::Stats;

// TCP_INFO readings of the live links, for stream growth (transport::grow).
mod telemetry;
// Re-reading what a lost link carried (issue 9).
mod requeue;
pub use requeue::Requeue;

/// Whether an error that ended a data thread is the link breaking (worth
/// replacing) rather than the peer breaking the protocol (fatal).
pub fn is_link_loss(e: &EngineError) -> bool {
    matches!(e, EngineError::Io(_) | EngineError::PeerClosed)
}

/// A replacement link, joined but not yet running.
pub struct Joined {
    pub stream: u16,
    pub epoch: u16,
    pub link: Box<dyn Link>,
    /// Already accepted (it waited for the old link's thread to end).
    pub accepted: bool,
}

/// How lost links of a session come back.
pub enum Relinks {
    /// This end cannot replace links (the session fails as before).
    None,
    /// We are the client: dial replacements.
    Dial(Arc<Dialer>),
    /// We are the server: the dispatcher hands us the peer's Rejoins
    /// (JoinOk not yet sent).
    Accept(Receiver<(u16, u16, Box<dyn Link>)>),
}

/// What the dialling threads and the dispatcher report.
pub enum LinkEvent {
    Up(Joined),
    /// Every attempt for `stream` failed; `reason` is the last error.
    GaveUp {
        stream: u16,
        attempts: u32,
        reason: String,
    },
}

/// Dials replacement links for one session (client side).
pub struct Dialer {
    pub transport: Arc<dyn Transport>,
    pub addr: String,
    pub session: u64,
    pub key: Bytes32,
    pub timeout: Duration,
    pub backoff: Backoff,
}

impl Dialer {
    /// One attempt: connect, Rejoin, wait for JoinOk.
    fn dial_once(&self, stream: u16, epoch: u16) -> Result<Box<dyn Link>, EngineError> {
        let l = self
            .transport
            .connect(&self.addr, self.timeout)
            .map_err(|e| EngineError::local(format!("cannot connect to {}: {e}", self.addr)))?;
        l.set_read_timeout(Some(self.timeout))?;
        let nonce = crate::transport::crypto::random32();
        let mac = rejoin_mac(&self.key, self.session, stream, epoch, &nonce);
        let m = Control::Rejoin {
            session: self.session,
            stream,
            epoch,
            nonce,
            mac,
        };
        crate::transport::wire::handshake_data_link(l, &self.addr, &m)
    }

    /// Dial `stream` in the background, epochs from `first_epoch` (one per
    /// attempt: the server may have taken a link whose JoinOk we never
    /// read), waiting per the back-off between attempts.
    fn spawn(
        self: &Arc<Self>,
        stream: u16,
        first_epoch: u16,
        tx: Sender<LinkEvent>,
        stats: Arc<Stats>,
        abort: Arc<AtomicBool>,
    ) {
        let d = self.clone();
        let _ = std::thread::Builder::new()
            .name(format!("redial-{stream}"))
            .spawn(move || {
                // The transport's clock: simulated in tests (transport::mem).
                let clock = d.transport.clock();
                let t0 = clock.now();
                let mut reason = String::from("no attempt made");
                let mut attempt = 0u32;
                while let Some(wait) = d.backoff.delay(attempt, clock.since(t0)) {
                    clock.sleep(wait);
                    if abort.load(Ordering::Relaxed) {
                        return;
                    }
                    let epoch = first_epoch.wrapping_add(attempt as u16);
                    attempt += 1;
                    match d.dial_once(stream, epoch) {
                        Ok(link) => {
                            let _ = tx.send(LinkEvent::Up(Joined {
                                stream,
                                epoch,
                                link,
                                accepted: false,
                            }));
                            return;
                        }
                        Err(e) => {
                            stats.link_retries.fetch_add(1, Ordering::Relaxed);
                            tracing::info!("re-dialling data stream {stream}: {e}");
                            reason = e.to_string();
                        }
                    }
                }
                let _ = tx.send(LinkEvent::GaveUp {
                    stream,
                    attempts: attempt,
                    reason,
                });
            });
    }
}

/// Where one stream stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// A thread runs on the current link.
    Live,
    /// The current link broke; a replacement may come.
    Lost,
    /// Ended normally, or lost for good (its work went to the others).
    Done,
    /// Added mid-transfer (issue 21, Control::AddStream): its first link
    /// (epoch 1) is being dialled or awaited.
    Joining,
}

struct Slot {
    state: State,
    epoch: u16,
    /// Highest epoch handed out or accepted (dial attempts use fresh ones).
    max_epoch: u16,
    /// Shutdown handle of the current link.
    handle: Option<Box<dyn Link>>,
    /// A replacement that arrived while the old link still had a thread.
    pending: Option<Joined>,
    /// That replacement, handed back to the event queue
    /// ([`Streams::requeue_arrival`]) and not yet taken from it: the
    /// stream is down but about to come back.
    requeued: bool,
    dialing: bool,
    /// Bytes acknowledged on the stream's earlier links, and the most
    /// seen on the current one ([`Streams::acked`]).
    acked_before: u64,
    acked_now: u64,
    /// Likewise the microseconds its links had data in flight
    /// ([`Streams::busy`]).
    busy_before: u64,
    busy_now: u64,
}

/// Per-stream bookkeeping of one session end.
pub struct Streams {
    slots: Vec<Slot>,
    relinks: Relinks,
    tx: Sender<LinkEvent>,
    /// Select on this in the controller loop.
    pub events: Receiver<LinkEvent>,
    stats: Arc<Stats>,
    abort: Arc<AtomicBool>,
    peer: String,
    /// First error that broke a link, and failed dial attempts.
    first_error: Option<String>,
    attempts: u32,
    /// Since when no link has been live (server side budget), on the
    /// links' clock (simulated in tests, transport::mem).
    all_down_since: Option<Instant>,
    budget: Duration,
    clock: Clock,
    /// Streams that ended normally.
    normal: usize,
    /// Every (stream, epoch) a thread ran on here.
    ran: std::collections::HashSet<(u16, u16)>,
    last_dial_error: Option<String>,
}

impl Streams {
    pub fn new(
        relinks: Relinks,
        handles: Vec<Box<dyn Link>>,
        peer: String,
        stats: Arc<Stats>,
        abort: Arc<AtomicBool>,
    ) -> Streams {
        let (tx, events) = unbounded();
        let n = handles.len();
        let clock = handles.first().map_or_else(Clock::default, |h| h.clock());
        let budget = match &relinks {
            Relinks::Dial(d) => d.backoff.budget,
            _ => Backoff::default().budget,
        };
        if let Relinks::Accept(rx) = &relinks {
            // The dispatcher's channel, forwarded into ours; ends when
            // either side is gone.
            let (rx, tx) = (rx.clone(), tx.clone());
            let _ = std::thread::Builder::new()
                .name("relink-accept".into())
                .spawn(move || {
                    while let Ok((stream, epoch, link)) = rx.recv() {
                        if tx
                            .send(LinkEvent::Up(Joined {
                                stream,
                                epoch,
                                link,
                                accepted: false,
                            }))
                            .is_err()
                        {
                            break;
                        }
                    }
                });
        }
        Streams {
            slots: handles
                .into_iter()
                .map(|h| Slot {
                    state: State::Live,
                    epoch: 0,
                    max_epoch: 0,
                    handle: Some(h),
                    pending: None,
                    requeued: false,
                    dialing: false,
                    acked_before: 0,
                    acked_now: 0,
                    busy_before: 0,
                    busy_now: 0,
                })
                .collect(),
            relinks,
            tx,
            events,
            stats,
            abort,
            peer,
            first_error: None,
            attempts: 0,
            all_down_since: None,
            budget: budget + Duration::from_secs(5),
            clock,
            normal: 0,
            last_dial_error: None,
            ran: (0..n as u16).map(|i| (i, 0)).collect(),
        }
    }

    /// Streams so far, added ones included.
    pub fn count(&self) -> usize {
        self.slots.len()
    }

    /// A stream added mid-transfer (issue 21): a slot awaiting its first
    /// link, which comes as a Rejoin with epoch 1 (epoch 0 is the links
    /// dialled at the start, so the AEAD nonces stay apart). The client
    /// starts dialling it (a push's source once the sink granted it, a
    /// pull's sink as it grants it); the server waits for it (a pull's
    /// source makes the slot as it asks, since the Rejoin may overtake
    /// the grant). Returns its number.
    pub fn add(&mut self) -> u16 {
        let stream = self.slots.len() as u16;
        let mut slot = Slot {
            state: State::Joining,
            epoch: 0,
            max_epoch: 0,
            handle: None,
            pending: None,
            requeued: false,
            dialing: false,
            acked_before: 0,
            acked_now: 0,
            busy_before: 0,
            busy_now: 0,
        };
        if let Relinks::Dial(d) = &self.relinks {
            slot.dialing = true;
            slot.max_epoch = d.backoff.tries as u16;
            d.spawn(
                stream,
                1,
                self.tx.clone(),
                self.stats.clone(),
                self.abort.clone(),
            );
        }
        self.slots.push(slot);
        stream
    }

    /// An added stream the peer refused (StreamAdded with 0 credits): its
    /// slot, made when it was asked for, ends unused.
    pub fn unwanted(&mut self, stream: u16) {
        if let Some(s) = self.slots.get_mut(stream as usize) {
            if s.state == State::Joining {
                s.state = State::Done;
            }
        }
    }

    /// Whether this end dials (the client): only it can add streams.
    pub fn dials(&self) -> bool {
        matches!(self.relinks, Relinks::Dial(_))
    }

    /// Whether lost links can be replaced at all.
    pub fn enabled(&self) -> bool {
        !matches!(self.relinks, Relinks::None)
    }

    pub fn epoch(&self, i: usize) -> u16 {
        self.slots[i].epoch
    }

    pub fn state(&self, i: usize) -> State {
        self.slots[i].state
    }

    /// The thread on stream `i` ended normally.
    pub fn ended(&mut self, i: usize) {
        self.normal += 1;
        self.slots[i].state = State::Done;
        self.slots[i].handle = None;
    }

    /// The thread on (`i`, `epoch`) ended because its link broke. Starts a
    /// re-dial on the client side. Returns a replacement that is already
    /// waiting, if any.
    pub fn lost(&mut self, i: usize, epoch: u16, e: &EngineError) -> Option<Joined> {
        let s = &mut self.slots[i];
        if s.epoch != epoch || s.state != State::Live {
            return None;
        }
        tracing::info!("data stream {i} lost: {e}");
        self.stats.links_lost.fetch_add(1, Ordering::Relaxed);
        if self.first_error.is_none() {
            self.first_error = Some(e.to_string());
        }
        s.state = State::Lost;
        s.handle = None;
        if let Some(p) = s.pending.take() {
            // Down until the caller starts it: the budget runs meanwhile.
            self.note_down();
            return Some(p);
        }
        if let Relinks::Dial(d) = &self.relinks {
            if !s.dialing {
                s.dialing = true;
                s.max_epoch = s.max_epoch.wrapping_add(1);
                let first = s.max_epoch;
                // Reserve the epochs the attempts may use.
                s.max_epoch = s.max_epoch.wrapping_add(d.backoff.tries as u16);
                d.spawn(
                    i as u16,
                    first,
                    self.tx.clone(),
                    self.stats.clone(),
                    self.abort.clone(),
                );
            }
        }
        self.note_down();
        None
    }

    fn note_down(&mut self) {
        if self.live() == 0 && self.all_down_since.is_none() {
            self.all_down_since = Some(self.clock.now());
        }
    }

    /// Whether a thread ever ran here on (`stream`, `epoch`). A sink asked
    /// about a link it never ran (the source's end joined, but our JoinOk
    /// or its dialler's answer was lost) answers Lost with 0 blocks.
    pub fn ran(&self, stream: u16, epoch: u16) -> bool {
        self.ran.contains(&(stream, epoch))
    }

    /// Close the current link of (`i`, `epoch`) so its thread ends (the
    /// peer saw it break first).
    pub fn close(&mut self, i: usize, epoch: u16) {
        if let Some(s) = self.slots.get(i) {
            if s.epoch == epoch && s.state == State::Live {
                if let Some(h) = &s.handle {
                    h.shutdown_both();
                }
            }
        }
    }

    /// A replacement arrived. Returns it when it can start now (the
    /// caller starts a thread on it and calls [`Self::started`]); keeps it
    /// while the old link's thread still runs (and closes that link), or
    /// drops it if it is stale or the stream has no use for it.
    pub fn arrived(&mut self, mut j: Joined) -> Option<Joined> {
        let server = matches!(self.relinks, Relinks::Accept(_));
        let Some(s) = self.slots.get_mut(j.stream as usize) else {
            if server {
                refuse(&mut j.link, "stream out of range");
            }
            return None;
        };
        if j.accepted {
            s.requeued = false;
            return (s.state == State::Lost).then_some(j);
        }
        if j.epoch <= s.epoch || s.state == State::Done {
            if server {
                refuse(&mut j.link, "stale or unneeded replacement link");
            }
            return None;
        }
        s.dialing = false;
        s.max_epoch = s.max_epoch.max(j.epoch);
        if server && send_control(&mut *j.link, &Control::JoinOk).is_err() {
            return None;
        }
        if s.state == State::Live {
            // The peer saw the old link break before we did.
            if let Some(h) = &s.handle {
                h.shutdown_both();
            }
            s.pending = Some(j);
            return None;
        }
        Some(j)
    }

    /// Hand a replacement that waited for its stream's old thread back to
    /// the event queue, to be started like a fresh arrival.
    pub fn requeue_arrival(&mut self, j: Joined) -> Result<(), EngineError> {
        // Already answered JoinOk when it arrived: start it as is.
        let mut j = j;
        j.accepted = true;
        if let Some(s) = self.slots.get_mut(j.stream as usize) {
            s.requeued = true;
        }
        self.tx
            .send(LinkEvent::Up(j))
            .map_err(|_| EngineError::local("link events closed"))
    }

    /// A thread now runs on the replacement (`i`, `epoch`), or on the
    /// first link of an added stream (then true).
    pub fn started(&mut self, i: usize, epoch: u16, handle: Box<dyn Link>) -> bool {
        let s = &mut self.slots[i];
        let added = s.state == State::Joining;
        s.acked_before += std::mem::take(&mut s.acked_now);
        s.busy_before += std::mem::take(&mut s.busy_now);
        s.state = State::Live;
        s.epoch = epoch;
        s.handle = Some(handle);
        self.ran.insert((i as u16, epoch));
        self.all_down_since = None;
        if added {
            tracing::info!("data stream {i} added");
        } else {
            self.stats.links_replaced.fetch_add(1, Ordering::Relaxed);
            tracing::info!("data stream {i} replaced (epoch {epoch})");
        }
        added
    }

    /// Every attempt to replace `stream` failed: it stays down. True if
    /// that ends the stream (its work goes to the others).
    pub fn gave_up(&mut self, stream: u16, attempts: u32, reason: String) -> bool {
        tracing::info!("data stream {stream} not replaced after {attempts} attempts: {reason}");
        self.attempts += attempts;
        self.last_dial_error = Some(reason);
        match self.slots.get_mut(stream as usize) {
            Some(s) if s.state == State::Lost && s.pending.is_none() => {
                s.dialing = false;
                s.state = State::Done;
                true
            }
            // An added stream that never came: nothing of it to end.
            Some(s) if s.state == State::Joining => {
                s.dialing = false;
                s.state = State::Done;
                false
            }
            Some(s) => {
                s.dialing = false;
                false
            }
            None => false,
        }
    }

    fn live(&self) -> usize {
        self.slots.iter().filter(|s| s.state == State::Live).count()
    }

    /// Lost streams that will not come back (given up) are Done; those
    /// still waiting are counted here.
    pub fn waiting(&self) -> usize {
        self.slots.iter().filter(|s| s.state == State::Lost).count()
    }

    /// After the work is complete: lost streams need no replacement.
    pub fn settle(&mut self) -> usize {
        let mut n = 0;
        for s in &mut self.slots {
            if s.state == State::Lost {
                s.state = State::Done;
                n += 1;
            } else if s.state == State::Joining {
                // Never counted as a sender: not in `n`.
                s.state = State::Done;
            }
        }
        n
    }

    /// Whether the transfer can still make progress; the reason if not.
    /// Called on every loop turn and tick.
    pub fn check(&self) -> Result<(), EngineError> {
        // A stream that ended normally means the data phase is over.
        if self.live() > 0 || self.normal > 0 {
            return Ok(());
        }
        let Some(first) = &self.first_error else {
            return Ok(());
        };
        // Given-up streams are Done; any other Done stream ended normally.
        // A replacement on its way through the event queue is hope on
        // either side (CI, 2026-11-27: the sink failed a push at once,
        // "did not reconnect", with the replacement already accepted). A
        // Lost stream holds no `pending` one: lost() hands it out.
        let coming = self
            .slots
            .iter()
            .any(|s| s.state == State::Lost && s.requeued);
        let hope = coming
            || match &self.relinks {
                Relinks::Dial(_) => self
                    .slots
                    .iter()
                    .any(|s| s.state == State::Lost && s.dialing),
                _ => self
                    .all_down_since
                    .is_some_and(|t| self.clock.since(t) <= self.budget),
            };
        if hope {
            return Ok(());
        }
        Err(EngineError::local(match &self.relinks {
            Relinks::Dial(_) => format!(
                "all data links lost to {}: {first}; {} reconnect attempts failed",
                self.peer, self.attempts
            ),
            _ => format!(
                "all data links lost to {}: {first}; the peer did not reconnect within {} s",
                self.peer,
                self.budget.as_secs()
            ),
        }))
    }
}

fn refuse(link: &mut Box<dyn Link>, why: &str) {
    crate::transport::wire::send_final(
        &mut **link,
        &Control::Error {
            code: 3,
            message: why.into(),
        },
    );
}

#[cfg(test)]
mod tests;
