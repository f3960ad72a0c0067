//! What an Open asks for, read for this daemon: its paths beneath the
//! export root, the session's options from its flags and selection, the
//! tops a source walks. Shared by sessions run here (super::request) and
//! relayed ones (super::relay), so neither imports the other for it.

use ramsys_proto::control::Role;
use ramsys_proto::path::validate_relative;

use crate::daemon::credentials::Grant;
use crate::daemon::users::ExportRoot;
use crate::request::walk::Top;
use crate::session::options::TransferOptions;
use crate::types::error::show;

use super::DaemonShared;

/// The request's paths, each relative to the export root ("" = the root
/// itself), and whether each names its contents: a source path ending in
/// '/' does (rsync's rule; the walk gives it an empty name, which the
/// sink maps to DST itself).
pub(super) fn request_paths(
    open: &ramsys_proto::control::Open,
) -> Result<(Vec<Vec<u8>>, Vec<bool>), ramsys_proto::ProtoError> {
    let mut rels = Vec::new();
    let mut contents = Vec::new();
    for p in &open.paths {
        let c = open.server_role == Role::Source && p.ends_with(b"/");
        contents.push(c);
        let p = if c { &p[..p.len() - 1] } else { &p[..] };
        if !p.is_empty() {
            validate_relative(p)?;
        }
        // Our own working files are neither read nor written through a
        // session (issue 34, crate::request::reserved).
        if crate::request::reserved::names_reserved(p) {
            return Err(ramsys_proto::ProtoError::BadPath(format!(
                "{}: {}",
                show(p),
                crate::request::reserved::REFUSED
            )));
        }
        rels.push(p.to_vec());
    }
    Ok((rels, contents))
}

/// An archive copy's bits (ArchiveOpen, for a source) and what a sink may
/// apply: a user of a multi-user daemon never creates files owned by
/// another user, device nodes, or privileged xattrs (crate::storage::archive,
/// docs/SECURITY.md).
pub(super) fn archive_options(
    mut opts: TransferOptions,
    preserve: u32,
    grant: &Grant,
) -> TransferOptions {
    opts.preserve = preserve;
    if grant.account.is_some() {
        opts.archive_policy = crate::storage::archive::Policy::confined();
    }
    opts
}

/// The client's wishes, within what this daemon serves. Err: the reason
/// to refuse, in one line, before any scan.
pub(super) fn session_options(
    sh: &DaemonShared,
    open: &ramsys_proto::control::Open,
    sync: u32,
    select: ramsys_proto::control::Selection,
) -> Result<TransferOptions, String> {
    let mut opts = sh.opts.clone();
    opts.recursive = open.recursive;
    opts.streams = open.streams.clamp(1, sh.res.config.max_streams as u16);
    opts.block_size = open
        .block_size
        .clamp(4096, sh.res.buffers.buf_size() as u32);
    opts.checksum = open.checksum;
    opts.sync = sync;
    if !select.is_empty() {
        // A source applies the selection to its scan, a sink to --delete.
        if let Err(e) = crate::request::filter::Filter::new(&select) {
            return Err(format!("filter rules: {e}"));
        }
        opts.select = select;
    }
    Ok(opts)
}

/// The source's top-level paths and the names their trees get on the
/// wire. Err: a path resolves outside the export root.
pub(super) fn source_tops(
    ex: &ExportRoot,
    rels: Vec<Vec<u8>>,
    contents: Vec<bool>,
) -> Result<Vec<Top>, String> {
    let mut tops = Vec::new();
    for (r, c) in rels.into_iter().zip(contents) {
        let name = match r.iter().rposition(|&b| b == b'/') {
            _ if c => Vec::new(),
            Some(i) => r[i + 1..].to_vec(),
            None if r.is_empty() => ex
                .path
                .file_name()
                .map(|n| n.as_encoded_bytes().to_vec())
                .unwrap_or_else(|| b"root".to_vec()),
            None => r.clone(),
        };
        let rel = resolve_top(ex, &r, c)?;
        tops.push(Top { rel, name });
    }
    Ok(tops)
}

/// Where a source path is inside the export (issue 35): symlinks on the
/// way are followed when they stay inside the root, as rsync's daemon
/// does (`mod/in-link/` with `in-link -> inner` sends inner's contents),
/// the whole resolution confined by openat2 RESOLVE_BENEATH (the source
/// root's Beneath rule: `..` above the root, an absolute link and a
/// magic link all fail). The last component is followed only for a
/// contents path (`DIR/`); otherwise a symlink is sent as what it is. The
/// resolved path has no symlink left, and is what the scan reads. Err:
/// one line naming the path that leads outside.
fn resolve_top(ex: &ExportRoot, rel: &[u8], contents: bool) -> Result<Vec<u8>, String> {
    let (dir, last) = match (contents, rel.iter().rposition(|&b| b == b'/')) {
        (true, _) => (rel, &b""[..]),
        (false, Some(i)) => (&rel[..i], &rel[i + 1..]),
        (false, None) => return Ok(rel.to_vec()),
    };
    if dir.is_empty() {
        return Ok(rel.to_vec());
    }
    let mut out = match ex.source.resolve_beneath(dir) {
        Ok(p) => p,
        // Missing: the scan reports it, as for any missing source.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(rel.to_vec()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EXDEV | libc::ELOOP)) => {
            return Err(format!(
                "{} resolves outside the daemon root (a symlink on the way leads out of it)",
                show(rel)
            ))
        }
        Err(e) => return Err(format!("{}: {e}", show(rel))),
    };
    if !last.is_empty() {
        if !out.is_empty() {
            out.push(b'/');
        }
        out.extend_from_slice(last);
    }
    Ok(out)
}
