//! Helpers shared by the engine's integration tests (issue 37): small
//! generated trees, tree comparison, the in-memory session pair, scratch
//! directories and the one seeded RNG.

#![allow(dead_code)]

pub mod accept;
pub mod files;
pub mod pair;
pub mod rng;
pub mod tree;
