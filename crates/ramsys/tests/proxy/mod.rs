//! A thread-based TCP proxy on loopback for fault and eavesdropping tests:
//! it forwards every connection to a target, records what clients send
//! (bounded), and can cut a connection after a number of forwarded bytes.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Most client bytes kept for inspection.
const CAPTURE_MAX: usize = 64 << 20;

pub struct Proxy {
    pub addr: String,
    /// Client-to-server bytes of every connection, concatenated.
    pub captured: Arc<Mutex<Vec<u8>>>,
    /// Server-to-client bytes of every connection, concatenated.
    pub captured_back: Arc<Mutex<Vec<u8>>>,
    /// Cut a connection once it has forwarded this many client bytes
    /// (0 = never); counts down across connections until one is cut.
    pub cut_after: Arc<AtomicU64>,
    /// Connections cut so far.
    pub cuts: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    pub fn start(target: &str) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let p = Proxy {
            addr,
            captured: Arc::new(Mutex::new(Vec::new())),
            captured_back: Arc::new(Mutex::new(Vec::new())),
            cut_after: Arc::new(AtomicU64::new(0)),
            cuts: Arc::new(AtomicU64::new(0)),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let (cap, cut, cuts, stop) = (
            p.captured.clone(),
            p.cut_after.clone(),
            p.cuts.clone(),
            p.stop.clone(),
        );
        let back = p.captured_back.clone();
        let target = target.to_string();
        std::thread::spawn(move || {
            for c in l.incoming() {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(c) = c else { continue };
                let Ok(s) = TcpStream::connect(&target) else {
                    continue;
                };
                let (c2, s2) = (c.try_clone().unwrap(), s.try_clone().unwrap());
                let (cap, cut, cuts) = (cap.clone(), cut.clone(), cuts.clone());
                // Client to server: captured, maybe cut.
                std::thread::spawn(move || {
                    pump(c, s, Some((cap, cut, cuts)));
                });
                // Server to client: captured, never cut.
                let tap = (back.clone(), Arc::default(), Arc::default());
                std::thread::spawn(move || pump(s2, c2, Some(tap)));
            }
        });
        p
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(&self.addr);
    }
}

type Tap = (Arc<Mutex<Vec<u8>>>, Arc<AtomicU64>, Arc<AtomicU64>);

fn pump(mut from: TcpStream, mut to: TcpStream, tap: Option<Tap>) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some((cap, cut, cuts)) = &tap {
            {
                let mut c = cap.lock().unwrap();
                if c.len() < CAPTURE_MAX {
                    c.extend_from_slice(&buf[..n]);
                }
            }
            let left = cut.load(Ordering::Relaxed);
            if left > 0 {
                if left <= n as u64 {
                    cut.store(0, Ordering::Relaxed);
                    cuts.fetch_add(1, Ordering::Relaxed);
                    let _ = to.write_all(&buf[..left as usize]);
                    break;
                }
                cut.fetch_sub(n as u64, Ordering::Relaxed);
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
