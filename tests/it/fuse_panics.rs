//! A panic in a FUSE operation answers that operation with EIO and takes nothing else
//! down: every FUSE thread goes on serving. The panic comes from below, where a bug
//! would put it: a store whose listing of one directory panics at once, so that the
//! operation panics in the FUSE thread's own first poll of it (a panic there used to
//! end the thread, and on thread 0 the whole mount), or after its first wait, in the
//! task the operation moved to.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use async_trait::async_trait;
use object_store::path::Path as ObjectPath;
use object_store::{ListResult, ObjectStore, Result};
use scdlfs::store::wrapper::{HookedStore, StoreHook};

use common::*;

/// Fewer FUSE threads than panics, so that a panic that ended a thread would leave
/// none to serve.
const FUSE_THREADS: usize = 2;
const PANICS: usize = 3 * FUSE_THREADS;

/// A store hook whose listing of `at_once/` panics when first polled and whose listing
/// of `after_a_wait/` panics once it has waited; everything else passes through.
#[derive(Debug)]
struct PanickingListings;

#[async_trait]
impl StoreHook for PanickingListings {
    async fn list_with_delimiter(
        &self,
        inner: &dyn ObjectStore,
        prefix: Option<&ObjectPath>,
    ) -> Result<ListResult> {
        match prefix.map(|p| p.as_ref()) {
            Some("at_once") => panic!("injected panic listing at_once/"),
            Some("after_a_wait") => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                panic!("injected panic listing after_a_wait/")
            }
            _ => inner.list_with_delimiter(prefix).await,
        }
    }
}

/// `ls DIR` in a process of its own, killed after 20 s: its exit status and standard
/// error. A mount whose FUSE threads are gone would leave it waiting.
fn ls(dir: &Path) -> (std::process::ExitStatus, String) {
    let out = Command::new("timeout")
        .args(["-s", "KILL", "20", "ls"])
        .arg(dir)
        .output()
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `cat FILE` the same way: its exit status and the bytes it printed.
fn cat(file: &PathBuf) -> (std::process::ExitStatus, Vec<u8>) {
    let out = Command::new("timeout")
        .args(["-s", "KILL", "20", "cat"])
        .arg(file)
        .output()
        .unwrap();
    (out.status, out.stdout)
}

#[test]
fn a_panicking_operation_answers_eio_and_every_fuse_thread_serves_on() {
    let src = tempfile::tempdir().unwrap();
    let files = plain_files();
    write_files(src.path(), &files);
    for dir in ["at_once", "after_a_wait"] {
        std::fs::create_dir(src.path().join(dir)).unwrap();
        std::fs::write(src.path().join(dir).join("inner.bin"), b"never listed").unwrap();
    }
    let store = Arc::new(HookedStore::new(local_store(src.path()), PanickingListings));
    let mount = TestMount::start(store, "", |s| s.fuse_threads = FUSE_THREADS);
    for round in 0..PANICS {
        for dir in ["at_once", "after_a_wait"] {
            let (status, stderr) = ls(&mount.path().join(dir));
            assert!(!status.success(), "round {round}: ls {dir} listed");
            assert!(
                stderr.contains("Input/output error"),
                "round {round}: ls {dir}: {stderr}"
            );
        }
    }
    for (name, want) in &files {
        let (status, got) = cat(&mount.path().join(name));
        assert!(status.success(), "{name}: cat exited with {status}");
        assert!(&got == want, "{name}: wrong bytes");
    }
    let (status, stderr) = ls(&mount.path());
    assert!(status.success(), "ls of the root: {stderr}");
}
