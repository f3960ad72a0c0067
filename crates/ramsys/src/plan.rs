//! `ramsys plan SRC DST`: the placement plan the daemon would follow for a
//! transfer on this host (or the host a --sysroot tree describes), without
//! moving data.

use std::path::{Path, PathBuf};

use clap::Args;
use ramsys_engine::daemon::placement::{nic_for_addr, sched_instance, storage_for_path};

use crate::spec::{parse_endpoint, Endpoint};

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Read /sys and /proc under DIR instead of the live system.
    #[arg(long, default_value = "/")]
    pub sysroot: PathBuf,
    /// I/O model file written by `ramsys iomodel -o` (default: derived
    /// from NUMA distances).
    #[arg(long, value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Also solve exactly (small hosts) and show the heuristic's gap.
    #[arg(long)]
    pub exact: bool,
    /// Block size the plan sizes buffers for.
    #[arg(long, default_value = "4M", value_parser = crate::spec::parse_block_size)]
    pub block_size: u64,
    pub src: String,
    pub dst: String,
}

/// The device an endpoint touches on this host: its storage device when
/// local, the NIC towards the daemon when remote.
fn device_of(topo: &ramsys_topo::Topology, e: &Endpoint, live: bool) -> anyhow::Result<String> {
    match e {
        Endpoint::Local(p) => {
            let abs = if live {
                std::path::absolute(p)?
            } else {
                Path::new("/").join(p)
            };
            // A destination that does not exist yet lives on its parent's device.
            let probe = if live && !abs.exists() {
                abs.parent().map(Path::to_path_buf).unwrap_or(abs.clone())
            } else {
                abs.clone()
            };
            storage_for_path(topo, &probe, live)
                .map(|d| d.name.clone())
                .ok_or_else(|| anyhow::anyhow!("no block device found under {}", abs.display()))
        }
        Endpoint::Daemon { addr, .. } => nic_for_addr(topo, addr)
            .or_else(|| topo.nics.iter().find(|n| !n.is_virtual))
            .or_else(|| topo.nics.first())
            .map(|n| n.name.clone())
            .ok_or_else(|| anyhow::anyhow!("no network interface found for {addr}")),
        // The NIC towards the ssh host (any port will do for the lookup).
        Endpoint::Ssh(s) => device_of(
            topo,
            &Endpoint::Daemon {
                addr: if s.host.contains(':') {
                    format!("[{}]:22", s.host)
                } else {
                    format!("{}:22", s.host)
                },
                path: Vec::new(),
            },
            live,
        ),
    }
}

pub fn run(a: &PlanArgs) -> anyhow::Result<i32> {
    let topo = ramsys_topo::discover(&a.sysroot)?;
    let live = a.sysroot == Path::new("/");
    let model = match &a.model {
        Some(p) => Some(ramsys_iomodel::load_model(p)?),
        None => None,
    };
    let src = device_of(&topo, &parse_endpoint(&a.src)?, live)?;
    let dst = device_of(&topo, &parse_endpoint(&a.dst)?, live)?;
    let inst = sched_instance(&topo, model.as_ref(), &src, &dst, a.block_size);
    let plan = ramsys_sched::plan(&inst);
    if a.json {
        let mut v = serde_json::to_value(&plan)?;
        if a.exact {
            if let Some(x) = ramsys_sched::plan_exact(&inst) {
                v["exact"] = serde_json::to_value(&x)?;
            }
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "transfer {src} -> {dst} on {} NUMA node(s)",
            topo.nodes.len()
        );
        print!("{}", ramsys_sched::render_text(&plan));
        if a.exact {
            match ramsys_sched::plan_exact(&inst) {
                Some(x) => println!(
                    "exact optimum: {:.2} Gbps (heuristic {:.2} Gbps, gap {:.1} %)",
                    x.predicted.gbps,
                    plan.predicted.gbps,
                    100.0 * (x.predicted.gbps - plan.predicted.gbps) / x.predicted.gbps.max(1e-9)
                ),
                None => println!("exact optimum: host too large for the exact solver"),
            }
        }
    }
    Ok(0)
}
