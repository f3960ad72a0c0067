//! get/put latency per coherence model between two DDSS nodes on loopback
//! (docs/SITE.md "Numbers"; seed 003 sec. 2.3.1 measures the same on
//! InfiniBand: 20-55 us). Links are plain TCP here (the daemons add a
//! one-time authentication at connect, nothing per operation).
//!
//! cargo run --release -p ramsys-ddss --example latency [ITERS]

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use ramsys_ddss::net::Stream;
use ramsys_ddss::{Dialer, Model, Node, Placement};

fn node(l: &TcpListener, holder: u64) -> Arc<Node> {
    let dial: Dialer = Box::new(|a: &str| -> std::io::Result<Box<dyn Stream>> {
        let s = TcpStream::connect(a)?;
        s.set_nodelay(true)?;
        Ok(Box::new(s))
    });
    let n = Arc::new(Node::new(
        &l.local_addr().unwrap().to_string(),
        holder,
        1 << 22,
        dial,
    ));
    let (l, n2) = (l.try_clone().unwrap(), n.clone());
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            c.set_nodelay(true).unwrap();
            let n = n2.clone();
            std::thread::spawn(move || {
                let mut c = c;
                let _ = n.serve_peer(&mut c);
            });
        }
    });
    n
}

fn stats(mut v: Vec<f64>) -> String {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    // One requester, one operation outstanding: throughput is 1/mean.
    format!(
        "mean {:6.1} p50 {:6.1} p99 {:6.1} ({:7.0} ops/s)",
        mean,
        v[v.len() / 2],
        v[v.len() * 99 / 100],
        1e6 / mean.max(1e-3)
    )
}

fn main() {
    let iters: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let la = TcpListener::bind("127.0.0.1:0").unwrap();
    let lb = TcpListener::bind("127.0.0.1:0").unwrap();
    let (a, b) = (node(&la, 1), node(&lb, 2));
    a.add_member(b.me());
    println!("{iters} ops each, requester A -> home B on loopback; times in us");
    for size in [1usize, 4096] {
        let data = vec![7u8; size];
        for (i, model) in [
            Model::Null,
            Model::Read,
            Model::Write,
            Model::Strict,
            Model::Version,
            Model::Delta(4),
            Model::Temporal(50),
        ]
        .into_iter()
        .enumerate()
        {
            let k = a
                .allocate(
                    &format!("s{size}-{i}"),
                    4096,
                    model,
                    Placement::On(b.me().into()),
                )
                .unwrap();
            a.put(&k, &data, 0).unwrap();
            let time = |f: &dyn Fn()| {
                (0..iters)
                    .map(|_| {
                        let t = Instant::now();
                        f();
                        t.elapsed().as_secs_f64() * 1e6
                    })
                    .collect::<Vec<f64>>()
            };
            let put = time(&|| {
                a.put(&k, &data, 0).unwrap();
            });
            // Unchanged data: what a monitoring pull costs.
            let get = time(&|| {
                a.get(&k).unwrap();
            });
            // Changed before every get (the put is not timed).
            let changed: Vec<f64> = (0..iters)
                .map(|_| {
                    b.put(&k, &data, 0).unwrap();
                    let t = Instant::now();
                    a.get(&k).unwrap();
                    t.elapsed().as_secs_f64() * 1e6
                })
                .collect();
            println!(
                "{size:>5} B {:<12} put {}  get(unchanged) {}  get(changed) {}",
                model.to_string(),
                stats(put),
                stats(get),
                stats(changed)
            );
        }
    }
}
