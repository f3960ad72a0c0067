//! One member of a site (seed 003 Table 2.1, lines ~581-595): the API
//! allocate / get / put / release / lock / unlock over keys, routing each
//! to the segment's home, the local store or a peer's responder.
//!
//! Decisions where the seed is silent (docs/SITE.md):
//! - Key: `name@home`, home being the member's listen address. Names are
//!   chosen by the caller (1-255 bytes); allocating an existing name
//!   returns it (one creator, everyone else gets a handle).
//! - Placement: local, a named member, or rotating over the members (the
//!   seed's "next data segment is automatically allocated on a different
//!   node", lines ~557-558).
//! - Home death: soft state. The home's segments die with it; a get or put
//!   returns HomeUnreachable (one clear error) and drops the cached copy,
//!   and the node keeps serving every other home. A home that restarts
//!   has no segments until their owners allocate and publish again.
//! - Membership: the members are the configured peers plus whoever dials
//!   in; a member whose link fails is redialed at the next call.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::cache::{Cache, Plan, Value};
use crate::lock::Holder;
use crate::model::Model;
use crate::msg::{Error, Op, Reply};
use crate::net::{Requester, Stream};
use crate::store::Store;

/// A segment's key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    pub name: String,
    pub home: String,
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.name, self.home)
    }
}

impl std::str::FromStr for Key {
    type Err = String;
    fn from_str(s: &str) -> Result<Key, String> {
        let (name, home) = s
            .rsplit_once('@')
            .ok_or_else(|| format!("key {s}: expected NAME@HOME"))?;
        Ok(Key {
            name: name.into(),
            home: home.into(),
        })
    }
}

/// Where allocate puts a segment.
#[derive(Debug, Clone)]
pub enum Placement {
    Local,
    On(String),
    /// The next member in turn (self included).
    Rotate,
}

pub type Dialer = Box<dyn Fn(&str) -> std::io::Result<Box<dyn Stream>> + Send + Sync>;

pub struct Node {
    me: String,
    holder: Holder,
    store: Arc<Mutex<Store>>,
    cache: Mutex<Cache>,
    peers: Mutex<HashMap<String, Arc<Mutex<Option<Requester>>>>>,
    dial: Dialer,
    start: Instant,
    turn: AtomicUsize,
}

impl Node {
    /// `me`: this member's address (homes are named by it); `holder`: a
    /// random nonzero id; `dial`: opens an authenticated stream to a peer.
    pub fn new(me: &str, holder: Holder, pool_bytes: usize, dial: Dialer) -> Node {
        Node {
            me: me.to_string(),
            holder: holder.max(1),
            store: Arc::new(Mutex::new(Store::new(pool_bytes))),
            cache: Mutex::new(Cache::default()),
            peers: Mutex::new(HashMap::new()),
            dial,
            start: Instant::now(),
            turn: AtomicUsize::new(0),
        }
    }

    pub fn me(&self) -> &str {
        &self.me
    }

    /// The home clock (ms since this node started).
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    pub fn store(&self) -> &Arc<Mutex<Store>> {
        &self.store
    }

    /// Add a member (configured peer, or one that dialed in).
    pub fn add_member(&self, addr: &str) {
        if addr != self.me {
            self.peers
                .lock()
                .unwrap()
                .entry(addr.to_string())
                .or_insert_with(|| Arc::new(Mutex::new(None)));
        }
    }

    /// Forget a member (aged out by its owner's policy): its link closes
    /// and its cached segments go; a later call to it would dial again.
    pub fn remove_member(&self, addr: &str) {
        self.peers.lock().unwrap().remove(addr);
        self.cache.lock().unwrap().forget_home(addr);
    }

    /// Members other than self, sorted.
    pub fn members(&self) -> Vec<String> {
        let mut v: Vec<String> = self.peers.lock().unwrap().keys().cloned().collect();
        v.sort();
        v
    }

    /// Serve a peer's requests against our store until it closes.
    pub fn serve_peer(&self, s: &mut dyn Stream) -> std::io::Result<()> {
        crate::net::serve(s, &self.store, &|| self.now_ms())
    }

    fn call(&self, home: &str, op: Op) -> Result<Reply, Error> {
        if home == self.me {
            return self
                .store
                .lock()
                .unwrap()
                .handle(self.holder, op, self.now_ms());
        }
        let slot = {
            let mut p = self.peers.lock().unwrap();
            p.entry(home.to_string())
                .or_insert_with(|| Arc::new(Mutex::new(None)))
                .clone()
        };
        let mut r = slot.lock().unwrap();
        if r.is_none() {
            let s =
                (self.dial)(home).map_err(|e| Error::HomeUnreachable(format!("{home}: {e}")))?;
            *r = Some(Requester::new(s, home));
        }
        let out = r.as_mut().expect("dialed above").call(self.holder, op);
        if matches!(
            out,
            Err(Error::HomeUnreachable(_)) | Err(Error::Protocol(_))
        ) {
            // Redial next time; the link may be half-read.
            *r = None;
        }
        out
    }

    pub fn allocate(
        &self,
        name: &str,
        capacity: u32,
        model: Model,
        at: Placement,
    ) -> Result<Key, Error> {
        let home = match at {
            Placement::Local => self.me.clone(),
            Placement::On(h) => h,
            Placement::Rotate => {
                let mut all = self.members();
                all.push(self.me.clone());
                all.sort();
                all[self.turn.fetch_add(1, Ordering::Relaxed) % all.len()].clone()
            }
        };
        self.call(
            &home,
            Op::Allocate {
                name: name.to_string(),
                capacity,
                model,
            },
        )?;
        Ok(Key {
            name: name.to_string(),
            home,
        })
    }

