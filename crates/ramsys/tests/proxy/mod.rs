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

/// What a connection is, from the first control message the client sends
/// (preamble 8 bytes, frame header 8, then the postcard variant index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Control,
    Join,
    Rejoin,
    Other,
}

/// Rules for [`LinkProxy`]; all may change while it runs.
#[derive(Default)]
pub struct Rules {
    /// Cut a data link once it has forwarded this many bytes (both
    /// directions; 0 = never) ...
    pub cut_data_after: AtomicU64,
    /// ... up to this many data links in all.
    pub cut_data_max: AtomicU64,
    /// Cut every control link once all data links together have forwarded
    /// this many bytes (0 = never).
    pub cut_control_after_data: AtomicU64,
    /// After the first cut, close every new connection at once.
    pub refuse_after_cut: AtomicBool,
    /// Before a data cut, swallow what the sender writes for this many
    /// milliseconds (forwarding nothing), so the sender has written all it
    /// had and sits idle when the link dies: only the receiver notices.
    pub hold_before_cut_ms: AtomicU64,
    /// Once a data link has carried this many bytes from the server back
    /// to the client (0 = never), flip the last byte of the next chunk in
    /// that direction, once in all: on a push that is the tail of a CREDIT.
    pub flip_reverse_after: AtomicU64,
}

/// Counters of what [`LinkProxy`] saw and did.
#[derive(Default)]
pub struct Seen {
    pub data_cuts: AtomicU64,
    pub control_cuts: AtomicU64,
    pub joins: AtomicU64,
    pub rejoins: AtomicU64,
    pub refused: AtomicU64,
    pub data_bytes: AtomicU64,
}

/// A proxy that knows control links from data links and cuts them by rule
/// (issue 9 fault tests: lost data links, lost control link, refused
/// re-dials).
pub struct LinkProxy {
    pub addr: String,
    pub rules: Arc<Rules>,
    pub seen: Arc<Seen>,
    stop: Arc<AtomicBool>,
}

impl LinkProxy {
    pub fn start(target: &str) -> LinkProxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = LinkProxy {
            addr: l.local_addr().unwrap().to_string(),
            rules: Arc::new(Rules::default()),
            seen: Arc::new(Seen::default()),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let (rules, seen, stop) = (p.rules.clone(), p.seen.clone(), p.stop.clone());
        let controls: Arc<Mutex<Vec<TcpStream>>> = Arc::new(Mutex::new(Vec::new()));
        let target = target.to_string();
        std::thread::spawn(move || {
            for c in l.incoming() {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(c) = c else { continue };
                let cut_yet = seen.data_cuts.load(Ordering::Relaxed)
                    + seen.control_cuts.load(Ordering::Relaxed)
                    > 0;
                if cut_yet && rules.refuse_after_cut.load(Ordering::Relaxed) {
                    seen.refused.fetch_add(1, Ordering::Relaxed);
                    let _ = c.shutdown(Shutdown::Both);
                    continue;
                }
                let (rules, seen, controls, target) = (
                    rules.clone(),
                    seen.clone(),
                    controls.clone(),
                    target.clone(),
                );
                std::thread::spawn(move || serve_conn(c, &target, rules, seen, controls));
            }
        });
        p
    }
}

impl Drop for LinkProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(&self.addr);
    }
}

fn serve_conn(
    mut c: TcpStream,
    target: &str,
    rules: Arc<Rules>,
    seen: Arc<Seen>,
    controls: Arc<Mutex<Vec<TcpStream>>>,
) {
    let _ = c.set_read_timeout(Some(std::time::Duration::from_secs(20)));
    let mut first = [0u8; 17];
    if c.read_exact(&mut first).is_err() {
        return;
    }
    let _ = c.set_read_timeout(None);
    // The first body byte is the postcard variant tag; take the tags
    // from the encoder so renumbering cannot silently break the proxy.
    let tag = |m: ramsys_proto::Control| m.encode().unwrap()[0];
    let rejoin = tag(ramsys_proto::Control::Rejoin {
        session: 0,
        stream: 0,
        epoch: 0,
        nonce: [0; 32],
        mac: [0; 32],
    });
    let join = tag(ramsys_proto::Control::Join {
        session: 0,
        stream: 0,
        nonce: [0; 32],
        mac: [0; 32],
    });
    let kind = match first[16] {
        0 => Kind::Control,
        t if t == join => Kind::Join,
        t if t == rejoin => Kind::Rejoin,
        _ => Kind::Other,
    };
    match kind {
        Kind::Join => seen.joins.fetch_add(1, Ordering::Relaxed),
        Kind::Rejoin => seen.rejoins.fetch_add(1, Ordering::Relaxed),
        _ => 0,
    };
    let Ok(mut s) = TcpStream::connect(target) else {
        return;
    };
    if s.write_all(&first).is_err() {
        return;
    }
    if kind == Kind::Control {
        controls.lock().unwrap().push(c.try_clone().unwrap());
    }
    let data = matches!(kind, Kind::Join | Kind::Rejoin);
    let fwd = Arc::new(AtomicU64::new(0));
    let handles = Arc::new((c.try_clone().unwrap(), s.try_clone().unwrap()));
    let mk = |from: TcpStream, to: TcpStream, reverse: bool| {
        let (rules, seen, controls, fwd, handles) = (
            rules.clone(),
            seen.clone(),
            controls.clone(),
            fwd.clone(),
            handles.clone(),
        );
        std::thread::spawn(move || {
            let cut = |h: &(TcpStream, TcpStream)| {
                let _ = h.0.shutdown(Shutdown::Both);
                let _ = h.1.shutdown(Shutdown::Both);
            };
            let (mut from, mut to) = (from, to);
            let mut buf = vec![0u8; 64 << 10];
            let mut back = 0u64;
            loop {
                let n = match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if data && reverse {
                    back += n as u64;
                    let after = rules.flip_reverse_after.load(Ordering::Relaxed);
                    if after > 0
                        && back >= after
                        && rules
                            .flip_reverse_after
                            .compare_exchange(after, 0, Ordering::Relaxed, Ordering::Relaxed)
                            .is_ok()
                    {
                        buf[n - 1] ^= 0x01;
                    }
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
                if !data {
                    continue;
                }
                let total = fwd.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
                let all = seen.data_bytes.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
                let cc = rules.cut_control_after_data.load(Ordering::Relaxed);
                if cc > 0 && all >= cc {
                    rules.cut_control_after_data.store(0, Ordering::Relaxed);
                    for h in controls.lock().unwrap().iter() {
                        let _ = h.shutdown(Shutdown::Both);
                    }
                    seen.control_cuts.fetch_add(1, Ordering::Relaxed);
                }
                let after = rules.cut_data_after.load(Ordering::Relaxed);
                if after > 0
                    && total >= after
                    && rules
                        .cut_data_max
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| m.checked_sub(1))
                        .is_ok()
                {
                    seen.data_cuts.fetch_add(1, Ordering::Relaxed);
                    let hold = rules.hold_before_cut_ms.load(Ordering::Relaxed);
                    if hold > 0 {
                        let until =
                            std::time::Instant::now() + std::time::Duration::from_millis(hold);
                        let _ = from.set_read_timeout(Some(std::time::Duration::from_millis(10)));
                        while std::time::Instant::now() < until {
                            if let Ok(0) = from.read(&mut buf) {
                                break;
                            }
                        }
                    }
                    cut(&handles);
                    break;
                }
            }
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
        })
    };
    let a = mk(c.try_clone().unwrap(), s.try_clone().unwrap(), false);
    let b = mk(s, c, true);
    let _ = a.join();
    let _ = b.join();
}
