//! The `scdlfs` command as users run it: `mount` detaches and returns only once the
//! mount answers, `unmount` ends the daemon, mistakes fail fast with a message that
//! says what is wrong, a mount left behind by a killed daemon is named for what it is
//! and cleaned up, `--foreground` unmounts cleanly on SIGINT and SIGTERM, `status`
//! reports JSON counters, and `chunk` refuses what is not an archive.
//!
//! Every test cleans up after itself, even when it fails: a guard
//! ([`common::process::Cleanup`]) lazily unmounts its mountpoints and kills the
//! processes it started.

use crate::common;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::process::{
    exit_of, is_mount_point, scdlfs_command, wait_until_mounted, wait_within, Cleanup,
};
use common::s3::{moto, unique_bucket};
use common::*;
use scdl_format::ArrayKind;

// ---------------------------------------------------------------------------------------
// Harness.

/// What a finished command said.
struct Outcome {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Outcome {
    #[track_caller]
    fn assert_success(&self, what: &str) {
        assert!(
            self.status.success(),
            "{what}: {}\nstdout: {}\nstderr: {}",
            self.status,
            self.stdout,
            self.stderr
        );
    }

    /// Asserts a non-zero exit with a closing `scdlfs: ...` message (after any log
    /// lines) that holds every one of `words` (in any case).
    #[track_caller]
    fn assert_failure_saying(&self, what: &str, words: &[&str]) {
        assert!(
            !self.status.success(),
            "{what}: succeeded\nstdout: {}\nstderr: {}",
            self.stdout,
            self.stderr
        );
        assert_eq!(
            self.status.code(),
            Some(1),
            "{what}: {}\nstderr: {}",
            self.status,
            self.stderr
        );
        let verdict = match self.stderr.rfind("\nscdlfs: ") {
            Some(at) => &self.stderr[at + 1..],
            None if self.stderr.starts_with("scdlfs: ") => &self.stderr[..],
            None => panic!("{what}: no closing message:\n{}", self.stderr),
        };
        let said = verdict.to_lowercase();
        for word in words {
            assert!(
                said.contains(&word.to_lowercase()),
                "{what}: the message does not say {word:?}:\n{verdict}"
            );
        }
    }
}

/// Makes this test process the reaper of the daemons its `scdlfs mount` children
/// detach, so that a test can wait for a daemon and see how it exited.
fn adopt_orphans() {
    // SAFETY: sets a flag of this process.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    assert_eq!(rc, 0, "PR_SET_CHILD_SUBREAPER");
}

/// Runs a command to its end, or kills it and fails the test after `limit`.
fn run_with_limit(mut command: Command, limit: Duration, cleanup: &mut Cleanup) -> Outcome {
    let out = tempfile::tempdir().unwrap();
    let (stdout, stderr) = (out.path().join("stdout"), out.path().join("stderr"));
    command
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap());
    let started = Instant::now();
    let what = format!("{command:?} to end");
    let status = exit_of(cleanup.spawn(&mut command), &what, limit);
    Outcome {
        status,
        stdout: std::fs::read_to_string(stdout).unwrap(),
        stderr: std::fs::read_to_string(stderr).unwrap(),
        took: started.elapsed(),
    }
}

fn scdlfs(args: &[&OsStr], cleanup: &mut Cleanup) -> Outcome {
    run_with_limit(scdlfs_command(args), Duration::from_secs(90), cleanup)
}

fn os<S: AsRef<OsStr> + ?Sized>(s: &S) -> &OsStr {
    s.as_ref()
}

