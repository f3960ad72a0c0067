//! Block devices from /sys/block (memory, virtual or real, rotational or
//! not) and mounts from /proc/self/mountinfo, matched to their devices.

use super::*;

/// Memory-backed block devices (brd ramdisks, zram, pmem).
const MEMORY_PREFIXES: &[&str] = &["ram", "zram", "pmem"];
/// Devices stacked on or emulating others.
const VIRTUAL_PREFIXES: &[&str] = &["loop", "dm-", "md", "nbd", "rbd", "drbd", "bcache"];

pub(super) fn classify(name: &str, has_device: bool, rotational: bool) -> DeviceKind {
    if MEMORY_PREFIXES.iter().any(|p| name.starts_with(p)) {
        DeviceKind::Memory
    } else if VIRTUAL_PREFIXES.iter().any(|p| name.starts_with(p)) || !has_device {
        DeviceKind::Virtual
    } else if name.starts_with("nvme") {
        DeviceKind::Nvme
    } else if rotational {
        DeviceKind::Hdd
    } else {
        DeviceKind::Ssd
    }
}

pub(super) fn read_block_devices(fs: &Root) -> Vec<BlockDevice> {
    let base = fs.p("sys/block");
    let mut devs = Vec::new();
    for name in dir_names(&base) {
        let d = base.join(&name);
        let has_device = d.join("device").exists();
        let rotational = read_num::<u32>(&d.join("queue/rotational")) == Some(1);
        let info = if has_device {
            device_info(fs, &d.join("device"))
        } else {
            DevInfo::default()
        };
        let partitions = dir_names(&d)
            .into_iter()
            .filter(|p| d.join(p).join("partition").exists())
            .collect();
        devs.push(BlockDevice {
            kind: classify(&name, has_device, rotational),
            rotational,
            numa_node: info.numa_node,
            // `size` counts 512-byte sectors whatever the logical block size.
            size_bytes: read_num::<u64>(&d.join("size")).unwrap_or(0) * 512,
            mounts: Vec::new(),
            partitions,
            slaves: dir_names(&d.join("slaves")),
            driver: info.driver,
            pci_slot: info.pci_slot,
            name,
        });
    }
    // Stacked devices (md RAID over two SSDs, dm) live where all their
    // slaves live. Two rounds cover dm over md.
    for _ in 0..2 {
        let snapshot = devs.clone();
        let owner_node = |slave: &str| -> Option<Option<u32>> {
            snapshot
                .iter()
                .find(|d| d.name == slave || d.partitions.iter().any(|p| p == slave))
                .map(|d| d.numa_node)
        };
        for dev in devs.iter_mut().filter(|d| d.numa_node.is_none()) {
            let nodes: Option<BTreeSet<Option<u32>>> =
                dev.slaves.iter().map(|s| owner_node(s)).collect();
            if let Some(nodes) = nodes {
                if nodes.len() == 1 {
                    dev.numa_node = *nodes.iter().next().unwrap();
                }
            }
        }
    }
    devs
}

/// Kernel file systems that hold no user data: no device for them.
const KERNEL_FS: &[&str] = &[
    "proc",
    "sysfs",
    "devtmpfs",
    "devpts",
    "cgroup",
    "cgroup2",
    "securityfs",
    "debugfs",
    "tracefs",
    "pstore",
    "bpf",
    "mqueue",
    "configfs",
    "fusectl",
    "binfmt_misc",
    "autofs",
    "efivarfs",
    "rpc_pipefs",
    "nsfs",
    "selinuxfs",
];
const MEMORY_FS: &[&str] = &["tmpfs", "ramfs", "hugetlbfs"];

/// Decodes the octal escapes (\040 for space) of mountinfo fields.
pub(super) fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

struct RawMount {
    dev: Option<String>, // "major:minor"
    mount_point: String,
    fs_type: String,
    source: String,
}

