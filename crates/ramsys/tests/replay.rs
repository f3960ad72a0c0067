//! Replayed credentials: an Auth captured from one handshake, or a Join
//! captured from one session, must not open anything anywhere else.

mod common;

use std::time::Duration;

use common::*;
use ramsys_engine::transport::tcp::Tcp;
use ramsys_engine::transport::wire::{exchange_preamble, recv_control, send_control};
use ramsys_engine::transport::{Link, Transport};
use ramsys_proto::auth::{join_mac, ClientHandshake};
use ramsys_proto::Control;

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

fn dial(addr: &str) -> Box<dyn Link> {
    let mut l = Tcp::default()
        .connect(addr, Duration::from_secs(5))
        .unwrap();
    l.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    exchange_preamble(&mut *l).unwrap();
    l
}

/// A full handshake; returns the control link (session alive), the
/// Hello and Auth as sent, and the session id and key.
fn handshake(addr: &str) -> (Box<dyn Link>, Control, Control, u64, [u8; 32]) {
    let mut l = dial(addr);
    let mut hs = ClientHandshake::new(KEY, "tester");
    let hello = hs.hello().unwrap();
    send_control(&mut *l, &hello).unwrap();
    let ch = recv_control(&mut *l).unwrap();
    let auth = hs.on_challenge(&ch).unwrap();
    send_control(&mut *l, &auth).unwrap();
    let (session, key) = hs.session().unwrap();
    match recv_control(&mut *l).unwrap() {
        Control::AuthOk { session: s } => assert_eq!(s, session),
        other => panic!("expected AuthOk, got {other:?}"),
    }
    (l, hello, auth, session, key)
}

/// The server answers with Error or closes: either way, refused.
fn refused(l: &mut Box<dyn Link>) -> bool {
    !matches!(
        recv_control(&mut **l),
        Ok(Control::AuthOk { .. }) | Ok(Control::JoinOk)
    )
}

fn join(session: u64, key: &[u8; 32], stream: u16, nonce: [u8; 32]) -> Control {
    Control::Join {
        session,
        stream,
        nonce,
        mac: join_mac(key, session, stream, &nonce),
    }
}

#[test]
fn replayed_auth_and_join_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = TestDaemon::start(&root, &key);

    let (ctl_a, hello, auth, sa, ka) = handshake(&d.addr);

    // 1. The captured Hello and Auth replayed on a new connection: the
    //    Hello still shows the key (the daemon answers it), but the Auth
    //    proves the old session's ephemeral secret, not this one's.
    let mut l = dial(&d.addr);
    send_control(&mut *l, &hello).unwrap();
    assert!(matches!(
        recv_control(&mut *l).unwrap(),
        Control::Challenge { .. }
    ));
    send_control(&mut *l, &auth).unwrap();
    assert!(refused(&mut l), "a replayed Auth was accepted");

    // 2. The Auth alone as a first message.
    let mut l = dial(&d.addr);
    send_control(&mut *l, &auth).unwrap();
    assert!(refused(&mut l), "a bare Auth was accepted");

    // 3. A Join of session A presented for a live session B (id swapped):
    //    the MAC binds the session id and key.
    let (ctl_b, _, _, sb, _kb) = handshake(&d.addr);
    let Control::Join {
        stream, nonce, mac, ..
    } = join(sa, &ka, 0, [3; 32])
    else {
        unreachable!()
    };
    let mut l = dial(&d.addr);
    send_control(
        &mut *l,
        &Control::Join {
            session: sb,
            stream,
            nonce,
            mac,
        },
    )
    .unwrap();
    assert!(refused(&mut l), "session A's Join opened a link into B");

    // 4. A valid Join of session A replayed after A has ended.
    let captured = join(sa, &ka, 0, [4; 32]);
    drop(ctl_a);
    std::thread::sleep(Duration::from_millis(300));
    let mut l = dial(&d.addr);
    send_control(&mut *l, &captured).unwrap();
    assert!(refused(&mut l), "a Join of an ended session was accepted");
    drop(ctl_b);

    // The daemon still serves honest clients.
    let f = t.path().join("f");
    std::fs::write(&f, b"still fine").unwrap();
    assert_ok(&ramsys(&key, &["cp", f.to_str().unwrap(), &d.url("f")]));
    assert_eq!(std::fs::read(root.join("f")).unwrap(), b"still fine");
}
