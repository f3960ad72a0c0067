//! How the sink reads DST (issue 15), so the same command means the same
//! place on every run.
//!
//! - Copy (`cp`, cp/scp's rule): an existing directory receives the
//!   sources inside it; otherwise a single source is copied *as* DST.
//! - Sync (`sync`, rsync's rule): DST is a directory that receives
//!   `basename(SRC)`, or the contents of `SRC/` (a top-level directory
//!   record with an empty path); it is created when missing. A single
//!   non-directory source onto a missing DST becomes DST, as in rsync.
//! - Resume: a copy that makes a missing DST the copy of its one
//!   directory leaves DST behind as a directory when it is interrupted.
//!   With the journal on (the default, and `--resume`) such a copy marks
//!   DST in the journal until it has finished; a retry that finds the
//!   mark, or journal rows under `DST/` but none under `DST/<top>/`, or
//!   (with `--resume`) DST carrying the top's own mode and mtime (a copy
//!   that had finished), reads DST the way the first run did instead of
//!   nesting a second copy inside it.
//!
//! Whether DST is a directory to receive the tops can depend on what the
//! first top is, which the sink learns from the first metadata record, so
//! the decision may stay open until then ([`DestMap::settle`]).

use crate::storage::fsops::{split_parent, Root};
use crate::types::error::show;

use super::journal::Journal;
use crate::request::reserved::JOURNAL_NAME;
use crate::request::sync::flags::{DEST_DIR, DRY_RUN, JOURNAL, RESUME, SYNC, WRITE_DEVICES};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Tops land inside DST.
    Into,
    /// DST names the copy of the single top itself.
    AsTop,
    /// Sync, DST missing, one top: a directory top makes DST a directory
    /// (created then), anything else becomes DST.
    SyncFirst,
    /// Copy, DST missing, one top, journal on: DST becomes the copy of the
    /// top; a directory top marks DST in the journal until done.
    CopyFirst,
    /// DST is an existing non-directory, one top: a file replaces it, a
    /// directory cannot (cp: "cannot overwrite non-directory").
    OverFile,
    /// Copy into an existing directory DST, one top, journal on: the first
    /// run may have made DST the copy of the top (module docs).
    ResumeProbe,
}

/// The first metadata record, as [`DestMap::settle`] needs it.
pub struct First<'a> {
    pub path: &'a [u8],
    pub dir: bool,
    pub mode: u32,
    pub mtime: (i64, u32),
}

/// Maps wire paths ("top/sub/x") to paths under the sink's root.
#[derive(Debug)]
pub struct DestMap {
    dest: Vec<u8>,
    state: State,
    flags: u32,
    /// DST is marked in the journal (unmark once the copy is done).
    marked: bool,
    /// DST is a block device (written in place; storage::volume).
    device: bool,
}

fn is_dir(st: &crate::storage::fsops::Stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

fn join_rel(a: &[u8], b: &[u8]) -> Vec<u8> {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_vec(),
        (_, true) => a.to_vec(),
        _ => [a, b"/", b].concat(),
    }
}

