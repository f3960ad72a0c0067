//! The accepting end's data links, as the daemon's dispatcher hands them
//! to a session (server.rs `join`, `rejoin`): the preamble, a Join or
//! Rejoin checked against the session key, then the link goes to the
//! session (ServerLinks) as (stream, epoch, link); the session answers.

use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver, Sender};
use ramsys_engine::transport::mem::Listener;
use ramsys_engine::transport::wire::{exchange_preamble, recv_control, send_final};
use ramsys_engine::transport::Link;
use ramsys_proto::auth::{verify_join, verify_rejoin};
use ramsys_proto::control::Bytes32;
use ramsys_proto::Control;

pub type Arrival = (u16, u16, Box<dyn Link>);

/// Serve `listener` for session `session` until the net stops listening.
pub fn data_links(listener: Listener, session: u64, key: Bytes32) -> Receiver<Arrival> {
    let (tx, rx) = unbounded();
    std::thread::Builder::new()
        .name("mem-accept".into())
        .spawn(move || {
            while let Some(link) = listener.accept() {
                let tx = tx.clone();
                std::thread::spawn(move || admit(link, session, &key, &tx));
            }
        })
        .unwrap();
    rx
}

fn admit(mut link: Box<dyn Link>, session: u64, key: &Bytes32, tx: &Sender<Arrival>) {
    let _ = link.set_read_timeout(Some(Duration::from_secs(30)));
    if exchange_preamble(&mut *link).is_err() {
        return;
    }
    let arrival = match recv_control(&mut *link) {
        Ok(Control::Join {
            session: s,
            stream,
            nonce,
            mac,
        }) if s == session && verify_join(key, s, stream, &nonce, &mac) => (stream, 0),
        Ok(Control::Rejoin {
            session: s,
            stream,
            epoch,
            nonce,
            mac,
        }) if s == session && epoch > 0 && verify_rejoin(key, s, stream, epoch, &nonce, &mac) => {
            (stream, epoch)
        }
        Ok(_) => {
            let message = "unknown session or bad credentials".into();
            send_final(&mut *link, &Control::Error { code: 1, message });
            return;
        }
        Err(_) => return,
    };
    let _ = tx.send((arrival.0, arrival.1, link));
}
