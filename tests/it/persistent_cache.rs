//! The cache outlives the mount (issue 11): a remount on the same cache directory adopts
//! what an earlier mount (cleanly unmounted or killed) downloaded, counted at the store,
//! and never serves a part of a changed object, a damaged part or a torn write; a
//! smaller budget shrinks the directory at once.

use crate::common;

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::process::{
    exit_of, foreground_mount, status_json, unmount, wait_until_mounted, wait_within, Cleanup,
    PATIENCE,
};
use common::*;
use object_store::path::Path as ObjectPath;
use scdl_format::layout::HEADER_FILE;
use scdlfs::cache::part_file::PartHeader;
use scdlfs::cache::test_files::{dir_bytes, flip_bit};
use scdlfs::mount::Mount;
use scdlfs::store::counting::CountReads;
use scdlfs::store::wrapper::HookedStore;

/// A source folder, and a cache directory that outlives the mounts of it.
struct Setup {
    src: tempfile::TempDir,
    cache: tempfile::TempDir,
    want: BTreeMap<String, Vec<u8>>,
}

impl Setup {
    fn new() -> Setup {
        let src = tempfile::tempdir().unwrap();
        let want = write_source(src.path());
        Setup {
            src,
            cache: tempfile::tempdir().unwrap(),
            want,
        }
    }

    fn parts_dir(&self) -> PathBuf {
        self.cache
            .path()
            .join(scdlfs::cache::adopt::layout_dir_name())
            .join("parts")
    }

    /// `scdlfs mount --foreground` of the source on `mountpoint` with the shared cache
    /// directory and a 256 MiB budget, as a daemon of its own (for kills and fd limits).
    fn daemon_command(&self, mountpoint: &Path, part_size: &str) -> Command {
        foreground_mount(
            self.src.path(),
            mountpoint,
            self.cache.path(),
            &["--cache-size", "256MiB", "--read-part-size", part_size],
        )
    }

    /// Mounts the source through a request counter on the shared cache directory, and
    /// waits until the earlier mount's part files have all been looked at.
    fn mount(&self, cache_bytes: u64) -> (TestMount, Arc<HookedStore<CountReads>>) {
        let (mount, counted) = self.mount_at_once(cache_bytes, 64 << 10);
        wait_within("adoption to end", Duration::from_secs(20), || {
            mount.status().cache.adoption_done
        });
        (mount, counted)
    }

    /// The same, not waiting for anything after the mount, with parts of `part_size`.
    fn mount_at_once(
        &self,
        cache_bytes: u64,
        part_size: u64,
    ) -> (TestMount, Arc<HookedStore<CountReads>>) {
        let counted = Arc::new(HookedStore::new(
            local_store(self.src.path()),
            CountReads::default(),
        ));
        let cache_dir = self.cache.path().to_owned();
        let mount = TestMount::start(counted.clone(), "", |s| {
            s.fs_name = self.src.path().display().to_string();
            s.cache_dir = cache_dir;
            s.cache_bytes = cache_bytes;
            s.part_size = part_size;
        });
        (mount, counted)
    }

    /// Reads the files, checking every byte; returns once their parts are cached.
    fn read_all(&self, mount: &TestMount, names: &[&String]) {
        for name in names {
            let got = std::fs::read(mount.path().join(name)).unwrap();
            assert!(got == self.want[*name], "{name}: wrong bytes");
        }
        mount.settle();
    }
}

fn names(want: &BTreeMap<String, Vec<u8>>) -> Vec<&String> {
    want.keys().collect()
}

/// The store's requests for parts (and direct reads). A dataset's header.sch is read
/// when the dataset is discovered, by every mount (metadata, not a cached part).
fn part_requests(counted: &HookedStore<CountReads>) -> Vec<impl std::fmt::Debug> {
    counted
        .hook()
        .snapshot()
        .into_iter()
        .filter(|((key, _), _)| !key.ends_with(HEADER_FILE))
        .collect()
}

#[test]
fn a_remount_reads_what_an_earlier_mount_read_without_a_request() {
    let setup = Setup::new();
    let all = names(&setup.want);
    let (first_half, second_half) = all.split_at(all.len() / 2);
    {
        let (mount, _) = setup.mount(256 << 20);
        setup.read_all(&mount, first_half);
    }
    let (mount, counted) = setup.mount(256 << 20);
    setup.read_all(&mount, first_half);
    let status = mount.status().cache;
    assert!(status.adopted_parts > 0, "{status:?}");
    let part_gets = part_requests(&counted);
    assert!(
        part_gets.is_empty(),
        "GETs for parts read before the remount: {part_gets:?}"
    );
    setup.read_all(&mount, second_half);
    assert!(counted.hook().total() > 0);
}

