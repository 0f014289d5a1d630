//! The fetcher against `object_store::memory::InMemory` and the doubles of
//! [`crate::store`], with a real disk cache in a temporary directory: no FUSE, no S3
//! server. One download per part, demand before prefetch, no retries of its own (the
//! client is the retry layer), the hard bound on a silent store, If-Match, short
//! bodies, a panicking download.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{GetRange, ObjectStoreExt, PutPayload};

use super::edges::EdgeInFlight;
use super::planned::Covered;
use super::*;
use crate::cache::{EvictionAdvisor, NextUse, Unit};
use crate::error::FsError;
use crate::parts::{GroupId, ObjectId};
use crate::planner_wake::PlannerWake;
use crate::store::counting::CountReads;
use crate::store::faulty::{Fault, InjectFaults};
use crate::store::wrapper::{HookedStore, StoreHook};

const PART: u64 = 1000;
const OBJECT_LEN: u64 = 4500;
const READ_TIMEOUT: Duration = Duration::from_millis(500);
const MEMORY_CAP: u64 = 5 * PART;

fn content() -> Vec<u8> {
    (0..OBJECT_LEN).map(|i| (i * 7 % 251) as u8).collect()
}

struct Bench {
    fetcher: Arc<Fetcher>,
    object: Arc<ObjectInfo>,
    dir: tempfile::TempDir,
}

/// A fetcher over `wrap(InMemory holding one object)`, its ETag pinned as listed.
async fn bench<S: ObjectStore>(
    slots: usize,
    wrap: impl FnOnce(Arc<dyn ObjectStore>) -> Arc<S>,
) -> (Bench, Arc<S>) {
    bench_with_cache(slots, 1 << 20, READ_TIMEOUT, wrap).await
}

async fn bench_with_cache<S: ObjectStore>(
    slots: usize,
    cache_budget: u64,
    read_timeout: Duration,
    wrap: impl FnOnce(Arc<dyn ObjectStore>) -> Arc<S>,
) -> (Bench, Arc<S>) {
    let memory = Arc::new(InMemory::new());
    let key = ObjectPath::from("data/object.bin");
    let put = memory.put(&key, PutPayload::from(content())).await.unwrap();
    let store = wrap(memory);
    let dir = tempfile::tempdir().unwrap();
    let fetcher = fetcher_on(store.clone(), dir.path(), cache_budget, slots, read_timeout);
    let object = Arc::new(ObjectInfo {
        id: ObjectId(0),
        key,
        size: OBJECT_LEN,
        etag: put.e_tag.map(Into::into),
        mtime: SystemTime::UNIX_EPOCH,
        group: None,
    });
    (
        Bench {
            fetcher,
            object,
            dir,
        },
        store,
    )
}

/// A fetcher of `store` whose cache is (or takes over) the one in `cache_dir`; the
/// earlier mount's part files are not adopted in the background.
fn fetcher_on(
    store: Arc<dyn ObjectStore>,
    cache_dir: &std::path::Path,
    cache_budget: u64,
    slots: usize,
    read_timeout: Duration,
) -> Arc<Fetcher> {
    let owner = crate::cache::CacheOwner {
        source: "memory".into(),
        endpoint: None,
        reset: false,
    };
    let cache = Arc::new(
        DiskCache::open(
            &crate::cache_dir_check::prepare(cache_dir).unwrap(),
            &owner,
            cache_budget,
            None,
        )
        .unwrap(),
    );
    Fetcher::new(
        store,
        cache,
        FetchLimits {
            part_size: PART,
            max_concurrent_requests: slots,
            read_timeout,
            memory_cap: MEMORY_CAP,
        },
        Arc::new(Metrics::default()),
        PlannerWake::default(),
    )
}

async fn read_part(bench: &Bench, index: u64) -> FsResult<Vec<u8>> {
    let part = bench.fetcher.part(&bench.object, index).await?;
    let range = bench.fetcher.part_range(&bench.object, index);
    let mut out = vec![0; (range.end - range.start) as usize];
    part.copy_to(&mut out, 0)?;
    Ok(out)
}

/// Waits (a bounded while) for the downloads under way to leave the in-flight map.
async fn settle(fetcher: &Fetcher) {
    for _ in 0..500 {
        if fetcher.in_flight_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn expected(index: u64) -> Vec<u8> {
    let start = (index * PART) as usize;
    content()[start..(start + PART as usize).min(OBJECT_LEN as usize)].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_readers_of_a_part_share_one_download() {
    let (bench, counts) = bench(4, |s| Arc::new(HookedStore::new(s, CountReads::default()))).await;
    let bench = Arc::new(bench);
    let readers: Vec<_> = (0..40)
        .map(|i| {
            let bench = bench.clone();
            tokio::spawn(async move { read_part(&bench, i % 5).await.unwrap() })
        })
        .collect();
    for (i, reader) in readers.into_iter().enumerate() {
        assert_eq!(reader.await.unwrap(), expected(i as u64 % 5));
    }
    let snapshot = counts.hook().snapshot();
    assert_eq!(snapshot.len(), 5, "one range per part: {snapshot:?}");
    assert!(snapshot.values().all(|&n| n == 1), "{snapshot:?}");
    // Cached now: more reads make no request.
    read_part(&bench, 2).await.unwrap();
    assert_eq!(counts.hook().total(), 5);
}

/// The next daemon on the same cache directory, before it has read any of the earlier
/// mount's headers: a read claims its part's file by name, a prefetch too, and
/// neither asks the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_after_a_remount_claim_their_parts_files_before_adoption() {
    let (bench, counts) = bench(4, |s| Arc::new(HookedStore::new(s, CountReads::default()))).await;
    for index in 0..5 {
        read_part(&bench, index).await.unwrap();
    }
    settle(&bench.fetcher).await;
    let Bench {
        fetcher,
        object,
        dir,
    } = bench;
    drop(fetcher);
    let fetcher = fetcher_on(counts.clone(), dir.path(), 1 << 20, 4, READ_TIMEOUT);
    // Another mount, other ids.
    let object = Arc::new(ObjectInfo {
        id: ObjectId(7),
        key: object.key.clone(),
        size: object.size,
        etag: object.etag.clone(),
        mtime: object.mtime,
        group: None,
    });
    let bench = Bench {
        fetcher,
        object,
        dir,
    };
    assert!(bench.fetcher.cache.claims_pending());
    for index in 0..4 {
        assert_eq!(read_part(&bench, index).await.unwrap(), expected(index));
    }
    assert!(
        !bench.fetcher.prefetch(&bench.object, 4),
        "claimed, not fetched"
    );
    assert_eq!(counts.hook().total(), 5, "only the first mount's requests");
    let stats = bench.fetcher.cache.stats();
    assert_eq!((stats.adopted_parts, stats.unclaimed_parts), (5, 0));
}

/// A double that records the order in which requests were sent (a request is sent
/// once it holds a download slot) and holds each until the test lets it through.
#[derive(Debug)]
struct Gate {
    open: tokio::sync::Semaphore,
    order: parking_lot::Mutex<Vec<u64>>,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            open: tokio::sync::Semaphore::new(0),
            order: Default::default(),
        }
    }
}

