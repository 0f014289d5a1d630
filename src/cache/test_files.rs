//! Helpers on a cache directory's plain files, for the cache's unit tests and the
//! integration tests (built with the test-support feature, never into the daemon):
//! what the directory holds, and damage.

use std::os::unix::fs::FileExt;
use std::path::Path;

/// Total bytes of the files directly in `dir` (a cache's part files); 0 if it is gone.
pub fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Flips one bit of the byte at `at` of the file at `path`, in place.
pub fn flip_bit(path: &Path, at: u64) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, at).unwrap();
    file.write_all_at(&[byte[0] ^ 0x10], at).unwrap();
}
