//! Whether a cache directory can be trusted: a mount serves the bytes it finds there as
//! the dataset's (checked against their CRCs, which whoever writes the files writes
//! too), so no other user may have planted the directory or be able to swap it away.
//! A root daemon given `--cache-dir` below a world-writable directory would otherwise
//! use one an attacker made, and an existing directory of someone else's would be
//! read and written as root.
//!
//! The rules: the directory belongs to this process's user and no group or other user
//! may write it; every directory the path passes through belongs to root or to this
//! user, and one that its group or other users may write carries the sticky bit (as
//! `/tmp` does: there nobody but its owner can rename or remove an entry). A
//! group-writable one was allowed, and let every member of the group rename the cache
//! away and put one of their own, with their own part files and CRCs, in its place
//! under a root daemon. A symbolic link on the way belongs to root or to this user too:
//! in a sticky directory its owner may replace it, and so point the path at a directory
//! of theirs (a link of another user's in `/tmp` was followed without a word). Its
//! target is walked under the same rules, every directory on the way, not only those
//! of the path as given and as resolved (a link whose target crossed a world-writable
//! directory was not seen).
//!
//! The walk goes one component at a time from `/`, each opened relative to the one
//! before without following links, and ends with the directory held open
//! ([`CheckedDir`]): the cache reaches everything under it relative to that descriptor,
//! so what it uses is the directory checked, whatever is renamed or planted on its path
//! afterwards.
//!
//! [`prepare`] is the one gate: `mount::assemble` passes every mount's cache directory
//! through it and hands the directory it holds to the cache (the CLI, the daemon's
//! re-exec, Python's `scdlfs.mount` and the tests all mount through there), and the
//! CLI once more before it writes its log file there.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags, Stat, CWD};

const GROUP_OR_OTHER_WRITE: u32 = 0o022;
const GROUP_WRITE: u32 = 0o020;
const STICKY: u32 = 0o1000;

/// Symbolic links one walk follows at most, as the kernel's own walk does (`ELOOP`).
const MAX_LINKS: usize = 40;

/// A cache directory that passed the check, held open.
#[derive(Debug)]
pub struct CheckedDir {
    path: PathBuf,
    fd: OwnedFd,
}

impl CheckedDir {
    /// The path it was given by: for messages only, never to reach it again.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Walks to `dir`, making (private to this user) the directories of it that do not
/// exist, checks it and every directory and link on the way, and holds it open. The
/// refusal says why.
pub fn prepare(dir: &Path) -> Result<CheckedDir, UntrustedCacheDir> {
    let me = rustix::process::geteuid().as_raw();
    let given = std::path::absolute(dir).map_err(|source| UntrustedCacheDir::CannotInspectDir {
        dir: dir.to_owned(),
        source,
    })?;
    let mut walk = Walk {
        dir,
        me,
        at: PathBuf::from("/"),
        current: open_root(dir)?,
        // The components still to walk, the next one last.
        pending: components(&given),
        links: 0,
    };
    while let Some(name) = walk.pending.pop() {
        walk.step(name)?;
    }
    walk.into_checked()
}

/// Where a walk is: `current` (the directory reached, not checked yet) is at `at`.
struct Walk<'a> {
    dir: &'a Path,
    me: u32,
    at: PathBuf,
    current: OwnedFd,
    pending: Vec<OsString>,
    links: usize,
}

