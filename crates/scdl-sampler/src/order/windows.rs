//! The chunk-window order of the original `ChunkAwareSampler`: chunks (shuffled or in
//! order) grouped into windows, each window's rows read before the next window's, so
//! that a cache of a few windows' chunks serves every read.
//!
//! The units the epoch visits are the chunks that hold rows of the subset, numbered in
//! ascending order; window `i` is the units at positions `[i·k, (i+1)·k)` of the
//! epoch's visit, so only the last window may hold fewer than `k` chunks.

use super::ChunkWindowOrder;
use crate::cached::CachedChunks;
use crate::layout::ChunkLayout;
use crate::ranges::RangeSet;
use crate::subset::RowSubset;
use crate::weights::Draws;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Windows {
    /// The chunks that hold rows of the subset.
    meeting: RangeSet,
    per_window: u64,
}

impl Windows {
    pub(super) fn new(
        order: &ChunkWindowOrder,
        chunks: &ChunkLayout,
        subset: &RowSubset,
    ) -> Windows {
        let chunk_size = chunks.chunk_size();
        Windows {
            meeting: RangeSet::from_ranges(
                subset
                    .ranges()
                    .iter()
                    .map(|r| r.start / chunk_size..(r.end - 1) / chunk_size + 1),
            ),
            per_window: order.chunks_per_window.get() as u64,
        }
    }

    pub(super) fn unit_count(&self) -> u64 {
        self.meeting.len()
    }

    pub(super) fn step_count(&self) -> usize {
        self.unit_count().div_ceil(self.per_window) as usize
    }

    /// The units whose chunks `cached` holds.
    pub(super) fn held_units(&self, cached: &CachedChunks) -> RangeSet {
        RangeSet::from_ranges(
            cached.ranges().iter().map(|held| {
                self.meeting.rank(held.start as u64)..self.meeting.rank(held.end as u64)
            }),
        )
    }

    /// The chunks of window `step`, in visiting order, given the unit at each position.
    pub(super) fn chunks_of(&self, unit_at: impl Fn(u64) -> u64, step: usize) -> Vec<u32> {
        let first = step as u64 * self.per_window;
        let end = (first + self.per_window).min(self.unit_count());
        (first..end)
            .map(|position| self.meeting.nth(unit_at(position)) as u32)
            .collect()
    }

    /// The unit (a chunk meeting the subset, by rank) whose chunk holds `row`.
    pub(super) fn unit_of_row(&self, chunks: &ChunkLayout, row: u64) -> u64 {
        self.meeting.rank(row / chunks.chunk_size())
    }

    /// The rows window `step` of a weighted order draws, unit by unit: inside the chunk
    /// of each unit's anchor, as many as that chunk holds of the subset.
    pub(super) fn draw_rows(
        &self,
        draws: &Draws,
        chunks: &ChunkLayout,
        subset: &RowSubset,
        step: usize,
    ) -> Vec<u64> {
        let first = step as u64 * self.per_window;
        let end = (first + self.per_window).min(self.unit_count());
        let chunk_of =
            |anchor| subset.intersect(chunks.chunk_rows((anchor / chunks.chunk_size()) as u32));
        let count = |rows: &[std::ops::Range<u64>]| rows.iter().map(|r| r.end - r.start).sum();
        (first..end)
            .flat_map(|position| draws.unit(subset, position, chunk_of, count))
            .collect()
    }
}
