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
//! and one insert tries the disk again every [`DISK_RETRY_AFTER`] (a removed directory
//! stays unusable: the cache holds the one checked, not its path). The directory and
//! its files are private to the daemon's user (0700 and 0600), and every one is
//! reached relative to the checked directory without following symbolic links
//! ([`directory`]).
//!
//! No byte leaves the cache unchecked: every read checks the CRC32C of each block it
//! touches (kept in memory since the part was written) against what the disk returned.
//! A part that fails is dropped from the cache at once, logged and counted, and the
//! read fails with [`CacheError::Corrupt`], which the read path answers by fetching the
//! part again. Our own disk never fails a read: a part whose file cannot be read (an
//! I/O error, a file truncated, removed or replaced under the daemon) is dropped the
//! same way, with [`CacheError::Unreadable`].
//!
//! The cache outlives the mount ([`adopt`]): a directory records the source it belongs
//! to, and the part files of an earlier daemon are counted against the budget at once
//! (from their names) and adopted, in the background, by the objects the catalog lists
//! with the same ETag, or by the first read of their part ([`DiskCache::claim_own`]).
//!
//! The cache knows objects and parts, never SCDL: grouping parts into units is the
//! caller's decision, and eviction advice comes from an [`EvictionAdvisor`].

pub mod adopt;
mod checked;
mod directory;
pub(crate) mod open_files;
pub mod part_file;
pub(crate) mod policy;
pub(crate) mod spool;
mod strays;
#[cfg(any(test, feature = "test-support"))]
pub mod test_files;

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::cache_dir_check::CheckedDir;
use crate::parts::{GroupId, PartKey};
pub use checked::PinnedPart;
use directory::HeldDir;
use open_files::{OpenFiles, PartFile};
use part_file::PartHeader;
pub use policy::{Admission, EvictionAdvisor, NextUse, Policy, Recency, Unit};
use strays::Strays;

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
    /// Open while the bound on open part files allows ([`open_files`]).
    file: Arc<PartFile>,
    /// Where the data starts in the file: the header's length.
    data_offset: u64,
    data_len: u64,
    block_len: u32,
    block_crc32c: Box<[u32]>,
    /// When the kernel was last told the whole part will be read
    /// ([`ADVISE_AGAIN_AFTER`]), in milliseconds since the cache opened; 0: never.
    advised_at_ms: AtomicU64,
}

/// A part read at all is soon read through (a chunk window's rows spread over all of
/// it), so its first read asks the kernel to read the whole part from disk at once
/// instead of a read-ahead window per FUSE read; asked again after this long, in case
/// the page cache dropped it. Cheap when the pages are resident. Asked once the read
/// has its own bytes: asked before, the read's pages queued behind the whole part's,
/// and a warm windows epoch with the page cache dropped took 7% longer (1.44–1.49 s
/// against 1.34–1.37 s on a 1.46 GB dataset). Not asked where the read-around reads
/// ahead ([`DiskCache::leave_read_ahead_to_read_around`]).
const ADVISE_AGAIN_AFTER: Duration = Duration::from_secs(1);

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
    #[error("cached part {part:?} could not be read ({reason}); dropped from the cache")]
    Unreadable { part: PartKey, reason: String },
}

impl From<CacheError> for crate::error::FsError {
    fn from(error: CacheError) -> Self {
        match error {
            CacheError::Io(error) => error.into(),
            // Both were dropped from the cache: the read path fetches the part again.
            dropped @ (CacheError::Corrupt { .. } | CacheError::Unreadable { .. }) => {
                crate::error::FsError::CacheCorrupt(dropped.to_string())
            }
        }
    }
}

struct Inner {
    policy: Policy,
    /// Each resident part's file, and its name in the parts directory.
    files: HashMap<PartKey, (Arc<ResidentFile>, String)>,
    strays: Strays,
}

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
    /// Parts whose file could not be read (an I/O error; a file truncated, removed or
    /// replaced under the daemon), dropped and fetched again.
    #[serde(default)]
    pub unreadable_parts_dropped: u64,
    /// Why the cache directory cannot be written, while it cannot.
    #[serde(default)]
    pub disk_unusable: Option<String>,
    /// Downloaded parts served without being cached because the disk failed.
    #[serde(default)]
    pub parts_not_cached_for_disk_errors: u64,
    /// Part files of an earlier mount that this mount took over.
    #[serde(default)]
    pub adopted_parts: u64,
    #[serde(default)]
    pub adopted_bytes: u64,
    /// Of those, the parts a read claimed before the background had read their header.
    #[serde(default)]
    pub adopted_by_reads: u64,
    /// Part files of an earlier mount not (yet) claimed by a listed object; they count
    /// against the budget and are deleted first when room is needed.
    #[serde(default)]
    pub unclaimed_parts: usize,
    #[serde(default)]
    pub unclaimed_bytes: u64,
    /// Part files of an earlier mount removed: changed objects, another part size,
    /// bad headers, torn writes, or beyond a smaller budget.
    #[serde(default)]
    pub stale_parts_removed: u64,
    /// Whether every header of an earlier mount's part files has been read.
    #[serde(default)]
    pub adoption_done: bool,
    /// Reads that had to open a part file again: more parts are resident than the
    /// open-file limit lets stay open ([`open_files`]).
    #[serde(default)]
    pub part_files_reopened: u64,
}

