//! Writers: drain received buffers into files ("offload") and return the
//! buffer's credit to the stream it came on.

// The io_uring loop: a private part of the writer.
mod uring;
// Digests applied off the control thread, beside the writers.
pub mod settler;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_channel::{Receiver, Sender};
use ramsys_resources::{Buf, BufferPool};

use super::files::{FileTable, WriteError};
use crate::transport::wire::send_credit_sealed;
use crate::transport::Link;

/// Credit return path of one stream: writers batch freed buffers and send
/// them back as one CREDIT frame. The link can be replaced mid-transfer
/// (crate::session::relink): the current link and its grant counter sit under the
/// lock, which is taken once per batch, never per block.
pub struct CreditReturn {
    pub link: Mutex<CreditLink>,
    /// Buffers of this stream freed so far (all of its links).
    pub released: AtomicU64,
    /// Of those, how many have been granted back (or written off when the
    /// link was replaced).
    pub cursor: AtomicU64,
    pub batch: u64,
}

/// The stream's current data link and the credits granted on it (read by
/// its receiver).
pub struct CreditLink {
    pub link: Box<dyn Link>,
    pub granted: Arc<AtomicU64>,
    /// Sealed sessions: the link's credit AEAD (crypto::StreamSeal::credits).
    pub seal: Option<crate::transport::crypto::StreamSeal>,
}

impl CreditReturn {
    pub fn new(
        link: Box<dyn Link>,
        batch: u64,
        seal: Option<crate::transport::crypto::StreamSeal>,
    ) -> CreditReturn {
        CreditReturn {
            link: Mutex::new(CreditLink {
                link,
                granted: Arc::new(AtomicU64::new(0)),
                seal,
            }),
            released: AtomicU64::new(0),
            cursor: AtomicU64::new(0),
            batch,
        }
    }

    /// The grant counter of the current link.
    pub fn granted(&self) -> Arc<AtomicU64> {
        self.link.lock().unwrap().granted.clone()
    }

    /// Grant `n` credits now (initial grant, or a batch).
    pub fn grant(&self, n: u64) -> std::io::Result<()> {
        let mut l = self.link.lock().unwrap();
        Self::grant_on(&mut l, n)
    }

    fn grant_on(l: &mut CreditLink, n: u64) -> std::io::Result<()> {
        // Count first: the block this credit allows may arrive before the
        // send call returns.
        l.granted.fetch_add(n, Ordering::AcqRel);
        send_credit_sealed(&mut *l.link, n as u32, l.seal.as_mut())
    }

    /// One buffer of this stream is free again.
    pub fn freed_one(&self) {
        let r = self.released.fetch_add(1, Ordering::AcqRel) + 1;
        if r.saturating_sub(self.cursor.load(Ordering::Acquire)) >= self.batch {
            let mut l = self.link.lock().unwrap();
            let r = self.released.load(Ordering::Acquire);
            let n = r.saturating_sub(self.cursor.load(Ordering::Acquire));
            if n > 0 {
                self.cursor.store(r, Ordering::Release);
                // A failure here means the link is gone; its receiver
                // reports that.
                let _ = Self::grant_on(&mut l, n);
            }
        }
    }

    /// Give `n` fewer credits back than buffers freed from now on: the
    /// stream's window shrinks by `n`, making room in the session's
    /// buffers for a stream added mid-transfer (issue 21). The freed
    /// buffers it keeps back back the new stream's credits.
    pub fn withhold(&self, n: u64) {
        let _l = self.link.lock().unwrap();
        self.cursor.fetch_add(n, Ordering::AcqRel);
    }

    /// The stream's link was replaced (crate::session::relink): grants go to `link`
    /// from now on, starting with the window less the buffers still held
    /// for blocks of the earlier links (`received` of them accepted in
    /// all). Returns the new link's grant counter for its receiver.
    pub fn rebase(
        &self,
        link: Box<dyn Link>,
        seal: Option<crate::transport::crypto::StreamSeal>,
        window: u64,
        received: u64,
    ) -> std::io::Result<Arc<AtomicU64>> {
        let mut l = self.link.lock().unwrap();
        let r = self.released.load(Ordering::Acquire);
        self.cursor.store(r, Ordering::Release);
        l.link = link;
        l.seal = seal;
        l.granted = Arc::new(AtomicU64::new(0));
        let n = ramsys_proto::relink::rebase_grant(window, received, r);
        if n > 0 {
            Self::grant_on(&mut l, n)?;
        }
        Ok(l.granted.clone())
    }
}

