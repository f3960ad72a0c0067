//! rsync 3.5's symlink hardening for a destination written as root (issue
//! 34): a root cron job copying into a directory a user controls must not
//! follow a symlink that user put in the way (`/home/u/out -> /etc`). A
//! destination, or any directory on the way to it, reached through a
//! symlink owned by someone other than root or the owner of what it points
//! to is refused in one line (the rule of the kernel's
//! fs.protected_symlinks, applied to the whole path). Only as root: an
//! ordinary user can only write where it may anyway.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// Links followed before giving up (the kernel's MAXSYMLINKS).
const MAX_LINKS: usize = 40;

/// Check `dst` (as given, relative to the current directory or absolute)
/// when running as root; see the module doc.
pub fn check_destination(dst: &Path) -> anyhow::Result<()> {
    // SAFETY: no failure mode.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    check_links(dst)
}

/// The walk itself, whoever runs it: every symlink met resolving `path`
/// component by component (links inside link targets included) must be
/// owned by root or by the owner of its target.
pub fn check_links(path: &Path) -> anyhow::Result<()> {
    let abs = std::path::absolute(path)?;
    let mut todo: VecDeque<OsString> = parts(&abs);
    let mut at = PathBuf::from("/");
    let mut links = 0;
    while let Some(c) = todo.pop_front() {
        if c == ".." {
            at.pop();
            continue;
        }
        let next = at.join(&c);
        let md = match std::fs::symlink_metadata(&next) {
            Ok(md) => md,
            // What does not exist yet is made by the copy, as root, never
            // through a link; other errors are for the copy to report.
            Err(_) => return Ok(()),
        };
        if !md.file_type().is_symlink() {
            at = next;
            continue;
        }
        links += 1;
        if links > MAX_LINKS {
            return Ok(());
        }
        let target_owner = std::fs::metadata(&next).ok().map(|m| m.uid());
        if md.uid() != 0 && Some(md.uid()) != target_owner {
            let whose = target_owner.map_or("is dangling".to_string(), |u| {
                format!("points to something of uid {u}")
            });
            anyhow::bail!(
                "destination {}: {} is a symlink owned by uid {} that {whose}; \
                 refusing to follow it as root (it could send the copy anywhere)",
                path.display(),
                next.display(),
                md.uid()
            );
        }
        let target = std::fs::read_link(&next)?;
        if target.is_absolute() {
            at = PathBuf::from("/");
        }
        for p in parts(&target).into_iter().rev() {
            todo.push_front(p);
        }
    }
    Ok(())
}

/// The normal components of `p` (`..` kept, `.` and the root dropped).
fn parts(p: &Path) -> VecDeque<OsString> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{lchown, symlink};

    fn is_root() -> bool {
        // SAFETY: no failure mode.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn links_owned_by_a_stranger_are_refused_others_followed() {
        if !is_root() {
            eprintln!("skipped: needs root to chown symlinks");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        std::fs::create_dir_all(d.join("rootdir/sub")).unwrap();
        std::fs::create_dir(d.join("theirs")).unwrap();
        std::os::unix::fs::chown(d.join("theirs"), Some(65534), Some(65534)).unwrap();
        // A stranger's link to root's directory: refused, as DST and on
        // the way to it, and when reached through a root-owned link.
        symlink(d.join("rootdir"), d.join("evil")).unwrap();
        lchown(d.join("evil"), Some(65534), Some(65534)).unwrap();
        symlink("evil/sub", d.join("hop")).unwrap();
        for p in ["evil", "evil/sub", "evil/sub/new/deeper", "hop", "hop/x"] {
            let e = check_links(&d.join(p)).unwrap_err().to_string();
            assert!(e.contains("uid 65534") && e.contains("evil"), "{p}: {e}");
        }
        // Root's own link, and a user's link to its own directory: fine.
        symlink(d.join("rootdir"), d.join("mine")).unwrap();
        symlink(d.join("theirs"), d.join("own")).unwrap();
        lchown(d.join("own"), Some(65534), Some(65534)).unwrap();
        for p in ["mine/sub", "own", "own/new", "rootdir/sub", "missing/x"] {
            check_links(&d.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
        }
        // A stranger's dangling link.
        symlink(d.join("nowhere"), d.join("dangling")).unwrap();
        lchown(d.join("dangling"), Some(65534), Some(65534)).unwrap();
        let e = check_links(&d.join("dangling")).unwrap_err().to_string();
        assert!(e.contains("dangling"), "{e}");
    }
}
