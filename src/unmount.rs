//! Unmounting: as root with umount(2), otherwise through `fusermount3 -u`, the setuid
//! helper FUSE ships for unprivileged users.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;

/// Unmounts `mountpoint`; `lazy` detaches it even while files are open (MNT_DETACH).
/// Works on a mount whose daemon is dead, too.
pub fn unmount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
    let path = CString::new(mountpoint.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "mountpoint contains a NUL byte",
        )
    })?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: `path` is a valid NUL-terminated string for the duration of the call.
    if unsafe { libc::umount2(path.as_ptr(), flags) } == 0 {
        return Ok(());
    }
    let error = io::Error::last_os_error();
    if error.raw_os_error() != Some(libc::EPERM) {
        return Err(error);
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