/// A source folder with the harness's plain files and a chunked dataset `ds`, a
/// mountpoint and a cache directory, all in one temporary directory.
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        write_files(&dir.path().join("src"), &plain_files());
        small_dataset()
            .write_chunked(&dir.path().join("src/ds"))
            .unwrap();
        std::fs::create_dir(dir.path().join("mnt")).unwrap();
        Setup { dir }
    }

    fn src(&self) -> PathBuf {
        self.dir.path().join("src")
    }

    fn mnt(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    fn cache(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    /// `scdlfs mount SRC MNT --cache-dir CACHE --cache-size 64MiB EXTRA...`.
    fn mount_args<'a>(&'a self, paths: &'a [PathBuf; 3], extra: &'a [&'a str]) -> Vec<&'a OsStr> {
        let mut args = vec![os("mount"), paths[0].as_os_str(), paths[1].as_os_str()];
        args.extend([
            os("--cache-dir"),
            paths[2].as_os_str(),
            os("--cache-size"),
            os("64MiB"),
        ]);
        args.extend(extra.iter().map(os));
        args
    }

    fn paths(&self) -> [PathBuf; 3] {
        [self.src(), self.mnt(), self.cache()]
    }
}

/// The running scdlfs daemons serving `mountpoint`, found by their command lines.
fn daemons_of(mountpoint: &Path) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let is_scdlfs = args.first().is_some_and(|a| a.ends_with(b"scdlfs"));
        let serves = args.iter().any(|a| *a == mountpoint.as_os_str().as_bytes());
        let is_zombie = std::fs::read_to_string(entry.path().join("stat"))
            .map(|s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
            })
            .unwrap_or(true);
        if is_scdlfs && serves && args.iter().any(|a| *a == b"--foreground") && !is_zombie {
            found.push(pid);
        }
    }
    found
}

/// The one daemon serving `mountpoint`.
fn daemon_of(mountpoint: &Path) -> i32 {
    match daemons_of(mountpoint).as_slice() {
        [pid] => *pid,
        other => panic!(
            "expected one daemon for {}, found {other:?}",
            mountpoint.display()
        ),
    }
}

/// How a process exited: waits for it (it must be our child, or an orphan we adopted).
fn wait_for_exit(pid: i32, limit: Duration) -> ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    let mut status = 0;
    wait_within(&format!("process {pid} to exit"), limit, || {
        // SAFETY: waitpid on a process of ours with a valid status pointer.
        let rc = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(
            rc >= 0,
            "waitpid({pid}): {}",
            std::io::Error::last_os_error()
        );
        rc == pid
    });
    ExitStatus::from_raw(status)
}

/// Every file reads back exactly through the mount.
fn assert_serves(mnt: &Path) {
    for (name, want) in plain_files() {
        assert!(std::fs::read(mnt.join(&name)).unwrap() == want, "{name}");
    }
    let mono = Monolithic::of(&small_dataset());
    let data = std::fs::read(mnt.join("ds").join(ArrayKind::Data.file_name())).unwrap();
    assert!(data == mono.data, "ds/data.npy");
}

/// Asserts that nothing is left of a mount that failed: no mount, no daemon.
#[track_caller]
fn assert_nothing_left(mountpoint: &Path) {
    assert!(
        !is_mount_point(mountpoint),
        "{} is mounted",
        mountpoint.display()
    );
    wait_within("the daemon to go", Duration::from_secs(10), || {
        daemons_of(mountpoint).is_empty()
    });
}

// ---------------------------------------------------------------------------------------
// Mounting and unmounting.

#[test]
fn mount_detaches_once_the_mount_answers_and_unmount_ends_the_daemon() {
    adopt_orphans();
    let setup = Setup::new();
    let mut cleanup = Cleanup::unmounting(setup.mnt());
    let paths = setup.paths();
    let mounted = scdlfs(&setup.mount_args(&paths, &[]), &mut cleanup);
    mounted.assert_success("scdlfs mount");
    // The very first access after `mount` returns is served.
    let first = std::fs::read(setup.mnt().join("tiny.txt"));
    let daemon = daemon_of(&setup.mnt());
    cleanup.pids.push(daemon);
    assert_eq!(first.unwrap(), plain_files()["tiny.txt"]);
    assert!(is_mount_point(&setup.mnt()));
    assert_serves(&setup.mnt());
    // The detached daemon logs to the cache directory by default.
    let log = std::fs::read_to_string(setup.cache().join("scdlfs.log")).unwrap();
    assert!(log.contains("mounted"), "{log}");
    // It runs out of sight: the command says where it mounted, its pid and its log.
    for said in [
        &*setup.mnt().to_string_lossy(),
        &format!("daemon pid {daemon}"),
        &*setup.cache().join("scdlfs.log").to_string_lossy(),
        "scdlfs unmount",
    ] {
        assert!(
            mounted.stdout.contains(said),
            "{said:?} not in: {}",
            mounted.stdout
        );
    }

    // A second mount on the same mountpoint is refused and leaves the first alone.
    let again = scdlfs(&setup.mount_args(&paths, &[]), &mut cleanup);
    again.assert_failure_saying("mounting twice", &["already a mount point"]);
    assert_eq!(daemons_of(&setup.mnt()), vec![daemon]);
    assert_serves(&setup.mnt());

    let unmounted = scdlfs(&[os("unmount"), setup.mnt().as_os_str()], &mut cleanup);
    unmounted.assert_success("scdlfs unmount");
    assert!(!is_mount_point(&setup.mnt()));
    let status = wait_for_exit(daemon, Duration::from_secs(20));
    assert!(status.success(), "the daemon exited with {status}");
    assert!(
        std::fs::read_dir(setup.mnt()).unwrap().next().is_none(),
        "the mountpoint is its empty self again"
    );
}

