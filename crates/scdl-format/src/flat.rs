//! A chunked archive read as the monolithic one it stands for: how byte ranges of the
//! virtual monolithic arrays map to byte ranges of the chunks' arrays ([`FlatLayout`]),
//! and the rules for row offsets: a chunk's check ([`check_chunk_row_offsets`]), the
//! check of the two that bound a range of rows ([`check_row_range_offsets`], all a
//! monolithic dataset's rows are located by), and the shift ([`rebase_row_offsets`]).
//! Pure arithmetic, no I/O, property-tested.
//!
//! `data.npy` and `col_ptr.npy` are the chunks' arrays one after the other. `row_ptr.npy`
//! is the global index: for each chunk, its first `rows` entries shifted by the values
//! of all earlier chunks, then one final entry, the total value count. A chunk's own last
//! entry (its nnz) is never served: the next chunk's first entry, shifted, stands there.

use std::ops::Range;

use crate::{ArrayKind, Dtype};

/// Sizes of one chunk, from the listing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkSizes {
    pub rows: u64,
    pub nnz: u64,
}

/// Where the bytes of a virtual array come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FlatPiece {
    /// Bytes `range` of chunk `chunk`'s array `array`, each element increased by `add`
    /// (non-zero only for row offsets).
    Chunk {
        chunk: usize,
        array: ArrayKind,
        range: Range<u64>,
        add: u64,
    },
    /// The final row offset: the total number of values.
    TotalNnz,
}

/// A read of a virtual array: the pieces to concatenate, then `skip` bytes to drop from
/// the front and `len` bytes to keep (pieces are whole elements, reads need not be).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlatRead {
    pub pieces: Vec<FlatPiece>,
    pub skip: u64,
    pub len: u64,
}

#[derive(Clone, Debug)]
pub struct FlatLayout {
    data_dtype: Dtype,
    col_dtype: Dtype,
    row_dtype: Dtype,
    rows_before: Vec<u64>,
    nnz_before: Vec<u64>,
}

impl FlatLayout {
    /// `dtypes` are the element types of (DATA, ROWPTR, COLPTR), all fixed-size.
    pub fn new(
        data_dtype: Dtype,
        row_dtype: Dtype,
        col_dtype: Dtype,
        chunks: &[ChunkSizes],
    ) -> FlatLayout {
        let mut rows_before = vec![0];
        let mut nnz_before = vec![0];
        for c in chunks {
            rows_before.push(rows_before.last().unwrap() + c.rows);
            nnz_before.push(nnz_before.last().unwrap() + c.nnz);
        }
        FlatLayout {
            data_dtype,
            col_dtype,
            row_dtype,
            rows_before,
            nnz_before,
        }
    }

    pub fn num_chunks(&self) -> usize {
        self.rows_before.len() - 1
    }

    pub fn total_rows(&self) -> u64 {
        *self.rows_before.last().unwrap()
    }

    pub fn total_nnz(&self) -> u64 {
        *self.nnz_before.last().unwrap()
    }

    pub fn row_dtype(&self) -> Dtype {
        self.row_dtype
    }

    /// The dataset rows that chunk `chunk` holds.
    pub fn chunk_rows(&self, chunk: usize) -> Range<u64> {
        self.rows_before[chunk]..self.rows_before[chunk + 1]
    }

    /// The values (elements of the data and column arrays) of the chunks before
    /// `chunk`: where the chunk's values start in the flat arrays.
    pub fn nnz_before(&self, chunk: usize) -> u64 {
        self.nnz_before[chunk]
    }

    pub fn chunk_sizes(&self, chunk: usize) -> ChunkSizes {
        ChunkSizes {
            rows: self.rows_before[chunk + 1] - self.rows_before[chunk],
            nnz: self.nnz_before[chunk + 1] - self.nnz_before[chunk],
        }
    }

    /// The chunks holding rows `rows` (a row range of the dataset).
    pub fn chunks_of_rows(&self, rows: Range<u64>) -> Range<usize> {
        if rows.is_empty() {
            return 0..0;
        }
        let first = self.rows_before.partition_point(|&b| b <= rows.start) - 1;
        let last = self.rows_before.partition_point(|&b| b < rows.end) - 1;
        first..last + 1
    }

