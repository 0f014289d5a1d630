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

/// A writer that loops on refused hint writes, as `nobody`: its first refusal, how long
/// it took to come back, and how many it got in `seconds`. Lines before the greeting
/// are refused (EINVAL) however often they come, so no rate of plan starts is involved.
const REFUSAL_LOOP: &str = r#"
export LC_ALL=C
exec 3>"$1"
start=${EPOCHREALTIME/./}
printf 'no greeting\n' >&3 2>/dev/null && exit 1
first=$(( ${EPOCHREALTIME/./} - start ))
refused=1; end=$(( start + $2 * 1000000 ))
while (( ${EPOCHREALTIME/./} < end )); do
  printf 'no greeting\n' >&3 2>/dev/null || refused=$((refused + 1))
done
echo "$first $refused"
"#;

/// Another user's refused hint writes, looped on, are answered late: at most about one
/// per `MAX_REFUSAL_DELAY` (the writer sleeps in its write(2) instead of taking a core),
/// while its first refusal comes back at once, and the mount's own user's hint writes
/// to the same file, beside it, are taken without waiting long behind it.
#[test]
fn a_users_refused_hint_writes_in_a_loop_are_answered_late_and_its_first_at_once() {
    use scdlfs::prefetch::budget::{MAX_REFUSAL_DELAY, PROMPT_REFUSALS};
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};

    const LOOP_SECONDS: u64 = 3;
    let source = tempfile::tempdir().unwrap();
    let spec = SyntheticDataset {
        rows: 64,
        genes: 100,
        chunk_rows: 8,
        mean_values: 4,
        seed: 42,
    };
    spec.write_chunked(&source.path().join("ds")).unwrap();
    let mount = TestMount::start(local_store(source.path()), "", |s| {
        s.allow_other = true;
    });
    std::fs::set_permissions(mount.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let hints = mount.path().join("ds").join(HINT_FILE);

    let writer = Command::new("bash")
        .args(["-c", REFUSAL_LOOP, "refused"])
        .arg(&hints)
        .arg(LOOP_SECONDS.to_string())
        .uid(HOSTILE_UID)
        .gid(HOSTILE_UID)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bash runs as nobody");
    // The mount's own user writes its hints beside the loop, to the same hint file.
    let own = std::fs::OpenOptions::new()
        .write(true)
        .open(&hints)
        .unwrap();
    let (mut own_writes, mut own_slowest) = (0u32, Duration::ZERO);
    let started = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    while started.elapsed() < Duration::from_secs(LOOP_SECONDS) - Duration::from_millis(300) {
        let lines = match own_writes {
            0 => "scdlfs-hints 1\nplan 0\nwindow 0\n".to_owned(),
            n => format!("window {}\n", n % 8),
        };
        let began = Instant::now();
        own.write_at(lines.as_bytes(), 0)
            .expect("the mount's user's hints are taken");
        own_slowest = own_slowest.max(began.elapsed());
        own_writes += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = writer.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the loop: {}: {stdout} {stderr}",
        out.status
    );
    let (first_us, refused) = stdout
        .trim()
        .split_once(' ')
        .map(|(f, n)| (f.parse::<u64>().unwrap(), n.parse::<u64>().unwrap()))
        .unwrap_or_else(|| panic!("the loop's output: {stdout:?} {stderr}"));
    let first = Duration::from_micros(first_us);
    let per_second = refused as f64 / LOOP_SECONDS as f64;
    eprintln!(
        "the loop: {refused} refusals in {LOOP_SECONDS} s ({per_second:.0}/s), the first in {first:?}; \
         the mount's user: {own_writes} hint writes, the slowest {own_slowest:?}"
    );
    // One thread's refusals, each answered at most MAX_REFUSAL_DELAY late once past the
    // prompt ones: at most one per MAX_REFUSAL_DELAY, with a fifth for timer slack.
    let bound = PROMPT_REFUSALS + 1.2 * LOOP_SECONDS as f64 / MAX_REFUSAL_DELAY.as_secs_f64();
    assert!(
        (refused as f64) <= bound,
        "{refused} refusals in {LOOP_SECONDS} s, more than {bound:.0}"
    );
    // A round trip, not a late answer's wait; with room for a loaded machine.
    assert!(
        first < 10 * MAX_REFUSAL_DELAY,
        "the first refusal took {first:?}"
    );
    // Held behind a late refusal on the hint file's inode, at most about its delay.
    assert!(
        own_slowest < Duration::from_millis(250),
        "a hint write of the mount's user took {own_slowest:?} beside the loop"
    );
    let status = mount.status();
    let looped = status
        .hint_refusals
        .iter()
        .find(|r| r.uid == HOSTILE_UID)
        .unwrap_or_else(|| panic!("no refusal of the loop: {status:?}"));
    assert_eq!(looped.refused, refused);
    // The first refusals are answered at once, whatever the machine's load; past
    // them, a loop that comes back within milliseconds keeps its refusals recent, so
    // nearly all the rest wait.
    assert!(
        looped.answered_late <= refused - PROMPT_REFUSALS as u64,
        "the first refusals were answered late: {looped:?}"
    );
    assert!(
        looped.answered_late >= (refused - PROMPT_REFUSALS as u64) * 9 / 10,
        "{looped:?}"
    );
    assert_eq!(
        status.counters.hint_refusals_answered_late,
        looped.answered_late
    );
    assert!(
        !status.hint_refusals.iter().any(|r| r.uid == 0),
        "the mount's user's hints were all taken: {:?}",
        status.hint_refusals
    );
}
