//! Open part files, bounded by the process's descriptor limit.
//!
//! A resident part keeps its file open so that a cached read costs one `pread`. A
//! cache of many small parts (10^5 parts of 64 KiB fill only 6.4 GB) would need more
//! descriptors than the process may have (`RLIMIT_NOFILE`), and running out would
//! fail reads, downloads and even the FUSE session. So at most a bound of part files
//! are open at once: past it, the files opened longest ago are closed, and a read of
//! a closed one opens it again by its name in the parts directory. Nothing else changes: the books, the pins
//! and the checksums are the cache's as before.
//!
//! The daemon raises its soft limit to the hard limit at start
//! ([`raise_descriptor_limit`]); the bound is three quarters of the limit then in force,
//! less a reserve for sockets, the FUSE device and the log.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// Descriptors left for everything but part files, besides the quarter kept free.
const RESERVED_DESCRIPTORS: u64 = 64;
/// Part files kept open however low the limit: fewer would reopen on every read.
const MIN_OPEN_PART_FILES: usize = 16;

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns the limit in force
/// (`u64::MAX` for unlimited). A refusal leaves the soft limit as it was: the cache
/// then keeps fewer files open, which costs reopens, not reads.
pub fn raise_descriptor_limit() -> u64 {
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if let Err(error) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(%error, soft = ?limit.current, hard = ?limit.maximum, "cannot raise the open-file limit to the hard limit");
        }
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// How many part files may be open at once under the process's current soft limit.
pub fn bound_for_this_process() -> usize {
    let soft = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    let usable = (soft / 4 * 3).saturating_sub(RESERVED_DESCRIPTORS);
    usize::try_from(usable)
        .unwrap_or(usize::MAX)
        .max(MIN_OPEN_PART_FILES)
}

/// One part file: its name in the parts directory, and the open file while it is open.
#[derive(Debug)]
pub struct PartFile {
    path: PathBuf,
    open: Mutex<Option<Arc<File>>>,
}

/// The part files open now, oldest first, under a bound.
pub struct OpenFiles {
    bound: usize,
    order: Mutex<VecDeque<Weak<PartFile>>>,
    reopened: AtomicU64,
}

impl OpenFiles {
    pub fn new(bound: usize) -> OpenFiles {
        OpenFiles {
            bound: bound.max(1),
            order: Mutex::new(VecDeque::new()),
            reopened: AtomicU64::new(0),
        }
    }

    /// A part file known by its path, opened when first read.
    pub fn closed(path: PathBuf) -> Arc<PartFile> {
        Arc::new(PartFile {
            path,
            open: Mutex::new(None),
        })
    }

    /// A part file just opened (written, then opened for reading).
    pub fn opened(&self, path: PathBuf, file: File) -> Arc<PartFile> {
        let part = Arc::new(PartFile {
            path,
            open: Mutex::new(Some(Arc::new(file))),
        });
        self.note_open(&part);
        part
    }

    /// The open file of `part`, opening it again by its path if it was closed.
    pub fn file(
        &self,
        part: &Arc<PartFile>,
        open: impl Fn(&Path) -> io::Result<File>,
    ) -> io::Result<Arc<File>> {
        if let Some(file) = part.open.lock().clone() {
            return Ok(file);
        }
        let file = match open(&part.path) {
            Err(error) if is_out_of_descriptors(&error) => {
                // Descriptors went elsewhere (sockets, readers): give back half of ours.
                self.close_oldest(self.order.lock().len() / 2);
                open(&part.path)?
            }
            other => other?,
        };
        let file = Arc::new(file);
        *part.open.lock() = Some(file.clone());
        self.reopened.fetch_add(1, Ordering::Relaxed);
        self.note_open(part);
        Ok(file)
    }

    /// Part files opened again after being closed for the bound.
    pub fn reopened(&self) -> u64 {
        self.reopened.load(Ordering::Relaxed)
    }

    fn note_open(&self, part: &Arc<PartFile>) {
        let excess = {
            let mut order = self.order.lock();
            order.push_back(Arc::downgrade(part));
            order.len().saturating_sub(self.bound)
        };
        self.close_oldest(excess);
    }

    /// Closes the `count` part files opened longest ago (entries of parts gone from
    /// the cache count too: their files closed with them). A reader holding one keeps
    /// its descriptor until it is done.
    fn close_oldest(&self, count: usize) {
        let victims: Vec<Weak<PartFile>> = {
            let mut order = self.order.lock();
            let count = count.min(order.len());
            order.drain(..count).collect()
        };
        for victim in victims.iter().filter_map(Weak::upgrade) {
            victim.open.lock().take();
        }
    }
}

fn is_out_of_descriptors(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EMFILE) | Some(libc::ENFILE)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::FileExt;

    fn open_read(path: &Path) -> io::Result<File> {
        File::open(path)
    }

    #[test]
    fn beyond_the_bound_the_oldest_close_and_reopen_when_read() {
        let dir = tempfile::tempdir().unwrap();
        let files = OpenFiles::new(2);
        let parts: Vec<Arc<PartFile>> = (0..5u8)
            .map(|i| {
                let path = dir.path().join(format!("{i}.part"));
                File::create(&path).unwrap().write_all(&[i; 4]).unwrap();
                files.opened(path.clone(), File::open(&path).unwrap())
            })
            .collect();
        let open_now =
            |parts: &[Arc<PartFile>]| parts.iter().filter(|p| p.open.lock().is_some()).count();
        assert_eq!(open_now(&parts), 2);
        for _round in 0..2 {
            for (i, part) in parts.iter().enumerate() {
                let mut byte = [0u8];
                files
                    .file(part, open_read)
                    .unwrap()
                    .read_exact_at(&mut byte, 3)
                    .unwrap();
                assert_eq!(byte[0], i as u8);
                assert!(open_now(&parts) <= 2);
            }
        }
        assert!(files.reopened() >= 8, "{} reopens", files.reopened());
    }

    #[test]
    fn a_closed_part_file_opens_on_first_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        File::create(&path).unwrap().write_all(b"abc").unwrap();
        let files = OpenFiles::new(4);
        let part = OpenFiles::closed(path);
        let mut bytes = [0u8; 3];
        files
            .file(&part, open_read)
            .unwrap()
            .read_exact_at(&mut bytes, 0)
            .unwrap();
        assert_eq!(&bytes, b"abc");
        assert_eq!(files.reopened(), 1);
    }

    #[test]
    fn the_bound_follows_the_soft_limit() {
        let soft = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
        let bound = bound_for_this_process() as u64;
        assert!(bound < soft || bound == MIN_OPEN_PART_FILES as u64);
    }
}
