//! Helpers on a cache directory's plain files, for the cache's unit tests and the
//! integration tests (built with the test-support feature, never into the daemon):
//! what the directory holds, damage, and a small tmpfs for a cache directory whose
//! filesystem fills up.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Total bytes of the files directly in `dir` (a cache's part files); 0 if it is gone.
pub fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Flips one bit of the byte at `at` of the file at `path`, in place.
pub fn flip_bit(path: &Path, at: u64) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, at).unwrap();
    file.write_all_at(&[byte[0] ^ 0x10], at).unwrap();
}

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
