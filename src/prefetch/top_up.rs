//! The top-up: keeps the next steps of every plan downloading, in plan order, up to the
//! lookahead and the share of the budget, with the margins and edges their readers'
//! read-around takes.
//!
//! A pass walks the plans' steps item by item (a chunk of a window, a chunk a row range
//! spans, a monolithic row range) and stops where nothing more can be issued: the
//! downloads are all taken, or the bytes ahead reach their share. Each plan keeps a
//! cursor ([`TopUpCursor`]) at its first item not yet issued, so the next pass starts
//! there: a pass costs what it issues plus the items still downloading behind the
//! cursor, not the width of the steps (a writer's step over every row of 10,000 chunks
//! was walked whole on every download's end, the daemon's largest cost beside another
//! user's epoch). The plans are walked breadth-first, every plan's current step before
//! any plan's next one, the plans taking an item of a step in turn; each user's plans
//! may hold at most an equal share of the
//! downloads: one user's wide step cannot keep another user's next step waiting.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use scdl_format::ArrayKind;

use super::exact::ExactRange;
use super::plan::{PlanMark, Step};
use super::Prefetcher;
use crate::catalog::{Dataset, FlatDataset, MonolithicDataset};
use crate::fetch::Fetcher;
use crate::object::ObjectInfo;
use crate::parts::{ObjectId, PartKey};

/// What an item of a step reads: its own byte ranges, the bytes it needs that serve
/// other steps too (the margins the kernel reads around its ranges in memory-mapped
/// arrays, a monolithic dataset's row offsets), the few bytes its readers' read-around
/// takes from neighbouring chunks (`edges`, worth fetching on their own where their
/// part is much larger), and whether the ranges are all known yet (a row range needs
/// its chunk's row offsets first).
#[derive(Default)]
pub(super) struct StepReads {
    pub(super) ranges: Vec<(Arc<ObjectInfo>, std::ops::Range<u64>)>,
    pub(super) read_around: Vec<(Arc<ObjectInfo>, std::ops::Range<u64>)>,
    pub(super) edges: Vec<(Arc<ObjectInfo>, std::ops::Range<u64>)>,
    /// The bytes of its rows fetched exactly ([`super::exact`]), instead of `ranges`'
    /// parts and the margins around them.
    pub(super) exact: Vec<ExactRange>,
    pub(super) complete: bool,
}

/// A place in a step: its entry (a chunk of a window, or a row range) and, in a row
/// range of a chunked dataset, which chunk of its span.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Item {
    entry: usize,
    chunk: usize,
}

/// How far the top-ups have issued a plan's lookahead at one mark (revision and
/// position). Every item before (`step`, `item`) had its ranges known and every part
/// cached, downloading or started; an item issued that fails, or is evicted before its
/// step is read, is fetched again when the reader moves, or by the read itself.
pub(super) struct TopUpCursor {
    mark: PlanMark,
    /// The plan's steps from its position to the end of the lookahead, as of `mark`
    /// (a plan's steps change only with its revision): shared by the passes, not copied
    /// out of the plan for each. Copied, a plan of 17 steps of 4,096 single rows was
    /// 1 MiB per pass, and 15 % of the daemon's time with four such plans.
    steps: Arc<[Step]>,
    /// The step, counted from the plan's position, and the item in it, where the next
    /// pass starts.
    step: usize,
    item: Item,
    /// The parts of the items of `step` before `item`: the step's parts once all are,
    /// which match reads to it ([`super::plan::Plan::resolve`]).
    parts: HashSet<PartKey>,
    /// What the items before the cursor counted against
    /// [`super::PrefetchConfig::max_ahead_bytes`].
    ahead_bytes: u64,
    /// The arrays a window step in view reads whole: an edge of one of them is not
    /// fetched on its own, as its part comes whole with that step (an edge sent first
    /// had those bytes come twice).
    read_whole: HashSet<ObjectId>,
    /// Prefetches the plan started that may still be downloading: its user's share.
    started: Vec<PartKey>,
}

impl TopUpCursor {
    fn at_start(mark: PlanMark, dataset: &Dataset, steps: Arc<[Step]>) -> TopUpCursor {
        let read_whole = match dataset {
            Dataset::Chunked(dataset) => steps
                .iter()
                .flat_map(|step| match step {
                    Step::Window(chunks) => chunks.as_slice(),
                    Step::Rows(_) => &[],
                })
                .flat_map(|&chunk| {
                    ArrayKind::ALL.map(|kind| dataset.array(chunk as usize, kind).id)
                })
                .collect(),
            Dataset::Monolithic(_) => HashSet::new(),
        };
        TopUpCursor {
            mark,
            steps,
            step: 0,
            item: Item::default(),
            parts: HashSet::new(),
            ahead_bytes: 0,
            read_whole,
            started: Vec::new(),
        }
    }
}

/// Steps kept fetching ahead of the reader, at least, where rows are fetched exactly:
/// the sampler's own lookahead.
const EXACT_LOOKAHEAD_STEPS: usize = 16;

/// Bytes added to each side of an edge: the page the kernel rounds its read-around to,
/// and the `.npy` header before a chunk's first value.
const EDGE_SLACK: u64 = 8 << 10;