/// /proc/self/mountinfo, or /proc/mounts (no device numbers) as a fallback.
fn read_raw_mounts(fs: &Root) -> Vec<RawMount> {
    if let Ok(text) = fs::read_to_string(fs.p("proc/self/mountinfo")) {
        return text
            .lines()
            .filter_map(|l| {
                let (pre, post) = l.split_once(" - ")?;
                let pre: Vec<&str> = pre.split_whitespace().collect();
                let mut post = post.split_whitespace();
                Some(RawMount {
                    dev: Some(pre.get(2)?.to_string()),
                    mount_point: unescape_mount(pre.get(4)?),
                    fs_type: post.next()?.to_string(),
                    source: unescape_mount(post.next().unwrap_or("")),
                })
            })
            .collect();
    }
    fs::read_to_string(fs.p("proc/mounts"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(RawMount {
                dev: None,
                source: unescape_mount(f.first()?),
                mount_point: unescape_mount(f.get(1)?),
                fs_type: f.get(2)?.to_string(),
            })
        })
        .collect()
}

pub(super) fn read_mounts(fs: &Root, devs: &mut [BlockDevice]) -> (Vec<Mount>, Vec<BlockDevice>) {
    // major:minor and name of every disk and partition -> (disk, partition).
    let mut by_dev: HashMap<String, (String, Option<String>)> = HashMap::new();
    let mut by_name: HashMap<String, (String, Option<String>)> = HashMap::new();
    for d in devs.iter() {
        let dir = fs.p("sys/block").join(&d.name);
        if let Some(n) = read_str(&dir.join("dev")) {
            by_dev.insert(n, (d.name.clone(), None));
        }
        by_name.insert(d.name.clone(), (d.name.clone(), None));
        for p in &d.partitions {
            if let Some(n) = read_str(&dir.join(p).join("dev")) {
                by_dev.insert(n, (d.name.clone(), Some(p.clone())));
            }
            by_name.insert(p.clone(), (d.name.clone(), Some(p.clone())));
        }
    }
    let mut mounts = Vec::new();
    let mut pseudo: Vec<BlockDevice> = Vec::new();
    for r in read_raw_mounts(fs) {
        let hit = r
            .dev
            .as_ref()
            .and_then(|d| by_dev.get(d))
            .or_else(|| {
                let base = r.source.strip_prefix("/dev/")?;
                by_name.get(base.rsplit('/').next()?)
            })
            .cloned();
        let (device, partition) = match hit {
            Some((disk, part)) => {
                if let Some(d) = devs.iter_mut().find(|d| d.name == disk) {
                    d.mounts.push(DeviceMount {
                        mount_point: r.mount_point.clone().into(),
                        fs_type: r.fs_type.clone(),
                        partition: part.clone(),
                    });
                }
                (Some(disk), part)
            }
            None if KERNEL_FS.contains(&r.fs_type.as_str()) => (None, None),
            None => {
                let kind = if MEMORY_FS.contains(&r.fs_type.as_str()) {
                    DeviceKind::Memory
                } else {
                    DeviceKind::Virtual
                };
                let name = format!("{}:{}", r.fs_type, r.mount_point);
                pseudo.retain(|p| p.name != name);
                pseudo.push(BlockDevice {
                    name: name.clone(),
                    kind,
                    rotational: false,
                    numa_node: None,
                    size_bytes: 0,
                    mounts: vec![DeviceMount {
                        mount_point: r.mount_point.clone().into(),
                        fs_type: r.fs_type.clone(),
                        partition: None,
                    }],
                    partitions: vec![],
                    slaves: vec![],
                    driver: None,
                    pci_slot: None,
                });
                (Some(name), None)
            }
        };
        mounts.push(Mount {
            mount_point: r.mount_point.into(),
            fs_type: r.fs_type,
            source: r.source,
            device,
            partition,
        });
    }
    (mounts, pseudo)
}
