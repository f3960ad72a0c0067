//! Helpers shared by the engine's integration tests (issue 37): small
//! generated trees, tree comparison, and the in-memory session pair.

#![allow(dead_code)]

pub mod accept;
pub mod pair;
pub mod tree;
