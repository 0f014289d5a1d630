//! The local disk cache: parts of objects kept as files under a byte budget.
//!
//! [`policy`] keeps the books (resident parts, reservations, pins, LRU units) without
//! touching the disk; [`part_file`] is the versioned on-disk format of one part. This
//! module joins them: a part is written to a temporary name and renamed into place
//! only after its bytes were reserved and the evicted parts' files were deleted, so the
//! cache directory never holds more than the budget. Readers get a [`PinnedPart`],
//! which keeps the part resident until it is dropped.
//!
//! The cache knows objects and parts, never SCDL: grouping parts into units is the
//! caller's decision, and eviction advice comes from an [`EvictionAdvisor`].

pub mod part_file;
pub mod policy;

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use part_file::{PartHeader, HEADER_LEN};
pub use policy::{EvictionAdvisor, GroupId, NextUse, ObjectId, PartKey, Policy, Unit};

/// The subdirectory of `--cache-dir` that this format version owns.
const VERSION_DIR: &str = "scdlfs-v1";

#[derive(Debug)]
struct ResidentFile {
    file: File,
    data_len: u64,
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
}

pub struct DiskCache {
    parts_dir: PathBuf,
    inner: Mutex<Inner>,
    advisor: RwLock<Option<Arc<dyn EvictionAdvisor>>>,
    next_file: AtomicU64,
    evicted_parts: AtomicU64,
    refused_for_room: AtomicU64,
    /// Held for the daemon's life: an exclusive lock on the cache directory.
    _lock: File,
}

impl DiskCache {
    /// Opens the cache under `dir`, taking an exclusive lock on it. Parts left by an
    /// earlier daemon are removed: this version starts every mount cold.
    pub fn open(dir: &Path, budget_bytes: u64, max_groups: Option<usize>) -> io::Result<DiskCache> {
        let root = dir.join(VERSION_DIR);
        let parts_dir = root.join("parts");
        fs::create_dir_all(&parts_dir)?;
        let lock = OpenOptions::new()
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
            _lock: lock,
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
        header: &PartHeader,
        data: &[u8],
    ) -> io::Result<bool> {
        if !PartHeader::fits(&header.key, &header.etag) {
            return Ok(false);
        }
        let disk_bytes = (HEADER_LEN + data.len()) as u64;
        let advisor = self.advisor.read().clone();
        let (reservation, victims) = {
            let mut inner = self.inner.lock();
            if inner.policy.contains(key) {
                return Ok(true);
            }
            let (reservation, victims) =
                inner
                    .policy
                    .reserve(disk_bytes, Unit::of(key, group), advisor.as_deref());
            (reservation, self.forget_files(&mut inner, victims))
        };
        self.delete_files(victims);
        let Some(reservation) = reservation else {
            self.refused_for_room.fetch_add(1, Ordering::Relaxed);
            return Ok(false);
        };
        let written = self.write_part_file(header, data);
        let mut inner = self.inner.lock();
        match written {
            Ok((file, path)) => {
                if !inner.policy.commit(reservation, key, group) {
                    // Another download of the same part landed first.
                    drop(inner);
                    self.delete_files(vec![path]);
                    return Ok(true);
                }
                inner.files.insert(
                    key,
                    (
                        Arc::new(ResidentFile {
                            file,
                            data_len: data.len() as u64,
                        }),
                        path,
                    ),
                );
                Ok(true)
            }
            Err(error) => {
                inner.policy.cancel(reservation);
                Err(error)
            }
        }
    }

    fn forget_files(&self, inner: &mut Inner, victims: Vec<PartKey>) -> Vec<PathBuf> {
        self.evicted_parts
            .fetch_add(victims.len() as u64, Ordering::Relaxed);
        victims
            .into_iter()
            .filter_map(|key| inner.files.remove(&key).map(|(_, path)| path))
            .collect()
    }

    fn delete_files(&self, paths: Vec<PathBuf>) {
        for path in paths {
            if let Err(error) = fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), %error, "could not delete an evicted cache file");
            }
        }
    }

    fn write_part_file(&self, header: &PartHeader, data: &[u8]) -> io::Result<(File, PathBuf)> {
        let id = self.next_file.fetch_add(1, Ordering::Relaxed);
        let path = self.parts_dir.join(format!("{id:016x}.part"));
        let tmp = self.parts_dir.join(format!("{id:016x}.part.tmp"));
        let result = (|| {
            let mut file = File::create(&tmp)?;
            file.write_all(&header.encode())?;
            file.write_all(data)?;
            fs::rename(&tmp, &path)?;
            File::open(&path)
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
        }
    }
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

    /// Fills `buf` from `offset` within the part's data.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file
            .file
            .read_exact_at(buf, HEADER_LEN as u64 + offset)
    }
}

impl Drop for PinnedPart {
    fn drop(&mut self) {
        self.cache.inner.lock().policy.unpin(self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(len: usize) -> PartHeader {
        PartHeader {
            key: "k".into(),
            etag: "e".into(),
            object_offset: 0,
            data_len: len as u64,
            data_crc32c: 0,
        }
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

    #[test]
    fn the_directory_stays_within_budget_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let part = 10_000usize;
        let budget = 3 * (HEADER_LEN + part) as u64;
        let cache = Arc::new(DiskCache::open(dir.path(), budget, None).unwrap());
        for object in 0..10u64 {
            let data = vec![object as u8; part];
            assert!(cache
                .insert(key(object), None, &header(part), &data)
                .unwrap());
            assert!(dir_bytes(cache.parts_dir()) <= budget);
        }
        let pinned = cache.get(key(9)).unwrap();
        let mut buf = [0u8; 4];
        pinned.read_exact_at(&mut buf, 5).unwrap();
        assert_eq!(buf, [9; 4]);
        assert!(cache.get(key(0)).is_none());
        assert_eq!(cache.stats().evicted_parts, 7);
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
        let budget = (HEADER_LEN + 100) as u64;
        let cache = Arc::new(DiskCache::open(dir.path(), budget, None).unwrap());
        assert!(cache.insert(key(1), None, &header(100), &[1; 100]).unwrap());
        let pinned = cache.get(key(1)).unwrap();
        assert!(!cache.insert(key(2), None, &header(100), &[2; 100]).unwrap());
        drop(pinned);
        assert!(cache.insert(key(2), None, &header(100), &[2; 100]).unwrap());
        assert_eq!(cache.stats().parts_not_cached_for_lack_of_room, 1);
    }
}
