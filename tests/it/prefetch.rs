//! Hint-guided prefetch over a slow link: a reader that announces its order through the
//! sampler finds the next windows (or row blocks) already local, while the same epoch
//! without hints waits on the network at every new window. The cache is smaller than
//! the dataset, and nothing is downloaded twice: the window being read is never evicted.

use crate::common;

use std::fs::File;
use std::io::Write;
use std::num::{NonZeroU32, NonZeroU64};
use std::sync::Arc;
use std::time::Duration;

use common::epoch::{self, Epoch, EpochSetup, HintsCompared, ONE_AT_A_TIME};
use common::*;
use scdl_sampler::{BlockOrder, ChunkWindowOrder, Order};
use scdlfs::store::throttled::Throttle;
use scdlfs::store::wrapper::HookedStore;
use scdlfs::synthetic::SyntheticDataset;

fn dataset() -> SyntheticDataset {
    SyntheticDataset {
        rows: 24_000,
        genes: 3_000,
        chunk_rows: 2_000,
        mean_values: 100,
        seed: 21,
    }
}

/// The chunked dataset in a local folder, under `ds/`.
fn setup(cache_bytes: u64, part_size: u64) -> (tempfile::TempDir, EpochSetup) {
    let src = tempfile::tempdir().unwrap();
    let spec = dataset();
    spec.write_chunked(&src.path().join("ds")).unwrap();
    let store = local_store(src.path());
    let setup = EpochSetup {
        store,
        spec,
        cache_bytes,
        part_size,
    };
    (src, setup)
}

fn run_epoch(order: Order, hints: bool, cache_bytes: u64, part_size: u64) -> Epoch {
    let (_src, setup) = setup(cache_bytes, part_size);
    epoch::run_epoch(&setup, order, hints)
}

fn dataset_bytes() -> u64 {
    let spec = dataset();
    let total = spec.total_values();
    let chunks = spec.rows.div_ceil(spec.chunk_rows as u64);
    total * 4 + total * spec.column_dtype().size().unwrap() + (spec.rows + chunks) * 4
}

fn window_order() -> Order {
    Order::ChunkWindows(ChunkWindowOrder {
        seed: 9,
        chunks_per_window: NonZeroU32::new(1).unwrap(),
        shuffle_chunks: true,
        shuffle_within_window: true,
    })
}

fn block_order() -> Order {
    Order::Blocks(BlockOrder {
        seed: 9,
        block_size: NonZeroU64::new(500).unwrap(),
        batch_size: NonZeroU64::new(100).unwrap(),
        fetch_factor: NonZeroU64::new(10).unwrap(),
    })
}

#[test]
fn chunk_window_hints_keep_the_reader_off_the_network() {
    let (_src, setup) = setup(6 << 20, 128 << 10);
    let compared = HintsCompared::run("windows", &setup, window_order());
    let (with, (unforeseen_with, unforeseen_without)) = (&compared.with, compared.unforeseen());
    assert!(
        unforeseen_without >= with.steps as u64,
        "without hints the reader asks for every window itself"
    );
    assert!(
        unforeseen_with * 10 <= unforeseen_without && unforeseen_with <= with.steps as u64 / 2,
        "with hints the reader should hardly ask for anything itself"
    );
    assert!(with.at_end.prefetch_hits > 0);
    // A cache of a third of the dataset, and little fetched twice: the plans kept the
    // window being read and evicted what was done with. What is fetched twice are the
    // edges of neighbouring chunks, fetched early for the kernel's read-around and
    // evicted before their own window comes.
    assert!(
        with.at_end.bytes_fetched <= dataset_bytes() * 5 / 4,
        "re-fetched data: {} of {} bytes",
        with.at_end.bytes_fetched,
        dataset_bytes()
    );
}

/// The row offsets of a dataset: an epoch of random blocks with a cache that holds
/// the dataset fetches each chunk's once (`row_offset_bytes_fetched`, every GET of a
/// `row_ptr.npy` counted by the store's hook, whatever part of the daemon asked).
#[test]
fn an_epoch_of_blocks_fetches_each_chunks_row_offsets_once() {
    let spec = dataset();
    let chunks = spec.rows.div_ceil(spec.chunk_rows as u64);
    let row_offset_bytes = (spec.rows + chunks) * 4;
    let epoch = run_epoch(block_order(), true, 64 << 20, 64 << 10);
    let fetched = epoch.at_end.row_offset_bytes_fetched;
    eprintln!("blocks: {fetched} bytes of row offsets fetched, the dataset has {row_offset_bytes}");
    assert!(
        fetched >= row_offset_bytes && fetched * 20 <= row_offset_bytes * 21,
        "{fetched} bytes of row offsets fetched for {row_offset_bytes}"
    );
}

