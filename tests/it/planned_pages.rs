//! A plan's exact rows into the page cache (`scdlfs::fs::planned_pages`), on a whole
//! mount assembled in-process with a recording page cache in place of the kernel's.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use scdlfs::fs::page_cache::PageCache;
use scdlfs::fs::FsCore;
use scdlfs::mount::{assemble, MountSettings};
use scdlfs::synthetic::SyntheticDataset;

use crate::common::{local_store, settings};

const ROOT: u64 = 1;
const PAGE: u64 = 4096;

/// The pages stored into the "kernel", by inode.
#[derive(Default)]
struct StoredPages(Mutex<BTreeSet<(u64, u64)>>);

impl PageCache for StoredPages {
    fn store(&self, ino: u64, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
        let pages = offset / PAGE..(offset + bytes.len() as u64).div_ceil(PAGE);
        self.0.lock().extend(pages.map(|page| (ino, page)));
        Ok(())
    }
}

impl StoredPages {
    fn has(&self, ino: u64, pages: Range<u64>) -> bool {
        let stored = self.0.lock();
        pages.into_iter().all(|page| stored.contains(&(ino, page)))
    }

    fn any(&self, ino: u64, pages: Range<u64>) -> bool {
        let stored = self.0.lock();
        pages.into_iter().any(|page| stored.contains(&(ino, page)))
    }
}

/// A mount's core over a synthetic chunked dataset `ds` in a local folder, whose stores
/// into the page cache are recorded, with `ds/data.npy` open.
struct RecordingMount {
    core: FsCore,
    stored: Arc<StoredPages>,
    data: u64,
    reader: u64,
    _observer: scdlfs::status::Observer,
    _dirs: [tempfile::TempDir; 2],
}

impl RecordingMount {
    async fn of(spec: &SyntheticDataset, tune: impl FnOnce(&mut MountSettings)) -> RecordingMount {
        let source = tempfile::tempdir().unwrap();
        spec.write_chunked(&source.path().join("ds")).unwrap();
        let cache = tempfile::tempdir().unwrap();
        let mut s = settings(cache.path());
        tune(&mut s);
        let (core, observer) = tokio::task::block_in_place(|| {
            assemble(
                local_store(source.path()),
                object_store::path::Path::from(""),
                &s,
                None,
            )
        })
        .unwrap();
        let stored = Arc::new(StoredPages::default());
        core.read_around().connect(stored.clone());
        let data = ino_of(&core, &["ds", "data.npy"]).await;
        let reader = core.open(data).unwrap().handle;
        RecordingMount {
            core,
            stored,
            data,
            reader,
            _observer: observer,
            _dirs: [source, cache],
        }
    }
}

async fn ino_of(core: &FsCore, path: &[&str]) -> u64 {
    let mut ino = ROOT;
    for name in path {
        ino = core.lookup(ino, OsStr::new(name)).await.unwrap().attr.ino.0;
    }
    ino
}

/// The pages of the flat `data.npy` (a raw array of f32) holding row `row`'s values.
fn data_pages(spec: &SyntheticDataset, row: u64) -> Range<u64> {
    let first: u64 = (0..row).map(|r| spec.row_len(r)).sum();
    let bytes = first * 4..(first + spec.row_len(row)) * 4;
    bytes.start / PAGE..bytes.end.div_ceil(PAGE)
}

