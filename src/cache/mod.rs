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
//! The cache outlives the mount ([`adopt`]): a directory records the source it belongs
//! to, and the part files of an earlier daemon are counted against the budget at once
//! (from their names) and adopted, in the background, by the objects the catalog lists
//! with the same ETag, or by the first read of their part ([`DiskCache::claim_own`]).
//!
//! The cache knows objects and parts, never SCDL: grouping parts into units is the
//! caller's decision, and eviction advice comes from an [`EvictionAdvisor`].

pub mod adopt;
pub mod open_files;
pub mod part_file;
pub mod policy;
pub mod spool;

use std::collections::{HashMap, VecDeque};
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
use adopt::{ListedObject, PartFileName, SourceRecord, Verdict};
use open_files::{OpenFiles, PartFile};
use part_file::PartHeader;
pub use policy::{Admission, EvictionAdvisor, NextUse, Policy, Recency, Unit};

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
/// against 1.34–1.37 s on a 1.46 GB dataset).
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
    #[error("cached part {part:?} could not be opened again ({reason}); dropped from the cache")]
    Vanished { part: PartKey, reason: String },
}

impl From<CacheError> for crate::error::FsError {
    fn from(error: CacheError) -> Self {
        match error {
            CacheError::Io(error) => error.into(),
            // Both were dropped from the cache: the read path fetches the part again.
            dropped @ (CacheError::Corrupt { .. } | CacheError::Vanished { .. }) => {
                crate::error::FsError::CacheCorrupt(dropped.to_string())
            }
        }
    }
}

struct Inner {
    policy: Policy,
    files: HashMap<PartKey, (Arc<ResidentFile>, PathBuf)>,
    strays: Strays,
}

/// Part files of an earlier daemon that no listed object has claimed yet. Their bytes
/// (what their names declare) are outside the policy's budget (which is the cache's
/// budget less theirs); they are deleted oldest first when a download needs their room.
#[derive(Default)]
struct Strays {
    /// Still on disk, oldest first; an entry no longer in `names` was claimed or removed.
    order: VecDeque<PathBuf>,
    names: HashMap<PathBuf, PartFileName>,
    total_bytes: u64,
    /// The newest stray of each part id ([`adopt::part_id`]), while headers are still
    /// being read, so that a read can claim its part's file itself.
    by_part: HashMap<u64, PathBuf>,
    /// Strays whose header has been read, by object key.
    by_key: HashMap<String, Vec<ReadStray>>,
    /// Objects listed while headers are still being read, so a stray read later
    /// finds its object; emptied once every header is read.
    listed: HashMap<String, (ListedObject, u64)>,
    headers_read: bool,
}

struct ReadStray {
    path: PathBuf,
    header: PartHeader,
    header_len: u64,
}

impl Strays {
    /// Forgets a stray (claimed or to be deleted); its bytes, if it was still known.
    fn take(&mut self, path: &Path) -> Option<u64> {
        let bytes = self.names.remove(path)?.len;
        self.total_bytes -= bytes;
        Some(bytes)
    }

    fn contains(&self, path: &Path) -> bool {
        self.names.contains_key(path)
    }

