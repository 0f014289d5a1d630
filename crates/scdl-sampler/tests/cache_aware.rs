//! Specification of the cache-aware order: the plain order's seeded permutation, with
//! the units the daemon announced it holds read first, and nothing else changed.

mod common;

use std::sync::Arc;

use common::*;
use proptest::prelude::*;
use scdl_format::hint::Announcement;
use scdl_sampler::{
    worker_share, CachedChunks, ChunkLayout, EpochPlan, EvenShares, Order, RowSubset, Shard, Step,
    Workers,
};

fn all_rows(plan: &EpochPlan) -> Vec<u64> {
    (0..plan.step_count())
        .flat_map(|i| plan.rows_of(i))
        .collect()
}

/// Any set of chunks of a dataset of `num_chunks` chunks (a few beyond it too: an
/// announcement of another dataset's chunks must not break anything).
fn cached_sets() -> impl Strategy<Value = CachedChunks> {
    prop::collection::vec((0u32..60, 0u32..12), 0..10).prop_map(|ranges| {
        CachedChunks::from_ranges(ranges.into_iter().map(|(start, len)| start..start + len))
    })
}

fn whole(chunks: ChunkLayout) -> Arc<RowSubset> {
    Arc::new(RowSubset::all(chunks.total_rows()))
}

fn cache_aware(chunks: ChunkLayout, order: Order, epoch: u64, cached: &CachedChunks) -> EpochPlan {
    EpochPlan::over_cache_aware(chunks, whole(chunks), order, epoch, cached)
}

fn row_is_held(chunks: ChunkLayout, cached: &CachedChunks, row: u64) -> bool {
    cached.holds((row / chunks.chunk_size()) as u32)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn every_row_appears_exactly_once_per_epoch_whatever_is_cached(
        chunks in chunk_layouts(), order in orders(), epoch in 0u64..5, cached in cached_sets(),
    ) {
        let plan = cache_aware(chunks, order, epoch, &cached);
        let mut rows = all_rows(&plan);
        rows.sort_unstable();
        prop_assert_eq!(rows, (0..chunks.total_rows()).collect::<Vec<_>>());
        prop_assert_eq!(plan.step_count(), order.step_count(&chunks));
    }

    #[test]
    fn over_a_subset_every_row_of_it_appears_exactly_once(
        chunks in chunk_layouts(), order in orders(), cached in cached_sets(),
        ranges in prop::collection::vec((0u64..1500, 0u64..60), 0..8),
    ) {
        let total = chunks.total_rows();
        let subset = RowSubset::from_ranges(ranges.into_iter().map(|(s, l)| s.min(total)..(s + l).min(total)));
        let plan = EpochPlan::over_cache_aware(chunks, Arc::new(subset.clone()), order, 1, &cached);
        let mut rows = all_rows(&plan);
        rows.sort_unstable();
        prop_assert_eq!(rows, subset.ranges().iter().flat_map(|r| r.clone()).collect::<Vec<_>>());
        prop_assert_eq!(plan.step_count(), order.step_count_over(&chunks, &subset));
    }

    /// Windows: the epoch's chunks, in visiting order, are the held ones then the
    /// others, every chunk of the plain order once. Each side has a seeded order of its
    /// own: keeping the plain order's relative order would take a walk of the whole
    /// epoch to find the held chunks' places in it.
    #[test]
    fn held_chunks_come_first_then_the_others(
        chunks in chunk_layouts(), order in window_orders(), epoch in 0u64..5, cached in cached_sets(),
    ) {
        let visited = |plan: &EpochPlan| -> Vec<u32> {
            plan.steps().flat_map(|s| match s {
                Step::Window { chunks } => chunks,
                Step::Fetch { .. } | Step::Draws { .. } => unreachable!(),
            }).collect()
        };
        let mut plain = visited(&EpochPlan::new(chunks, order, epoch));
        let aware = visited(&cache_aware(chunks, order, epoch, &cached));
        let held = aware.iter().take_while(|&&c| cached.holds(c)).count();
        prop_assert!(aware[held..].iter().all(|&c| !cached.holds(c)), "{:?}", aware);
        prop_assert_eq!(held, plain.iter().filter(|&&c| cached.holds(c)).count());
        let mut sorted = aware.clone();
        sorted.sort_unstable();
        plain.sort_unstable();
        prop_assert_eq!(sorted, plain);
    }

    /// Blocks: the fetches before the first one that reads a row outside the held
    /// chunks are at least as many as the held blocks fill.
    #[test]
    fn fetches_of_held_blocks_come_first(
        chunks in chunk_layouts(), order in block_orders(), epoch in 0u64..5, cached in cached_sets(),
    ) {
        let Order::Blocks(blocks) = order else { unreachable!() };
        let block_size = blocks.block_size.get();
        let per_fetch = (blocks.batch_size.get() * blocks.fetch_factor.get()).div_ceil(block_size);
        let held_blocks = (0..chunks.total_rows().div_ceil(block_size))
            .filter(|b| (b * block_size..((b + 1) * block_size).min(chunks.total_rows()))
                .all(|row| row_is_held(chunks, &cached, row)))
            .count() as u64;
        let plan = cache_aware(chunks, order, epoch, &cached);
        let leading_held = (0..plan.step_count())
            .take_while(|&i| plan.rows_of(i).iter().all(|&r| row_is_held(chunks, &cached, r)))
            .count() as u64;
        prop_assert!(leading_held >= held_blocks / per_fetch,
            "{} leading fetches of held rows, {} held blocks of {} per fetch", leading_held, held_blocks, per_fetch);
    }

    #[test]
    fn nothing_held_or_everything_held_is_the_plain_order(
        chunks in chunk_layouts(), order in orders(), epoch in 0u64..5,
    ) {
        let plain = EpochPlan::new(chunks, order, epoch);
        let everything = CachedChunks::from_ranges(std::iter::once(0..chunks.num_chunks()));
        prop_assert_eq!(&cache_aware(chunks, order, epoch, &CachedChunks::default()), &plain);
        prop_assert_eq!(&cache_aware(chunks, order, epoch, &everything), &plain);
    }

    /// Ranks and workers that each compute the plan from the same announcement share
    /// out the epoch: every row once, over all of them.
    #[test]
    fn ranks_given_the_same_announcement_read_every_row_once(
        chunks in chunk_layouts(), order in orders(), epoch in 0u64..4, cached in cached_sets(),
        world_size in 1u32..5, num_workers in 1u32..3,
    ) {
        let announced = Announcement::new(chunks.chunk_size(), cached.ranges().to_vec()).to_string();
        let mut rows = Vec::new();
        for rank in 0..world_size {
            let shard = Shard::new(rank, nonzero(world_size), EvenShares::Uneven).unwrap();
            for worker_id in 0..num_workers {
                // Each process parses the announcement and builds its plan on its own.
                let parsed = Announcement::parse(announced.as_bytes()).unwrap();
                let own = CachedChunks::announced(&parsed).unwrap();
                let plan = cache_aware(chunks, order, epoch, &own);
                let workers = Workers::new(worker_id, nonzero(num_workers)).unwrap();
                rows.extend(worker_share(&plan, &shard, &workers).iter()
                    .flat_map(|s| plan.rows_of(s.step).into_iter().take(s.rows as usize)));
            }
        }
        rows.sort_unstable();
        prop_assert_eq!(rows, (0..chunks.total_rows()).collect::<Vec<_>>());
    }
}

