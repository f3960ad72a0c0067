//! What a detector reports: one change to the watched tree, with paths
//! relative to its root (`b""` is the root itself, components separated
//! by `/`, never `.` or `..`).

/// A change to the watched tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A file was closed after being written (CLOSE_WRITE): its content is
    /// complete and may be sent.
    Closed(Vec<u8>),
    /// A file was written to and may still be open: sent once closed, or
    /// once quiet for the configured time.
    Modified(Vec<u8>),
    /// A new entry. `settled`: nothing will write it further (a directory,
    /// a symlink, a file moved in from outside the tree); a file created
    /// empty waits for its close.
    Created {
        path: Vec<u8>,
        dir: bool,
        settled: bool,
    },
    /// Mode, owner, times or extended attributes changed.
    Attrib { path: Vec<u8>, dir: bool },
    /// Removed, or moved out of the tree.
    Deleted { path: Vec<u8>, dir: bool },
    /// Renamed within the tree.
    Renamed {
        from: Vec<u8>,
        to: Vec<u8>,
        dir: bool,
    },
    /// A subtree must be scanned (inotify could not watch it).
    Rescan(Vec<u8>),
    /// The kernel dropped events: only a full scan is sure to be right.
    Overflow,
}

/// `a/b` from `a` and `b` (`b` alone when `a` is the root).
pub fn join(a: &[u8], b: &[u8]) -> Vec<u8> {
    if a.is_empty() {
        return b.to_vec();
    }
    let mut v = Vec::with_capacity(a.len() + 1 + b.len());
    v.extend_from_slice(a);
    v.push(b'/');
    v.extend_from_slice(b);
    v
}

/// Is `path` equal to `dir` or below it?
pub fn under(path: &[u8], dir: &[u8]) -> bool {
    dir.is_empty()
        || path == dir
        || (path.len() > dir.len() && path.starts_with(dir) && path[dir.len()] == b'/')
}

/// `path` (at or below `from`) moved to below `to`.
pub fn moved(path: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let rest = &path[from.len()..];
    if from.is_empty() && !rest.is_empty() {
        return join(to, rest);
    }
    [to, rest].concat()
}

/// The parent of `path` (`b""` for a top-level name).
pub fn parent(path: &[u8]) -> &[u8] {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => &path[..i],
        None => b"",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_helpers() {
        assert_eq!(join(b"", b"x"), b"x");
        assert_eq!(join(b"a", b"x"), b"a/x");
        assert!(under(b"a/b", b"a"));
        assert!(under(b"a", b"a"));
        assert!(!under(b"ab", b"a"));
        assert!(under(b"anything", b""));
        assert_eq!(moved(b"a/b/c", b"a/b", b"z"), b"z/c");
        assert_eq!(moved(b"a/b", b"a/b", b"z"), b"z");
        assert_eq!(parent(b"a/b/c"), b"a/b");
        assert_eq!(parent(b"a"), b"");
    }
}
