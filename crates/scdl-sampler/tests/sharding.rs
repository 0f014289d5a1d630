//! Specification of how an epoch is divided among ranks and their workers.

mod common;

use std::collections::HashSet;

use common::*;
use proptest::prelude::*;
use scdl_sampler::{
    rank_share, worker_share, ChunkLayout, EpochPlan, EvenShares, Shard, ShardError, ShareStep,
    Workers,
};

/// The rows a share yields, in order: each step's first `rows` rows.
fn share_rows(plan: &EpochPlan, share: &[ShareStep]) -> Vec<u64> {
    share
        .iter()
        .flat_map(|s| plan.rows_of(s.step).into_iter().take(s.rows as usize))
        .collect()
}

fn shards(world_size: u32, even: EvenShares) -> Vec<Shard> {
    (0..world_size)
        .map(|rank| Shard::new(rank, nonzero(world_size), even).unwrap())
        .collect()
}

/// A plan and a world size that can be evened out: every rank owns a step.
fn evenable() -> impl Strategy<Value = (EpochPlan, u32)> {
    (chunk_layouts(), orders(), 0u64..4, 1u32..6).prop_filter_map(
        "every rank must own a step",
        |(chunks, order, epoch, world_size)| {
            let plan = EpochPlan::new(chunks, order, epoch);
            (plan.step_count() >= world_size as usize).then_some((plan, world_size))
        },
    )
}

proptest! {
    #[test]
    fn ranks_and_workers_together_visit_every_row_exactly_once(
        chunks in chunk_layouts(), order in orders(), epoch in 0u64..4,
        world_size in 1u32..6, num_workers in 1u32..4,
    ) {
        let plan = EpochPlan::new(chunks, order, epoch);
        let mut rows = Vec::new();
        for shard in shards(world_size, EvenShares::Uneven) {
            for worker_id in 0..num_workers {
                let workers = Workers::new(worker_id, nonzero(num_workers)).unwrap();
                rows.extend(share_rows(&plan, &worker_share(&plan, &shard, &workers)));
            }
        }
        rows.sort_unstable();
        prop_assert_eq!(rows, (0..chunks.total_rows()).collect::<Vec<_>>());
    }

    #[test]
    fn ranks_get_disjoint_whole_steps_within_one_step_of_each_other(
        chunks in chunk_layouts(), order in orders(), world_size in 1u32..6,
    ) {
        let plan = EpochPlan::new(chunks, order, 0);
        let shares: Vec<Vec<ShareStep>> = shards(world_size, EvenShares::Uneven)
            .iter()
            .map(|shard| rank_share(&plan, shard))
            .collect();
        let mut owned = HashSet::new();
        for share in &shares {
            for s in share {
                prop_assert!(owned.insert(s.step), "step {} dealt twice", s.step);
                prop_assert_eq!(s.rows, plan.row_count(s.step));
            }
        }
        let lengths: Vec<usize> = shares.iter().map(Vec::len).collect();
        let (min, max) = (lengths.iter().min().unwrap(), lengths.iter().max().unwrap());
        prop_assert!(max - min <= 1, "step counts {:?}", lengths);
    }

    #[test]
    fn padding_brings_every_rank_to_the_longest_share_with_its_own_rows(
        (plan, world_size) in evenable(),
    ) {
        let uneven: Vec<Vec<u64>> = shards(world_size, EvenShares::Uneven)
            .iter()
            .map(|shard| share_rows(&plan, &rank_share(&plan, shard)))
            .collect();
        let longest = uneven.iter().map(Vec::len).max().unwrap();
        for (own, shard) in uneven.iter().zip(shards(world_size, EvenShares::Pad)) {
            let padded = share_rows(&plan, &rank_share(&plan, &shard));
            prop_assert_eq!(padded.len(), longest);
            prop_assert_eq!(&padded[..own.len()], &own[..]);
            let own_set: HashSet<_> = own.iter().collect();
            prop_assert!(padded.iter().all(|r| own_set.contains(r)));
        }
    }

    #[test]
    fn dropping_cuts_every_rank_to_the_shortest_share(
        (plan, world_size) in evenable(),
    ) {
        let uneven: Vec<Vec<u64>> = shards(world_size, EvenShares::Uneven)
            .iter()
            .map(|shard| share_rows(&plan, &rank_share(&plan, shard)))
            .collect();
        let shortest = uneven.iter().map(Vec::len).min().unwrap();
        for (own, shard) in uneven.iter().zip(shards(world_size, EvenShares::Drop)) {
            let dropped = share_rows(&plan, &rank_share(&plan, &shard));
            prop_assert_eq!(&dropped[..], &own[..shortest]);
        }
    }

    #[test]
    fn workers_deal_their_ranks_share_by_whole_steps(
        (plan, world_size) in evenable(), num_workers in 1u32..5,
        even in prop_oneof![Just(EvenShares::Uneven), Just(EvenShares::Pad), Just(EvenShares::Drop)],
    ) {
        for shard in shards(world_size, even) {
            let rank = rank_share(&plan, &shard);
            for worker_id in 0..num_workers {
                let workers = Workers::new(worker_id, nonzero(num_workers)).unwrap();
                let expected: Vec<ShareStep> = rank
                    .iter()
                    .skip(worker_id as usize)
                    .step_by(num_workers as usize)
                    .copied()
                    .collect();
                prop_assert_eq!(worker_share(&plan, &shard, &workers), expected);
            }
        }
    }
}

#[test]
fn ranks_and_workers_must_exist() {
    assert_eq!(
        Shard::new(4, nonzero(4), EvenShares::Uneven),
        Err(ShardError::RankOutOfRange {
            rank: 4,
            world_size: 4
        })
    );
    assert_eq!(
        Workers::new(2, nonzero(2)),
        Err(ShardError::WorkerOutOfRange {
            worker_id: 2,
            num_workers: 2
        })
    );
}

#[test]
fn evening_out_needs_a_step_for_every_rank() {
    for even in [EvenShares::Pad, EvenShares::Drop] {
        let shard = Shard::new(0, nonzero(3), even).unwrap();
        assert_eq!(shard.check_step_count(3), Ok(()));
        assert_eq!(
            shard.check_step_count(2),
            Err(ShardError::FewerStepsThanRanks {
                steps: 2,
                world_size: 3
            })
        );
    }
    let uneven = Shard::new(0, nonzero(3), EvenShares::Uneven).unwrap();
    assert_eq!(uneven.check_step_count(0), Ok(()));
}

#[test]
fn a_rank_without_steps_yields_nothing_when_uneven() {
    let plan = EpochPlan::new(ChunkLayout::new(100, 50).unwrap(), window_order(0, 1), 0);
    let last = Shard::new(2, nonzero(3), EvenShares::Uneven).unwrap();
    assert_eq!(rank_share(&plan, &last), vec![]);
}
