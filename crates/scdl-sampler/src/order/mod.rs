//! The two visiting orders and the epoch plan they produce.
//!
//! An order cuts an epoch into **steps**, the units of I/O locality: a window of chunks
//! ([`ChunkWindowOrder`]) or a fetch of row blocks ([`BlockOrder`]). Steps are what
//! ranks and workers divide among themselves and what the hint file announces, so
//! every step is read whole by one reader. The plan of an epoch depends only on the
//! dataset's chunk layout, the order (seed included) and the epoch number, so every
//! process computes the same plan without talking to the others.

mod blocks;
mod windows;

use std::num::{NonZeroU32, NonZeroU64};
use std::ops::Range;
use std::sync::Arc;

use rand::seq::SliceRandom;
use scdl_format::hint::HintLine;

use crate::cached::CachedChunks;
use crate::layout::ChunkLayout;
use crate::seeding::{self, Stream};
use crate::subset::RowSubset;

/// Visit chunks a window at a time, as the original `ChunkAwareSampler` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkWindowOrder {
    pub seed: u64,
    pub chunks_per_window: NonZeroU32,
    /// Visit the chunks in a new random order each epoch (else in ascending order).
    pub shuffle_chunks: bool,
    /// Shuffle the rows of each window (else read them chunk by chunk, in row order).
    pub shuffle_within_window: bool,
}

/// Visit random contiguous blocks a fetch at a time, as scDataset does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockOrder {
    pub seed: u64,
    /// Rows per block; the dataset's last block may be shorter.
    pub block_size: NonZeroU64,
    /// Rows per minibatch.
    pub batch_size: NonZeroU64,
    /// Minibatches per fetch: a fetch reads about `batch_size × fetch_factor` rows.
    pub fetch_factor: NonZeroU64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    ChunkWindows(ChunkWindowOrder),
    Blocks(BlockOrder),
}

impl Order {
    fn seed(&self) -> u64 {
        match self {
            Order::ChunkWindows(o) => o.seed,
            Order::Blocks(o) => o.seed,
        }
    }

    /// How many steps every epoch of this order has over `chunks`.
    pub fn step_count(&self, chunks: &ChunkLayout) -> usize {
        self.step_count_over(chunks, &RowSubset::all(chunks.total_rows()))
    }

    /// How many steps every epoch of this order has over the rows of `subset`.
    pub fn step_count_over(&self, chunks: &ChunkLayout, subset: &RowSubset) -> usize {
        match self {
            Order::ChunkWindows(o) => windows::window_count(o, chunks, subset),
            Order::Blocks(o) => blocks::fetch_count(o, subset),
        }
    }

    /// Rows per minibatch, for the order that cuts its steps into minibatches.
    pub fn batch_size(&self) -> Option<u64> {
        match self {
            Order::ChunkWindows(_) => None,
            Order::Blocks(o) => Some(o.batch_size.get()),
        }
    }

    fn shuffles_rows_within_steps(&self) -> bool {
        match self {
            Order::ChunkWindows(o) => o.shuffle_within_window,
            Order::Blocks(_) => true,
        }
    }
}

/// One step of an epoch: the rows one reader takes in one piece.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Every row of these chunks (listed in the epoch's chunk order) that is in the
    /// plan's subset.
    Window { chunks: Vec<u32> },
    /// Every row of these blocks, sorted ascending (all in the plan's subset).
    Fetch { blocks: Vec<Range<u64>> },
}

impl Step {
    /// The hint line that announces this step: a `window` line, or a `rows` line with
    /// the fetch's blocks.
    pub fn hint_lines(&self) -> Vec<HintLine> {
        match self {
            Step::Window { chunks } => vec![HintLine::Window {
                chunks: chunks.clone(),
            }],
            Step::Fetch { blocks } => vec![HintLine::Rows {
                ranges: blocks.clone(),
            }],
        }
    }
}

/// The complete plan of one epoch, for all ranks and workers together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpochPlan {
    chunks: ChunkLayout,
    subset: Arc<RowSubset>,
    order: Order,
    epoch: u64,
    steps: Vec<Step>,
}

impl EpochPlan {
    /// The plan of epoch `epoch` over every row of the dataset.
    pub fn new(chunks: ChunkLayout, order: Order, epoch: u64) -> EpochPlan {
        let all = Arc::new(RowSubset::all(chunks.total_rows()));
        EpochPlan::over(chunks, all, order, epoch)
    }

    /// The plan of epoch `epoch` over the rows of `subset` (which must lie within
    /// `chunks`, see [`RowSubset::check_within`]).
    pub fn over(
        chunks: ChunkLayout,
        subset: Arc<RowSubset>,
        order: Order,
        epoch: u64,
    ) -> EpochPlan {
        EpochPlan::with_cache(chunks, subset, order, epoch, None)
    }

    /// The plan of epoch `epoch` over the rows of `subset` that reads the units wholly
    /// in `cached` first (see the module documentation). With nothing or everything
    /// cached it is the plain plan.
    pub fn over_cache_aware(
        chunks: ChunkLayout,
        subset: Arc<RowSubset>,
        order: Order,
        epoch: u64,
        cached: &CachedChunks,
    ) -> EpochPlan {
        EpochPlan::with_cache(chunks, subset, order, epoch, Some(cached))
    }

    fn with_cache(
        chunks: ChunkLayout,
        subset: Arc<RowSubset>,
        order: Order,
        epoch: u64,
        cached: Option<&CachedChunks>,
    ) -> EpochPlan {
        let steps = match &order {
            Order::ChunkWindows(o) => windows::windows(o, &chunks, &subset, epoch, cached),
            Order::Blocks(o) => blocks::fetches(o, &chunks, &subset, epoch, cached),
        };
        EpochPlan {
            chunks,
            subset,
            order,
            epoch,
            steps,
        }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn order(&self) -> &Order {
        &self.order
    }

    /// The epoch's steps in visiting order.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// The rows the plan visits.
    pub fn subset(&self) -> &RowSubset {
        &self.subset
    }

    pub fn row_count(&self, step: usize) -> u64 {
        self.row_ranges(step).iter().map(|r| r.end - r.start).sum()
    }

    /// The rows of step `step` as contiguous ranges, in the order the step lists them.
    pub fn row_ranges(&self, step: usize) -> Vec<Range<u64>> {
        match &self.steps[step] {
            Step::Window { chunks } => chunks
                .iter()
                .flat_map(|&c| self.subset.intersect(self.chunks.chunk_rows(c)))
                .collect(),
            Step::Fetch { blocks } => blocks.clone(),
        }
    }

    /// The rows of step `step` in the order they are visited.
    pub fn rows_of(&self, step: usize) -> Vec<u64> {
        let mut rows: Vec<u64> = self.row_ranges(step).into_iter().flatten().collect();
        if self.order.shuffles_rows_within_steps() {
            let seed = self.order.seed();
            rows.shuffle(&mut seeding::rng(seed, self.epoch, Stream::StepRows(step)));
        }
        rows
    }
}
