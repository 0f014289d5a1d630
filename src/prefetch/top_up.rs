//! The top-up: keeps the next steps of every plan downloading, in plan order, up to the
//! lookahead and the share of the budget, with the margins and edges their readers'
//! read-around takes.

use std::collections::HashSet;
use std::sync::Arc;

use scdl_format::ArrayKind;

use super::plan::Step;
use super::Prefetcher;
use crate::catalog::{Dataset, FlatDataset, MonolithicDataset};
use crate::fetch::Fetcher;
use crate::object::ObjectInfo;

/// What a step reads: its own byte ranges, the bytes it needs that serve other steps
/// too (the margins the kernel reads around its ranges in memory-mapped arrays, a
/// monolithic dataset's row offsets), the few bytes its readers' read-around takes from
/// neighbouring chunks (`edges`, worth fetching on their own where their part is much
/// larger), and whether the ranges are all known yet (a row step needs its chunks' row
/// offsets first).
#[derive(Default)]
pub(super) struct StepReads {
    pub(super) ranges: Vec<(Arc<ObjectInfo>, std::ops::Range<u64>)>,
    pub(super) read_around: Vec<(Arc<ObjectInfo>, std::ops::Range<u64>)>,
    pub(super) edges: Vec<(Arc<ObjectInfo>, std::ops::Range<u64>)>,
    pub(super) complete: bool,
}

/// Bytes added to each side of an edge: the page the kernel rounds its read-around to,
/// and the `.npy` header before a chunk's first value.
const EDGE_SLACK: u64 = 8 << 10;