#[test]
fn mount_refuses_obvious_mistakes_with_a_clear_message() {
    let setup = Setup::new();
    let mut cleanup = Cleanup::unmounting(setup.mnt());
    let cache = setup.cache();
    let file = setup.dir.path().join("a_file");
    std::fs::write(&file, b"x").unwrap();
    let missing = setup.dir.path().join("no/such/dir");
    let (src, mnt) = (setup.src(), setup.mnt());
    let cases: [(&str, &OsStr, &OsStr, &[&str]); 4] = [
        (
            "an unsupported URL",
            os("ftp://x/y"),
            mnt.as_os_str(),
            &["unsupported", "ftp://x/y"],
        ),
        (
            "a mountpoint that is a file",
            src.as_os_str(),
            file.as_os_str(),
            &["not a directory", "a_file"],
        ),
        (
            "a missing mountpoint",
            src.as_os_str(),
            missing.as_os_str(),
            &["does not exist", "no/such/dir"],
        ),
        (
            "a missing source folder",
            os("/no/such/source"),
            mnt.as_os_str(),
            &["/no/such/source", "not a directory"],
        ),
    ];
    for (what, source, mountpoint, words) in cases {
        for foreground in [false, true] {
            let mut args = vec![
                os("mount"),
                source,
                mountpoint,
                os("--cache-dir"),
                cache.as_os_str(),
            ];
            if foreground {
                args.push(os("--foreground"));
            }
            let outcome = scdlfs(&args, &mut cleanup);
            outcome.assert_failure_saying(&format!("{what} (foreground: {foreground})"), words);
            assert!(
                outcome.took < Duration::from_secs(10),
                "{what}: took {:?}",
                outcome.took
            );
        }
    }
    assert_nothing_left(&setup.mnt());
    assert!(!file.with_file_name("no").exists());
}

fn s3_env(command: &mut Command) {
    command
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_REGION", "us-east-1");
}

#[test]
fn an_unreachable_endpoint_fails_the_mount_quickly_and_clearly() {
    let setup = Setup::new();
    let mut cleanup = Cleanup::unmounting(setup.mnt());
    let (cache, mnt) = (setup.cache(), setup.mnt());
    for foreground in [false, true] {
        let mut args = vec![os("mount"), os("s3://bucket/p"), mnt.as_os_str()];
        args.extend([
            os("--endpoint-url"),
            os("http://127.0.0.1:1"),
            os("--cache-dir"),
            cache.as_os_str(),
        ]);
        if foreground {
            args.push(os("--foreground"));
        }
        let mut command = scdlfs_command(&args);
        s3_env(&mut command);
        let outcome = run_with_limit(command, Duration::from_secs(120), &mut cleanup);
        eprintln!(
            "unreachable endpoint (foreground: {foreground}) failed after {:?}",
            outcome.took
        );
        outcome.assert_failure_saying("an unreachable endpoint", &["cannot list", "s3://bucket/p"]);
        let said = outcome.stderr.to_lowercase();
        assert!(
            said.contains("connect") || said.contains("refused") || said.contains("127.0.0.1:1"),
            "the message does not say the endpoint refused: {}",
            outcome.stderr
        );
        assert!(
            outcome.took < Duration::from_secs(30),
            "took {:?}",
            outcome.took
        );
    }
    assert_nothing_left(&setup.mnt());
}