impl DestMap {
    /// Decide from DST as it is now. `Err` is the one-line reason to
    /// refuse the session before any data moves.
    pub fn resolve(root: &Root, dest: &[u8], roots: u32, flags: u32) -> Result<DestMap, String> {
        let sync = flags & SYNC != 0;
        let st = root
            .lstat(dest)
            .map_err(|e| format!("destination {}: {e}", show_dest(dest)))?;
        let device = st
            .as_ref()
            .is_some_and(crate::storage::volume::is_block_stat);
        if device && flags & WRITE_DEVICES == 0 {
            let name = crate::storage::volume::shown(root, dest);
            let msg = crate::storage::volume::refusal(&name, false, 0, 0);
            return Err(msg.unwrap_or_default());
        }
        let state = match st {
            Some(st) if is_dir(&st) => {
                if flags & (RESUME | JOURNAL) != 0 && roots <= 1 && !sync {
                    State::ResumeProbe
                } else {
                    State::Into
                }
            }
            // `DST/` names a directory (rsync: "cannot stat destination:
            // Not a directory"; cp: the same).
            Some(_) if flags & DEST_DIR != 0 => {
                return Err(format!(
                    "destination {}/ is not a directory",
                    show_dest(dest)
                ))
            }
            Some(_) if roots <= 1 => State::OverFile,
            Some(_) => {
                return Err(format!(
                    "destination {} is not a directory (needed for {roots} sources)",
                    show_dest(dest)
                ))
            }
            None => {
                let (parent, _) = split_parent(dest);
                match root.lstat(parent) {
                    Ok(Some(p)) if is_dir(&p) => {}
                    Ok(Some(_)) => {
                        return Err(format!(
                            "destination {}: {} is not a directory",
                            show_dest(dest),
                            show_dest(parent)
                        ))
                    }
                    _ => {
                        return Err(format!(
                            "destination directory {} does not exist",
                            show_dest(parent)
                        ))
                    }
                }
                match (sync, roots <= 1) {
                    // `DST/`: a directory, whatever the one top is (rsync
                    // makes it and puts a file inside; issue 35).
                    (true, true) if flags & DEST_DIR != 0 => {
                        mkdir(root, dest, flags)?;
                        State::Into
                    }
                    (true, true) => State::SyncFirst,
                    (true, false) => {
                        mkdir(root, dest, flags)?;
                        State::Into
                    }
                    (false, true) if flags & (RESUME | JOURNAL) != 0 => State::CopyFirst,
                    (false, true) => State::AsTop,
                    (false, false) => {
                        return Err(format!(
                        "destination {} is not an existing directory (needed for {roots} sources)",
                        show_dest(dest)
                    ))
                    }
                }
            }
        };
        Ok(DestMap {
            dest: dest.to_vec(),
            state,
            flags,
            marked: false,
            device,
        })
    }

    /// Whether `target` (a mapped path) is DST and DST a block device.
    pub fn is_device(&self, target: &[u8]) -> bool {
        self.device && target == self.dest.as_slice()
    }

    /// Settle an open decision on the first metadata record.
    pub fn settle(&mut self, root: &Root, first: &First) -> Result<(), String> {
        let top = match first.path.iter().position(|&b| b == b'/') {
            Some(i) => &first.path[..i],
            None => first.path,
        };
        match self.state {
            // A contents top (`SRC/` in a sync, or any source with
            // --files-from): its records carry no top name, so DST is the
            // directory that receives them, made when it is missing.
            State::SyncFirst | State::CopyFirst | State::AsTop
                if first.dir && first.path.is_empty() =>
            {
                mkdir(root, &self.dest, self.flags)?;
                self.state = State::Into;
            }
            State::ResumeProbe if first.path.is_empty() => self.state = State::Into,
            State::SyncFirst if first.dir => {
                mkdir(root, &self.dest, self.flags)?;
                self.state = State::Into;
            }
            State::SyncFirst => self.state = State::AsTop,
            // cp's rule: a file is not copied to a missing `DIR/` (GNU cp:
            // "cannot create regular file 'DIR/': Not a directory").
            State::CopyFirst | State::AsTop if !first.dir && self.flags & DEST_DIR != 0 => {
                return Err(format!(
                    "destination {}/ does not exist (a trailing / names a directory; \
                     make it first, or use sync, which makes it)",
                    show_dest(&self.dest)
                ))
            }
            State::OverFile if first.dir => {
                return Err(format!(
                    "destination {} exists and is not a directory",
                    show_dest(&self.dest)
                ))
            }
            State::OverFile => self.state = State::AsTop,
            State::CopyFirst => {
                self.state = State::AsTop;
                if first.dir {
                    // Best effort: without the mark a retry still finds
                    // journal rows, or the finished copy's attributes.
                    match Journal::open(root.path()).and_then(|mut j| j.mark_dest(&self.dest, top))
                    {
                        Ok(()) => self.marked = true,
                        Err(e) => tracing::warn!("{e}"),
                    }
                }
            }
            State::ResumeProbe => {
                self.state = if self.was_copy_of(root, first, top) {
                    tracing::info!(
                        "{} is the copy of {} made by an earlier run: continuing it",
                        show_dest(&self.dest),
                        show(top)
                    );
                    self.marked = true;
                    State::AsTop
                } else {
                    State::Into
                };
            }
            State::Into | State::AsTop => {}
        }
        Ok(())
    }

