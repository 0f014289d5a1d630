use super::parts_dir::InsertMoment;
use super::test_files::{dir_bytes, flip_bit, SmallTmpfs};
use super::*;
use crate::parts::spans_touched;
use crate::parts::ObjectId;
use adopt::{ListedObject, PartFileName, SourceRecord};
use part_file::BLOCK_LEN;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

pub(super) const ORIGIN: PartOrigin = PartOrigin {
    key: "k",
    etag: "e",
    object_offset: 0,
};

/// Bytes a part of `len` data bytes takes on disk.
fn disk_len(len: usize) -> u64 {
    (PartHeader::of(ORIGIN.key, ORIGIN.etag, 0, &vec![0; len]).encoded_len() + len) as u64
}

pub(super) fn owner() -> CacheOwner {
    CacheOwner {
        source: "s3://bucket/atlas".into(),
        endpoint: None,
        reset: false,
    }
}

pub(super) fn key(object: u64) -> PartKey {
    PartKey {
        object: ObjectId(object),
        index: 0,
    }
}

fn only_file(dir: &Path) -> PathBuf {
    let mut files: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1);
    files.pop().unwrap()
}

/// A cache in `dir` with room for everything a test here writes (1 GiB).
fn roomy_cache(dir: &Path) -> Arc<DiskCache> {
    Arc::new(
        DiskCache::open(
            &crate::cache_dir_check::prepare(dir).unwrap(),
            &owner(),
            1 << 30,
            None,
        )
        .unwrap(),
    )
}

/// A cache holding one part of three blocks and a bit, its data, and its file.
pub(super) fn cache_with_one_part(dir: &Path) -> (Arc<DiskCache>, Vec<u8>, PathBuf) {
    let cache = roomy_cache(dir);
    let data: Vec<u8> = (0..3 * BLOCK_LEN as usize + 100)
        .map(|i| (i % 251) as u8)
        .collect();
    assert!(cache.insert(key(1), None, ORIGIN, &data));
    let file = only_file(&cache.parts_dir());
    (cache, data, file)
}

#[test]
fn the_directory_stays_within_budget_and_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let part = 10_000usize;
    let budget = 3 * disk_len(part);
    let cache = Arc::new(
        DiskCache::open(
            &crate::cache_dir_check::prepare(dir.path()).unwrap(),
            &owner(),
            budget,
            None,
        )
        .unwrap(),
    );
    for object in 0..10u64 {
        let data = vec![object as u8; part];
        assert!(cache.insert(key(object), None, ORIGIN, &data));
        assert!(dir_bytes(&cache.parts_dir()) <= budget);
    }
    let pinned = cache.get(key(9), Recency::Use).unwrap();
    let mut buf = [0u8; 4];
    pinned.read_exact_at(&mut buf, 5).unwrap();
    assert_eq!(buf, [9; 4]);
    assert!(cache.get(key(0), Recency::Use).is_none());
    assert_eq!(cache.stats().evicted_parts, 7);
}