#[async_trait::async_trait]
impl StoreHook for Gate {
    async fn get(
        &self,
        request: crate::store::wrapper::GetRequest<'_>,
    ) -> object_store::Result<object_store::GetResult> {
        if let Some(GetRange::Bounded(range)) = &request.options.range {
            self.order.lock().push(range.start / PART);
        }
        self.open.acquire().await.unwrap().forget();
        request.send().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demand_read_goes_before_queued_prefetches() {
    let (bench, gate) = bench(2, |s| Arc::new(HookedStore::new(s, Gate::default()))).await;
    // Prefetches of parts 0..4: one runs (they never take the last slot), three queue.
    for index in 0..4 {
        assert!(bench.fetcher.prefetch(&bench.object, index));
    }
    let demand = tokio::spawn({
        let (fetcher, object) = (bench.fetcher.clone(), bench.object.clone());
        async move { fetcher.part(&object, 4).await.map(|_| ()) }
    });
    // Let the demand request reach the queue before any slot frees.
    while bench.fetcher.in_flight_count() < 5 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    gate.hook().open.add_permits(5);
    demand.await.unwrap().unwrap();
    settle(&bench.fetcher).await;
    let order = gate.hook().order.lock().clone();
    assert_eq!(order.len(), 5, "{order:?}");
    let position = |part| order.iter().position(|&p| p == part).unwrap();
    assert!(
        (1..4).all(|queued| position(4) < position(queued)),
        "the demand read went after a queued prefetch: {order:?}"
    );
}

/// Faults on the first `n` requests, then none.
fn first_requests_fail(
    n: u64,
    fault: Fault,
) -> impl Fn(Arc<dyn ObjectStore>) -> Arc<HookedStore<InjectFaults>> {
    move |store| {
        let seen = Arc::new(AtomicU64::new(0));
        let fault = fault.clone();
        Arc::new(HookedStore::new(
            store,
            InjectFaults::new(move |_, _| {
                (seen.fetch_add(1, Ordering::Relaxed) < n).then(|| fault.clone())
            }),
        ))
    }
}

/// Counts requests below a fault injector.
async fn counted_faulty_bench(
    n: u64,
    fault: Fault,
) -> (Bench, Arc<HookedStore<InjectFaults>>, Arc<AtomicU64>) {
    let requests = Arc::new(AtomicU64::new(0));
    let counter = requests.clone();
    let (bench, store) = bench(2, move |store| {
        let counted: Arc<dyn ObjectStore> = Arc::new(HookedStore::new(
            store,
            InjectFaults::new(move |_, _| {
                counter.fetch_add(1, Ordering::Relaxed);
                None
            }),
        ));
        first_requests_fail(n, fault)(counted)
    })
    .await;
    (bench, store, requests)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fetcher_does_not_retry_and_a_failure_is_not_remembered() {
    let (bench, _store, _) = counted_faulty_bench(1, Fault::Fail).await;
    assert!(matches!(
        read_part(&bench, 1).await,
        Err(FsError::Store { .. })
    ));
    assert_eq!(bench.fetcher.in_flight_count(), 0);
    // The next read asks again and gets the part.
    assert_eq!(read_part(&bench, 1).await.unwrap(), expected(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_body_is_an_error_never_bytes() {
    let (bench, _store, requests) = counted_faulty_bench(1, Fault::Truncate(10)).await;
    assert!(matches!(
        read_part(&bench, 0).await,
        Err(FsError::ShortRead { got: 10, .. })
    ));
    assert_eq!(
        requests.load(Ordering::Relaxed),
        1,
        "retried in the fetcher"
    );
    assert!(!bench.fetcher.cache.contains(Fetcher::key(&bench.object, 0)));
    assert_eq!(read_part(&bench, 0).await.unwrap(), expected(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_store_gives_a_timeout_within_the_bound() {
    let (bench, _store, _) = counted_faulty_bench(1, Fault::Stall).await;
    let started = std::time::Instant::now();
    assert!(matches!(
        read_part(&bench, 3).await,
        Err(FsError::TimedOut { .. })
    ));
    // Bounded by READ_TIMEOUT; the upper figure only guards against a hang.
    assert!(started.elapsed() >= READ_TIMEOUT);
    assert!(started.elapsed() < READ_TIMEOUT * 20);
    // The abandoned download left its slot and its entry.
    settle(&bench.fetcher).await;
    assert_eq!(read_part(&bench, 3).await.unwrap(), expected(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_download_leaves_no_stuck_entry() {
    let (bench, _store, _) = counted_faulty_bench(1, Fault::Panic).await;
    assert!(read_part(&bench, 2).await.is_err());
    settle(&bench.fetcher).await;
    // Were the dead download's entry left behind, this read would join it and fail.
    assert_eq!(read_part(&bench, 2).await.unwrap(), expected(2));
    // A prefetch that panics is cleaned up too, with no reader waiting.
    let (bench, _store, _) = counted_faulty_bench(1, Fault::Panic).await;
    assert!(bench.fetcher.prefetch(&bench.object, 4));
    settle(&bench.fetcher).await;
    assert_eq!(read_part(&bench, 4).await.unwrap(), expected(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_object_is_refused_not_mixed() {
    let (bench, store) = bench(2, |s| Arc::new(HookedStore::new(s, CountReads::default()))).await;
    assert_eq!(read_part(&bench, 0).await.unwrap(), expected(0));
    let replaced: Vec<u8> = content().iter().map(|b| !b).collect();
    store
        .put(&bench.object.key, PutPayload::from(replaced))
        .await
        .unwrap();
    assert!(matches!(
        read_part(&bench, 1).await,
        Err(FsError::ObjectChanged { .. })
    ));
    // The part cached before the change is still the pinned version.
    assert_eq!(read_part(&bench, 0).await.unwrap(), expected(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_bytes_stay_under_the_cap_when_the_cache_has_no_room() {
    use crate::store::throttled::Throttle;
    // No disk room: every part is served from memory, and kept there when it fits.
    let (bench, _store) = bench_with_cache(8, 0, READ_TIMEOUT, |s| {
        Arc::new(HookedStore::new(
            s,
            Throttle::new(Duration::from_millis(5), 200_000),
        ))
    })
    .await;
    let bench = Arc::new(bench);
    let readers: Vec<_> = (0..64)
        .map(|i| {
            let bench = bench.clone();
            tokio::spawn(async move {
                let index = (i * 7) % 5;
                // Prefetches compete with the readers for the same budget.
                bench.fetcher.prefetch(&bench.object, (index + 1) % 5);
                let part = read_part(&bench, index).await;
                (index, part)
            })
        })
        .collect();
    for reader in readers {
        let (index, part) = reader.await.unwrap();
        assert_eq!(part.unwrap(), expected(index));
    }
    let peak = bench.fetcher.metrics.snapshot().fetch_memory_peak_bytes;
    assert!(peak <= MEMORY_CAP, "held {peak} bytes, cap {MEMORY_CAP}");
    assert!(peak > PART, "the load never held two parts at once: {peak}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_into_the_cache_holds_a_block_of_its_body_not_the_part() {
    // Parts of eight blocks, the body in pieces of a quarter block: each download's body
    // goes to its part file as it comes.
    let part = 8 * crate::cache::part_file::BLOCK_LEN as u64;
    let object_len = 4 * part + 1000;
    let data: Vec<u8> = (0..object_len).map(|i| (i * 13 % 251) as u8).collect();
    let trickle = Trickle::new(crate::cache::part_file::BLOCK_LEN as usize / 4);
    trickle.pieces.add_permits(1 << 20);
    let slots = 4;
    let (bench, _store) = big_object_bench(&data, part, slots, 64 * part, trickle).await;
    let (fetcher, object) = (bench.fetcher.clone(), bench.object.clone());
    let cache = fetcher.cache.clone();
    let reads = (0..5).map(|index| {
        let (fetcher, object) = (fetcher.clone(), object.clone());
        tokio::spawn(async move {
            let range = fetcher.part_range(&object, index);
            let mut out = vec![0; (range.end - range.start) as usize];
            fetcher.part(&object, index).await?.copy_to(&mut out, 0)?;
            Ok::<_, FsError>((range, out))
        })
    });
    for read in reads {
        let (range, out) = read.await.unwrap().unwrap();
        assert!(
            out == data[range.start as usize..range.end as usize],
            "part at {range:?}"
        );
    }
    settle(&fetcher).await;
    for index in 0..5 {
        assert!(
            cache.contains(Fetcher::key(&object, index)),
            "part {index} cached"
        );
    }
    let peak = fetcher.metrics.snapshot().fetch_memory_peak_bytes;
    assert!(
        peak <= slots as u64 * SPOOL_BUFFER,
        "held {peak} bytes for {slots} downloads of {part}-byte parts"
    );
}

/// A double whose bodies trickle: each response's body comes in pieces of `piece`
/// bytes, one piece per permit the test adds to `pieces`. Requests for less than a
/// part pass at once, whole.
#[derive(Debug)]
struct Trickle {
    piece: usize,
    pieces: Arc<tokio::sync::Semaphore>,
    /// The ranges asked for, in order.
    asked: parking_lot::Mutex<Vec<Range<u64>>>,
}

impl Trickle {
    fn new(piece: usize) -> Trickle {
        Trickle {
            piece,
            pieces: Arc::new(tokio::sync::Semaphore::new(0)),
            asked: Default::default(),
        }
    }
}

#[async_trait::async_trait]
impl StoreHook for Trickle {
    async fn get(
        &self,
        request: crate::store::wrapper::GetRequest<'_>,
    ) -> object_store::Result<object_store::GetResult> {
        let Some(GetRange::Bounded(range)) = request.options.range.clone() else {
            return request.send().await;
        };
        self.asked.lock().push(range.clone());
        let (body, head) = crate::store::wrapper::buffer_body(request.send().await?).await?;
        if range.end - range.start < PART {
            return Ok(crate::store::wrapper::with_body(head, body));
        }
        let (pieces, piece) = (self.pieces.clone(), self.piece);
        let stream = futures::stream::unfold(0, move |at| {
            let (body, pieces) = (body.clone(), pieces.clone());
            async move {
                if at >= body.len() {
                    return None;
                }
                pieces.acquire().await.unwrap().forget();
                let end = (at + piece).min(body.len());
                Some((Ok(body.slice(at..end)), end))
            }
        });
        Ok(object_store::GetResult {
            payload: object_store::GetResultPayload::Stream(Box::pin(stream)),
            ..head
        })
    }
}

/// A reader of bytes `within` of part `index`, on a task of its own.
fn spawn_read_within(
    bench: &Arc<Bench>,
    index: u64,
    within: Range<u64>,
) -> tokio::task::JoinHandle<FsResult<Vec<u8>>> {
    let bench = bench.clone();
    tokio::spawn(async move { read_within(&bench, index, within).await })
}

async fn read_within(bench: &Bench, index: u64, within: Range<u64>) -> FsResult<Vec<u8>> {
    let bytes = bench
        .fetcher
        .bytes(&bench.object, index, within.clone())
        .await?;
    let mut out = vec![0; (within.end - within.start) as usize];
    bytes.copy_to(&mut out, within.start)?;
    Ok(out)
}

fn expected_within(index: u64, within: Range<u64>) -> Vec<u8> {
    expected(index)[within.start as usize..within.end as usize].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_is_answered_once_the_body_has_passed_its_bytes() {
    let (bench, trickle) = bench(4, |s| Arc::new(HookedStore::new(s, Trickle::new(200)))).await;
    let bench = Arc::new(bench);
    let reader = spawn_read_within(&bench, 1, 300..380);
    // Two pieces (bytes 0..400) are not enough for the whole part, but for the reader.
    trickle.hook().pieces.add_permits(2);
    let read = tokio::time::timeout(Duration::from_secs(5), reader).await;
    assert_eq!(
        read.unwrap().unwrap().unwrap(),
        expected_within(1, 300..380)
    );
    assert_eq!(
        bench.fetcher.in_flight_count(),
        1,
        "the part is still arriving"
    );
    assert!(!bench.fetcher.cache.contains(Fetcher::key(&bench.object, 1)));
    trickle.hook().pieces.add_permits(3);
    settle(&bench.fetcher).await;
    assert!(bench.fetcher.cache.contains(Fetcher::key(&bench.object, 1)));
    assert_eq!(
        *trickle.hook().asked.lock(),
        vec![1000..2000],
        "one request"
    );
}

/// A fetcher of `part`-byte parts over `data`, one object of an in-memory store behind
/// `hook`, with `slots` and `memory_cap` as asked and a cache of its own.
async fn big_object_bench<H: StoreHook>(
    data: &[u8],
    part: u64,
    slots: usize,
    memory_cap: u64,
    hook: H,
) -> (Bench, Arc<HookedStore<H>>) {
    let memory = Arc::new(InMemory::new());
    let key = ObjectPath::from("data/big.bin");
    let put = memory
        .put(&key, PutPayload::from(data.to_vec()))
        .await
        .unwrap();
    let store = Arc::new(HookedStore::new(memory, hook));
    let dir = tempfile::tempdir().unwrap();
    let owner = crate::cache::CacheOwner {
        source: "memory".into(),
        endpoint: None,
        reset: false,
    };
    let fetcher = Fetcher::new(
        store.clone(),
        Arc::new(
            DiskCache::open(
                &crate::cache_dir_check::prepare(dir.path()).unwrap(),
                &owner,
                1 << 30,
                None,
            )
            .unwrap(),
        ),
        FetchLimits {
            part_size: part,
            max_concurrent_requests: slots,
            read_timeout: Duration::from_secs(5),
            memory_cap,
        },
        Arc::new(Metrics::default()),
        PlannerWake::default(),
    );
    let object = Arc::new(ObjectInfo {
        id: ObjectId(0),
        key,
        size: data.len() as u64,
        etag: put.e_tag.map(Into::into),
        mtime: SystemTime::UNIX_EPOCH,
        group: None,
    });
    let bench = Bench {
        fetcher,
        object,
        dir,
    };
    (bench, store)
}

/// Four slots over a store whose bodies arrive 100 bytes per permit of its `pieces`.
async fn trickling_bench() -> (Arc<Bench>, Arc<HookedStore<Trickle>>) {
    let (bench, trickle) = bench(4, |s| Arc::new(HookedStore::new(s, Trickle::new(100)))).await;
    (Arc::new(bench), trickle)
}

/// Fills every slot of a four-slot fetcher with downloads whose bodies wait for the
/// trickle's pieces: prefetches of parts 0, 1 and 2 (all prefetches may take) and a
/// reader of the whole part 3, returned once all four requests have reached the store.
async fn fill_the_slots(
    bench: &Arc<Bench>,
    trickle: &HookedStore<Trickle>,
) -> tokio::task::JoinHandle<FsResult<Vec<u8>>> {
    for index in 0..3 {
        assert!(bench.fetcher.prefetch(&bench.object, index));
    }
    let reader = tokio::spawn({
        let bench = bench.clone();
        async move { read_part(&bench, 3).await }
    });
    while trickle.hook().asked.lock().len() < 4 {
        tokio::task::yield_now().await;
    }
    reader
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_whose_part_waits_for_a_slot_asks_for_its_own_bytes() {
    let (bench, trickle) = trickling_bench().await;
    let blocked = fill_the_slots(&bench, &trickle).await;
    let read = tokio::time::timeout(Duration::from_secs(5), read_within(&bench, 4, 100..200)).await;
    assert_eq!(read.unwrap().unwrap(), expected_within(4, 100..200));
    let asked = trickle.hook().asked.lock().clone();
    assert!(asked.contains(&(4100..4200)), "{asked:?}");
    trickle.hook().pieces.add_permits(1000);
    assert_eq!(blocked.await.unwrap().unwrap(), expected(3));
    settle(&bench.fetcher).await;
    // The part itself still came, once, for the readers after.
    let asked = trickle.hook().asked.lock().clone();
    assert_eq!(
        asked.iter().filter(|r| **r == (4000..4500)).count(),
        1,
        "{asked:?}"
    );
    assert!(bench.fetcher.cache.contains(Fetcher::key(&bench.object, 4)));
    assert_eq!(bench.fetcher.metrics.snapshot().direct_reads, 1);
}

/// A reader going through a part in small pieces while its download waits for a
/// slot asks beside it once: the pieces after wait for the part, so the reader does
/// not fetch the part a second time, piece by piece, beside its download.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_waiting_for_a_slot_has_one_direct_read_beside_it() {
    let (bench, trickle) = trickling_bench().await;
    let blocked = fill_the_slots(&bench, &trickle).await;
    let first = tokio::time::timeout(Duration::from_secs(5), read_within(&bench, 4, 0..100)).await;
    assert_eq!(first.unwrap().unwrap(), expected_within(4, 0..100));
    let later: Vec<_> = [100..200, 200..300]
        .into_iter()
        .map(|within| (within.clone(), spawn_read_within(&bench, 4, within)))
        .collect();
    trickle.hook().pieces.add_permits(1000);
    for (within, reader) in later {
        assert_eq!(reader.await.unwrap().unwrap(), expected_within(4, within));
    }
    assert_eq!(blocked.await.unwrap().unwrap(), expected(3));
    settle(&bench.fetcher).await;
    let part_4: Vec<_> = trickle
        .hook()
        .asked
        .lock()
        .iter()
        .filter(|r| (4000..4500).contains(&r.start))
        .cloned()
        .collect();
    assert_eq!(
        part_4,
        vec![4000..4100, 4000..4500],
        "one direct read, then the part"
    );
    assert_eq!(bench.fetcher.metrics.snapshot().direct_reads, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_whose_part_is_on_the_wire_waits_for_its_body_alone() {
    let (bench, trickle) = trickling_bench().await;
    let reader = spawn_read_within(&bench, 2, 100..200);
    trickle.hook().pieces.add_permits(1000);
    assert_eq!(reader.await.unwrap().unwrap(), expected_within(2, 100..200));
    assert_eq!(*trickle.hook().asked.lock(), vec![2000..3000]);
    assert_eq!(bench.fetcher.metrics.snapshot().direct_reads, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_read_of_a_changed_object_is_refused_not_mixed() {
    let (bench, trickle) = trickling_bench().await;
    let blocked = fill_the_slots(&bench, &trickle).await;
    let replaced: Vec<u8> = content().iter().map(|b| !b).collect();
    trickle
        .put(&bench.object.key, PutPayload::from(replaced))
        .await
        .unwrap();
    let reader = spawn_read_within(&bench, 4, 10..20);
    // The direct read is refused; the part's own download, once it has a slot, too.
    trickle.hook().pieces.add_permits(1000);
    let read = tokio::time::timeout(Duration::from_secs(5), reader).await;
    assert!(
        matches!(read.unwrap().unwrap(), Err(FsError::ObjectChanged { .. })),
        "a replaced object's bytes were served"
    );
    // What was on the wire before the change is the pinned version, whole.
    assert_eq!(blocked.await.unwrap().unwrap(), expected(3));
}

/// Waits until no edge is on its way (a bounded poll of the fetcher's own set).
async fn settle_edges(fetcher: &Fetcher) {
    for _ in 0..500 {
        if fetcher.edges.in_flight.lock().is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An edge is one request for its own bytes: reads within it are served from memory
/// with no other request, a read reaching past it downloads the part, and once the
/// part is cached no edge of it is fetched again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_serves_the_reads_it_covers_and_no_more() {
    let (bench, counts) = bench(4, |s| Arc::new(HookedStore::new(s, CountReads::default()))).await;
    let bench = Arc::new(bench);
    bench.fetcher.prefetch_edge(&bench.object, 2100..2300);
    bench.fetcher.prefetch_edge(&bench.object, 2100..2300);
    settle_edges(&bench.fetcher).await;
    assert_eq!(counts.hook().total(), 1, "one request, however often asked");
    assert_eq!(bench.fetcher.metrics.snapshot().edges_fetched, 1);
    for within in [100..300, 150..160, 299..300] {
        let read = read_within(&bench, 2, within.clone()).await.unwrap();
        assert_eq!(read, expected_within(2, within));
    }
    assert_eq!(
        counts.hook().total(),
        1,
        "covered reads are served from memory"
    );
    let read = read_within(&bench, 2, 250..400).await.unwrap();
    assert_eq!(read, expected_within(2, 250..400));
    settle(&bench.fetcher).await;
    let snapshot = counts.hook().snapshot();
    assert_eq!(snapshot.len(), 2, "{snapshot:?}");
    assert!(bench.fetcher.cache.contains(Fetcher::key(&bench.object, 2)));
    bench.fetcher.prefetch_edge(&bench.object, 2500..2600);
    settle_edges(&bench.fetcher).await;
    assert_eq!(
        counts.hook().total(),
        2,
        "the part is cached: no edge of it"
    );
}

/// A part whose first or last bytes an edge holds (the kernel's read-around into a
/// neighbour chunk, read later in its own window) asks the store for the rest only, and
/// its cache file holds the whole part; an edge inside a part does not shorten it.
/// Once the part is cached, its edge's memory is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_download_asks_only_for_the_bytes_its_held_edge_lacks() {
    let (bench, counts) = bench(4, |s| Arc::new(HookedStore::new(s, CountReads::default()))).await;
    let bench = Arc::new(bench);
    for edge in [1400..1500, 2000..2200, 3700..4000, 4300..4500] {
        bench.fetcher.prefetch_edge(&bench.object, edge);
    }
    settle_edges(&bench.fetcher).await;
    for index in 1..=4 {
        assert_eq!(read_part(&bench, index).await.unwrap(), expected(index));
    }
    settle(&bench.fetcher).await;
    let mut asked: Vec<Range<u64>> = counts
        .hook()
        .snapshot()
        .into_iter()
        .map(|((_, range), count)| {
            assert_eq!(count, 1, "{range:?} asked for twice");
            range.unwrap()
        })
        .collect();
    asked.sort_by_key(|range| (range.start, range.end));
    let edges = [1400..1500, 2000..2200, 3700..4000, 4300..4500];
    let rests = [1000..2000, 2200..3000, 3000..3700, 4000..4300];
    let mut expected_asks: Vec<Range<u64>> = edges.into_iter().chain(rests).collect();
    expected_asks.sort_by_key(|range| (range.start, range.end));
    assert_eq!(asked, expected_asks);
    let metrics = bench.fetcher.metrics.snapshot();
    assert_eq!(metrics.edge_bytes_reused, 200 + 300 + 200);
    assert_eq!(metrics.bytes_fetched, 100 + OBJECT_LEN - 1000);
    assert_eq!(
        bench.fetcher.edges.held.lock().len(),
        0,
        "cached parts no longer hold their edges"
    );
    for index in 1..=4 {
        assert!(bench
            .fetcher
            .cache
            .contains(Fetcher::key(&bench.object, index)));
        assert_eq!(read_part(&bench, index).await.unwrap(), expected(index));
    }
    assert_eq!(
        counts.hook().total(),
        8,
        "the cached parts are read from disk"
    );
}

/// An edge that covers its whole part (a small object, or the short last part, that the
/// read-around spans end to end) is the part: its download asks the store for nothing,
/// and the part is cached from the edge's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_whose_held_edge_is_all_of_it_is_not_asked_for_again() {
    let (bench, counts) = bench(4, |s| Arc::new(HookedStore::new(s, CountReads::default()))).await;
    let bench = Arc::new(bench);
    let whole_parts = [1000..2000, 4000..OBJECT_LEN];
    for edge in whole_parts.clone() {
        bench.fetcher.prefetch_edge(&bench.object, edge);
    }
    settle_edges(&bench.fetcher).await;
    for index in [1, 4] {
        bench.fetcher.prefetch(&bench.object, index);
    }
    settle(&bench.fetcher).await;
    for index in [1, 4] {
        let key = Fetcher::key(&bench.object, index);
        assert!(bench.fetcher.cache.contains(key), "part {index} is cached");
        assert_eq!(read_part(&bench, index).await.unwrap(), expected(index));
    }
    let mut asked: Vec<(Range<u64>, u64)> = counts
        .hook()
        .snapshot()
        .into_iter()
        .map(|((_, range), count)| (range.unwrap(), count))
        .collect();
    asked.sort_by_key(|(range, _)| range.start);
    assert_eq!(asked, whole_parts.map(|range| (range, 1)));
    let metrics = bench.fetcher.metrics.snapshot();
    assert_eq!(metrics.edge_bytes_reused, PART + OBJECT_LEN - 4000);
    assert_eq!(metrics.bytes_fetched, PART + OBJECT_LEN - 4000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_of_bytes_an_edge_on_the_wire_covers_waits_for_it() {
    let (bench, gate) = bench(4, |s| Arc::new(HookedStore::new(s, Gate::default()))).await;
    let bench = Arc::new(bench);
    bench.fetcher.prefetch_edge(&bench.object, 2100..2300);
    while gate.hook().order.lock().is_empty() {
        tokio::task::yield_now().await;
    }
    let reader = spawn_read_within(&bench, 2, 150..250);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!reader.is_finished(), "the edge is held at the gate");
    gate.hook().open.add_permits(1);
    let read = tokio::time::timeout(Duration::from_secs(5), reader).await;
    assert_eq!(
        read.unwrap().unwrap().unwrap(),
        expected_within(2, 150..250)
    );
    assert_eq!(
        gate.hook().order.lock().len(),
        1,
        "the reader asked for nothing of its own: {:?}",
        gate.hook().order.lock()
    );
}

/// A reader's next read (the other array of the row it waits for) falls in a part
/// whose download queues behind prefetches: its bytes go on the wire at once, where a
/// prefetched edge would have left them to the queued download.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bytes_of_a_next_read_in_a_queued_part_are_asked_for_at_once() {
    let (bench, gate) = bench(4, |s| Arc::new(HookedStore::new(s, Gate::default()))).await;
    let bench = Arc::new(bench);
    // Three prefetches hold the slots prefetches may take; part 3's queues.
    for index in 0..4 {
        assert!(bench.fetcher.prefetch(&bench.object, index));
    }
    // The parts whose requests were sent, once there are `count` (or after a while),
    // in part order: concurrent prefetches reach the store in any order.
    let sent = |count: usize| {
        let gate = gate.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while gate.hook().order.lock().len() < count && tokio::time::Instant::now() < deadline {
                tokio::task::yield_now().await;
            }
            let mut sent = gate.hook().order.lock().clone();
            sent.sort_unstable();
            sent
        }
    };
    assert_eq!(sent(3).await, vec![0, 1, 2]);
    bench.fetcher.prefetch_edge(&bench.object, 3100..3200);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        sent(3).await,
        vec![0, 1, 2],
        "a prefetched edge waits for its part"
    );
    bench.fetcher.edge_for_next_read(&bench.object, 3100..3200);
    assert_eq!(
        sent(4).await,
        vec![0, 1, 2, 3],
        "the edge went on the wire at once"
    );
    // The prefetches and the edge pass; part 3's download, sent next, is held.
    gate.hook().open.add_permits(4);
    let read = tokio::time::timeout(Duration::from_secs(5), read_within(&bench, 3, 120..180));
    assert_eq!(read.await.unwrap().unwrap(), expected_within(3, 120..180));
    gate.hook().open.add_permits(8);
    settle(&bench.fetcher).await;
}

/// Counts the store's HEAD requests, and passes every request on.
#[derive(Debug, Default)]
struct CountHeads(AtomicU64);

#[async_trait::async_trait]
impl StoreHook for CountHeads {
    async fn get(
        &self,
        request: crate::store::wrapper::GetRequest<'_>,
    ) -> object_store::Result<object_store::GetResult> {
        if request.options.head {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        request.send().await
    }
}

/// A starting plan's connections are opened before its reader's first row needs them:
/// one HEAD per request that row makes at once, and no read of bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_start_opens_connections_for_its_first_row_with_heads_alone() {
    let (bench, heads) = bench(4, |s| Arc::new(HookedStore::new(s, CountHeads::default()))).await;
    bench.fetcher.open_connections_for(&bench.object);
    let started = std::time::Instant::now();
    while heads.hook().0.load(Ordering::Relaxed) < CONNECTIONS_PER_PLAN_START as u64 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the HEADs were sent"
        );
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        heads.hook().0.load(Ordering::Relaxed),
        CONNECTIONS_PER_PLAN_START as u64
    );
    let metrics = bench.fetcher.metrics.snapshot();
    assert_eq!((metrics.bytes_fetched, metrics.parts_fetched), (0, 0));
}

/// Eviction advice ranking units as given: lone parts, as a plan ranks a monolithic
/// dataset's, or groups (SCDL chunks), as it ranks a chunked dataset's.
struct UnitRanks(HashMap<Unit, NextUse>);

impl EvictionAdvisor for UnitRanks {
    fn next_use(&self, unit: Unit) -> Option<NextUse> {
        self.0.get(&unit).copied()
    }
    fn ranks_any(&self) -> bool {
        !self.0.is_empty()
    }
}

/// A reader's few bytes of a part the plans read many steps later (the kernel's
/// read-around across a chunk's edge), in a cache full of what they read sooner, are
/// asked for alone: downloading the part would evict what is needed first. A part of
/// the next step still comes whole, and evicts what is needed furthest ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stray_read_into_a_part_needed_later_is_asked_for_alone_and_evicts_nothing() {
    let on_disk = |len| {
        crate::cache::part_file::PartHeader::encoded_len_before_data("data/object.bin", "", len)
            as u64
            + len
    };
    let room_for_three_parts = 3 * on_disk(PART) + on_disk(PART) / 2;
    let (bench, trickle) = bench_with_cache(4, room_for_three_parts, READ_TIMEOUT, |s| {
        Arc::new(HookedStore::new(s, Trickle::new(PART as usize)))
    })
    .await;
    trickle.hook().pieces.add_permits(1 << 20);
    for index in 0..3 {
        assert_eq!(read_part(&bench, index).await.unwrap(), expected(index));
    }
    settle(&bench.fetcher).await;
    let key = |index| Fetcher::key(&bench.object, index);
    bench
        .fetcher
        .cache
        .set_advisor(Some(Arc::new(UnitRanks(HashMap::from([
            (Unit::Part(key(0)), NextUse::Current),
            (Unit::Part(key(1)), NextUse::Ahead(1)),
            (Unit::Part(key(2)), NextUse::Ahead(3)),
            (Unit::Part(key(3)), NextUse::Ahead(6)),
            (Unit::Part(key(4)), NextUse::Ahead(1)),
        ])))));

    assert_eq!(
        read_within(&bench, 3, 100..200).await.unwrap(),
        expected_within(3, 100..200)
    );
    let asked = trickle.hook().asked.lock().clone();
    assert_eq!(asked[3..], vec![3100..3200], "the stray bytes alone");
    let cache = &bench.fetcher.cache;
    assert!((0..3).all(|index| cache.contains(key(index))));
    assert!(!cache.contains(key(3)));
    assert_eq!(bench.fetcher.metrics.snapshot().stray_reads, 1);

    assert_eq!(
        read_within(&bench, 4, 0..100).await.unwrap(),
        expected_within(4, 0..100)
    );
    settle(&bench.fetcher).await;
    let asked = trickle.hook().asked.lock().clone();
    assert_eq!(asked[4..], vec![4000..4500], "the next step's part, whole");
    assert!(cache.contains(key(4)));
    assert!(!cache.contains(key(2)), "needed furthest ahead");
    assert!(cache.contains(key(0)) && cache.contains(key(1)));
    assert_eq!(bench.fetcher.metrics.snapshot().stray_reads, 1);
}

/// A reader's few bytes of a chunk's array that no plan reads within its announced
/// steps, while the plans read other chunks (the kernel's read-around from a window
/// across a chunk's edge, into a chunk the plans reach later if at all), are asked for
/// alone even where the cache has room for the part: cached, it would be the first to
/// go when room is needed, long before the plans reach it, and come again whole. On a
/// mount nobody plans on, the part comes whole; and so it does for a monolithic array,
/// whose ends are no chunk's edges (its plan may just not have located the reader's
/// step yet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_around_into_a_chunk_no_plan_names_is_asked_for_alone() {
    let (bench, trickle) = bench_with_cache(4, 1 << 20, READ_TIMEOUT, |s| {
        Arc::new(HookedStore::new(s, Trickle::new(PART as usize)))
    })
    .await;
    trickle.hook().pieces.add_permits(1 << 20);
    let of_a_chunk = |group| {
        Arc::new(ObjectInfo {
            id: bench.object.id,
            key: bench.object.key.clone(),
            size: bench.object.size,
            etag: bench.object.etag.clone(),
            mtime: bench.object.mtime,
            group,
        })
    };
    let read = |object: Arc<ObjectInfo>, index: u64| {
        let fetcher = bench.fetcher.clone();
        async move {
            let bytes = fetcher.bytes(&object, index, 100..200).await.unwrap();
            let mut out = vec![0; 100];
            bytes.copy_to(&mut out, 100).unwrap();
            assert_eq!(out, expected_within(index, 100..200));
        }
    };
    let key = |index| Fetcher::key(&bench.object, index);
    let cache = &bench.fetcher.cache;
    cache.set_advisor(Some(Arc::new(UnitRanks(HashMap::from([
        (Unit::Group(GroupId(1)), NextUse::Current),
        (Unit::Group(GroupId(2)), NextUse::Ahead(1)),
    ])))));

    read(of_a_chunk(Some(GroupId(0))), 3).await;
    settle(&bench.fetcher).await;
    assert_eq!(
        *trickle.hook().asked.lock(),
        vec![3100..3200],
        "the bytes alone"
    );
    assert!(!cache.contains(key(3)));
    assert_eq!(bench.fetcher.metrics.snapshot().stray_reads, 1);

    read(of_a_chunk(None), 2).await;
    settle(&bench.fetcher).await;
    assert_eq!(
        trickle.hook().asked.lock()[1..],
        vec![2000..3000],
        "a monolithic array's part, whole"
    );
    assert!(cache.contains(key(2)));

    cache.set_advisor(Some(Arc::new(UnitRanks(HashMap::new()))));
    read(of_a_chunk(Some(GroupId(0))), 3).await;
    settle(&bench.fetcher).await;
    assert_eq!(
        trickle.hook().asked.lock()[2..],
        vec![3000..4000],
        "the part, whole"
    );
    assert!(cache.contains(key(3)));
    assert_eq!(bench.fetcher.metrics.snapshot().stray_reads, 1);
}

/// An edge whose fetch dies (its task panics in the store) leaves the set of edges in
/// flight however it ended, and a reader of its bytes gets them with their part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_whose_fetch_panics_leaves_no_entry_behind() {
    let (bench, _store) = bench(4, |s| {
        Arc::new(HookedStore::new(
            s,
            InjectFaults::new(|_, options| {
                let the_edge =
                    matches!(&options.range, Some(GetRange::Bounded(r)) if *r == (2100..2300));
                the_edge.then_some(Fault::Panic)
            }),
        ))
    })
    .await;
    let bench = Arc::new(bench);
    bench.fetcher.prefetch_edge(&bench.object, 2100..2300);
    settle_edges(&bench.fetcher).await;
    assert!(
        bench.fetcher.edges.in_flight.lock().is_empty(),
        "the dead edge's entry stayed"
    );
    let read = tokio::time::timeout(Duration::from_secs(5), read_within(&bench, 2, 150..250)).await;
    assert_eq!(read.unwrap().unwrap(), expected_within(2, 150..250));
}

/// A reader never spins on an edge that will not come: an entry whose fetch is gone
/// (its watch closed) is not waited for, and the reader fetches the part. Run from a
/// thread of its own, so that a reader that spins fails the test instead of holding
/// the runtime.
#[test]
fn a_reader_does_not_wait_for_an_edge_whose_fetch_is_gone() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (bench, _counts) = runtime.block_on(bench(4, |s| {
        Arc::new(HookedStore::new(s, CountReads::default()))
    }));
    let (on_the_wire, watched) = tokio::sync::watch::channel(true);
    drop(on_the_wire);
    bench.fetcher.edges.in_flight.lock().insert(
        Fetcher::key(&bench.object, 2),
        EdgeInFlight {
            within: 100..300,
            on_the_wire: watched,
        },
    );
    let bench = Arc::new(bench);
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn({
        let (bench, runtime) = (bench.clone(), runtime.handle().clone());
        move || {
            let _ = done.send(runtime.block_on(read_within(&bench, 2, 150..250)));
        }
    });
    let read = finished
        .recv_timeout(Duration::from_secs(10))
        .expect("the reader is still waiting for the dead edge");
    assert_eq!(read.unwrap(), expected_within(2, 150..250));
}

/// The part file a download writes into, while it is being written.
fn spool_file(cache_dir: &std::path::Path) -> std::path::PathBuf {
    let parts = cache_dir
        .join(crate::cache::adopt::layout_dir_name())
        .join("parts");
    let mut spooling = std::fs::read_dir(parts)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "tmp"));
    let file = spooling.next().expect("a part file being written");
    assert!(spooling.next().is_none(), "one download under way");
    file
}

/// Our own disk never fails a read, even of a part still being written: bytes the
/// download wrote that its part file can no longer give (truncated under it here)
/// fail that read as a dropped part does, and the reader asking again gets them from
/// the store, with a request of their own, while the download goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_a_part_file_being_written_cannot_give_are_read_from_the_store() {
    let block = crate::cache::part_file::BLOCK_LEN as usize;
    let batch = super::arriving::WRITE_BATCH;
    let part = 2 * batch as u64;
    let data: Vec<u8> = (0..2 * part).map(|i| (i * 13 % 251) as u8).collect();
    let (bench, trickle) = big_object_bench(&data, part, 4, 16 * part, Trickle::new(block)).await;
    let (fetcher, object) = (bench.fetcher.clone(), bench.object.clone());
    let within = 100..200;
    let want = &data[within.start as usize..within.end as usize];
    // A batch of the part's blocks written; the reader's bytes are in the first.
    trickle.hook().pieces.add_permits(batch / block);
    let mut first = fetcher.bytes(&object, 0, within.clone()).await.unwrap();
    // Until the block is on disk its bytes come from memory.
    for _ in 0..500 {
        if matches!(first, PartBytes::Spooled(_)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        first = fetcher.bytes(&object, 0, within.clone()).await.unwrap();
    }
    assert!(matches!(first, PartBytes::Spooled(_)), "read from the file");
    std::fs::OpenOptions::new()
        .write(true)
        .open(spool_file(bench.dir.path()))
        .unwrap()
        .set_len(0)
        .unwrap();
    let mut out = vec![0; want.len()];
    match first.copy_to(&mut out, within.start) {
        Err(FsError::CacheCorrupt(_)) => {}
        other => panic!("not a dropped part's error, which the read path reads again: {other:?}"),
    }
    let again = tokio::time::timeout(
        Duration::from_secs(2),
        fetcher.bytes(&object, 0, within.clone()),
    )
    .await
    .expect("the reader waited for the download")
    .unwrap();
    again.copy_to(&mut out, within.start).unwrap();
    assert!(out == want, "wrong bytes");
    assert!(
        trickle.hook().asked.lock().contains(&within),
        "the bytes came from the store: {:?}",
        trickle.hook().asked.lock()
    );
    assert_eq!(fetcher.metrics.snapshot().spool_failure_reads, 1);
    trickle.hook().pieces.add_permits(1000);
    settle(&fetcher).await;
}

/// Waits until no planned range is on its way.
async fn settle_planned(fetcher: &Fetcher) {
    for _ in 0..500 {
        if fetcher.planned.ranges.lock().coming_bytes() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A plan's exact range is one request for exactly its bytes, whoever asks again; it
/// serves the reads it covers from memory and not those past it; its `done` runs once;
/// released, it gives its memory back and is not held any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_range_is_fetched_once_and_serves_the_reads_it_covers() {
    let (bench, gate) = bench(4, |s| Arc::new(HookedStore::new(s, Gate::default()))).await;
    let bench = Arc::new(bench);
    let arrivals = Arc::new(AtomicU64::new(0));
    let arrived = || {
        let arrivals = arrivals.clone();
        move || {
            arrivals.fetch_add(1, Ordering::Relaxed);
        }
    };
    let planned =
        |range: Range<u64>, done| bench.fetcher.prefetch_planned(&bench.object, range, done);
    assert_eq!(planned(2100..2600, arrived()), Planned::Started);
    assert_eq!(planned(2200..2300, arrived()), Planned::Coming);
    gate.hook().open.add_permits(100);
    settle_planned(&bench.fetcher).await;
    assert_eq!(planned(2100..2600, arrived()), Planned::Local);
    // `done` runs just after the bytes are recorded as held.
    for _ in 0..500 {
        if arrivals.load(Ordering::Relaxed) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(arrivals.load(Ordering::Relaxed), 1);
    assert_eq!(*gate.hook().order.lock(), vec![2], "one request, in part 2");
    assert_eq!(bench.fetcher.metrics.snapshot().planned_bytes, 500);
    for within in [100..600, 300..301] {
        let read = read_within(&bench, 2, within.clone()).await.unwrap();
        assert_eq!(read, expected_within(2, within));
    }
    assert_eq!(
        gate.hook().order.lock().len(),
        1,
        "covered reads come from memory"
    );
    assert_eq!(bench.fetcher.planned_bytes_held(), 500);
    bench
        .fetcher
        .release_planned(Fetcher::key(&bench.object, 2), &(0..PART));
    assert_eq!(bench.fetcher.planned_bytes_held(), 0);
    assert_eq!(bench.fetcher.memory.held(), 0, "its memory is given back");
    assert!(bench
        .fetcher
        .in_memory(Fetcher::key(&bench.object, 2), &(100..200))
        .is_none());
}

/// A planned range held in memory is a copy of its bytes, not the store's answer: an
/// answer in one piece is a slice of a buffer many times its length (the HTTP
/// connection's, here the in-memory store's whole object), which holding the range
/// would keep alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_planned_range_keeps_only_its_own_bytes() {
    let mut store = None;
    let (bench, gate) = bench(4, |s| {
        store = Some(s.clone());
        Arc::new(HookedStore::new(s, Gate::default()))
    })
    .await;
    let whole = store
        .unwrap()
        .get(&bench.object.key)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let answer_buffer = whole.as_ptr_range();
    bench
        .fetcher
        .prefetch_planned(&bench.object, 2100..2600, || {});
    gate.hook().open.add_permits(100);
    settle_planned(&bench.fetcher).await;
    let Some(Covered::Held { bytes, .. }) = bench
        .fetcher
        .planned
        .ranges
        .lock()
        .covering(Fetcher::key(&bench.object, 2), &(100..600))
    else {
        panic!("the planned range is held once it arrived");
    };
    assert_eq!(&bytes[..], &content()[2100..2600]);
    assert!(
        !answer_buffer.contains(&bytes.as_ptr()),
        "the held range points into the store's buffer"
    );
}

/// A reader of bytes a planned range on its way covers waits for that range rather
/// than asking for them (or their part) again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_of_bytes_a_planned_range_on_its_way_covers_waits_for_it() {
    let (bench, gate) = bench(4, |s| Arc::new(HookedStore::new(s, Gate::default()))).await;
    let bench = Arc::new(bench);
    let started = bench
        .fetcher
        .prefetch_planned(&bench.object, 3000..3400, || {});
    assert_eq!(started, Planned::Started);
    while gate.hook().order.lock().is_empty() {
        tokio::task::yield_now().await;
    }
    let reader = spawn_read_within(&bench, 3, 100..200);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!reader.is_finished(), "the range is held at the gate");
    gate.hook().open.add_permits(1);
    let read = tokio::time::timeout(Duration::from_secs(5), reader).await;
    assert_eq!(
        read.unwrap().unwrap().unwrap(),
        expected_within(3, 100..200)
    );
    assert_eq!(
        gate.hook().order.lock().len(),
        1,
        "the reader asked for nothing"
    );
}

/// A reader of bytes whose planned range still queues for its place on the wire (every
/// place taken by ranges the store holds) sends that range at once, beside the bound,
/// rather than waiting for the ranges ahead of it to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_of_a_planned_range_queued_behind_a_full_wire_sends_it_at_once() {
    // Long enough for the ranges ahead to be held at the gate for the whole test.
    let held_for_the_test = Duration::from_secs(60);
    let (bench, gate) = bench_with_cache(4, 1 << 20, held_for_the_test, |s| {
        Arc::new(HookedStore::new(s, Gate::default()))
    })
    .await;
    let bench = Arc::new(bench);
    // Each request weighs at least its minimum: this many fill the wire.
    let ahead =
        (super::planned::PLANNED_BYTES_IN_FLIGHT / super::planned::PLANNED_REQUEST_WEIGHT) as usize;
    for i in 0..ahead as u64 {
        let range = PART + 3 * i..PART + 3 * i + 2;
        let started = bench.fetcher.prefetch_planned(&bench.object, range, || {});
        assert_eq!(started, Planned::Started);
    }
    let sent_for_part = |part: u64| {
        gate.hook()
            .order
            .lock()
            .iter()
            .filter(|&&p| p == part)
            .count()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while sent_for_part(1) < ahead && tokio::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
    assert_eq!(sent_for_part(1), ahead, "the ranges ahead hold every place");
    let queued = bench
        .fetcher
        .prefetch_planned(&bench.object, 3000..3400, || {});
    assert_eq!(queued, Planned::Started);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(sent_for_part(3), 0, "the last range queues for a place");
    let reader = spawn_read_within(&bench, 3, 100..200);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while sent_for_part(3) == 0 && tokio::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        sent_for_part(3),
        1,
        "the reader's range went beside the full wire"
    );
    gate.hook().open.add_permits(ahead + 1);
    let read = tokio::time::timeout(Duration::from_secs(5), reader).await;
    assert_eq!(
        read.unwrap().unwrap().unwrap(),
        expected_within(3, 100..200)
    );
    settle_planned(&bench.fetcher).await;
}

/// An edge waiting for a download slot holds none of the fetcher's memory: it takes
/// its bytes once it has its slot, as a download does (slot, then memory). Edges that
/// took memory and then waited for a slot, beside downloads that held every slot and
/// waited for memory, held each other up until a reader's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_waiting_for_a_slot_holds_no_memory() {
    let (bench, gate) = bench(4, |s| Arc::new(HookedStore::new(s, Gate::default()))).await;
    let bench = Arc::new(bench);
    // Three prefetches hold the slots prefetches may take, their memory reserved.
    for index in 0..3 {
        assert!(bench.fetcher.prefetch(&bench.object, index));
    }
    while gate.hook().order.lock().len() < 3 {
        tokio::task::yield_now().await;
    }
    let held = bench.fetcher.memory.held();
    bench.fetcher.prefetch_edge(&bench.object, 3100..3200);
    bench.fetcher.prefetch_edge(&bench.object, 4100..4200);
    assert_eq!(
        bench.fetcher.memory.held(),
        held,
        "edges queued for a slot hold memory"
    );
    gate.hook().open.add_permits(8);
    settle_edges(&bench.fetcher).await;
    settle(&bench.fetcher).await;
    assert_eq!(bench.fetcher.metrics.snapshot().edges_fetched, 2);
    assert_eq!(
        read_within(&bench, 3, 100..200).await.unwrap(),
        expected_within(3, 100..200)
    );
}

/// A store that ignores `If-Match` and answers without an ETag (some HTTP servers on
/// a 206).
#[derive(Debug)]
struct NoEtags;

#[async_trait::async_trait]
impl StoreHook for NoEtags {
    async fn get(
        &self,
        mut request: crate::store::wrapper::GetRequest<'_>,
    ) -> object_store::Result<object_store::GetResult> {
        request.options.if_match = None;
        let mut result = request.send().await?;
        result.meta.e_tag = None;
        Ok(result)
    }
}

/// Two answers that no ETag ties to one version are never joined into one part: an
/// edge held from before the object was rewritten (same size) is not reused by its
/// part's download, which gets either the pinned version's bytes or an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_without_an_etag_are_never_joined_into_one_part() {
    let (bench, store) = bench(4, |s| Arc::new(HookedStore::new(s, NoEtags))).await;
    let listed = store.head(&bench.object.key).await.unwrap();
    let object = Arc::new(ObjectInfo {
        id: ObjectId(1),
        key: listed.location,
        size: listed.size,
        etag: bench.object.etag.clone(),
        mtime: listed.last_modified.into(),
        group: None,
    });
    bench.fetcher.prefetch_edge(&object, 2000..2200);
    settle_edges(&bench.fetcher).await;
    assert_eq!(bench.fetcher.metrics.snapshot().edges_fetched, 1);
    let rewritten: Vec<u8> = content().iter().map(|b| !b).collect();
    store
        .put(&object.key, PutPayload::from(rewritten))
        .await
        .unwrap();
    let read = async {
        let part = bench.fetcher.part(&object, 2).await?;
        let mut out = vec![0; PART as usize];
        part.copy_to(&mut out, 0)?;
        FsResult::Ok(out)
    };
    match read.await {
        Ok(bytes) => assert!(bytes == expected(2), "a part of two versions was served"),
        Err(FsError::ObjectChanged { .. }) => {}
        Err(other) => panic!("not the changed object's error: {other:?}"),
    }
}
