//! Helpers shared by topo's integration tests (issue 37: one copy, not
//! one per test file): the captured fixture trees and the live machine.

#![allow(dead_code)]

use ramsys_topo::{discover, BlockDevice, Topology};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// A captured sysfs/procfs tree under tests/fixtures (see make-fixtures.py).
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The model discovered from a captured machine.
pub fn load(name: &str) -> Topology {
    discover(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e:#}"))
}

/// The model of the machine the tests run on.
pub fn live() -> Topology {
    discover(Path::new("/")).unwrap_or_else(|e| panic!("this machine: {e:#}"))
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub fn dev<'a>(t: &'a Topology, name: &str) -> &'a BlockDevice {
    t.device(name).unwrap_or_else(|| panic!("no device {name}"))
}

pub fn cpus_of(t: &Topology, node: u32) -> Vec<usize> {
    t.node(node)
        .unwrap_or_else(|| panic!("no node {node}"))
        .cpus
        .clone()
}
