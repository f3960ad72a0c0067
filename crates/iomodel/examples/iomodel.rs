//! Stand-alone `iomodel` front end (same flags as `ramsys iomodel`), for
//! trying the tool before it is wired into the `ramsys` binary.
use clap::Parser;

#[derive(Parser, Debug)]
#[command(name = "iomodel")]
struct Cli {
    #[command(flatten)]
    args: ramsys_iomodel::IomodelArgs,
}

fn main() -> anyhow::Result<()> {
    ramsys_iomodel::run(&Cli::parse().args)
}
