//! Shared harness of the integration tests: real FUSE mounts of real stores (a local
//! folder, or moto_server on 127.0.0.1), with the test doubles of `scdlfs::store` in
//! between where a test needs to count, slow down or break requests.
#![allow(dead_code)] // each test binary uses its own part of the harness

pub mod cli_mount;
pub mod epoch;
pub mod faulty_mount;
pub mod hostile_hints;
pub mod process;
pub mod proxy;
pub mod s3;
pub mod servers;
pub mod sigv4;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::ObjectStore;
use scdl_format::{ArrayKind, Header};
use scdlfs::catalog::DirMode;
use scdlfs::mount::{Mount, MountSettings};
use scdlfs::store::counting::ReadKey;
use scdlfs::synthetic::SyntheticDataset;

/// Mount settings for tests: small parts so that small files span several.
pub fn settings(cache_dir: &Path) -> MountSettings {
    MountSettings {
        fs_name: "scdlfs-test".into(),
        endpoint: None,
        view: DirMode::Discover,
        cache_dir: cache_dir.to_owned(),
        cache_reset: false,
        cache_bytes: 256 << 20,
        max_cached_chunks: None,
        part_size: 64 << 10,
        max_concurrent_requests: 8,
        allow_other: false,
        allow_root: false,
        ownership: scdlfs::fs::Ownership::of_mounting_user(),
        fuse_threads: 4,
        prefetch_lookahead_steps: 2,
        read_timeout: scdlfs::store::NetworkBounds::default().read_timeout,
        fetch_memory: 64 << 20,
        read_ahead: None,
        cache_read_around: 1 << 20,
        metadata_ttl: None,
        users: std::sync::Arc::new(scdlfs::users::Users::unwatched()),
        keys_in_order: false,
    }
}

/// A mount with its own temporary mountpoint and cache directory.
pub struct TestMount {
    pub mount: Option<Mount>,
    pub dir: tempfile::TempDir,
}

impl TestMount {
    pub fn start(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        configure: impl FnOnce(&mut MountSettings),
    ) -> TestMount {
        let dir = tempfile::tempdir().unwrap();
        let mountpoint = dir.path().join("mnt");
        std::fs::create_dir(&mountpoint).unwrap();
        let mut s = settings(&dir.path().join("cache"));
        configure(&mut s);
        let mount = Mount::start(store, ObjectPath::from(prefix), &mountpoint, &s).expect("mount");
        TestMount {
            mount: Some(mount),
            dir,
        }
    }

    pub fn path(&self) -> PathBuf {
        self.mount.as_ref().unwrap().mountpoint().to_owned()
    }

    pub fn cache_parts_dir(&self) -> PathBuf {
        self.dir
            .path()
            .join("cache")
            .join(scdlfs::cache::adopt::layout_dir_name())
            .join("parts")
    }

    pub fn status(&self) -> scdlfs::status::Status {
        self.mount.as_ref().unwrap().status()
    }

