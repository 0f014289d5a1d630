//! Chunked SCDL datasets found in the store, checked from sizes alone before they are
//! presented as flat (monolithic) archives.
//!
//! A directory whose `header.sch` decodes as a chunked header becomes a [`FlatDataset`]
//! only if every chunk's three arrays exist and agree with each other and with the
//! header: equal value counts in `data.npy` and `col_ptr.npy`, `rows + 1` entries in
//! `row_ptr.npy`, totals equal to the header's. The contents of each chunk's row
//! offsets are checked later, on first use ([`crate::row_offset_check`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use scdl_format::flat::{check_chunk_row_offsets, ChunkSizes, FlatLayout};
use scdl_format::layout::{chunk_dir_name, parse_chunk_dir_name};
use scdl_format::{ArrayKind, ChunkGeometry, Header, HeaderError};

use crate::error::FsError;
use crate::object::ObjectInfo;
use crate::parts::ObjectId;

/// The three array objects of one chunk, in [`ArrayKind::ALL`] order.
pub type ChunkObjects = [Arc<ObjectInfo>; 3];

/// The objects in a chunked dataset's chunk directories, by chunk: what a listing of
/// the dataset (or its manifest) shows there, before it is checked. Found by chunk
/// number and array kind, not by a key of their own: the objects' keys are all it
/// holds of names (a map by relative key held a third copy of each, 8 MB at 10^5
/// objects, while the dataset was discovered).
#[derive(Clone, Default)]
pub struct ChunkDirs {
    chunks: HashMap<u32, ChunkDir>,
}

#[derive(Clone, Default)]
struct ChunkDir {
    arrays: [Option<Arc<ObjectInfo>>; 3],
    /// Anything else under the chunk's directory (`chunk_00003/notes.txt`).
    others: Vec<Arc<ObjectInfo>>,
}

impl ChunkDirs {
    /// Room for the chunks of `objects` objects (three a chunk).
    pub fn with_capacity(objects: usize) -> ChunkDirs {
        ChunkDirs {
            chunks: HashMap::with_capacity(objects / 3 + 1),
        }
    }

    /// How many chunk directories hold an object.
    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Takes `object`, at key `relative` to the dataset's prefix, if it lies in a chunk
    /// directory (`chunk_00003/...`); anything else is not kept.
    pub fn insert(&mut self, relative: &str, object: Arc<ObjectInfo>) {
        let Some((dir, rest)) = relative.split_once('/') else {
            return;
        };
        let Some(chunk) = parse_chunk_dir_name(dir) else {
            return;
        };
        let at = self.chunks.entry(chunk).or_default();
        match ArrayKind::from_file_name(rest) {
            Some(kind) => at.arrays[kind.index()] = Some(object),
            None => at.others.push(object),
        }
    }

    /// Array `kind` of chunk `chunk`, if listed.
    pub fn array(&self, chunk: u32, kind: ArrayKind) -> Option<&Arc<ObjectInfo>> {
        self.chunks.get(&chunk)?.arrays[kind.index()].as_ref()
    }

    /// Every object held, in no order.
    pub fn ids(&self) -> impl Iterator<Item = ObjectId> + '_ {
        self.chunks.values().flat_map(|dir| {
            let arrays = dir.arrays.iter().flatten();
            arrays.chain(&dir.others).map(|object| object.id)
        })
    }

    /// An object of the lowest-numbered chunk from `chunks` on, if any is held.
    pub fn beyond(&self, chunks: u32) -> Option<&Arc<ObjectInfo>> {
        let (_, dir) = (self.chunks.iter())
            .filter(|(&chunk, _)| chunk >= chunks)
            .min_by_key(|(&chunk, _)| chunk)?;
        dir.arrays.iter().flatten().chain(&dir.others).next()
    }
}

/// A chunked dataset presented as a monolithic archive.
pub struct FlatDataset {
    /// The dataset directory's key prefix.
    pub prefix: ObjectPath,
    /// The chunked header as stored.
    pub header: Header,
    /// `header.sch` of the equivalent monolithic archive.
    pub flat_header: Bytes,
    pub layout: FlatLayout,
    pub chunks: Vec<ChunkObjects>,
    /// Newest modification time among the header and the chunks.
    pub mtime: SystemTime,
    row_ptr_checks: Vec<tokio::sync::OnceCell<RowOffsetsVerdict>>,
    /// Whether the prefetcher has started each chunk's check.
    row_ptr_checks_started: Vec<AtomicBool>,
}

