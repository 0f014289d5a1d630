//! Every FUSE operation has one deadline, `--read-timeout`, metadata included: a
//! directory whose listing never ends (each page says another follows: every request
//! is quick, their number unbounded) or stalls (no answer, each attempt abandoned
//! after `--stall-timeout` and tried again) answers `ls` and lookups with EIO within
//! the deadline, and the mount goes on answering everything else. The real `scdlfs
//! mount` of moto_server through the fault proxy, so object_store's paging and
//! retries are what the deadline bounds.

use crate::common;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::cli_mount::{mount_command, CliMount};
use common::faulty_mount::{bound_flags, SLACK};
use common::process::{exit_of, is_mount_point, Cleanup};
use common::proxy::{Fault, FaultProxy, Request};
use common::s3::{moto, unique_bucket};
use common::*;
use scdlfs::catalog::LISTING_DEADLINES;
use scdlfs::store::NetworkBounds;

/// Short bounds, so that the test is quick.
const BOUNDS: NetworkBounds = NetworkBounds {
    request_timeout: Duration::from_secs(3),
    stall_timeout: Duration::from_secs(1),
    max_attempts: 3,
    read_timeout: Duration::from_secs(4),
};

/// Whether `request` lists the directory `dir` of the mounted prefix `data/`.
fn lists(request: &Request, dir: &str) -> bool {
    request.method == "GET"
        && request.path.contains("list-type=2")
        && request.path.contains(&format!("prefix=data%2F{dir}%2F"))
}

/// What an operation on the mount ended with, and how long it took; `None` for the
/// result if it had not ended after a minute (the thread is left behind).
fn timed<T: Send + 'static>(
    operation: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> (Option<std::io::Result<T>>, Duration) {
    let started = Instant::now();
    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(operation()));
    let result = result.recv_timeout(Duration::from_secs(60)).ok();
    (result, started.elapsed())
}

