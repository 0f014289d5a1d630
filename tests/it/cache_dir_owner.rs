//! A mount trusts its cache directory with bytes it serves as the dataset's, so it
//! refuses, with a message that says why, one that another user could have planted or
//! could swap away: an existing directory owned by someone else (`nobody` here) or
//! writable by group or others, and one below a directory that its group or others
//! may write (not sticky) or that belongs to another user. A directory of its own below a
//! sticky world-writable one (`/tmp`) is fine. Through the real `scdlfs mount`, as root,
//! and through the library's `Mount::start`, which every other way to mount (the
//! daemon's re-exec, Python's `scdlfs.mount`, the tests) goes through.

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::process::{is_mount_point, scdlfs_command, unmount, Cleanup};
use common::{settings, write_source};
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use scdlfs::mount::Mount;

fn nobody() -> (u32, u32) {
    // SAFETY: getpwnam with a NUL-terminated name; the entry is read at once.
    let entry = unsafe { libc::getpwnam(c"nobody".as_ptr()) };
    assert!(!entry.is_null(), "this machine has no user nobody");
    // SAFETY: checked non-null just above.
    unsafe { ((*entry).pw_uid, (*entry).pw_gid) }
}

fn chown(path: &Path, (uid, gid): (u32, u32)) {
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `scdlfs mount` (detaching) of a local folder with `--cache-dir cache`: Ok, or the
/// error it printed. A mount it made is undone.
fn mount_with_cache(dir: &Path, cache: &Path) -> Result<(), String> {
    let source = dir.join("source");
    if !source.exists() {
        write_source(&source);
    }
    let mountpoint = dir.join("mnt");
    std::fs::create_dir_all(&mountpoint).unwrap();
    let _cleanup = Cleanup::unmounting(mountpoint.clone());
    let output = scdlfs_command(["mount"])
        .arg(&source)
        .arg(&mountpoint)
        .arg("--cache-dir")
        .arg(cache)
        .output()
        .unwrap();
    if is_mount_point(&mountpoint) {
        unmount(&mountpoint);
    }
    if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

#[track_caller]
fn assert_refused(result: Result<(), String>, words: &[&str]) {
    let message = result.expect_err("the mount used a cache directory it cannot trust");
    for word in words {
        assert!(message.contains(word), "no {word:?} in: {message}");
    }
}

#[test]
fn an_existing_cache_directory_owned_by_another_user_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    chmod(&cache, 0o700);
    chown(&cache, nobody());
    assert_refused(
        mount_with_cache(dir.path(), &cache),
        &[
            &cache.display().to_string(),
            "owned by",
            &nobody().0.to_string(),
        ],
    );
}

#[test]
fn a_cache_directory_writable_by_group_or_others_is_refused() {
    for mode in [0o770, 0o707] {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        chmod(&cache, mode);
        assert_refused(
            mount_with_cache(dir.path(), &cache),
            &[&cache.display().to_string(), "writable"],
        );
    }
}

#[test]
fn a_cache_directory_below_a_world_writable_or_foreign_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    chmod(&open, 0o777);
    assert_refused(
        mount_with_cache(dir.path(), &open.join("cache")),
        &[&open.display().to_string(), "writable"],
    );

    let foreign = dir.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    chmod(&foreign, 0o755);
    chown(&foreign, nobody());
    assert_refused(
        mount_with_cache(dir.path(), &foreign.join("cache")),
        &[&foreign.display().to_string(), "owned by"],
    );
}

/// A directory above the cache that its group may write lets every member of the group
/// rename the cache away and put one of their own in its place, as a world-writable
/// one lets everybody: refused unless it is sticky (it mounted without a word).
#[test]
fn a_cache_directory_below_a_group_writable_directory_is_refused_unless_sticky() {
    let dir = tempfile::tempdir().unwrap();
    let team = dir.path().join("team");
    std::fs::create_dir(&team).unwrap();
    chmod(&team, 0o775);
    chown(&team, (0, nobody().1));
    assert_refused(
        mount_with_cache(dir.path(), &team.join("cache")),
        &[&team.display().to_string(), "writable by its group"],
    );
    chmod(&team, 0o1775);
    mount_with_cache(dir.path(), &team.join("cache")).expect("below a sticky group directory");
}

