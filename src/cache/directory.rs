//! The cache's directories on disk, held open, and whose they are.
//!
//! Everything under the cache directory is reached relative to a descriptor, from the
//! one [`crate::cache_dir_check::prepare`] held after its check down to the layout
//! directory and its `parts`: each opened, created, renamed or deleted with
//! `openat`/`mkdirat`/`renameat`/`unlinkat` and never through a symbolic link. A link
//! planted in the place of the layout directory, its `parts` or a file of theirs is
//! refused or removed, never followed: opened by path, `DirBuilder` made `parts` in
//! the target of a link named as the layout directory before the mount refused it, and
//! a daemon whose directory was renamed and replaced after its check would have gone
//! on writing into the replacement.
//!
//! Whose the directory is: an exclusive lock held for the daemon's life, the record of
//! the source it belongs to ([`SourceRecord`]), so that a directory of another source
//! or layout version is refused (or wiped on request), and files private to the
//! daemon's user (0700 and 0600).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, FileType, FlockOperation, Mode, OFlags};

use super::adopt::{self, PartFileName, SourceRecord};
use crate::cache_dir_check::CheckedDir;

/// Whose cache a directory is, and what to do with one of another source or version.
#[derive(Clone, Debug)]
pub struct CacheOwner {
    /// The source as the mount names it; recorded in the directory.
    pub source: String,
    /// The store's custom endpoint, if any; recorded with the source.
    pub endpoint: Option<String>,
    /// Wipe a directory of another source or layout version instead of refusing it.
    pub reset: bool,
}

/// A directory of the cache, held open; its files are reached by name.
#[derive(Debug)]
pub(super) struct HeldDir {
    /// Where it was when opened: for messages only.
    shown: PathBuf,
    fd: OwnedFd,
}

/// How long a mount waits for the cache directory's lock: a mount that just ended (a
/// restart, a remount) may take a moment to let its threads go.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// The most bytes of a source record read: it is a few lines.
const MAX_RECORD_BYTES: u64 = 64 << 10;

/// How deep a directory the cache removes may be: the layouts hold files two levels
/// down; anything deeper was not written by scdlfs and is refused, not walked.
const MAX_REMOVED_DEPTH: usize = 4;

/// The layout directory of `dir` taken over for this mount.
pub(super) struct Claimed {
    pub parts: HeldDir,
    /// Held for the daemon's life: an exclusive lock on the layout directory.
    pub lock: File,
}

/// Takes over the layout directory under `dir` for `owner`'s source: other layouts
/// refused or removed ([`refuse_other_layouts`]), the layout directory and its `parts`
/// made private, locked against a second daemon, and recorded as the source's.
pub(super) fn claim(dir: &CheckedDir, owner: &CacheOwner) -> io::Result<Claimed> {
    let cache_dir = HeldDir {
        shown: dir.path().to_owned(),
        fd: dir.fd().try_clone_to_owned()?,
    };
    refuse_other_layouts(&cache_dir, owner)?;
    let layout = cache_dir.private_subdir(&adopt::layout_dir_name())?;
    let parts = layout.private_subdir("parts")?;
    let lock = layout.lock_exclusively("lock").map_err(|error| match error.kind() {
        io::ErrorKind::WouldBlock => io::Error::new(
            io::ErrorKind::WouldBlock,
            format!(
                "cache directory {} is in use by another scdlfs mount; give each mount its own --cache-dir",
                dir.path().display()
            ),
        ),
        _ => error,
    })?;
    claim_for_source(dir.path(), &layout, &parts, owner)?;
    Ok(Claimed { parts, lock })
}

impl HeldDir {
    /// Where `name` in this directory is: for messages.
    pub fn shown(&self, name: &str) -> PathBuf {
        self.shown.join(name)
    }

    /// Opens the file `name` for reading; a symbolic link there is refused (`ELOOP`).
    pub fn open_for_reading(&self, name: impl AsRef<OsStr>) -> io::Result<File> {
        self.open(name.as_ref(), OFlags::RDONLY, Mode::empty())
    }

