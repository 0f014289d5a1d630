//! Specification of the two orders: what an epoch plan contains, whatever the dataset.

mod common;

use std::num::NonZeroU32;

use common::*;
use proptest::prelude::*;
use scdl_format::hint::HintLine;
use scdl_sampler::{ChunkLayout, ChunkWindowOrder, EpochPlan, Order, Step};

/// Every row of the plan, step after step, in visiting order.
fn all_rows(plan: &EpochPlan) -> Vec<u64> {
    (0..plan.step_count())
        .flat_map(|i| plan.rows_of(i))
        .collect()
}

fn window_chunks(step: &Step) -> &[u32] {
    match step {
        Step::Window { chunks } => chunks,
        Step::Fetch { .. } | Step::Draws { .. } => panic!("a window order made a fetch"),
    }
}

fn fetch_blocks(step: &Step) -> &[std::ops::Range<u64>] {
    match step {
        Step::Fetch { blocks } => blocks,
        Step::Window { .. } | Step::Draws { .. } => panic!("a block order made a window or draws"),
    }
}

proptest! {
    #[test]
    fn an_epoch_visits_every_row_exactly_once(
        chunks in chunk_layouts(), order in orders(), epoch in 0u64..5,
    ) {
        let mut rows = all_rows(&EpochPlan::new(chunks, order, epoch));
        rows.sort_unstable();
        prop_assert_eq!(rows, (0..chunks.total_rows()).collect::<Vec<_>>());
    }

    #[test]
    fn a_step_lists_as_many_rows_as_it_counts(
        chunks in chunk_layouts(), order in orders(),
    ) {
        let plan = EpochPlan::new(chunks, order, 0);
        for i in 0..plan.step_count() {
            prop_assert!(plan.row_count(i) > 0);
            prop_assert_eq!(plan.rows_of(i).len() as u64, plan.row_count(i));
        }
    }

    #[test]
    fn the_plan_is_a_function_of_seed_and_epoch(
        chunks in chunk_layouts(), order in orders(), epoch in any::<u64>(),
    ) {
        let (a, b) = (EpochPlan::new(chunks, order, epoch), EpochPlan::new(chunks, order, epoch));
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(all_rows(&a), all_rows(&b));
    }

    /// Randomness comes from the shuffles, so a step whose at least 20 rows are
    /// shuffled makes two epochs coincide with odds below 1 in 20!: any coincidence
    /// is a bug.
    #[test]
    fn consecutive_epochs_differ(
        (chunks, order) in (20u64..200, orders())
            .prop_filter("some step shuffles at least 20 rows", |(chunk_size, order)| {
                match order {
                    Order::ChunkWindows(w) => w.shuffle_within_window && *chunk_size >= 20,
                    Order::Blocks(b) => b.batch_size.get() * b.fetch_factor.get() >= 20,
                }
            })
            .prop_flat_map(|(chunk_size, order)| (chunk_size..1500, Just(chunk_size), Just(order)))
            .prop_map(|(rows, chunk_size, order)| (ChunkLayout::new(rows, chunk_size).unwrap(), order)),
        epoch in 0u64..1000,
    ) {
        prop_assert_ne!(
            all_rows(&EpochPlan::new(chunks, order, epoch)),
            all_rows(&EpochPlan::new(chunks, order, epoch + 1))
        );
    }

    #[test]
    fn the_step_count_is_known_before_the_plan(
        chunks in chunk_layouts(), order in orders(), epoch in 0u64..5,
    ) {
        prop_assert_eq!(
            order.step_count(&chunks),
            EpochPlan::new(chunks, order, epoch).step_count()
        );
    }

    #[test]
    fn a_window_holds_chunks_per_window_chunks_and_only_their_rows(
        chunks in chunk_layouts(), order in window_orders(), epoch in 0u64..5,
    ) {
        let Order::ChunkWindows(o) = order else { unreachable!() };
        let plan = EpochPlan::new(chunks, order, epoch);
        let steps: Vec<Step> = plan.steps().collect();
        for (i, step) in steps.iter().enumerate() {
            let ids = window_chunks(step);
            let per_window = o.chunks_per_window.get() as usize;
            if i + 1 < steps.len() {
                prop_assert_eq!(ids.len(), per_window);
            } else {
                prop_assert!((1..=per_window).contains(&ids.len()));
            }
            for row in plan.rows_of(i) {
                let chunk = (row / chunks.chunk_size()) as u32;
                prop_assert!(ids.contains(&chunk), "row {} outside window {:?}", row, ids);
            }
        }
    }

    #[test]
    fn a_fetch_reads_whole_blocks_in_ascending_order(
        chunks in chunk_layouts(), order in block_orders(), epoch in 0u64..5,
    ) {
        let Order::Blocks(o) = order else { unreachable!() };
        let (block, batch, factor) = (o.block_size.get(), o.batch_size.get(), o.fetch_factor.get());
        let per_fetch = (batch * factor).div_ceil(block) as usize;
        let plan = EpochPlan::new(chunks, order, epoch);
        let steps: Vec<Step> = plan.steps().collect();
        for (i, step) in steps.iter().enumerate() {
            let blocks = fetch_blocks(step);
            if i + 1 < steps.len() {
                prop_assert_eq!(blocks.len(), per_fetch);
            } else {
                prop_assert!((1..=per_fetch).contains(&blocks.len()));
            }
            prop_assert!(blocks.windows(2).all(|w| w[0].end <= w[1].start), "{:?}", blocks);
            for b in blocks {
                prop_assert_eq!(b.start % block, 0);
                prop_assert_eq!(b.end, (b.start + block).min(chunks.total_rows()));
            }
            let mut rows = plan.rows_of(i);
            rows.sort_unstable();
            let expected: Vec<u64> = blocks.iter().cloned().flatten().collect();
            prop_assert_eq!(rows, expected);
        }
    }

    #[test]
    fn a_step_is_announced_by_its_chunks_or_blocks(
        chunks in chunk_layouts(), order in orders(),
    ) {
        let plan = EpochPlan::new(chunks, order, 0);
        for step in plan.steps() {
            let expected = match &step {
                Step::Window { chunks } => vec![HintLine::Window { chunks: chunks.clone() }],
                Step::Fetch { blocks } => vec![HintLine::Rows { ranges: blocks.clone() }],
                Step::Draws { .. } => unreachable!("an unweighted order draws nothing"),
            };
            prop_assert_eq!(step.hint_lines(), expected);
        }
    }
}