    /// ResumeProbe: did an earlier run make DST the copy of `top`?
    fn was_copy_of(&self, root: &Root, first: &First, top: &[u8]) -> bool {
        let nested = join_rel(&self.dest, top);
        if !first.dir || top.is_empty() || matches!(root.lstat(&nested), Ok(Some(_))) {
            return false;
        }
        if root.path().join(JOURNAL_NAME).exists() {
            if let Ok(j) = Journal::open(root.path()) {
                if j.dest_top(&self.dest).ok().flatten().as_deref() == Some(top) {
                    return true;
                }
                let under = |p: &[u8]| j.any_under(p).unwrap_or(false);
                if under(&self.dest) && !under(&nested) {
                    return true;
                }
            }
        }
        // A finished copy carries the top's mode and mtime (set last).
        // Not empty: two directories made within one clock tick share an
        // mtime, and an empty DST holds no copy to continue.
        self.flags & RESUME != 0
            && matches!(root.lstat(&self.dest), Ok(Some(st))
                if st.st_mode & 0o7777 == first.mode
                    && (st.st_mtime, st.st_mtime_nsec as u32) == first.mtime)
            && non_empty(root, &self.dest)
    }

    /// The transfer finished without failures: DST no longer needs a mark.
    pub fn finished(&mut self, root: &Root) {
        if !self.marked {
            return;
        }
        self.marked = false;
        if let Ok(mut j) = Journal::open(root.path()) {
            if let Err(e) = j.unmark_dest(&self.dest) {
                tracing::warn!("{e}");
            }
            j.close();
        }
    }

    /// Where a wire path goes. The empty path is DST itself (`SRC/`).
    pub fn map(&self, wire: &[u8]) -> Vec<u8> {
        if self.state == State::AsTop {
            match wire.iter().position(|&b| b == b'/') {
                Some(i) => join_rel(&self.dest, &wire[i + 1..]),
                None => self.dest.clone(),
            }
        } else {
            join_rel(&self.dest, wire)
        }
    }

    /// DST relative to the root.
    pub fn dest(&self) -> &[u8] {
        &self.dest
    }
}

fn non_empty(root: &Root, dir: &[u8]) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(fd) = root.open_dir(dir) else {
        return false;
    };
    std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
}

/// Make DST where rsync makes it; a dry run changes nothing (rsync -n
/// makes no directory either: its files are then all to send).
fn mkdir(root: &Root, dest: &[u8], flags: u32) -> Result<(), String> {
    if dest.is_empty() || flags & DRY_RUN != 0 {
        return Ok(());
    }
    root.mkdir(dest, 0o755)
        .map_err(|e| format!("destination {}: {e}", show_dest(dest)))
}