pub struct DiskCache {
    /// Where every part file is, by its name.
    parts: HeldDir,
    budget_bytes: u64,
    adopted_parts: AtomicU64,
    adopted_bytes: AtomicU64,
    adopted_by_reads: AtomicU64,
    stale_removed: AtomicU64,
    inner: Mutex<Inner>,
    advisor: RwLock<Option<Arc<dyn EvictionAdvisor>>>,
    next_file: AtomicU64,
    evicted_parts: AtomicU64,
    refused_for_room: AtomicU64,
    corrupt_dropped: AtomicU64,
    unreadable_dropped: AtomicU64,
    disk: Mutex<DiskState>,
    disk_retry_after: Duration,
    refused_for_disk: AtomicU64,
    open_files: OpenFiles,
    /// The clock of the read-ahead advice ([`ADVISE_AGAIN_AFTER`]).
    opened: Instant,
    /// Whether a read advises the kernel to read its whole part
    /// ([`DiskCache::leave_read_ahead_to_read_around`]).
    advises_whole_parts: AtomicBool,
    /// Held for the daemon's life: an exclusive lock on the cache directory.
    _lock: File,
    /// Lets a test act at the moments the directory grows or shrinks.
    #[cfg(test)]
    test_hook: Mutex<Option<InsertHook>>,
}

#[cfg(test)]
type InsertHook = Arc<dyn Fn(InsertMoment) + Send + Sync>;

/// The moments of an insert a test can act at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum InsertMoment {
    /// A new part file has all its bytes on disk (under its temporary name).
    Written,
    /// A part file is about to be deleted.
    Deleting,
}

impl DiskCache {
    /// Opens the cache under `dir` for `owner`'s source, taking an exclusive lock on
    /// it. Part files an earlier daemon left count against the budget at once, at the
    /// lengths their names declare (the oldest beyond it are deleted);
    /// [`DiskCache::adopt_in_background`] then reads their headers so that listed
    /// objects can claim them.
    pub fn open(
        dir: &CheckedDir,
        owner: &CacheOwner,
        budget_bytes: u64,
        max_groups: Option<usize>,
    ) -> io::Result<DiskCache> {
        let directory::Claimed { parts, lock } = directory::claim(dir, owner)?;
        let scan = directory::scan(&parts, budget_bytes)?;
        let mut strays = Strays::default();
        for found in scan.parts {
            strays.total_bytes += found.name.len;
            strays.names.insert(found.file.clone(), found.name);
            // Oldest first: a part's newest file wins.
            strays.by_part.insert(found.name.part, found.file.clone());
            strays.order.push_back(found.file);
        }
        let mut over_budget = 0;
        while strays.total_bytes > budget_bytes {
            let (file, _) = strays.oldest().expect("bytes over budget are in files");
            parts.remove(&file)?;
            over_budget += 1;
        }
        strays.headers_read = strays.names.is_empty();
        if !strays.names.is_empty() || scan.removed + over_budget > 0 {
            tracing::info!(
                parts = strays.names.len(),
                bytes = strays.total_bytes,
                removed_torn_or_foreign = scan.removed,
                removed_over_budget = over_budget,
                "found the part files of an earlier mount; adopting those whose objects are unchanged"
            );
        }
        let policy_budget = budget_bytes - strays.total_bytes;
        Ok(DiskCache {
            parts,
            budget_bytes,
            adopted_parts: AtomicU64::new(0),
            adopted_bytes: AtomicU64::new(0),
            adopted_by_reads: AtomicU64::new(0),
            stale_removed: AtomicU64::new(scan.removed + over_budget),
            inner: Mutex::new(Inner {
                policy: Policy::new(policy_budget, max_groups),
                files: HashMap::new(),
                strays,
            }),
            advisor: RwLock::new(None),
            next_file: AtomicU64::new(scan.next_file),
            evicted_parts: AtomicU64::new(0),
            refused_for_room: AtomicU64::new(0),
            corrupt_dropped: AtomicU64::new(0),
            unreadable_dropped: AtomicU64::new(0),
            disk: Mutex::new(DiskState::default()),
            disk_retry_after: DISK_RETRY_AFTER,
            refused_for_disk: AtomicU64::new(0),
            opened: Instant::now(),
            advises_whole_parts: AtomicBool::new(true),
            open_files: OpenFiles::new(open_files::bound_for_this_process()),
            _lock: lock,
            #[cfg(test)]
            test_hook: Mutex::new(None),
        })
    }

