//! A reader's announced order (a plan) and where the reader is in it. Pure logic: the
//! steps, their validation against the dataset, matching served reads to steps, and the
//! eviction ranks the plan implies.
//!
//! A plan knows the dataset only by how its rows fall into chunks ([`ChunkGeometry`]):
//! the chunks of a chunked dataset, or the virtual chunks of a monolithic one.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;

use scdl_format::hint::HintLine;
use scdl_format::ChunkGeometry;

use super::budget::MAX_STEP_WORK;
use crate::cache::NextUse;
use crate::error::PlanRefused;
use crate::parts::PartKey;

/// A plan longer than this is refused (EINVAL): the daemon keeps plans in memory.
pub const MAX_PLAN_STEPS: usize = 1 << 20;

/// Chunks and row ranges held by the plans of all open hint files together: what hint
/// writers can make the daemon keep, however many handles they open (about 16 bytes
/// each, so 64 MiB at most).
pub const MAX_PLANNED_ENTRIES: usize = 1 << 22;
/// What a plan may hold once a batch is applied: chunks and row ranges (what the
/// mount's plans hold together, [`MAX_PLANNED_ENTRIES`]), and work (what its handle and
/// user may still have done, [`super::budget`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Room {
    pub entries: usize,
    pub work: u64,
}

/// What a batch of hint lines says, read before any of it is applied.
struct Batch {
    /// The epoch of its last `plan` line, or the plan's.
    epoch: u64,
    /// A `plan` line began a new plan: the old steps go.
    replaced: bool,
    /// The steps its lines end.
    appended: Vec<Step>,
    /// The step its last lines begin and do not end, or the plan's one begun before.
    partial: Option<Step>,
}

/// How far from the current step a served read is matched to a step.
const MATCH_HORIZON: usize = 64;
/// How many steps ahead the plan ranks chunks for eviction.
pub const RANK_HORIZON: usize = 2 * MATCH_HORIZON;
/// Reads of a later step, with no read of the current one in between, it takes to
/// move there. A stray read (the kernel's read-around crossing into a neighbouring
/// chunk of the flat file) must not move the position: that would mark the step being
/// read as done.
const READS_TO_ADVANCE: u32 = 3;
/// Reads it takes to move back to an earlier step: readers go forward, so going back
/// needs more evidence than strays give.
const READS_TO_GO_BACK: u32 = 12;

/// Shared, not copied, by the plans' horizons ([`Plan::horizon`]): eight ranks' steps of
/// 4,096 single rows, copied for every ranking, held 11.8 MB beside the plans' own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Chunks read together, in any order.
    Window(Arc<[u32]>),
    /// Row ranges `[start, end)` read together (one fetch of a block order).
    Rows(Arc<[Range<u64>]>),
}

impl Step {
    /// The chunks or row ranges the step names.
    fn entries(&self) -> usize {
        match self {
            Step::Window(chunks) => chunks.len(),
            Step::Rows(ranges) => ranges.len(),
        }
    }

    /// The work the step makes wherever it is expanded to chunks (ranks, matching
    /// reads, prefetch): one per chunk of a window, one per chunk each row range spans
    /// (at least one per range). Counted without expanding it.
    pub fn work(&self, layout: &ChunkGeometry) -> u64 {
        match self {
            Step::Window(chunks) => chunks.len() as u64,
            Step::Rows(ranges) => ranges
                .iter()
                .map(|r| {
                    let span = layout.chunks_of_rows(r.clone());
                    (span.end - span.start).max(1)
                })
                .sum(),
        }
    }

    /// Whether the step reads from any of `chunks`: a read touches a chunk or two, so
    /// each row range is compared by the span of chunks it covers, not walked.
    fn reads_any_of(&self, chunks: &[usize], layout: &ChunkGeometry) -> bool {
        match self {
            Step::Window(window) => window.iter().any(|c| chunks.contains(&(*c as usize))),
            Step::Rows(ranges) => ranges.iter().any(|r| {
                let span = layout.chunks_of_rows(r.clone());
                chunks.iter().any(|&c| span.contains(&(c as u64)))
            }),
        }
    }

