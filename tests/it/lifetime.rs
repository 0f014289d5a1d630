//! A daemon that lives for other processes (`--exit-with-pid`, the Python package's
//! mounts, and processes attached later through the root's `user.scdlfs.users`): it
//! unmounts and exits once the last of them has exited, however it ended, or left,
//! lazily if a file is still open, and then removes its `--scratch-dir`; a scratch
//! directory that could hold anything but this mount is refused before anything starts.
//! Through the real binary, mounting a local folder in the foreground.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::process::{
    exit_of, foreground_mount, is_mount_point, scdlfs_command, wait_until_mounted, Cleanup,
    PATIENCE,
};
use common::write_source;
use scdlfs::fs::SOURCE_XATTR as SOURCE;
use scdlfs::users::USERS_XATTR as USERS;

/// How long a daemon whose users live is watched to still be serving.
const STILL_SERVING: Duration = Duration::from_millis(600);

/// A process standing for a user of the mount, until it is killed.
fn user() -> Child {
    let mut command = Command::new("sleep");
    command.arg("600").stdin(Stdio::null());
    common::process::dies_with_test(&mut command);
    command.spawn().unwrap()
}

/// A source folder, and a scratch directory as `mktemp -d` makes it (mode 0700) holding
/// the mountpoint `mnt`; the cache goes to `scratch/cache`.
struct Layout {
    _source_dir: tempfile::TempDir,
    source: PathBuf,
    scratch: PathBuf,
    mountpoint: PathBuf,
}

fn layout(parent: &Path) -> Layout {
    let source_dir = tempfile::tempdir().unwrap();
    let source = source_dir.path().join("source");
    write_source(&source);
    let scratch = parent.join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    std::fs::set_permissions(&scratch, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mountpoint = scratch.join("mnt");
    std::fs::create_dir(&mountpoint).unwrap();
    Layout {
        _source_dir: source_dir,
        source,
        scratch,
        mountpoint,
    }
}

/// `scdlfs mount --foreground` of the layout, living for `pids`, with its scratch.
fn mount_living_for(layout: &Layout, pids: &[u32]) -> Command {
    let mut extra: Vec<String> = vec!["--scratch-dir".into(), layout.scratch.display().to_string()];
    for pid in pids {
        extra.extend(["--exit-with-pid".into(), pid.to_string()]);
    }
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    foreground_mount(
        &layout.source,
        &layout.mountpoint,
        &layout.scratch.join("cache"),
        &extra,
    )
}

fn end(mut process: Child) {
    process.kill().unwrap();
    process.wait().unwrap();
}

#[test]
fn the_daemon_unmounts_and_removes_its_scratch_once_the_last_of_its_users_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let layout = layout(dir.path());
    let mut cleanup = Cleanup::unmounting(layout.mountpoint.clone());
    let (first, second) = (user(), user());
    let daemon = cleanup.spawn(&mut mount_living_for(&layout, &[first.id(), second.id()]));
    wait_until_mounted(&layout.mountpoint, daemon);

    end(first);
    std::thread::sleep(STILL_SERVING);
    assert!(
        daemon.try_wait().unwrap().is_none() && is_mount_point(&layout.mountpoint),
        "the daemon stopped while one of its users lived"
    );
    assert!(std::fs::read(layout.mountpoint.join("tiny.txt")).is_ok());

    end(second);
    let status = exit_of(daemon, "the daemon to exit after its users", PATIENCE);
    assert!(status.success(), "the daemon failed: {status}");
    assert!(!is_mount_point(&layout.mountpoint));
    assert!(
        !layout.scratch.exists(),
        "the scratch directory (mountpoint, cache, log) was left behind"
    );
}

#[test]
fn a_file_open_when_the_last_user_exits_is_served_until_it_closes() {
    let dir = tempfile::tempdir().unwrap();
    let layout = layout(dir.path());
    let mut cleanup = Cleanup::unmounting(layout.mountpoint.clone());
    let only = user();
    let daemon = cleanup.spawn(&mut mount_living_for(&layout, &[only.id()]));
    wait_until_mounted(&layout.mountpoint, daemon);
    let open = std::fs::File::open(layout.mountpoint.join("nested/big.bin")).unwrap();

    end(only);
    common::process::wait_for("the mount to be detached", || {
        !is_mount_point(&layout.mountpoint)
    });
    assert!(
        common::read_at(&open, 0, 4096).is_ok(),
        "an open file of the detached mount no longer reads"
    );
    assert!(daemon.try_wait().unwrap().is_none());
    drop(open);
    let status = exit_of(daemon, "the daemon to exit once the file closed", PATIENCE);
    assert!(status.success(), "the daemon failed: {status}");
    assert!(!layout.scratch.exists());
}

#[test]
fn a_user_gone_before_the_mount_started_ends_it_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let layout = layout(dir.path());
    let mut cleanup = Cleanup::unmounting(layout.mountpoint.clone());
    let gone = user();
    let pid = gone.id();
    end(gone);
    let daemon = cleanup.spawn(&mut mount_living_for(&layout, &[pid]));
    let status = exit_of(daemon, "the daemon to exit", PATIENCE);
    assert!(status.success(), "the daemon failed: {status}");
    assert!(!is_mount_point(&layout.mountpoint));
    assert!(!layout.scratch.exists());
}

