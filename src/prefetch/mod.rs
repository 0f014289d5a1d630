//! The prefetcher: keeps what readers will need next arriving before they need it.
//!
//! Readers announce their order through hint files ([`plan`]); the prefetcher keeps the
//! next steps of every plan downloading, in plan order, up to a lookahead of steps and a
//! share of the cache budget, and it tells the cache which chunks to evict first (those
//! no plan needs again, then those needed furthest ahead; never those of a step being
//! read). The reader's position comes from the reads actually served, so a sampler that
//! runs ahead of its workers does not drag the prefetch along. Readers that give no hint
//! get sequential read-ahead per open handle ([`sequential`]), and a flat chunk they
//! touch at scattered places is fetched whole ([`scatter`]) while that keeps paying.
//!
//! A monolithic dataset's plan names virtual chunks and rows, whose bytes the row
//! offsets locate: the prefetcher fetches the parts of `row_ptr.npy` a step needs, then
//! the values they bound. Its parts have no cache group: each is ranked as the virtual
//! chunks it holds bytes of are, once the offsets of their ends were read.
//!
//! What hint writers can make it do is bounded per handle and per user ([`budget`]),
//! and the eviction ranks the plans imply are computed by the prefetcher's own task
//! from a snapshot of the plans, outside the lock that reads take to move positions.
//!
//! Prefetches use the fetcher's low priority, which never delays a demand read at the
//! download slots; a new plan's are held to a few while its reader's first reads go
//! over the link ([`crate::fetch::Fetcher::begin_opening`]).

pub mod budget;
pub mod plan;
pub mod row_offsets;
pub mod scatter;
pub mod sequential;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::{Mutex, RwLock};
use scdl_format::hint::HintLine;
use scdl_format::ArrayKind;
use serde::{Deserialize, Serialize};

use crate::cache::{DiskCache, EvictionAdvisor, NextUse, Recency, Unit};
use crate::catalog::{Dataset, FileContent, FlatDataset, MonolithicDataset};
use crate::error::PlanRefused;
use crate::fetch::Fetcher;
use crate::metrics::Metrics;
use crate::object::ObjectInfo;
use crate::parts::{GroupId, PartKey};
use crate::planner_wake::PlannerWake;
use crate::row_offset_check::RowOffsetCheck;
use crate::view::{plan_read, Piece, ReadPlan};
use budget::{
    HintBudget, MAX_HANDLE_WORK, MAX_USER_WORK, PLAN_STARTS_PER_SECOND, PLAN_START_BURST,
};
use plan::{Plan, Room, Step, Touched, MAX_PLANNED_ENTRIES};
use row_offsets::KeptRowOffsets;

/// What a step reads: its own byte ranges, the bytes it needs that serve other steps
/// too (the margins the kernel reads around its ranges in memory-mapped arrays, a
/// monolithic dataset's row offsets), the few bytes its readers' read-around takes from
/// neighbouring chunks (`edges`, worth fetching on their own where their part is much
/// larger), and whether the ranges are all known yet (a row step needs its chunks' row
/// offsets first).
#[derive(Default)]
struct StepReads {
    ranges: Vec<(Arc<ObjectInfo>, std::ops::Range<u64>)>,
    read_around: Vec<(Arc<ObjectInfo>, std::ops::Range<u64>)>,
    edges: Vec<(Arc<ObjectInfo>, std::ops::Range<u64>)>,
    complete: bool,
}

/// Bytes added to each side of an edge: the page the kernel rounds its read-around to,
/// and the `.npy` header before a chunk's first value.
const EDGE_SLACK: u64 = 8 << 10;
/// The page the kernel reads memory-mapped files in.
const PAGE: u64 = 4096;
use scatter::{Decision, ScatterDetector};
use sequential::SequentialWindow;

/// How the prefetcher is bounded.
#[derive(Clone, Copy, Debug)]
pub struct PrefetchConfig {
    /// Plan steps kept fetching ahead of the current one.
    pub lookahead_steps: usize,
    /// Bytes kept fetching ahead, at most (a share of the cache budget).
    pub max_ahead_bytes: u64,
    /// Largest sequential read-ahead window of a hint-less handle.
    pub max_sequential_window: u64,
    /// The kernel's read-ahead for the mount ([`crate::fs::read_ahead`]): a fault in a
    /// memory-mapped file reads this much, centred on the fault, and an in-order reader
    /// gets as much again ahead. The margins of every step follow it.
    pub kernel_read_ahead: u64,
}

