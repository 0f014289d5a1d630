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

use super::exact::{ExactRange, PAGE};
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
    /// The chunk a window step reads whole: the parts of its values and column ids go
    /// into the page cache of the flat files as they arrive.
    pub(super) window_chunk: Option<usize>,
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
    /// Steps whose every read was cached when a pass walked them: kept from cursor to
    /// cursor of the plan.
    cached_steps: CachedSteps,
}

/// The steps of a plan a pass found wholly cached (every part their items read, none
/// fetched exactly or on its way), by their place ([`super::plan::Plan::place`]), with
/// the cache's generation then and the bytes they count ahead. While the generation
/// stays (no part joined or left the cache), a cursor made after the reader moved or
/// steps were appended passes them without walking their items: walked again, a plan of
/// random rows in steps of 1,024 over a dataset all cached cost every move of its
/// reader 5,120 items, the daemon's whole CPU beside a reader warm in the page cache.
#[derive(Default)]
struct CachedSteps(HashMap<(u64, u64), CachedStep>);

#[derive(Clone, Copy)]
struct CachedStep {
    generation: u64,
    bytes: u64,
}

impl TopUpCursor {
    fn at_start(
        mark: PlanMark,
        dataset: &Dataset,
        steps: Arc<[Step]>,
        cached_steps: CachedSteps,
    ) -> TopUpCursor {
        let read_whole = match dataset {
            Dataset::Chunked(dataset) => steps
                .iter()
                .flat_map(|step| match step {
                    Step::Window(chunks) => &chunks[..],
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
            cached_steps,
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
    /// The index of the plan's step at its position (its steps from there to the end of
    /// the lookahead are the cursor's).
    start: usize,
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
    /// The place of each step in view ([`super::plan::Plan::place`]), and whether its
    /// parts are recorded ([`super::plan::Plan::is_resolved`]).
    places: Vec<((u64, u64), bool)>,
    /// Of the step being walked: every item so far was all cached, and the bytes they
    /// counted ahead.
    step_cached: bool,
    step_bytes: u64,
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
    /// The cache's generation as the pass started.
    generation: u64,
}

impl PassState {
    /// Starts a pass over `walks`: the downloads each user's plans still hold, and the
    /// shares of the downloads the pass may start.
    fn start(walks: &mut [Walk], fetcher: &Fetcher, generation: u64) -> PassState {
        let mut started_by_user: HashMap<u32, usize> = HashMap::new();
        for walk in walks.iter_mut() {
            walk.cursor.started.retain(|key| fetcher.is_in_flight(*key));
            *started_by_user.entry(walk.uid).or_default() += walk.cursor.started.len();
        }
        let users_walking: HashSet<u32> = walks
            .iter()
            .filter(|w| w.at.0 < w.cursor.steps.len())
            .map(|w| w.uid)
            .collect();
        let shares = 2 * fetcher.max_concurrent_requests();
        PassState {
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
            generation,
        }
    }

    /// Whether the pass issues nothing more: the downloads are all taken, or, for a
    /// step after the current one (`ahead`), the bytes ahead reached their share.
    fn is_full(&self, fetcher: &Fetcher, ahead: bool, max_ahead_bytes: u64) -> bool {
        fetcher.in_flight_count() >= self.max_in_flight
            || (ahead && self.ahead_bytes >= max_ahead_bytes)
    }

    /// Whether user `uid`'s plans hold their share of the downloads.
    fn share_taken(&self, uid: u32) -> bool {
        self.started_by_user.get(&uid).copied().unwrap_or(0) >= self.user_share
    }
}

/// What issuing one item came to.
struct ItemIssued {
    /// Every part, range and edge of the item is cached, downloading or started.
    all: bool,
    /// The pass or the user's share filled up while it was issued.
    filled: bool,
    /// The bytes it counted against the bytes ahead.
    bytes: u64,
    /// The parts of the item's own reads (not its read-around), which match reads to
    /// its step.
    parts: Vec<PartKey>,
    /// It started a download, and gave the turn to the next plan: the item is walked
    /// again at the plan's next turn.
    turn_taken: bool,
    /// Every part it reads is cached, and none of its bytes is fetched exactly.
    all_cached: bool,
}

// Not a type of its own: a pass takes every plan's cursor and issues through the fetcher, the exact rows and the cached offsets, the Prefetcher's whole state; its own state is PassState, Walk and TopUpCursor.
impl Prefetcher {
    /// Issues prefetches for every plan's next steps, within the bounds, and records
    /// the parts of each step it resolved for matching reads to steps.
    pub(super) fn top_up(&self) {
        let _one_pass_at_a_time = self.top_up_pass.lock();
        #[cfg(any(test, feature = "test-support"))]
        self.counters
            .top_up_passes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut walks = self.take_walks();
        let mut pass = PassState::start(&mut walks, &self.fetcher, self.cache.generation());
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
        self.walk_in_turn(&mut walks, &mut pass, &read_whole);
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

    /// Every plan's walk for a pass, by handle: its steps in view and its cursor, taken
    /// out under the plans' lock, which every read of a planned dataset takes, and put
    /// back after the pass. Nothing is issued under it, since issuing can wait (the
    /// fetcher's and the cache's locks, an earlier mount's part file claimed with a
    /// header read).
    fn take_walks(&self) -> Vec<Walk> {
        let mut walks: Vec<Walk> = self
            .plans
            .lock()
            .iter_mut()
            .filter(|(_, a)| self.has_standing(a))
            .map(|(handle, a)| {
                let lookahead = self.lookahead_of(&a.dataset);
                let start = a.plan.position.min(a.plan.steps.len());
                let end = (start + 1 + lookahead).min(a.plan.steps.len());
                let cursor = match a.top_up.take() {
                    Some(cursor) if cursor.mark == a.plan.mark() => cursor,
                    earlier => {
                        // The steps behind the reader are not walked again.
                        let behind = a.plan.place(start.saturating_sub(1));
                        let mut cached = earlier.map(|c| c.cached_steps).unwrap_or_default();
                        cached
                            .0
                            .retain(|place, _| place.0 == behind.0 && place.1 >= behind.1);
                        let steps = a.plan.steps[start..end].into();
                        TopUpCursor::at_start(a.plan.mark(), &a.dataset, steps, cached)
                    }
                };
                let places = (start..end)
                    .map(|index| (a.plan.place(index), a.plan.is_resolved(index)))
                    .collect();
                Walk {
                    handle: *handle,
                    uid: a.uid,
                    dataset: a.dataset.clone(),
                    start,
                    at: (cursor.step, cursor.item),
                    cursor,
                    behind: false,
                    checked_step: None,
                    moved: false,
                    stopped: false,
                    places,
                    step_cached: false,
                    step_bytes: 0,
                }
            })
            .collect();
        walks.sort_by_key(|w| w.handle);
        walks
    }

    /// Walks the plans' items round by round, each plan taking an item in turn, until
    /// the pass is full or every walk is done: walked one plan's step after another,
    /// the plan of the lowest handle had its step issued first on every pass, and with
    /// eight ranks on one link its rank finished a second before the others.
    fn walk_in_turn(
        &self,
        walks: &mut [Walk],
        pass: &mut PassState,
        read_whole: &HashSet<ObjectId>,
    ) {
        let rounds = walks
            .iter()
            .map(|w| w.cursor.steps.len())
            .max()
            .unwrap_or(0);
        // The plan with the fewest downloads of its own on their way takes the first
        // turn, and every turn starts one download at most: ranks whose windows are
        // whole chunks of 180 MB took the link a chunk each in turn, and eight of them
        // finished 1.7x apart, and in lockstep as DDP trains, 1.40x the link's time.
        walks.sort_by_key(|w| (w.cursor.started.len(), w.handle));
        for round in 0..rounds {
            let mut walked = true;
            while walked {
                walked = false;
                for walk in walks.iter_mut() {
                    if !walk.stopped && walk.at.0 <= round && walk.at.0 < walk.cursor.steps.len() {
                        walked = true;
                        if let Walked::PassFull = self.walk_item(walk, pass, read_whole) {
                            return;
                        }
                    }
                }
            }
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
            if !self.still_upcoming(walk, index) {
                walk.moved = true;
                walk.stopped = true;
                return Walked::Next;
            }
            walk.checked_step = Some(step_index);
        }
        let ahead = step_index > 0;
        // Only a chunked dataset's steps are passed so: a monolithic dataset's virtual
        // chunks share parts with their neighbours, and its plans are ranked anew at
        // every pass from what the walks located; that case was not measured.
        let chunked = matches!(walk.dataset, Dataset::Chunked(_));
        if chunked && item == Item::default() && !walk.behind {
            let (place, resolved) = walk.places[step_index];
            let cached = walk.cursor.cached_steps.0.get(&place).copied();
            if let Some(cached) = cached.filter(|c| resolved && c.generation == pass.generation) {
                if ahead && pass.is_full(&self.fetcher, ahead, self.config.max_ahead_bytes) {
                    return Walked::PassFull;
                }
                if ahead {
                    walk.cursor.ahead_bytes += cached.bytes;
                    pass.ahead_bytes += cached.bytes;
                }
                walk.cursor.step = step_index + 1;
                walk.at = (step_index + 1, Item::default());
                return Walked::Next;
            }
            walk.step_cached = true;
            walk.step_bytes = 0;
        }
        let step = &walk.cursor.steps[step_index];
        let Some((reads, next)) = self.item_reads(&walk.dataset, step, item) else {
            // The step's end: resolved if all of it was issued.
            if !walk.behind {
                let parts = std::mem::take(&mut walk.cursor.parts);
                pass.resolved
                    .push((walk.handle, index, step.clone(), parts));
                walk.cursor.step = step_index + 1;
                walk.cursor.item = Item::default();
                if walk.step_cached {
                    let cached = CachedStep {
                        generation: pass.generation,
                        bytes: walk.step_bytes,
                    };
                    walk.cursor
                        .cached_steps
                        .0
                        .insert(walk.places[step_index].0, cached);
                }
            }
            walk.at = (step_index + 1, Item::default());
            return Walked::Next;
        };
        #[cfg(any(test, feature = "test-support"))]
        self.counters
            .items_walked
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if pass.is_full(&self.fetcher, ahead, self.config.max_ahead_bytes) {
            return Walked::PassFull;
        }
        if pass.share_taken(walk.uid) {
            walk.stopped = true;
            return Walked::Next;
        }
        let issued = self.issue_item(walk, pass, reads, ahead, read_whole);
        if issued.turn_taken {
            // Walked again at the plan's next turn, which records its parts once all are
            // issued.
            return Walked::Next;
        }
        walk.step_cached &= issued.all_cached && issued.all;
        walk.step_bytes += issued.bytes;
        if issued.all && !walk.behind {
            walk.cursor.item = next;
            walk.cursor.ahead_bytes += issued.bytes;
            walk.cursor.parts.extend(issued.parts);
        } else {
            walk.behind = true;
        }
        walk.at = (step_index, next);
        if issued.filled {
            // The user's share is taken: the plan waits for a later pass. (The pass
            // itself is full if the downloads are.)
            walk.stopped = true;
            if pass.is_full(&self.fetcher, ahead, self.config.max_ahead_bytes) {
                return Walked::PassFull;
            }
        }
        Walked::Next
    }

    /// Whether the plan's step `index` is still ahead of its reader. The reader may
    /// have moved on since the snapshot, and the eviction freed the steps it passed:
    /// those are not fetched again. A move that slips in between costs at most one
    /// step's prefetches.
    fn still_upcoming(&self, walk: &Walk, index: usize) -> bool {
        self.plans
            .lock()
            .get(&walk.handle)
            .is_some_and(|a| a.plan.is_upcoming(walk.cursor.mark.revision, index))
    }

    /// Issues what an item of `walk`'s plan reads, within the pass's bounds: its parts
    /// (its own first, its read-around after), its exact ranges, and its neighbours'
    /// edges. `ahead`: the item's step comes after the current one.
    fn issue_item(
        &self,
        walk: &mut Walk,
        pass: &mut PassState,
        reads: StepReads,
        ahead: bool,
        read_whole: &HashSet<ObjectId>,
    ) -> ItemIssued {
        let mut issued = ItemIssued {
            all: reads.complete,
            filled: false,
            bytes: 0,
            parts: Vec::new(),
            turn_taken: false,
            all_cached: reads.exact.is_empty() && reads.edges.is_empty(),
        };
        // The item's own parts queue first; its neighbours' edges after them.
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
            let window_chunk = reads.window_chunk.filter(|_| of_the_step);
            for part in self.fetcher.parts_of(range) {
                let target = (object, part, window_chunk);
                self.issue_part(walk, pass, &mut issued, target, of_the_step, ahead);
                if issued.turn_taken {
                    return issued;
                }
            }
        }
        if let Dataset::Chunked(dataset) = &walk.dataset {
            for range in reads.exact {
                let max_ahead_bytes = self.config.max_ahead_bytes;
                if pass.is_full(&self.fetcher, ahead, max_ahead_bytes) || pass.share_taken(walk.uid)
                {
                    issued.filled = true;
                    issued.all = false;
                    break;
                }
                let exact = self.exact.issue_exact(dataset, range);
                issued.parts.extend(exact.parts);
                if ahead {
                    issued.bytes += exact.bytes;
                    pass.ahead_bytes += exact.bytes;
                }
                if !exact.all {
                    // No room for more planned bytes: nothing after this is asked for
                    // before it, and the room's return wakes the next pass.
                    issued.filled = true;
                    issued.all = false;
                    break;
                }
            }
        }
        for (object, range) in edges {
            if read_whole.contains(&object.id) {
                continue;
            }
            if ahead && pass.ahead_bytes >= self.config.max_ahead_bytes {
                issued.all = false;
                continue;
            }
            if ahead {
                issued.bytes += range.end - range.start;
                pass.ahead_bytes += range.end - range.start;
            }
            self.fetcher.prefetch_edge(object, range.clone());
        }
        issued
    }

    /// Issues part `part` of `object` for an item, once per pass, unless the pass or the
    /// user's share is full. `of_the_step`: the part is of the item's own reads, not of
    /// its read-around; `window_chunk`: of the chunk a window step reads whole.
    fn issue_part(
        &self,
        walk: &mut Walk,
        pass: &mut PassState,
        issued: &mut ItemIssued,
        (object, part, window_chunk): (&Arc<ObjectInfo>, u64, Option<usize>),
        of_the_step: bool,
        ahead: bool,
    ) {
        let key = Fetcher::key(object, part);
        if of_the_step {
            issued.parts.push(key);
        }
        if !pass.seen.insert(key) {
            // Looked up only while the item may still be all cached: an item with
            // exact ranges never is, and its row offsets' parts recur in every item.
            issued.all_cached = issued.all_cached && self.cache.contains(key);
            return;
        }
        if pass.is_full(&self.fetcher, ahead, self.config.max_ahead_bytes)
            || pass.share_taken(walk.uid)
        {
            issued.filled = true;
            issued.all = false;
            return;
        }
        if ahead {
            let range = self.fetcher.part_range(object, part);
            issued.bytes += range.end - range.start;
            pass.ahead_bytes += range.end - range.start;
        }
        #[cfg(any(test, feature = "test-support"))]
        self.counters.before_issuing();
        // A part this plan started has its pages stored already once it arrives.
        let window_chunk = window_chunk.filter(|_| !walk.cursor.started.contains(&key));
        let started = match (&walk.dataset, window_chunk) {
            (Dataset::Chunked(dataset), Some(chunk)) => {
                self.prefetch_window_part(dataset, chunk, object, part)
            }
            _ => self.fetcher.prefetch(object, part),
        };
        issued.all_cached = issued.all_cached && !started && self.cache.contains(key);
        if started {
            walk.cursor.started.push(key);
            *pass.started_by_user.entry(walk.uid).or_default() += 1;
            issued.turn_taken = true;
            issued.all = false;
        } else if !self.cache.contains(key) && !self.fetcher.is_in_flight(key) {
            // Not started, and neither cached nor downloading: it waits for room in the
            // cache, and a later pass issues it again.
            issued.all = false;
        }
    }

    /// Prefetches part `part` of one of the arrays of a window's chunk `chunk` and, for
    /// its values and column ids, stores the part's whole pages into the page cache of
    /// the flat file once it is cached (prefetched, or downloading for a reader) and
    /// the chunk's row offsets have passed their check. Every row of a window is read, in an order shuffled across the window, so
    /// a reader gets far only once most of the window has arrived: left to its reads,
    /// the window's bytes went into the page cache through FUSE replies and the
    /// read-around's stores after the last part came, beside the readers on the same
    /// cores (8 ranks in lockstep, each reading one chunk of 180 MB, spent 0.5 s past
    /// the link's time that way).
    fn prefetch_window_part(
        &self,
        dataset: &Arc<FlatDataset>,
        chunk: usize,
        object: &Arc<ObjectInfo>,
        part: u64,
    ) -> bool {
        let kind = [ArrayKind::Data, ArrayKind::ColPtr]
            .into_iter()
            .find(|&kind| dataset.array(chunk, kind).id == object.id);
        let (Some(kind), Some(pages)) = (kind, self.exact.planned_pages()) else {
            return self.fetcher.prefetch(object, part);
        };
        // Whole pages only: a page shared with the next part or chunk is left to the
        // reader's fault, since a store of part of a page leaves it not up to date.
        let object_bytes = self.fetcher.part_range(object, part);
        let in_file = dataset.layout.nnz_before(chunk) * dataset.layout.width(kind);
        let (start, end) = (in_file + object_bytes.start, in_file + object_bytes.end);
        let start = start.div_ceil(PAGE) * PAGE;
        let end = if end == dataset.layout.file_len(kind) {
            end
        } else {
            end / PAGE * PAGE
        };
        let check = self.offsets.row_offset_check().clone();
        let dataset = dataset.clone();
        self.fetcher.prefetch_then(object, part, async move {
            if start < end && matches!(check.check(&dataset, chunk).await, Ok(Ok(()))) {
                pages.arrived(&dataset, kind, start..end);
            }
        })
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
            Dataset::Chunked(flat) if self.exact.fetches_rows_exactly(flat) => {
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
            window_chunk: Some(chunk),
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
        let in_chunk = rows.start.max(chunk_rows.start)..rows.end.min(chunk_rows.end);
        let local = in_chunk.start - chunk_rows.start..in_chunk.end - chunk_rows.start;
        let Some(values) = self.offsets.cached_value_range(dataset, chunk, local) else {
            reads.complete = false;
            return reads;
        };
        if self.exact.fetches_rows_exactly(dataset) {
            reads.exact = self.exact.exact_ranges(dataset, chunk, &values);
            let (pages, chunks) = self.exact.row_offset_pages(dataset, &in_chunk);
            // The pages may reach into a neighbour (a row at a chunk's end, or chunks not
            // a whole number of pages): its offsets are fetched whole and checked before
            // the pages can be served.
            let mut checked = true;
            for other in chunks.into_iter().filter(|&c| c != chunk) {
                let row_ptr = dataset.array(other, ArrayKind::RowPtr);
                reads.ranges.push((row_ptr.clone(), 0..row_ptr.size));
                checked &= self.offsets.row_offsets_checked(dataset, other);
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
        let entry = |row: u64| self.offsets.cached_entry(row_ptr, dataset.dtypes[1], row);
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