/// Whether a chunk's row offsets passed their check ([`crate::row_offset_check`]). A
/// dataset holds one per chunk: the rejection, which no valid chunk has, is boxed, so
/// that the verdict is a word, not the 64 bytes of the rejection.
pub type RowOffsetsVerdict = Result<(), Box<RowOffsetsRejected>>;

/// A chunk's `row_ptr.npy` breaks the format's rules: its reads fail.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{key}: {source}")]
pub struct RowOffsetsRejected {
    pub key: String,
    pub source: scdl_format::flat::RowOffsetError,
}

impl From<RowOffsetsRejected> for FsError {
    fn from(rejected: RowOffsetsRejected) -> FsError {
        FsError::RowOffsets {
            key: rejected.key,
            source: rejected.source,
        }
    }
}

impl From<Box<RowOffsetsRejected>> for FsError {
    fn from(rejected: Box<RowOffsetsRejected>) -> FsError {
        FsError::from(*rejected)
    }
}

/// Why a chunked dataset is not presented flat: the object or the header field, and the
/// mismatch.
#[derive(Debug, thiserror::Error)]
pub enum InconsistentDataset {
    #[error("header has no chunk information")]
    NotChunked,
    #[error(transparent)]
    Header(#[from] HeaderError),
    #[error("header gives a chunk size of 0")]
    ZeroChunkSize,
    #[error(
        "header says {declared} chunks, but {rows} rows in chunks of {chunk_size} make {counted}"
    )]
    ChunkCount {
        declared: u32,
        rows: u64,
        chunk_size: u32,
        counted: u64,
    },
    #[error("header's ROWPTR has {entries} entries for {rows} rows (expected rows + 1)")]
    RowPtrLength { entries: u64, rows: u64 },
    #[error("header's DATA has {data} values but COLPTR {col_ptr}")]
    ValueCounts { data: u64, col_ptr: u64 },
    #[error("{values} values do not fit the header's ROWPTR type {dtype}")]
    RowPtrType {
        values: u64,
        dtype: scdl_format::Dtype,
    },
    #[error("chunks of {chunk_size} rows carry {bytes} bytes of row offsets each, more than the {MAX_CHUNK_ROW_OFFSET_BYTES} scdlfs checks")]
    RowOffsetsTooLarge { chunk_size: u32, bytes: u64 },
    #[error("{0} is missing")]
    Missing(String),
    #[error("{key} is {size} bytes, not a whole number of {width}-byte elements")]
    PartialElement {
        key: ObjectPath,
        size: u64,
        width: u64,
    },
    #[error("{col_ptr} holds {col_values} values but {data} holds {nnz}")]
    ChunkValueCounts {
        col_ptr: ObjectPath,
        col_values: u64,
        data: ObjectPath,
        nnz: u64,
    },
    #[error("{key} has {entries} entries; chunk {chunk} has {rows} rows, so it needs {}", rows + 1)]
    ChunkRowPtrLength {
        key: ObjectPath,
        entries: u64,
        chunk: u64,
        rows: u64,
    },
    #[error("the chunks' value counts overflow at {0}")]
    ValueCountOverflow(ObjectPath),
    #[error("{key} lies beyond the {declared} chunks the header declares")]
    ExtraChunk { key: String, declared: u32 },
    #[error("chunks hold {total} values in all; the header says {declared}")]
    TotalValues { total: u64, declared: u64 },
}

/// The largest row-offset array of one chunk that scdlfs checks (in memory, whole)
/// before serving the chunk: 32 Mi rows of 8-byte offsets.
pub const MAX_CHUNK_ROW_OFFSET_BYTES: u64 = 256 << 20;

