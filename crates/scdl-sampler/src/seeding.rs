//! Random streams of an order, derived from (seed, epoch, purpose) alone.
//!
//! Every rank and every data-loading worker computes the same epoch plan independently,
//! so nothing random may depend on process state: each shuffle draws from its own
//! ChaCha stream, keyed by the seed and the epoch and numbered by what it shuffles.
//! Keying each step's row shuffle by the step's index (rather than drawing it from one
//! running generator) lets any process produce the rows of any step without producing
//! the steps before it, and makes a step repeated for padding repeat the same rows.
//! The epoch's order of units is a permutation keyed by the `Steps` stream
//! ([`crate::permutation`]), evaluated where needed rather than shuffled. Plans are
//! reproducible for a given version of this crate and of `rand`, whose shuffle orders
//! the rows inside a step; all processes of a job must share both.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// What a random stream is used for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Stream {
    /// The order of the epoch's steps: the keys of the chunk or block permutation.
    Steps,
    /// The order of the rows inside step `index` of the epoch.
    StepRows(usize),
    /// The chunks' order when a dataset is split by chunk (the same every epoch).
    Split,
    /// The block and rows drawn by unit `position` of a weighted epoch.
    Draw(u64),
}

pub(crate) fn rng(seed: u64, epoch: u64, stream: Stream) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&epoch.to_le_bytes());
    let mut rng = ChaCha8Rng::from_seed(key);
    rng.set_stream(match stream {
        Stream::Steps => 0,
        Stream::StepRows(index) => index as u64 + 1,
        Stream::Split => u64::MAX,
        // The upper half of the stream numbers, apart from the steps' (an epoch has
        // fewer than 2^63 steps or units).
        Stream::Draw(position) => (1 << 63) | position,
    });
    rng
}
