//! The chunks the daemon holds, as its hint file announces them (protocol version 3):
//! what a cache-aware epoch reads first.
//!
//! The announcement describes the daemon's disk cache at the moment a hint handle
//! first read it, so two processes that read it themselves may see two caches. Every
//! process of a job that computes the same epoch (ranks, data-loading workers) must use
//! the same [`CachedChunks`]: read it once (say on rank 0), share it, and hand it to
//! each sampler. Equal inputs give equal orders; nothing here reads the clock or the
//! process.

use std::ops::Range;
use std::path::Path;

use scdl_format::hint::Announcement;

use crate::layout::{read_announcement, LayoutError};

/// A set of chunk ids, kept as sorted, disjoint, non-adjacent ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CachedChunks {
    ranges: Vec<Range<u32>>,
}

impl CachedChunks {
    /// The chunks in `ranges` (any order; overlaps and empty ranges allowed).
    pub fn from_ranges(ranges: impl IntoIterator<Item = Range<u32>>) -> CachedChunks {
        let mut ranges: Vec<_> = ranges.into_iter().filter(|r| !r.is_empty()).collect();
        ranges.sort_unstable_by_key(|r| r.start);
        let mut merged: Vec<Range<u32>> = Vec::with_capacity(ranges.len());
        for r in ranges {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        CachedChunks { ranges: merged }
    }

    /// The chunks an announcement says the daemon holds; `None` when it does not say
    /// (a daemon of protocol version 1 or 2).
    pub fn announced(announcement: &Announcement) -> Option<CachedChunks> {
        let ranges = announcement.cached.as_ref()?;
        Some(CachedChunks::from_ranges(ranges.iter().cloned()))
    }

    /// Reads the announcement of the dataset directory `dir` now, through a handle of
    /// its own: the chunks the daemon holds, or `None` off a mount or from a daemon
    /// that does not say.
    pub fn read_from(dir: &Path) -> Result<Option<CachedChunks>, LayoutError> {
        Ok(read_announcement(dir)?
            .as_ref()
            .and_then(CachedChunks::announced))
    }

    pub fn holds(&self, chunk: u32) -> bool {
        let after = self.ranges.partition_point(|r| r.end <= chunk);
        self.ranges.get(after).is_some_and(|r| r.contains(&chunk))
    }

    /// The chunks as sorted, disjoint ranges.
    pub fn ranges(&self) -> &[Range<u32>] {
        &self.ranges
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_chunk_is_held_exactly_when_a_range_given_holds_it(
            given in proptest::collection::vec((0u32..200, 0u32..20), 0..12),
        ) {
            let ranges: Vec<Range<u32>> = given.iter().map(|&(s, l)| s..s + l).collect();
            let set = CachedChunks::from_ranges(ranges.clone());
            for chunk in 0..230 {
                prop_assert_eq!(set.holds(chunk), ranges.iter().any(|r| r.contains(&chunk)));
            }
            for pair in set.ranges().windows(2) {
                prop_assert!(pair[0].end < pair[1].start);
            }
        }
    }

    #[test]
    fn an_announcement_without_a_cache_gives_no_set() {
        let v2 = Announcement::parse(b"scdlfs-hints 2\nchunk-rows 8\n").unwrap();
        assert_eq!(CachedChunks::announced(&v2), None);
        let v3 = Announcement::new(8, std::iter::once(3..5));
        assert_eq!(
            CachedChunks::announced(&v3),
            Some(CachedChunks::from_ranges(std::iter::once(3..5)))
        );
    }
}
