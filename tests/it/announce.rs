//! The hint file's read side (protocol version 3, issue 29): a reader of a dataset's
//! hint file learns which chunks the daemon's disk cache holds, as of the handle's
//! first read, on a real mount of an S3 bucket.

use crate::common;

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;

use common::s3::{moto, unique_bucket};
use common::*;
use scdl_format::hint::{Announcement, HINT_FILE};
use scdl_format::layout::{chunk_dir_name, CHUNKED_DIR};
use scdl_format::ArrayKind;
use scdl_sampler::CachedChunks;

fn announced(path: &std::path::Path) -> Announcement {
    Announcement::parse(&std::fs::read(path).unwrap()).expect("an announcement")
}

#[test]
fn the_announcement_names_exactly_the_chunks_the_cache_holds_whole() {
    let src = tempfile::tempdir().unwrap();
    let spec = small_dataset();
    spec.write_chunked(&src.path().join("datasets/small"))
        .unwrap();
    let server = moto();
    let bucket = unique_bucket("announce");
    server.create_bucket(&bucket);
    server.upload(&bucket, "", src.path());
    let mount = TestMount::start(server.store(&bucket), "", |_| {});
    let flat = mount.path().join("datasets/small");
    let raw = flat.join(CHUNKED_DIR);

    let first = announced(&flat.join(HINT_FILE));
    assert_eq!(first.chunk_rows, spec.chunk_rows as u64);
    assert_eq!(first.cached, Some(vec![]), "nothing is cached yet");
    // A handle keeps the announcement of its first read.
    let early = File::open(flat.join(HINT_FILE)).unwrap();
    let mut head = [0u8; 4];
    early.read_exact_at(&mut head, 0).unwrap();

    // Chunks 1 and 3 read whole, and one array of chunk 2 only.
    for chunk in [1, 3] {
        for kind in ArrayKind::ALL {
            std::fs::read(raw.join(chunk_dir_name(chunk)).join(kind.file_name())).unwrap();
        }
    }
    std::fs::read(
        raw.join(chunk_dir_name(2))
            .join(ArrayKind::Data.file_name()),
    )
    .unwrap();
    mount.settle();

    let now = announced(&flat.join(HINT_FILE));
    assert_eq!(now.cached, Some(vec![1..2, 3..4]));
    assert_eq!(
        announced(&raw.join(HINT_FILE)),
        now,
        "the raw view's hint file says the same"
    );
    assert_eq!(
        mount.status().cache.cached_groups,
        3,
        "chunk 2 is resident in part, and not announced"
    );
    // What the sampler reads through its own handle, past the size the file shows.
    assert!(now.to_string().len() as u64 > std::fs::metadata(flat.join(HINT_FILE)).unwrap().len());
    assert_eq!(
        CachedChunks::read_from(&flat).unwrap(),
        Some(CachedChunks::from_ranges([1..2, 3..4]))
    );

    // pread left the position at 0: this reads the handle's announcement whole.
    let mut early_text = Vec::new();
    (&early).read_to_end(&mut early_text).unwrap();
    assert_eq!(
        Announcement::parse(&early_text),
        Some(first),
        "the early handle's snapshot"
    );
}

/// Reading the hint file over and over (another user's loop of open, read, close)
/// makes one announcement while the cache does not change, not one per handle under
/// the cache's lock; a change of the cache makes the next one anew.
#[test]
fn an_announcement_is_made_once_per_change_of_the_cache_not_per_handle() {
    let src = tempfile::tempdir().unwrap();
    small_dataset()
        .write_chunked(&src.path().join("datasets/small"))
        .unwrap();
    let server = moto();
    let bucket = unique_bucket("announce-once");
    server.create_bucket(&bucket);
    server.upload(&bucket, "", src.path());
    let mount = TestMount::start(server.store(&bucket), "", |_| {});
    let flat = mount.path().join("datasets/small");
    mount.settle();
    let made = || mount.status().counters.announcements_made;
    for _ in 0..20 {
        assert_eq!(announced(&flat.join(HINT_FILE)).cached, Some(vec![]));
    }
    assert_eq!(
        made(),
        1,
        "announcements made for 20 handles of an unchanged cache"
    );

    let chunk = flat.join(CHUNKED_DIR).join(chunk_dir_name(1));
    for kind in ArrayKind::ALL {
        std::fs::read(chunk.join(kind.file_name())).unwrap();
    }
    mount.settle();
    for _ in 0..20 {
        let cached = announced(&flat.join(HINT_FILE)).cached.unwrap();
        assert_eq!(cached, vec![1..2; 1], "chunk 1 alone");
    }
    assert_eq!(made(), 2, "one more once the cache changed");
}
