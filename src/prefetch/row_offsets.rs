//! Row offsets of chunks, decoded once and kept for the plans' steps.
//!
//! A step of rows (`rows` hint lines) names rows; what it will read of the values and
//! column ids is bounded by two row offsets per row range. Read from the cache one at a
//! time, each offset costs a checked read of its whole 64 KiB block, and a plan in
//! random order asks for two per row, again at every wake of the prefetcher. So a
//! chunk's offsets are read (checked) from its cached parts once, as a whole, and kept
//! in memory, least recently used first out, within a byte bound that keeps the
//! daemon's memory flat whatever the dataset's size.

use std::sync::Arc;

use lru::LruCache;
use parking_lot::Mutex;

use crate::parts::ObjectId;

/// Bytes of decoded row offsets kept at most: the chunks of a few windows of even a
/// large plan (a chunk of 4096 rows takes 32 KiB).
pub const KEPT_ROW_OFFSETS_BYTES: usize = 4 << 20;

pub struct KeptRowOffsets {
    budget_bytes: usize,
    kept: Mutex<Kept>,
}

struct Kept {
    /// By the row-offset object they were decoded from.
    offsets: LruCache<ObjectId, Arc<[u64]>>,
    bytes: usize,
}

impl KeptRowOffsets {
    pub fn new(budget_bytes: usize) -> KeptRowOffsets {
        KeptRowOffsets {
            budget_bytes,
            kept: Mutex::new(Kept {
                offsets: LruCache::unbounded(),
                bytes: 0,
            }),
        }
    }

    /// The offsets decoded from `object`: kept ones, or what `load` gives (`None`: not
    /// local), kept if they fit the bound.
    pub fn get_or_load(
        &self,
        object: ObjectId,
        load: impl FnOnce() -> Option<Vec<u64>>,
    ) -> Option<Arc<[u64]>> {
        if let Some(offsets) = self.kept.lock().offsets.get(&object) {
            return Some(offsets.clone());
        }
        let offsets: Arc<[u64]> = load()?.into();
        let size = offsets.len() * size_of::<u64>();
        if size <= self.budget_bytes {
            let mut kept = self.kept.lock();
            if kept.offsets.put(object, offsets.clone()).is_none() {
                kept.bytes += size;
            }
            while kept.bytes > self.budget_bytes {
                let (_, dropped) = kept.offsets.pop_lru().expect("bytes are in entries");
                kept.bytes -= dropped.len() * size_of::<u64>();
            }
        }
        Some(offsets)
    }
}

impl Default for KeptRowOffsets {
    fn default() -> Self {
        KeptRowOffsets::new(KEPT_ROW_OFFSETS_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn offsets_are_loaded_once_and_the_least_recently_used_leave_first() {
        let kept = KeptRowOffsets::new(3 * 8 * 10);
        let loads = Cell::new(0);
        let load = |n: u64| {
            loads.set(loads.get() + 1);
            Some((0..10).map(|i| i * n).collect::<Vec<u64>>())
        };
        for object in 0..3 {
            assert_eq!(
                kept.get_or_load(ObjectId(object), || load(object)).unwrap()[2],
                2 * object
            );
        }
        assert_eq!(loads.get(), 3);
        kept.get_or_load(ObjectId(0), || load(0)).unwrap();
        assert_eq!(loads.get(), 3, "kept");
        kept.get_or_load(ObjectId(3), || load(3)).unwrap();
        kept.get_or_load(ObjectId(0), || load(0)).unwrap();
        assert_eq!(loads.get(), 4, "object 0 was used last: object 1 left");
        kept.get_or_load(ObjectId(1), || load(1)).unwrap();
        assert_eq!(loads.get(), 5);
    }

    #[test]
    fn offsets_not_local_are_not_kept_and_too_many_are_not_kept_but_served() {
        let kept = KeptRowOffsets::new(8 * 4);
        assert!(kept.get_or_load(ObjectId(0), || None).is_none());
        let big = kept.get_or_load(ObjectId(1), || Some(vec![7; 5])).unwrap();
        assert_eq!(big.len(), 5);
        let again = kept.get_or_load(ObjectId(1), || Some(vec![8; 5])).unwrap();
        assert_eq!(again[0], 8, "loaded again: it did not fit");
    }
}
