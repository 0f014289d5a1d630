//! The local disk cache: parts of objects kept as files under a byte budget.
//!
//! [`policy`] keeps the accounts (resident parts, reservations, pins, LRU units)
//! without touching the disk, and [`books`] holds them, with each resident part's file,
//! under the cache's one lock; [`part_file`] is the versioned on-disk format of one
//! part. [`DiskCache`] joins them: a part is written to a temporary name and renamed
//! into place ([`spool`]) only after its bytes were reserved and the evicted parts'
//! files were deleted ([`parts_dir`]), so the cache directory never holds more than the
//! budget. Readers get a [`PinnedPart`] ([`checked`]), which keeps the part resident
//! until it is dropped, and whose first read advises the kernel to read the whole part
//! ([`read_advice`]). What the cache counts it counts into the mount's counter table
//! ([`crate::metrics`]).
//!
//! A cache directory that cannot be written (full, removed, read-only) turns caching
//! off with one log line and a flag in `status` ([`disk_health`]); downloads are then
//! served from memory, and one insert tries the disk again every [`DISK_RETRY_AFTER`]
//! (a removed directory stays unusable: the cache holds the one checked, not its path).
//! The directory and its files are private to the daemon's user (0700 and 0600), and
//! every one is reached relative to the checked directory without following symbolic
//! links ([`directory`]).
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
//! (from their names, [`strays`]) and adopted, in the background, by the objects the
//! catalog lists with the same ETag, or by the first read of their part
//! ([`adoption`], [`DiskCache::claim_own`]).
//!
//! The cache knows objects and parts, never SCDL: grouping parts into units is the
//! caller's decision, and eviction advice comes from an [`EvictionAdvisor`].

pub mod adopt;
mod adoption;
mod books;
mod checked;
mod directory;
mod disk_health;
pub(crate) mod open_files;
pub mod part_file;
mod parts_dir;
pub(crate) mod policy;
mod read_advice;
pub(crate) mod spool;
mod strays;
#[cfg(any(test, feature = "test-support"))]
pub mod test_files;

use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};

use crate::cache_dir_check::CheckedDir;
use crate::metrics::Metrics;
use crate::parts::{GroupId, PartKey};
use adopt::ListedObject;
use adoption::Adoption;
use books::{Books, ResidentFile};
pub use checked::PinnedPart;
pub use directory::CacheOwner;
use disk_health::DiskHealth;
pub use disk_health::DISK_RETRY_AFTER;
use open_files::OpenFiles;
use part_file::PartHeader;
pub use part_file::PartOrigin;
use parts_dir::PartsDir;
use policy::Reservation;
pub use policy::{Admission, EvictionAdvisor, NextUse, Policy, Recency, Unit};
use read_advice::ReadAdvice;
use spool::Spool;
use strays::Strays;

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

/// The cache: its books under one lock, the parts directory, and what the disk and
/// the reads need beside them, each a type of its own file; the methods here are the
/// cache's face, and hand the work to those types.
pub struct DiskCache {
    /// Where every part file is, by its name.
    parts: PartsDir,
    budget_bytes: u64,
    books: Mutex<Books>,
    advisor: RwLock<Option<Arc<dyn EvictionAdvisor>>>,
    /// The mount's counter table; the cache counts into its `cache_*` counters.
    counters: Arc<Metrics>,
    disk: DiskHealth,
    open_files: OpenFiles,
    read_advice: ReadAdvice,
    /// Held for the daemon's life: an exclusive lock on the cache directory.
    _lock: File,
}

impl DiskCache {
    /// Opens the cache under `dir` for `owner`'s source, taking an exclusive lock on
    /// it, with counters of its own ([`DiskCache::open_counting_into`]).
    pub fn open(
        dir: &CheckedDir,
        owner: &CacheOwner,
        budget_bytes: u64,
        max_groups: Option<usize>,
    ) -> io::Result<DiskCache> {
        Self::open_counting_into(dir, owner, budget_bytes, max_groups, Arc::default())
    }

