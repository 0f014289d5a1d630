//! `scdlfs warm` against a real mount (issue 11): the command reports progress, brings
//! the named parts into the cache so that reading them makes no request, fetches
//! nothing the second time (counted at the store), stays within the cache budget, and
//! stops cleanly on SIGINT.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::process::scdlfs_command;
use common::*;
use scdl_format::layout::HEADER_FILE;
use scdlfs::cache::test_files::dir_bytes;
use scdlfs::store::counting::CountReads;
use scdlfs::store::throttled::Throttle;
use scdlfs::store::wrapper::HookedStore;
use scdlfs::warm::{WarmProgress, WarmState, WARM_XATTR};

struct Setup {
    _src: tempfile::TempDir,
    want: BTreeMap<String, Vec<u8>>,
    counted: Arc<HookedStore<CountReads>>,
    mount: TestMount,
}

/// The small dataset (as `ds/`) and plain files, mounted through a request counter
/// (and a slow link when `latency` is given).
fn setup(cache_bytes: u64, latency: Option<Duration>) -> Setup {
    let src = tempfile::tempdir().unwrap();
    let want = write_source(src.path());
    let mut store = local_store(src.path());
    if let Some(latency) = latency {
        store = Arc::new(HookedStore::new(store, Throttle::new(latency, 1 << 30)));
    }
    let counted = Arc::new(HookedStore::new(store, CountReads::default()));
    let mount = TestMount::start(counted.clone(), "", |s| {
        s.cache_bytes = cache_bytes;
        s.max_concurrent_requests = 4;
    });
    Setup {
        _src: src,
        want,
        counted,
        mount,
    }
}

/// Part downloads so far: every GET but discovery's of a dataset's header (once).
fn part_gets(counted: &HookedStore<CountReads>) -> u64 {
    counted
        .hook()
        .snapshot()
        .into_iter()
        .filter(|((key, _), _)| !key.ends_with(HEADER_FILE))
        .map(|(_, n)| n)
        .sum()
}

