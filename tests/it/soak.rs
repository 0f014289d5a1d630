//! A soak: 16 reader threads read random ranges of every file through a real mount of
//! moto_server while the fault proxy breaks about one part request in five (5xx, 429,
//! resets, truncated and short bodies, stalls with and without headers), with a small
//! cache and a small fetcher memory cap so that eviction and the cap are exercised;
//! each read's pages are dropped from the page cache after it, so reads reach the daemon.
//! Beside them another user (`--allow-other`) writes hints as hostile as it can
//! (tests/common/hostile_hints.rs) on a small dataset of the same bucket.
//! Must hold: 0 wrong bytes, 0 reads past the bound, fetcher memory under its cap.
//!
//! `SCDLFS_SOAK_SECONDS` sets the duration (default 20 s in the suite, capped at 60 s
//! unless `SCDLFS_SOAK_LONG=1`); the long run:
//! `SCDLFS_SOAK_LONG=1 SCDLFS_SOAK_SECONDS=600 cargo test --release --test it soak:: -- --nocapture`

use crate::common;

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::faulty_mount::{judged_read, setup_shared_with_dataset};
use common::hostile_hints::{self, HOSTILE_UID};
use common::proxy::{Fault, Outcomes};
use common::{forget_cached_pages, Rng};
use scdl_format::hint::HINT_FILE;

const READERS: u64 = 16;
const PART: u64 = 64 << 10;
const MEMORY_CAP: u64 = 6 * PART;

fn soak_duration() -> Duration {
    let seconds: u64 = std::env::var("SCDLFS_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let long = std::env::var_os("SCDLFS_SOAK_LONG").is_some();
    Duration::from_secs(if long { seconds } else { seconds.min(60) })
}

/// About one part request in five gets a fault, chosen by a seeded sequence.
fn random_fault(n: u64) -> Option<Fault> {
    let mut x = (n + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 29;
    const FAULTS: [Fault; 7] = [
        Fault::Status(503),
        Fault::Status(429),
        Fault::ResetMidBody,
        Fault::TruncateBody,
        Fault::ShortPartial,
        Fault::StallAfterHeaders,
        Fault::StallNoHeaders,
    ];
    x.is_multiple_of(5)
        .then(|| FAULTS[(x / 5 % FAULTS.len() as u64) as usize])
}

#[test]
fn sixteen_readers_under_random_faults() {
    let cache = (8 * PART).to_string();
    let memory_cap = MEMORY_CAP.to_string();
    let setup = setup_shared_with_dataset(
        "soak",
        &[
            "--cache-size",
            &cache,
            "--max-fetch-memory",
            &memory_cap,
            "--max-concurrent-requests",
            "8",
        ],
    );
    let sequence = Arc::new(AtomicU64::new(0));
    setup.proxy.set_rule(move |r| {
        if r.method != "GET" || r.range.is_none() {
            return None;
        }
        random_fault(sequence.fetch_add(1, Ordering::Relaxed))
    });
    let duration = soak_duration();
    let deadline = Instant::now() + duration;
    // Beside the readers, another user writes hints as hostile as it can (bounded by
    // the budgets of prefetch/budget.rs).
    let rows = common::small_dataset().rows;
    let hints = setup.mount.path().join("ds").join(HINT_FILE);
    let mut hostile = hostile_hints::start(&hints, rows, duration);
    let files = Arc::new(setup.files.clone());
    let mnt = setup.mount.path();
    let threads: Vec<_> = (0..READERS)
        .map(|reader| {
            let (files, mnt) = (files.clone(), mnt.clone());
            std::thread::spawn(move || {
                let names: Vec<&String> = files.keys().collect();
                let mut rng = Rng::new(100 + reader);
                let mut outcomes = Outcomes::default();
                while Instant::now() < deadline {
                    let name = names[rng.below(names.len() as u64) as usize];
                    let want = &files[name];
                    let file = File::open(mnt.join(name)).unwrap();
                    let offset = rng.below(want.len() as u64 + 1);
                    let len = 1 + rng.below(192 << 10) as usize;
                    outcomes.add(judged_read(&file, want, offset, len));
                    // Out of the page cache, so that the next read reaches the daemon.
                    forget_cached_pages(&file);
                }
                outcomes
            })
        })
        .collect();
    let mut total = Outcomes::default();
    for thread in threads {
        total.add(thread.join().unwrap());
    }
    hostile.wait().unwrap();
    let status = setup.mount.status();
    let peak = status.counters.fetch_memory_peak_bytes;
    println!(
        "SOAK {}s, {READERS} readers: {total}; part requests {}, injected {:?}; \
         fetcher memory peak {peak} of cap {MEMORY_CAP}; evictions {}",
        duration.as_secs(),
        setup.proxy.requests(),
        setup.proxy.injected(),
        status.cache.evicted_parts,
    );
    assert_eq!(total.wrong, 0, "wrong bytes served");
    assert_eq!(total.late, 0, "reads past the bound");
    assert!(total.ok > 0, "no read succeeded");
    assert!(
        peak <= MEMORY_CAP,
        "fetcher held {peak} bytes, cap {MEMORY_CAP}"
    );
    assert!(
        peak > 0,
        "the fetcher never held a byte: nothing was measured"
    );
    assert!(
        status.hint_refusals.iter().any(|r| r.uid == HOSTILE_UID),
        "the hostile writer was never refused: it did not reach the mount"
    );
}
