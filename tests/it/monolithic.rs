//! Monolithic datasets in a bucket get the prefetch chunked ones get: the directory of
//! a monolithic archive on S3 has a hint file that announces its virtual chunks, the
//! sampler discovers them with no extra code, over a slow link a reader that announces
//! its order (chunk windows or row blocks) waits far less than one that does not, and
//! with a cache smaller than the dataset the plan keeps what it needs next. Every row
//! read equals the source. A dataset whose arrays disagree with its header is shown as
//! stored, without a hint file.

use crate::common;

use std::fs::File;
use std::num::{NonZeroU32, NonZeroU64, NonZeroUsize};
use std::sync::Arc;

use common::epoch::{EpochSetup, HintsCompared, ONE_AT_A_TIME};
use common::s3::{moto, unique_bucket};
use common::*;
use scdl_format::hint::{announcement, HINT_FILE};
use scdl_format::ArrayKind;
use scdl_sampler::{
    BlockOrder, ChunkWindowOrder, DatasetKind, DatasetLayout, Order, Sampler, Shard, Workers,
    DEFAULT_VIRTUAL_CHUNK_SIZE,
};
use scdlfs::store::counting::CountReads;
use scdlfs::store::wrapper::HookedStore;
use scdlfs::synthetic::SyntheticDataset;

/// The daemon's virtual chunk size for monolithic datasets.
const VIRTUAL_CHUNK_ROWS: u64 = scdlfs::catalog::monolithic::DEFAULT_VIRTUAL_CHUNK_ROWS;

fn dataset() -> SyntheticDataset {
    SyntheticDataset {
        rows: 24_000,
        genes: 3_000,
        chunk_rows: 2_000, // unused: the archive is monolithic
        mean_values: 100,
        seed: 23,
    }
}

/// A bucket holding the monolithic archive of `spec` under `ds/`.
fn bucket_with(spec: &SyntheticDataset) -> String {
    let src = tempfile::tempdir().unwrap();
    write_monolithic(spec, src.path());
    let bucket = unique_bucket("mono");
    moto().create_bucket(&bucket);
    moto().upload(&bucket, "ds", src.path());
    bucket
}

/// Reads one epoch of the bucket's dataset with hints and without, behind a slow link
/// with a cache of less than half the dataset, and compares what each waited for.
fn compare(what: &str, bucket: &str, order: Order, cache_bytes: u64, part_size: u64) {
    let setup = EpochSetup {
        store: moto().store(bucket),
        spec: dataset(),
        cache_bytes,
        part_size,
    };
    let compared = HintsCompared::run(&format!("monolithic, {what}"), &setup, order);
    let (with, (unforeseen_with, unforeseen_without)) = (&compared.with, compared.unforeseen());
    assert_eq!(with.layout.kind, DatasetKind::MountedMonolithic);
    assert_eq!(with.layout.chunks.chunk_size(), VIRTUAL_CHUNK_ROWS);
    assert!(with.at_end.prefetch_hits > 0);
    assert!(
        unforeseen_without >= with.steps as u64,
        "without hints the reader asks for every step itself"
    );
    assert!(
        unforeseen_with * 3 <= unforeseen_without,
        "hints should foresee at least two thirds of what the reader waits for"
    );
}

#[test]
fn chunk_window_hints_prefetch_a_monolithic_dataset_on_s3() {
    let bucket = bucket_with(&dataset());
    let order = Order::ChunkWindows(ChunkWindowOrder {
        seed: 9,
        chunks_per_window: NonZeroU32::new(1).unwrap(),
        shuffle_chunks: true,
        shuffle_within_window: true,
    });
    compare("chunk windows", &bucket, order, 10 << 20, 128 << 10);
}

#[test]
fn row_range_hints_prefetch_a_monolithic_dataset_on_s3() {
    let bucket = bucket_with(&dataset());
    let order = Order::Blocks(BlockOrder {
        seed: 9,
        block_size: NonZeroU64::new(500).unwrap(),
        batch_size: NonZeroU64::new(100).unwrap(),
        fetch_factor: NonZeroU64::new(10).unwrap(),
    });
    compare("row blocks", &bucket, order, 10 << 20, 128 << 10);
}

