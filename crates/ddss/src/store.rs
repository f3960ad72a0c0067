//! The home node's side of DDSS (seed 003 sec. 2.2.1-2.2.3): the segments
//! homed here, their bytes in one pre-allocated pool (first-fit), their
//! 64-bit versions and lock words. Sans-I/O: [`Store::handle`] turns one
//! request and the home's clock into one reply; the transport's responder
//! thread (standing in for the seed's one-sided RDMA access) calls it.
//! Each request is applied atomically, so a get never sees half a put.

use std::collections::HashMap;

use crate::alloc::FirstFit;
use crate::lock::{Holder, LockError, LockWord};
use crate::model::Model;
use crate::msg::{check_name, Error, Op, Reply, MAX_SEGMENT};

#[derive(Debug)]
struct Segment {
    off: u64,
    capacity: u32,
    len: u32,
    /// 0 until the first put; +1 per put.
    version: u64,
    model: Model,
    lock: LockWord,
}

/// The segments homed on this node.
pub struct Store {
    pool: Vec<u8>,
    alloc: FirstFit,
    segs: HashMap<String, Segment>,
}

impl From<LockError> for Error {
    fn from(e: LockError) -> Error {
        match e {
            LockError::Busy {
                holder,
                remaining_ms,
            } => Error::Busy {
                holder,
                remaining_ms,
            },
            LockError::Fenced => Error::Fenced,
        }
    }
}

impl Store {
    /// A home with a pool of `pool_bytes` (allocated once).
    pub fn new(pool_bytes: usize) -> Store {
        Store {
            pool: vec![0; pool_bytes],
            alloc: FirstFit::new(pool_bytes as u64),
            segs: HashMap::new(),
        }
    }

    pub fn free_bytes(&self) -> u64 {
        self.alloc.free_bytes()
    }

    pub fn len(&self) -> usize {
        self.segs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }

    fn seg(&mut self, name: &str) -> Result<&mut Segment, Error> {
        self.segs
            .get_mut(name)
            .ok_or_else(|| Error::NoSuchKey(name.to_string()))
    }

    /// Apply one request from `who` at home time `now_ms`.
    pub fn handle(&mut self, who: Holder, op: Op, now_ms: u64) -> Result<Reply, Error> {
        match op {
            Op::Ping => Ok(Reply::Pong { now_ms }),
            Op::Allocate {
                name,
                capacity,
                model,
            } => self.allocate(name, capacity, model),
            Op::Release { name } => self.release(who, &name, now_ms),
            Op::Get { name, have, slack } => self.get(who, name, have, slack, now_ms),
            Op::Put { name, data, token } => self.put(who, name, &data, token, now_ms),
            Op::Lock { name, lease_ms } => {
                let s = self.seg(&name)?;
                let token = s.lock.acquire(who, lease_ms as u64, now_ms)?;
                Ok(Reply::Locked { token, lease_ms })
            }
            Op::Unlock { name, token } => {
                self.seg(&name)?.lock.release(token, now_ms)?;
                Ok(Reply::Unlocked)
            }
        }
    }

    /// Create `name`, or hand out the existing segment of that name when
    /// its model is the same.
    fn allocate(&mut self, name: String, capacity: u32, model: Model) -> Result<Reply, Error> {
        check_name(&name)?;
        if let Some(s) = self.segs.get(&name) {
            return if s.model == model {
                Ok(Reply::Allocated {
                    model,
                    capacity: s.capacity,
                    created: false,
                })
            } else {
                Err(Error::Exists {
                    name,
                    model: s.model,
                })
            };
        }
        if capacity > MAX_SEGMENT {
            return Err(Error::TooLarge {
                len: capacity as u64,
                capacity: MAX_SEGMENT,
            });
        }
        let off = self
            .alloc
            .alloc(capacity as u64)
            .ok_or(Error::NoSpace(capacity))?;
        self.segs.insert(
            name,
            Segment {
                off,
                capacity,
                len: 0,
                version: 0,
                model,
                lock: LockWord::default(),
            },
        );
        Ok(Reply::Allocated {
            model,
            capacity,
            created: true,
        })
    }

