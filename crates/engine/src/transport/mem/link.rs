//! An in-memory link: two [`Pipe`]s, one per direction, each written
//! through its end's [`Tap`]. Ends behave as a TCP socket's: clones share
//! the stream, the last handle dropped (or `shutdown_both`) closes it.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ramsys_proto::Control;

use super::pipe::Pipe;
use super::tap::{Fault, Record, Sink, Tap};
use super::NetInner;
use crate::transport::clock::Clock;
use crate::transport::Link;

/// What both ends of one link share. Index 0 is the end that dialled
/// (or the first of a pair), 1 the other; `pipes[i]` carries what end i
/// writes.
pub(super) struct LinkCore {
    pub id: usize,
    pub net: Arc<NetInner>,
    pub label: Mutex<String>,
    pub hosts: [String; 2],
    pub pipes: [Pipe; 2],
    taps: [Mutex<Tap>; 2],
    /// Faults planned for end i's direction, taken by its tap on its next
    /// write (the tap may be busy in another thread when they are added).
    pending: [Mutex<Vec<Fault>>; 2],
}

impl LinkCore {
    pub fn new(id: usize, net: Arc<NetInner>, label: String, hosts: [String; 2]) -> LinkCore {
        let (cap, clock) = (net.buffer(), net.clock.clone());
        LinkCore {
            id,
            net,
            label: Mutex::new(label),
            hosts,
            pipes: [Pipe::new(cap, clock.clone()), Pipe::new(cap, clock)],
            taps: [Mutex::new(Tap::new()), Mutex::new(Tap::new())],
            pending: Default::default(),
        }
    }

    pub fn label(&self) -> String {
        self.label.lock().unwrap().clone()
    }

    /// Plan `f` for what end `side` writes. Stalls and delays are the
    /// pipe's; the rest act on frames in the tap.
    pub fn plan(&self, side: usize, f: Fault) {
        match f {
            Fault::StallAfter(n) => self.pipes[side].stall_at(Some(n)),
            Fault::Delay(d) => self.pipes[side].set_delay(d),
            f => self.pending[side].lock().unwrap().push(f),
        }
    }

    pub fn reset(&self) {
        self.pipes[0].reset();
        self.pipes[1].reset();
    }

    /// End `side` closes: its reads end, the peer reads end of stream.
    fn close(&self, side: usize) {
        if let Ok(mut t) = self.taps[side].try_lock() {
            let _ = t.flush(&Out { core: self, side });
        }
        self.pipes[side].close_write();
        self.pipes[1 - side].shut_read();
    }

    fn write(&self, side: usize, b: &[u8], depth: u64) -> io::Result<()> {
        self.pipes[side].writable()?;
        let mut tap = self.taps[side].lock().unwrap();
        tap.faults.append(&mut self.pending[side].lock().unwrap());
        tap.write(b, depth, &Out { core: self, side })
    }
}

/// A tap's view of its link.
struct Out<'a> {
    core: &'a LinkCore,
    side: usize,
}

impl Sink for Out<'_> {
    fn pipe(&self) -> &Pipe {
        &self.core.pipes[self.side]
    }
    fn reset(&self) {
        self.core.reset();
    }
    fn die(&self) {
        self.core.pipes[0].fail_after_queued();
        self.core.pipes[1].fail_after_queued();
    }
    fn record(&self, r: Record) {
        self.core.net.record(r);
    }
    fn label(&self) -> String {
        self.core.label()
    }
    /// The dialler's first message names a link that has no name yet:
    /// a data link by its stream and epoch; then the faults planned for
    /// that name attach.
    fn name_by(&self, first: &Control) {
        let name = {
            let mut l = self.core.label.lock().unwrap();
            if !l.is_empty() {
                return;
            }
            *l = match first {
                Control::Join { stream, .. } => format!("data{stream}.0"),
                Control::Rejoin { stream, epoch, .. } => format!("data{stream}.{epoch}"),
                Control::Hello { .. } => "ctl".into(),
                _ => format!("link{}", self.core.id),
            };
            l.clone()
        };
        // Its faults take effect from the tap's next write.
        self.core.net.attach(self.core, &name);
    }
    fn from(&self) -> String {
        self.core.hosts[self.side].clone()
    }
}

/// One end of a link, shared by its handles.
pub(super) struct End {
    pub core: Arc<LinkCore>,
    pub side: usize,
    read_timeout: Mutex<Option<Duration>>,
    /// The deepest frame read on this end (see tap::Record::depth).
    seen: AtomicU64,
}

impl Drop for End {
    fn drop(&mut self) {
        self.core.close(self.side);
    }
}

/// A handle on one end of an in-memory link.
pub struct MemLink(Arc<End>);

impl MemLink {
    pub(super) fn new(core: Arc<LinkCore>, side: usize) -> MemLink {
        MemLink(Arc::new(End {
            core,
            side,
            read_timeout: Mutex::new(None),
            seen: AtomicU64::new(0),
        }))
    }

    fn peer_side(&self) -> usize {
        1 - self.0.side
    }
}

impl Read for MemLink {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let e = &self.0;
        let timeout = *e.read_timeout.lock().unwrap();
        let (n, depth) = e.core.pipes[self.peer_side()].read(buf, timeout)?;
        e.seen.fetch_max(depth, Ordering::AcqRel);
        Ok(n)
    }
}

impl Write for MemLink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let e = &self.0;
        let depth = e.seen.load(Ordering::Acquire) + 1;
        e.core.write(e.side, buf, depth)?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Link for MemLink {
    fn try_clone_link(&self) -> io::Result<Box<dyn Link>> {
        Ok(Box::new(MemLink(self.0.clone())))
    }
    fn shutdown_both(&self) {
        self.0.core.close(self.0.side);
    }
    fn shutdown_write(&self) {
        let e = &self.0;
        if let Ok(mut t) = e.core.taps[e.side].try_lock() {
            let _ = t.flush(&Out {
                core: &e.core,
                side: e.side,
            });
        }
        e.core.pipes[e.side].close_write();
    }
    fn peer(&self) -> String {
        let c = &self.0.core;
        format!("mem:{}/{}", c.hosts[self.peer_side()], c.label())
    }
    fn local(&self) -> String {
        let c = &self.0.core;
        format!("mem:{}/{}", c.hosts[self.0.side], c.label())
    }
    fn kind(&self) -> &'static str {
        "mem"
    }
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        *self.0.read_timeout.lock().unwrap() = d;
        Ok(())
    }
    fn peer_gone(&self) -> bool {
        self.0.core.pipes[self.peer_side()].ended()
    }
    fn clock(&self) -> Clock {
        self.0.core.net.clock.clone()
    }
}
