//! Iterating one worker's share of an epoch, row by row or minibatch by minibatch,
//! while keeping the daemon's plan a bounded distance ahead.
//!
//! Rows of a step are produced when the iteration enters the step, so memory holds
//! one step's rows at a time. Entering a step is also when the hint file learns of the
//! steps up to `lookahead` places further on (in batches of about half the lookahead):
//! the daemon always knows what is being read now and the next few steps, never the
//! whole epoch, so its plan stays small and follows the reader even when an epoch is
//! abandoned halfway.

use scdl_format::hint::HintLine;

use crate::hints::HintWriter;
use crate::order::EpochPlan;
use crate::shard::ShareStep;

/// The rows of one worker's share of one epoch, in visiting order.
#[derive(Debug)]
pub struct EpochIter<'a> {
    plan: EpochPlan,
    share: Vec<ShareStep>,
    hints: &'a mut HintWriter,
    lookahead: usize,
    /// How many steps of the share the hint file has been told of.
    announced: usize,
    /// The share position of the next step to enter.
    next_step: usize,
    /// The current step's rows, cut to its share.
    rows: Vec<u64>,
    /// The next row to yield, as a position in `rows`.
    position: usize,
    rows_left: u64,
}

impl<'a> EpochIter<'a> {
    /// Starts the epoch: writes `plan <epoch>` and the first `lookahead` steps.
    pub(crate) fn start(
        plan: EpochPlan,
        share: Vec<ShareStep>,
        hints: &'a mut HintWriter,
        lookahead: usize,
    ) -> EpochIter<'a> {
        let rows_left = share.iter().map(|s| s.rows).sum();
        let mut iter = EpochIter {
            plan,
            share,
            hints,
            lookahead,
            announced: 0,
            next_step: 0,
            rows: Vec::new(),
            position: 0,
            rows_left,
        };
        iter.announce(vec![HintLine::Plan {
            epoch: iter.plan.epoch(),
        }]);
        iter
    }

    /// The whole epoch's plan, for all ranks and workers.
    pub fn plan(&self) -> &EpochPlan {
        &self.plan
    }

    /// This worker's steps of the epoch, in order.
    pub fn share(&self) -> &[ShareStep] {
        &self.share
    }

    /// The rows up to the next minibatch boundary. Block order cuts every fetch into
    /// minibatches of `batch_size` rows (a fetch's last one may be shorter); the
    /// chunk-window order has no minibatches of its own, so its only boundaries are
    /// window ends and a call yields the rest of the current window.
    pub fn next_minibatch(&mut self) -> Option<Vec<u64>> {
        if !self.current_step_has_rows() {
            return None;
        }
        let end = match self.plan.order().batch_size() {
            Some(batch) => {
                let batch = batch as usize;
                ((self.position / batch + 1) * batch).min(self.rows.len())
            }
            None => self.rows.len(),
        };
        let minibatch = self.rows[self.position..end].to_vec();
        self.position = end;
        self.rows_left -= minibatch.len() as u64;
        Some(minibatch)
    }

    /// Makes sure a row is available at `position`, entering steps as needed; `false`
    /// once the share is exhausted.
    fn current_step_has_rows(&mut self) -> bool {
        while self.position == self.rows.len() {
            let Some(entered) = self.share.get(self.next_step).copied() else {
                return false;
            };
            self.next_step += 1;
            self.rows = self.plan.rows_of(entered.step);
            self.rows.truncate(entered.rows as usize);
            self.position = 0;
            self.announce(Vec::new());
        }
        true
    }

    /// Writes `lines`, then the steps not yet announced up to `lookahead` steps from
    /// the current one, all in one go. Steps are topped up only once fewer than half
    /// the lookahead remain announced ahead: one write per several small steps keeps
    /// a fast reader from paying a FUSE write per step.
    fn announce(&mut self, mut lines: Vec<HintLine>) {
        // The step being read; before any is entered, the first one to be.
        let current = self.next_step.saturating_sub(1);
        if lines.is_empty() && self.announced > current + self.lookahead / 2 {
            return;
        }
        // Never below `announced`: `current` only grows.
        let through = (current + self.lookahead).min(self.share.len());
        for share_step in &self.share[self.announced..through] {
            lines.extend(self.plan.steps()[share_step.step].hint_lines());
        }
        self.announced = through;
        if !lines.is_empty() {
            self.hints.write_lines(&lines);
        }
    }
}

impl Iterator for EpochIter<'_> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        if !self.current_step_has_rows() {
            return None;
        }
        let row = self.rows[self.position];
        self.position += 1;
        self.rows_left -= 1;
        Some(row)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.rows_left as usize;
        (left, Some(left))
    }
}

impl ExactSizeIterator for EpochIter<'_> {}