/// Chunk `chunk`'s three arrays (its `rows`), checked against the widths of the
/// header's dtypes and each other: whole elements, as many column ids as values, one
/// row offset per row and one more. Returns them with the chunk's value count.
fn checked_chunk(
    chunk: u64,
    rows: std::ops::Range<u64>,
    widths: [u64; 3],
    objects: &ChunkDirs,
) -> Result<(ChunkObjects, u64), InconsistentDataset> {
    use InconsistentDataset as E;
    let arrays = ArrayKind::ALL.map(|kind| {
        let missing = || format!("{}/{}", chunk_dir_name(chunk as u32), kind.file_name());
        objects
            .array(chunk as u32, kind)
            .cloned()
            .ok_or_else(missing)
    });
    let [d, r, c] = arrays;
    let arrays = [
        d.map_err(E::Missing)?,
        r.map_err(E::Missing)?,
        c.map_err(E::Missing)?,
    ];
    for (info, width) in arrays.iter().zip(widths) {
        if info.size % width != 0 {
            return Err(E::PartialElement {
                key: info.key.clone(),
                size: info.size,
                width,
            });
        }
    }
    let [d, r, c] = &arrays;
    let nnz = d.size / widths[0];
    if c.size / widths[2] != nnz {
        return Err(E::ChunkValueCounts {
            col_ptr: c.key.clone(),
            col_values: c.size / widths[2],
            data: d.key.clone(),
            nnz,
        });
    }
    if r.size / widths[1] != rows.end - rows.start + 1 {
        return Err(E::ChunkRowPtrLength {
            key: r.key.clone(),
            entries: r.size / widths[1],
            chunk,
            rows: rows.end - rows.start,
        });
    }
    Ok((arrays, nnz))
}

impl FlatDataset {
    /// Checks a chunked dataset from its header and the objects listed in its chunk
    /// directories. The error names the object and the mismatch.
    pub fn validate(
        prefix: ObjectPath,
        header: Header,
        header_mtime: SystemTime,
        objects: &ChunkDirs,
    ) -> Result<FlatDataset, InconsistentDataset> {
        use InconsistentDataset as E;
        let chunked = header.chunked.ok_or(E::NotChunked)?;
        let [data, row_ptr, col_ptr] = header.csr_arrays()?;
        let geometry = ChunkGeometry::new(chunked.total_rows, chunked.chunk_size as u64)
            .ok_or(E::ZeroChunkSize)?;
        if geometry.num_chunks() != chunked.num_chunks as u64 {
            return Err(E::ChunkCount {
                declared: chunked.num_chunks,
                rows: chunked.total_rows,
                chunk_size: chunked.chunk_size,
                counted: geometry.num_chunks(),
            });
        }
        if Some(row_ptr.length) != chunked.total_rows.checked_add(1) {
            return Err(E::RowPtrLength {
                entries: row_ptr.length,
                rows: chunked.total_rows,
            });
        }
        if data.length != col_ptr.length {
            return Err(E::ValueCounts {
                data: data.length,
                col_ptr: col_ptr.length,
            });
        }
        if !row_ptr.dtype.write_uint(&mut [0u8; 8], 0, data.length) {
            return Err(E::RowPtrType {
                values: data.length,
                dtype: row_ptr.dtype,
            });
        }
        let widths = [data.dtype, row_ptr.dtype, col_ptr.dtype].map(|d| d.size().unwrap());
        // A chunk's row offsets are checked whole in memory before any read of it.
        let row_offset_bytes = (chunked.chunk_size as u64 + 1) * widths[1];
        if row_offset_bytes > MAX_CHUNK_ROW_OFFSET_BYTES {
            return Err(E::RowOffsetsTooLarge {
                chunk_size: chunked.chunk_size,
                bytes: row_offset_bytes,
            });
        }
        // No capacity from the header alone: a corrupt chunk count must not allocate.
        let capacity = geometry.num_chunks().min(objects.len() as u64) as usize;
        let mut chunks = Vec::with_capacity(capacity);
        let mut sizes = Vec::with_capacity(capacity);
        let mut mtime = header_mtime;
        let mut total_nnz = 0u64;
        for chunk in 0..geometry.num_chunks() {
            let rows = geometry.chunk_rows(chunk);
            let (arrays, nnz) = checked_chunk(chunk, rows.clone(), widths, objects)?;
            for info in &arrays {
                mtime = mtime.max(info.mtime);
            }
            total_nnz = total_nnz
                .checked_add(nnz)
                .ok_or_else(|| E::ValueCountOverflow(arrays[0].key.clone()))?;
            sizes.push(ChunkSizes {
                rows: rows.end - rows.start,
                nnz,
            });
            chunks.push(arrays);
        }
        if let Some(extra) = objects.beyond(chunked.num_chunks) {
            return Err(E::ExtraChunk {
                key: extra.key.to_string(),
                declared: chunked.num_chunks,
            });
        }
        if total_nnz != data.length {
            return Err(E::TotalValues {
                total: total_nnz,
                declared: data.length,
            });
        }
        let layout = FlatLayout::new(data.dtype, row_ptr.dtype, col_ptr.dtype, &sizes);
        Ok(FlatDataset {
            prefix,
            flat_header: Bytes::from(header.to_monolithic().encode()),
            header,
            layout,
            row_ptr_checks: (0..chunks.len()).map(|_| Default::default()).collect(),
            row_ptr_checks_started: (0..chunks.len()).map(|_| AtomicBool::new(false)).collect(),
            chunks,
            mtime,
        })
    }

