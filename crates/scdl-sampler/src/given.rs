//! Hints for an order this crate did not compute: torch's samplers, scDataset's
//! strategies, a user's own. The caller reads that order ahead of its reader, cuts it
//! into steps (rows read together) and hands the steps here as it reads ahead; this
//! writes them in the protocol of [`scdl_format::hint`], through the same
//! [`HintWriter`] and the same step lines ([`scdl_format::hint::HintLine::rows_step`])
//! as [`crate::Sampler`]'s own orders, and says which step the reader is in
//! (`reading`), as the sampler does at every step it enters.
//!
//! A step's rows are announced as sorted, coalesced ranges: the daemon reads a step's
//! rows in any order, and a row listed twice (a weighted draw) is fetched once.

use scdl_format::hint::HintLine;

use crate::hints::{HintWriteError, HintWriter};
use crate::subset::RowSubset;

/// The plan of one reader of an order given row by row, written to one hint handle.
#[derive(Debug)]
pub struct GivenOrderHints {
    hints: HintWriter,
    /// The epoch of a plan started and not yet written: its `plan` line goes out with
    /// the first steps, since a daemon takes a new handle's plan only once it has a step.
    starting: Option<u64>,
}

impl GivenOrderHints {
    /// Announces through `hints` (see [`HintWriter::open`]; a disabled writer, or one
    /// without a hint file, writes nothing).
    pub fn new(hints: HintWriter) -> GivenOrderHints {
        GivenOrderHints {
            hints,
            starting: None,
        }
    }

    /// Whether the daemon is being told the plan.
    pub fn is_active(&self) -> bool {
        self.hints.is_active()
    }

    /// Starts a new plan (for `epoch`, which the daemon only reports), dropping the
    /// steps of the previous one: the next [`GivenOrderHints::advance`]'s first step
    /// is step 0. Written with that advance.
    pub fn start(&mut self, epoch: u64) {
        self.starting = Some(epoch);
    }

    /// Appends `steps` (each the rows of one step, in any order, repeats allowed; an
    /// empty step is no step, and is not counted by `reading`) to the plan, then, if given, says that the reader is in
    /// step `reading` (counted from the plan's first step): one write, so that the
    /// daemon learns of a step before it hears it is being read.
    pub fn advance<S: AsRef<[u64]>>(&mut self, steps: &[S], reading: Option<u64>) {
        if !self.hints.is_active() {
            return;
        }
        let plan = self.starting.take().map(|epoch| HintLine::Plan { epoch });
        let mut lines: Vec<HintLine> = plan.into_iter().collect();
        lines.extend(
            steps
                .iter()
                .map(|rows| RowSubset::from_rows(rows.as_ref().iter().copied()))
                .filter(|rows| !rows.is_empty())
                .flat_map(|rows| HintLine::rows_step(rows.ranges())),
        );
        lines.extend(reading.map(|step| HintLine::Reading { step }));
        if !lines.is_empty() {
            self.hints.write_lines(&lines);
        }
    }

    /// Waits until the hints announced so far have reached the hint file.
    pub fn flush(&self) {
        self.hints.flush();
    }

    /// The first hint failure since the last call, once the hints announced so far
    /// have been written; see [`HintWriter::take_error`].
    pub fn take_error(&mut self) -> Option<HintWriteError> {
        self.hints.take_error()
    }

    /// The failure [`GivenOrderHints::take_error`] would give next, as text, without
    /// waiting; see [`HintWriter::pending_error`].
    pub fn pending_error(&self) -> Option<String> {
        self.hints.pending_error()
    }
}