/// What a writer tells the sink controller.
#[derive(Debug)]
pub enum WriterEvent {
    Fatal(String),
    Protocol(String),
}

/// Writer thread body: the io_uring engine when configured and
/// available, else the synchronous loop.
pub fn run_writer(w: WriterIo<'_>, received: Receiver<Buf>) {
    let table = w.table;
    if table.storage.engine == crate::storage::IoEngine::Uring
        && !table.storage.null
        && uring::run_writer_uring(&w, &received)
    {
        return;
    }
    while let Ok(buf) = w.next(&received) {
        if !w.abort.load(Ordering::Relaxed) {
            let mut p = 0usize;
            for (i, s) in buf.segs.iter().enumerate() {
                let end = p + s.payload_len();
                let h = buf.hashes.get(i).copied().unwrap_or(0);
                if !w.check(table.write_segment(s, &buf.data()[p..end], h)) {
                    break;
                }
                p = end;
            }
        }
        w.release(buf);
    }
}

/// What both writer engines share: the table, where buffers go back, and
/// where errors are reported.
pub struct WriterIo<'a> {
    pub table: &'a FileTable,
    pub pool: Arc<BufferPool>,
    pub credits: Arc<Vec<CreditReturn>>,
    pub events: Sender<WriterEvent>,
    /// Wakes the sink's loop to look for Settled now (bounded(1)).
    pub settle_wake: Sender<()>,
    pub abort: Arc<AtomicBool>,
    /// This writer's index and its task's gate (a site share: writers
    /// past the limit park; site::share).
    pub gate: Option<(usize, Arc<crate::daemon::site::share::ThreadGate>)>,
    /// Most bytes of O_DIRECT writes this writer keeps in flight on the
    /// large files it may also write buffered (its direct lane).
    pub lane: usize,
}

/// One writer's direct lane: the configured one (StorageCfg::lane_bytes),
/// but never more than half of this writer's share of the receive
/// buffers. A block waiting for the disk holds its buffer; a lane as
/// large as the pool would take every block and run the whole push at the
/// disk's pace (measured: 4 x 1 GiB with O_DIRECT writes throttled to
/// 200 MB/s, a 256 MiB lane 20.7 s, 64 MiB 3.4-3.6 s; docs/STORAGE.md).
pub fn direct_lane(configured: usize, pool: &BufferPool, writers: usize) -> usize {
    configured.min(pool.count() * pool.buf_size() / (2 * writers.max(1)))
}

impl WriterIo<'_> {
    /// The next block, once the gate lets this writer run.
    pub fn next(&self, rx: &Receiver<Buf>) -> Result<Buf, crossbeam_channel::RecvError> {
        match &self.gate {
            Some((i, g)) => g.recv(*i, rx, &self.abort),
            None => rx.recv(),
        }
    }

    /// Whether the gate lets this writer take more blocks now.
    pub fn admitted(&self) -> bool {
        self.gate.as_ref().is_none_or(|(i, g)| g.admits(*i))
    }

    /// Report a session-stopping error; false if the block must stop.
    pub fn check(&self, r: Result<(), WriteError>) -> bool {
        match r {
            Ok(()) => true,
            Err(WriteError::Fatal(m)) => {
                self.abort.store(true, Ordering::Release);
                let _ = self.events.send(WriterEvent::Fatal(m));
                false
            }
            Err(WriteError::Protocol(m)) => {
                self.abort.store(true, Ordering::Release);
                let _ = self.events.send(WriterEvent::Protocol(m));
                false
            }
        }
    }

    /// The buffer is free again: back to the pool, credit to its stream.
    pub fn release(&self, buf: Buf) {
        let stream = buf.stream as usize;
        self.pool.put(buf);
        if let Some(c) = self.credits.get(stream) {
            c.freed_one();
        }
        if self.table.counted_all_first() {
            let _ = self.settle_wake.try_send(());
        }
    }
}
