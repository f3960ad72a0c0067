//! Handshakes per second on one core, both ends in one thread, no I/O
//! (issue 34: the cost of forward secrecy, docs/SECURITY.md "Handshake").
//!
//!     cargo run --release -p ramsys-proto --example handshake_rate [SECONDS] [ROUNDS]
//!
//! Interleaves, ROUNDS times, SECONDS (default 1) of each:
//! - `noise`: the Noise NNpsk0 handshake of proto::auth (Hello, Challenge,
//!   Auth checked, AuthOk), client and server;
//! - `hmac`: the challenge/response of protocols 1 and 2 (two nonces,
//!   server and client proofs made and checked, session key at both ends:
//!   five HMAC-SHA256), rebuilt here as the baseline.
//!
//! Prints each round and the medians.

use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use ramsys_proto::auth::{Accept, ClientHandshake, ServerHandshake};
use ramsys_proto::Control;
use sha2::Sha256;

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn noise() -> [u8; 32] {
    let mut c = ClientHandshake::new(KEY, "alice");
    let hello = c.hello().unwrap();
    let mut s = ServerHandshake::accept(KEY, &hello).unwrap();
    let ch = s
        .challenge(Accept {
            session: 1,
            tcp: None,
        })
        .unwrap();
    let auth = c.on_challenge(&ch).unwrap();
    let (_, k) = s.on_auth(&auth).unwrap();
    c.on_auth_ok(&Control::AuthOk { session: 1 }).unwrap();
    k
}

fn mac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap();
    for p in parts {
        m.update(&(p.len() as u64).to_le_bytes());
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

fn hmac(n: u64) -> [u8; 32] {
    // Nonces from the OS as the old handshake drew them (random32).
    let (mut cn, mut sn) = ([0u8; 32], [0u8; 32]);
    getrandom::getrandom(&mut cn).unwrap();
    getrandom::getrandom(&mut sn).unwrap();
    cn[..8].copy_from_slice(&n.to_le_bytes());
    let u = b"alice";
    let sp = mac(KEY, &[b"ramsys-v1 server", &cn, &sn, u]);
    assert_eq!(sp, mac(KEY, &[b"ramsys-v1 server", &cn, &sn, u]));
    let cp = mac(KEY, &[b"ramsys-v1 client", &cn, &sn, u]);
    assert_eq!(cp, mac(KEY, &[b"ramsys-v1 client", &cn, &sn, u]));
    mac(KEY, &[b"ramsys-v1 session", &cn, &sn])
}

fn rate(secs: f64, f: &mut dyn FnMut(u64) -> [u8; 32]) -> f64 {
    let t0 = Instant::now();
    let (mut n, mut acc) = (0u64, 0u8);
    while t0.elapsed() < Duration::from_secs_f64(secs) {
        for _ in 0..16 {
            acc ^= f(n)[0];
            n += 1;
        }
    }
    std::hint::black_box(acc);
    n as f64 / t0.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1.0);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        a.push(rate(secs, &mut |n| hmac(n)));
        b.push(rate(secs, &mut |_| noise()));
        println!(
            "round {}: hmac {:>9.0}/s  noise {:>7.0}/s",
            r + 1,
            a[r],
            b[r]
        );
    }
    let (m1, m2) = (median(a), median(b));
    println!(
        "median: hmac {m1:.0}/s ({:.1} us), noise {m2:.0}/s ({:.1} us), +{:.1} us per handshake (both ends)",
        1e6 / m1,
        1e6 / m2,
        1e6 / m2 - 1e6 / m1
    );
}
