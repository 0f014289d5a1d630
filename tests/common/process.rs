//! The process side of the harness, shared by the tests that run the `scdlfs` binary
//! as users do (`tests/cli.rs`, `tests/service.rs`): the binary, the mount table, and
//! the guards that leave no mount and no daemon behind when a test fails halfway.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub const SCDLFS: &str = env!("CARGO_BIN_EXE_scdlfs");

/// How long a test waits for a daemon, a mount or a message before it fails.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Whether `path` is listed in this process's mount table (a dead FUSE mount counts).
pub fn is_mount_point(path: &Path) -> bool {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    table
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(&*path.to_string_lossy()))
}

/// Lazily unmounts `path` if it is mounted (live or dead), without panicking: for
/// guards that run while a failed test unwinds.
pub fn detach(path: &Path) {
    if is_mount_point(path) {
        let _ = rustix::mount::unmount(path, rustix::mount::UnmountFlags::DETACH);
    }
}

/// Detaches whatever is mounted at the path when dropped.
pub struct Unmounting(pub PathBuf);

impl Drop for Unmounting {
    fn drop(&mut self) {
        detach(&self.0);
    }
}

/// Makes the process `command` starts die with the thread that starts it, so that a
/// test that panics or is killed leaves no daemon or server running.
pub fn dies_with_test(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl in the child before exec, async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// Polls `condition` until it holds; fails the test after [`PATIENCE`].
pub fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < PATIENCE, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
