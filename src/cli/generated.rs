//! `scdlfs man` and `scdlfs completions SHELL`: the manual pages and the shell
//! completions, generated at run time from the same clap definitions the parser uses
//! (with the `SCDLFS_*` variables of `mount`), so they cannot disagree with the flags
//! of the binary that prints them. The release packages take them from the binary
//! they ship (scripts/build-release).

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, CommandFactory};
use clap_complete::Shell;

use super::{spellings, Cli};

#[derive(Args, Debug)]
pub struct ManArgs {
    /// Write one page per command (scdlfs.1, scdlfs-mount.1, ...) into DIR instead of
    /// printing scdlfs(1), which lists the commands, to standard output.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for, e.g. `scdlfs completions bash >
    /// /etc/bash_completion.d/scdlfs`.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// The command as the parser sees it.
fn command() -> clap::Command {
    spellings::with_environment(Cli::command())
}

pub fn man(args: ManArgs) -> anyhow::Result<()> {
    match args.out_dir {
        Some(dir) => write_pages(&dir)
            .with_context(|| format!("cannot write the manual pages into {}", dir.display())),
        None => {
            let mut out = io::stdout().lock();
            clap_mangen::Man::new(command()).render(&mut out)?;
            out.flush()?;
            Ok(())
        }
    }
}

fn write_pages(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    clap_mangen::generate_to(command(), dir)
}

pub fn completions(args: CompletionsArgs) -> anyhow::Result<()> {
    let mut command = command();
    let name = command.get_name().to_owned();
    let mut out = io::stdout().lock();
    clap_complete::generate(args.shell, &mut command, name, &mut out);
    out.flush()?;
    Ok(())
}
