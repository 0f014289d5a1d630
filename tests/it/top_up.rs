//! The prefetcher's top-up on whole mounts (assembled in-process, without FUSE): what a
//! pass walks and issues, the order plans take the downloads in, the locks it leaves
//! free, the ranks it keeps, a user's share of the cache, and a panic contained.
//! They watch the prefetcher through its test probe (`scdlfs::prefetch::probe`).

use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{GetResult, ObjectStore};
use parking_lot::Mutex;
use scdl_format::ArrayKind;

use scdlfs::catalog::{Dataset, DirMode};
use scdlfs::fs::{FsCore, Ownership};
use scdlfs::mount::{assemble, MountSettings};
use scdlfs::prefetch::probe::Probe;
use scdlfs::prefetch::Viewer;
use scdlfs::store::wrapper::{GetRequest, HookedStore, StoreHook};
use scdlfs::synthetic::SyntheticDataset;

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

/// Rows of [`core_of_many_chunks_downloads_held`]' dataset: 600 chunks of 4 rows.
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
    let local: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(source).unwrap());
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
        users: Arc::new(scdlfs::users::Users::unwatched()),
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
async fn top_up_until_a_pass_walks_nothing(prefetcher: &Probe<'_>, pause: Duration) -> bool {
    let walked = || prefetcher.counters().items_walked.load(Ordering::Relaxed);
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
    let prefetcher = core.prefetcher().probe();
    for _ in 0..20 {
        prefetcher.top_up();
    }
    let passes = prefetcher.counters().top_up_passes.load(Ordering::Relaxed);
    let walked = prefetcher.counters().items_walked.load(Ordering::Relaxed);
    let max_in_flight = 2 * prefetcher.max_concurrent_requests() as u64;
    assert!(
        prefetcher.in_flight_count() as u64 >= max_in_flight,
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
    let passes = prefetcher.counters().top_up_passes.load(Ordering::Relaxed);
    let walked = prefetcher.counters().items_walked.load(Ordering::Relaxed);
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
    let prefetcher = core.prefetcher().probe();
    prefetcher.top_up();
    let other = write_a_plan_as(&core, 4242, "window 599\nwindow 597\n").await;
    for _ in 0..3 {
        prefetcher.top_up();
    }
    let dataset = match prefetcher.dataset_of(other) {
        Dataset::Chunked(dataset) => dataset.clone(),
        Dataset::Monolithic(_) => unreachable!("a chunked dataset"),
    };
    for chunk in [599, 597] {
        for kind in ArrayKind::ALL {
            assert!(
                prefetcher.is_in_flight(dataset.array(chunk, kind), 0),
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
    let prefetcher = core.prefetcher().probe();
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
        let _no_pass_yet = prefetcher.hold_passes();
        for (handle, chunks) in [(first, 0..chunks / 2), (second, chunks / 2..chunks)] {
            core.write(handle, window(chunks).as_bytes()).unwrap();
        }
    }
    prefetcher.top_up();
    let dataset = match prefetcher.dataset_of(first) {
        Dataset::Chunked(dataset) => dataset.clone(),
        Dataset::Monolithic(_) => unreachable!("a chunked dataset"),
    };
    let issued = |chunks: std::ops::Range<usize>| {
        chunks
            .filter(|&chunk| {
                let values = dataset.array(chunk, ArrayKind::Data);
                prefetcher.is_in_flight(values, 0)
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

/// Two ranks' plans (one user), each of a window of one chunk of many parts, as ranks
/// whose windows are whole chunks of 180 MB: each turn starts one download, so a pass
/// that cannot issue both chunks splits the downloads between them, where the first
/// plan took its whole chunk before the second had a part (eight such ranks in
/// lockstep: 1.40x the link's time, 1.15x in turns).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_whose_windows_are_one_large_chunk_each_take_its_parts_in_turn() {
    let (source, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    SyntheticDataset {
        rows: 4_000,
        genes: 2_000,
        chunk_rows: 2_000,
        mean_values: 200,
        seed: 13,
    }
    .write_chunked(&source.path().join("ds"))
    .unwrap();
    let gate = Arc::new(AtomicBool::new(false));
    let local: Arc<dyn ObjectStore> =
        Arc::new(LocalFileSystem::new_with_prefix(source.path()).unwrap());
    let core = core_over(
        Arc::new(HookedStore::new(local, GatedReads(gate.clone()))),
        cache.path(),
    );
    let file = hint_file(&core).await;
    gate.store(true, Ordering::SeqCst);
    let prefetcher = core.prefetcher().probe();
    let (first, second) = (
        core.open_as(file, 0).unwrap().handle,
        core.open_as(file, 0).unwrap().handle,
    );
    {
        let _no_pass_yet = prefetcher.hold_passes();
        for (handle, chunk) in [(first, 0), (second, 1)] {
            core.write(
                handle,
                format!("scdlfs-hints 1\nplan 0\nwindow {chunk}\n").as_bytes(),
            )
            .unwrap();
        }
    }
    prefetcher.top_up();
    let dataset = match prefetcher.dataset_of(first) {
        Dataset::Chunked(dataset) => dataset.clone(),
        Dataset::Monolithic(_) => unreachable!("a chunked dataset"),
    };
    let in_flight = |chunk: usize| {
        let values = dataset.array(chunk, ArrayKind::Data);
        let parts = values.size.div_ceil(64 << 10);
        assert!(parts >= 20, "a chunk of {parts} parts");
        (0..parts)
            .filter(|&part| prefetcher.is_in_flight(values, part))
            .count()
    };
    let (of_first, of_second) = (in_flight(0), in_flight(1));
    assert!(
        of_first > 0 && of_first < 20,
        "{of_first} parts of the first chunk"
    );
    assert!(
        of_first.abs_diff(of_second) <= 1,
        "parts downloading: {of_first} of the first plan's chunk, {of_second} of the second's"
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
    core.prefetcher().probe().on_issue(Arc::new(move || {
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

    let prefetcher = core.prefetcher().probe();
    let expansions = || prefetcher.counters().items_walked.load(Ordering::Relaxed);
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
    let prefetcher = core.prefetcher().probe();
    let ranked = || {
        prefetcher
            .counters()
            .horizons_ranked
            .load(Ordering::Relaxed)
    };
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
    read_the_first_rows_as(&core, 4242).await;
    let dataset = match core.prefetcher().probe().dataset_of(handle) {
        Dataset::Chunked(dataset) => dataset.clone(),
        Dataset::Monolithic(_) => unreachable!("a chunked dataset"),
    };
    let chunk_bytes = |chunk: usize| -> u64 {
        ArrayKind::ALL
            .iter()
            .map(|kind| dataset.array(chunk, *kind).size)
            .sum()
    };
    let prefetcher = core.prefetcher().probe();
    prefetcher.rank_plans();
    let protected: u64 = (0..dataset.chunks.len())
        .filter(|&chunk| {
            let group = dataset.array(chunk, ArrayKind::Data).group.unwrap();
            prefetcher.next_use(scdlfs::cache::Unit::Group(group))
                == Some(scdlfs::cache::NextUse::Current)
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

/// A plan whose rows are fetched exactly (a dataset whose values are several times the
/// cache) reads nothing of a chunk from the cache but its row offsets: the cache may
/// give up the chunk's other parts, which an earlier order left, while the plan ranks
/// it (at 10^8 rows they pinned 580 MB of a 1 GiB cache, and the row offsets the plans
/// needed churned in the rest: fetched 1.21 times each). Over a cache that holds the
/// values, the plans read every part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_of_exact_rows_reads_only_its_chunks_row_offsets_from_the_cache() {
    for (budget_divisor, exactly) in [(8, true), (1, false)] {
        let (source, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        small_dataset()
            .write_chunked(&source.path().join("ds"))
            .unwrap();
        let budget = bytes_under(&source.path().join("ds")) / budget_divisor;
        let core = core_over_a_cache_of(
            Arc::new(LocalFileSystem::new_with_prefix(source.path()).unwrap()),
            cache.path(),
            budget,
            false,
        );
        let handle = write_a_plan_as(&core, 0, "rows 0 2500\n").await;
        let prefetcher = core.prefetcher().probe();
        let Dataset::Chunked(dataset) = prefetcher.dataset_of(handle) else {
            unreachable!("a chunked dataset")
        };
        for chunk in 0..dataset.chunks.len() {
            let group = dataset.array(chunk, ArrayKind::Data).group.unwrap();
            let expected = exactly.then(|| dataset.array(chunk, ArrayKind::RowPtr).id);
            assert_eq!(
                prefetcher.reads_only(scdlfs::cache::Unit::Group(group)),
                expected,
                "chunk {chunk}, a cache of 1/{budget_divisor} of the dataset"
            );
        }
        // A plan of windows over the same dataset reads its chunks' parts from the cache
        // whole: a `window` step fetches whole parts, whatever the dataset's size.
        let windows = write_a_plan_as(&core, 0, "window 0 1\n").await;
        prefetcher.rank_plans();
        let group_of = |chunk| {
            scdlfs::cache::Unit::Group(dataset.array(chunk, ArrayKind::Data).group.unwrap())
        };
        assert_eq!(prefetcher.reads_only(group_of(0)), None, "a window's chunk");
        let last = dataset.chunks.len() - 1;
        let expected = exactly.then(|| dataset.array(last, ArrayKind::RowPtr).id);
        assert_eq!(prefetcher.reads_only(group_of(last)), expected);
        core.release(windows);
        core.release(handle);
        assert_eq!(prefetcher.reads_only(group_of(0)), None, "the plan is gone");
    }
}

/// On a mount of one user, the step being read protects all its chunks, however wide:
/// bounded by the budget, a step of random rows over every chunk of a dataset twice the
/// cache had its chunks past the budget rank as nothing planned, evicted first (by the
/// next step's prefetches too) while they were read, and a single hinted reader in
/// bench --quick fetched 82-102 MB of blocks and 55-167 MB of random rows of a 47 MB
/// dataset, where it fetched 50-55 before the share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_mount_of_one_user_the_step_being_read_protects_all_its_chunks() {
    let (source, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    small_dataset()
        .write_chunked(&source.path().join("ds"))
        .unwrap();
    let budget = bytes_under(&source.path().join("ds")) / 2;
    let core = core_over_a_cache_of(
        Arc::new(LocalFileSystem::new_with_prefix(source.path()).unwrap()),
        cache.path(),
        budget,
        false,
    );
    let handle = open_hint_file(&core).await;
    core.write(handle, b"scdlfs-hints 1\nplan 0\nrows 0 2500\n")
        .unwrap();
    let prefetcher = core.prefetcher().probe();
    let dataset = match prefetcher.dataset_of(handle) {
        Dataset::Chunked(dataset) => dataset.clone(),
        Dataset::Monolithic(_) => unreachable!("a chunked dataset"),
    };
    prefetcher.rank_plans();
    let unprotected: Vec<usize> = (0..dataset.chunks.len())
        .filter(|&chunk| {
            let group = dataset.array(chunk, ArrayKind::Data).group.unwrap();
            prefetcher.next_use(scdlfs::cache::Unit::Group(group))
                != Some(scdlfs::cache::NextUse::Current)
        })
        .collect();
    assert!(
        unprotected.is_empty(),
        "chunks {unprotected:?} of the step being read are not protected"
    );
    core.release(handle);
}

/// Reads the first page of the dataset's flat `data.npy` through a handle user `uid`
/// opened, as that user's reader would.
async fn read_the_first_rows_as(core: &FsCore, uid: u32) {
    read_as(core, uid, "data.npy", 0, 4096).await;
}

/// Reads `len` bytes at `offset` of the dataset's flat file `name` through a handle
/// user `uid` opened.
async fn read_as(core: &FsCore, uid: u32, name: &str, offset: u64, len: u32) {
    let ds = core.lookup(ROOT, OsStr::new("ds")).await.unwrap();
    let file = core
        .lookup(ds.attr.ino.0, OsStr::new(name))
        .await
        .unwrap()
        .attr
        .ino
        .0;
    let handle = core.open_as(file, uid).unwrap().handle;
    core.read(file, handle, offset, len).await.unwrap();
    core.release(handle);
}

/// On a mount other users may read, a plan ranks nothing and has nothing prefetched
/// until its own user reads its dataset: another user's reads do not count, and its
/// user's first read gives it both. Beside another user's cold epoch, a writer of
/// plans over every row that never read took half the downloads and ranked every
/// chunk as needed next, which left the reader's own prefetches no room (the reader
/// alone 42.6 s, beside the writer 75.2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_whose_user_has_not_read_ranks_and_fetches_nothing_on_a_shared_mount() {
    let (source, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    small_dataset()
        .write_chunked(&source.path().join("ds"))
        .unwrap();
    let core = core_over_a_cache_of(
        Arc::new(LocalFileSystem::new_with_prefix(source.path()).unwrap()),
        cache.path(),
        256 << 20,
        true,
    );
    let handle = write_a_plan_as(&core, 4242, "rows 0 300\nrows 300 600\n").await;
    let prefetcher = core.prefetcher().probe();
    let dataset = match prefetcher.dataset_of(handle) {
        Dataset::Chunked(dataset) => dataset.clone(),
        Dataset::Monolithic(_) => unreachable!("a chunked dataset"),
    };
    let first_chunk = dataset.array(0, ArrayKind::Data).group.unwrap();
    let ranked_and_fetched = || {
        prefetcher.rank_plans();
        prefetcher.top_up();
        (
            prefetcher.next_use(scdlfs::cache::Unit::Group(first_chunk)),
            prefetcher.metrics().prefetch_requests,
        )
    };
    assert_eq!(
        ranked_and_fetched(),
        (None, 0),
        "a plan nobody read ranked or fetched"
    );
    read_the_first_rows_as(&core, 0).await;
    assert_eq!(
        ranked_and_fetched(),
        (None, 0),
        "another user's read gave the plan its standing"
    );
    read_the_first_rows_as(&core, 4242).await;
    let (rank, prefetches) = ranked_and_fetched();
    assert_eq!(
        rank,
        Some(scdlfs::cache::NextUse::Current),
        "its user's read left the plan's step unranked"
    );
    assert!(prefetches > 0, "its user's read left the plan unfetched");
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
    core.prefetcher().probe().on_issue(Arc::new(move || {
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
    let metrics = core.prefetcher().probe().metrics();
    assert_eq!(metrics.prefetcher_panics, 1, "the panic was not counted");
    core.release(handle);
}

/// A plan's steps that a pass found wholly cached are not walked again when its reader
/// moves on, while no part joined or left the cache: a plan of random rows in steps of
/// 1,024 over a dataset all cached cost every move of its reader its lookahead's 5,120
/// items, the daemon's whole CPU beside a reader warm in the page cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_all_cached_are_not_walked_again_when_the_reader_moves() {
    let (source, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let core = core_of_a_dataset(source.path(), cache.path());
    let handle = open_hint_file(&core).await;
    // Steps of 100 single rows, spread over every chunk.
    let step = |s: u64| -> String {
        let rows: String = (0..100)
            .map(|i| (i * 25 + s) % 2_500)
            .map(|r| format!(" {r} {}", r + 1))
            .collect();
        format!("rows{rows}\n")
    };
    let steps: String = (0..8).map(step).collect();
    core.write(
        handle,
        format!("scdlfs-hints 4\nchunk-rows 300\nplan 0\n{steps}").as_bytes(),
    )
    .unwrap();
    let prefetcher = core.prefetcher().probe();
    let walked = || prefetcher.counters().items_walked.load(Ordering::Relaxed);
    assert!(
        top_up_until_a_pass_walks_nothing(&prefetcher, Duration::from_millis(50)).await,
        "the plan's lookahead was never all issued"
    );
    // Every part those steps read is cached now; the reader moves on, one step at a
    // time, and each move brings one new step into the lookahead.
    for reading in 1..4 {
        core.write(handle, format!("reading {reading}\n").as_bytes())
            .unwrap();
        assert!(
            top_up_until_a_pass_walks_nothing(&prefetcher, Duration::from_millis(50)).await,
            "the new step was never all issued"
        );
    }
    let before = walked();
    core.write(handle, b"reading 4\n").unwrap();
    prefetcher.top_up();
    let after_the_move = walked() - before;
    assert!(
        after_the_move <= 100,
        "a move walked {after_the_move} items: the steps all cached were walked again"
    );
    core.release(handle);
}
