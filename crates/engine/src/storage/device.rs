//! Device type of a file system (seed 000 sec. 6.2.2 and Fig. 6-13: a
//! rotational disk wants one sequential reader and striping; SSD, NVMe and
//! memory want several threads and pipelining).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Kind of storage behind a device number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Rotational,
    Ssd,
    Nvme,
    /// tmpfs, ramfs, zram, pmem.
    Memory,
}

impl DeviceKind {
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Rotational => "hdd",
            DeviceKind::Ssd => "ssd",
            DeviceKind::Nvme => "nvme",
            DeviceKind::Memory => "mem",
        }
    }
}

const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// Kind of the device `dev` (st_dev) holding `path`.
pub fn device_kind(dev: u64, path: &Path) -> DeviceKind {
    if libc::major(dev) == 0 {
        // Anonymous device: a virtual file system. Memory if tmpfs/ramfs,
        // otherwise (overlay, NFS, FUSE) assume flash-like behaviour.
        return match fs_magic(path) {
            Some(TMPFS_MAGIC) | Some(RAMFS_MAGIC) => DeviceKind::Memory,
            _ => DeviceKind::Ssd,
        };
    }
    let disk = disk_dir(Path::new("/sys"), dev);
    let name = disk
        .as_ref()
        .and_then(|d| d.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let rotational = disk
        .as_ref()
        .and_then(|d| std::fs::read_to_string(d.join("queue/rotational")).ok())
        .map(|s| s.trim() == "1");
    classify(&name, rotational)
}

/// The sysfs directory of the whole disk behind device number `dev` (a
/// partition's parent: its queue/ and the counters that matter for
/// contention live there), under the sysfs root `sys`; None without one.
pub fn disk_dir(sys: &Path, dev: u64) -> Option<std::path::PathBuf> {
    let (maj, min) = (libc::major(dev), libc::minor(dev));
    let real = std::fs::canonicalize(sys.join(format!("dev/block/{maj}:{min}"))).ok()?;
    if real.join("partition").exists() {
        real.parent().map(|p| p.to_path_buf())
    } else {
        Some(real)
    }
}

/// Kind from the block device's name and its queue/rotational flag.
pub fn classify(name: &str, rotational: Option<bool>) -> DeviceKind {
    if name.starts_with("zram") || name.starts_with("ram") || name.starts_with("pmem") {
        DeviceKind::Memory
    } else if name.starts_with("nvme") {
        DeviceKind::Nvme
    } else if rotational == Some(true) {
        DeviceKind::Rotational
    } else {
        DeviceKind::Ssd
    }
}

fn fs_magic(path: &Path) -> Option<i64> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: zeroed statfs is a valid out-parameter; c is a C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    #[allow(clippy::unnecessary_cast)]
    Some(st.f_type as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// A partition's device number leads to its disk's directory, a
    /// disk's to its own; an unknown number to none (fixture sysfs tree).
    #[test]
    fn disk_dir_of_a_partition_is_its_disk() {
        let t = tempfile::tempdir().unwrap();
        let sys = t.path();
        let disk = sys.join("devices/virtual/block/vdz");
        std::fs::create_dir_all(disk.join("vdz1")).unwrap();
        std::fs::write(disk.join("vdz1/partition"), "1\n").unwrap();
        std::fs::create_dir_all(sys.join("dev/block")).unwrap();
        let link = |mm: &str, to: &str| {
            std::os::unix::fs::symlink(to, sys.join("dev/block").join(mm)).unwrap()
        };
        link("254:0", "../../devices/virtual/block/vdz");
        link("254:1", "../../devices/virtual/block/vdz/vdz1");
        let real = std::fs::canonicalize(&disk).unwrap();
        assert_eq!(disk_dir(sys, libc::makedev(254, 1)), Some(real.clone()));
        assert_eq!(disk_dir(sys, libc::makedev(254, 0)), Some(real));
        assert_eq!(disk_dir(sys, libc::makedev(8, 0)), None);
    }

    #[test]
    fn classifies_names_and_flags() {
        assert_eq!(classify("sda", Some(true)), DeviceKind::Rotational);
        assert_eq!(classify("sda", Some(false)), DeviceKind::Ssd);
        assert_eq!(classify("nvme0n1", Some(false)), DeviceKind::Nvme);
        assert_eq!(classify("zram0", Some(false)), DeviceKind::Memory);
        assert_eq!(classify("", None), DeviceKind::Ssd);
    }

    #[test]
    fn tmpfs_is_memory() {
        let p = Path::new("/dev/shm");
        if let Ok(md) = std::fs::metadata(p) {
            if fs_magic(p) == Some(TMPFS_MAGIC) {
                assert_eq!(device_kind(md.dev(), p), DeviceKind::Memory);
            }
        }
    }
}
