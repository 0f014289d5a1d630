//! Detaching like other mount helpers: the command re-runs itself in the foreground as
//! a new session, with its log in a file, and waits on a pipe until the child reports
//! that the mount answers (or why it could not mount).

use anyhow::{anyhow, Context};
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::Path;
use std::process::{Command, Stdio};

/// The variable through which the parent tells the child where to report readiness.
pub const READY_FD_VAR: &str = "SCDLFS_READY_FD";

/// Starts the daemon and waits for its verdict.
pub fn spawn_and_wait(log_file: &Path) -> anyhow::Result<()> {
    let (read_end, write_end) = rustix::pipe::pipe().context("pipe")?;
    // Only the write end goes to the child.
    rustix::io::fcntl_setfd(&read_end, rustix::io::FdFlags::CLOEXEC).context("pipe")?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_file)
        .with_context(|| format!("cannot open log file {}", log_file.display()))?;
    let exe = std::env::current_exe().map_err(anyhow::Error::msg)?;
    let mut command = Command::new(exe);
    command
        // The flag goes right after the subcommand, so a user's `--` stays last.
        .args(std::env::args_os().skip(1).take(1))
        .arg("--foreground")
        .args(std::env::args_os().skip(2))
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
        "ready" => Ok(()),
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

/// In the daemon: reports the mount's fate to the waiting parent, if there is one.
pub fn report(message: &str) {
    let Some(fd) = std::env::var(READY_FD_VAR)
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
    else {
        return;
    };
    std::env::remove_var(READY_FD_VAR);
    // SAFETY: the parent passed this descriptor to us for exactly this use, once.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    use std::io::Write;
    let _ = file.write_all(message.as_bytes());
}
