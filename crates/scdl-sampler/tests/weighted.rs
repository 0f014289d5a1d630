//! Specification of the weighted block order ([`RowWeights`]): each epoch as many
//! draws as the rows it visits, only of rows of positive weight in its subset, a fetch
//! reading no more blocks than the plain order's; seeded (the same plan in every
//! process), dealt to ranks by whole fetches, resumable part-way; a class drawn as
//! often as another whatever their sizes; and each fetch announced as its distinct rows.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use common::*;
use proptest::prelude::*;
use scdl_format::hint::HintLine;
use scdl_sampler::{
    worker_share, BlockOrder, ChunkLayout, DatasetLayout, EpochPlan, EvenShares, Order,
    RestrictError, RowSubset, RowWeights, Sampler, Shard, Step, WeightsError, Workers,
    DEFAULT_VIRTUAL_CHUNK_SIZE,
};

fn blocks_of(order: Order) -> BlockOrder {
    match order {
        Order::Blocks(o) => o,
        Order::ChunkWindows(_) => unreachable!("block_orders() makes block orders"),
    }
}

/// Weights for `rows` rows, a third of them 0, the others between 0.01 and 100.
fn weights(rows: u64) -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(
        prop_oneof![Just(0.0), 0.01f64..100.0, 0.01f64..100.0],
        rows as usize,
    )
}

fn drawn_rows(plan: &EpochPlan) -> Vec<u64> {
    (0..plan.step_count())
        .flat_map(|i| plan.rows_of(i))
        .collect()
}

fn multiset(rows: impl IntoIterator<Item = u64>) -> BTreeMap<u64, usize> {
    let mut counts = BTreeMap::new();
    for row in rows {
        *counts.entry(row).or_default() += 1;
    }
    counts
}

