//! Exact rows: when a dataset is larger than the disk cache, a plan's rows are fetched
//! as the bytes they need, not as the parts that hold them, and stored into the page
//! cache of the flat files as they arrive.
//!
//! Whole parts pay when the cache keeps them until the plan has read every row it
//! names in them: with the dataset's values in the cache, each part is fetched once
//! however the plan visits it. With a dataset ten times the cache, a part of 8 MiB
//! that a block of 32 rows touches is evicted long before the plan comes back to its
//! other blocks, and is fetched again for each (a cache of a tenth of the dataset
//! fetched it five times over). So when the values of a dataset are several times the
//! cache ([`EXACT_ROWS_VALUES_PER_CACHE`]), a row step asks for the bytes of its rows alone, rounded out to whole pages of the
//! flat file ([`crate::fetch::Fetcher::prefetch_planned`]), unless they are most of
//! their part, which is then fetched whole as before.
//!
//! The kernel reads around every fault of a memory-mapped file (half its read-ahead on
//! either side, and a window ahead of a reader going in order): exact bytes served
//! through FUSE reads would make it ask for as much again around each block, bytes no
//! plan names. Stored into the page cache before the reader comes ([`PlannedPages`]),
//! the rows' pages are found there and the kernel asks for nothing. The same holds for
//! the pages of the row offsets that bound each row, which a reader's map faults on
//! first ([`ExactRows::row_offset_pages`]).

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use scdl_format::flat::FlatPiece;
use scdl_format::ArrayKind;

use crate::cache::DiskCache;
use crate::catalog::FlatDataset;
use crate::fetch::{Fetcher, Planned};
use crate::object::ObjectInfo;
use crate::parts::PartKey;

/// The page the kernel caches files in.
pub(super) const PAGE: u64 = 4096;

/// How many times the disk cache a dataset's values must be for its plans' rows to be
/// fetched exactly. Exact rows trade bytes for requests, one or two a row: where the
/// store answers few requests a second that loses, and where the cache holds much of
/// the values, whole parts are seldom evicted before the plan comes back to them.
/// Measured on each side: with a cache of half the values, a store answering about 250
/// small requests a second (moto_server behind a 20 ms link), uniformly random rows read
/// at 49 rows/s exactly against 6,301 with whole parts (2.6× the dataset fetched); with a
/// cache of a tenth, blocks of 32 rows fetched 4.6–5.1× the dataset with whole parts
/// against 1.07× exactly, at 1.28–1.55× the link's time.
const EXACT_ROWS_VALUES_PER_CACHE: u64 = 4;

/// Where a plan's bytes go once they have arrived (the exact bytes of its rows, and the
/// parts of its windows' values, [`super::top_up`]): the mount's page cache, which the
/// filesystem layer reaches.
pub trait PlannedPages: Send + Sync {
    /// Bytes `file_bytes` of `dataset`'s flat array `kind` are all held by the fetcher
    /// or cached.
    fn arrived(&self, dataset: &Arc<FlatDataset>, kind: ArrayKind, file_bytes: Range<u64>);
}

/// One exact range of a step: bytes of a flat array, whole pages of the file.
pub(super) struct ExactRange {
    pub(super) kind: ArrayKind,
    pub(super) file_bytes: Range<u64>,
}

impl ExactRange {
    /// Bytes `bytes` of the flat array `kind`, rounded out to the whole pages the kernel
    /// caches (the last one cut at the file's end).
    fn whole_pages(dataset: &FlatDataset, kind: ArrayKind, bytes: Range<u64>) -> ExactRange {
        let start = bytes.start / PAGE * PAGE;
        let end = bytes
            .end
            .div_ceil(PAGE)
            .saturating_mul(PAGE)
            .min(dataset.layout.file_len(kind));
        ExactRange {
            kind,
            file_bytes: start..end,
        }
    }
}

/// What issuing one exact range did.
pub(super) struct Issued {
    /// Every byte is cached, held or on its way.
    pub(super) all: bool,
    /// Bytes newly asked for.
    pub(super) bytes: u64,
    /// The parts the range touches, for matching reads to steps.
    pub(super) parts: Vec<PartKey>,
}