#[test]
fn a_scratch_dir_that_could_hold_anything_else_is_refused_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let layout = layout(dir.path());
    let _cleanup = Cleanup::unmounting(layout.mountpoint.clone());
    let scratch = layout.scratch.display().to_string();
    let refused = |why: &str| {
        let output = scdlfs_command(["mount"])
            .arg(&layout.source)
            .arg(&layout.mountpoint)
            .args(["--scratch-dir", &scratch, "--cache-dir"])
            .arg(layout.scratch.join("cache"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{why}: mounted");
        assert!(stderr.contains("--scratch-dir"), "{why}: {stderr}");
        assert!(!is_mount_point(&layout.mountpoint), "{why}: mounted");
        assert!(layout.mountpoint.is_dir(), "{why}: the directory went");
        stderr.into_owned()
    };

    std::fs::create_dir(layout.scratch.join("precious")).unwrap();
    let stderr = refused("a directory holding another directory");
    assert!(stderr.contains("precious"), "{stderr}");
    std::fs::remove_dir(layout.scratch.join("precious")).unwrap();

    std::fs::set_permissions(&layout.scratch, std::fs::Permissions::from_mode(0o755)).unwrap();
    let stderr = refused("a directory other users can enter");
    assert!(stderr.contains("0700"), "{stderr}");
}

fn users_of(mountpoint: &Path) -> serde_json::Value {
    let mut buf = vec![0u8; 4096];
    let len = rustix::fs::getxattr(mountpoint, USERS, &mut buf).unwrap();
    serde_json::from_slice(&buf[..len]).unwrap()
}

fn write_users(mountpoint: &Path, value: &str) -> rustix::io::Result<()> {
    rustix::fs::setxattr(
        mountpoint,
        USERS,
        value.as_bytes(),
        rustix::fs::XattrFlags::empty(),
    )
}

#[test]
fn a_process_attached_later_keeps_the_mount_until_it_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let layout = layout(dir.path());
    let mut cleanup = Cleanup::unmounting(layout.mountpoint.clone());
    let (starter, later) = (user(), user());
    let daemon = cleanup.spawn(&mut mount_living_for(&layout, &[starter.id()]));
    wait_until_mounted(&layout.mountpoint, daemon);

    write_users(&layout.mountpoint, &format!("+{}", later.id())).unwrap();
    let users = users_of(&layout.mountpoint);
    assert_eq!(users["daemon"], daemon.id());
    assert_eq!(
        users["users"],
        serde_json::json!([starter.id(), later.id()])
    );
    assert_eq!(
        write_users(&layout.mountpoint, "+0"),
        Err(rustix::io::Errno::INVAL),
        "a pid that names no process"
    );

    end(starter);
    std::thread::sleep(STILL_SERVING);
    assert!(
        daemon.try_wait().unwrap().is_none() && is_mount_point(&layout.mountpoint),
        "the daemon stopped while a process attached later lived"
    );
    assert_eq!(
        users_of(&layout.mountpoint)["users"],
        serde_json::json!([later.id()])
    );

    // Leaving, not exiting: the last user's leave stops the mount.
    write_users(&layout.mountpoint, &format!("-{}", later.id())).unwrap();
    let status = exit_of(
        daemon,
        "the daemon to exit after its last user left",
        PATIENCE,
    );
    assert!(status.success(), "the daemon failed: {status}");
    assert!(!is_mount_point(&layout.mountpoint) && !layout.scratch.exists());
    end(later);
}

#[test]
fn a_mount_without_exit_with_pid_takes_no_users() {
    let dir = tempfile::tempdir().unwrap();
    let layout = layout(dir.path());
    let mut cleanup = Cleanup::unmounting(layout.mountpoint.clone());
    let daemon = cleanup.spawn(&mut foreground_mount(
        &layout.source,
        &layout.mountpoint,
        &dir.path().join("cache"),
        &[],
    ));
    wait_until_mounted(&layout.mountpoint, daemon);
    let me = std::process::id();
    assert_eq!(
        write_users(&layout.mountpoint, &format!("+{me}")),
        Err(rustix::io::Errno::INVAL)
    );
    assert_eq!(users_of(&layout.mountpoint)["users"], serde_json::json!([]));
}

fn shown_by(mountpoint: &Path) -> serde_json::Value {
    let mut buf = vec![0u8; 4096];
    let len = rustix::fs::getxattr(mountpoint, SOURCE, &mut buf).unwrap();
    serde_json::from_slice(&buf[..len]).unwrap()
}

/// The root says what the mount shows and whether it lives for users, so that a process
/// wanting a mount of a source (the Python package) can tell a node's own mount, which
/// it may use as it is, from one that goes with another process.
#[test]
fn the_root_says_what_the_mount_shows_and_whether_it_lives_for_users() {
    let dir = tempfile::tempdir().unwrap();
    let node = layout(dir.path());
    let mut cleanup = Cleanup::unmounting(node.mountpoint.clone());
    let daemon = cleanup.spawn(&mut foreground_mount(
        &node.source,
        &node.mountpoint,
        &dir.path().join("cache"),
        &[],
    ));
    wait_until_mounted(&node.mountpoint, daemon);
    assert_eq!(
        shown_by(&node.mountpoint),
        serde_json::json!({
            "source": node.source.display().to_string(),
            "endpoint": null,
            "daemon": daemon.id(),
            "lives_for_users": false,
        })
    );

    let other = tempfile::tempdir().unwrap();
    let job = layout(other.path());
    let mut job_cleanup = Cleanup::unmounting(job.mountpoint.clone());
    let starter = user();
    let daemon = job_cleanup.spawn(&mut mount_living_for(&job, &[starter.id()]));
    wait_until_mounted(&job.mountpoint, daemon);
    let shown = shown_by(&job.mountpoint);
    assert_eq!(shown["lives_for_users"], true, "{shown}");
    assert_eq!(shown["source"], job.source.display().to_string());
    end(starter);
}