fn warm(dataset: &Path, args: &[&str]) -> Output {
    scdlfs_command(["warm"])
        .arg(dataset)
        .args(args)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn progress(dataset: &Path) -> WarmProgress {
    let mut buf = vec![0u8; 64 << 10];
    let len = rustix::fs::getxattr(dataset, WARM_XATTR, &mut buf[..]).unwrap();
    serde_json::from_slice(&buf[..len]).unwrap()
}

#[test]
fn warming_reports_progress_and_a_second_run_fetches_nothing() {
    let s = setup(256 << 20, None);
    let ds = s.mount.path().join("ds");
    let first = warm(&ds, &["--all"]);
    let (stdout, stderr) = (text(&first.stdout), text(&first.stderr));
    assert!(first.status.success(), "{stdout}\n{stderr}");
    // Not a terminal: plain progress lines, then the summary.
    assert!(
        stderr.contains("warm: ") && stderr.contains(" parts, "),
        "{stderr}"
    );
    let done = progress(&ds);
    assert_eq!(done.state, WarmState::Done);
    assert!(done.parts_fetched > 0 && done.parts_failed == 0, "{done:?}");
    assert_eq!(done.parts_already_cached, 0, "{done:?}");
    assert!(
        stdout.contains(&format!("{} fetched", done.parts_fetched)),
        "{stdout}"
    );
    let gets = part_gets(&s.counted);
    assert_eq!(gets, done.parts_fetched, "one GET per part warmed");

    let second = warm(&ds, &["--all"]);
    assert!(second.status.success(), "{}", text(&second.stderr));
    let again = progress(&ds);
    assert_eq!(again.parts_fetched, 0, "{again:?}");
    assert_eq!(again.parts_already_cached, done.parts_fetched, "{again:?}");
    assert!(
        text(&second.stdout).contains(" 0 fetched"),
        "{}",
        text(&second.stdout)
    );
    assert_eq!(part_gets(&s.counted), gets, "the second run made requests");

    // Reading the whole dataset now needs the network for nothing, and is right.
    for (name, bytes) in s.want.iter().filter(|(name, _)| name.starts_with("ds/")) {
        let got = std::fs::read(s.mount.path().join(name)).unwrap();
        assert!(&got == bytes, "{name}: wrong bytes");
    }
    assert_eq!(
        part_gets(&s.counted),
        gets,
        "reading the warmed dataset made requests"
    );
}

#[test]
fn warming_a_few_chunks_fetches_only_their_parts() {
    let s = setup(256 << 20, None);
    let ds = s.mount.path().join("ds");
    let output = warm(&ds, &["--chunks", "1..3", "--quiet"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let chunk_keys: Vec<String> = s
        .counted
        .hook()
        .snapshot()
        .into_keys()
        .map(|(key, _)| key)
        .filter(|key| !key.ends_with(HEADER_FILE))
        .collect();
    assert!(!chunk_keys.is_empty());
    for key in &chunk_keys {
        assert!(
            key.contains("chunk_00001/") || key.contains("chunk_00002/"),
            "{key} is not in chunks 1..3"
        );
    }
    let rows = warm(&ds, &["--rows", "0..1", "--quiet"]);
    assert!(rows.status.success(), "{}", text(&rows.stderr));
    assert!(
        progress(&ds).parts_fetched > 0,
        "row 0 is in chunk 0, not warmed before"
    );
}

#[test]
fn warming_more_than_the_budget_stops_at_the_budget_and_says_so() {
    let budget = 640 << 10;
    let s = setup(budget, None);
    let ds = s.mount.path().join("ds");
    let output = warm(&ds, &["--all"]);
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("larger than the cache budget"), "{stderr}");
    let p = progress(&ds);
    assert!(p.parts_over_budget > 0 && p.parts_fetched > 0, "{p:?}");
    assert!(p.bytes_total <= budget, "{p:?}");
    let status = s.mount.status().cache;
    assert!(status.cached_bytes <= budget, "{status:?}");
    assert!(dir_bytes(&s.mount.cache_parts_dir()) <= budget);
    assert_eq!(
        status.evicted_parts, 0,
        "warming evicted what it warmed: {status:?}"
    );
    assert_eq!(status.cached_parts as u64, p.parts_fetched, "{status:?}");
}

#[test]
fn sigint_stops_warming_cleanly() {
    let s = setup(256 << 20, Some(Duration::from_millis(300)));
    let ds = s.mount.path().join("ds");
    let child = scdlfs_command(["warm"])
        .arg(&ds)
        .arg("--all")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while progress_started(&ds).is_none_or(|p| p.parts_fetched < 2) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "warming never began"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::INT,
    )
    .unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("stopped"), "{stderr}");
    assert!(
        text(&output.stdout).contains("fetched"),
        "{}",
        text(&output.stdout)
    );
    let stopped = progress(&ds);
    assert_eq!(stopped.state, WarmState::Stopped, "{stopped:?}");
    assert!(stopped.parts_fetched < stopped.parts_total, "{stopped:?}");
    // Nothing more is fetched once it says it stopped.
    let gets = part_gets(&s.counted);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        part_gets(&s.counted),
        gets,
        "downloads went on after the stop"
    );
    assert_eq!(s.mount.status().downloads_in_flight, 0);
}

/// The job's progress once it exists.
fn progress_started(dataset: &Path) -> Option<WarmProgress> {
    let mut buf = vec![0u8; 64 << 10];
    let len = rustix::fs::getxattr(dataset, WARM_XATTR, &mut buf[..]).ok()?;
    serde_json::from_slice(&buf[..len]).ok()
}

#[test]
fn warming_a_directory_that_is_no_dataset_is_refused() {
    let s = setup(256 << 20, None);
    let output = warm(&s.mount.path().join("nested"), &["--all"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("not a dataset directory"),
        "{}",
        text(&output.stderr)
    );
}
