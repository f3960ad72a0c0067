//! Sessions in memory (issue 37): a source and a sink session run
//! against each other in one process over `transport::mem` links, each
//! protocol path a fast test with its faults placed exactly (by frame or
//! byte on a named link). The harness is tests/common/pair.rs; how to add
//! a test: docs/ARCHITECTURE.md, "Sessions in memory".

#[path = "../common/mod.rs"]
mod common;

mod archive;
mod budget;
mod credits;
mod daemon;
mod deadlock;
mod dirs_done;
mod faults;
mod kept;
mod metadata;
mod negotiation;
mod relink;
mod sync;
