//! A dataset whose discovery takes longer than `--read-timeout` still appears. While
//! its listing advances (pages of entries keep coming, as for an atlas of 10^5
//! objects), the first `ls` waits for it. A listing that stalls for longer than the
//! deadline has the first `ls` get EIO at the deadline, but the listing goes on
//! without it, and a later `ls` finds the dataset, listed by the store once, not once
//! per attempt. A listing that never ends is still given up, after
//! [`LISTING_DEADLINES`] deadlines, and the next `ls` lists again. A root slower to
//! list than the deadline still mounts. The slowness comes from below, where a slow
//! store puts it: a store whose listings of the dataset's prefix (its directory, and
//! its chunks' objects) answer late, and whose listing of one directory never answers;
//! and, through the fault proxy, moto_server answering every listing page late, where a
//! dataset without a manifest has its objects listed in key ranges at once.

use crate::common;

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ListResult, ObjectMeta, ObjectStore, Result};

use common::cli_mount::CliMount;
use common::faulty_mount::SLACK;
use common::proxy::{Fault, FaultProxy, Request};
use common::s3::{moto, unique_bucket};
use common::*;
use scdlfs::catalog::LISTING_DEADLINES;
use scdlfs::store::wrapper::{HookedStore, StoreHook};
use scdlfs::synthetic::SyntheticDataset;

const READ_TIMEOUT: Duration = Duration::from_secs(1);
/// How late each listing of the dataset's prefix answers: its discovery (a delimited
/// listing, then the recursive one) takes three deadlines.
const LISTING_DELAY: Duration = Duration::from_millis(1_500);
const SLOW_PREFIX: &str = "ds";
const NEVER_LISTED: &str = "never";

/// A hook whose listings of one prefix (`slow`: [`SLOW_PREFIX`], or `""` for the
/// root) answer [`LISTING_DELAY`] late and whose listing of [`NEVER_LISTED`] never
/// answers, counted; everything else passes through.
#[derive(Debug)]
struct SlowListings {
    slow: &'static str,
    delimited: AtomicUsize,
    recursive: AtomicUsize,
    never_answered: AtomicUsize,
}

impl SlowListings {
    fn over(inner: Arc<dyn ObjectStore>, slow: &'static str) -> HookedStore<SlowListings> {
        let hook = SlowListings {
            slow,
            delimited: AtomicUsize::new(0),
            recursive: AtomicUsize::new(0),
            never_answered: AtomicUsize::new(0),
        };
        HookedStore::new(inner, hook)
    }

    fn is_slow(&self, prefix: Option<&ObjectPath>) -> bool {
        prefix.map_or("", |p| p.as_ref()) == self.slow
    }
}

#[async_trait]
impl StoreHook for SlowListings {
    fn list(
        &self,
        inner: &dyn ObjectStore,
        prefix: Option<&ObjectPath>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let listed = inner.list(prefix);
        if !self.is_slow(prefix) {
            return listed;
        }
        self.recursive.fetch_add(1, Ordering::SeqCst);
        futures::stream::once(async move {
            tokio::time::sleep(LISTING_DELAY).await;
            listed
        })
        .flatten()
        .boxed()
    }

    async fn list_with_delimiter(
        &self,
        inner: &dyn ObjectStore,
        prefix: Option<&ObjectPath>,
    ) -> Result<ListResult> {
        if self.is_slow(prefix) {
            self.delimited.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(LISTING_DELAY).await;
        }
        if prefix.is_some_and(|p| p.as_ref() == NEVER_LISTED) {
            self.never_answered.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
        inner.list_with_delimiter(prefix).await
    }
}

/// The names `ls DIR` lists, and how long it took; `None` if it had no answer after a
/// minute (the thread is left behind).
fn ls(dir: PathBuf) -> (Option<std::io::Result<Vec<String>>>, Duration) {
    let started = Instant::now();
    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let names = std::fs::read_dir(dir).and_then(|entries| {
            entries
                .map(|entry| entry.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect()
        });
        done.send(names)
    });
    let result = result.recv_timeout(Duration::from_secs(60)).ok();
    (result, started.elapsed())
}