struct ActivePlan {
    dataset: Dataset,
    plan: Plan,
    /// Who opened the hint handle: whose budget the plan spends.
    uid: u32,
}

/// Whose plans a status shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Viewer {
    /// Root and the mounting user see every plan.
    All,
    /// Any other user sees only their own.
    User(u32),
}

/// What `scdlfs status` shows of one plan.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PlanStatus {
    /// Absent from the JSON of daemons older than this field.
    #[serde(default)]
    pub uid: u32,
    pub dataset: String,
    pub epoch: u64,
    pub steps: usize,
    pub position: usize,
}

pub struct Prefetcher {
    fetcher: Arc<Fetcher>,
    cache: Arc<DiskCache>,
    row_offset_check: Arc<RowOffsetCheck>,
    metrics: Arc<Metrics>,
    config: PrefetchConfig,
    plans: Mutex<HashMap<u64, ActivePlan>>,
    plan_count: AtomicUsize,
    /// Ranks of groups and lone parts derived from the plans, read by the cache on
    /// eviction.
    advice: Arc<Advice>,
    /// Which dataset chunk each cache group is, for the datasets that have plans.
    chunk_of_group: Mutex<HashMap<GroupId, (Arc<FlatDataset>, usize)>>,
    /// Wakes [`drive`]; rung here, by the fetcher when a download ends, and by the
    /// row-offset check when a chunk's verdict is new.
    wake: PlannerWake,
    /// Which flat chunks hint-less readers take at scattered places.
    scatter: Mutex<ScatterDetector>,
    /// Chunks' row offsets, for the plans' steps of rows.
    row_offsets: KeptRowOffsets,
    /// What each user's hint writers may still do.
    budget: HintBudget,
    /// The plans changed since [`Advice::ranks`] was computed: [`drive`] computes them
    /// again, so that no read or hint write waits on it.
    ranks_stale: AtomicBool,
}

#[derive(Default)]
struct Advice {
    ranks: RwLock<HashMap<Unit, NextUse>>,
    /// By plan (its hint handle): the units of the chunks it has finished this epoch
    /// ([`Plan::finished_chunks`]), which rank [`NextUse::Done`] unless a plan's steps
    /// rank them otherwise.
    done: RwLock<HashMap<u64, HashSet<Unit>>>,
}

impl EvictionAdvisor for Advice {
    fn next_use(&self, unit: Unit) -> Option<NextUse> {
        if let Some(rank) = self.ranks.read().get(&unit) {
            return Some(*rank);
        }
        let done = self.done.read();
        done.values()
            .any(|units| units.contains(&unit))
            .then_some(NextUse::Done)
    }
}

impl Prefetcher {
    /// Must be called within the runtime, which then drives the prefetches.
    pub fn new(
        fetcher: Arc<Fetcher>,
        cache: Arc<DiskCache>,
        row_offset_check: Arc<RowOffsetCheck>,
        wake: PlannerWake,
        metrics: Arc<Metrics>,
        config: PrefetchConfig,
    ) -> Arc<Prefetcher> {
        let prefetcher = Arc::new(Prefetcher {
            fetcher,
            cache,
            row_offset_check,
            metrics,
            config,
            plans: Mutex::new(HashMap::new()),
            plan_count: AtomicUsize::new(0),
            advice: Arc::default(),
            chunk_of_group: Mutex::new(HashMap::new()),
            wake: wake.clone(),
            scatter: Mutex::new(ScatterDetector::new(config.kernel_read_ahead)),
            row_offsets: KeptRowOffsets::default(),
            budget: HintBudget::default(),
            ranks_stale: AtomicBool::new(false),
        });
        tokio::spawn(drive(Arc::downgrade(&prefetcher), wake));
        prefetcher
    }

    /// What each user's hint writers may still do: hint handles are counted by the
    /// filesystem core, which opens and closes them.
    pub fn budget(&self) -> &HintBudget {
        &self.budget
    }

