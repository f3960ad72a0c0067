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
//! Lost links (crate::session::relink): a link whose send fails leaves the set and
//! is reported, with its SentLog, on the session's link-outcome channel
//! (the one queued senders report on); the block in hand is in that log,
//! so the controller re-reads it with the others the link lost, and the
//! reader goes on with the next block on another link. A replacement joins
//! the set with [`InlineLinks::add`]. A link the sink saw break first is
//! [`InlineLinks::evict`]ed: marked, and pulled out of the free set by
//! whoever next meets it there (a reader, or the controller's sweep, which
//! matters when no reader sends any more). Only when the session fails does
//! [`InlineLinks::close`] leave a tombstone that stops every taker.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_channel::{bounded, Receiver, Sender};
use ramsys_resources::{Buf, BufferPool};

use crate::data::sender::{LinkDone, StreamOut};
use crate::types::error::EngineError;
use crate::types::stats::Stats;

/// One slot of the free set.
enum Slot {
    Live(Box<StreamOut>),
    /// The session is over (failed or ended): every taker stops and puts
    /// the tombstone back for the next.
    Gone,
}

/// The links of one session on the inline path.
pub struct InlineLinks {
    free_tx: Sender<Slot>,
    free_rx: Receiver<Slot>,
    streams: usize,
    /// Live links (in the set or in a sender's hand).
    live: AtomicUsize,
    /// Per stream: epoch + 1 of an incarnation to pull out (0 = none).
    doomed: Vec<AtomicU32>,
    done: Sender<LinkDone>,
    pool: Arc<BufferPool>,
    abort: Arc<AtomicBool>,
    stats: Arc<Stats>,
    ended: AtomicBool,
    /// Serialises membership changes (add, end, close): rare, never per
    /// block.
    members: Mutex<()>,
}

impl InlineLinks {
    /// `done` receives each link's report: as soon as a send fails or the
    /// link is evicted, else after [`InlineLinks::end`].
    pub fn new(
        outs: Vec<StreamOut>,
        done: Sender<LinkDone>,
        pool: Arc<BufferPool>,
        abort: Arc<AtomicBool>,
        stats: Arc<Stats>,
    ) -> InlineLinks {
        let streams = outs.len();
        // One slot per stream, plus room for the tombstone.
        let (free_tx, free_rx) = bounded(streams + 1);
        let live = AtomicUsize::new(outs.len());
        for o in outs {
            free_tx
                .send(Slot::Live(Box::new(o)))
                .expect("room for every link");
        }
        InlineLinks {
            free_tx,
            free_rx,
            streams,
            live,
            doomed: (0..streams).map(|_| AtomicU32::new(0)).collect(),
            done,
            pool,
            abort,
            stats,
            ended: AtomicBool::new(false),
            members: Mutex::new(()),
        }
    }

    /// Streams of the session (live or not).
    pub fn count(&self) -> usize {
        self.streams
    }

    fn is_doomed(&self, out: &StreamOut) -> bool {
        self.doomed[out.stream].load(Ordering::SeqCst) == out.epoch as u32 + 1
    }

    /// Report a link that left the set.
    fn lost(&self, out: StreamOut, e: EngineError) {
        self.live.fetch_sub(1, Ordering::SeqCst);
        let _ = self.done.send(out.finish(Err(e)));
    }

    /// Take a free live link, pulling doomed ones out on the way. None
    /// once the session is over.
    fn take(&self) -> Option<Box<StreamOut>> {
        loop {
            // Never disconnected: this struct holds both ends.
            match self.free_rx.recv().expect("free set holds its sender") {
                Slot::Gone => {
                    self.put_back(Slot::Gone);
                    return None;
                }
                Slot::Live(out) if self.is_doomed(&out) => {
                    self.lost(*out, EngineError::PeerClosed);
                }
                Slot::Live(out) => return Some(out),
            }
        }
    }

    /// Send `buf` on a free link from the calling thread and return it to
    /// the pool. False when the session is over (failed, aborting, or
    /// ended): the caller stops. A link that breaks under the block is
    /// reported and the block is re-sent from its log (crate::session::relink), so
    /// that still counts as sent here.
    pub fn send(&self, mut buf: Buf) -> bool {
        let Some(mut out) = self.take() else {
            self.pool.put(buf);
            return false;
        };
        if self.abort.load(Ordering::Relaxed) || self.ended.load(Ordering::Relaxed) {
            self.put_back(Slot::Live(out));
            self.pool.put(buf);
            return false;
        }
        let r = out.send_block(&mut buf, &self.stats);
        self.pool.put(buf);
        match r {
            Ok(()) => self.put_back(Slot::Live(out)),
            Err(e) => self.lost(*out, e),
        }
        true
    }

