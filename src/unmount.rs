//! Unmounting: as root with umount(2), otherwise through `fusermount3 -u`, the setuid
//! helper FUSE ships for unprivileged users.

use std::io;
use std::path::Path;
use std::process::Command;

use rustix::io::Errno;
use rustix::mount::UnmountFlags;

/// Unmounts `mountpoint`; `lazy` detaches it even while files are open (MNT_DETACH).
/// Works on a mount whose daemon is dead, too.
pub fn unmount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
    let flags = if lazy {
        UnmountFlags::DETACH
    } else {
        UnmountFlags::empty()
    };
    match rustix::mount::unmount(mountpoint, flags) {
        Ok(()) => return Ok(()),
        Err(Errno::PERM) => {}
        Err(error) => return Err(error.into()),
    }
    let mut command = Command::new("fusermount3");
    command.arg("-u");
    if lazy {
        command.arg("-z");
    }
    let status = command.arg(mountpoint).status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "fusermount3 -u {} failed",
            mountpoint.display()
        )))
    }
}