    /// Opens the cache under `dir` for `owner`'s source, taking an exclusive lock on
    /// it, counting into the mount's `counters`. Part files an earlier daemon left
    /// count against the budget at once, at the lengths their names declare (the
    /// oldest beyond it are deleted); [`DiskCache::adopt_in_background`] then reads
    /// their headers so that listed objects can claim them.
    pub fn open_counting_into(
        dir: &CheckedDir,
        owner: &CacheOwner,
        budget_bytes: u64,
        max_groups: Option<usize>,
        counters: Arc<Metrics>,
    ) -> io::Result<DiskCache> {
        let directory::Claimed { parts, lock } = directory::claim(dir, owner)?;
        let scan = directory::scan(&parts, budget_bytes)?;
        let (strays, over_budget) = Strays::found(scan.parts, &parts, budget_bytes)?;
        if !strays.names.is_empty() || scan.removed + over_budget > 0 {
            tracing::info!(
                parts = strays.names.len(),
                bytes = strays.total_bytes,
                removed_torn_or_foreign = scan.removed,
                removed_over_budget = over_budget,
                "found the part files of an earlier mount; adopting those whose objects are unchanged"
            );
        }
        Metrics::add(
            &counters.cache_stale_parts_removed,
            scan.removed + over_budget,
        );
        let policy = Policy::new(budget_bytes - strays.total_bytes, max_groups);
        Ok(DiskCache {
            disk: DiskHealth::new(parts.shown("")),
            parts: PartsDir::new(parts, scan.next_file),
            budget_bytes,
            books: Mutex::new(Books::new(policy, strays)),
            advisor: RwLock::new(None),
            counters,
            open_files: OpenFiles::new(open_files::bound_for_this_process()),
            read_advice: ReadAdvice::new(),
            _lock: lock,
        })
    }

    /// The directory whose files the budget bounds.
    #[cfg(test)]
    fn parts_dir(&self) -> PathBuf {
        self.parts.dir.shown("")
    }

    pub fn set_advisor(&self, advisor: Option<Arc<dyn EvictionAdvisor>>) {
        *self.advisor.write() = advisor;
    }

    /// The most groups (SCDL chunks) the cache keeps, if bounded.
    pub fn max_groups(&self) -> Option<usize> {
        self.books.lock().policy.max_groups()
    }

    pub fn contains(&self, key: PartKey) -> bool {
        self.books.lock().policy.contains(key)
    }

    /// Moves whenever a part joins or leaves the books ([`DiskCache::wholly_resident`]
    /// gives the same answer while it stays).
    pub fn generation(&self) -> u64 {
        self.books.lock().policy.generation()
    }

    /// Which of `units` (each the parts of one unit, say an SCDL chunk's three arrays)
    /// are wholly resident, under one look at the books: no I/O, no use counted, and
    /// an earlier mount's files not yet adopted do not count.
    pub fn wholly_resident(&self, units: &[Vec<PartKey>]) -> Vec<bool> {
        let books = self.books.lock();
        units
            .iter()
            .map(|parts| parts.iter().all(|&key| books.policy.contains(key)))
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
        let books = self.books.lock();
        !room_for(&books.policy, Admission::Prefetch) && room_for(&books.policy, Admission::Demand)
    }

    /// Whether the plans rank units but not this part's: no plan reads it within its
    /// announced steps, while plans read others. No I/O.
    pub fn unranked_beside_plans(&self, key: PartKey, group: Option<GroupId>) -> bool {
        let advisor = self.advisor.read().clone();
        advisor.is_some_and(|a| a.ranks_any() && a.next_use(Unit::of(key, group)).is_none())
    }