    /// Waits (at most 30 s) until no download is under way: a read returns once its
    /// own bytes have arrived, and its part lands in the cache a little later.
    pub fn settle(&self) {
        let started = std::time::Instant::now();
        while self.status().downloads_in_flight > 0 {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(30),
                "downloads still under way after 30 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

impl Drop for TestMount {
    fn drop(&mut self) {
        if let Some(mount) = self.mount.take() {
            let _ = mount.unmount();
        }
    }
}

pub fn local_store(root: &Path) -> Arc<dyn ObjectStore> {
    Arc::new(LocalFileSystem::new_with_prefix(root).unwrap())
}

/// A deterministic byte pattern that differs at every offset of every file.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Plain files of awkward sizes for a 64 KiB part size: empty, tiny, exactly one part,
/// one byte over, several parts, in nested directories.
pub fn plain_files() -> BTreeMap<String, Vec<u8>> {
    let part = 64 << 10;
    [
        ("empty.bin", 0),
        ("tiny.txt", 5),
        ("one_part.bin", part),
        ("one_part_plus_one.bin", part + 1),
        ("nested/deeper/three_parts.bin", 3 * part + 17),
        ("nested/big.bin", 11 * part + 4093),
    ]
    .iter()
    .enumerate()
    .map(|(i, (name, len))| (name.to_string(), pattern(i as u64 + 1, *len)))
    .collect()
}

pub fn write_files(root: &Path, files: &BTreeMap<String, Vec<u8>>) {
    for (name, bytes) in files {
        let path = root.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
}

/// Writes the plain files and the small dataset (as `ds/`) under `root`; returns every
/// file the mount shows of them with the bytes it must read back.
pub fn write_source(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut want = plain_files();
    write_files(root, &want);
    let spec = small_dataset();
    spec.write_chunked(&root.join("ds")).unwrap();
    let mono = Monolithic::of(&spec);
    for kind in ArrayKind::ALL {
        want.insert(
            format!("ds/{}", kind.file_name()),
            mono.array(kind).to_vec(),
        );
    }
    want
}

/// A small synthetic dataset with a short last chunk and empty rows.
pub fn small_dataset() -> SyntheticDataset {
    SyntheticDataset {
        rows: 2_500,
        genes: 3_000,
        chunk_rows: 300,
        mean_values: 60,
        seed: 11,
    }
}

/// The monolithic arrays a synthetic dataset stands for, built without scdlfs.
pub struct Monolithic {
    pub data: Vec<u8>,
    pub row_ptr: Vec<u8>,
    pub col_ptr: Vec<u8>,
}

impl Monolithic {
    pub fn of(spec: &SyntheticDataset) -> Monolithic {
        let total = spec.total_values();
        let rw = uint_width(total);
        let cw = uint_width(spec.genes.saturating_sub(1) as u64);
        let mut m = Monolithic {
            data: Vec::new(),
            row_ptr: vec![0; (spec.rows as usize + 1) * rw],
            col_ptr: vec![0; total as usize * cw],
        };
        let mut at = 0usize;
        for r in 0..spec.rows {
            let row = spec.row(r);
            for (c, v) in row.columns.iter().zip(&row.values) {
                m.data.extend_from_slice(&v.to_le_bytes());
                m.col_ptr[at * cw..(at + 1) * cw].copy_from_slice(&(*c as u64).to_le_bytes()[..cw]);
                at += 1;
            }
            let next = (r as usize + 1) * rw;
            m.row_ptr[next..next + rw].copy_from_slice(&(at as u64).to_le_bytes()[..rw]);
        }
        m
    }

    pub fn array(&self, kind: ArrayKind) -> &[u8] {
        match kind {
            ArrayKind::Data => &self.data,
            ArrayKind::RowPtr => &self.row_ptr,
            ArrayKind::ColPtr => &self.col_ptr,
        }
    }
}

/// Writes `spec` as a monolithic archive at `dir`: the three arrays and the header.
pub fn write_monolithic(spec: &SyntheticDataset, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let arrays = Monolithic::of(spec);
    for kind in ArrayKind::ALL {
        std::fs::write(dir.join(kind.file_name()), arrays.array(kind)).unwrap();
    }
    std::fs::write(dir.join("header.sch"), spec.monolithic_header().encode()).unwrap();
}

/// Reads rows through memory maps of a dataset directory's three arrays (the flat view
/// of a chunked dataset, or a monolithic archive), as the released reader does.
pub struct MappedRows {
    data: Mmap,
    row_ptr: Mmap,
    col_ptr: Mmap,
    header: Header,
}

impl MappedRows {
    pub fn open(dir: &Path) -> MappedRows {
        let map = |kind: ArrayKind| unsafe {
            Mmap::map(&File::open(dir.join(kind.file_name())).unwrap()).unwrap()
        };
        MappedRows {
            data: map(ArrayKind::Data),
            row_ptr: map(ArrayKind::RowPtr),
            col_ptr: map(ArrayKind::ColPtr),
            header: Header::decode(&std::fs::read(dir.join("header.sch")).unwrap()).unwrap(),
        }
    }

    pub fn row(&self, row: u64) -> scdlfs::synthetic::Row {
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

/// Makes the kernel forget the pages it caches of a mounted file (kept across opens:
/// FOPEN_KEEP_CACHE), so that the next reads reach the daemon. Pages a live memory map
/// holds stay: unmap first.
pub fn forget_cached_pages(file: &File) {
    rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::DontNeed).expect("posix_fadvise");
}

/// Opens a file for reads of exactly the pages asked for: no kernel read-ahead, so a
/// read of one chunk's bytes never drags in the bytes of the chunk next to it.
pub fn open_random(path: &Path) -> File {
    let file = File::open(path).unwrap();
    rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::Random).expect("posix_fadvise");
    file
}

/// Asserts that `result` is the error EIO, not data.
#[track_caller]
pub fn assert_eio<T: std::fmt::Debug>(result: std::io::Result<T>, what: &str) {
    match result {
        Ok(value) => panic!(
            "{what}: expected EIO, got data {:.200}",
            format!("{value:?}")
        ),
        Err(error) => assert_eq!(error.raw_os_error(), Some(libc::EIO), "{what}: {error}"),
    }
}

/// The (object, range) requests made more than once since `before` was counted.
pub fn requested_again(
    before: &HashMap<ReadKey, u64>,
    now: HashMap<ReadKey, u64>,
) -> Vec<(ReadKey, u64)> {
    let mut again: Vec<_> = now
        .into_iter()
        .filter(|(read, n)| *n - before.get(read).copied().unwrap_or(0) > 1)
        .collect();
    again.sort_by_key(|((key, range), _)| (key.clone(), range.as_ref().map(|r| r.start)));
    again
}

/// The bytes fetched in two epochs of a reader going through a dataset in the same
/// order with a cache smaller than it: the first fetches each byte about once, the
/// second reuses most of what the cache holds. The floor is what no cache of this size
/// can keep; the prefetcher makes room for the first steps before any step is done,
/// which costs a few steps more.
#[track_caller]
pub fn assert_a_second_epoch_reuses_the_cache(
    what: &str,
    dataset_bytes: u64,
    cache_bytes: u64,
    fetched: &[u64],
) {
    let floor = dataset_bytes - cache_bytes;
    eprintln!(
        "{what}, same order twice: {dataset_bytes} bytes, cache {cache_bytes}; fetched {} in \
         the first epoch, {} in the second (floor {floor})",
        fetched[0], fetched[1]
    );
    assert!(
        fetched[0] <= dataset_bytes * 11 / 10,
        "the first epoch fetches each byte about once"
    );
    assert!(
        fetched[1] <= floor + cache_bytes / 2,
        "the second epoch reuses most of what the cache holds"
    );
}

/// Bytes per value of the smallest unsigned integer holding `max`, as numpy would
/// store it; written out here, not taken from scdl-format, so the oracle shares no code
/// with what it checks.
fn uint_width(max: u64) -> usize {
    match max {
        0..=0xff => 1,
        0x100..=0xffff => 2,
        0x1_0000..=0xffff_ffff => 4,
        _ => 8,
    }
}

/// Reads up to `len` bytes at `offset` (fewer only at the end of the file).
pub fn read_at(file: &std::fs::File, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        let n = file.read_at(&mut buf[got..], offset + got as u64)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    buf.truncate(got);
    Ok(buf)
}

/// Every regular file under `root` with its bytes, by relative path.
pub fn snapshot(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            } else {
                let rel = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

/// A small seeded generator for random offsets and sizes in tests.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        if n == 0 {
            0
        } else {
            self.0 % n
        }
    }
}
