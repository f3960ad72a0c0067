//! Control messages, carried in CONTROL frames and encoded with postcard
//! (varint integers, length-prefixed byte strings, enum variants by index;
//! docs/PROTOCOL.md lists every variant and field in wire order).
//!
//! Decoding is bounded: a CONTROL body is at most
//! [`crate::frame::MAX_CONTROL_BODY`] bytes, and every collection inside is
//! bounded by that body, so arbitrary input can never allocate without bound.

use serde::{Deserialize, Serialize};

use crate::frame::MAX_CONTROL_BODY;
use crate::ProtoError;

/// 256-bit nonce or MAC.
pub type Bytes32 = [u8; 32];

/// Which end of a session the *server* (daemon) plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    Source,
    Sink,
}

/// A client's request, sent once on the control link after authentication.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Open {
    /// Which end the server plays in this session.
    pub server_role: Role,
    /// Server is source: the paths to send (relative to its root).
    /// Server is sink: exactly one path, the destination.
    pub paths: Vec<Vec<u8>>,
    /// Copy directories recursively (cp -r).
    pub recursive: bool,
    /// What the client asks for; a server-side source proposes at most
    /// this (a server-side sink gets the source's own Propose).
    pub streams: u16,
    pub block_size: u32,
    pub checksum: bool,
}

/// Capacity proposal, source to sink (seed 000 Fig. 6-4a).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Propose {
    /// Number of top-level source entries (decides how DST is interpreted).
    pub roots: u32,
    /// Data streams the source has senders for.
    pub streams: u16,
    /// Proposed block size in bytes.
    pub block_size: u32,
    /// Task capacity the source can sustain, Mbit/s (0 = unknown).
    pub capacity_mbps: u64,
    /// Per-block checksums and whole-file digests on.
    pub checksum: bool,
}

/// Confirmation, sink to source: what the sink can serve. The source
/// releases whatever it reserved beyond this.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confirm {
    pub streams: u16,
    pub block_size: u32,
    /// Blocks the source may have in flight per stream (the credit window).
    pub credits_per_stream: u32,
    pub capacity_mbps: u64,
    pub checksum: bool,
}

/// What a metadata record describes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    Dir,
    File {
        size: u64,
    },
    Symlink {
        target: Vec<u8>,
    },
    /// A further name for the file with id `target_id` (same inode).
    HardLink {
        target_id: u64,
    },
}

/// One metadata record (seed 000 Fig. 6-4b). `path` is relative, '/'
/// separated, and its first component is the top-level source name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// File id: position in the source's depth-first walk.
    pub id: u64,
    pub path: Vec<u8>,
    pub kind: EntryKind,
    /// Permission bits (07777).
    pub mode: u32,
    pub mtime_s: i64,
    pub mtime_ns: u32,
}

/// A path that failed, with the reason, for the final report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub path: Vec<u8>,
    pub reason: String,
}

/// Final report, sink to source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Complete {
    pub files: u64,
    pub bytes: u64,
    pub failures: Vec<Failure>,
    /// CPU seconds the sink's process spent during the session.
    pub cpu_s: f64,
}

/// Every control message. Variant order is the wire tag; append only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Control {
    /// Client to server: start authentication.
    Hello {
        nonce: Bytes32,
        user: String,
    },
    /// Server to client: server nonce, the server's proof of the key, and
    /// the id the session will have once the client proves itself (so the
    /// client can open data links without waiting for AuthOk).
    Challenge {
        nonce: Bytes32,
        proof: Bytes32,
        session: u64,
    },
    /// Client to server: the client's proof of the key.
    Auth {
        proof: Bytes32,
    },
    /// Server to client: authenticated; data links join with this id.
    AuthOk {
        session: u64,
    },
    /// Client to server: the request.
    Open(Open),
    /// First message of a data link: join `session` as stream `stream`.
    Join {
        session: u64,
        stream: u16,
        nonce: Bytes32,
        mac: Bytes32,
    },
    /// Server to client on a data link: joined.
    JoinOk,
    Propose(Propose),
    Confirm(Confirm),
    /// A batch of metadata records.
    Entries(Vec<Entry>),
    /// All metadata sent.
    MetaEnd {
        entries: u64,
        files: u64,
        bytes: u64,
    },
    /// Sink to source: directories exist, file table ready; failures of
    /// entries the sink could not prepare.
    SyncDone {
        failures: Vec<Failure>,
    },
    /// Source to sink: whole-file digests of files fully read (id, digest).
    FilesDone(Vec<(u64, u64)>),
    /// Source to sink: a file could not be read; the sink discards it.
    FileFailed {
        id: u64,
        reason: String,
    },
    /// Source to sink: every block has been sent on every stream.
    EndOfData {
        files: u64,
        bytes: u64,
    },
    Complete(Complete),
    /// Either side: the session cannot go on.
    Abort {
        reason: String,
    },
    /// Server to client: request refused.
    Error {
        code: u16,
        message: String,
    },
    /// Client to server, instead of Open: ask for the daemon's state
    /// (`ramsys status`; docs/DAEMON.md).
    StatusQuery,
    /// Server to client: the state as a JSON document (schema versioned
    /// inside, so it can grow without a wire change).
    StatusReport {
        json: String,
    },
}