#[test]
fn a_missing_bucket_fails_the_mount_clearly() {
    let setup = Setup::new();
    let mut cleanup = Cleanup::unmounting(setup.mnt());
    let server = moto();
    let bucket = unique_bucket("missing");
    let source = format!("s3://{bucket}/some/prefix");
    let (cache, mnt) = (setup.cache(), setup.mnt());
    let args = [
        os("mount"),
        os(&source),
        mnt.as_os_str(),
        os("--endpoint-url"),
        os(&server.endpoint),
        os("--cache-dir"),
        cache.as_os_str(),
    ];
    let mut command = scdlfs_command(args);
    s3_env(&mut command);
    let outcome = run_with_limit(command, Duration::from_secs(120), &mut cleanup);
    outcome.assert_failure_saying("a missing bucket", &[&bucket]);
    let said = outcome.stderr.to_lowercase();
    assert!(
        said.contains("nosuchbucket")
            || said.contains("does not exist")
            || said.contains("no such bucket"),
        "the message does not say the bucket is missing: {}",
        outcome.stderr
    );
    assert!(
        outcome.took < Duration::from_secs(30),
        "took {:?}",
        outcome.took
    );
    assert_nothing_left(&setup.mnt());
}

#[test]
fn a_mount_left_by_a_killed_daemon_is_named_and_cleaned_up() {
    adopt_orphans();
    let setup = Setup::new();
    let mut cleanup = Cleanup::unmounting(setup.mnt());
    let paths = setup.paths();
    scdlfs(&setup.mount_args(&paths, &[]), &mut cleanup).assert_success("scdlfs mount");
    let daemon = daemon_of(&setup.mnt());
    cleanup.pids.push(daemon);
    assert_serves(&setup.mnt());
    // SAFETY: killing the daemon this test started.
    assert_eq!(unsafe { libc::kill(daemon, libc::SIGKILL) }, 0);
    let status = wait_for_exit(daemon, Duration::from_secs(10));
    assert!(!status.success());
    // The kernel still knows the mountpoint's attributes, but nothing answers.
    let dead = std::fs::read_dir(setup.mnt()).unwrap_err();
    assert_eq!(dead.raw_os_error(), Some(libc::ENOTCONN), "{dead}");

    for foreground in [false, true] {
        let extra: &[&str] = if foreground { &["--foreground"] } else { &[] };
        let outcome = scdlfs(&setup.mount_args(&paths, extra), &mut cleanup);
        outcome.assert_failure_saying("mounting over a dead mount", &["dead", "scdlfs unmount"]);
        assert!(
            outcome.stderr.contains(&*setup.mnt().to_string_lossy()),
            "{}",
            outcome.stderr
        );
    }
    assert!(daemons_of(&setup.mnt()).is_empty());

    scdlfs(&[os("unmount"), setup.mnt().as_os_str()], &mut cleanup)
        .assert_success("unmounting a dead mount");
    assert!(!is_mount_point(&setup.mnt()));
    assert!(std::fs::metadata(setup.mnt()).unwrap().is_dir());

    // And the mountpoint takes a new mount, which serves everything (from a cache
    // directory the killed daemon left as it was).
    scdlfs(&setup.mount_args(&paths, &[]), &mut cleanup).assert_success("mounting again");
    let daemon = daemon_of(&setup.mnt());
    cleanup.pids.push(daemon);
    assert_serves(&setup.mnt());
    scdlfs(&[os("unmount"), setup.mnt().as_os_str()], &mut cleanup)
        .assert_success("scdlfs unmount");
    assert!(wait_for_exit(daemon, Duration::from_secs(20)).success());
}

#[test]
fn a_cache_budget_its_filesystem_cannot_hold_is_refused_saying_what_fits() {
    let setup = Setup::new();
    let mut cleanup = Cleanup::unmounting(setup.mnt());
    let small = scdlfs::cache::test_files::SmallTmpfs::mount("4m");
    let cache = small.path().join("cache");
    let (src, mnt) = (setup.src(), setup.mnt());
    let mount = |extra: &[&str], cleanup: &mut Cleanup| {
        let mut args = vec![
            os("mount"),
            src.as_os_str(),
            mnt.as_os_str(),
            os("--cache-dir"),
            cache.as_os_str(),
        ];
        args.extend(extra.iter().map(os));
        scdlfs(&args, cleanup)
    };
    for foreground in [&[][..], &["--foreground"]] {
        let asked = [&["--cache-size", "200MiB"][..], foreground].concat();
        mount(&asked, &mut cleanup).assert_failure_saying(
            "a budget of 200 MiB on 4 MiB",
            &[
                "--cache-size 200.00 MiB does not fit",
                &cache.to_string_lossy(),
                "4.00 MiB usable",
                "--cache-size 4.00 MiB or less",
            ],
        );
        // The default budget's floor is no smaller than the filesystem is.
        mount(foreground, &mut cleanup).assert_failure_saying(
            "the default budget on 4 MiB",
            &[
                &cache.to_string_lossy(),
                "4.00 MiB usable",
                "floor of 256.00 MiB",
            ],
        );
    }
    assert_nothing_left(&setup.mnt());
}

