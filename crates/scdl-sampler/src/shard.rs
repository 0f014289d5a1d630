//! Dividing an epoch among distributed ranks and, inside a rank, among data-loading
//! workers, always by whole steps so that a window never leaves its chunks and a fetch
//! is read by one reader.
//!
//! Steps are dealt round-robin: rank `r` of `W` takes steps `r, r + W, r + 2W, …`, and
//! worker `w` of `N` takes every `N`-th step of its rank's share in the same way. Shares
//! are therefore disjoint and within one step of each other in length. Distributed
//! training usually needs every rank to yield the same number of rows; [`EvenShares`]
//! says how to get there. Every rank computes every rank's row count from the shared
//! epoch plan, so the ranks agree without communicating.

use std::num::NonZeroU32;

use crate::order::EpochPlan;

/// How ranks whose shares differ in length are evened out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvenShares {
    /// Leave shares as dealt: together the ranks visit every row exactly once.
    Uneven,
    /// Bring every rank up to the longest share by repeating its own steps from the
    /// start (the last repetition cut short).
    Pad,
    /// Cut every rank down to the shortest share, dropping rows from its end.
    Drop,
}

/// Why a sharding is impossible.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error("rank {rank} does not exist among {world_size} ranks")]
    RankOutOfRange { rank: u32, world_size: u32 },
    #[error("worker {worker_id} does not exist among {num_workers} workers")]
    WorkerOutOfRange { worker_id: u32, num_workers: u32 },
    #[error(
        "the order has {steps} steps for {world_size} ranks; padding or dropping to even \
         shares needs every rank to own a step (use smaller windows or fetches, or Uneven)"
    )]
    FewerStepsThanRanks { steps: usize, world_size: u32 },
}

/// This process's place among the ranks of a distributed job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    rank: u32,
    world_size: NonZeroU32,
    even: EvenShares,
}

impl Shard {
    pub fn new(rank: u32, world_size: NonZeroU32, even: EvenShares) -> Result<Shard, ShardError> {
        if rank >= world_size.get() {
            return Err(ShardError::RankOutOfRange {
                rank,
                world_size: world_size.get(),
            });
        }
        Ok(Shard {
            rank,
            world_size,
            even,
        })
    }

    /// The only rank of a job that is not distributed.
    pub fn single() -> Shard {
        Shard {
            rank: 0,
            world_size: NonZeroU32::MIN,
            even: EvenShares::Uneven,
        }
    }

    pub fn rank(&self) -> u32 {
        self.rank
    }

    pub fn world_size(&self) -> u32 {
        self.world_size.get()
    }

    pub fn even(&self) -> EvenShares {
        self.even
    }

    /// Checks that an order with `steps` steps per epoch can be evened out as asked: an
    /// empty share has no rows to repeat, and would cut every other share to nothing.
    pub fn check_step_count(&self, steps: usize) -> Result<(), ShardError> {
        let too_few = steps < self.world_size.get() as usize;
        if too_few && self.even != EvenShares::Uneven {
            return Err(ShardError::FewerStepsThanRanks {
                steps,
                world_size: self.world_size.get(),
            });
        }
        Ok(())
    }
}

/// This process's place among the data-loading workers of its rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workers {
    worker_id: u32,
    num_workers: NonZeroU32,
}

impl Workers {
    pub fn new(worker_id: u32, num_workers: NonZeroU32) -> Result<Workers, ShardError> {
        if worker_id >= num_workers.get() {
            return Err(ShardError::WorkerOutOfRange {
                worker_id,
                num_workers: num_workers.get(),
            });
        }
        Ok(Workers {
            worker_id,
            num_workers,
        })
    }

    /// The only worker: rows are loaded in the process that iterates.
    pub fn single() -> Workers {
        Workers {
            worker_id: 0,
            num_workers: NonZeroU32::MIN,
        }
    }

    pub fn worker_id(&self) -> u32 {
        self.worker_id
    }

    pub fn num_workers(&self) -> u32 {
        self.num_workers.get()
    }
}

/// One step of a share: the first `rows` rows of the plan's step `step`, in the
/// step's visiting order. `rows` is the step's full row count except where
/// [`EvenShares`] cut it short.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShareStep {
    pub step: usize,
    pub rows: u64,
}

/// The steps of one rank, evened out as the shard asks.
pub fn rank_share(plan: &EpochPlan, shard: &Shard) -> Vec<ShareStep> {
    let world_size = shard.world_size() as usize;
    let dealt = |rank: usize| {
        (rank..plan.step_count())
            .step_by(world_size)
            .map(|step| ShareStep {
                step,
                rows: plan.row_count(step),
            })
    };
    let own: Vec<ShareStep> = dealt(shard.rank() as usize).collect();
    let rank_rows = || (0..world_size).map(|rank| dealt(rank).map(|s| s.rows).sum::<u64>());
    match shard.even() {
        EvenShares::Uneven => own,
        EvenShares::Pad => {
            let target = rank_rows().max().unwrap_or(0);
            let own_rows: u64 = own.iter().map(|s| s.rows).sum();
            let padding = take_rows(own.iter().cycle(), target - own_rows);
            own.iter().copied().chain(padding).collect()
        }
        EvenShares::Drop => {
            let target = rank_rows().min().unwrap_or(0);
            take_rows(own.iter(), target)
        }
    }
}

/// The steps of `steps`, in order, up to `total` rows, the last one cut short. Stops
/// when `steps` runs out, so an empty cycle cannot loop forever.
fn take_rows<'a>(steps: impl Iterator<Item = &'a ShareStep>, total: u64) -> Vec<ShareStep> {
    let mut left = total;
    steps
        .map_while(|s| {
            let rows = s.rows.min(left);
            left -= rows;
            (rows > 0).then_some(ShareStep { step: s.step, rows })
        })
        .collect()
}

/// The steps one worker of one rank reads, in order.
pub fn worker_share(plan: &EpochPlan, shard: &Shard, workers: &Workers) -> Vec<ShareStep> {
    rank_share(plan, shard)
        .into_iter()
        .skip(workers.worker_id() as usize)
        .step_by(workers.num_workers() as usize)
        .collect()
}