/// One plan in a pass: its steps in view, its cursor, and where the pass has got to.
struct Walk {
    handle: u64,
    uid: u32,
    dataset: Dataset,
    /// The index of the plan's step at its position, and the steps from there to the
    /// end of the lookahead.
    start: usize,
    steps: Arc<[Step]>,
    cursor: TopUpCursor,
    /// The step (from the plan's position) and item this pass is at.
    at: (usize, Item),
    /// An item this pass walked is not all issued: the cursor stays before it.
    behind: bool,
    /// The step whose being still ahead of the reader this pass checked.
    checked_step: Option<usize>,
    /// The plan moved or changed since the snapshot: its cursor is dropped.
    moved: bool,
    stopped: bool,
}

/// What one item's walk tells the pass.
enum Walked {
    Next,
    /// The downloads are all taken, or the bytes ahead reached their share.
    PassFull,
}

/// What a pass shares between its walks.
struct PassState {
    /// Downloads (demand reads included) past which no prefetch is issued: the sum of
    /// the users' shares, and as much again for what the shares do not hold (demand
    /// reads, edges, a share given up as another user's plan came).
    max_in_flight: usize,
    /// Downloads one user's plans may hold.
    user_share: usize,
    started_by_user: HashMap<u32, usize>,
    ahead_bytes: u64,
    seen: HashSet<PartKey>,
    resolved: Vec<(u64, usize, Step, HashSet<PartKey>)>,
}