#[test]
fn a_discovery_longer_than_the_deadline_goes_on_and_a_later_ls_finds_the_dataset() {
    let src = tempfile::tempdir().unwrap();
    let want = write_source(src.path());
    let store = Arc::new(SlowListings::over(local_store(src.path()), SLOW_PREFIX));
    let mount = TestMount::start(store.clone(), "", |s| s.read_timeout = READ_TIMEOUT);
    let dataset = mount.path().join(SLOW_PREFIX);

    let (first, took) = ls(dataset.clone());
    println!("first ls: {first:?} after {took:?}");
    let first = first.expect("the first ls answers");
    assert_eq!(
        first
            .expect_err("the first ls waits out the deadline")
            .raw_os_error(),
        Some(libc::EIO)
    );
    assert!(took <= READ_TIMEOUT + SLACK, "EIO after {took:?}");

    // Another attempt within the listing's time joins it rather than starting over.
    let (second, took) = ls(dataset.clone());
    println!("second ls: {second:?} after {took:?}");

    let discovery_done = 2 * LISTING_DELAY + SLACK;
    std::thread::sleep(discovery_done);
    let (later, took) = ls(dataset.clone());
    println!("ls after {discovery_done:?}: {later:?} after {took:?}");
    let later = later
        .expect("the later ls answers")
        .expect("the later ls lists the dataset");
    for kind in scdl_format::ArrayKind::ALL {
        assert!(
            later.iter().any(|name| name == kind.file_name()),
            "{} missing from {later:?}",
            kind.file_name()
        );
    }
    let data = std::fs::read(dataset.join("data.npy")).unwrap();
    assert!(data == want["ds/data.npy"], "data.npy: wrong bytes");

    let listings = (
        store.hook().delimited.load(Ordering::SeqCst),
        store.hook().recursive.load(Ordering::SeqCst),
    );
    assert_eq!(
        listings,
        (1, 1),
        "the dataset's directory and its chunks' objects each listed once (delimited, recursive)"
    );
}

fn assert_eio_within_the_deadline(
    what: &str,
    (result, took): (Option<std::io::Result<Vec<String>>>, Duration),
) {
    println!("{what}: {result:?} after {took:?}");
    let error = result
        .unwrap_or_else(|| panic!("{what}: no answer"))
        .expect_err(what);
    assert_eq!(error.raw_os_error(), Some(libc::EIO), "{what}: {error}");
    assert!(took <= READ_TIMEOUT + SLACK, "{what}: EIO after {took:?}");
}

#[test]
fn a_listing_that_never_answers_is_given_up_and_the_next_ls_lists_again() {
    let src = tempfile::tempdir().unwrap();
    write_files(src.path(), &plain_files());
    std::fs::create_dir(src.path().join(NEVER_LISTED)).unwrap();
    std::fs::write(
        src.path().join(NEVER_LISTED).join("inner.bin"),
        b"never listed",
    )
    .unwrap();
    let store = Arc::new(SlowListings::over(local_store(src.path()), SLOW_PREFIX));
    let mount = TestMount::start(store.clone(), "", |s| s.read_timeout = READ_TIMEOUT);
    let never = mount.path().join(NEVER_LISTED);

    let started = Instant::now();
    assert_eio_within_the_deadline("the first ls", ls(never.clone()));
    assert_eio_within_the_deadline("an ls while the listing runs", ls(never.clone()));
    assert_eq!(
        store.hook().never_answered.load(Ordering::SeqCst),
        1,
        "the second ls joined the listing under way"
    );

    let listing_bound = READ_TIMEOUT * LISTING_DEADLINES;
    std::thread::sleep((listing_bound + SLACK).saturating_sub(started.elapsed()));
    assert_eio_within_the_deadline("an ls after the listing was given up", ls(never));
    assert_eq!(
        store.hook().never_answered.load(Ordering::SeqCst),
        2,
        "the listing given up after {listing_bound:?} is not kept: the next ls lists again"
    );
}

/// The root is listed before the mount appears; a root slower to list than
/// `--read-timeout`, but that would end, is waited for as any listing is (up to
/// [`LISTING_DEADLINES`] deadlines) rather than failing the mount.
#[test]
fn a_root_slower_to_list_than_the_deadline_still_mounts() {
    let src = tempfile::tempdir().unwrap();
    let files = plain_files();
    write_files(src.path(), &files);
    let store = Arc::new(SlowListings::over(local_store(src.path()), ""));
    let mount = TestMount::start(store.clone(), "", |s| s.read_timeout = READ_TIMEOUT);
    let (root, took) = ls(mount.path());
    println!("ls of the root: {root:?} after {took:?}");
    let root = root.expect("the root answers").expect("the root lists");
    for name in files.keys().filter_map(|path| path.split('/').next()) {
        assert!(
            root.iter().any(|n| n == name),
            "{name} missing from {root:?}"
        );
    }
    assert_eq!(
        store.hook().delimited.load(Ordering::SeqCst),
        1,
        "the mount's listing of the root is the root's first"
    );
}

/// Whether `request` asks for a page of a listing of the mounted dataset `data/ds/`
/// (its directory, delimited, or its objects, recursive).
fn lists_the_dataset(request: &Request) -> bool {
    request.method == "GET"
        && request.path.contains("list-type=2")
        && request.path.contains("prefix=data%2Fds%2F")
}