#[test]
fn a_sampler_is_plain_unless_asked_and_follows_the_set_it_is_given() {
    let dir = tempfile::tempdir().unwrap();
    write_header(dir.path(), &monolithic_header(4000));
    let layout =
        scdl_sampler::DatasetLayout::discover(dir.path(), std::num::NonZeroU64::new(100).unwrap())
            .unwrap();
    let order = window_order(9, 2);
    let sampler = || {
        scdl_sampler::Sampler::without_hints(&layout, order, Shard::single(), Workers::single())
            .unwrap()
    };
    let plain: Vec<u64> = sampler().epoch(3).collect();
    let mut plain_sampler = sampler();
    assert_eq!(plain_sampler.cache_aware_order(), None);
    assert_eq!(plain_sampler.epoch(3).collect::<Vec<_>>(), plain);

    let held = CachedChunks::from_ranges([5..9, 30..31]);
    let mut aware = sampler().with_cache_aware_order(held.clone());
    let rows: Vec<u64> = aware.epoch(3).collect();
    assert_ne!(rows, plain);
    // Five held chunks of 100 rows: two whole windows of two, then one shared with a
    // chunk not held.
    let is_held = |row: &&u64| held.holds((**row / 100) as u32);
    let (first, shared) = rows.split_at(400);
    assert!(
        first.iter().all(|r| is_held(&r)),
        "two windows of held chunks first"
    );
    assert_eq!(shared[..200].iter().filter(is_held).count(), 100);
    aware.set_cache_aware_order(None);
    assert_eq!(aware.epoch(3).collect::<Vec<_>>(), plain);
}