impl Control {
    /// Short name for logs and state-machine errors.
    pub fn name(&self) -> &'static str {
        match self {
            Control::Hello { .. } => "Hello",
            Control::Challenge { .. } => "Challenge",
            Control::Auth { .. } => "Auth",
            Control::AuthOk { .. } => "AuthOk",
            Control::Open(_) => "Open",
            Control::Join { .. } => "Join",
            Control::JoinOk => "JoinOk",
            Control::Propose(_) => "Propose",
            Control::Confirm(_) => "Confirm",
            Control::Entries(_) => "Entries",
            Control::MetaEnd { .. } => "MetaEnd",
            Control::SyncDone { .. } => "SyncDone",
            Control::FilesDone(_) => "FilesDone",
            Control::FileFailed { .. } => "FileFailed",
            Control::EndOfData { .. } => "EndOfData",
            Control::Complete(_) => "Complete",
            Control::Abort { .. } => "Abort",
            Control::Error { .. } => "Error",
            Control::StatusQuery => "StatusQuery",
            Control::StatusReport { .. } => "StatusReport",
        }
    }

    /// Encode into a CONTROL frame body.
    pub fn encode(&self) -> Result<Vec<u8>, ProtoError> {
        let v = postcard::to_stdvec(self)
            .map_err(|e| ProtoError::malformed("control message", e.to_string()))?;
        if v.len() > MAX_CONTROL_BODY as usize {
            return Err(ProtoError::FrameTooLarge {
                len: v.len() as u64,
                limit: MAX_CONTROL_BODY as u64,
            });
        }
        Ok(v)
    }

    /// Decode a CONTROL frame body. Trailing bytes are an error.
    pub fn decode(body: &[u8]) -> Result<Self, ProtoError> {
        if body.len() > MAX_CONTROL_BODY as usize {
            return Err(ProtoError::FrameTooLarge {
                len: body.len() as u64,
                limit: MAX_CONTROL_BODY as u64,
            });
        }
        let (msg, rest) = postcard::take_from_bytes::<Control>(body)
            .map_err(|e| ProtoError::malformed("control message", e.to_string()))?;
        if !rest.is_empty() {
            return Err(ProtoError::malformed(
                "control message",
                format!("{} trailing bytes", rest.len()),
            ));
        }
        Ok(msg)
    }
}

/// Encoded size of one entry, used to split metadata into bounded batches.
pub fn entry_wire_size(e: &Entry) -> usize {
    postcard::experimental::serialized_size(e).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_every_variant() {
        let msgs = vec![
            Control::Hello {
                nonce: [1; 32],
                user: "alice".into(),
            },
            Control::Challenge {
                nonce: [2; 32],
                proof: [3; 32],
                session: 9,
            },
            Control::Auth { proof: [4; 32] },
            Control::AuthOk { session: 77 },
            Control::Open(Open {
                server_role: Role::Sink,
                paths: vec![b"dst".to_vec()],
                recursive: true,
                streams: 4,
                block_size: 1 << 20,
                checksum: true,
            }),
            Control::Join {
                session: 77,
                stream: 3,
                nonce: [5; 32],
                mac: [6; 32],
            },
            Control::JoinOk,
            Control::Propose(Propose {
                roots: 1,
                streams: 4,
                block_size: 1 << 22,
                capacity_mbps: 0,
                checksum: true,
            }),
            Control::Confirm(Confirm {
                streams: 4,
                block_size: 1 << 22,
                credits_per_stream: 8,
                capacity_mbps: 10_000,
                checksum: true,
            }),
            Control::Entries(vec![Entry {
                id: 9,
                path: "a/ü b".as_bytes().to_vec(),
                kind: EntryKind::Symlink {
                    target: b"../x".to_vec(),
                },
                mode: 0o755,
                mtime_s: -5,
                mtime_ns: 999,
            }]),
            Control::MetaEnd {
                entries: 1,
                files: 2,
                bytes: 3,
            },
            Control::SyncDone { failures: vec![] },
            Control::FilesDone(vec![(1, 2), (3, 4)]),
            Control::FileFailed {
                id: 1,
                reason: "EIO".into(),
            },
            Control::EndOfData { files: 1, bytes: 2 },
            Control::Complete(Complete {
                files: 1,
                bytes: 2,
                failures: vec![Failure {
                    path: b"x".to_vec(),
                    reason: "disk full".into(),
                }],
                cpu_s: 0.5,
            }),
            Control::Abort {
                reason: "disk full".into(),
            },
            Control::Error {
                code: 2,
                message: "no".into(),
            },
            Control::StatusQuery,
            Control::StatusReport {
                json: "{\"version\":1}".into(),
            },
        ];
        for m in msgs {
            let b = m.encode().unwrap();
            assert_eq!(Control::decode(&b).unwrap(), m);
        }
    }

    #[test]
    fn trailing_bytes_rejected() {
        let mut b = Control::JoinOk.encode().unwrap();
        b.push(0);
        assert!(Control::decode(&b).is_err());
    }
}