    fn oldest(&mut self) -> Option<(PathBuf, u64)> {
        while let Some(path) = self.order.pop_front() {
            if let Some(bytes) = self.take(&path) {
                return Some((path, bytes));
            }
        }
        None
    }
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
    parts_dir: PathBuf,
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
    disk: Mutex<DiskState>,
    disk_retry_after: Duration,
    refused_for_disk: AtomicU64,
    open_files: OpenFiles,
    /// The clock of the read-ahead advice ([`ADVISE_AGAIN_AFTER`]).
    opened: Instant,
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
    /// Opens the cache under `dir` for `owner`'s source, taking an exclusive lock on
    /// it. Part files an earlier daemon left count against the budget at once, at the
    /// lengths their names declare (the oldest beyond it are deleted);
    /// [`DiskCache::adopt_in_background`] then reads their headers so that listed
    /// objects can claim them.
    pub fn open(
        dir: &Path,
        owner: &CacheOwner,
        budget_bytes: u64,
        max_groups: Option<usize>,
    ) -> io::Result<DiskCache> {
        let root = dir.join(adopt::layout_dir_name());
        refuse_other_layouts(dir, &root, owner)?;
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
        let lock = lock_exclusively(&root.join("lock")).map_err(|error| match error.kind() {
            io::ErrorKind::WouldBlock => io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "cache directory {} is in use by another scdlfs mount; give each mount its own --cache-dir",
                    dir.display()
                ),
            ),
            _ => error,
        })?;
        claim_for_source(dir, &root, &parts_dir, owner)?;
        let scan = adopt::scan(&parts_dir, budget_bytes)?;
        let mut strays = Strays::default();
        for found in scan.parts {
            strays.total_bytes += found.name.len;
            strays.names.insert(found.path.clone(), found.name);
            // Oldest first: a part's newest file wins.
            strays.by_part.insert(found.name.part, found.path.clone());
            strays.order.push_back(found.path);
        }
        let mut over_budget = 0;
        while strays.total_bytes > budget_bytes {
            let (path, _) = strays.oldest().expect("bytes over budget are in files");
            fs::remove_file(&path)?;
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
            parts_dir,
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
            disk: Mutex::new(DiskState::default()),
            disk_retry_after: DISK_RETRY_AFTER,
            refused_for_disk: AtomicU64::new(0),
            opened: Instant::now(),
            open_files: OpenFiles::new(open_files::bound_for_this_process()),
            _lock: lock,
            #[cfg(test)]
            test_hook: Mutex::new(None),
        })
    }

    /// Reads the headers of the earlier mount's part files on threads of their own, so
    /// that a large cache does not delay the mount.
    pub fn adopt_in_background(self: &Arc<Self>) {
        if self.inner.lock().strays.headers_read {
            return;
        }
        let cache = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("scdlfs-adopt".into())
            .spawn(move || {
                let started = Instant::now();
                let paths: Vec<PathBuf> = match cache.upgrade() {
                    Some(cache) => cache.inner.lock().strays.order.iter().cloned().collect(),
                    None => return,
                };
                adopt::in_parallel(&paths, |path| {
                    if let Some(cache) = cache.upgrade() {
                        cache.read_stray(path.clone());
                    }
                });
                if let Some(cache) = cache.upgrade() {
                    cache.headers_done();
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
        let paths: Vec<PathBuf> = self.inner.lock().strays.order.iter().cloned().collect();
        for path in paths {
            self.read_stray(path);
        }
        self.headers_done();
    }

    /// Reads one stray's header; removes it if the header is bad, files it under its
    /// key otherwise, and lets an object listed already claim it.
    fn read_stray(&self, path: PathBuf) {
        let Some(name) = self.inner.lock().strays.names.get(&path).copied() else {
            return; // claimed by a read, or deleted for room, meanwhile
        };
        let read = adopt::read_header(&path, &name);
        let mut inner = self.inner.lock();
        let (header, header_len) = match read {
            Ok(read) => read,
            Err(reason) => {
                self.remove_stray(&mut inner, &path, &reason);
                return;
            }
        };
        let key = header.key.clone();
        inner
            .strays
            .by_key
            .entry(key.clone())
            .or_default()
            .push(ReadStray {
                path,
                header,
                header_len,
            });
        if let Some((object, part_size)) = inner.strays.listed.get(&key).cloned() {
            self.claim(&mut inner, &object, part_size);
        }
    }

    fn headers_done(&self) {
        let mut inner = self.inner.lock();
        inner.strays.headers_read = true;
        inner.strays.listed = HashMap::new();
        inner.strays.by_part = HashMap::new();
    }

    /// Tells the cache that the catalog listed `object`: it claims the earlier mount's
    /// parts of its key that are parts of it as it is now (cut at `part_size`), and the
    /// others of its key are deleted.
    pub fn object_listed(&self, object: ListedObject, part_size: u64) {
        let mut inner = self.inner.lock();
        if inner.strays.names.is_empty() {
            return;
        }
        if !inner.strays.headers_read {
            inner
                .strays
                .listed
                .insert(object.key.clone(), (object.clone(), part_size));
        }
        self.claim(&mut inner, &object, part_size);
    }

    fn claim(&self, inner: &mut Inner, object: &ListedObject, part_size: u64) {
        let Some(strays) = inner.strays.by_key.remove(&object.key) else {
            return;
        };
        for stray in strays {
            if inner.strays.contains(&stray.path) {
                self.judge_stray(inner, object, part_size, stray);
            }
        }
    }

    /// Whether some of the earlier mount's part files may still be claimed by a read
    /// ([`DiskCache::claim_own`]): their headers are still being read.
    pub fn claims_pending(&self) -> bool {
        !self.inner.lock().strays.by_part.is_empty()
    }

    /// Claims the earlier mount's file of part `index` of `object` for a read that
    /// comes before the background has read that file's header: the file its name
    /// says holds the part is checked as adoption checks it and adopted. Returns
    /// whether the part is resident now. Blocking file I/O (one header read), and only
    /// while headers are still being read; at most once per file.
    pub fn claim_own(&self, object: &ListedObject, part_size: u64, index: u64) -> bool {
        let key = PartKey {
            object: object.id,
            index,
        };
        let offset = index * part_size;
        let etag = object.etag.as_deref().unwrap_or_default();
        let (path, name) = {
            let inner = self.inner.lock();
            if inner.strays.by_part.is_empty() || inner.policy.contains(key) {
                return inner.policy.contains(key);
            }
            let part = adopt::part_id(&object.key, etag, offset);
            let Some(path) = inner.strays.by_part.get(&part) else {
                return false;
            };
            match inner.strays.names.get(path) {
                Some(name) => (path.clone(), *name),
                None => return false, // claimed or removed already
            }
        };
        let read = adopt::read_header(&path, &name);
        let mut inner = self.inner.lock();
        if !inner.strays.contains(&path) {
            return inner.policy.contains(key);
        }
        match read {
            Ok((header, _)) if header.key != object.key => false, // ids of two parts met
            Ok((header, header_len)) => {
                let stray = ReadStray {
                    path,
                    header,
                    header_len,
                };
                if self.judge_stray(&mut inner, object, part_size, stray) {
                    self.adopted_by_reads.fetch_add(1, Ordering::Relaxed);
                }
                inner.policy.contains(key)
            }
            Err(reason) => {
                self.remove_stray(&mut inner, &path, &reason);
                false
            }
        }
    }

    /// Adopts a stray whose header names `object`'s key, if it is a part of the object
    /// as listed now; deletes it otherwise. Returns whether it was adopted.
    fn judge_stray(
        &self,
        inner: &mut Inner,
        object: &ListedObject,
        part_size: u64,
        stray: ReadStray,
    ) -> bool {
        let index = match adopt::judge(&stray.header, object, part_size) {
            Verdict::Adopt { index } => index,
            Verdict::Remove(reason) => {
                self.remove_stray(inner, &stray.path, reason);
                return false;
            }
        };
        // Opened when first read: a large cache would not fit the descriptor limit.
        let file = OpenFiles::closed(stray.path.clone());
        let bytes = inner
            .strays
            .take(&stray.path)
            .expect("checked by the caller");
        let budget = inner.policy.budget_bytes() + bytes;
        inner.policy.set_budget_bytes(budget);
        let key = PartKey {
            object: object.id,
            index,
        };
        if !inner.policy.adopt(key, object.group, bytes) {
            // Downloaded again already, or over the chunk budget.
            self.stale_removed.fetch_add(1, Ordering::Relaxed);
            self.delete_files(vec![stray.path]);
            return false;
        }
        self.adopted_parts.fetch_add(1, Ordering::Relaxed);
        self.adopted_bytes.fetch_add(bytes, Ordering::Relaxed);
        let header = stray.header;
        inner.files.insert(
            key,
            (
                Arc::new(ResidentFile {
                    file,
                    data_offset: stray.header_len,
                    data_len: header.data_len,
                    block_len: header.block_len,
                    block_crc32c: header.block_crc32c.into(),
                    advised_at_ms: AtomicU64::new(0),
                }),
                stray.path,
            ),
        );
        true
    }

    /// Deletes a stray of no use, handing its room to the books.
    fn remove_stray(&self, inner: &mut Inner, path: &Path, reason: &str) {
        let Some(bytes) = inner.strays.take(path) else {
            return;
        };
        tracing::debug!(path = %path.display(), reason, "an earlier mount's part file is not adopted: removed");
        self.stale_removed.fetch_add(1, Ordering::Relaxed);
        self.delete_files(vec![path.to_owned()]);
        let budget = inner.policy.budget_bytes() + bytes;
        inner.policy.set_budget_bytes(budget);
    }

    /// Deletes the oldest strays until `bytes` more fit the books' budget (or none is
    /// left): an earlier mount's parts that nothing claimed are the least recently used.
    fn make_room_from_strays(&self, inner: &mut Inner, bytes: u64) {
        while inner.policy.used_bytes() + inner.policy.reserved_bytes() + bytes
            > inner.policy.budget_bytes()
        {
            let Some((path, freed)) = inner.strays.oldest() else {
                return;
            };
            self.evicted_parts.fetch_add(1, Ordering::Relaxed);
            self.delete_files(vec![path]);
            let budget = inner.policy.budget_bytes() + freed;
            inner.policy.set_budget_bytes(budget);
        }
    }
    /// The directory whose files the budget bounds.
    #[cfg(test)]
    fn parts_dir(&self) -> &Path {
        &self.parts_dir
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
            tracing::error!(path = %path.display(), part = ?key, block, "a cached part failed its checksum: dropped, and fetched again when read");
        }
    }

    /// Drops a part whose file could not be opened again, as [`DiskCache::drop_corrupt`].
    fn drop_unreadable(&self, key: PartKey, file: &Arc<ResidentFile>, reason: &str) {
        if let Some(path) = self.drop_resident(key, file) {
            tracing::error!(path = %path.display(), part = ?key, reason, "a cached part could not be opened again: dropped, and fetched again when read");
        }
    }

    /// Forgets and deletes `file` if it is still `key`'s, counting it as dropped.
    fn drop_resident(&self, key: PartKey, file: &Arc<ResidentFile>) -> Option<PathBuf> {
        let mut inner = self.inner.lock();
        let (resident, _) = inner.files.get(&key)?;
        if !Arc::ptr_eq(resident, file) {
            return None;
        }
        let (_, path) = inner.files.remove(&key).expect("present");
        inner.policy.discard(key);
        self.delete_files(vec![path.clone()]);
        drop(inner);
        self.corrupt_dropped.fetch_add(1, Ordering::Relaxed);
        Some(path)
    }
}

/// Options for the cache's own files: readable by the daemon's user only, and never
/// through a symbolic link planted in their place.
fn private_file() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.mode(0o600).custom_flags(libc::O_NOFOLLOW);
    options
}

