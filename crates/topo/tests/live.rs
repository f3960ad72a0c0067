//! Runs discovery, pinning, node-bound allocation and move_pages
//! verification for real on this machine.

use ramsys_topo::placement::{
    current_affinity, current_cpu, pin_current_thread, Binding, MemPolicy, NodeRegion, OsPlacer,
};
use ramsys_topo::plan::{alloc_buffers, pin_for};
use ramsys_topo::*;
use std::path::Path;

mod common;

#[test]
fn discover_live_system() {
    let t = common::live();
    assert!(!t.nodes.is_empty());
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    assert_eq!(t.all_cpus(), parse_cpulist(&online).unwrap());
    assert!(t.nodes.iter().map(|n| n.memory_bytes).sum::<u64>() > 0);
    assert!(t.nic("lo").is_some_and(|lo| lo.is_virtual));
    assert_eq!(
        t.nic_for_addr("127.0.0.1".parse().unwrap())
            .map(|n| n.name.as_str()),
        Some("lo")
    );
    // The crate's own source lives on some device (or a pseudo one).
    let here = t.device_for_local_path(Path::new(env!("CARGO_MANIFEST_DIR")));
    assert!(here.is_some());
    // A destination that does not exist yet still resolves.
    let nope = Path::new(env!("CARGO_MANIFEST_DIR")).join("no/such/file");
    assert_eq!(
        t.device_for_local_path(&nope).map(|d| &d.name),
        here.map(|d| &d.name)
    );
    let text = render_text(&t);
    assert!(text.contains("NUMA nodes"));
}

#[test]
fn pin_alloc_verify_on_node0() {
    let t = common::live();
    let cpus = common::cpus_of(&t, 0);
    std::thread::spawn(move || {
        // Pin to node 0's CPUs, as a reader or sender thread would.
        pin_current_thread(&cpus).unwrap();
        assert_eq!(current_affinity(), cpus);
        assert!(cpus.contains(&current_cpu().unwrap()));

        for policy in [MemPolicy::Bind, MemPolicy::Preferred] {
            let bytes = 8 << 20;
            let mut r = NodeRegion::alloc_with(bytes, Some(0), policy).unwrap();
            r.as_mut_slice()[bytes - 1] = 1;
            let placed = r.verify_nodes();
            match r.binding() {
                Binding::Bound { node, .. } => {
                    assert_eq!(*node, 0);
                    // Every page pre-faulted, all of them on node 0.
                    let pages = bytes.div_ceil(ramsys_topo::placement::page_size());
                    assert_eq!(placed.unwrap(), vec![(0, pages)]);
                }
                // A kernel or sandbox without mbind: the fallback says why.
                Binding::Unbound(why) => {
                    assert!(why.contains("mbind"), "{why}");
                    eprintln!("mbind unavailable here: {why}");
                }
            }
        }
        // Unbound allocation still verifies (first touch on this node).
        let r = NodeRegion::alloc(1 << 20, None).unwrap();
        if let Ok(v) = r.verify_nodes() {
            assert_eq!(
                v.iter().map(|&(_, p)| p).sum::<usize>(),
                (1 << 20) / ramsys_topo::placement::page_size()
            );
        }
    })
    .join()
    .unwrap();
}

#[test]
fn plan_applied_for_real() {
    let t = common::live();
    let root = t.device_for_local_path(Path::new("/")).cloned();
    let nic = t.nics.iter().find(|n| !n.is_virtual).cloned();
    // On this host, node 0 everywhere (forced), applied with the OS placer.
    let plan = plan_transfer(
        &t,
        Role::Source,
        root.as_ref(),
        nic.as_ref(),
        NumaMode::Node(0),
    )
    .unwrap();
    std::thread::spawn(move || {
        pin_for(&OsPlacer, &plan.storage_threads).unwrap();
        assert_eq!(current_affinity(), plan.storage_threads.cpus);
        let buf = alloc_buffers(&OsPlacer, &plan, 1 << 20).unwrap();
        assert_eq!(buf.len(), 1 << 20);
        if matches!(buf.binding(), Binding::Bound { .. }) {
            let pages = (1 << 20) / ramsys_topo::placement::page_size();
            assert_eq!(buf.verify_nodes().unwrap(), vec![(0, pages)]);
        }
    })
    .join()
    .unwrap();
}
