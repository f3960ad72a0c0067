//! Re-reading the blocks a lost data link carried beyond what the sink
//! accepted, for whichever sender is free (issue 9; docs/PROTOCOL.md "Lost
//! links").

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Sender;
use ramsys_proto::data::Segment;
use ramsys_resources::{Buf, BufferPool};

use crate::data::reread::Rereader;
use crate::storage::fsops::Root;

/// What the source needs to re-read lost blocks.
pub struct Requeue {
    pub root: Arc<Root>,
    pub files: crate::types::file::LiveFiles,
    pub pool: Arc<BufferPool>,
    pub checksum: bool,
    pub null: bool,
    pub abort: Arc<AtomicBool>,
}

impl Requeue {
    /// Re-read `blocks` (segment tables of blocks a broken link lost) on a
    /// thread of their own and queue them for the senders, same segment
    /// boundaries (so hashes and digests are unchanged). A segment that
    /// cannot be read again fails its file through `failed`.
    pub fn spawn(
        self: &Arc<Self>,
        blocks: Vec<Vec<Segment>>,
        filled: Sender<Buf>,
        failed: Sender<crate::data::reader::ReaderEvent>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("requeue".into())
            .spawn(move || {
                let files = me.files.snapshot();
                let rr = Rereader::new(&me.root, &files, me.checksum, me.null);
                for segs in blocks {
                    if me.abort.load(Ordering::Relaxed) {
                        return;
                    }
                    // Wait for a buffer, but not past an abort.
                    let mut buf = loop {
                        if me.abort.load(Ordering::Relaxed) {
                            return;
                        }
                        if let Some(b) = me.pool.get_timeout(Duration::from_millis(200)) {
                            break b;
                        }
                    };
                    match rr.fill(&mut buf, &segs) {
                        Ok(()) => {
                            if filled.send(buf).is_err() {
                                return;
                            }
                        }
                        Err((id, reason)) => {
                            me.pool.put(buf);
                            let _ = failed.send(crate::data::reader::ReaderEvent::FileFailed {
                                id,
                                path: rr.path(id),
                                reason,
                            });
                        }
                    }
                }
            })
    }
}