/// How long a mount waits for the cache directory's lock: a mount that just ended (a
/// restart, a remount) may take a moment to let its threads go.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// Takes an exclusive lock on `path` (created if missing) for as long as the file lives,
/// waiting at most [`LOCK_WAIT`] for another holder to let go.
fn lock_exclusively(path: &Path) -> io::Result<File> {
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
fn refuse_other_layouts(dir: &Path, ours: &Path, owner: &CacheOwner) -> io::Result<()> {
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
fn claim_for_source(
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

thread_local! {
    /// Where a read puts the blocks it covers only in part, to check them whole.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A part's data in a file, with the CRC32C of each of its blocks (all of them, or
/// the first ones of a part still being written, whose reads stay within them).
struct CheckedBlocks<'a> {
    file: &'a File,
    data_offset: u64,
    data_len: u64,
    block_len: u64,
    block_crc32c: &'a [u32],
}

enum BlockReadFailure {
    Io(io::Error),
    BadBlock(u64),
}

impl From<io::Error> for BlockReadFailure {
    fn from(error: io::Error) -> Self {
        BlockReadFailure::Io(error)
    }
}

/// Fills `buf` from `offset` within the data of `blocks`, checking every block it
/// touches against its CRC32C. Blocks the request covers whole are read straight into
/// `buf`; the (at most two) blocks it covers in part are read whole into a scratch
/// buffer.
fn read_checked(
    blocks: &CheckedBlocks<'_>,
    buf: &mut [u8],
    offset: u64,
) -> Result<(), BlockReadFailure> {
    let range = offset..offset + buf.len() as u64;
    assert!(range.end <= blocks.data_len, "read past the part's end");
    let block_len = blocks.block_len;
    let block_range = |block: u64| span(block, block_len, blocks.data_len);
    let check = |block: u64, bytes: &[u8]| {
        let expected = blocks.block_crc32c.get(block as usize);
        assert!(expected.is_some(), "read of a block not yet written");
        if expected == Some(&crc32c::crc32c(bytes)) {
            Ok(())
        } else {
            Err(BlockReadFailure::BadBlock(block))
        }
    };
    let touched = spans_touched(&range, block_len);
    let covered = |block: u64| {
        let bytes = block_range(block);
        range.start <= bytes.start && bytes.end <= range.end
    };
    let whole_start = touched.start + u64::from(!covered(touched.start));
    let whole_end = touched.end - u64::from(touched.end > whole_start && !covered(touched.end - 1));
    if whole_start < whole_end {
        let bytes = block_range(whole_start).start..block_range(whole_end - 1).end;
        let dest = &mut buf[(bytes.start - offset) as usize..(bytes.end - offset) as usize];
        blocks
            .file
            .read_exact_at(dest, blocks.data_offset + bytes.start)?;
        for (i, block) in dest.chunks(block_len as usize).enumerate() {
            check(whole_start + i as u64, block)?;
        }
    }
    for block in touched.filter(|b| !(whole_start..whole_end).contains(b)) {
        let bytes = block_range(block);
        SCRATCH.with_borrow_mut(|scratch| {
            scratch.resize((bytes.end - bytes.start) as usize, 0);
            blocks
                .file
                .read_exact_at(scratch, blocks.data_offset + bytes.start)?;
            check(block, scratch)?;
            let from = range.start.max(bytes.start);
            let to = range.end.min(bytes.end);
            buf[(from - offset) as usize..(to - offset) as usize].copy_from_slice(
                &scratch[(from - bytes.start) as usize..(to - bytes.start) as usize],
            );
            Ok::<_, BlockReadFailure>(())
        })?;
    }
    Ok(())
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
    /// touches ([`read_checked`]).
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<(), CacheError> {
        if buf.is_empty() {
            return Ok(());
        }
        let file = &*self.file;
        let handle = self
            .cache
            .open_files
            .file(&file.file, |path| private_file().read(true).open(path))
            .map_err(|error| self.vanished(error))?;
        let blocks = CheckedBlocks {
            file: &handle,
            data_offset: file.data_offset,
            data_len: file.data_len,
            block_len: file.block_len as u64,
            block_crc32c: &file.block_crc32c,
        };
        let result = read_checked(&blocks, buf, offset);
        if result.is_ok() {
            self.advise_whole_part(&handle);
        }
        result.map_err(|failure| match failure {
            BlockReadFailure::Io(error) => CacheError::Io(error),
            BlockReadFailure::BadBlock(block) => {
                self.cache.drop_corrupt(self.key, &self.file, block);
                CacheError::Corrupt {
                    part: self.key,
                    block,
                }
            }
        })
    }

    /// Asks the kernel to bring the whole part into the page cache, at most once per
    /// [`ADVISE_AGAIN_AFTER`]. Advice only: a failure changes nothing but speed.
    fn advise_whole_part(&self, handle: &File) {
        let now = self.cache.opened.elapsed().as_millis() as u64 + 1;
        let last = self.file.advised_at_ms.load(Ordering::Relaxed);
        if last != 0 && now - last < ADVISE_AGAIN_AFTER.as_millis() as u64 {
            return;
        }
        if self
            .file
            .advised_at_ms
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            let len = std::num::NonZeroU64::new(self.file.data_len);
            let _ = rustix::fs::fadvise(
                handle,
                self.file.data_offset,
                len,
                rustix::fs::Advice::WillNeed,
            );
        }
    }

    /// A part file that cannot be opened again (deleted behind the daemon's back) is
    /// dropped like a corrupt one, so the read fetches the part afresh.
    fn vanished(&self, error: io::Error) -> CacheError {
        self.cache
            .drop_unreadable(self.key, &self.file, &error.to_string());
        CacheError::Vanished {
            part: self.key,
            reason: error.to_string(),
        }
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
#[path = "../../tests/common/files.rs"]
mod test_files;

#[cfg(test)]
mod tests {
    use super::test_files::{dir_bytes, flip_bit};
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

    fn owner() -> CacheOwner {
        CacheOwner {
            source: "s3://bucket/atlas".into(),
            endpoint: None,
            reset: false,
        }
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

    #[test]
    fn the_directory_stays_within_budget_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let part = 10_000usize;
        let budget = 3 * disk_len(part);
        let cache = Arc::new(DiskCache::open(dir.path(), &owner(), budget, None).unwrap());
        for object in 0..10u64 {
            let data = vec![object as u8; part];
            assert!(cache.insert(key(object), None, ORIGIN, &data));
            assert!(dir_bytes(cache.parts_dir()) <= budget);
        }
        let pinned = cache.get(key(9), Recency::Use).unwrap();
        let mut buf = [0u8; 4];
        pinned.read_exact_at(&mut buf, 5).unwrap();
        assert_eq!(buf, [9; 4]);
        assert!(cache.get(key(0), Recency::Use).is_none());
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
        let cache = Arc::new(DiskCache::open(dir.path(), &owner(), budget, None).unwrap());
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
        let cache = Arc::new(DiskCache::open(dir.path(), &owner(), budget, None).unwrap());
        assert!(cache.insert(key(2), None, ORIGIN, &[2; 10_000]));
        let _kept = cache.get(key(2), Recency::Use).unwrap();
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
        let mut cache = DiskCache::open(dir.path(), &owner(), 1 << 20, None).unwrap();
        cache.disk_retry_after = Duration::from_millis(200);
        let cache = Arc::new(cache);
        assert!(cache.insert(key(1), None, ORIGIN, &[1; 100]));
        let kept = cache.get(key(1), Recency::Use).unwrap();
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
        let cache = Arc::new(DiskCache::open(dir.path(), &owner(), 1 << 20, None).unwrap());
        assert!(cache.insert(key(1), None, ORIGIN, &[1; 100]));
        let mode = |path: &Path| fs::metadata(path).unwrap().permissions().mode() & 0o777;
        let root = dir.path().join(adopt::layout_dir_name());
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(cache.parts_dir()), 0o700);
        assert_eq!(mode(&root.join("lock")), 0o600);
        assert_eq!(mode(&only_file(cache.parts_dir())), 0o600);
        drop(cache);

        let elsewhere = tempfile::tempdir().unwrap();
        let planted = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(
            elsewhere.path(),
            planted.path().join(adopt::layout_dir_name()),
        )
        .unwrap();
        let refused = DiskCache::open(planted.path(), &owner(), 1 << 20, None)
            .err()
            .unwrap();
        assert!(refused.to_string().contains("symbolic link"), "{refused}");
    }

    #[test]
    fn a_second_daemon_cannot_share_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let _first = DiskCache::open(dir.path(), &owner(), 1 << 20, None).unwrap();
        let second = DiskCache::open(dir.path(), &owner(), 1 << 20, None);
        assert!(second.is_err());
    }

    #[test]
    fn pinned_parts_leave_new_parts_uncached() {
        let dir = tempfile::tempdir().unwrap();
        let budget = disk_len(100);
        let cache = Arc::new(DiskCache::open(dir.path(), &owner(), budget, None).unwrap());
        assert!(cache.insert(key(1), None, ORIGIN, &[1; 100]));
        let pinned = cache.get(key(1), Recency::Use).unwrap();
        assert!(!cache.insert(key(2), None, ORIGIN, &[2; 100]));
        drop(pinned);
        assert!(cache.insert(key(2), None, ORIGIN, &[2; 100]));
        assert_eq!(cache.stats().parts_not_cached_for_lack_of_room, 1);
    }

    #[test]
    fn a_flipped_bit_is_caught_and_drops_the_part() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Arc::new(DiskCache::open(dir.path(), &owner(), 1 << 30, None).unwrap());
        let data: Vec<u8> = (0..3 * BLOCK_LEN as usize + 100)
            .map(|i| (i % 253) as u8)
            .collect();
        assert!(cache.insert(key(1), None, ORIGIN, &data));
        let path = only_file(cache.parts_dir());
        let data_offset = fs::metadata(&path).unwrap().len() - data.len() as u64;
        // A byte in the third block.
        flip_bit(&path, data_offset + 2 * BLOCK_LEN as u64 + 7);
        let pinned = cache.get(key(1), Recency::Use).unwrap();
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
        assert!(
            cache.get(key(1), Recency::Use).is_none(),
            "dropped from the index"
        );
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
        let again = cache.get(key(1), Recency::Use).unwrap();
        again
            .read_exact_at(&mut buf, 2 * BLOCK_LEN as u64 + 500)
            .unwrap();
        assert_eq!(buf, data[2 * BLOCK_LEN as usize + 500..][..1000]);
    }

    fn listed(object: u64, etag: &str, size: u64, group: Option<GroupId>) -> ListedObject {
        ListedObject {
            id: ObjectId(object),
            key: ORIGIN.key.into(),
            etag: Some(etag.into()),
            size,
            group,
        }
    }

    /// A cache of `parts` parts of 1000 bytes of object `ORIGIN.key`, closed again.
    fn earlier_mount(dir: &Path, parts: u64) {
        let cache = Arc::new(DiskCache::open(dir, &owner(), 1 << 30, None).unwrap());
        for index in 0..parts {
            let origin = PartOrigin {
                object_offset: index * 1000,
                ..ORIGIN
            };
            assert!(cache.insert(
                PartKey {
                    object: ObjectId(9),
                    index
                },
                None,
                origin,
                &[index as u8; 1000]
            ));
        }
    }

    /// The last ten bytes of a resident part of 1000 bytes.
    fn last_bytes(cache: &Arc<DiskCache>, object: u64, index: u64) -> [u8; 10] {
        let part = cache
            .get(
                PartKey {
                    object: ObjectId(object),
                    index,
                },
                Recency::Use,
            )
            .expect("resident");
        let mut buf = [0u8; 10];
        part.read_exact_at(&mut buf, 990).unwrap();
        buf
    }

    #[test]
    fn a_remount_adopts_the_parts_of_an_unchanged_object_into_its_group() {
        let dir = tempfile::tempdir().unwrap();
        earlier_mount(dir.path(), 3);
        let cache = Arc::new(DiskCache::open(dir.path(), &owner(), 1 << 30, None).unwrap());
        let stats = cache.stats();
        assert_eq!(
            (stats.unclaimed_parts, stats.cached_bytes),
            (3, 3 * disk_len(1000))
        );
        cache.adopt_now();
        // Ids are the new mount's: the object is listed under another id now.
        cache.object_listed(listed(4, ORIGIN.etag, 3000, Some(GroupId(2))), 1000);
        let stats = cache.stats();
        assert_eq!(
            (
                stats.adopted_parts,
                stats.unclaimed_parts,
                stats.cached_groups
            ),
            (3, 0, 1)
        );
        assert_eq!(last_bytes(&cache, 4, 2), [2; 10]);
        assert!(
            cache.insert(key(5), None, ORIGIN, &[5; 1000]),
            "new files take new names"
        );
        assert_eq!(fs::read_dir(cache.parts_dir()).unwrap().count(), 4);
    }

    #[test]
    fn an_object_listed_before_its_headers_are_read_still_adopts() {
        let dir = tempfile::tempdir().unwrap();
        earlier_mount(dir.path(), 2);
        let cache = Arc::new(DiskCache::open(dir.path(), &owner(), 1 << 30, None).unwrap());
        cache.object_listed(listed(0, ORIGIN.etag, 2000, None), 1000);
        assert_eq!(cache.stats().adopted_parts, 0);
        cache.adopt_now();
        assert_eq!(cache.stats().adopted_parts, 2);
    }

    #[test]
    fn parts_of_a_changed_object_or_another_part_size_are_removed() {
        for (etag, size, part_size) in [("\"v2\"", 2000, 1000), (ORIGIN.etag, 2000, 2000)] {
            let dir = tempfile::tempdir().unwrap();
            earlier_mount(dir.path(), 2);
            let cache = Arc::new(DiskCache::open(dir.path(), &owner(), 1 << 30, None).unwrap());
            cache.adopt_now();
            cache.object_listed(listed(0, etag, size, None), part_size);
            let stats = cache.stats();
            assert_eq!(
                (
                    stats.adopted_parts,
                    stats.stale_parts_removed,
                    stats.cached_bytes
                ),
                (0, 2, 0)
            );
            assert_eq!(fs::read_dir(cache.parts_dir()).unwrap().count(), 0);
        }
    }

    #[test]
    fn bad_headers_and_torn_writes_are_removed_and_bad_data_is_never_served() {
        let dir = tempfile::tempdir().unwrap();
        earlier_mount(dir.path(), 3);
        let parts_dir = dir.path().join(adopt::layout_dir_name()).join("parts");
        let mut files: Vec<_> = fs::read_dir(&parts_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        flip_bit(&files[0], 20); // in the header
        let data_start = fs::metadata(&files[1]).unwrap().len() - 1000;
        flip_bit(&files[1], data_start + 5); // in the data
        fs::write(parts_dir.join("00000000000000ff.part.tmp"), [1; 100]).unwrap();
        let cache = Arc::new(DiskCache::open(dir.path(), &owner(), 1 << 30, None).unwrap());
        cache.adopt_now();
        cache.object_listed(listed(0, ORIGIN.etag, 3000, None), 1000);
        let stats = cache.stats();
        assert_eq!(
            (stats.adopted_parts, stats.stale_parts_removed),
            (2, 2),
            "{stats:?}"
        );
        assert!(cache
            .get(
                PartKey {
                    object: ObjectId(0),
                    index: 0
                },
                Recency::Use
            )
            .is_none());
        let bad = cache
            .get(
                PartKey {
                    object: ObjectId(0),
                    index: 1,
                },
                Recency::Use,
            )
            .unwrap();
        let mut buf = [0u8; 10];
        assert!(matches!(
            bad.read_exact_at(&mut buf, 0),
            Err(CacheError::Corrupt { .. })
        ));
        assert_eq!(fs::read_dir(&parts_dir).unwrap().count(), 1);
    }

    /// The part files of a cache directory, oldest first.
    fn part_files(dir: &Path) -> Vec<PathBuf> {
        let mut files: Vec<_> = fs::read_dir(dir.join(adopt::layout_dir_name()).join("parts"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        files
    }

    #[test]
    fn a_read_claims_its_own_part_before_the_headers_are_read() {
        let dir = tempfile::tempdir().unwrap();
        earlier_mount(dir.path(), 4);
        let files = part_files(dir.path());
        flip_bit(&files[2], 20); // part 2's header
        let cache = Arc::new(DiskCache::open(dir.path(), &owner(), 1 << 30, None).unwrap());
        let object = listed(4, ORIGIN.etag, 4000, None);
        assert!(cache.claims_pending());
        assert!(cache.claim_own(&object, 1000, 1));
        let stats = cache.stats();
        assert_eq!(
            (
                stats.adopted_parts,
                stats.adopted_by_reads,
                stats.unclaimed_parts
            ),
            (1, 1, 3)
        );
        assert_eq!(last_bytes(&cache, 4, 1), [1; 10]);
        assert!(!cache.claim_own(&object, 1000, 2), "a damaged header");
        assert!(!files[2].exists(), "removed, never served");
        let changed = listed(4, "\"v2\"", 4000, None);
        assert!(
            !cache.claim_own(&changed, 1000, 3),
            "no file of that version"
        );
        assert!(files[3].exists());
        // The background adopts the rest and finds the claimed part taken.
        cache.adopt_now();
        assert!(!cache.claims_pending());
        cache.object_listed(object, 1000);
        let stats = cache.stats();
        assert_eq!(
            (
                stats.adopted_parts,
                stats.unclaimed_parts,
                stats.stale_parts_removed
            ),
            (3, 0, 1)
        );
    }

    #[test]
    fn a_read_of_another_part_size_removes_the_file_it_finds() {
        let dir = tempfile::tempdir().unwrap();
        earlier_mount(dir.path(), 2);
        let cache = Arc::new(DiskCache::open(dir.path(), &owner(), 1 << 30, None).unwrap());
        // Part 0 at 2000 bytes a part starts where the earlier mount's part 0 did.
        assert!(!cache.claim_own(&listed(4, ORIGIN.etag, 2000, None), 2000, 0));
        let stats = cache.stats();
        assert_eq!((stats.stale_parts_removed, stats.unclaimed_parts), (1, 1));
    }

    #[test]
    fn the_budget_counts_what_the_names_declare_until_the_headers_are_read() {
        let dir = tempfile::tempdir().unwrap();
        earlier_mount(dir.path(), 3);
        // Cut short behind the daemon's back (a power loss after the rename).
        let cut = &part_files(dir.path())[0];
        let full = fs::metadata(cut).unwrap().len();
        File::options()
            .write(true)
            .open(cut)
            .unwrap()
            .set_len(full / 2)
            .unwrap();
        let budget = 3 * disk_len(1000);
        let cache = Arc::new(DiskCache::open(dir.path(), &owner(), budget, None).unwrap());
        assert_eq!(
            cache.stats().cached_bytes,
            budget,
            "at least what is on disk"
        );
        assert!(dir_bytes(cache.parts_dir()) < budget);
        cache.adopt_now();
        let stats = cache.stats();
        assert_eq!(
            (stats.stale_parts_removed, stats.cached_bytes),
            (1, 2 * disk_len(1000)),
            "the cut file removed, its room released"
        );
        assert!(cache.insert(key(7), None, ORIGIN, &[7; 1000]));
        assert_eq!(cache.stats().unclaimed_parts, 2, "no stray gave way");
        assert_eq!(dir_bytes(cache.parts_dir()), budget);
    }

    #[test]
    fn a_smaller_budget_shrinks_the_directory_at_open_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        earlier_mount(dir.path(), 5);
        let budget = 2 * disk_len(1000);
        let cache = Arc::new(DiskCache::open(dir.path(), &owner(), budget, None).unwrap());
        assert!(dir_bytes(cache.parts_dir()) <= budget);
        cache.adopt_now();
        cache.object_listed(listed(0, ORIGIN.etag, 5000, None), 1000);
        assert!(
            cache.contains(PartKey {
                object: ObjectId(0),
                index: 4
            }),
            "the newest kept"
        );
        // Unclaimed strays make room for new parts, and the budget holds.
        assert!(cache.insert(key(7), None, ORIGIN, &[7; 1000]));
        assert!(dir_bytes(cache.parts_dir()) <= budget);
    }

    #[test]
    fn unclaimed_parts_give_way_to_new_ones_within_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        earlier_mount(dir.path(), 3);
        let budget = 3 * disk_len(1000);
        let cache = Arc::new(DiskCache::open(dir.path(), &owner(), budget, None).unwrap());
        for object in 10..13 {
            assert!(cache.insert(key(object), None, ORIGIN, &[1; 1000]));
            assert!(dir_bytes(cache.parts_dir()) <= budget);
        }
        assert_eq!(cache.stats().unclaimed_parts, 0);
    }

    #[test]
    fn a_cache_of_another_source_or_version_is_refused_unless_reset() {
        let dir = tempfile::tempdir().unwrap();
        earlier_mount(dir.path(), 1);
        let other = CacheOwner {
            source: "s3://another/one".into(),
            ..owner()
        };
        let refused = DiskCache::open(dir.path(), &other, 1 << 20, None)
            .err()
            .unwrap();
        assert!(
            refused
                .to_string()
                .contains("belongs to the source s3://bucket/atlas"),
            "{refused}"
        );
        let reset = CacheOwner {
            reset: true,
            ..other
        };
        let cache = DiskCache::open(dir.path(), &reset, 1 << 20, None).unwrap();
        assert_eq!(fs::read_dir(cache.parts_dir()).unwrap().count(), 0);
        drop(cache);

        let old = tempfile::tempdir().unwrap();
        fs::create_dir_all(old.path().join("scdlfs-v1/parts")).unwrap();
        DiskCache::open(old.path(), &owner(), 1 << 20, None).unwrap();
        assert!(
            !old.path().join("scdlfs-v1").exists(),
            "the first layout, emptied at every mount by its versions, is removed unasked"
        );

        let second = tempfile::tempdir().unwrap();
        let record = |source: &str| {
            let mut record = SourceRecord::of(source, None);
            record.layout_version = 2;
            record.encode()
        };
        fs::create_dir_all(second.path().join("scdlfs-cache-v2/parts")).unwrap();
        fs::write(
            second.path().join("scdlfs-cache-v2/source.json"),
            record("s3://another/one"),
        )
        .unwrap();
        let refused = DiskCache::open(second.path(), &owner(), 1 << 20, None)
            .err()
            .unwrap();
        assert!(
            refused.to_string().contains("(scdlfs-cache-v2)"),
            "another source's cache of the second layout is refused: {refused}"
        );
        fs::write(
            second.path().join("scdlfs-cache-v2/source.json"),
            record(&owner().source),
        )
        .unwrap();
        DiskCache::open(second.path(), &owner(), 1 << 20, None).unwrap();
        assert!(
            !second.path().join("scdlfs-cache-v2").exists(),
            "the source's own cache of the second layout is removed unasked"
        );

        let newer = tempfile::tempdir().unwrap();
        fs::create_dir_all(newer.path().join("scdlfs-cache-v9/parts")).unwrap();
        let refused = DiskCache::open(newer.path(), &owner(), 1 << 20, None)
            .err()
            .unwrap();
        assert!(
            refused
                .to_string()
                .contains("another scdlfs version (scdlfs-cache-v9)"),
            "{refused}"
        );
        let reset = CacheOwner {
            reset: true,
            ..owner()
        };
        DiskCache::open(newer.path(), &reset, 1 << 20, None).unwrap();
        assert!(!newer.path().join("scdlfs-cache-v9").exists());
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
            let cache = Arc::new(DiskCache::open(dir.path(), &owner(), 1 << 30, None).unwrap());
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 256) as u8).collect();
            assert!(cache.insert(key(1), None, ORIGIN, &data));
            let flipped = flip.map(|f| (f * len as f64) as u64);
            if let Some(at) = flipped {
                let path = only_file(cache.parts_dir());
                flip_bit(&path, fs::metadata(&path).unwrap().len() - len as u64 + at);
            }
            let pinned = cache.get(key(1), Recency::Use).unwrap();
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
