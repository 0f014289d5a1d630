//! `--metadata-ttl` on real mounts of moto_server: a bucket that changes while mounted.
//! Once the TTL has passed, a new open reads a replaced object's new version, a new
//! dataset appears and a deleted object is gone; a file opened before the change keeps
//! reading its own version (bytes it had, or EIO for parts the store no longer has),
//! never a byte of the new one. Without a TTL the first listing stands for the mount.

use crate::common;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::time::Duration;

use common::s3::{moto, unique_bucket};
use common::*;
use scdl_format::ArrayKind;

const TTL: Duration = Duration::from_secs(1);
const BIG: &str = "big.bin";
const CHUNK: &str = "ds/chunk_00001/data.npy";

/// A bucket holding the plain files, `big.bin` of 12 parts and the small dataset as
/// `ds/`; returns it with every object's bytes.
fn bucket_with_files() -> (String, BTreeMap<String, Vec<u8>>) {
    let bucket = unique_bucket("ttl");
    moto().create_bucket(&bucket);
    let src = tempfile::tempdir().unwrap();
    let mut files = plain_files();
    files.insert(BIG.into(), pattern(3, 12 * (64 << 10)));
    write_files(src.path(), &files);
    small_dataset()
        .write_chunked(&src.path().join("ds"))
        .unwrap();
    moto().upload(&bucket, "", src.path());
    (bucket, snapshot(src.path()))
}

/// Puts or deletes objects of `bucket` (`None` deletes).
fn change(bucket: &str, objects: &[(&str, Option<&[u8]>)]) {
    let objects = objects
        .iter()
        .map(|(name, bytes)| (name.to_string(), bytes.map(<[u8]>::to_vec)));
    moto().change(bucket, objects);
}

/// An npy file's values: what follows its (version 1) header.
fn values(npy: &[u8]) -> &[u8] {
    &npy[10 + u16::from_le_bytes([npy[8], npy[9]]) as usize..]
}

/// The same npy file with every value byte inverted: same size, other values.
fn inverted_values(npy: &[u8]) -> Vec<u8> {
    let header_len = npy.len() - values(npy).len();
    let mut out = npy.to_vec();
    out[header_len..].iter_mut().for_each(|b| *b ^= 0xff);
    out
}

/// Reads `file` (opened before the bucket changed) whole in parts: each read must be
/// the old bytes or EIO. Returns how many reads got bytes.
fn reads_only_the_old_version(file: &File, old: &[u8], name: &str) -> usize {
    let mut served = 0;
    for offset in (0..old.len()).step_by(64 << 10) {
        let len = (64 << 10).min(old.len() - offset);
        match read_at(file, offset as u64, len) {
            Ok(bytes) => {
                assert!(
                    bytes == old[offset..offset + len],
                    "{name} at {offset}: not the version the file was opened with"
                );
                served += 1;
            }
            Err(error) => assert_eq!(error.raw_os_error(), Some(libc::EIO), "{name}: {error}"),
        }
    }
    served
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_bucket_changed_during_a_mount_shows_its_changes_after_the_ttl_and_open_files_keep_theirs() {
    let (bucket, files) = bucket_with_files();
    let mount = TestMount::start(moto().store(&bucket), "", |s| s.metadata_ttl = Some(TTL));
    let mnt = mount.path();
    let mono = Monolithic::of(&small_dataset());
    let old_big = File::open(mnt.join(BIG)).unwrap();
    assert!(read_at(&old_big, 0, 64 << 10).unwrap() == files[BIG][..64 << 10]);
    let old_flat = File::open(mnt.join("ds/data.npy")).unwrap();
    assert!(read_at(&old_flat, 0, 4096).unwrap() == mono.data[..4096]);

    let new_big = pattern(4, files[BIG].len());
    let new_chunk = inverted_values(&files[CHUNK]);
    let ds2 = tempfile::tempdir().unwrap();
    small_dataset().write_chunked(ds2.path()).unwrap();
    moto().upload(&bucket, "ds2", ds2.path());
    change(
        &bucket,
        &[
            (BIG, Some(&new_big)),
            (CHUNK, Some(&new_chunk)),
            ("tiny.txt", None),
        ],
    );
    std::thread::sleep(TTL + Duration::from_millis(500));

    assert!(
        std::fs::read(mnt.join(BIG)).unwrap() == new_big,
        "a new open reads the new version"
    );
    let (old_values, new_values) = (values(&files[CHUNK]), values(&new_chunk));
    let at = mono
        .data
        .windows(old_values.len())
        .position(|w| w == old_values)
        .expect("chunk 1's values in the flat array");
    let mut want = mono.data.clone();
    want[at..at + new_values.len()].copy_from_slice(new_values);
    assert!(
        std::fs::read(mnt.join("ds/data.npy")).unwrap() == want,
        "the flat view shows the new chunk"
    );
    assert!(
        std::fs::read(mnt.join("ds/row_ptr.npy")).unwrap() == mono.row_ptr,
        "the chunk kept its size and row offsets"
    );
    let names = names_in(&mnt);
    assert!(names.contains(&"ds2".to_owned()), "{names:?}");
    assert!(!names.contains(&"tiny.txt".to_owned()), "{names:?}");
    assert_eq!(
        std::fs::metadata(mnt.join("tiny.txt")).unwrap_err().kind(),
        std::io::ErrorKind::NotFound
    );
    for kind in ArrayKind::ALL {
        let path = mnt.join("ds2").join(kind.file_name());
        assert!(
            std::fs::read(&path).unwrap() == mono.array(kind),
            "{path:?}"
        );
    }

    assert!(reads_only_the_old_version(&old_big, &files[BIG], BIG) >= 1);
    assert!(reads_only_the_old_version(&old_flat, &mono.data, "ds/data.npy") >= 1);
    let counters = mount.status().counters;
    assert!(counters.objects_replaced >= 2, "{counters:?}");
    assert_eq!(counters.datasets_rediscovered, 1, "{counters:?}");
}

#[test]
fn without_a_ttl_a_mount_keeps_its_first_listing() {
    let (bucket, files) = bucket_with_files();
    let mount = TestMount::start(moto().store(&bucket), "", |_| {});
    let mnt = mount.path();
    let before = names_in(&mnt);
    let size = std::fs::metadata(mnt.join(BIG)).unwrap().len();
    let new_big = pattern(4, files[BIG].len() + 1);
    change(&bucket, &[(BIG, Some(&new_big)), ("tiny.txt", None)]);
    let ds2 = tempfile::tempdir().unwrap();
    small_dataset().write_chunked(ds2.path()).unwrap();
    moto().upload(&bucket, "ds2", ds2.path());
    std::thread::sleep(TTL + Duration::from_millis(500));

    assert_eq!(names_in(&mnt), before, "no dataset appears, nothing goes");
    assert_eq!(std::fs::metadata(mnt.join(BIG)).unwrap().len(), size);
    let file = File::open(mnt.join(BIG)).unwrap();
    assert_eq!(
        reads_only_the_old_version(&file, &files[BIG], BIG),
        0,
        "the pinned version is gone from the store: every read fails"
    );
    let counters = mount.status().counters;
    assert_eq!(counters.listings_refreshed, 0, "{counters:?}");
}
