//! The filesystem core driven in-process: no FUSE, no S3 server. The store is
//! `object_store::memory::InMemory` behind the counting double, so these tests see the
//! exact requests the core makes, and run in seconds.

use crate::common;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use fuser::FileType;
use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{ListResult, ObjectStore, ObjectStoreExt, PutPayload};
use scdl_format::hint::HINT_FILE;
use scdl_format::layout::CHUNKED_DIR;
use scdl_format::ArrayKind;
use scdlfs::error::FsError;
use scdlfs::fs::page_cache::PageCache;
use scdlfs::fs::FsCore;
use scdlfs::mount::{assemble, MountSettings};
use scdlfs::status::Observer;
use scdlfs::store::counting::CountReads;
use scdlfs::store::wrapper::HookedStore;
use scdlfs::synthetic::SyntheticDataset;

const ROOT: u64 = 1;

/// A core over an in-memory copy of `files`, with its cache in `cache_dir`.
struct Core {
    core: FsCore,
    observer: Observer,
    reads: Arc<HookedStore<CountReads>>,
    /// The store behind the counter, for tests that change the bucket while mounted.
    memory: Arc<InMemory>,
    _cache: tempfile::TempDir,
}

async fn core_of(
    files: &BTreeMap<String, Vec<u8>>,
    configure: impl FnOnce(&mut MountSettings),
) -> Core {
    core_over(memory_of(files).await, configure, None)
}

async fn memory_of(files: &BTreeMap<String, Vec<u8>>) -> Arc<InMemory> {
    let memory = Arc::new(InMemory::new());
    for (name, bytes) in files {
        let payload = PutPayload::from(Bytes::from(bytes.clone()));
        memory
            .put(&ObjectPath::from(name.as_str()), payload)
            .await
            .unwrap();
    }
    memory
}

/// A core over `memory`; `root_listing`: the root's listing made at mount time.
fn core_over(
    memory: Arc<InMemory>,
    configure: impl FnOnce(&mut MountSettings),
    root_listing: Option<ListResult>,
) -> Core {
    let reads = Arc::new(HookedStore::new(memory.clone(), CountReads::default()));
    let cache = tempfile::tempdir().unwrap();
    let mut s = settings(cache.path());
    configure(&mut s);
    let store: Arc<dyn ObjectStore> = reads.clone();
    let (core, observer) = assemble(store, ObjectPath::from(""), &s, root_listing).unwrap();
    Core {
        core,
        observer,
        reads,
        memory,
        _cache: cache,
    }
}

/// The files of a chunked synthetic dataset under `prefix/`.
fn dataset_files(prefix: &str) -> BTreeMap<String, Vec<u8>> {
    chunked_files(&small_dataset(), prefix)
}

/// The files of chunked dataset `spec` under `prefix/`.
fn chunked_files(spec: &SyntheticDataset, prefix: &str) -> BTreeMap<String, Vec<u8>> {
    let dir = tempfile::tempdir().unwrap();
    spec.write_chunked(dir.path()).unwrap();
    snapshot(dir.path())
        .into_iter()
        .map(|(name, bytes)| (format!("{prefix}/{name}"), bytes))
        .collect()
}

/// Under a paused clock: spins the runtime (never idle, so the clock stands still) until
/// `done`, within a bound of real time; returns whether it became true. Part files are
/// written on blocking threads, in real time: a test that moved the clock meanwhile
/// would time their downloads out.
async fn without_timers(mut done: impl FnMut() -> bool) -> bool {
    let frozen = tokio::time::Instant::now();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(20) {
        if done() {
            assert_eq!(tokio::time::Instant::now(), frozen, "the clock moved");
            return true;
        }
        tokio::task::yield_now().await;
    }
    false
}