    /// The directory whose files the budget bounds.
    #[cfg(test)]
    fn parts_dir(&self) -> PathBuf {
        self.parts.shown("")
    }

    pub fn set_advisor(&self, advisor: Option<Arc<dyn EvictionAdvisor>>) {
        *self.advisor.write() = advisor;
    }

    /// The most groups (SCDL chunks) the cache keeps, if bounded.
    pub fn max_groups(&self) -> Option<usize> {
        self.inner.lock().policy.max_groups()
    }

    pub fn contains(&self, key: PartKey) -> bool {
        self.inner.lock().policy.contains(key)
    }

    /// Moves whenever a part joins or leaves the books ([`DiskCache::wholly_resident`]
    /// gives the same answer while it stays).
    pub fn generation(&self) -> u64 {
        self.inner.lock().policy.generation()
    }

    /// Which of `units` (each the parts of one unit, say an SCDL chunk's three arrays)
    /// are wholly resident, under one look at the books: no I/O, no use counted, and
    /// an earlier mount's files not yet adopted do not count.
    pub fn wholly_resident(&self, units: &[Vec<PartKey>]) -> Vec<bool> {
        let inner = self.inner.lock();
        units
            .iter()
            .map(|parts| parts.iter().all(|&key| inner.policy.contains(key)))
            .collect()
    }

    /// Whether a prefetch of the part should wait: [`DiskCache::spool`] would find room
    /// for it only by evicting what the plans need sooner than it ([`Admission`]). A
    /// cache that cannot take it even for a reader (pinned data fills it) is no reason
    /// to wait. No I/O: a prefetcher asks before it takes a download slot.
    pub fn prefetch_waits_for_room(
        &self,
        key: PartKey,
        group: Option<GroupId>,
        origin: PartOrigin,
        data_len: u64,
    ) -> bool {
        let disk_bytes = PartHeader::encoded_len_before_data(origin.key, origin.etag, data_len)
            as u64
            + data_len;
        let (unit, advisor) = (Unit::of(key, group), self.advisor.read().clone());
        let room_for = |policy: &Policy, admission| {
            policy.has_room(disk_bytes, unit, advisor.as_deref(), admission)
        };
        let inner = self.inner.lock();
        !room_for(&inner.policy, Admission::Prefetch) && room_for(&inner.policy, Admission::Demand)
    }

    /// The part, pinned while the returned handle lives, if it is resident; `recency`
    /// says whether this counts as a use.
    pub fn get(self: &Arc<Self>, key: PartKey, recency: Recency) -> Option<PinnedPart> {
        let mut inner = self.inner.lock();
        if !inner.policy.pin(key, recency) {
            return None;
        }
        let file = inner.files[&key].0.clone();
        Some(PinnedPart {
            cache: self.clone(),
            key,
            file,
        })
    }

    /// Stores a downloaded part whole ([`DiskCache::spool`], one write, commit).
    /// Blocking file I/O: call from a blocking context. Returns `false` when the part
    /// cannot be cached (pinned or protected data fills the budget, or the disk
    /// failed); the caller still has the bytes to serve.
    pub fn insert(
        self: &Arc<Self>,
        key: PartKey,
        group: Option<GroupId>,
        origin: PartOrigin,
        data: &[u8],
    ) -> bool {
        if self.contains(key) {
            return true;
        }
        let Some(spool) = self.spool(key, group, origin, data.len() as u64, Admission::Demand)
        else {
            return false;
        };
        if spool.write_next(data).is_err() {
            self.refused_for_disk.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        spool.commit()
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
            tracing::error!(dir = %self.parts.shown("").display(), %error, retry_seconds = self.disk_retry_after.as_secs(), "the cache directory cannot be written: serving parts from the store without caching them");
        }
        disk.unusable_since = Some(Instant::now());
        disk.reason = Some(error.to_string());
    }

    fn disk_ok(&self) {
        let mut disk = self.disk.lock();
        if disk.reason.take().is_some() {
            tracing::info!(dir = %self.parts.shown("").display(), "the cache directory can be written again: caching resumes");
        }
        disk.unusable_since = None;
    }

    #[cfg(test)]
    fn reached(&self, moment: InsertMoment) {
        let hook = self.test_hook.lock().clone();
        if let Some(hook) = hook {
            hook(moment);
        }
    }

    #[cfg(not(test))]
    fn reached(&self, _: InsertMoment) {}

