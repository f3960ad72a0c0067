//! Names for metric and status labels: the NIC that carries a link and
//! the storage device that holds a path.

use std::ffi::CStr;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::storage::device::device_kind;

/// Name of the interface that owns the local address of a link
/// ("127.0.0.1:7000" -> "lo"); "unknown" if none matches.
pub fn nic_for(local: &str) -> String {
    let ip = match local.parse::<SocketAddr>() {
        Ok(a) => a.ip(),
        Err(_) => return "unknown".into(),
    };
    let ip = match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    };
    interfaces()
        .into_iter()
        .find(|(_, a)| *a == ip)
        .map(|(n, _)| n)
        .unwrap_or_else(|| "unknown".into())
}

/// (name, address) of every configured interface address.
pub fn interfaces() -> Vec<(String, IpAddr)> {
    let mut out = Vec::new();
    // SAFETY: getifaddrs allocates a list we walk read-only and free once.
    unsafe {
        let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut head) != 0 {
            return out;
        }
        let mut p = head;
        while !p.is_null() {
            let ifa = &*p;
            if !ifa.ifa_addr.is_null() && !ifa.ifa_name.is_null() {
                let name = CStr::from_ptr(ifa.ifa_name).to_string_lossy().into_owned();
                match (*ifa.ifa_addr).sa_family as i32 {
                    libc::AF_INET => {
                        let sa = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                        let ip = std::net::Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr));
                        out.push((name, IpAddr::V4(ip)));
                    }
                    libc::AF_INET6 => {
                        let sa = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                        out.push((
                            name,
                            IpAddr::V6(std::net::Ipv6Addr::from(sa.sin6_addr.s6_addr)),
                        ));
                    }
                    _ => {}
                }
            }
            p = ifa.ifa_next;
        }
        libc::freeifaddrs(head);
    }
    out
}

/// Device queue key ("major:minor") and kind of the storage holding
/// `path`, or of its nearest existing ancestor (a sink's destination may
/// not exist yet).
pub fn device_of(path: &Path) -> (String, &'static str) {
    let mut p = Some(path);
    while let Some(q) = p {
        if let Ok(m) = std::fs::metadata(q) {
            let dev = m.dev();
            let key = format!("{}:{}", libc::major(dev), libc::minor(dev));
            return (key, device_kind(dev, q).name());
        }
        p = q.parent();
    }
    ("unknown".into(), "ssd")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_lo_and_paths_have_devices() {
        assert_eq!(nic_for("127.0.0.1:1"), "lo");
        assert_eq!(nic_for("not an address"), "unknown");
        let t = tempfile::tempdir().unwrap();
        let (a, _) = device_of(t.path());
        let (b, _) = device_of(&t.path().join("missing/deeper"));
        assert_eq!(a, b);
        assert!(a.contains(':'));
    }
}