fn weighted_sampler(
    rows: u64,
    chunk: u32,
    order: Order,
    shard: Shard,
    weights: &[f64],
) -> (tempfile::TempDir, Sampler) {
    let dataset = raw_dataset(rows, chunk, false);
    let layout = DatasetLayout::discover(dataset.path(), DEFAULT_VIRTUAL_CHUNK_SIZE).unwrap();
    let sampler = Sampler::new(&layout, order, shard, Workers::single())
        .unwrap()
        .with_row_weights(Arc::new(RowWeights::new(weights).unwrap()))
        .unwrap();
    (dataset, sampler)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// An epoch draws as many rows as the subset has, each a row of the subset of
    /// positive weight; a fetch's rows lie in no more blocks than it has units, and
    /// each step's row count is known without drawing it.
    #[test]
    fn an_epoch_draws_its_rows_by_weight_in_blocks(
        (rows, w) in (1u64..700).prop_flat_map(|rows| (Just(rows), weights(rows))),
        order in block_orders(), epoch in 0u64..4, subset_seed in 0u64..4,
    ) {
        let chunks = ChunkLayout::new(rows, 64).unwrap();
        let weights = Arc::new(RowWeights::new(&w).unwrap());
        // Every other row, or all of them.
        let subset = match subset_seed {
            0 => RowSubset::from_rows((0..rows).filter(|r| r % 2 == 1)),
            _ => RowSubset::all(rows),
        };
        prop_assume!(weights.check_for(rows, &subset).is_ok());
        let plan = EpochPlan::over_weighted(chunks, Arc::new(subset.clone()), order, epoch, weights);
        let order = blocks_of(order);
        let drawn = drawn_rows(&plan);
        prop_assert_eq!(drawn.len() as u64, subset.len());
        prop_assert!(drawn.iter().all(|&r| subset.contains(r) && w[r as usize] > 0.0));
        let block = order.block_size.get();
        let per_fetch = (order.batch_size.get() * order.fetch_factor.get()).div_ceil(block);
        for step in 0..plan.step_count() {
            let Step::Draws { rows: step_rows } = plan.step(step) else {
                panic!("a weighted order made {:?}", plan.step(step));
            };
            prop_assert!(step_rows.is_sorted());
            prop_assert_eq!(step_rows.len() as u64, plan.row_count(step));
            let blocks: BTreeSet<u64> = step_rows.iter().map(|&r| subset.position_of(r) / block).collect();
            prop_assert!(blocks.len() as u64 <= per_fetch, "{} blocks", blocks.len());
            // Announced as its distinct rows, once each.
            let announced = announced_rows(&plan, step);
            prop_assert_eq!(announced, step_rows.iter().copied().collect::<BTreeSet<_>>().into_iter().collect::<Vec<_>>());
        }
        // Seeded: the same plan again.
        let again = EpochPlan::over_weighted(chunks, Arc::new(subset), Order::Blocks(order), epoch, plan_weights(&w));
        prop_assert_eq!(&plan, &again);
    }

    /// A window order's epoch draws, for each unit, as many rows as the drawn chunk
    /// holds of the subset, each of positive weight and in that chunk: a window's rows lie
    /// in the chunks it announces (each once), no more than the order's chunks per window.
    #[test]
    fn a_window_epoch_draws_its_rows_by_weight_in_chunks(
        (rows, w) in (1u64..700).prop_flat_map(|rows| (Just(rows), weights(rows))),
        order in window_orders(), epoch in 0u64..4, chunk_size in 1u64..90,
    ) {
        prop_assume!(w.iter().any(|&x| x > 0.0));
        let chunks = ChunkLayout::new(rows, chunk_size).unwrap();
        let plan = EpochPlan::over_weighted(chunks, Arc::new(RowSubset::all(rows)), order, epoch, plan_weights(&w));
        let Order::ChunkWindows(windows) = order else { unreachable!("window_orders() makes window orders") };
        for step in 0..plan.step_count() {
            let Step::Window { chunks: announced } = plan.step(step) else {
                panic!("a window order made {:?}", plan.step(step));
            };
            prop_assert!(announced.len() as u32 <= windows.chunks_per_window.get());
            prop_assert_eq!(announced.iter().collect::<BTreeSet<_>>().len(), announced.len());
            let step_rows = plan.rows_of(step);
            prop_assert_eq!(step_rows.len() as u64, plan.row_count(step));
            prop_assert!(step_rows.iter().all(|&r| w[r as usize] > 0.0
                && announced.contains(&((r / chunk_size) as u32))));
        }
    }

    /// Ranks' shares are the epoch's steps dealt out whole: together exactly the
    /// epoch's draws (uneven shares), and a resumed share the rest of the uninterrupted one.
    #[test]
    fn ranks_share_and_resume_the_draws(
        (rows, w) in (1u64..500).prop_flat_map(|rows| (Just(rows), weights(rows))),
        order in orders(), epoch in 0u64..3, world in 1u32..4, cut in 0.0f64..1.0,
    ) {
        prop_assume!(w.iter().any(|&x| x > 0.0));
        let chunks = ChunkLayout::new(rows, 32).unwrap();
        let plan = EpochPlan::over_weighted(chunks, Arc::new(RowSubset::all(rows)), order, epoch, plan_weights(&w));
        let mut together = Vec::new();
        for rank in 0..world {
            let shard = Shard::new(rank, nonzero(world), EvenShares::Uneven).unwrap();
            let (_dataset, mut sampler) = weighted_sampler(rows, 32, order, shard, &w);
            let share: Vec<u64> = sampler.epoch(epoch).collect();
            prop_assert_eq!(
                share.len() as u64,
                worker_share(&plan, &shard, &Workers::single()).iter().map(|s| s.rows).sum::<u64>()
            );
            let done = (share.len() as f64 * cut) as u64;
            let mut cursor = sampler.resume_epoch(epoch, done).unwrap();
            let mut rest = Vec::new();
            while let Some(batch) = sampler.next_minibatch(&mut cursor) {
                rest.extend(batch);
            }
            prop_assert_eq!(&rest[..], &share[done as usize..]);
            together.extend(share);
        }
        prop_assert_eq!(multiset(together), multiset(drawn_rows(&plan)));
    }
}

