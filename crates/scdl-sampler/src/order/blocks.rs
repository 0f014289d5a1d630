//! The block order of scDataset: short contiguous blocks of rows shuffled over the whole
//! dataset, taken a fetch at a time. A fetch's blocks are read in ascending order, which
//! turns random access into a few forward sweeps, and its rows are then shuffled in
//! memory and cut into minibatches, which restores diversity inside each minibatch.

use std::ops::Range;

use rand::seq::SliceRandom;

use super::{BlockOrder, Step};
use crate::layout::ChunkLayout;
use crate::seeding::{self, Stream};

fn block_count(order: &BlockOrder, chunks: &ChunkLayout) -> u64 {
    chunks.total_rows().div_ceil(order.block_size.get())
}

/// Blocks per fetch: enough to cover `batch_size × fetch_factor` rows. The product
/// saturates, because a fetch larger than the dataset is simply the whole dataset.
fn blocks_per_fetch(order: &BlockOrder) -> u64 {
    order
        .batch_size
        .get()
        .saturating_mul(order.fetch_factor.get())
        .div_ceil(order.block_size.get())
}

pub(super) fn fetch_count(order: &BlockOrder, chunks: &ChunkLayout) -> usize {
    block_count(order, chunks).div_ceil(blocks_per_fetch(order)) as usize
}

/// The epoch's fetches, in visiting order, each with its blocks sorted ascending; only
/// the last fetch may hold fewer blocks, and only the dataset's last block is short.
pub(super) fn fetches(order: &BlockOrder, chunks: &ChunkLayout, epoch: u64) -> Vec<Step> {
    let block_size = order.block_size.get();
    let block_rows = |block: u64| -> Range<u64> {
        let start = block * block_size;
        start..(start + block_size).min(chunks.total_rows())
    };
    let mut ids: Vec<u64> = (0..block_count(order, chunks)).collect();
    ids.shuffle(&mut seeding::rng(order.seed, epoch, Stream::Steps));
    ids.chunks_mut(blocks_per_fetch(order) as usize)
        .map(|fetch| {
            fetch.sort_unstable();
            Step::Fetch {
                blocks: fetch.iter().map(|&b| block_rows(b)).collect(),
            }
        })
        .collect()
}
