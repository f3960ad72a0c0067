//! Draining a daemon that is asked to stop (issue 20: "SIGTERM drains (new
//! sessions refused, running ones finish within a grace period, then stop
//! resumably)"). The signal handling itself is the binary's (`ramsys
//! serve`, crates/ramsys/src/signals.rs); this is the state it drives:
//! a flag the connection handler checks before a new session's handshake,
//! and the control links of running sessions, which are shut down when the
//! grace period ends. A session whose control link goes down fails the way
//! any broken session does: the sink keeps the temp files and journal of
//! large files (docs/SYNC.md), so the agent's `--resume` continues it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::transport::Link;

/// What a client is told when it asks for a session during a drain.
pub const DRAINING: &str = "the daemon is shutting down and takes no new sessions; try again later";

/// The drain flag and the running sessions' control links.
#[derive(Default)]
pub struct Lifecycle {
    draining: AtomicBool,
    live: Mutex<HashMap<u64, Box<dyn Link>>>,
}

/// A running session, tracked until this drops.
pub struct Live<'a>(&'a Lifecycle, u64);

impl Drop for Live<'_> {
    fn drop(&mut self) {
        self.0.live.lock().unwrap().remove(&self.1);
    }
}

impl Lifecycle {
    /// True once a drain began: new sessions are refused.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Refuse new sessions from now on.
    pub fn start_drain(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Track a running session by a clone of its control link (a session
    /// whose link cannot be cloned is not tracked, and simply ends with
    /// the process).
    pub fn track(&self, session: u64, ctl: &dyn Link) -> Live<'_> {
        if let Ok(l) = ctl.try_clone_link() {
            self.live.lock().unwrap().insert(session, l);
        }
        Live(self, session)
    }

    /// Sessions running now.
    pub fn running(&self) -> usize {
        self.live.lock().unwrap().len()
    }

    /// Shut down every running session's control link (the grace period
    /// is over); returns how many.
    pub fn stop_all(&self) -> usize {
        let live = self.live.lock().unwrap();
        for l in live.values() {
            l.shutdown_both();
        }
        live.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn tracks_sessions_and_stops_them() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut peer, _) = l.accept().unwrap();
        let life = Lifecycle::default();
        assert!(!life.draining());
        let link: Box<dyn Link> = Box::new(c);
        let g = life.track(7, &*link);
        assert_eq!(life.running(), 1);
        life.start_drain();
        assert!(life.draining());
        assert_eq!(life.stop_all(), 1);
        // The peer sees the link end.
        let mut b = [0u8; 1];
        assert_eq!(peer.read(&mut b).unwrap(), 0);
        drop(g);
        assert_eq!(life.running(), 0);
    }
}