#[test]
fn row_range_hints_prefetch_block_order() {
    let (_src, setup) = setup(10 << 20, 64 << 10);
    let compared = HintsCompared::run("blocks", &setup, block_order());
    let (with, (unforeseen_with, unforeseen_without)) = (&compared.with, compared.unforeseen());
    assert!(
        unforeseen_without >= with.steps as u64,
        "without hints every fetch asks for its own parts"
    );
    assert!(
        unforeseen_with * 2 <= unforeseen_without,
        "row-range hints should foresee most of what the reader needs"
    );
    assert!(with.at_end.prefetch_hits > 0);
}

#[test]
fn a_sequential_reader_without_hints_gets_read_ahead() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let src = tempfile::tempdir().unwrap();
    let bytes = pattern(5, 6 << 20);
    std::fs::write(src.path().join("big.bin"), &bytes).unwrap();
    let link = Throttle::new(Duration::from_millis(20), 40_000_000);
    let store = Arc::new(HookedStore::new(local_store(src.path()), link));
    let part = 128 << 10;
    let mount = TestMount::start(store, "", |s| s.part_size = part);
    let file = File::open(mount.path().join("big.bin")).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    let mut offset = 0;
    while offset < bytes.len() {
        let n = std::os::unix::fs::FileExt::read_at(&file, &mut buf, offset as u64).unwrap();
        assert!(n > 0, "0-byte read at {offset} of {}", bytes.len());
        assert_eq!(&buf[..n], &bytes[offset..offset + n]);
        offset += n;
        // A reader that works on what it read, slower than the 40 MB/s link.
        std::thread::sleep(Duration::from_millis(3));
    }
    let counters = mount.status().counters;
    let parts = bytes.len() as u64 / part;
    eprintln!(
        "sequential: {parts} parts, {} reads waited, {} parts the reader asked for itself, \
         {} prefetched, {} prefetch hits",
        counters.demand_wait_seconds.count,
        counters.demand_downloads,
        counters.prefetch_requests,
        counters.prefetch_hits
    );
    assert!(counters.prefetch_requests > 0);
    assert!(
        counters.demand_downloads * 4 <= parts,
        "read-ahead should ask for most parts before the reader does"
    );
}

/// A reader that gives no hint but takes chunks a few random rows at a time (windows
/// of one chunk, shuffled within) has nearly every chunk fetched whole once it touched
/// it at scattered places, so the chunk's parts come side by side rather than one wait each;
/// nothing is fetched for nothing: with a cache that holds the dataset, each byte once.
#[test]
fn scattered_rows_without_hints_get_their_chunks_fetched_whole() {
    let epoch = run_epoch(window_order(), false, 64 << 20, 128 << 10);
    let counters = &epoch.at_end;
    eprintln!(
        "windows without hints: {} steps, {} chunks fetched whole, {} reads waited, \
         {} direct reads, fetched {} of {} bytes; parts {} prefetched {} hits {}",
        epoch.steps,
        counters.chunks_fetched_whole,
        counters.demand_wait_seconds.count,
        counters.direct_reads,
        counters.bytes_fetched,
        dataset_bytes(),
        counters.parts_fetched,
        counters.prefetch_requests,
        counters.prefetch_hits,
    );
    // The first chunk is read before anything is scattered; with the sampler's
    // permutation of this session, one more is often reached by the kernel's read-around
    // or the sequential read-ahead first (10 of 12 in 4 of 6 loaded runs, 11 in 2).
    assert!(
        counters.chunks_fetched_whole + 2 >= epoch.steps as u64,
        "every chunk (but perhaps two read without scatter) is fetched whole"
    );
    assert!(counters.prefetch_hits > 0);
    assert!(
        counters.bytes_fetched <= dataset_bytes() * 21 / 20,
        "fetched {} bytes of a {}-byte dataset",
        counters.bytes_fetched,
        dataset_bytes()
    );
}