/// Runs inserts on named threads with a hook that makes the race of issue 10
/// happen whenever the code allows it: when a thread is about to delete a part
/// file, it starts the `writer` thread's insert and waits (up to a second) for the
/// writer's file to be on disk. Records the directory's largest size seen each time
/// a file has been written. Threads named `dup` meet before either commits, so both
/// downloads of one part are on disk at once.
fn race(
    cache: &Arc<DiskCache>,
    inserts: Vec<(&'static str, PartKey, Vec<u8>)>,
    writer: (PartKey, Vec<u8>),
) -> u64 {
    use std::sync::mpsc;
    use std::time::Duration;
    let largest = Arc::new(AtomicU64::new(0));
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (written_tx, written_rx) = mpsc::channel::<()>();
    let (go_tx, written_rx) = (Mutex::new(Some(go_tx)), Mutex::new(written_rx));
    let dups = std::sync::Barrier::new(2);
    let parts_dir = cache.parts_dir();
    let hook = {
        let largest = largest.clone();
        move |step: InsertMoment| {
            let thread = std::thread::current();
            let name = thread.name().unwrap_or_default();
            match step {
                InsertMoment::Written => {
                    largest.fetch_max(dir_bytes(&parts_dir), Ordering::SeqCst);
                    match name {
                        "writer" => written_tx.send(()).unwrap(),
                        "dup" => {
                            dups.wait();
                        }
                        _ => {}
                    }
                }
                InsertMoment::Deleting if name != "writer" => {
                    if let Some(go) = go_tx.lock().take() {
                        go.send(()).unwrap();
                        let _ = written_rx.lock().recv_timeout(Duration::from_secs(1));
                    }
                }
                InsertMoment::Deleting => {}
            }
        }
    };
    *cache.parts.test_hook.lock() = Some(Arc::new(hook));
    std::thread::scope(|scope| {
        let writer_thread = std::thread::Builder::new()
            .name("writer".into())
            .spawn_scoped(scope, move || {
                go_rx.recv().unwrap();
                assert!(cache.insert(writer.0, None, ORIGIN, &writer.1));
            })
            .unwrap();
        for (name, key, data) in &inserts {
            std::thread::Builder::new()
                .name(name.to_string())
                .spawn_scoped(scope, move || {
                    assert!(cache.insert(*key, None, ORIGIN, data));
                })
                .unwrap();
        }
        writer_thread.join().unwrap();
    });
    *cache.parts.test_hook.lock() = None;
    largest.load(Ordering::SeqCst)
}

#[test]
fn evicted_files_are_deleted_before_their_room_is_reused() {
    let dir = tempfile::tempdir().unwrap();
    let unit = disk_len(10_000);
    let budget = 3 * unit;
    let cache = Arc::new(
        DiskCache::open(
            &crate::cache_dir_check::prepare(dir.path()).unwrap(),
            &owner(),
            budget,
            None,
        )
        .unwrap(),
    );
    let big = (2 * unit - disk_len(0)) as usize;
    assert_eq!(disk_len(big), 2 * unit);
    assert!(cache.insert(key(1), None, ORIGIN, &vec![1; big]));
    assert!(cache.insert(key(2), None, ORIGIN, &[2; 10_000]));
    // Part 3 evicts part 1, which frees twice what part 3 takes: part 4 then fits
    // without evicting anything, and must not be written while part 1 is on disk.
    let largest = race(
        &cache,
        vec![("evictor", key(3), vec![3; 10_000])],
        (key(4), vec![4; 10_000]),
    );
    assert!(
        largest <= budget,
        "directory reached {largest}, budget {budget}"
    );
    assert_eq!(dir_bytes(&cache.parts_dir()), budget);
    assert_eq!(cache.stats().evicted_parts, 1);
}

#[test]
fn a_losing_duplicate_is_deleted_before_its_room_is_reused() {
    let dir = tempfile::tempdir().unwrap();
    let unit = disk_len(10_000);
    let budget = 3 * unit;
    let cache = Arc::new(
        DiskCache::open(
            &crate::cache_dir_check::prepare(dir.path()).unwrap(),
            &owner(),
            budget,
            None,
        )
        .unwrap(),
    );
    assert!(cache.insert(key(2), None, ORIGIN, &[2; 10_000]));
    let _kept = cache.get(key(2), Recency::Use).unwrap();
    // Two downloads of part 5 both reserve and write; the loser's reservation must
    // not be reused by part 6 while the loser's file is still on disk.
    let largest = race(
        &cache,
        vec![
            ("dup", key(5), vec![5; 10_000]),
            ("dup", key(5), vec![5; 10_000]),
        ],
        (key(6), vec![6; 10_000]),
    );
    assert!(
        largest <= budget,
        "directory reached {largest}, budget {budget}"
    );
    assert_eq!(dir_bytes(&cache.parts_dir()), budget);
}

#[test]
fn a_full_disk_turns_caching_off_once_and_on_again() {
    let disk = SmallTmpfs::mount("256k");
    let mut cache = DiskCache::open(
        &crate::cache_dir_check::prepare(&disk.path()).unwrap(),
        &owner(),
        1 << 20,
        None,
    )
    .unwrap();
    cache.disk.retry_after = Duration::from_millis(200);
    let cache = Arc::new(cache);
    assert!(cache.insert(key(1), None, ORIGIN, &[1; 100]));
    let kept = cache.get(key(1), Recency::Use).unwrap();
    let ballast = disk.path().join("ballast");
    let _ = fs::write(&ballast, vec![0u8; 256 << 10]);
    assert!(!cache.insert(key(2), None, ORIGIN, &[2; 8192]));
    let stats = cache.stats();
    assert!(stats.disk_unusable.is_some(), "{stats:?}");
    // Room again at once: the disk is not tried again before the retry delay.
    fs::remove_file(&ballast).unwrap();
    assert!(!cache.insert(key(3), None, ORIGIN, &[3; 100]));
    assert_eq!(cache.stats().parts_not_cached_for_disk_errors, 2);
    let mut buf = [0u8; 10];
    kept.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [1; 10], "parts already open still serve, checked");
    std::thread::sleep(Duration::from_millis(250));
    assert!(cache.insert(key(4), None, ORIGIN, &[4; 100]));
    assert_eq!(cache.stats().disk_unusable, None);
}