#[test]
fn a_user_other_than_root_where_dev_fuse_is_0600_is_told_what_to_do() {
    // In a mount namespace of its own, over a /dev/fuse of mode 0600 (as on this kind
    // of machine): only root can open it, and fusermount3 opens it with the user's own
    // rights, so no fallback can mount; the message must say what to change.
    let setup = Setup::new();
    let home = setup.dir.path().join("home");
    std::fs::create_dir_all(home.join("mnt")).unwrap();
    std::fs::set_permissions(
        setup.dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    for path in [home.clone(), home.join("mnt")] {
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
    }
    let device = setup.dir.path().join("fuse");
    let script = r#"mknod -m 0600 "$1" c 10 229 && mount --bind "$1" /dev/fuse && shift &&
        exec setpriv --reuid=65534 --regid=65534 --clear-groups "$@""#;
    let mut command = Command::new("unshare");
    command
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .arg(&device)
        .arg(common::process::SCDLFS)
        .arg("mount")
        .arg(setup.src())
        .arg(home.join("mnt"))
        .arg("--cache-dir")
        .arg(home.join("cache"))
        .args(["--cache-size", "64MiB", "--foreground"]);
    let mut cleanup = Cleanup::unmounting(home.join("mnt"));
    run_with_limit(command, Duration::from_secs(90), &mut cleanup).assert_failure_saying(
        "a mount by nobody",
        &[
            "/dev/fuse (mode 0600, owner uid 0) cannot be opened by this user (uid 65534)",
            "chmod 0666 /dev/fuse",
            "as root",
        ],
    );
}

#[test]
fn unmount_of_something_that_is_not_mounted_fails_clearly() {
    let setup = Setup::new();
    let mut cleanup = Cleanup::default();
    let outcome = scdlfs(&[os("unmount"), setup.mnt().as_os_str()], &mut cleanup);
    outcome.assert_failure_saying(
        "unmounting a plain directory",
        &[&setup.mnt().to_string_lossy(), "is not mounted"],
    );
}

#[test]
fn unmount_of_a_mount_with_a_file_open_says_it_is_busy_and_how_to_detach() {
    adopt_orphans();
    let setup = Setup::new();
    let mut cleanup = Cleanup::unmounting(setup.mnt());
    let paths = setup.paths();
    scdlfs(&setup.mount_args(&paths, &[]), &mut cleanup).assert_success("scdlfs mount");
    let daemon = daemon_of(&setup.mnt());
    cleanup.pids.push(daemon);
    let open = std::fs::File::open(setup.mnt().join("tiny.txt")).unwrap();
    let mnt = setup.mnt().to_string_lossy().into_owned();
    scdlfs(&[os("unmount"), setup.mnt().as_os_str()], &mut cleanup).assert_failure_saying(
        "unmounting with a file open",
        &[
            &format!("{mnt} is busy"),
            &format!("scdlfs unmount --lazy {mnt}"),
        ],
    );
    assert!(is_mount_point(&setup.mnt()));
    drop(open);
    scdlfs(&[os("unmount"), setup.mnt().as_os_str()], &mut cleanup)
        .assert_success("scdlfs unmount");
    assert!(wait_for_exit(daemon, Duration::from_secs(20)).success());
}

// ---------------------------------------------------------------------------------------
// The foreground daemon and signals.

fn foreground_mount_ends_cleanly_on(signal: i32) {
    let setup = Setup::new();
    let mut cleanup = Cleanup::unmounting(setup.mnt());
    let paths = setup.paths();
    let mut command = scdlfs_command(setup.mount_args(&paths, &["--foreground"]));
    let log = setup.dir.path().join("foreground.log");
    command
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let child = cleanup.spawn(&mut command);
    wait_until_mounted(&setup.mnt(), child);
    assert_serves(&setup.mnt());

    // SAFETY: signalling the child this test started.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
    let what = format!("the daemon to exit after signal {signal}");
    let status = exit_of(child, &what, Duration::from_secs(20));
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        status.success(),
        "exit {status} after signal {signal}; log:\n{log}"
    );
    assert!(
        !is_mount_point(&setup.mnt()),
        "still mounted after signal {signal}"
    );
    assert!(std::fs::read_dir(setup.mnt()).unwrap().next().is_none());
    assert!(log.contains("unmounting"), "{log}");
    assert!(!log.contains("ERROR"), "{log}");
}

