//! The kernel's read-ahead for the mount: how many bytes the page cache asks for at
//! once when a file is read in order or a memory map faults.
//!
//! At FUSE's INIT the kernel offers its default (128 KiB here) and a daemon can only
//! lower it (fuser's `KernelConfig::set_max_readahead`); raising it goes through the
//! mount's backing device, `/sys/class/bdi/<major>:<minor>/read_ahead_kb`, named by the
//! mount's `st_dev`. Each open takes the value then in force, so it is set once the
//! mount answers and before any file is opened. A single FUSE read stays at most
//! `max_pages` (the kernel's `fs.fuse.max_pages_limit`, 1 MiB by default): a larger
//! window arrives as several reads in flight at once.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The sysfs file holding the read-ahead of the filesystem mounted at `mountpoint`.
fn bdi_file(mountpoint: &Path) -> io::Result<PathBuf> {
    let dev = std::fs::metadata(mountpoint)?.dev();
    Ok(PathBuf::from(format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        rustix::fs::major(dev),
        rustix::fs::minor(dev)
    )))
}

/// The read-ahead of the disk holding `path`: what a read of a file there brings in
/// around each fault. A partition reads ahead as its disk does.
pub fn of_disk_holding(path: &Path) -> io::Result<u64> {
    let dev = std::fs::metadata(path)?.dev();
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    let block = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let candidates = [
        block.join("queue/read_ahead_kb"),
        block.join("../queue/read_ahead_kb"),
        PathBuf::from(format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb")),
    ];
    let file = candidates
        .iter()
        .find(|file| file.exists())
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no read-ahead for this device"))?;
    read_kib(file)
}

fn read_kib(file: &Path) -> io::Result<u64> {
    let text = std::fs::read_to_string(file)?;
    let kib: u64 = text
        .trim()
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok(kib << 10)
}

/// Sets the read-ahead of the mount at `mountpoint` to `bytes` (rounded down to KiB).
pub fn set(mountpoint: &Path, bytes: u64) -> io::Result<()> {
    std::fs::write(bdi_file(mountpoint)?, format!("{}\n", bytes >> 10))
}

/// The read-ahead in force for the mount at `mountpoint`, in bytes.
pub fn get(mountpoint: &Path) -> io::Result<u64> {
    read_kib(&bdi_file(mountpoint)?)
}
