//! Every byte read through a real mount equals the source: whole files, random ranges,
//! ranges across part and chunk boundaries, past the end, empty objects; for plain
//! objects and for the flat view of a chunked dataset; from a local folder and from a
//! real S3 server.

use crate::common;

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use common::s3::{moto, unique_bucket};
use common::*;
use scdl_format::layout::{CHUNKED_DIR, HEADER_FILE};
use scdl_format::{ArrayKind, Backend, Header};

/// A source folder with plain files and a chunked dataset under `datasets/small`.
fn source() -> (tempfile::TempDir, BTreeMap<String, Vec<u8>>) {
    let dir = tempfile::tempdir().unwrap();
    let files = plain_files();
    write_files(dir.path(), &files);
    small_dataset()
        .write_chunked(&dir.path().join("datasets/small"))
        .unwrap();
    (dir, files)
}

fn check_plain_files(mnt: &Path, files: &BTreeMap<String, Vec<u8>>) {
    let mut rng = Rng::new(7);
    for (name, want) in files {
        let path = mnt.join(name);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            want.len() as u64,
            "{name} size"
        );
        assert_eq!(&std::fs::read(&path).unwrap(), want, "{name} whole");
        let file = File::open(&path).unwrap();
        for _ in 0..40 {
            let offset = rng.below(want.len() as u64 + 200);
            let len = rng.below(200_000) as usize;
            check_range(&file, want, offset, len, name);
        }
        // Across every part boundary.
        for boundary in (0..want.len() as u64).step_by(64 << 10).skip(1) {
            check_range(&file, want, boundary - 3, 7, name);
        }
    }
}

fn check_range(file: &File, want: &[u8], offset: u64, len: usize, name: &str) {
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        let n = file.read_at(&mut buf[got..], offset + got as u64).unwrap();
        if n == 0 {
            break;
        }
        got += n;
    }
    let start = (offset as usize).min(want.len());
    let end = (offset as usize + len).min(want.len());
    assert_eq!(&buf[..got], &want[start..end], "{name} at {offset}+{len}");
}

fn check_flat_dataset(dataset: &Path, raw_source: Option<&Path>) {
    let spec = small_dataset();
    let mono = Monolithic::of(&spec);
    let header = Header::decode(&std::fs::read(dataset.join(HEADER_FILE)).unwrap()).unwrap();
    assert_eq!(header.backend, Backend::Monolithic);
    assert_eq!(header.chunked, None);
    let mut rng = Rng::new(3);
    for kind in ArrayKind::ALL {
        let want = mono.array(kind);
        let path = dataset.join(kind.file_name());
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            want.len() as u64,
            "{kind:?} size"
        );
        assert_eq!(std::fs::read(&path).unwrap(), want, "{kind:?} whole");
        let file = File::open(&path).unwrap();
        for _ in 0..200 {
            let offset = rng.below(want.len() as u64 + 50);
            let len = rng.below(5000) as usize;
            check_range(&file, want, offset, len, kind.file_name());
        }
    }
    if let Some(raw) = raw_source {
        // The objects as stored stay reachable, byte for byte.
        let chunked = without_announcement(snapshot(&dataset.join(CHUNKED_DIR)));
        assert_eq!(chunked, snapshot(raw));
    }
}

/// A snapshot of a dataset directory without its hint file, which must read as the
/// protocol's announcement of the dataset's chunk rows (and of what is cached, which
/// depends on what was read before).
fn without_announcement(mut snapshot: BTreeMap<String, Vec<u8>>) -> BTreeMap<String, Vec<u8>> {
    let text = snapshot
        .remove(scdl_format::hint::HINT_FILE)
        .expect("a dataset directory has a hint file");
    let announced = scdl_format::hint::Announcement::parse(&text).expect("an announcement");
    assert_eq!(announced.chunk_rows, small_dataset().chunk_rows as u64);
    assert_eq!(announced.version, scdl_format::hint::VERSION);
    snapshot
}

#[test]
fn a_local_folder_reads_back_exactly() {
    let (src, files) = source();
    let mount = TestMount::start(local_store(src.path()), "", |_| {});
    check_plain_files(&mount.path(), &files);
    check_flat_dataset(
        &mount.path().join("datasets/small"),
        Some(&src.path().join("datasets/small")),
    );
}

