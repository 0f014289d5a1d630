//! The prefetcher: keeps what readers will need next arriving before they need it.
//!
//! Readers announce their order through hint files ([`plan`]); the prefetcher keeps the
//! next steps of every plan downloading, in plan order, up to a lookahead of steps and a
//! share of the cache budget, and it tells the cache which chunks to evict first (those
//! no plan needs again, then those needed furthest ahead; never those of a step being
//! read, up to its user's share of the budget). The reader's position comes from the reads actually served, so a sampler that
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

mod advice;
pub mod budget;
mod cached_offsets;
pub(crate) mod exact;
mod follow;
pub(crate) mod plan;
#[cfg(any(test, feature = "test-support"))]
pub mod probe;
pub(crate) mod row_offsets;
pub(crate) mod scatter;
pub(crate) mod sequential;
mod top_up;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::Mutex;
use scdl_format::hint::HintLine;
use scdl_format::ArrayKind;
use serde::{Deserialize, Serialize};

use crate::cache::{DiskCache, EvictionAdvisor, NextUse, Unit};
use crate::catalog::{Dataset, FlatDataset};
use crate::error::PlanRefused;
use crate::fetch::Fetcher;
use crate::metrics::Metrics;
use crate::parts::GroupId;
use crate::planner_wake::PlannerWake;
use crate::row_offset_check::RowOffsetCheck;
use advice::Advice;
use budget::{
    HintBudget, MAX_HANDLE_WORK, MAX_USER_WORK, PLAN_STARTS_PER_SECOND, PLAN_START_BURST,
};
use cached_offsets::CachedOffsets;
use exact::ExactRows;
use plan::{Plan, PlanMark, Room, MAX_PLANNED_ENTRIES};
use scatter::ScatterDetector;
use top_up::{StepReads, TopUpCursor};

pub use exact::PlannedPages;

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
    /// The disk cache's budget: a dataset whose values are several times it has its
    /// rows fetched exactly ([`exact`]).
    pub cache_bytes: u64,
    /// Whether users other than the mounting one may read the mount (`--allow-other`,
    /// `--allow-root`): then one user's current steps protect at most a share of the
    /// cache; on a mount of one user, all of them, as wide as they are. Halving it
    /// cost a single hinted reader with a cache of half the dataset 2.7 to 6 times the
    /// bytes (bench --quick, blocks and random orders); bounded by the whole budget,
    /// 1.1 to 3 times.
    pub shared_by_users: bool,
}

struct ActivePlan {
    dataset: Dataset,
    plan: Plan,
    /// Who opened the hint handle: whose budget the plan spends.
    uid: u32,
    /// Whether that user has read the plan's dataset since the plan began: see
    /// [`Prefetcher::has_standing`].
    read_from: bool,
    /// How far the top-ups have issued its lookahead: see [`TopUpCursor`].
    top_up: Option<TopUpCursor>,
    /// The ranks the plan gave when last ranked, if its dataset is chunked.
    ranked: Option<RankedPlan>,
}

/// The eviction ranks one plan gave at a revision and position: until either changes,
/// its steps rank the same units the same.
struct RankedPlan {
    mark: PlanMark,
    ranks: Arc<[(Unit, NextUse)]>,
    /// Every step it ranks names rows (no windows): see [`plan::Horizon::names_rows_only`].
    rows_only: bool,
}

