//! A part written into its cache file while its body arrives, readable as it grows.
//!
//! A download holds a whole part in memory only if the cache cannot take it: otherwise
//! the part's room in the budget is reserved (and what that evicts deleted) before the
//! request goes out, its file is created under a temporary name, and the body goes
//! to disk whole blocks at a time ([`Spool::write_next`]; the download gathers about a
//! megabyte for each write), each block's CRC32C computed on the way. Readers waiting for the part read the blocks already written, checked like any
//! cached read ([`Spool::read_exact_at`]). When the last block is on disk, the header
//! (which holds the block checksums) is written in front and the file is renamed
//! into place ([`Spool::commit`]), as an insert of a whole part does.
//!
//! A read of written bytes that the file cannot give (our disk failed: an I/O error, a
//! file truncated under the daemon, a block that fails its checksum) marks the spool
//! failed ([`Spool::has_failed_a_read`]) and fails as a dropped part does, so that the
//! reader asks again and the fetcher serves it from the store: our own disk never
//! fails a read.
//!
//! A spool dropped before its commit (a failed download) returns its reservation and
//! deletes its file. Its open file outlives an eviction of the committed part, so a
//! reader that was handed the spool finishes its read.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::adopt::PartFileName;
use super::books::ResidentFile;
use super::checked::{read_checked, BlockReadFailure, CheckedBlocks};
use super::part_file::{PartHeader, PartOrigin, BLOCK_LEN};
use super::parts_dir::InsertMoment;
use super::policy::{Admission, Reservation};
use super::{CacheError, DiskCache};
use crate::metrics::Metrics;
use crate::parts::{GroupId, PartKey};

pub struct Spool {
    cache: Arc<DiskCache>,
    key: PartKey,
    group: Option<GroupId>,
    object_key: String,
    etag: String,
    object_offset: u64,
    data_len: u64,
    /// The header's length: where the data starts in the file.
    data_offset: u64,
    name: PartFileName,
    /// The file's name in the parts directory until its commit.
    tmp: String,
    file: File,
    state: Mutex<SpoolState>,
    /// A read of its written bytes failed: readers get them from the store instead.
    failed_a_read: AtomicBool,
}

struct SpoolState {
    /// Bytes of data on disk, from the start.
    written: u64,
    /// The CRC32C of each block on disk.
    block_crc32c: Vec<u32>,
    /// Held until the part is committed or the spool dropped.
    reservation: Option<Reservation>,
}

impl Spool {
    /// [`DiskCache::spool`]: the part's room reserved, and its file created under a
    /// temporary name.
    pub(super) fn begin(
        cache: &Arc<DiskCache>,
        key: PartKey,
        group: Option<GroupId>,
        origin: PartOrigin,
        data_len: u64,
        admission: Admission,
    ) -> Option<Spool> {
        if !PartHeader::fits(origin.key, origin.etag) {
            return None;
        }
        if !cache.disk.usable() {
            Metrics::add(&cache.counters.cache_parts_not_cached_for_disk_errors, 1);
            return None;
        }
        let data_offset =
            PartHeader::encoded_len_before_data(origin.key, origin.etag, data_len) as u64;
        let disk_bytes = data_offset + data_len;
        let reservation = cache.reserve(key, group, disk_bytes, admission)?;
        let name = cache.parts.new_name(origin, disk_bytes);
        let tmp = format!("{name}.tmp");
        let file = match cache.parts.dir.create_new(&tmp) {
            Ok(file) => file,
            Err(error) => {
                cache.books.lock().policy.cancel(reservation);
                cache.disk.failed(&error);
                Metrics::add(&cache.counters.cache_parts_not_cached_for_disk_errors, 1);
                return None;
            }
        };
        Some(Spool {
            cache: cache.clone(),
            key,
            group,
            object_key: origin.key.to_owned(),
            etag: origin.etag.to_owned(),
            object_offset: origin.object_offset,
            data_len,
            data_offset,
            name,
            tmp,
            file,
            state: Mutex::new(SpoolState {
                written: 0,
                block_crc32c: Vec::with_capacity(data_len.div_ceil(BLOCK_LEN as u64) as usize),
                reservation: Some(reservation),
            }),
            failed_a_read: AtomicBool::new(false),
        })
    }

    /// Bytes of the part on disk and readable, from its start.
    /// The part's length: the bytes its file takes after the header.
    pub fn data_len(&self) -> u64 {
        self.data_len
    }

    pub fn written(&self) -> u64 {
        self.state.lock().written
    }

