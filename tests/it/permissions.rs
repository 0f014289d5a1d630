//! Who may use a mount: the owner and modes the files show are the ones the kernel
//! enforces (`default_permissions`) for the other users `--allow-other` lets in, and
//! the hint file is writable by exactly those who may read the dataset.

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use common::{local_store, write_source, TestMount};
use scdl_format::hint::HINT_FILE;
use scdlfs::fs::Ownership;

/// `nobody` on Debian.
const OTHER_UID: u32 = 65534;

fn mount_with(ownership: Ownership) -> (tempfile::TempDir, TestMount) {
    let source = tempfile::tempdir().unwrap();
    write_source(source.path());
    let mount = TestMount::start(local_store(source.path()), "", |s| {
        s.allow_other = true;
        s.ownership = ownership;
    });
    // The other user must reach the mountpoint, or every check below passes for the
    // wrong reason.
    std::fs::set_permissions(mount.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    (source, mount)
}

/// Runs `script` in `sh` as the other user; returns (succeeded, stderr).
fn as_other_user(script: &str, path: &Path) -> (bool, String) {
    let output = Command::new("sh")
        .args(["-c", script, "sh"])
        .arg(path)
        .uid(OTHER_UID)
        .gid(OTHER_UID)
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

const READ: &str = "cat \"$1\" > /dev/null";
/// What the released reader does: open read-write (`r+`).
const OPEN_READ_WRITE: &str = "exec 3<> \"$1\"";
const OPEN_FOR_WRITING: &str = ": >> \"$1\"";

fn ownership(file_mode: u16) -> Ownership {
    Ownership {
        uid: 0,
        gid: 0,
        file_mode,
        dir_mode: 0o755,
    }
}

#[test]
fn another_user_is_refused_what_the_modes_forbid() {
    let (_source, mount) = mount_with(ownership(0o640));
    let data = mount.path().join("ds/data.npy");
    let hints = mount.path().join("ds").join(HINT_FILE);

    let (listed, stderr) = as_other_user("ls \"$1\" > /dev/null", &mount.path().join("ds"));
    assert!(listed, "the directory (0755) must list: {stderr}");
    for (what, script, path) in [
        ("read a 0640 file", READ, &data),
        ("open a 0640 file read-write", OPEN_READ_WRITE, &data),
        ("open the hint file for writing", OPEN_FOR_WRITING, &hints),
    ] {
        let (ok, stderr) = as_other_user(script, path);
        assert!(!ok, "another user could {what}");
        assert!(stderr.contains("Permission denied"), "{what}: {stderr}");
    }
    // The owner (root here) is not refused.
    assert!(std::fs::read(&data).is_ok());
}

#[test]
fn another_user_may_do_what_the_modes_allow_and_writes_still_fail() {
    let (_source, mount) = mount_with(ownership(0o666));
    let data = mount.path().join("ds/data.npy");
    let hints = mount.path().join("ds").join(HINT_FILE);
    for (what, script, path) in [
        ("read a 0666 file", READ, &data),
        ("open a 0666 file read-write", OPEN_READ_WRITE, &data),
        ("open the hint file for writing", OPEN_FOR_WRITING, &hints),
    ] {
        let (ok, stderr) = as_other_user(script, path);
        assert!(ok, "another user could not {what}: {stderr}");
    }
    let before = std::fs::read(&data).unwrap();
    let (wrote, _) = as_other_user("printf x 1<> \"$1\"", &data);
    assert!(!wrote, "a write went through");
    assert_eq!(std::fs::read(&data).unwrap(), before);
}

#[test]
fn stat_shows_the_owner_and_modes_asked_for_and_hints_follow_the_readers() {
    let (_source, mount) = mount_with(Ownership {
        uid: 1234,
        gid: 5678,
        file_mode: 0o640,
        dir_mode: 0o750,
    });
    let file = std::fs::metadata(mount.path().join("ds/data.npy")).unwrap();
    assert_eq!(
        (file.uid(), file.gid(), file.mode() & 0o7777),
        (1234, 5678, 0o640)
    );
    let dir = std::fs::metadata(mount.path().join("ds")).unwrap();
    assert_eq!(
        (dir.uid(), dir.gid(), dir.mode() & 0o7777),
        (1234, 5678, 0o750)
    );
    let hints = std::fs::metadata(mount.path().join("ds").join(HINT_FILE)).unwrap();
    assert_eq!(hints.mode() & 0o7777, 0o660);
}

#[test]
fn the_hint_file_is_writable_by_exactly_the_classes_that_read() {
    for (file_mode, hint_mode) in [
        (0o644, 0o666),
        (0o640, 0o660),
        (0o600, 0o600),
        (0o444, 0o666),
        (0o666, 0o666),
        (0o604, 0o606),
        (0o000, 0o000),
    ] {
        assert_eq!(
            ownership(file_mode).hint_file_mode(),
            hint_mode,
            "{file_mode:o}"
        );
    }
}