    /// Applies hint lines written on handle `handle`, opened by `uid`. All or nothing.
    pub fn apply(
        &self,
        handle: u64,
        uid: u32,
        dataset: &Dataset,
        lines: &[HintLine],
    ) -> Result<(), PlanRefused> {
        let geometry = dataset.geometry();
        let new_epoch = lines
            .iter()
            .any(|line| matches!(line, HintLine::Plan { .. }));
        if new_epoch && !self.budget.start_plan(uid, Instant::now()) {
            return Err(PlanRefused::StartsTooFast {
                per_second: PLAN_STARTS_PER_SECOND,
                burst: PLAN_START_BURST,
            });
        }
        if new_epoch {
            // A new epoch: what the plan read in the last one is needed again. (Cleared
            // even if the batch is refused: that only ranks the chunks as unread.)
            self.advice.done.write().remove(&handle);
        }
        let mut plans = self.plans.lock();
        let (mut others_entries, mut users_work) = (0, 0);
        for (_, active) in plans.iter().filter(|(other, _)| **other != handle) {
            others_entries += active.plan.entries();
            if active.uid == uid {
                users_work += active.plan.work();
            }
        }
        let room = Room {
            entries: MAX_PLANNED_ENTRIES.saturating_sub(others_entries),
            work: MAX_HANDLE_WORK.min(MAX_USER_WORK.saturating_sub(users_work)),
        };
        let changed_ahead = match plans.get_mut(&handle) {
            Some(active) => active.plan.apply(lines, &geometry, room)?,
            None => {
                let mut plan = Plan::default();
                plan.apply(lines, &geometry, room)?;
                if plan.steps.is_empty() {
                    // A greeting alone announces nothing.
                    return Ok(());
                }
                if let Dataset::Chunked(flat) = dataset {
                    if !plans.values().any(|a| a.dataset.same(dataset)) {
                        let mut index = self.chunk_of_group.lock();
                        for (chunk, objects) in flat.chunks.iter().enumerate() {
                            if let Some(group) = objects[0].group {
                                index.insert(group, (flat.clone(), chunk));
                            }
                        }
                    }
                }
                let dataset = dataset.clone();
                plans.insert(handle, ActivePlan { dataset, plan, uid });
                Some(0)
            }
        };
        if new_epoch {
            self.fetcher.begin_opening();
        }
        // Steps beyond the ranks' horizon or the prefetch's reach change neither yet:
        // the position's moves bring them in.
        let Some(distance) = changed_ahead else {
            return Ok(());
        };
        if distance < plan::RANK_HORIZON {
            self.after_plans_changed(&plans);
        }
        drop(plans);
        if distance <= self.config.lookahead_steps {
            self.wake.ring();
        }
        Ok(())
    }

    pub fn drop_plan(&self, handle: u64) {
        let mut plans = self.plans.lock();
        plans.remove(&handle);
        self.advice.done.write().remove(&handle);
        self.chunk_of_group.lock().retain(|_, (dataset, _)| {
            plans
                .values()
                .any(|a| matches!(&a.dataset, Dataset::Chunked(d) if Arc::ptr_eq(d, dataset)))
        });
        self.after_plans_changed(&plans);
    }

    /// The plans `viewer` may see.
    pub fn plan_status(&self, viewer: Viewer) -> Vec<PlanStatus> {
        self.plans
            .lock()
            .values()
            .filter(|a| viewer == Viewer::All || viewer == Viewer::User(a.uid))
            .map(|a| PlanStatus {
                uid: a.uid,
                dataset: a.dataset.prefix().to_string(),
                epoch: a.plan.epoch,
                steps: a.plan.steps.len(),
                position: a.plan.position,
            })
            .collect()
    }

    /// Marks the ranks for [`drive`] to compute again: the caller holds the plans'
    /// lock, which reads take, and the work is as large as the plans' steps are wide.
    fn after_plans_changed(&self, plans: &HashMap<u64, ActivePlan>) {
        self.plan_count.store(plans.len(), Ordering::Relaxed);
        self.ranks_stale.store(true, Ordering::Release);
        self.wake.ring();
    }

