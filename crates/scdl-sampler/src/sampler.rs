//! The sampler: one order over one dataset, for one worker of one rank, with the
//! dataset's hint file held open across epochs (the daemon keeps a plan per handle).

use std::num::NonZeroUsize;

use crate::epoch::EpochIter;
use crate::hints::{HintWriteError, HintWriter};
use crate::layout::{ChunkLayout, DatasetLayout};
use crate::order::{EpochPlan, Order};
use crate::shard::{worker_share, Shard, ShardError, Workers};

/// Steps announced ahead of the reader unless the caller says otherwise: enough for
/// the daemon to keep its downloads busy, few enough that a plan stays small.
pub const DEFAULT_HINT_LOOKAHEAD: NonZeroUsize = NonZeroUsize::new(8).unwrap();

#[derive(Debug)]
pub struct Sampler {
    chunks: ChunkLayout,
    order: Order,
    shard: Shard,
    workers: Workers,
    hints: HintWriter,
    lookahead: NonZeroUsize,
}

impl Sampler {
    /// A sampler of `layout`'s dataset. Opens the dataset's hint file if it has one.
    pub fn new(
        layout: &DatasetLayout,
        order: Order,
        shard: Shard,
        workers: Workers,
    ) -> Result<Sampler, ShardError> {
        shard.check_step_count(order.step_count(&layout.chunks))?;
        Ok(Sampler {
            chunks: layout.chunks,
            order,
            shard,
            workers,
            hints: HintWriter::open(&layout.dir),
            lookahead: DEFAULT_HINT_LOOKAHEAD,
        })
    }

    /// Announces `steps` steps ahead of the reader, counting the one being read.
    pub fn with_hint_lookahead(self, steps: NonZeroUsize) -> Sampler {
        Sampler {
            lookahead: steps,
            ..self
        }
    }

    /// Starts epoch `epoch`: tells the daemon of the new plan, and yields this worker's
    /// rows of it.
    pub fn epoch(&mut self, epoch: u64) -> EpochIter<'_> {
        let plan = EpochPlan::new(self.chunks, self.order, epoch);
        let share = worker_share(&plan, &self.shard, &self.workers);
        EpochIter::start(plan, share, &mut self.hints, self.lookahead.get())
    }

    /// Whether the daemon is being told the plan.
    pub fn hints_active(&self) -> bool {
        self.hints.is_active()
    }

    /// The first hint failure since the last call, if any. Rows are unaffected.
    pub fn take_hint_error(&mut self) -> Option<HintWriteError> {
        self.hints.take_error()
    }
}
