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
use crate::permutation::Permutation;
use crate::ranges::RangeSet;
use crate::seeding::{self, Stream};
use crate::subset::RowSubset;
use crate::weights::{Draws, RowWeights};

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
            Order::ChunkWindows(o) => windows::Windows::new(o, chunks, subset).step_count(),
            Order::Blocks(o) => blocks::Fetches::new(o, subset).step_count(),
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
    /// plan's subset; in a weighted order, the rows drawn in them.
    Window { chunks: Vec<u32> },
    /// Every row of these blocks, sorted ascending (all in the plan's subset).
    Fetch { blocks: Vec<Range<u64>> },
    /// The rows a weighted fetch drew, sorted ascending, a row drawn twice listed twice.
    Draws { rows: Vec<u64> },
}

impl Step {
    /// The hint lines that announce this step: a `window` line, or a `rows` line with
    /// the fetch's blocks, preceded by `window+` or `rows+` lines when the step is
    /// longer than a line (a fetch of thousands of single rows).
    pub fn hint_lines(&self) -> Vec<HintLine> {
        match self {
            Step::Window { chunks } => HintLine::window_step(chunks),
            Step::Fetch { blocks } => HintLine::rows_step(blocks),
            // A row drawn twice is fetched once.
            Step::Draws { rows } => {
                HintLine::rows_step(RowSubset::from_rows(rows.iter().copied()).ranges())
            }
        }
    }
}

/// The plan of one epoch, for all ranks and workers together. It holds no step: any
/// step is computed from its index when asked for ([`EpochPlan::step`]), from a seeded
/// permutation of the order's units (see [`crate::permutation`]), so a plan costs the
/// same memory at 10^3 rows as at 10^9, whatever the block size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpochPlan {
    chunks: ChunkLayout,
    subset: Arc<RowSubset>,
    order: Order,
    epoch: u64,
    visit: Visit,
    units: Units,
}