/// Fetches a plan's rows exactly: the fetcher and the cache, the cache's budget (which
/// says whose rows are fetched so), and where the rows go once they have arrived.
pub(super) struct ExactRows {
    fetcher: Arc<Fetcher>,
    cache: Arc<DiskCache>,
    /// The disk cache's budget ([`EXACT_ROWS_VALUES_PER_CACHE`]).
    cache_bytes: u64,
    /// Where a plan's exact rows go once they have arrived.
    planned_pages: std::sync::OnceLock<Arc<dyn PlannedPages>>,
}

impl ExactRows {
    pub(super) fn new(fetcher: Arc<Fetcher>, cache: Arc<DiskCache>, cache_bytes: u64) -> ExactRows {
        ExactRows {
            fetcher,
            cache,
            cache_bytes,
            planned_pages: std::sync::OnceLock::new(),
        }
    }

    /// Sends a plan's exact rows to `pages` as they arrive (once: the mount's page
    /// cache); until then they are served by reads alone.
    pub(super) fn connect_planned_pages(&self, pages: Arc<dyn PlannedPages>) {
        if self.planned_pages.set(pages).is_err() {
            tracing::warn!("the planned pages are connected already");
        }
    }

    /// Where a plan's bytes go once they have arrived, once connected.
    pub(super) fn planned_pages(&self) -> Option<Arc<dyn PlannedPages>> {
        self.planned_pages.get().cloned()
    }

    /// Whether bytes `within` of the object (within one part) are most of their part,
    /// which is then fetched whole.
    fn most_of_its_part(&self, object: &ObjectInfo, within: &Range<u64>) -> bool {
        let part = self
            .fetcher
            .part_range(object, within.start / self.fetcher.part_size());
        2 * (within.end - within.start) > part.end - part.start
    }

    /// Whether a plan's rows of `dataset` are fetched exactly: its values and column ids
    /// are more than [`EXACT_ROWS_VALUES_PER_CACHE`] times the disk cache.
    pub(super) fn fetches_rows_exactly(&self, dataset: &FlatDataset) -> bool {
        let values =
            dataset.layout.file_len(ArrayKind::Data) + dataset.layout.file_len(ArrayKind::ColPtr);
        values > EXACT_ROWS_VALUES_PER_CACHE.saturating_mul(self.cache_bytes)
    }

    /// The exact ranges of a row range's values in one chunk (`values`: element
    /// offsets within the chunk), in the flat files, rounded out to whole pages.
    pub(super) fn exact_ranges(
        &self,
        dataset: &FlatDataset,
        chunk: usize,
        values: &Range<u64>,
    ) -> Vec<ExactRange> {
        let chunk_start = dataset.layout.nnz_before(chunk);
        [ArrayKind::Data, ArrayKind::ColPtr]
            .into_iter()
            .map(|kind| {
                let width = dataset.layout.width(kind);
                let elements = chunk_start + values.start..chunk_start + values.end;
                ExactRange::whole_pages(dataset, kind, elements.start * width..elements.end * width)
            })
            .filter(|range| !range.file_bytes.is_empty())
            .collect()
    }

    /// The pages of the flat row offsets that bound `rows` (entries `rows.start` to
    /// `rows.end`, the last inclusive), and the chunks whose offsets they hold. A
    /// reader's memory map faults on them before it reads a row's values: stored into
    /// the page cache like the values, they spare each row a FUSE read, which the kernel
    /// widens to its read-around, the offsets of several chunks the plan does not read
    /// (measured on 10^7 rows in 2,442 chunks, blocks of one row: a read of 128 KiB
    /// every row, 47 ms each, all of the reader's time).
    pub(super) fn row_offset_pages(
        &self,
        dataset: &FlatDataset,
        rows: &Range<u64>,
    ) -> (ExactRange, Vec<usize>) {
        let width = dataset.layout.width(ArrayKind::RowPtr);
        let pages = ExactRange::whole_pages(
            dataset,
            ArrayKind::RowPtr,
            rows.start * width..(rows.end + 1) * width,
        );
        let bytes = &pages.file_bytes;
        let read = dataset
            .layout
            .map(ArrayKind::RowPtr, bytes.start, bytes.end - bytes.start);
        let mut chunks: Vec<usize> = read
            .pieces
            .iter()
            .filter_map(|piece| match piece {
                FlatPiece::Chunk { chunk, .. } => Some(*chunk),
                FlatPiece::TotalNnz => None,
            })
            .collect();
        chunks.dedup();
        (pages, chunks)
    }