    /// Computes the eviction ranks of the plans, from a snapshot of the steps they rank
    /// taken under the plans' lock (a copy of at most [`plan::RANK_HORIZON`] steps each,
    /// bounded by the budgets), and publishes them.
    fn rank_plans(&self) {
        let horizons: Vec<(Dataset, plan::Horizon)> = self
            .plans
            .lock()
            .values()
            .map(|active| (active.dataset.clone(), active.plan.horizon()))
            .collect();
        let mut ranks: HashMap<Unit, NextUse> = HashMap::new();
        for (dataset, horizon) in &horizons {
            for (chunk, distance) in horizon.chunks_ahead(&dataset.geometry()) {
                let rank = if distance == 0 {
                    NextUse::Current
                } else {
                    NextUse::Ahead(distance)
                };
                for unit in self.units_of_chunk(dataset, chunk) {
                    let entry = ranks.entry(unit).or_insert(rank);
                    *entry = (*entry).min(rank);
                }
            }
        }
        *self.advice.ranks.write() = ranks;
        let advisor: Option<Arc<dyn EvictionAdvisor>> = if horizons.is_empty() {
            None
        } else {
            Some(self.advice.clone())
        };
        self.cache.set_advisor(advisor);
    }

    /// Records the chunks of a chunked dataset that the plan on `handle` has finished
    /// this epoch. (A monolithic dataset's virtual chunks share their row offsets' parts
    /// with other chunks, so none of its parts is done while any chunk is not.)
    fn note_finished(&self, handle: u64, active: &mut ActivePlan) {
        if !matches!(active.dataset, Dataset::Chunked(_)) {
            return;
        }
        let finished = active.plan.finished_chunks(&active.dataset.geometry());
        if finished.is_empty() {
            return;
        }
        let units: Vec<Unit> = finished
            .into_iter()
            .flat_map(|chunk| self.units_of_chunk(&active.dataset, chunk))
            .collect();
        self.advice
            .done
            .write()
            .entry(handle)
            .or_default()
            .extend(units);
    }

    /// The cache units that hold a chunk's bytes: a chunked dataset's chunk is its
    /// group; a virtual chunk of a monolithic one is the parts of its row offsets and
    /// values (with the kernel's read-around), once the offsets at its ends were read.
    fn units_of_chunk(&self, dataset: &Dataset, chunk: usize) -> Vec<Unit> {
        match dataset {
            Dataset::Chunked(dataset) => dataset.chunks[chunk]
                .iter()
                .filter_map(|object| object.group.map(Unit::Group))
                .collect(),
            Dataset::Monolithic(dataset) => {
                let rows = dataset.geometry.chunk_rows(chunk as u64);
                let values = dataset.chunk_values(chunk as u64);
                let mut reads = StepReads::default();
                self.monolithic_row_reads(dataset, &rows, values, &mut reads);
                let ranges = reads.ranges.iter().chain(&reads.read_around);
                ranges
                    .flat_map(|(object, range)| {
                        self.fetcher
                            .parts_of(range)
                            .map(|index| Unit::Part(Fetcher::key(object, index)))
                    })
                    .collect()
            }
        }
    }

    /// Called for every read served: moves plan positions, and reads ahead for a
    /// hint-less sequential reader (`window`: the read-ahead state of its handle).
    pub fn observe_read(
        &self,
        window: Option<&mut SequentialWindow>,
        content: &FileContent,
        file_size: u64,
        offset: u64,
        len: u64,
        plan: &ReadPlan,
    ) {
        // Observed even when a plan covers the read: whether it jumped decides the
        // companion fetch ([`Prefetcher::fetch_companion`]).
        let ahead = window.map(|window| {
            window.observe(
                offset,
                len,
                self.fetcher.part_size(),
                self.config.max_sequential_window,
                self.config.kernel_read_ahead,
            )
        });
        if self.plan_count.load(Ordering::Relaxed) > 0 && self.advance_plans(plan) {
            return;
        }
        if let FileContent::FlatArray(dataset, kind) = content {
            self.observe_scatter(dataset, *kind, plan);
        }
        if let Some(ahead) = ahead.filter(|ahead| !ahead.is_empty()) {
            let read_ahead = plan_read(content, file_size, ahead.start, ahead.end - ahead.start);
            for piece in &read_ahead.pieces {
                if let Piece::Object { object, range, .. } = piece {
                    for index in self.fetcher.parts_of(range) {
                        self.fetcher.prefetch(object, index);
                    }
                }
            }
        }
    }