/// What the units of an order are, and how steps are cut from them.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Units {
    Windows(windows::Windows),
    Fetches {
        fetches: blocks::Fetches,
        /// The fetch that holds the subset's last block when it is short: every other
        /// fetch's blocks are full, so fetches count their rows without listing them.
        short: Option<usize>,
    },
    /// A weighted chunk-window order's windows: units drawn, not visited.
    DrawnWindows {
        windows: windows::Windows,
        draws: Draws,
    },
    /// A weighted block order's fetches: units drawn, not visited.
    Draws {
        fetches: blocks::Fetches,
        draws: Draws,
        /// As for [`Units::Fetches`]: the fetch whose last unit draws fewer rows.
        short: Option<usize>,
    },
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

    /// The plan of epoch `epoch` of `order` drawing rows of `subset` by `weights` (see
    /// [`RowWeights`]), which must fit the dataset and give the subset some weight
    /// ([`RowWeights::check_for`]).
    pub fn over_weighted(
        chunks: ChunkLayout,
        subset: Arc<RowSubset>,
        order: Order,
        epoch: u64,
        weights: Arc<RowWeights>,
    ) -> EpochPlan {
        let draws = Draws::new(weights, &subset, order.seed(), epoch);
        let units = match &order {
            Order::ChunkWindows(o) => Units::DrawnWindows {
                windows: windows::Windows::new(o, &chunks, &subset),
                draws,
            },
            Order::Blocks(o) => {
                let fetches = blocks::Fetches::new(o, &subset);
                // The epoch's last unit draws the rows a short last block would hold.
                let short = fetches
                    .short_block()
                    .map(|last| fetches.step_of_position(last));
                Units::Draws {
                    fetches,
                    draws,
                    short,
                }
            }
        };
        EpochPlan {
            chunks,
            // Units are drawn, not visited: the visit is never asked.
            visit: Visit::new(0, RangeSet::default(), false, order.seed(), epoch),
            subset,
            order,
            epoch,
            units,
        }
    }

    /// The chunk of each unit of window `step` of a weighted window order, with
    /// repeats.
    fn drawn_chunks(&self, windows: &windows::Windows, draws: &Draws, step: usize) -> Vec<u32> {
        windows.chunks_of(
            |p| windows.unit_of_row(&self.chunks, draws.anchor(&self.subset, p)),
            step,
        )
    }

    fn with_cache(
        chunks: ChunkLayout,
        subset: Arc<RowSubset>,
        order: Order,
        epoch: u64,
        cached: Option<&CachedChunks>,
    ) -> EpochPlan {
        let visit = |count, held, shuffled| Visit::new(count, held, shuffled, order.seed(), epoch);
        let (visit, units) = match &order {
            Order::ChunkWindows(o) => {
                let windows = windows::Windows::new(o, &chunks, &subset);
                let held = cached.map(|c| windows.held_units(c)).unwrap_or_default();
                let visit = visit(windows.unit_count(), held, o.shuffle_chunks);
                (visit, Units::Windows(windows))
            }
            Order::Blocks(o) => {
                let fetches = blocks::Fetches::new(o, &subset);
                let held = cached
                    .map(|c| fetches.held_blocks(&chunks, &subset, c))
                    .unwrap_or_default();
                let visit = visit(fetches.unit_count(), held, true);
                let short = fetches
                    .short_block()
                    .map(|block| fetches.step_of_position(visit.position_of(block)));
                (visit, Units::Fetches { fetches, short })
            }
        };
        EpochPlan {
            chunks,
            subset,
            order,
            epoch,
            visit,
            units,
        }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn order(&self) -> &Order {
        &self.order
    }

    /// How many steps the epoch has.
    pub fn step_count(&self) -> usize {
        match &self.units {
            Units::Windows(w) | Units::DrawnWindows { windows: w, .. } => w.step_count(),
            Units::Fetches { fetches, .. } | Units::Draws { fetches, .. } => fetches.step_count(),
        }
    }

    /// Step `step` of the epoch (below [`EpochPlan::step_count`]).
    pub fn step(&self, step: usize) -> Step {
        match &self.units {
            Units::Windows(w) => Step::Window {
                chunks: w.chunks_of(|p| self.visit.unit_at(p), step),
            },
            Units::Fetches { fetches, .. } => Step::Fetch {
                blocks: fetches.rows_of(|p| self.visit.unit_at(p), &self.subset, step),
            },
            Units::DrawnWindows { windows, draws } => {
                // A chunk drawn twice in a window is announced once.
                let mut chunks = self.drawn_chunks(windows, draws, step);
                let mut seen = std::collections::HashSet::new();
                chunks.retain(|c| seen.insert(*c));
                Step::Window { chunks }
            }
            Units::Draws {
                fetches,
                draws,
                short,
            } => {
                let mut rows = fetches.draw_rows(draws, &self.subset, step, *short == Some(step));
                rows.sort_unstable();
                Step::Draws { rows }
            }
        }
    }

    /// The epoch's steps in visiting order, each computed as the iterator reaches it.
    pub fn steps(&self) -> impl ExactSizeIterator<Item = Step> + '_ {
        (0..self.step_count()).map(|step| self.step(step))
    }

    /// The rows the plan visits.
    pub fn subset(&self) -> &RowSubset {
        &self.subset
    }

    /// How many rows step `step` has, without listing them: for a fetch in constant
    /// time, for a window in time of its chunks.
    pub fn row_count(&self, step: usize) -> u64 {
        match &self.units {
            Units::Windows(w) => w
                .chunks_of(|p| self.visit.unit_at(p), step)
                .into_iter()
                .map(|c| {
                    let rows = self.chunks.chunk_rows(c);
                    self.subset.position_of(rows.end) - self.subset.position_of(rows.start)
                })
                .sum(),
            Units::DrawnWindows { windows, draws } => self
                .drawn_chunks(windows, draws, step)
                .into_iter()
                .map(|c| self.subset.intersect(self.chunks.chunk_rows(c)))
                .map(|rows| rows.iter().map(|r| r.end - r.start).sum::<u64>())
                .sum(),
            Units::Fetches { fetches, short } | Units::Draws { fetches, short, .. } => {
                fetches.row_count(step, *short == Some(step))
            }
        }
    }

    /// The rows of step `step` as contiguous ranges, in the order the step lists them
    /// (a weighted order's a row each, in the order drawn, a row drawn twice listed
    /// twice).
    pub fn row_ranges(&self, step: usize) -> Vec<Range<u64>> {
        if let Units::DrawnWindows { windows, draws } = &self.units {
            let rows = windows.draw_rows(draws, &self.chunks, &self.subset, step);
            return rows.into_iter().map(|row| row..row + 1).collect();
        }
        match self.step(step) {
            Step::Window { chunks } => chunks
                .iter()
                .flat_map(|&c| self.subset.intersect(self.chunks.chunk_rows(c)))
                .collect(),
            Step::Fetch { blocks } => blocks,
            Step::Draws { rows } => rows.into_iter().map(|row| row..row + 1).collect(),
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

/// The epoch's visiting order of an order's units (the chunks of a window order, the
/// blocks of a block order): the units to read first (a cache-aware epoch's held ones),
/// in a seeded order, then the others, in a seeded order. Both sides are permutations
/// keyed alike from the epoch's step stream, so that with nothing to read first, or
/// everything, the visit is the plain one.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Visit {
    first: RangeSet,
    first_order: Permutation,
    rest_order: Permutation,
}

impl Visit {
    fn new(count: u64, first: RangeSet, shuffled: bool, seed: u64, epoch: u64) -> Visit {
        // Every unit first is no unit first: one order, the plain one.
        let first = if first.len() == count {
            RangeSet::default()
        } else {
            first
        };
        let permutation = |n| match shuffled {
            true => Permutation::random(n, &mut seeding::rng(seed, epoch, Stream::Steps)),
            false => Permutation::identity(n),
        };
        Visit {
            first_order: permutation(first.len()),
            rest_order: permutation(count - first.len()),
            first,
        }
    }

    /// The unit visited at position `position` of the epoch.
    fn unit_at(&self, position: u64) -> u64 {
        match position.checked_sub(self.first.len()) {
            None => self.first.nth(self.first_order.at(position)),
            Some(rest) => self.first.nth_outside(self.rest_order.at(rest)),
        }
    }

    /// The position in the epoch at which unit `unit` is visited.
    fn position_of(&self, unit: u64) -> u64 {
        let before = self.first.rank(unit);
        match self.first.contains(unit) {
            true => self.first_order.position_of(before),
            false => self.first.len() + self.rest_order.position_of(unit - before),
        }
    }
}