fn unshuffled(shuffle_chunks: bool, shuffle_within_window: bool) -> Order {
    Order::ChunkWindows(ChunkWindowOrder {
        seed: 7,
        chunks_per_window: NonZeroU32::new(3).unwrap(),
        shuffle_chunks,
        shuffle_within_window,
    })
}

#[test]
fn without_shuffling_windows_read_the_dataset_front_to_back() {
    let chunks = ChunkLayout::new(1000, 64).unwrap();
    let plan = EpochPlan::new(chunks, unshuffled(false, false), 3);
    assert_eq!(window_chunks(&plan.step(0)), [0, 1, 2]);
    assert_eq!(window_chunks(&plan.step(5)), [15]);
    assert_eq!(all_rows(&plan), (0..1000).collect::<Vec<_>>());
}

#[test]
fn shuffling_only_chunks_keeps_each_chunk_in_row_order() {
    let chunks = ChunkLayout::new(1000, 10).unwrap();
    let plan = EpochPlan::new(chunks, unshuffled(true, false), 0);
    let rows = all_rows(&plan);
    for chunk_rows in rows.chunks(10) {
        let first = chunk_rows[0];
        assert_eq!(first % 10, 0);
        assert_eq!(chunk_rows, (first..first + 10).collect::<Vec<_>>());
    }
    let visited: Vec<u64> = rows.chunks(10).map(|c| c[0] / 10).collect();
    assert_ne!(visited, (0..100).collect::<Vec<_>>());
    let next_epoch = all_rows(&EpochPlan::new(chunks, unshuffled(true, false), 1));
    assert_ne!(rows, next_epoch);
}

#[test]
fn different_seeds_give_different_orders() {
    let chunks = ChunkLayout::new(500, 50).unwrap();
    for order in [|s| window_order(s, 2), |s| block_order(s, 4, 8, 2)] {
        assert_ne!(
            all_rows(&EpochPlan::new(chunks, order(1), 0)),
            all_rows(&EpochPlan::new(chunks, order(2), 0))
        );
    }
}

#[test]
fn an_empty_dataset_has_no_steps() {
    let chunks = ChunkLayout::new(0, 16).unwrap();
    for order in [window_order(1, 2), block_order(1, 4, 8, 2)] {
        assert!(EpochPlan::new(chunks, order, 0).step_count() == 0);
        assert_eq!(order.step_count(&chunks), 0);
    }
}