impl Core {
    /// Waits (at most 30 s) until no download is under way: a read returns once its
    /// own bytes have arrived, and its part lands in the cache a little later.
    async fn settle(&self) {
        let started = Instant::now();
        while self.observer.status().downloads_in_flight > 0 {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "downloads still under way"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn resolve(&self, path: &str) -> Result<fuser::FileAttr, FsError> {
        let mut attr = self.core.getattr(ROOT)?;
        for name in path.split('/').filter(|n| !n.is_empty()) {
            attr = self.core.lookup(attr.ino.0, OsStr::new(name)).await?.attr;
        }
        Ok(attr)
    }

    /// Reads a whole file in reads of `step` bytes through one open handle.
    async fn read_all(&self, path: &str, step: u32) -> Vec<u8> {
        let attr = self.resolve(path).await.unwrap();
        let opened = self.core.open(attr.ino.0).unwrap();
        let mut out = Vec::new();
        loop {
            let got = self
                .core
                .read(attr.ino.0, opened.handle, out.len() as u64, step)
                .await
                .unwrap();
            assert!(got.len() <= step as usize);
            if got.is_empty() {
                break;
            }
            out.extend_from_slice(&got);
            assert!(out.len() as u64 <= attr.size, "read past the end of {path}");
        }
        self.core.release(opened.handle);
        out
    }

    /// Reads every flat array of the small dataset at `prefix` in reads of `step` bytes
    /// and checks it against the monolithic archive.
    async fn assert_serves_small_dataset(&self, prefix: &str, step: u32) {
        let mono = Monolithic::of(&small_dataset());
        for kind in ArrayKind::ALL {
            let path = format!("{prefix}/{}", kind.file_name());
            assert_eq!(
                self.read_all(&path, step).await,
                mono.array(kind),
                "{path} in reads of {step}"
            );
        }
    }

    /// Waits, within a bound, until the store saw a read of `key` in `range`.
    async fn wait_for_read(&self, key: &str, range: std::ops::Range<u64>) -> bool {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(20) {
            let seen = self.reads.hook().snapshot().keys().any(|(k, r)| {
                k == key
                    && r.as_ref()
                        .is_some_and(|r| r.start <= range.start && range.end <= r.end)
            });
            if seen {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_files_read_back_exactly_in_any_slicing() {
    let files = plain_files();
    let core = core_of(&files, |_| {}).await;
    for (name, bytes) in &files {
        let attr = core.resolve(name).await.unwrap();
        assert_eq!(attr.size, bytes.len() as u64, "{name}");
        assert_eq!(attr.kind, FileType::RegularFile);
        for step in [7777, 64 << 10, 1 << 20] {
            assert_eq!(
                &core.read_all(name, step).await,
                bytes,
                "{name} in reads of {step}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_lists_directories_and_refuses_what_a_read_only_tree_must() {
    let files = plain_files();
    let core = core_of(&files, |_| {}).await;
    let root = core.core.readdir(ROOT).await.unwrap();
    let entries: Vec<_> = core.core.dir_entries(ROOT, 0, &root).collect();
    let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        [
            ".",
            "..",
            "empty.bin",
            "nested",
            "one_part.bin",
            "one_part_plus_one.bin",
            "tiny.txt"
        ]
    );
    assert_eq!(entries[3].kind, FileType::Directory);
    let offsets: Vec<u64> = entries.iter().map(|e| e.next_offset).collect();
    assert_eq!(offsets, (1..=entries.len() as u64).collect::<Vec<_>>());
    let resumed: Vec<_> = core.core.dir_entries(ROOT, 3, &root).collect();
    assert_eq!(
        resumed,
        entries[3..],
        "a listing resumes after the offset it gave"
    );

    assert!(matches!(core.resolve("nope").await, Err(FsError::NotFound)));
    assert!(matches!(
        core.resolve("tiny.txt/below").await,
        Err(FsError::NotADirectory)
    ));
    let nested = core.resolve("nested").await.unwrap();
    assert_eq!(nested.kind, FileType::Directory);
    assert!(matches!(
        core.core.open(nested.ino.0),
        Err(FsError::IsADirectory)
    ));

    let tiny = core.resolve("tiny.txt").await.unwrap();
    let opened = core.core.open(tiny.ino.0).unwrap();
    assert!(!opened.direct_io, "data files keep their page cache");
    assert!(matches!(
        core.core.write(opened.handle, b"x"),
        Err(FsError::ReadOnly)
    ));
    assert!(matches!(
        core.core.setattr(tiny.ino.0, Some(0), false),
        Err(FsError::ReadOnly)
    ));
    assert!(matches!(
        core.core.setattr(tiny.ino.0, None, true),
        Err(FsError::ReadOnly)
    ));
    assert_eq!(
        core.read_all("tiny.txt", 4096).await,
        files["tiny.txt"],
        "nothing changed"
    );

    assert!(matches!(
        core.core
            .getxattr(tiny.ino.0, OsStr::new("user.scdlfs.status"), 0)
            .await,
        Err(FsError::NoSuchAttribute)
    ));
    assert!(core.core.listxattr(tiny.ino.0).is_empty());
    let names = core.core.listxattr(ROOT);
    let names: Vec<&str> = std::str::from_utf8(&names)
        .unwrap()
        .trim_end_matches('\0')
        .split('\0')
        .collect();
    assert!(names.contains(&"user.scdlfs.status"), "{names:?}");
    let name = OsStr::new("user.scdlfs.status");
    let status: serde_json::Value =
        serde_json::from_slice(&core.core.getxattr(ROOT, name, 0).await.unwrap()).unwrap();
    assert_eq!(
        status["counters"]["reads"], 2,
        "the two reads of tiny.txt: {status}"
    );
}

/// The mount lists its root before it answers, to fail early on an unreachable store;
/// the root's first use takes that listing instead of waiting for another. Here the
/// bucket gains an object in between, which the root then does not show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listing_made_at_mount_time_is_the_roots_first() {
    let memory = memory_of(&plain_files()).await;
    let at_mount = memory.list_with_delimiter(None).await.unwrap();
    memory
        .put(
            &ObjectPath::from("added.txt"),
            PutPayload::from_static(b"new"),
        )
        .await
        .unwrap();
    let core = core_over(memory, |_| {}, Some(at_mount));
    let root = core.core.readdir(ROOT).await.unwrap();
    assert!(root.get("tiny.txt").is_some());
    assert!(
        root.get("added.txt").is_none(),
        "listed from the store again"
    );
}

/// Discovery reads a dataset's `header.sch` whole; a reader of the stored header (the
/// sampler reads `.chunked/header.sch` to learn the chunk layout) gets those bytes
/// without another request, and they are the stored ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stored_header_is_served_from_what_discovery_read() {
    let files = dataset_files("ds");
    let core = core_of(&files, |_| {}).await;
    let raw_header = format!("ds/{CHUNKED_DIR}/header.sch");
    assert_eq!(
        core.read_all(&raw_header, 4096).await,
        files["ds/header.sch"]
    );
    let header_reads: u64 = core
        .reads
        .hook()
        .snapshot()
        .iter()
        .filter(|((key, _), _)| key == "ds/header.sch")
        .map(|(_, count)| count)
        .sum();
    assert_eq!(header_reads, 1, "discovery's read only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_readers_share_one_download_per_part() {
    let files = plain_files();
    let core = core_of(&files, |_| {}).await;
    let name = "nested/big.bin";
    let (a, b, c) = tokio::join!(
        core.read_all(name, 4096),
        core.read_all(name, 100_000),
        core.read_all(name, 1 << 20)
    );
    for got in [a, b, c] {
        assert_eq!(got, files[name]);
    }
    let counts = core.reads.hook().snapshot();
    let part = 64 << 10;
    let len = files[name].len() as u64;
    let parts = len.div_ceil(part);
    let of_big: Vec<_> = counts.iter().filter(|((k, _), _)| k == name).collect();
    // A reader whose part still waits for a download slot may ask for its own few
    // bytes beside the download (fetch/mod.rs, DIRECT_READ_LEAD): those are not parts.
    let (downloads, direct): (Vec<_>, Vec<_>) = of_big.iter().partition(|((_, range), _)| {
        let range = range.clone().unwrap();
        range.start % part == 0 && range.end == (range.start + part).min(len)
    });
    assert_eq!(
        downloads.len() as u64,
        parts,
        "every part downloaded: {of_big:?}"
    );
    assert!(
        downloads.iter().all(|(_, n)| **n == 1),
        "each part once: {of_big:?}"
    );
    assert!(
        direct.iter().all(|((_, range), _)| {
            let range = range.clone().unwrap();
            range.end - range.start < part / 2 && range.start / part == (range.end - 1) / part
        }),
        "other requests are a reader's own few bytes of one part: {direct:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flat_view_serves_the_monolithic_arrays() {
    let core = core_of(&dataset_files("ds"), |_| {}).await;
    core.assert_serves_small_dataset("ds", 128 << 10).await;
    core.assert_serves_small_dataset("ds", 5000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_are_minted_by_the_table_and_forgotten_on_release() {
    let core = core_of(&plain_files(), |_| {}).await;
    let tiny = core.resolve("tiny.txt").await.unwrap();
    let handles: Vec<u64> = (0..3)
        .map(|_| core.core.open(tiny.ino.0).unwrap().handle)
        .collect();
    assert!(handles.iter().all(|&h| h != 0), "0 means no handle");
    assert_eq!(
        handles
            .iter()
            .collect::<std::collections::HashSet<_>>()
            .len(),
        3
    );
    for &handle in &handles {
        core.core.release(handle);
    }
    let again = core.core.open(tiny.ino.0).unwrap().handle;
    assert!(!handles.contains(&again), "ids are not reused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hint_writes_are_all_or_nothing_and_a_plan_prefetches_its_steps() {
    let core = core_of(&dataset_files("ds"), |s| s.prefetch_lookahead_steps = 1).await;
    let hints = core.resolve(&format!("ds/{HINT_FILE}")).await.unwrap();
    assert!(
        core.core.setattr(hints.ino.0, Some(0), false).is_ok(),
        "O_TRUNC of the hint file"
    );
    let opened = core.core.open(hints.ino.0).unwrap();
    assert!(opened.direct_io, "every hint write reaches the daemon");
    let h = opened.handle;
    let before = core.reads.hook().total();

    assert!(
        matches!(
            core.core.write(h, b"window 1\n"),
            Err(FsError::InvalidHint(_))
        ),
        "no greeting"
    );
    assert!(
        matches!(
            core.core.write(h, b"scdlfs-hints 1\nplan 0\nwindow 99\n"),
            Err(FsError::InvalidHint(_))
        ),
        "no chunk 99"
    );
    assert!(
        core.observer.status().active_plans.is_empty(),
        "refused writes leave no plan"
    );
    assert_eq!(core.reads.hook().total(), before, "and fetch nothing");

    core.core
        .write(h, b"scdlfs-hints 1\nplan 4\nwindow 5\nwindow 2\nwindow 7\n")
        .unwrap();
    let plans = core.observer.status().active_plans;
    assert_eq!((plans.len(), plans[0].epoch, plans[0].steps), (1, 4, 3));
    // The current step and one ahead are fetched before any read; the third is not.
    for chunk in ["chunk_00005", "chunk_00002"] {
        let key = format!("ds/{chunk}/{}", ArrayKind::Data.file_name());
        assert!(core.wait_for_read(&key, 0..1).await, "{key} prefetched");
    }
    let fetched = core.reads.hook().snapshot();
    assert!(
        !fetched
            .keys()
            .any(|(k, _)| k.starts_with("ds/chunk_00007/")),
        "beyond the lookahead: {fetched:?}"
    );

    core.core.release(h);
    assert!(
        core.observer.status().active_plans.is_empty(),
        "the plan closes with its handle"
    );
}

/// Protocol version 4: a step too long for one line comes as `rows+` lines and a last
/// `rows` line, here over two writes; it is one step, and its chunks, the first line's
/// too, are fetched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_written_in_several_lines_and_writes_is_one_step_and_prefetched() {
    let core = core_of(&dataset_files("ds"), |s| s.prefetch_lookahead_steps = 1).await;
    let hints = core.resolve(&format!("ds/{HINT_FILE}")).await.unwrap();
    let h = core.core.open(hints.ino.0).unwrap().handle;
    // Chunks of 300 rows: rows 1800.. are chunk 6, 900.. chunk 3, 1500.. chunk 5.
    core.core
        .write(h, b"scdlfs-hints 4\nplan 2\nrows+ 1800 1801\n")
        .unwrap();
    let steps = |core: &Core| {
        let plans = core.observer.status().active_plans;
        plans.iter().map(|p| p.steps).sum::<usize>()
    };
    assert_eq!(steps(&core), 0, "no step before its last line");
    core.core
        .write(h, b"rows+ 900 901\nrows 1500 1501\n")
        .unwrap();
    assert_eq!(steps(&core), 1);
    let started = Instant::now();
    let fetched = |chunk: &str| {
        core.reads
            .hook()
            .snapshot()
            .keys()
            .any(|(k, _)| k.starts_with(&format!("ds/{chunk}/")))
    };
    while !["chunk_00006", "chunk_00003", "chunk_00005"]
        .iter()
        .all(|c| fetched(c))
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the step's chunks were not all fetched"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    core.core.release(h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequential_reader_gets_read_ahead_and_a_random_one_does_not() {
    let files = plain_files();
    let core = core_of(&files, |_| {}).await;
    let big = core.resolve("nested/big.bin").await.unwrap();
    let part = 64u64 << 10;

    let random = core.core.open(big.ino.0).unwrap().handle;
    for offset in [9 * part, 2 * part, 6 * part] {
        core.core
            .read(big.ino.0, random, offset, 4096)
            .await
            .unwrap();
    }
    let requested = core.reads.hook().total();
    assert_eq!(requested, 3, "one part per random read, nothing ahead");

    // Reads as the kernel sends them for a sequential reader: its 128 KiB window.
    let sequential = core.core.open(big.ino.0).unwrap().handle;
    let window = 128u64 << 10;
    for k in 0..4 {
        core.core
            .read(big.ino.0, sequential, k * window, window as u32)
            .await
            .unwrap();
    }
    assert!(
        core.wait_for_read("nested/big.bin", 8 * part..9 * part)
            .await,
        "the part after a run of sequential reads is fetched before it is read"
    );
    let fetched = core.reads.hook().snapshot();
    // The parts after the random reads at 2 and 6 parts are the sequential reader's.
    let after_random = Some(10 * part..11 * part);
    assert!(
        !fetched.contains_key(&("nested/big.bin".to_owned(), after_random)),
        "no read-ahead after a random read: {fetched:?}"
    );
}

/// The files of a monolithic archive of `spec` under `ds/`.
fn monolithic_files(spec: &SyntheticDataset) -> BTreeMap<String, Vec<u8>> {
    let dir = tempfile::tempdir().unwrap();
    write_monolithic(spec, dir.path());
    snapshot(dir.path())
        .into_iter()
        .map(|(name, bytes)| (format!("ds/{name}"), bytes))
        .collect()
}

/// Little-endian unsigned entry `index` of an array of `width`-byte entries.
fn entry(array: &[u8], width: usize, index: u64) -> u64 {
    let at = index as usize * width;
    let mut bytes = [0u8; 8];
    bytes[..width].copy_from_slice(&array[at..at + width]);
    u64::from_le_bytes(bytes)
}

/// A monolithic dataset of `chunks` virtual chunks of the default rows, opened through
/// a core configured by `configure` (given the dataset's bytes): its three arrays and
/// its hint file open.
struct MonolithicReader {
    core: Core,
    mono: Monolithic,
    rows: u64,
    /// `(inode, handle)` of each array, in [`ArrayKind::ALL`] order.
    arrays: Vec<(u64, u64)>,
    hints: u64,
    dataset_bytes: u64,
}

impl MonolithicReader {
    async fn open(
        chunks: u64,
        configure: impl FnOnce(&mut MountSettings, u64),
    ) -> MonolithicReader {
        let spec = SyntheticDataset {
            rows: chunks * scdlfs::catalog::monolithic::DEFAULT_VIRTUAL_CHUNK_ROWS,
            genes: 300,
            chunk_rows: 1024, // unused: the archive is monolithic
            mean_values: 40,
            seed: 5,
        };
        let mono = Monolithic::of(&spec);
        let dataset_bytes = ArrayKind::ALL
            .iter()
            .map(|&k| mono.array(k).len() as u64)
            .sum::<u64>();
        let core = core_of(&monolithic_files(&spec), |s| configure(s, dataset_bytes)).await;
        let mut arrays = Vec::new();
        for kind in ArrayKind::ALL {
            let attr = core
                .resolve(&format!("ds/{}", kind.file_name()))
                .await
                .unwrap();
            arrays.push((attr.ino.0, core.core.open(attr.ino.0).unwrap().handle));
        }
        let hints = core.resolve(&format!("ds/{HINT_FILE}")).await.unwrap();
        let hints = core.core.open(hints.ino.0).unwrap().handle;
        MonolithicReader {
            core,
            mono,
            rows: spec.rows,
            arrays,
            hints,
            dataset_bytes,
        }
    }

    /// Reads virtual chunk `chunk` as a reader of the arrays does: its rows' offsets,
    /// then their values and column ids, in 4 KiB reads, each checked.
    async fn read_chunk(&self, chunk: u64) {
        let chunk_rows = scdlfs::catalog::monolithic::DEFAULT_VIRTUAL_CHUNK_ROWS;
        let mono = &self.mono;
        let rows = chunk * chunk_rows..(chunk + 1) * chunk_rows;
        let row_width = mono.row_ptr.len() / (self.rows as usize + 1);
        let col_width = mono.col_ptr.len() / (mono.data.len() / 4);
        let (start, end) = (
            entry(&mono.row_ptr, row_width, rows.start),
            entry(&mono.row_ptr, row_width, rows.end),
        );
        let widths = [4, row_width as u64, col_width as u64];
        for (k, kind) in ArrayKind::ALL.into_iter().enumerate() {
            let bytes = match kind {
                ArrayKind::RowPtr => rows.start * widths[k]..(rows.end + 1) * widths[k],
                _ => start * widths[k]..end * widths[k],
            };
            let (ino, handle) = self.arrays[k];
            for offset in bytes.clone().step_by(4096) {
                let len = (bytes.end - offset).min(4096);
                let got = self
                    .core
                    .core
                    .read(ino, handle, offset, len as u32)
                    .await
                    .unwrap();
                let want = &mono.array(kind)[offset as usize..(offset + len) as usize];
                assert!(got == want, "{kind:?} at {offset} of chunk {chunk}");
            }
        }
    }

    fn plan_position(&self) -> usize {
        self.core.observer.status().active_plans[0].position
    }
}

/// A reader that goes through a monolithic dataset larger than its cache in
/// the same order every epoch, one virtual chunk a step. Least-recently-used eviction
/// throws out each virtual chunk just before the reader comes back to it, and fetches
/// the whole dataset again every epoch. The plan ranks the parts of the steps it has
/// located: the second epoch fetches about what the cache cannot hold, and nothing
/// the plan needs is evicted between its prefetch and its read, nor fetched for a step
/// the reader has passed or for the end of the next epoch as it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_keeps_what_a_monolithic_reader_needs_next_in_a_cache_smaller_than_the_dataset() {
    let chunks = 24u64;
    let reader = MonolithicReader::open(chunks, |s, dataset_bytes| {
        s.part_size = 64 << 10;
        s.cache_bytes = dataset_bytes * 3 / 4;
        s.prefetch_lookahead_steps = 2;
        // No kernel reads around pages here: small margins for it.
        s.read_ahead = Some(16 << 10);
    })
    .await;
    let (core, dataset_bytes) = (&reader.core, reader.dataset_bytes);
    let cache_bytes = dataset_bytes * 3 / 4;
    let windows: String = (0..chunks).map(|c| format!("window {c}\n")).collect();
    let mut fetched = Vec::new();
    let mut twice = Vec::new();
    for epoch in 0..2 {
        let greeting = match epoch {
            0 => format!(
                "scdlfs-hints 2\nchunk-rows {}\n",
                scdlfs::catalog::monolithic::DEFAULT_VIRTUAL_CHUNK_ROWS
            ),
            _ => String::new(),
        };
        let lines = format!("{greeting}plan {epoch}\n{windows}");
        let (bytes_before, requests_before) = (
            core.observer.status().counters.bytes_fetched,
            core.reads.hook().snapshot(),
        );
        core.core.write(reader.hints, lines.as_bytes()).unwrap();
        for chunk in 0..chunks {
            reader.read_chunk(chunk).await;
        }
        fetched.push(core.observer.status().counters.bytes_fetched - bytes_before);
        let again = requested_again(&requests_before, core.reads.hook().snapshot());
        twice.push(again);
    }
    assert_a_second_epoch_reuses_the_cache("in-process", dataset_bytes, cache_bytes, &fetched);
    assert_eq!(twice, [vec![], vec![]], "parts fetched twice in one epoch");
}

/// A core over a synthetic chunked dataset `ds` of `chunks` chunks of 100 rows, with
/// its hint file open: the core, the hint handle, and each chunk's bytes.
async fn chunked_with_hints(
    chunks: u32,
    seed: u64,
    configure: impl FnOnce(&mut MountSettings),
) -> (Core, u64, Vec<u64>) {
    let spec = SyntheticDataset {
        rows: chunks as u64 * 100,
        genes: 3_000,
        chunk_rows: 100,
        mean_values: 60,
        seed,
    };
    chunked_spec_with_hints(&spec, |settings, _| configure(settings)).await
}

/// A core over the chunked dataset `spec` as `ds`, with its hint file open: the core,
/// the hint handle, and each chunk's bytes, which `configure` is given too.
async fn chunked_spec_with_hints(
    spec: &SyntheticDataset,
    configure: impl FnOnce(&mut MountSettings, &[u64]),
) -> (Core, u64, Vec<u64>) {
    let files = chunked_files(spec, "ds");
    let chunks = spec.rows.div_ceil(spec.chunk_rows as u64);
    let chunk_sizes: Vec<u64> = (0..chunks)
        .map(|c| {
            let dir = format!("ds/chunk_{c:05}/");
            let of_chunk = files.iter().filter(|(name, _)| name.starts_with(&dir));
            of_chunk.map(|(_, bytes)| bytes.len() as u64).sum()
        })
        .collect();
    let core = core_of(&files, |settings| configure(settings, &chunk_sizes)).await;
    let hints = core.resolve(&format!("ds/{HINT_FILE}")).await.unwrap();
    let hints = core.core.open(hints.ino.0).unwrap().handle;
    (core, hints, chunk_sizes)
}

/// A reader that announces a few steps ahead, as the sampler does, goes through a
/// dataset larger than the cache in the same order every epoch. Least-recently-used
/// eviction would throw out each chunk just before the reader comes back to it. The
/// chunks a plan has read this epoch go first: the second epoch keeps what it has not
/// read yet, and fetches little more than what the cache cannot hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_read_this_epoch_are_evicted_before_those_not_read_yet() {
    let (chunks, cached_chunks) = (30u32, 20usize);
    let (core, hints, chunk_sizes) = chunked_with_hints(chunks, 11, |s| {
        s.max_cached_chunks = Some(cached_chunks);
        s.prefetch_lookahead_steps = 1;
    })
    .await;
    let chunk_bytes = |c: u32| chunk_sizes[c as usize];
    let mut fetched = Vec::new();
    for epoch in 0..2 {
        let greeting = if epoch == 0 { "scdlfs-hints 1\n" } else { "" };
        let lines = format!("{greeting}plan {epoch}\nwindow 0\nwindow 1\n");
        core.core.write(hints, lines.as_bytes()).unwrap();
        let before = core.observer.status().counters.bytes_fetched;
        for chunk in 0..chunks {
            for kind in ArrayKind::ALL {
                let path = format!("ds/{CHUNKED_DIR}/chunk_{chunk:05}/{}", kind.file_name());
                core.read_all(&path, 16 << 10).await;
            }
            if chunk + 2 < chunks {
                let next = format!("window {}\n", chunk + 2);
                core.core.write(hints, next.as_bytes()).unwrap();
            }
        }
        fetched.push(core.observer.status().counters.bytes_fetched - before);
    }
    let dataset: u64 = (0..chunks).map(chunk_bytes).sum();
    let floor = dataset - (0..cached_chunks as u32).map(chunk_bytes).sum::<u64>();
    eprintln!("fetched {fetched:?} of {dataset}; floor {floor}");
    // Room for the step being read, the one just left, the one ahead and the parts of
    // their neighbours the kernel reads around into is made before any chunk is done:
    // each costs a fetch more, and more under load, when the reader's position lags.
    // Least recently used, the epoch would fetch it all again.
    assert!(
        fetched[1].saturating_sub(floor) <= (dataset - floor) / 2,
        "the second epoch keeps the chunks it has not read yet"
    );
}

/// A reader goes through a dataset twice as large as the cache in windows of four
/// chunks, prefetched three windows ahead: in order, then in a new order whose every
/// window mixes chunks the cache holds with chunks it does not, the whole epoch
/// announced at its start. A prefetch that evicts what the new order reads sooner than
/// the part it brings (with the lookahead as large as the cache, the steps just ahead)
/// makes the epoch fetch the whole dataset or more; one that waits for room keeps some
/// of what the cache held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefetch_in_a_new_order_keeps_what_the_epoch_reads_later() {
    let (chunks, cached_chunks) = (32u32, 16usize);
    let (core, hints, chunk_sizes) = chunked_with_hints(chunks, 13, |s| {
        s.max_cached_chunks = Some(cached_chunks);
        s.prefetch_lookahead_steps = 3;
    })
    .await;
    // Epoch 0: 0-3, 4-7, ...; epoch 1: {0, 8, 16, 24}, {1, 9, 17, 25}, ...
    let in_order: Vec<Vec<u32>> = (0..8).map(|w| (4 * w..4 * w + 4).collect()).collect();
    let interleaved: Vec<Vec<u32>> = (0..8)
        .map(|w| (0..4).map(|i| w + 8 * i).collect())
        .collect();
    let mut fetched = Vec::new();
    for (epoch, windows) in [in_order, interleaved].iter().enumerate() {
        let greeting = if epoch == 0 { "scdlfs-hints 1\n" } else { "" };
        let steps: String = windows
            .iter()
            .map(|w| {
                format!(
                    "window {}\n",
                    w.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
                )
            })
            .collect();
        core.core
            .write(hints, format!("{greeting}plan {epoch}\n{steps}").as_bytes())
            .unwrap();
        let before = core.observer.status().counters.bytes_fetched;
        for window in windows {
            for &chunk in window {
                for kind in ArrayKind::ALL {
                    let path = format!("ds/{CHUNKED_DIR}/chunk_{chunk:05}/{}", kind.file_name());
                    core.read_all(&path, 16 << 10).await;
                }
            }
        }
        fetched.push(core.observer.status().counters.bytes_fetched - before);
    }
    // No cache of this many chunks holds more than the largest of them.
    let mut sizes = chunk_sizes;
    sizes.sort_unstable();
    let dataset: u64 = sizes.iter().sum();
    let floor = dataset - sizes.iter().rev().take(cached_chunks).sum::<u64>();
    eprintln!("fetched {fetched:?} of {dataset}; floor {floor}");
    // The margins the kernel reads around chunks, and the room the first steps take
    // before any chunk is done, may cost what the cache saves, and a tenth more.
    assert!(
        fetched[1] <= dataset + dataset / 10,
        "the second epoch fetched {:.2}x the dataset: what the cache held was evicted before \
         it was read",
        fetched[1] as f64 / dataset as f64
    );
}

/// Large chunks, as issue 29's bench reads them: eight chunks of many parts each, read
/// in windows of two with the whole epoch announced at its start, and a cache of half
/// the dataset: room for the window being read and the next one, no more. Then a new
/// order. The first epoch fetches about the dataset: the step just left gives its room
/// to the window being read and the next one (protected like the current step, it left
/// them none, and their parts were fetched into memory, dropped and fetched again: 3.4
/// times the dataset). The second reuses some of what the cache held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_half_the_dataset_cached_windows_of_large_chunks_are_fetched_about_once() {
    let spec = SyntheticDataset {
        rows: 8 * 1_000,
        genes: 3_000,
        chunk_rows: 1_000,
        mean_values: 300,
        seed: 17,
    };
    let (core, hints, chunk_sizes) = chunked_spec_with_hints(&spec, |s, sizes| {
        s.cache_bytes = sizes.iter().sum::<u64>() / 2;
        s.part_size = 64 << 10;
        // No kernel reads around pages here: small margins for it.
        s.read_ahead = Some(16 << 10);
    })
    .await;
    let orders = [
        [[0, 1], [2, 3], [4, 5], [6, 7]],
        [[5, 2], [7, 0], [3, 6], [1, 4]],
    ];
    let mut fetched = Vec::new();
    for (epoch, windows) in orders.iter().enumerate() {
        let greeting = if epoch == 0 { "scdlfs-hints 1\n" } else { "" };
        let steps: String = windows
            .iter()
            .map(|[a, b]| format!("window {a} {b}\n"))
            .collect();
        let before = core.observer.status().counters.bytes_fetched;
        core.core
            .write(hints, format!("{greeting}plan {epoch}\n{steps}").as_bytes())
            .unwrap();
        for chunk in windows.iter().flatten() {
            for kind in ArrayKind::ALL {
                let path = format!("ds/{CHUNKED_DIR}/chunk_{chunk:05}/{}", kind.file_name());
                core.read_all(&path, 64 << 10).await;
            }
        }
        fetched.push(core.observer.status().counters.bytes_fetched - before);
    }
    let dataset: u64 = chunk_sizes.iter().sum();
    let floor = dataset - dataset / 2;
    eprintln!("fetched {fetched:?} of {dataset}; floor {floor}");
    // A part of the current step that finds no room (the part files' headers make two
    // steps a little more than the cache) evicts a whole chunk of the next step, now
    // and then: one chunk of eight fetched twice.
    assert!(
        fetched[0] <= dataset * 5 / 4,
        "the first epoch fetched {:.2}x the dataset",
        fetched[0] as f64 / dataset as f64
    );
    // Each step's room comes from the cached chunks read last: the next step is
    // fetched while the current one is read, so it evicts what later steps read (1.4 to
    // 1.75 times the floor, measured); issue 29's target of 1.1 is not met.
    assert!(
        fetched[1] <= dataset + dataset / 10,
        "the second epoch fetched {:.2}x the floor",
        fetched[1] as f64 / floor as f64
    );
}

/// The reader of a monolithic dataset is followed by the row offsets it reads itself,
/// not only through the steps the prefetch has located: with no lookahead the prefetch
/// locates the current step alone, and a reader that moves on (as one that outruns
/// a lagging prefetch does) is found at its new step by its reads of values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monolithic_reader_is_followed_before_the_prefetch_locates_its_step() {
    let reader = MonolithicReader::open(16, |s, _| s.prefetch_lookahead_steps = 0).await;
    let windows: String = (0..16).map(|c| format!("window {c}\n")).collect();
    let lines = format!("scdlfs-hints 2\nchunk-rows 1024\nplan 0\n{windows}");
    reader
        .core
        .core
        .write(reader.hints, lines.as_bytes())
        .unwrap();
    reader.read_chunk(0).await;
    assert_eq!(reader.plan_position(), 0);
    reader.read_chunk(9).await;
    assert_eq!(
        reader.plan_position(),
        9,
        "the reader's values name its step"
    );
    reader.read_chunk(10).await;
    assert_eq!(reader.plan_position(), 10);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

    /// The flat view read through the real read path, against the monolithic arrays
    /// built without scdlfs or scdl-format: any dataset shape, any byte range.
    #[test]
    fn any_range_of_any_flat_file_is_the_monolithic_bytes(
        rows in 1u64..400,
        genes in 2u32..600,
        chunk_rows in 1u32..90,
        mean_values in proptest::prop_oneof![0u32..30, 150u32..300],
        seed in 0u64..1000,
        ranges in proptest::collection::vec((0.0f64..1.0, 0u32..70_000), 1..6),
    ) {
        let spec = scdlfs::synthetic::SyntheticDataset { rows, genes, chunk_rows, mean_values, seed };
        let dir = tempfile::tempdir().unwrap();
        spec.write_chunked(dir.path()).unwrap();
        let files: BTreeMap<String, Vec<u8>> = snapshot(dir.path())
            .into_iter()
            .map(|(name, bytes)| (format!("ds/{name}"), bytes))
            .collect();
        let mono = Monolithic::of(&spec);
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let core = core_of(&files, |_| {}).await;
            for kind in ArrayKind::ALL {
                let want = mono.array(kind);
                let attr = core.resolve(&format!("ds/{}", kind.file_name())).await.unwrap();
                assert_eq!(attr.size, want.len() as u64, "{kind:?}");
                let handle = core.core.open(attr.ino.0).unwrap().handle;
                for &(at, len) in &ranges {
                    let offset = (at * want.len() as f64) as u64;
                    let got = core.core.read(attr.ino.0, handle, offset, len).await.unwrap();
                    let end = (offset as usize + len as usize).min(want.len());
                    assert_eq!(got, &want[offset as usize..end], "{kind:?} at {offset}+{len}");
                }
            }
        });
    }
}

/// The prefetcher has no timer: it acts when something it depends on changes. These
/// tests run on a paused clock and never let the runtime idle, so no timer can fire;
/// whatever they wait for must follow from the event alone.
mod prefetcher_events {
    use super::*;

    fn fetched(core: &Core, key: &str) -> bool {
        core.reads.hook().snapshot().keys().any(|(k, _)| k == key)
    }

    fn data_of(chunk: u32) -> String {
        format!("ds/chunk_{chunk:05}/{}", ArrayKind::Data.file_name())
    }

    async fn plan(core: &Core, lines: &str) -> u64 {
        let hints = core.resolve(&format!("ds/{HINT_FILE}")).await.unwrap();
        let handle = core.core.open(hints.ino.0).unwrap().handle;
        core.core.write(handle, lines.as_bytes()).unwrap();
        handle
    }

    /// One download at a time (so at most two in flight), and a step of several parts:
    /// the plan's second step is reached only through downloads ending.
    #[tokio::test(start_paused = true)]
    async fn a_download_ending_starts_the_next_prefetch() {
        let core = core_of(&dataset_files("ds"), |s| {
            s.max_concurrent_requests = 1;
            s.prefetch_lookahead_steps = 1;
        })
        .await;
        plan(
            &core,
            "scdlfs-hints 1\nplan 0\nwindow 5\nwindow 2\nwindow 7\n",
        )
        .await;
        assert!(
            without_timers(|| fetched(&core, &data_of(2))).await,
            "the second step is prefetched: {:?}",
            core.reads.hook().snapshot()
        );
        assert!(!fetched(&core, &data_of(7)), "beyond the lookahead");
    }

    /// Lookahead 1: the third step is fetched only once reads of the second move the
    /// reader's position there.
    #[tokio::test(start_paused = true)]
    async fn a_reader_moving_on_starts_the_next_steps() {
        let core = core_of(&dataset_files("ds"), |s| s.prefetch_lookahead_steps = 1).await;
        plan(
            &core,
            "scdlfs-hints 1\nplan 0\nwindow 5\nwindow 2\nwindow 7\n",
        )
        .await;
        assert!(without_timers(|| fetched(&core, &data_of(2))).await);
        assert!(!fetched(&core, &data_of(7)), "beyond the lookahead");
        let raw = format!(
            "ds/{CHUNKED_DIR}/chunk_00002/{}",
            ArrayKind::Data.file_name()
        );
        let attr = core.resolve(&raw).await.unwrap();
        let handle = core.core.open(attr.ino.0).unwrap().handle;
        for offset in [0, 4096, 8192] {
            core.core
                .read(attr.ino.0, handle, offset, 4096)
                .await
                .unwrap();
        }
        assert!(
            without_timers(|| fetched(&core, &data_of(7))).await,
            "the step after the reader's new one is prefetched"
        );
    }

    /// The ranges a store was asked for of `key`.
    fn requested(core: &Core, key: &str) -> Vec<std::ops::Range<u64>> {
        let reads = core.reads.hook().snapshot();
        reads
            .into_keys()
            .filter(|(k, _)| k == key)
            .map(|(_, range)| range.expect("ranged reads only"))
            .collect()
    }

    /// A window's readers map the flat arrays, and the kernel reads around the rows
    /// they touch, across the window's chunk edges into the neighbouring chunks. Those
    /// few bytes are fetched on their own, not as their parts (here each a whole array,
    /// which would be the neighbour fetched for its own window, long before it), and a
    /// read of them is served from memory, without another request.
    #[tokio::test(start_paused = true)]
    async fn a_window_fetches_the_edges_of_its_neighbours_not_their_parts() {
        let files = dataset_files("ds");
        let core = core_of(&files, |s| {
            s.part_size = 1 << 20;
            s.read_ahead = Some(32 << 10);
            s.prefetch_lookahead_steps = 0;
        })
        .await;
        plan(&core, "scdlfs-hints 1\nplan 0\nwindow 5\n").await;
        let raw = |chunk: u32, kind: ArrayKind| format!("ds/chunk_{chunk:05}/{}", kind.file_name());
        let edges = [
            (raw(4, ArrayKind::Data), true),
            (raw(4, ArrayKind::ColPtr), true),
            (raw(6, ArrayKind::Data), false),
            (raw(6, ArrayKind::ColPtr), false),
        ];
        assert!(
            without_timers(|| edges.iter().all(|(key, _)| fetched(&core, key))).await,
            "the edges are prefetched: {:?}",
            core.reads.hook().snapshot()
        );
        for (key, at_end) in &edges {
            let size = files[key].len() as u64;
            let ranges = requested(&core, key);
            assert_eq!(ranges.len(), 1, "{key}: {ranges:?}");
            let range = &ranges[0];
            let at_its_edge = if *at_end {
                range.end == size
            } else {
                range.start == 0
            };
            assert!(
                at_its_edge && range.end - range.start < size,
                "{key}: {range:?} of {size}"
            );
        }
        // The first 16 KiB of chunk 6's values, as the kernel's read-around would ask.
        let key = &edges[2].0;
        let path = format!(
            "ds/{CHUNKED_DIR}/chunk_00006/{}",
            ArrayKind::Data.file_name()
        );
        let attr = core.resolve(&path).await.unwrap();
        let handle = core.core.open(attr.ino.0).unwrap().handle;
        let before = core.reads.hook().total();
        let got = core
            .core
            .read(attr.ino.0, handle, 0, 16 << 10)
            .await
            .unwrap();
        assert_eq!(got, files[key][..16 << 10]);
        assert_eq!(
            core.reads.hook().total(),
            before,
            "served from the edge in memory"
        );
    }

    /// A `rows` step: the prefetcher fetches the chunk's row offsets, checks them once
    /// they are local, and only then knows which values to fetch.
    #[tokio::test(start_paused = true)]
    async fn row_offsets_checked_locate_the_values_to_prefetch() {
        let core = core_of(&dataset_files("ds"), |_| {}).await;
        // Rows 1300..1310 lie in chunk 4 (300 rows a chunk).
        plan(&core, "scdlfs-hints 1\nplan 0\nrows 1300 1310\n").await;
        assert!(
            without_timers(|| fetched(&core, &data_of(4))).await,
            "the values of the rows are prefetched: {:?}",
            core.reads.hook().snapshot()
        );
    }
}

/// `--metadata-ttl`: listings made again once it has passed, on a paused clock that only
/// the tests move. A changed object or dataset is a new inode for new lookups; a handle
/// open on the old one reads the old version or fails, never the new bytes.
mod metadata_ttl {
    use super::*;

    const TTL: Duration = Duration::from_secs(60);

    async fn put(core: &Core, name: &str, bytes: &[u8]) {
        let payload = PutPayload::from(Bytes::from(bytes.to_vec()));
        core.memory
            .put(&ObjectPath::from(name), payload)
            .await
            .unwrap();
    }

    async fn passes(ttl: Duration) {
        tokio::time::advance(ttl + Duration::from_millis(1)).await;
    }

    fn counters(core: &Core) -> scdlfs::metrics::MetricsSnapshot {
        core.observer.status().counters
    }

    /// An npy file's payload: what follows its (version 1) header.
    fn payload(npy: &[u8]) -> &[u8] {
        &npy[10 + u16::from_le_bytes([npy[8], npy[9]]) as usize..]
    }

    #[tokio::test(start_paused = true)]
    async fn a_replaced_object_opens_as_its_new_version_once_the_ttl_passed() {
        let files = plain_files();
        let core = core_of(&files, |s| s.metadata_ttl = Some(TTL)).await;
        let (name, unchanged) = ("nested/big.bin", "nested/deeper/three_parts.bin");
        let old = core.resolve(name).await.unwrap();
        let kept = core.resolve(unchanged).await.unwrap();
        let handle = core.core.open(old.ino.0).unwrap().handle;
        let first_part = core
            .core
            .read(old.ino.0, handle, 0, 64 << 10)
            .await
            .unwrap();
        assert_eq!(first_part, files[name][..64 << 10]);
        assert!(
            without_timers(|| core.observer.status().downloads_in_flight == 0).await,
            "the first part is cached before the clock moves"
        );

        let new_bytes = pattern(77, files[name].len());
        put(&core, name, &new_bytes).await;
        passes(TTL / 2).await;
        assert_eq!(
            core.resolve(name).await.unwrap().ino,
            old.ino,
            "within the TTL the listing stands"
        );
        passes(TTL / 2).await;
        let new = core.resolve(name).await.unwrap();
        assert_ne!(new.ino, old.ino, "a new version is a new inode");
        assert_eq!(core.read_all(name, 100_000).await, new_bytes);
        let again = core.core.read(old.ino.0, handle, 0, 64 << 10).await;
        assert_eq!(
            again.unwrap(),
            files[name][..64 << 10],
            "the old handle's cached part is the old version"
        );
        let uncached = core.core.read(old.ino.0, handle, 5 << 16, 4096).await;
        assert!(
            matches!(uncached, Err(FsError::ObjectChanged { .. })),
            "the old version is gone from the store: {uncached:?}"
        );
        let c = counters(&core);
        assert_eq!(
            (c.listings_refreshed, c.objects_replaced),
            (2, 1),
            "the root and nested/ listed again, one object in a new version: {c:?}"
        );
        let still = core.resolve(unchanged).await.unwrap();
        assert_eq!(still.ino, kept.ino, "an unchanged object keeps its inode");
    }

    #[tokio::test(start_paused = true)]
    async fn new_datasets_appear_and_vanished_objects_go_once_the_ttl_passed() {
        let mut files = plain_files();
        files.extend(dataset_files("ds"));
        let core = core_of(&files, |s| s.metadata_ttl = Some(TTL)).await;
        let tiny = core.resolve("tiny.txt").await.unwrap();
        assert!(matches!(
            core.resolve("ds2/data.npy").await,
            Err(FsError::NotFound)
        ));
        for (name, bytes) in dataset_files("ds2") {
            put(&core, &name, &bytes).await;
        }
        core.memory
            .delete(&ObjectPath::from("tiny.txt"))
            .await
            .unwrap();
        passes(TTL).await;
        core.assert_serves_small_dataset("ds2", 128 << 10).await;
        assert!(core.resolve(&format!("ds2/{HINT_FILE}")).await.is_ok());
        assert!(matches!(
            core.resolve("tiny.txt").await,
            Err(FsError::NotFound)
        ));
        assert!(
            core.core.getattr(tiny.ino.0).is_ok(),
            "a vanished file's inode stays for handles still open"
        );
        let ds = core.resolve("ds/data.npy").await.unwrap();
        passes(TTL).await;
        assert_eq!(
            core.resolve("ds/data.npy").await.unwrap().ino,
            ds.ino,
            "an unchanged dataset keeps its inodes"
        );
        assert_eq!(counters(&core).datasets_rediscovered, 0);
    }

    /// A chunk's values replaced (same size, so the dataset stays consistent): the
    /// dataset is discovered again as a whole; a handle on the old flat file never
    /// gets a byte of the new chunk.
    #[tokio::test(start_paused = true)]
    async fn a_dataset_whose_chunk_changed_is_discovered_again_whole() {
        let files = dataset_files("ds");
        let core = core_of(&files, |s| s.metadata_ttl = Some(TTL)).await;
        let old_flat = core.read_all("ds/data.npy", 1 << 20).await;
        let old = core.resolve("ds/data.npy").await.unwrap();
        let handle = core.core.open(old.ino.0).unwrap().handle;
        let old_row_ptr = core.resolve("ds/row_ptr.npy").await.unwrap();

        let chunk = "ds/chunk_00001/data.npy";
        let old_chunk = payload(&files[chunk]).to_vec();
        let mut new_file = files[chunk].clone();
        let header_len = new_file.len() - old_chunk.len();
        new_file[header_len..].iter_mut().for_each(|b| *b ^= 0xff);
        put(&core, chunk, &new_file).await;
        passes(TTL).await;

        let new = core.resolve("ds/data.npy").await.unwrap();
        assert_ne!(new.ino, old.ino);
        let at = old_flat
            .windows(old_chunk.len())
            .position(|w| w == old_chunk)
            .expect("chunk 1's values in the flat array");
        let mut want = old_flat.clone();
        want[at..at + old_chunk.len()].copy_from_slice(payload(&new_file));
        assert_eq!(core.read_all("ds/data.npy", 100_000).await, want);
        // The old handle's parts were all cached before the change: it reads the old
        // version whole, chunk 1 included.
        let mut got = Vec::new();
        while (got.len() as u64) < old.size {
            got.extend(
                core.core
                    .read(old.ino.0, handle, got.len() as u64, 1 << 17)
                    .await
                    .unwrap(),
            );
        }
        assert_eq!(got, old_flat);
        let c = counters(&core);
        assert_eq!(
            (c.datasets_rediscovered, c.objects_replaced),
            (1, 1),
            "{c:?}"
        );
        let row_ptr = core.resolve("ds/row_ptr.npy").await.unwrap();
        assert_ne!(
            row_ptr.ino, old_row_ptr.ino,
            "every flat file of the dataset is new"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_ttl_the_first_listing_stands_for_the_mount() {
        let mut files = plain_files();
        files.extend(dataset_files("ds"));
        let core = core_of(&files, |_| {}).await;
        let big = core.resolve("nested/big.bin").await.unwrap();
        let flat = core.resolve("ds/data.npy").await.unwrap();
        put(&core, "nested/big.bin", &pattern(5, 10)).await;
        put(
            &core,
            "ds/chunk_00000/data.npy",
            &files["ds/chunk_00000/data.npy"],
        )
        .await;
        for (name, bytes) in dataset_files("ds2") {
            put(&core, &name, &bytes).await;
        }
        passes(Duration::from_secs(365 * 24 * 3600)).await;
        let still = core.resolve("nested/big.bin").await.unwrap();
        assert_eq!((still.ino, still.size), (big.ino, big.size));
        assert_eq!(core.resolve("ds/data.npy").await.unwrap().ino, flat.ino);
        assert!(matches!(core.resolve("ds2").await, Err(FsError::NotFound)));
        let c = counters(&core);
        assert_eq!(
            (
                c.listings_refreshed,
                c.objects_replaced,
                c.datasets_rediscovered
            ),
            (0, 0, 0)
        );
    }
}

/// What the read-around stored into the "kernel": (inode, offset, bytes), in order, a
/// store that continues the one before joined to it (how many stores a run of pages
/// takes is the pusher's business).
#[derive(Default)]
struct RecordedPageCache(parking_lot::Mutex<Vec<(u64, u64, Vec<u8>)>>);

impl PageCache for RecordedPageCache {
    fn store(&self, ino: u64, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
        let mut stored = self.0.lock();
        match stored.last_mut() {
            Some((last_ino, last_offset, last))
                if *last_ino == ino && *last_offset + last.len() as u64 == offset =>
            {
                last.extend_from_slice(bytes)
            }
            _ => stored.push((ino, offset, bytes.to_vec())),
        }
        Ok(())
    }
}

impl RecordedPageCache {
    /// Waits (at most 10 s) for `n` stores, then a little more for any beyond them, and
    /// takes them all.
    async fn take(&self, n: usize) -> Vec<(u64, u64, Vec<u8>)> {
        let started = Instant::now();
        while self.0.lock().len() < n && started.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        std::mem::take(&mut *self.0.lock())
    }
}

/// A read the disk cache serves offers the aligned window around it, and the pages of
/// that window the kernel was not given (by a read it asked for, or a push), exactly
/// the file's bytes, go into the page cache: without a request to the store. Reads that
/// waited on the network, and windows with a part not local, store nothing; a read of
/// a page given before (the kernel dropped it) makes the whole window go again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_served_from_the_cache_stores_the_pages_of_its_window_the_kernel_lacks() {
    let page = 4096u64;
    // Windows of 2 MiB: a pusher stores them a slice at a time.
    let part = 512u64 << 10;
    let window = 4 * part;
    // Part 10 is a page and a bit: the last window ends inside a page.
    let blob = pattern(9, (10 * part + page + 1000) as usize);
    let end = blob.len() as u64;
    let partial = pattern(10, (4 * part) as usize);
    let files = BTreeMap::from([
        ("blob.bin".to_string(), blob.clone()),
        ("partial.bin".to_string(), partial),
    ]);
    // A kernel read-ahead of two pages: the margins a read prefetches around itself
    // stay inside its part.
    let core = core_of(&files, |s| {
        s.part_size = part;
        s.cache_read_around = window;
        s.read_ahead = Some(2 * page);
    })
    .await;
    let pages = Arc::new(RecordedPageCache::default());
    core.core.read_around().connect(pages.clone());
    let ino = core.resolve("blob.bin").await.unwrap().ino.0;
    // Each read through a handle of its own, so that none looks sequential.
    let read = |offset: u64, len: u32| {
        let core = &core.core;
        async move {
            let h = core.open(ino).unwrap().handle;
            let bytes = core.read(ino, h, offset, len).await.unwrap();
            core.release(h);
            bytes
        }
    };
    let expect = |from: u64, to: u64| (ino, from, blob[from as usize..to as usize].to_vec());
    // What a push of `window` stores: its bytes but the pages at `given`, in runs.
    let all_but = |window: std::ops::Range<u64>, given: &[u64]| {
        let mut given = given.to_vec();
        given.sort();
        let (mut runs, mut from) = (Vec::new(), window.start);
        for at in given {
            if at > from {
                runs.push(expect(from, at));
            }
            from = at + page;
        }
        if from < window.end {
            runs.push(expect(from, window.end));
        }
        runs
    };

    // One page of each part: every read waits on the network, and its part lands in
    // the cache.
    let first_read_of = |index: u64| index * part + if index < 10 { part / 2 } else { 0 };
    for index in [3, 7, 1, 9, 5, 0, 8, 2, 10, 4, 6] {
        read(first_read_of(index), page as u32).await;
    }
    core.settle().await;
    assert!(
        pages.take(0).await.is_empty(),
        "reads from the network push nothing"
    );

    // Its window's other three parts are not local: nothing is pushed, nothing fetched.
    let partial_ino = core.resolve("partial.bin").await.unwrap().ino.0;
    for offset in [0, 8192] {
        let h = core.core.open(partial_ino).unwrap().handle;
        core.core.read(partial_ino, h, offset, 4096).await.unwrap();
        core.core.release(h);
        core.settle().await;
    }
    let requests = core.reads.hook().total();
    assert!(
        pages.take(0).await.is_empty(),
        "a window not all local is not pushed"
    );

    // A read in the second window: every page of it but those the kernel asked for.
    let at = window + part / 4;
    assert_eq!(read(at, 4096).await, blob[at as usize..at as usize + 4096]);
    let asked: Vec<u64> = (4..8).map(first_read_of).chain([at]).collect();
    let pushed = all_but(window..2 * window, &asked);
    assert_eq!(pages.take(pushed.len()).await, pushed);
    // The kernel asks for a page it was given: it dropped pages of that window, so all
    // of them go again but that one.
    read(first_read_of(5), 4096).await;
    let pushed = all_but(window..2 * window, &[first_read_of(5)]);
    assert_eq!(pages.take(pushed.len()).await, pushed);
    // The last window ends with the file.
    let at = 2 * window + 3 * page;
    read(at, 100).await;
    let asked: Vec<u64> = (8..11).map(first_read_of).chain([at]).collect();
    let pushed = all_but(2 * window..end, &asked);
    assert_eq!(
        pushed.last().unwrap().2.len() as u64,
        end - 10 * part - page
    );
    assert_eq!(pages.take(pushed.len()).await, pushed);
    assert_eq!(core.reads.hook().total(), requests, "pushes fetch nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_of_values_that_waits_asks_for_the_same_elements_column_ids_beside_it() {
    let files = dataset_files("ds");
    let core = core_of(&files, |_| {}).await;
    let data = core.resolve("ds/data.npy").await.unwrap();
    let handle = core.core.open(data.ino.0).unwrap().handle;
    let chunk0 = files["ds/chunk_00000/data.npy"].len() as u64;
    let chunk1_values = files["ds/chunk_00001/data.npy"].len() as u64 / 4;
    let chunk1_ids = files["ds/chunk_00001/col_ptr.npy"].len() as u64;
    let id_width = chunk1_ids / chunk1_values;
    // A page of values in the middle of chunk 1, as a fault reads it.
    let offset = (chunk0 + chunk1_values * 2).next_multiple_of(4096);
    let read = core
        .core
        .read(data.ino.0, handle, offset, 4096)
        .await
        .unwrap();
    assert_eq!(read.len(), 4096);
    let elements = (offset - chunk0) / 4..(offset - chunk0 + 4096) / 4;
    let ids = elements.start * id_width..elements.end * id_width;
    assert!(
        core.wait_for_read("ds/chunk_00001/col_ptr.npy", ids.clone())
            .await,
        "the column ids of the same elements are asked for: {:?}",
        core.reads.hook().snapshot()
    );
    let asked: Vec<_> = core
        .reads
        .hook()
        .snapshot()
        .into_keys()
        .filter(|(key, _)| key == "ds/chunk_00001/col_ptr.npy")
        .collect();
    assert!(
        asked.iter().all(|(_, range)| {
            let range = range.clone().unwrap();
            range.end - range.start < chunk1_ids.min(64 << 10)
        }),
        "on their own, not as their part: {asked:?}"
    );
}

/// What one user's hint writers may make the daemon do is bounded per handle and per
/// user (`prefetch::budget`), and other users are unaffected by a writer over its
/// bounds. Users 1000 and 1001 are not the mounting user (root, running the tests).
mod hint_budgets {
    use super::*;
    use scdlfs::prefetch::budget::{
        MAX_HANDLE_WORK, MAX_HINT_HANDLES_PER_USER, MAX_USER_WORK, PLAN_START_BURST,
    };
    use scdlfs::status::Status;

    const CHUNKS: u64 = 1000;
    const WRITER: u32 = 1000;
    const OTHER: u32 = 1001;

    /// A chunked dataset of `CHUNKS` chunks of one row each, with no prefetch (what
    /// is measured is what the plans may hold).
    async fn core_of_many_chunks() -> Core {
        let spec = SyntheticDataset {
            rows: CHUNKS,
            genes: 50,
            chunk_rows: 1,
            mean_values: 2,
            seed: 3,
        };
        core_of(&chunked_files(&spec, "ds"), |s| {
            s.prefetch_lookahead_steps = 0
        })
        .await
    }

    /// A step of 16 row ranges, each over the whole dataset: 16 entries, 16,000 chunks
    /// of work.
    fn wide_step() -> String {
        let ranges = vec![format!("0 {CHUNKS}"); 16].join(" ");
        format!("rows {ranges}\n")
    }
    const WIDE_STEP_WORK: u64 = 16 * CHUNKS;

    async fn open_hints(core: &Core, uid: u32) -> Result<u64, FsError> {
        let hints = core.resolve(&format!("ds/{HINT_FILE}")).await.unwrap();
        core.core.open_as(hints.ino.0, uid).map(|o| o.handle)
    }

    fn steps(n: u64) -> String {
        wide_step().repeat(n as usize)
    }

    async fn status_as(core: &Core, uid: u32) -> Status {
        let json = core
            .core
            .getxattr(ROOT, OsStr::new("user.scdlfs.status"), uid)
            .await
            .unwrap();
        serde_json::from_slice(&json).unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_handles_plan_is_held_to_its_work_not_its_entries() {
        let core = core_of_many_chunks().await;
        let handle = open_hints(&core, WRITER).await.unwrap();
        let fits = MAX_HANDLE_WORK / WIDE_STEP_WORK;
        core.core
            .write(
                handle,
                format!("scdlfs-hints 1\nplan 0\n{}", steps(fits)).as_bytes(),
            )
            .unwrap();
        assert!(
            matches!(
                core.core.write(handle, steps(1).as_bytes()),
                Err(FsError::InvalidHint(_))
            ),
            "{} entries, but {} chunks of work over the handle's {MAX_HANDLE_WORK}",
            16 * (fits + 1),
            WIDE_STEP_WORK * (fits + 1)
        );
        let plans = core.observer.status().active_plans;
        assert_eq!(
            plans[0].steps as u64, fits,
            "the refused write changed nothing"
        );
        core.core.write(handle, b"window 1\n").unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_users_plans_are_held_to_the_users_work_and_other_users_are_unaffected() {
        let core = core_of_many_chunks().await;
        let per_handle = MAX_HANDLE_WORK / WIDE_STEP_WORK;
        let mut spent = 0;
        while spent + per_handle * WIDE_STEP_WORK <= MAX_USER_WORK {
            let handle = open_hints(&core, WRITER).await.unwrap();
            let lines = format!("scdlfs-hints 1\nplan 0\n{}", steps(per_handle));
            core.core.write(handle, lines.as_bytes()).unwrap();
            spent += per_handle * WIDE_STEP_WORK;
        }
        let left = (MAX_USER_WORK - spent) / WIDE_STEP_WORK;
        let last = open_hints(&core, WRITER).await.unwrap();
        let refused = core.core.write(
            last,
            format!("scdlfs-hints 1\nplan 0\n{}", steps(left + 1)).as_bytes(),
        );
        assert!(
            matches!(refused, Err(FsError::InvalidHint(_))),
            "over the user's {MAX_USER_WORK} chunks of work though within its handle's"
        );
        let other = open_hints(&core, OTHER).await.unwrap();
        core.core
            .write(
                other,
                format!("scdlfs-hints 1\nplan 0\n{}", steps(per_handle)).as_bytes(),
            )
            .expect("another user's writer has a budget of its own");
        let refusals = core.observer.status().hint_refusals;
        assert_eq!(
            refusals
                .iter()
                .map(|r| (r.uid, r.refused))
                .collect::<Vec<_>>(),
            vec![(WRITER, 1)],
            "the refusal is shown in the status: {refusals:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_user_holds_a_bounded_number_of_hint_handles_and_gets_ebusy_beyond() {
        let core = core_of_many_chunks().await;
        let mut handles = Vec::new();
        for _ in 0..MAX_HINT_HANDLES_PER_USER {
            handles.push(open_hints(&core, WRITER).await.unwrap());
        }
        let refused = open_hints(&core, WRITER).await.unwrap_err();
        assert!(
            matches!(refused, FsError::TooManyHintHandles { .. }),
            "{refused:?}"
        );
        // Not EMFILE: the process is not at its own limit of open files.
        assert_eq!(scdlfs::fs::errno::errno(&refused), fuser::Errno::EBUSY);
        assert!(open_hints(&core, OTHER).await.is_ok(), "another user");
        let data = core.resolve("ds/data.npy").await.unwrap();
        assert!(
            core.core.open_as(data.ino.0, WRITER).is_ok(),
            "data files are not counted"
        );
        core.core.release(handles.pop().unwrap());
        assert!(
            open_hints(&core, WRITER).await.is_ok(),
            "a closed handle frees its place"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn plans_are_started_at_a_bounded_rate_per_user() {
        let core = core_of_many_chunks().await;
        let handle = open_hints(&core, WRITER).await.unwrap();
        core.core.write(handle, b"scdlfs-hints 1\n").unwrap();
        for epoch in 0..PLAN_START_BURST {
            core.core
                .write(handle, format!("plan {epoch}\nwindow 3\n").as_bytes())
                .unwrap();
        }
        let refused = core.core.write(handle, b"plan 99\nwindow 4\n").unwrap_err();
        assert!(
            matches!(refused, FsError::InvalidHint(_)),
            "a restart past the burst, at once: {refused:?}"
        );
        // Not EINVAL: the same lines are valid a moment later.
        assert_eq!(scdlfs::fs::errno::errno(&refused), fuser::Errno::EAGAIN);
        core.core
            .write(handle, b"window 5\n")
            .expect("steps of the running plan are not restarts");
        let other = open_hints(&core, OTHER).await.unwrap();
        core.core
            .write(other, b"scdlfs-hints 1\nplan 0\nwindow 3\n")
            .expect("another user's starts are their own");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_user_sees_only_their_own_plans_and_refusals_root_sees_all() {
        let core = core_of_many_chunks().await;
        for uid in [WRITER, OTHER] {
            let handle = open_hints(&core, uid).await.unwrap();
            core.core
                .write(handle, b"scdlfs-hints 1\nplan 0\nwindow 3\n")
                .unwrap();
            assert!(core.core.write(handle, b"window 99999\n").is_err());
        }
        let seen = |status: &Status| {
            let plans: Vec<u32> = status.active_plans.iter().map(|p| p.uid).collect();
            let refused: Vec<u32> = status.hint_refusals.iter().map(|r| r.uid).collect();
            (plans, refused)
        };
        assert_eq!(
            seen(&status_as(&core, WRITER).await),
            (vec![WRITER], vec![WRITER])
        );
        assert_eq!(
            seen(&status_as(&core, OTHER).await),
            (vec![OTHER], vec![OTHER])
        );
        let (mut plans, refused) = seen(&status_as(&core, 0).await);
        plans.sort();
        assert_eq!(
            (plans, refused),
            (vec![WRITER, OTHER], vec![WRITER, OTHER]),
            "root"
        );
    }
}

/// Several plans on one mount (issue 29's fair sharing): they share the downloads, the
/// prefetch slots and the cache budget without one rank's prefetch costing another
/// rank its next step or its first row.
mod plans_sharing_a_mount {
    use super::*;
    use object_store::GetResult;
    use scdlfs::store::throttled::Throttle;
    use scdlfs::store::wrapper::{GetRequest, StoreHook};

    /// The keys read, in the order their requests reached the store (a HEAD reads
    /// nothing: a plan's start opens connections with them).
    #[derive(Debug, Default)]
    struct Arrivals(parking_lot::Mutex<Vec<String>>);

    #[async_trait::async_trait]
    impl StoreHook for Arrivals {
        async fn get(&self, request: GetRequest<'_>) -> object_store::Result<GetResult> {
            if !request.options.head {
                self.0.lock().push(request.location.to_string());
            }
            request.send().await
        }
    }

    async fn plan(core: &Core, lines: &str) -> u64 {
        let hints = core.resolve(&format!("ds/{HINT_FILE}")).await.unwrap();
        let handle = core.core.open(hints.ino.0).unwrap().handle;
        core.core.write(handle, lines.as_bytes()).unwrap();
        handle
    }

    fn raw(chunk: u32, kind: ArrayKind) -> String {
        format!("ds/{CHUNKED_DIR}/chunk_{chunk:05}/{}", kind.file_name())
    }

    fn chunk_bytes(files: &BTreeMap<String, Vec<u8>>, chunk: u32) -> u64 {
        let dir = format!("ds/chunk_{chunk:05}/");
        files
            .iter()
            .filter(|(name, _)| name.starts_with(&dir))
            .map(|(_, bytes)| bytes.len() as u64)
            .sum()
    }

    fn requests_of_chunk(core: &Core, chunk: u32) -> u64 {
        let dir = format!("ds/chunk_{chunk:05}/");
        let reads = core.reads.hook().snapshot();
        reads
            .iter()
            .filter(|((key, _), _)| key.starts_with(&dir))
            .map(|(_, n)| n)
            .sum()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_plans_that_need_the_same_parts_fetch_each_part_once() {
        let core = core_of(&dataset_files("ds"), |s| s.prefetch_lookahead_steps = 3).await;
        let lines = "scdlfs-hints 1\nplan 0\nwindow 1\nwindow 2\nwindow 3\n";
        let (a, b) = (plan(&core, lines).await, plan(&core, lines).await);
        for chunk in 1..=3 {
            for kind in ArrayKind::ALL {
                let path = raw(chunk, kind);
                let (first, second) = tokio::join!(
                    core.read_all(&path, 16 << 10),
                    core.read_all(&path, 16 << 10)
                );
                assert_eq!(first, second, "{path}");
            }
        }
        core.settle().await;
        let reads = core.reads.hook().snapshot();
        let twice: Vec<_> = reads.iter().filter(|(_, &n)| n > 1).collect();
        assert!(twice.is_empty(), "asked for more than once: {twice:?}");
        // And of each object, at most one companion edge's bytes came twice: a read
        // that missed the cache asks at once, at demand priority, for the few bytes of
        // the other array its reader faults on next (`Prefetcher::fetch_companion`,
        // a quarter part at most), which a plan's download of that part may already
        // carry or later carry again. Nothing else is asked for twice.
        let mut by_key: BTreeMap<&str, Vec<std::ops::Range<u64>>> = BTreeMap::new();
        // (Whole objects are read only by discovery: the header.)
        for (key, range) in reads.keys() {
            if let Some(range) = range {
                by_key.entry(key).or_default().push(range.clone());
            }
        }
        let companion_edge = settings(std::path::Path::new("")).part_size / 4;
        for (key, mut ranges) in by_key {
            ranges.sort_by_key(|r| r.start);
            let (mut twice, mut reached) = (0, 0);
            for range in &ranges {
                twice += reached.min(range.end).saturating_sub(range.start);
                reached = reached.max(range.end);
            }
            assert!(twice <= companion_edge, "{key}: {ranges:?}");
        }
        core.core.release(a);
        core.core.release(b);
    }

    /// A cache of about three chunks; plan A is reading chunk 1, plan B announces six
    /// chunks ahead. B's prefetches take the room A's plan does not name, never A's
    /// current step: reading chunk 1 again fetches nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_plans_current_step_is_never_evicted_for_another_plans_later_step() {
        let files = dataset_files("ds");
        let largest = (0..9).map(|c| chunk_bytes(&files, c)).max().unwrap();
        let core = core_of(&files, |s| {
            s.cache_bytes = 3 * largest + (64 << 10);
            s.prefetch_lookahead_steps = 6;
        })
        .await;
        let a = plan(&core, "scdlfs-hints 1\nplan 0\nwindow 1\n").await;
        for kind in ArrayKind::ALL {
            core.read_all(&raw(1, kind), 16 << 10).await;
        }
        core.settle().await;
        let fetched_before = requests_of_chunk(&core, 1);
        let b = plan(
            &core,
            "scdlfs-hints 1\nplan 0\nwindow 2\nwindow 3\nwindow 4\nwindow 5\nwindow 6\nwindow 7\n",
        )
        .await;
        // B's reader goes through its first steps, which moves its plan on and keeps
        // its prefetch wanting room.
        for chunk in 2..=4 {
            for kind in ArrayKind::ALL {
                core.read_all(&raw(chunk, kind), 16 << 10).await;
            }
        }
        core.settle().await;
        for kind in ArrayKind::ALL {
            core.read_all(&raw(1, kind), 16 << 10).await;
        }
        assert_eq!(
            requests_of_chunk(&core, 1),
            fetched_before,
            "chunk 1, A's current step, was evicted for B's steps: {:?}",
            core.observer.status().cache
        );
        core.core.release(a);
        core.core.release(b);
    }

    /// Plan A's prefetches queue behind two download slots over a slow link; plan B
    /// starts, and its reader's first read goes to the store before A's queued
    /// prefetches (at most the two slots' worth of A's requests that were about to
    /// start come first).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_new_plans_first_read_goes_before_the_other_plans_queued_prefetches() {
        let memory = memory_of(&dataset_files("ds")).await;
        let arrivals = Arc::new(HookedStore::new(
            Arc::new(HookedStore::new(
                memory.clone(),
                Throttle::new(Duration::from_millis(40), 2 << 20),
            )),
            Arrivals::default(),
        ));
        let reads = Arc::new(HookedStore::new(arrivals.clone(), CountReads::default()));
        let cache = tempfile::tempdir().unwrap();
        let mut s = settings(cache.path());
        s.max_concurrent_requests = 2;
        s.prefetch_lookahead_steps = 6;
        let store: Arc<dyn ObjectStore> = reads.clone();
        let (core, observer) = assemble(store, ObjectPath::from(""), &s, None).unwrap();
        let core = Core {
            core,
            observer,
            reads,
            memory,
            _cache: cache,
        };
        let a = plan(
            &core,
            "scdlfs-hints 1\nplan 0\nwindow 0\nwindow 1\nwindow 2\nwindow 3\nwindow 4\nwindow 5\n",
        )
        .await;
        let started = Instant::now();
        while arrivals.hook().0.lock().len() < 2 {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "A prefetches nothing"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let b = plan(&core, "scdlfs-hints 1\nplan 0\nwindow 8\n").await;
        let before = arrivals.hook().0.lock().len();
        let first_row = core.resolve(&raw(8, ArrayKind::Data)).await.unwrap();
        let handle = core.core.open(first_row.ino.0).unwrap().handle;
        core.core
            .read(first_row.ino.0, handle, 0, 4096)
            .await
            .unwrap();
        let log = arrivals.hook().0.lock().clone();
        let since: Vec<&String> = log[before..].iter().collect();
        let of_a = |key: &&String| (0..=5).any(|c| key.starts_with(&format!("ds/chunk_{c:05}/")));
        let first_of_b = since
            .iter()
            .position(|key| key.starts_with("ds/chunk_00008/"))
            .expect("B's read reached the store");
        let a_before_b = since[..first_of_b].iter().filter(|k| of_a(k)).count();
        assert!(
            a_before_b <= 2,
            "{a_before_b} of A's requests went before B's first read: {since:?}"
        );
        core.core.release(handle);
        core.core.release(a);
        core.core.release(b);
    }
}