    /// Bytes per element of array `kind`.
    pub fn width(&self, kind: ArrayKind) -> u64 {
        let dtype = match kind {
            ArrayKind::Data => self.data_dtype,
            ArrayKind::RowPtr => self.row_dtype,
            ArrayKind::ColPtr => self.col_dtype,
        };
        dtype.size().expect("flat arrays have fixed-size types")
    }

    /// The exact size of a virtual array file.
    pub fn file_len(&self, kind: ArrayKind) -> u64 {
        let elements = match kind {
            ArrayKind::RowPtr => self.total_rows() + 1,
            _ => self.total_nnz(),
        };
        elements * self.width(kind)
    }

    /// Maps `len` bytes at `offset` of a virtual array (clamped to its end).
    pub fn map(&self, kind: ArrayKind, offset: u64, len: u64) -> FlatRead {
        let end = offset.saturating_add(len).min(self.file_len(kind));
        if offset >= end {
            return FlatRead {
                pieces: Vec::new(),
                skip: 0,
                len: 0,
            };
        }
        let w = self.width(kind);
        let (first, last) = (offset / w, end.div_ceil(w));
        let before = match kind {
            ArrayKind::RowPtr => &self.rows_before,
            _ => &self.nnz_before,
        };
        let mut pieces = Vec::new();
        let covered_end = last.min(*before.last().unwrap());
        let mut element = first;
        while element < covered_end {
            // The chunk holding `element`: the last one that starts at or before it and
            // is non-empty.
            let chunk = before.partition_point(|&b| b <= element) - 1;
            let chunk_end = before[chunk + 1].min(covered_end);
            let local = element - before[chunk];
            pieces.push(FlatPiece::Chunk {
                chunk,
                array: kind,
                range: local * w..(local + chunk_end - element) * w,
                add: if kind == ArrayKind::RowPtr {
                    self.nnz_before[chunk]
                } else {
                    0
                },
            });
            element = chunk_end;
        }
        if kind == ArrayKind::RowPtr && last > self.total_rows() {
            pieces.push(FlatPiece::TotalNnz);
        }
        FlatRead {
            pieces,
            skip: offset - first * w,
            len: end - offset,
        }
    }
}

/// Why a chunk's row offsets cannot be served.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RowOffsetError {
    #[error("first entry is {0}, not 0")]
    NonZeroStart(u64),
    #[error("entry {index} ({value}) is below entry {previous_index} ({previous})")]
    Decreasing {
        index: u64,
        value: u64,
        previous_index: u64,
        previous: u64,
    },
    #[error("entry {index} ({value}) points past the {nnz} values")]
    PastValueCount { index: u64, value: u64, nnz: u64 },
    #[error("last entry is {last}, but the chunk holds {nnz} values")]
    WrongEnd { last: u64, nnz: u64 },
    #[error("a row offset shifted by {add} overflows {dtype}")]
    ShiftOverflows { add: u64, dtype: Dtype },
}

/// Checks a chunk's whole `row_ptr.npy` (`dtype` entries): starts at 0, never
/// decreases, ends at the chunk's value count `nnz`.
pub fn check_chunk_row_offsets(bytes: &[u8], dtype: Dtype, nnz: u64) -> Result<(), RowOffsetError> {
    let mut previous = 0;
    for (index, value) in dtype.read_uints(bytes).into_iter().enumerate() {
        if index == 0 && value != 0 {
            return Err(RowOffsetError::NonZeroStart(value));
        }
        let index = index as u64;
        in_order((index.saturating_sub(1), previous), (index, value))?;
        previous = value;
    }
    if previous != nnz {
        return Err(RowOffsetError::WrongEnd {
            last: previous,
            nnz,
        });
    }
    Ok(())
}

/// Checks the row offsets `start` and `end` that bound rows `rows` of an array of `nnz`
/// values: `end` is not below `start` and does not point past the values.
pub fn check_row_range_offsets(
    rows: Range<u64>,
    start: u64,
    end: u64,
    nnz: u64,
) -> Result<(), RowOffsetError> {
    in_order((rows.start, start), (rows.end, end))?;
    if end > nnz {
        return Err(RowOffsetError::PastValueCount {
            index: rows.end,
            value: end,
            nnz,
        });
    }
    Ok(())
}

/// Row offsets never decrease: entry `index` holds `value`, a later one than
/// `previous_index`, which holds `previous`.
fn in_order(
    (previous_index, previous): (u64, u64),
    (index, value): (u64, u64),
) -> Result<(), RowOffsetError> {
    if value < previous {
        return Err(RowOffsetError::Decreasing {
            index,
            value,
            previous_index,
            previous,
        });
    }
    Ok(())
}