/// A plan as [`Prefetcher::rank_plans`] takes it from under the plans' lock: its ranks
/// as last computed, or the steps to rank.
enum PlanRanks {
    Ranked {
        ranks: Arc<[(Unit, NextUse)]>,
        rows_only: bool,
    },
    ToRank {
        dataset: Dataset,
        mark: PlanMark,
        horizon: plan::Horizon,
    },
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
    /// Row offsets read from the cache ([`cached_offsets`]).
    offsets: CachedOffsets,
    /// What each user's hint writers may still do.
    budget: HintBudget,
    /// The plans changed since [`Advice::ranks`] was computed: [`drive`] computes them
    /// again, so that no read or hint write waits on it.
    ranks_stale: AtomicBool,
    /// Top-up passes run one at a time: each takes the plans' cursors and puts them back.
    top_up_pass: Mutex<()>,
    /// A plan's rows fetched exactly ([`exact`]).
    exact: ExactRows,
    #[cfg(any(test, feature = "test-support"))]
    counters: probe::PassCounters,
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
            offsets: CachedOffsets::new(fetcher.clone(), cache.clone(), row_offset_check),
            exact: ExactRows::new(fetcher.clone(), cache.clone(), config.cache_bytes),
            fetcher,
            cache,
            metrics,
            config,
            plans: Mutex::new(HashMap::new()),
            plan_count: AtomicUsize::new(0),
            advice: Arc::default(),
            chunk_of_group: Mutex::new(HashMap::new()),
            wake: wake.clone(),
            scatter: Mutex::new(ScatterDetector::new(config.kernel_read_ahead)),
            budget: HintBudget::default(),
            ranks_stale: AtomicBool::new(false),
            top_up_pass: Mutex::new(()),
            #[cfg(any(test, feature = "test-support"))]
            counters: Default::default(),
        });
        tokio::spawn(drive(Arc::downgrade(&prefetcher), wake));
        prefetcher
    }

    /// Sends a plan's exact rows to `pages` as they arrive (once: the mount's page
    /// cache); until then they are served by reads alone.
    pub fn connect_planned_pages(&self, pages: Arc<dyn PlannedPages>) {
        self.exact.connect_planned_pages(pages);
    }

    /// What the tests see and drive of this prefetcher.
    #[cfg(any(test, feature = "test-support"))]
    pub fn probe(&self) -> probe::Probe<'_> {
        probe::Probe(self)
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
                if plan.is_empty() {
                    // A greeting alone announces nothing.
                    return Ok(());
                }
                if let Dataset::Chunked(flat) = dataset {
                    if !plans.values().any(|a| a.dataset.same(dataset)) {
                        self.index_chunks(flat);
                    }
                }
                let dataset = dataset.clone();
                plans.insert(
                    handle,
                    ActivePlan {
                        dataset,
                        plan,
                        uid,
                        read_from: false,
                        top_up: None,
                        ranked: None,
                    },
                );
                Some(0)
            }
        };
        let standing = plans.get(&handle).is_some_and(|a| self.has_standing(a));
        // Ranks started together join the first one's opening, whose deadline bounds
        // them all; a new one is the user's only as often as the budget lets it.
        if new_epoch && standing {
            let joined = self.fetcher.join_opening();
            let opened = !joined && self.budget.may_open(uid, Instant::now());
            if opened {
                self.fetcher.begin_opening();
            }
            let first_object = plans
                .get(&handle)
                .and_then(|a| a.dataset.row_offsets_object());
            if let Some(object) = first_object.filter(|_| joined || opened) {
                self.fetcher.open_connections_for(object);
            }
        }
        let said_reading = lines.iter().rev().find_map(|line| match line {
            HintLine::Reading { step } => Some(*step),
            _ => None,
        });
        let moved = said_reading.is_some_and(|step| {
            plans.get_mut(&handle).is_some_and(|active| {
                let moved = active.plan.reading(step);
                if moved {
                    self.note_finished(handle, active);
                }
                moved
            })
        });
        // Steps beyond the ranks' horizon or the prefetch's reach change neither yet:
        // the position's moves bring them in.
        let distance = match (changed_ahead, moved) {
            (_, true) => 0,
            (Some(distance), false) => distance,
            (None, false) => return Ok(()),
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
        let chunk_of_group = self.chunk_of_group.lock();
        self.advice
            .row_offsets_only
            .write()
            .retain(|group, _| chunk_of_group.contains_key(group));
        drop(chunk_of_group);
        self.after_plans_changed(&plans);
    }

    /// Indexes a chunked dataset's chunks by their cache groups, as its first plan
    /// arrives; and, where its plans fetch rows exactly, tells the cache that they read
    /// only the chunks' row offsets from it.
    fn index_chunks(&self, flat: &Arc<FlatDataset>) {
        let exactly = self.exact.fetches_rows_exactly(flat);
        let mut index = self.chunk_of_group.lock();
        let mut row_offsets_only = self.advice.row_offsets_only.write();
        for (chunk, objects) in flat.chunks.iter().enumerate() {
            if let Some(group) = objects[0].group {
                index.insert(group, (flat.clone(), chunk));
                if exactly {
                    let row_offsets = &objects[ArrayKind::RowPtr.index()];
                    row_offsets_only.insert(group, row_offsets.id);
                }
            }
        }
    }

    /// Whether a plan ranks the cache's units, has its steps prefetched and opens the
    /// fetcher's opening: on a mount of one user, always; on a mount other users may
    /// read, once its user has read its dataset (`read_from`). A plan whose rows are
    /// never read costs others without serving anyone: beside another user's cold
    /// epoch, a writer of plans of steps over every row that never read took half the
    /// downloads and ranked every chunk as needed next, so that the reader's own
    /// prefetches found no room. A reader's plan waits for its first read, which is
    /// the reader's own request anyway.
    fn has_standing(&self, active: &ActivePlan) -> bool {
        !self.config.shared_by_users || active.read_from
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
    /// bounded by the budgets), and publishes them. A chunked dataset's plan that has
    /// neither moved nor changed since it was last ranked gives the ranks it gave then
    /// ([`RankedPlan`]): a writer's plan of steps over every row that never reads is
    /// ranked once, not on every move of another reader.
    fn rank_plans(&self) {
        let snapshot: Vec<(u64, u32, PlanRanks)> = self
            .plans
            .lock()
            .iter()
            .filter(|(_, active)| self.has_standing(active))
            .map(|(handle, active)| {
                let ranks = match &active.ranked {
                    Some(ranked) if ranked.mark == active.plan.mark() => PlanRanks::Ranked {
                        ranks: ranked.ranks.clone(),
                        rows_only: ranked.rows_only,
                    },
                    _ => PlanRanks::ToRank {
                        dataset: active.dataset.clone(),
                        mark: active.plan.mark(),
                        horizon: active.plan.horizon(),
                    },
                };
                (*handle, active.uid, ranks)
            })
            .collect();
        let mut ranks: HashMap<Unit, NextUse> = HashMap::new();
        let mut rank = |unit: Unit, rank: NextUse| {
            let entry = ranks.entry(unit).or_insert(rank);
            *entry = (*entry).min(rank);
        };
        let mut current_by_user: HashMap<u32, Vec<Unit>> = HashMap::new();
        let mut newly_ranked = Vec::new();
        // Units a plan of windows ranks: read whole from the cache, whatever the dataset.
        let mut read_whole = HashSet::new();
        for (handle, uid, plan_ranks) in &snapshot {
            let (of_plan, rows_only) = match plan_ranks {
                PlanRanks::Ranked { ranks, rows_only } => (ranks.clone(), *rows_only),
                PlanRanks::ToRank {
                    dataset,
                    mark,
                    horizon,
                } => {
                    let of_plan = self.rank_horizon(dataset, horizon);
                    let rows_only = horizon.names_rows_only();
                    // A monolithic dataset's parts rank as the row offsets read so far
                    // locate them, which moves no position: ranked anew each time.
                    if matches!(dataset, Dataset::Chunked(_)) {
                        newly_ranked.push((
                            *handle,
                            RankedPlan {
                                mark: *mark,
                                ranks: of_plan.clone(),
                                rows_only,
                            },
                        ));
                    }
                    (of_plan, rows_only)
                }
            };
            if !rows_only {
                read_whole.extend(of_plan.iter().map(|(unit, _)| *unit));
            }
            for &(unit, next_use) in of_plan.iter() {
                match next_use {
                    NextUse::Current => current_by_user.entry(*uid).or_default().push(unit),
                    _ => rank(unit, next_use),
                }
            }
        }
        let users = snapshot
            .iter()
            .map(|(_, uid, _)| uid)
            .collect::<std::collections::HashSet<_>>()
            .len() as u64;
        let share = match self.config.shared_by_users {
            // One share more for readers without a plan.
            true => self.config.cache_bytes / (users + 1),
            // Unbounded, not the budget: a step wider than the cache had its units
            // past the budget rank as nothing planned, evicted first, by the next
            // step's prefetches too, while they were being read.
            false => u64::MAX,
        };
        for units in current_by_user.values_mut() {
            for unit in self.within_share(units, share) {
                rank(unit, NextUse::Current);
            }
        }
        if !newly_ranked.is_empty() {
            let mut plans = self.plans.lock();
            for (handle, ranked) in newly_ranked {
                if let Some(active) = plans.get_mut(&handle) {
                    active.ranked = Some(ranked);
                }
            }
        }
        *self.advice.ranks.write() = ranks;
        *self.advice.read_whole.write() = read_whole;
        let advisor: Option<Arc<dyn EvictionAdvisor>> = if snapshot.is_empty() {
            None
        } else {
            Some(self.advice.clone())
        };
        self.cache.set_advisor(advisor);
    }

    /// Of one user's units of the steps being read, those that [`NextUse::Current`]
    /// protects: in unit order (a chunked dataset's groups are its chunks in order),
    /// as many as fit in `share` bytes. Beyond it they rank as nothing planned: a plan
    /// whose step spans every row and is never read protected everything cached, and
    /// once the cache was full other users' prefetches found no room and their parts
    /// lived in memory only.
    fn within_share(&self, units: &mut Vec<Unit>, share: u64) -> Vec<Unit> {
        units.sort_unstable();
        units.dedup();
        let chunk_of_group = self.chunk_of_group.lock();
        let bytes = |unit: &Unit| match unit {
            Unit::Group(group) => chunk_of_group.get(group).map_or(0, |(dataset, chunk)| {
                ArrayKind::ALL
                    .iter()
                    .map(|kind| dataset.array(*chunk, *kind).size)
                    .sum()
            }),
            Unit::Part(_) => self.fetcher.part_size(),
        };
        let mut protected = 0;
        units
            .iter()
            .take_while(|unit| {
                protected += bytes(unit);
                protected <= share
            })
            .copied()
            .collect()
    }

    /// The ranks one plan's horizon gives the cache's units: kept with the plan until it
    /// moves, as a slice (a map per plan of random rows over 10^4 chunks held 19.5 MB
    /// over eight ranks' plans).
    fn rank_horizon(&self, dataset: &Dataset, horizon: &plan::Horizon) -> Arc<[(Unit, NextUse)]> {
        #[cfg(any(test, feature = "test-support"))]
        self.counters
            .horizons_ranked
            .fetch_add(1, Ordering::Relaxed);
        let mut ranks = HashMap::new();
        for (chunk, rank) in horizon.chunks_ahead(&dataset.geometry()) {
            for unit in self.units_of_chunk(dataset, chunk) {
                let entry = ranks.entry(unit).or_insert(rank);
                *entry = (*entry).min(rank);
            }
        }
        ranks.into_iter().collect()
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
///
/// A panic in a pass is contained as the FUSE callbacks' are: logged, counted
/// (`prefetcher_panics`), and the loop waits for its next wake-up, with the ranks marked
/// for computing again. Left to end the task, it ended prefetch for the rest of the
/// mount, silently.
async fn drive(prefetcher: Weak<Prefetcher>, wake: PlannerWake) {
    loop {
        let Some(this) = prefetcher.upgrade() else {
            return;
        };
        let pass = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if this.ranks_stale.swap(false, Ordering::AcqRel) {
                this.rank_plans();
            }
            if this.plan_count.load(Ordering::Relaxed) > 0 {
                this.top_up();
            }
        }));
        if let Err(panic) = pass {
            let error = crate::error::FsError::of_panic(panic);
            tracing::error!(%error, "a prefetcher pass panicked; prefetch goes on at the next wake-up");
            Metrics::add(&this.metrics.prefetcher_panics, 1);
            this.ranks_stale.store(true, Ordering::Release);
        }
        drop(this);
        wake.rung().await;
    }
}
