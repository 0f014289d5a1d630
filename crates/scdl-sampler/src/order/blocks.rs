//! The block order of scDataset: short contiguous blocks of rows shuffled over the whole
//! dataset, taken a fetch at a time. A fetch's blocks are read in ascending order, which
//! turns random access into a few forward sweeps, and its rows are then shuffled in
//! memory and cut into minibatches, which restores diversity inside each minibatch.
//!
//! Over a subset, blocks are cut from the subset's rows in ascending order: a block is
//! contiguous wherever the subset is, and every block but the last is full. The units
//! the epoch visits are the blocks; fetch `i` is the blocks at positions
//! `[i·f, (i+1)·f)` of the epoch's visit (`f` blocks per fetch), so only the last fetch
//! may hold fewer blocks.

use std::ops::Range;

use super::BlockOrder;
use crate::cached::CachedChunks;
use crate::layout::ChunkLayout;
use crate::ranges::RangeSet;
use crate::subset::RowSubset;
use crate::weights::Draws;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Fetches {
    block_size: u64,
    blocks_per_fetch: u64,
    /// Rows of the subset.
    rows: u64,
}

impl Fetches {
    pub(super) fn new(order: &BlockOrder, subset: &RowSubset) -> Fetches {
        let block_size = order.block_size.get();
        Fetches {
            block_size,
            // Enough to cover `batch_size × fetch_factor` rows. The product saturates,
            // because a fetch larger than the dataset is simply the whole dataset.
            blocks_per_fetch: order
                .batch_size
                .get()
                .saturating_mul(order.fetch_factor.get())
                .div_ceil(block_size),
            rows: subset.len(),
        }
    }

    pub(super) fn unit_count(&self) -> u64 {
        self.rows.div_ceil(self.block_size)
    }

    pub(super) fn step_count(&self) -> usize {
        self.unit_count().div_ceil(self.blocks_per_fetch) as usize
    }

    /// The subset's last block if it is shorter than the others.
    pub(super) fn short_block(&self) -> Option<u64> {
        (!self.rows.is_multiple_of(self.block_size)).then(|| self.unit_count() - 1)
    }

    /// The fetch that reads the block visited at `position`.
    pub(super) fn step_of_position(&self, position: u64) -> usize {
        (position / self.blocks_per_fetch) as usize
    }

    /// The blocks whose rows all lie in chunks `cached` holds. A block is a run of
    /// subset positions, so it is held when one run of positions whose rows are all
    /// in held chunks contains it: one run per held chunk range, joined where no row of
    /// the subset lies between two.
    pub(super) fn held_blocks(
        &self,
        chunks: &ChunkLayout,
        subset: &RowSubset,
        cached: &CachedChunks,
    ) -> RangeSet {
        let position = |chunk: u32| subset.position_of(chunk as u64 * chunks.chunk_size());
        let mut runs: Vec<Range<u64>> = Vec::new();
        for held in cached.ranges() {
            let run = position(held.start)..position(held.end);
            match runs.last_mut() {
                Some(last) if last.end == run.start => last.end = run.end,
                _ => runs.push(run),
            }
        }
        RangeSet::from_ranges(runs.into_iter().map(|run| {
            // The short last block ends at the subset's end, not a block boundary.
            let end = match run.end == self.rows {
                true => run.end.div_ceil(self.block_size),
                false => run.end / self.block_size,
            };
            run.start.div_ceil(self.block_size)..end
        }))
    }

    /// How many rows fetch `step` reads; `short` if it holds the short last block.
    pub(super) fn row_count(&self, step: usize, short: bool) -> u64 {
        let first = step as u64 * self.blocks_per_fetch;
        let blocks = (self.unit_count() - first).min(self.blocks_per_fetch);
        let shortfall = match short {
            true => self.unit_count() * self.block_size - self.rows,
            false => 0,
        };
        blocks * self.block_size - shortfall
    }

    /// The rows of fetch `step`, block by block in ascending order, given the block at
    /// each position.
    pub(super) fn rows_of(
        &self,
        block_at: impl Fn(u64) -> u64,
        subset: &RowSubset,
        step: usize,
    ) -> Vec<Range<u64>> {
        let first = step as u64 * self.blocks_per_fetch;
        let end = (first + self.blocks_per_fetch).min(self.unit_count());
        let mut blocks: Vec<u64> = (first..end).map(block_at).collect();
        blocks.sort_unstable();
        blocks
            .into_iter()
            .flat_map(|b| subset.rows_at(b * self.block_size..(b + 1) * self.block_size))
            .collect()
    }

    /// The rows fetch `step` of a weighted order draws, unit by unit: `block_size`
    /// each, but for the last unit of the epoch when `short` (see
    /// [`Fetches::row_count`]).
    pub(super) fn draw_rows(
        &self,
        draws: &Draws,
        subset: &RowSubset,
        step: usize,
        short: bool,
    ) -> Vec<u64> {
        let first = step as u64 * self.blocks_per_fetch;
        let end = (first + self.blocks_per_fetch).min(self.unit_count());
        (first..end)
            .flat_map(|position| {
                let count = match short && position + 1 == self.unit_count() {
                    true => self.rows - position * self.block_size,
                    false => self.block_size,
                };
                let block_of = |anchor| {
                    let block = subset.position_of(anchor) / self.block_size;
                    subset.rows_at(block * self.block_size..(block + 1) * self.block_size)
                };
                draws.unit(subset, position, block_of, |_| count)
            })
            .collect()
    }
}
