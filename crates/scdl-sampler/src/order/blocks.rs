//! The block order of scDataset: short contiguous blocks of rows shuffled over the whole
//! dataset, taken a fetch at a time. A fetch's blocks are read in ascending order, which
//! turns random access into a few forward sweeps, and its rows are then shuffled in
//! memory and cut into minibatches, which restores diversity inside each minibatch.
//!
//! Over a subset, blocks are cut from the subset's rows in ascending order: a block is
//! contiguous wherever the subset is, and every block but the last is full.

use rand::seq::SliceRandom;

use super::{BlockOrder, Step};
use crate::cached::CachedChunks;
use crate::layout::ChunkLayout;
use crate::seeding::{self, Stream};
use crate::subset::RowSubset;

fn block_count(order: &BlockOrder, subset: &RowSubset) -> u64 {
    subset.len().div_ceil(order.block_size.get())
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

pub(super) fn fetch_count(order: &BlockOrder, subset: &RowSubset) -> usize {
    block_count(order, subset).div_ceil(blocks_per_fetch(order)) as usize
}

/// The epoch's fetches, in visiting order, each with its blocks sorted ascending; only
/// the last fetch may hold fewer blocks, and only the subset's last block is short.
/// With `cached`, the blocks whose rows all lie in chunks it holds come first.
pub(super) fn fetches(
    order: &BlockOrder,
    chunks: &ChunkLayout,
    subset: &RowSubset,
    epoch: u64,
    cached: Option<&CachedChunks>,
) -> Vec<Step> {
    let block_size = order.block_size.get();
    let mut ids: Vec<u64> = (0..block_count(order, subset)).collect();
    ids.shuffle(&mut seeding::rng(order.seed, epoch, Stream::Steps));
    if let Some(cached) = cached {
        let held = |block: u64| {
            subset
                .rows_at(block * block_size..(block + 1) * block_size)
                .iter()
                .all(|rows| {
                    let first = rows.start / chunks.chunk_size();
                    let last = (rows.end - 1) / chunks.chunk_size();
                    (first..=last).all(|chunk| cached.holds(chunk as u32))
                })
        };
        // A stable sort: each side keeps its shuffled order.
        ids.sort_by_cached_key(|&block| !held(block));
    }
    ids.chunks_mut(blocks_per_fetch(order) as usize)
        .map(|fetch| {
            fetch.sort_unstable();
            Step::Fetch {
                blocks: fetch
                    .iter()
                    .flat_map(|&b| subset.rows_at(b * block_size..(b + 1) * block_size))
                    .collect(),
            }
        })
        .collect()
}
