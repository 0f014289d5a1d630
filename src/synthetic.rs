//! Synthetic chunked SCDL datasets for the demo, the tests and the benchmarks: rows of
//! realistic length derived from (seed, row) alone, so any reader can check any row it
//! got without keeping the dataset in memory.

use std::path::Path;

use scdl_format::chunking::{ChunkWriter, ChunkingError};
use scdl_format::{ArrayInfo, Backend, Dtype, Header};

/// The shape of a synthetic dataset.
#[derive(Clone, Copy, Debug)]
pub struct SyntheticDataset {
    pub rows: u64,
    pub genes: u32,
    /// Rows per chunk.
    pub chunk_rows: u32,
    /// Average stored values per row; rows range from half to one and a half times it,
    /// and every 37th row is empty.
    pub mean_values: u32,
    pub seed: u64,
}

/// One row: sorted column ids and their values.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub columns: Vec<u32>,
    pub values: Vec<f32>,
}

fn mix(mut x: u64) -> u64 {
    // splitmix64: cheap, well spread, and the same everywhere.
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl SyntheticDataset {
    /// Stored values in row `row`.
    pub fn row_len(&self, row: u64) -> u64 {
        if row % 37 == 36 {
            return 0;
        }
        let mean = self.mean_values.max(1) as u64;
        let len = mean / 2 + mix(self.seed ^ row) % (mean + 1);
        len.min(self.genes as u64)
    }

    pub fn row(&self, row: u64) -> Row {
        let len = self.row_len(row);
        let mut columns = Vec::with_capacity(len as usize);
        let mut values = Vec::with_capacity(len as usize);
        let genes = self.genes as u64;
        for k in 0..len {
            // One column in each of `len` equal strides: sorted and distinct.
            let (start, end) = (k * genes / len, (k + 1) * genes / len);
            let h = mix(self.seed.rotate_left(17) ^ (row << 20) ^ k);
            columns.push((start + h % (end - start)) as u32);
            values.push((h >> 40) as u32 as f32 % 31.0 + 1.0);
        }
        Row { columns, values }
    }

    pub fn total_values(&self) -> u64 {
        (0..self.rows).map(|r| self.row_len(r)).sum()
    }

    pub fn column_dtype(&self) -> Dtype {
        Dtype::smallest_uint_for(self.genes.saturating_sub(1) as u64)
    }

    /// The header of the dataset as one monolithic archive: the template of its chunked
    /// header, and what a monolithic copy of it carries.
    pub fn monolithic_header(&self) -> Header {
        let total = self.total_values();
        let array = |name: &str, length, dtype| ArrayInfo {
            name: name.into(),
            length,
            dtype,
            shape: None,
        };
        Header {
            version: (0, 1, 0),
            endianness: 1,
            backend: Backend::Monolithic,
            arrays: vec![
                array("DATA", total, Dtype::F32),
                array("ROWPTR", self.rows + 1, Dtype::smallest_uint_for(total)),
                array("COLPTR", total, self.column_dtype()),
            ],
            feature_indices: Vec::new(),
            chunked: None,
        }
    }

    /// Writes the dataset as a chunked archive at `dir`.
    pub fn write_chunked(&self, dir: &Path) -> Result<Header, ChunkingError> {
        let total = self.total_values();
        let row_dtype = Dtype::smallest_uint_for(total);
        let col_dtype = self.column_dtype();
        let mut writer = ChunkWriter::new(dir, row_dtype)?;
        let chunk_rows = self.chunk_rows.max(1) as u64;
        let mut first = 0;
        while first < self.rows {
            let last = (first + chunk_rows).min(self.rows);
            let (mut data, mut cols, mut offsets) = (Vec::new(), Vec::new(), vec![0u64]);
            for r in first..last {
                let row = self.row(r);
                for (c, v) in row.columns.iter().zip(&row.values) {
                    data.extend_from_slice(&v.to_le_bytes());
                    let mut col = [0u8; 8];
                    col_dtype.write_uint(&mut col, 0, *c as u64);
                    cols.extend_from_slice(&col[..col_dtype.size().unwrap() as usize]);
                }
                offsets.push(offsets.last().unwrap() + row.columns.len() as u64);
            }
            let nnz = *offsets.last().unwrap();
            writer.write_chunk(&data, &cols, &offsets, nnz)?;
            first = last;
        }
        let template = self.monolithic_header();
        let header = writer.finish(&template, self.chunk_rows)?;
        let io = |path: &Path, e| ChunkingError::Io {
            path: path.to_owned(),
            source: e,
        };
        let version = dir.join("version.json");
        std::fs::write(&version, "\"0.1.3\"").map_err(|e| io(&version, e))?;
        let metadata = dir.join("metadata.json");
        std::fs::write(&metadata, format!("{{\"num_rows\": {}}}", self.rows))
            .map_err(|e| io(&metadata, e))?;
        Ok(header)
    }
}

/// Bytes of the files under `dir`, recursively: the stored size of a written dataset.
pub fn stored_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => stored_bytes(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_sorted_distinct_and_reproducible() {
        let d = SyntheticDataset {
            rows: 500,
            genes: 300,
            chunk_rows: 64,
            mean_values: 40,
            seed: 7,
        };
        for r in 0..d.rows {
            let row = d.row(r);
            assert_eq!(row.columns.len() as u64, d.row_len(r));
            assert!(row.columns.windows(2).all(|w| w[0] < w[1]));
            assert!(row.columns.iter().all(|&c| c < d.genes));
            assert_eq!(row, d.row(r));
        }
        assert_eq!(d.row_len(36), 0);
    }
}
