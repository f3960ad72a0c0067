//! Which storage device a daemon's device queue is, as the site sees it
//! (site::share): two daemons share a device when they write the same
//! file system, whichever host they run on.
//!
//! The identity comes from the mount (`/proc/self/mountinfo`) holding the
//! queue's device number:
//! - a network or cluster file system (NFS, Lustre, CephFS, GPFS, ...):
//!   its type and mount source (`server:/export`, `mgs@tcp:/fs`) and the
//!   root within it, the same string on every client that mounts it the
//!   same way;
//! - anything else (a local disk, tmpfs): its device number plus the
//!   kernel's boot id, so daemons on one host share it (they do share the
//!   disk) and two hosts' `/dev/sda` never do.
//!
//! The published id is a 64-bit FNV-1a hash of that string (the load
//! segment is small; the string itself shows in `status`).

use std::path::Path;

use serde::{Deserialize, Serialize};

/// File system types whose data lives on servers every client shares.
const NETWORK_FS: &[&str] = &[
    "nfs",
    "nfs4",
    "lustre",
    "ceph",
    "fuse.ceph",
    "fuse.cephfs",
    "gpfs",
    "cifs",
    "smb3",
    "glusterfs",
    "fuse.glusterfs",
    "beegfs",
    "ocfs2",
    "gfs2",
    "panfs",
    "fuse.sshfs",
    "9p",
];

/// A device's identity: the human form and its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageId {
    pub id: u64,
    pub name: String,
    /// A network or cluster file system (shared across hosts).
    pub network: bool,
}

/// FNV-1a, 64 bits: stable across builds and hosts (std's hasher is not).
pub fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The identity of device `dev` ("major:minor") from mountinfo `text` and
/// this kernel's `boot_id`. Pure, for tests.
pub fn identify(dev: &str, mountinfo: &str, boot_id: &str) -> StorageId {
    // mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS... - TYPE SOURCE SUPER
    let mount = mountinfo.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let pre: Vec<&str> = pre.split_whitespace().collect();
        if pre.get(2) != Some(&dev) {
            return None;
        }
        let mut post = post.split_whitespace();
        let fs = post.next()?.to_string();
        let source = post.next().unwrap_or("").to_string();
        Some((fs, source, pre.get(3).copied().unwrap_or("/").to_string()))
    });
    let (name, network) = match mount {
        Some((fs, source, root)) if NETWORK_FS.contains(&fs.as_str()) => {
            (format!("{fs} {source} root {root}"), true)
        }
        Some((fs, _, _)) => (format!("{fs} dev {dev} on host {boot_id}"), false),
        None => (format!("dev {dev} on host {boot_id}"), false),
    };
    StorageId {
        id: fnv1a(&name),
        name,
        network,
    }
}

/// [`identify`] on this host.
pub fn identify_local(dev: &str) -> StorageId {
    let read = |p: &str| std::fs::read_to_string(Path::new(p)).unwrap_or_default();
    let boot = read("/proc/sys/kernel/random/boot_id");
    identify(dev, &read("/proc/self/mountinfo"), boot.trim())
}

/// One shared storage device in use by a member (in its `load` segment).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageUse {
    /// The device's identity (site::storage: a hash of the file system's
    /// mount source and type, the same on every host that mounts it).
    pub id: u64,
    /// Tasks of the member holding storage threads on it.
    pub tasks: u16,
    /// Storage threads those tasks hold (granted, before the share).
    pub threads: u16,
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST_A: &str = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
        40 22 0:52 / /data rw,relatime shared:9 - nfs4 fs1:/export/data rw,vers=4.2\n\
        41 22 0:60 / /scratch rw - lustre 10.0.0.9@tcp:/scratch rw\n";
    // Host B mounts the same export under another path, with another
    // anonymous device number.
    const HOST_B: &str = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
        50 22 0:77 / /mnt/d rw,relatime shared:9 - nfs4 fs1:/export/data rw,vers=4.2\n";

    #[test]
    fn one_export_is_one_device_across_hosts_and_disks_are_not() {
        let a = identify("0:52", HOST_A, "boot-a");
        let b = identify("0:77", HOST_B, "boot-b");
        assert!(a.network);
        assert_eq!(a.id, b.id, "{a:?} {b:?}");
        assert_eq!(a.name, "nfs4 fs1:/export/data root /");
        // Same /dev/sda1 on two hosts: two devices; on one host: one.
        let da = identify("8:1", HOST_A, "boot-a");
        let db = identify("8:1", HOST_B, "boot-b");
        assert_ne!(da.id, db.id);
        assert_eq!(da, identify("8:1", HOST_A, "boot-a"));
        assert!(!da.network);
        assert_ne!(identify("0:60", HOST_A, "x").id, a.id);
        // Not in mountinfo: still a per-host identity.
        assert_eq!(identify("9:9", HOST_A, "b").name, "dev 9:9 on host b");
    }

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv1a(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a("a"), 0xaf63_dc4c_8601_ec8c);
    }
}
