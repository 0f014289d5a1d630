//! Monolithic datasets in a bucket get the prefetch chunked ones get: the directory of
//! a monolithic archive on S3 has a hint file that announces its virtual chunks, the
//! sampler discovers them with no extra code, and over a slow link a reader that
//! announces its order (chunk windows or row blocks) waits far less than one that does
//! not. Every row read equals the source. A dataset whose arrays disagree with its
//! header is shown as stored, without a hint file.

mod common;

use std::fs::File;
use std::num::{NonZeroU32, NonZeroU64};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::s3::{moto, unique_bucket};
use common::*;
use memmap2::Mmap;
use scdl_format::hint::{announcement, HINT_FILE};
use scdl_format::{ArrayKind, Header};
use scdl_sampler::{
    BlockOrder, ChunkWindowOrder, DatasetKind, DatasetLayout, Order, Sampler, Shard, Workers,
    DEFAULT_VIRTUAL_CHUNK_SIZE,
};
use scdlfs::metrics::MetricsSnapshot;
use scdlfs::store::throttled::Throttle;
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

/// Writes `spec` as a monolithic archive at `dir`.
fn write_monolithic(spec: &SyntheticDataset, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let arrays = Monolithic::of(spec);
    for kind in ArrayKind::ALL {
        std::fs::write(dir.join(kind.file_name()), arrays.array(kind)).unwrap();
    }
    std::fs::write(dir.join("header.sch"), spec.monolithic_header().encode()).unwrap();
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

/// Reads rows through memory maps of the monolithic arrays, as the released reader does.
struct Reader {
    data: Mmap,
    row_ptr: Mmap,
    col_ptr: Mmap,
    header: Header,
}

impl Reader {
    fn open(dir: &Path) -> Reader {
        let map = |kind: ArrayKind| unsafe {
            Mmap::map(&File::open(dir.join(kind.file_name())).unwrap()).unwrap()
        };
        Reader {
            data: map(ArrayKind::Data),
            row_ptr: map(ArrayKind::RowPtr),
            col_ptr: map(ArrayKind::ColPtr),
            header: Header::decode(&std::fs::read(dir.join("header.sch")).unwrap()).unwrap(),
        }
    }

    fn row(&self, row: u64) -> scdlfs::synthetic::Row {
        let [_, rows, cols] = self.header.csr_arrays().unwrap();
        let start = rows.dtype.read_uint(&self.row_ptr, row as usize) as usize;
        let end = rows.dtype.read_uint(&self.row_ptr, row as usize + 1) as usize;
        scdlfs::synthetic::Row {
            columns: (start..end)
                .map(|i| cols.dtype.read_uint(&self.col_ptr, i) as u32)
                .collect(),
            values: (start..end)
                .map(|i| f32::from_le_bytes(self.data[i * 4..i * 4 + 4].try_into().unwrap()))
                .collect(),
        }
    }
}

/// How the epoch went: counters after the first step and at the end.
struct Epoch {
    after_first_step: MetricsSnapshot,
    at_end: MetricsSnapshot,
    steps: usize,
}

impl Epoch {
    fn waits_after_first_step(&self) -> u64 {
        self.at_end.demand_reads_waited - self.after_first_step.demand_reads_waited
    }
}

/// The epochs of this file run one at a time: each measures waits against a clock.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Mounts the bucket behind a 20 ms, 40 MB/s link with a cache of less than half the
/// dataset, and reads one epoch with `order`, spending 40 µs of "training" per row.
fn run_epoch(bucket: &str, order: Order, hints: bool, cache_bytes: u64, part_size: u64) -> Epoch {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let spec = dataset();
    let link = Throttle::new(Duration::from_millis(20), 40_000_000);
    let store = Arc::new(HookedStore::new(moto().store(bucket), link));
    let mount = TestMount::start(store, "", |s| {
        s.part_size = part_size;
        s.cache_bytes = cache_bytes;
        s.prefetch_lookahead_steps = 3;
    });
    let dir = mount.path().join("ds");
    let layout = DatasetLayout::discover(&dir, DEFAULT_VIRTUAL_CHUNK_SIZE).unwrap();
    assert_eq!(layout.kind, DatasetKind::MountedMonolithic);
    assert_eq!(layout.chunks.chunk_size(), VIRTUAL_CHUNK_ROWS);
    let mut sampler = if hints {
        Sampler::new(&layout, order, Shard::single(), Workers::single()).unwrap()
    } else {
        Sampler::without_hints(&layout, order, Shard::single(), Workers::single()).unwrap()
    };
    assert_eq!(sampler.hints_active(), hints);
    let reader = Reader::open(&dir);
    let mut rows = sampler.epoch(0);
    let first_step_rows = rows.share()[0].rows;
    let steps = rows.share().len();
    let mut after_first_step = None;
    let mut read = 0;
    while let Some(batch) = rows.next_minibatch() {
        for &row in &batch {
            assert_eq!(reader.row(row), spec.row(row), "row {row}");
        }
        std::thread::sleep(Duration::from_micros(40 * batch.len() as u64));
        read += batch.len() as u64;
        if after_first_step.is_none() && read >= first_step_rows {
            after_first_step = Some(mount.status().counters);
        }
    }
    drop(rows);
    assert!(sampler.take_hint_error().is_none());
    Epoch {
        after_first_step: after_first_step.unwrap(),
        at_end: mount.status().counters,
        steps,
    }
}

fn compare(what: &str, bucket: &str, order: Order, cache_bytes: u64, part_size: u64) {
    let with = run_epoch(bucket, order, true, cache_bytes, part_size);
    let without = run_epoch(bucket, order, false, cache_bytes, part_size);
    let (waits_with, waits_without) = (
        with.waits_after_first_step(),
        without.waits_after_first_step(),
    );
    eprintln!(
        "monolithic, {what}: {} steps; reads that waited after the first step: {waits_with} \
         with hints, {waits_without} without; prefetch hits {}",
        with.steps, with.at_end.prefetch_hits
    );
    assert!(with.at_end.prefetch_hits > 0);
    assert!(
        waits_with * 3 <= waits_without,
        "hints should remove at least two thirds of the waits"
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