#[test]
fn a_private_cache_directory_below_a_sticky_shared_one_is_used() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o1777);
    mount_with_cache(dir.path(), &shared.join("cache")).expect("a private cache was refused");
    let mode = std::fs::metadata(shared.join("cache")).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o700);
}

/// A symbolic link on the way to the cache belongs to root or to this user: in a sticky
/// directory another user's link can be replaced by its owner, pointing the path at a
/// directory of theirs (it was followed without a word). And the directories a link's
/// target crosses are checked as any on the way: here a link in a world-writable
/// directory that anyone could replace, reached through a second link, was seen
/// neither in the path as given nor as resolved.
#[test]
fn a_cache_directory_reached_through_a_link_others_can_replace_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mine = dir.path().join("mine");
    std::fs::create_dir(&mine).unwrap();

    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o1777);
    let theirs = shared.join("link");
    std::os::unix::fs::symlink(&mine, &theirs).unwrap();
    let (uid, gid) = nobody();
    std::os::unix::fs::lchown(&theirs, Some(uid), Some(gid)).unwrap();
    assert_refused(
        mount_with_cache(dir.path(), &theirs.join("cache")),
        &[
            &theirs.display().to_string(),
            "symbolic link",
            &format!("owned by uid {uid}"),
        ],
    );

    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    chmod(&open, 0o777);
    std::os::unix::fs::symlink(&mine, open.join("hop")).unwrap();
    let via = dir.path().join("via");
    std::os::unix::fs::symlink(open.join("hop"), &via).unwrap();
    assert_refused(
        mount_with_cache(dir.path(), &via.join("cache")),
        &[&open.display().to_string(), "writable by every user"],
    );

    // A link of this user's, through directories nobody else may write, is fine.
    let own = dir.path().join("own");
    std::os::unix::fs::symlink(&mine, &own).unwrap();
    mount_with_cache(dir.path(), &own.join("cache")).expect("through the user's own link");
    assert!(mine.join("cache").is_dir());
}

/// `Mount::start` of a local folder with `cache` as its cache directory: Ok, or the
/// error it gave. A mount it made is undone.
fn mount_through_the_library(dir: &Path, cache: &Path) -> Result<(), String> {
    let source = dir.join("source");
    if !source.exists() {
        write_source(&source);
    }
    let mountpoint = dir.join("mnt");
    std::fs::create_dir_all(&mountpoint).unwrap();
    let store = std::sync::Arc::new(LocalFileSystem::new_with_prefix(&source).unwrap());
    let mount = Mount::start(store, ObjectPath::from(""), &mountpoint, &settings(cache));
    let result = mount.map(drop).map_err(|error| error.to_string());
    assert!(!is_mount_point(&mountpoint), "the mount outlived its drop");
    result
}

#[test]
fn every_way_to_mount_refuses_an_untrusted_cache_directory() {
    let dir = tempfile::tempdir().unwrap();
    let foreign = dir.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    chmod(&foreign, 0o700);
    chown(&foreign, nobody());
    assert_refused(
        mount_through_the_library(dir.path(), &foreign),
        &[&foreign.display().to_string(), "owned by"],
    );

    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    chmod(&open, 0o777);
    assert_refused(
        mount_through_the_library(dir.path(), &open.join("cache")),
        &[&open.display().to_string(), "writable"],
    );

    // A directory not made yet is made private, then used.
    let fresh = dir.path().join("fresh").join("cache");
    mount_through_the_library(dir.path(), &fresh).expect("a private cache was refused");
    assert_eq!(std::fs::metadata(&fresh).unwrap().mode() & 0o777, 0o700);
}