/// The cache holds the directory it checked, not its path: a directory made in its
/// place after it was removed is not the one checked, and nothing is written there.
#[test]
fn a_removed_directory_turns_caching_off_and_one_made_in_its_place_is_not_used() {
    let dir = tempfile::tempdir().unwrap();
    let mut cache = DiskCache::open(
        &crate::cache_dir_check::prepare(dir.path()).unwrap(),
        &owner(),
        1 << 20,
        None,
    )
    .unwrap();
    cache.disk.retry_after = Duration::from_millis(200);
    let cache = Arc::new(cache);
    assert!(cache.insert(key(1), None, ORIGIN, &[1; 100]));
    let kept = cache.get(key(1), Recency::Use).unwrap();
    fs::remove_dir_all(dir.path()).unwrap();
    assert!(!cache.insert(key(2), None, ORIGIN, &[2; 100]));
    let stats = cache.stats();
    assert!(stats.disk_unusable.is_some(), "{stats:?}");
    fs::create_dir_all(cache.parts_dir()).unwrap();
    std::thread::sleep(Duration::from_millis(250));
    assert!(!cache.insert(key(3), None, ORIGIN, &[3; 100]));
    assert_eq!(fs::read_dir(cache.parts_dir()).unwrap().count(), 0);
    assert_eq!(cache.stats().parts_not_cached_for_disk_errors, 2);
    let mut buf = [0u8; 10];
    kept.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [1; 10], "parts already open still serve, checked");
}

#[test]
fn the_directory_and_files_are_private_and_symlinks_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Arc::new(
        DiskCache::open(
            &crate::cache_dir_check::prepare(dir.path()).unwrap(),
            &owner(),
            1 << 20,
            None,
        )
        .unwrap(),
    );
    assert!(cache.insert(key(1), None, ORIGIN, &[1; 100]));
    let mode = |path: &Path| fs::metadata(path).unwrap().permissions().mode() & 0o777;
    let root = dir.path().join(adopt::layout_dir_name());
    assert_eq!(mode(&root), 0o700);
    assert_eq!(mode(&cache.parts_dir()), 0o700);
    assert_eq!(mode(&root.join("lock")), 0o600);
    assert_eq!(mode(&only_file(&cache.parts_dir())), 0o600);
}

fn open_cache(dir: &Path, owner: &CacheOwner) -> io::Result<DiskCache> {
    DiskCache::open(
        &crate::cache_dir_check::prepare(dir).unwrap(),
        owner,
        1 << 20,
        None,
    )
}

