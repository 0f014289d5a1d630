//! The read side of a dataset's hint file: the announcement a reader gets (protocol
//! version 3), with the dataset's rows per chunk and the chunks the disk cache holds,
//! so that a sampler can order its next epoch to read those first.
//!
//! A hint handle's announcement is made when the handle is first read and kept for
//! the handle's life: a reader going through it in pieces gets one snapshot, never two
//! caches spliced together; a reader who wants the cache as of now opens the file
//! again. Making it asks the cache's books once (no I/O, no use counted): a chunk of a
//! chunked dataset is held when every part of its three arrays is resident on disk.
//! A monolithic dataset's virtual chunks share parts, and their bytes are known only
//! through row offsets the daemon may not have read, so none is announced as held:
//! its readers get the plain order.
//!
//! An announcement made is kept per dataset ([`Announcements`], a bounded number of
//! them) and given to later handles while no part has joined or left the cache's books
//! (its generation): each hint handle's first read made one under the cache's lock, so
//! another user's loop of open, read, close delayed every cached read. Now announcements
//! are made at most once per change of the cache, however many handles read them.

use std::num::NonZeroUsize;
use std::ops::Range;

use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use parking_lot::Mutex;
use scdl_format::hint::Announcement;

use crate::cache::DiskCache;
use crate::catalog::Dataset;
use crate::parts::{spans_touched, PartKey};

/// Datasets whose last announcement is kept.
const ANNOUNCED_DATASETS: usize = 64;

/// The last announcement made for each dataset (at most [`ANNOUNCED_DATASETS`]).
pub struct Announcements {
    made: Mutex<lru::LruCache<ObjectPath, Made>>,
}

struct Made {
    dataset: Dataset,
    generation: u64,
    bytes: Bytes,
}

impl Default for Announcements {
    fn default() -> Self {
        Announcements {
            made: Mutex::new(lru::LruCache::new(
                NonZeroUsize::new(ANNOUNCED_DATASETS).expect("not zero"),
            )),
        }
    }
}

impl Announcements {
    /// The announcement for `dataset` at the cache's `generation`: the one made last,
    /// if at the same generation, else one `make` makes now.
    pub fn get(&self, dataset: &Dataset, generation: u64, make: impl FnOnce() -> Bytes) -> Bytes {
        let mut made = self.made.lock();
        if let Some(last) = made.get(dataset.prefix()) {
            if last.dataset.same(dataset) && last.generation == generation {
                return last.bytes.clone();
            }
        }
        let bytes = make();
        made.put(
            dataset.prefix().clone(),
            Made {
                dataset: dataset.clone(),
                generation,
                bytes: bytes.clone(),
            },
        );
        bytes
    }
}

/// The announcement for `dataset` as the cache stands now, as the bytes a reader gets.
pub fn announce(dataset: &Dataset, cache: &DiskCache, part_size: u64) -> Bytes {
    let chunk_rows = dataset.geometry().chunk_size;
    let held = held_chunks(dataset, cache, part_size);
    Bytes::from(Announcement::new(chunk_rows, held).to_string())
}

/// The chunks of `dataset` whose every part is resident, as ranges of chunk ids.
fn held_chunks(dataset: &Dataset, cache: &DiskCache, part_size: u64) -> Vec<Range<u32>> {
    let Dataset::Chunked(flat) = dataset else {
        return Vec::new();
    };
    let parts_of_chunks: Vec<Vec<PartKey>> = flat
        .chunks
        .iter()
        .map(|arrays| {
            arrays
                .iter()
                .flat_map(|object| {
                    spans_touched(&(0..object.size), part_size).map(|index| PartKey {
                        object: object.id,
                        index,
                    })
                })
                .collect()
        })
        .collect();
    cache
        .wholly_resident(&parts_of_chunks)
        .into_iter()
        .enumerate()
        .filter(|&(_, held)| held)
        .map(|(chunk, _)| chunk as u32..chunk as u32 + 1)
        .collect()
}