    /// A reader of a row takes its values, then its column ids (or the other way
    /// round): a read of the same elements of the other array follows a read of one at
    /// once. When the first waits on the network, the bytes of the second are asked for
    /// beside it, on their own (an edge, kept in memory), so the second read does not
    /// wait a round trip more. They are asked for at demand priority: as a prefetch
    /// they queued behind a plan's prefetches, and the second read asked for them
    /// itself, a round trip later. Called for reads the cache could not serve that jumped
    /// (a memory map's fault at a row; not a reader going through a whole file, which
    /// reads the other later, if at all).
    pub fn fetch_companion(&self, content: &FileContent, offset: u64, len: u64) {
        let FileContent::FlatArray(dataset, kind) = content else {
            return;
        };
        let other = match kind {
            ArrayKind::Data => ArrayKind::ColPtr,
            ArrayKind::ColPtr => ArrayKind::Data,
            ArrayKind::RowPtr => return,
        };
        // The kernel reads both memory-mapped files the same way: a window of the same
        // length centred on the page of the fault. The other window is centred on the
        // same element, a page wider on each side for the rounding.
        let layout = &dataset.layout;
        let (width, other_width) = (layout.width(*kind), layout.width(other));
        let centre = (offset + len / 2) / width * other_width;
        let start = centre.saturating_sub(len / 2 + PAGE);
        let companion = plan_read(
            &FileContent::FlatArray(dataset.clone(), other),
            layout.file_len(other),
            start,
            len + 2 * PAGE,
        );
        for piece in &companion.pieces {
            let Piece::Object { object, range, .. } = piece else {
                continue;
            };
            for index in self.fetcher.parts_of(range) {
                let part = self.fetcher.part_range(object, index);
                let within = range.start.max(part.start)..range.end.min(part.end);
                if within != part && self.worth_an_edge(&within) {
                    self.fetcher.edge_for_next_read(object, within);
                } else {
                    // Most of a part, or all of a small one: the part itself, which the
                    // second read joins (as an edge it would be fetched again as a part).
                    self.fetcher.part_for_next_read(object, index);
                }
            }
        }
    }

    /// Feeds a hint-less read of a flat array to the scatter detector, and fetches the
    /// chunks it names whole: all parts of the chunk's three arrays, at prefetch
    /// priority, unless the chunk is larger than the bytes allowed ahead.
    fn observe_scatter(&self, dataset: &Arc<FlatDataset>, kind: ArrayKind, read: &ReadPlan) {
        let array = ArrayKind::ALL.iter().position(|&k| k == kind).unwrap();
        let part_size = self.fetcher.part_size();
        let mut scatter = self.scatter.lock();
        for (chunk, _, range) in read.chunk_pieces() {
            let id = dataset.array(chunk, ArrayKind::Data).id.0;
            let touched: Vec<u64> = self
                .fetcher
                .parts_of(range)
                .map(|index| chunk_part(array, index))
                .collect();
            if scatter.observe(id, array, range.start, touched.iter().copied())
                != Decision::FetchChunk
            {
                continue;
            }
            let objects = &dataset.chunks[chunk];
            let bytes: u64 = objects.iter().map(|o| o.size).sum();
            if bytes > self.config.max_ahead_bytes {
                continue;
            }
            let mut parts = Vec::new();
            for (array, object) in objects.iter().enumerate() {
                for index in 0..object.size.div_ceil(part_size) {
                    self.fetcher.prefetch(object, index);
                    parts.push(chunk_part(array, index));
                }
            }
            Metrics::add(&self.metrics.chunks_fetched_whole, 1);
            scatter.fetching(id, parts, &touched);
        }
    }

    /// Moves the positions of the plans whose dataset the read touches, through either
    /// view. Returns whether any plan covers the read's dataset.
    fn advance_plans(&self, read: &ReadPlan) -> bool {
        let mut touched: Vec<(Dataset, Option<usize>, PartKey)> = Vec::new();
        {
            let index = self.chunk_of_group.lock();
            for piece in &read.pieces {
                if let Piece::Object { object, range, .. } = piece {
                    if let Some((dataset, chunk)) = object.group.and_then(|g| index.get(&g)) {
                        for part in self.fetcher.parts_of(range) {
                            touched.push((
                                Dataset::Chunked(dataset.clone()),
                                Some(*chunk),
                                Fetcher::key(object, part),
                            ));
                        }
                    }
                }
            }
        }
        let mut plans = self.plans.lock();
        self.touched_monolithic(&plans, read, &mut touched);
        if touched.is_empty() {
            return false;
        }
        let mut moved = false;
        for (handle, active) in plans.iter_mut() {
            let mut read = Touched::default();
            for (dataset, chunk, part) in &touched {
                if dataset.same(&active.dataset) {
                    read.chunks.extend(chunk);
                    read.parts.push(*part);
                }
            }
            if !read.parts.is_empty() && active.plan.observe(&read, &active.dataset.geometry()) {
                moved = true;
                self.note_finished(*handle, active);
            }
        }
        if moved {
            self.after_plans_changed(&plans);
            drop(plans);
            self.wake.ring();
        }
        true
    }

