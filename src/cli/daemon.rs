//! Detaching like other mount helpers: the command re-runs itself in the foreground as
//! a new session, with its log in a file, and waits on a pipe until the child reports
//! that the mount answers (or why it could not mount). The child writes its report
//! only into a descriptor that can be that pipe (`SCDLFS_READY_FD` is checked). The
//! source reaches the child in its environment, never on its command line.

use anyhow::{anyhow, Context};
use std::ffi::OsString;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::Path;
use std::process::{Command, Stdio};

use super::SOURCE_FROM_ENVIRONMENT;

/// The variable through which the parent tells the child where to report readiness.
pub const READY_FD_VAR: &str = "SCDLFS_READY_FD";

/// The variable through which the parent hands the child the source: an environment
/// is readable by its owner only, a command line by every local user.
pub const SOURCE_VAR: &str = "SCDLFS_SOURCE";

/// Starts the daemon and waits for its verdict. `source_arg` is SOURCE as given on
/// the command line, `source` what it names. Once mounted, says where and how the
/// daemon can be found and stopped: it runs detached, out of sight.
pub fn spawn_and_wait(
    log_file: &Path,
    source_arg: &str,
    source: &str,
    mountpoint: &Path,
) -> anyhow::Result<()> {
    let (read_end, write_end) = rustix::pipe::pipe().context("pipe")?;
    // Only the write end goes to the child.
    rustix::io::fcntl_setfd(&read_end, rustix::io::FdFlags::CLOEXEC).context("pipe")?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_file)
        .with_context(|| format!("cannot open log file {}", log_file.display()))?;
    let exe = std::env::current_exe().map_err(anyhow::Error::msg)?;
    let argv: Vec<OsString> = std::env::args_os().collect();
    let mut command = Command::new(exe);
    command
        .args(child_arguments(&argv, source_arg))
        .env(SOURCE_VAR, source)
        // A detached daemon is not the process a service manager watches.
        .env_remove("NOTIFY_SOCKET")
        .env(READY_FD_VAR, write_end.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    // SAFETY: setsid is async-signal-safe; the write end stays open in the child
    // because it is not close-on-exec (made by pipe() without O_CLOEXEC).
    unsafe {
        use std::os::unix::process::CommandExt;
        command.pre_exec(|| {
            let _ = rustix::process::setsid();
            Ok(())
        });
    }
    let mut child = command.spawn().context("cannot start the daemon")?;
    drop(write_end);
    let mut report = String::new();
    let mut reader = std::fs::File::from(read_end);
    let _ = reader.read_to_string(&mut report);
    match report.trim() {
        "ready" => {
            println!(
                "mounted {} at {} (daemon pid {}, log {}); `scdlfs unmount {}` unmounts it",
                crate::store::redact::redact(source),
                mountpoint.display(),
                child.id(),
                log_file.display(),
                mountpoint.display()
            );
            Ok(())
        }
        "" => {
            let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
            Err(anyhow!(
                "the daemon exited ({status}) before the mount was ready; see {}",
                log_file.display()
            ))
        }
        message => {
            // The daemon exits after reporting a failure: reap it.
            let _ = child.wait();
            Err(anyhow::Error::msg(message.to_owned()))
        }
    }
}

/// The daemon's command line: this one's after the program, `--foreground` right after
/// the subcommand (so a user's `--` stays last), and SOURCE as `env:SCDLFS_SOURCE`. The
/// argument swapped is the one the parser takes as SOURCE: the same text can be another
/// flag's value before it (`--cache-dir /d /d /mnt`), and swapping that one left the
/// source on the daemon's command line.
fn child_arguments(argv: &[OsString], source_arg: &str) -> Vec<OsString> {
    let from_environment = format!("{SOURCE_FROM_ENVIRONMENT}{SOURCE_VAR}");
    let mut swapped = argv.to_vec();
    let at = (2..argv.len())
        .filter(|&at| argv[at].as_os_str() == source_arg)
        .find(|&at| {
            swapped[at] = from_environment.clone().into();
            let takes_it = matches!(
                super::parse_from(swapped.iter().cloned()),
                Ok(super::Cli { command: super::Command::Mount(args), .. })
                    if args.source == from_environment
            );
            swapped[at] = argv[at].clone();
            takes_it
        });
    if let Some(at) = at {
        swapped[at] = from_environment.into();
    }
    let mut child = swapped.split_off(1);
    child.insert(1, "--foreground".into());
    child
}

/// In the daemon: reports the mount's fate to the waiting parent, if there is one.
pub fn report(message: &str) {
    let Some(value) = std::env::var_os(READY_FD_VAR) else {
        return;
    };
    std::env::remove_var(READY_FD_VAR);
    let Some(mut pipe) = value
        .to_str()
        .and_then(|v| v.parse::<i32>().ok())
        .and_then(inherited_pipe)
    else {
        tracing::warn!(
            "{READY_FD_VAR}={} is not the write end of a pipe this process inherited; \
             ignored",
            value.to_string_lossy()
        );
        return;
    };
    use std::io::Write;
    let _ = pipe.write_all(message.as_bytes());
}

/// `fd`, taken over, if it can be the detaching parent's pipe: not a standard stream,
/// open, a pipe, and open for writing. Anything else (a variable left in a service's
/// environment, a typo) is neither written to nor closed.
fn inherited_pipe(fd: i32) -> Option<std::fs::File> {
    if fd <= libc::STDERR_FILENO {
        return None;
    }
    // SAFETY: fstat and fcntl(F_GETFL) only read; on a closed descriptor they fail
    // with EBADF.
    let (is_fifo, writable) = unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut stat) != 0 {
            return None;
        }
        let flags = libc::fcntl(fd, libc::F_GETFL);
        (
            stat.st_mode & libc::S_IFMT == libc::S_IFIFO,
            flags >= 0 && flags & libc::O_ACCMODE == libc::O_WRONLY,
        )
    };
    // SAFETY: an open pipe's write end that the parent passed for this one report;
    // the variable is gone, so nothing takes it again.
    (is_fifo && writable).then(|| unsafe { std::fs::File::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arguments(argv: &[&str]) -> Vec<String> {
        let argv: Vec<OsString> = argv.iter().map(OsString::from).collect();
        child_arguments(&argv, "/d")
            .into_iter()
            .map(|arg| arg.into_string().unwrap())
            .collect()
    }

    /// The argument swapped for the environment is SOURCE, not an earlier flag's value
    /// that reads the same.
    #[test]
    fn the_source_leaves_the_command_line_even_where_a_flag_has_its_text() {
        assert_eq!(
            arguments(&["scdlfs", "mount", "--cache-dir", "/d", "/d", "/mnt"]),
            [
                "mount",
                "--foreground",
                "--cache-dir",
                "/d",
                "env:SCDLFS_SOURCE",
                "/mnt"
            ]
        );
        assert_eq!(
            arguments(&["scdlfs", "mount", "/d", "/mnt", "--cache-dir", "/d"]),
            [
                "mount",
                "--foreground",
                "env:SCDLFS_SOURCE",
                "/mnt",
                "--cache-dir",
                "/d"
            ]
        );
    }
}
