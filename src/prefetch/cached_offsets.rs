//! Row offsets read from the cache only (never a download): a monolithic dataset's
//! offsets of a row step, and a flat chunk's entries, when they are already local.

use std::sync::Arc;

use scdl_format::ArrayKind;

use super::row_offsets::{self, KeptRowOffsets};
use crate::cache::{DiskCache, Recency};
use crate::catalog::FlatDataset;
use crate::fetch::Fetcher;
use crate::object::ObjectInfo;
use crate::row_offset_check::RowOffsetCheck;

/// Reads row offsets from the cache: the fetcher (for the part geometry), the cache,
/// the row-offset check, and the chunks' offsets kept for the plans' steps of rows.
pub(super) struct CachedOffsets {
    fetcher: Arc<Fetcher>,
    cache: Arc<DiskCache>,
    row_offset_check: Arc<RowOffsetCheck>,
    /// Chunks' row offsets, for the plans' steps of rows.
    kept: KeptRowOffsets,
}

impl CachedOffsets {
    pub(super) fn new(
        fetcher: Arc<Fetcher>,
        cache: Arc<DiskCache>,
        row_offset_check: Arc<RowOffsetCheck>,
    ) -> CachedOffsets {
        CachedOffsets {
            fetcher,
            cache,
            row_offset_check,
            kept: KeptRowOffsets::default(),
        }
    }

    /// The check a chunk's row offsets pass before anything of the chunk is served.
    pub(super) fn row_offset_check(&self) -> &Arc<RowOffsetCheck> {
        &self.row_offset_check
    }

    /// Entry `index` of a row-offset array of type `dtype`, if its part is cached.
    pub(super) fn cached_entry(
        &self,
        row_ptr: &ObjectInfo,
        dtype: scdl_format::Dtype,
        index: u64,
    ) -> Option<u64> {
        let width = dtype.size().unwrap();
        let offset = index * width;
        let part_index = offset / self.fetcher.part_size();
        let part = self
            .cache
            .get(Fetcher::key(row_ptr, part_index), Recency::Use)?;
        let mut bytes = [0u8; 8];
        let bytes = &mut bytes[..width as usize];
        part.read_exact_at(bytes, offset - part_index * self.fetcher.part_size())
            .ok()?;
        Some(dtype.read_uint(bytes, 0))
    }

    /// The value range `[row_ptr[rows.start], row_ptr[rows.end])` of a chunk, if its
    /// row offsets are cached and verified.
    pub(super) fn cached_value_range(
        &self,
        dataset: &Arc<FlatDataset>,
        chunk: usize,
        rows: std::ops::Range<u64>,
    ) -> Option<std::ops::Range<u64>> {
        let row_ptr = dataset.array(chunk, ArrayKind::RowPtr);
        let dtype = dataset.layout.row_dtype();
        if !self.row_offsets_checked(dataset, chunk) {
            return None;
        }
        let entries = row_ptr.size / dtype.size().unwrap();
        if entries * 8 > row_offsets::KEPT_ROW_OFFSETS_BYTES as u64 {
            // Too many to keep: read the two needed.
            let entry = |i: u64| self.cached_entry(row_ptr, dtype, i);
            return Some(entry(rows.start)?..entry(rows.end)?);
        }
        let offsets = self
            .kept
            .get_or_load(row_ptr.id, || self.cached_row_offsets(row_ptr, dtype))?;
        Some(*offsets.get(rows.start as usize)?..*offsets.get(rows.end as usize)?)
    }

    /// Whether chunk `chunk`'s row offsets have passed their check. If not checked yet,
    /// the check starts once they are local, so that what they point at can be fetched
    /// (and their pages served): its verdict wakes the prefetcher again.
    pub(super) fn row_offsets_checked(&self, dataset: &Arc<FlatDataset>, chunk: usize) -> bool {
        match RowOffsetCheck::verdict(dataset, chunk) {
            Some(verdict) => verdict.is_ok(),
            None => {
                self.row_offset_check.start_when_local(dataset, chunk);
                false
            }
        }
    }

    /// All entries of a row-offset array, if all its parts are cached (read checked,
    /// without counting as a use for the eviction order).
    fn cached_row_offsets(
        &self,
        row_ptr: &ObjectInfo,
        dtype: scdl_format::Dtype,
    ) -> Option<Vec<u64>> {
        let mut bytes = vec![0u8; row_ptr.size as usize];
        for index in self.fetcher.parts_of(&(0..row_ptr.size)) {
            let key = Fetcher::key(row_ptr, index);
            let part = self.cache.get(key, Recency::Keep)?;
            let range = self.fetcher.part_range(row_ptr, index);
            part.read_exact_at(&mut bytes[range.start as usize..range.end as usize], 0)
                .ok()?;
        }
        Some(dtype.read_uints(&bytes))
    }
}
