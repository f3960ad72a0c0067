//! ramsys-topo: hardware discovery and NUMA placement.
//!
//! The INI layer of seed 000 (sec. 6.1.2) profiles every I/O resource and
//! binds the threads and memory that serve a device to the device's NUMA
//! node; Tyche (seed 002, sec. 3 and 6) binds every structure, buffer and
//! thread of a path to one NIC and its node. This crate provides:
//! - [`discover`]: the [`Topology`] of a machine from sysfs/procfs under a
//!   sysroot (fixtures stand in for machines);
//! - [`placement`]: thread pinning and node-bound, verified buffers;
//! - [`plan`]: placement decisions for a transfer;
//! - [`channel`]: the multi-NIC channel scheduler;
//! - [`rawnic`]: which NICs can carry raw-Ethernet channels;
//! - [`TopoArgs`]/[`run`]: the `ramsys topo` subcommand.

pub mod channel;
mod discover;
pub mod model;
pub mod placement;
pub mod plan;
pub mod rawnic;
mod render;

pub use channel::{Channel, ChannelPolicy, ChannelScheduler};
pub use discover::{discover, parse_cpulist};
pub use model::{BlockDevice, DeviceKind, DeviceMount, Mount, Nic, NicAddr, Node, Topology};
pub use placement::{Binding, NodeRegion, Placer};
pub use plan::{plan_transfer, NumaMode, Placement, Role, TransferPlan};
pub use render::{fmt_cpus, render_text};

use std::path::PathBuf;

/// `ramsys topo [--sysroot DIR] [--json]`.
#[derive(clap::Args, Debug)]
pub struct TopoArgs {
    /// Read sys/ and proc/ under this directory instead of the live system.
    #[arg(long, default_value = "/")]
    pub sysroot: PathBuf,
    /// Print the model as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &TopoArgs) -> anyhow::Result<()> {
    let topo = discover(&args.sysroot)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&topo)?);
    } else {
        print!("{}", render_text(&topo));
    }
    Ok(())
}
