//! Eight threads reading random ranges of the same and of different files at once get
//! correct bytes, and each part is downloaded exactly once.

use crate::common;

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use common::*;
use scdl_format::layout::HEADER_FILE;
use scdl_format::ArrayKind;
use scdlfs::store::counting::CountReads;
use scdlfs::store::wrapper::HookedStore;

#[test]
fn concurrent_readers_share_each_download() {
    let src = tempfile::tempdir().unwrap();
    let files = plain_files();
    write_files(src.path(), &files);
    let spec = small_dataset();
    spec.write_chunked(&src.path().join("ds")).unwrap();
    let mono = Monolithic::of(&spec);

    let counted = Arc::new(HookedStore::new(
        local_store(src.path()),
        CountReads::default(),
    ));
    let mount = TestMount::start(counted.clone(), "", |_| {});
    let mut targets: Vec<(std::path::PathBuf, Vec<u8>)> = files
        .iter()
        .filter(|(_, bytes)| !bytes.is_empty())
        .map(|(name, bytes)| (mount.path().join(name), bytes.clone()))
        .collect();
    for kind in ArrayKind::ALL {
        targets.push((
            mount.path().join("ds").join(kind.file_name()),
            mono.array(kind).to_vec(),
        ));
    }
    let targets = Arc::new(targets);
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let targets = targets.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(100 + t);
                for i in 0..300 {
                    // Half the threads hammer the same file, half spread out.
                    let which = if t % 2 == 0 {
                        0
                    } else {
                        rng.below(targets.len() as u64) as usize
                    };
                    let (path, want) = &targets[(which + i % 2) % targets.len()];
                    let file = std::fs::File::open(path).unwrap();
                    let offset = rng.below(want.len() as u64);
                    let mut buf = vec![0u8; 1 + rng.below(150_000) as usize];
                    let n = file.read_at(&mut buf, offset).unwrap();
                    let end = (offset as usize + buf.len()).min(want.len());
                    assert_eq!(
                        n,
                        end - offset as usize,
                        "{} at {offset}: a short read before the end",
                        path.display()
                    );
                    assert_eq!(
                        &buf[..n],
                        &want[offset as usize..end],
                        "{} at {offset}",
                        path.display()
                    );
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    mount.settle();
    let counts = counted.hook().snapshot();
    assert!(!counts.is_empty());
    for ((key, range), count) in &counts {
        assert_eq!(*count, 1, "{key} {range:?} was downloaded {count} times");
    }
    // Every read but discovery's of a dataset's header (asked for as the range of its
    // listed size) is a part download, a reader's own bytes (a direct read) or the
    // window of the other value array beside a reader's (an edge). A direct read that
    // lost its race to the download is dropped before its answer, which the double
    // does not count (it counts what was read), while the mount counts it as sent.
    let ranged = counts
        .keys()
        .filter(|(key, _)| !key.ends_with(HEADER_FILE))
        .count() as u64;
    let counters = mount.status().counters;
    let sent = counters.parts_fetched + counters.direct_reads + counters.edges_fetched;
    assert!(
        counters.parts_fetched + counters.edges_fetched <= ranged && ranged <= sent,
        "{ranged} ranges read; {} parts, {} direct reads, {} edges sent",
        counters.parts_fetched,
        counters.direct_reads,
        counters.edges_fetched
    );
}