/// Pages a read asked for are not stored by the plan's pusher: the read fills them.
/// Its pages stay locked in the kernel until the read is answered, and a store waits
/// for them; the pusher stores in arrival order, so one store behind a read of the
/// link held every range that arrived after it (5 s of an 8 s epoch of blocks over a
/// cache of a tenth of the dataset, the link idle while its bound of bytes was held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plans_pages_a_read_asked_for_are_left_to_that_read() {
    let spec = SyntheticDataset {
        rows: 6_000,
        genes: 2_000,
        chunk_rows: 1_000,
        mean_values: 200,
        seed: 3,
    };
    // The values are many times the cache: rows are fetched exactly.
    let mount = RecordingMount::of(&spec, |s| {
        s.cache_bytes = 1 << 20;
        s.part_size = 256 << 10;
    })
    .await;
    let (core, stored, data, reader) = (&mount.core, &mount.stored, mount.data, mount.reader);

    // A read of row 2,500's pages comes first, as a fault of the reader's memory map
    // before its plan's bytes arrive.
    let (read_row, planned_rows) = (2_500u64, [700u64, 2_500, 4_200, 5_100]);
    let asked = data_pages(&spec, read_row);
    core.read(
        data,
        reader,
        asked.start * PAGE,
        ((asked.end - asked.start) * PAGE) as u32,
    )
    .await
    .unwrap();

    let hints = core
        .open(ino_of(core, &["ds", scdl_format::hint::HINT_FILE]).await)
        .unwrap()
        .handle;
    let rows: String = planned_rows
        .iter()
        .map(|r| format!(" {r} {}", r + 1))
        .collect();
    core.write(
        hints,
        format!("scdlfs-hints 4\nchunk-rows 1000\nplan 0\nrows{rows}\n").as_bytes(),
    )
    .unwrap();
    let others = planned_rows.iter().filter(|&&r| r != read_row);
    let started = Instant::now();
    while !others
        .clone()
        .all(|&row| stored.has(data, data_pages(&spec, row)))
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the plan's other rows never reached the page cache"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The other rows' stores came after the read row's bytes would have.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !stored.any(data, asked),
        "the pages the read asked for were stored again"
    );
    core.release(hints);
    core.release(reader);
}

/// A window step's values go into the page cache as their parts arrive, before any read:
/// its rows are read in an order shuffled across the window, so a reader gets far only
/// once most of the window is there, and its bytes, left to the reads, went into the
/// page cache beside the readers after the last part came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_windows_values_reach_the_page_cache_as_their_parts_arrive() {
    let spec = SyntheticDataset {
        rows: 4_000,
        genes: 2_000,
        chunk_rows: 1_000,
        mean_values: 200,
        seed: 5,
    };
    // The whole dataset fits the cache: the window's parts are fetched whole.
    let part_size = 64 << 10;
    let mount = RecordingMount::of(&spec, |s| s.part_size = part_size).await;
    let (core, stored, data, reader) = (&mount.core, &mount.stored, mount.data, mount.reader);
    let hints = core
        .open(ino_of(core, &["ds", scdl_format::hint::HINT_FILE]).await)
        .unwrap()
        .handle;
    core.write(
        hints,
        b"scdlfs-hints 4\nchunk-rows 1000\nplan 0\nwindow 2\n",
    )
    .unwrap();

    // Chunk 2's values in the flat data.npy (f32), and the pages no part boundary cuts:
    // a page shared by two parts is left to the reader's fault.
    let first_value = |row: u64| -> u64 { (0..row).map(|r| spec.row_len(r)).sum() };
    let chunk = first_value(2_000) * 4..first_value(3_000) * 4;
    let part_boundary_inside = |page: u64| {
        (page * PAGE + 1..(page + 1) * PAGE).any(|b| (b - chunk.start) % part_size == 0)
    };
    let whole_pages: Vec<u64> = (chunk.start.div_ceil(PAGE)..chunk.end / PAGE)
        .filter(|&page| !part_boundary_inside(page))
        .collect();
    assert!(whole_pages.len() > 100, "too few pages to tell");
    let started = Instant::now();
    while !whole_pages
        .iter()
        .all(|&page| stored.has(data, page..page + 1))
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the window's values never reached the page cache: {} of {} pages",
            whole_pages
                .iter()
                .filter(|&&page| stored.has(data, page..page + 1))
                .count(),
            whole_pages.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Nothing of the chunks no step names.
    let other = first_value(500) * 4 / PAGE..first_value(1_500) * 4 / PAGE;
    assert!(
        !stored.any(data, other),
        "pages of a chunk no step names were stored"
    );
    core.release(hints);
    core.release(reader);
}