#[test]
fn a_foreground_mount_unmounts_cleanly_on_sigint() {
    foreground_mount_ends_cleanly_on(libc::SIGINT);
}

#[test]
fn a_foreground_mount_unmounts_cleanly_on_sigterm() {
    foreground_mount_ends_cleanly_on(libc::SIGTERM);
}

#[test]
fn a_foreground_mount_exits_when_unmounted_from_outside() {
    let setup = Setup::new();
    let mut cleanup = Cleanup::unmounting(setup.mnt());
    let paths = setup.paths();
    let mut command = scdlfs_command(setup.mount_args(&paths, &["--foreground"]));
    command.stdout(Stdio::null()).stderr(Stdio::null());
    wait_until_mounted(&setup.mnt(), cleanup.spawn(&mut command));
    let outcome = scdlfs(&[os("unmount"), setup.mnt().as_os_str()], &mut cleanup);
    outcome.assert_success("scdlfs unmount");
    let child = cleanup.children.first_mut().unwrap();
    let status = exit_of(
        child,
        "the daemon to exit after the unmount",
        Duration::from_secs(20),
    );
    assert!(status.success(), "{status}");
}

// ---------------------------------------------------------------------------------------
// Logs.

/// Starts `scdlfs mount --foreground EXTRA...` of `setup` with standard error in
/// `stderr` and `env` added, and waits until it has logged that it mounted.
fn foreground_mount_logging(
    setup: &Setup,
    cleanup: &mut Cleanup,
    extra: &[&str],
    env: &[(&str, &str)],
    stderr: &Path,
    log: &Path,
) {
    let paths = setup.paths();
    let mut args = vec!["--foreground"];
    args.extend_from_slice(extra);
    let mut command = scdlfs_command(setup.mount_args(&paths, &args));
    command.envs(env.iter().copied());
    command
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(stderr).unwrap());
    cleanup.children.push(command.spawn().unwrap());
    wait_until_mounted(&setup.mnt(), cleanup.children.last_mut().unwrap());
    assert_serves(&setup.mnt());
    common::process::wait_for("the \"mounted\" log line", || {
        std::fs::read_to_string(log).is_ok_and(|text| text.contains("mounted"))
    });
}

#[test]
fn log_directory_gets_a_daily_json_file_and_keeps_the_newest() {
    let setup = Setup::new();
    let mut cleanup = Cleanup::unmounting(setup.mnt());
    let logs = setup.dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    // Four days of an earlier mount's logs, the oldest made first.
    for day in 1..=4 {
        std::fs::write(logs.join(format!("scdlfs.2020-01-0{day}.log")), "old\n").unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    let today =
        humantime::format_rfc3339(std::time::SystemTime::now()).to_string()[..10].to_owned();
    let todays = logs.join(format!("scdlfs.{today}.log"));
    let stderr = setup.dir.path().join("stderr");
    let logs_arg = logs.to_string_lossy().into_owned();
    foreground_mount_logging(
        &setup,
        &mut cleanup,
        &[
            "--log-directory",
            &logs_arg,
            "--log-format",
            "json",
            "--log-max-files",
            "3",
            "-d",
        ],
        &[],
        &stderr,
        &todays,
    );

    let mut names: Vec<String> = std::fs::read_dir(&logs)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "scdlfs.2020-01-03.log".to_owned(),
            "scdlfs.2020-01-04.log".to_owned(),
            format!("scdlfs.{today}.log"),
        ],
        "the oldest beyond --log-max-files are deleted"
    );
    let text = std::fs::read_to_string(&todays).unwrap();
    let events: Vec<serde_json::Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect();
    for event in &events {
        assert!(
            event["timestamp"].is_string() && event["level"].is_string(),
            "{event}"
        );
    }
    assert!(
        events
            .iter()
            .any(|event| event["level"] == "INFO" && event["fields"]["message"] == "mounted"),
        "{text}"
    );
    assert!(
        events.iter().any(|event| event["level"] == "DEBUG"),
        "-d gave no debug lines:\n{text}"
    );
    // The log went to the directory, not to standard error.
    let stderr = std::fs::read_to_string(&stderr).unwrap();
    assert!(!stderr.contains("mounted"), "{stderr}");
}