    /// What a read touches of the monolithic datasets that have plans: the parts of
    /// their values and column ids (a step's own), and the virtual chunks of the row
    /// offsets it reads. Row-offset parts are no step's own: one part holds the offsets
    /// of many steps.
    fn touched_monolithic(
        &self,
        plans: &HashMap<u64, ActivePlan>,
        read: &ReadPlan,
        touched: &mut Vec<(Dataset, Option<usize>, PartKey)>,
    ) {
        let mut seen: Vec<&Arc<MonolithicDataset>> = Vec::new();
        for active in plans.values() {
            let Dataset::Monolithic(dataset) = &active.dataset else {
                continue;
            };
            if seen.iter().any(|d| Arc::ptr_eq(d, dataset)) {
                continue;
            }
            seen.push(dataset);
            for piece in &read.pieces {
                let Piece::Object { object, range, .. } = piece else {
                    continue;
                };
                let Some(kind) = ArrayKind::ALL
                    .into_iter()
                    .find(|&k| Arc::ptr_eq(dataset.array(k), object))
                else {
                    continue;
                };
                if kind == ArrayKind::RowPtr {
                    let width = dataset.width(kind);
                    let rows = range.start / width..range.end.div_ceil(width);
                    for chunk in dataset.geometry.chunks_of_rows(rows) {
                        // The part stands for the read; it is in no resolved step.
                        let part = Fetcher::key(object, range.start / self.fetcher.part_size());
                        touched.push((active.dataset.clone(), Some(chunk as usize), part));
                    }
                } else {
                    for part in self.fetcher.parts_of(range) {
                        touched.push((active.dataset.clone(), None, Fetcher::key(object, part)));
                    }
                    // Once the offsets around the values were read, the read names its
                    // virtual chunks too: steps not resolved yet are matched by those.
                    let width = dataset.width(kind);
                    let values = range.start / width..range.end.div_ceil(width);
                    if let Some((first, last)) = dataset.chunks_of_values(values) {
                        let part = Fetcher::key(object, range.start / self.fetcher.part_size());
                        for chunk in first..=last {
                            touched.push((active.dataset.clone(), Some(chunk as usize), part));
                        }
                    }
                }
            }
        }
    }

    /// Called with the bytes of every read served while plans exist: the row offsets a
    /// reader of a monolithic dataset reads locate its virtual chunks, for matching its
    /// reads to steps and for ranking their parts, however far the prefetch lags.
    pub fn observe_served(&self, content: &FileContent, offset: u64, bytes: &[u8]) {
        if self.plan_count.load(Ordering::Relaxed) == 0 {
            return;
        }
        let FileContent::Object(object) = content else {
            return;
        };
        let plans = self.plans.lock();
        // The object is one dataset's, however many plans follow that dataset.
        let dataset = plans.values().find_map(|active| match &active.dataset {
            Dataset::Monolithic(dataset)
                if Arc::ptr_eq(dataset.array(ArrayKind::RowPtr), object) =>
            {
                Some(dataset)
            }
            _ => None,
        });
        if dataset.is_some_and(|d| d.remember_served_row_offsets(offset, bytes)) {
            self.after_plans_changed(&plans);
        }
    }