/// Every file and directory under the cache directory is reached relative to the one
/// checked, without following a link: a link planted in the place of the layout
/// directory, its source record or a part file is refused or removed, and what it
/// points to is left as it was (opened by path, the cache made `parts` in the target of
/// a linked layout directory before refusing it, and took a linked source record of
/// its own source for its own).
#[test]
fn a_link_planted_in_the_cache_directory_is_never_followed() {
    let outside = tempfile::tempdir().unwrap();
    let outside = outside.path();
    fs::create_dir(outside.join("dir")).unwrap();
    fs::write(outside.join("secret"), b"not the cache's").unwrap();
    let ours = SourceRecord::of(&owner().source, None).encode();
    fs::write(outside.join("record.json"), &ours).unwrap();
    let untouched = || {
        assert_eq!(fs::read_dir(outside.join("dir")).unwrap().count(), 0);
        assert_eq!(
            fs::read(outside.join("secret")).unwrap(),
            b"not the cache's"
        );
        assert_eq!(fs::read(outside.join("record.json")).unwrap(), ours);
    };
    let link =
        |target: &str, at: &Path| std::os::unix::fs::symlink(outside.join(target), at).unwrap();

    let planted = tempfile::tempdir().unwrap();
    link("dir", &planted.path().join(adopt::layout_dir_name()));
    let refused = open_cache(planted.path(), &owner()).err().unwrap();
    assert!(refused.to_string().contains("symbolic link"), "{refused}");
    untouched();

    let planted = tempfile::tempdir().unwrap();
    drop(open_cache(planted.path(), &owner()).unwrap());
    let layout = planted.path().join(adopt::layout_dir_name());
    fs::remove_file(layout.join(adopt::SOURCE_RECORD)).unwrap();
    link("record.json", &layout.join(adopt::SOURCE_RECORD));
    let refused = open_cache(planted.path(), &owner()).err().unwrap();
    assert!(
        refused.to_string().contains("unreadable source record"),
        "{refused}"
    );
    let reset = CacheOwner {
        reset: true,
        ..owner()
    };
    drop(open_cache(planted.path(), &reset).unwrap());
    assert!(fs::symlink_metadata(layout.join(adopt::SOURCE_RECORD))
        .unwrap()
        .is_file());
    untouched();

    let part = PartFileName {
        seq: 1,
        part: adopt::part_id(ORIGIN.key, ORIGIN.etag, 0),
        len: disk_len(100),
    };
    link("secret", &layout.join("parts").join(part.to_string()));
    let cache = open_cache(planted.path(), &owner()).unwrap();
    assert_eq!(cache.stats().unclaimed_parts, 0);
    assert_eq!(fs::read_dir(cache.parts_dir()).unwrap().count(), 0);
    untouched();
}

#[test]
fn a_second_daemon_cannot_share_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let _first = DiskCache::open(
        &crate::cache_dir_check::prepare(dir.path()).unwrap(),
        &owner(),
        1 << 20,
        None,
    )
    .unwrap();
    let second = DiskCache::open(
        &crate::cache_dir_check::prepare(dir.path()).unwrap(),
        &owner(),
        1 << 20,
        None,
    );
    assert!(second.is_err());
}

#[test]
fn pinned_parts_leave_new_parts_uncached() {
    let dir = tempfile::tempdir().unwrap();
    let budget = disk_len(100);
    let cache = Arc::new(
        DiskCache::open(
            &crate::cache_dir_check::prepare(dir.path()).unwrap(),
            &owner(),
            budget,
            None,
        )
        .unwrap(),
    );
    assert!(cache.insert(key(1), None, ORIGIN, &[1; 100]));
    let pinned = cache.get(key(1), Recency::Use).unwrap();
    assert!(!cache.insert(key(2), None, ORIGIN, &[2; 100]));
    drop(pinned);
    assert!(cache.insert(key(2), None, ORIGIN, &[2; 100]));
    assert_eq!(cache.stats().parts_not_cached_for_lack_of_room, 1);
}

