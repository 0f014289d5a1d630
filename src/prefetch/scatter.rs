//! Read-ahead by chunk for readers that give no hint but take chunks a few random rows
//! at a time: the upstream chunk-aware samplers, a plain DataLoader over chunk windows.
//! Such a reader touches a chunk at scattered places, then reads most of the rest of it
//! soon after; fetching the whole chunk at the second scattered touch makes its parts
//! download side by side at the link's speed instead of one wait per part.
//!
//! Only the decisions live here, on plain numbers: the prefetcher feeds every read of a
//! flat chunk ([`ScatterDetector::observe`]) and fetches what it is told to. A chunk is
//! fetched once reads of one of its arrays have reached two places [`SITES_APART`] sites
//! apart, a site being the kernel's read-ahead window: one row with the kernel's
//! read-around and read-ahead never does, a second random row or a sequential reader a
//! few windows in does. Whether it paid is judged per fetched chunk when [`HISTORY`] later chunks
//! have been fetched: the share of its parts read by then. When the last judged chunks
//! mostly went unread (a random reader over a dataset larger than the cache, say),
//! detection pauses for a number of triggers that doubles while it keeps not paying.

use std::collections::{HashSet, VecDeque};
use std::num::NonZeroUsize;

use lru::LruCache;

/// How many sites apart two reads of an array must be to count as scattered: a fault
/// in a memory map reads half a window on either side of it and, read in order, a
/// window more after that, which spans up to three sites.
pub const SITES_APART: u64 = 3;
/// Chunks fetched since a fetched chunk, before it is judged.
pub const HISTORY: usize = 8;
/// Judged chunks whose mean decides whether detection pauses.
const JUDGED: usize = 4;
/// A chunk paid if at least this share of its parts was read by its judgement.
const PAYS: f64 = 0.25;
/// The longest pause, in triggers.
const MAX_PAUSE: u32 = 64;
/// Chunks whose touched sites are remembered; the least recent are forgotten.
const REMEMBERED: usize = 1024;

/// A chunk, by a number unique within the mount (its first array's object id).
pub type ChunkId = u64;

/// What the detector asks for after a read.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    Nothing,
    /// Fetch the whole chunk; report its parts with [`ScatterDetector::fetching`].
    FetchChunk,
}

pub struct ScatterDetector {
    /// The grain at which reads of an array count as being at different places.
    site_bytes: u64,
    /// Per chunk not fetched: the first site touched per array (by array number); the
    /// least recently touched chunks are forgotten.
    first_sites: LruCache<ChunkId, [Option<u64>; 3]>,
    /// Fetched chunks not judged yet, oldest first.
    fetched: VecDeque<Fetched>,
    /// Whether each recently judged chunk paid, newest last.
    judged: VecDeque<bool>,
    /// Triggers still to skip, and the pause the next bad judgement sets.
    skip: u32,
    next_pause: u32,
}

struct Fetched {
    chunk: ChunkId,
    parts: usize,
    unread: HashSet<u64>,
}

impl ScatterDetector {
    /// A detector whose sites are `site_bytes` long (the kernel's read-ahead window).
    pub fn new(site_bytes: u64) -> ScatterDetector {
        ScatterDetector {
            site_bytes: site_bytes.max(1),
            first_sites: LruCache::new(NonZeroUsize::new(REMEMBERED).unwrap()),
            fetched: VecDeque::new(),
            judged: VecDeque::new(),
            skip: 0,
            next_pause: 0,
        }
    }

    /// Records a read of array `array` (0, 1 or 2) of `chunk` at byte `offset`, touching
    /// the chunk's parts `parts` (any numbering unique within the chunk).
    pub fn observe(
        &mut self,
        chunk: ChunkId,
        array: usize,
        offset: u64,
        parts: impl IntoIterator<Item = u64>,
    ) -> Decision {
        if let Some(fetched) = self.fetched.iter_mut().find(|f| f.chunk == chunk) {
            for part in parts {
                fetched.unread.remove(&part);
            }
            return Decision::Nothing;
        }
        let site = offset / self.site_bytes;
        let sites = self.first_sites.get_or_insert_mut(chunk, Default::default);
        let first = *sites[array].get_or_insert(site);
        if first.abs_diff(site) < SITES_APART {
            return Decision::Nothing;
        }
        self.first_sites.pop(&chunk);
        if self.skip > 0 {
            self.skip -= 1;
            return Decision::Nothing;
        }
        Decision::FetchChunk
    }

    /// The chunk is being fetched whole: its parts are `parts`, of which `read` were
    /// read already.
    pub fn fetching(&mut self, chunk: ChunkId, parts: impl IntoIterator<Item = u64>, read: &[u64]) {
        let mut unread: HashSet<u64> = parts.into_iter().collect();
        let total = unread.len();
        for part in read {
            unread.remove(part);
        }
        self.fetched.push_back(Fetched {
            chunk,
            parts: total,
            unread,
        });
        while self.fetched.len() > HISTORY {
            let oldest = self.fetched.pop_front().unwrap();
            let read = oldest.parts - oldest.unread.len();
            self.judge(read as f64 >= PAYS * oldest.parts.max(1) as f64);
        }
    }