/// Adds `add` to every `dtype` row offset in `bytes`; an offset that would overflow its
/// dtype is an error (the bytes are then partly shifted and must not be served).
pub fn rebase_row_offsets(bytes: &mut [u8], dtype: Dtype, add: u64) -> Result<(), RowOffsetError> {
    if add == 0 {
        return Ok(());
    }
    if !dtype.add_to_uints(bytes, add) {
        return Err(RowOffsetError::ShiftOverflows { add, dtype });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The monolithic arrays a chunk layout stands for, built the slow obvious way.
    struct Monolith {
        data: Vec<u8>,
        row_ptr: Vec<u8>,
        col_ptr: Vec<u8>,
        chunk_arrays: Vec<[Vec<u8>; 3]>,
    }

    fn build(chunks: &[Vec<u64>], row_dtype: Dtype) -> Monolith {
        let (mut data, mut col, mut rows) = (Vec::new(), Vec::new(), vec![0u64]);
        let mut chunk_arrays = Vec::new();
        let mut value = 0u32;
        for row_lens in chunks {
            let (mut cd, mut cc, mut cr) = (Vec::new(), Vec::new(), vec![0u64]);
            for &n in row_lens {
                for _ in 0..n {
                    value += 1;
                    cd.extend_from_slice(&(value as f32).to_le_bytes());
                    cc.extend_from_slice(&((value % 65_000) as u16).to_le_bytes());
                }
                cr.push(cr.last().unwrap() + n);
                rows.push(rows.last().unwrap() + n);
            }
            data.extend_from_slice(&cd);
            col.extend_from_slice(&cc);
            let w = row_dtype.size().unwrap() as usize;
            let mut crb = vec![0u8; cr.len() * w];
            for (i, v) in cr.iter().enumerate() {
                assert!(row_dtype.write_uint(&mut crb, i, *v));
            }
            chunk_arrays.push([cd, crb, cc]);
        }
        let w = row_dtype.size().unwrap() as usize;
        let mut row_ptr = vec![0u8; rows.len() * w];
        for (i, v) in rows.iter().enumerate() {
            assert!(row_dtype.write_uint(&mut row_ptr, i, *v));
        }
        Monolith {
            data,
            row_ptr,
            col_ptr: col,
            chunk_arrays,
        }
    }

    /// Serves a read from the chunk arrays with the read path's own rebasing.
    fn serve(layout: &FlatLayout, m: &Monolith, kind: ArrayKind, offset: u64, len: u64) -> Vec<u8> {
        let read = layout.map(kind, offset, len);
        let mut out = Vec::new();
        let dtype = layout.row_dtype();
        for piece in &read.pieces {
            match piece {
                FlatPiece::Chunk {
                    chunk,
                    array,
                    range,
                    add,
                } => {
                    let index = ArrayKind::ALL.iter().position(|k| k == array).unwrap();
                    let mut bytes = m.chunk_arrays[*chunk][index]
                        [range.start as usize..range.end as usize]
                        .to_vec();
                    rebase_row_offsets(&mut bytes, dtype, *add).unwrap();
                    out.extend_from_slice(&bytes);
                }
                FlatPiece::TotalNnz => {
                    let mut b = vec![0u8; dtype.size().unwrap() as usize];
                    assert!(dtype.write_uint(&mut b, 0, layout.total_nnz()));
                    out.extend_from_slice(&b);
                }
            }
        }
        out[read.skip as usize..(read.skip + read.len) as usize].to_vec()
    }

    fn layout_strategy() -> impl Strategy<Value = (Vec<Vec<u64>>, Dtype)> {
        // Chunks of one to a few rows, rows of zero to several values: short last chunks,
        // empty rows, one-row chunks and empty-valued chunks all occur.
        (
            proptest::collection::vec(proptest::collection::vec(0u64..6, 1..6), 1..7),
            prop_oneof![
                Just(Dtype::U8),
                Just(Dtype::U16),
                Just(Dtype::U32),
                Just(Dtype::U64)
            ],
        )
    }

    fn u16s(values: &[u16]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn chunk_row_offsets_start_at_zero_never_decrease_and_end_at_the_value_count() {
        let check = |values: &[u16], nnz| check_chunk_row_offsets(&u16s(values), Dtype::U16, nnz);
        assert_eq!(check(&[0, 2, 2, 5], 5), Ok(()));
        assert_eq!(check(&[1, 2, 5], 5), Err(RowOffsetError::NonZeroStart(1)));
        assert_eq!(
            check(&[0, 3, 2, 5], 5),
            Err(RowOffsetError::Decreasing {
                index: 2,
                value: 2,
                previous_index: 1,
                previous: 3
            })
        );
        assert_eq!(
            check(&[0, 2, 4], 5),
            Err(RowOffsetError::WrongEnd { last: 4, nnz: 5 })
        );
    }

    #[test]
    fn the_offsets_bounding_a_row_range_are_in_order_and_within_the_values() {
        assert_eq!(check_row_range_offsets(4..9, 10, 10, 30), Ok(()));
        assert_eq!(check_row_range_offsets(4..9, 10, 30, 30), Ok(()));
        assert_eq!(
            check_row_range_offsets(4..9, 11, 10, 30),
            Err(RowOffsetError::Decreasing {
                index: 9,
                value: 10,
                previous_index: 4,
                previous: 11
            })
        );
        let past = check_row_range_offsets(4..9, 10, 31, 30).unwrap_err();
        assert_eq!(
            past.to_string(),
            "entry 9 (31) points past the 30 values",
            "{past:?}"
        );
    }

    #[test]
    fn a_shift_past_the_row_offset_type_is_refused() {
        let mut bytes = u16s(&[0, 65_000]);
        assert_eq!(rebase_row_offsets(&mut bytes, Dtype::U16, 500), Ok(()));
        assert_eq!(bytes, u16s(&[500, 65_500]));
        assert_eq!(
            rebase_row_offsets(&mut bytes, Dtype::U16, 36),
            Err(RowOffsetError::ShiftOverflows {
                add: 36,
                dtype: Dtype::U16
            })
        );
    }

    proptest! {
        #[test]
        fn offsets_bound_a_row_range_exactly_when_ordered_and_within_the_values(
            start in 0u64..50,
            end in 0u64..50,
            nnz in 0u64..50,
        ) {
            let verdict = check_row_range_offsets(3..7, start, end, nnz);
            prop_assert_eq!(verdict.is_ok(), start <= end && end <= nnz, "{:?}", verdict);
        }

        #[test]
        fn every_byte_range_equals_the_monolithic_arrays(
            (chunks, row_dtype) in layout_strategy(),
            offset in 0u64..400,
            len in 0u64..400,
        ) {
            let m = build(&chunks, row_dtype);
            let sizes: Vec<ChunkSizes> = chunks
                .iter()
                .map(|r| ChunkSizes { rows: r.len() as u64, nnz: r.iter().sum() })
                .collect();
            let layout = FlatLayout::new(Dtype::F32, row_dtype, Dtype::U16, &sizes);
            for (kind, whole) in [
                (ArrayKind::Data, &m.data),
                (ArrayKind::RowPtr, &m.row_ptr),
                (ArrayKind::ColPtr, &m.col_ptr),
            ] {
                prop_assert_eq!(layout.file_len(kind), whole.len() as u64);
                let start = offset.min(whole.len() as u64) as usize;
                let end = (offset + len).min(whole.len() as u64) as usize;
                prop_assert_eq!(serve(&layout, &m, kind, offset, len), whole[start..end.max(start)].to_vec(), "{:?}", kind);
            }
        }

        #[test]
        fn chunks_of_rows_covers_exactly_the_rows(
            (chunks, _) in layout_strategy(),
            a in 0u64..40,
            b in 0u64..40,
        ) {
            let sizes: Vec<ChunkSizes> = chunks.iter().map(|r| ChunkSizes { rows: r.len() as u64, nnz: 0 }).collect();
            let layout = FlatLayout::new(Dtype::F32, Dtype::U32, Dtype::U32, &sizes);
            let rows = a.min(layout.total_rows())..b.min(layout.total_rows());
            let found = layout.chunks_of_rows(rows.clone());
            for c in 0..layout.num_chunks() {
                let start: u64 = sizes[..c].iter().map(|s| s.rows).sum();
                let end = start + sizes[c].rows;
                let overlaps = !rows.is_empty() && rows.start < end && start < rows.end;
                prop_assert_eq!(found.contains(&c), overlaps);
            }
        }
    }
}
