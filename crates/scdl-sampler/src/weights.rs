//! Weighted orders: each row drawn with a chance in proportion to its weight (as
//! scDataset's `BlockWeightedSampling`), or to the inverse of its class's size (as its
//! `ClassBalancedSampling`: a rare cell type drawn as often as a common one), while
//! reads stay in blocks or chunk windows.
//!
//! An epoch has the units of the plain order (blocks, or chunks), cut into steps as the
//! plain order cuts them, but each unit is drawn: unit `p` of the epoch draws one row of
//! the subset by weight, takes the group that holds it (the plain order's block, or its
//! chunk), and draws the unit's rows inside that group, again by weight: `block_size` of
//! them, or as many as the chunk holds of the subset. A row's chance per draw is then
//! exactly its weight over the subset's (the group's chance is its weight share, the
//! row's inside it its share of the group), with every unit's rows in one group, so a
//! fetch reads `f` blocks' ranges and a window `k` chunks, as in the plain orders. Draws
//! are with replacement: a row may come twice in an epoch, and once per step in its
//! hints.
//!
//! Every unit is drawn from a random stream of its own (seed, epoch, position), so any
//! step is computed from its index alone, and ranks, workers and resumes share out and
//! skip steps exactly as in the plain order. The cumulative weights cost 8 bytes a row,
//! held once per sampler.

use std::ops::Range;
use std::sync::Arc;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::seeding::{self, Stream};
use crate::subset::RowSubset;

/// Why weights cannot drive an order.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum WeightsError {
    #[error("row {row}'s weight is {weight}: weights must be finite and at least 0")]
    Invalid { row: u64, weight: f64 },
    #[error("{given} weights were given for a dataset of {rows} rows: give one a row")]
    Count { given: u64, rows: u64 },
    #[error("every row the order visits has weight 0")]
    Nothing,
}

/// Running sums of non-negative weights: `at(i)` is the weight before item `i`.
#[derive(Clone, Debug)]
struct Cumulative(Vec<f64>);

impl Cumulative {
    fn of(weights: impl IntoIterator<Item = f64>) -> Cumulative {
        let mut sum = 0.0;
        let mut sums = vec![0.0];
        sums.extend(weights.into_iter().map(|w| {
            sum += w;
            sum
        }));
        Cumulative(sums)
    }

    fn at(&self, item: u64) -> f64 {
        self.0[item as usize]
    }

    /// The item of `items` (a range of items of positive total weight) into whose
    /// weight `target` falls: clamped into the items' span, so that rounding never
    /// lands on an item of weight 0 or outside.
    fn item_at(&self, items: Range<u64>, target: f64) -> u64 {
        let (low, high) = (self.at(items.start), self.at(items.end));
        let target = target.max(low).min(high.next_down());
        let sums = &self.0[items.start as usize..=items.end as usize];
        items.start + sums.partition_point(|&s| s <= target) as u64 - 1
    }
}

impl PartialEq for Cumulative {
    fn eq(&self, other: &Cumulative) -> bool {
        self.0.len() == other.0.len()
            && self
                .0
                .iter()
                .zip(&other.0)
                .all(|(a, b)| a.to_bits() == b.to_bits())
    }
}

impl Eq for Cumulative {}

/// One weight a row of a dataset, as running sums, for the weighted orders
/// ([`crate::Sampler::with_row_weights`], [`crate::EpochPlan::over_weighted`]): each
/// unit of an epoch draws a block (or chunk) by weight and its rows inside it by weight,
/// so a row's chance per draw is its share of the weight, and a step still reads blocks
/// (or chunks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowWeights {
    rows: Cumulative,
}

impl RowWeights {
    /// The weights of a dataset's rows, one a row (any scale: only ratios count).
    pub fn new(weights: &[f64]) -> Result<RowWeights, WeightsError> {
        if let Some((row, &weight)) = weights
            .iter()
            .enumerate()
            .find(|(_, w)| !(w.is_finite() && **w >= 0.0))
        {
            return Err(WeightsError::Invalid {
                row: row as u64,
                weight,
            });
        }
        Ok(RowWeights {
            rows: Cumulative::of(weights.iter().copied()),
        })
    }

