//! Human-readable `ramsys topo` output.

use crate::model::Topology;
use std::fmt::Write;

use ramsys_units::format_size as fmt_bytes;

/// Compact cpulist ("0-7,16-23").
pub fn fmt_cpus(cpus: &[usize]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    if out.is_empty() {
        "-".into()
    } else {
        out.join(",")
    }
}

fn node_str(n: Option<u32>) -> String {
    n.map_or("unknown".into(), |n| n.to_string())
}

/// The topology as `ramsys topo` prints it: NUMA nodes, NICs, block
/// devices.
pub fn render_text(t: &Topology) -> String {
    let mut s = String::new();
    nodes_text(&mut s, t);
    nics_text(&mut s, t);
    devices_text(&mut s, t);
    s
}

fn nodes_text(s: &mut String, t: &Topology) {
    let synth = if t.numa_synthetic {
        " (no NUMA exposed by the kernel: one synthetic node)"
    } else {
        ""
    };
    let _ = writeln!(s, "NUMA nodes: {}{synth}", t.nodes.len());
    for n in &t.nodes {
        let pk: Vec<String> = n.packages.iter().map(|p| p.to_string()).collect();
        let llc = n
            .llc_bytes
            .map_or(String::new(), |b| format!("  llc {}", fmt_bytes(b)));
        let _ = writeln!(
            s,
            "  node {}: cpus {}  memory {}  package {}{llc}",
            n.id,
            fmt_cpus(&n.cpus),
            fmt_bytes(n.memory_bytes),
            if pk.is_empty() {
                "?".into()
            } else {
                pk.join(",")
            },
        );
        let d: Vec<String> = n.distances.iter().map(|d| d.to_string()).collect();
        let _ = writeln!(s, "          distances {}", d.join(" "));
    }
}

fn nics_text(s: &mut String, t: &Topology) {
    let _ = writeln!(s, "NICs: {}", t.nics.len());
    for n in &t.nics {
        let speed = n
            .speed_mbps
            .map_or("speed ?".into(), |m| format!("{m} Mb/s"));
        let addrs: Vec<String> = n
            .addresses
            .iter()
            .map(|a| format!("{}/{}", a.addr, a.prefix_len))
            .collect();
        let mut extra = String::new();
        if n.is_virtual {
            extra.push_str("  virtual");
        }
        if let Some(d) = &n.driver {
            let _ = write!(extra, "  driver {d}");
        }
        if let Some(p) = &n.pci_slot {
            let _ = write!(extra, "  pci {p}");
        }
        if !n.irqs.is_empty() {
            let irqs: Vec<String> = n.irqs.iter().map(|i| i.to_string()).collect();
            let _ = write!(extra, "  irqs {}", irqs.join(","));
        }
        let _ = writeln!(
            s,
            "  {}: node {}  {speed}  [{}]{extra}",
            n.name,
            node_str(n.numa_node),
            addrs.join(" "),
        );
        let _ = writeln!(s, "      {}", crate::rawnic::describe(n));
    }
}

fn devices_text(s: &mut String, t: &Topology) {
    let _ = writeln!(s, "Block devices: {}", t.block_devices.len());
    for d in t.block_devices.iter().chain(t.pseudo_devices.iter()) {
        let mounts: Vec<String> = d
            .mounts
            .iter()
            .map(|m| {
                let part = m
                    .partition
                    .as_ref()
                    .map_or(String::new(), |p| format!("{p} "));
                format!("{part}{} ({})", m.mount_point.display(), m.fs_type)
            })
            .collect();
        let size = if d.size_bytes > 0 {
            format!("  {}", fmt_bytes(d.size_bytes))
        } else {
            String::new()
        };
        let mut extra = String::new();
        if !d.slaves.is_empty() {
            let _ = write!(extra, "  on {}", d.slaves.join(","));
        }
        if let Some(dr) = &d.driver {
            let _ = write!(extra, "  driver {dr}");
        }
        let _ = writeln!(
            s,
            "  {}: {}{}  node {}{size}{extra}{}",
            d.name,
            d.kind.as_str(),
            if d.rotational { " (rotational)" } else { "" },
            node_str(d.numa_node),
            if mounts.is_empty() {
                String::new()
            } else {
                format!("  mounted {}", mounts.join(", "))
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ranges() {
        assert_eq!(fmt_cpus(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(fmt_cpus(&[]), "-");
        assert_eq!(fmt_cpus(&[5]), "5");
    }

    #[test]
    fn byte_units() {
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(64 << 30), "64.0 GiB");
        assert_eq!(fmt_bytes(5 << 20), "5.0 MiB");
    }
}
