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
use crate::parts::ObjectId;

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

/// A plan's last top-up that issued all its lookahead: every step resolved, every
/// part cached, downloading or started. Until the plan's revision or position changes a
/// pass has nothing to add for it. (A part it issued that fails, or is evicted before
/// its step is read, is fetched again when the reader moves, or by the read itself.)
#[derive(Clone, Copy, Debug)]
pub(super) struct ToppedUp {
    revision: u64,
    position: usize,
    /// What the plan's prefetches counted against [`PrefetchConfig::max_ahead_bytes`].
    ///
    /// [`PrefetchConfig::max_ahead_bytes`]: super::PrefetchConfig::max_ahead_bytes
    ahead_bytes: u64,
}

impl ToppedUp {
    /// Whether the plan is where this top-up left it.
    fn is_at(&self, plan: &super::plan::Plan) -> bool {
        self.revision == plan.revision() && self.position == plan.position.min(plan.steps.len())
    }
}

/// Bytes added to each side of an edge: the page the kernel rounds its read-around to,
/// and the `.npy` header before a chunk's first value.
const EDGE_SLACK: u64 = 8 << 10;

impl Prefetcher {
    /// Issues prefetches for every plan's next steps, within the bounds, and records
    /// the parts of each step it could resolve for matching reads to steps.
    pub(super) fn top_up(&self) {
        // A plan whose last pass issued all its lookahead at this revision and position
        // has nothing to issue until one of them changes: it is skipped, so that a plan
        // of wide steps that does not move (a writer that never reads) is not walked
        // again on every move of other readers and every download's end. Its bytes
        // ahead still count against the bound. Those are the bytes of the steps after
        // the current one: the step being read is needed now, whatever the share.
        // Counted in, a step of half the cache took the whole share and the next one
        // was fetched only once the reader came to it.
        let mut ahead_bytes = 0u64;
        let snapshot: Vec<(u64, u64, Dataset, usize, Vec<Step>)> = self
            .plans
            .lock()
            .iter()
            .filter_map(|(handle, a)| {
                let start = a.plan.position.min(a.plan.steps.len());
                if let Some(done) = a.topped_up.filter(|t| t.is_at(&a.plan)) {
                    ahead_bytes += done.ahead_bytes;
                    return None;
                }
                let end = (start + 1 + self.config.lookahead_steps).min(a.plan.steps.len());
                Some((
                    *handle,
                    a.plan.revision(),
                    a.dataset.clone(),
                    start,
                    a.plan.steps[start..end].to_vec(),
                ))
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
        // The arrays a plan's window step in view reads whole: an edge of one of them
        // is not fetched on its own, as its part comes whole with that step, in this
        // pass or, past the in-flight limit, a later one (an edge sent first had
        // those bytes come twice).
        let read_whole: HashSet<ObjectId> = snapshot
            .iter()
            .filter_map(|(_, _, dataset, _, steps)| match dataset {
                Dataset::Chunked(dataset) => Some((dataset, steps)),
                Dataset::Monolithic(_) => None,
            })
            .flat_map(|(dataset, steps)| {
                steps.iter().flat_map(move |step| match step {
                    Step::Window(chunks) => chunks
                        .iter()
                        .flat_map(|&chunk| {
                            ArrayKind::ALL.map(|kind| dataset.array(chunk as usize, kind).id)
                        })
                        .collect(),
                    Step::Rows(_) => Vec::new(),
                })
            })
            .collect();
        let located = || -> usize { monolithic.iter().map(|d| d.known_boundaries()).sum() };
        let located_before = located();
        let max_in_flight = 2 * self.fetcher.max_concurrent_requests();
        let mut seen = HashSet::new();
        let mut resolved = Vec::new();
        let mut topped_up = Vec::new();
        'plans: for (handle, revision, dataset, first, steps) in snapshot {
            let plan_bytes_before = ahead_bytes;
            // Whether every step of the lookahead was resolved and all its parts are
            // cached, downloading or started: then the next pass may skip the plan.
            let mut all_issued = true;
            for (offset, step) in steps.into_iter().enumerate() {
                #[cfg(test)]
                self.step_expansions
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let reads = match &dataset {
                    Dataset::Chunked(dataset) => self.step_reads(dataset, &step),
                    Dataset::Monolithic(dataset) => self.monolithic_step_reads(dataset, &step),
                };
                // The reader may have moved on since the snapshot, and the eviction
                // freed the steps it passed: those are not fetched again. Only this
                // look needs the lock that moves positions; the prefetches are issued
                // after it is released, since issuing one can wait (the fetcher's and
                // the cache's locks, an earlier mount's part file claimed with a header
                // read) and every read of a planned dataset and every status take it. A
                // move that slips in between costs at most one step's prefetches.
                let upcoming = self
                    .plans
                    .lock()
                    .get(&handle)
                    .is_some_and(|a| a.plan.is_upcoming(revision, first + offset));
                if !upcoming {
                    all_issued = false;
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
                        if !seen.insert(key) {
                            continue;
                        }
                        if ahead_bytes >= self.config.max_ahead_bytes
                            || self.fetcher.in_flight_count() >= max_in_flight
                        {
                            all_issued = false;
                            continue;
                        }
                        if offset > 0 {
                            let part = self.fetcher.part_range(object, index);
                            ahead_bytes += part.end - part.start;
                        }
                        #[cfg(test)]
                        self.before_issuing();
                        // Not started, and neither cached nor downloading: it waits for
                        // room in the cache, and a later pass issues it again.
                        if !self.fetcher.prefetch(object, index)
                            && !self.cache.contains(key)
                            && !self.fetcher.is_in_flight(key)
                        {
                            all_issued = false;
                        }
                    }
                }
                for (object, range) in edges {
                    if ahead_bytes < self.config.max_ahead_bytes && !read_whole.contains(&object.id)
                    {
                        if offset > 0 {
                            ahead_bytes += range.end - range.start;
                        }
                        self.fetcher.prefetch_edge(object, range.clone());
                    } else {
                        all_issued = false;
                    }
                }
                if reads.complete {
                    resolved.push((handle, first + offset, step, parts));
                } else {
                    all_issued = false;
                }
                if ahead_bytes >= self.config.max_ahead_bytes {
                    break 'plans;
                }
            }
            if all_issued {
                topped_up.push((handle, revision, first, ahead_bytes - plan_bytes_before));
            }
        }
        let mut plans = self.plans.lock();
        for (handle, index, step, parts) in resolved {
            if let Some(active) = plans.get_mut(&handle) {
                active.plan.resolve(index, &step, parts);
            }
        }
        for (handle, revision, position, ahead_bytes) in topped_up {
            if let Some(active) = plans.get_mut(&handle) {
                active.topped_up = Some(ToppedUp {
                    revision,
                    position,
                    ahead_bytes,
                });
            }
        }
        if located() != located_before {
            self.after_plans_changed(&plans);
        }
    }