impl Prefetcher {
    /// Issues prefetches for every plan's next steps, within the bounds, and records
    /// the parts of each step it could resolve for matching reads to steps.
    pub(super) fn top_up(&self) {
        let snapshot: Vec<(u64, u64, Dataset, usize, Vec<Step>)> = self
            .plans
            .lock()
            .iter()
            .map(|(handle, a)| {
                let start = a.plan.position.min(a.plan.steps.len());
                let end = (start + 1 + self.config.lookahead_steps).min(a.plan.steps.len());
                (
                    *handle,
                    a.plan.revision(),
                    a.dataset.clone(),
                    start,
                    a.plan.steps[start..end].to_vec(),
                )
            })
            .collect();
        // Resolving a monolithic step locates its virtual chunks, which ranks its parts.
        let monolithic: Vec<Arc<MonolithicDataset>> = snapshot
            .iter()
            .filter_map(|(_, _, dataset, ..)| match dataset {
                Dataset::Monolithic(dataset) => Some(dataset.clone()),
                Dataset::Chunked(_) => None,
            })
            .collect();
        let located = || -> usize { monolithic.iter().map(|d| d.known_boundaries()).sum() };
        let located_before = located();
        let max_in_flight = 2 * self.fetcher.max_concurrent_requests();
        // Bytes of the steps after the current one: the step being read is needed now,
        // whatever the share. Counted in, a step of half the cache took the whole share
        // and the next one was fetched only once the reader came to it.
        let mut ahead_bytes = 0u64;
        let mut seen = HashSet::new();
        let mut resolved = Vec::new();
        'plans: for (handle, revision, dataset, first, steps) in snapshot {
            for (offset, step) in steps.into_iter().enumerate() {
                let reads = match &dataset {
                    Dataset::Chunked(dataset) => self.step_reads(dataset, &step),
                    Dataset::Monolithic(dataset) => self.monolithic_step_reads(dataset, &step),
                };
                // The reader may have moved on since the snapshot, and the eviction
                // freed the steps it passed: those are not fetched again. Checked under
                // the lock that moves positions, so no move slips in before the
                // prefetches are issued.
                let plans = self.plans.lock();
                let upcoming = plans
                    .get(&handle)
                    .is_some_and(|a| a.plan.is_upcoming(revision, first + offset));
                if !upcoming {
                    continue;
                }
                let mut parts = HashSet::new();
                // The step's own parts queue first; its neighbours' edges after them.
                let (edges, whole_parts): (Vec<_>, Vec<_>) = reads
                    .edges
                    .iter()
                    .partition(|(_, range)| self.worth_an_edge(range));
                let around = reads.read_around.iter().chain(whole_parts);
                for ((object, range), of_the_step) in reads
                    .ranges
                    .iter()
                    .map(|r| (r, true))
                    .chain(around.map(|r| (r, false)))
                {
                    for index in self.fetcher.parts_of(range) {
                        let key = Fetcher::key(object, index);
                        if of_the_step {
                            parts.insert(key);
                        }
                        if !seen.insert(key)
                            || ahead_bytes >= self.config.max_ahead_bytes
                            || self.fetcher.in_flight_count() >= max_in_flight
                        {
                            continue;
                        }
                        if offset > 0 {
                            let part = self.fetcher.part_range(object, index);
                            ahead_bytes += part.end - part.start;
                        }
                        self.fetcher.prefetch(object, index);
                    }
                }
                for (object, range) in edges {
                    if ahead_bytes < self.config.max_ahead_bytes {
                        if offset > 0 {
                            ahead_bytes += range.end - range.start;
                        }
                        self.fetcher.prefetch_edge(object, range.clone());
                    }
                }
                drop(plans);
                if reads.complete {
                    resolved.push((handle, first + offset, step, parts));
                }
                if ahead_bytes >= self.config.max_ahead_bytes {
                    break 'plans;
                }
            }
        }
        let mut plans = self.plans.lock();
        for (handle, index, step, parts) in resolved {
            if let Some(active) = plans.get_mut(&handle) {
                active.plan.resolve(index, &step, parts);
            }
        }
        if located() != located_before {
            self.after_plans_changed(&plans);
        }
    }

    /// Whether an edge is fetched on its own: it lies within one part, and is a small
    /// share of it (else its whole part is fetched, and cached).
    pub(super) fn worth_an_edge(&self, range: &std::ops::Range<u64>) -> bool {
        let parts = self.fetcher.parts_of(range);
        parts.end - parts.start == 1 && 4 * (range.end - range.start) <= self.fetcher.part_size()
    }

    /// How far on either side of a touched page the kernel reads a memory-mapped file:
    /// half its read-ahead window, which it centres on the fault.
    fn kernel_read_around(&self) -> u64 {
        self.config.kernel_read_ahead / 2
    }

    /// The byte ranges of objects a step reads.
    fn step_reads(&self, dataset: &Arc<FlatDataset>, step: &Step) -> StepReads {
        let margin = self.kernel_read_around();
        let mut reads = StepReads {
            complete: true,
            ..StepReads::default()
        };
        match step {
            Step::Window(chunks) => {
                for &chunk in chunks {
                    let chunk = chunk as usize;
                    for kind in ArrayKind::ALL {
                        let object = dataset.array(chunk, kind);
                        reads.ranges.push((object.clone(), 0..object.size));
                    }
                    let margin = margin + EDGE_SLACK;
                    for kind in [ArrayKind::Data, ArrayKind::ColPtr] {
                        if let Some(before) = chunk.checked_sub(1).map(|c| dataset.array(c, kind)) {
                            let edge = before.size.saturating_sub(margin)..before.size;
                            reads.edges.push((before.clone(), edge));
                        }
                        if chunk + 1 < dataset.chunks.len() {
                            let after = dataset.array(chunk + 1, kind);
                            reads.edges.push((after.clone(), 0..after.size.min(margin)));
                        }
                    }
                }
            }
            Step::Rows(rows) => {
                for rows in rows {
                    for chunk in dataset.layout.chunks_of_rows(rows.clone()) {
                        let row_ptr = dataset.array(chunk, ArrayKind::RowPtr);
                        reads.ranges.push((row_ptr.clone(), 0..row_ptr.size));
                        let chunk_rows = dataset.layout.chunk_rows(chunk);
                        let local = rows.start.max(chunk_rows.start) - chunk_rows.start
                            ..rows.end.min(chunk_rows.end) - chunk_rows.start;
                        let Some(values) = self.cached_value_range(dataset, chunk, local) else {
                            reads.complete = false;
                            continue;
                        };
                        for kind in [ArrayKind::Data, ArrayKind::ColPtr] {
                            let object = dataset.array(chunk, kind);
                            let width = dataset.layout.width(kind);
                            let (start, end) = (values.start * width, values.end * width);
                            reads.ranges.push((object.clone(), start..end));
                            let around = start.saturating_sub(margin)..start;
                            reads.read_around.push((object.clone(), around));
                            let around = end..(end + margin).min(object.size);
                            reads.read_around.push((object.clone(), around));
                        }
                    }
                }
            }
        }
        reads
    }

    /// The byte ranges of a monolithic dataset's objects a step reads: a virtual chunk
    /// is its rows. The row offsets bounding each row range come first; the values and
    /// column ids they bound once those offsets are cached.
    fn monolithic_step_reads(&self, dataset: &MonolithicDataset, step: &Step) -> StepReads {
        let rows: Vec<std::ops::Range<u64>> = match step {
            Step::Window(chunks) => chunks
                .iter()
                .map(|&c| dataset.geometry.chunk_rows(c as u64))
                .collect(),
            Step::Rows(ranges) => ranges.clone(),
        };
        let mut reads = StepReads {
            complete: true,
            ..StepReads::default()
        };
        let row_ptr = dataset.array(ArrayKind::RowPtr);
        for rows in rows {
            let entry = |row: u64| self.cached_entry(row_ptr, dataset.dtypes[1], row);
            let values = dataset.value_range(&rows, entry);
            reads.complete &= values.is_some();
            self.monolithic_row_reads(dataset, &rows, values.and_then(Result::ok), &mut reads);
        }
        reads
    }

    /// Adds what reading `rows` of a monolithic dataset takes: their row offsets, and
    /// once those are known (`values`) the values and column ids they bound, with the
    /// kernel's read-around.
    pub(super) fn monolithic_row_reads(
        &self,
        dataset: &MonolithicDataset,
        rows: &std::ops::Range<u64>,
        values: Option<std::ops::Range<u64>>,
        reads: &mut StepReads,
    ) {
        let margin = self.kernel_read_around();
        let row_ptr = dataset.array(ArrayKind::RowPtr);
        reads
            .read_around
            .push((row_ptr.clone(), dataset.row_ptr_bytes(rows)));
        if let Some(values) = values {
            for kind in [ArrayKind::Data, ArrayKind::ColPtr] {
                let object = dataset.array(kind);
                let width = dataset.width(kind);
                let (start, end) = (values.start * width, values.end * width);
                reads.ranges.push((object.clone(), start..end));
                let around = start.saturating_sub(margin)..start;
                reads.read_around.push((object.clone(), around));
                // A reader going through the range in order gets the kernel's
                // asynchronous read-ahead too: a whole window past the end.
                let around = end..(end + 2 * margin).min(object.size);
                reads.read_around.push((object.clone(), around));
            }
        }
    }
}