    /// The chunks the step reads from.
    pub fn chunks(&self, layout: &ChunkGeometry) -> Vec<usize> {
        match self {
            Step::Window(chunks) => chunks.iter().map(|&c| c as usize).collect(),
            Step::Rows(ranges) => {
                let mut chunks: Vec<usize> = ranges
                    .iter()
                    .flat_map(|r| layout.chunks_of_rows(r.clone()))
                    .map(|c| c as usize)
                    .collect();
                chunks.dedup();
                chunks
            }
        }
    }
}

/// What one served read touched: the dataset chunks, and the parts of their objects.
#[derive(Debug, Default)]
pub struct Touched {
    pub chunks: Vec<usize>,
    pub parts: Vec<PartKey>,
}

/// A plan's revision and position: see [`Plan::mark`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanMark {
    pub revision: u64,
    pub position: usize,
}

#[derive(Debug, Default)]
pub struct Plan {
    pub epoch: u64,
    pub steps: Vec<Step>,
    /// For each step, the parts it reads once the prefetcher has resolved them. Reads
    /// are matched to steps by part where known: steps of a block order share most of
    /// their chunks, but few of their parts.
    parts: Vec<Option<HashSet<PartKey>>>,
    /// The step the reader is in, as inferred from the reads served or said by its
    /// writer (`reading`).
    pub position: usize,
    /// Steps of this plan retired before `steps[0]`: a `reading` line counts from the
    /// `plan` line.
    retired: usize,
    /// Counts the `plan` lines applied: a step's place counted from its `plan` line
    /// ([`Plan::place`]) names that step only with the same count.
    started: u64,
    /// Reads of other steps since the position last moved, by step.
    reads_elsewhere: HashMap<usize, u32>,
    /// Counts the batches applied: step indices taken before a batch may name other
    /// steps after it (a new epoch, retired steps).
    revision: u64,
    /// The steps before this one have been counted in [`Plan::finished_chunks`].
    counted: usize,
    /// Rows of each chunk the counted row steps read this epoch.
    rows_read: HashMap<usize, u64>,
    /// The chunks and row ranges of the steps, kept as they change: a write is checked
    /// against them without walking the plan.
    entries: usize,
    /// The work of the steps ([`Step::work`]), kept likewise.
    work: u64,
    /// The first lines of a step not yet ended (`window+` or `rows+`, protocol
    /// version 4): a step too long for one line may span writes, and becomes a step
    /// only with its last line, so that the reader's position never lands in half of it.
    partial: Option<Step>,
}

impl Plan {
    /// The chunks and row ranges the plan holds, a step not yet ended included.
    pub fn entries(&self) -> usize {
        self.entries + self.partial.as_ref().map_or(0, Step::entries)
    }

    /// The work of the plan's steps ([`Step::work`]).
    pub fn work(&self) -> u64 {
        self.work
    }

