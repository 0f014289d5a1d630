//! A mount shared by several users (`--allow-other`): a hostile hint writer, another
//! user, can make the daemon's work for its hints no larger than its budgets allow, so
//! everyone else's reads keep completing.

use crate::common;

use std::fs::File;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::time::{Duration, Instant};

use common::hostile_hints::{self, HOSTILE_UID};
use common::{forget_cached_pages, local_store, Rng, TestMount};
use scdl_format::hint::HINT_FILE;
use scdlfs::synthetic::SyntheticDataset;

/// Chunks of one row: a `rows` range over the dataset spans this many chunks.
const ROWS: u64 = 10_000;
/// How long the hostile writer runs, and the other user reads meanwhile.
const HOSTILE_FOR: Duration = Duration::from_secs(12);
/// What every read of the other user must take at most.
const READ_BOUND: Duration = Duration::from_secs(2);

#[test]
fn a_hostile_hint_writer_does_not_stall_another_users_reads() {
    let source = tempfile::tempdir().unwrap();
    let spec = SyntheticDataset {
        rows: ROWS,
        genes: 100,
        chunk_rows: 1,
        mean_values: 4,
        seed: 30,
    };
    spec.write_chunked(&source.path().join("ds")).unwrap();
    let mount = TestMount::start(local_store(source.path()), "", |s| {
        s.allow_other = true;
    });
    // The other user must reach the mountpoint, or the writer fails for the wrong reason.
    std::fs::set_permissions(mount.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let ds = mount.path().join("ds");
    let data = File::open(ds.join("data.npy")).unwrap();
    let size = data.metadata().unwrap().len();

    // One read before the writer starts: what a read costs here without it. The
    // mount's first read pays for setting up the flat view of 10,000 chunks (0.98 s
    // measured alone, on two loaded cores), which is not the writer's doing.
    let began = Instant::now();
    data.read_exact_at(&mut [0u8; 4096], size / 2).unwrap();
    let alone = began.elapsed();
    forget_cached_pages(&data);

    let mut hostile = hostile_hints::start(&ds.join(HINT_FILE), ROWS, HOSTILE_FOR);
    // The reader has a plan of its own, which the writer's must leave alone.
    let own_plan = std::fs::OpenOptions::new()
        .write(true)
        .open(ds.join(HINT_FILE))
        .unwrap();
    let started = Instant::now();
    let mut rng = Rng::new(30);
    let (mut reads, mut slowest) = (0, Duration::ZERO);
    let mut plans_written = 0;
    let mut next_plan = started;
    while started.elapsed() < HOSTILE_FOR {
        if Instant::now() >= next_plan {
            // A new epoch every 2 s: well within the rate of plan starts.
            next_plan += Duration::from_secs(2);
            let epoch = plans_written;
            let chunk = rng.below(ROWS);
            let lines = format!("scdlfs-hints 1\nplan {epoch}\nwindow {chunk}\n");
            let began = Instant::now();
            let written = own_plan.write_at(lines.as_bytes(), 0);
            slowest = slowest.max(began.elapsed());
            written.expect("the reader's own plan is accepted");
            plans_written += 1;
        }
        let offset = rng.below(size - 4096);
        let mut buf = vec![0u8; 4096];
        let began = Instant::now();
        data.read_exact_at(&mut buf, offset).unwrap();
        let took = began.elapsed();
        slowest = slowest.max(took);
        assert!(
            took <= READ_BOUND,
            "read {reads} at {offset} took {took:?} beside the hostile writer"
        );
        forget_cached_pages(&data);
        reads += 1;
    }
    let exit = hostile.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(hostile.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    eprintln!(
        "{reads} reads and {plans_written} plans of the reader, the slowest {slowest:?} (a read before the writer: {alone:?}); the writer: {exit} {stderr}"
    );
    assert!(reads >= 100, "only {reads} reads in {HOSTILE_FOR:?}");
    // The writer did write: some of its plans were taken, the rest refused.
    let status = mount.status();
    let refused = status
        .hint_refusals
        .iter()
        .find(|r| r.uid == HOSTILE_UID)
        .unwrap_or_else(|| panic!("no refusal of the hostile writer: {status:?}\n{stderr}"));
    assert!(refused.refused > 0);
    assert!(
        !status.hint_refusals.iter().any(|r| r.uid == 0),
        "the reader's writes were all taken: {:?}",
        status.hint_refusals
    );
}
