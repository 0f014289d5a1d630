//! A cache directory that fills up (a small tmpfs) or disappears while mounted does not
//! stop the mount: every read still returns the right bytes, served from the store, and
//! `status` says why the cache is off.

use crate::common;

use std::collections::BTreeMap;

use common::*;
use scdlfs::cache::test_files::SmallTmpfs;

fn read_all(mount: &TestMount, want: &BTreeMap<String, Vec<u8>>) {
    for (name, bytes) in want {
        let got = std::fs::read(mount.path().join(name)).unwrap();
        assert!(&got == bytes, "{name}: wrong bytes");
    }
}

#[test]
fn a_full_cache_disk_serves_from_the_store() {
    let src = tempfile::tempdir().unwrap();
    let want = write_source(src.path());
    let tmpfs = SmallTmpfs::mount("256k");
    let mount = TestMount::start(local_store(src.path()), "", |s| {
        s.cache_dir = tmpfs.path();
        s.cache_bytes = 64 << 20;
    });
    for _ in 0..2 {
        read_all(&mount, &want);
    }
    let cache = mount.status().cache;
    let reason = cache.disk_unusable.expect("the full disk is reported");
    assert!(reason.contains("No space"), "{reason}");
    assert!(cache.parts_not_cached_for_disk_errors > 0);
    let leftovers: Vec<_> = std::fs::read_dir(
        tmpfs
            .path()
            .join(scdlfs::cache::adopt::layout_dir_name())
            .join("parts"),
    )
    .unwrap()
    .map(|e| e.unwrap().file_name())
    .filter(|name| name.to_string_lossy().ends_with(".tmp"))
    .collect();
    assert!(leftovers.is_empty(), "torn temporaries left: {leftovers:?}");
    drop(mount);
}

#[test]
fn a_removed_cache_directory_serves_from_the_store() {
    let src = tempfile::tempdir().unwrap();
    let want = write_source(src.path());
    let mount = TestMount::start(local_store(src.path()), "", |_| {});
    let (first, rest): (BTreeMap<_, _>, BTreeMap<_, _>) = want
        .clone()
        .into_iter()
        .partition(|(name, _)| name.starts_with("nested"));
    read_all(&mount, &first);
    mount.settle();
    std::fs::remove_dir_all(mount.cache_parts_dir()).unwrap();
    read_all(&mount, &rest);
    read_all(&mount, &want);
    let cache = mount.status().cache;
    assert!(cache.disk_unusable.is_some(), "{cache:?}");
}
