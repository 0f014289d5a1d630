//! Adoption of an earlier daemon's part files (the strays, [`super::strays`]): their
//! headers read ([`Adoption::read_stray`], on threads of their own:
//! [`super::DiskCache::adopt_in_background`]), and each claimed by an object the
//! catalog lists with the same ETag ([`Adoption::object_listed`]), or by the first read
//! of its part ([`Adoption::claim_own`]); one that is no part of its object as listed
//! now is deleted. The rules of the judging are [`adopt::judge`]'s.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use parking_lot::Mutex;

use super::adopt::{self, ListedObject, PartFileName, Verdict};
use super::books::{Books, ResidentFile};
use super::open_files::OpenFiles;
use super::parts_dir::PartsDir;
use super::strays::ReadStray;
use crate::metrics::Metrics;
use crate::parts::PartKey;

/// What adoption works on: the cache's books (under their lock), its parts directory
/// and its counters.
pub(super) struct Adoption<'a> {
    pub(super) books: &'a Mutex<Books>,
    pub(super) parts: &'a PartsDir,
    pub(super) counters: &'a Metrics,
}

impl Adoption<'_> {
    /// The strays whose headers are to be read, oldest first.
    pub(super) fn unread(&self) -> Vec<String> {
        self.books.lock().strays.order.iter().cloned().collect()
    }

    /// Reads the headers of the earlier mount's part files on this thread.
    #[cfg(test)]
    pub(super) fn read_all_now(&self) {
        for file in self.unread() {
            self.read_stray(file);
        }
        self.headers_done();
    }

    /// Reads one stray's header; removes it if the header is bad, files it under its
    /// key otherwise, and lets an object listed already claim it.
    pub(super) fn read_stray(&self, file: String) {
        let Some(name) = self.books.lock().strays.names.get(&file).copied() else {
            return; // claimed by a read, or deleted for room, meanwhile
        };
        let read = self.parts.read_header(&file, &name);
        let mut books = self.books.lock();
        let (header, header_len) = match read {
            Ok(read) => read,
            Err(reason) => {
                self.remove_stray(&mut books, &file, &reason.to_string());
                return;
            }
        };
        let key = header.key.clone();
        books
            .strays
            .by_key
            .entry(key.clone())
            .or_default()
            .push(ReadStray {
                file,
                header,
                header_len,
            });
        if let Some((object, part_size)) = books.strays.listed.get(&key).cloned() {
            self.claim(&mut books, &object, part_size);
        }
    }

    pub(super) fn headers_done(&self) {
        let mut books = self.books.lock();
        books.strays.headers_read = true;
        books.strays.listed = HashMap::new();
        books.strays.by_part = HashMap::new();
    }

    /// The catalog listed `object`: the earlier mount's parts of its key that are parts
    /// of it as it is now (cut at `part_size`) are claimed, and the others of its key
    /// deleted.
    pub(super) fn object_listed(&self, object: ListedObject, part_size: u64) {
        let mut books = self.books.lock();
        if books.strays.names.is_empty() {
            return;
        }
        if !books.strays.headers_read {
            books
                .strays
                .listed
                .insert(object.key.clone(), (object.clone(), part_size));
        }
        self.claim(&mut books, &object, part_size);
    }

    fn claim(&self, books: &mut Books, object: &ListedObject, part_size: u64) {
        let Some(strays) = books.strays.by_key.remove(&object.key) else {
            return;
        };
        for stray in strays {
            if books.strays.contains(&stray.file) {
                self.judge_stray(books, object, part_size, stray);
            }
        }
    }

    /// Claims the earlier mount's file of part `index` of `object` for a read that
    /// comes before the background has read that file's header
    /// ([`super::DiskCache::claim_own`]). Returns whether the part is resident now.
    pub(super) fn claim_own(&self, object: &ListedObject, part_size: u64, index: u64) -> bool {
        let key = PartKey {
            object: object.id,
            index,
        };
        let (file, name) = match self.own_stray(object, part_size, key) {
            Ok(found) => found,
            Err(resident) => return resident,
        };
        let read = self.parts.read_header(&file, &name);
        let mut books = self.books.lock();
        if !books.strays.contains(&file) {
            return books.policy.contains(key);
        }
        match read {
            Ok((header, _)) if header.key != object.key => false, // ids of two parts met
            Ok((header, header_len)) => {
                let stray = ReadStray {
                    file,
                    header,
                    header_len,
                };
                if self.judge_stray(&mut books, object, part_size, stray) {
                    Metrics::add(&self.counters.cache_adopted_by_reads, 1);
                }
                books.policy.contains(key)
            }
            Err(reason) => {
                self.remove_stray(&mut books, &file, &reason.to_string());
                false
            }
        }
    }

    /// The stray whose name says it holds part `key` of `object`; where there is none
    /// to read (every header read, the part resident, no such file), whether the part
    /// is resident.
    fn own_stray(
        &self,
        object: &ListedObject,
        part_size: u64,
        key: PartKey,
    ) -> Result<(String, PartFileName), bool> {
        let books = self.books.lock();
        if books.strays.by_part.is_empty() || books.policy.contains(key) {
            return Err(books.policy.contains(key));
        }
        let etag = object.etag.as_deref().unwrap_or_default();
        let part = adopt::part_id(&object.key, etag, key.index * part_size);
        let file = books.strays.by_part.get(&part).ok_or(false)?;
        // Claimed or removed already.
        let name = books.strays.names.get(file).ok_or(false)?;
        Ok((file.clone(), *name))
    }

    /// Adopts a stray whose header names `object`'s key, if it is a part of the object
    /// as listed now; deletes it otherwise. Returns whether it was adopted.
    fn judge_stray(
        &self,
        books: &mut Books,
        object: &ListedObject,
        part_size: u64,
        stray: ReadStray,
    ) -> bool {
        let index = match adopt::judge(&stray.header, object, part_size) {
            Verdict::Adopt { index } => index,
            Verdict::Remove(reason) => {
                self.remove_stray(books, &stray.file, reason);
                return false;
            }
        };
        // Opened when first read: a large cache would not fit the descriptor limit.
        let file = OpenFiles::closed(PathBuf::from(&stray.file));
        let bytes = books
            .strays
            .take(&stray.file)
            .expect("checked by the caller");
        books.give_room(bytes);
        let key = PartKey {
            object: object.id,
            index,
        };
        if !books.policy.adopt(key, object.group, bytes) {
            // Downloaded again already, or over the chunk budget.
            Metrics::add(&self.counters.cache_stale_parts_removed, 1);
            self.parts.delete(vec![stray.file]);
            return false;
        }
        Metrics::add(&self.counters.cache_adopted_parts, 1);
        Metrics::add(&self.counters.cache_adopted_bytes, bytes);
        let header = stray.header;
        let resident = ResidentFile {
            file,
            data_offset: stray.header_len,
            data_len: header.data_len,
            block_len: header.block_len,
            block_crc32c: header.block_crc32c.into(),
            advised_at_ms: AtomicU64::new(0),
        };
        books.files.insert(key, (Arc::new(resident), stray.file));
        true
    }

    /// Deletes a stray of no use, handing its room to the books.
    fn remove_stray(&self, books: &mut Books, file: &str, reason: &str) {
        let Some(bytes) = books.strays.take(file) else {
            return;
        };
        tracing::debug!(path = %self.parts.dir.shown(file).display(), reason, "an earlier mount's part file is not adopted: removed");
        Metrics::add(&self.counters.cache_stale_parts_removed, 1);
        self.parts.delete(vec![file.to_owned()]);
        books.give_room(bytes);
    }
}
