//! Specification of orders over part of a dataset (a split by chunk, or rows a caller
//! lists) and of resuming an epoch part-way: every row of the part once per epoch,
//! ranks' shares disjoint, splits disjoint and covering, and a resumed epoch yielding
//! exactly the rest of the uninterrupted one, with the hints restarting where it
//! resumed.

mod common;

use std::collections::BTreeSet;
use std::num::NonZeroUsize;
use std::sync::Arc;

use common::*;
use proptest::prelude::*;
use scdl_format::hint::HintLine;
use scdl_sampler::{
    worker_share, ChunkLayout, DatasetLayout, EpochPlan, EvenShares, Order, RestrictError,
    RowSubset, Sampler, Shard, Step, SubsetError, Workers, DEFAULT_VIRTUAL_CHUNK_SIZE,
};

/// Up to 12 row ranges within `rows` rows, in any order, possibly overlapping.
fn row_ranges(rows: u64) -> impl Strategy<Value = Vec<std::ops::Range<u64>>> {
    prop::collection::vec((0..rows.max(1), 0u64..40), 0..12).prop_map(move |v| {
        v.into_iter()
            .map(|(start, len)| start.min(rows)..(start + len).min(rows))
            .collect()
    })
}

fn all_rows(plan: &EpochPlan) -> Vec<u64> {
    (0..plan.step_count())
        .flat_map(|i| plan.rows_of(i))
        .collect()
}

fn share_rows(plan: &EpochPlan, shard: &Shard) -> Vec<u64> {
    worker_share(plan, shard, &Workers::single())
        .iter()
        .flat_map(|s| plan.rows_of(s.step).into_iter().take(s.rows as usize))
        .collect()
}

