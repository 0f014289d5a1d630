//! The prefetcher: keeps what readers will need next arriving before they need it.
//!
//! Readers announce their order through hint files ([`plan`]); the prefetcher keeps the
//! next steps of every plan downloading, in plan order, up to a lookahead of steps and a
//! share of the cache budget, and it tells the cache which chunks to evict first (those
//! no plan needs again, then those needed furthest ahead; never those of a step being
//! read). The reader's position comes from the reads actually served, so a sampler that
//! runs ahead of its workers does not drag the prefetch along. Readers that give no hint
//! get sequential read-ahead per open handle ([`sequential`]).
//!
//! Prefetches use the fetcher's low priority, which never delays a demand read.

pub mod plan;
pub mod sequential;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use scdl_format::hint::HintLine;
use scdl_format::ArrayKind;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::cache::{EvictionAdvisor, NextUse};
use crate::catalog::{FileContent, FlatDataset, ObjectInfo};
use crate::fetch::Fetcher;
use crate::parts::{GroupId, PartKey};
use crate::read::ReadPath;
use crate::view::{plan_read, Piece, ReadPlan};
use plan::{Plan, Step, Touched, MAX_PLANNED_ENTRIES};

/// What a step reads: its own byte ranges, the margins the kernel reads around them
/// in memory-mapped flat arrays, and whether the ranges are all known yet (a row step
/// needs its chunks' row offsets first).
#[derive(Default)]
struct StepReads {
    ranges: Vec<(Arc<ObjectInfo>, std::ops::Range<u64>)>,
    read_around: Vec<(Arc<ObjectInfo>, std::ops::Range<u64>)>,
    complete: bool,
}
use sequential::SequentialWindow;

/// How far on either side of a touched page the kernel reads a memory-mapped FUSE
/// file: half its 128 KiB read-ahead window, which it centres on the fault.
const KERNEL_READ_AROUND: u64 = 64 << 10;

/// How the prefetcher is bounded.
#[derive(Clone, Copy, Debug)]
pub struct PrefetchConfig {
    /// Plan steps kept fetching ahead of the current one.
    pub lookahead_steps: usize,
    /// Bytes kept fetching ahead, at most (a share of the cache budget).
    pub max_ahead_bytes: u64,
    /// Largest sequential read-ahead window of a hint-less handle.
    pub max_sequential_window: u64,
}

struct ActivePlan {
    dataset: Arc<FlatDataset>,
    plan: Plan,
}

/// What `scdlfs status` shows of one plan.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PlanStatus {
    pub dataset: String,
    pub epoch: u64,
    pub steps: usize,
    pub position: usize,
}

pub struct Prefetcher {
    fetcher: Arc<Fetcher>,
    read_path: Arc<ReadPath>,
    config: PrefetchConfig,
    plans: Mutex<HashMap<u64, ActivePlan>>,
    plan_count: AtomicUsize,
    /// Group ranks derived from the plans, read by the cache on eviction.
    advice: Arc<Advice>,
    /// Which dataset chunk each cache group is, for the datasets that have plans.
    chunk_of_group: Mutex<HashMap<GroupId, (Arc<FlatDataset>, usize)>>,
    wake: Notify,
}

#[derive(Default)]
struct Advice {
    ranks: RwLock<HashMap<GroupId, NextUse>>,
}

impl EvictionAdvisor for Advice {
    fn next_use(&self, group: GroupId) -> Option<NextUse> {
        self.ranks.read().get(&group).copied()
    }
}

impl Prefetcher {
    pub fn new(
        fetcher: Arc<Fetcher>,
        read_path: Arc<ReadPath>,
        config: PrefetchConfig,
    ) -> Arc<Prefetcher> {
        let prefetcher = Arc::new(Prefetcher {
            fetcher,
            read_path,
            config,
            plans: Mutex::new(HashMap::new()),
            plan_count: AtomicUsize::new(0),
            advice: Arc::default(),
            chunk_of_group: Mutex::new(HashMap::new()),
            wake: Notify::new(),
        });
        tokio::spawn(drive(Arc::downgrade(&prefetcher)));
        prefetcher
    }

