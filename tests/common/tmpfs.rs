//! A small tmpfs, for a cache directory whose filesystem fills up.

use std::path::PathBuf;
use std::process::Command;

/// A tmpfs of `size` mounted on a new directory, unmounted when dropped. Private
/// (`mode=700`), as a mount requires of its cache directory: a tmpfs's root is
/// otherwise world-writable.
pub struct SmallTmpfs {
    dir: tempfile::TempDir,
}

impl SmallTmpfs {
    pub fn mount(size: &str) -> SmallTmpfs {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=700"),
                "tmpfs",
            ])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "mounting a tmpfs needs root");
        SmallTmpfs { dir }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().to_owned()
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}
