//! `scdlfs chunk` never publishes a mixed dataset: a source rewritten between two runs
//! of a job or during one is detected and refused with the target unpublished, a
//! corrupt source's row offsets are an error (never a wrapped subtraction), and two
//! jobs started at once into one empty target cannot both write it. Against local
//! folders and moto_server on 127.0.0.1.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use common::s3::{moto, unique_bucket};
use common::{local_store, write_monolithic};
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{GetResult, ObjectStore, ObjectStoreExt};
use scdl_format::manifest::{Manifest, MANIFEST_FILE};
use scdlfs::chunker::{relative_key, ChunkError, ChunkJob, ChunkOptions, ChunkReport, Location};
use scdlfs::store::faulty::{Fault, InjectFaults};
use scdlfs::store::wrapper::{GetRequest, HookedStore, StoreHook};
use scdlfs::synthetic::SyntheticDataset;
use tokio_util::sync::CancellationToken;

/// A dataset in many small chunks, so a job can be cut or changed midway.
fn many_chunks() -> SyntheticDataset {
    SyntheticDataset {
        rows: 3_000,
        genes: 1_000,
        chunk_rows: 97,
        mean_values: 30,
        seed: 21,
    }
}

fn options() -> ChunkOptions {
    ChunkOptions {
        part_size: 5 << 20,
        objects_in_flight: 2,
        verify_data: false,
        quiet: true,
    }
}

/// Every object below `prefix`, by key.
async fn objects(store: &Arc<dyn ObjectStore>, prefix: &str) -> BTreeMap<String, Vec<u8>> {
    let prefix = ObjectPath::from(prefix);
    let listing: Vec<_> = store.list(Some(&prefix)).try_collect().await.unwrap();
    let mut out = BTreeMap::new();
    for meta in listing {
        let bytes = store.get(&meta.location).await.unwrap().bytes().await;
        let key = relative_key(&meta.location, &prefix).unwrap();
        let mut bytes = bytes.unwrap().to_vec();
        if key == MANIFEST_FILE {
            // The objects it names and their sizes: their ETags and times are each
            // store's and each run's own.
            let manifest = Manifest::decode(&bytes).unwrap();
            bytes = (manifest.objects.iter())
                .flat_map(|o| format!("{} {}\n", o.key, o.size).into_bytes())
                .collect();
        }
        out.insert(key, bytes);
    }
    out
}

/// The same source with every value's bytes changed and its shape kept: the header and
/// the array sizes are those of the original.
fn rewrite_values(source: &Path) {
    let path = source.join("data.npy");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.iter_mut().for_each(|b| *b ^= 0x5a);
    std::fs::write(&path, bytes).unwrap();
}

/// A new bucket on the test server, and a client for it.
fn new_bucket(name: &str) -> (String, Arc<dyn ObjectStore>) {
    let bucket = unique_bucket(name);
    moto().create_bucket(&bucket);
    let store = moto().store(&bucket);
    (bucket, store)
}

/// Uploads the folder `root` to `bucket` under `prefix` (moto's client blocks).
async fn upload(bucket: &str, prefix: &'static str, root: &Path) {
    let (bucket, root) = (bucket.to_owned(), root.to_owned());
    tokio::task::spawn_blocking(move || moto().upload(&bucket, prefix, &root))
        .await
        .unwrap();
}