    /// Creates the file `name` (0600) for reading and writing; one there already, or
    /// a link, is refused.
    pub fn create_new(&self, name: &str) -> io::Result<File> {
        self.open(
            name.as_ref(),
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL,
            Mode::RUSR | Mode::WUSR,
        )
    }

    pub fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        Ok(rustix::fs::renameat(&self.fd, from, &self.fd, to)?)
    }

    /// Deletes the file `name` (a link: the link itself).
    pub fn remove(&self, name: impl AsRef<OsStr>) -> io::Result<()> {
        Ok(rustix::fs::unlinkat(
            &self.fd,
            name.as_ref(),
            AtFlags::empty(),
        )?)
    }

    /// The directory's entries (not `.` and `..`), each with its type as the entry
    /// itself is (a link is a link).
    pub fn entries(&self) -> io::Result<Vec<(OsString, FileType)>> {
        let mut entries = Vec::new();
        for entry in rustix::fs::Dir::read_from(&self.fd)? {
            let entry = entry?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            let file_type = match entry.file_type() {
                // A filesystem that does not record the type in its entries.
                FileType::Unknown => FileType::from_raw_mode(
                    rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)?.st_mode,
                ),
                known => known,
            };
            entries.push((name.to_owned(), file_type));
        }
        Ok(entries)
    }

    /// Deletes the entry `name`, a directory with everything in it, without following
    /// a link anywhere.
    pub fn remove_all(&self, name: &OsStr, file_type: FileType) -> io::Result<()> {
        self.remove_all_within(name, file_type, MAX_REMOVED_DEPTH)
    }

    fn remove_all_within(&self, name: &OsStr, file_type: FileType, depth: usize) -> io::Result<()> {
        if file_type != FileType::Directory {
            return self.remove(name);
        }
        if depth == 0 {
            return Err(io::Error::other(format!(
                "{} is deeper than any cache scdlfs writes: not removed",
                self.shown.join(name).display()
            )));
        }
        let inner = self.subdir(name)?;
        for (entry, file_type) in inner.entries()? {
            inner.remove_all_within(&entry, file_type, depth - 1)?;
        }
        drop(inner);
        Ok(rustix::fs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR)?)
    }

    /// The directory `name`, made (0700) if missing and made private if not; refused
    /// if it is anything else, a link included.
    fn private_subdir(&self, name: &str) -> io::Result<HeldDir> {
        match rustix::fs::mkdirat(&self.fd, name, Mode::RWXU) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(error) => return Err(error.into()),
        }
        let dir = self
            .subdir(name.as_ref())
            .map_err(|error| match error.raw_os_error() {
                Some(libc::ELOOP | libc::ENOTDIR) => io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{} is not a directory (a symbolic link?); scdlfs refuses to cache there",
                        self.shown(name).display()
                    ),
                ),
                _ => error,
            })?;
        rustix::fs::fchmod(&dir.fd, Mode::RWXU)?;
        Ok(dir)
    }

    /// The existing directory `name`, not through a link.
    fn subdir(&self, name: &OsStr) -> io::Result<HeldDir> {
        Ok(HeldDir {
            shown: self.shown.join(name),
            fd: rustix::fs::openat(
                &self.fd,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?,
        })
    }

    /// The bytes of the file `name`, at most [`MAX_RECORD_BYTES`]; `None` if missing.
    fn read_small(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        let file = match self.open_for_reading(name) {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error),
        };
        let mut bytes = Vec::new();
        file.take(MAX_RECORD_BYTES).read_to_end(&mut bytes)?;
        Ok(Some(bytes))
    }

    /// Writes `bytes` as the file `name`, whole or not at all (a temporary renamed
    /// into place, which replaces a link there rather than writing through it).
    fn replace(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let tmp = format!("{name}.tmp");
        match self.remove(&tmp) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
        self.create_new(&tmp)?.write_all(bytes)?;
        self.rename(&tmp, name)
    }

    /// Takes an exclusive lock on the file `name` (created if missing) for as long as
    /// the file lives, waiting at most [`LOCK_WAIT`] for another holder to let go.
    fn lock_exclusively(&self, name: &str) -> io::Result<File> {
        let lock = self.open(
            name.as_ref(),
            OFlags::WRONLY | OFlags::CREATE,
            Mode::RUSR | Mode::WUSR,
        )?;
        let started = Instant::now();
        while rustix::fs::flock(&lock, FlockOperation::NonBlockingLockExclusive).is_err() {
            if started.elapsed() >= LOCK_WAIT {
                return Err(io::Error::from(io::ErrorKind::WouldBlock));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(lock)
    }

    fn open(&self, name: &OsStr, flags: OFlags, mode: Mode) -> io::Result<File> {
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            mode,
        )?;
        Ok(File::from(fd))
    }
}

