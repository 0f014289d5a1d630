//! `scdlfs mount-flags` (hidden): the `mount` command's flags as JSON, read from the
//! clap definition itself, so that the Python package (`scdlfs.mount(**options)`)
//! validates and translates keyword arguments without a second list of the flags, and
//! learns how the daemon reports readiness.

use clap::{ArgAction, CommandFactory};
use serde::Serialize;

use super::{daemon, Cli};

#[derive(Serialize)]
struct Flag {
    /// The long name, e.g. `cache-size` (Python's `cache_size`).
    long: String,
    /// False for a switch (`--allow-other`), true for a flag that takes a value.
    takes_value: bool,
    /// Whether it may be given more than once (`-o`).
    repeatable: bool,
    value_name: Option<String>,
    default: Vec<String>,
    help: String,
}

#[derive(Serialize)]
struct MountFlags {
    /// The variable naming the descriptor on which `mount --foreground` writes `ready`
    /// or its error message.
    ready_fd_var: &'static str,
    flags: Vec<Flag>,
}

pub fn run() -> anyhow::Result<()> {
    let command = Cli::command();
    let mount = command
        .find_subcommand("mount")
        .expect("the CLI has a mount command");
    let flags = mount
        .get_arguments()
        .filter_map(|arg| {
            let long = arg.get_long()?;
            Some(Flag {
                long: long.to_owned(),
                takes_value: arg.get_action().takes_values(),
                repeatable: matches!(arg.get_action(), ArgAction::Append),
                value_name: arg
                    .get_value_names()
                    .and_then(|names| names.first())
                    .map(|name| name.to_string()),
                default: arg
                    .get_default_values()
                    .iter()
                    .map(|value| value.to_string_lossy().into_owned())
                    .collect(),
                help: arg.get_help().map(|h| h.to_string()).unwrap_or_default(),
            })
        })
        .collect();
    let description = MountFlags {
        ready_fd_var: daemon::READY_FD_VAR,
        flags,
    };
    println!("{}", serde_json::to_string(&description)?);
    Ok(())
}
