//! `ramsys`: one binary for the daemon (`serve`), the agent (`cp`) and the
//! hardware tools (`topo`, `iomodel`).

#[macro_use]
mod say;

mod agent;
mod args;
mod daemon;
mod docgen;
mod harden;
mod numa;
mod pairs;
mod pick;
mod plan;
mod progress;
mod rawpick;
mod replicate;
mod signals;
mod spec;
mod ssh;
mod ssh_serve;
mod status;
mod stripe;
mod summary;
mod token;
mod tunnel;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "ramsys",
    version,
    about = "NUMA-aware, resource-aware data replication"
)]
pub(crate) struct Cli {
    /// More log output (repeat for more); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the daemon: serve transfers beneath --root.
    Serve(daemon::ServeArgs),
    /// Copy files and directory trees (local paths, ramsys://HOST:PORT/PATH
    /// or [USER@]HOST:PATH), as cp and scp do: an existing directory DST
    /// receives the sources; a missing DST becomes the copy of one source.
    Cp(args::CpArgs),
    /// Bring DST up to date with SRC: only changed files (and changed
    /// blocks of large files) move; --delete, --dry-run, --checksum.
    ///
    /// rsync's rule: SRC lands as DST/basename(SRC), SRC/ (trailing slash)
    /// puts SRC's contents into DST; DST is created when missing, so the
    /// same command run again updates the same copy.
    #[command(
        after_help = "Examples:\n  ramsys sync -r data /backup        # -> /backup/data/...\n  ramsys sync -r data/ /backup/data  # same place, by contents"
    )]
    Sync(args::SyncArgs),
    /// Show a daemon's sessions, tasks, queues, pools and throughput.
    Status(status::StatusArgs),
    /// Ask a running daemon for a one-time credential (one session, bound
    /// to your export root), e.g. for an ssh session to relay.
    Token(token::TokenArgs),
    /// Show the hardware model: NUMA nodes, NICs, block devices.
    Topo(ramsys_topo::TopoArgs),
    /// NUMA I/O bandwidth characterization, classes, prediction, calibration.
    Iomodel(ramsys_iomodel::IomodelArgs),
    /// Show the thread, buffer and stream plan for a transfer, without moving data.
    Plan(plan::PlanArgs),
    /// The remote end of an ssh transfer, run by the agent through ssh
    /// (one session; credential on stdin; docs/PROTOCOL.md).
    #[command(hide = true)]
    SshServe(ssh_serve::SshServeArgs),
    /// Print a shell completion script (bash, zsh or fish) on stdout,
    /// e.g. `ramsys completions bash > /etc/bash_completion.d/ramsys`.
    Completions(docgen::CompletionsArgs),
    /// Write the man pages (ramsys.1, ramsys-SUBCOMMAND.1) into OUTDIR.
    #[command(hide = true)]
    Man(docgen::ManArgs),
}

/// Options shared by every command that authenticates.
#[derive(Args, Debug, Clone)]
pub struct KeyArgs {
    /// Shared key file (default: $RAMSYS_KEY_FILE or ~/.config/ramsys/key,
    /// created with mode 0600 on first use).
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
}

impl KeyArgs {
    pub fn load(&self) -> anyhow::Result<Vec<u8>> {
        let p = self
            .key_file
            .clone()
            .unwrap_or_else(ramsys_resources::keys::default_key_path);
        ramsys_resources::keys::load_or_create(&p)
    }
}

/// `agent`: cp and sync, whose failures end in one `ramsys: error:` line;
/// the engines they run in-process (a local copy's daemon) would repeat
/// it as warnings, so those show only with -v.
fn init_logging(verbose: u8, agent: bool) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 if agent => "error",
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // No colour codes when stderr is the journal or a file (a service).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(move || say::LogWriter { ansi })
        .with_ansi(ansi)
        .with_target(false)
        .try_init();
}

/// Parse the command line; cp's and sync's --include/--exclude rules are
/// put in command-line order from clap's indices (args::SelectArgs).
fn parse() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let m = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&m).unwrap_or_else(|e| e.exit());
    let ordered = match (&mut cli.cmd, m.subcommand()) {
        (Cmd::Cp(a), Some((_, sm))) => a.select.order(sm),
        (Cmd::Sync(a), Some((_, sm))) => a.cp.select.order(sm),
        _ => Ok(()),
    };
    if let Err(e) = ordered {
        say!("ramsys: {e:#}");
        std::process::exit(2);
    }
    cli
}

fn main() {
    let cli = parse();
    init_logging(cli.verbose, matches!(cli.cmd, Cmd::Cp(_) | Cmd::Sync(_)));
    let r = match &cli.cmd {
        Cmd::Serve(a) => daemon::run(a),
        Cmd::Cp(a) => agent::run(a),
        // Continuous replication (issue 38, docs/WATCH.md).
        Cmd::Sync(a) if a.watch.watch => replicate::agent::run(a, agent::sync_flags(a)),
        Cmd::Sync(a) => agent::run_sync(a),
        Cmd::Status(a) => status::run(a),
        Cmd::Token(a) => token::run(a),
        Cmd::Topo(a) => ramsys_topo::run(a).map(|_| 0),
        Cmd::Iomodel(a) => ramsys_iomodel::run(a).map(|_| 0),
        Cmd::Plan(a) => plan::run(a),
        Cmd::SshServe(a) => ssh_serve::run(a),
        Cmd::Completions(a) => docgen::run_completions(a),
        Cmd::Man(a) => docgen::run_man(a),
    };
    match r {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            // One line: the error and its causes.
            let mut msg = e.to_string();
            for c in e.chain().skip(1) {
                let s = c.to_string();
                if !msg.contains(&s) {
                    msg.push_str(": ");
                    msg.push_str(&s);
                }
            }
            say!("ramsys: error: {msg}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    /// clap checks its definitions (duplicate short flags such as the
    /// archive flags -a/-o/-g/-X/-A/-D/-U/-H, conflicts) only in debug
    /// builds at run time; this runs the same checks in any build.
    #[test]
    fn cli_definitions_are_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
