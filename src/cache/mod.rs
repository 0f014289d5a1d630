//! The local disk cache: parts of objects kept as files under a byte budget.
//!
//! [`policy`] keeps the books (resident parts, reservations, pins, LRU units) without
//! touching the disk; [`part_file`] is the versioned on-disk format of one part. This
//! module joins them: a part is written to a temporary name and renamed into place
//! only after its bytes were reserved and the evicted parts' files were deleted, so the
//! cache directory never holds more than the budget. Readers get a [`PinnedPart`],
//! which keeps the part resident until it is dropped.
//!
//! A cache directory that cannot be written (full, removed, read-only) turns caching
//! off with one log line and a flag in `status`; downloads are then served from memory,
//! and one insert tries the disk again every [`DISK_RETRY_AFTER`]. The directory and
//! its files are private to the daemon's user (0700 and 0600), and are opened without
//! following symbolic links.
//!
//! No byte leaves the cache unchecked: every read checks the CRC32C of each block it
//! touches (kept in memory since the part was written) against what the disk returned.
//! A part that fails is dropped from the cache at once, logged and counted, and the
//! read fails with [`CacheError::Corrupt`], which the read path answers by fetching the
//! part again.
//!
//! The cache knows objects and parts, never SCDL: grouping parts into units is the
//! caller's decision, and eviction advice comes from an [`EvictionAdvisor`].

pub mod part_file;
pub mod policy;

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::parts::{span, spans_touched, GroupId, PartKey};
use part_file::PartHeader;
pub use policy::{EvictionAdvisor, NextUse, Policy, Unit};

/// The subdirectory of `--cache-dir` that this format version owns.
const VERSION_DIR: &str = "scdlfs-v1";

/// How long caching stays off after a failed write before one insert tries again.
pub const DISK_RETRY_AFTER: Duration = Duration::from_secs(60);

/// Whether the cache directory can be written, and since when it cannot.
#[derive(Debug, Default)]
struct DiskState {
    unusable_since: Option<Instant>,
    reason: Option<String>,
}

#[derive(Debug)]
struct ResidentFile {
    file: File,
    /// Where the data starts in the file: the header's length.
    data_offset: u64,
    data_len: u64,
    block_len: u32,
    block_crc32c: Box<[u32]>,
}

/// Where a part's bytes came from: what its file's header records.
#[derive(Clone, Copy, Debug)]
pub struct PartOrigin<'a> {
    pub key: &'a str,
    pub etag: &'a str,
    pub object_offset: u64,
}

/// Why bytes could not be read from the cache.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cached part {part:?} failed its checksum in block {block}; dropped from the cache")]
    Corrupt { part: PartKey, block: u64 },
    #[error("reading a cached part failed: {0}")]
    Io(#[from] io::Error),
}

struct Inner {
    policy: Policy,
    files: HashMap<PartKey, (Arc<ResidentFile>, PathBuf)>,
}

/// Figures for `scdlfs status`.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct CacheStats {
    pub budget_bytes: u64,
    pub cached_bytes: u64,
    pub reserved_bytes: u64,
    pub cached_parts: usize,
    pub cached_groups: usize,
    pub evicted_parts: u64,
    pub parts_not_cached_for_lack_of_room: u64,
    /// Parts that failed their checksum on a read and were dropped.
    #[serde(default)]
    pub corrupt_parts_dropped: u64,
    /// Why the cache directory cannot be written, while it cannot.
    #[serde(default)]
    pub disk_unusable: Option<String>,
    /// Downloaded parts served without being cached because the disk failed.
    #[serde(default)]
    pub parts_not_cached_for_disk_errors: u64,
}

