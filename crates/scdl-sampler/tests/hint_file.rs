//! Specification of the hints a sampler writes: the greeting, `plan <epoch>` at each
//! epoch start, then this worker's steps, never more than the lookahead ahead of the
//! reader. The hint file here is a regular file, read back and decoded as the daemon
//! decodes it.

mod common;

use std::fs;
use std::num::NonZeroUsize;
use std::os::unix::fs::symlink;

use common::*;
use proptest::prelude::*;
use scdl_format::hint::{HintLine, GREETING, HINT_FILE, VERSION};
use scdl_sampler::{
    worker_share, DatasetLayout, EpochPlan, EvenShares, HintWriteError, Order, Sampler, Shard,
    Workers, DEFAULT_VIRTUAL_CHUNK_SIZE,
};

/// The lines every handle opens with: the greeting and the chunk rows assumed.
fn opening(chunk_rows: u64) -> Vec<HintLine> {
    vec![
        HintLine::Greeting { version: VERSION },
        HintLine::ChunkRows { rows: chunk_rows },
    ]
}

fn sampler_of(dir: &std::path::Path, order: Order, shard: Shard, workers: Workers) -> Sampler {
    let layout = DatasetLayout::discover(dir, DEFAULT_VIRTUAL_CHUNK_SIZE).unwrap();
    Sampler::new(&layout, order, shard, workers).unwrap()
}

/// The hint lines of one worker's steps of one epoch, in order.
fn share_lines(plan: &EpochPlan, shard: &Shard, workers: &Workers) -> Vec<HintLine> {
    worker_share(plan, shard, workers)
        .iter()
        .flat_map(|s| plan.step(s.step).hint_lines())
        .collect()
}

/// The lines without the reader's position (`reading`), which the sampler says at
/// every step it enters.
fn without_positions(lines: Vec<HintLine>) -> Vec<HintLine> {
    lines
        .into_iter()
        .filter(|l| !matches!(l, HintLine::Reading { .. }))
        .collect()
}

/// The steps the `reading` lines name, in order.
fn positions(lines: &[HintLine]) -> Vec<u64> {
    lines
        .iter()
        .filter_map(|l| match l {
            HintLine::Reading { step } => Some(*step),
            _ => None,
        })
        .collect()
}

/// How many steps the lines after the last `plan` announce.
fn steps_in_current_plan(lines: &[HintLine]) -> usize {
    let plan_at = lines
        .iter()
        .rposition(|l| matches!(l, HintLine::Plan { .. }))
        .unwrap();
    without_positions(lines[plan_at + 1..].to_vec()).len()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A whole epoch announces exactly the worker's steps, in the order it reads them.
    #[test]
    fn an_epoch_announces_the_workers_steps_in_order(
        rows in 0u64..600, chunk_size in 1u32..50, order in orders(), epoch in 0u64..3,
        world_size in 1u32..4, num_workers in 1u32..3,
    ) {
        let dataset = raw_dataset(rows, chunk_size, true);
        let shard = Shard::new(world_size - 1, nonzero(world_size), EvenShares::Uneven).unwrap();
        let workers = Workers::new(num_workers - 1, nonzero(num_workers)).unwrap();
        let mut sampler = sampler_of(dataset.path(), order, shard, workers);
        prop_assert!(sampler.hints_active());
        let visited = sampler.epoch(epoch).count();
        sampler.flush_hints();

        let plan = EpochPlan::new(scdl_sampler::ChunkLayout::new(rows, chunk_size as u64).unwrap(), order, epoch);
        let mut expected = opening(chunk_size as u64);
        expected.push(HintLine::Plan { epoch });
        let share = share_lines(&plan, &shard, &workers);
        let steps = share.len() as u64;
        expected.extend(share);
        let lines = hint_lines(dataset.path());
        prop_assert_eq!(without_positions(lines.clone()), expected);
        // Each step after the first is said as it is entered, in order.
        prop_assert_eq!(positions(&lines), (1..steps).collect::<Vec<_>>());
        prop_assert!(sampler.take_hint_error().is_none());
        prop_assert_eq!(visited as u64, worker_share(&plan, &shard, &workers).iter().map(|s| s.rows).sum::<u64>());
    }

    /// While step `i` of the share is being read, more than `i + lookahead / 2` and at
    /// most `i + lookahead` steps have been announced: topped up in batches, never
    /// further than the lookahead.
    #[test]
    fn announcements_stay_a_bounded_lookahead_ahead_of_the_reader(
        chunks_total in 1u32..40, lookahead in 1usize..6,
    ) {
        let chunk_size = 3;
        let dataset = raw_dataset(chunks_total as u64 * chunk_size as u64, chunk_size, true);
        let mut sampler = sampler_of(dataset.path(), window_order(9, 1), Shard::single(), Workers::single())
            .with_hint_lookahead(NonZeroUsize::new(lookahead).unwrap());
        let steps = chunks_total as usize;
        let mut iter = sampler.epoch(0);
        iter.flush_hints();
        prop_assert_eq!(steps_in_current_plan(&hint_lines(dataset.path())), lookahead.min(steps));
        let mut read = 0;
        while iter.next().is_some() {
            let reading = read / chunk_size as usize;
            read += 1;
            iter.flush_hints();
            let announced = steps_in_current_plan(&hint_lines(dataset.path()));
            prop_assert!(announced <= (reading + lookahead).min(steps), "{} announced", announced);
            prop_assert!(announced > (reading + lookahead / 2).min(steps - 1), "{} announced", announced);
        }
    }
}