#[test]
fn a_flipped_bit_is_caught_and_drops_the_part() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, data, path) = cache_with_one_part(dir.path());
    let data_offset = fs::metadata(&path).unwrap().len() - data.len() as u64;
    // A byte in the third block.
    flip_bit(&path, data_offset + 2 * BLOCK_LEN as u64 + 7);
    let pinned = cache.get(key(1), Recency::Use).unwrap();
    let mut buf = vec![0u8; 1000];
    pinned.read_exact_at(&mut buf, 10).unwrap();
    assert_eq!(
        buf,
        data[10..1010],
        "blocks the read does not touch are not checked"
    );
    let error = pinned
        .read_exact_at(&mut buf, 2 * BLOCK_LEN as u64 + 500)
        .unwrap_err();
    assert!(
        matches!(error, CacheError::Corrupt { block: 2, .. }),
        "{error}"
    );
    assert!(
        cache.get(key(1), Recency::Use).is_none(),
        "dropped from the index"
    );
    assert_eq!(
        fs::read_dir(cache.parts_dir()).unwrap().count(),
        0,
        "file deleted"
    );
    let stats = cache.stats();
    assert_eq!((stats.corrupt_parts_dropped, stats.cached_bytes), (1, 0));
    // Another read through the stale handle fails again, without counting twice.
    assert!(pinned
        .read_exact_at(&mut buf, 2 * BLOCK_LEN as u64)
        .is_err());
    drop(pinned);
    assert_eq!(cache.stats().corrupt_parts_dropped, 1);
    assert!(cache.insert(key(1), None, ORIGIN, &data), "fetched again");
    let again = cache.get(key(1), Recency::Use).unwrap();
    again
        .read_exact_at(&mut buf, 2 * BLOCK_LEN as u64 + 500)
        .unwrap();
    assert_eq!(buf, data[2 * BLOCK_LEN as usize + 500..][..1000]);
}

fn listed(object: u64, etag: &str, size: u64, group: Option<GroupId>) -> ListedObject {
    ListedObject {
        id: ObjectId(object),
        key: ORIGIN.key.into(),
        etag: Some(etag.into()),
        size,
        group,
    }
}

/// A cache of `parts` parts of 1000 bytes of object `ORIGIN.key`, closed again.
fn earlier_mount(dir: &Path, parts: u64) {
    let cache = roomy_cache(dir);
    for index in 0..parts {
        let origin = PartOrigin {
            object_offset: index * 1000,
            ..ORIGIN
        };
        assert!(cache.insert(
            PartKey {
                object: ObjectId(9),
                index
            },
            None,
            origin,
            &[index as u8; 1000]
        ));
    }
}

/// The last ten bytes of a resident part of 1000 bytes.
fn last_bytes(cache: &Arc<DiskCache>, object: u64, index: u64) -> [u8; 10] {
    let part = cache
        .get(
            PartKey {
                object: ObjectId(object),
                index,
            },
            Recency::Use,
        )
        .expect("resident");
    let mut buf = [0u8; 10];
    part.read_exact_at(&mut buf, 990).unwrap();
    buf
}

#[test]
fn a_remount_adopts_the_parts_of_an_unchanged_object_into_its_group() {
    let dir = tempfile::tempdir().unwrap();
    earlier_mount(dir.path(), 3);
    let cache = roomy_cache(dir.path());
    let stats = cache.stats();
    assert_eq!(
        (stats.unclaimed_parts, stats.cached_bytes),
        (3, 3 * disk_len(1000))
    );
    cache.adopt_now();
    // Ids are the new mount's: the object is listed under another id now.
    cache.object_listed(listed(4, ORIGIN.etag, 3000, Some(GroupId(2))), 1000);
    let stats = cache.stats();
    assert_eq!(
        (
            stats.adopted_parts,
            stats.unclaimed_parts,
            stats.cached_groups
        ),
        (3, 0, 1)
    );
    assert_eq!(last_bytes(&cache, 4, 2), [2; 10]);
    assert!(
        cache.insert(key(5), None, ORIGIN, &[5; 1000]),
        "new files take new names"
    );
    assert_eq!(fs::read_dir(cache.parts_dir()).unwrap().count(), 4);
}

