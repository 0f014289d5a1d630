//! Iterating one worker's share of an epoch, row by row or minibatch by minibatch,
//! while keeping the daemon's plan a bounded distance ahead.
//!
//! Rows of a step are produced when the iteration enters the step, so memory holds
//! one step's rows at a time. Entering a step is also when the hint file learns of the
//! steps up to `lookahead` places further on (in batches of about half the lookahead):
//! the daemon always knows what is being read now and the next few steps, never the
//! whole epoch, so its plan stays small and follows the reader even when an epoch is
//! abandoned halfway.
//!
//! The position ([`EpochCursor`]) is kept apart from the hint file it announces to, so
//! that a caller that cannot hold a borrow of the sampler across calls (the Python
//! binding, whose iterator is an object of its own) can keep it; [`EpochIter`] is the
//! two together.

use scdl_format::hint::HintLine;

use crate::hints::HintWriter;
use crate::order::EpochPlan;
use crate::shard::ShareStep;

/// The rows of one worker's share of one epoch, in visiting order.
#[derive(Debug)]
pub struct EpochIter<'a> {
    cursor: EpochCursor,
    hints: &'a mut HintWriter,
}

/// How far one worker is through its share of one epoch, and how far the hint file
/// has been told. Advanced with [`crate::Sampler::next_minibatch`].
#[derive(Debug)]
pub struct EpochCursor {
    plan: EpochPlan,
    share: Vec<ShareStep>,
    lookahead: usize,
    /// How many steps of the share the hint file has been told of.
    announced: usize,
    /// The share position of the plan's first step: `reading` lines count from it.
    plan_start: usize,
    /// The share position of the next step to enter.
    next_step: usize,
    /// The current step's rows, cut to its share.
    rows: Vec<u64>,
    /// The next row to yield, as a position in `rows`.
    position: usize,
    rows_left: u64,
}

impl<'a> EpochIter<'a> {
    pub(crate) fn new(cursor: EpochCursor, hints: &'a mut HintWriter) -> EpochIter<'a> {
        EpochIter { cursor, hints }
    }

    /// The whole epoch's plan, for all ranks and workers.
    pub fn plan(&self) -> &EpochPlan {
        self.cursor.plan()
    }

    /// This worker's steps of the epoch, in order.
    pub fn share(&self) -> &[ShareStep] {
        self.cursor.share()
    }

    /// Waits until the steps announced so far have reached the hint file; see
    /// [`crate::Sampler::flush_hints`].
    pub fn flush_hints(&self) {
        self.hints.flush();
    }

    /// The rows up to the next minibatch boundary; see [`crate::Sampler::next_minibatch`].
    pub fn next_minibatch(&mut self) -> Option<Vec<u64>> {
        self.cursor.next_minibatch(self.hints)
    }
}

impl EpochCursor {
    /// Starts the epoch after the first `rows_done` rows of the share (0 for its
    /// beginning): writes `plan <epoch>` and the `lookahead` steps from the one that
    /// holds the next row. The steps before it are skipped without computing their
    /// rows. `None` when the share has fewer than `rows_done` rows.
    pub(crate) fn start(
        plan: EpochPlan,
        share: Vec<ShareStep>,
        hints: &mut HintWriter,
        lookahead: usize,
        rows_done: u64,
    ) -> Option<EpochCursor> {
        let share_rows: u64 = share.iter().map(|s| s.rows).sum();
        let rows_left = share_rows.checked_sub(rows_done)?;
        let mut cursor = EpochCursor {
            plan,
            share,
            lookahead,
            announced: 0,
            plan_start: 0,
            next_step: 0,
            rows: Vec::new(),
            position: 0,
            rows_left,
        };
        // The step holding the next row, and the row's place in it.
        let mut before = 0;
        let resume_in = cursor
            .share
            .iter()
            .enumerate()
            .find_map(|(index, share_step)| {
                let holds_next = before + share_step.rows > rows_done;
                let found = holds_next.then(|| (index, (rows_done - before) as usize));
                before += share_step.rows;
                found
            });
        let current = resume_in.map_or(cursor.share.len(), |(index, _)| index);
        // Announcing starts from the current step; its rows are computed after the
        // announcement is handed to the writer, so the daemon hears of it first.
        cursor.next_step = current + usize::from(resume_in.is_some());
        cursor.announced = current;
        cursor.plan_start = current;
        let greeting = vec![HintLine::Plan {
            epoch: cursor.plan.epoch(),
        }];
        cursor.announce(hints, greeting);
        if let Some((index, offset)) = resume_in {
            cursor.enter(index);
            cursor.position = offset;
        }
        Some(cursor)
    }