    /// Applies hint lines written on handle `handle`. All or nothing.
    pub fn apply(
        &self,
        handle: u64,
        dataset: &Arc<FlatDataset>,
        lines: &[HintLine],
    ) -> Result<(), String> {
        let mut plans = self.plans.lock();
        let others: usize = plans
            .iter()
            .filter(|(other, _)| **other != handle)
            .map(|(_, active)| active.plan.entries())
            .sum();
        let budget = MAX_PLANNED_ENTRIES.saturating_sub(others);
        match plans.get_mut(&handle) {
            Some(active) => active.plan.apply(lines, &dataset.layout, budget)?,
            None => {
                let mut plan = Plan::default();
                plan.apply(lines, &dataset.layout, budget)?;
                if plan.steps.is_empty() {
                    // A greeting alone announces nothing.
                    return Ok(());
                }
                if !plans.values().any(|a| Arc::ptr_eq(&a.dataset, dataset)) {
                    let mut index = self.chunk_of_group.lock();
                    for (chunk, objects) in dataset.chunks.iter().enumerate() {
                        if let Some(group) = objects[0].group {
                            index.insert(group, (dataset.clone(), chunk));
                        }
                    }
                }
                let dataset = dataset.clone();
                plans.insert(handle, ActivePlan { dataset, plan });
            }
        }
        self.after_plans_changed(&plans);
        drop(plans);
        self.wake.notify_one();
        Ok(())
    }

    pub fn drop_plan(&self, handle: u64) {
        let mut plans = self.plans.lock();
        plans.remove(&handle);
        self.chunk_of_group
            .lock()
            .retain(|_, (dataset, _)| plans.values().any(|a| Arc::ptr_eq(&a.dataset, dataset)));
        self.after_plans_changed(&plans);
    }

    pub fn plan_status(&self) -> Vec<PlanStatus> {
        self.plans
            .lock()
            .values()
            .map(|a| PlanStatus {
                dataset: a.dataset.prefix.to_string(),
                epoch: a.plan.epoch,
                steps: a.plan.steps.len(),
                position: a.plan.position,
            })
            .collect()
    }

