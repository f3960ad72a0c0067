//! DDSS wire messages (docs/PROTOCOL.md "Site links"): requests a
//! requester sends to a segment's home and the home's responses. The
//! encoding is postcard (as the control messages); each message travels
//! in a frame of a 4-byte little-endian length and the body. Decoders take
//! untrusted bytes: they bound every length and never panic (fuzzed below).

use serde::{Deserialize, Serialize};

use crate::lock::Holder;
use crate::model::Model;

/// Largest segment (bytes of data) a home accepts.
pub const MAX_SEGMENT: u32 = 1 << 20;
/// Longest segment name (bytes of UTF-8).
pub const MAX_NAME: usize = 255;
/// Largest frame body: a full segment plus its envelope.
pub const MAX_FRAME: u32 = MAX_SEGMENT + 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Echoed in the response.
    pub id: u64,
    pub holder: Holder,
    pub op: Op,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// allocate_ss(nbytes, type): create `name` at this home, or return
    /// the existing segment of that name (the seed's "special
    /// identifiers": one creator, everyone else gets a handle).
    Allocate {
        name: String,
        capacity: u32,
        model: Model,
    },
    /// release_ss(key).
    Release { name: String },
    /// get(): `have` is the version the requester holds (None: nothing);
    /// the home answers Unchanged if `have + slack >= latest`, else Data.
    Get {
        name: String,
        have: Option<u64>,
        slack: u64,
    },
    /// put(): `token` 0 = no lock claimed; else the lock's fencing token.
    Put {
        name: String,
        data: Vec<u8>,
        token: u64,
    },
    /// acquire_lock_ss(key) with a lease.
    Lock { name: String, lease_ms: u32 },
    /// release_lock_ss(key).
    Unlock { name: String, token: u64 },
    /// Liveness and the home's clock.
    Ping,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    pub id: u64,
    pub result: Result<Reply, Error>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Allocated {
        model: Model,
        capacity: u32,
        created: bool,
    },
    Released,
    Data {
        version: u64,
        model: Model,
        data: Vec<u8>,
    },
    /// The requester's copy is current enough; no data moves.
    Unchanged {
        version: u64,
        model: Model,
    },
    Stored {
        version: u64,
    },
    Locked {
        token: u64,
        lease_ms: u32,
    },
    Unlocked,
    Pong {
        now_ms: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Error {
    #[error("no segment named {0}")]
    NoSuchKey(String),
    #[error("segment {name} exists with model {model}")]
    Exists { name: String, model: Model },
    #[error("segment locked by another holder for {remaining_ms} ms more")]
    Busy { holder: Holder, remaining_ms: u64 },
    #[error("lock token is stale or its lease expired (fenced)")]
    Fenced,
    #[error("{len} bytes do not fit the segment's {capacity}")]
    TooLarge { len: u64, capacity: u32 },
    #[error("the home's pool has no free range of {0} bytes")]
    NoSpace(u32),
    #[error("bad segment name: {0}")]
    BadName(String),
    #[error("segment version exhausted (2^64-1 puts): release and reallocate")]
    VersionExhausted,
    /// Requester side only: the home is down or unreachable. Soft state:
    /// the data is gone with its home until someone publishes it again.
    #[error("home unreachable: {0}")]
    HomeUnreachable(String),
    #[error("protocol error: {0}")]
    Protocol(String),
}

fn encode<T: Serialize>(m: &T) -> Vec<u8> {
    // Infallible for these types: no maps, no non-string keys.
    postcard::to_stdvec(m).expect("ddss messages always serialize")
}

fn decode<'a, T: Deserialize<'a>>(b: &'a [u8]) -> Result<T, Error> {
    if b.len() > MAX_FRAME as usize {
        return Err(Error::Protocol(format!("{} byte message", b.len())));
    }
    let (m, rest) =
        postcard::take_from_bytes::<T>(b).map_err(|e| Error::Protocol(e.to_string()))?;
    if !rest.is_empty() {
        return Err(Error::Protocol(format!("{} trailing bytes", rest.len())));
    }
    Ok(m)
}

impl Request {
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }
    pub fn decode(b: &[u8]) -> Result<Request, Error> {
        decode(b)
    }
}

