//! Real mounts of moto_server through the fault-injecting proxy (below object_store, so
//! its retries and timeouts are under test): 5xx and 429 bursts, resets mid-body,
//! truncated bodies, short 206 bodies (asked again), stalls with and without headers, 403s, an
//! outage, an object replaced while it is read. For each: every read returns the
//! right bytes or EIO, never wrong bytes, never later than the bound; errors that heal
//! are retried (the reads succeed) and errors that cannot are not (one request).
//! Each test prints its outcome counts (`--nocapture` shows them).
//!
//! Every mount is the real `scdlfs mount`, its bounds given as flags; each bound flag
//! (`--stall-timeout`, `--request-timeout`, `--read-timeout`, `--max-attempts`) has a
//! test whose timing or request count the flag's default would break.

use crate::common;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::faulty_mount::{judged_read, setup, setup_with_bounds, Setup, BOUNDS, MAX_TRIES};
use common::proxy::{Fault, Outcomes, Request};
use common::s3::moto;
use common::*;
use scdlfs::store::NetworkBounds;

fn is_part_get(request: &Request) -> bool {
    request.method == "GET" && request.range.is_some()
}

/// `readers` threads reading random ranges of every file.
fn read_everything(
    mnt: &Path,
    files: &BTreeMap<String, Vec<u8>>,
    readers: u64,
    reads_per_file: u64,
) -> Outcomes {
    let files = Arc::new(files.clone());
    let threads: Vec<_> = (0..readers)
        .map(|reader| {
            let (mnt, files) = (mnt.to_owned(), files.clone());
            std::thread::spawn(move || {
                let mut rng = Rng::new(reader + 1);
                let mut outcomes = Outcomes::default();
                for (name, want) in files.iter() {
                    let file = File::open(mnt.join(name)).unwrap();
                    for _ in 0..reads_per_file {
                        let offset = rng.below(want.len() as u64 + 1);
                        let len = 1 + rng.below(96 << 10) as usize;
                        outcomes.add(judged_read(&file, want, offset, len));
                    }
                }
                outcomes
            })
        })
        .collect();
    let mut total = Outcomes::default();
    for thread in threads {
        total.add(thread.join().unwrap());
    }
    total
}

fn report(fault: &str, setup: &Setup, outcomes: Outcomes) {
    println!(
        "FAULT {fault}: {outcomes}; requests {}, injected {:?}, most tries of one range {}",
        setup.proxy.requests(),
        setup.proxy.injected(),
        setup.proxy.most_tries_of_a_range()
    );
    assert_eq!(outcomes.wrong, 0, "{fault}: wrong bytes served");
    assert_eq!(outcomes.late, 0, "{fault}: reads past the bound");
}

/// A fault on the first `burst` part requests of each object: retries must hide it.
fn healing_burst(name: &str, fault: Fault, burst: u64) {
    let setup = setup(name, &[]);
    setup
        .proxy
        .set_rule(move |r| (is_part_get(r) && r.repeat < burst).then_some(fault));
    let outcomes = read_everything(&setup.mount.path(), &setup.files, 4, 12);
    report(name, &setup, outcomes);
    assert_eq!(
        outcomes.eio, 0,
        "{name}: a retry should have healed every read"
    );
    assert!(
        setup.proxy.injected()[&fault] > 0,
        "{name}: no fault was injected"
    );
    assert!(
        setup.proxy.most_tries_of_a_range() <= MAX_TRIES,
        "{name}: more tries than --max-attempts"
    );
}

#[test]
fn bursts_of_503_are_retried() {
    healing_burst("status-503-burst", Fault::Status(503), 2);
}

#[test]
fn bursts_of_429_are_retried() {
    healing_burst("status-429-burst", Fault::Status(429), 2);
}

#[test]
fn resets_mid_body_are_retried() {
    healing_burst("reset-mid-body", Fault::ResetMidBody, 2);
}

#[test]
fn truncated_bodies_are_retried() {
    healing_burst("truncated-body", Fault::TruncateBody, 2);
}

#[test]
fn a_stall_after_the_headers_is_abandoned_and_retried() {
    healing_burst("stall-after-headers-once", Fault::StallAfterHeaders, 1);
}

#[test]
fn a_request_never_answered_is_abandoned_and_retried() {
    healing_burst("stall-no-headers-once", Fault::StallNoHeaders, 1);
}

