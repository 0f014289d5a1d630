//! Writing chunked archives: the chunk header and row-offset encoding that every writer
//! shares (the daemon's `scdlfs chunk`, which streams a monolithic archive from any
//! store to any store, and the synthetic-data generators), and a local chunk writer.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::dtype::Dtype;
use crate::header::{Backend, ChunkedInfo, Header, HeaderError};
use crate::layout::{chunk_dir_name, ArrayKind, HEADER_FILE};

/// Files and directories a chunked archive carries over once, globally.
pub const GLOBAL_ENTRIES: [&str; 4] = [
    "version.json",
    "metadata.json",
    "var_features",
    "obs_features",
];

#[derive(Debug, thiserror::Error)]
pub enum ChunkingError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: {source}")]
    Header { path: PathBuf, source: HeaderError },
    #[error("{0}")]
    Inconsistent(String),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ChunkingError + '_ {
    move |source| ChunkingError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Writes the chunk directories of a chunked archive one after the other.
#[derive(Debug)]
pub struct ChunkWriter {
    root: PathBuf,
    row_ptr_dtype: Dtype,
    chunks_written: u32,
    rows_written: u64,
    nnz_written: u64,
}

impl ChunkWriter {
    pub fn new(root: &Path, row_ptr_dtype: Dtype) -> Result<ChunkWriter, ChunkingError> {
        fs::create_dir_all(root).map_err(io_err(root))?;
        Ok(ChunkWriter {
            root: root.to_owned(),
            row_ptr_dtype,
            chunks_written: 0,
            rows_written: 0,
            nnz_written: 0,
        })
    }

    /// Writes the next chunk: its values and column ids as raw little-endian bytes, and
    /// its row offsets rebased to start at 0 (`rows + 1` entries, last = nnz).
    pub fn write_chunk(
        &mut self,
        data: &[u8],
        col_ptr: &[u8],
        row_ptr: &[u64],
        nnz: u64,
    ) -> Result<(), ChunkingError> {
        if row_ptr.last() != Some(&nnz) {
            return Err(ChunkingError::Inconsistent(format!(
                "chunk {} row offsets must end at its nnz {nnz}",
                self.chunks_written
            )));
        }
        let encoded = encode_row_offsets(self.row_ptr_dtype, row_ptr)?;
        let dir = self.root.join(chunk_dir_name(self.chunks_written));
        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        for (kind, bytes) in [
            (ArrayKind::Data, data),
            (ArrayKind::RowPtr, &encoded[..]),
            (ArrayKind::ColPtr, col_ptr),
        ] {
            let path = dir.join(kind.file_name());
            fs::write(&path, bytes).map_err(io_err(&path))?;
        }
        self.chunks_written += 1;
        self.rows_written += row_ptr.len() as u64 - 1;
        self.nnz_written += nnz;
        Ok(())
    }

    /// Writes `header.sch` for what was written: see [`chunked_header`].
    pub fn finish(self, template: &Header, chunk_size: u32) -> Result<Header, ChunkingError> {
        let header = chunked_header(
            template,
            ChunkedInfo {
                chunk_size,
                num_chunks: self.chunks_written,
                total_rows: self.rows_written,
            },
            self.nnz_written,
        )?;
        let path = self.root.join(HEADER_FILE);
        fs::write(&path, header.encode()).map_err(io_err(&path))?;
        Ok(header)
    }
}

/// The header of a chunked archive: `template`'s arrays (less the neighbour arrays,
/// which chunks do not carry) and feature indices, backend 2, and `chunks`. Fails
/// unless the template's array lengths agree with `chunks.total_rows` rows holding
/// `nnz` values.
pub fn chunked_header(
    template: &Header,
    chunks: ChunkedInfo,
    nnz: u64,
) -> Result<Header, ChunkingError> {
    let header = Header {
        backend: Backend::Chunked,
        arrays: template
            .arrays
            .iter()
            .filter(|a| !a.name.starts_with("NEIGHBOR"))
            .cloned()
            .collect(),
        chunked: Some(chunks),
        ..template.clone()
    };
    let [data, row_ptr, col_ptr] = header
        .csr_arrays()
        .map_err(|source| ChunkingError::Header {
            path: PathBuf::from(HEADER_FILE),
            source,
        })?;
    if data.length != nnz || col_ptr.length != nnz || row_ptr.length != chunks.total_rows + 1 {
        return Err(ChunkingError::Inconsistent(format!(
            "chunks hold {} rows and {nnz} values; the header says DATA {}, COLPTR {}, ROWPTR {}",
            chunks.total_rows, data.length, col_ptr.length, row_ptr.length
        )));
    }
    Ok(header)
}

/// A chunk's row offsets as its `row_ptr.npy` stores them: rebased to start at 0, in
/// the archive's row-offset dtype. Fails on offsets that do not start at 0, decrease,
/// or do not fit the dtype.
pub fn encode_row_offsets(dtype: Dtype, offsets: &[u64]) -> Result<Vec<u8>, ChunkingError> {
    if offsets.first() != Some(&0) || offsets.windows(2).any(|w| w[0] > w[1]) {
        return Err(ChunkingError::Inconsistent(
            "a chunk's row offsets must start at 0 and never decrease".into(),
        ));
    }
    let width = dtype
        .size()
        .filter(|_| dtype.is_unsigned_int())
        .ok_or_else(|| {
            ChunkingError::Inconsistent(format!("row offsets cannot be stored as {dtype}"))
        })? as usize;
    let mut encoded = vec![0u8; offsets.len() * width];
    for (i, &v) in offsets.iter().enumerate() {
        if !dtype.write_uint(&mut encoded, i, v) {
            return Err(ChunkingError::Inconsistent(format!(
                "row offset {v} does not fit {dtype}"
            )));
        }
    }
    Ok(encoded)
}