    /// How the rows fall into chunks, as the header declares (validated).
    pub fn geometry(&self) -> ChunkGeometry {
        let chunked = self.header.chunked.expect("validated chunked header");
        ChunkGeometry::new(chunked.total_rows, chunked.chunk_size as u64)
            .expect("validated chunk size")
    }

    /// The object of array `kind` of chunk `chunk`.
    pub fn array(&self, chunk: usize, kind: ArrayKind) -> &Arc<ObjectInfo> {
        &self.chunks[chunk][kind.index()]
    }

    /// Claims the start of chunk `chunk`'s check for the prefetcher: `true` once.
    pub fn start_row_ptr_check(&self, chunk: usize) -> bool {
        !self.row_ptr_checks_started[chunk].swap(true, Ordering::Relaxed)
    }

    /// The once-per-mount verdict on chunk `chunk`'s row offsets.
    pub fn row_ptr_check(&self, chunk: usize) -> &tokio::sync::OnceCell<RowOffsetsVerdict> {
        &self.row_ptr_checks[chunk]
    }

    /// Checks the bytes of chunk `chunk`'s `row_ptr.npy`: starts at 0, never decreases,
    /// ends at the chunk's value count.
    pub fn verify_row_ptr(&self, chunk: usize, bytes: &[u8]) -> RowOffsetsVerdict {
        let nnz = self.layout.chunk_sizes(chunk).nnz;
        check_chunk_row_offsets(bytes, self.layout.row_dtype(), nnz).map_err(|source| {
            Box::new(RowOffsetsRejected {
                key: self.array(chunk, ArrayKind::RowPtr).key.to_string(),
                source,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(id: u64, key: &str) -> Arc<ObjectInfo> {
        Arc::new(ObjectInfo {
            id: ObjectId(id),
            key: ObjectPath::from(key),
            size: 0,
            etag: None,
            mtime: SystemTime::UNIX_EPOCH,
            group: None,
        })
    }

    /// A chunk directory's arrays are found by chunk and kind, anything else in it is
    /// held as one of its objects, and what lies outside the chunk directories (or in a
    /// directory whose name is not a chunk's) is not held.
    #[test]
    fn chunk_dirs_hold_what_lies_in_chunk_directories() {
        let keys = [
            "chunk_00000/data.npy",
            "chunk_00000/row_ptr.npy",
            "chunk_00001/col_ptr.npy",
            "chunk_00001/notes.txt",
            "chunk_00001/deeper/data.npy",
            "chunk_00007/data.npy",
            "chunk_1/data.npy",
            "metadata.json",
            "features/data.npy",
        ];
        let mut dirs = ChunkDirs::with_capacity(keys.len());
        for (id, key) in keys.iter().enumerate() {
            dirs.insert(key, object(id as u64, &format!("ds/{key}")));
        }
        assert_eq!(dirs.len(), 3);
        let id = |chunk, kind| dirs.array(chunk, kind).map(|o| o.id.0);
        assert_eq!(id(0, ArrayKind::Data), Some(0));
        assert_eq!(id(0, ArrayKind::RowPtr), Some(1));
        assert_eq!(id(0, ArrayKind::ColPtr), None);
        assert_eq!(id(1, ArrayKind::ColPtr), Some(2));
        assert_eq!(id(1, ArrayKind::Data), None);
        assert_eq!(id(7, ArrayKind::Data), Some(5));
        assert_eq!(id(2, ArrayKind::Data), None);
        let mut ids: Vec<u64> = dirs.ids().map(|id| id.0).collect();
        ids.sort_unstable();
        assert_eq!(ids, [0, 1, 2, 3, 4, 5]);
        assert_eq!(
            dirs.beyond(2).map(|o| o.key.to_string()).as_deref(),
            Some("ds/chunk_00007/data.npy")
        );
        assert_eq!(dirs.beyond(1).map(|o| o.id.0), Some(2));
        assert!(dirs.beyond(8).is_none());
    }
}
