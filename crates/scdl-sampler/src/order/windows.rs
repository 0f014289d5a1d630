//! The chunk-window order of the original `ChunkAwareSampler`: chunks (shuffled or in
//! order) grouped into windows, each window's rows read before the next window's, so
//! that a cache of a few windows' chunks serves every read.

use rand::seq::SliceRandom;

use super::{ChunkWindowOrder, Step};
use crate::cached::CachedChunks;
use crate::layout::ChunkLayout;
use crate::seeding::{self, Stream};
use crate::subset::RowSubset;

/// The chunks that hold rows of `subset`, in ascending order.
fn chunks_of<'a>(chunks: &'a ChunkLayout, subset: &'a RowSubset) -> impl Iterator<Item = u32> + 'a {
    (0..chunks.num_chunks()).filter(move |&c| subset.meets(chunks.chunk_rows(c)))
}

pub(super) fn window_count(
    order: &ChunkWindowOrder,
    chunks: &ChunkLayout,
    subset: &RowSubset,
) -> usize {
    chunks_of(chunks, subset)
        .count()
        .div_ceil(order.chunks_per_window.get() as usize)
}

/// The epoch's windows of the chunks that hold rows of `subset`, in visiting order;
/// only the last may hold fewer chunks. With `cached`, the chunks it holds come first.
pub(super) fn windows(
    order: &ChunkWindowOrder,
    chunks: &ChunkLayout,
    subset: &RowSubset,
    epoch: u64,
    cached: Option<&CachedChunks>,
) -> Vec<Step> {
    let mut ids: Vec<u32> = chunks_of(chunks, subset).collect();
    if order.shuffle_chunks {
        ids.shuffle(&mut seeding::rng(order.seed, epoch, Stream::Steps));
    }
    if let Some(cached) = cached {
        // A stable sort: each side keeps its shuffled order.
        ids.sort_by_key(|&chunk| !cached.holds(chunk));
    }
    ids.chunks(order.chunks_per_window.get() as usize)
        .map(|window| Step::Window {
            chunks: window.to_vec(),
        })
        .collect()
}
