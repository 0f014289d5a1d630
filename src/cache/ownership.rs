//! Who owns a cache directory: its files private to the daemon's user, an exclusive
//! lock held for the daemon's life, and the record of the source it belongs to, so that
//! a directory of another source or layout version is refused (or wiped on request).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use super::adopt::{self, SourceRecord};
use super::CacheOwner;

/// Options for the cache's own files: readable by the daemon's user only, and never
/// through a symbolic link planted in their place.
pub(super) fn private_file() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.mode(0o600).custom_flags(libc::O_NOFOLLOW);
    options
}

/// How long a mount waits for the cache directory's lock: a mount that just ended (a
/// restart, a remount) may take a moment to let its threads go.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// Takes an exclusive lock on `path` (created if missing) for as long as the file lives,
/// waiting at most [`LOCK_WAIT`] for another holder to let go.
pub(super) fn lock_exclusively(path: &Path) -> io::Result<File> {
    let lock = private_file()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    let started = Instant::now();
    // SAFETY: flock on a file descriptor we own; no memory is involved.
    while unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        if started.elapsed() >= LOCK_WAIT {
            return Err(io::Error::from(io::ErrorKind::WouldBlock));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(lock)
}

/// Refuses a `--cache-dir` that holds a cache of another layout version, or wipes it
/// with `reset` (unless a daemon still holds it). Removed without asking: the first
/// layout (`scdlfs-v1`), which the versions that wrote it emptied at every mount, and
/// the second (`scdlfs-cache-v2`) when it records `owner`'s source: this daemon's own
/// cache, whose files it could count only by sizing each.
pub(super) fn refuse_other_layouts(dir: &Path, ours: &Path, owner: &CacheOwner) -> io::Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    for entry in entries {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if path == ours || !adopt::is_layout_dir_name(name) {
            continue;
        }
        let removed_unasked = match name {
            adopt::FIRST_LAYOUT_DIR => Some(
                "removing the cache of an older scdlfs, which that version emptied at every mount",
            ),
            adopt::SECOND_LAYOUT_DIR if records_source_of(&path, owner) => Some(
                "removing this source's cache of an older scdlfs, whose part files this version \
                 could count only by sizing each: the cache starts cold",
            ),
            _ => None,
        };
        if !owner.reset && removed_unasked.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "cache directory {} holds a cache of another scdlfs version ({name}); \
                     mount with --cache-reset to wipe it, or give this mount another --cache-dir",
                    dir.display()
                ),
            ));
        }
        if path.join("lock").exists() {
            let _held = lock_exclusively(&path.join("lock")).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!("{} is in use by another scdlfs mount", path.display()),
                )
            })?;
        }
        match removed_unasked {
            Some(why) => tracing::warn!(path = %path.display(), "{why}"),
            None => {
                tracing::warn!(path = %path.display(), "--cache-reset: wiping the cache of another scdlfs version")
            }
        }
        fs::remove_dir_all(&path)?;
    }
    Ok(())
}

/// Whether the layout directory `layout_dir` records `owner`'s source and endpoint.
fn records_source_of(layout_dir: &Path, owner: &CacheOwner) -> bool {
    let ours = SourceRecord::of(&owner.source, owner.endpoint.as_deref());
    fs::read(layout_dir.join(adopt::SOURCE_RECORD))
        .ok()
        .and_then(|bytes| SourceRecord::decode(&bytes))
        .is_some_and(|record| (record.source, record.endpoint) == (ours.source, ours.endpoint))
}

/// Checks that the layout directory belongs to `owner`'s source (recording it in a
/// directory that holds no parts yet); a directory of another source is refused, or
/// wiped with `reset`.
pub(super) fn claim_for_source(
    dir: &Path,
    root: &Path,
    parts_dir: &Path,
    owner: &CacheOwner,
) -> io::Result<()> {
    let record_path = root.join(adopt::SOURCE_RECORD);
    let ours = SourceRecord::of(&owner.source, owner.endpoint.as_deref());
    let recorded = match fs::read(&record_path) {
        Ok(bytes) => Some(SourceRecord::decode(&bytes)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => None,
        Err(error) => return Err(error),
    };
    let has_parts = fs::read_dir(parts_dir)?.next().is_some();
    let foreign = match &recorded {
        Some(Some(record)) if *record == ours => return Ok(()),
        Some(Some(record)) => Some(format!("the source {record}")),
        Some(None) => Some("an unreadable source record".to_owned()),
        None if has_parts => Some("no source record".to_owned()),
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
        for entry in fs::read_dir(parts_dir)? {
            fs::remove_file(entry?.path())?;
        }
    }
    let tmp = root.join(format!("{}.tmp", adopt::SOURCE_RECORD));
    private_file()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?
        .write_all(&ours.encode())?;
    fs::rename(&tmp, &record_path)
}
