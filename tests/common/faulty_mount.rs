//! The fault tests' harness: moto_server with the plain test files, the fault proxy in
//! front, and the real `scdlfs mount` through it, its network bounds given as the
//! command-line flags a user would pass (`--request-timeout`, `--stall-timeout`,
//! `--max-attempts`, `--read-timeout`); reads judged against the source: right bytes,
//! EIO, wrong bytes, or past the bound.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::time::{Duration, Instant};

use scdlfs::store::NetworkBounds;

use super::cli_mount::CliMount;
use super::proxy::{FaultProxy, Outcomes};
use super::s3::{moto, unique_bucket};
use super::{plain_files, write_files};

/// Short bounds so that the stall tests finish quickly, each unlike the flag's default
/// so that a flag the mount ignored shows.
pub const BOUNDS: NetworkBounds = NetworkBounds {
    request_timeout: Duration::from_secs(3),
    stall_timeout: Duration::from_secs(1),
    max_attempts: 3,
    read_timeout: Duration::from_secs(6),
};

pub const MAX_TRIES: u64 = BOUNDS.max_attempts as u64;

/// The bound on one read(2) with `bounds`: the kernel sends a failed read-ahead page
/// again, once, as a request of its own, so a read that fails may wait for two FUSE
/// requests.
pub fn read_syscall_bound(bounds: &NetworkBounds) -> Duration {
    2 * bounds.read_timeout
}

/// Scheduling delay allowed on top of the bound on a loaded machine.
pub const SLACK: Duration = Duration::from_secs(3);

pub struct Setup {
    pub proxy: FaultProxy,
    pub mount: CliMount,
    pub files: BTreeMap<String, Vec<u8>>,
    pub bucket: String,
}

/// The flags that give a mount `bounds`.
pub fn bound_flags(bounds: &NetworkBounds) -> Vec<String> {
    let duration = |d: Duration| humantime::format_duration(d).to_string();
    vec![
        "--request-timeout".into(),
        duration(bounds.request_timeout),
        "--stall-timeout".into(),
        duration(bounds.stall_timeout),
        "--max-attempts".into(),
        bounds.max_attempts.to_string(),
        "--read-timeout".into(),
        duration(bounds.read_timeout),
    ]
}

/// moto_server with the plain test files, the proxy in front, `scdlfs mount` through
/// it with [`BOUNDS`] and the `extra` flags.
pub fn setup(name: &str, extra: &[&str]) -> Setup {
    setup_with_bounds(name, &BOUNDS, extra)
}

/// As [`setup`], with the network bounds `bounds`.
pub fn setup_with_bounds(name: &str, bounds: &NetworkBounds, extra: &[&str]) -> Setup {
    setup_of(name, bounds, extra, |_| {})
}

/// As [`setup`], with the small synthetic dataset beside the plain files (at `ds/`,
/// not among [`Setup::files`]) and the mount open to other users (`--allow-other`,
/// the mountpoint reachable), whose hint file another user may then write.
pub fn setup_shared_with_dataset(name: &str, extra: &[&str]) -> Setup {
    let mut extra = extra.to_vec();
    extra.push("--allow-other");
    let setup = setup_of(name, &BOUNDS, &extra, |dir| {
        super::small_dataset()
            .write_chunked(&dir.join("ds"))
            .unwrap();
    });
    let reachable = std::fs::Permissions::from_mode(0o755);
    std::fs::set_permissions(setup.mount.dir.path(), reachable).unwrap();
    setup
}

fn setup_of(
    name: &str,
    bounds: &NetworkBounds,
    extra: &[&str],
    add_to_source: impl FnOnce(&std::path::Path),
) -> Setup {
    let moto = moto();
    let bucket = unique_bucket(name);
    moto.create_bucket(&bucket);
    let files = plain_files();
    let dir = tempfile::tempdir().unwrap();
    write_files(dir.path(), &files);
    add_to_source(dir.path());
    moto.upload(&bucket, "data", dir.path());
    let proxy = FaultProxy::start(&moto.endpoint);
    let endpoint = proxy.endpoint();
    let bound_flags = bound_flags(bounds);
    let mut flags = vec!["--endpoint-url", &endpoint, "--read-part-size", "64KiB"];
    flags.extend(bound_flags.iter().map(String::as_str));
    flags.extend_from_slice(extra);
    // Explicit dummy keys: moto refuses unsigned reads.
    let key = OsString::from("test");
    let mount = CliMount::start(
        &format!("s3://{bucket}/data"),
        &flags,
        &[("AWS_ACCESS_KEY_ID", &key), ("AWS_SECRET_ACCESS_KEY", &key)],
    );
    // Listed before any fault: the tests break part downloads, not lookups.
    for name in files.keys() {
        std::fs::metadata(mount.path().join(name)).unwrap();
    }
    Setup {
        proxy,
        mount,
        files,
        bucket,
    }
}

/// One read of `len` bytes at `offset`, judged against `want`.
/// Late means past [`read_syscall_bound`] of [`BOUNDS`].
pub fn judged_read(file: &File, want: &[u8], offset: u64, len: usize) -> Outcomes {
    let started = Instant::now();
    let mut buf = vec![0u8; len];
    let mut got = 0;
    let result = loop {
        if got == len {
            break Ok(());
        }
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break Ok(()),
            Ok(n) => got += n,
            Err(e) => break Err(e),
        }
    };
    let elapsed = started.elapsed();
    let mut outcome = Outcomes {
        slowest_ms: elapsed.as_millis() as u64,
        late: u64::from(elapsed > read_syscall_bound(&BOUNDS) + SLACK),
        ..Outcomes::default()
    };
    match result {
        Err(e) if e.raw_os_error() == Some(libc::EIO) => outcome.eio = 1,
        Err(e) => panic!("read failed with something other than EIO: {e}"),
        Ok(()) => {
            let start = (offset as usize).min(want.len());
            let end = (start + len).min(want.len());
            if buf[..got] == want[start..end] {
                outcome.ok = 1;
            } else {
                outcome.wrong = 1;
            }
        }
    }
    outcome
}