#[test]
fn an_object_listed_before_its_headers_are_read_still_adopts() {
    let dir = tempfile::tempdir().unwrap();
    earlier_mount(dir.path(), 2);
    let cache = roomy_cache(dir.path());
    cache.object_listed(listed(0, ORIGIN.etag, 2000, None), 1000);
    assert_eq!(cache.stats().adopted_parts, 0);
    cache.adopt_now();
    assert_eq!(cache.stats().adopted_parts, 2);
}

#[test]
fn parts_of_a_changed_object_or_another_part_size_are_removed() {
    for (etag, size, part_size) in [("\"v2\"", 2000, 1000), (ORIGIN.etag, 2000, 2000)] {
        let dir = tempfile::tempdir().unwrap();
        earlier_mount(dir.path(), 2);
        let cache = roomy_cache(dir.path());
        cache.adopt_now();
        cache.object_listed(listed(0, etag, size, None), part_size);
        let stats = cache.stats();
        assert_eq!(
            (
                stats.adopted_parts,
                stats.stale_parts_removed,
                stats.cached_bytes
            ),
            (0, 2, 0)
        );
        assert_eq!(fs::read_dir(cache.parts_dir()).unwrap().count(), 0);
    }
}

#[test]
fn bad_headers_and_torn_writes_are_removed_and_bad_data_is_never_served() {
    let dir = tempfile::tempdir().unwrap();
    earlier_mount(dir.path(), 3);
    let parts_dir = dir.path().join(adopt::layout_dir_name()).join("parts");
    let mut files: Vec<_> = fs::read_dir(&parts_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    flip_bit(&files[0], 20); // in the header
    let data_start = fs::metadata(&files[1]).unwrap().len() - 1000;
    flip_bit(&files[1], data_start + 5); // in the data
    fs::write(parts_dir.join("00000000000000ff.part.tmp"), [1; 100]).unwrap();
    let cache = roomy_cache(dir.path());
    cache.adopt_now();
    cache.object_listed(listed(0, ORIGIN.etag, 3000, None), 1000);
    let stats = cache.stats();
    assert_eq!(
        (stats.adopted_parts, stats.stale_parts_removed),
        (2, 2),
        "{stats:?}"
    );
    assert!(cache
        .get(
            PartKey {
                object: ObjectId(0),
                index: 0
            },
            Recency::Use
        )
        .is_none());
    let bad = cache
        .get(
            PartKey {
                object: ObjectId(0),
                index: 1,
            },
            Recency::Use,
        )
        .unwrap();
    let mut buf = [0u8; 10];
    assert!(matches!(
        bad.read_exact_at(&mut buf, 0),
        Err(CacheError::Corrupt { .. })
    ));
    assert_eq!(fs::read_dir(&parts_dir).unwrap().count(), 1);
}

/// The part files of a cache directory, oldest first.
fn part_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<_> = fs::read_dir(dir.join(adopt::layout_dir_name()).join("parts"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

#[test]
fn a_read_claims_its_own_part_before_the_headers_are_read() {
    let dir = tempfile::tempdir().unwrap();
    earlier_mount(dir.path(), 4);
    let files = part_files(dir.path());
    flip_bit(&files[2], 20); // part 2's header
    let cache = roomy_cache(dir.path());
    let object = listed(4, ORIGIN.etag, 4000, None);
    assert!(cache.claims_pending());
    assert!(cache.claim_own(&object, 1000, 1));
    let stats = cache.stats();
    assert_eq!(
        (
            stats.adopted_parts,
            stats.adopted_by_reads,
            stats.unclaimed_parts
        ),
        (1, 1, 3)
    );
    assert_eq!(last_bytes(&cache, 4, 1), [1; 10]);
    assert!(!cache.claim_own(&object, 1000, 2), "a damaged header");
    assert!(!files[2].exists(), "removed, never served");
    let changed = listed(4, "\"v2\"", 4000, None);
    assert!(
        !cache.claim_own(&changed, 1000, 3),
        "no file of that version"
    );
    assert!(files[3].exists());
    // The background adopts the rest and finds the claimed part taken.
    cache.adopt_now();
    assert!(!cache.claims_pending());
    cache.object_listed(object, 1000);
    let stats = cache.stats();
    assert_eq!(
        (
            stats.adopted_parts,
            stats.unclaimed_parts,
            stats.stale_parts_removed
        ),
        (3, 0, 1)
    );
}

#[test]
fn a_read_of_another_part_size_removes_the_file_it_finds() {
    let dir = tempfile::tempdir().unwrap();
    earlier_mount(dir.path(), 2);
    let cache = roomy_cache(dir.path());
    // Part 0 at 2000 bytes a part starts where the earlier mount's part 0 did.
    assert!(!cache.claim_own(&listed(4, ORIGIN.etag, 2000, None), 2000, 0));
    let stats = cache.stats();
    assert_eq!((stats.stale_parts_removed, stats.unclaimed_parts), (1, 1));
}

#[test]
fn the_budget_counts_what_the_names_declare_until_the_headers_are_read() {
    let dir = tempfile::tempdir().unwrap();
    earlier_mount(dir.path(), 3);
    // Cut short behind the daemon's back (a power loss after the rename).
    let cut = &part_files(dir.path())[0];
    let full = fs::metadata(cut).unwrap().len();
    File::options()
        .write(true)
        .open(cut)
        .unwrap()
        .set_len(full / 2)
        .unwrap();
    let budget = 3 * disk_len(1000);
    let cache = Arc::new(
        DiskCache::open(
            &crate::cache_dir_check::prepare(dir.path()).unwrap(),
            &owner(),
            budget,
            None,
        )
        .unwrap(),
    );
    assert_eq!(
        cache.stats().cached_bytes,
        budget,
        "at least what is on disk"
    );
    assert!(dir_bytes(&cache.parts_dir()) < budget);
    cache.adopt_now();
    let stats = cache.stats();
    assert_eq!(
        (stats.stale_parts_removed, stats.cached_bytes),
        (1, 2 * disk_len(1000)),
        "the cut file removed, its room released"
    );
    assert!(cache.insert(key(7), None, ORIGIN, &[7; 1000]));
    assert_eq!(cache.stats().unclaimed_parts, 2, "no stray gave way");
    assert_eq!(dir_bytes(&cache.parts_dir()), budget);
}

#[test]
fn a_smaller_budget_shrinks_the_directory_at_open_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    earlier_mount(dir.path(), 5);
    let budget = 2 * disk_len(1000);
    let cache = Arc::new(
        DiskCache::open(
            &crate::cache_dir_check::prepare(dir.path()).unwrap(),
            &owner(),
            budget,
            None,
        )
        .unwrap(),
    );
    assert!(dir_bytes(&cache.parts_dir()) <= budget);
    cache.adopt_now();
    cache.object_listed(listed(0, ORIGIN.etag, 5000, None), 1000);
    assert!(
        cache.contains(PartKey {
            object: ObjectId(0),
            index: 4
        }),
        "the newest kept"
    );
    // Unclaimed strays make room for new parts, and the budget holds.
    assert!(cache.insert(key(7), None, ORIGIN, &[7; 1000]));
    assert!(dir_bytes(&cache.parts_dir()) <= budget);
}

#[test]
fn unclaimed_parts_give_way_to_new_ones_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    earlier_mount(dir.path(), 3);
    let budget = 3 * disk_len(1000);
    let cache = Arc::new(
        DiskCache::open(
            &crate::cache_dir_check::prepare(dir.path()).unwrap(),
            &owner(),
            budget,
            None,
        )
        .unwrap(),
    );
    for object in 10..13 {
        assert!(cache.insert(key(object), None, ORIGIN, &[1; 1000]));
        assert!(dir_bytes(&cache.parts_dir()) <= budget);
    }
    assert_eq!(cache.stats().unclaimed_parts, 0);
}

#[test]
fn a_cache_of_another_source_or_version_is_refused_unless_reset() {
    let dir = tempfile::tempdir().unwrap();
    earlier_mount(dir.path(), 1);
    let other = CacheOwner {
        source: "s3://another/one".into(),
        ..owner()
    };
    let refused = open_cache(dir.path(), &other).err().unwrap();
    assert!(
        refused
            .to_string()
            .contains("belongs to the source s3://bucket/atlas"),
        "{refused}"
    );
    let reset = CacheOwner {
        reset: true,
        ..other
    };
    let cache = open_cache(dir.path(), &reset).unwrap();
    assert_eq!(fs::read_dir(cache.parts_dir()).unwrap().count(), 0);
    drop(cache);

    let old = tempfile::tempdir().unwrap();
    fs::create_dir_all(old.path().join("scdlfs-v1/parts")).unwrap();
    open_cache(old.path(), &owner()).unwrap();
    assert!(
        !old.path().join("scdlfs-v1").exists(),
        "the first layout, emptied at every mount by its versions, is removed unasked"
    );

    let second = tempfile::tempdir().unwrap();
    let record = |source: &str| {
        let mut record = SourceRecord::of(source, None);
        record.layout_version = 2;
        record.encode()
    };
    fs::create_dir_all(second.path().join("scdlfs-cache-v2/parts")).unwrap();
    fs::write(
        second.path().join("scdlfs-cache-v2/source.json"),
        record("s3://another/one"),
    )
    .unwrap();
    let refused = open_cache(second.path(), &owner()).err().unwrap();
    assert!(
        refused.to_string().contains("(scdlfs-cache-v2)"),
        "another source's cache of the second layout is refused: {refused}"
    );
    fs::write(
        second.path().join("scdlfs-cache-v2/source.json"),
        record(&owner().source),
    )
    .unwrap();
    open_cache(second.path(), &owner()).unwrap();
    assert!(
        !second.path().join("scdlfs-cache-v2").exists(),
        "the source's own cache of the second layout is removed unasked"
    );

    let newer = tempfile::tempdir().unwrap();
    fs::create_dir_all(newer.path().join("scdlfs-cache-v9/parts")).unwrap();
    let refused = open_cache(newer.path(), &owner()).err().unwrap();
    assert!(
        refused
            .to_string()
            .contains("another scdlfs version (scdlfs-cache-v9)"),
        "{refused}"
    );
    let reset = CacheOwner {
        reset: true,
        ..owner()
    };
    open_cache(newer.path(), &reset).unwrap();
    assert!(!newer.path().join("scdlfs-cache-v9").exists());
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    /// Any read of an intact part returns exactly its bytes; with one byte flipped,
    /// a read returns its bytes exactly when it does not touch that byte's block.
    #[test]
    fn reads_return_the_bytes_or_fail_on_a_touched_bad_block(
        len in 1usize..4 * BLOCK_LEN as usize,
        reads in proptest::collection::vec((0.0f64..1.0, 0.0f64..1.0), 1..8),
        flip in proptest::option::of(0.0f64..1.0),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let cache = roomy_cache(dir.path());
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 256) as u8).collect();
        assert!(cache.insert(key(1), None, ORIGIN, &data));
        let flipped = flip.map(|f| (f * len as f64) as u64);
        if let Some(at) = flipped {
            let path = only_file(&cache.parts_dir());
            flip_bit(&path, fs::metadata(&path).unwrap().len() - len as u64 + at);
        }
        let pinned = cache.get(key(1), Recency::Use).unwrap();
        for (a, b) in reads {
            let start = (a * len as f64) as u64;
            let end = start + (b * (len as u64 - start) as f64) as u64;
            let mut buf = vec![0u8; (end - start) as usize];
            let result = pinned.read_exact_at(&mut buf, start);
            let bad_block_touched = flipped.is_some_and(|at| {
                spans_touched(&(start..end), BLOCK_LEN as u64).contains(&(at / BLOCK_LEN as u64))
            });
            if bad_block_touched {
                proptest::prop_assert!(result.is_err());
            } else {
                proptest::prop_assert!(result.is_ok());
                proptest::prop_assert_eq!(&buf[..], &data[start as usize..end as usize]);
            }
        }
    }
}
