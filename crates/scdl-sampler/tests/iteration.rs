//! Specification of iterating a sampler: the rows of this worker's share, step after
//! step, and minibatches that never cross a fetch.

mod common;

use common::*;
use proptest::prelude::*;
use scdl_sampler::{
    worker_share, DatasetLayout, EpochPlan, EvenShares, Order, Sampler, Shard, ShardError, Workers,
    DEFAULT_VIRTUAL_CHUNK_SIZE,
};

fn sampler(dir: &std::path::Path, order: Order, shard: Shard, workers: Workers) -> Sampler {
    let layout = DatasetLayout::discover(dir, DEFAULT_VIRTUAL_CHUNK_SIZE).unwrap();
    Sampler::new(&layout, order, shard, workers).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn an_epoch_yields_the_workers_share_row_by_row(
        rows in 0u64..800, chunk_size in 1u32..100, order in orders(), epoch in 0u64..3,
        world_size in 1u32..4, num_workers in 1u32..3, rank in any::<prop::sample::Index>(),
        worker in any::<prop::sample::Index>(),
    ) {
        let dataset = raw_dataset(rows, chunk_size, false);
        let shard = Shard::new(rank.index(world_size as usize) as u32, nonzero(world_size), EvenShares::Uneven).unwrap();
        let workers = Workers::new(worker.index(num_workers as usize) as u32, nonzero(num_workers)).unwrap();
        let mut sampler = sampler(dataset.path(), order, shard, workers);

        let chunks = scdl_sampler::ChunkLayout::new(rows, chunk_size as u64).unwrap();
        let plan = EpochPlan::new(chunks, order, epoch);
        let expected: Vec<u64> = worker_share(&plan, &shard, &workers)
            .iter()
            .flat_map(|s| plan.rows_of(s.step).into_iter().take(s.rows as usize))
            .collect();

        let iter = sampler.epoch(epoch);
        prop_assert_eq!(iter.len(), expected.len());
        prop_assert_eq!(iter.collect::<Vec<_>>(), expected);
    }

    /// An oracle that shares no code with the sampler: with uneven shares, the ranks
    /// and workers of an epoch together read every row exactly once.
    #[test]
    fn ranks_and_workers_together_read_every_row_once(
        rows in 0u64..800, chunk_size in 1u32..100, order in orders(), epoch in 0u64..3,
        world_size in 1u32..4, num_workers in 1u32..3,
    ) {
        let dataset = raw_dataset(rows, chunk_size, false);
        let mut seen = vec![0u32; rows as usize];
        for rank in 0..world_size {
            for worker in 0..num_workers {
                let shard = Shard::new(rank, nonzero(world_size), EvenShares::Uneven).unwrap();
                let workers = Workers::new(worker, nonzero(num_workers)).unwrap();
                for row in sampler(dataset.path(), order, shard, workers).epoch(epoch) {
                    prop_assert!(row < rows, "row {} of {}", row, rows);
                    seen[row as usize] += 1;
                }
            }
        }
        prop_assert!(seen.iter().all(|&n| n == 1), "visits per row: {:?}", seen);
    }

    #[test]
    fn minibatches_cut_fetches_and_never_cross_them(
        rows in 0u64..800, chunk_size in 1u32..100, order in block_orders(),
        world_size in 1u32..4, even in prop_oneof![Just(EvenShares::Uneven), Just(EvenShares::Pad), Just(EvenShares::Drop)],
    ) {
        let Order::Blocks(blocks) = order else { unreachable!() };
        let batch = blocks.batch_size.get() as usize;
        let dataset = raw_dataset(rows, chunk_size, false);
        let layout = DatasetLayout::discover(dataset.path(), DEFAULT_VIRTUAL_CHUNK_SIZE).unwrap();
        let shard = Shard::new(world_size - 1, nonzero(world_size), even).unwrap();
        let sampler = Sampler::new(&layout, order, shard, Workers::single());
        prop_assume!(sampler.is_ok(), "too few fetches to even out");
        let mut sampler = sampler.unwrap();
        let all_rows: Vec<u64> = sampler.epoch(0).collect();

        let mut iter = sampler.epoch(0);
        let share = iter.share().to_vec();
        let mut minibatches = Vec::new();
        while let Some(minibatch) = iter.next_minibatch() {
            minibatches.push(minibatch);
        }
        prop_assert_eq!(minibatches.concat(), all_rows);

        // Each share step is cut into full minibatches and at most one short last one.
        let mut cuts = minibatches.iter().map(Vec::len);
        for step in share {
            let mut left = step.rows as usize;
            while left > 0 {
                let len = cuts.next().unwrap();
                prop_assert_eq!(len, batch.min(left));
                left -= len;
            }
        }
        prop_assert_eq!(cuts.next(), None);
    }

    /// A cursor kept apart from its sampler (as the Python binding keeps it) yields the
    /// minibatches of `epoch()` and announces the same hints, and `rows_in_epoch`
    /// counts them.
    #[test]
    fn a_cursor_kept_apart_is_the_epoch_iterator(
        rows in 0u64..800, chunk_size in 1u32..100, order in orders(), epoch in 0u64..3,
        world_size in 1u32..4,
        even in prop_oneof![Just(EvenShares::Uneven), Just(EvenShares::Pad), Just(EvenShares::Drop)],
    ) {
        let by_iterator = raw_dataset(rows, chunk_size, true);
        let by_cursor = raw_dataset(rows, chunk_size, true);
        let shard = Shard::new(world_size - 1, nonzero(world_size), even).unwrap();
        let layout = DatasetLayout::discover(by_iterator.path(), DEFAULT_VIRTUAL_CHUNK_SIZE).unwrap();
        let iterated = Sampler::new(&layout, order, shard, Workers::single());
        prop_assume!(iterated.is_ok(), "too few steps to even out");
        let mut iterated = iterated.unwrap();
        let mut kept_apart = sampler(by_cursor.path(), order, shard, Workers::single());

        let mut iter = iterated.epoch(epoch);
        let expected: Vec<Vec<u64>> = std::iter::from_fn(|| iter.next_minibatch()).collect();
        let mut cursor = kept_apart.start_epoch(epoch);
        let got: Vec<Vec<u64>> = std::iter::from_fn(|| kept_apart.next_minibatch(&mut cursor)).collect();
        prop_assert_eq!(&got, &expected);
        prop_assert_eq!(kept_apart.rows_in_epoch(epoch), got.concat().len() as u64);
        iter.flush_hints();
        kept_apart.flush_hints();
        prop_assert_eq!(hint_lines(by_cursor.path()), hint_lines(by_iterator.path()));
    }
}