/// Fractions of a split into `parts` parts, each at least 1/(4 parts).
fn fractions(parts: usize) -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(1u32..4, parts).prop_map(|w| {
        let sum: u32 = w.iter().sum();
        w.iter().map(|&x| x as f64 / sum as f64).collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// A subset holds exactly the rows listed, and answers membership, intersections
    /// and positions as the set of them would.
    #[test]
    fn a_subset_is_the_set_of_its_rows(
        ranges in row_ranges(500), probe in 0u64..520, window in (0u64..520, 0u64..100),
    ) {
        let subset = RowSubset::from_ranges(ranges.clone());
        let model: BTreeSet<u64> = ranges.iter().flat_map(|r| r.clone()).collect();
        let listed: Vec<u64> = subset.ranges().iter().flat_map(|r| r.clone()).collect();
        prop_assert_eq!(&listed, &model.iter().copied().collect::<Vec<_>>());
        prop_assert_eq!(subset.len(), model.len() as u64);
        prop_assert_eq!(subset.contains(probe), model.contains(&probe));
        prop_assert_eq!(RowSubset::from_rows(model.iter().copied()), subset.clone());

        let (start, len) = window;
        let inside: Vec<u64> = subset.intersect(start..start + len).into_iter().flatten().collect();
        prop_assert_eq!(&inside, &model.range(start..start + len).copied().collect::<Vec<_>>());
        prop_assert_eq!(subset.meets(start..start + len), !inside.is_empty());
        let at: Vec<u64> = subset.rows_at(start..start + len).into_iter().flatten().collect();
        let expected: Vec<u64> = model.iter().copied().skip(start as usize).take(len as usize).collect();
        prop_assert_eq!(at, expected);
    }

    /// An epoch over a subset visits each of its rows exactly once, and nothing else.
    #[test]
    fn an_epoch_over_a_subset_visits_each_of_its_rows_once(
        chunks in chunk_layouts(), order in orders(), epoch in 0u64..4, ranges in row_ranges(900),
    ) {
        let subset = RowSubset::from_ranges(ranges.into_iter().map(|r| r.start.min(chunks.total_rows())..r.end.min(chunks.total_rows())));
        let plan = EpochPlan::over(chunks, Arc::new(subset.clone()), order, epoch);
        let mut rows = all_rows(&plan);
        rows.sort_unstable();
        prop_assert_eq!(rows, subset.ranges().iter().flat_map(|r| r.clone()).collect::<Vec<_>>());
        prop_assert_eq!(plan.step_count(), order.step_count_over(&chunks, &subset));
        for i in 0..plan.step_count() {
            prop_assert!(plan.row_count(i) > 0, "step {} of the plan has no row of the subset", i);
        }
    }

    /// Over the whole dataset, a plan is the plan of `EpochPlan::new`.
    #[test]
    fn the_whole_dataset_as_a_subset_changes_nothing(
        chunks in chunk_layouts(), order in orders(), epoch in 0u64..4,
    ) {
        let all = Arc::new(RowSubset::all(chunks.total_rows()));
        prop_assert_eq!(EpochPlan::over(chunks, all, order, epoch), EpochPlan::new(chunks, order, epoch));
    }

    /// The ranks' shares of a subset are disjoint; dealt unevened, they cover it.
    #[test]
    fn ranks_share_a_subset_without_overlap(
        chunks in chunk_layouts(), order in orders(), epoch in 0u64..3, world_size in 1u32..5,
        ranges in row_ranges(900),
        even in prop_oneof![Just(EvenShares::Uneven), Just(EvenShares::Pad), Just(EvenShares::Drop)],
    ) {
        let total = chunks.total_rows();
        let subset = RowSubset::from_ranges(ranges.into_iter().map(|r| r.start.min(total)..r.end.min(total)));
        let steps = order.step_count_over(&chunks, &subset);
        prop_assume!(even == EvenShares::Uneven || steps >= world_size as usize);
        let plan = EpochPlan::over(chunks, Arc::new(subset.clone()), order, epoch);
        let shares: Vec<BTreeSet<u64>> = (0..world_size)
            .map(|r| share_rows(&plan, &Shard::new(r, nonzero(world_size), even).unwrap()).into_iter().collect())
            .collect();
        for (i, a) in shares.iter().enumerate() {
            for b in &shares[i + 1..] {
                prop_assert!(a.is_disjoint(b));
            }
        }
        let union: BTreeSet<u64> = shares.iter().flatten().copied().collect();
        prop_assert!(union.iter().all(|&r| subset.contains(r)));
        if even != EvenShares::Drop {
            prop_assert_eq!(union.len() as u64, subset.len());
        }
    }

    /// A split by chunk: parts made of whole chunks, disjoint, together every row, and
    /// the same split for the same seed.
    #[test]
    fn a_split_by_chunk_is_disjoint_covering_and_whole_chunks(
        rows in 1u64..3000, chunk_size in 1u64..200, fractions in (1usize..4).prop_flat_map(fractions),
        seed in any::<u64>(),
    ) {
        let chunks = ChunkLayout::new(rows, chunk_size).unwrap();
        let parts = match RowSubset::split_by_chunk(&chunks, &fractions, seed) {
            Ok(parts) => parts,
            Err(SubsetError::EmptyPart { .. }) => {
                // Only when a part's fraction is less than one chunk.
                prop_assert!((chunks.num_chunks() as usize) < 4 * fractions.len());
                return Ok(());
            }
            Err(e) => return Err(TestCaseError::fail(e.to_string())),
        };
        prop_assert_eq!(parts.len(), fractions.len());
        prop_assert_eq!(parts.iter().map(|p| p.len()).sum::<u64>(), rows);
        let union = RowSubset::from_ranges(parts.iter().flat_map(|p| p.ranges().to_vec()));
        prop_assert_eq!(union, RowSubset::all(rows));
        for part in &parts {
            for chunk in 0..chunks.num_chunks() {
                let held = part.intersect(chunks.chunk_rows(chunk));
                prop_assert!(held.is_empty() || held == vec![chunks.chunk_rows(chunk)], "chunk {} cut by the split", chunk);
            }
        }
        // Each part holds its fraction of the chunks, to the nearest chunk.
        for (part, fraction) in parts.iter().zip(&fractions) {
            let held = (0..chunks.num_chunks()).filter(|&c| part.meets(chunks.chunk_rows(c))).count() as f64;
            prop_assert!((held - fraction * chunks.num_chunks() as f64).abs() <= 1.0 + 1e-9);
        }
        prop_assert_eq!(RowSubset::split_by_chunk(&chunks, &fractions, seed).unwrap(), parts);
    }

    /// Resuming after any number of rows yields the rest of the uninterrupted epoch,
    /// minibatch boundaries included, on a rank's share of a subset.
    #[test]
    fn a_resumed_epoch_is_the_rest_of_the_uninterrupted_one(
        rows in 0u64..800, chunk_size in 1u32..100, order in orders(), epoch in 0u64..3,
        world_size in 1u32..4, cut in any::<prop::sample::Index>(), ranges in row_ranges(800),
    ) {
        let dataset = raw_dataset(rows, chunk_size, false);
        let layout = DatasetLayout::discover(dataset.path(), DEFAULT_VIRTUAL_CHUNK_SIZE).unwrap();
        let subset = Arc::new(RowSubset::from_ranges(ranges.into_iter().map(|r| r.start.min(rows)..r.end.min(rows))));
        let shard = Shard::new(world_size - 1, nonzero(world_size), EvenShares::Uneven).unwrap();
        let make = || Sampler::without_hints(&layout, order, shard, Workers::single()).unwrap()
            .restricted_to(subset.clone()).unwrap();
        let (mut whole, mut resumed) = (make(), make());

        let mut cursor = whole.start_epoch(epoch);
        let minibatches: Vec<Vec<u64>> = std::iter::from_fn(|| whole.next_minibatch(&mut cursor)).collect();
        let all: Vec<u64> = minibatches.concat();
        let rows_done = cut.index(all.len() + 1) as u64;

        let mut cursor = resumed.resume_epoch(epoch, rows_done).unwrap();
        prop_assert_eq!(cursor.rows_done(), rows_done);
        let rest: Vec<Vec<u64>> = std::iter::from_fn(|| resumed.next_minibatch(&mut cursor)).collect();
        prop_assert_eq!(&rest.concat()[..], &all[rows_done as usize..]);
        // The cut's minibatch goes on from the cut; the later ones are the uninterrupted ones.
        let (mut whole_minibatches, mut boundary) = (0, 0);
        while whole_minibatches < minibatches.len() && boundary + minibatches[whole_minibatches].len() as u64 <= rows_done {
            boundary += minibatches[whole_minibatches].len() as u64;
            whole_minibatches += 1;
        }
        let mut expected: Vec<Vec<u64>> = minibatches[whole_minibatches..].to_vec();
        if let Some(cut_one) = expected.first_mut() {
            cut_one.drain(..(rows_done - boundary) as usize);
        }
        prop_assert_eq!(rest, expected);
        prop_assert!(resumed.resume_epoch(epoch, all.len() as u64 + 1).is_none());
    }

    /// A resumed epoch tells the daemon the plan again and announces the steps from the
    /// one holding the next row, not the steps already read.
    #[test]
    fn a_resumed_epoch_announces_from_the_step_it_resumes_in(
        rows in 1u64..800, chunk_size in 1u32..60, order in orders(), epoch in 0u64..3,
        cut in any::<prop::sample::Index>(), lookahead in 1usize..6,
    ) {
        let dataset = raw_dataset(rows, chunk_size, true);
        let layout = DatasetLayout::discover(dataset.path(), DEFAULT_VIRTUAL_CHUNK_SIZE).unwrap();
        let mut sampler = Sampler::new(&layout, order, Shard::single(), Workers::single()).unwrap()
            .with_hint_lookahead(NonZeroUsize::new(lookahead).unwrap());
        let rows_done = cut.index(rows as usize) as u64;
        let _cursor = sampler.resume_epoch(epoch, rows_done).unwrap();
        sampler.flush_hints();

        let plan = EpochPlan::new(layout.chunks, order, epoch);
        let share = worker_share(&plan, &Shard::single(), &Workers::single());
        let mut before = 0;
        let current = share.iter().position(|s| { before += s.rows; before > rows_done }).unwrap();
        let lines = hint_lines(dataset.path());
        let plan_at = lines.iter().rposition(|l| matches!(l, HintLine::Plan { .. })).unwrap();
        prop_assert_eq!(&lines[plan_at], &HintLine::Plan { epoch });
        let expected: Vec<HintLine> = share[current..(current + lookahead).min(share.len())]
            .iter()
            .flat_map(|s| plan.step(s.step).hint_lines())
            .collect();
        prop_assert_eq!(&lines[plan_at + 1..], &expected[..]);
    }
}

#[test]
fn windows_over_a_subset_hold_only_the_chunks_it_meets() {
    let chunks = ChunkLayout::new(100, 10).unwrap();
    // Rows in chunks 1, 4 (two ranges) and 9.
    let subset = RowSubset::from_ranges([12..14, 41..42, 45..50, 99..100]);
    let plan = EpochPlan::over(chunks, Arc::new(subset), window_order(5, 2), 0);
    let mut held: Vec<u32> = plan
        .steps()
        .flat_map(|s| match s {
            Step::Window { chunks } => chunks,
            Step::Fetch { .. } | Step::Draws { .. } => unreachable!(),
        })
        .collect();
    held.sort_unstable();
    assert_eq!(held, vec![1, 4, 9]);
    assert_eq!(plan.step_count(), 2);
}

#[test]
fn rows_out_of_range_and_bad_splits_are_refused() {
    let dataset = raw_dataset(100, 10, false);
    let layout = DatasetLayout::discover(dataset.path(), DEFAULT_VIRTUAL_CHUNK_SIZE).unwrap();
    let sampler = |order: Order| {
        Sampler::without_hints(&layout, order, Shard::single(), Workers::single()).unwrap()
    };
    let err = sampler(window_order(0, 1))
        .restricted_to(Arc::new(RowSubset::from_rows([3, 100])))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "row 100 is out of range: the dataset has 100 rows"
    );
    let two_ranks = Shard::new(0, nonzero(2), EvenShares::Pad).unwrap();
    let one_chunk = Arc::new(RowSubset::from_rows(20..25));
    let err = Sampler::without_hints(&layout, window_order(0, 1), two_ranks, Workers::single())
        .unwrap()
        .restricted_to(one_chunk)
        .unwrap_err();
    assert!(matches!(err, RestrictError::Shard(_)), "{err}");

    let chunks = layout.chunks;
    assert_eq!(
        RowSubset::split_by_chunk(&chunks, &[0.5, 0.6], 0),
        Err(SubsetError::BadFractions {
            fractions: vec![0.5, 0.6]
        })
    );
    assert!(matches!(
        RowSubset::split_by_chunk(&chunks, &[0.99, 0.01], 0),
        Err(SubsetError::EmptyPart { part: 1, .. })
    ));
}
