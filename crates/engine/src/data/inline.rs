//! The inline send path (seed 002 sec. 7, Tyche's "inline" mode): the
//! reader that filled a block writes it to a data link itself, with no
//! hand-off to a sender thread. That saves the queue, the wake-up and
//! context switch of a sender, and the cache misses of touching the block
//! on a second core; the cost is that readers, not a few dedicated
//! senders, contend for the links (Tyche's NIC-lock contention, which
//! grows with the number of issuing threads).
//!
//! The session's links sit in a small free set (a bounded lock-free array
//! channel holding each link's [`StreamOut`] by value). A reader with a
//! full block takes any free link, waits for that link's credit, sends
//! through the same [`StreamOut::send_block`] as the queued senders, and
//! puts the link back. With no more readers than links a free link is
//! always there, so taking one never blocks; with more, a reader waits
//! while every link is busy (or starved of credits). Ownership moves with
//! the value, so nothing is locked, and nothing is allocated per block.
//!
//! Failures: a link whose send fails is reported on the session's
//! link-outcome channel (the same one queued senders report on) and
//! leaves a dead slot in the set, so every later taker returns "links
//! gone" and readers stop, exactly as when the `filled` queue closes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_channel::{bounded, Receiver, Sender};
use ramsys_resources::{Buf, BufferPool};

use crate::data::sender::{LinkOutcome, StreamOut};
use crate::stats::Stats;

/// One slot of the free set: a live link, or a dead one (its link and
/// error already reported).
type Slot = Option<StreamOut>;

/// The links of one session on the inline path.
pub struct InlineLinks {
    free_tx: Sender<Slot>,
    free_rx: Receiver<Slot>,
    count: usize,
    done: Sender<(usize, LinkOutcome)>,
    pool: Arc<BufferPool>,
    abort: Arc<AtomicBool>,
    stats: Arc<Stats>,
    ended: AtomicBool,
}

impl InlineLinks {
    /// `done` receives each link's outcome: an error as soon as a send
    /// fails, else the link after [`InlineLinks::end`].
    pub fn new(
        outs: Vec<StreamOut>,
        done: Sender<(usize, LinkOutcome)>,
        pool: Arc<BufferPool>,
        abort: Arc<AtomicBool>,
        stats: Arc<Stats>,
    ) -> InlineLinks {
        let count = outs.len();
        let (free_tx, free_rx) = bounded(count.max(1));
        for o in outs {
            free_tx.send(Some(o)).expect("room for every link");
        }
        InlineLinks {
            free_tx,
            free_rx,
            count,
            done,
            pool,
            abort,
            stats,
            ended: AtomicBool::new(false),
        }
    }

    /// Links in the set (live or dead).
    pub fn count(&self) -> usize {
        self.count
    }

    /// Send `buf` on a free link from the calling thread and return it to
    /// the pool. False when the links are gone (one failed, the session
    /// is aborting, or they were ended): the caller stops.
    pub fn send(&self, mut buf: Buf) -> bool {
        // Never disconnected: this struct holds both ends. Every taker
        // puts its slot back before returning, so a slot always comes.
        let slot = self.free_rx.recv().expect("free set holds its sender");
        let Some(mut out) = slot else {
            self.put_back(None);
            self.pool.put(buf);
            return false;
        };
        if self.abort.load(Ordering::Relaxed) || self.ended.load(Ordering::Relaxed) {
            self.put_back(Some(out));
            self.pool.put(buf);
            return false;
        }
        let r = out.send_block(&mut buf, &self.stats);
        self.pool.put(buf);
        match r {
            Ok(()) => {
                self.put_back(Some(out));
                true
            }
            Err(e) => {
                let stream = out.stream;
                let _ = self.done.send((stream, out.finish(Err(e))));
                self.put_back(None);
                false
            }
        }
    }

    fn put_back(&self, s: Slot) {
        // At most `count` slots exist, so the bounded set never fills.
        let _ = self.free_tx.try_send(s);
    }