    /// Free a segment nobody else holds locked.
    fn release(&mut self, who: Holder, name: &str, now_ms: u64) -> Result<Reply, Error> {
        let s = self.seg(name)?;
        if s.lock.excludes(who, now_ms) {
            return Err(Error::Busy {
                holder: s.lock.holder(now_ms).unwrap_or(0),
                remaining_ms: 0,
            });
        }
        let (off, cap) = (s.off, s.capacity);
        self.segs.remove(name);
        self.alloc.release(off, cap as u64);
        Ok(Reply::Released)
    }

    /// The data, or Unchanged when the requester's version `have` is
    /// within `slack` of ours.
    fn get(
        &self,
        who: Holder,
        name: String,
        have: Option<u64>,
        slack: u64,
        now_ms: u64,
    ) -> Result<Reply, Error> {
        let s = self.segs.get(&name).ok_or(Error::NoSuchKey(name))?;
        if s.model.lock_excludes_get() && s.lock.excludes(who, now_ms) {
            return Err(s.lock.clone().acquire(who, 0, now_ms).unwrap_err().into());
        }
        // `have` newer than ours cannot be current (a reallocated
        // segment restarted its versions): send the data.
        match have {
            Some(h) if h <= s.version && h.saturating_add(slack) >= s.version => {
                Ok(Reply::Unchanged {
                    version: s.version,
                    model: s.model,
                })
            }
            _ => Ok(Reply::Data {
                version: s.version,
                model: s.model,
                data: self.pool[s.off as usize..][..s.len as usize].to_vec(),
            }),
        }
    }

    /// Store `data` as the next version: under the lock's fencing `token`
    /// (0: none claimed) where the model wants one.
    fn put(
        &mut self,
        who: Holder,
        name: String,
        data: &[u8],
        token: u64,
        now_ms: u64,
    ) -> Result<Reply, Error> {
        let s = self.segs.get_mut(&name).ok_or(Error::NoSuchKey(name))?;
        if token != 0 {
            s.lock.check(token, now_ms)?;
        } else if s.model.lock_excludes_put() && s.lock.excludes(who, now_ms) {
            return Err(s.lock.clone().acquire(who, 0, now_ms).unwrap_err().into());
        }
        if data.len() > s.capacity as usize {
            return Err(Error::TooLarge {
                len: data.len() as u64,
                capacity: s.capacity,
            });
        }
        // Decision (docs/SITE.md): versions never wrap; the last
        // one is terminal, so "same version = same data" holds.
        if s.version == u64::MAX {
            return Err(Error::VersionExhausted);
        }
        self.pool[s.off as usize..][..data.len()].copy_from_slice(data);
        s.len = data.len() as u32;
        s.version += 1;
        Ok(Reply::Stored { version: s.version })
    }