impl Prefetcher {
    /// Issues prefetches for every plan's next steps, within the bounds, and records
    /// the parts of each step it resolved for matching reads to steps.
    pub(super) fn top_up(&self) {
        let _one_pass_at_a_time = self.top_up_pass.lock();
        #[cfg(test)]
        self.top_up_passes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The cursors are taken out under the plans' lock, which every read of a planned
        // dataset takes, and put back after: nothing is issued under it, since issuing
        // can wait (the fetcher's and the cache's locks, an earlier mount's part file
        // claimed with a header read).
        let mut walks: Vec<Walk> = self
            .plans
            .lock()
            .iter_mut()
            .map(|(handle, a)| {
                let lookahead = self.lookahead_of(&a.dataset);
                let start = a.plan.position.min(a.plan.steps.len());
                let end = (start + 1 + lookahead).min(a.plan.steps.len());
                let cursor = a.top_up.take().filter(|c| c.mark == a.plan.mark());
                let cursor = cursor.unwrap_or_else(|| {
                    let steps = a.plan.steps[start..end].into();
                    TopUpCursor::at_start(a.plan.mark(), &a.dataset, steps)
                });
                let steps = cursor.steps.clone();
                Walk {
                    handle: *handle,
                    uid: a.uid,
                    dataset: a.dataset.clone(),
                    start,
                    at: (cursor.step, cursor.item),
                    cursor,
                    steps,
                    behind: false,
                    checked_step: None,
                    moved: false,
                    stopped: false,
                }
            })
            .collect();
        walks.sort_by_key(|w| w.handle);
        let mut started_by_user: HashMap<u32, usize> = HashMap::new();
        for walk in &mut walks {
            walk.cursor
                .started
                .retain(|key| self.fetcher.is_in_flight(*key));
            *started_by_user.entry(walk.uid).or_default() += walk.cursor.started.len();
        }
        let users_walking: HashSet<u32> = walks
            .iter()
            .filter(|w| w.at.0 < w.steps.len())
            .map(|w| w.uid)
            .collect();
        let shares = 2 * self.fetcher.max_concurrent_requests();
        let mut pass = PassState {
            max_in_flight: 2 * shares,
            user_share: (shares / users_walking.len().max(1)).max(1),
            started_by_user,
            // Bytes ahead are those of the steps after the current one: the step being
            // read is needed now, whatever the share. Counted in, a step of half the
            // cache took the whole share and the next one was fetched only once the
            // reader came to it.
            ahead_bytes: walks.iter().map(|w| w.cursor.ahead_bytes).sum(),
            seen: HashSet::new(),
            resolved: Vec::new(),
        };
        let read_whole: HashSet<ObjectId> = walks
            .iter()
            .flat_map(|w| w.cursor.read_whole.iter().copied())
            .collect();
        // Resolving a monolithic step locates its virtual chunks, which ranks its parts.
        let monolithic: Vec<Arc<MonolithicDataset>> = walks
            .iter()
            .filter_map(|w| match &w.dataset {
                Dataset::Monolithic(dataset) => Some(dataset.clone()),
                Dataset::Chunked(_) => None,
            })
            .collect();
        let located = || -> usize { monolithic.iter().map(|d| d.known_boundaries()).sum() };
        let located_before = located();
        // In each round, the plans take an item in turn: walked one plan's step after
        // another, the plan of the lowest handle had its step issued first on every
        // pass, and with eight ranks on one link its rank finished a second before the
        // others.
        let rounds = walks.iter().map(|w| w.steps.len()).max().unwrap_or(0);
        'rounds: for round in 0..rounds {
            let mut walked = true;
            while walked {
                walked = false;
                for walk in walks.iter_mut() {
                    if !walk.stopped && walk.at.0 <= round && walk.at.0 < walk.steps.len() {
                        walked = true;
                        if let Walked::PassFull = self.walk_item(walk, &mut pass, &read_whole) {
                            break 'rounds;
                        }
                    }
                }
            }
        }
        let mut plans = self.plans.lock();
        for (handle, index, step, parts) in pass.resolved {
            if let Some(active) = plans.get_mut(&handle) {
                active.plan.resolve(index, &step, parts);
            }
        }
        for walk in walks {
            if let Some(active) = plans.get_mut(&walk.handle) {
                if !walk.moved && walk.cursor.mark == active.plan.mark() {
                    active.top_up = Some(walk.cursor);
                }
            }
        }
        if located() != located_before {
            self.after_plans_changed(&plans);
        }
    }

    /// Walks the item the pass is at in `walk`'s plan: issues what it reads, within the
    /// bounds, and moves the cursor past it if all of it is issued and nothing before
    /// it in this pass was left behind.
    fn walk_item(
        &self,
        walk: &mut Walk,
        pass: &mut PassState,
        read_whole: &HashSet<ObjectId>,
    ) -> Walked {
        let (step_index, item) = walk.at;
        let index = walk.start + step_index;
        if walk.checked_step != Some(step_index) {
            // The reader may have moved on since the snapshot, and the eviction freed
            // the steps it passed: those are not fetched again. A move that slips in
            // between costs at most one step's prefetches.
            let upcoming = self
                .plans
                .lock()
                .get(&walk.handle)
                .is_some_and(|a| a.plan.is_upcoming(walk.cursor.mark.revision, index));
            if !upcoming {
                walk.moved = true;
                walk.stopped = true;
                return Walked::Next;
            }
            walk.checked_step = Some(step_index);
        }
        let step = &walk.steps[step_index];
        let Some((reads, next)) = self.item_reads(&walk.dataset, step, item) else {
            // The step's end: resolved if all of it was issued.
            if !walk.behind {
                let parts = std::mem::take(&mut walk.cursor.parts);
                pass.resolved
                    .push((walk.handle, index, step.clone(), parts));
                walk.cursor.step = step_index + 1;
                walk.cursor.item = Item::default();
            }
            walk.at = (step_index + 1, Item::default());
            return Walked::Next;
        };
        #[cfg(test)]
        self.items_walked
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ahead = step_index > 0;
        let full = |pass: &PassState| {
            self.fetcher.in_flight_count() >= pass.max_in_flight
                || (ahead && pass.ahead_bytes >= self.config.max_ahead_bytes)
        };
        let share_taken = |pass: &PassState| {
            pass.started_by_user.get(&walk.uid).copied().unwrap_or(0) >= pass.user_share
        };
        if full(pass) {
            return Walked::PassFull;
        }
        if share_taken(pass) {
            walk.stopped = true;
            return Walked::Next;
        }
        let mut issued_all = reads.complete;
        let mut bytes = 0;
        let mut item_parts = Vec::new();
        // The item's own parts queue first; its neighbours' edges after them.
        let (edges, whole_parts): (Vec<_>, Vec<_>) = reads
            .edges
            .iter()
            .partition(|(_, range)| self.worth_an_edge(range));
        let around = reads.read_around.iter().chain(whole_parts);
        let mut filled = false;
        for ((object, range), of_the_step) in reads
            .ranges
            .iter()
            .map(|r| (r, true))
            .chain(around.map(|r| (r, false)))
        {
            for part in self.fetcher.parts_of(range) {
                let key = Fetcher::key(object, part);
                if of_the_step {
                    item_parts.push(key);
                }
                if !pass.seen.insert(key) {
                    continue;
                }
                if full(pass) || share_taken(pass) {
                    filled = true;
                    issued_all = false;
                    continue;
                }
                if ahead {
                    let range = self.fetcher.part_range(object, part);
                    bytes += range.end - range.start;
                    pass.ahead_bytes += range.end - range.start;
                }
                #[cfg(test)]
                self.before_issuing();
                if self.fetcher.prefetch(object, part) {
                    walk.cursor.started.push(key);
                    *pass.started_by_user.entry(walk.uid).or_default() += 1;
                } else if !self.cache.contains(key) && !self.fetcher.is_in_flight(key) {
                    // Not started, and neither cached nor downloading: it waits for
                    // room in the cache, and a later pass issues it again.
                    issued_all = false;
                }
            }
        }
        if let Dataset::Chunked(dataset) = &walk.dataset {
            for range in reads.exact {
                if full(pass) || share_taken(pass) {
                    filled = true;
                    issued_all = false;
                    break;
                }
                let issued = self.issue_exact(dataset, range);
                item_parts.extend(issued.parts);
                if ahead {
                    bytes += issued.bytes;
                    pass.ahead_bytes += issued.bytes;
                }
                if !issued.all {
                    // No room for more planned bytes: nothing after this is asked for
                    // before it, and the room's return wakes the next pass.
                    filled = true;
                    issued_all = false;
                    break;
                }
            }
        }
        for (object, range) in edges {
            if read_whole.contains(&object.id) {
                continue;
            }
            if ahead && pass.ahead_bytes >= self.config.max_ahead_bytes {
                issued_all = false;
                continue;
            }
            if ahead {
                bytes += range.end - range.start;
                pass.ahead_bytes += range.end - range.start;
            }
            self.fetcher.prefetch_edge(object, range.clone());
        }
        if issued_all && !walk.behind {
            walk.cursor.item = next;
            walk.cursor.ahead_bytes += bytes;
            walk.cursor.parts.extend(item_parts);
        } else {
            walk.behind = true;
        }
        walk.at = (step_index, next);
        if filled {
            // The user's share is taken: the plan waits for a later pass. (The pass
            // itself is full if the downloads are.)
            walk.stopped = true;
            if full(pass) {
                return Walked::PassFull;
            }
        }
        Walked::Next
    }

    #[cfg(test)]
    fn before_issuing(&self) {
        let hook = self.issue_hook.lock().clone();
        if let Some(hook) = hook {
            hook();
        }
    }

    /// The steps after the current one a plan of `dataset` keeps fetching: the
    /// configured lookahead, or for rows fetched exactly at least
    /// [`EXACT_LOOKAHEAD_STEPS`]. Those steps are small (a few hundred KB of rows where a
    /// window is chunks), and a link of 20 ms a response needs megabytes on their way:
    /// four steps of 64 random rows were 6 ms of a 250 MB/s link, and the reader caught
    /// up with them at every step.
    fn lookahead_of(&self, dataset: &Dataset) -> usize {
        let lookahead = self.config.lookahead_steps;
        match dataset {
            Dataset::Chunked(flat) if self.fetches_rows_exactly(flat) => {
                lookahead.max(EXACT_LOOKAHEAD_STEPS)
            }
            _ => lookahead,
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

    /// The reads of the item at `at` of a step, and the item after it; `None` past the
    /// step's last item.
    fn item_reads(&self, dataset: &Dataset, step: &Step, at: Item) -> Option<(StepReads, Item)> {
        let next_entry = Item {
            entry: at.entry + 1,
            chunk: 0,
        };
        match (dataset, step) {
            (Dataset::Chunked(dataset), Step::Window(chunks)) => {
                let chunk = *chunks.get(at.entry)? as usize;
                Some((self.window_chunk_reads(dataset, chunk), next_entry))
            }
            (Dataset::Chunked(dataset), Step::Rows(ranges)) => {
                let mut at = at;
                loop {
                    let rows = ranges.get(at.entry)?;
                    let span = dataset.layout.chunks_of_rows(rows.clone());
                    if at.chunk < span.len() {
                        let chunk = span.start + at.chunk;
                        let next = if at.chunk + 1 < span.len() {
                            Item {
                                entry: at.entry,
                                chunk: at.chunk + 1,
                            }
                        } else {
                            Item {
                                entry: at.entry + 1,
                                chunk: 0,
                            }
                        };
                        return Some((self.row_chunk_reads(dataset, rows, chunk), next));
                    }
                    at = Item {
                        entry: at.entry + 1,
                        chunk: 0,
                    };
                }
            }
            (Dataset::Monolithic(dataset), step) => {
                let rows = match step {
                    Step::Window(chunks) => {
                        dataset.geometry.chunk_rows(*chunks.get(at.entry)? as u64)
                    }
                    Step::Rows(ranges) => ranges.get(at.entry)?.clone(),
                };
                Some((self.monolithic_rows_reads(dataset, &rows), next_entry))
            }
        }
    }

    /// What a window step reads of one chunk: its arrays whole, and the edges of its
    /// neighbours the read-around takes.
    fn window_chunk_reads(&self, dataset: &Arc<FlatDataset>, chunk: usize) -> StepReads {
        let mut reads = StepReads {
            complete: true,
            ..StepReads::default()
        };
        for kind in ArrayKind::ALL {
            let object = dataset.array(chunk, kind);
            reads.ranges.push((object.clone(), 0..object.size));
        }
        let margin = self.kernel_read_around() + EDGE_SLACK;
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
        reads
    }

    /// What a row range reads of one chunk it spans: the chunk's row offsets, and once
    /// they are known the values and column ids of its rows there, with the read-around.
    fn row_chunk_reads(
        &self,
        dataset: &Arc<FlatDataset>,
        rows: &std::ops::Range<u64>,
        chunk: usize,
    ) -> StepReads {
        let margin = self.kernel_read_around();
        let mut reads = StepReads {
            complete: true,
            ..StepReads::default()
        };
        let row_ptr = dataset.array(chunk, ArrayKind::RowPtr);
        reads.ranges.push((row_ptr.clone(), 0..row_ptr.size));
        let chunk_rows = dataset.layout.chunk_rows(chunk);
        let local = rows.start.max(chunk_rows.start) - chunk_rows.start
            ..rows.end.min(chunk_rows.end) - chunk_rows.start;
        let Some(values) = self.cached_value_range(dataset, chunk, local) else {
            reads.complete = false;
            return reads;
        };
        if self.fetches_rows_exactly(dataset) {
            reads.exact = self.exact_ranges(dataset, chunk, &values);
            let in_chunk = rows.start.max(chunk_rows.start)..rows.end.min(chunk_rows.end);
            let (pages, chunks) = self.row_offset_pages(dataset, &in_chunk);
            // The pages may reach into a neighbour (a row at a chunk's end, or chunks not
            // a whole number of pages): its offsets are fetched whole and checked before
            // the pages can be served.
            let mut checked = true;
            for other in chunks.into_iter().filter(|&c| c != chunk) {
                let row_ptr = dataset.array(other, ArrayKind::RowPtr);
                reads.ranges.push((row_ptr.clone(), 0..row_ptr.size));
                checked &= self.row_offsets_checked(dataset, other);
            }
            if checked {
                reads.exact.push(pages);
            } else {
                reads.complete = false;
            }
            return reads;
        }
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
        reads
    }

    /// What a row range of a monolithic dataset reads: the row offsets bounding it
    /// first; the values and column ids they bound once those offsets are cached.
    fn monolithic_rows_reads(
        &self,
        dataset: &MonolithicDataset,
        rows: &std::ops::Range<u64>,
    ) -> StepReads {
        let mut reads = StepReads {
            complete: true,
            ..StepReads::default()
        };
        let row_ptr = dataset.array(ArrayKind::RowPtr);
        let entry = |row: u64| self.cached_entry(row_ptr, dataset.dtypes[1], row);
        let values = dataset.value_range(rows, entry);
        reads.complete = values.is_some();
        self.monolithic_row_reads(dataset, rows, values.and_then(Result::ok), &mut reads);
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

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Arc};
    use std::time::{Duration, Instant};

    use object_store::local::LocalFileSystem;
    use object_store::path::Path as ObjectPath;
    use object_store::{GetResult, ObjectStore};
    use parking_lot::Mutex;
    use scdl_format::ArrayKind;

    use crate::catalog::{Dataset, DirMode};
    use crate::fetch::Fetcher;
    use crate::fs::{FsCore, Ownership};
    use crate::mount::{assemble, MountSettings};
    use crate::prefetch::{Prefetcher, Viewer};
    use crate::store::wrapper::{GetRequest, HookedStore, StoreHook};
    use crate::synthetic::SyntheticDataset;

    const ROOT: u64 = 1;

    /// A small chunked dataset: 2,500 rows in chunks of 300.
    fn small_dataset() -> SyntheticDataset {
        SyntheticDataset {
            rows: 2_500,
            genes: 3_000,
            chunk_rows: 300,
            mean_values: 60,
            seed: 11,
        }
    }

    /// The core of a mount of a small chunked dataset `ds` in a local folder.
    fn core_of_a_dataset(source: &std::path::Path, cache: &std::path::Path) -> FsCore {
        small_dataset().write_chunked(&source.join("ds")).unwrap();
        core_over(
            Arc::new(LocalFileSystem::new_with_prefix(source).unwrap()),
            cache,
        )
    }

    /// Rows of [`core_of_many_chunks`]' dataset: 600 chunks of 4 rows.
    const MANY_ROWS: u64 = 2_400;

    /// The core of a mount of a dataset `ds` of 600 chunks of 4 rows, discovered, whose
    /// reads then wait while the flag returned is set: what the top-up started stays in
    /// flight.
    async fn core_of_many_chunks_downloads_held(
        source: &std::path::Path,
        cache: &std::path::Path,
    ) -> (FsCore, Arc<AtomicBool>) {
        let gate = Arc::new(AtomicBool::new(false));
        SyntheticDataset {
            rows: MANY_ROWS,
            genes: 500,
            chunk_rows: 4,
            mean_values: 30,
            seed: 12,
        }
        .write_chunked(&source.join("ds"))
        .unwrap();
        let local: Arc<dyn ObjectStore> =
            Arc::new(LocalFileSystem::new_with_prefix(source).unwrap());
        let core = core_over(
            Arc::new(HookedStore::new(local, GatedReads(gate.clone()))),
            cache,
        );
        hint_file(&core).await;
        gate.store(true, Ordering::SeqCst);
        (core, gate)
    }

    /// Holds every read while its flag is set.
    #[derive(Debug)]
    struct GatedReads(Arc<AtomicBool>);

    #[async_trait::async_trait]
    impl StoreHook for GatedReads {
        async fn get(&self, request: GetRequest<'_>) -> object_store::Result<GetResult> {
            while self.0.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            request.send().await
        }
    }

    fn core_over(store: Arc<dyn ObjectStore>, cache: &std::path::Path) -> FsCore {
        core_over_a_cache_of(store, cache, 256 << 20, false)
    }

    /// `allow_other`: as `--allow-other`, a mount other users may read.
    fn core_over_a_cache_of(
        store: Arc<dyn ObjectStore>,
        cache: &std::path::Path,
        cache_bytes: u64,
        allow_other: bool,
    ) -> FsCore {
        let settings = MountSettings {
            fs_name: "top-up-test".into(),
            endpoint: None,
            view: DirMode::Discover,
            cache_dir: cache.to_owned(),
            cache_reset: false,
            cache_bytes,
            max_cached_chunks: None,
            part_size: 64 << 10,
            max_concurrent_requests: 8,
            allow_other,
            allow_root: false,
            ownership: Ownership::of_mounting_user(),
            fuse_threads: 1,
            prefetch_lookahead_steps: 2,
            read_timeout: Duration::from_secs(15),
            fetch_memory: 64 << 20,
            read_ahead: None,
            cache_read_around: 0,
            metadata_ttl: None,
            users: Arc::new(crate::users::Users::unwatched()),
            keys_in_order: false,
        };
        let (core, _observer) =
            tokio::task::block_in_place(|| assemble(store, ObjectPath::from(""), &settings, None))
                .unwrap();
        core
    }

    /// Issuing a prefetch can wait (starting a download takes the fetcher's and the
    /// cache's locks, and claiming an earlier mount's part file reads its header from
    /// disk): the top-up issues outside the plans' lock, which every read of a planned
    /// dataset and every status takes, so none of them waits for it.
    /// A handle of the dataset's hint file, as a reader's sampler opens it.
    async fn open_hint_file(core: &FsCore) -> u64 {
        core.open(hint_file(core).await).unwrap().handle
    }

    /// The inode of the dataset's hint file.
    async fn hint_file(core: &FsCore) -> u64 {
        let ds = core.lookup(ROOT, OsStr::new("ds")).await.unwrap();
        let hints = core
            .lookup(ds.attr.ino.0, OsStr::new(scdl_format::hint::HINT_FILE))
            .await
            .unwrap();
        hints.attr.ino.0
    }

    /// A handle of the dataset's hint file opened by user `uid`, with `plan` written.
    async fn write_a_plan_as(core: &FsCore, uid: u32, plan: &str) -> u64 {
        let handle = core.open_as(hint_file(core).await, uid).unwrap().handle;
        core.write(handle, format!("scdlfs-hints 1\nplan 0\n{plan}").as_bytes())
            .unwrap();
        handle
    }

    /// Runs top-up passes `pause` apart until one walks no item: whether one did within
    /// 20 s.
    async fn top_up_until_a_pass_walks_nothing(prefetcher: &Prefetcher, pause: Duration) -> bool {
        let walked = || prefetcher.items_walked.load(Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let before = walked();
            prefetcher.top_up();
            if walked() == before {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// A pass walks what it can issue, not the width of the steps: a plan of steps over
    /// every row of 600 chunks costs each pass the items still downloading behind its
    /// cursor, not its 1,800 items, while its downloads are held and while they go on (a
    /// writer's plan of wide steps was walked whole on every download's end).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pass_walks_what_it_can_issue_not_the_width_of_the_steps() {
        let (source, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (core, gate) = core_of_many_chunks_downloads_held(source.path(), cache.path()).await;
        let every_row = format!("rows 0 {MANY_ROWS}\n").repeat(3);
        let handle = write_a_plan_as(&core, 0, &every_row).await;
        let prefetcher = core.prefetcher().clone();
        for _ in 0..20 {
            prefetcher.top_up();
        }
        let passes = prefetcher.top_up_passes.load(Ordering::Relaxed);
        let walked = prefetcher.items_walked.load(Ordering::Relaxed);
        let max_in_flight = 2 * prefetcher.fetcher.max_concurrent_requests() as u64;
        assert!(
            prefetcher.fetcher.in_flight_count() as u64 >= max_in_flight,
            "the plan's prefetches did not take the downloads"
        );
        assert!(
            walked <= passes * 2 * max_in_flight,
            "{passes} passes walked {walked} items with the downloads held"
        );
        // The downloads go on until the lookahead is all issued: the items cached
        // behind the cursor are not walked again.
        gate.store(false, Ordering::SeqCst);
        assert!(
            top_up_until_a_pass_walks_nothing(&prefetcher, Duration::from_millis(2)).await,
            "the lookahead was never all issued"
        );
        let passes = prefetcher.top_up_passes.load(Ordering::Relaxed);
        let walked = prefetcher.items_walked.load(Ordering::Relaxed);
        assert!(
            walked <= passes * 2 * max_in_flight,
            "{passes} passes walked {walked} items while the downloads went on"
        );
        core.release(handle);
    }

    /// One user's step over every row, which alone would take every download, leaves
    /// another user's plan its share: that user's current and next steps are issued.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn another_users_next_step_is_issued_while_one_users_wide_step_fills_the_downloads() {
        let (source, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (core, gate) = core_of_many_chunks_downloads_held(source.path(), cache.path()).await;
        let wide = write_a_plan_as(&core, 0, &format!("rows 0 {MANY_ROWS}\n").repeat(3)).await;
        let prefetcher = core.prefetcher().clone();
        prefetcher.top_up();
        let other = write_a_plan_as(&core, 4242, "window 599\nwindow 597\n").await;
        for _ in 0..3 {
            prefetcher.top_up();
        }
        let dataset = match &prefetcher.plans.lock()[&other].dataset {
            Dataset::Chunked(dataset) => dataset.clone(),
            Dataset::Monolithic(_) => unreachable!("a chunked dataset"),
        };
        for chunk in [599, 597] {
            for kind in ArrayKind::ALL {
                let key = Fetcher::key(dataset.array(chunk, kind), 0);
                assert!(
                    prefetcher.fetcher.is_in_flight(key),
                    "chunk {chunk}'s {kind:?} was not issued beside the wide step"
                );
            }
        }
        gate.store(false, Ordering::SeqCst);
        core.release(wide);
        core.release(other);
    }

    /// Two ranks' plans (one user), each of a current step wider than the downloads a
    /// pass may start: the plans take an item of their steps in turn, so both ranks'
    /// steps are downloading, not the first plan's alone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn plans_of_one_user_take_the_downloads_of_a_pass_in_turn() {
        let (source, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (core, gate) = core_of_many_chunks_downloads_held(source.path(), cache.path()).await;
        let prefetcher = core.prefetcher().clone();
        let file = hint_file(&core).await;
        let (first, second) = (
            core.open_as(file, 0).unwrap().handle,
            core.open_as(file, 0).unwrap().handle,
        );
        let chunks = (MANY_ROWS / 4) as usize;
        let window = |chunks: std::ops::Range<usize>| {
            let ids: Vec<String> = chunks.map(|chunk| chunk.to_string()).collect();
            format!("scdlfs-hints 1\nplan 0\nwindow {}\n", ids.join(" "))
        };
        {
            // Both plans are there before the first pass.
            let _no_pass_yet = prefetcher.top_up_pass.lock();
            for (handle, chunks) in [(first, 0..chunks / 2), (second, chunks / 2..chunks)] {
                core.write(handle, window(chunks).as_bytes()).unwrap();
            }
        }
        prefetcher.top_up();
        let dataset = match &prefetcher.plans.lock()[&first].dataset {
            Dataset::Chunked(dataset) => dataset.clone(),
            Dataset::Monolithic(_) => unreachable!("a chunked dataset"),
        };
        let issued = |chunks: std::ops::Range<usize>| {
            chunks
                .filter(|&chunk| {
                    let values = dataset.array(chunk, ArrayKind::Data);
                    prefetcher.fetcher.is_in_flight(Fetcher::key(values, 0))
                })
                .count()
        };
        let (of_first, of_second) = (issued(0..chunks / 2), issued(chunks / 2..chunks));
        assert!(
            of_first + of_second < chunks,
            "the pass could issue both steps whole"
        );
        assert!(
            of_first.abs_diff(of_second) <= 1,
            "chunks issued: {of_first} of the first plan's step, {of_second} of the second's"
        );
        gate.store(false, Ordering::SeqCst);
        core.release(first);
        core.release(second);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_prefetch_being_issued_holds_no_lock_that_reads_or_status_take() {
        let (source, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let core = core_of_a_dataset(source.path(), cache.path());
        let (issuing, issued) = mpsc::channel();
        let (release, released) = mpsc::channel::<()>();
        let released = Mutex::new(released);
        *core.prefetcher().issue_hook.lock() = Some(Arc::new(move || {
            let _ = issuing.send(());
            // Until the test lets go (drops `release`); at most a while.
            let _ = released.lock().recv_timeout(Duration::from_secs(30));
        }));
        let handle = open_hint_file(&core).await;
        core.write(handle, b"scdlfs-hints 1\nplan 0\nwindow 1\nwindow 2\n")
            .unwrap();
        issued
            .recv_timeout(Duration::from_secs(20))
            .expect("the plan's prefetches were issued");

        let prefetcher = core.prefetcher().clone();
        let (answer, answered) = mpsc::channel();
        std::thread::spawn(move || answer.send(prefetcher.plan_status(Viewer::All).len()));
        let plans = answered.recv_timeout(Duration::from_secs(5));
        drop(release);
        assert_eq!(
            plans,
            Ok(1),
            "the status waited for the prefetch being issued"
        );
        core.release(handle);
    }

    /// A plan of four steps, each over every row of the dataset.
    fn write_a_plan_over_every_row(core: &FsCore, handle: u64) {
        let every_row = "rows 0 2500\n".repeat(4);
        core.write(
            handle,
            format!("scdlfs-hints 1\nplan 0\n{every_row}").as_bytes(),
        )
        .unwrap();
    }

    /// A plan that neither moved nor changed costs a later pass no work once its
    /// lookahead is all issued: a writer's plan of steps over every row, which never
    /// reads, is not walked again on every move of other readers or every download's
    /// end (issue 30: it doubled the daemon's CPU beside another user's epoch).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_plan_that_has_not_moved_costs_a_later_top_up_no_work() {
        let (source, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let core = core_of_a_dataset(source.path(), cache.path());
        let handle = open_hint_file(&core).await;
        write_a_plan_over_every_row(&core, handle);

        let prefetcher = core.prefetcher().clone();
        let expansions = || prefetcher.items_walked.load(Ordering::Relaxed);
        // Its parts download and its row offsets arrive: passes expand its steps until
        // all are resolved and issued.
        assert!(
            top_up_until_a_pass_walks_nothing(&prefetcher, Duration::from_millis(50)).await,
            "every top-up pass expanded the steps of a plan that had not moved"
        );
        let before = expansions();
        for _ in 0..10 {
            prefetcher.top_up();
        }
        assert_eq!(
            expansions(),
            before,
            "later passes expanded its steps again"
        );
        core.release(handle);
    }

    /// The eviction ranks of a plan that neither moved nor changed are not computed
    /// again when another plan's change makes the ranks stale: a writer's plan of steps
    /// over every row costs each move of another reader no walk of its steps.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_plan_that_has_not_moved_is_not_ranked_again() {
        let (source, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let core = core_of_a_dataset(source.path(), cache.path());
        let handle = open_hint_file(&core).await;
        write_a_plan_over_every_row(&core, handle);
        let prefetcher = core.prefetcher().clone();
        let ranked = || prefetcher.horizons_ranked.load(Ordering::Relaxed);
        prefetcher.rank_plans();
        let once = ranked();
        assert!(once >= 1, "the plan was never ranked");
        for _ in 0..5 {
            prefetcher.rank_plans();
        }
        assert_eq!(ranked(), once, "the plan's steps were ranked again");

        core.write(handle, b"rows 0 300\n").unwrap();
        prefetcher.rank_plans();
        assert!(ranked() > once, "a plan that changed kept its old ranks");
        core.release(handle);
    }

    /// On a mount other users may read, one user's current step protects at most an
    /// equal share of the cache budget (one share more for readers without a plan): a
    /// plan whose step spans every row
    /// and is never read leaves the rest of the cache to other users' reads and
    /// prefetches (issue 42: it protected everything cached, and once the cache was full
    /// other users got no prefetch and their parts lived in memory only).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_users_current_step_protects_at_most_their_share_of_the_cache() {
        let (source, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        small_dataset()
            .write_chunked(&source.path().join("ds"))
            .unwrap();
        let dataset_bytes: u64 = bytes_under(&source.path().join("ds"));
        let budget = dataset_bytes / 2;
        let core = core_over_a_cache_of(
            Arc::new(LocalFileSystem::new_with_prefix(source.path()).unwrap()),
            cache.path(),
            budget,
            true,
        );
        let handle = write_a_plan_as(&core, 4242, "rows 0 2500\n").await;
        let dataset = match &core.prefetcher().plans.lock()[&handle].dataset {
            Dataset::Chunked(dataset) => dataset.clone(),
            Dataset::Monolithic(_) => unreachable!("a chunked dataset"),
        };
        let chunk_bytes = |chunk: usize| -> u64 {
            ArrayKind::ALL
                .iter()
                .map(|kind| dataset.array(chunk, *kind).size)
                .sum()
        };
        let prefetcher = core.prefetcher().clone();
        prefetcher.rank_plans();
        let protected: u64 = (0..dataset.chunks.len())
            .filter(|&chunk| {
                let group = dataset.array(chunk, ArrayKind::Data).group.unwrap();
                crate::cache::EvictionAdvisor::next_use(
                    prefetcher.advice.as_ref(),
                    crate::cache::Unit::Group(group),
                ) == Some(crate::cache::NextUse::Current)
            })
            .map(chunk_bytes)
            .sum();
        assert!(protected > 0, "the step being read protects nothing");
        assert!(
            protected <= budget / 2,
            "one user's step protects {protected} bytes of a {budget}-byte cache"
        );
        core.release(handle);
    }

    /// The bytes of the files under `dir`.
    fn bytes_under(dir: &std::path::Path) -> u64 {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|entry| match entry.metadata().unwrap() {
                meta if meta.is_dir() => bytes_under(&entry.path()),
                meta => meta.len(),
            })
            .sum()
    }

    /// A panic in the prefetcher's loop is contained: logged, counted, and the loop
    /// goes on, so a later plan's prefetches are still issued (it ended prefetch for
    /// the rest of the mount, silently).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panic_in_the_prefetchers_loop_ends_no_later_prefetch() {
        let (source, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let core = core_of_a_dataset(source.path(), cache.path());
        let (issuing, issued) = mpsc::channel();
        let panicked = AtomicBool::new(false);
        let issuing = Mutex::new(issuing);
        *core.prefetcher().issue_hook.lock() = Some(Arc::new(move || {
            if !panicked.swap(true, Ordering::SeqCst) {
                let _ = issuing.lock().send(false);
                panic!("a bug in the top-up");
            }
            let _ = issuing.lock().send(true);
        }));
        let handle = open_hint_file(&core).await;
        core.write(handle, b"scdlfs-hints 1\nplan 0\nwindow 1\n")
            .unwrap();
        assert_eq!(
            issued.recv_timeout(Duration::from_secs(20)),
            Ok(false),
            "the first prefetch was never issued"
        );
        core.write(handle, b"window 5\nwindow 6\n").unwrap();
        assert_eq!(
            issued.recv_timeout(Duration::from_secs(20)),
            Ok(true),
            "no prefetch was issued after the panic"
        );
        let metrics = core.prefetcher().metrics.snapshot();
        assert_eq!(metrics.prefetcher_panics, 1, "the panic was not counted");
        core.release(handle);
    }
}
