//! Row orders for SCDL datasets that read well from a remote, chunked store, and the
//! read-ahead hints that let the scdlfs daemon fetch ahead of them.
//!
//! Training wants rows in random order; a remote chunked dataset wants reads grouped by
//! chunk. The orders here sit between the two:
//!
//! * the **chunk-window order** of the original `ChunkAwareSampler`
//!   ([`ChunkWindowOrder`]): shuffled chunks taken a few at a time, rows shuffled inside
//!   each window;
//! * the **block order** of scDataset ([`BlockOrder`]): short contiguous blocks taken at
//!   random, a fetch of them read in ascending order, the fetch's rows shuffled in memory
//!   and cut into minibatches.
//!
//! Either order can also draw rows by weight, or balance classes ([`RowWeights`],
//! [`Sampler::with_row_weights`]), still reading in blocks or chunk windows.
//!
//! An order can visit a subset of the rows instead of all of them ([`RowSubset`]): a
//! split by whole chunks ([`RowSubset::split_by_chunk`]) or any rows a caller lists,
//! with windows and blocks made of the subset's rows so that reads stay local.
//! A worker can resume an epoch after the rows it already read
//! ([`Sampler::resume_epoch`]), with the hints restarting from there.
//!
//! An epoch is cut into steps (windows or fetches), which ranks and data-loading workers
//! share out whole ([`Shard`], [`Workers`], [`EvenShares`]). Everything random is derived
//! from (seed, epoch), so every process computes the same [`EpochPlan`] on its own.
//!
//! # Pairing with the daemon
//!
//! The sampler needs nothing but a dataset directory: [`DatasetLayout::discover`] reads
//! the chunk layout from the headers of an scdlfs mount's raw or flat view, or treats a
//! plain local archive as virtual chunks. When the directory has a `.scdlfs-hints` file
//! (only a mount has one), a [`Sampler`] keeps it open and, as iteration advances, writes
//! `plan <epoch>` and the next few steps of its own worker's share in the hint protocol
//! of [`scdl_format::hint`] (from a thread of its own, so that the reader does not wait
//! for the daemon). The daemon prefetches those chunks or rows and may evict
//! what no plan names. Hints are advice: without the file, or when a write fails, rows
//! come out exactly the same, and failures wait in [`Sampler::take_hint_error`].
//!
//! An order computed elsewhere (torch's samplers, scDataset's strategies, a user's
//! own) is announced the same way through [`GivenOrderHints`], by a caller that reads
//! that order ahead of its reader and hands over its steps.
//!
//! ```no_run
//! use std::num::{NonZeroU32, NonZeroU64};
//! use scdl_sampler::*;
//!
//! let layout = DatasetLayout::discover("/mnt/scdl/pbmc".as_ref(), DEFAULT_VIRTUAL_CHUNK_SIZE)?;
//! let order = Order::Blocks(BlockOrder {
//!     seed: 42,
//!     block_size: NonZeroU64::new(16).unwrap(),
//!     batch_size: NonZeroU64::new(64).unwrap(),
//!     fetch_factor: NonZeroU64::new(16).unwrap(),
//! });
//! let shard = Shard::new(0, NonZeroU32::new(4).unwrap(), EvenShares::Pad)?;
//! let mut sampler = Sampler::new(&layout, order, shard, Workers::single())?;
//! for epoch in 0..10 {
//!     let mut rows = sampler.epoch(epoch);
//!     while let Some(minibatch) = rows.next_minibatch() {
//!         // read the rows of `minibatch` from the dataset
//!     }
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod cached;
mod epoch;
mod given;
mod hints;
mod layout;
mod order;
mod permutation;
mod ranges;
mod sampler;
mod seeding;
mod shard;
mod subset;
mod weights;

pub use cached::CachedChunks;
pub use epoch::{EpochCursor, EpochIter};
pub use given::GivenOrderHints;
pub use hints::{HintWriteError, HintWriter};
pub use layout::{
    read_announcement, ChunkLayout, DatasetKind, DatasetLayout, LayoutError,
    DEFAULT_VIRTUAL_CHUNK_SIZE,
};
pub use order::{BlockOrder, ChunkWindowOrder, EpochPlan, Order, Step};
pub use sampler::{RestrictError, Sampler, DEFAULT_HINT_LOOKAHEAD};
pub use shard::{rank_share, worker_share, EvenShares, Shard, ShardError, ShareStep, Workers};
pub use subset::{RowSubset, SubsetError};
pub use weights::{RowWeights, WeightsError};