fn show_dest(p: &[u8]) -> String {
    if p.is_empty() {
        ".".into()
    } else {
        show(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roles::sink::journal::PartRec;
    use crate::storage::fsops::Confinement;

    fn root() -> (tempfile::TempDir, Root) {
        let d = tempfile::tempdir().unwrap();
        let r = Root::open(d.path(), Confinement::Strict).unwrap();
        (d, r)
    }

    fn dir(path: &[u8]) -> First<'_> {
        First {
            path,
            dir: true,
            mode: 0o755,
            mtime: (1_600_000_000, 5),
        }
    }

    fn file(path: &[u8]) -> First<'_> {
        First {
            dir: false,
            ..dir(path)
        }
    }

    #[test]
    fn copy_follows_cp() {
        let (d, r) = root();
        // Missing DST, one source: DST is the copy.
        let mut m = DestMap::resolve(&r, b"x", 1, 0).unwrap();
        m.settle(&r, &dir(b"src")).unwrap();
        assert_eq!(m.map(b"src"), b"x");
        assert_eq!(m.map(b"src/a"), b"x/a");
        // Existing directory: inside it.
        std::fs::create_dir(d.path().join("x")).unwrap();
        let mut m = DestMap::resolve(&r, b"x", 1, 0).unwrap();
        m.settle(&r, &dir(b"src")).unwrap();
        assert_eq!(m.map(b"src/a"), b"x/src/a");
        // Several sources need an existing directory.
        let e = DestMap::resolve(&r, b"y", 2, 0).unwrap_err();
        assert!(e.contains("not an existing directory"), "{e}");
        // The default journal marks nothing for a plain file.
        let mut m = DestMap::resolve(&r, b"f", 1, JOURNAL).unwrap();
        m.settle(&r, &file(b"f0")).unwrap();
        assert_eq!(m.map(b"f0"), b"f");
        assert!(!d.path().join(JOURNAL_NAME).exists());
    }

    #[test]
    fn a_contents_top_fills_dst_in_a_copy_too() {
        // cp --files-from sends its source as contents (an empty top):
        // DST receives them whether it exists or not, on every run.
        let (d, r) = root();
        for flags in [0, JOURNAL, RESUME] {
            for _ in 0..2 {
                let mut m = DestMap::resolve(&r, b"c", 1, flags).unwrap();
                m.settle(&r, &dir(b"")).unwrap();
                assert_eq!(m.map(b""), b"c");
                assert_eq!(m.map(b"a/b"), b"c/a/b");
                assert!(d.path().join("c").is_dir());
            }
            std::fs::remove_dir(d.path().join("c")).unwrap();
        }
    }

    #[test]
    fn sync_follows_rsync_whether_or_not_dst_exists() {
        let (d, r) = root();
        for _ in 0..2 {
            let mut m = DestMap::resolve(&r, b"x", 1, SYNC | JOURNAL).unwrap();
            m.settle(&r, &dir(b"src")).unwrap();
            assert_eq!(m.map(b"src/a"), b"x/src/a");
            assert!(d.path().join("x").is_dir());
        }
        // SRC/: the empty path is DST itself.
        let mut m = DestMap::resolve(&r, b"t", 1, SYNC).unwrap();
        m.settle(&r, &dir(b"")).unwrap();
        assert_eq!(m.map(b""), b"t");
        assert_eq!(m.map(b"a"), b"t/a");
        // One file onto a missing DST becomes DST (rsync does the same).
        let mut m = DestMap::resolve(&r, b"f", 1, SYNC).unwrap();
        m.settle(&r, &file(b"file")).unwrap();
        assert_eq!(m.map(b"file"), b"f");
        // Several sources: DST created at once.
        let m = DestMap::resolve(&r, b"many", 3, SYNC).unwrap();
        assert!(d.path().join("many").is_dir());
        assert_eq!(m.map(b"a/b"), b"many/a/b");
    }

    /// A dry run maps DST as the sync would, twice alike, and makes no
    /// directory (rsync -n makes none either).
    #[test]
    fn a_dry_run_maps_dst_and_makes_nothing() {
        let (d, r) = root();
        let dry = SYNC | DRY_RUN;
        for _ in 0..2 {
            let mut m = DestMap::resolve(&r, b"x", 1, dry).unwrap();
            m.settle(&r, &dir(b"src")).unwrap();
            assert_eq!(m.map(b"src/a"), b"x/src/a");
            let mut m = DestMap::resolve(&r, b"t", 1, dry | DEST_DIR).unwrap();
            m.settle(&r, &dir(b"")).unwrap();
            assert_eq!(m.map(b"a"), b"t/a");
            let m = DestMap::resolve(&r, b"many", 3, dry).unwrap();
            assert_eq!(m.map(b"a/b"), b"many/a/b");
        }
        let left: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_trailing_slash_names_a_directory() {
        // issue 35: `sync file out/newdir/` makes newdir and puts the file
        // in it (rsync); `cp file out/newdir/` refuses (cp); an existing
        // non-directory `g/` is refused by both.
        let (d, r) = root();
        for _ in 0..2 {
            let mut m = DestMap::resolve(&r, b"newdir", 1, SYNC | DEST_DIR).unwrap();
            m.settle(&r, &file(b"file")).unwrap();
            assert_eq!(m.map(b"file"), b"newdir/file");
            assert!(d.path().join("newdir").is_dir());
        }
        let mut m = DestMap::resolve(&r, b"nd2", 1, SYNC | DEST_DIR).unwrap();
        m.settle(&r, &dir(b"src")).unwrap();
        assert_eq!(m.map(b"src/a"), b"nd2/src/a");
        for flags in [DEST_DIR, JOURNAL | DEST_DIR] {
            let mut m = DestMap::resolve(&r, b"cpdir", 1, flags).unwrap();
            let e = m.settle(&r, &file(b"file")).unwrap_err();
            assert!(e.starts_with("destination cpdir/ does not exist"), "{e}");
            assert!(!d.path().join("cpdir").exists());
            // A directory top still becomes the copy (cp -r dir new/).
            let mut m = DestMap::resolve(&r, b"cpdir", 1, flags).unwrap();
            m.settle(&r, &dir(b"src")).unwrap();
            assert_eq!(m.map(b"src/a"), b"cpdir/a");
        }
        std::fs::write(d.path().join("g"), b"x").unwrap();
        for flags in [SYNC | DEST_DIR, DEST_DIR] {
            let e = DestMap::resolve(&r, b"g", 1, flags).unwrap_err();
            assert_eq!(e, "destination g/ is not a directory");
        }
    }

    #[test]
    fn a_directory_never_replaces_a_file() {
        let (d, r) = root();
        std::fs::write(d.path().join("f"), b"x").unwrap();
        for flags in [0, SYNC, JOURNAL] {
            let mut m = DestMap::resolve(&r, b"f", 1, flags).unwrap();
            let e = m.settle(&r, &dir(b"src")).unwrap_err();
            assert_eq!(e, "destination f exists and is not a directory");
            let mut m = DestMap::resolve(&r, b"f", 1, flags).unwrap();
            m.settle(&r, &file(b"g")).unwrap();
            assert_eq!(m.map(b"g"), b"f");
        }
    }

    #[test]
    fn missing_parent_is_one_line_before_anything_moves() {
        let (_d, r) = root();
        for flags in [0, SYNC, JOURNAL, RESUME | JOURNAL] {
            let e = DestMap::resolve(&r, b"etc/x", 1, flags).unwrap_err();
            assert_eq!(e, "destination directory etc does not exist");
        }
    }

    #[test]
    fn an_interrupted_copy_is_continued_in_place() {
        let (d, r) = root();
        // First run: x missing, so x becomes the copy of `big`; marked.
        let mut m = DestMap::resolve(&r, b"x", 1, JOURNAL).unwrap();
        m.settle(&r, &dir(b"big")).unwrap();
        std::fs::create_dir(d.path().join("x")).unwrap();
        // ... interrupted. The retry (with or without --resume) continues x.
        for flags in [JOURNAL, RESUME | JOURNAL] {
            let mut m = DestMap::resolve(&r, b"x", 1, flags).unwrap();
            m.settle(&r, &dir(b"big")).unwrap();
            assert_eq!(m.map(b"big/f.bin"), b"x/f.bin");
        }
        // Another source into x is cp's rule again.
        let mut m = DestMap::resolve(&r, b"x", 1, JOURNAL).unwrap();
        m.settle(&r, &dir(b"other")).unwrap();
        assert_eq!(m.map(b"other/a"), b"x/other/a");
        // Done: the mark and the journal go.
        let mut m = DestMap::resolve(&r, b"x", 1, RESUME | JOURNAL).unwrap();
        m.settle(&r, &dir(b"big")).unwrap();
        m.finished(&r);
        assert!(!d.path().join(JOURNAL_NAME).exists());
        // Without the journal, cp nests.
        let mut m = DestMap::resolve(&r, b"x", 1, 0).unwrap();
        m.settle(&r, &dir(b"big")).unwrap();
        assert_eq!(m.map(b"big/f.bin"), b"x/big/f.bin");
    }

    #[test]
    fn journal_rows_tell_where_an_unmarked_run_went() {
        let (d, r) = root();
        std::fs::create_dir(d.path().join("x")).unwrap();
        let rec = |dest: &[u8]| PartRec {
            dest: dest.to_vec(),
            size: 1,
            mtime: (0, 0),
            part: b".p".to_vec(),
            block_size: 4096,
            written: vec![0],
        };
        let mut j = Journal::open(d.path()).unwrap();
        j.put(&[rec(b"x/f.bin")]).unwrap();
        drop(j);
        let mut m = DestMap::resolve(&r, b"x", 1, RESUME).unwrap();
        m.settle(&r, &dir(b"big")).unwrap();
        assert_eq!(m.map(b"big/f.bin"), b"x/f.bin");
        // Rows under x/big/: the interrupted run nested, so does the retry.
        let mut j = Journal::open(d.path()).unwrap();
        j.put(&[rec(b"x/big/g.bin")]).unwrap();
        drop(j);
        std::fs::create_dir(d.path().join("x/big")).unwrap();
        let mut m = DestMap::resolve(&r, b"x", 1, RESUME).unwrap();
        m.settle(&r, &dir(b"big")).unwrap();
        assert_eq!(m.map(b"big/f.bin"), b"x/big/f.bin");
    }

    #[test]
    fn a_finished_copy_run_again_with_resume_stays_in_place() {
        let (d, r) = root();
        let x = d.path().join("x");
        std::fs::create_dir(&x).unwrap();
        let f = dir(b"big");
        std::fs::set_permissions(&x, std::os::unix::fs::PermissionsExt::from_mode(f.mode)).unwrap();
        let t = rustix::fs::Timespec {
            tv_sec: f.mtime.0,
            tv_nsec: f.mtime.1 as _,
        };
        let times = rustix::fs::Timestamps {
            last_access: t,
            last_modification: t,
        };
        let touch =
            || rustix::fs::utimensat(rustix::fs::CWD, &x, &times, rustix::fs::AtFlags::empty());
        touch().unwrap();
        // Empty: nothing to continue (and two fresh directories can share
        // an mtime).
        let mut m = DestMap::resolve(&r, b"x", 1, RESUME | JOURNAL).unwrap();
        m.settle(&r, &f).unwrap();
        assert_eq!(m.map(b"big/a"), b"x/big/a");
        std::fs::write(x.join("a"), b"a").unwrap();
        touch().unwrap();
        let mut m = DestMap::resolve(&r, b"x", 1, RESUME | JOURNAL).unwrap();
        m.settle(&r, &f).unwrap();
        assert_eq!(m.map(b"big/a"), b"x/a");
        // A plain cp keeps cp's rule.
        let mut m = DestMap::resolve(&r, b"x", 1, JOURNAL).unwrap();
        m.settle(&r, &f).unwrap();
        assert_eq!(m.map(b"big/a"), b"x/big/a");
    }
}
