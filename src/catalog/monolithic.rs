//! Monolithic SCDL datasets found in the store, and the datasets a hint file steers.
//!
//! A directory whose `header.sch` is monolithic is served as stored, but it gets a hint
//! file like a chunked dataset, so its readers' plans are prefetched too. Its rows are
//! grouped into *virtual chunks* of a fixed row count (the hint protocol's `chunk-rows`,
//! which the hint file announces), which `window` steps name. Which bytes a virtual
//! chunk or a row range reads is known only from the row offsets in `row_ptr.npy`; the
//! prefetcher reads the few entries it needs from there ([`MonolithicDataset::value_range`]),
//! and the dataset remembers those at virtual chunk boundaries, from the prefetcher's
//! look-ups and from the row offsets served to readers
//! ([`MonolithicDataset::remember_served_row_offsets`]). So a virtual chunk's bytes stay
//! known for eviction once they were located ([`MonolithicDataset::chunk_values`]), and a
//! read of values can be told which virtual chunk it is in
//! ([`MonolithicDataset::chunks_of_values`]) before any prefetch located it.
//!
//! The dataset is checked from sizes alone on discovery: the three arrays exist, hold
//! whole elements, and their lengths agree with the header's.

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use object_store::path::Path as ObjectPath;
use parking_lot::Mutex;
use scdl_format::flat::{check_row_range_offsets, RowOffsetError};
use scdl_format::{ArrayKind, ChunkGeometry, Dtype, Header, HeaderError};

use crate::object::ObjectInfo;

/// Rows per virtual chunk of a monolithic dataset: the sampler's default for local
/// monolithic archives. The hint file announces it, so a sampler never assumes it.
pub const DEFAULT_VIRTUAL_CHUNK_ROWS: u64 = 1024;

