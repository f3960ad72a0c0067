//! Times the online heuristic (`ramsys_sched::plan`) on an 8-node host shaped
//! like the seed 001 AMD testbed (8 nodes x 4 cores, SSD and NIC on node 7),
//! for one transfer and for two concurrent ones, and prints the median.
//! Run: `cargo bench -p ramsys-sched --bench heuristic`.

use ramsys_sched::{plan, Device, DeviceKind, Host, Instance, Node, Params, Request};
use std::hint::black_box;
use std::time::Instant;

fn amd_host(requests: Vec<Request>) -> Instance {
    // SLIT of a 4-package Magny-Cours box: 10 local, 16 same package, 22 else.
    let distances = (0..8u32)
        .map(|a| {
            (0..8u32)
                .map(|b| match (a, b) {
                    _ if a == b => 10,
                    _ if a / 2 == b / 2 => 16,
                    _ => 22,
                })
                .collect()
        })
        .collect();
    Instance {
        host: Host {
            nodes: (0..8u32)
                .map(|i| Node {
                    id: i,
                    cpus: (i as usize * 4..i as usize * 4 + 4).collect(),
                    busy_cpus: Vec::new(),
                })
                .collect(),
            devices: vec![
                Device {
                    name: "nytro0".into(),
                    kind: DeviceKind::Storage,
                    node: Some(7),
                    capacity_gbps: 34.7,
                },
                Device {
                    name: "nytro1".into(),
                    kind: DeviceKind::Storage,
                    node: Some(7),
                    capacity_gbps: 34.7,
                },
                Device {
                    name: "eth7".into(),
                    kind: DeviceKind::Nic,
                    node: Some(7),
                    capacity_gbps: 40.0,
                },
            ],
            distances: Some(distances),
        },
        model: None,
        requests,
        params: Params::default(),
    }
}

fn median_us(inst: &Instance, iters: usize) -> f64 {
    let mut samples = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        black_box(plan(black_box(inst)));
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    samples.sort_by(f64::total_cmp);
    samples[iters / 2]
}

fn main() {
    let req = |s: &str, d: &str| Request {
        source: s.into(),
        sink: d.into(),
        bytes: None,
    };
    let one = amd_host(vec![req("nytro0", "eth7")]);
    let two = amd_host(vec![req("nytro0", "eth7"), req("nytro1", "eth7")]);
    // Warm up, then measure.
    median_us(&one, 100);
    let m1 = median_us(&one, 5000);
    let m2 = median_us(&two, 2000);
    println!("heuristic plan, 8 nodes, 1 request:  median {m1:.1} us over 5000 runs");
    println!("heuristic plan, 8 nodes, 2 requests: median {m2:.1} us over 2000 runs (LP-evaluated, shared NIC)");
}
