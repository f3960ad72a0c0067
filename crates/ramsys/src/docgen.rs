//! Shell completions and man pages generated from the clap definitions
//! (issue 20: "Shell completions and man pages generated from the clap
//! definitions"), so they never drift from the flags: `ramsys completions
//! bash|zsh|fish` prints a script on stdout; the hidden `ramsys man OUTDIR`
//! writes ramsys.1 and one ramsys-SUBCOMMAND.1 per visible subcommand (the
//! Debian package ships them).

use std::path::{Path, PathBuf};

use clap::{Args, Command, CommandFactory};
use clap_complete::Shell;

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to print a completion script for.
    #[arg(value_name = "bash|zsh|fish")]
    pub shell: CompletionShell,
}

/// The shells supported (clap_complete knows more; these are the ones the
/// package installs scripts for).
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

impl From<CompletionShell> for Shell {
    fn from(s: CompletionShell) -> Shell {
        match s {
            CompletionShell::Bash => Shell::Bash,
            CompletionShell::Zsh => Shell::Zsh,
            CompletionShell::Fish => Shell::Fish,
        }
    }
}

#[derive(Args, Debug)]
pub struct ManArgs {
    /// Directory to write the pages into (created if missing).
    #[arg(value_name = "OUTDIR")]
    pub out: PathBuf,
}

/// The completion script for `shell`.
pub fn completion(shell: CompletionShell) -> Vec<u8> {
    let mut cmd = crate::Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(Shell::from(shell), &mut cmd, "ramsys", &mut out);
    out
}

pub fn run_completions(a: &CompletionsArgs) -> anyhow::Result<i32> {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    o.write_all(&completion(a.shell))?;
    o.flush()?;
    Ok(0)
}

/// Write ramsys.1 and ramsys-SUB.1 for every visible subcommand into
/// `dir`; returns the files written.
pub fn write_man_pages(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    let mut cmd = crate::Cli::command();
    // Subcommand pages are named and titled ramsys-SUB, as git's are.
    cmd.build();
    let mut written = vec![page(&cmd, dir, "ramsys")?];
    // `help` is clap's own (added by build); hidden ones are internal.
    for sub in cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        let name = format!("ramsys-{}", sub.get_name());
        let sub = sub
            .clone()
            .display_name(name.clone())
            .version(env!("CARGO_PKG_VERSION"));
        written.push(page(&sub, dir, &name)?);
    }
    Ok(written)
}

fn page(cmd: &Command, dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join(format!("{name}.1"));
    let mut buf = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut buf)?;
    // Through a temp name: no page appears half-written.
    let tmp = dir.join(format!(".{name}.1.tmp"));
    std::fs::write(&tmp, &buf).map_err(|e| anyhow::anyhow!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, &path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(path)
}

pub fn run_man(a: &ManArgs) -> anyhow::Result<i32> {
    for p in write_man_pages(&a.out)? {
        println!("{}", p.display());
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every visible subcommand's name.
    fn subcommands() -> Vec<String> {
        crate::Cli::command()
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .map(|s| s.get_name().to_string())
            .collect()
    }

    #[test]
    fn each_shell_completes_every_subcommand() {
        let subs = subcommands();
        assert!(subs.iter().any(|s| s == "cp") && subs.iter().any(|s| s == "serve"));
        for sh in [
            CompletionShell::Bash,
            CompletionShell::Zsh,
            CompletionShell::Fish,
        ] {
            let text = String::from_utf8(completion(sh)).unwrap();
            assert!(!text.is_empty(), "{sh:?}");
            for s in &subs {
                assert!(text.contains(s.as_str()), "{sh:?} lacks {s}");
            }
            // A flag of a subcommand, too.
            assert!(text.contains("bwlimit"), "{sh:?} lacks --bwlimit");
        }
    }

    #[test]
    fn man_pages_for_the_tool_and_each_subcommand() {
        let d = tempfile::tempdir().unwrap();
        let files = write_man_pages(d.path()).unwrap();
        let subs = subcommands();
        assert_eq!(files.len(), subs.len() + 1);
        let top = std::fs::read_to_string(d.path().join("ramsys.1")).unwrap();
        assert!(top.starts_with(".ie") || top.contains(".TH"), "{top:.200}");
        for s in &subs {
            let p = d.path().join(format!("ramsys-{s}.1"));
            let text = std::fs::read_to_string(&p).unwrap();
            assert!(text.contains(".TH"), "{}", p.display());
            assert!(top.contains(s.as_str()), "ramsys.1 lacks {s}");
        }
        let cp = std::fs::read_to_string(d.path().join("ramsys-cp.1")).unwrap();
        assert!(
            cp.contains("bwlimit") && cp.contains("ramsys\\-cp"),
            "{cp:.400}"
        );
        // The hidden subcommands get no page.
        assert!(!d.path().join("ramsys-ssh-serve.1").exists());
        assert!(!d.path().join("ramsys-man.1").exists());
    }
}
