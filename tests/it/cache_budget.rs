//! With a cache smaller than the data, a full pass still reads correct bytes, and the
//! cache directory stays within its budget at every moment (sampled during the pass),
//! under the byte budget and under the chunk budget alike.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use scdl_format::ArrayKind;
use scdlfs::cache::test_files::dir_bytes;
use scdlfs::synthetic::SyntheticDataset;

fn larger_dataset() -> SyntheticDataset {
    SyntheticDataset {
        rows: 12_000,
        genes: 3_000,
        chunk_rows: 500,
        mean_values: 80,
        seed: 5,
    }
}

/// Samples the size of `dir` every millisecond until stopped; returns the largest seen.
fn watch_size(dir: std::path::PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let largest = AtomicU64::new(0);
        while !stop.load(Ordering::Relaxed) {
            largest.fetch_max(dir_bytes(&dir), Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(1));
        }
        largest.into_inner()
    })
}

#[test]
fn a_full_pass_stays_within_the_byte_budget() {
    let src = tempfile::tempdir().unwrap();
    let files = plain_files();
    write_files(src.path(), &files);
    let spec = larger_dataset();
    spec.write_chunked(&src.path().join("ds")).unwrap();
    let budget = 640 << 10;
    let mount = TestMount::start(local_store(src.path()), "", |s| {
        s.cache_bytes = budget;
        s.max_concurrent_requests = 4;
    });
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_size(mount.cache_parts_dir(), stop.clone());

    let mono = Monolithic::of(&spec);
    let mut total = 0;
    for kind in ArrayKind::ALL {
        let got = std::fs::read(mount.path().join("ds").join(kind.file_name())).unwrap();
        assert_eq!(got, mono.array(kind), "{kind:?}");
        total += got.len();
    }
    for (name, want) in &files {
        assert_eq!(
            &std::fs::read(mount.path().join(name)).unwrap(),
            want,
            "{name}"
        );
        total += want.len();
    }
    stop.store(true, Ordering::Relaxed);
    let largest = watcher.join().unwrap();
    assert!(
        total as u64 > 4 * budget,
        "the pass must be larger than the cache"
    );
    assert!(largest > 0, "the cache was used");
    assert!(
        largest <= budget,
        "cache directory reached {largest} bytes, budget {budget}"
    );
    let status = mount.status();
    assert!(status.cache.cached_bytes <= budget);
    assert!(status.cache.evicted_parts > 0);
}

#[test]
fn the_chunk_budget_bounds_the_chunks_held() {
    let src = tempfile::tempdir().unwrap();
    let spec = larger_dataset();
    spec.write_chunked(&src.path().join("ds")).unwrap();
    let mount = TestMount::start(local_store(src.path()), "", |s| {
        s.max_cached_chunks = Some(3)
    });
    let mono = Monolithic::of(&spec);
    let mut most_groups = 0;
    let data = std::fs::File::open(mount.path().join("ds/data.npy")).unwrap();
    let mut buf = vec![0u8; 100_000];
    let mut offset = 0;
    while offset < mono.data.len() {
        let n = std::os::unix::fs::FileExt::read_at(&data, &mut buf, offset as u64).unwrap();
        assert!(n > 0, "0-byte read at {offset} of {}", mono.data.len());
        assert_eq!(&buf[..n], &mono.data[offset..offset + n]);
        offset += n;
        most_groups = most_groups.max(mount.status().cache.cached_groups);
    }
    assert!(most_groups <= 3, "held {most_groups} chunks");
    assert!(mount.status().cache.evicted_parts > 0);
}
