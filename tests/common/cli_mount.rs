//! `scdlfs mount` as a user runs it, in the foreground, for the tests of sources and
//! credentials: a clean environment (no AWS or Google settings of the machine, no
//! instance metadata), the daemon's standard error in a file, and the mount and the
//! daemon gone when the test ends, however it ends.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::process::{is_mount_point, scdlfs_command, wait_within, Cleanup};

/// `scdlfs mount SOURCE MNT --foreground ...`, its log in a file, unmounted on drop.
pub struct CliMount {
    // Declared first: unmounted and killed before the directory goes.
    _guard: Cleanup,
    pub dir: tempfile::TempDir,
}

impl CliMount {
    pub fn start(source: &str, extra: &[&str], env: &[(&str, &OsString)]) -> CliMount {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("mnt")).unwrap();
        let mut command = mount_command(source, dir.path(), extra, env);
        command.arg("--foreground");
        command.stderr(File::create(dir.path().join("log")).unwrap());
        let mnt = dir.path().join("mnt");
        let mut guard = Cleanup::unmounting(mnt.clone());
        let child = guard.spawn(&mut command);
        wait_within("the mount", Duration::from_secs(60), || {
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "scdlfs mount {source} exited ({status}) before mounting:\n{}",
                    std::fs::read_to_string(dir.path().join("log")).unwrap()
                );
            }
            is_mount_point(&mnt)
        });
        CliMount { _guard: guard, dir }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    /// What the daemon wrote to standard error so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap()
    }

    /// The daemon's figures, as `scdlfs status --json` reads them.
    pub fn status(&self) -> scdlfs::status::Status {
        let mut buf = vec![0u8; 1 << 20];
        let len = rustix::fs::getxattr(self.path(), scdlfs::status::STATUS_XATTR, &mut buf[..])
            .unwrap_or_else(|e| panic!("no status ({e}); the daemon's log:\n{}", self.log()));
        serde_json::from_slice(&buf[..len]).expect("the status is JSON")
    }

    /// The bytes of `name` under the mount; a failure shows the daemon's log.
    pub fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.path().join(name))
            .unwrap_or_else(|e| panic!("read {name}: {e}; the daemon's log:\n{}", self.log()))
    }
}

/// The mount command with a clean environment ([`scdlfs_command`]: no AWS or Google
/// settings of the machine, instance metadata off, no credentials files); `env` adds
/// the test's own; a 64 MiB cache unless `extra` sets `--cache-size`.
pub fn mount_command(
    source: &str,
    dir: &Path,
    extra: &[&str],
    env: &[(&str, &OsString)],
) -> Command {
    let mut command = scdlfs_command([OsStr::new("mount"), OsStr::new(source)]);
    command
        .arg(dir.join("mnt"))
        .arg("--cache-dir")
        .arg(dir.join("cache"));
    if !extra.contains(&"--cache-size") {
        command.args(["--cache-size", "64MiB"]);
    }
    command.args(extra).stdout(Stdio::null());
    for (key, value) in env {
        command.env(key, value);
    }
    command
}