    /// Test hook: set a segment's version (version exhaustion).
    #[cfg(test)]
    fn set_version(&mut self, name: &str, v: u64) {
        self.segs.get_mut(name).unwrap().version = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(s: &mut Store, name: &str, model: Model) {
        s.handle(
            1,
            Op::Allocate {
                name: name.into(),
                capacity: 64,
                model,
            },
            0,
        )
        .unwrap();
    }

    fn put(
        s: &mut Store,
        who: u64,
        name: &str,
        d: &[u8],
        token: u64,
        now: u64,
    ) -> Result<Reply, Error> {
        s.handle(
            who,
            Op::Put {
                name: name.into(),
                data: d.to_vec(),
                token,
            },
            now,
        )
    }

    #[test]
    fn allocate_is_idempotent_per_name_and_release_frees() {
        let mut s = Store::new(128);
        alloc(&mut s, "a", Model::Version);
        assert_eq!(
            s.handle(
                2,
                Op::Allocate {
                    name: "a".into(),
                    capacity: 64,
                    model: Model::Version
                },
                0
            ),
            Ok(Reply::Allocated {
                model: Model::Version,
                capacity: 64,
                created: false
            })
        );
        assert!(matches!(
            s.handle(
                2,
                Op::Allocate {
                    name: "a".into(),
                    capacity: 64,
                    model: Model::Null
                },
                0
            ),
            Err(Error::Exists { .. })
        ));
        alloc(&mut s, "b", Model::Null);
        assert_eq!(
            s.handle(
                2,
                Op::Allocate {
                    name: "c".into(),
                    capacity: 1,
                    model: Model::Null
                },
                0
            ),
            Err(Error::NoSpace(1))
        );
        s.handle(2, Op::Release { name: "a".into() }, 0).unwrap();
        alloc(&mut s, "c", Model::Null);
        assert_eq!(s.free_bytes(), 0);
    }

    #[test]
    fn stale_lock_holder_is_fenced() {
        let mut s = Store::new(128);
        alloc(&mut s, "k", Model::Write);
        let Ok(Reply::Locked { token: t1, .. }) = s.handle(
            1,
            Op::Lock {
                name: "k".into(),
                lease_ms: 100,
            },
            0,
        ) else {
            panic!()
        };
        // Another writer is excluded while the lease runs.
        assert!(matches!(
            put(&mut s, 2, "k", b"x", 0, 10),
            Err(Error::Busy { .. })
        ));
        // Holder 1 stalls past its lease; holder 2 locks.
        let Ok(Reply::Locked { token: t2, .. }) = s.handle(
            2,
            Op::Lock {
                name: "k".into(),
                lease_ms: 100,
            },
            150,
        ) else {
            panic!()
        };
        assert_eq!(put(&mut s, 1, "k", b"old", t1, 160), Err(Error::Fenced));
        assert_eq!(
            put(&mut s, 2, "k", b"new", t2, 160),
            Ok(Reply::Stored { version: 1 })
        );
    }

    #[test]
    fn versions_do_not_wrap() {
        let mut s = Store::new(64);
        alloc(&mut s, "v", Model::Version);
        s.set_version("v", u64::MAX - 1);
        assert_eq!(
            put(&mut s, 1, "v", b"a", 0, 0),
            Ok(Reply::Stored { version: u64::MAX })
        );
        assert_eq!(
            put(&mut s, 1, "v", b"b", 0, 0),
            Err(Error::VersionExhausted)
        );
    }

    #[test]
    fn strict_excludes_readers_write_does_not() {
        let mut s = Store::new(128);
        alloc(&mut s, "s", Model::Strict);
        alloc(&mut s, "w", Model::Write);
        for n in ["s", "w"] {
            s.handle(
                1,
                Op::Lock {
                    name: n.into(),
                    lease_ms: 100,
                },
                0,
            )
            .unwrap();
        }
        let get = |s: &mut Store, n: &str| {
            s.handle(
                2,
                Op::Get {
                    name: n.into(),
                    have: None,
                    slack: 0,
                },
                1,
            )
        };
        assert!(matches!(
            get(&mut s, "s"),
            Err(Error::Busy { holder: 1, .. })
        ));
        assert!(matches!(get(&mut s, "w"), Ok(Reply::Data { .. })));
        assert!(put(&mut s, 2, "s", b"x", 0, 1).is_err());
        // The holder itself is not excluded.
        assert!(put(&mut s, 1, "s", b"x", 0, 1).is_ok());
    }

    #[test]
    fn too_large_put_is_refused_and_data_kept() {
        let mut s = Store::new(128);
        alloc(&mut s, "a", Model::Null);
        put(&mut s, 1, "a", b"keep", 0, 0).unwrap();
        assert!(matches!(
            put(&mut s, 1, "a", &[0; 65], 0, 0),
            Err(Error::TooLarge { .. })
        ));
        assert_eq!(
            s.handle(
                1,
                Op::Get {
                    name: "a".into(),
                    have: None,
                    slack: 0
                },
                0
            ),
            Ok(Reply::Data {
                version: 1,
                model: Model::Null,
                data: b"keep".to_vec()
            })
        );
    }
}
