//! Monolithic SCDL datasets found in the store, and the datasets a hint file steers.
//!
//! A directory whose `header.sch` is monolithic is served as stored, but it gets a hint
//! file like a chunked dataset, so its readers' plans are prefetched too. Its rows are
//! grouped into *virtual chunks* of a fixed row count (the hint protocol's `chunk-rows`,
//! which the hint file announces), which `window` steps name. Which bytes a virtual
//! chunk or a row range reads is known only from the row offsets in `row_ptr.npy`; the
//! prefetcher reads the few entries it needs from there ([`MonolithicDataset::value_range`]),
//! and the dataset remembers those at virtual chunk boundaries, so that a virtual chunk's
//! bytes stay known for eviction once they were located
//! ([`MonolithicDataset::chunk_values`]).
//!
//! The dataset is checked from sizes alone on discovery: the three arrays exist, hold
//! whole elements, and their lengths agree with the header's.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use object_store::path::Path as ObjectPath;
use parking_lot::Mutex;
use scdl_format::flat::{check_row_range_offsets, RowOffsetError};
use scdl_format::{ArrayKind, ChunkGeometry, Dtype, Header, HeaderError};

use super::dataset::FlatDataset;
use super::objects::ObjectInfo;

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
    /// The row offsets read so far at virtual chunk boundaries, by boundary (`k`: the
    /// first row of chunk `k`, or the end of the rows).
    boundaries: Mutex<HashMap<u64, u64>>,
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
                    boundaries.insert(boundary, offset);
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
        let rows = self.geometry.chunk_rows(chunk);
        let boundaries = self.boundaries.lock();
        let (start, end) = (*boundaries.get(&chunk)?, *boundaries.get(&(chunk + 1))?);
        check_row_range_offsets(rows, start, end, self.total_nnz).ok()?;
        Some(start..end)
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

/// A dataset a hint file steers: chunked (shown flat), or monolithic (shown as stored).
#[derive(Clone)]
pub enum Dataset {
    Chunked(Arc<FlatDataset>),
    Monolithic(Arc<MonolithicDataset>),
}

impl Dataset {
    pub fn prefix(&self) -> &ObjectPath {
        match self {
            Dataset::Chunked(d) => &d.prefix,
            Dataset::Monolithic(d) => &d.prefix,
        }
    }

    /// How the dataset's rows fall into chunks, real or virtual: what plans name.
    pub fn geometry(&self) -> ChunkGeometry {
        match self {
            Dataset::Chunked(d) => d.geometry(),
            Dataset::Monolithic(d) => d.geometry,
        }
    }

    pub fn mtime(&self) -> SystemTime {
        match self {
            Dataset::Chunked(d) => d.mtime,
            Dataset::Monolithic(d) => d.mtime(),
        }
    }

    pub fn same(&self, other: &Dataset) -> bool {
        match (self, other) {
            (Dataset::Chunked(a), Dataset::Chunked(b)) => Arc::ptr_eq(a, b),
            (Dataset::Monolithic(a), Dataset::Monolithic(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}
