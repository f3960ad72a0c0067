//! The wire protocol is versioned (the preamble, docs/PROTOCOL.md): a peer
//! of another version gets one clear line naming both versions, never a
//! half-run handshake (issue 34 bumped it to 3 with the Noise handshake).

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use common::*;
use ramsys_proto::{parse_preamble, preamble, ProtoError, PREAMBLE_LEN, VERSION};

/// A daemon of the previous protocol, as it behaved: its preamble first,
/// then the client's; on a mismatch it closes.
fn old_daemon() -> (String, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let h = std::thread::spawn(move || {
        l.set_nonblocking(true).unwrap();
        let end = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < end {
            match l.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                    let _ = s.write_all(&preamble(VERSION - 1));
                    let mut p = [0u8; PREAMBLE_LEN];
                    let _ = s.read_exact(&mut p);
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    });
    (addr, h)
}

#[test]
fn an_agent_meeting_an_old_daemon_says_both_versions_in_one_line() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let f = t.path().join("f");
    std::fs::write(&f, b"x").unwrap();
    let (addr, _h) = old_daemon();
    let url = format!("ramsys://{addr}/f");
    let o = ramsys(&key, &["cp", f.to_str().unwrap(), &url]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    let want = format!(
        "protocol version mismatch: we speak {VERSION}, peer speaks {}",
        VERSION - 1
    );
    assert!(err.contains(&want), "{err}");
}

#[test]
fn an_old_agent_meeting_a_new_daemon_reads_its_version_first() {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let d = TestDaemon::start(&root, &key);
    // A client of the previous protocol: preamble and its Hello (nonce,
    // user) in one write, then it reads the daemon's preamble.
    let mut s = TcpStream::connect(&d.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hello = vec![0u8]; // Control::Hello's tag
    hello.extend_from_slice(&[7; 32]);
    hello.extend_from_slice(&[5, b'a', b'l', b'i', b'c', b'e']);
    let mut out = preamble(VERSION - 1).to_vec();
    out.extend_from_slice(&[1, 1, 0, 0]);
    out.extend_from_slice(&(hello.len() as u32).to_le_bytes());
    out.extend_from_slice(&hello);
    s.write_all(&out).unwrap();
    let mut p = [0u8; PREAMBLE_LEN];
    s.read_exact(&mut p).unwrap();
    // What the older client does with it: one line naming both versions.
    let theirs = parse_preamble(&p).unwrap();
    assert_eq!(theirs, VERSION);
    let ours = VERSION - 1;
    let line = ProtoError::VersionMismatch { ours, theirs }.to_string();
    let want = format!("protocol version mismatch: we speak {ours}, peer speaks {theirs}");
    assert!(line.starts_with(&want), "{line}");
    // Nothing else follows: no Challenge for a client of another version.
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{rest:?}");
    // And the daemon goes on serving its own version.
    let f = t.path().join("f");
    std::fs::write(&f, b"fine").unwrap();
    assert_ok(&ramsys(&key, &["cp", f.to_str().unwrap(), &d.url("f")]));
    assert_eq!(std::fs::read(root.join("f")).unwrap(), b"fine");
}
