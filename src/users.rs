//! The processes a mount lives for: those of `--exit-with-pid`, and those that attach
//! later by writing `+PID` into the root's [`USERS_XATTR`] (the ranks of a node sharing
//! one mount, as the Python package does) and leave by writing `-PID`. Each is watched
//! through a pidfd (Linux 5.3): unlike a parent-death signal it follows a process, not
//! the thread that started the daemon, and sees it end however it ends (a SIGKILL, the
//! OOM killer). Once none is left the mount stops for good: a later attach is refused
//! (EBUSY), so a process that attached is never left with a mount that goes.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;

use rustix::process::{pidfd_open, Pid, PidfdFlags};

use crate::error::{FsError, FsResult};

/// The root's attribute that lists the users as JSON, `{"daemon": PID, "users":
/// [PID, ...]}`, and takes `+PID` (attach) and `-PID` (leave).
pub const USERS_XATTR: &str = "user.scdlfs.users";

/// The processes a mount lives for; a mount without any lives until it is stopped.
#[derive(Debug)]
pub struct Users {
    /// False without `--exit-with-pid`: such a mount (a service's) takes no users.
    watched: bool,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    pids: Vec<(i32, OwnedFd)>,
    /// Every user has gone: the mount is stopping and takes no one new.
    stopping: bool,
}

impl Users {
    /// A mount that lives until it is stopped.
    pub fn unwatched() -> Users {
        Users {
            watched: false,
            state: Mutex::default(),
        }
    }

    /// A mount that lives for `pids`, each watched from now (before mounting, so that
    /// one ending meanwhile is seen, and a pid reused later is not mistaken for it); one
    /// gone already counts as exited.
    pub fn watching(pids: &[i32]) -> std::io::Result<Users> {
        let mut state = State::default();
        for &pid in pids {
            match open(pid) {
                Ok(fd) => state.pids.push((pid, fd)),
                Err(rustix::io::Errno::SRCH) => {
                    tracing::info!(pid, "--exit-with-pid: the process is gone already")
                }
                Err(error) => {
                    return Err(std::io::Error::other(format!(
                        "--exit-with-pid {pid}: cannot watch the process (pidfd_open needs \
                         Linux 5.3): {error}"
                    )))
                }
            }
        }
        Ok(Users {
            watched: !pids.is_empty(),
            state: Mutex::new(state),
        })
    }

    /// Whether every user has gone, the mount then stopping for good. Never for a
    /// mount that lives until stopped.
    pub fn all_gone(&self) -> bool {
        if !self.watched {
            return false;
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.pids.retain(|(_, fd)| !has_exited(fd));
        state.stopping |= state.pids.is_empty();
        state.stopping
    }

    /// Whether the mount lives for its users (`--exit-with-pid`) rather than until it
    /// is stopped.
    pub fn takes_users(&self) -> bool {
        self.watched
    }

    /// `+PID` attaches a process, `-PID` lets one go (the last one stops the mount).
    pub fn request(&self, value: &[u8]) -> FsResult<()> {
        let invalid = || {
            FsError::InvalidRequest(format!(
                "{USERS_XATTR} takes +PID or -PID, not {:?}",
                String::from_utf8_lossy(value)
            ))
        };
        let text = std::str::from_utf8(value).map_err(|_| invalid())?.trim();
        let (attach, pid) = match text.split_at_checked(1) {
            Some(("+", pid)) => (true, pid),
            Some(("-", pid)) => (false, pid),
            _ => return Err(invalid()),
        };
        let pid: i32 = pid.parse().map_err(|_| invalid())?;
        if !self.watched {
            return Err(FsError::InvalidRequest(
                "this mount lives until it is stopped (no --exit-with-pid): it takes no users"
                    .into(),
            ));
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.stopping {
            return Err(FsError::Busy(
                "every user has gone: the mount is stopping".into(),
            ));
        }
        if !attach {
            state.pids.retain(|(p, _)| *p != pid);
            state.stopping = state.pids.is_empty();
            return Ok(());
        }
        if state.pids.iter().all(|(p, _)| *p != pid) {
            let fd = open(pid).map_err(|error| {
                FsError::InvalidRequest(format!("cannot watch process {pid}: {error}"))
            })?;
            state.pids.push((pid, fd));
        }
        Ok(())
    }

    /// `{"daemon": PID, "users": [PID, ...]}`: the processes still alive.
    pub fn describe(&self) -> Vec<u8> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.pids.retain(|(_, fd)| !has_exited(fd));
        let pids: Vec<i32> = state.pids.iter().map(|(pid, _)| *pid).collect();
        serde_json::to_vec(&serde_json::json!({"daemon": std::process::id(), "users": pids}))
            .expect("a list of numbers serializes")
    }
}

fn open(pid: i32) -> rustix::io::Result<OwnedFd> {
    let pid = Pid::from_raw(pid).ok_or(rustix::io::Errno::SRCH)?;
    pidfd_open(pid, PidfdFlags::NONBLOCK)
}

/// A pidfd polls readable once its process has exited.
fn has_exited(fd: &OwnedFd) -> bool {
    let mut poll = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd of an open descriptor, no wait.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    ready > 0 && poll.revents != 0
}
