//! Bits of SyncOpen/SyncMode `flags` (docs/SYNC.md). Its own module so
//! callers name them `control::sync::DELETE`.

/// Skip files the sink holds with the same size and mtime; delta the rest.
pub const SYNC: u32 = 1;
/// Compare whole-file content digests instead of size and mtime.
pub const CHECKSUM: u32 = 2;
/// Remove sink entries the source no longer has.
pub const DELETE: u32 = 4;
/// Change nothing; report what would be sent and removed.
pub const DRY_RUN: u32 = 8;
/// Keep interrupted temp files and a journal; reuse them next time.
pub const RESUME: u32 = 16;
/// Keep the temp files of interrupted large files and journal their
/// verified blocks, so a later `--resume` can reuse them (on by
/// default; issue 15). Without RESUME nothing at the sink is reused.
pub const JOURNAL: u32 = 32;
/// A block device DST may be written, in place (`--write-devices`;
/// docs/STORAGE.md "Volumes"). Without it the sink refuses a device.
pub const WRITE_DEVICES: u32 = 64;
/// Leave every entry DST already has as it is (rsync's
/// `--ignore-existing`, cp's `--no-clobber`); send only missing files.
pub const IGNORE_EXISTING: u32 = 128;
/// Leave files that are newer at the sink (rsync's and cp's
/// `--update`): a regular file whose mtime is later than the source's.
pub const UPDATE: u32 = 256;
/// DST was written with a trailing `/` (issue 35): it names a
/// directory. A sync makes it when it is missing, even for one file
/// (rsync's rule); a copy of one file refuses (cp's). Read by the sink
/// from SyncOpen or its own options; a source leaves it out of
/// SyncMode (a sink of before this bit rejects unknown SyncMode bits).
pub const DEST_DIR: u32 = 512;
pub const ALL: u32 = 1023;
/// The bits a windowed session may carry (issue 36, docs/PROTOCOL.md
/// "Windows"): a copy's journal, and a sync whose answer the sink gives per
/// window (Have before each Ready), with or without DELETE (the sink keeps
/// a keyed hash per path the source sent and deletes at the end, as in the
/// whole-tree phases), DRY_RUN (each end lists the files it would send
/// per window, frame::DRY_WINDOWS_FLAG) or RESUME (the sink looks each
/// file up in its journal as its record comes, frame::RESUME_WINDOWS_FLAG).
/// WRITE_DEVICES needs the whole tree at the sink (one device): those
/// sessions keep the whole-tree phases.
pub const WINDOWED: u32 =
    SYNC | CHECKSUM | DELETE | DRY_RUN | RESUME | JOURNAL | IGNORE_EXISTING | UPDATE | DEST_DIR;
