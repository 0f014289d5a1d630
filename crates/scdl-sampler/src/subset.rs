//! The rows an order visits when it should not visit the whole dataset: a training or
//! validation split, or any set of row indices a caller gives.
//!
//! A subset is kept as sorted, disjoint, non-adjacent row ranges, so that a split of
//! whole chunks of a 100-million-row dataset costs one range per run of chunks, not one
//! entry per row. Orders over a subset keep their locality: the chunk-window order
//! makes its windows of the chunks that hold rows of the subset, and the block order
//! cuts its blocks from the subset's rows in ascending order (a block is contiguous
//! wherever the subset is).
//!
//! [`RowSubset::split_by_chunk`] deals whole chunks to the parts of a split at random
//! (from a seed, so every rank draws the same split), which keeps each part's reads as
//! local as the whole dataset's and makes its parts disjoint and covering.

use std::ops::Range;

use rand::seq::SliceRandom;

use crate::layout::ChunkLayout;
use crate::ranges::RangeSet;
use crate::seeding::{self, Stream};

/// Why a subset or a split cannot be made.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SubsetError {
    #[error("row {row} is out of range: the dataset has {total_rows} rows")]
    RowOutOfRange { row: u64, total_rows: u64 },
    #[error("a split needs at least one fraction")]
    NoFractions,
    #[error("split fractions must be positive and add up to 1, got {fractions:?}")]
    BadFractions { fractions: Vec<f64> },
    #[error(
        "a split by chunk of {num_chunks} chunks gives part {part} (fraction {fraction}) no \
         chunk: use fewer parts, larger fractions or smaller chunks"
    )]
    EmptyPart {
        part: usize,
        fraction: f64,
        num_chunks: u32,
    },
}

/// A set of rows, as sorted, disjoint, non-adjacent ranges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowSubset {
    rows: RangeSet,
}

impl RowSubset {
    /// Every row of a dataset of `total_rows` rows.
    pub fn all(total_rows: u64) -> RowSubset {
        RowSubset::from_ranges(std::iter::once(0..total_rows))
    }

    /// The rows of `ranges`, in any order, overlapping or not; empty ranges are ignored.
    pub fn from_ranges(ranges: impl IntoIterator<Item = Range<u64>>) -> RowSubset {
        RowSubset {
            rows: RangeSet::from_ranges(ranges),
        }
    }

    /// The rows listed, in any order; a row listed twice is in the subset once.
    pub fn from_rows(rows: impl IntoIterator<Item = u64>) -> RowSubset {
        RowSubset::from_ranges(rows.into_iter().map(|row| row..row + 1))
    }

    /// The subset's rows as sorted, disjoint, non-adjacent ranges.
    pub fn ranges(&self) -> &[Range<u64>] {
        self.rows.ranges()
    }

    /// How many rows the subset holds.
    pub fn len(&self) -> u64 {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn contains(&self, row: u64) -> bool {
        self.rows.contains(row)
    }

    /// How many rows of the subset lie below `row`: the position in the subset's
    /// ascending order of `row`, or of the first row of the subset after it.
    pub fn position_of(&self, row: u64) -> u64 {
        self.rows.rank(row)
    }

    /// Checks that every row of the subset exists in a dataset of `total_rows` rows.
    pub fn check_within(&self, total_rows: u64) -> Result<(), SubsetError> {
        match self.ranges().last() {
            Some(last) if last.end > total_rows => Err(SubsetError::RowOutOfRange {
                row: last.end - 1,
                total_rows,
            }),
            _ => Ok(()),
        }
    }

    /// The rows of the subset inside `rows`, as ranges in ascending order.
    pub fn intersect(&self, rows: Range<u64>) -> Vec<Range<u64>> {
        let ranges = self.ranges();
        let first = ranges.partition_point(|r| r.end <= rows.start);
        ranges[first..]
            .iter()
            .take_while(|r| r.start < rows.end)
            .map(|r| r.start.max(rows.start)..r.end.min(rows.end))
            .collect()
    }

    /// Whether any row of `rows` is in the subset.
    pub fn meets(&self, rows: Range<u64>) -> bool {
        self.position_of(rows.start) < self.position_of(rows.end)
    }

    /// The rows at positions `positions` of the subset in ascending order (the subset's
    /// `positions.start`-th row up to, not including, its `positions.end`-th), as
    /// ranges in ascending order.
    pub fn rows_at(&self, positions: Range<u64>) -> Vec<Range<u64>> {
        let end = positions.end.min(self.len());
        if positions.start >= end {
            return Vec::new();
        }
        let starts = self.rows.starts();
        let first = starts.partition_point(|&s| s <= positions.start) - 1;
        let mut out = Vec::new();
        for (range, &start) in self.ranges()[first..].iter().zip(&starts[first..]) {
            if start >= end {
                break;
            }
            let from = range.start + positions.start.saturating_sub(start);
            let to = range.start + (end - start).min(range.end - range.start);
            out.push(from..to);
        }
        out
    }

    /// A split of `chunks`' dataset into parts of whole chunks, in the proportions of
    /// `fractions` (positive, adding up to 1): the chunks are shuffled by `seed`, and
    /// part `i` takes the next `fractions[i]` of them (rounded so that the parts take
    /// every chunk once). The parts are disjoint and together hold every row.
    pub fn split_by_chunk(
        chunks: &ChunkLayout,
        fractions: &[f64],
        seed: u64,
    ) -> Result<Vec<RowSubset>, SubsetError> {
        if fractions.is_empty() {
            return Err(SubsetError::NoFractions);
        }
        let sum: f64 = fractions.iter().sum();
        if fractions.iter().any(|&f| !(f > 0.0 && f.is_finite())) || (sum - 1.0).abs() > 1e-6 {
            return Err(SubsetError::BadFractions {
                fractions: fractions.to_vec(),
            });
        }
        let num_chunks = chunks.num_chunks();
        let mut ids: Vec<u32> = (0..num_chunks).collect();
        ids.shuffle(&mut seeding::rng(seed, 0, Stream::Split));
        // Each part ends where the running sum of fractions, in chunks, rounds to: the
        // last part ends at the last chunk whatever the rounding of the sum.
        let mut parts = Vec::with_capacity(fractions.len());
        let (mut taken, mut running) = (0usize, 0.0);
        for (part, &fraction) in fractions.iter().enumerate() {
            running += fraction;
            let end = if part + 1 == fractions.len() {
                ids.len()
            } else {
                ((running * num_chunks as f64).round() as usize).clamp(taken, ids.len())
            };
            if end == taken {
                return Err(SubsetError::EmptyPart {
                    part,
                    fraction,
                    num_chunks,
                });
            }
            parts.push(RowSubset::from_ranges(
                ids[taken..end].iter().map(|&c| chunks.chunk_rows(c)),
            ));
            taken = end;
        }
        Ok(parts)
    }
}
