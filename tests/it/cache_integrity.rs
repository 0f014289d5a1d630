//! Bytes flipped in the cache's part files while the mount runs are never served: with
//! the kernel's page cache of the mounted files dropped, every read returns the right
//! bytes, and each damaged part is dropped and downloaded exactly once more (counted at
//! the store).

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use scdlfs::cache::part_file::PartHeader;
use scdlfs::store::counting::CountReads;
use scdlfs::store::wrapper::HookedStore;

/// Reads a mounted file whole after asking the kernel to forget its cached pages, so
/// the read reaches the daemon even though the file was opened with FOPEN_KEEP_CACHE.
fn read_uncached(path: &Path) -> Vec<u8> {
    let file = std::fs::File::open(path).unwrap();
    forget_cached_pages(&file);
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut &file, &mut out).unwrap();
    out
}

/// The object key and byte range a part file holds, from its header.
fn part_of(path: &Path) -> (String, u64, u64, u64) {
    let bytes = std::fs::read(path).unwrap();
    let header = PartHeader::decode(&bytes).expect("an intact header");
    let data_offset = header.encoded_len() as u64;
    (
        header.key,
        header.object_offset,
        header.object_offset + header.data_len,
        data_offset,
    )
}

/// A mount of the harness's files under `src`, through a store that counts reads, with
/// parts of four checksummed blocks (so that damage to one block hits one among
/// several), after every file was read once, checked, and its downloads ended.
fn every_file_read_once(
    src: &Path,
) -> (
    BTreeMap<String, Vec<u8>>,
    Arc<HookedStore<CountReads>>,
    TestMount,
) {
    let want = write_source(src);
    let counted = Arc::new(HookedStore::new(local_store(src), CountReads::default()));
    let mount = TestMount::start(counted.clone(), "", |s| s.part_size = 256 << 10);
    for (name, bytes) in &want {
        assert!(&read_uncached(&mount.path().join(name)) == bytes, "{name}");
    }
    mount.settle();
    (want, counted, mount)
}

#[test]
fn flipped_bits_in_cached_parts_are_never_served_and_are_refetched() {
    let src = tempfile::tempdir().unwrap();
    let (want, counted, mount) = every_file_read_once(src.path());
    let before = counted.hook().snapshot();
    assert!(
        before.values().all(|&n| n == 1),
        "one download per part: {:?}",
        before.iter().filter(|(_, &n)| n > 1).collect::<Vec<_>>()
    );

    // Damage every third part file: a few bytes each, in its data.
    let mut part_files: Vec<PathBuf> = std::fs::read_dir(mount.cache_parts_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    part_files.sort();
    assert!(part_files.len() > 20, "{} part files", part_files.len());
    let mut damaged = Vec::new();
    let mut rng = Rng::new(7);
    for path in part_files.iter().step_by(3) {
        let (key, start, end, data_offset) = part_of(path);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        for _ in 0..1 + rng.below(4) {
            let at = data_offset + rng.below(end - start);
            let mut byte = [0u8];
            std::os::unix::fs::FileExt::read_exact_at(&file, &mut byte, at).unwrap();
            byte[0] ^= 1 << rng.below(8);
            std::os::unix::fs::FileExt::write_all_at(&file, &byte, at).unwrap();
        }
        damaged.push((key, Some(start..end)));
    }

    for round in 0..2 {
        for (name, bytes) in &want {
            assert!(
                &read_uncached(&mount.path().join(name)) == bytes,
                "{name}: wrong bytes in round {round}"
            );
        }
    }
    mount.settle();
    let after = counted.hook().snapshot();
    let refetched: HashMap<_, _> = after
        .iter()
        .filter(|(read, n)| before.get(*read) != Some(n))
        .map(|(read, n)| (read.clone(), *n))
        .collect();
    assert_eq!(refetched.len(), damaged.len(), "refetched: {refetched:?}");
    for read in &damaged {
        assert_eq!(
            refetched.get(read),
            Some(&2),
            "{read:?} downloaded again once"
        );
    }
    assert_eq!(
        mount.status().cache.corrupt_parts_dropped,
        damaged.len() as u64
    );
}

/// The parts that changed their count of downloads since `before`, with their count.
fn refetched_since(
    before: &HashMap<scdlfs::store::counting::ReadKey, u64>,
    after: &HashMap<scdlfs::store::counting::ReadKey, u64>,
) -> HashMap<scdlfs::store::counting::ReadKey, u64> {
    after
        .iter()
        .filter(|(read, n)| before.get(*read) != Some(n))
        .map(|(read, n)| (read.clone(), *n))
        .collect()
}

/// The part files of a cache directory, in name order, with the part each holds.
fn part_files(dir: &Path) -> Vec<(PathBuf, (String, u64, u64, u64))> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let part = part_of(&path);
            (path, part)
        })
        .filter(|(_, (_, start, end, _))| end > start)
        .collect()
}