#[test]
fn block_order_announces_each_fetch_as_one_line_of_sorted_blocks() {
    let dataset = raw_dataset(1000, 100, true);
    let order = block_order(5, 10, 16, 2); // 4 blocks per fetch
    let mut sampler = sampler_of(dataset.path(), order, Shard::single(), Workers::single())
        .with_hint_lookahead(NonZeroUsize::new(2).unwrap());
    let mut iter = sampler.epoch(0);
    iter.next();
    iter.flush_hints();
    let lines = hint_lines(dataset.path());
    assert_eq!(lines[..2], opening(100));
    assert_eq!(lines[2], HintLine::Plan { epoch: 0 });
    assert_eq!(lines.len(), 3 + 2, "one rows line per fetch");
    for line in &lines[3..] {
        let HintLine::Rows { ranges } = line else {
            panic!("{line:?}");
        };
        assert_eq!(ranges.len(), 4);
        assert!(ranges.iter().all(|r| r.end - r.start == 10));
        assert!(ranges.is_sorted_by_key(|r| r.start), "{ranges:?}");
    }
}

#[test]
fn every_epoch_starts_a_new_plan_on_the_same_handle() {
    let dataset = raw_dataset(200, 10, true);
    let order = window_order(1, 4);
    let mut sampler = sampler_of(dataset.path(), order, Shard::single(), Workers::single());
    sampler.epoch(0).for_each(drop);
    let mut abandoned = sampler.epoch(1);
    abandoned.next();
    drop(abandoned);
    sampler.epoch(2).for_each(drop);
    sampler.flush_hints();

    let chunks = scdl_sampler::ChunkLayout::new(200, 10).unwrap();
    let steps = |epoch| {
        share_lines(
            &EpochPlan::new(chunks, order, epoch),
            &Shard::single(),
            &Workers::single(),
        )
    };
    let mut expected = opening(10);
    expected.push(HintLine::Plan { epoch: 0 });
    expected.extend(steps(0));
    expected.push(HintLine::Plan { epoch: 1 });
    expected.extend(steps(1)); // 5 windows, all within the default lookahead of 8
    expected.push(HintLine::Plan { epoch: 2 });
    expected.extend(steps(2));
    assert_eq!(without_positions(hint_lines(dataset.path())), expected);
    assert_eq!(
        fs::read_to_string(dataset.path().join(HINT_FILE))
            .unwrap()
            .lines()
            .next(),
        Some(format!("{GREETING} {VERSION}").as_str())
    );
}

#[test]
fn without_a_hint_file_rows_are_the_same_and_nothing_is_written() {
    let order = block_order(4, 3, 5, 2);
    let with = raw_dataset(300, 30, true);
    let without = raw_dataset(300, 30, false);
    let mut hinted = sampler_of(with.path(), order, Shard::single(), Workers::single());
    let mut silent = sampler_of(without.path(), order, Shard::single(), Workers::single());
    assert!(!silent.hints_active());
    assert_eq!(
        hinted.epoch(3).collect::<Vec<_>>(),
        silent.epoch(3).collect::<Vec<_>>()
    );
    assert!(silent.take_hint_error().is_none());
    assert!(!without.path().join(HINT_FILE).exists());
}

