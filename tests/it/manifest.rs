//! A dataset with a manifest opens with one GET: the first `ls` of it through a store
//! whose listing pages are slow answers at once, lists none of its objects, and reads
//! the right bytes, pinned to the ETags the manifest lists. `scdlfs chunk` writes the
//! manifest; `scdlfs manifest URL` writes one for a dataset another tool chunked,
//! with one listing and one GET of the header. An object changed since its manifest
//! was written is refused (EIO), never mixed in. The real `scdlfs mount` of
//! moto_server through the fault proxy, which answers every listing page of the
//! dataset late.

use crate::common;

use std::ffi::OsString;
use std::time::{Duration, Instant};

use common::cli_mount::CliMount;
use common::process::{run_ok, scdlfs_command};
use common::proxy::{Fault, FaultProxy, Request};
use common::s3::{moto, unique_bucket};
use common::*;
use scdl_format::manifest::{Manifest, MANIFEST_FILE};
use scdl_format::ArrayKind;
use scdlfs::synthetic::SyntheticDataset;

/// How late each listing page of the dataset comes: listing it whole (18 pages of 20
/// entries) takes 9 s.
const PAGE_DELAY: Duration = Duration::from_millis(500);

/// 80 chunks of 15 rows.
fn spec() -> SyntheticDataset {
    SyntheticDataset {
        rows: 1_200,
        genes: 500,
        chunk_rows: 15,
        mean_values: 4,
        seed: 7,
    }
}

/// Whether `request` lists the dataset `data/ds/` (delimited or recursive).
fn lists_the_dataset(request: &Request) -> bool {
    request.method == "GET"
        && request.path.contains("list-type=2")
        && request.path.contains("prefix=data%2Fds%2F")
}

/// `scdlfs WORDS... --endpoint-url ENDPOINT` with the test's keys.
fn scdlfs_on(endpoint: &str, words: &[&str]) -> std::process::Output {
    let mut command = scdlfs_command(words);
    command
        .args(["--endpoint-url", endpoint])
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1");
    run_ok(&mut command)
}

/// A mount of `s3://BUCKET/data` through `proxy`, which answers every listing page of
/// the dataset [`PAGE_DELAY`] late and 20 entries long.
fn slow_listing_mount(bucket: &str, proxy: &FaultProxy) -> CliMount {
    proxy.set_rule(|request| {
        lists_the_dataset(request).then_some(Fault::SlowPages {
            keys: 20,
            delay: PAGE_DELAY,
        })
    });
    let endpoint = proxy.endpoint();
    let key = OsString::from("test");
    CliMount::start(
        &format!("s3://{bucket}/data"),
        &["--endpoint-url", &endpoint, "--read-timeout", "10s"],
        &[("AWS_ACCESS_KEY_ID", &key), ("AWS_SECRET_ACCESS_KEY", &key)],
    )
}

/// The first `ls` of the dataset answers within two listing pages' time, asking for no
/// page of its objects (at most the first of its directory, started beside the
/// manifest's GET and dropped), and the flat arrays read back right.
fn assert_opens_from_its_manifest(mount: &CliMount, proxy: &FaultProxy, spec: &SyntheticDataset) {
    let started = Instant::now();
    let listed: Vec<String> = std::fs::read_dir(mount.path().join("ds"))
        .unwrap_or_else(|e| panic!("ls: {e}\n{}", mount.log()))
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let took = started.elapsed();
    let recursive = (proxy.seen().iter())
        .filter(|r| lists_the_dataset(r) && !r.path.contains("delimiter"))
        .count();
    let delimited = (proxy.seen().iter())
        .filter(|r| lists_the_dataset(r) && r.path.contains("delimiter"))
        .count();
    println!("first ls: {listed:?} after {took:?}; pages asked: {delimited} delimited, {recursive} recursive");
    for kind in ArrayKind::ALL {
        assert!(listed.iter().any(|n| n == kind.file_name()), "{listed:?}");
    }
    assert!(
        mount.log().contains("opened from its manifest"),
        "{}",
        mount.log()
    );
    assert_eq!(recursive, 0, "no page of the dataset's objects asked for");
    assert!(
        delimited <= 1,
        "{delimited} pages of its directory asked for"
    );
    assert!(took < 2 * PAGE_DELAY, "the first ls took {took:?}");
    let monolithic = Monolithic::of(spec);
    for kind in ArrayKind::ALL {
        let flat = mount.read(&format!("ds/{}", kind.file_name()));
        assert!(flat == monolithic.array(kind), "{kind:?} differs");
    }
}