fn list_dir(path: PathBuf) -> std::io::Result<Vec<String>> {
    std::fs::read_dir(path)?
        .map(|entry| entry.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect()
}

fn assert_eio_within_the_deadline<T: std::fmt::Debug>(
    what: &str,
    (result, took): (Option<std::io::Result<T>>, Duration),
) {
    println!("{what}: answered after {took:?}");
    let result = result.unwrap_or_else(|| panic!("{what}: no answer after {took:?}"));
    let error = result.expect_err(what);
    assert_eq!(error.raw_os_error(), Some(libc::EIO), "{what}: {error}");
    assert!(
        took <= BOUNDS.read_timeout + SLACK,
        "{what}: EIO after {took:?}, past the deadline {:?}",
        BOUNDS.read_timeout
    );
}

fn assert_answers(mount: &Path, files: &std::collections::BTreeMap<String, Vec<u8>>) {
    for (name, want) in files {
        let path = mount.join(name);
        let (got, took) = timed(move || std::fs::read(path));
        let got = got.unwrap_or_else(|| panic!("{name}: no answer after {took:?}"));
        assert!(&got.unwrap() == want, "{name}: wrong bytes");
    }
    let (root, _) = timed({
        let mount = mount.to_owned();
        move || list_dir(mount)
    });
    assert!(root
        .expect("the root lists")
        .unwrap()
        .contains(&"tiny.txt".to_owned()));
}

#[test]
fn listings_that_never_end_or_stall_fail_within_the_deadline_and_the_mount_answers_on() {
    let moto = moto();
    let bucket = unique_bucket("deadlines");
    moto.create_bucket(&bucket);
    let files = plain_files();
    let dir = tempfile::tempdir().unwrap();
    write_files(dir.path(), &files);
    for broken in ["endless", "stalling"] {
        std::fs::create_dir(dir.path().join(broken)).unwrap();
        std::fs::write(dir.path().join(broken).join("inner.bin"), b"never listed").unwrap();
    }
    moto.upload(&bucket, "data", dir.path());
    let proxy = FaultProxy::start(&moto.endpoint);
    proxy.set_rule(|request| {
        if lists(request, "endless") {
            Some(Fault::EndlessListing)
        } else if lists(request, "stalling") {
            Some(Fault::StallNoHeaders)
        } else {
            None
        }
    });
    let endpoint = proxy.endpoint();
    let mut flags = vec!["--endpoint-url", &endpoint];
    let bound_flags = bound_flags(&BOUNDS);
    flags.extend(bound_flags.iter().map(String::as_str));
    // Explicit dummy keys: moto refuses unsigned reads.
    let key = OsString::from("test");
    let mount = CliMount::start(
        &format!("s3://{bucket}/data"),
        &flags,
        &[("AWS_ACCESS_KEY_ID", &key), ("AWS_SECRET_ACCESS_KEY", &key)],
    );
    let mnt = mount.path();
    for broken in ["endless", "stalling"] {
        let path = mnt.join(broken);
        assert_eio_within_the_deadline(&format!("ls {broken}"), timed(move || list_dir(path)));
        let path = mnt.join(broken).join("inner.bin");
        assert_eio_within_the_deadline(
            &format!("stat {broken}/inner.bin"),
            timed(move || std::fs::metadata(path)),
        );
        assert_answers(&mnt, &files);
    }
    let pages = proxy
        .seen()
        .iter()
        .filter(|request| lists(request, "endless"))
        .count();
    println!("pages of the endless listing asked for: {pages}");
    assert!(pages > 1, "the endless listing was paged: {pages} pages");
}

/// The mount lists its root before the mount appears; a root whose listing never ends
/// fails `scdlfs mount` within the bound of any listing ([`LISTING_DEADLINES`] ×
/// `--read-timeout`), with one line saying so and a non-zero exit, rather than hanging
/// before a mount exists to be unmounted.
#[test]
fn a_root_listing_that_never_ends_fails_the_mount_within_the_listing_bound() {
    let moto = moto();
    let bucket = unique_bucket("deadline-at-mount");
    moto.create_bucket(&bucket);
    let dir = tempfile::tempdir().unwrap();
    write_files(dir.path(), &plain_files());
    moto.upload(&bucket, "data", dir.path());
    let proxy = FaultProxy::start(&moto.endpoint);
    proxy.set_rule(|request| {
        let lists_the_root = request.method == "GET"
            && request.path.contains("list-type=2")
            && request
                .path
                .split(['?', '&'])
                .any(|p| p == "prefix=data%2F");
        lists_the_root.then_some(Fault::EndlessListing)
    });
    let endpoint = proxy.endpoint();
    let mut flags = vec!["--endpoint-url", &endpoint];
    let bound_flags = bound_flags(&BOUNDS);
    flags.extend(bound_flags.iter().map(String::as_str));
    let key = OsString::from("test");
    let env = [("AWS_ACCESS_KEY_ID", &key), ("AWS_SECRET_ACCESS_KEY", &key)];
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir(work.path().join("mnt")).unwrap();
    let mut command = mount_command(&format!("s3://{bucket}/data"), work.path(), &flags, &env);
    command.arg("--foreground");
    let log = work.path().join("log");
    command.stderr(std::fs::File::create(&log).unwrap());
    let mut cleanup = Cleanup::unmounting(work.path().join("mnt"));
    let started = Instant::now();
    let status = exit_of(
        cleanup.spawn(&mut command),
        "the mount of an endless root listing to end",
        Duration::from_secs(60),
    );
    let took = started.elapsed();
    let said = std::fs::read_to_string(&log).unwrap();
    println!("the mount failed after {took:?} ({status}):\n{said}");
    assert!(!status.success(), "the mount succeeded: {said}");
    let listing_bound = BOUNDS.read_timeout * LISTING_DEADLINES;
    assert!(
        took <= listing_bound + SLACK,
        "failed after {took:?}, past the bound {listing_bound:?}"
    );
    let lines: Vec<&str> = said
        .lines()
        .filter(|line| line.contains("cannot list"))
        .collect();
    assert!(
        lines.iter().any(|line| line.contains("--read-timeout")),
        "no line says the listing ran past --read-timeout: {said}"
    );
    assert!(!is_mount_point(&work.path().join("mnt")));
    let pages = proxy
        .seen()
        .iter()
        .filter(|request| request.path.contains("list-type=2"))
        .count();
    assert!(pages > 1, "the endless listing was paged: {pages} pages");
}