/// A part file found at open, before its header has been read.
#[derive(Debug, PartialEq, Eq)]
pub struct Found {
    pub file: String,
    pub name: PartFileName,
}

/// What [`scan`] found: the part files, oldest first, and the first free file number.
#[derive(Debug, Default)]
pub struct Scan {
    pub parts: Vec<Found>,
    pub next_file: u64,
    /// Files removed: temporaries of writes a crash cut short, and names no daemon writes.
    pub removed: u64,
}

/// Lists the parts directory without opening or sizing its files: the part files,
/// oldest first. Anything else (a temporary of a write cut short, a foreign name, a
/// link, a name declaring more than `max_len` bytes, which no cache of that budget
/// holds) is removed.
pub(super) fn scan(parts: &HeldDir, max_len: u64) -> io::Result<Scan> {
    let mut scan = Scan::default();
    for (file, file_type) in parts.entries()? {
        let name = file.to_str().and_then(PartFileName::parse);
        match name {
            Some(name) if file_type == FileType::RegularFile && name.len <= max_len => {
                scan.next_file = scan.next_file.max(name.seq + 1);
                scan.parts.push(Found {
                    file: name.to_string(),
                    name,
                });
            }
            _ => {
                scan.removed += 1;
                parts.remove_all(&file, file_type)?;
            }
        }
    }
    scan.parts.sort_by_key(|found| found.name.seq);
    Ok(scan)
}

/// Refuses a cache directory that holds a cache of another layout version, or wipes it
/// with `reset` (unless a daemon still holds it). Removed without asking: the first
/// layout (`scdlfs-v1`), which the versions that wrote it emptied at every mount, and
/// the second (`scdlfs-cache-v2`) when it records `owner`'s source: this daemon's own
/// cache, whose files it could count only by sizing each.
fn refuse_other_layouts(dir: &HeldDir, owner: &CacheOwner) -> io::Result<()> {
    let ours = adopt::layout_dir_name();
    for (entry, file_type) in dir.entries()? {
        let Some(name) = entry.to_str() else { continue };
        if name == ours || !adopt::is_layout_dir_name(name) {
            continue;
        }
        let shown = dir.shown(name);
        // A link or a file by a layout's name was not written by scdlfs.
        let layout = match file_type {
            FileType::Directory => Some(dir.subdir(&entry)?),
            _ => None,
        };
        let removed_unasked = match name {
            adopt::FIRST_LAYOUT_DIR => Some(
                "removing the cache of an older scdlfs, which that version emptied at every mount",
            ),
            adopt::SECOND_LAYOUT_DIR
                if layout.as_ref().is_some_and(|l| records_source_of(l, owner)) =>
            {
                Some(
                    "removing this source's cache of an older scdlfs, whose part files this \
                     version could count only by sizing each: the cache starts cold",
                )
            }
            _ => None,
        };
        if !owner.reset && removed_unasked.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "cache directory {} holds a cache of another scdlfs version ({name}); \
                     mount with --cache-reset to wipe it, or give this mount another --cache-dir",
                    dir.shown.display()
                ),
            ));
        }
        // A lock file there: wait for its daemon as a mount of that layout would.
        if let Some(layout) = layout.filter(|l| l.open_for_reading("lock").is_ok()) {
            layout.lock_exclusively("lock").map_err(|_| {
                io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!("{} is in use by another scdlfs mount", shown.display()),
                )
            })?;
        }
        match removed_unasked {
            Some(why) => tracing::warn!(path = %shown.display(), "{why}"),
            None => {
                tracing::warn!(path = %shown.display(), "--cache-reset: wiping the cache of another scdlfs version")
            }
        }
        dir.remove_all(&entry, file_type)?;
    }
    Ok(())
}