/// A plan of small blocks over a dataset many times the disk cache, with parts far
/// larger than a block: each part holds rows of many steps, and is evicted long before
/// the plan comes back to it. Its rows' bytes are fetched alone, each once, and the
/// reader finds them in the page cache: it waits for almost nothing after the first
/// step, and the link carries about the dataset, not a part per block.
#[test]
fn a_plan_over_a_cache_smaller_than_its_parts_fetches_each_planned_byte_once() {
    let cache = 2 << 20;
    let (_src, setup) = setup(cache, 1 << 20);
    assert!(dataset_bytes() > 5 * cache);
    // Blocks of 200 rows (120 KB of values and column ids), a tenth of a part.
    let order = Order::Blocks(BlockOrder {
        seed: 4,
        block_size: NonZeroU64::new(200).unwrap(),
        batch_size: NonZeroU64::new(100).unwrap(),
        fetch_factor: NonZeroU64::new(4).unwrap(),
    });
    let epoch = epoch::run_epoch(&setup, order, true);
    let fetched = epoch.at_end.bytes_fetched;
    let c = &epoch.at_end;
    eprintln!(
        "exact rows: fetched {fetched} of {} bytes: {} planned requests of {} bytes ({} \
         pushed), {} parts, {} demand downloads, {} direct and {} stray reads; {} reads \
         waited after the first step",
        dataset_bytes(),
        c.planned_requests,
        c.planned_bytes,
        c.planned_bytes_pushed,
        c.parts_fetched,
        c.demand_downloads,
        c.direct_reads,
        c.stray_reads,
        epoch.waits_after_first_step(),
    );
    assert!(
        epoch.at_end.planned_requests > 0,
        "rows were fetched exactly"
    );
    // Each planned byte once, but for the pages two blocks share.
    assert!(
        c.planned_bytes <= dataset_bytes() * 11 / 10,
        "planned {} bytes of a {} byte dataset",
        c.planned_bytes,
        dataset_bytes()
    );
    // Besides: the row offsets, and the reader's faults before the first step's rows
    // arrived or where a range's page is shared with a block not yet read; more of those
    // race the ranges on a loaded machine (1.17-1.20× in five runs at a load of 6, one
    // over 1.25×), and whole parts fetched 7.8×.
    assert!(
        fetched <= dataset_bytes() * 4 / 3,
        "fetched {fetched} bytes of a {} byte dataset",
        dataset_bytes()
    );
    // The rows went to the page cache ahead of the reader: without, each of its 120
    // blocks faults in both arrays, a FUSE read each (and more past 128 KiB); with,
    // 28-32 in four runs, the first step's rows and the pages of row offsets. (Bytes
    // pushed no longer tell: pages the kernel was given are not pushed again.)
    let reads = c.reads - epoch.after_first_step.reads;
    eprintln!("{reads} FUSE reads after the first step");
    assert!(
        reads <= 60,
        "{reads} FUSE reads after the first step: the rows did not reach the page cache ahead of the reader"
    );
}

/// Whether every page of `bytes` of the mapped file is in the kernel's page cache
/// (root may ask of any file), without touching them.
fn resident(map: &memmap2::Mmap, bytes: std::ops::Range<usize>) -> bool {
    let page = rustix::param::page_size();
    let start = bytes.start / page * page;
    let pages = (bytes.end - start).div_ceil(page);
    let mut flags = vec![0u8; pages];
    // SAFETY: the range lies within the live mapping; `flags` holds a byte per page.
    let answer = unsafe {
        libc::mincore(
            map.as_ptr().add(start) as *mut libc::c_void,
            bytes.end - start,
            flags.as_mut_ptr(),
        )
    };
    assert_eq!(answer, 0, "mincore: {}", std::io::Error::last_os_error());
    flags.iter().all(|f| f & 1 == 1)
}

/// With a plan's rows fetched exactly, the row offsets that bound them go into the page
/// cache with their values: a reader's memory map faults on a row's offsets before its
/// values, and through FUSE the kernel would widen that read to its read-around, the
/// offsets of chunks the plan never reads (on 10^7 rows in blocks of one row, a read of
/// 128 KiB at every row, all of the reader's time).
#[test]
fn a_plan_of_exact_rows_stores_their_row_offsets_in_the_page_cache_too() {
    let spec = SyntheticDataset {
        rows: 200_000,
        genes: 2_000,
        chunk_rows: 4_096,
        mean_values: 30,
        seed: 5,
    };
    let src = tempfile::tempdir().unwrap();
    spec.write_chunked(&src.path().join("ds")).unwrap();
    let cache = 4 << 20;
    assert!(
        spec.total_values() * 4 > 4 * cache,
        "values several times the cache"
    );
    let mount = TestMount::start(local_store(src.path()), "", |s| {
        s.part_size = 256 << 10;
        s.cache_bytes = cache;
    });
    let dir = mount.path().join("ds");
    let row_ptr = File::open(dir.join("row_ptr.npy")).unwrap();
    // SAFETY: the mount's files do not change while mapped.
    let offsets = unsafe { memmap2::Mmap::map(&row_ptr).unwrap() };
    let reader = MappedRows::open(&dir);
    let width = offsets.len() / (spec.rows as usize + 1);
    // Rows of most chunks, a chunk's last row among them (its end is the next chunk's
    // first offset).
    let rows: Vec<u64> = (0..45u64).map(|k| k * 4_441 + 17).chain([4_095]).collect();
    let announced: String = rows.iter().map(|r| format!(" {r} {}", r + 1)).collect();
    let mut hints = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(".scdlfs-hints"))
        .unwrap();
    hints
        .write_all(format!("scdlfs-hints 4\nchunk-rows 4096\nplan 0\nrows{announced}\n").as_bytes())
        .unwrap();
    let bounds = |row: u64| row as usize * width..(row as usize + 2) * width;
    let started = std::time::Instant::now();
    while !rows.iter().all(|&row| resident(&offsets, bounds(row))) {
        let missing: Vec<u64> = rows
            .iter()
            .copied()
            .filter(|&row| !resident(&offsets, bounds(row)))
            .collect();
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the offsets of rows {missing:?} never reached the page cache"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let reads_before = mount.status().counters.reads;
    for &row in &rows {
        assert_eq!(reader.row(row), spec.row(row), "row {row}");
    }
    assert_eq!(
        mount.status().counters.reads,
        reads_before,
        "the planned rows were read without a FUSE read"
    );
    drop(hints);
}
