//! Sizes and counts that a store reports are not trusted: an object listed far larger
//! than it is, a listing longer than any dataset's. Whatever the store says, the daemon's
//! memory stays bounded, reads get the right bytes or EIO, and listings end.

use crate::common;

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use common::cli_mount::CliMount;
use common::faulty_mount::judged_read;
use common::proxy::{Fault, FaultProxy, Request};
use common::s3::{moto, unique_bucket};
use common::*;
use futures::stream::{self, BoxStream, StreamExt};
use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{ListResult, ObjectMeta, ObjectStore, ObjectStoreExt, PutPayload};
use scdlfs::catalog::tree::MAX_LISTED_ENTRIES;
use scdlfs::error::FsError;
use scdlfs::mount::assemble;
use scdlfs::store::wrapper::{HookedStore, StoreHook};

const ROOT: u64 = 1;

/// A petabyte: one read near its end made the read-around's marks of the file 32 GiB.
const PETABYTE: u64 = 1 << 50;

fn is_listing(request: &Request) -> bool {
    request.method == "GET" && request.path.contains("list-type=2")
}

#[test]
fn an_object_listed_as_a_petabyte_leaves_the_daemon_small_and_reads_right_or_eio() {
    let moto = moto();
    let bucket = unique_bucket("listed-petabyte");
    moto.create_bucket(&bucket);
    let files = plain_files();
    let dir = tempfile::tempdir().unwrap();
    write_files(dir.path(), &files);
    moto.upload(&bucket, "data", dir.path());
    let proxy = FaultProxy::start(&moto.endpoint);
    proxy.set_rule(|r| is_listing(r).then_some(Fault::ListedSizes(PETABYTE)));
    let endpoint = proxy.endpoint();
    let key = OsString::from("test");
    let mount = CliMount::start(
        &format!("s3://{bucket}/data"),
        &[
            "--endpoint-url",
            &endpoint,
            "--read-part-size",
            "64KiB",
            "--cache-read-around",
            "8MiB",
            "--read-timeout",
            "5s",
        ],
        &[("AWS_ACCESS_KEY_ID", &key), ("AWS_SECRET_ACCESS_KEY", &key)],
    );
    let name = "nested/big.bin";
    let file = File::open(mount.path().join(name)).unwrap();
    assert_eq!(
        file.metadata().unwrap().len(),
        PETABYTE,
        "the lie was not listed"
    );
    let before = mount.status().memory;

    // The bytes the object has are served as they are; the ones it lacks are EIO.
    let want = &files[name];
    let start = judged_read(&file, want, 0, 4096);
    assert_eq!(start.ok, 1, "{start}");
    for offset in [PETABYTE - 4096, PETABYTE - (8 << 20) - 1, PETABYTE / 2] {
        let mut buf = vec![0u8; 4096];
        let read = file.read_at(&mut buf, offset);
        assert_eio(
            read,
            &format!("a read at {offset} of bytes the store lacks"),
        );
    }
    let again = judged_read(&file, want, 1000, 4096);
    assert_eq!(again.ok, 1, "{again}");

    let after = mount.status().memory;
    println!(
        "resident before {} MiB, peak after {} MiB",
        before.resident_bytes >> 20,
        after.peak_resident_bytes >> 20
    );
    assert!(
        after.peak_resident_bytes < before.resident_bytes + (64 << 20),
        "the daemon grew from {} MiB to a peak of {} MiB",
        before.resident_bytes >> 20,
        after.peak_resident_bytes >> 20
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_listed_with_more_than_the_most_entries_is_eio() {
    let too_many = ListResult {
        common_prefixes: (0..=MAX_LISTED_ENTRIES)
            .map(|n| ObjectPath::from(format!("d{n}")))
            .collect(),
        objects: Vec::new(),
        extensions: Default::default(),
    };
    let cache = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (core, _observer) = tokio::task::block_in_place(|| {
        assemble(
            store,
            ObjectPath::from(""),
            &settings(cache.path()),
            Some(too_many),
        )
    })
    .unwrap();
    match core.readdir(ROOT).await {
        Err(error @ FsError::ListingTooLong { .. }) => {
            assert_eq!(scdlfs::fs::errno::errno(&error), fuser::Errno::EIO)
        }
        Err(other) => panic!("another error: {other:?}"),
        Ok(_) => panic!("a listing of {} entries was taken", MAX_LISTED_ENTRIES + 1),
    }
}

/// A store hook whose recursive listings under `endless` go on after the real objects,
/// with made-up chunk objects, up to a hard stop far past any cap: it counts what it
/// gave.
struct EndlessListing {
    endless: ObjectPath,
    /// A real object's metadata, which the made-up ones copy.
    template: ObjectMeta,
    given: Arc<AtomicUsize>,
}

/// Where a listing without end stops, so that a daemon without a cap still ends.
const HARD_STOP: usize = 3 * MAX_LISTED_ENTRIES;

impl fmt::Debug for EndlessListing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EndlessListing")
    }
}

