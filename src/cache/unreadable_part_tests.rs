//! Our own disk never fails a read: a cached part whose file fails under the cache is
//! dropped, counted and reported as such, so that the read path fetches it again; and
//! a read never trips over another reader's read-ahead advice.

use std::fs;

use super::tests::{cache_with_one_part, key, ORIGIN};
use super::*;
use part_file::BLOCK_LEN;

#[test]
fn a_part_file_truncated_under_a_reader_is_dropped_and_counted_as_unreadable() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, data, path) = cache_with_one_part(dir.path());
    let data_offset = fs::metadata(&path).unwrap().len() - data.len() as u64;
    let pinned = cache.get(key(1), Recency::Use).unwrap();
    // Cut in the second block, through the descriptor the cache holds open.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(data_offset + BLOCK_LEN as u64 + 10)
        .unwrap();
    let mut buf = vec![0u8; 1000];
    pinned.read_exact_at(&mut buf, 10).unwrap();
    assert_eq!(buf, data[10..1010], "the bytes still on disk are served");
    let error = pinned
        .read_exact_at(&mut buf, 2 * BLOCK_LEN as u64)
        .unwrap_err();
    assert!(matches!(error, CacheError::Unreadable { .. }), "{error}");
    assert!(
        matches!(
            crate::error::FsError::from(error),
            crate::error::FsError::CacheCorrupt(_)
        ),
        "the read path fetches a dropped part again"
    );
    assert!(cache.get(key(1), Recency::Use).is_none(), "dropped");
    assert_eq!(fs::read_dir(cache.parts_dir()).unwrap().count(), 0);
    // Read again through the stale handle: fails again, counted once.
    assert!(pinned
        .read_exact_at(&mut buf, 2 * BLOCK_LEN as u64)
        .is_err());
    drop(pinned);
    let stats = cache.stats();
    assert_eq!(
        (
            stats.unreadable_parts_dropped,
            stats.corrupt_parts_dropped,
            stats.cached_bytes
        ),
        (1, 0, 0)
    );
    assert!(cache.insert(key(1), None, ORIGIN, &data), "fetched again");
    let again = cache.get(key(1), Recency::Use).unwrap();
    again.read_exact_at(&mut buf, 2 * BLOCK_LEN as u64).unwrap();
    assert_eq!(buf, data[2 * BLOCK_LEN as usize..][..1000]);
}

/// Two readers of one part read the clock, and the later reading may advise first:
/// the other then finds the advice newer than its own clock (it used to subtract, and
/// overflow).
#[test]
fn a_read_after_advice_newer_than_its_clock_reads() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, data, _) = cache_with_one_part(dir.path());
    let pinned = cache.get(key(1), Recency::Use).unwrap();
    let later = cache.read_advice.opened.elapsed().as_millis() as u64 + 60_000;
    pinned.file.advised_at_ms.store(later, Ordering::Relaxed);
    let mut buf = vec![0u8; 100];
    pinned.read_exact_at(&mut buf, 5).unwrap();
    assert_eq!(buf, data[5..105]);
}

/// A part's first read advises the kernel to read the whole part, unless the mount's
/// read-around brings the parts in as it reads its windows through them.
#[test]
fn a_first_read_advises_its_whole_part_unless_the_read_around_reads_ahead() {
    for read_around_reads_ahead in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (cache, data, _) = cache_with_one_part(dir.path());
        if read_around_reads_ahead {
            cache.leave_read_ahead_to_read_around();
        }
        let pinned = cache.get(key(1), Recency::Use).unwrap();
        let mut buf = vec![0u8; 100];
        pinned.read_exact_at(&mut buf, 5).unwrap();
        assert_eq!(buf, data[5..105]);
        let advised = pinned.file.advised_at_ms.load(Ordering::Relaxed) != 0;
        assert_eq!(advised, !read_around_reads_ahead);
    }
}