/// Reads that come right after the mount, while the earlier mount's headers are still
/// being read, find their parts' files by name (or after the background claimed
/// them): no part is fetched again. Small parts make many files to read.
#[test]
fn reads_at_once_after_a_remount_fetch_no_part_again() {
    let setup = Setup::new();
    let all = names(&setup.want);
    {
        let (mount, _) = setup.mount_at_once(256 << 20, 4 << 10);
        setup.read_all(&mount, &all);
    }
    let (mount, counted) = setup.mount_at_once(256 << 20, 4 << 10);
    setup.read_all(&mount, &all);
    let part_gets = part_requests(&counted);
    assert!(part_gets.is_empty(), "parts fetched again: {part_gets:?}");
    let status = mount.status().cache;
    assert!(status.adopted_parts > 400, "{status:?}");
}

#[test]
fn an_object_replaced_between_mounts_is_read_anew() {
    let mut setup = Setup::new();
    let name = "nested/big.bin".to_owned();
    {
        let (mount, _) = setup.mount(256 << 20);
        setup.read_all(&mount, &[&name]);
    }
    // Same length, other bytes: only the ETag tells.
    let new = pattern(99, setup.want[&name].len());
    std::fs::write(setup.src.path().join(&name), &new).unwrap();
    setup.want.insert(name.clone(), new);
    let (mount, counted) = setup.mount(256 << 20);
    setup.read_all(&mount, &[&name]);
    let status = mount.status().cache;
    assert_eq!(status.adopted_parts, 0, "{status:?}");
    assert!(status.stale_parts_removed >= 12, "{status:?}");
    assert!(counted.hook().total() >= 12);
}