#[test]
fn a_sampler_told_not_to_hint_writes_nothing_and_yields_the_same_rows() {
    let order = window_order(5, 3);
    let hinted_dir = raw_dataset(300, 30, true);
    let silent_dir = raw_dataset(300, 30, true);
    let layout = DatasetLayout::discover(silent_dir.path(), DEFAULT_VIRTUAL_CHUNK_SIZE).unwrap();
    let mut hinted = sampler_of(hinted_dir.path(), order, Shard::single(), Workers::single());
    let mut silent =
        Sampler::without_hints(&layout, order, Shard::single(), Workers::single()).unwrap();
    assert!(hinted.hints_active());
    assert!(!silent.hints_active());
    assert_eq!(
        hinted.epoch(2).collect::<Vec<_>>(),
        silent.epoch(2).collect::<Vec<_>>()
    );
    assert!(hint_lines(silent_dir.path()).is_empty());
    assert!(silent.take_hint_error().is_none());
}

/// A fetch of 4,096 single rows (batch 256 × fetch factor 16, blocks of one row) of a
/// 10^8-row dataset is about 80 KB of hint text, over the protocol's line limit: it is
/// announced in lines the daemon's decoder takes, and they join into the fetch.
#[test]
fn a_fetch_longer_than_a_line_is_announced_whole() {
    let dataset = raw_dataset(100_000_000, 4096, true);
    let order = block_order(3, 1, 256, 16);
    let lookahead = 3;
    let mut sampler = sampler_of(dataset.path(), order, Shard::single(), Workers::single())
        .with_hint_lookahead(NonZeroUsize::new(lookahead).unwrap());
    assert!(sampler.epoch(0).next().is_some());
    sampler.flush_hints();
    let mut steps = Vec::new();
    let mut begun = Vec::new();
    for line in hint_lines(dataset.path()) {
        match line {
            HintLine::RowsPart { ranges } => begun.extend(ranges),
            HintLine::Rows { ranges } => {
                begun.extend(ranges);
                steps.push(std::mem::take(&mut begun));
            }
            _ => {}
        }
    }
    let plan = EpochPlan::new(
        scdl_sampler::ChunkLayout::new(100_000_000, 4096).unwrap(),
        order,
        0,
    );
    let expected: Vec<_> = (0..lookahead).map(|i| plan.row_ranges(i)).collect();
    assert_eq!(steps, expected);
    assert!(steps.iter().all(|fetch| fetch.len() == 4096));
    assert!(sampler.take_hint_error().is_none());
}

#[test]
fn a_refused_write_is_reported_and_rows_still_come() {
    let dataset = raw_dataset(300, 30, false);
    symlink("/dev/full", dataset.path().join(HINT_FILE)).unwrap();
    let mut sampler = sampler_of(
        dataset.path(),
        window_order(0, 2),
        Shard::single(),
        Workers::single(),
    );
    assert_eq!(sampler.epoch(0).count(), 300);
    let pending = sampler.pending_hint_error().expect("the failure is seen");
    assert!(pending.contains(HINT_FILE), "{pending}");
    assert_eq!(
        sampler.pending_hint_error(),
        Some(pending),
        "seeing a failure leaves it to be taken"
    );
    let err = sampler
        .take_hint_error()
        .expect("the write failure is kept");
    assert!(matches!(err, HintWriteError::Write { .. }));
    assert!(err.to_string().contains(HINT_FILE), "{err}");
    assert!(
        sampler.take_hint_error().is_none(),
        "a failure is reported once"
    );
    assert_eq!(sampler.pending_hint_error(), None);
    assert!(
        !sampler.hints_active(),
        "a handle that could not greet stays silent"
    );
}

#[test]
fn a_hint_file_that_cannot_be_opened_is_reported_and_rows_still_come() {
    let dataset = raw_dataset(300, 30, false);
    fs::create_dir(dataset.path().join(HINT_FILE)).unwrap();
    let mut sampler = sampler_of(
        dataset.path(),
        window_order(0, 2),
        Shard::single(),
        Workers::single(),
    );
    assert!(!sampler.hints_active());
    assert!(matches!(
        sampler.take_hint_error(),
        Some(HintWriteError::Open { .. })
    ));
    assert_eq!(sampler.epoch(0).count(), 300);
}
