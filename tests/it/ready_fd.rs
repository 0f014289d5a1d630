//! `SCDLFS_READY_FD` is how a detaching `scdlfs mount` hears from its daemon; a mount
//! started with it naming anything but an inherited pipe (a variable left in a
//! service's environment, a typo) neither writes into that descriptor nor closes it.
//! Through the real binary, mounting a local folder in the foreground.

use crate::common;

use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::process::{exit_of, foreground_mount, wait_until_mounted, Cleanup};
use common::write_source;

/// Mounts a local folder in the foreground with `SCDLFS_READY_FD=fd` and stdout
/// `stdout`, until the mount answers, then stops it with SIGTERM; returns what the
/// daemon wrote to its standard output, if it was piped.
fn mount_with_ready_fd(dir: &Path, fd: i32, stdout: Stdio) -> String {
    let source = dir.join("source");
    write_source(&source);
    let mountpoint = dir.join("mnt");
    std::fs::create_dir_all(&mountpoint).unwrap();
    let mut cleanup = Cleanup::unmounting(mountpoint.clone());
    let mut command = foreground_mount(&source, &mountpoint, &dir.join("cache"), &[]);
    command
        .env("SCDLFS_READY_FD", fd.to_string())
        .stdout(stdout);
    let daemon = cleanup.spawn(&mut command);
    wait_until_mounted(&mountpoint, daemon);
    // SAFETY: signalling the daemon this test started.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let status = exit_of(daemon, "the daemon to stop", Duration::from_secs(30));
    assert!(status.success(), "the daemon failed: {status}");
    let mut out = String::new();
    if let Some(mut piped) = daemon.stdout.take() {
        piped.read_to_string(&mut out).unwrap();
    }
    out
}

#[test]
fn a_ready_fd_naming_an_inherited_file_leaves_the_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let file = std::fs::File::create(dir.path().join("precious")).unwrap();
    // Inherited by the daemon, as a descriptor of a service's own would be.
    rustix::io::fcntl_setfd(&file, rustix::io::FdFlags::empty()).unwrap();
    mount_with_ready_fd(dir.path(), file.as_raw_fd(), Stdio::null());
    let written = std::fs::read_to_string(dir.path().join("precious")).unwrap();
    assert_eq!(written, "", "the daemon wrote into a file it was not given");
}

#[test]
fn a_ready_fd_naming_standard_output_neither_writes_to_it_nor_closes_it() {
    let dir = tempfile::tempdir().unwrap();
    // Standard output is a pipe here, as under a service manager: the type alone does
    // not tell it from the detaching parent's pipe.
    let out = mount_with_ready_fd(dir.path(), 1, Stdio::piped());
    assert!(
        !out.contains("ready"),
        "the daemon reported into its standard output: {out:?}"
    );
}

#[test]
fn a_ready_fd_naming_no_open_descriptor_mounts_as_usual() {
    let dir = tempfile::tempdir().unwrap();
    mount_with_ready_fd(dir.path(), 987, Stdio::null());
}
