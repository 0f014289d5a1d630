//! A daemon started on a program's behalf (the Python package's mounts) ends with it
//! (`--exit-with-pid`, [`crate::users`]) and leaves nothing behind: `--scratch-dir`
//! removes the directory holding the temporary mountpoint, cache and log after the
//! unmount.

use anyhow::bail;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

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