fn plan_weights(w: &[f64]) -> Arc<RowWeights> {
    Arc::new(RowWeights::new(w).unwrap())
}

/// The rows a step's hint lines name, in order.
fn announced_rows(plan: &EpochPlan, step: usize) -> Vec<u64> {
    plan.step(step)
        .hint_lines()
        .into_iter()
        .flat_map(|line| match line {
            HintLine::Rows { ranges } | HintLine::RowsPart { ranges } => ranges,
            other => panic!("{other:?}"),
        })
        .flatten()
        .collect()
}

#[test]
fn a_rare_class_is_drawn_as_often_as_a_common_one() {
    // 95 % of the rows in class 0, in long runs as cell types lie in an atlas, 5 % in
    // class 1; blocks of 16, or windows of 2 chunks of 1,024, 40,000 draws over four epochs.
    let rows = 10_000u64;
    let labels: Vec<u64> = (0..rows).map(|r| u64::from(r % 1000 >= 950)).collect();
    let weights = Arc::new(RowWeights::class_balanced(&labels));
    let chunks = ChunkLayout::new(rows, 1024).unwrap();
    for order in [block_order(3, 16, 64, 16), window_order(3, 2)] {
        let mut per_class = [0u64; 2];
        for epoch in 0..4 {
            let all = Arc::new(RowSubset::all(rows));
            let plan = EpochPlan::over_weighted(chunks, all, order, epoch, weights.clone());
            for row in drawn_rows(&plan) {
                per_class[labels[row as usize] as usize] += 1;
            }
        }
        let rare_share = per_class[1] as f64 / (per_class[0] + per_class[1]) as f64;
        assert!(
            (0.45..0.55).contains(&rare_share),
            "{order:?}: {per_class:?}"
        );
    }
}

#[test]
fn weights_that_cannot_drive_an_order_are_refused() {
    assert!(matches!(
        RowWeights::new(&[1.0, f64::NAN]),
        Err(WeightsError::Invalid { row: 1, .. })
    ));
    assert!(matches!(
        RowWeights::new(&[-1.0]),
        Err(WeightsError::Invalid { row: 0, .. })
    ));
    let dataset = raw_dataset(10, 5, false);
    let layout = DatasetLayout::discover(dataset.path(), DEFAULT_VIRTUAL_CHUNK_SIZE).unwrap();
    let sampler = |order| Sampler::new(&layout, order, Shard::single(), Workers::single()).unwrap();
    let weights = |w: &[f64]| Arc::new(RowWeights::new(w).unwrap());
    let blocks = block_order(1, 2, 2, 1);
    assert_eq!(
        sampler(blocks).with_row_weights(weights(&[1.0; 9])).err(),
        Some(WeightsError::Count { given: 9, rows: 10 })
    );
    let mut w = [0.0; 10];
    w[7] = 1.0;
    let weighted = sampler(blocks).with_row_weights(weights(&w)).unwrap();
    assert!(matches!(
        weighted.restricted_to(Arc::new(RowSubset::from_rows(0..5))),
        Err(RestrictError::Weights(WeightsError::Nothing))
    ));
}

#[test]
fn only_rows_of_positive_weight_are_drawn() {
    let mut w = vec![0.0; 300];
    for row in [5, 6, 150, 299] {
        w[row] = 1.0;
    }
    let (_dataset, mut sampler) =
        weighted_sampler(300, 100, block_order(2, 8, 16, 4), Shard::single(), &w);
    let drawn: BTreeSet<u64> = sampler.epoch(0).collect();
    assert!(
        drawn.is_subset(&BTreeSet::from([5, 6, 150, 299])),
        "{drawn:?}"
    );
    assert!(drawn.len() >= 3, "{drawn:?}");
}
