//! Unmounting: as root with umount(2), otherwise through `fusermount3 -u`, the setuid
//! helper FUSE ships for unprivileged users.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use rustix::io::Errno;
use rustix::mount::UnmountFlags;

/// Why a mountpoint was not unmounted.
#[derive(Debug, thiserror::Error)]
pub enum UnmountError {
    /// umount(2) says EINVAL of a path that is no mount point.
    #[error("{0} is not mounted: nothing to unmount")]
    NotMounted(PathBuf),
    #[error(
        "{0} is busy: a process has files open or its working directory there; stop it, \
         or detach the mount now with `scdlfs unmount --lazy {0}` (it goes once they close)"
    )]
    Busy(PathBuf),
    #[error("cannot unmount {path}: {source}")]
    Failed { path: PathBuf, source: io::Error },
}

impl From<UnmountError> for io::Error {
    fn from(error: UnmountError) -> io::Error {
        io::Error::other(error)
    }
}

/// Unmounts `mountpoint`; `lazy` detaches it even while files are open (MNT_DETACH).
/// Works on a mount whose daemon is dead, too.
pub fn unmount(mountpoint: &Path, lazy: bool) -> Result<(), UnmountError> {
    let flags = if lazy {
        UnmountFlags::DETACH
    } else {
        UnmountFlags::empty()
    };
    let failed = |source| UnmountError::Failed {
        path: mountpoint.to_owned(),
        source,
    };
    match rustix::mount::unmount(mountpoint, flags) {
        Ok(()) => return Ok(()),
        Err(Errno::PERM) => {}
        Err(Errno::INVAL) => return Err(UnmountError::NotMounted(mountpoint.to_owned())),
        Err(Errno::BUSY) => return Err(UnmountError::Busy(mountpoint.to_owned())),
        Err(error) => return Err(failed(error.into())),
    }
    let mut command = Command::new("fusermount3");
    command.arg("-u");
    if lazy {
        command.arg("-z");
    }
    let output = command.arg(mountpoint).output().map_err(failed)?;
    if output.status.success() {
        Ok(())
    } else {
        Err(failed(io::Error::other(format!(
            "fusermount3 -u: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))))
    }
}