/// Our own disk never fails a read: part files truncated under a live mount (to
/// nothing, or to their header and half their data, through the descriptor the mount
/// holds open) are dropped, counted and downloaded once more; every read returns the
/// right bytes.
#[test]
fn part_files_truncated_under_the_mount_are_fetched_again_not_failed() {
    let src = tempfile::tempdir().unwrap();
    let (want, counted, mount) = every_file_read_once(src.path());
    let before = counted.hook().snapshot();

    let mut damaged = Vec::new();
    for (i, (path, (key, start, end, data_offset))) in part_files(&mount.cache_parts_dir())
        .into_iter()
        .enumerate()
        .step_by(3)
    {
        let len = if i % 2 == 0 {
            0
        } else {
            data_offset + (end - start) / 2
        };
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len)
            .unwrap();
        damaged.push((key, Some(start..end)));
    }
    assert!(damaged.len() >= 5, "{} damaged", damaged.len());

    for round in 0..2 {
        for (name, bytes) in &want {
            let path = mount.path().join(name);
            let file = std::fs::File::open(&path).unwrap();
            forget_cached_pages(&file);
            let mut got = Vec::new();
            let read = std::io::Read::read_to_end(&mut &file, &mut got);
            assert!(read.is_ok(), "{name} in round {round}: {read:?}");
            assert!(&got == bytes, "{name}: wrong bytes in round {round}");
        }
    }
    mount.settle();
    let refetched = refetched_since(&before, &counted.hook().snapshot());
    assert_eq!(refetched.len(), damaged.len(), "refetched: {refetched:?}");
    for read in &damaged {
        assert_eq!(
            refetched.get(read),
            Some(&2),
            "{read:?} downloaded again once"
        );
    }
    let cache = mount.status().cache;
    assert_eq!(
        cache.unreadable_parts_dropped,
        damaged.len() as u64,
        "{cache:?}"
    );
    assert_eq!(cache.corrupt_parts_dropped, 0, "{cache:?}");
}

/// The same for part files an earlier mount left, adopted by this one and not opened
/// yet: removed, or replaced by a directory (which opens, and fails to read), before
/// their first read.
#[test]
fn part_files_removed_or_replaced_before_their_first_read_are_fetched_again() {
    let src = tempfile::tempdir().unwrap();
    let want = write_source(src.path());
    let cache_dir = tempfile::tempdir().unwrap();
    let mount_counted = || {
        let counted = Arc::new(HookedStore::new(
            local_store(src.path()),
            CountReads::default(),
        ));
        let cache_dir = cache_dir.path().to_owned();
        let mount = TestMount::start(counted.clone(), "", |s| {
            s.fs_name = src.path().display().to_string();
            s.cache_dir = cache_dir;
            s.part_size = 256 << 10;
        });
        (mount, counted)
    };
    {
        let (mount, _) = mount_counted();
        for (name, bytes) in &want {
            assert!(&read_uncached(&mount.path().join(name)) == bytes, "{name}");
        }
        mount.settle();
    }
    let (mount, counted) = mount_counted();
    let started = std::time::Instant::now();
    while !mount.status().cache.adoption_done {
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let parts_dir = cache_dir
        .path()
        .join(scdlfs::cache::adopt::layout_dir_name())
        .join("parts");
    let mut damaged = Vec::new();
    for (i, (path, (key, start, end, _))) in
        part_files(&parts_dir).into_iter().enumerate().step_by(3)
    {
        std::fs::remove_file(&path).unwrap();
        if i % 2 == 0 {
            std::fs::create_dir(&path).unwrap();
        }
        damaged.push((key, Some(start..end)));
    }
    assert!(damaged.len() >= 5, "{} damaged", damaged.len());
    for (name, bytes) in &want {
        let got = std::fs::read(mount.path().join(name));
        assert!(got.is_ok(), "{name}: {got:?}");
        assert!(&got.unwrap() == bytes, "{name}: wrong bytes");
    }
    mount.settle();
    let fetched = counted.hook().snapshot();
    for read in &damaged {
        assert_eq!(
            fetched.get(read),
            Some(&1),
            "{read:?} downloaded again once"
        );
    }
    let cache = mount.status().cache;
    assert_eq!(
        cache.unreadable_parts_dropped,
        damaged.len() as u64,
        "{cache:?}"
    );
}
