//! Validation of paths received from a peer.
//!
//! Every path in a metadata record is relative to the transfer root. A sink
//! refuses, without touching the file system, any path that is absolute,
//! empty, contains NUL, has an empty, `.` or `..` component, or is
//! unreasonably long. Whether a path would pass through a symlink can only
//! be decided against the file system; the engine does that with
//! `openat2(RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH)`.

use crate::ProtoError;

/// Longest path accepted from a peer (Linux PATH_MAX).
pub const MAX_PATH: usize = 4096;
/// Longest single component (Linux NAME_MAX).
pub const MAX_NAME: usize = 255;

/// Check a relative path from the wire. Returns it unchanged when valid.
pub fn validate_relative(p: &[u8]) -> Result<&[u8], ProtoError> {
    let show = || String::from_utf8_lossy(p).into_owned();
    if p.is_empty() {
        return Err(ProtoError::BadPath("empty path".into()));
    }
    if p.len() > MAX_PATH {
        return Err(ProtoError::BadPath(format!(
            "path longer than {MAX_PATH} bytes"
        )));
    }
    if p.contains(&0) {
        return Err(ProtoError::BadPath(format!("NUL byte in {:?}", show())));
    }
    if p[0] == b'/' {
        return Err(ProtoError::BadPath(format!("absolute path {:?}", show())));
    }
    for c in p.split(|&b| b == b'/') {
        match c {
            b"" => {
                return Err(ProtoError::BadPath(format!(
                    "empty component in {:?}",
                    show()
                )))
            }
            b"." | b".." => {
                return Err(ProtoError::BadPath(format!(
                    "'{}' component in {:?}",
                    String::from_utf8_lossy(c),
                    show()
                )))
            }
            _ if c.len() > MAX_NAME => {
                return Err(ProtoError::BadPath(format!(
                    "component too long in {:?}",
                    show()
                )))
            }
            _ => {}
        }
    }
    Ok(p)
}

/// Check a symlink target from the wire: any bytes but NUL, bounded. The
/// sink creates the link without ever following it.
pub fn validate_link_target(t: &[u8]) -> Result<&[u8], ProtoError> {
    if t.is_empty() || t.len() > MAX_PATH || t.contains(&0) {
        return Err(ProtoError::BadPath("invalid symlink target".into()));
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_normal_paths() {
        for p in ["a", "a/b/c", "dir with space/ü.txt", ".hidden/x", "a..b"] {
            assert!(validate_relative(p.as_bytes()).is_ok(), "{p}");
        }
    }

    #[test]
    fn rejects_hostile_paths() {
        for p in [
            &b""[..],
            b"/etc/passwd",
            b"../x",
            b"a/../../x",
            b"a/./b",
            b"a//b",
            b"a/",
            b"a\0b",
            b".",
            b"..",
        ] {
            assert!(validate_relative(p).is_err(), "{:?}", p);
        }
        assert!(validate_relative(&vec![b'a'; 5000]).is_err());
        assert!(validate_relative(&vec![b'a'; 300]).is_err());
    }
}