    fn judge(&mut self, paid: bool) {
        self.judged.push_back(paid);
        if self.judged.len() > JUDGED {
            self.judged.pop_front();
        }
        let paying = self.judged.iter().filter(|&&p| p).count();
        if self.judged.len() == JUDGED && paying * 2 < JUDGED {
            self.next_pause = (self.next_pause * 2).clamp(1, MAX_PAUSE);
            self.skip = self.next_pause;
            // Judge afresh after the pause, on chunks fetched after it.
            self.judged.clear();
        } else if paid {
            self.next_pause = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;
    /// Sites of a MiB, so offsets in the tests read as sites.
    fn detector() -> ScatterDetector {
        ScatterDetector::new(MIB)
    }

    #[test]
    fn a_second_read_far_from_the_first_fetches_the_chunk() {
        let mut d = detector();
        assert_eq!(d.observe(7, 0, 5 * MIB, [0]), Decision::Nothing);
        assert_eq!(
            d.observe(7, 0, 5 * MIB + 4096, [0]),
            Decision::Nothing,
            "same site"
        );
        assert_eq!(
            d.observe(7, 0, 7 * MIB, [0]),
            Decision::Nothing,
            "two sites on"
        );
        assert_eq!(d.observe(7, 0, 20 * MIB, [2]), Decision::FetchChunk);
    }

    #[test]
    fn arrays_of_a_chunk_are_judged_apart() {
        let mut d = detector();
        // The same offsets in two arrays are two places in the chunk's rows, not two
        // places in one array.
        assert_eq!(d.observe(1, 0, 0, [0]), Decision::Nothing);
        assert_eq!(d.observe(1, 1, 30 * MIB, [9]), Decision::Nothing);
        assert_eq!(d.observe(1, 1, 0, [5]), Decision::FetchChunk);
    }

    proptest! {
        /// Reads confined to three neighbouring sites (one row with the kernel's
        /// read-around and read-ahead, say) never fetch the chunk.
        #[test]
        fn reads_within_three_neighbouring_sites_never_fetch(
            site in 0u64..1000,
            reads in proptest::collection::vec((0usize..3, 0..3 * MIB), 1..100),
        ) {
            let mut d = detector();
            for (array, within) in reads {
                let offset = site * MIB + within;
                prop_assert_eq!(d.observe(11, array, offset, [offset / MIB]), Decision::Nothing);
            }
        }
    }

    /// Sends two scattered reads to each of `n` chunks from `first` on; each chunk
    /// fetched has `parts` parts, of which the two triggering reads touched two and
    /// `read_after` more are read after the fetch. Returns how many were fetched.
    fn scattered_chunks(d: &mut ScatterDetector, n: u64, parts: u64, read_after: u64) -> u64 {
        let mut fetched = 0;
        for chunk in 0..n {
            d.observe(chunk, 0, 0, [0]);
            if d.observe(chunk, 0, 10 * MIB, [1]) == Decision::FetchChunk {
                fetched += 1;
                d.fetching(chunk, 0..parts, &[0, 1]);
                for part in 2..2 + read_after {
                    d.observe(chunk, 0, part * MIB, [part]);
                }
            }
        }
        fetched
    }

    #[test]
    fn chunks_read_through_keep_being_fetched() {
        let mut d = detector();
        assert_eq!(scattered_chunks(&mut d, 100, 8, 6), 100);
        assert_eq!(d.skip, 0);
    }

    #[test]
    fn a_quarter_read_pays() {
        let mut d = detector();
        assert_eq!(scattered_chunks(&mut d, 100, 8, 0), 100);
    }

    #[test]
    fn fetches_that_go_unread_pause_detection_longer_each_time() {
        let mut d = detector();
        // 2 of 16 parts read: none pays. The first judgement set is full after
        // HISTORY + JUDGED fetches; then pauses of 1, 2, 4, ... 64 triggers, each
        // followed by JUDGED fetches.
        let fetched = scattered_chunks(&mut d, 200, 16, 0);
        assert!(
            (12..=45).contains(&fetched),
            "fetched {fetched} of 200 unread chunks"
        );
        assert!(d.next_pause >= 32, "the pause grew to {}", d.next_pause);
        // Chunks that are read through end the pauses.
        let mut d2 = detector();
        scattered_chunks(&mut d2, 30, 16, 0);
        let paused = d2.next_pause;
        assert!(paused > 0);
        scattered_chunks(&mut d2, 200, 4, 2);
        assert_eq!(d2.next_pause, 0);
    }

    #[test]
    fn a_fetched_chunk_is_not_fetched_again_until_judged() {
        let mut d = detector();
        d.observe(5, 0, 0, [0]);
        assert_eq!(d.observe(5, 0, 10 * MIB, [1]), Decision::FetchChunk);
        d.fetching(5, 0..4, &[0, 1]);
        assert!(d.fetched.iter().any(|fetched| fetched.chunk == 5));
        assert_eq!(d.observe(5, 0, 30 * MIB, [3]), Decision::Nothing);
        assert_eq!(d.observe(5, 0, 0, [0]), Decision::Nothing);
    }

    #[test]
    fn memory_of_touched_chunks_is_bounded() {
        let mut d = detector();
        for chunk in 0..(3 * REMEMBERED as u64) {
            d.observe(chunk, 0, 0, [0]);
        }
        assert_eq!(d.first_sites.len(), REMEMBERED);
    }
}
