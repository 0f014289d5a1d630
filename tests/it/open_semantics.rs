//! The SCDL reader opens files O_RDWR and maps them shared and writable: that works and
//! reads correct data, while every write fails with EROFS and changes nothing, neither
//! in the bucket nor in the cache.

use crate::common;

use std::fs::OpenOptions;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::FileExt;

use common::*;
use scdl_format::ArrayKind;

fn erofs(result: std::io::Result<impl Sized>) {
    match result {
        Ok(_) => panic!("a write succeeded on a read-only dataset"),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}"),
    }
}

#[test]
fn read_write_open_and_shared_writable_mmap_read_correct_data() {
    let src = tempfile::tempdir().unwrap();
    small_dataset()
        .write_chunked(&src.path().join("ds"))
        .unwrap();
    let bucket_before = snapshot(src.path());
    let mount = TestMount::start(local_store(src.path()), "", |_| {});
    let mono = Monolithic::of(&small_dataset());
    let path = mount.path().join("ds").join(ArrayKind::Data.file_name());
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("O_RDWR open");
    let len = file.metadata().unwrap().len() as usize;
    // SAFETY: a fresh mapping of a file nobody writes to.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
        )
    };
    assert_ne!(
        map,
        libc::MAP_FAILED,
        "shared writable mmap: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: the mapping is `len` bytes long and lives until munmap below.
    let mapped = unsafe { std::slice::from_raw_parts(map as *const u8, len) };
    assert_eq!(mapped, &mono.data[..]);
    mount.settle();
    let cache_before = snapshot(&mount.cache_parts_dir());
    // Written through once: the write-back must be refused and change nothing.
    // SAFETY: byte 0 lies in the mapping, which is writable.
    unsafe { *(map as *mut u8) ^= 0xff };
    // SAFETY: syncing the whole mapping made above.
    let synced = unsafe { libc::msync(map, len, libc::MS_SYNC) };
    let sync_error = std::io::Error::last_os_error();
    // SAFETY: unmapping what we mapped.
    unsafe { libc::munmap(map, len) };
    assert_eq!(
        synced, -1,
        "the write-back of a read-only dataset succeeded"
    );
    eprintln!("msync after a write through the mapping: {sync_error}");
    assert_eq!(snapshot(src.path()), bucket_before, "the bucket changed");
    mount.settle();
    assert_eq!(
        snapshot(&mount.cache_parts_dir()),
        cache_before,
        "the cache changed"
    );
}

#[test]
fn writes_fail_with_erofs_and_change_nothing() {
    let src = tempfile::tempdir().unwrap();
    write_files(src.path(), &plain_files());
    small_dataset()
        .write_chunked(&src.path().join("ds"))
        .unwrap();
    let before = snapshot(src.path());
    let mount = TestMount::start(local_store(src.path()), "", |_| {});
    let mnt = mount.path();
    // Warm the cache, then record it.
    let _ = std::fs::read(mnt.join("nested/big.bin")).unwrap();
    let _ = std::fs::read(mnt.join("ds/data.npy")).unwrap();
    mount.settle();
    let cache_before = snapshot(&mount.cache_parts_dir());
    assert!(!cache_before.is_empty());

    for name in [
        "nested/big.bin",
        "ds/data.npy",
        "ds/header.sch",
        "ds/metadata.json",
    ] {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(mnt.join(name))
            .unwrap();
        erofs(file.write_all(b"garbage"));
        erofs(file.write_at(b"garbage", 3));
        erofs(file.set_len(1));
    }
    erofs(
        OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(mnt.join("tiny.txt")),
    );
    erofs(std::fs::write(mnt.join("new_file"), b"x"));
    erofs(std::fs::create_dir(mnt.join("new_dir")));
    erofs(std::fs::remove_file(mnt.join("tiny.txt")));
    erofs(std::fs::rename(mnt.join("tiny.txt"), mnt.join("moved.txt")));
    let missing = std::fs::metadata(mnt.join("new_file")).unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound);

    assert_eq!(snapshot(src.path()), before, "the bucket changed");
    mount.settle();
    assert_eq!(
        snapshot(&mount.cache_parts_dir()),
        cache_before,
        "the cache changed"
    );
    assert_eq!(
        std::fs::read(mnt.join("nested/big.bin")).unwrap(),
        plain_files()["nested/big.bin"]
    );
}

#[test]
fn a_terminal_query_gets_enotty() {
    let src = tempfile::tempdir().unwrap();
    write_files(src.path(), &plain_files());
    let mount = TestMount::start(local_store(src.path()), "", |_| {});
    let file = std::fs::File::open(mount.path().join("tiny.txt")).unwrap();
    let mut termios = std::mem::MaybeUninit::<libc::termios>::uninit();
    // SAFETY: TCGETS writes one termios into the buffer given.
    let rc = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            libc::TCGETS,
            termios.as_mut_ptr(),
        )
    };
    assert_eq!(rc, -1);
    let error = std::io::Error::last_os_error();
    assert_eq!(error.raw_os_error(), Some(libc::ENOTTY), "{error}");
}
