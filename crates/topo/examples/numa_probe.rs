//! Measures what the placement primitives cost and deliver on this host:
//! `cargo run -p ramsys-topo --example numa_probe -- [MiB] [NODE]`.
//! Allocates a bound and an unbound region, verifies page placement with
//! move_pages, and times memcpy between them from a thread pinned to the
//! node's CPUs. On a multi-node host, run it once per NODE and compare.
use ramsys_topo::placement::{pin_current_thread, NodeRegion};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().map_or(Ok(256), |s| s.parse())?;
    let node: u32 = args.next().map_or(Ok(0), |s| s.parse())?;
    let topo = ramsys_topo::discover(std::path::Path::new("/"))?;
    let cpus = topo
        .node(node)
        .ok_or_else(|| anyhow::anyhow!("no node {node}"))?
        .cpus
        .clone();
    pin_current_thread(&cpus)?;
    let bytes = mib << 20;
    for bind in [Some(node), None] {
        let t = Instant::now();
        let src = NodeRegion::alloc(bytes, bind)?;
        let alloc = t.elapsed();
        let mut dst = NodeRegion::alloc(bytes, bind)?;
        let t = Instant::now();
        let placed = src.verify_nodes()?;
        let verify = t.elapsed();
        let t = Instant::now();
        let rounds = 4;
        for _ in 0..rounds {
            dst.as_mut_slice().copy_from_slice(src.as_slice());
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "node={bind:?} binding={:?} alloc+prefault {mib} MiB: {:.1} ms ({:.2} GB/s)  \
             move_pages verify: {:.2} ms {placed:?}  memcpy: {:.2} GB/s",
            src.binding(),
            alloc.as_secs_f64() * 1e3,
            bytes as f64 / alloc.as_secs_f64() / 1e9,
            verify.as_secs_f64() * 1e3,
            (rounds * bytes) as f64 / secs / 1e9,
        );
    }
    Ok(())
}