#[test]
fn an_s3_bucket_reads_back_exactly() {
    let (src, files) = source();
    let server = moto();
    let bucket = unique_bucket("reads");
    server.create_bucket(&bucket);
    server.upload(&bucket, "under/prefix", src.path());
    let mount = TestMount::start(server.store(&bucket), "under/prefix", |_| {});
    check_plain_files(&mount.path(), &files);
    check_flat_dataset(&mount.path().join("datasets/small"), None);
    let listed: Vec<String> = std::fs::read_dir(mount.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(listed.contains(&"nested".to_string()) && listed.contains(&"empty.bin".to_string()));
}

#[test]
fn the_raw_view_shows_the_bucket_as_stored() {
    let (src, _) = source();
    let mount = TestMount::start(local_store(src.path()), "", |s| {
        s.view = scdlfs::catalog::DirMode::Raw
    });
    let dataset = mount.path().join("datasets/small");
    let stored = snapshot(&src.path().join("datasets/small"));
    assert_eq!(without_announcement(snapshot(&dataset)), stored);
    let header = Header::decode(&std::fs::read(dataset.join(HEADER_FILE)).unwrap()).unwrap();
    assert_eq!(header.backend, Backend::Chunked);
}

#[test]
fn sizes_and_times_are_exact() {
    let (src, files) = source();
    let mount = TestMount::start(local_store(src.path()), "", |_| {});
    for name in files.keys() {
        let stored = std::fs::metadata(src.path().join(name)).unwrap();
        let mounted = std::fs::metadata(mount.path().join(name)).unwrap();
        assert_eq!(mounted.len(), stored.len());
        assert_eq!(
            mounted.modified().unwrap(),
            stored.modified().unwrap(),
            "{name} mtime"
        );
    }
}

/// The kernel's read-ahead for the mount is what was asked (its device's
/// `read_ahead_kb`), and the files still read back exactly through the larger window,
/// sequentially and through a memory map.
#[test]
fn the_kernel_read_ahead_is_set_as_asked() {
    let (src, files) = source();
    let asked = 4u64 << 20;
    let mount = TestMount::start(local_store(src.path()), "", |s| s.read_ahead = Some(asked));
    assert_eq!(scdlfs::fs::read_ahead::get(&mount.path()).unwrap(), asked);
    check_plain_files(&mount.path(), &files);
    for (name, want) in &files {
        let file = File::open(mount.path().join(name)).unwrap();
        if want.is_empty() {
            continue;
        }
        // SAFETY: the mount's files do not change while mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        assert_eq!(&map[..], &want[..], "{name} mapped");
    }
    let other = TestMount::start(local_store(src.path()), "", |_| {});
    assert_ne!(
        scdlfs::fs::read_ahead::get(&other.path()).unwrap(),
        asked,
        "a mount that asks nothing keeps the kernel's default"
    );
}

/// A read the disk cache serves brings the window around it into the kernel's page
/// cache: the other reads of that window never reach the daemon, and they read the
/// file's exact bytes.
#[test]
fn a_read_from_the_cache_brings_its_window_into_the_page_cache() {
    let (src, files) = source();
    let part = 64u64 << 10;
    let window = 4 * part;
    let mount = TestMount::start(local_store(src.path()), "", |s| {
        s.cache_read_around = window
    });
    let name = "nested/big.bin";
    let want = &files[name];
    let path = mount.path().join(name);
    // Each part read once, out of order and each through a file of its own so that no
    // read looks sequential: every read waits on the network, none pushes.
    for index in [3, 7, 1, 9, 5, 0, 8, 2, 10, 4, 6] {
        check_range(&open_random(&path), want, index * part, part as usize, name);
        mount.settle();
    }
    assert_eq!(mount.status().counters.read_around_windows, 0);

    let file = open_random(&path);
    forget_cached_pages(&file);
    check_range(&file, want, window + 8192, 4096, name);
    wait_for_pushes(&mount, 1);
    let reads = mount.status().counters.reads;
    for offset in (window..2 * window).step_by(4096) {
        check_range(&file, want, offset, 4096, name);
    }
    assert_eq!(
        mount.status().counters.reads,
        reads,
        "reads of the pushed window reached the daemon"
    );
    // SAFETY: the mount's files do not change while mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    assert_eq!(&map[..], &want[..], "mapped after the push");
}

fn wait_for_pushes(mount: &TestMount, windows: u64) {
    let started = std::time::Instant::now();
    while mount.status().counters.read_around_windows < windows {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "no window pushed in 10 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