    /// Whether the plan holds no step, not even the first lines of one.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty() && self.partial.is_none()
    }

    /// Applies a batch of protocol lines, all or nothing: on error the plan is unchanged.
    /// The plan may hold at most `room` afterwards, and no step more than
    /// [`MAX_STEP_WORK`].
    /// Returns how far ahead of the position the batch changed the plan: the distance
    /// of its first new step (0 for a new plan), or `None` if it added none. (A reader
    /// served from the page cache moves no position, so its steps pile up far ahead,
    /// where they change neither the ranks nor what is fetched.)
    pub fn apply(
        &mut self,
        lines: &[HintLine],
        layout: &ChunkGeometry,
        room: Room,
    ) -> Result<Option<usize>, PlanRefused> {
        let Batch {
            epoch,
            replaced,
            appended,
            partial,
        } = self.read_batch(lines, layout)?;
        // Steps the reader has passed are retired, so a plan that grows as the epoch
        // advances stays as long as its lookahead.
        let kept = if replaced {
            0
        } else {
            self.steps.len() - self.position
        };
        if kept + appended.len() > MAX_PLAN_STEPS {
            return Err(PlanRefused::TooManySteps {
                limit: MAX_PLAN_STEPS,
            });
        }
        // The step just left stays (ranked, kept from all but the nearest steps); those
        // before it go.
        let retired = if replaced {
            self.steps.len()
        } else {
            self.position.saturating_sub(1)
        };
        let gone = &self.steps[..retired];
        let entries = self.entries - gone.iter().map(Step::entries).sum::<usize>()
            + appended.iter().map(Step::entries).sum::<usize>();
        let work = self.work - gone.iter().map(|s| s.work(layout)).sum::<u64>()
            + appended.iter().map(|s| s.work(layout)).sum::<u64>();
        if entries + partial.as_ref().map_or(0, Step::entries) > room.entries {
            return Err(PlanRefused::TooManyEntries {
                limit: MAX_PLANNED_ENTRIES,
            });
        }
        if work > room.work {
            return Err(PlanRefused::TooMuchWork {
                work,
                limit: room.work,
            });
        }
        self.entries = entries;
        self.work = work;
        self.partial = partial;
        let position = if replaced {
            self.started += 1;
            self.steps.clear();
            self.parts.clear();
            self.counted = 0;
            self.rows_read.clear();
            self.retired = 0;
            // A new plan starts at its first step.
            0
        } else {
            self.retired += retired;
            self.steps.drain(..retired);
            self.parts.drain(..retired);
            self.counted = self.counted.saturating_sub(retired);
            self.position - retired
        };
        let first_new = self.steps.len();
        let added = !appended.is_empty();
        self.parts.resize(self.steps.len() + appended.len(), None);
        self.steps.extend(appended);
        self.epoch = epoch;
        self.position = position.min(self.steps.len());
        self.reads_elsewhere.clear();
        self.revision += 1;
        Ok(match (replaced, added) {
            (true, _) => Some(0),
            (false, true) => Some(first_new.saturating_sub(self.position)),
            (false, false) => None,
        })
    }

    /// Reads a batch of protocol lines against the plan as it is, changing nothing:
    /// the steps they end, the step they leave begun, and whether a `plan` line
    /// replaced the plan.
    fn read_batch(&self, lines: &[HintLine], layout: &ChunkGeometry) -> Result<Batch, PlanRefused> {
        let mut batch = Batch {
            epoch: self.epoch,
            replaced: false,
            appended: Vec::new(),
            partial: self.partial.clone(),
        };
        for line in lines {
            let (step, ends) = match line {
                // `cached` is the announcement's: the decoder refuses it from a writer.
                // `reading` moves the position once the batch is in ([`Plan::reading`]).
                HintLine::Greeting { .. } | HintLine::Cached { .. } | HintLine::Reading { .. } => {
                    continue
                }
                HintLine::ChunkRows { rows } if *rows != layout.chunk_size => {
                    return Err(PlanRefused::ChunkRows {
                        writer: *rows,
                        dataset: layout.chunk_size,
                    });
                }
                HintLine::ChunkRows { .. } => continue,
                HintLine::Plan { epoch } => {
                    batch.epoch = *epoch;
                    batch.replaced = true;
                    batch.appended.clear();
                    // A step begun in the old plan is no step of the new one.
                    batch.partial = None;
                    continue;
                }
                HintLine::Window { chunks } | HintLine::WindowPart { chunks } => {
                    if let Some(&chunk) = chunks.iter().find(|&&c| c as u64 >= layout.num_chunks())
                    {
                        return Err(PlanRefused::NoSuchChunk {
                            chunk,
                            chunks: layout.num_chunks(),
                        });
                    }
                    let mut all = match batch.partial.take() {
                        None => Vec::new(),
                        Some(Step::Window(first)) => first.to_vec(),
                        Some(Step::Rows(_)) => return Err(PlanRefused::MixedStep),
                    };
                    all.extend_from_slice(chunks);
                    let ends = matches!(line, HintLine::Window { .. });
                    (Step::Window(all.into()), ends)
                }
                HintLine::Rows { ranges } | HintLine::RowsPart { ranges } => {
                    if let Some(bad) = ranges.iter().find(|r| r.end > layout.total_rows) {
                        return Err(PlanRefused::RowsPastEnd {
                            start: bad.start,
                            end: bad.end,
                            rows: layout.total_rows,
                        });
                    }
                    let mut all = match batch.partial.take() {
                        None => Vec::new(),
                        Some(Step::Rows(first)) => first.to_vec(),
                        Some(Step::Window(_)) => return Err(PlanRefused::MixedStep),
                    };
                    all.extend_from_slice(ranges);
                    let ends = matches!(line, HintLine::Rows { .. });
                    (Step::Rows(all.into()), ends)
                }
            };
            let work = step.work(layout);
            if work > MAX_STEP_WORK {
                return Err(PlanRefused::StepTooWide {
                    work,
                    limit: MAX_STEP_WORK,
                });
            }
            match ends {
                true => batch.appended.push(step),
                false => batch.partial = Some(step),
            }
        }
        Ok(batch)
    }

    /// The writer says it reads step `step` (counted from the `plan` line): moves the
    /// position there if that is ahead of it. Returns whether it moved. A reader served
    /// from the page cache makes no reads to infer it from, and the exact rows of a
    /// large dataset are stored there ahead of it ([`super::exact`]).
    pub fn reading(&mut self, step: u64) -> bool {
        let Some(index) = (step as usize).checked_sub(self.retired) else {
            return false;
        };
        let index = index.min(self.steps.len());
        if index <= self.position {
            return false;
        }
        self.position = index;
        self.reads_elsewhere.clear();
        true
    }

    /// Where step `index` stands for as long as it is in the plan, whatever steps are
    /// retired or appended: the `plan` line it came with, and its place counted from
    /// that line.
    pub fn place(&self, index: usize) -> (u64, u64) {
        (self.started, (self.retired + index) as u64)
    }

    /// Whether the parts step `index` reads were recorded ([`Plan::resolve`]).
    pub fn is_resolved(&self, index: usize) -> bool {
        self.parts.get(index).is_some_and(Option::is_some)
    }

    /// Records the parts step `index` reads, if it is still `step`.
    pub fn resolve(&mut self, index: usize, step: &Step, parts: HashSet<PartKey>) {
        if self.steps.get(index) == Some(step) {
            self.parts[index] = Some(parts);
        }
    }

    /// Where the plan stands now: what is derived from it (its ranks, how far its
    /// lookahead was issued) holds while the mark stays.
    pub fn mark(&self) -> PlanMark {
        PlanMark {
            revision: self.revision,
            position: self.position,
        }
    }

    /// Whether step `index`, as of `revision`, is not behind the reader (the step just
    /// left counts, as in [`Horizon::chunks_ahead`]). A top-up computed on an
    /// older position or plan must not fetch what the reader has passed and the
    /// eviction has freed, nor what a new epoch needs only at its end.
    pub fn is_upcoming(&self, revision: u64, index: usize) -> bool {
        self.revision == revision && index + 1 >= self.position
    }

    fn touches(&self, index: usize, touched: &Touched, layout: &ChunkGeometry) -> bool {
        match &self.parts[index] {
            Some(parts) => touched.parts.iter().any(|p| parts.contains(p)),
            None => self.steps[index].reads_any_of(&touched.chunks, layout),
        }
    }

    /// Counts a read towards the step it belongs to (searching forward from the
    /// current step first, then backward), and moves the position there once enough
    /// reads went there. Returns whether it moved.
    pub fn observe(&mut self, touched: &Touched, layout: &ChunkGeometry) -> bool {
        if self.position < self.steps.len() && self.touches(self.position, touched, layout) {
            self.reads_elsewhere.clear();
            return false;
        }
        let forward = self.position + 1..(self.position + MATCH_HORIZON).min(self.steps.len());
        let backward = self.position.saturating_sub(MATCH_HORIZON)..self.position;
        let Some(step) = forward
            .into_iter()
            .find(|&i| self.touches(i, touched, layout))
            .or_else(|| backward.rev().find(|&i| self.touches(i, touched, layout)))
        else {
            return false;
        };
        let reads = self.reads_elsewhere.entry(step).or_default();
        *reads += 1;
        let needed = if step > self.position {
            READS_TO_ADVANCE
        } else {
            READS_TO_GO_BACK
        };
        if *reads < needed {
            return false;
        }
        self.position = step;
        self.reads_elsewhere.clear();
        true
    }

    /// The chunks the reader has finished since the last call, in this epoch: those of
    /// the window steps it has passed (behind the step just left), and those whose
    /// every row the row steps it passed have read. A plan reads each row once an epoch,
    /// so a finished chunk is not needed again until the next.
    pub fn finished_chunks(&mut self, layout: &ChunkGeometry) -> Vec<usize> {
        let passed = self.position.saturating_sub(1).min(self.steps.len());
        let mut finished = Vec::new();
        for step in &self.steps[self.counted.min(passed)..passed] {
            match step {
                Step::Window(chunks) => finished.extend(chunks.iter().map(|&c| c as usize)),
                Step::Rows(ranges) => {
                    for rows in ranges.iter() {
                        for chunk in layout.chunks_of_rows(rows.clone()) {
                            let of_chunk = layout.chunk_rows(chunk);
                            let read = rows.end.min(of_chunk.end) - rows.start.max(of_chunk.start);
                            let total = self.rows_read.entry(chunk as usize).or_default();
                            let before = *total;
                            *total += read;
                            let size = of_chunk.end - of_chunk.start;
                            if before < size && *total >= size {
                                finished.push(chunk as usize);
                            }
                        }
                    }
                }
            }
        }
        self.counted = self.counted.max(passed);
        finished
    }

    /// The steps the plan ranks, copied: the step just left, the current one and
    /// those up to [`RANK_HORIZON`] ahead. Beyond it the prefetcher fetches nothing, and
    /// ranking would cost a walk of the whole plan on every move.
    pub fn horizon(&self) -> Horizon {
        let first = self.position.saturating_sub(1).min(self.steps.len());
        let end = (self.position + RANK_HORIZON).min(self.steps.len());
        Horizon {
            steps: self.steps[first..end.max(first)].to_vec(),
            current: self.position - first,
        }
    }

    /// See [`Horizon::chunks_ahead`].
    #[cfg(test)]
    pub fn chunks_ahead(&self, layout: &ChunkGeometry) -> HashMap<usize, NextUse> {
        self.horizon().chunks_ahead(layout)
    }
}