    /// get() under the segment's coherence model.
    pub fn get(&self, k: &Key) -> Result<Value, Error> {
        let plan = self
            .cache
            .lock()
            .unwrap()
            .plan_get(&k.home, &k.name, self.now_ms());
        match plan {
            Plan::Local(v) => Ok(v),
            Plan::Ask(op) => match self.call(&k.home, op) {
                Ok(r) => self
                    .cache
                    .lock()
                    .unwrap()
                    .on_get_reply(&k.home, &k.name, r, self.now_ms())
                    .ok_or_else(|| Error::Protocol("unexpected reply to get".into())),
                Err(e) => {
                    if matches!(e, Error::HomeUnreachable(_) | Error::NoSuchKey(_)) {
                        self.cache.lock().unwrap().forget(&k.home, &k.name);
                    }
                    Err(e)
                }
            },
        }
    }

    /// put(); `token` 0 = no lock claimed, else the fencing token.
    pub fn put(&self, k: &Key, data: &[u8], token: u64) -> Result<u64, Error> {
        let r = self.call(
            &k.home,
            Op::Put {
                name: k.name.clone(),
                data: data.to_vec(),
                token,
            },
        )?;
        match r {
            Reply::Stored { version } => {
                let mut c = self.cache.lock().unwrap();
                let m = c.model_of(&k.home, &k.name);
                c.on_put(&k.home, &k.name, m, version, data, self.now_ms());
                Ok(version)
            }
            _ => Err(Error::Protocol("unexpected reply to put".into())),
        }
    }

    /// acquire_lock_ss: the fencing token of a lease of `lease_ms`.
    pub fn lock(&self, k: &Key, lease_ms: u32) -> Result<u64, Error> {
        match self.call(
            &k.home,
            Op::Lock {
                name: k.name.clone(),
                lease_ms,
            },
        )? {
            Reply::Locked { token, .. } => Ok(token),
            _ => Err(Error::Protocol("unexpected reply to lock".into())),
        }
    }

    pub fn unlock(&self, k: &Key, token: u64) -> Result<(), Error> {
        self.call(
            &k.home,
            Op::Unlock {
                name: k.name.clone(),
                token,
            },
        )
        .map(|_| ())
    }

    pub fn release(&self, k: &Key) -> Result<(), Error> {
        self.cache.lock().unwrap().forget(&k.home, &k.name);
        self.call(
            &k.home,
            Op::Release {
                name: k.name.clone(),
            },
        )
        .map(|_| ())
    }

    /// Round trip to a member (liveness).
    pub fn ping(&self, home: &str) -> Result<(), Error> {
        self.call(home, Op::Ping).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    /// Two nodes on loopback with unauthenticated dialing (auth is the
    /// engine's job); node b's responder serves each accepted link.
    fn pair() -> (Arc<Node>, Arc<Node>) {
        let la = TcpListener::bind("127.0.0.1:0").unwrap();
        let lb = TcpListener::bind("127.0.0.1:0").unwrap();
        let dial: fn() -> Dialer = || {
            Box::new(|a: &str| -> std::io::Result<Box<dyn Stream>> {
                Ok(Box::new(TcpStream::connect(a)?))
            })
        };
        let a = Arc::new(Node::new(
            &la.local_addr().unwrap().to_string(),
            1,
            4096,
            dial(),
        ));
        let b = Arc::new(Node::new(
            &lb.local_addr().unwrap().to_string(),
            2,
            4096,
            dial(),
        ));
        for (l, n) in [(la, a.clone()), (lb, b.clone())] {
            std::thread::spawn(move || {
                for c in l.incoming().flatten() {
                    let n = n.clone();
                    std::thread::spawn(move || {
                        let mut c = c;
                        let _ = n.serve_peer(&mut c);
                    });
                }
            });
        }
        a.add_member(b.me());
        b.add_member(a.me());
        (a, b)
    }

    #[test]
    fn api_across_two_homes() {
        let (a, b) = pair();
        let k = a
            .allocate("cfg", 32, Model::Version, Placement::On(b.me().into()))
            .unwrap();
        assert_eq!(k.home, b.me());
        assert_eq!(a.put(&k, b"v1", 0), Ok(1));
        let g = b.get(&k).unwrap();
        assert_eq!(
            (g.version, g.data.as_slice(), g.moved),
            (1, &b"v1"[..], true)
        );
        // Unchanged: the next get moves no data.
        assert!(!b.get(&k).unwrap().moved);
        let t = a.lock(&k, 10_000).unwrap();
        assert!(matches!(b.lock(&k, 100), Err(Error::Busy { .. })));
        a.unlock(&k, t).unwrap();
        assert!(b.lock(&k, 100).unwrap() > t);
        assert_eq!(a.put(&k, b"stale", t), Err(Error::Fenced));
        // Rotating placement spreads homes over both members.
        let h1 = a
            .allocate("r1", 8, Model::Null, Placement::Rotate)
            .unwrap()
            .home;
        let h2 = a
            .allocate("r2", 8, Model::Null, Placement::Rotate)
            .unwrap()
            .home;
        assert_ne!(h1, h2);
        assert_eq!(k.to_string().parse::<Key>().unwrap(), k);
    }

    #[test]
    fn dead_home_is_a_clear_error_and_others_carry_on() {
        let (a, _b) = pair();
        let gone = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .to_string();
        a.add_member(&gone);
        let k = Key {
            name: "x".into(),
            home: gone.clone(),
        };
        assert!(matches!(a.get(&k), Err(Error::HomeUnreachable(_))));
        let mine = a
            .allocate("mine", 8, Model::Strict, Placement::Local)
            .unwrap();
        assert_eq!(a.put(&mine, b"ok", 0), Ok(1));
    }
}
