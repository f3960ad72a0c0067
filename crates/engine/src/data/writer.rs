//! Writers: drain received buffers into files ("offload") and return the
//! buffer's credit to the stream it came on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_channel::{Receiver, Sender};
use ramsys_resources::{Buf, BufferPool};

use super::sinkfiles::{FileTable, WriteError};
use crate::transport::Link;
use crate::wire::send_credit;

/// Credit return path of one stream: writers batch freed buffers and send
/// them back as one CREDIT frame.
pub struct CreditReturn {
    pub link: Mutex<Box<dyn Link>>,
    pub freed: AtomicU64,
    /// Total credits granted on this stream (read by its receiver).
    pub granted: Arc<AtomicU64>,
    pub batch: u64,
}

impl CreditReturn {
    /// Grant `n` credits now (initial grant, or a batch).
    pub fn grant(&self, n: u64) -> std::io::Result<()> {
        // Count first: the block this credit allows may arrive before the
        // send call returns.
        self.granted.fetch_add(n, Ordering::AcqRel);
        let mut l = self.link.lock().unwrap();
        send_credit(&mut **l, n as u32)
    }

    /// One buffer of this stream is free again.
    pub fn freed_one(&self) {
        let n = self.freed.fetch_add(1, Ordering::AcqRel) + 1;
        if n >= self.batch {
            let n = self.freed.swap(0, Ordering::AcqRel);
            if n > 0 {
                // A failure here means the link is gone; its receiver
                // reports that.
                let _ = self.grant(n);
            }
        }
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
pub fn run_writer(
    table: &FileTable,
    received: Receiver<Buf>,
    pool: Arc<BufferPool>,
    credits: Arc<Vec<CreditReturn>>,
    events: Sender<WriterEvent>,
    abort: Arc<AtomicBool>,
) {
    let w = WriterIo {
        table,
        pool,
        credits,
        events,
        abort,
    };
    if table.storage.engine == crate::storage::IoEngine::Uring
        && !table.storage.null
        && crate::storage::uring::run_writer_uring(&w, &received)
    {
        return;
    }
    while let Ok(buf) = received.recv() {
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
    pub abort: Arc<AtomicBool>,
}

impl WriterIo<'_> {
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
    }
}
