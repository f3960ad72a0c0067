//! Encoding and bounded decoding of a CONTROL body, and each message's short
//! name for logs.

use super::{Control, Entry};
use crate::frame::MAX_CONTROL_BODY;
use crate::ProtoError;

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
            Control::SyncOpen { .. } => "SyncOpen",
            Control::SyncMode { .. } => "SyncMode",
            Control::Have(_) => "Have",
            Control::Reuse(_) => "Reuse",
            Control::Deleted(_) => "Deleted",
            Control::Resend(_) => "Resend",
            Control::Settled => "Settled",
            Control::TokenRequest { .. } => "TokenRequest",
            Control::Token { .. } => "Token",
            Control::SealControl { .. } => "SealControl",
            Control::Rejoin { .. } => "Rejoin",
            Control::Lost { .. } => "Lost",
            Control::LinkDown { .. } => "LinkDown",
            Control::SelectOpen { .. } => "SelectOpen",
            Control::SiteHello { .. } => "SiteHello",
            Control::ArchiveOpen { .. } => "ArchiveOpen",
            Control::Preserve { .. } => "Preserve",
            Control::Attrs(_) => "Attrs",
            Control::BwLimit { .. } => "BwLimit",
            Control::Redirect { .. } => "Redirect",
            Control::Redirected { .. } => "Redirected",
            Control::RawQuery => "RawQuery",
            Control::RawOffer { .. } => "RawOffer",
            Control::AddStream { .. } => "AddStream",
            Control::StreamAdded { .. } => "StreamAdded",
            Control::RelayOpen(_) => "RelayOpen",
            Control::OnBehalf { .. } => "OnBehalf",
            Control::RelayProgress { .. } => "RelayProgress",
            Control::RelayDone(_) => "RelayDone",
            Control::GrowStreams => "GrowStreams",
            Control::Grown { .. } => "Grown",
            Control::RetiredChallengeTcp => "RetiredChallengeTcp",
            Control::GrownLinks { .. } => "GrownLinks",
            Control::ScanFailed { .. } => "ScanFailed",
            Control::WatchOpen { .. } => "WatchOpen",
            Control::WatchReady { .. } => "WatchReady",
            Control::WatchOps { .. } => "WatchOps",
            Control::WatchDone { .. } => "WatchDone",
            Control::SelectFiles { .. } => "SelectFiles",
            Control::WatchBatch { .. } => "WatchBatch",
            Control::Ready { .. } => "Ready",
            Control::SettledThrough { .. } => "SettledThrough",
            Control::Window { .. } => "Window",
            Control::Placed { .. } => "Placed",
            Control::RelayPlaced(_) => "RelayPlaced",
            Control::DirsDone { .. } => "DirsDone",
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