    fn put_back(&self, s: Slot) {
        // At most one slot per stream and one tombstone exist, so the set
        // never fills.
        let _ = self.free_tx.try_send(s);
    }

    /// A replacement link (crate::session::relink) joins the set; after
    /// [`InlineLinks::end`] it is ended at once instead.
    pub fn add(&self, mut out: StreamOut) {
        let _g = self.members.lock().unwrap_or_else(|e| e.into_inner());
        if self.ended.load(Ordering::SeqCst) {
            let r = out.end();
            let _ = self.done.send(out.finish(r));
            return;
        }
        self.live.fetch_add(1, Ordering::SeqCst);
        self.put_back(Slot::Live(Box::new(out)));
    }

    /// The sink saw (`stream`, `epoch`) break: pull that link out of the
    /// set and report it. Non-blocking: it sweeps the links free right now;
    /// one in a sender's hand fails its send (the caller has shut the link
    /// down) or is pulled out by the next taker. The caller repeats this
    /// until the report arrives, which covers a link put back just after
    /// the sweep.
    pub fn evict(&self, stream: usize, epoch: u16) {
        let Some(d) = self.doomed.get(stream) else {
            return;
        };
        d.store(epoch as u32 + 1, Ordering::SeqCst);
        for _ in 0..=self.streams {
            match self.free_rx.try_recv() {
                Ok(Slot::Live(out)) if self.is_doomed(&out) => {
                    self.lost(*out, EngineError::PeerClosed);
                }
                Ok(s) => self.put_back(s),
                Err(_) => break,
            }
        }
    }

    /// End of data: an END frame on every live link, each link's report on
    /// `done`. Call once no reader and no re-send is left; later calls do
    /// nothing. Links that break meanwhile are reported as lost.
    pub fn end(&self) {
        {
            let _g = self.members.lock().unwrap_or_else(|e| e.into_inner());
            if self.ended.swap(true, Ordering::SeqCst) {
                return;
            }
        }
        // No link joins after `ended`, so `live` only falls from here.
        let mut got = 0;
        while got < self.live.load(Ordering::SeqCst) {
            match self
                .free_rx
                .recv_timeout(std::time::Duration::from_millis(20))
            {
                Ok(Slot::Live(out)) if self.is_doomed(&out) => {
                    self.lost(*out, EngineError::PeerClosed);
                }
                Ok(Slot::Live(mut out)) => {
                    got += 1;
                    let r = out.end();
                    let _ = self.done.send(out.finish(r));
                }
                Ok(Slot::Gone) => {
                    self.put_back(Slot::Gone);
                    return;
                }
                Err(_) => {}
            }
        }
        self.put_back(Slot::Gone);
    }

