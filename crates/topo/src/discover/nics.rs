//! Network interfaces from /sys/class/net: NUMA node, driver, PCI slot,
//! MSI IRQs (named in /proc/interrupts) and IPv4/IPv6 addresses.

use super::*;

pub(super) fn read_nics(fs: &Root) -> Vec<Nic> {
    let base = fs.p("sys/class/net");
    let interrupts = fs::read_to_string(fs.p("proc/interrupts")).unwrap_or_default();
    let mut nics = Vec::new();
    for name in dir_names(&base) {
        let d = base.join(&name);
        if !d.is_dir() {
            continue; // e.g. bonding_masters
        }
        let dev = d.join("device");
        let is_virtual = !dev.exists();
        let info = if is_virtual {
            DevInfo::default()
        } else {
            device_info(fs, &dev)
        };
        // speed is -1 or unreadable (EINVAL) when the link is down/unknown.
        let speed_mbps = read_num::<i64>(&d.join("speed")).and_then(|s| u64::try_from(s).ok());
        let mut irqs = info.msi_irqs.clone();
        irqs.extend(irqs_named(&interrupts, &name, info.pci_slot.as_deref()));
        irqs.sort_unstable();
        irqs.dedup();
        nics.push(Nic {
            name,
            numa_node: info.numa_node,
            speed_mbps,
            is_virtual,
            addresses: Vec::new(),
            irqs,
            mac: read_str(&d.join("address")),
            mtu: read_num(&d.join("mtu")),
            operstate: read_str(&d.join("operstate")),
            driver: info.driver,
            pci_slot: info.pci_slot,
            link_type: read_num(&d.join("type")),
        });
    }
    nics
}

/// IRQ numbers of /proc/interrupts lines naming the interface ("eth2-rx-0")
/// or its PCI function ("mlx4-comp-0@pci:0000:41:00.0", "PCI-MSIX-0000:...").
pub(super) fn irqs_named(interrupts: &str, ifname: &str, pci: Option<&str>) -> Vec<u32> {
    interrupts
        .lines()
        .filter_map(|l| {
            let (num, rest) = l.trim_start().split_once(':')?;
            let irq: u32 = num.trim().parse().ok()?;
            let hit = rest.split_whitespace().any(|tok| {
                tok.strip_prefix(ifname).is_some_and(|r| {
                    r.is_empty() || r.starts_with('-') || r.starts_with('@') || r.starts_with('.')
                }) || pci.is_some_and(|p| tok.contains(p))
            });
            hit.then_some(irq)
        })
        .collect()
}

/// Interface addresses: IPv6 from /proc/net/if_inet6; IPv4 from
/// getifaddrs(3) on the live system, otherwise from /proc/net/fib_trie
/// (local addresses) matched to /proc/net/route (which interface's subnet
/// holds them), since sysfs has no IPv4 addresses.
pub(super) fn attach_addresses(fs: &Root, nics: &mut [Nic]) {
    let mut by_if: BTreeMap<String, Vec<NicAddr>> = BTreeMap::new();
    if let Ok(text) = fs::read_to_string(fs.p("proc/net/if_inet6")) {
        for (name, a) in parse_if_inet6(&text) {
            by_if.entry(name).or_default().push(a);
        }
    }
    let live_v4 = if fs.live { live_ipv4() } else { None };
    match live_v4 {
        Some(v4) => {
            for (name, a) in v4 {
                by_if.entry(name).or_default().push(a);
            }
        }
        None => {
            let trie = fs::read_to_string(fs.p("proc/net/fib_trie")).unwrap_or_default();
            let routes = fs::read_to_string(fs.p("proc/net/route")).unwrap_or_default();
            let loopback = nics.iter().find(|n| n.name == "lo").map(|n| n.name.clone());
            for (name, a) in ipv4_from_proc(&trie, &routes, loopback.as_deref()) {
                by_if.entry(name).or_default().push(a);
            }
        }
    }
    for nic in nics {
        if let Some(mut v) = by_if.remove(&nic.name) {
            v.sort_by_key(|a| (a.addr.is_ipv6(), a.addr));
            v.dedup();
            nic.addresses = v;
        }
    }
}

pub(super) fn parse_if_inet6(text: &str) -> Vec<(String, NicAddr)> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 6 || f[0].len() != 32 {
                return None;
            }
            let addr = Ipv6Addr::from(u128::from_str_radix(f[0], 16).ok()?);
            let prefix_len = u8::from_str_radix(f[2], 16).ok()?;
            Some((
                f[5].to_string(),
                NicAddr {
                    addr: IpAddr::V6(addr),
                    prefix_len,
                },
            ))
        })
        .collect()
}

/// Local IPv4 addresses are the "/32 host LOCAL" leaves of fib_trie; the
/// interface is the one whose directly connected route (no gateway) holds
/// the address, longest mask first. 127/8 goes to the loopback device.
pub(super) fn ipv4_from_proc(
    trie: &str,
    routes: &str,
    loopback: Option<&str>,
) -> Vec<(String, NicAddr)> {
    let mut locals = BTreeSet::new();
    let mut last: Option<Ipv4Addr> = None;
    for l in trie.lines() {
        let t = l.trim_start_matches([' ', '|', '+', '-']).trim();
        if let Ok(ip) = t.parse::<Ipv4Addr>() {
            last = Some(ip);
        } else if t.starts_with("/32 host LOCAL") {
            if let Some(ip) = last {
                locals.insert(ip);
            }
        }
    }
    // (iface, dest, mask) of connected routes.
    let hex = |s: &str| {
        u32::from_str_radix(s, 16)
            .ok()
            .map(|v| Ipv4Addr::from(v.to_le_bytes()))
    };
    let connected: Vec<(String, u32, u32)> = routes
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 8 || hex(f[2])? != Ipv4Addr::UNSPECIFIED {
                return None;
            }
            Some((
                f[0].to_string(),
                u32::from(hex(f[1])?),
                u32::from(hex(f[7])?),
            ))
        })
        .collect();
    let mut out = Vec::new();
    for ip in locals {
        if ip.is_loopback() {
            if let Some(lo) = loopback {
                out.push((
                    lo.to_string(),
                    NicAddr {
                        addr: IpAddr::V4(ip),
                        prefix_len: 8,
                    },
                ));
            }
            continue;
        }
        let v = u32::from(ip);
        if let Some((name, _, mask)) = connected
            .iter()
            .filter(|(_, dest, mask)| *mask != 0 && v & mask == *dest)
            .max_by_key(|(_, _, mask)| mask.count_ones())
        {
            out.push((
                name.clone(),
                NicAddr {
                    addr: IpAddr::V4(ip),
                    prefix_len: mask.count_ones() as u8,
                },
            ));
        }
    }
    out
}

/// IPv4 addresses of this machine via getifaddrs(3).
fn live_ipv4() -> Option<Vec<(String, NicAddr)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` walks the list returned by getifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and its family tells the real type.
        if unsafe { (*ifa.ifa_addr).sa_family } as i32 != libc::AF_INET {
            continue;
        }
        // SAFETY: AF_INET addresses are sockaddr_in; netmask likewise when set.
        let (addr, prefix_len) = unsafe {
            let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
            let addr = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            let prefix = if ifa.ifa_netmask.is_null() {
                32
            } else {
                let m = &*(ifa.ifa_netmask as *const libc::sockaddr_in);
                u32::from_be(m.sin_addr.s_addr).count_ones() as u8
            };
            (addr, prefix)
        };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        out.push((
            name,
            NicAddr {
                addr: IpAddr::V4(addr),
                prefix_len,
            },
        ));
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Some(out)
}