#[test]
fn a_dataset_chunked_by_scdlfs_opens_from_its_manifest_without_listing_its_objects() {
    let moto = moto();
    let bucket = unique_bucket("manifest-chunk");
    moto.create_bucket(&bucket);
    let dir = tempfile::tempdir().unwrap();
    let spec = spec();
    write_monolithic(&spec, &dir.path().join("mono"));
    let mono = dir.path().join("mono");
    let target = format!("s3://{bucket}/data/ds");
    let rows = spec.chunk_rows.to_string();
    let words = [
        "chunk",
        "--chunk-rows",
        &rows,
        mono.to_str().unwrap(),
        &target,
    ];
    scdlfs_on(&moto.endpoint, &words);

    let proxy = FaultProxy::start(&moto.endpoint);
    let mount = slow_listing_mount(&bucket, &proxy);
    assert_opens_from_its_manifest(&mount, &proxy, &spec);
}

/// `scdlfs manifest` on a dataset another tool chunked (scdl-format's writer, as the
/// Python `partition_scdl` lays it out): one listing, one GET of the header, no HEAD,
/// one PUT; then mounts open it from the manifest. A chunk object written again
/// afterwards is refused by its pinned ETag (EIO), not read in its new version.
#[test]
fn scdlfs_manifest_writes_one_for_a_dataset_chunked_elsewhere_and_a_changed_object_is_refused() {
    let moto = moto();
    let bucket = unique_bucket("manifest-cmd");
    moto.create_bucket(&bucket);
    let src = tempfile::tempdir().unwrap();
    let spec = spec();
    spec.write_chunked(&src.path().join("ds")).unwrap();
    moto.upload(&bucket, "data", src.path());

    let proxy = FaultProxy::start(&moto.endpoint);
    let output = scdlfs_on(
        &proxy.endpoint(),
        &["manifest", &format!("s3://{bucket}/data/ds")],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("1200 rows in 80 chunks"), "{stdout}");
    let requests = proxy.seen();
    let kinds: Vec<String> = (requests.iter())
        .filter(|r| !lists_the_dataset(r))
        .map(|r| format!("{} {}", r.method, r.path.split('?').next().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        [
            format!("GET /{bucket}/data/ds/header.sch"),
            format!("PUT /{bucket}/data/ds/{MANIFEST_FILE}")
        ],
        "besides the listing pages"
    );
    let written = moto.store(&bucket);
    let manifest = tokio::runtime::Runtime::new().unwrap().block_on(async {
        use object_store::ObjectStoreExt;
        let key = object_store::path::Path::from(format!("data/ds/{MANIFEST_FILE}"));
        written.get(&key).await.unwrap().bytes().await.unwrap()
    });
    let manifest = Manifest::decode(&manifest).unwrap();
    assert_eq!(manifest.chunks, 80);
    assert!(manifest.objects.iter().all(|o| o.etag.is_some()));
    assert!(manifest.objects.iter().all(|o| o.key != "header.sch"));

    let proxy = FaultProxy::start(&moto.endpoint);
    let mount = slow_listing_mount(&bucket, &proxy);
    assert_opens_from_its_manifest(&mount, &proxy, &spec);

    // Another version of a chunk's values, of the same size, under the pinned key.
    let key = "data/ds/chunk_00003/data.npy";
    let old = mount.read("ds/.chunked/chunk_00003/data.npy");
    let new: Vec<u8> = old.iter().map(|b| b ^ 0x5a).collect();
    moto.change(&bucket, [(key.to_owned(), Some(new))]);
    let fresh = CliMount::start(
        &format!("s3://{bucket}/data"),
        &["--endpoint-url", &moto.endpoint],
        &[
            ("AWS_ACCESS_KEY_ID", &OsString::from("test")),
            ("AWS_SECRET_ACCESS_KEY", &OsString::from("test")),
        ],
    );
    assert_eio(
        std::fs::read(fresh.path().join("ds/.chunked/chunk_00003/data.npy")),
        "a chunk changed since its manifest was written",
    );
    let other = fresh.read("ds/.chunked/chunk_00004/data.npy");
    assert_eq!(other, mount.read("ds/.chunked/chunk_00004/data.npy"));
}