    /// Asks for the bytes of `range` that are neither cached nor held, part by part;
    /// once every piece is held, hands the range to the page cache. A piece that is most
    /// of its part is fetched with its part (cached as any part).
    pub(super) fn issue_exact(&self, dataset: &Arc<FlatDataset>, range: ExactRange) -> Issued {
        let read = dataset.layout.map(
            range.kind,
            range.file_bytes.start,
            range.file_bytes.end - range.file_bytes.start,
        );
        let mut pieces: Vec<(Arc<ObjectInfo>, Range<u64>)> = Vec::new();
        for piece in read.pieces {
            if let FlatPiece::Chunk {
                chunk,
                array,
                range,
                ..
            } = piece
            {
                let object = dataset.array(chunk, array);
                if let Some(group) = object.group {
                    self.fetcher.read_exactly(group);
                }
                for index in self.fetcher.parts_of(&range) {
                    let part = self.fetcher.part_range(object, index);
                    let within = range.start.max(part.start)..range.end.min(part.end);
                    pieces.push((object.clone(), within));
                }
            }
        }
        let mut issued = Issued {
            all: true,
            bytes: 0,
            parts: Vec::new(),
        };
        let asked: u64 = pieces
            .iter()
            .filter(|(object, within)| !self.most_of_its_part(object, within))
            .map(|(_, within)| within.end - within.start)
            .sum();
        if !self.fetcher.has_planned_room_for(asked) {
            // Whole or not at all: a piece held while another found no room could not
            // be stored, and would hold its room until dropped.
            issued.all = false;
            return issued;
        }
        // The range goes to the page cache when its last piece is held (the count
        // includes this call's own, dropped after every piece is issued).
        let waiting = Arc::new(AtomicUsize::new(pieces.len() + 1));
        let arrive = {
            let (pages, dataset) = (self.planned_pages.get().cloned(), dataset.clone());
            let kind = range.kind;
            let file_bytes = range.file_bytes.clone();
            let waiting = waiting.clone();
            move || {
                if waiting.fetch_sub(1, Ordering::AcqRel) == 1 {
                    if let Some(pages) = &pages {
                        pages.arrived(&dataset, kind, file_bytes.clone());
                    }
                }
            }
        };
        let arrive = Arc::new(arrive);
        for (object, within) in pieces {
            let index = within.start / self.fetcher.part_size();
            let key = Fetcher::key(&object, index);
            issued.parts.push(key);
            if self.most_of_its_part(&object, &within) {
                // Most of the part: fetched whole (and cached) like a window's.
                if self.fetcher.prefetch(&object, index) {
                    let part = self.fetcher.part_range(&object, index);
                    issued.bytes += part.end - part.start;
                } else if !self.cache.contains(key) && !self.fetcher.is_in_flight(key) {
                    issued.all = false;
                }
                arrive();
                continue;
            }
            let on_arrival = arrive.clone();
            match self
                .fetcher
                .prefetch_planned(&object, within.clone(), move || on_arrival())
            {
                Planned::Started => issued.bytes += within.end - within.start,
                // Local, or on its way for another range: the push finds it, or
                // leaves those pages to the reader's faults.
                Planned::Local | Planned::Coming => arrive(),
                Planned::Refused => {
                    issued.all = false;
                    arrive();
                }
            }
        }
        arrive();
        issued
    }
}
