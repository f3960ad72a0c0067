//! Request management (RM) layer (seed 000, sec. 6.1.3): a request is
//! turned into the metadata of every entry (the depth-first [`walk`]) and
//! into per-storage-device queues of read units ([`tasks`]), so each device
//! is served by its own readers (Fig. 6-3).

pub mod filter;
pub mod null;
pub mod pieces;
pub mod reserved;
pub mod rules;
pub mod shares;
pub mod sync;
pub mod tasks;
pub mod walk;
pub mod wildmatch;
