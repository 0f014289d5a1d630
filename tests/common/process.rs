//! The process side of the harness, shared by the tests that run the `scdlfs` binary
//! as users do (`cli`, `service`, `persistent_cache`, `sources`, `chunk`, `warm`): the
//! binary with a test's environment, the mount table, waits with a bound, and the guard
//! that leaves no mount and no daemon behind when a test fails halfway.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

pub const SCDLFS: &str = env!("CARGO_BIN_EXE_scdlfs");

/// How long a test waits for a daemon, a mount or a message before it fails.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// `scdlfs ARGS` as a test runs it: stdin closed, and none of this machine's AWS or
/// Google settings, so no cloud credential chain (profiles, credential files, instance
/// metadata) is consulted, and no RUST_LOG.
pub fn scdlfs_command<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> Command {
    let mut command = Command::new(SCDLFS);
    command.args(args).stdin(Stdio::null());
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("GOOGLE_") || key.starts_with("AWS_") || key == "RUST_LOG" {
            command.env_remove(&*key);
        }
    }
    command
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_CONFIG_FILE", "/nonexistent")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent");
    command
}

/// `scdlfs mount SOURCE MOUNTPOINT --foreground --cache-dir CACHE EXTRA...`, its output
/// discarded, dying with the test.
pub fn foreground_mount(source: &Path, mountpoint: &Path, cache: &Path, extra: &[&str]) -> Command {
    let mut command = scdlfs_command([OsStr::new("mount"), source.as_os_str()]);
    command
        .arg(mountpoint)
        .arg("--foreground")
        .arg("--cache-dir")
        .arg(cache)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    dies_with_test(&mut command);
    command
}

/// Runs `command` to its end, which must succeed (else the test fails with its stderr).
#[track_caller]
pub fn run_ok(command: &mut Command) -> Output {
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// What `scdlfs status --json MOUNTPOINT` says.
pub fn status_json(mountpoint: &Path) -> serde_json::Value {
    let output = run_ok(scdlfs_command(["status", "--json"]).arg(mountpoint));
    serde_json::from_slice(&output.stdout).unwrap()
}

/// `scdlfs unmount MOUNTPOINT`, which must succeed.
pub fn unmount(mountpoint: &Path) {
    run_ok(scdlfs_command(["unmount"]).arg(mountpoint));
}

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

/// Cleans up whatever a test left, even when it panics: lazily unmounts its
/// mountpoints, then kills the processes it started or found, and reaps them.
#[derive(Default)]
pub struct Cleanup {
    pub mountpoints: Vec<PathBuf>,
    pub pids: Vec<i32>,
    pub children: Vec<Child>,
}

impl Cleanup {
    pub fn unmounting(mountpoint: PathBuf) -> Cleanup {
        let mut cleanup = Cleanup::default();
        cleanup.mountpoints.push(mountpoint);
        cleanup
    }

    /// Starts `command`, to be killed when the guard goes; returns the child.
    pub fn spawn(&mut self, command: &mut Command) -> &mut Child {
        self.children.push(command.spawn().expect("spawn"));
        self.children.last_mut().unwrap()
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for mountpoint in &self.mountpoints {
            detach(mountpoint);
        }
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for &pid in &self.pids {
            // SAFETY: signalling and reaping a process this test started (a daemon
            // reparented to us); ECHILD/ESRCH when it is gone already.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
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
pub fn wait_for(what: &str, condition: impl FnMut() -> bool) {
    wait_within(what, PATIENCE, condition);
}

/// Polls `condition` until it holds; fails the test after `limit`.
pub fn wait_within(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < limit,
            "gave up waiting {limit:?} for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the mount at `mountpoint` answers, failing if `daemon` exits first.
pub fn wait_until_mounted(mountpoint: &Path, daemon: &mut Child) {
    wait_for("the mount to answer", || {
        if let Some(status) = daemon.try_wait().unwrap() {
            panic!("the daemon exited ({status}) before mounting");
        }
        is_mount_point(mountpoint) && std::fs::read_dir(mountpoint).is_ok()
    });
}

/// How `child` exits, within `limit`.
pub fn exit_of(child: &mut Child, what: &str, limit: Duration) -> ExitStatus {
    let mut status = None;
    wait_within(what, limit, || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    status.unwrap()
}