    /// Issues prefetches for every plan's next steps, within the bounds, and records
    /// the parts of each step it could resolve for matching reads to steps.
    fn top_up(&self) {
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
                        let part = self.fetcher.part_range(object, index);
                        ahead_bytes += part.end - part.start;
                        self.fetcher.prefetch(object, index);
                    }
                }
                for (object, range) in edges {
                    if ahead_bytes < self.config.max_ahead_bytes {
                        ahead_bytes += range.end - range.start;
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
    fn worth_an_edge(&self, range: &std::ops::Range<u64>) -> bool {
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
    fn monolithic_row_reads(
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

    /// Entry `index` of a row-offset array of type `dtype`, if its part is cached.
    fn cached_entry(
        &self,
        row_ptr: &ObjectInfo,
        dtype: scdl_format::Dtype,
        index: u64,
    ) -> Option<u64> {
        let width = dtype.size().unwrap();
        let offset = index * width;
        let part_index = offset / self.fetcher.part_size();
        let part = self
            .cache
            .get(Fetcher::key(row_ptr, part_index), Recency::Use)?;
        let mut bytes = [0u8; 8];
        let bytes = &mut bytes[..width as usize];
        part.read_exact_at(bytes, offset - part_index * self.fetcher.part_size())
            .ok()?;
        Some(dtype.read_uint(bytes, 0))
    }

    /// The value range `[row_ptr[rows.start], row_ptr[rows.end])` of a chunk, if its
    /// row offsets are cached and verified.
    fn cached_value_range(
        &self,
        dataset: &Arc<FlatDataset>,
        chunk: usize,
        rows: std::ops::Range<u64>,
    ) -> Option<std::ops::Range<u64>> {
        let row_ptr = dataset.array(chunk, ArrayKind::RowPtr);
        let dtype = dataset.layout.row_dtype();
        match RowOffsetCheck::verdict(dataset, chunk) {
            Some(Ok(())) => {}
            Some(Err(_)) => return None,
            None => {
                // Check the offsets once they are local, so the values they point at can
                // be fetched; its verdict wakes the prefetcher again.
                self.row_offset_check.start_when_local(dataset, chunk);
                return None;
            }
        }
        let entries = row_ptr.size / dtype.size().unwrap();
        if entries * 8 > row_offsets::KEPT_ROW_OFFSETS_BYTES as u64 {
            // Too many to keep: read the two needed.
            let entry = |i: u64| self.cached_entry(row_ptr, dtype, i);
            return Some(entry(rows.start)?..entry(rows.end)?);
        }
        let offsets = self
            .row_offsets
            .get_or_load(row_ptr.id, || self.cached_row_offsets(row_ptr, dtype))?;
        Some(*offsets.get(rows.start as usize)?..*offsets.get(rows.end as usize)?)
    }

    /// All entries of a row-offset array, if all its parts are cached (read checked,
    /// without counting as a use for the eviction order).
    fn cached_row_offsets(
        &self,
        row_ptr: &ObjectInfo,
        dtype: scdl_format::Dtype,
    ) -> Option<Vec<u64>> {
        let mut bytes = vec![0u8; row_ptr.size as usize];
        for index in self.fetcher.parts_of(&(0..row_ptr.size)) {
            let key = Fetcher::key(row_ptr, index);
            let part = self.cache.get(key, Recency::Keep)?;
            let range = self.fetcher.part_range(row_ptr, index);
            part.read_exact_at(&mut bytes[range.start as usize..range.end as usize], 0)
                .ok()?;
        }
        let width = dtype.size().unwrap() as usize;
        Some(
            bytes
                .chunks_exact(width)
                .map(|entry| dtype.read_uint(entry, 0))
                .collect(),
        )
    }
}

/// A part of a chunk, numbered uniquely within the chunk: its array's number and index.
fn chunk_part(array: usize, index: u64) -> u64 {
    ((array as u64) << 48) | index
}

impl Drop for Prefetcher {
    /// Lets [`drive`] see that the prefetcher is gone.
    fn drop(&mut self) {
        self.wake.ring();
    }
}

/// The prefetcher's background loop: tops up the plans' prefetches whenever something
/// they depend on changed, and sleeps otherwise. What wakes it: a plan written or
/// dropped, a reader's position moving, a download ending (room for the next, or
/// row offsets now local), a chunk's row offsets checked. A wake-up that comes while
/// it works is kept for its next wait, so none is lost; those that come together are
/// served by one top-up. It holds no strong reference while it waits, and ends once
/// the prefetcher is dropped.
async fn drive(prefetcher: Weak<Prefetcher>, wake: PlannerWake) {
    loop {
        let Some(this) = prefetcher.upgrade() else {
            return;
        };
        if this.ranks_stale.swap(false, Ordering::AcqRel) {
            this.rank_plans();
        }
        if this.plan_count.load(Ordering::Relaxed) > 0 {
            this.top_up();
        }
        drop(this);
        wake.rung().await;
    }
}