    /// The whole epoch's plan, for all ranks and workers.
    pub fn plan(&self) -> &EpochPlan {
        &self.plan
    }

    /// This worker's steps of the epoch, in order.
    pub fn share(&self) -> &[ShareStep] {
        &self.share
    }

    pub(crate) fn next_minibatch(&mut self, hints: &mut HintWriter) -> Option<Vec<u64>> {
        if !self.current_step_has_rows(hints) {
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

    /// The rows of the share yielded so far (counting those skipped by a resume).
    pub fn rows_done(&self) -> u64 {
        self.share.iter().map(|s| s.rows).sum::<u64>() - self.rows_left
    }

    /// The rows of the share not yet yielded.
    pub fn rows_left(&self) -> u64 {
        self.rows_left
    }

    fn next_row(&mut self, hints: &mut HintWriter) -> Option<u64> {
        if !self.current_step_has_rows(hints) {
            return None;
        }
        let row = self.rows[self.position];
        self.position += 1;
        self.rows_left -= 1;
        Some(row)
    }

    /// Makes sure a row is available at `position`, entering steps as needed; `false`
    /// once the share is exhausted.
    fn current_step_has_rows(&mut self, hints: &mut HintWriter) -> bool {
        while self.position == self.rows.len() {
            if self.next_step == self.share.len() {
                return false;
            }
            self.enter(self.next_step);
            // Said at every step: a reader whose rows the daemon stored into the page
            // cache ahead of it makes no reads the daemon could follow it by.
            let step = (self.next_step - 1 - self.plan_start) as u64;
            self.announce(hints, vec![HintLine::Reading { step }]);
        }
        true
    }

    /// Makes step `index` of the share the current one, at its first row.
    fn enter(&mut self, index: usize) {
        let entered = self.share[index];
        self.next_step = index + 1;
        self.rows = self.plan.rows_of(entered.step);
        self.rows.truncate(entered.rows as usize);
        self.position = 0;
    }

    /// Writes `lines`, then the steps not yet announced up to `lookahead` steps from
    /// the current one, all in one go (handed to the hint writer's thread). Steps are
    /// topped up only once fewer than half the lookahead remain announced ahead, so
    /// that the daemon parses each step once in a few writes; the position alone
    /// (`reading`) is one short line a step.
    fn announce(&mut self, hints: &mut HintWriter, mut lines: Vec<HintLine>) {
        // The step being read; before any is entered, the first one to be.
        let current = self.next_step.saturating_sub(1);
        if self.announced > current + self.lookahead / 2 {
            if !lines.is_empty() {
                hints.write_lines(&lines);
            }
            return;
        }
        // Never below `announced`: `current` only grows.
        let through = (current + self.lookahead).min(self.share.len());
        // A writer that writes nothing (no hint file, hints off, a fork) is not worth
        // the steps' lines: a fetch of thousands of blocks costs a millisecond.
        if hints.is_active() {
            for share_step in &self.share[self.announced..through] {
                lines.extend(self.plan.step(share_step.step).hint_lines());
            }
            if !lines.is_empty() {
                hints.write_lines(&lines);
            }
        }
        self.announced = through;
    }
}

impl Iterator for EpochIter<'_> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        self.cursor.next_row(self.hints)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.cursor.rows_left as usize;
        (left, Some(left))
    }
}

impl ExactSizeIterator for EpochIter<'_> {}
