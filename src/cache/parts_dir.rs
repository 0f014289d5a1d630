//! The parts directory as the cache writes it: the names of new part files (a sequence
//! number, the part's id and its length on disk, [`adopt::PartFileName`]), deletions
//! of the files the books stopped counting, and the header reads of an earlier mount's
//! files. Every file is reached relative to the directory held open
//! ([`super::directory`]). A test can act at the moments the directory grows or
//! shrinks ([`InsertMoment`]).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use super::adopt::{self, PartFileName};
use super::directory::HeldDir;
use super::part_file::{PartHeader, PartOrigin};

pub(super) struct PartsDir {
    pub(super) dir: HeldDir,
    /// The sequence number of the next part file: names sort oldest first.
    next_file: AtomicU64,
    /// Lets a test act at the moments the directory grows or shrinks.
    #[cfg(test)]
    pub(super) test_hook: parking_lot::Mutex<Option<InsertHook>>,
}

#[cfg(test)]
pub(super) type InsertHook = std::sync::Arc<dyn Fn(InsertMoment) + Send + Sync>;

/// The moments of an insert a test can act at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum InsertMoment {
    /// A new part file has all its bytes on disk (under its temporary name).
    Written,
    /// A part file is about to be deleted.
    Deleting,
}

impl PartsDir {
    /// `dir`, whose files an earlier mount numbered below `next_file`.
    pub(super) fn new(dir: HeldDir, next_file: u64) -> PartsDir {
        PartsDir {
            dir,
            next_file: AtomicU64::new(next_file),
            #[cfg(test)]
            test_hook: parking_lot::Mutex::new(None),
        }
    }

    /// The name of a new file for the part `origin` of `disk_bytes` on disk.
    pub(super) fn new_name(&self, origin: PartOrigin, disk_bytes: u64) -> PartFileName {
        PartFileName {
            seq: self.next_file.fetch_add(1, Ordering::Relaxed),
            part: adopt::part_id(origin.key, origin.etag, origin.object_offset),
            len: disk_bytes,
        }
    }

    /// Deletes part files; called with the books' lock held, before their bytes are
    /// credited or right after, so that the room they free is free on disk too.
    pub(super) fn delete(&self, files: Vec<String>) {
        for file in files {
            self.reached(InsertMoment::Deleting);
            match self.dir.remove(&file) {
                // A file already gone (a removed cache directory) is what deleting wanted.
                Err(error) if error.kind() != io::ErrorKind::NotFound => {
                    tracing::warn!(path = %self.dir.shown(&file).display(), %error, "could not delete a cache file");
                }
                _ => {}
            }
        }
    }

    /// Reads and checks the header of the earlier mount's part file `file`
    /// ([`adopt::read_header`]).
    pub(super) fn read_header(
        &self,
        file: &str,
        name: &PartFileName,
    ) -> Result<(PartHeader, u64), adopt::BadPartFile> {
        adopt::read_header(self.dir.open_for_reading(file)?, name)
    }

    #[cfg(test)]
    pub(super) fn reached(&self, moment: InsertMoment) {
        let hook = self.test_hook.lock().clone();
        if let Some(hook) = hook {
            hook(moment);
        }
    }

    #[cfg(not(test))]
    pub(super) fn reached(&self, _: InsertMoment) {}
}
