//! Whether a cache directory can be trusted: a mount serves the bytes it finds there as
//! the dataset's (checked against their CRCs, which whoever writes the files writes
//! too), so no other user may have planted the directory or be able to swap it away.
//! A root daemon given `--cache-dir` below a world-writable directory would otherwise
//! use one an attacker made, and an existing directory of someone else's would be
//! read and written as root.
//!
//! The rules: the directory belongs to this process's user and no group or other user
//! may write it; every directory above it belongs to root or to this user, and one
//! that its group or other users may write carries the sticky bit (as `/tmp` does:
//! there nobody but its owner can rename or remove an entry). A group-writable one was
//! allowed, and let every member of the group rename the cache away and put one of
//! their own, with their own part files and CRCs, in its place under a root daemon.
//!
//! [`prepare`] is the one gate: `mount::assemble` passes every mount's cache directory
//! through it before the cache opens it (the CLI, the daemon's re-exec, Python's
//! `scdlfs.mount` and the tests all mount through there), and the CLI once more before
//! it writes its log file there.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

const GROUP_OR_OTHER_WRITE: u32 = 0o022;
const GROUP_WRITE: u32 = 0o020;
const STICKY: u32 = 0o1000;

/// Makes `dir` (private to this user) if it does not exist, then [`check`]s it.
pub fn prepare(dir: &Path) -> Result<(), UntrustedCacheDir> {
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(dir)
        .map_err(|source| UntrustedCacheDir::CannotCreate {
            dir: dir.to_owned(),
            source,
        })?;
    check(dir)
}

/// Checks `dir` (which exists) and the directories above it; the refusal says why.
pub fn check(dir: &Path) -> Result<(), UntrustedCacheDir> {
    let me = rustix::process::geteuid().as_raw();
    let cannot_inspect = |source| UntrustedCacheDir::CannotInspectDir {
        dir: dir.to_owned(),
        source,
    };
    let meta = std::fs::symlink_metadata(dir).map_err(cannot_inspect)?;
    if meta.file_type().is_symlink() {
        return Err(UntrustedCacheDir::SymbolicLink(dir.to_owned()));
    }
    if meta.uid() != me {
        return Err(UntrustedCacheDir::OwnedByAnother {
            dir: dir.to_owned(),
            owner: meta.uid(),
            me,
        });
    }
    if meta.mode() & GROUP_OR_OTHER_WRITE != 0 {
        return Err(UntrustedCacheDir::WritableByOthers {
            dir: dir.to_owned(),
            mode: meta.mode() & 0o7777,
        });
    }
    // Both the path as given and as resolved: a symbolic link above the directory is
    // as safe as the directory holding the link.
    let given = std::path::absolute(dir).map_err(cannot_inspect)?;
    let resolved = dir.canonicalize().map_err(cannot_inspect)?;
    for above in given
        .ancestors()
        .skip(1)
        .chain(resolved.ancestors().skip(1))
    {
        let meta = std::fs::metadata(above).map_err(|source| UntrustedCacheDir::CannotInspect {
            path: above.to_owned(),
            source,
        })?;
        if meta.uid() != 0 && meta.uid() != me {
            return Err(UntrustedCacheDir::BelowAnothersDir {
                dir: dir.to_owned(),
                above: above.to_owned(),
                owner: meta.uid(),
            });
        }
        if meta.mode() & GROUP_OR_OTHER_WRITE != 0 && meta.mode() & STICKY == 0 {
            let (dir, above, mode) = (dir.to_owned(), above.to_owned(), meta.mode() & 0o7777);
            return Err(if mode & GROUP_OR_OTHER_WRITE == GROUP_WRITE {
                UntrustedCacheDir::BelowGroupWritableDir { dir, above, mode }
            } else {
                UntrustedCacheDir::BelowWorldWritableDir { dir, above, mode }
            });
        }
    }
    Ok(())
}

/// Why a cache directory is refused.
#[derive(Debug, thiserror::Error)]
pub enum UntrustedCacheDir {
    #[error("cannot create cache directory {}: {source}", dir.display())]
    CannotCreate { dir: PathBuf, source: io::Error },
    #[error("cannot inspect cache directory {}: {source}", dir.display())]
    CannotInspectDir { dir: PathBuf, source: io::Error },
    #[error("cannot inspect {}: {source}", path.display())]
    CannotInspect { path: PathBuf, source: io::Error },
    #[error("cache directory {} is a symbolic link; give the directory itself", .0.display())]
    SymbolicLink(PathBuf),
    #[error(
        "cache directory {} is owned by uid {owner}, not by this user (uid {me}): its owner \
         could plant the files it serves; use a directory of your own",
        dir.display()
    )]
    OwnedByAnother { dir: PathBuf, owner: u32, me: u32 },
    #[error(
        "cache directory {} is writable by other users (mode {mode:o}); chmod 700 it",
        dir.display()
    )]
    WritableByOthers { dir: PathBuf, mode: u32 },
    #[error(
        "cache directory {} is below {}, which is owned by uid {owner}: its owner could \
         replace the cache directory; use one below directories of root or your own",
        dir.display(),
        above.display()
    )]
    BelowAnothersDir {
        dir: PathBuf,
        above: PathBuf,
        owner: u32,
    },
    #[error(
        "cache directory {} is below {}, which is writable by every user (mode {mode:o}, not \
         sticky): anyone could replace the cache directory; use another place",
        dir.display(),
        above.display()
    )]
    BelowWorldWritableDir {
        dir: PathBuf,
        above: PathBuf,
        mode: u32,
    },
    #[error(
        "cache directory {} is below {}, which is writable by its group (mode {mode:o}, not \
         sticky): any member could replace the cache directory; use another place, or \
         chmod g-w or +t it",
        dir.display(),
        above.display()
    )]
    BelowGroupWritableDir {
        dir: PathBuf,
        above: PathBuf,
        mode: u32,
    },
}
