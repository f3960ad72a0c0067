//! DDSS over a byte stream (the daemons' authenticated TCP links; the
//! seed's RDMA and atomics, lines ~575-577, become one request/response
//! each): length-prefixed frames, the home's responder loop, and the
//! requester's blocking call. Authentication happens before these run
//! (engine `site`: the same Noise handshake as every ramsys link).

use std::io::{self, Read, Write};
use std::sync::Mutex;

use crate::lock::Holder;
use crate::msg::{Error, Op, Reply, Request, Response, MAX_FRAME};
use crate::store::Store;

/// A connected, authenticated stream.
pub trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// A frame: body length (u32 LE), body (ramsys-framing; one write, so a
/// sealed link seals it as one record).
pub fn write_frame(w: &mut dyn Write, body: &[u8]) -> io::Result<()> {
    let mut h = [0u8; 4];
    ramsys_framing::put_le_len(&mut h, 0, body.len());
    w.write_all(&ramsys_framing::encode(&h, body))?;
    w.flush()
}

/// One frame body; Ok(None) at a clean end of stream. A length above
/// MAX_FRAME is an error before anything is allocated.
pub fn read_frame(r: &mut dyn Read) -> io::Result<Option<Vec<u8>>> {
    let (mut h, mut b) = ([0u8; 4], Vec::new());
    let got = ramsys_framing::read_frame(r, &mut h, &mut b, |h| {
        let n = ramsys_framing::le_len(h, 0);
        if n > MAX_FRAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("ddss frame of {n} bytes"),
            ));
        }
        Ok(n as usize)
    })?;
    Ok(got.then_some(b))
}

/// The home's responder: answer requests from one peer until it closes.
/// `now_ms` is the home's clock (leases run on it).
pub fn serve(s: &mut dyn Stream, store: &Mutex<Store>, now_ms: &dyn Fn() -> u64) -> io::Result<()> {
    while let Some(b) = read_frame(s)? {
        let resp = match Request::decode(&b) {
            Ok(r) => Response {
                id: r.id,
                result: store.lock().unwrap().handle(r.holder, r.op, now_ms()),
            },
            Err(e) => {
                // Undecodable: answer once and drop the link.
                let _ = write_frame(
                    s,
                    &Response {
                        id: 0,
                        result: Err(e),
                    }
                    .encode(),
                );
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "bad ddss request",
                ));
            }
        };
        write_frame(s, &resp.encode())?;
    }
    Ok(())
}

/// The requester's end of a link to one home: one request in flight.
pub struct Requester {
    s: Box<dyn Stream>,
    next: u64,
    home: String,
}

impl Requester {
    pub fn new(s: Box<dyn Stream>, home: &str) -> Requester {
        Requester {
            s,
            next: 1,
            home: home.to_string(),
        }
    }

    /// Send `op`, wait for its reply. A broken link (or read timeout set
    /// on the stream) is HomeUnreachable; the caller drops the requester.
    pub fn call(&mut self, holder: Holder, op: Op) -> Result<Reply, Error> {
        let id = self.next;
        self.next += 1;
        let gone = |e: io::Error| Error::HomeUnreachable(format!("{}: {e}", self.home));
        write_frame(&mut self.s, &Request { id, holder, op }.encode()).map_err(gone)?;
        let b = read_frame(&mut self.s)
            .map_err(gone)?
            .ok_or_else(|| Error::HomeUnreachable(format!("{}: closed", self.home)))?;
        let r = Response::decode(&b)?;
        if r.id != id {
            return Err(Error::Protocol(format!("reply {} to request {id}", r.id)));
        }
        r.result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Model;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn read_frame_never_panics(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = read_frame(&mut &b[..]);
        }
    }

    #[test]
    fn huge_length_is_refused_before_allocation() {
        let b = u32::MAX.to_le_bytes();
        assert!(read_frame(&mut &b[..]).is_err());
    }

    #[test]
    fn responder_answers_over_a_socket() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        let store = std::sync::Arc::new(Mutex::new(Store::new(1024)));
        let st = store.clone();
        let t = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            serve(&mut c, &st, &|| 0).unwrap();
        });
        let mut r = Requester::new(Box::new(std::net::TcpStream::connect(a).unwrap()), "h");
        r.call(
            1,
            Op::Allocate {
                name: "x".into(),
                capacity: 8,
                model: Model::Version,
            },
        )
        .unwrap();
        assert_eq!(
            r.call(
                1,
                Op::Put {
                    name: "x".into(),
                    data: b"hi".to_vec(),
                    token: 0
                }
            ),
            Ok(Reply::Stored { version: 1 })
        );
        assert_eq!(
            r.call(
                2,
                Op::Get {
                    name: "x".into(),
                    have: Some(1),
                    slack: 0
                }
            ),
            Ok(Reply::Unchanged {
                version: 1,
                model: Model::Version
            })
        );
        drop(r);
        t.join().unwrap();
    }
}