    /// Appends the next bytes of the part: whole blocks ([`BLOCK_LEN`]), or the rest
    /// of the part. Blocking file I/O. A failure turns caching off for a while, as a
    /// failed insert does, and leaves what was written readable; the caller then drops
    /// the spool, whose part cannot be completed.
    pub fn write_next(&self, data: &[u8]) -> io::Result<()> {
        let block_len = BLOCK_LEN as usize;
        let at = self.written();
        assert!(
            at + data.len() as u64 <= self.data_len
                && (data.len().is_multiple_of(block_len)
                    || at + data.len() as u64 == self.data_len),
            "whole blocks or the part's last bytes"
        );
        let crcs: Vec<u32> = data.chunks(block_len).map(crc32c::crc32c).collect();
        if let Err(error) = self.file.write_all_at(data, self.data_offset + at) {
            self.cache.disk.failed(&error);
            return Err(error);
        }
        let mut state = self.state.lock();
        state.block_crc32c.extend(crcs);
        state.written += data.len() as u64;
        Ok(())
    }

    /// Whether a read of the written bytes failed: the part file cannot be trusted to
    /// give them, and readers should ask the store.
    pub fn has_failed_a_read(&self) -> bool {
        self.failed_a_read.load(Ordering::Relaxed)
    }

    /// Fills `buf` from `offset` within the part, which must be within the bytes
    /// written; every block it touches is checked. A failure (logged once per spool)
    /// is [`CacheError::Unreadable`] or [`CacheError::Corrupt`], which a reader answers
    /// by asking again, and marks the spool failed.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<(), CacheError> {
        if buf.is_empty() {
            return Ok(());
        }
        let (written, block_crc32c) = {
            let state = self.state.lock();
            (state.written, state.block_crc32c.clone())
        };
        assert!(
            offset + buf.len() as u64 <= written,
            "a read of a spool stays within its written bytes"
        );
        let blocks = CheckedBlocks {
            file: &self.file,
            data_offset: self.data_offset,
            data_len: self.data_len,
            block_len: BLOCK_LEN as u64,
            block_crc32c: &block_crc32c,
        };
        read_checked(&blocks, buf, offset).map_err(|failure| {
            let first = !self.failed_a_read.swap(true, Ordering::Relaxed);
            match failure {
                BlockReadFailure::Io(error) => {
                    if first {
                        tracing::error!(path = %self.cache.parts.dir.shown(&self.tmp).display(), part = ?self.key, %error, "a part file being written could not be read back: its readers get their bytes from the store");
                    }
                    CacheError::Unreadable {
                        part: self.key,
                        reason: error.to_string(),
                    }
                }
                BlockReadFailure::BadBlock(block) => {
                    if first {
                        tracing::error!(path = %self.cache.parts.dir.shown(&self.tmp).display(), part = ?self.key, block, "a part being written failed its checksum on reading back: its readers get their bytes from the store");
                    }
                    CacheError::Corrupt {
                        part: self.key,
                        block,
                    }
                }
            }
        })
    }

    /// Makes the whole written part resident: writes its header, renames the file into
    /// place and commits its room. Returns whether the part is cached now (by this
    /// spool or by another that landed first); `false` if the disk failed, which turns
    /// caching off for a while ([`super::DISK_RETRY_AFTER`]). Blocking file I/O.
    pub fn commit(&self) -> bool {
        let cache = &self.cache;
        let (header, reservation) = {
            let mut state = self.state.lock();
            assert_eq!(state.written, self.data_len, "commit of a whole part");
            let Some(reservation) = state.reservation.take() else {
                return false;
            };
            let header = PartHeader {
                key: self.object_key.clone(),
                etag: self.etag.clone(),
                object_offset: self.object_offset,
                data_len: self.data_len,
                block_len: BLOCK_LEN,
                block_crc32c: state.block_crc32c.clone(),
            };
            (header, reservation)
        };
        let encoded = header.encode();
        debug_assert_eq!(encoded.len() as u64, self.data_offset);
        let name = self.name.to_string();
        let placed = (|| {
            self.file.write_all_at(&encoded, 0)?;
            cache.parts.dir.rename(&self.tmp, &name)?;
            cache.parts.dir.open_for_reading(&name)
        })();
        cache.parts.reached(InsertMoment::Written);
        let mut books = cache.books.lock();
        let file = match placed {
            Ok(file) => cache.open_files.opened(PathBuf::from(&name), file),
            Err(error) => {
                let _ = cache.parts.dir.remove(&self.tmp);
                let _ = cache.parts.dir.remove(&name);
                books.policy.cancel(reservation);
                drop(books);
                cache.disk.failed(&error);
                Metrics::add(&cache.counters.cache_parts_not_cached_for_disk_errors, 1);
                return false;
            }
        };
        cache.disk.ok();
        if books.policy.contains(self.key) {
            // Another download of the same part landed first.
            cache.parts.delete(vec![name]);
            books.policy.cancel(reservation);
            return true;
        }
        let committed = books.policy.commit(reservation, self.key, self.group);
        debug_assert!(committed, "checked under the same lock");
        books.files.insert(
            self.key,
            (
                Arc::new(ResidentFile {
                    file,
                    data_offset: self.data_offset,
                    data_len: self.data_len,
                    block_len: BLOCK_LEN,
                    block_crc32c: header.block_crc32c.into(),
                    advised_at_ms: Default::default(),
                }),
                name,
            ),
        );
        true
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        if let Some(reservation) = self.state.get_mut().reservation.take() {
            // Deleted before its room is credited, as an evicted file is.
            let mut books = self.cache.books.lock();
            if let Err(error) = self.cache.parts.dir.remove(&self.tmp) {
                if error.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(path = %self.cache.parts.dir.shown(&self.tmp).display(), %error, "could not delete an unfinished part file");
                }
            }
            books.policy.cancel(reservation);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{adopt, CacheOwner, Recency};
    use crate::parts::ObjectId;
    use std::fs;
    use std::path::Path;

    const ORIGIN: PartOrigin = PartOrigin {
        key: "ds/chunk_0/data.npy",
        etag: "e",
        object_offset: 0,
    };

    fn open(dir: &Path, budget: u64) -> Arc<DiskCache> {
        let owner = CacheOwner {
            source: "s3://bucket/atlas".into(),
            endpoint: None,
            reset: false,
        };
        Arc::new(
            DiskCache::open(
                &crate::cache_dir_check::prepare(dir).unwrap(),
                &owner,
                budget,
                None,
            )
            .unwrap(),
        )
    }

    fn key(object: u64) -> PartKey {
        PartKey {
            object: ObjectId(object),
            index: 0,
        }
    }

    fn files(cache: &DiskCache) -> Vec<PathBuf> {
        fs::read_dir(cache.parts.dir.shown(""))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect()
    }

    fn part(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    #[test]
    fn written_blocks_are_readable_before_the_commit_and_the_part_is_resident_after() {
        let dir = tempfile::tempdir().unwrap();
        let cache = open(dir.path(), 1 << 30);
        let block = BLOCK_LEN as usize;
        let data = part(2 * block + 1000);
        let spool = cache
            .spool(key(1), None, ORIGIN, data.len() as u64, Admission::Demand)
            .unwrap();
        spool.write_next(&data[..block]).unwrap();
        assert_eq!(spool.written(), block as u64);
        let mut buf = vec![0; 100];
        spool.read_exact_at(&mut buf, 500).unwrap();
        assert_eq!(buf, data[500..600]);
        assert!(!cache.contains(key(1)), "not resident before the commit");
        spool.write_next(&data[block..]).unwrap();
        assert!(spool.commit());
        let pinned = cache.get(key(1), Recency::Use).unwrap();
        let mut whole = vec![0; data.len()];
        pinned.read_exact_at(&mut whole, 0).unwrap();
        assert_eq!(whole, data);
        let names = files(&cache);
        assert_eq!(names.len(), 1);
        assert!(
            adopt::PartFileName::parse(names[0].file_name().unwrap().to_str().unwrap()).is_some(),
            "renamed into place: {names:?}"
        );
        spool.read_exact_at(&mut whole, 0).unwrap();
        assert_eq!(whole, data, "the spool still reads after its commit");
    }

    #[test]
    fn a_spool_holds_its_room_until_dropped_then_deletes_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let len = 3 * BLOCK_LEN as u64;
        let disk = PartHeader::encoded_len_before_data(ORIGIN.key, ORIGIN.etag, len) as u64 + len;
        let cache = open(dir.path(), disk);
        let first = cache
            .spool(key(1), None, ORIGIN, len, Admission::Demand)
            .unwrap();
        first.write_next(&part(BLOCK_LEN as usize)).unwrap();
        assert!(
            cache
                .spool(key(2), None, ORIGIN, len, Admission::Demand)
                .is_none(),
            "the budget holds one part, reserved by the first"
        );
        assert_eq!(files(&cache).len(), 1);
        drop(first);
        assert!(
            files(&cache).is_empty(),
            "an unfinished part file is deleted"
        );
        let second = cache
            .spool(key(2), None, ORIGIN, len, Admission::Demand)
            .unwrap();
        second.write_next(&part(len as usize)).unwrap();
        assert!(second.commit());
        assert!(cache.contains(key(2)) && !cache.contains(key(1)));
    }

    #[test]
    fn a_block_damaged_on_disk_before_the_commit_fails_its_read() {
        let dir = tempfile::tempdir().unwrap();
        let cache = open(dir.path(), 1 << 30);
        let data = part(2 * BLOCK_LEN as usize);
        let spool = cache
            .spool(key(1), None, ORIGIN, data.len() as u64, Admission::Demand)
            .unwrap();
        spool.write_next(&data).unwrap();
        let tmp = files(&cache).pop().unwrap();
        let mut bytes = fs::read(&tmp).unwrap();
        let at = spool.data_offset as usize + BLOCK_LEN as usize + 9;
        bytes[at] ^= 1;
        fs::write(&tmp, &bytes).unwrap();
        let mut buf = vec![0; 10];
        spool.read_exact_at(&mut buf, 0).unwrap();
        let error = spool
            .read_exact_at(&mut buf, BLOCK_LEN as u64 + 5)
            .unwrap_err();
        assert!(
            matches!(error, CacheError::Corrupt { block: 1, .. }),
            "{error}"
        );
    }
}
