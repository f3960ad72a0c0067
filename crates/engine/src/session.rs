//! Connection setup: version preamble, challenge/response authentication
//! and data-link joins, for both the connecting (client) and accepting
//! (server) side.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Receiver;
use ramsys_proto::auth::{join_mac, ClientHandshake};
use ramsys_proto::control::Bytes32;
use ramsys_proto::{Control, ProtoError};

use crate::transport::{Link, Transport};
use crate::wire::{exchange_preamble, recv_control, send_control};
use crate::EngineError;

/// Fresh random bytes from the OS.
pub fn random32() -> Bytes32 {
    let mut b = [0u8; 32];
    getrandom::getrandom(&mut b).expect("OS randomness");
    b
}

/// The user name we authenticate as.
pub fn current_user() -> String {
    std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".into())
}

/// An authenticated control connection, client side.
pub struct ClientSession {
    pub ctl: Box<dyn Link>,
    pub session: u64,
    pub session_key: Bytes32,
    pub addr: String,
}

fn connect_err(addr: &str, e: std::io::Error) -> EngineError {
    EngineError::local(format!("cannot connect to {addr}: {e}"))
}

/// Connect to a daemon and authenticate.
pub fn client_connect(
    transport: &dyn Transport,
    addr: &str,
    key: &[u8],
    timeout: Duration,
) -> Result<ClientSession, EngineError> {
    let mut ctl = transport
        .connect(addr, timeout)
        .map_err(|e| connect_err(addr, e))?;
    ctl.set_read_timeout(Some(timeout))?;
    exchange_preamble(&mut *ctl).map_err(|e| match e {
        EngineError::Io(io) => connect_err(addr, io),
        other => other,
    })?;
    let mut hs = ClientHandshake::new(key, &current_user(), random32());
    send_control(&mut *ctl, &hs.hello())?;
    let reply = recv_control(&mut *ctl)?;
    if let Control::Error { message, .. } = &reply {
        return Err(EngineError::Refused(message.clone()));
    }
    let auth = hs.on_challenge(&reply).map_err(|e| match e {
        ProtoError::AuthFailed => EngineError::local(format!(
            "authentication failed: the daemon at {addr} does not hold our key (check --key-file)"
        )),
        other => other.into(),
    })?;
    send_control(&mut *ctl, &auth)?;
    let ok = match recv_control(&mut *ctl) {
        Ok(m) => m,
        Err(EngineError::PeerClosed) | Err(EngineError::Io(_)) => {
            return Err(EngineError::local(format!(
                "authentication failed: the daemon at {addr} refused our key (check --key-file)"
            )))
        }
        Err(e) => return Err(e),
    };
    let (session, session_key) = hs.on_auth_ok(&ok).map_err(|_| {
        EngineError::local(format!(
            "authentication failed: the daemon at {addr} refused our key (check --key-file)"
        ))
    })?;
    Ok(ClientSession {
        ctl,
        session,
        session_key,
        addr: addr.to_string(),
    })
}

/// Opens the data links of a session once the stream count is agreed.
pub trait LinkProvider: Send {
    fn open(&mut self, streams: u16) -> Result<Vec<Box<dyn Link>>, EngineError>;
}

/// Client side: dial `streams` connections and join each to the session.
pub struct ClientLinks {
    pub transport: Arc<dyn Transport>,
    pub addr: String,
    pub session: u64,
    pub session_key: Bytes32,
    pub timeout: Duration,
}

impl ClientLinks {
    fn join(&self, stream: u16) -> Result<Box<dyn Link>, EngineError> {
        let mut l = self
            .transport
            .connect(&self.addr, self.timeout)
            .map_err(|e| connect_err(&self.addr, e))?;
        l.set_read_timeout(Some(self.timeout))?;
        exchange_preamble(&mut *l)?;
        let nonce = random32();
        let mac = join_mac(&self.session_key, self.session, stream, &nonce);
        send_control(
            &mut *l,
            &Control::Join {
                session: self.session,
                stream,
                nonce,
                mac,
            },
        )?;
        match recv_control(&mut *l)? {
            Control::JoinOk => Ok(l),
            Control::Error { message, .. } => Err(EngineError::Refused(message)),
            other => Err(ProtoError::Unexpected {
                got: other.name(),
                state: "awaiting JoinOk",
            }
            .into()),
        }
    }
}

impl LinkProvider for ClientLinks {
    fn open(&mut self, streams: u16) -> Result<Vec<Box<dyn Link>>, EngineError> {
        // Dial in parallel: on a long path each join costs round trips.
        let this = &*self;
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..streams)
                .map(|i| s.spawn(move || this.join(i)))
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(EngineError::local("join thread panicked")))
                })
                .collect()
        })
    }
}

/// Server side: links arrive through the daemon's dispatcher.
pub struct ServerLinks {
    pub rx: Receiver<(u16, Box<dyn Link>)>,
    pub timeout: Duration,
}

impl LinkProvider for ServerLinks {
    fn open(&mut self, streams: u16) -> Result<Vec<Box<dyn Link>>, EngineError> {
        let mut slots: Vec<Option<Box<dyn Link>>> = (0..streams).map(|_| None).collect();
        let mut got = 0;
        let deadline = std::time::Instant::now() + self.timeout;
        while got < streams {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let (i, mut l) = self.rx.recv_timeout(left).map_err(|_| {
                EngineError::local("peer did not open its data connections in time")
            })?;
            match slots.get_mut(i as usize) {
                Some(s @ None) => {
                    send_control(&mut *l, &Control::JoinOk)?;
                    *s = Some(l);
                    got += 1;
                }
                _ => {
                    tracing::warn!("refusing data link for stream {i} (duplicate or out of range)");
                    let _ = send_control(
                        &mut *l,
                        &Control::Error {
                            code: 3,
                            message: format!("stream {i} duplicate or out of range"),
                        },
                    );
                }
            }
        }
        Ok(slots.into_iter().map(|s| s.unwrap()).collect())
    }
}