impl Walk<'_> {
    /// Looks `name` up in the directory reached, which must pass as one above the cache.
    fn step(&mut self, name: OsString) -> Result<(), UntrustedCacheDir> {
        self.check_above()?;
        if name == ".." {
            self.current = self.open(
                &self.current,
                "..".as_ref(),
                OFlags::PATH | OFlags::DIRECTORY,
            )?;
            self.at.pop();
            return Ok(());
        }
        let path = self.at.join(&name);
        let next = match rustix::fs::openat(
            &self.current,
            name.as_os_str(),
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Err(rustix::io::Errno::NOENT) => {
                match rustix::fs::mkdirat(&self.current, name.as_os_str(), Mode::RWXU) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(error) => {
                        return Err(UntrustedCacheDir::CannotCreate {
                            dir: self.dir.to_owned(),
                            source: error.into(),
                        })
                    }
                }
                self.open(&self.current, &name, OFlags::PATH | OFlags::NOFOLLOW)?
            }
            opened => opened.map_err(|error| cannot_inspect(&path, error))?,
        };
        let stat = rustix::fs::fstat(&next).map_err(|error| cannot_inspect(&path, error))?;
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory => {
                self.current = next;
                self.at = path;
                Ok(())
            }
            FileType::Symlink if self.pending.is_empty() => {
                Err(UntrustedCacheDir::SymbolicLink(self.dir.to_owned()))
            }
            FileType::Symlink => self.follow(next, path, &stat),
            _ => Err(UntrustedCacheDir::NotADirectory {
                dir: self.dir.to_owned(),
                path,
            }),
        }
    }

    /// Goes on from the target of the link at `path` (opened as `link`), if it is
    /// root's or this user's.
    fn follow(
        &mut self,
        link: OwnedFd,
        path: PathBuf,
        stat: &Stat,
    ) -> Result<(), UntrustedCacheDir> {
        if stat.st_uid != 0 && stat.st_uid != self.me {
            return Err(UntrustedCacheDir::LinkOfAnother {
                dir: self.dir.to_owned(),
                link: path,
                owner: stat.st_uid,
            });
        }
        self.links += 1;
        if self.links > MAX_LINKS {
            return Err(UntrustedCacheDir::TooManyLinks(self.dir.to_owned()));
        }
        let target = rustix::fs::readlinkat(&link, "", Vec::new())
            .map_err(|error| cannot_inspect(&path, error))?;
        let target = Path::new(OsStr::from_bytes(target.as_bytes()));
        if target.is_absolute() {
            self.current = open_root(self.dir)?;
            self.at = PathBuf::from("/");
        }
        self.pending.extend(components(target));
        Ok(())
    }

    /// The directory reached passes as one above the cache: root's or this user's, and
    /// sticky if others may write it.
    fn check_above(&self) -> Result<(), UntrustedCacheDir> {
        let stat =
            rustix::fs::fstat(&self.current).map_err(|error| cannot_inspect(&self.at, error))?;
        let (dir, above, mode) = (self.dir.to_owned(), self.at.clone(), stat.st_mode & 0o7777);
        if stat.st_uid != 0 && stat.st_uid != self.me {
            return Err(UntrustedCacheDir::BelowAnothersDir {
                dir,
                above,
                owner: stat.st_uid,
            });
        }
        if mode & GROUP_OR_OTHER_WRITE != 0 && mode & STICKY == 0 {
            return Err(if mode & GROUP_OR_OTHER_WRITE == GROUP_WRITE {
                UntrustedCacheDir::BelowGroupWritableDir { dir, above, mode }
            } else {
                UntrustedCacheDir::BelowWorldWritableDir { dir, above, mode }
            });
        }
        Ok(())
    }

    /// The directory reached is the cache: this user's, and nobody else may write it.
    fn into_checked(self) -> Result<CheckedDir, UntrustedCacheDir> {
        let dir = self.dir.to_owned();
        let stat =
            rustix::fs::fstat(&self.current).map_err(|error| cannot_inspect(&self.at, error))?;
        if stat.st_uid != self.me {
            return Err(UntrustedCacheDir::OwnedByAnother {
                dir,
                owner: stat.st_uid,
                me: self.me,
            });
        }
        if stat.st_mode & GROUP_OR_OTHER_WRITE != 0 {
            return Err(UntrustedCacheDir::WritableByOthers {
                dir,
                mode: stat.st_mode & 0o7777,
            });
        }
        // The walk's descriptors only name a place; the cache lists and opens in it.
        let fd = self.open(
            &self.current,
            ".".as_ref(),
            OFlags::RDONLY | OFlags::DIRECTORY,
        )?;
        Ok(CheckedDir { path: dir, fd })
    }

    fn open(
        &self,
        at: &OwnedFd,
        name: &OsStr,
        flags: OFlags,
    ) -> Result<OwnedFd, UntrustedCacheDir> {
        rustix::fs::openat(at, name, flags | OFlags::CLOEXEC, Mode::empty())
            .map_err(|error| cannot_inspect(&self.at.join(name), error))
    }
}

fn open_root(dir: &Path) -> Result<OwnedFd, UntrustedCacheDir> {
    rustix::fs::openat(
        CWD,
        "/",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|error| UntrustedCacheDir::CannotInspectDir {
        dir: dir.to_owned(),
        source: error.into(),
    })
}

/// The names to walk in `path`, the first last (a stack); `.` and `/` walk nowhere.
fn components(path: &Path) -> Vec<OsString> {
    let mut names: Vec<OsString> = path
        .components()
        .filter_map(|component| match component {
            Component::Normal(name) => Some(name.to_owned()),
            Component::ParentDir => Some("..".into()),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect();
    names.reverse();
    names
}

fn cannot_inspect(path: &Path, error: rustix::io::Errno) -> UntrustedCacheDir {
    UntrustedCacheDir::CannotInspect {
        path: path.to_owned(),
        source: error.into(),
    }
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
        "cache directory {} is reached through the symbolic link {}, owned by uid {owner}: \
         its owner could point it at a directory of theirs; give a path without it",
        dir.display(),
        link.display()
    )]
    LinkOfAnother {
        dir: PathBuf,
        link: PathBuf,
        owner: u32,
    },
    #[error(
        "cache directory {}: more than {MAX_LINKS} symbolic links on the way (a loop?)",
        .0.display()
    )]
    TooManyLinks(PathBuf),
    #[error(
        "cache directory {}: {} is not a directory",
        dir.display(),
        path.display()
    )]
    NotADirectory { dir: PathBuf, path: PathBuf },
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
