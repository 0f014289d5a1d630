//! What the cache-aware order does to minibatch diversity, against the plain order:
//! distinct plates per minibatch of 64 rows, where a plate is a run of neighbouring
//! rows (cells of one plate, sample or donor are stored together), for plates smaller
//! than, about as large as, and several times larger than a chunk.
//!
//! The cache holds half the chunks, either as the epoch before leaves it (the chunks
//! that epoch read last, in its own seeded order) or as one contiguous half of the
//! dataset (the worst case: held chunks all come from one end). Minibatches are 64
//! consecutive rows of the epoch, as a DataLoader cuts them; each figure is the mean
//! over 20 epochs. Run: `cargo run --profile ci -p scdl-sampler --example
//! cache_aware_diversity`.

use std::collections::HashSet;
use std::num::{NonZeroU32, NonZeroU64};
use std::sync::Arc;

use scdl_sampler::{
    BlockOrder, CachedChunks, ChunkLayout, ChunkWindowOrder, EpochPlan, Order, RowSubset, Step,
};

const ROWS: u64 = 400_000;
const CHUNK_ROWS: u64 = 4096;
const BATCH: usize = 64;
const EPOCHS: u64 = 20;

fn orders() -> [(&'static str, Order); 2] {
    [
        (
            "windows of 4 chunks",
            Order::ChunkWindows(ChunkWindowOrder {
                seed: 7,
                chunks_per_window: NonZeroU32::new(4).unwrap(),
                shuffle_chunks: true,
                shuffle_within_window: true,
            }),
        ),
        (
            "blocks of 32, fetches of 16 minibatches",
            Order::Blocks(BlockOrder {
                seed: 7,
                block_size: NonZeroU64::new(32).unwrap(),
                batch_size: NonZeroU64::new(64).unwrap(),
                fetch_factor: NonZeroU64::new(16).unwrap(),
            }),
        ),
    ]
}

fn epoch_rows(plan: &EpochPlan) -> Vec<u64> {
    (0..plan.step_count())
        .flat_map(|i| plan.rows_of(i))
        .collect()
}

/// Mean distinct plates per minibatch of BATCH consecutive rows.
fn plates_per_batch(rows: &[u64], plate_rows: u64) -> f64 {
    let batches: Vec<usize> = rows
        .chunks(BATCH)
        .map(|batch| {
            batch
                .iter()
                .map(|r| r / plate_rows)
                .collect::<HashSet<_>>()
                .len()
        })
        .collect();
    batches.iter().sum::<usize>() as f64 / batches.len() as f64
}

/// The half of the chunks the windows epoch `epoch - 1` read last.
fn left_by_previous_epoch(chunks: ChunkLayout, epoch: u64) -> CachedChunks {
    let previous = EpochPlan::new(chunks, orders()[0].1, epoch.wrapping_sub(1));
    let visited: Vec<u32> = previous
        .steps()
        .flat_map(|step| match step {
            Step::Window { chunks } => chunks,
            Step::Fetch { .. } | Step::Draws { .. } => unreachable!(),
        })
        .collect();
    let last_half = &visited[visited.len() / 2..];
    CachedChunks::from_ranges(last_half.iter().map(|&c| c..c + 1))
}

fn main() {
    let chunks = ChunkLayout::new(ROWS, CHUNK_ROWS).unwrap();
    let all = Arc::new(RowSubset::all(ROWS));
    let contiguous = CachedChunks::from_ranges(std::iter::once(0..chunks.num_chunks() / 2));
    println!(
        "{ROWS} rows in {} chunks of {CHUNK_ROWS}; half the chunks cached; minibatches of {BATCH}; \
         mean over {EPOCHS} epochs\n",
        chunks.num_chunks()
    );
    println!("| order | plate rows | plain | cache-aware, cache left by the epoch before | ratio | cache-aware, one contiguous half cached | ratio |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (name, order) in orders() {
        for plate_rows in [500, CHUNK_ROWS, 20_000] {
            let (mut plain, mut left, mut half) = (0.0, 0.0, 0.0);
            for epoch in 1..=EPOCHS {
                let plan = |cached: Option<&CachedChunks>| match cached {
                    Some(c) => EpochPlan::over_cache_aware(chunks, all.clone(), order, epoch, c),
                    None => EpochPlan::over(chunks, all.clone(), order, epoch),
                };
                plain += plates_per_batch(&epoch_rows(&plan(None)), plate_rows);
                let held = left_by_previous_epoch(chunks, epoch);
                left += plates_per_batch(&epoch_rows(&plan(Some(&held))), plate_rows);
                half += plates_per_batch(&epoch_rows(&plan(Some(&contiguous))), plate_rows);
            }
            let n = EPOCHS as f64;
            let (plain, left, half) = (plain / n, left / n, half / n);
            println!(
                "| {name} | {plate_rows} | {plain:.2} | {left:.2} | {:.3} | {half:.2} | {:.3} |",
                left / plain,
                half / plain
            );
        }
    }
}