/// The steps a plan ranks, taken from it so that ranking them holds no lock.
#[derive(Clone, Debug)]
pub struct Horizon {
    steps: Vec<Step>,
    /// Which of `steps` is the current one.
    current: usize,
}

impl Horizon {
    /// Whether every step names rows, none a window: a plan of rows fetched exactly
    /// reads only their row offsets from the cache.
    pub fn names_rows_only(&self) -> bool {
        self.steps.iter().all(|step| matches!(step, Step::Rows(_)))
    }

    /// For each chunk the plan still needs, when: [`NextUse::Current`] for the step
    /// being read; [`NextUse::JustLeft`] for the step before it, whose last rows may
    /// still be in a reader's hands when the position moves on; else how many steps
    /// ahead of the current one it is first needed. A chunk of several steps takes the
    /// soonest.
    pub fn chunks_ahead(&self, layout: &ChunkGeometry) -> HashMap<usize, NextUse> {
        let mut ahead: HashMap<usize, NextUse> = HashMap::new();
        for (index, step) in self.steps.iter().enumerate() {
            let rank = match index.cmp(&self.current) {
                Ordering::Less => NextUse::JustLeft,
                Ordering::Equal => NextUse::Current,
                Ordering::Greater => NextUse::Ahead((index - self.current) as u64),
            };
            for chunk in step.chunks(layout) {
                let soonest = ahead.entry(chunk).or_insert(rank);
                *soonest = (*soonest).min(rank);
            }
        }
        ahead
    }
}
#[cfg(test)]
mod tests;