fn location(store: Arc<dyn ObjectStore>, prefix: &str) -> Location {
    Location {
        store,
        prefix: ObjectPath::from(prefix),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_rewritten_between_two_runs_is_refused_not_mixed() {
    let spec = many_chunks();
    let dir = tempfile::tempdir().unwrap();
    write_monolithic(&spec, &dir.path().join("mono"));
    let (bucket, source_store) = new_bucket("chunk-src-between");
    upload(&bucket, "mono", &dir.path().join("mono")).await;
    std::fs::create_dir(dir.path().join("target")).unwrap();
    let target = location(local_store(&dir.path().join("target")), "");

    // The first run stops midway: its source's reads fail from the 30th on.
    let reads = Arc::new(AtomicUsize::new(0));
    let faulty = InjectFaults::new(move |_, _| {
        (reads.fetch_add(1, Ordering::SeqCst) >= 30).then_some(Fault::Fail)
    });
    let cut = location(
        Arc::new(HookedStore::new(source_store.clone(), faulty)),
        "mono",
    );
    let job = ChunkJob::prepare(cut, spec.chunk_rows).await.unwrap();
    let error = job
        .run(target.clone(), &options(), CancellationToken::new())
        .await
        .expect_err("the source failed midway");
    assert!(error.resumable(), "{error}");

    // Then the source is rewritten with the same shape, and the job run again.
    rewrite_values(&dir.path().join("mono"));
    upload(&bucket, "mono", &dir.path().join("mono")).await;
    let job = ChunkJob::prepare(location(source_store, "mono"), spec.chunk_rows)
        .await
        .unwrap();
    let rerun = job
        .run(target.clone(), &options(), CancellationToken::new())
        .await;
    let error = rerun.expect_err("the second run mixed two versions of the source");
    assert!(
        matches!(error, ChunkError::TargetOccupied(_)) && error.to_string().contains("changed"),
        "{error}"
    );
    assert!(
        !objects(&target.store, "").await.contains_key("header.sch"),
        "a mixed dataset was published"
    );
}

/// A source folder that rewrites its `data.npy` (same shape, other values) just before
/// the `at`-th read of it: a source changed while a job copies it.
#[derive(Debug)]
struct RewrittenMidway {
    folder: PathBuf,
    reads: AtomicUsize,
    at: usize,
}

#[async_trait]
impl StoreHook for RewrittenMidway {
    async fn get(&self, request: GetRequest<'_>) -> object_store::Result<GetResult> {
        if request.location.as_ref().ends_with("data.npy")
            && self.reads.fetch_add(1, Ordering::SeqCst) + 1 == self.at
        {
            rewrite_values(&self.folder);
        }
        request.send().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_rewritten_during_a_run_stops_it_with_a_clear_error() {
    let spec = many_chunks();
    let dir = tempfile::tempdir().unwrap();
    let mono = dir.path().join("mono");
    write_monolithic(&spec, &mono);
    let hook = RewrittenMidway {
        folder: mono.clone(),
        reads: AtomicUsize::new(0),
        at: 5,
    };
    let source = location(Arc::new(HookedStore::new(local_store(&mono), hook)), "");
    let target = location(new_bucket("chunk-during").1, "ds");
    let job = ChunkJob::prepare(source, spec.chunk_rows).await.unwrap();
    let result = job
        .run(target.clone(), &options(), CancellationToken::new())
        .await;
    let error = result.expect_err("a job over a source rewritten midway published");
    assert!(
        error.to_string().contains("changed"),
        "the error does not say the source changed: {error}"
    );
    assert!(!objects(&target.store, "ds")
        .await
        .contains_key("header.sch"));
}

/// A store that ignores If-Match, as some S3-compatible servers do (s3s-fs).
#[derive(Debug)]
struct IgnoresIfMatch;

#[async_trait]
impl StoreHook for IgnoresIfMatch {
    async fn get(&self, mut request: GetRequest<'_>) -> object_store::Result<GetResult> {
        request.options.if_match = None;
        request.send().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_offsets_below_their_chunks_start_are_an_error_not_a_wrapped_subtraction() {
    let spec = many_chunks();
    let dir = tempfile::tempdir().unwrap();
    let mono = dir.path().join("mono");
    write_monolithic(&spec, &mono);
    let source = location(
        Arc::new(HookedStore::new(local_store(&mono), IgnoresIfMatch)),
        "",
    );
    let job = ChunkJob::prepare(source, spec.chunk_rows).await.unwrap();
    // After the checks, the row offsets become all zeros: every chunk past the first
    // starts above them.
    let row_ptr = mono.join("row_ptr.npy");
    let size = std::fs::metadata(&row_ptr).unwrap().len();
    std::fs::write(&row_ptr, vec![0u8; size as usize]).unwrap();

    let target_dir = dir.path().join("target");
    std::fs::create_dir(&target_dir).unwrap();
    let target = location(local_store(&target_dir), "");
    let error = job
        .run(target.clone(), &options(), CancellationToken::new())
        .await
        .expect_err("decreasing row offsets were rebased");
    assert!(
        matches!(error, ChunkError::Inconsistent(_)) && error.to_string().contains("row offset"),
        "{error}"
    );
    assert!(!target_dir.join("header.sch").exists());
}

/// A target whose first two reads of the resume record both wait until both arrived:
/// two jobs that each find the target empty before either starts.
#[derive(Debug)]
struct MeetAtTheRecord(tokio::sync::Barrier);

#[async_trait]
impl StoreHook for MeetAtTheRecord {
    async fn get(&self, request: GetRequest<'_>) -> object_store::Result<GetResult> {
        let location = request.location;
        let result = request.send().await;
        if location.as_ref().ends_with(".scdlfs-chunk/job.json") {
            tokio::time::timeout(std::time::Duration::from_secs(5), self.0.wait())
                .await
                .ok();
        }
        result
    }
}

/// Two jobs of one source with different chunk sizes, started at once into the empty
/// `target`: exactly one publishes, the other is refused, and the target holds exactly
/// what the one alone makes.
async fn two_jobs_at_once(target: Arc<dyn ObjectStore>, alone: Arc<dyn ObjectStore>) {
    let spec = many_chunks();
    let dir = tempfile::tempdir().unwrap();
    let mono = dir.path().join("mono");
    write_monolithic(&spec, &mono);
    let target = location(
        Arc::new(HookedStore::new(
            target,
            MeetAtTheRecord(tokio::sync::Barrier::new(2)),
        )),
        "ds",
    );
    let source = || location(local_store(&mono), "");
    let (small, large) = (
        ChunkJob::prepare(source(), 97).await.unwrap(),
        ChunkJob::prepare(source(), 500).await.unwrap(),
    );
    let (options, cancel) = (options(), CancellationToken::new());
    let (a, b) = tokio::join!(
        small.run(target.clone(), &options, cancel.clone()),
        large.run(target.clone(), &options, cancel.clone()),
    );
    let (winner, loser): (ChunkReport, ChunkError) = match (a, b) {
        (Ok(report), Err(error)) | (Err(error), Ok(report)) => (report, error),
        (a, b) => panic!("not exactly one job ran: {a:?} / {b:?}"),
    };
    assert!(matches!(loser, ChunkError::TargetOccupied(_)), "{loser}");
    let chunk_rows = (spec.rows as u32).div_ceil(winner.chunks);
    let job = ChunkJob::prepare(source(), chunk_rows).await.unwrap();
    job.run(location(alone.clone(), "ds"), &options, cancel)
        .await
        .unwrap();
    assert_eq!(
        objects(&target.store, "ds").await,
        objects(&alone, "ds").await,
        "the target holds pieces of both jobs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_jobs_started_at_once_into_one_empty_folder_cannot_interleave() {
    let dir = tempfile::tempdir().unwrap();
    for side in ["target", "alone"] {
        std::fs::create_dir(dir.path().join(side)).unwrap();
    }
    two_jobs_at_once(
        local_store(&dir.path().join("target")),
        local_store(&dir.path().join("alone")),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_jobs_started_at_once_into_one_empty_bucket_cannot_interleave() {
    two_jobs_at_once(new_bucket("chunk-race").1, new_bucket("chunk-alone").1).await;
}
