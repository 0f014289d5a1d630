//! Bytes flipped in the cache's part files while the mount runs are never served: with
//! the kernel's page cache of the mounted files dropped, every read returns the right
//! bytes, and each damaged part is dropped and downloaded exactly once more (counted at
//! the store).

use crate::common;

use std::collections::HashMap;
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

#[test]
fn flipped_bits_in_cached_parts_are_never_served_and_are_refetched() {
    let src = tempfile::tempdir().unwrap();
    let want = write_source(src.path());

    let counted = Arc::new(HookedStore::new(
        local_store(src.path()),
        CountReads::default(),
    ));
    // Parts of four checksummed blocks, so a flip hits one block among several.
    let mount = TestMount::start(counted.clone(), "", |s| s.part_size = 256 << 10);
    for (name, bytes) in &want {
        assert!(&read_uncached(&mount.path().join(name)) == bytes, "{name}");
    }
    mount.settle();
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