#[test]
fn under_systemd_log_lines_carry_the_journal_priority_and_no_timestamp() {
    use std::os::unix::fs::MetadataExt;
    for journal in [true, false] {
        let setup = Setup::new();
        let mut cleanup = Cleanup::unmounting(setup.mnt());
        let stderr = setup.dir.path().join("stderr");
        std::fs::write(&stderr, "").unwrap();
        let meta = std::fs::metadata(&stderr).unwrap();
        // systemd names the stream it connected; a stream inherited from a service by
        // a process whose stderr went elsewhere names another one.
        let stream = if journal {
            format!("{}:{}", meta.dev(), meta.ino())
        } else {
            format!("{}:{}", meta.dev(), meta.ino() + 1)
        };
        let paths = setup.paths();
        let mut command = scdlfs_command(setup.mount_args(&paths, &["--foreground"]));
        command
            .env("JOURNAL_STREAM", &stream)
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(&stderr)
                    .unwrap(),
            );
        cleanup.children.push(command.spawn().unwrap());
        wait_until_mounted(&setup.mnt(), cleanup.children.last_mut().unwrap());
        common::process::wait_for("the \"mounted\" log line", || {
            std::fs::read_to_string(&stderr).is_ok_and(|text| text.contains("mounted"))
        });
        let text = std::fs::read_to_string(&stderr).unwrap();
        let line = text.lines().find(|line| line.contains("mounted")).unwrap();
        if journal {
            assert!(line.starts_with("<6> INFO"), "{line}");
        } else {
            // An RFC 3339 timestamp first, as anywhere but the journal.
            assert!(line.starts_with("20") && line.contains('T'), "{line}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// status and chunk.

#[test]
fn status_prints_json_counters_of_a_mount_and_refuses_other_directories() {
    adopt_orphans();
    let setup = Setup::new();
    let mut cleanup = Cleanup::unmounting(setup.mnt());
    let paths = setup.paths();
    scdlfs(&setup.mount_args(&paths, &[]), &mut cleanup).assert_success("scdlfs mount");
    cleanup.pids.push(daemon_of(&setup.mnt()));
    let big = std::fs::read(setup.mnt().join("nested/big.bin")).unwrap();

    let outcome = scdlfs(
        &[os("status"), setup.mnt().as_os_str(), os("--json")],
        &mut cleanup,
    );
    outcome.assert_success("scdlfs status --json");
    let status: serde_json::Value = serde_json::from_str(&outcome.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", outcome.stdout));
    let counters = status["counters"]
        .as_object()
        .unwrap_or_else(|| panic!("no counters: {status}"));
    for name in [
        "reads",
        "bytes_read",
        "bytes_fetched",
        "parts_fetched",
        "fetch_errors",
        "read_errors",
    ] {
        assert!(
            counters.get(name).is_some_and(|v| v.is_u64()),
            "counter {name}: {status}"
        );
    }
    // What the kernel did not ask for, the read-around gave it.
    let given =
        counters["bytes_read"].as_u64().unwrap() + counters["read_around_bytes"].as_u64().unwrap();
    assert!(given >= big.len() as u64, "{status}");
    assert!(
        counters["bytes_fetched"].as_u64().unwrap() >= big.len() as u64,
        "{status}"
    );
    assert_eq!(counters["fetch_errors"], 0);
    assert!(
        status["source"].as_str().is_some_and(|s| s.contains("src")),
        "{status}"
    );

    // The human form says the same.
    let human = scdlfs(&[os("status"), setup.mnt().as_os_str()], &mut cleanup);
    human.assert_success("scdlfs status");
    assert!(human.stdout.contains("reads"), "{}", human.stdout);

    let plain = setup.dir.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    for not_a_mount in [plain.as_path(), &setup.src(), Path::new("/no/such/dir")] {
        let outcome = scdlfs(
            &[os("status"), not_a_mount.as_os_str(), os("--json")],
            &mut cleanup,
        );
        outcome.assert_failure_saying(
            "status of a directory that is not a mount",
            &["not a scdlfs mount", &not_a_mount.to_string_lossy()],
        );
        assert!(outcome.stdout.is_empty(), "{}", outcome.stdout);
    }
    scdlfs(&[os("unmount"), setup.mnt().as_os_str()], &mut cleanup)
        .assert_success("scdlfs unmount");
}

#[test]
fn chunk_refuses_what_is_not_a_monolithic_archive() {
    let dir = tempfile::tempdir().unwrap();
    let mut cleanup = Cleanup::default();
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let chunked = dir.path().join("chunked");
    small_dataset().write_chunked(&chunked).unwrap();
    let target = dir.path().join("target");
    let cases: [(&str, &Path, &[&str]); 3] = [
        (
            "a directory without header.sch",
            &empty,
            &["not a monolithic SCDL archive", "header.sch is missing"],
        ),
        (
            "a missing directory",
            Path::new("/no/such/archive"),
            &["/no/such/archive", "not a directory"],
        ),
        (
            "a chunked archive",
            &chunked,
            &["not a monolithic SCDL archive", "chunked archive already"],
        ),
    ];
    for (what, source, words) in cases {
        let outcome = scdlfs(
            &[os("chunk"), source.as_os_str(), target.as_os_str()],
            &mut cleanup,
        );
        outcome.assert_failure_saying(what, words);
        assert!(!target.exists(), "{what}: the target was created");
    }
}

/// The commands `scdlfs --help` lists, but for `help` itself.
fn listed_commands(cleanup: &mut Cleanup) -> Vec<String> {
    let help = scdlfs(&[os("--help")], cleanup);
    help.assert_success("scdlfs --help");
    let listing = help.stdout.split("Commands:\n").nth(1).unwrap();
    let commands: Vec<String> = listing
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .filter(|line| line.starts_with("  ") && !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect();
    assert!(commands.contains(&"mount".to_owned()), "{}", help.stdout);
    commands
}

#[test]
fn the_man_page_describes_every_command() {
    let mut cleanup = Cleanup::default();
    let commands = listed_commands(&mut cleanup);
    let page = scdlfs(&[os("man")], &mut cleanup);
    page.assert_success("scdlfs man");
    assert!(page.stdout.starts_with(".ie \\n(.g .ds Aq \\(aq"));
    assert!(page.stdout.contains(".TH scdlfs 1"));
    for command in &commands {
        assert!(
            page.stdout.contains(command.as_str()),
            "{command} not in the page"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let pages = dir.path().join("man1");
    scdlfs(
        &[os("man"), os("--out-dir"), pages.as_os_str()],
        &mut cleanup,
    )
    .assert_success("scdlfs man --out-dir");
    for command in &commands {
        let page = std::fs::read_to_string(pages.join(format!("scdlfs-{command}.1")))
            .unwrap_or_else(|error| panic!("no page of {command}: {error}"));
        assert!(page.contains(&format!(".TH scdlfs-{command} 1")), "{page}");
    }
    let mount = std::fs::read_to_string(pages.join("scdlfs-mount.1")).unwrap();
    assert!(mount.contains("cache\\-size") && mount.contains("SCDLFS_CACHE_SIZE"));
}

#[test]
fn completions_for_each_shell_name_every_command() {
    let mut cleanup = Cleanup::default();
    let commands = listed_commands(&mut cleanup);
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = scdlfs(&[os("completions"), os(shell)], &mut cleanup);
        script.assert_success(shell);
        for command in &commands {
            assert!(
                script.stdout.contains(command.as_str()),
                "{shell}: {command} not completed"
            );
        }
        assert!(
            script.stdout.contains("cache-size"),
            "{shell}: no mount flags"
        );
    }
    let unknown = scdlfs(&[os("completions"), os("tcsh")], &mut cleanup);
    assert!(!unknown.status.success() && unknown.stderr.contains("'tcsh'"));
}
