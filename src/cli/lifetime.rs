//! A daemon started on a program's behalf (the Python package's mounts) ends with it:
//! `--exit-with-pid` unmounts once every listed process has exited, however it ended (a
//! SIGKILL, the OOM killer, a lost session run no exit handler), and `--scratch-dir`
//! removes the directory holding the temporary mountpoint, cache and log after the
//! unmount. Each process is watched through a pidfd (Linux 5.3): unlike a parent-death
//! signal it follows a process, not the thread that started the daemon, and any number
//! of them.

use anyhow::{bail, Context};
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::process::{pidfd_open, Pid, PidfdFlags};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// The processes the daemon lives for, as pidfds; `given` is false without
/// `--exit-with-pid`, when the daemon lives until it is stopped.
pub struct Users {
    fds: Vec<OwnedFd>,
    given: bool,
}

impl Users {
    /// Opens a pidfd on each process: before mounting, so that one ending meanwhile is
    /// seen, and a pid reused later is not mistaken for it. A process gone already
    /// counts as exited.
    pub fn watch(pids: &[i32]) -> anyhow::Result<Users> {
        let mut fds = Vec::with_capacity(pids.len());
        for &pid in pids {
            let raw = Pid::from_raw(pid).context("--exit-with-pid: a pid is positive")?;
            match pidfd_open(raw, PidfdFlags::NONBLOCK) {
                Ok(fd) => fds.push(fd),
                Err(rustix::io::Errno::SRCH) => {
                    tracing::info!(pid, "--exit-with-pid: the process is gone already")
                }
                Err(error) => {
                    return Err(error).with_context(|| {
                        format!("--exit-with-pid {pid}: cannot watch the process (pidfd_open needs Linux 5.3)")
                    })
                }
            }
        }
        Ok(Users {
            fds,
            given: !pids.is_empty(),
        })
    }

    /// Resolves once every watched process has exited (at once if they all have);
    /// never when none was given. Runs inside a Tokio runtime.
    pub async fn all_exited(self) {
        if !self.given {
            return std::future::pending().await;
        }
        for fd in self.fds {
            // SAFETY: the AsyncFd owns the pidfd, so it stays open, the same process's,
            // for the registration's whole life.
            let registered = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) };
            // A pidfd polls readable once its process has exited.
            let exited = match registered {
                Ok(fd) => fd.readable().await.map(drop),
                Err(error) => Err(error.into()),
            };
            if let Err(error) = exited {
                // Serving on is the safe side: stopping would break a job still running.
                tracing::warn!(%error, "--exit-with-pid: cannot poll a pidfd; serving until stopped");
                return std::future::pending().await;
            }
        }
    }
}

/// A directory made for one mount (`--scratch-dir`), removed after its unmount.
pub struct Scratch(PathBuf);

impl Scratch {
    /// Takes `dir` as scratch if it is private to this user (mode 0700, as `mktemp -d`
    /// makes it) and holds no directory but the mountpoint and the cache: a slip such
    /// as `--scratch-dir ~` must not delete a home.
    pub fn check(dir: &Path, mountpoint: &Path, cache_dir: &Path) -> anyhow::Result<Scratch> {
        let refuse = |why: String| anyhow::anyhow!("--scratch-dir {}: {why}", dir.display());
        let meta = std::fs::metadata(dir).map_err(|error| refuse(error.to_string()))?;
        if !meta.is_dir()
            || meta.uid() != rustix::process::geteuid().as_raw()
            || meta.mode() & 0o077 != 0
        {
            return Err(refuse(
                "not a directory of this user's alone (mode 0700, as mktemp -d makes it)".into(),
            ));
        }
        let absolute = |path: &Path| std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
        let own = [absolute(mountpoint), absolute(cache_dir)];
        for entry in std::fs::read_dir(dir).map_err(|error| refuse(error.to_string()))? {
            let entry = entry?;
            let path = absolute(&entry.path());
            if entry.file_type()?.is_dir() && !own.contains(&path) {
                bail!(refuse(format!(
                    "it holds {}, which is neither the mountpoint nor the cache: give a \
                     directory made for this mount alone",
                    path.display()
                )));
            }
        }
        Ok(Scratch(dir.to_owned()))
    }

    /// Removes the directory and what it holds, never crossing into another
    /// filesystem.
    pub fn remove(self) {
        let dir = &self.0;
        let removed = std::fs::metadata(dir).and_then(|meta| remove_on_device(dir, meta.dev()));
        if let Err(error) = removed {
            tracing::warn!(dir = %dir.display(), %error, "--scratch-dir kept");
        }
    }
}

fn remove_on_device(dir: &Path, device: u64) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let meta = std::fs::symlink_metadata(&path)?;
        if !meta.is_dir() {
            std::fs::remove_file(&path)?;
        } else if meta.dev() == device {
            remove_on_device(&path, device)?;
        } else {
            return Err(std::io::Error::other(format!(
                "{} is another filesystem",
                path.display()
            )));
        }
    }
    std::fs::remove_dir(dir)
}