impl Response {
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }
    pub fn decode(b: &[u8]) -> Result<Response, Error> {
        decode(b)
    }
}

/// Check a segment name: 1-255 bytes, no control characters.
pub fn check_name(name: &str) -> Result<(), Error> {
    if name.is_empty() || name.len() > MAX_NAME || name.chars().any(|c| c.is_control()) {
        return Err(Error::BadName(
            name.chars().take(40).collect::<String>() + if name.len() > 40 { "..." } else { "" },
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn model() -> impl Strategy<Value = Model> {
        prop_oneof![
            Just(Model::Strict),
            Just(Model::Write),
            Just(Model::Read),
            Just(Model::Null),
            Just(Model::Version),
            any::<u64>().prop_map(Model::Delta),
            any::<u32>().prop_map(Model::Temporal),
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        let name = "[a-z/0-9:.]{1,40}";
        prop_oneof![
            (name, any::<u32>(), model()).prop_map(|(name, capacity, model)| Op::Allocate {
                name,
                capacity,
                model
            }),
            name.prop_map(|name| Op::Release { name }),
            (name, any::<Option<u64>>(), any::<u64>()).prop_map(|(name, have, slack)| Op::Get {
                name,
                have,
                slack
            }),
            (
                name,
                proptest::collection::vec(any::<u8>(), 0..300),
                any::<u64>()
            )
                .prop_map(|(name, data, token)| Op::Put { name, data, token }),
            (name, any::<u32>()).prop_map(|(name, lease_ms)| Op::Lock { name, lease_ms }),
            (name, any::<u64>()).prop_map(|(name, token)| Op::Unlock { name, token }),
            Just(Op::Ping),
        ]
    }

    fn reply() -> impl Strategy<Value = Result<Reply, Error>> {
        prop_oneof![
            (
                any::<u64>(),
                model(),
                proptest::collection::vec(any::<u8>(), 0..300)
            )
                .prop_map(|(version, model, data)| Ok(Reply::Data {
                    version,
                    model,
                    data
                })),
            (any::<u64>(), model())
                .prop_map(|(version, model)| Ok(Reply::Unchanged { version, model })),
            any::<u64>().prop_map(|version| Ok(Reply::Stored { version })),
            (any::<u64>(), any::<u32>())
                .prop_map(|(token, lease_ms)| Ok(Reply::Locked { token, lease_ms })),
            (any::<u64>(), any::<u64>()).prop_map(|(holder, remaining_ms)| Err(Error::Busy {
                holder,
                remaining_ms
            })),
            Just(Err(Error::Fenced)),
            "[a-z]{0,20}".prop_map(|s| Err(Error::NoSuchKey(s))),
        ]
    }

    proptest! {
        #[test]
        fn requests_roundtrip(id in any::<u64>(), holder in any::<u64>(), op in op()) {
            let r = Request { id, holder, op };
            prop_assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        }

        #[test]
        fn responses_roundtrip(id in any::<u64>(), result in reply()) {
            let r = Response { id, result };
            prop_assert_eq!(Response::decode(&r.encode()).unwrap(), r);
        }

        #[test]
        fn decoders_never_panic(b in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Request::decode(&b);
            let _ = Response::decode(&b);
        }

        #[test]
        fn truncated_or_extended_is_an_error(id in any::<u64>(), op in op(), cut in 0usize..64) {
            let b = Request { id, holder: 1, op }.encode();
            let cut = cut.min(b.len() - 1);
            prop_assert!(Request::decode(&b[..b.len() - 1 - cut]).is_err());
            let mut longer = b.clone();
            longer.push(0);
            prop_assert!(Request::decode(&longer).is_err());
        }
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("load/127.0.0.1:4000").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name(&"x".repeat(256)).is_err());
        assert!(check_name("a\nb").is_err());
    }
}
