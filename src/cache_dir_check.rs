//! Whether a cache directory can be trusted: a mount serves the bytes it finds there as
//! the dataset's (checked against their CRCs, which whoever writes the files writes
//! too), so no other user may have planted the directory or be able to swap it away.
//! A root daemon given `--cache-dir` below a world-writable directory would otherwise
//! use one an attacker made, and an existing directory of someone else's would be
//! read and written as root.
//!
//! The rules: the directory belongs to this process's user and no group or other user
//! may write it; every directory above it belongs to root or to this user, and one
//! that other users may write carries the sticky bit (as `/tmp` does: there nobody
//! but its owner can rename or remove an entry). Group-writable directories above it
//! are allowed: a user's own group is commonly such.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

const GROUP_OR_OTHER_WRITE: u32 = 0o022;
const OTHER_WRITE: u32 = 0o002;
const STICKY: u32 = 0o1000;

/// Checks `dir` (which exists) and the directories above it; the refusal says why.
pub fn check(dir: &Path) -> Result<(), String> {
    let me = rustix::process::geteuid().as_raw();
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|error| format!("cannot inspect cache directory {}: {error}", dir.display()))?;
    if meta.file_type().is_symlink() {
        return Err(format!(
            "cache directory {} is a symbolic link; give the directory itself",
            dir.display()
        ));
    }
    if meta.uid() != me {
        return Err(format!(
            "cache directory {} is owned by uid {}, not by this user (uid {me}): its owner \
             could plant the files it serves; use a directory of your own",
            dir.display(),
            meta.uid()
        ));
    }
    if meta.mode() & GROUP_OR_OTHER_WRITE != 0 {
        return Err(format!(
            "cache directory {} is writable by other users (mode {:o}); chmod 700 it",
            dir.display(),
            meta.mode() & 0o7777
        ));
    }
    // Both the path as given and as resolved: a symbolic link above the directory is
    // as safe as the directory holding the link.
    let given = std::path::absolute(dir).map_err(|error| error.to_string())?;
    let resolved = dir.canonicalize().map_err(|error| error.to_string())?;
    for above in given
        .ancestors()
        .skip(1)
        .chain(resolved.ancestors().skip(1))
    {
        let meta = std::fs::metadata(above)
            .map_err(|error| format!("cannot inspect {}: {error}", above.display()))?;
        if meta.uid() != 0 && meta.uid() != me {
            return Err(format!(
                "cache directory {} is below {}, which is owned by uid {}: its owner could \
                 replace the cache directory; use one below directories of root or your own",
                dir.display(),
                above.display(),
                meta.uid()
            ));
        }
        if meta.mode() & OTHER_WRITE != 0 && meta.mode() & STICKY == 0 {
            return Err(format!(
                "cache directory {} is below {}, which is writable by every user (mode {:o}, not \
                 sticky): anyone could replace the cache directory; use another place",
                dir.display(),
                above.display(),
                meta.mode() & 0o7777
            ));
        }
    }
    Ok(())
}