/// A reader that goes through a monolithic dataset on S3 in the same order every
/// epoch, with a cache of about two thirds of it. Least-recently-used eviction throws
/// out each virtual chunk just before the reader comes back to it, and fetches the
/// whole dataset again every epoch; the plan ranks the parts of its steps, so the second
/// epoch fetches about what the cache cannot hold, and nothing the plan needs is
/// evicted between its prefetch and its read.
#[test]
fn a_second_epoch_in_the_same_order_fetches_about_what_the_cache_cannot_hold() {
    // Alone: the other epochs of this file count waits, which a busy server shifts.
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let spec = dataset();
    let bucket = bucket_with(&spec);
    let counted = Arc::new(HookedStore::new(
        moto().store(&bucket),
        CountReads::default(),
    ));
    let cache_bytes = 9u64 << 20;
    let mount = TestMount::start(counted.clone(), "", |s| {
        s.part_size = 128 << 10;
        s.cache_bytes = cache_bytes;
        s.prefetch_lookahead_steps = 3;
    });
    let dir = mount.path().join("ds");
    let layout = DatasetLayout::discover(&dir, DEFAULT_VIRTUAL_CHUNK_SIZE).unwrap();
    let in_order = Order::ChunkWindows(ChunkWindowOrder {
        seed: 9,
        chunks_per_window: NonZeroU32::new(1).unwrap(),
        shuffle_chunks: false,
        shuffle_within_window: false,
    });
    // The whole epoch announced: what the plan does not name, it cannot keep.
    let steps = NonZeroUsize::new(layout.chunks.num_chunks() as usize).unwrap();
    let mut sampler = Sampler::new(&layout, in_order, Shard::single(), Workers::single())
        .unwrap()
        .with_hint_lookahead(steps);
    let mut fetched = Vec::new();
    let mut requests = Vec::new();
    for epoch in 0..2 {
        let (bytes_before, requests_before) = (
            mount.status().counters.bytes_fetched,
            counted.hook().snapshot(),
        );
        let reader = MappedRows::open(&dir);
        let mut rows = sampler.epoch(epoch);
        while let Some(batch) = rows.next_minibatch() {
            for &row in &batch {
                assert_eq!(reader.row(row), spec.row(row), "row {row}");
            }
        }
        drop(rows);
        // Unmapped and out of the page cache: the next epoch's reads reach the daemon.
        drop(reader);
        for kind in ArrayKind::ALL {
            forget_cached_pages(&File::open(dir.join(kind.file_name())).unwrap());
        }
        fetched.push(mount.status().counters.bytes_fetched - bytes_before);
        let twice = requested_again(&requests_before, counted.hook().snapshot());
        requests.push(twice);
    }
    assert!(sampler.take_hint_error().is_none());
    let dataset_bytes: u64 = ArrayKind::ALL
        .iter()
        .map(|k| std::fs::metadata(dir.join(k.file_name())).unwrap().len())
        .sum();
    assert_a_second_epoch_reuses_the_cache("monolithic", dataset_bytes, cache_bytes, &fetched);
    assert_eq!(
        requests,
        [vec![], vec![]],
        "parts fetched twice in one epoch"
    );
}

#[test]
fn the_hint_file_announces_virtual_chunks_and_refuses_a_writer_that_assumes_others() {
    let bucket = bucket_with(&dataset());
    let mount = TestMount::start(moto().store(&bucket), "", |_| {});
    let hints = mount.path().join("ds").join(HINT_FILE);
    assert_eq!(
        std::fs::read_to_string(&hints).unwrap(),
        announcement(VIRTUAL_CHUNK_ROWS)
    );
    let write = |text: &str| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(&hints)
            .unwrap();
        std::io::Write::write_all(&mut file, text.as_bytes())
    };
    let virtual_chunks = dataset().rows.div_ceil(VIRTUAL_CHUNK_ROWS);
    write(&format!(
        "scdlfs-hints 2\nchunk-rows {VIRTUAL_CHUNK_ROWS}\nplan 0\nwindow {}\n",
        virtual_chunks - 1
    ))
    .unwrap();
    let refused = write("scdlfs-hints 2\nchunk-rows 1000\nplan 0\nwindow 0\n").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EINVAL));
    let refused = write(&format!("scdlfs-hints 1\nwindow {virtual_chunks}\n")).unwrap_err();
    assert_eq!(
        refused.raw_os_error(),
        Some(libc::EINVAL),
        "past the last chunk"
    );
    // Version 1 writers are still heard.
    write("scdlfs-hints 1\nplan 0\nwindow 0\nrows 5 90\n").unwrap();
}

#[test]
fn a_monolithic_dataset_whose_arrays_disagree_with_its_header_gets_no_hint_file() {
    let src = tempfile::tempdir().unwrap();
    let spec = dataset();
    write_monolithic(&spec, &src.path().join("ds"));
    let data = src.path().join("ds/data.npy");
    let mut bytes = std::fs::read(&data).unwrap();
    bytes.truncate(bytes.len() - 4);
    std::fs::write(&data, bytes).unwrap();
    let mount = TestMount::start(local_store(src.path()), "", |_| {});
    let dir = mount.path().join("ds");
    assert!(dir.join("data.npy").exists(), "served as stored");
    assert!(!dir.join(HINT_FILE).exists());
}