    /// End of data: an END frame on every live link, each link's outcome
    /// reported on `done`. Call once all readers have stopped and no more
    /// re-sends can come; later calls do nothing.
    pub fn end(&self) {
        if self.ended.swap(true, Ordering::AcqRel) {
            return;
        }
        // Take every slot (all are free: no reader is left) and leave a
        // dead one in its place, so a late taker is told "gone".
        let mut live = Vec::with_capacity(self.count);
        for _ in 0..self.count {
            if let Ok(Some(out)) = self.free_rx.recv() {
                live.push(out);
            }
        }
        for _ in 0..self.count {
            self.put_back(None);
        }
        for mut out in live {
            let r = out.end();
            let stream = out.stream;
            let _ = self.done.send((stream, out.finish(r)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::Link;
    use crossbeam_channel::unbounded;
    use ramsys_proto::data::Segment;
    use ramsys_proto::frame::{FrameHeader, FrameKind, HEADER_LEN};
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};

    fn pair() -> (Box<dyn Link>, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (Box::new(c), s)
    }

    fn block(pool: &BufferPool, id: u64) -> Buf {
        let mut b = pool.get();
        b.reset();
        b.space()[..100].fill(id as u8);
        b.len = 100;
        b.segs.push(Segment {
            file_id: id,
            offset: 0,
            len: 100,
        });
        b
    }

    /// Blocks go out on the links from the calling thread, END closes
    /// each link, and every buffer is back in the pool.
    #[test]
    fn readers_send_on_free_links_and_end_each() {
        let pool = Arc::new(BufferPool::allocate(4, 4096).unwrap());
        let (tx, rx) = unbounded();
        let mut peers = Vec::new();
        let mut outs = Vec::new();
        for i in 0..2 {
            let (l, mut p) = pair();
            crate::wire::send_credit(&mut p, 16).unwrap();
            outs.push(StreamOut::new(i, l, 16, None));
            peers.push(p);
        }
        let stats = Arc::new(Stats::default());
        let set = InlineLinks::new(
            outs,
            tx,
            pool.clone(),
            Arc::new(AtomicBool::new(false)),
            stats.clone(),
        );
        for id in 0..6 {
            assert!(set.send(block(&pool, id)));
        }
        set.end();
        assert!(!set.send(block(&pool, 9)), "no sends after end");
        let mut ended: Vec<usize> = rx
            .try_iter()
            .map(|(i, r)| {
                assert!(r.is_ok());
                i
            })
            .collect();
        ended.sort();
        assert_eq!(ended, [0, 1]);
        assert_eq!(stats.blocks.load(Ordering::Relaxed), 6);
        assert_eq!(pool.free(), 4);
        // Each peer sees whole DATA frames, then END.
        let mut frames = 0;
        for mut p in peers {
            loop {
                let mut h = [0u8; HEADER_LEN];
                p.read_exact(&mut h).unwrap();
                let h = FrameHeader::decode(&h, 1 << 20).unwrap();
                if h.kind == FrameKind::End {
                    break;
                }
                assert_eq!(h.kind, FrameKind::Data);
                let mut body = vec![0u8; h.len as usize];
                p.read_exact(&mut body).unwrap();
                frames += 1;
            }
        }
        assert_eq!(frames, 6);
    }

    /// A link that breaks is reported once, and every later send says the
    /// links are gone instead of blocking.
    #[test]
    fn a_failed_link_stops_every_sender() {
        let pool = Arc::new(BufferPool::allocate(4, 4096).unwrap());
        let (tx, rx) = unbounded();
        let (l, p) = pair();
        // No credits and a peer that closes: the credit wait fails.
        let out = StreamOut::new(0, l, 0, None);
        drop(p);
        let set = InlineLinks::new(
            vec![out],
            tx,
            pool.clone(),
            Arc::new(AtomicBool::new(false)),
            Arc::new(Stats::default()),
        );
        assert!(!set.send(block(&pool, 1)));
        assert!(!set.send(block(&pool, 2)));
        let got: Vec<_> = rx.try_iter().collect();
        assert_eq!(got.len(), 1);
        assert!(got[0].1.is_err());
        set.end();
        assert_eq!(rx.try_iter().count(), 0, "a dead link is not ended again");
        assert_eq!(pool.free(), 4);
    }
}