    fn forget_files(&self, inner: &mut Inner, victims: Vec<PartKey>) -> Vec<String> {
        self.evicted_parts
            .fetch_add(victims.len() as u64, Ordering::Relaxed);
        victims
            .into_iter()
            .filter_map(|key| inner.files.remove(&key).map(|(_, path)| path))
            .collect()
    }

    /// Deletes part files; called with the books' lock held, before their bytes are
    /// credited or right after, so that the room they free is free on disk too.
    fn delete_files(&self, files: Vec<String>) {
        for file in files {
            self.reached(InsertMoment::Deleting);
            match self.parts.remove(&file) {
                // A file already gone (a removed cache directory) is what deleting wanted.
                Err(error) if error.kind() != io::ErrorKind::NotFound => {
                    tracing::warn!(path = %self.parts.shown(&file).display(), %error, "could not delete a cache file");
                }
                _ => {}
            }
        }
    }

    pub fn stats(&self) -> CacheStats {
        let inner = self.inner.lock();
        CacheStats {
            budget_bytes: self.budget_bytes,
            cached_bytes: inner.policy.used_bytes() + inner.strays.total_bytes,
            reserved_bytes: inner.policy.reserved_bytes(),
            cached_parts: inner.policy.resident_parts(),
            cached_groups: inner.policy.resident_groups(),
            evicted_parts: self.evicted_parts.load(Ordering::Relaxed),
            parts_not_cached_for_lack_of_room: self.refused_for_room.load(Ordering::Relaxed),
            corrupt_parts_dropped: self.corrupt_dropped.load(Ordering::Relaxed),
            unreadable_parts_dropped: self.unreadable_dropped.load(Ordering::Relaxed),
            disk_unusable: self.disk.lock().reason.clone(),
            parts_not_cached_for_disk_errors: self.refused_for_disk.load(Ordering::Relaxed),
            adopted_parts: self.adopted_parts.load(Ordering::Relaxed),
            adopted_bytes: self.adopted_bytes.load(Ordering::Relaxed),
            adopted_by_reads: self.adopted_by_reads.load(Ordering::Relaxed),
            unclaimed_parts: inner.strays.names.len(),
            unclaimed_bytes: inner.strays.total_bytes,
            stale_parts_removed: self.stale_removed.load(Ordering::Relaxed),
            adoption_done: inner.strays.headers_read,
            part_files_reopened: self.open_files.reopened(),
        }
    }

    /// Drops a part whose bytes failed their checksum, unless an earlier read dropped
    /// it already (then the part may have been fetched again: a new file).
    fn drop_corrupt(&self, key: PartKey, file: &Arc<ResidentFile>, block: u64) {
        if let Some(path) = self.drop_resident(key, file) {
            self.corrupt_dropped.fetch_add(1, Ordering::Relaxed);
            tracing::error!(path = %path.display(), part = ?key, block, "a cached part failed its checksum: dropped, and fetched again when read");
        }
    }

    /// Stops advising the kernel to read a whole part at its first read, for a mount
    /// whose read-around reads the windows around reads (1 MiB or more) through the
    /// part files in order, so that the cache disk's own read-ahead brings the parts in
    /// as they are read. There the advice cost CPU and bought no speed: without it a
    /// disk-cache warm windows epoch took 0.66 daemon CPU s per GB instead of 0.77, and
    /// read no slower beside local disk (docs/architecture.md, where the CPU goes per
    /// byte).
    pub fn leave_read_ahead_to_read_around(&self) {
        self.advises_whole_parts.store(false, Ordering::Relaxed);
    }

    /// Drops a part whose file could not be opened or read, as
    /// [`DiskCache::drop_corrupt`].
    fn drop_unreadable(&self, key: PartKey, file: &Arc<ResidentFile>, reason: &str) {
        if let Some(path) = self.drop_resident(key, file) {
            self.unreadable_dropped.fetch_add(1, Ordering::Relaxed);
            tracing::error!(path = %path.display(), part = ?key, reason, "a cached part could not be read: dropped, and fetched again when read");
        }
    }

    /// Forgets and deletes `file` if it is still `key`'s.
    fn drop_resident(&self, key: PartKey, file: &Arc<ResidentFile>) -> Option<PathBuf> {
        let mut inner = self.inner.lock();
        let (resident, _) = inner.files.get(&key)?;
        if !Arc::ptr_eq(resident, file) {
            return None;
        }
        let (_, name) = inner.files.remove(&key).expect("present");
        inner.policy.discard(key);
        let path = self.parts.shown(&name);
        self.delete_files(vec![name]);
        Some(path)
    }
}

#[cfg(test)]
#[path = "../../tests/common/tmpfs.rs"]
mod test_tmpfs;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod unreadable_part_tests;
