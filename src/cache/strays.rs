//! Adoption of an earlier daemon's part files (the strays): counted against the budget
//! at once from their names, their headers read in the background, and each claimed
//! by an object the catalog lists with the same ETag, or by the first read of its part;
//! the unclaimed ones are deleted oldest first when a download needs their room.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::adopt::{self, ListedObject, PartFileName, Verdict};
use super::open_files::OpenFiles;
use super::part_file::PartHeader;
use super::{DiskCache, Inner, ResidentFile};
use crate::parts::PartKey;

/// Part files of an earlier daemon that no listed object has claimed yet. Their bytes
/// (what their names declare) are outside the policy's budget (which is the cache's
/// budget less theirs); they are deleted oldest first when a download needs their room.
#[derive(Default)]
pub(super) struct Strays {
    /// Their files' names in the parts directory, oldest first; an entry no longer in
    /// `names` was claimed or removed.
    pub(super) order: VecDeque<String>,
    pub(super) names: HashMap<String, PartFileName>,
    pub(super) total_bytes: u64,
    /// The newest stray of each part id ([`adopt::part_id`]), while headers are still
    /// being read, so that a read can claim its part's file itself.
    pub(super) by_part: HashMap<u64, String>,
    /// Strays whose header has been read, by object key.
    pub(super) by_key: HashMap<String, Vec<ReadStray>>,
    /// Objects listed while headers are still being read, so a stray read later
    /// finds its object; emptied once every header is read.
    pub(super) listed: HashMap<String, (ListedObject, u64)>,
    pub(super) headers_read: bool,
}

pub(super) struct ReadStray {
    file: String,
    header: PartHeader,
    header_len: u64,
}

impl Strays {
    /// Forgets a stray (claimed or to be deleted); its bytes, if it was still known.
    fn take(&mut self, file: &str) -> Option<u64> {
        let bytes = self.names.remove(file)?.len;
        self.total_bytes -= bytes;
        Some(bytes)
    }

    fn contains(&self, file: &str) -> bool {
        self.names.contains_key(file)
    }

    pub(super) fn oldest(&mut self) -> Option<(String, u64)> {
        while let Some(file) = self.order.pop_front() {
            if let Some(bytes) = self.take(&file) {
                return Some((file, bytes));
            }
        }
        None
    }
}

impl DiskCache {
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
                let files: Vec<String> = match cache.upgrade() {
                    Some(cache) => cache.inner.lock().strays.order.iter().cloned().collect(),
                    None => return,
                };
                adopt::in_parallel(&files, |file| {
                    if let Some(cache) = cache.upgrade() {
                        cache.read_stray(file.clone());
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
    pub(super) fn adopt_now(&self) {
        let files: Vec<String> = self.inner.lock().strays.order.iter().cloned().collect();
        for file in files {
            self.read_stray(file);
        }
        self.headers_done();
    }

    /// Reads one stray's header; removes it if the header is bad, files it under its
    /// key otherwise, and lets an object listed already claim it.
    fn read_stray(&self, file: String) {
        let Some(name) = self.inner.lock().strays.names.get(&file).copied() else {
            return; // claimed by a read, or deleted for room, meanwhile
        };
        let read = self.read_header(&file, &name);
        let mut inner = self.inner.lock();
        let (header, header_len) = match read {
            Ok(read) => read,
            Err(reason) => {
                self.remove_stray(&mut inner, &file, &reason.to_string());
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
                file,
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
            if inner.strays.contains(&stray.file) {
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
        let (file, name) = {
            let inner = self.inner.lock();
            if inner.strays.by_part.is_empty() || inner.policy.contains(key) {
                return inner.policy.contains(key);
            }
            let part = adopt::part_id(&object.key, etag, offset);
            let Some(file) = inner.strays.by_part.get(&part) else {
                return false;
            };
            match inner.strays.names.get(file) {
                Some(name) => (file.clone(), *name),
                None => return false, // claimed or removed already
            }
        };
        let read = self.read_header(&file, &name);
        let mut inner = self.inner.lock();
        if !inner.strays.contains(&file) {
            return inner.policy.contains(key);
        }
        match read {
            Ok((header, _)) if header.key != object.key => false, // ids of two parts met
            Ok((header, header_len)) => {
                let stray = ReadStray {
                    file,
                    header,
                    header_len,
                };
                if self.judge_stray(&mut inner, object, part_size, stray) {
                    self.adopted_by_reads.fetch_add(1, Ordering::Relaxed);
                }
                inner.policy.contains(key)
            }
            Err(reason) => {
                self.remove_stray(&mut inner, &file, &reason.to_string());
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
                self.remove_stray(inner, &stray.file, reason);
                return false;
            }
        };
        // Opened when first read: a large cache would not fit the descriptor limit.
        let file = OpenFiles::closed(PathBuf::from(&stray.file));
        let bytes = inner
            .strays
            .take(&stray.file)
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
            self.delete_files(vec![stray.file]);
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
                stray.file,
            ),
        );
        true
    }

    /// Deletes a stray of no use, handing its room to the books.
    fn remove_stray(&self, inner: &mut Inner, file: &str, reason: &str) {
        let Some(bytes) = inner.strays.take(file) else {
            return;
        };
        tracing::debug!(path = %self.parts.shown(file).display(), reason, "an earlier mount's part file is not adopted: removed");
        self.stale_removed.fetch_add(1, Ordering::Relaxed);
        self.delete_files(vec![file.to_owned()]);
        let budget = inner.policy.budget_bytes() + bytes;
        inner.policy.set_budget_bytes(budget);
    }

    /// Deletes the oldest strays until `bytes` more fit the books' budget (or none is
    /// left): an earlier mount's parts that nothing claimed are the least recently used.
    pub(super) fn make_room_from_strays(&self, inner: &mut Inner, bytes: u64) {
        while inner.policy.used_bytes() + inner.policy.reserved_bytes() + bytes
            > inner.policy.budget_bytes()
        {
            let Some((file, freed)) = inner.strays.oldest() else {
                return;
            };
            self.evicted_parts.fetch_add(1, Ordering::Relaxed);
            self.delete_files(vec![file]);
            let budget = inner.policy.budget_bytes() + freed;
            inner.policy.set_budget_bytes(budget);
        }
    }

    /// Reads and checks the header of the earlier mount's part file `file`
    /// ([`adopt::read_header`]).
    fn read_header(
        &self,
        file: &str,
        name: &PartFileName,
    ) -> Result<(PartHeader, u64), adopt::BadPartFile> {
        adopt::read_header(self.parts.open_for_reading(file)?, name)
    }
}
