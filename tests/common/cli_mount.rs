//! `scdlfs mount` as a user runs it, in the foreground, for the tests of sources and
//! credentials: a clean environment (no AWS or Google settings of the machine, no
//! instance metadata), the daemon's standard error in a file, and the mount and the
//! daemon gone when the test ends, however it ends.

use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::process::{detach, dies_with_test, is_mount_point, SCDLFS};

/// `scdlfs mount SOURCE MNT --foreground ...`, its log in a file, unmounted on drop.
pub struct CliMount {
    pub dir: tempfile::TempDir,
    child: Child,
}

impl CliMount {
    pub fn start(source: &str, extra: &[&str], env: &[(&str, &OsString)]) -> CliMount {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("mnt")).unwrap();
        let mut command = mount_command(source, dir.path(), extra, env);
        command.arg("--foreground");
        command.stderr(File::create(dir.path().join("log")).unwrap());
        dies_with_test(&mut command);
        let mut child = command.spawn().expect("spawn scdlfs");
        let mnt = dir.path().join("mnt");
        let started = Instant::now();
        while !is_mount_point(&mnt) {
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "scdlfs mount {source} exited ({status}) before mounting:\n{}",
                    std::fs::read_to_string(dir.path().join("log")).unwrap()
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "not mounted after 60 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        CliMount { dir, child }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    /// What the daemon wrote to standard error so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap()
    }

    /// The bytes of `name` under the mount; a failure shows the daemon's log.
    pub fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.path().join(name))
            .unwrap_or_else(|e| panic!("read {name}: {e}; the daemon's log:\n{}", self.log()))
    }
}

impl Drop for CliMount {
    fn drop(&mut self) {
        detach(&self.path());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The mount command with a clean environment: no AWS or Google settings of the
/// machine leak in, and no cloud credential chain reaches a cloud (instance metadata
/// off, no credentials file); `env` adds the test's own.
pub fn mount_command(
    source: &str,
    dir: &Path,
    extra: &[&str],
    env: &[(&str, &OsString)],
) -> Command {
    let mut command = Command::new(SCDLFS);
    command
        .arg("mount")
        .arg(source)
        .arg(dir.join("mnt"))
        .arg("--cache-dir")
        .arg(dir.join("cache"))
        .args(["--cache-size", "64MiB"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
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
    for (key, value) in env {
        command.env(key, value);
    }
    command
}