    /// The session failed: wake and stop every taker, including those
    /// waiting for a replacement link that will not come.
    pub fn close(&self) {
        let _g = self.members.lock().unwrap_or_else(|e| e.into_inner());
        self.ended.store(true, Ordering::SeqCst);
        self.put_back(Slot::Gone);
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

    /// A link with credit and a peer that reads, and one whose peer is
    /// gone without granting credit (its first send fails).
    fn live_link(i: usize, epoch: u16) -> (StreamOut, TcpStream) {
        let (l, mut p) = pair();
        crate::transport::wire::send_credit(&mut p, 16).unwrap();
        (StreamOut::new(i, epoch, l, 16, None), p)
    }
    fn broken_link(i: usize) -> StreamOut {
        let (l, p) = pair();
        drop(p);
        StreamOut::new(i, 0, l, 0, None)
    }

    fn set_of(outs: Vec<StreamOut>, pool: &Arc<BufferPool>) -> (InlineLinks, Receiver<LinkDone>) {
        let (tx, rx) = unbounded();
        let set = InlineLinks::new(
            outs,
            tx,
            pool.clone(),
            Arc::new(AtomicBool::new(false)),
            Arc::new(Stats::default()),
        );
        (set, rx)
    }

    /// Blocks go out on the links from the calling thread, END closes
    /// each link, and every buffer is back in the pool.
    #[test]
    fn readers_send_on_free_links_and_end_each() {
        let pool = Arc::new(BufferPool::allocate(4, 4096).unwrap());
        let (mut outs, mut peers) = (Vec::new(), Vec::new());
        for i in 0..2 {
            let (o, p) = live_link(i, 0);
            outs.push(o);
            peers.push(p);
        }
        let (set, rx) = set_of(outs, &pool);
        for id in 0..6 {
            assert!(set.send(block(&pool, id)));
        }
        set.end();
        assert!(!set.send(block(&pool, 9)), "no sends after end");
        let mut ended: Vec<usize> = rx
            .try_iter()
            .map(|(i, _, r, log)| {
                assert!(r.is_ok());
                assert_eq!(log.sent(), 3, "sends alternate between free links");
                i
            })
            .collect();
        ended.sort();
        assert_eq!(ended, [0, 1]);
        assert_eq!(set.stats.blocks.load(Ordering::Relaxed), 6);
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

    /// A link that breaks under a block leaves the set, reported once with
    /// that block in its log (to be sent again); the reader goes on with
    /// the other link.
    #[test]
    fn a_broken_link_leaves_the_set_with_its_log() {
        let pool = Arc::new(BufferPool::allocate(4, 4096).unwrap());
        let (good, _peer) = live_link(1, 0);
        let (set, rx) = set_of(vec![broken_link(0), good], &pool);
        assert!(
            set.send(block(&pool, 7)),
            "a lost block is re-sent, not failed"
        );
        assert!(set.send(block(&pool, 8)));
        assert!(set.send(block(&pool, 9)));
        let got: Vec<_> = rx.try_iter().collect();
        assert_eq!(got.len(), 1);
        let (i, epoch, r, log) = &got[0];
        assert_eq!((*i, *epoch), (0, 0));
        assert!(r.is_err());
        let lost = log.unreceived(0).unwrap();
        assert_eq!(lost.len(), 1);
        assert_eq!(lost[0][0].file_id, 7);
        set.end();
        let ended: Vec<_> = rx.try_iter().collect();
        assert_eq!(ended.len(), 1, "only the live link is ended");
        assert_eq!(ended[0].0, 1);
        assert_eq!(ended[0].3.sent(), 2);
        assert_eq!(pool.free(), 4);
    }

    /// The sink saw a link break first: evicting it pulls it out of the
    /// free set even though no reader sends any more; a replacement
    /// (next epoch) joins and is ended with the rest.
    #[test]
    fn evict_pulls_an_idle_link_out_and_a_replacement_joins() {
        let pool = Arc::new(BufferPool::allocate(4, 4096).unwrap());
        let (a, _pa) = live_link(0, 0);
        let (b, _pb) = live_link(1, 0);
        let (set, rx) = set_of(vec![a, b], &pool);
        set.evict(1, 0);
        let got: Vec<_> = rx.try_iter().collect();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].0, got[0].1), (1, 0));
        assert!(got[0].2.is_err());
        // Evicting an epoch that is not in the set changes nothing.
        set.evict(0, 3);
        assert_eq!(rx.try_iter().count(), 0);
        let (b2, _pb2) = live_link(1, 1);
        set.add(b2);
        for id in 0..4 {
            assert!(set.send(block(&pool, id)));
        }
        set.end();
        let mut ended: Vec<(usize, u16)> = rx
            .try_iter()
            .map(|(i, e, r, _)| {
                assert!(r.is_ok());
                (i, e)
            })
            .collect();
        ended.sort();
        assert_eq!(ended, [(0, 0), (1, 1)]);
        // A replacement that arrives after the end is ended at once.
        let (late, _pl) = live_link(0, 1);
        set.add(late);
        let r: Vec<_> = rx.try_iter().collect();
        assert_eq!(r.len(), 1);
        assert!(r[0].2.is_ok());
        assert_eq!(pool.free(), 4);
    }

    /// With every link lost a reader waits for a replacement; closing the
    /// set (the session failed) wakes it and it stops.
    #[test]
    fn close_wakes_a_reader_waiting_for_a_link() {
        let pool = Arc::new(BufferPool::allocate(4, 4096).unwrap());
        let (set, rx) = set_of(vec![broken_link(0)], &pool);
        let set = Arc::new(set);
        assert!(set.send(block(&pool, 1)));
        assert_eq!(rx.try_iter().count(), 1);
        let (s2, p2) = (set.clone(), pool.clone());
        let t = std::thread::spawn(move || s2.send(block(&p2, 2)));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!t.is_finished(), "waits for a link");
        set.close();
        assert!(!t.join().unwrap());
        assert!(!set.send(block(&pool, 3)));
        set.end();
        assert_eq!(rx.try_iter().count(), 0);
        assert_eq!(pool.free(), 4);
    }
}