    /// Weights that draw every class as often: each row weighs one over the number of
    /// rows of its class (`labels`, one a row) in the dataset.
    pub fn class_balanced(labels: &[u64]) -> RowWeights {
        let mut sizes = std::collections::HashMap::<u64, u64>::new();
        for &label in labels {
            *sizes.entry(label).or_default() += 1;
        }
        RowWeights {
            rows: Cumulative::of(labels.iter().map(|label| 1.0 / sizes[label] as f64)),
        }
    }

    /// How many rows the weights are for.
    pub fn rows(&self) -> u64 {
        self.rows.0.len() as u64 - 1
    }

    fn weight(&self, rows: &Range<u64>) -> f64 {
        self.rows.at(rows.end) - self.rows.at(rows.start)
    }

    /// Checks that the weights fit a dataset of `total_rows` rows and give the rows of
    /// `subset` some weight.
    pub fn check_for(&self, total_rows: u64, subset: &RowSubset) -> Result<(), WeightsError> {
        if self.rows() != total_rows {
            return Err(WeightsError::Count {
                given: self.rows(),
                rows: total_rows,
            });
        }
        match subset.ranges().iter().any(|r| self.weight(r) > 0.0) {
            true => Ok(()),
            false => Err(WeightsError::Nothing),
        }
    }

    /// The row of `ranges` whose weight `draw` (in `[0, 1)`) falls into, given the
    /// running sums of the ranges' weights.
    fn draw_in(&self, ranges: &[Range<u64>], sums: &Cumulative, draw: f64) -> u64 {
        let total = sums.at(ranges.len() as u64);
        let range = sums.item_at(0..ranges.len() as u64, draw * total);
        let within = draw * total - sums.at(range);
        let rows = ranges[range as usize].clone();
        self.rows
            .item_at(rows.clone(), self.rows.at(rows.start) + within)
    }
}

/// The draws of one epoch's weighted order over a subset: each unit's rows, drawn inside
/// the group (a block, a chunk) that holds the row it draws first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Draws {
    weights: Arc<RowWeights>,
    /// Running sums of the weights of the subset's ranges.
    ranges: Cumulative,
    seed: u64,
    epoch: u64,
}

impl Draws {
    pub(crate) fn new(
        weights: Arc<RowWeights>,
        subset: &RowSubset,
        seed: u64,
        epoch: u64,
    ) -> Draws {
        Draws {
            ranges: Cumulative::of(subset.ranges().iter().map(|r| weights.weight(r))),
            weights,
            seed,
            epoch,
        }
    }

    /// Unit `position`'s random stream, and the row it draws first from the whole
    /// subset: the row that picks the unit's group.
    fn anchor_and_rng(&self, subset: &RowSubset, position: u64) -> (u64, ChaCha8Rng) {
        let mut rng = seeding::rng(self.seed, self.epoch, Stream::Draw(position));
        let anchor = self
            .weights
            .draw_in(subset.ranges(), &self.ranges, rng.random());
        (anchor, rng)
    }

    /// The row unit `position` draws first, which picks its group.
    pub(crate) fn anchor(&self, subset: &RowSubset, position: u64) -> u64 {
        self.anchor_and_rng(subset, position).0
    }

    /// The rows unit `position` draws, in the order drawn: inside `group(anchor)` (the
    /// rows, as ranges, of the group that holds its anchor), as many as `count` says of
    /// that group.
    pub(crate) fn unit(
        &self,
        subset: &RowSubset,
        position: u64,
        group: impl FnOnce(u64) -> Vec<Range<u64>>,
        count: impl FnOnce(&[Range<u64>]) -> u64,
    ) -> Vec<u64> {
        let (anchor, mut rng) = self.anchor_and_rng(subset, position);
        let rows = group(anchor);
        let sums = Cumulative::of(rows.iter().map(|r| self.weights.weight(r)));
        (0..count(&rows))
            .map(|_| self.weights.draw_in(&rows, &sums, rng.random()))
            .collect()
    }
}
