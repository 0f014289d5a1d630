//! The sampler: one order over one dataset, for one worker of one rank, with the
//! dataset's hint file held open across epochs (the daemon keeps a plan per handle).

use std::num::NonZeroUsize;
use std::sync::Arc;

use crate::cached::CachedChunks;
use crate::epoch::{EpochCursor, EpochIter};
use crate::hints::{HintWriteError, HintWriter};
use crate::layout::{ChunkLayout, DatasetLayout};
use crate::order::{EpochPlan, Order};
use crate::shard::{worker_share, Shard, ShardError, ShareStep, Workers};
use crate::subset::{RowSubset, SubsetError};
use crate::weights::{RowWeights, WeightsError};

/// Steps announced ahead of the reader unless the caller says otherwise: enough for
/// the daemon to keep its downloads busy (at least half of them are always announced,
/// above the daemon's default prefetch of four steps), few enough that a plan stays
/// small. Top-ups come every half of it, so it also sets how often the reader's process
/// writes to the daemon: with 16, one write per eight minibatches of a random order.
pub const DEFAULT_HINT_LOOKAHEAD: NonZeroUsize = NonZeroUsize::new(16).unwrap();

/// Why a sampler cannot be restricted to a subset.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum RestrictError {
    #[error(transparent)]
    Subset(#[from] SubsetError),
    #[error(transparent)]
    Shard(#[from] ShardError),
    #[error(transparent)]
    Weights(#[from] WeightsError),
}

#[derive(Debug)]
pub struct Sampler {
    chunks: ChunkLayout,
    subset: Arc<RowSubset>,
    order: Order,
    shard: Shard,
    workers: Workers,
    hints: HintWriter,
    lookahead: NonZeroUsize,
    /// Read these chunks first (a cache-aware order), if set.
    cached_first: Option<Arc<CachedChunks>>,
    /// Draw rows by these weights (a weighted block order), if set.
    weights: Option<Arc<RowWeights>>,
}

impl Sampler {
    /// A sampler of `layout`'s dataset. Opens the dataset's hint file if it has one.
    pub fn new(
        layout: &DatasetLayout,
        order: Order,
        shard: Shard,
        workers: Workers,
    ) -> Result<Sampler, ShardError> {
        let chunk_rows = layout.chunks.chunk_size();
        Sampler::with_writer(layout, order, shard, workers, |dir| {
            HintWriter::open(dir, chunk_rows)
        })
    }

    /// A sampler of `layout`'s dataset that gives no hints, even on a mount; its rows
    /// are those of [`Sampler::new`].
    pub fn without_hints(
        layout: &DatasetLayout,
        order: Order,
        shard: Shard,
        workers: Workers,
    ) -> Result<Sampler, ShardError> {
        Sampler::with_writer(layout, order, shard, workers, |_| HintWriter::disabled())
    }

    fn with_writer(
        layout: &DatasetLayout,
        order: Order,
        shard: Shard,
        workers: Workers,
        open_hints: impl FnOnce(&std::path::Path) -> HintWriter,
    ) -> Result<Sampler, ShardError> {
        shard.check_step_count(order.step_count(&layout.chunks))?;
        Ok(Sampler {
            chunks: layout.chunks,
            subset: Arc::new(RowSubset::all(layout.chunks.total_rows())),
            order,
            shard,
            workers,
            hints: open_hints(&layout.dir),
            lookahead: DEFAULT_HINT_LOOKAHEAD,
            cached_first: None,
            weights: None,
        })
    }

    /// Announces `steps` steps ahead of the reader, counting the one being read.
    pub fn with_hint_lookahead(self, steps: NonZeroUsize) -> Sampler {
        Sampler {
            lookahead: steps,
            ..self
        }
    }

    /// The same sampler in the cache-aware order: the epochs it starts read the units
    /// wholly in `cached` (the chunks the daemon announced it holds, see
    /// [`CachedChunks::read_from`]) first, then the rest, each in the seeded order
    /// ([`EpochPlan::over_cache_aware`]). Every process that shares the epoch (ranks,
    /// workers) must be given the same set: each then computes the same plan. Off
    /// unless asked for: see docs/preparing-data.md for what it does to minibatch
    /// diversity.
    pub fn with_cache_aware_order(mut self, cached: CachedChunks) -> Sampler {
        self.set_cache_aware_order(Some(cached));
        self
    }

    /// Sets the chunks the epochs started from now on read first (`None`: the plain
    /// order). An epoch under way keeps its plan.
    pub fn set_cache_aware_order(&mut self, cached: Option<CachedChunks>) {
        self.cached_first = cached.map(Arc::new);
    }

    /// The same order drawing its rows by `weights` (see [`RowWeights`]), with
    /// replacement, in blocks or chunk windows as the plain order reads. A cache-aware
    /// order set is ignored while weights are.
    pub fn with_row_weights(self, weights: Arc<RowWeights>) -> Result<Sampler, WeightsError> {
        weights.check_for(self.chunks.total_rows(), &self.subset)?;
        Ok(Sampler {
            weights: Some(weights),
            ..self
        })
    }

    /// The chunks the next epoch reads first, if the order is cache-aware.
    pub fn cache_aware_order(&self) -> Option<&CachedChunks> {
        self.cached_first.as_deref()
    }

    /// Starts epoch `epoch`: tells the daemon of the new plan, and yields this worker's
    /// rows of it.
    pub fn epoch(&mut self, epoch: u64) -> EpochIter<'_> {
        let cursor = self.start_epoch(epoch);
        EpochIter::new(cursor, &mut self.hints)
    }

    /// The same sampler over the rows of `subset` only (a split, or any rows of the
    /// dataset); see [`RowSubset`] for how the orders keep their locality.
    pub fn restricted_to(self, subset: Arc<RowSubset>) -> Result<Sampler, RestrictError> {
        subset.check_within(self.chunks.total_rows())?;
        if let Some(weights) = &self.weights {
            weights.check_for(self.chunks.total_rows(), &subset)?;
        }
        self.shard
            .check_step_count(self.order.step_count_over(&self.chunks, &subset))?;
        Ok(Sampler { subset, ..self })
    }

    /// The rows this sampler visits (all ranks and workers together).
    pub fn subset(&self) -> &RowSubset {
        &self.subset
    }

    /// Starts epoch `epoch` like [`Sampler::epoch`], for a caller that keeps the
    /// position apart from the sampler and advances it with
    /// [`Sampler::next_minibatch`].
    pub fn start_epoch(&mut self, epoch: u64) -> EpochCursor {
        self.resume_epoch(epoch, 0)
            .expect("an epoch resumes after its first 0 rows")
    }

    /// Resumes epoch `epoch` after this worker's first `rows_done` rows of it, as if
    /// they had been read: the rest comes out exactly as an uninterrupted epoch would
    /// yield it, and the daemon is told the plan from the step that holds the next row.
    /// `None` when this worker's share of the epoch has fewer than `rows_done` rows.
    pub fn resume_epoch(&mut self, epoch: u64, rows_done: u64) -> Option<EpochCursor> {
        let (plan, share) = self.share(epoch);
        EpochCursor::start(
            plan,
            share,
            &mut self.hints,
            self.lookahead.get(),
            rows_done,
        )
    }

    fn share(&self, epoch: u64) -> (EpochPlan, Vec<ShareStep>) {
        let subset = self.subset.clone();
        let plan = match (&self.weights, &self.cached_first) {
            (Some(weights), _) => {
                EpochPlan::over_weighted(self.chunks, subset, self.order, epoch, weights.clone())
            }
            (None, Some(cached)) => {
                EpochPlan::over_cache_aware(self.chunks, subset, self.order, epoch, cached)
            }
            (None, None) => EpochPlan::over(self.chunks, subset, self.order, epoch),
        };
        let share = worker_share(&plan, &self.shard, &self.workers);
        (plan, share)
    }

    /// The rows up to `cursor`'s next minibatch boundary, announcing steps as it
    /// enters them. Block order cuts every fetch into minibatches of `batch_size` rows
    /// (a fetch's last one may be shorter); the chunk-window order has no minibatches
    /// of its own, so its only boundaries are window ends and a call yields the rest of
    /// the current window.
    pub fn next_minibatch(&mut self, cursor: &mut EpochCursor) -> Option<Vec<u64>> {
        cursor.next_minibatch(&mut self.hints)
    }

    /// How many rows this worker visits in epoch `epoch`.
    pub fn rows_in_epoch(&self, epoch: u64) -> u64 {
        self.share(epoch).1.iter().map(|s| s.rows).sum()
    }

    /// How many minibatches this worker reads in epoch `epoch` when every step is cut
    /// into minibatches of `batch_size` rows (the last of a step maybe shorter), as
    /// [`Sampler::next_minibatch`] cuts the block order's.
    pub fn minibatches_in_epoch(&self, epoch: u64, batch_size: u64) -> u64 {
        self.share(epoch)
            .1
            .iter()
            .map(|step| step.rows.div_ceil(batch_size))
            .sum()
    }

    /// Whether the daemon is being told the plan.
    pub fn hints_active(&self) -> bool {
        self.hints.is_active()
    }

    /// Waits until the hints announced so far have reached the hint file (they are
    /// written by a thread of the sampler's, behind the reader).
    pub fn flush_hints(&self) {
        self.hints.flush();
    }

    /// The first hint failure since the last call, once the hints announced so far
    /// have been written; if any. Rows are unaffected.
    pub fn take_hint_error(&mut self) -> Option<HintWriteError> {
        self.hints.take_error()
    }

    /// The failure [`Sampler::take_hint_error`] would give next, as text, without
    /// waiting for the hints queued and without taking it (see
    /// [`HintWriter::pending_error`]).
    pub fn pending_hint_error(&self) -> Option<String> {
        self.hints.pending_error()
    }
}
