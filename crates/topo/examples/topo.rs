//! `cargo run -p ramsys-topo --example topo -- [--sysroot DIR] [--json]`:
//! the `ramsys topo` subcommand without the rest of the binary.
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ramsys_topo::TopoArgs,
}

fn main() -> anyhow::Result<()> {
    ramsys_topo::run(&Cli::parse().args)
}