    #[cfg(test)]
    fn before_issuing(&self) {
        let hook = self.issue_hook.lock().clone();
        if let Some(hook) = hook {
            hook();
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

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;
    use std::sync::atomic::Ordering;
    use std::sync::{mpsc, Arc};
    use std::time::{Duration, Instant};

    use object_store::local::LocalFileSystem;
    use object_store::path::Path as ObjectPath;
    use object_store::ObjectStore;
    use parking_lot::Mutex;

    use crate::catalog::DirMode;
    use crate::fs::{FsCore, Ownership};
    use crate::mount::{assemble, MountSettings};
    use crate::prefetch::Viewer;
    use crate::synthetic::SyntheticDataset;

    const ROOT: u64 = 1;

    /// The core of a mount of a small chunked dataset `ds` in a local folder.
    fn core_of_a_dataset(source: &std::path::Path, cache: &std::path::Path) -> FsCore {
        SyntheticDataset {
            rows: 2_500,
            genes: 3_000,
            chunk_rows: 300,
            mean_values: 60,
            seed: 11,
        }
        .write_chunked(&source.join("ds"))
        .unwrap();
        let store: Arc<dyn ObjectStore> =
            Arc::new(LocalFileSystem::new_with_prefix(source).unwrap());
        let settings = MountSettings {
            fs_name: "top-up-test".into(),
            endpoint: None,
            view: DirMode::Discover,
            cache_dir: cache.to_owned(),
            cache_reset: false,
            cache_bytes: 256 << 20,
            max_cached_chunks: None,
            part_size: 64 << 10,
            max_concurrent_requests: 8,
            allow_other: false,
            allow_root: false,
            ownership: Ownership::of_mounting_user(),
            fuse_threads: 1,
            prefetch_lookahead_steps: 2,
            read_timeout: Duration::from_secs(15),
            fetch_memory: 64 << 20,
            read_ahead: None,
            cache_read_around: 0,
            metadata_ttl: None,
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
        let ds = core.lookup(ROOT, OsStr::new("ds")).await.unwrap();
        let hints = core
            .lookup(ds.attr.ino.0, OsStr::new(scdl_format::hint::HINT_FILE))
            .await
            .unwrap();
        core.open(hints.attr.ino.0).unwrap().handle
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
        let expansions = || prefetcher.step_expansions.load(Ordering::Relaxed);
        // Its parts download and its row offsets arrive: passes expand its steps until
        // all are resolved and issued.
        let deadline = Instant::now() + Duration::from_secs(20);
        let idle_pass = loop {
            let before = expansions();
            prefetcher.top_up();
            if expansions() == before {
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            idle_pass,
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
}