/// Why a monolithic directory gets no hint file (it is still served as stored).
#[derive(Debug, thiserror::Error)]
pub enum InconsistentMonolithic {
    #[error(transparent)]
    Header(#[from] HeaderError),
    #[error("header's ROWPTR has no entries, not even the final offset")]
    NoRowOffsets,
    #[error("header's DATA has {data} values but COLPTR {col_ptr}")]
    ValueCounts { data: u64, col_ptr: u64 },
    #[error("{0} is missing")]
    Missing(&'static str),
    #[error("{key} is {size} bytes; the header's {length} entries of {dtype} need {expected}")]
    Size {
        key: ObjectPath,
        size: u64,
        length: u64,
        dtype: Dtype,
        expected: u128,
    },
    #[error("{rows} rows make more than 2^32 virtual chunks of {chunk_rows}")]
    TooManyChunks { rows: u64, chunk_rows: u64 },
}

/// Row offsets of a monolithic dataset that cannot be right.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {source}")]
pub struct CorruptRowOffsets {
    pub key: ObjectPath,
    pub source: RowOffsetError,
}

/// A monolithic dataset, served as stored, with virtual chunks for its plans.
pub struct MonolithicDataset {
    pub prefix: ObjectPath,
    /// The three arrays, in [`ArrayKind::ALL`] order.
    pub arrays: [Arc<ObjectInfo>; 3],
    pub dtypes: [Dtype; 3],
    pub geometry: ChunkGeometry,
    pub total_nnz: u64,
    /// Whether corrupt row offsets were reported already (once per mount is enough).
    corruption_reported: AtomicBool,
    boundaries: Mutex<Boundaries>,
}

/// The row offsets read so far at virtual chunk boundaries (boundary `k`: the first
/// row of chunk `k`, or the end of the rows). The first value read of each is kept:
/// they are the stored bytes of one pinned version, and a pair of them is checked
/// before it is used.
#[derive(Default)]
struct Boundaries {
    by_chunk: HashMap<u64, u64>,
    /// `(offset, boundary)`, to find the chunk holding a value.
    by_offset: BTreeSet<(u64, u64)>,
}

impl Boundaries {
    fn remember(&mut self, boundary: u64, offset: u64) -> bool {
        if self.by_chunk.contains_key(&boundary) {
            return false;
        }
        self.by_chunk.insert(boundary, offset);
        self.by_offset.insert((offset, boundary));
        true
    }
}

impl MonolithicDataset {
    /// Checks a monolithic dataset from its header and the objects of its directory
    /// (by file name). The error names the object and the mismatch.
    /// `virtual_chunk_rows` must be positive.
    pub fn validate(
        prefix: ObjectPath,
        header: &Header,
        objects: &HashMap<&str, Arc<ObjectInfo>>,
        virtual_chunk_rows: u64,
    ) -> Result<MonolithicDataset, InconsistentMonolithic> {
        use InconsistentMonolithic as E;
        // Checks that the arrays have types a reader can map: raw numbers, offsets.
        let infos = header.csr_arrays()?;
        let rows = infos[1].length.checked_sub(1).ok_or(E::NoRowOffsets)?;
        if infos[0].length != infos[2].length {
            return Err(E::ValueCounts {
                data: infos[0].length,
                col_ptr: infos[2].length,
            });
        }
        let mut arrays = Vec::new();
        for (kind, info) in ArrayKind::ALL.into_iter().zip(infos) {
            let object = objects
                .get(kind.file_name())
                .ok_or(E::Missing(kind.file_name()))?;
            // csr_arrays accepts fixed-size types only.
            let width = info.dtype.size().expect("fixed-size CSR array");
            let expected = info.length as u128 * width as u128;
            if object.size as u128 != expected {
                return Err(E::Size {
                    key: object.key.clone(),
                    size: object.size,
                    length: info.length,
                    dtype: info.dtype,
                    expected,
                });
            }
            arrays.push(object.clone());
        }
        let geometry = ChunkGeometry::new(rows, virtual_chunk_rows).expect("positive chunk rows");
        if u32::try_from(geometry.num_chunks()).is_err() {
            return Err(E::TooManyChunks {
                rows,
                chunk_rows: virtual_chunk_rows,
            });
        }
        Ok(MonolithicDataset {
            prefix,
            arrays: arrays.try_into().expect("three arrays"),
            dtypes: infos.map(|i| i.dtype),
            geometry,
            total_nnz: infos[0].length,
            corruption_reported: AtomicBool::new(false),
            boundaries: Mutex::default(),
        })
    }

    pub fn array(&self, kind: ArrayKind) -> &Arc<ObjectInfo> {
        &self.arrays[kind.index()]
    }

    pub fn width(&self, kind: ArrayKind) -> u64 {
        self.dtypes[kind.index()]
            .size()
            .expect("fixed-size, checked")
    }

    /// The bytes of `row_ptr.npy` holding the offsets of `rows` and the one after.
    pub fn row_ptr_bytes(&self, rows: &Range<u64>) -> Range<u64> {
        let width = self.width(ArrayKind::RowPtr);
        rows.start * width..(rows.end + 1) * width
    }

    /// The values `[row_ptr[rows.start], row_ptr[rows.end])` of `rows`, from the two
    /// entries as read by `entry` (`None` while an entry is not local). Offsets that
    /// cannot be right (decreasing, past the value count) are an error, which is
    /// logged once per mount; right ones at virtual chunk boundaries are remembered.
    pub fn value_range(
        &self,
        rows: &Range<u64>,
        entry: impl Fn(u64) -> Option<u64>,
    ) -> Option<Result<Range<u64>, CorruptRowOffsets>> {
        let (start, end) = (entry(rows.start)?, entry(rows.end)?);
        let Err(source) = check_row_range_offsets(rows.clone(), start, end, self.total_nnz) else {
            let mut boundaries = self.boundaries.lock();
            for (row, offset) in [(rows.start, start), (rows.end, end)] {
                if let Some(boundary) = self.boundary_at(row) {
                    boundaries.remember(boundary, offset);
                }
            }
            return Some(Ok(start..end));
        };
        let error = CorruptRowOffsets {
            key: self.array(ArrayKind::RowPtr).key.clone(),
            source,
        };
        if !self.corruption_reported.swap(true, Ordering::Relaxed) {
            tracing::error!(dataset = %self.prefix, %error, "corrupt row offsets; no prefetch of the rows they bound");
        }
        Some(Err(error))
    }

    /// The values of virtual chunk `chunk`, if the row offsets at both its ends were
    /// read (by [`MonolithicDataset::value_range`]) and agree with each other.
    pub fn chunk_values(&self, chunk: u64) -> Option<Range<u64>> {
        self.checked_chunk_values(&self.boundaries.lock(), chunk)
    }

    fn checked_chunk_values(&self, boundaries: &Boundaries, chunk: u64) -> Option<Range<u64>> {
        let rows = self.geometry.chunk_rows(chunk);
        let by_chunk = &boundaries.by_chunk;
        let (start, end) = (*by_chunk.get(&chunk)?, *by_chunk.get(&(chunk + 1))?);
        check_row_range_offsets(rows, start, end, self.total_nnz).ok()?;
        Some(start..end)
    }

    /// Remembers the row offsets at virtual chunk boundaries among `bytes`, served from
    /// `row_ptr.npy` at `offset` (whole entries only). Returns whether any was new.
    pub fn remember_served_row_offsets(&self, offset: u64, bytes: &[u8]) -> bool {
        let width = self.width(ArrayKind::RowPtr);
        let entries = offset.div_ceil(width)..(offset + bytes.len() as u64) / width;
        let size = self.geometry.chunk_size;
        let last = self.geometry.total_rows;
        let at_boundaries = (entries.start.div_ceil(size) * size..entries.end)
            .step_by(size as usize)
            .chain((entries.contains(&last) && !last.is_multiple_of(size)).then_some(last));
        let mut boundaries = self.boundaries.lock();
        let mut new = false;
        for entry in at_boundaries {
            let at = (entry * width - offset) as usize;
            let value = self.dtypes[ArrayKind::RowPtr.index()]
                .read_uint(&bytes[at..at + width as usize], 0);
            let boundary = self.boundary_at(entry).expect("a boundary row");
            new |= boundaries.remember(boundary, value);
        }
        new
    }

    /// The virtual chunks holding the first and the last of `values` (indices into the
    /// values and column ids), if the offsets around them were read and are consistent.
    pub fn chunks_of_values(&self, values: Range<u64>) -> Option<(u64, u64)> {
        if values.is_empty() {
            return None;
        }
        let boundaries = self.boundaries.lock();
        let chunk_of = |value: u64| {
            // The last boundary at or before the value; of several at one offset (empty
            // chunks), the last, whose chunk is the one that holds values.
            let &(_, chunk) = boundaries
                .by_offset
                .range(..=(value, u64::MAX))
                .next_back()?;
            let held = self.checked_chunk_values(&boundaries, chunk)?;
            held.contains(&value).then_some(chunk)
        };
        Some((chunk_of(values.start)?, chunk_of(values.end - 1)?))
    }

    /// How many boundary offsets are remembered: it grows as chunks are located.
    pub fn known_boundaries(&self) -> usize {
        self.boundaries.lock().by_chunk.len()
    }

    /// Which virtual chunk boundary row `row` is, if it is one.
    fn boundary_at(&self, row: u64) -> Option<u64> {
        let size = self.geometry.chunk_size;
        if row.is_multiple_of(size) {
            Some(row / size)
        } else {
            (row == self.geometry.total_rows).then(|| self.geometry.num_chunks())
        }
    }

    pub fn mtime(&self) -> SystemTime {
        self.arrays
            .iter()
            .map(|a| a.mtime)
            .max()
            .expect("three arrays")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parts::ObjectId;
    use crate::synthetic::SyntheticDataset;
    use proptest::prelude::*;

    /// A monolithic dataset of `spec` in virtual chunks of `chunk_rows`, and its row
    /// offsets as stored.
    fn dataset(spec: &SyntheticDataset, chunk_rows: u64) -> (MonolithicDataset, Vec<u8>) {
        let header = spec.monolithic_header();
        let infos = header.csr_arrays().unwrap();
        let objects: HashMap<&str, Arc<ObjectInfo>> = ArrayKind::ALL
            .into_iter()
            .zip(infos)
            .enumerate()
            .map(|(id, (kind, info))| {
                let object = ObjectInfo {
                    id: ObjectId(id as u64),
                    key: ObjectPath::from(kind.file_name()),
                    size: info.length * info.dtype.size().unwrap(),
                    etag: None,
                    mtime: SystemTime::UNIX_EPOCH,
                    group: None,
                };
                (kind.file_name(), Arc::new(object))
            })
            .collect();
        let dataset =
            MonolithicDataset::validate(ObjectPath::from("ds"), &header, &objects, chunk_rows)
                .unwrap();
        let dtype = infos[1].dtype;
        let mut row_ptr = vec![0u8; objects["row_ptr.npy"].size as usize];
        let mut offset = 0;
        for row in 0..=spec.rows {
            dtype.write_uint(&mut row_ptr, row as usize, offset);
            offset += spec.row_len(row);
        }
        (dataset, row_ptr)
    }

    proptest! {
        /// Whatever row offsets were served, in whatever slices, a value is placed in
        /// the virtual chunk that holds it or in none; and every value of a chunk
        /// whose two boundary offsets were served is placed.
        #[test]
        fn served_row_offsets_place_values_in_their_virtual_chunks(
            rows in 1u64..3000,
            mean_values in 0u32..40,
            chunk_rows in 1u64..700,
            slices in proptest::collection::vec((0.0f64..1.0, 1usize..5000), 1..6),
        ) {
            let spec = SyntheticDataset { rows, genes: 600, chunk_rows: 1, mean_values, seed: 3 };
            let (dataset, row_ptr) = dataset(&spec, chunk_rows);
            let width = dataset.width(ArrayKind::RowPtr) as usize;
            let mut served = vec![false; rows as usize + 1];
            for (at, len) in slices {
                let start = (at * row_ptr.len() as f64) as usize;
                let end = (start + len).min(row_ptr.len());
                dataset.remember_served_row_offsets(start as u64, &row_ptr[start..end]);
                let entries = start.div_ceil(width)..end / width;
                if !entries.is_empty() {
                    served[entries].fill(true);
                }
            }
            let offset = |row: u64| dtype_entry(&dataset, &row_ptr, row);
            for chunk in 0..dataset.geometry.num_chunks() {
                let rows = dataset.geometry.chunk_rows(chunk);
                let values = offset(rows.start)..offset(rows.end);
                let located = served[rows.start as usize] && served[rows.end as usize];
                prop_assert_eq!(dataset.chunk_values(chunk), located.then(|| values.clone()));
                for value in values {
                    let placed = dataset.chunks_of_values(value..value + 1);
                    prop_assert!(placed.is_none() || placed == Some((chunk, chunk)), "{value}: {placed:?}");
                    prop_assert!(!located || placed.is_some(), "{value} of chunk {chunk}");
                }
            }
        }
    }

    fn dtype_entry(dataset: &MonolithicDataset, row_ptr: &[u8], row: u64) -> u64 {
        dataset.dtypes[ArrayKind::RowPtr.index()].read_uint(row_ptr, row as usize)
    }

    #[test]
    fn a_remembered_offset_is_reported_new_once() {
        let spec = SyntheticDataset {
            rows: 100,
            genes: 50,
            chunk_rows: 1,
            mean_values: 5,
            seed: 1,
        };
        let (dataset, row_ptr) = dataset(&spec, 10);
        assert!(dataset.remember_served_row_offsets(0, &row_ptr));
        assert_eq!(dataset.known_boundaries(), 11);
        assert!(!dataset.remember_served_row_offsets(0, &row_ptr));
    }
}
