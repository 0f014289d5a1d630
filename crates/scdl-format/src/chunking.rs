//! Writing chunked archives: partitioning a monolithic archive by rows, and the chunk
//! writer that the partitioner and the synthetic-data generators share.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::dtype::Dtype;
use crate::header::{Backend, ChunkedInfo, Header, HeaderError};
use crate::layout::{chunk_dir_name, ArrayKind, ChunkGeometry, HEADER_FILE};

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
        if row_ptr.first() != Some(&0) || row_ptr.last() != Some(&nnz) {
            return Err(ChunkingError::Inconsistent(format!(
                "chunk {} row offsets must run from 0 to its nnz {nnz}",
                self.chunks_written
            )));
        }
        let dir = self.root.join(chunk_dir_name(self.chunks_written));
        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let width = self.row_ptr_dtype.size().expect("row_ptr is an integer") as usize;
        let mut encoded = vec![0u8; row_ptr.len() * width];
        for (i, &v) in row_ptr.iter().enumerate() {
            if !self.row_ptr_dtype.write_uint(&mut encoded, i, v) {
                return Err(ChunkingError::Inconsistent(format!(
                    "row offset {v} does not fit {}",
                    self.row_ptr_dtype
                )));
            }
        }
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

    /// Writes `header.sch`: `template`'s arrays and feature indices, backend 2, and the
    /// chunk description of what was written. Checks the totals against the template.
    pub fn finish(self, template: &Header, chunk_size: u32) -> Result<Header, ChunkingError> {
        let header = Header {
            backend: Backend::Chunked,
            arrays: template
                .arrays
                .iter()
                .filter(|a| !a.name.starts_with("NEIGHBOR"))
                .cloned()
                .collect(),
            chunked: Some(ChunkedInfo {
                chunk_size,
                num_chunks: self.chunks_written,
                total_rows: self.rows_written,
            }),
            ..template.clone()
        };
        let [data, row_ptr, col_ptr] =
            header
                .csr_arrays()
                .map_err(|source| ChunkingError::Header {
                    path: self.root.join(HEADER_FILE),
                    source,
                })?;
        if data.length != self.nnz_written
            || col_ptr.length != self.nnz_written
            || row_ptr.length != self.rows_written + 1
        {
            return Err(ChunkingError::Inconsistent(format!(
                "chunks hold {} rows and {} values; the header says DATA {}, COLPTR {}, ROWPTR {}",
                self.rows_written, self.nnz_written, data.length, col_ptr.length, row_ptr.length
            )));
        }
        let path = self.root.join(HEADER_FILE);
        fs::write(&path, header.encode()).map_err(io_err(&path))?;
        Ok(header)
    }
}

fn read_at(file: &mut File, path: &Path, offset: u64, len: u64) -> Result<Vec<u8>, ChunkingError> {
    let mut buf = vec![0u8; len as usize];
    file.seek(SeekFrom::Start(offset)).map_err(io_err(path))?;
    file.read_exact(&mut buf).map_err(io_err(path))?;
    Ok(buf)
}

fn copy_tree(from: &Path, to: &Path) -> Result<(), ChunkingError> {
    if from.is_dir() {
        fs::create_dir_all(to).map_err(io_err(to))?;
        for entry in fs::read_dir(from).map_err(io_err(from))? {
            let entry = entry.map_err(io_err(from))?;
            copy_tree(&entry.path(), &to.join(entry.file_name()))?;
        }
    } else {
        fs::copy(from, to).map_err(io_err(from))?;
    }
    Ok(())
}

/// Partitions the monolithic archive at `source` into a chunked archive at `target`,
/// `chunk_size` rows per chunk. Streams chunk by chunk, so memory stays at one chunk.
pub fn partition(source: &Path, target: &Path, chunk_size: u32) -> Result<Header, ChunkingError> {
    let header_path = source.join(HEADER_FILE);
    let bytes = fs::read(&header_path).map_err(io_err(&header_path))?;
    let header = Header::decode(&bytes).map_err(|source| ChunkingError::Header {
        path: header_path.clone(),
        source,
    })?;
    if header.backend != Backend::Monolithic {
        return Err(ChunkingError::Inconsistent(format!(
            "{} is not a monolithic archive",
            source.display()
        )));
    }
    let [data, row_ptr, col_ptr] = header
        .csr_arrays()
        .map_err(|source| ChunkingError::Header {
            path: header_path.clone(),
            source,
        })?;
    let geometry = ChunkGeometry::new(row_ptr.length.saturating_sub(1), chunk_size as u64)
        .ok_or_else(|| ChunkingError::Inconsistent("chunk size must be positive".into()))?;
    let open = |kind: ArrayKind| -> Result<(File, PathBuf), ChunkingError> {
        let path = source.join(kind.file_name());
        Ok((File::open(&path).map_err(io_err(&path))?, path))
    };
    let (mut data_file, data_path) = open(ArrayKind::Data)?;
    let (mut col_file, col_path) = open(ArrayKind::ColPtr)?;
    let (mut row_file, row_path) = open(ArrayKind::RowPtr)?;
    let (data_w, col_w, row_w) = (
        data.dtype.size().unwrap(),
        col_ptr.dtype.size().unwrap(),
        row_ptr.dtype.size().unwrap(),
    );

    if target.exists() {
        return Err(ChunkingError::Inconsistent(format!(
            "{} exists already; choose a new directory",
            target.display()
        )));
    }
    let mut writer = ChunkWriter::new(target, row_ptr.dtype)?;
    for chunk in 0..geometry.num_chunks() {
        let rows = geometry.chunk_rows(chunk);
        let entries = rows.end - rows.start + 1;
        let raw = read_at(
            &mut row_file,
            &row_path,
            rows.start * row_w,
            entries * row_w,
        )?;
        let offsets: Vec<u64> = (0..entries as usize)
            .map(|i| row_ptr.dtype.read_uint(&raw, i))
            .collect();
        let (first, last) = (offsets[0], offsets[offsets.len() - 1]);
        if offsets.windows(2).any(|w| w[0] > w[1]) || last > data.length {
            return Err(ChunkingError::Inconsistent(format!(
                "{}: row offsets of rows {}..{} are not monotone within {} values",
                row_path.display(),
                rows.start,
                rows.end,
                data.length
            )));
        }
        let rebased: Vec<u64> = offsets.iter().map(|o| o - first).collect();
        let nnz = last - first;
        let values = read_at(&mut data_file, &data_path, first * data_w, nnz * data_w)?;
        let cols = read_at(&mut col_file, &col_path, first * col_w, nnz * col_w)?;
        writer.write_chunk(&values, &cols, &rebased, nnz)?;
    }
    for entry in GLOBAL_ENTRIES {
        let from = source.join(entry);
        if from.exists() {
            copy_tree(&from, &target.join(entry))?;
        }
    }
    writer.finish(&header, chunk_size)
}