pub struct DiskCache {
    parts_dir: PathBuf,
    inner: Mutex<Inner>,
    advisor: RwLock<Option<Arc<dyn EvictionAdvisor>>>,
    next_file: AtomicU64,
    evicted_parts: AtomicU64,
    refused_for_room: AtomicU64,
    corrupt_dropped: AtomicU64,
    disk: Mutex<DiskState>,
    disk_retry_after: Duration,
    refused_for_disk: AtomicU64,
    /// Held for the daemon's life: an exclusive lock on the cache directory.
    _lock: File,
    /// Lets a test act at the moments the directory grows or shrinks.
    #[cfg(test)]
    test_hook: Mutex<Option<StepHook>>,
}

#[cfg(test)]
type StepHook = Arc<dyn Fn(Step) + Send + Sync>;

/// The moments of an insert a test can act at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// A new part file has all its bytes on disk (under its temporary name).
    Written,
    /// A part file is about to be deleted.
    Deleting,
}

impl DiskCache {
    /// Opens the cache under `dir`, taking an exclusive lock on it. Parts left by an
    /// earlier daemon are removed: this version starts every mount cold.
    pub fn open(dir: &Path, budget_bytes: u64, max_groups: Option<usize>) -> io::Result<DiskCache> {
        let root = dir.join(VERSION_DIR);
        let parts_dir = root.join("parts");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&parts_dir)?;
        for owned in [&root, &parts_dir] {
            if !fs::symlink_metadata(owned)?.is_dir() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{} is not a directory (a symbolic link?); scdlfs refuses to cache there",
                        owned.display()
                    ),
                ));
            }
            fs::set_permissions(owned, fs::Permissions::from_mode(0o700))?;
        }
        let lock = private_file()
            .create(true)
            .truncate(false)
            .write(true)
            .open(root.join("lock"))?;
        // SAFETY: flock on a file descriptor we own; no memory is involved.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "cache directory {} is in use by another scdlfs mount; give each mount its own --cache-dir",
                    dir.display()
                ),
            ));
        }
        for entry in fs::read_dir(&parts_dir)? {
            fs::remove_file(entry?.path())?;
        }
        Ok(DiskCache {
            parts_dir,
            inner: Mutex::new(Inner {
                policy: Policy::new(budget_bytes, max_groups),
                files: HashMap::new(),
            }),
            advisor: RwLock::new(None),
            next_file: AtomicU64::new(0),
            evicted_parts: AtomicU64::new(0),
            refused_for_room: AtomicU64::new(0),
            corrupt_dropped: AtomicU64::new(0),
            disk: Mutex::new(DiskState::default()),
            disk_retry_after: DISK_RETRY_AFTER,
            refused_for_disk: AtomicU64::new(0),
            _lock: lock,
            #[cfg(test)]
            test_hook: Mutex::new(None),
        })
    }

    /// The directory whose files the budget bounds.
    #[cfg(test)]
    fn parts_dir(&self) -> &Path {
        &self.parts_dir
    }

    pub fn set_advisor(&self, advisor: Option<Arc<dyn EvictionAdvisor>>) {
        *self.advisor.write() = advisor;
    }

    pub fn contains(&self, key: PartKey) -> bool {
        self.inner.lock().policy.contains(key)
    }

    /// The part, pinned while the returned handle lives, if it is resident.
    pub fn get(self: &Arc<Self>, key: PartKey) -> Option<PinnedPart> {
        let mut inner = self.inner.lock();
        if !inner.policy.pin(key) {
            return None;
        }
        let file = inner.files[&key].0.clone();
        Some(PinnedPart {
            cache: self.clone(),
            key,
            file,
        })
    }

    /// Stores a downloaded part. Blocking file I/O: call from a blocking context.
    /// Returns `Ok(false)` when the part cannot be cached because pinned or protected
    /// data fills the budget; the caller still has the bytes to serve.
    pub fn insert(
        &self,
        key: PartKey,
        group: Option<GroupId>,
        origin: PartOrigin,
        data: &[u8],
    ) -> bool {
        if !PartHeader::fits(origin.key, origin.etag) {
            return false;
        }
        if !self.disk_usable() {
            self.refused_for_disk.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let header = PartHeader::of(origin.key, origin.etag, origin.object_offset, data);
        let encoded = header.encode();
        let disk_bytes = (encoded.len() + data.len()) as u64;
        let advisor = self.advisor.read().clone();
        // The books credit freed bytes as soon as they are told; so every file whose
        // bytes they credit is deleted before the lock is released, or another insert
        // could write into room that is still taken on disk.
        let reservation = {
            let mut inner = self.inner.lock();
            if inner.policy.contains(key) {
                return true;
            }
            let (reservation, victims) =
                inner
                    .policy
                    .reserve(disk_bytes, Unit::of(key, group), advisor.as_deref());
            let victims = self.forget_files(&mut inner, victims);
            self.delete_files(victims);
            reservation
        };
        let Some(reservation) = reservation else {
            self.refused_for_room.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        let written = self.write_part_file(&encoded, data);
        self.step(Step::Written);
        let mut inner = self.inner.lock();
        let (file, path) = match written {
            Ok(written) => written,
            Err(error) => {
                inner.policy.cancel(reservation);
                drop(inner);
                self.disk_failed(&error);
                self.refused_for_disk.fetch_add(1, Ordering::Relaxed);
                return false;
            }
        };
        self.disk_ok();
        if inner.policy.contains(key) {
            // Another download of the same part landed first.
            self.delete_files(vec![path]);
            inner.policy.cancel(reservation);
            return true;
        }
        let committed = inner.policy.commit(reservation, key, group);
        debug_assert!(committed, "checked under the same lock");
        inner.files.insert(
            key,
            (
                Arc::new(ResidentFile {
                    file,
                    data_offset: encoded.len() as u64,
                    data_len: header.data_len,
                    block_len: header.block_len,
                    block_crc32c: header.block_crc32c.into(),
                }),
                path,
            ),
        );
        true
    }

    /// Whether an insert may write: always while the disk works; after a failure,
    /// one insert per [`DISK_RETRY_AFTER`].
    fn disk_usable(&self) -> bool {
        let mut disk = self.disk.lock();
        match disk.unusable_since {
            None => true,
            Some(since) if since.elapsed() >= self.disk_retry_after => {
                disk.unusable_since = Some(Instant::now());
                true
            }
            Some(_) => false,
        }
    }

    fn disk_failed(&self, error: &io::Error) {
        let mut disk = self.disk.lock();
        if disk.reason.is_none() {
            tracing::error!(dir = %self.parts_dir.display(), %error, retry_seconds = self.disk_retry_after.as_secs(), "the cache directory cannot be written: serving parts from the store without caching them");
        }
        disk.unusable_since = Some(Instant::now());
        disk.reason = Some(error.to_string());
    }

    fn disk_ok(&self) {
        let mut disk = self.disk.lock();
        if disk.reason.take().is_some() {
            tracing::info!(dir = %self.parts_dir.display(), "the cache directory can be written again: caching resumes");
        }
        disk.unusable_since = None;
    }

    #[cfg(test)]
    fn step(&self, step: Step) {
        let hook = self.test_hook.lock().clone();
        if let Some(hook) = hook {
            hook(step);
        }
    }

    #[cfg(not(test))]
    fn step(&self, _: Step) {}

    fn forget_files(&self, inner: &mut Inner, victims: Vec<PartKey>) -> Vec<PathBuf> {
        self.evicted_parts
            .fetch_add(victims.len() as u64, Ordering::Relaxed);
        victims
            .into_iter()
            .filter_map(|key| inner.files.remove(&key).map(|(_, path)| path))
            .collect()
    }

    /// Deletes part files; called with the books' lock held, before their bytes are
    /// credited or right after, so that the room they free is free on disk too.
    fn delete_files(&self, paths: Vec<PathBuf>) {
        for path in paths {
            self.step(Step::Deleting);
            match fs::remove_file(&path) {
                // A file already gone (a removed cache directory) is what deleting wanted.
                Err(error) if error.kind() != io::ErrorKind::NotFound => {
                    tracing::warn!(path = %path.display(), %error, "could not delete a cache file");
                }
                _ => {}
            }
        }
    }

    fn write_part_file(&self, header: &[u8], data: &[u8]) -> io::Result<(File, PathBuf)> {
        let id = self.next_file.fetch_add(1, Ordering::Relaxed);
        let path = self.parts_dir.join(format!("{id:016x}.part"));
        let tmp = self.parts_dir.join(format!("{id:016x}.part.tmp"));
        let result = (|| {
            let mut file = private_file().write(true).create_new(true).open(&tmp)?;
            file.write_all(header)?;
            file.write_all(data)?;
            fs::rename(&tmp, &path)?;
            private_file().read(true).open(&path)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
            let _ = fs::remove_file(&path);
        }
        Ok((result?, path))
    }

    pub fn stats(&self) -> CacheStats {
        let inner = self.inner.lock();
        CacheStats {
            budget_bytes: inner.policy.budget_bytes(),
            cached_bytes: inner.policy.used_bytes(),
            reserved_bytes: inner.policy.reserved_bytes(),
            cached_parts: inner.policy.resident_parts(),
            cached_groups: inner.policy.resident_groups(),
            evicted_parts: self.evicted_parts.load(Ordering::Relaxed),
            parts_not_cached_for_lack_of_room: self.refused_for_room.load(Ordering::Relaxed),
            corrupt_parts_dropped: self.corrupt_dropped.load(Ordering::Relaxed),
            disk_unusable: self.disk.lock().reason.clone(),
            parts_not_cached_for_disk_errors: self.refused_for_disk.load(Ordering::Relaxed),
        }
    }

    /// Drops a part whose bytes failed their checksum, unless an earlier read dropped
    /// it already (then the part may have been fetched again: a new file).
    fn drop_corrupt(&self, key: PartKey, file: &Arc<ResidentFile>, block: u64) {
        let mut inner = self.inner.lock();
        let Some((resident, _)) = inner.files.get(&key) else {
            return;
        };
        if !Arc::ptr_eq(resident, file) {
            return;
        }
        let (_, path) = inner.files.remove(&key).expect("present");
        inner.policy.discard(key);
        self.delete_files(vec![path.clone()]);
        drop(inner);
        self.corrupt_dropped.fetch_add(1, Ordering::Relaxed);
        tracing::error!(path = %path.display(), part = ?key, block, "a cached part failed its checksum: dropped, and fetched again when read");
    }
}

/// Options for the cache's own files: readable by the daemon's user only, and never
/// through a symbolic link planted in their place.
fn private_file() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.mode(0o600).custom_flags(libc::O_NOFOLLOW);
    options
}

thread_local! {
    /// Where a read puts the blocks it covers only in part, to check them whole.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A resident part, kept from eviction while this handle lives.
pub struct PinnedPart {
    cache: Arc<DiskCache>,
    key: PartKey,
    file: Arc<ResidentFile>,
}

impl PinnedPart {
    pub fn len(&self) -> u64 {
        self.file.data_len
    }

    pub fn is_empty(&self) -> bool {
        self.file.data_len == 0
    }

    /// Fills `buf` from `offset` within the part's data, checking every block it
    /// touches. Blocks the request covers whole are read straight into `buf`; the
    /// (at most two) blocks it covers in part are read whole into a scratch buffer.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<(), CacheError> {
        if buf.is_empty() {
            return Ok(());
        }
        let file = &*self.file;
        let range = offset..offset + buf.len() as u64;
        assert!(range.end <= file.data_len, "read past the part's end");
        let block_len = file.block_len as u64;
        let block_range = |block: u64| span(block, block_len, file.data_len);
        let blocks = spans_touched(&range, block_len);
        let covered = |block: u64| {
            let bytes = block_range(block);
            range.start <= bytes.start && bytes.end <= range.end
        };
        let whole_start = blocks.start + u64::from(!covered(blocks.start));
        let whole_end =
            blocks.end - u64::from(blocks.end > whole_start && !covered(blocks.end - 1));
        if whole_start < whole_end {
            let bytes = block_range(whole_start).start..block_range(whole_end - 1).end;
            let dest = &mut buf[(bytes.start - offset) as usize..(bytes.end - offset) as usize];
            file.file
                .read_exact_at(dest, file.data_offset + bytes.start)?;
            for (i, block) in dest.chunks(block_len as usize).enumerate() {
                self.check(whole_start + i as u64, block)?;
            }
        }
        for block in blocks.filter(|b| !(whole_start..whole_end).contains(b)) {
            let bytes = block_range(block);
            SCRATCH.with_borrow_mut(|scratch| {
                scratch.resize((bytes.end - bytes.start) as usize, 0);
                file.file
                    .read_exact_at(scratch, file.data_offset + bytes.start)?;
                self.check(block, scratch)?;
                let from = range.start.max(bytes.start);
                let to = range.end.min(bytes.end);
                buf[(from - offset) as usize..(to - offset) as usize].copy_from_slice(
                    &scratch[(from - bytes.start) as usize..(to - bytes.start) as usize],
                );
                Ok::<_, CacheError>(())
            })?;
        }
        Ok(())
    }

    fn check(&self, block: u64, bytes: &[u8]) -> Result<(), CacheError> {
        if crc32c::crc32c(bytes) == self.file.block_crc32c[block as usize] {
            return Ok(());
        }
        self.cache.drop_corrupt(self.key, &self.file, block);
        Err(CacheError::Corrupt {
            part: self.key,
            block,
        })
    }
}

impl Drop for PinnedPart {
    fn drop(&mut self) {
        let mut inner = self.cache.inner.lock();
        // A part dropped as corrupt took its pins with it.
        let current = inner
            .files
            .get(&self.key)
            .is_some_and(|(file, _)| Arc::ptr_eq(file, &self.file));
        if current {
            inner.policy.unpin(self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parts::ObjectId;
    use part_file::BLOCK_LEN;

    const ORIGIN: PartOrigin = PartOrigin {
        key: "k",
        etag: "e",
        object_offset: 0,
    };

    /// Bytes a part of `len` data bytes takes on disk.
    fn disk_len(len: usize) -> u64 {
        (PartHeader::of(ORIGIN.key, ORIGIN.etag, 0, &vec![0; len]).encoded_len() + len) as u64
    }

    fn dir_bytes(dir: &Path) -> u64 {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum()
    }

    fn key(object: u64) -> PartKey {
        PartKey {
            object: ObjectId(object),
            index: 0,
        }
    }

    fn only_file(dir: &Path) -> PathBuf {
        let mut files: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(files.len(), 1);
        files.pop().unwrap()
    }

    fn flip_byte(path: &Path, at: u64) {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        let mut byte = [0u8];
        file.read_exact_at(&mut byte, at).unwrap();
        file.write_all_at(&[byte[0] ^ 0x10], at).unwrap();
    }

    #[test]
    fn the_directory_stays_within_budget_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let part = 10_000usize;
        let budget = 3 * disk_len(part);
        let cache = Arc::new(DiskCache::open(dir.path(), budget, None).unwrap());
        for object in 0..10u64 {
            let data = vec![object as u8; part];
            assert!(cache.insert(key(object), None, ORIGIN, &data));
            assert!(dir_bytes(cache.parts_dir()) <= budget);
        }
        let pinned = cache.get(key(9)).unwrap();
        let mut buf = [0u8; 4];
        pinned.read_exact_at(&mut buf, 5).unwrap();
        assert_eq!(buf, [9; 4]);
        assert!(cache.get(key(0)).is_none());
        assert_eq!(cache.stats().evicted_parts, 7);
    }

    /// Runs inserts on named threads with a hook that makes the race of issue 10
    /// happen whenever the code allows it: when a thread is about to delete a part
    /// file, it starts the `writer` thread's insert and waits (up to a second) for the
    /// writer's file to be on disk. Records the directory's largest size seen each time
    /// a file has been written. Threads named `dup` meet before either commits, so both
    /// downloads of one part are on disk at once.
    fn race(
        cache: &Arc<DiskCache>,
        inserts: Vec<(&'static str, PartKey, Vec<u8>)>,
        writer: (PartKey, Vec<u8>),
    ) -> u64 {
        use std::sync::mpsc;
        use std::time::Duration;
        let largest = Arc::new(AtomicU64::new(0));
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (written_tx, written_rx) = mpsc::channel::<()>();
        let (go_tx, written_rx) = (Mutex::new(Some(go_tx)), Mutex::new(written_rx));
        let dups = std::sync::Barrier::new(2);
        let parts_dir = cache.parts_dir().to_owned();
        let hook = {
            let largest = largest.clone();
            move |step: Step| {
                let thread = std::thread::current();
                let name = thread.name().unwrap_or_default();
                match step {
                    Step::Written => {
                        largest.fetch_max(dir_bytes(&parts_dir), Ordering::SeqCst);
                        match name {
                            "writer" => written_tx.send(()).unwrap(),
                            "dup" => {
                                dups.wait();
                            }
                            _ => {}
                        }
                    }
                    Step::Deleting if name != "writer" => {
                        if let Some(go) = go_tx.lock().take() {
                            go.send(()).unwrap();
                            let _ = written_rx.lock().recv_timeout(Duration::from_secs(1));
                        }
                    }
                    Step::Deleting => {}
                }
            }
        };
        *cache.test_hook.lock() = Some(Arc::new(hook));
        std::thread::scope(|scope| {
            let writer_thread = std::thread::Builder::new()
                .name("writer".into())
                .spawn_scoped(scope, move || {
                    go_rx.recv().unwrap();
                    assert!(cache.insert(writer.0, None, ORIGIN, &writer.1));
                })
                .unwrap();
            for (name, key, data) in &inserts {
                std::thread::Builder::new()
                    .name(name.to_string())
                    .spawn_scoped(scope, move || {
                        assert!(cache.insert(*key, None, ORIGIN, data));
                    })
                    .unwrap();
            }
            writer_thread.join().unwrap();
        });
        *cache.test_hook.lock() = None;
        largest.load(Ordering::SeqCst)
    }

    #[test]
    fn evicted_files_are_deleted_before_their_room_is_reused() {
        let dir = tempfile::tempdir().unwrap();
        let unit = disk_len(10_000);
        let budget = 3 * unit;
        let cache = Arc::new(DiskCache::open(dir.path(), budget, None).unwrap());
        let big = (2 * unit - disk_len(0)) as usize;
        assert_eq!(disk_len(big), 2 * unit);
        assert!(cache.insert(key(1), None, ORIGIN, &vec![1; big]));
        assert!(cache.insert(key(2), None, ORIGIN, &[2; 10_000]));
        // Part 3 evicts part 1, which frees twice what part 3 takes: part 4 then fits
        // without evicting anything, and must not be written while part 1 is on disk.
        let largest = race(
            &cache,
            vec![("evictor", key(3), vec![3; 10_000])],
            (key(4), vec![4; 10_000]),
        );
        assert!(
            largest <= budget,
            "directory reached {largest}, budget {budget}"
        );
        assert_eq!(dir_bytes(cache.parts_dir()), budget);
        assert_eq!(cache.stats().evicted_parts, 1);
    }

    #[test]
    fn a_losing_duplicate_is_deleted_before_its_room_is_reused() {
        let dir = tempfile::tempdir().unwrap();
        let unit = disk_len(10_000);
        let budget = 3 * unit;
        let cache = Arc::new(DiskCache::open(dir.path(), budget, None).unwrap());
        assert!(cache.insert(key(2), None, ORIGIN, &[2; 10_000]));
        let _kept = cache.get(key(2)).unwrap();
        // Two downloads of part 5 both reserve and write; the loser's reservation must
        // not be reused by part 6 while the loser's file is still on disk.
        let largest = race(
            &cache,
            vec![
                ("dup", key(5), vec![5; 10_000]),
                ("dup", key(5), vec![5; 10_000]),
            ],
            (key(6), vec![6; 10_000]),
        );
        assert!(
            largest <= budget,
            "directory reached {largest}, budget {budget}"
        );
        assert_eq!(dir_bytes(cache.parts_dir()), budget);
    }

    #[test]
    fn a_removed_directory_turns_caching_off_once_and_on_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut cache = DiskCache::open(dir.path(), 1 << 20, None).unwrap();
        cache.disk_retry_after = Duration::from_millis(200);
        let cache = Arc::new(cache);
        assert!(cache.insert(key(1), None, ORIGIN, &[1; 100]));
        let kept = cache.get(key(1)).unwrap();
        fs::remove_dir_all(dir.path()).unwrap();
        assert!(!cache.insert(key(2), None, ORIGIN, &[2; 100]));
        let stats = cache.stats();
        assert!(stats.disk_unusable.is_some(), "{stats:?}");
        // Recreated at once, the directory is not tried again before the retry delay.
        fs::create_dir_all(cache.parts_dir()).unwrap();
        assert!(!cache.insert(key(3), None, ORIGIN, &[3; 100]));
        assert_eq!(fs::read_dir(cache.parts_dir()).unwrap().count(), 0);
        assert_eq!(cache.stats().parts_not_cached_for_disk_errors, 2);
        let mut buf = [0u8; 10];
        kept.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [1; 10], "parts already open still serve, checked");
        std::thread::sleep(Duration::from_millis(250));
        assert!(cache.insert(key(4), None, ORIGIN, &[4; 100]));
        assert_eq!(cache.stats().disk_unusable, None);
    }

    #[test]
    fn the_directory_and_files_are_private_and_symlinks_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Arc::new(DiskCache::open(dir.path(), 1 << 20, None).unwrap());
        assert!(cache.insert(key(1), None, ORIGIN, &[1; 100]));
        let mode = |path: &Path| fs::metadata(path).unwrap().permissions().mode() & 0o777;
        let root = dir.path().join(VERSION_DIR);
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(cache.parts_dir()), 0o700);
        assert_eq!(mode(&root.join("lock")), 0o600);
        assert_eq!(mode(&only_file(cache.parts_dir())), 0o600);
        drop(cache);

        let elsewhere = tempfile::tempdir().unwrap();
        let planted = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), planted.path().join(VERSION_DIR)).unwrap();
        let refused = DiskCache::open(planted.path(), 1 << 20, None)
            .err()
            .unwrap();
        assert!(refused.to_string().contains("symbolic link"), "{refused}");
    }

    #[test]
    fn a_second_daemon_cannot_share_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let _first = DiskCache::open(dir.path(), 1 << 20, None).unwrap();
        let second = DiskCache::open(dir.path(), 1 << 20, None);
        assert!(second.is_err());
    }

    #[test]
    fn pinned_parts_leave_new_parts_uncached() {
        let dir = tempfile::tempdir().unwrap();
        let budget = disk_len(100);
        let cache = Arc::new(DiskCache::open(dir.path(), budget, None).unwrap());
        assert!(cache.insert(key(1), None, ORIGIN, &[1; 100]));
        let pinned = cache.get(key(1)).unwrap();
        assert!(!cache.insert(key(2), None, ORIGIN, &[2; 100]));
        drop(pinned);
        assert!(cache.insert(key(2), None, ORIGIN, &[2; 100]));
        assert_eq!(cache.stats().parts_not_cached_for_lack_of_room, 1);
    }

    #[test]
    fn a_flipped_bit_is_caught_and_drops_the_part() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Arc::new(DiskCache::open(dir.path(), 1 << 30, None).unwrap());
        let data: Vec<u8> = (0..3 * BLOCK_LEN as usize + 100)
            .map(|i| (i % 253) as u8)
            .collect();
        assert!(cache.insert(key(1), None, ORIGIN, &data));
        let path = only_file(cache.parts_dir());
        let data_offset = fs::metadata(&path).unwrap().len() - data.len() as u64;
        // A byte in the third block.
        flip_byte(&path, data_offset + 2 * BLOCK_LEN as u64 + 7);
        let pinned = cache.get(key(1)).unwrap();
        let mut buf = vec![0u8; 1000];
        pinned.read_exact_at(&mut buf, 10).unwrap();
        assert_eq!(
            buf,
            data[10..1010],
            "blocks the read does not touch are not checked"
        );
        let error = pinned
            .read_exact_at(&mut buf, 2 * BLOCK_LEN as u64 + 500)
            .unwrap_err();
        assert!(
            matches!(error, CacheError::Corrupt { block: 2, .. }),
            "{error}"
        );
        assert!(cache.get(key(1)).is_none(), "dropped from the index");
        assert_eq!(
            fs::read_dir(cache.parts_dir()).unwrap().count(),
            0,
            "file deleted"
        );
        let stats = cache.stats();
        assert_eq!((stats.corrupt_parts_dropped, stats.cached_bytes), (1, 0));
        // Another read through the stale handle fails again, without counting twice.
        assert!(pinned
            .read_exact_at(&mut buf, 2 * BLOCK_LEN as u64)
            .is_err());
        drop(pinned);
        assert_eq!(cache.stats().corrupt_parts_dropped, 1);
        assert!(cache.insert(key(1), None, ORIGIN, &data), "fetched again");
        let again = cache.get(key(1)).unwrap();
        again
            .read_exact_at(&mut buf, 2 * BLOCK_LEN as u64 + 500)
            .unwrap();
        assert_eq!(buf, data[2 * BLOCK_LEN as usize + 500..][..1000]);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Any read of an intact part returns exactly its bytes; with one byte flipped,
        /// a read returns its bytes exactly when it does not touch that byte's block.
        #[test]
        fn reads_return_the_bytes_or_fail_on_a_touched_bad_block(
            len in 1usize..4 * BLOCK_LEN as usize,
            reads in proptest::collection::vec((0.0f64..1.0, 0.0f64..1.0), 1..8),
            flip in proptest::option::of(0.0f64..1.0),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let cache = Arc::new(DiskCache::open(dir.path(), 1 << 30, None).unwrap());
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 256) as u8).collect();
            assert!(cache.insert(key(1), None, ORIGIN, &data));
            let flipped = flip.map(|f| (f * len as f64) as u64);
            if let Some(at) = flipped {
                let path = only_file(cache.parts_dir());
                flip_byte(&path, fs::metadata(&path).unwrap().len() - len as u64 + at);
            }
            let pinned = cache.get(key(1)).unwrap();
            for (a, b) in reads {
                let start = (a * len as f64) as u64;
                let end = start + (b * (len as u64 - start) as f64) as u64;
                let mut buf = vec![0u8; (end - start) as usize];
                let result = pinned.read_exact_at(&mut buf, start);
                let bad_block_touched = flipped.is_some_and(|at| {
                    spans_touched(&(start..end), BLOCK_LEN as u64).contains(&(at / BLOCK_LEN as u64))
                });
                if bad_block_touched {
                    proptest::prop_assert!(result.is_err());
                } else {
                    proptest::prop_assert!(result.is_ok());
                    proptest::prop_assert_eq!(&buf[..], &data[start as usize..end as usize]);
                }
            }
        }
    }
}