/// Every part request of one object fails the same way: its reads get EIO within the
/// bound, the other objects read fine, and each of its downloads sent `tries` requests.
fn lasting_fault_on_one_object(name: &str, fault: Fault, tries: std::ops::RangeInclusive<u64>) {
    let setup = setup(name, &[]);
    let victim = "nested/big.bin";
    setup
        .proxy
        .set_rule(move |r| (is_part_get(r) && r.path.ends_with(victim)).then_some(fault));
    let mut others = setup.files.clone();
    let victim_file = BTreeMap::from([(victim.to_owned(), others.remove(victim).unwrap())]);
    let healthy = read_everything(&setup.mount.path(), &others, 2, 6);
    let hit = read_everything(&setup.mount.path(), &victim_file, 2, 3);
    let mut all = healthy;
    all.add(hit);
    report(name, &setup, all);
    assert_eq!(healthy.eio, 0, "{name}: an object without faults failed");
    assert_eq!(hit.ok, 0, "{name}: a read of the failing object succeeded");
    // Every failed download of the victim sent between `tries` requests; counted once
    // the downloads the kernel's read-ahead started have ended too.
    let settled = std::time::Instant::now();
    while setup.mount.status().downloads_in_flight > 0 {
        assert!(
            settled.elapsed() < std::time::Duration::from_secs(30),
            "{name}: downloads never ended"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let downloads = setup.mount.status().counters.fetch_errors;
    let requests = setup.proxy.injected()[&fault];
    println!("FAULT {name}: {downloads} failed downloads sent {requests} requests");
    assert!(downloads > 0);
    assert!(
        requests >= downloads * tries.start() && requests <= downloads * tries.end(),
        "{name}: {requests} requests for {downloads} downloads, expected {tries:?} each"
    );
}

#[test]
fn lasting_503s_give_eio_after_max_attempts() {
    lasting_fault_on_one_object(
        "status-503-lasting",
        Fault::Status(503),
        MAX_TRIES..=MAX_TRIES,
    );
}

#[test]
fn errors_that_cannot_heal_are_not_retried() {
    for status in [403, 404, 412, 416] {
        lasting_fault_on_one_object(&format!("status-{status}"), Fault::Status(status), 1..=1);
    }
}

#[test]
fn a_lasting_stall_after_headers_gives_eio_within_the_bound() {
    lasting_fault_on_one_object(
        "stall-after-headers-lasting",
        Fault::StallAfterHeaders,
        2..=MAX_TRIES,
    );
}

#[test]
fn a_store_that_never_answers_gives_eio_within_the_bound() {
    lasting_fault_on_one_object(
        "stall-no-headers-lasting",
        Fault::StallNoHeaders,
        2..=MAX_TRIES,
    );
}

#[test]
fn short_206_answers_are_asked_again() {
    healing_burst("short-206-burst", Fault::ShortPartial, 2);
}

/// Whether request `n` of a seeded sequence is one of the tenth chosen.
fn one_in_ten(n: u64) -> bool {
    let mut x = (n + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 29;
    x.is_multiple_of(10)
}

/// Short answers to a tenth of the part requests, over rounds of reads that each reach
/// the store: a cache of two parts, the kernel's pages dropped between rounds.
#[test]
fn short_206_answers_to_a_tenth_of_the_part_requests_fail_no_read() {
    let name = "short-206-one-in-ten";
    let setup = setup(name, &["--cache-size", "128KiB"]);
    let sequence = AtomicU64::new(0);
    setup.proxy.set_rule(move |r| {
        let chosen = one_in_ten(sequence.fetch_add(1, Ordering::Relaxed));
        (is_part_get(r) && chosen).then_some(Fault::ShortPartial)
    });
    let mnt = setup.mount.path();
    let mut outcomes = Outcomes::default();
    for _round in 0..8 {
        outcomes.add(read_everything(&mnt, &setup.files, 4, 12));
        for name in setup.files.keys() {
            forget_cached_pages(&File::open(mnt.join(name)).unwrap());
        }
    }
    report(name, &setup, outcomes);
    assert!(setup.proxy.injected()[&Fault::ShortPartial] >= 10);
    assert_eq!(outcomes.eio, 0, "{name}: a short answer failed a read");
}

#[test]
fn an_outage_gives_eio_or_bytes_and_the_mount_recovers() {
    let name = "outage";
    let setup = setup(name, &[]);
    setup.proxy.set_rule(|_| Some(Fault::Refuse));
    let during = read_everything(&setup.mount.path(), &setup.files, 4, 4);
    report(name, &setup, during);
    assert!(during.eio > 0, "no read met the outage");
    setup.proxy.set_rule(|_| None);
    let after = read_everything(&setup.mount.path(), &setup.files, 4, 12);
    report(&format!("{name} (after)"), &setup, after);
    assert_eq!(after.eio, 0, "the mount did not recover after the outage");
}

#[test]
fn an_object_replaced_during_reads_is_never_mixed() {
    let name = "object-replaced";
    let setup = setup(name, &[]);
    let key = "nested/big.bin";
    let old = setup.files[key].clone();
    let mnt = setup.mount.path();
    let file = File::open(mnt.join(key)).unwrap();
    // The first part is read (and cached) before the object changes.
    let before = judged_read(&file, &old, 0, 1000);
    assert_eq!(before.ok, 1);
    let new: Vec<u8> = old.iter().map(|b| !b).collect();
    let upload = tempfile::tempdir().unwrap();
    write_files(upload.path(), &BTreeMap::from([(key.to_owned(), new)]));
    moto().upload(&setup.bucket, "data", upload.path());
    let only = BTreeMap::from([(key.to_owned(), old)]);
    let after = read_everything(&mnt, &only, 4, 12);
    report(name, &setup, after);
    assert!(after.eio > 0, "no read met the changed object");
}

/// The first read of `nested/big.bin` on a mount with `bounds` whose first request for
/// the file's first part gets `fault`, and the outcome.
fn first_read_with_one_fault(name: &str, bounds: &NetworkBounds, fault: Fault) -> Outcomes {
    let setup = setup_with_bounds(name, bounds, &[]);
    let key = "nested/big.bin";
    let first = Arc::new(AtomicBool::new(true));
    setup.proxy.set_rule(move |r| {
        let first_part = r
            .range
            .as_deref()
            .is_some_and(|range| range.starts_with("bytes=0-"));
        (is_part_get(r)
            && r.path.ends_with(key)
            && first_part
            && first.swap(false, Ordering::Relaxed))
        .then_some(fault)
    });
    let file = File::open(setup.mount.path().join(key)).unwrap();
    let outcome = judged_read(&file, &setup.files[key], 0, 1000);
    println!(
        "FAULT {name}: {outcome}; injected {:?}",
        setup.proxy.injected()
    );
    assert_eq!(
        setup.proxy.injected().get(&fault),
        Some(&1),
        "{name}: no fault was injected"
    );
    outcome
}

#[test]
fn the_stall_timeout_flag_abandons_a_silent_body_that_soon() {
    // Only the stall bound can end the stalled attempt early: the others are long.
    let bounds = NetworkBounds {
        stall_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(30),
        read_timeout: Duration::from_secs(30),
        ..BOUNDS
    };
    let outcome = first_read_with_one_fault("stall-flag", &bounds, Fault::StallAfterHeaders);
    assert_eq!(outcome.ok, 1, "{outcome}");
    // The default stall bound (5 s) would hold the read past this.
    assert!(outcome.slowest_ms < 3500, "{outcome}");
}

#[test]
fn the_request_timeout_flag_abandons_a_body_that_never_ends() {
    // A byte every 300 ms never trips the 1 s stall bound; only the request bound ends it.
    let bounds = NetworkBounds {
        stall_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(2),
        read_timeout: Duration::from_secs(30),
        ..BOUNDS
    };
    let outcome = first_read_with_one_fault("request-timeout-flag", &bounds, Fault::Trickle);
    assert_eq!(outcome.ok, 1, "{outcome}");
    // The default request bound (10 s) would hold the read past this.
    assert!(outcome.slowest_ms < 6000, "{outcome}");
}

#[test]
fn the_read_timeout_flag_fails_a_read_that_soon() {
    // The store never answers, and no attempt ends before the read's own bound.
    let bounds = NetworkBounds {
        stall_timeout: Duration::from_secs(30),
        request_timeout: Duration::from_secs(30),
        read_timeout: Duration::from_secs(2),
        ..BOUNDS
    };
    let setup = setup_with_bounds("read-timeout-flag", &bounds, &[]);
    let key = "nested/big.bin";
    setup.proxy.set_rule(move |r| {
        (is_part_get(r) && r.path.ends_with(key)).then_some(Fault::StallNoHeaders)
    });
    let file = File::open(setup.mount.path().join(key)).unwrap();
    let outcome = judged_read(&file, &setup.files[key], 0, 1000);
    println!("FAULT read-timeout-flag: {outcome}");
    assert_eq!(outcome.eio, 1, "{outcome}");
    // Twice the bound (the kernel asks again once) and slack, far under the default
    // 15 s.
    assert!(outcome.slowest_ms < 7000, "{outcome}");
}
