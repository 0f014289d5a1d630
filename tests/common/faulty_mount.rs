//! The fault tests' harness: moto_server with the plain test files, the fault proxy in
//! front, a mount through it with the daemon's client settings, and
//! reads judged against the source: right bytes, EIO, wrong bytes, or past the bound.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use scdlfs::mount::MountSettings;
use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::ObjectStore;
use scdlfs::store::NetworkBounds;

use super::proxy::{FaultProxy, Outcomes};
use super::s3::{moto, unique_bucket};
use super::{plain_files, write_files, TestMount};

/// Short bounds so that the stall tests finish quickly.
pub const BOUNDS: NetworkBounds = NetworkBounds {
    request_timeout: Duration::from_secs(3),
    stall_timeout: Duration::from_secs(1),
    max_attempts: 4,
    read_timeout: Duration::from_secs(6),
};

pub const MAX_TRIES: u64 = BOUNDS.max_attempts as u64;

/// The bound on one read(2): the kernel sends a failed read-ahead page again, once, as
/// a request of its own, so a read that fails may wait for two FUSE requests.
pub const READ_SYSCALL_BOUND: Duration = Duration::from_secs(2 * 6);

/// Scheduling delay allowed on top of the bound on a loaded machine.
pub const SLACK: Duration = Duration::from_secs(3);

pub struct Setup {
    pub proxy: FaultProxy,
    pub mount: TestMount,
    pub files: BTreeMap<String, Vec<u8>>,
    pub bucket: String,
}

/// moto_server with the plain test files, the proxy in front, a mount through it.
pub fn setup(name: &str, configure: impl FnOnce(&mut MountSettings)) -> Setup {
    // The daemon's log lines, for a failing run: RUST_LOG=scdlfs=debug.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let moto = moto();
    let bucket = unique_bucket(name);
    moto.create_bucket(&bucket);
    let files = plain_files();
    let dir = tempfile::tempdir().unwrap();
    write_files(dir.path(), &files);
    moto.upload(&bucket, "data", dir.path());
    let proxy = FaultProxy::start(&moto.endpoint);
    // The daemon's client settings (`NetworkBounds` shapes retries and timeouts as in
    // `Source::open`), with explicit dummy keys: moto refuses unsigned reads.
    let store: Arc<dyn ObjectStore> = Arc::new(
        AmazonS3Builder::new()
            .with_bucket_name(&bucket)
            .with_endpoint(proxy.endpoint())
            .with_region("us-east-1")
            .with_access_key_id("test")
            .with_secret_access_key("test")
            .with_virtual_hosted_style_request(false)
            .with_client_options(BOUNDS.client_options().with_allow_http(true))
            .with_retry(BOUNDS.retry_config())
            .build()
            .unwrap(),
    );
    let mount = TestMount::start(store, "data", |s| {
        s.read_timeout = BOUNDS.read_timeout;
        configure(s);
    });
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
        late: u64::from(elapsed > READ_SYSCALL_BOUND + SLACK),
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