    /// The part, pinned while the returned handle lives, if it is resident; `recency`
    /// says whether this counts as a use.
    pub fn get(self: &Arc<Self>, key: PartKey, recency: Recency) -> Option<PinnedPart> {
        let mut books = self.books.lock();
        if !books.policy.pin(key, recency) {
            return None;
        }
        let file = books.files[&key].0.clone();
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
            Metrics::add(&self.counters.cache_parts_not_cached_for_disk_errors, 1);
            return false;
        }
        spool.commit()
    }

    /// Reserves the room of a part of `data_len` bytes, evicting only what `admission`
    /// may, and creates its file, to be filled with [`Spool::write_next`]. `None` when
    /// the part cannot be cached now: no room (pinned or protected data fills the
    /// budget), the disk failed, a key or ETag too long for the format, or the part is
    /// resident already. Blocking file I/O.
    pub fn spool(
        self: &Arc<Self>,
        key: PartKey,
        group: Option<GroupId>,
        origin: PartOrigin,
        data_len: u64,
        admission: Admission,
    ) -> Option<Spool> {
        Spool::begin(self, key, group, origin, data_len, admission)
    }

    /// Reserves `disk_bytes` for the part `key` in the books, evicting only what
    /// `admission` may (an earlier mount's unclaimed files first). The books credit
    /// freed bytes as soon as they are told; so every file whose bytes they credit is
    /// deleted before the lock is released, or another spool could write into room
    /// that is still taken on disk. `None` if the part is resident, or there is no room
    /// (counted).
    fn reserve(
        &self,
        key: PartKey,
        group: Option<GroupId>,
        disk_bytes: u64,
        admission: Admission,
    ) -> Option<Reservation> {
        let advisor = self.advisor.read().clone();
        let mut books = self.books.lock();
        if books.policy.contains(key) {
            return None;
        }
        let strays = books.room_from_strays(disk_bytes);
        Metrics::add(&self.counters.cache_evicted_parts, strays.len() as u64);
        self.parts.delete(strays);
        let (reservation, victims) = books.policy.reserve(
            disk_bytes,
            Unit::of(key, group),
            advisor.as_deref(),
            admission,
        );
        Metrics::add(&self.counters.cache_evicted_parts, victims.len() as u64);
        let victims = books.forget(victims);
        self.parts.delete(victims);
        if reservation.is_none() {
            Metrics::add(&self.counters.cache_parts_not_cached_for_lack_of_room, 1);
        }
        reservation
    }

    /// Reads the headers of the earlier mount's part files on threads of their own, so
    /// that a large cache does not delay the mount; holds the cache only while it
    /// reads ([`adoption`]).
    pub fn adopt_in_background(self: &Arc<Self>) {
        if self.books.lock().strays.headers_read {
            return;
        }
        let cache = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("scdlfs-adopt".into())
            .spawn(move || {
                let started = Instant::now();
                let files = match cache.upgrade() {
                    Some(cache) => cache.adoption().unread(),
                    None => return,
                };
                adopt::in_parallel(&files, |file| {
                    if let Some(cache) = cache.upgrade() {
                        cache.adoption().read_stray(file.clone());
                    }
                });
                if let Some(cache) = cache.upgrade() {
                    cache.adoption().headers_done();
                    let stats = cache.stats();
                    tracing::info!(
                        seconds = started.elapsed().as_secs_f64(),
                        adopted = stats.adopted_parts,
                        unclaimed = stats.unclaimed_parts,
                        removed = stats.stale_parts_removed,
                        "read the headers of the earlier mount's part files"
                    );
                }
            });
        if let Err(error) = spawned {
            tracing::error!(%error, "cannot start adopting the earlier mount's parts: they will be replaced as room is needed");
        }
    }

    /// Reads the headers of the earlier mount's part files on this thread.
    #[cfg(test)]
    fn adopt_now(&self) {
        self.adoption().read_all_now();
    }

    /// Tells the cache that the catalog listed `object`: it claims the earlier mount's
    /// parts of its key that are parts of it as it is now (cut at `part_size`), and the
    /// others of its key are deleted.
    pub fn object_listed(&self, object: ListedObject, part_size: u64) {
        self.adoption().object_listed(object, part_size);
    }

    /// Whether some of the earlier mount's part files may still be claimed by a read
    /// ([`DiskCache::claim_own`]): their headers are still being read.
    pub fn claims_pending(&self) -> bool {
        !self.books.lock().strays.by_part.is_empty()
    }

    /// Claims the earlier mount's file of part `index` of `object` for a read that
    /// comes before the background has read that file's header: the file its name
    /// says holds the part is checked as adoption checks it and adopted. Returns
    /// whether the part is resident now. Blocking file I/O (one header read), and only
    /// while headers are still being read; at most once per file.
    pub fn claim_own(&self, object: &ListedObject, part_size: u64, index: u64) -> bool {
        self.adoption().claim_own(object, part_size, index)
    }

    fn adoption(&self) -> Adoption<'_> {
        Adoption {
            books: &self.books,
            parts: &self.parts,
            counters: &self.counters,
        }
    }

    pub fn stats(&self) -> CacheStats {
        let books = self.books.lock();
        let counted = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let c = &*self.counters;
        CacheStats {
            budget_bytes: self.budget_bytes,
            cached_bytes: books.policy.used_bytes() + books.strays.total_bytes,
            reserved_bytes: books.policy.reserved_bytes(),
            cached_parts: books.policy.resident_parts(),
            cached_groups: books.policy.resident_groups(),
            evicted_parts: counted(&c.cache_evicted_parts),
            parts_not_cached_for_lack_of_room: counted(&c.cache_parts_not_cached_for_lack_of_room),
            corrupt_parts_dropped: counted(&c.cache_corrupt_parts_dropped),
            unreadable_parts_dropped: counted(&c.cache_unreadable_parts_dropped),
            disk_unusable: self.disk.unusable(),
            parts_not_cached_for_disk_errors: counted(&c.cache_parts_not_cached_for_disk_errors),
            adopted_parts: counted(&c.cache_adopted_parts),
            adopted_bytes: counted(&c.cache_adopted_bytes),
            adopted_by_reads: counted(&c.cache_adopted_by_reads),
            unclaimed_parts: books.strays.names.len(),
            unclaimed_bytes: books.strays.total_bytes,
            stale_parts_removed: counted(&c.cache_stale_parts_removed),
            adoption_done: books.strays.headers_read,
            part_files_reopened: self.open_files.reopened(),
        }
    }

    /// Stops advising the kernel to read a whole part at its first read, for a mount
    /// whose read-around reads the windows around reads through the part files in
    /// order ([`read_advice`]).
    pub fn leave_read_ahead_to_read_around(&self) {
        self.read_advice.leave_to_read_around();
    }

    /// Drops a part whose bytes failed their checksum, unless an earlier read dropped
    /// it already (then the part may have been fetched again: a new file).
    fn drop_corrupt(&self, key: PartKey, file: &Arc<ResidentFile>, block: u64) {
        if let Some(path) = self.drop_resident(key, file) {
            Metrics::add(&self.counters.cache_corrupt_parts_dropped, 1);
            tracing::error!(path = %path.display(), part = ?key, block, "a cached part failed its checksum: dropped, and fetched again when read");
        }
    }

    /// Drops a part whose file could not be opened or read, as
    /// [`DiskCache::drop_corrupt`].
    fn drop_unreadable(&self, key: PartKey, file: &Arc<ResidentFile>, reason: &str) {
        if let Some(path) = self.drop_resident(key, file) {
            Metrics::add(&self.counters.cache_unreadable_parts_dropped, 1);
            tracing::error!(path = %path.display(), part = ?key, reason, "a cached part could not be read: dropped, and fetched again when read");
        }
    }

    /// Forgets and deletes `file` if it is still `key`'s.
    fn drop_resident(&self, key: PartKey, file: &Arc<ResidentFile>) -> Option<PathBuf> {
        let mut books = self.books.lock();
        let name = books.forget_if_current(key, file)?;
        let path = self.parts.dir.shown(&name);
        self.parts.delete(vec![name]);
        Some(path)
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod unreadable_part_tests;