#[test]
fn a_window_order_minibatch_is_the_rest_of_the_window() {
    let dataset = raw_dataset(100, 10, false);
    let mut sampler = sampler(
        dataset.path(),
        window_order(3, 2),
        Shard::single(),
        Workers::single(),
    );
    let mut iter = sampler.epoch(0);
    let first: Vec<u64> = iter.by_ref().take(5).collect();
    let rest_of_window = iter.next_minibatch().unwrap();
    assert_eq!(rest_of_window.len(), 15);
    let window: Vec<u64> = [first, rest_of_window].concat();
    let chunks: std::collections::BTreeSet<u64> = window.iter().map(|r| r / 10).collect();
    assert_eq!(chunks.len(), 2);
    assert_eq!(iter.next_minibatch().unwrap().len(), 20);
}

#[test]
fn evening_out_is_refused_when_a_rank_would_own_no_step() {
    let dataset = raw_dataset(100, 10, false);
    let layout = DatasetLayout::discover(dataset.path(), DEFAULT_VIRTUAL_CHUNK_SIZE).unwrap();
    let shard = Shard::new(0, nonzero(4), EvenShares::Pad).unwrap();
    let err = Sampler::new(&layout, window_order(0, 4), shard, Workers::single()).unwrap_err();
    assert_eq!(
        err,
        ShardError::FewerStepsThanRanks {
            steps: 3,
            world_size: 4
        }
    );
}