/// A dataset of 80 chunks listed in pages of 2 entries, each page 0.3 s late: each of
/// the 16 key ranges its objects are listed in takes 8 pages, longer than a deadline of
/// 2 s, every page well within it. The first `ls` waits while the pages come, and
/// lists the dataset (it failed with EIO at the deadline, and the retry of a caller who
/// unmounts on that error started the listing from zero).
#[test]
fn the_first_ls_of_a_dataset_listed_in_many_slow_pages_waits_while_they_come() {
    const READ_TIMEOUT: Duration = Duration::from_secs(2);
    let moto = moto();
    let bucket = unique_bucket("many-pages");
    moto.create_bucket(&bucket);
    let src = tempfile::tempdir().unwrap();
    eighty_chunks()
        .write_chunked(&src.path().join("ds"))
        .unwrap();
    moto.upload(&bucket, "data", src.path());
    let proxy = FaultProxy::start(&moto.endpoint);
    proxy.set_rule(|request| {
        lists_the_dataset(request).then_some(Fault::SlowPages {
            keys: 2,
            delay: Duration::from_millis(300),
        })
    });
    let endpoint = proxy.endpoint();
    let timeout = humantime::format_duration(READ_TIMEOUT).to_string();
    let key = OsString::from("test");
    let mount = CliMount::start(
        &format!("s3://{bucket}/data"),
        &["--endpoint-url", &endpoint, "--read-timeout", &timeout],
        &[("AWS_ACCESS_KEY_ID", &key), ("AWS_SECRET_ACCESS_KEY", &key)],
    );

    let (first, took) = ls(mount.path().join("ds"));
    let pages = proxy.seen().iter().filter(|r| lists_the_dataset(r)).count();
    println!("first ls: {first:?} after {took:?}, {pages} listing pages");
    let first = first
        .expect("the first ls answers")
        .unwrap_or_else(|e| panic!("the first ls lists the dataset: {e}\n{}", mount.log()));
    for kind in scdl_format::ArrayKind::ALL {
        assert!(
            first.iter().any(|name| name == kind.file_name()),
            "{} missing from {first:?}",
            kind.file_name()
        );
    }
    assert!(pages >= 15, "the dataset listed in {pages} pages");
    assert!(
        took > READ_TIMEOUT,
        "the listing took {took:?}, not longer than the deadline: the test shows nothing"
    );
}

/// 80 chunks of 15 rows: 243 objects.
fn eighty_chunks() -> SyntheticDataset {
    SyntheticDataset {
        rows: 1_200,
        genes: 500,
        chunk_rows: 15,
        mean_values: 4,
        seed: 5,
    }
}

/// A dataset of 80 chunks without a manifest, listed in pages of 20 entries each 0.5 s
/// late (18 pages one after the other: 9 s): its objects are listed in key ranges at
/// once, cut at the chunk names its header predicts, so the first `ls` answers within
/// a few pages' time, and the flat arrays read right.
#[test]
fn a_dataset_without_a_manifest_is_listed_in_key_ranges_at_once() {
    const PAGE_DELAY: Duration = Duration::from_millis(500);
    let moto = moto();
    let bucket = unique_bucket("ranges");
    moto.create_bucket(&bucket);
    let src = tempfile::tempdir().unwrap();
    let spec = eighty_chunks();
    spec.write_chunked(&src.path().join("ds")).unwrap();
    moto.upload(&bucket, "data", src.path());
    let proxy = FaultProxy::start(&moto.endpoint);
    proxy.set_rule(|request| {
        lists_the_dataset(request).then_some(Fault::SlowPages {
            keys: 20,
            delay: PAGE_DELAY,
        })
    });
    let endpoint = proxy.endpoint();
    let key = OsString::from("test");
    let mount = CliMount::start(
        &format!("s3://{bucket}/data"),
        &["--endpoint-url", &endpoint],
        &[("AWS_ACCESS_KEY_ID", &key), ("AWS_SECRET_ACCESS_KEY", &key)],
    );

    let (first, took) = ls(mount.path().join("ds"));
    let ranged = (proxy.seen().iter())
        .filter(|r| lists_the_dataset(r) && r.path.contains("start-after"))
        .count();
    println!("first ls: {first:?} after {took:?}; {ranged} pages started after a chunk name");
    let first = first
        .expect("the first ls answers")
        .unwrap_or_else(|e| panic!("the first ls lists the dataset: {e}\n{}", mount.log()));
    assert!(first.iter().any(|name| name == "data.npy"), "{first:?}");
    assert!(ranged >= 15, "{ranged} ranges listed from a chunk's name");
    assert!(took < 3 * PAGE_DELAY, "the first ls took {took:?}");
    let monolithic = Monolithic::of(&spec);
    for kind in scdl_format::ArrayKind::ALL {
        let flat = mount.read(&format!("ds/{}", kind.file_name()));
        assert!(flat == monolithic.array(kind), "{kind:?} differs");
    }
}