#[async_trait]
impl StoreHook for EndlessListing {
    fn list(
        &self,
        inner: &dyn ObjectStore,
        prefix: Option<&ObjectPath>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let real = inner.list(prefix);
        if prefix != Some(&self.endless) {
            return real;
        }
        let (endless, given) = (self.endless.clone(), self.given.clone());
        let template = self.template.clone();
        let made_up = stream::iter(0..HARD_STOP).map(move |n| {
            Ok(ObjectMeta {
                location: ObjectPath::from(format!("{endless}/chunk_{n:08}/extra.npy")),
                e_tag: Some(format!("\"{n}\"")),
                ..template.clone()
            })
        });
        real.chain(made_up)
            .inspect(move |_| {
                given.fetch_add(1, Ordering::Relaxed);
            })
            .boxed()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_dataset_listed_without_end_is_read_no_further_than_the_most_entries() {
    let inner = InMemory::new();
    let dir = tempfile::tempdir().unwrap();
    small_dataset().write_chunked(dir.path()).unwrap();
    let files: BTreeMap<String, Vec<u8>> = snapshot(dir.path());
    for (name, bytes) in &files {
        let payload = PutPayload::from(Bytes::from(bytes.clone()));
        let key = ObjectPath::from(format!("ds/{name}"));
        inner.put(&key, payload).await.unwrap();
    }
    let given = Arc::new(AtomicUsize::new(0));
    let template = inner
        .head(&ObjectPath::from("ds/header.sch"))
        .await
        .unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(HookedStore::new(
        Arc::new(inner),
        EndlessListing {
            endless: ObjectPath::from("ds"),
            template,
            given: given.clone(),
        },
    ));
    let cache = tempfile::tempdir().unwrap();
    let (core, _observer) = tokio::task::block_in_place(|| {
        assemble(store, ObjectPath::from(""), &settings(cache.path()), None)
    })
    .unwrap();
    let ds = core.lookup(ROOT, OsStr::new("ds")).await.unwrap();
    let listing = tokio::time::timeout(Duration::from_secs(120), core.readdir(ds.attr.ino.0))
        .await
        .expect("the listing never ended");
    // Discovery failed on the listing: the directory is shown as stored.
    let listing = listing.unwrap();
    assert!(listing.get("chunk_00000").is_some());
    let given = given.load(Ordering::Relaxed);
    assert!(
        given <= MAX_LISTED_ENTRIES + 1,
        "{given} entries taken from a listing without end"
    );
}

/// A directory whose listing pages go on without end, each full of made-up
/// subdirectories, is read no further than the most entries a listing may hold: `ls`
/// is EIO once the cap is passed, not at the deadline, after no more pages than the
/// cap takes, and the daemon held no more than those entries (object_store's delimited
/// listing gathered every page until the deadline, growing all the while).
#[test]
fn a_listing_paged_without_end_is_read_no_further_than_the_most_entries() {
    const PAGE: usize = 1000;
    let read_timeout = Duration::from_secs(40);
    let moto = moto();
    let bucket = unique_bucket("paged-without-end");
    moto.create_bucket(&bucket);
    let dir = tempfile::tempdir().unwrap();
    write_files(dir.path(), &plain_files());
    std::fs::create_dir(dir.path().join("endless")).unwrap();
    std::fs::write(dir.path().join("endless/inner.bin"), b"never listed").unwrap();
    moto.upload(&bucket, "data", dir.path());
    let lists_endless = |r: &Request| is_listing(r) && r.path.contains("prefix=data%2Fendless%2F");
    let proxy = FaultProxy::start(&moto.endpoint);
    proxy.set_rule(move |r| lists_endless(r).then_some(Fault::FullListingPages(PAGE)));
    let endpoint = proxy.endpoint();
    let key = OsString::from("test");
    let timeout = humantime::format_duration(read_timeout).to_string();
    let mount = CliMount::start(
        &format!("s3://{bucket}/data"),
        &["--endpoint-url", &endpoint, "--read-timeout", &timeout],
        &[("AWS_ACCESS_KEY_ID", &key), ("AWS_SECRET_ACCESS_KEY", &key)],
    );
    let before = mount.status().memory;
    let started = std::time::Instant::now();
    let listed: std::io::Result<Vec<_>> =
        std::fs::read_dir(mount.path().join("endless")).and_then(|entries| entries.collect());
    let took = started.elapsed();
    let pages = proxy.seen().iter().filter(|r| lists_endless(r)).count();
    let after = mount.status().memory;
    println!(
        "ls: {:?} after {took:?}, {pages} pages; resident before {} MiB, peak after {} MiB",
        listed.as_ref().map(Vec::len),
        before.resident_bytes >> 20,
        after.peak_resident_bytes >> 20
    );
    assert_eio(listed.map(|_| ()), "ls of a listing without end");
    assert!(
        pages <= MAX_LISTED_ENTRIES / PAGE + 2,
        "{pages} pages of {PAGE} read, past the cap of {MAX_LISTED_ENTRIES} entries"
    );
    assert!(took < read_timeout, "EIO only at the deadline: {took:?}");
    assert!(
        after.peak_resident_bytes < before.resident_bytes + (512 << 20),
        "the daemon grew from {} MiB to a peak of {} MiB",
        before.resident_bytes >> 20,
        after.peak_resident_bytes >> 20
    );
    assert!(
        mount.log().contains("refusing the listing"),
        "{}",
        mount.log()
    );
}