/// Whether the layout directory records `owner`'s source and endpoint.
fn records_source_of(layout: &HeldDir, owner: &CacheOwner) -> bool {
    let ours = SourceRecord::of(&owner.source, owner.endpoint.as_deref());
    layout
        .read_small(adopt::SOURCE_RECORD)
        .ok()
        .flatten()
        .and_then(|bytes| SourceRecord::decode(&bytes))
        .is_some_and(|record| (record.source, record.endpoint) == (ours.source, ours.endpoint))
}

/// Checks that the layout directory belongs to `owner`'s source (recording it in a
/// directory that holds no parts yet); a directory of another source is refused, or
/// wiped with `reset`.
fn claim_for_source(
    dir: &Path,
    layout: &HeldDir,
    parts: &HeldDir,
    owner: &CacheOwner,
) -> io::Result<()> {
    let ours = SourceRecord::of(&owner.source, owner.endpoint.as_deref());
    // A link in the record's place reads as no record it could follow: unreadable.
    let recorded = match layout.read_small(adopt::SOURCE_RECORD) {
        Ok(bytes) => bytes.map(|bytes| SourceRecord::decode(&bytes)),
        Err(error) if error.raw_os_error() == Some(libc::ELOOP) => Some(None),
        Err(error) => return Err(error),
    };
    let entries = parts.entries()?;
    let foreign = match &recorded {
        Some(Some(record)) if *record == ours => return Ok(()),
        Some(Some(record)) => Some(format!("the source {record}")),
        Some(None) => Some("an unreadable source record".to_owned()),
        None if !entries.is_empty() => Some("no source record".to_owned()),
        None => None,
    };
    if let Some(foreign) = foreign {
        if !owner.reset {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "cache directory {} belongs to {foreign}, not {ours}; give this mount its \
                     own --cache-dir, or mount with --cache-reset to wipe it",
                    dir.display(),
                ),
            ));
        }
        tracing::warn!(dir = %dir.display(), "--cache-reset: wiping a cache of {foreign}");
        for (entry, file_type) in entries {
            parts.remove_all(&entry, file_type)?;
        }
    }
    layout.replace(adopt::SOURCE_RECORD, &ours.encode())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn held(dir: &Path) -> HeldDir {
        HeldDir {
            shown: dir.to_owned(),
            fd: File::open(dir).unwrap().into(),
        }
    }

    fn name(seq: u64, len: u64) -> String {
        PartFileName {
            seq,
            part: seq * 7,
            len,
        }
        .to_string()
    }

    #[test]
    fn a_scan_lists_parts_oldest_first_without_sizing_them_and_removes_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        // Names declare 10 and 20 bytes; the files' real lengths are not looked at.
        fs::write(dir.path().join(name(0xa, 10)), b"x").unwrap();
        fs::write(dir.path().join(name(2, 20)), b"").unwrap();
        fs::write(dir.path().join(format!("{}.tmp", name(0xb, 4))), b"torn").unwrap();
        fs::write(
            dir.path().join(name(3, 1001)),
            b"more than any cache of 1000 bytes holds",
        )
        .unwrap();
        fs::write(dir.path().join("notes"), b"?").unwrap();
        fs::create_dir(dir.path().join(name(4, 10))).unwrap();
        fs::write(outside.path().join("kept"), b"not the cache's").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join(name(5, 10))).unwrap();
        let scan = scan(&held(dir.path()), 1000).unwrap();
        let found: Vec<_> = scan
            .parts
            .iter()
            .map(|f| (f.name.seq, f.name.len))
            .collect();
        assert_eq!(found, [(2, 20), (0xa, 10)]);
        assert_eq!((scan.next_file, scan.removed), (11, 5));
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
        assert_eq!(
            fs::read(outside.path().join("kept")).unwrap(),
            b"not the cache's",
            "the link was removed, not what it points to"
        );
    }
}
