//! Which NICs can carry raw-Ethernet channels (seed 002, Tyche; issue 18:
//! "`ramsys topo` shows which NICs can carry raw channels (up, MTU, MAC,
//! XDP support)"). A raw channel needs an Ethernet interface that is up,
//! with a MAC address and an MTU of at least 1500; 9000 (jumbo) is what
//! the seed uses and what channels prefer.

use crate::model::Nic;

const ARPHRD_ETHER: u32 = 1;

/// Drivers with native (driver-mode) XDP in mainline Linux; any other
/// interface still has generic XDP (slower: after the skb is built).
const NATIVE_XDP_DRIVERS: &[&str] = &[
    "veth",
    "virtio_net",
    "mlx4_core",
    "mlx4_en",
    "mlx5_core",
    "i40e",
    "ice",
    "ixgbe",
    "ixgbevf",
    "igb",
    "igc",
    "bnxt_en",
    "ena",
    "nfp",
    "qede",
    "thunderx",
    "tun",
    "netdevsim",
    "stmmac",
    "sfc",
    "mvneta",
    "mvpp2",
    "hv_netvsc",
];

/// A NIC that can carry raw channels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawNic {
    pub mtu: u32,
    /// MTU 9000 or more: jumbo frames, as the seed uses.
    pub jumbo: bool,
    pub mac: String,
    /// Native XDP by driver (AF_XDP could attach in driver mode).
    pub native_xdp: bool,
}

/// Whether `n` can carry raw channels, or why not.
pub fn raw_support(n: &Nic) -> Result<RawNic, String> {
    let zero_mac = match n.mac.as_deref() {
        Some(m) => m.split(':').all(|b| b == "00"),
        None => true,
    };
    match n.link_type {
        Some(ARPHRD_ETHER) => {}
        Some(t) => return Err(format!("not Ethernet (link type {t})")),
        // Older fixtures and sysfs copies have no `type`: loopback has an
        // all-zero MAC, so the MAC decides.
        None if zero_mac => return Err("not Ethernet (no MAC address)".into()),
        None => {}
    }
    if zero_mac {
        return Err("no MAC address".into());
    }
    match n.operstate.as_deref() {
        Some("up") | Some("unknown") => {}
        Some(s) => return Err(format!("link {s}")),
        None => return Err("link state unknown".into()),
    }
    let mtu = n.mtu.ok_or("MTU unknown")?;
    if mtu < 1500 {
        return Err(format!("MTU {mtu} below 1500"));
    }
    let driver = n.driver.as_deref().unwrap_or("");
    Ok(RawNic {
        mtu,
        jumbo: mtu >= 9000,
        mac: n.mac.clone().unwrap_or_default(),
        native_xdp: NATIVE_XDP_DRIVERS.contains(&driver) || n.name.starts_with("veth"),
    })
}

/// One line for `ramsys topo`.
pub fn describe(n: &Nic) -> String {
    match raw_support(n) {
        Ok(r) => format!(
            "raw channels: yes  mac {}  mtu {}{}  xdp {}",
            r.mac,
            r.mtu,
            if r.jumbo { " (jumbo)" } else { "" },
            if r.native_xdp { "native" } else { "generic" }
        ),
        Err(why) => format!("raw channels: no ({why})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nic(name: &str, ty: Option<u32>, mac: &str, mtu: u32, state: &str, drv: &str) -> Nic {
        Nic {
            name: name.into(),
            numa_node: None,
            speed_mbps: None,
            is_virtual: false,
            addresses: vec![],
            irqs: vec![],
            mac: Some(mac.into()),
            mtu: Some(mtu),
            operstate: Some(state.into()),
            driver: (!drv.is_empty()).then(|| drv.into()),
            pci_slot: None,
            link_type: ty,
        }
    }

    #[test]
    fn which_nics_qualify() {
        let j = raw_support(&nic(
            "eth2",
            Some(1),
            "00:02:c9:00:07:02",
            9000,
            "up",
            "mlx4_core",
        ));
        assert_eq!(
            j.unwrap(),
            RawNic {
                mtu: 9000,
                jumbo: true,
                mac: "00:02:c9:00:07:02".into(),
                native_xdp: true
            }
        );
        let s = raw_support(&nic(
            "eth0",
            Some(1),
            "78:e7:d1:00:00:01",
            1500,
            "up",
            "bnx2",
        ))
        .unwrap();
        assert!(!s.jumbo && !s.native_xdp);
        let lo = nic("lo", None, "00:00:00:00:00:00", 65536, "unknown", "");
        assert!(raw_support(&lo).unwrap_err().contains("not Ethernet"));
        let ib = nic("ib0", Some(32), "80:00:00:48", 2044, "up", "");
        assert!(raw_support(&ib).unwrap_err().contains("link type 32"));
        let down = nic("eth1", Some(1), "00:11:22:33:44:55", 9000, "down", "");
        assert_eq!(raw_support(&down).unwrap_err(), "link down");
        let small = nic("eth4", Some(1), "00:11:22:33:44:56", 1280, "up", "");
        assert!(raw_support(&small).unwrap_err().contains("below 1500"));
        assert!(
            describe(&nic("veth0", None, "aa:bb:cc:00:00:01", 1500, "up", ""))
                .contains("yes  mac aa:bb:cc:00:00:01  mtu 1500  xdp native")
        );
    }
}