    fn after_plans_changed(&self, plans: &HashMap<u64, ActivePlan>) {
        self.plan_count.store(plans.len(), Ordering::Relaxed);
        let mut ranks: HashMap<GroupId, NextUse> = HashMap::new();
        for active in plans.values() {
            for (chunk, distance) in active.plan.chunks_ahead(&active.dataset.layout) {
                let rank = if distance == 0 {
                    NextUse::Current
                } else {
                    NextUse::Ahead(distance)
                };
                for object in &active.dataset.chunks[chunk] {
                    if let Some(group) = object.group {
                        let entry = ranks.entry(group).or_insert(rank);
                        *entry = (*entry).min(rank);
                    }
                }
            }
        }
        *self.advice.ranks.write() = ranks;
        let advisor: Option<Arc<dyn EvictionAdvisor>> = if plans.is_empty() {
            None
        } else {
            Some(self.advice.clone())
        };
        self.fetcher.cache().set_advisor(advisor);
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
        if self.plan_count.load(Ordering::Relaxed) > 0 && self.advance_plans(plan) {
            return;
        }
        let Some(window) = window else {
            return;
        };
        let ahead = window.observe(
            offset,
            len,
            self.fetcher.part_size(),
            self.config.max_sequential_window,
        );
        if !ahead.is_empty() {
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

    /// Moves the positions of the plans whose dataset the read touches, through either
    /// view. Returns whether any plan covers the read's dataset.
    fn advance_plans(&self, read: &ReadPlan) -> bool {
        let mut touched: Vec<(Arc<FlatDataset>, usize, PartKey)> = Vec::new();
        {
            let index = self.chunk_of_group.lock();
            for piece in &read.pieces {
                if let Piece::Object { object, range, .. } = piece {
                    if let Some((dataset, chunk)) = object.group.and_then(|g| index.get(&g)) {
                        for part in self.fetcher.parts_of(range) {
                            touched.push((dataset.clone(), *chunk, Fetcher::key(object, part)));
                        }
                    }
                }
            }
        }
        if touched.is_empty() {
            return false;
        }
        let mut plans = self.plans.lock();
        let mut moved = false;
        for active in plans.values_mut() {
            let mut read = Touched::default();
            for (dataset, chunk, part) in &touched {
                if Arc::ptr_eq(dataset, &active.dataset) {
                    read.chunks.push(*chunk);
                    read.parts.push(*part);
                }
            }
            if !read.chunks.is_empty() {
                moved |= active.plan.observe(&read, &active.dataset.layout);
            }
        }
        if moved {
            self.after_plans_changed(&plans);
            drop(plans);
            self.wake.notify_one();
        }
        true
    }

    /// Issues prefetches for every plan's next steps, within the bounds, and records
    /// the parts of each step it could resolve for matching reads to steps.
    fn top_up(&self) {
        let snapshot: Vec<(u64, Arc<FlatDataset>, usize, Vec<Step>)> = self
            .plans
            .lock()
            .iter()
            .map(|(handle, a)| {
                let start = a.plan.position.min(a.plan.steps.len());
                let end = (start + 1 + self.config.lookahead_steps).min(a.plan.steps.len());
                (
                    *handle,
                    a.dataset.clone(),
                    start,
                    a.plan.steps[start..end].to_vec(),
                )
            })
            .collect();
        let max_in_flight = 2 * self.fetcher.max_concurrent_requests();
        let mut ahead_bytes = 0u64;
        let mut seen = HashSet::new();
        let mut resolved = Vec::new();
        'plans: for (handle, dataset, first, steps) in snapshot {
            for (offset, step) in steps.into_iter().enumerate() {
                let reads = self.step_reads(&dataset, &step);
                let mut parts = HashSet::new();
                let around = reads.read_around.iter().map(|r| (r, false));
                for ((object, range), of_the_step) in
                    reads.ranges.iter().map(|r| (r, true)).chain(around)
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
    }

    /// The byte ranges of objects a step reads.
    fn step_reads(&self, dataset: &Arc<FlatDataset>, step: &Step) -> StepReads {
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
                    for kind in [ArrayKind::Data, ArrayKind::ColPtr] {
                        if let Some(before) = chunk.checked_sub(1).map(|c| dataset.array(c, kind)) {
                            let edge = before.size.saturating_sub(KERNEL_READ_AROUND)..before.size;
                            reads.read_around.push((before.clone(), edge));
                        }
                        if chunk + 1 < dataset.chunks.len() {
                            let after = dataset.array(chunk + 1, kind);
                            reads
                                .read_around
                                .push((after.clone(), 0..after.size.min(KERNEL_READ_AROUND)));
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
                            let around = start.saturating_sub(KERNEL_READ_AROUND)..start;
                            reads.read_around.push((object.clone(), around));
                            let around = end..(end + KERNEL_READ_AROUND).min(object.size);
                            reads.read_around.push((object.clone(), around));
                        }
                    }
                }
            }
        }
        reads
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
        let width = dtype.size().unwrap();
        match dataset.row_ptr_check(chunk).get() {
            Some(Ok(())) => {}
            Some(Err(_)) => return None,
            None => {
                // Check the offsets once they are local, so the values they point at can
                // be fetched; the check itself then costs no download.
                if self.fetcher.is_cached(row_ptr) && dataset.start_row_ptr_check(chunk) {
                    let (read_path, dataset) = (self.read_path.clone(), dataset.clone());
                    self.fetcher
                        .runtime()
                        .spawn(async move { read_path.check_row_ptr(&dataset, chunk).await });
                }
                return None;
            }
        }
        let entry = |i: u64| -> Option<u64> {
            let offset = i * width;
            let index = offset / self.fetcher.part_size();
            let part = self.fetcher.cache().get(Fetcher::key(row_ptr, index))?;
            let mut bytes = [0u8; 8];
            let bytes = &mut bytes[..width as usize];
            part.read_exact_at(bytes, offset - index * self.fetcher.part_size())
                .ok()?;
            Some(dtype.read_uint(bytes, 0))
        };
        Some(entry(rows.start)?..entry(rows.end)?)
    }
}

/// The prefetcher's background loop: tops up after every change and on a short tick
/// (downloads finishing free room for more), until the prefetcher is dropped.
async fn drive(prefetcher: Weak<Prefetcher>) {
    loop {
        let Some(this) = prefetcher.upgrade() else {
            return;
        };
        if this.plan_count.load(Ordering::Relaxed) > 0 {
            this.top_up();
        }
        let wake = async { this.wake.notified().await };
        let _ = tokio::time::timeout(Duration::from_millis(20), wake).await;
    }
}
