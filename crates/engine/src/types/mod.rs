//! Plain types every layer shares (issue 37): nothing here imports a layer
//! above it, so any layer may use them.

pub mod error;
pub mod file;
pub mod phase;
pub mod sendpath;
pub mod stats;