#[test]
fn damaged_part_files_are_never_served_after_a_remount() {
    let setup = Setup::new();
    let all = names(&setup.want);
    {
        let (mount, _) = setup.mount(256 << 20);
        setup.read_all(&mount, &all);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(setup.parts_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let mut damaged = 0;
    for (i, path) in files.iter().enumerate().step_by(4) {
        let bytes = std::fs::read(path).unwrap();
        let header = PartHeader::decode(&bytes).unwrap();
        if header.data_len == 0 {
            continue;
        }
        // Alternately a header byte and a data byte.
        let at = match i % 8 {
            0 => 17,
            _ => header.encoded_len() as u64 + header.data_len / 2,
        };
        flip_bit(path, at);
        damaged += 1;
    }
    assert!(damaged >= 5, "{damaged} damaged");
    let (mount, counted) = setup.mount(256 << 20);
    setup.read_all(&mount, &all);
    let status = mount.status().cache;
    assert!(
        status.stale_parts_removed + status.corrupt_parts_dropped >= damaged,
        "{status:?}"
    );
    assert!(counted.hook().total() >= damaged);
}

#[test]
fn a_smaller_budget_on_remount_shrinks_the_directory_at_once() {
    let setup = Setup::new();
    let all = names(&setup.want);
    {
        let (mount, _) = setup.mount(256 << 20);
        setup.read_all(&mount, &all);
    }
    let before = dir_bytes(&setup.parts_dir());
    let budget = before / 3;
    let (mount, _) = setup.mount_at_once(budget, 64 << 10);
    // Before any header is read (from the files' names alone) the books count at least
    // what the directory holds, and that is within the budget.
    let after = dir_bytes(&setup.parts_dir());
    let counted = mount.status().cache;
    assert!(
        after <= counted.cached_bytes && counted.cached_bytes <= budget,
        "{after} bytes in the directory, {} counted, budget {budget}",
        counted.cached_bytes
    );
    setup.read_all(&mount, &all);
    assert!(dir_bytes(&setup.parts_dir()) <= budget);
}

#[test]
fn a_daemon_killed_while_downloading_leaves_a_cache_the_next_mount_can_trust() {
    let setup = Setup::new();
    let mountpoint = tempfile::tempdir().unwrap();
    let mut guard = Cleanup::unmounting(mountpoint.path().to_owned());
    let mut command = setup.daemon_command(mountpoint.path(), "64KiB");
    let daemon = guard.spawn(&mut command);
    wait_until_mounted(mountpoint.path(), daemon);
    // Readers of every file at once; the daemon dies under them.
    let readers: Vec<_> = setup
        .want
        .keys()
        .map(|name| {
            let path = mountpoint.path().join(name);
            std::thread::spawn(move || {
                let _ = std::fs::read(path);
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(30));
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    for reader in readers {
        reader.join().unwrap();
    }
    unmount(mountpoint.path());
    let left = std::fs::read_dir(setup.parts_dir()).unwrap().count();

    let (mount, counted) = setup.mount(256 << 20);
    assert!(
        !has_temporaries(&setup.parts_dir()),
        "torn temporaries removed at open"
    );
    setup.read_all(&mount, &names(&setup.want));
    let status = mount.status().cache;
    assert!(status.adopted_parts as usize <= left);
    assert!(
        left == 0 || status.adopted_parts > 0,
        "complete parts reused: {status:?}"
    );
    let fetched_twice: Vec<_> = counted
        .hook()
        .snapshot()
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .collect();
    assert!(fetched_twice.is_empty(), "{fetched_twice:?}");
}

/// The same bucket name at two endpoints is two stores: a cache directory recorded for
/// one is refused to the other, with a message naming both, and still serves the first.
#[test]
fn a_cache_of_the_same_bucket_at_another_endpoint_is_refused() {
    let setup = Setup::new();
    let mount_at = |endpoint: &str| {
        let dir = tempfile::tempdir().unwrap();
        let mut s = settings(setup.cache.path());
        s.fs_name = "s3://bucket/atlas".into();
        s.endpoint = Some(endpoint.into());
        let mounted = Mount::start(
            local_store(setup.src.path()),
            ObjectPath::from(""),
            dir.path(),
            &s,
        );
        (mounted, dir)
    };
    let (first, _dir) = mount_at("http://127.0.0.1:9000");
    let first = first.expect("first mount");
    let name = "nested/big.bin";
    assert!(std::fs::read(first.mountpoint().join(name)).unwrap() == setup.want[name]);
    first.unmount().unwrap();
    let (refused, _dir) = mount_at("http://127.0.0.1:9001");
    let message = refused.err().expect("another endpoint refused").to_string();
    for said in [
        "belongs to the source s3://bucket/atlas at the endpoint http://127.0.0.1:9000",
        "not s3://bucket/atlas at the endpoint http://127.0.0.1:9001",
        "--cache-reset",
    ] {
        assert!(message.contains(said), "{message}");
    }
    let (again, _dir) = mount_at("http://127.0.0.1:9000/");
    let again = again.expect("the recorded endpoint mounts again");
    assert!(std::fs::read(again.mountpoint().join(name)).unwrap() == setup.want[name]);
}

fn has_temporaries(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .unwrap()
        .any(|e| e.unwrap().path().extension().is_some_and(|x| x == "tmp"))
}

/// A daemon whose open-file limit is far below its cached parts (first mount and
/// remount, adopted parts included) closes and reopens part files: every read right.
#[test]
fn more_cached_parts_than_open_files_allowed_still_read_right() {
    let setup = Setup::new();
    let all = names(&setup.want);
    for round in 0..2 {
        let mountpoint = tempfile::tempdir().unwrap();
        let mut guard = Cleanup::unmounting(mountpoint.path().to_owned());
        let mut command = setup.daemon_command(mountpoint.path(), "4KiB");
        command.args(["--fuse-threads", "1", "--max-concurrent-requests", "2"]);
        // SAFETY: setrlimit before exec, on the child's own limits.
        unsafe {
            command.pre_exec(|| {
                let limit = libc::rlimit {
                    rlim_cur: 128,
                    rlim_max: 128,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        wait_until_mounted(mountpoint.path(), guard.spawn(&mut command));
        // Twice: the second pass reads parts whose files were closed for the limit.
        for _ in 0..2 {
            for name in &all {
                let got = std::fs::read(mountpoint.path().join(name)).unwrap();
                assert!(
                    got == setup.want[*name],
                    "round {round}: {name}: wrong bytes"
                );
            }
            // Past the kernel's page cache: drop it for the mount.
            for name in &all {
                forget_cached_pages(&std::fs::File::open(mountpoint.path().join(name)).unwrap());
            }
        }
        let status: scdlfs::status::Status =
            serde_json::from_value(status_json(mountpoint.path())).unwrap();
        assert!(
            status.cache.cached_parts > 128,
            "round {round}: {} parts cached, not more than the limit",
            status.cache.cached_parts
        );
        assert!(
            status.cache.part_files_reopened > 0,
            "round {round}: {:?}",
            status.cache
        );
        if round == 1 {
            assert!(status.cache.adopted_parts > 0, "{:?}", status.cache);
        }
        unmount(mountpoint.path());
        exit_of(&mut guard.children[0], "the daemon to exit", PATIENCE);
    }
}
